//! Telemetry set-up and the request's server span: the one place that names spans and their
//! fields, installs the exporter and the log writers, and flushes them at shutdown.
//!
//! Spans go to a Jaeger agent over UDP or to an OTLP collector over HTTP or gRPC (batched, off
//! the request path, as `OTEL_TRACES_EXPORTER` says); log lines go, as JSON,
//! to stdout and to the log file through non-blocking writers. `RUST_LOG` filters the logs only:
//! spans are exported whatever the log level.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::export::trace::SpanExporter;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::observability::jaeger_agent::AgentExporter;
use crate::observability::logs::{JsonFieldSets, JsonLines};
use crate::observability::settings::{
    DEFAULT_LOG_FILTER, OtlpProtocol, OtlpSettings, SpanExport, TelemetrySettings,
};

/// How long the exit waits for the last spans to leave.
const FLUSH_DEADLINE: Duration = Duration::from_secs(5);
/// One export to the Jaeger agent: a UDP send never waits, so this is never reached.
const AGENT_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans per export unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says otherwise. A request span is
/// about 350 bytes in Thrift, so 128 of them fit one 65,000-byte UDP packet; the SDK's default
/// of 512 does not, and the exporter then halves the batch and encodes each half again (and
/// again), which made span encoding the host's largest user-space cost under load.
const SPANS_PER_BATCH: usize = 128;

/// Keeps the log writers and the span exporter alive; dropping it flushes both.
///
/// Drop it from a blocking context (not a runtime worker): the exporter's shutdown blocks on
/// the batch task's last export.
#[must_use = "dropping the guard stops logging and tracing"]
pub struct TelemetryGuard {
    _log_writers: Vec<WorkerGuard>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        // The last export waits on the collector: on a thread of its own, so that a collector
        // that never answers delays the exit by at most `FLUSH_DEADLINE`.
        let (done, flushed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            opentelemetry::global::shutdown_tracer_provider();
            let _ = done.send(());
        });
        let _ = flushed.recv_timeout(FLUSH_DEADLINE);
    }
}

/// Installs logging (stdout and the settings' log file) and span export. Never fails: a log file that
/// cannot be opened or an exporter that cannot start is one warning, and the service runs on.
/// Must run inside the tokio runtime (the exporter's batch task lives there).
pub fn init(settings: &TelemetrySettings) -> TelemetryGuard {
    // Buffered behind the non-blocking channel: its worker flushes whenever the channel runs
    // dry, so a burst of lines is one write, not one system call per line.
    let (stdout, stdout_guard) = tracing_appender::non_blocking(BufWriter::new(std::io::stdout()));
    let (file_target, file_error): (Box<dyn Write + Send>, _) =
        match open_append(&settings.log_file) {
            Ok(file) => (Box::new(BufWriter::new(file)), None),
            Err(error) => (Box::new(std::io::sink()), Some(error)),
        };
    let (file, file_guard) = tracing_appender::non_blocking(file_target);
    let log_level = EnvFilter::try_new(&settings.log_filter)
        .unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    // Spans stay enabled whatever the level, so a WARN line still carries its request's fields.
    // The level hints matter: they set the `log` crate's maximum level, and cranelift logs every
    // compilation step through `log` at debug and trace.
    let info_spans = || {
        filter_fn(|metadata| metadata.is_span() && *metadata.level() <= tracing::Level::INFO)
            .with_max_level_hint(tracing::Level::INFO)
    };
    let log_level = log_level.or(info_spans());
    let logs = tracing_subscriber::fmt::layer()
        .event_format(JsonLines)
        .fmt_fields(JsonFieldSets)
        .with_writer(stdout.and(file))
        .with_filter(log_level);

    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // An unreachable agent or collector must cost nothing: its errors are said in one WARN line
    // a minute at most, so a user whose spans go nowhere learns it without a flood of lines.
    let _ = opentelemetry::global::set_error_handler(warn_of_export_errors);
    let (tracer, exporter_error) = match tracer(settings) {
        Ok(tracer) => (tracer, None),
        Err(error) => (None, Some(error)),
    };
    let spans = tracer.map(|tracer| {
        // Without code locations, thread ids and busy/idle timings: tags nobody reads here, and
        // the exporter's Thrift encoding of every tag is a visible share of the host's CPU.
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(info_spans())
    });
    tracing_subscriber::registry().with(logs).with(spans).init();

    if let Some(error) = file_error {
        tracing::warn!(path = %settings.log_file.display(), %error, "cannot write the log file; logging to stdout only");
    }
    if let Some(error) = exporter_error {
        tracing::warn!(%error, "cannot start the span exporter; spans are not exported");
    } else {
        let (exporter, endpoint) = settings.export.describe();
        if endpoint.is_empty() {
            tracing::info!(exporter, "spans are not exported");
        } else {
            tracing::info!(exporter, endpoint, "spans go to {endpoint}");
        }
    }
    TelemetryGuard {
        _log_writers: vec![stdout_guard, file_guard],
    }
}

/// How often, at most, a failing span export is said in a WARN line.
pub const EXPORT_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The OpenTelemetry SDK's error handler: the first error, then at most one a minute, as a WARN
/// line (later ones in the same minute are counted in the next line).
fn warn_of_export_errors(error: opentelemetry::global::Error) {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match &mut *last {
        Some((said, unsaid)) if said.elapsed() < EXPORT_WARNING_INTERVAL => *unsaid += 1,
        _ => {
            let unsaid = last.map_or(0, |(_, unsaid)| unsaid);
            *last = Some((Instant::now(), 0));
            drop(last);
            tracing::warn!(
                %error,
                errors_since_last_line = unsaid,
                "span export failed; spans are being lost (said at most once a minute)"
            );
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The tracer of the exporter `settings` choose, installed as the global provider; `None` when
/// spans are not exported.
fn tracer(
    settings: &TelemetrySettings,
) -> Result<Option<opentelemetry_sdk::trace::Tracer>, opentelemetry::trace::TraceError> {
    let resource = resource(settings);
    let limits = settings.batch;
    // Every setting given here, so none comes from the SDK's own unchecked reading.
    let batch = BatchConfigBuilder::default()
        .with_scheduled_delay(limits.schedule_delay)
        .with_max_queue_size(limits.max_queue_size)
        .with_max_concurrent_exports(limits.max_concurrent_exports);
    let tracer = match &settings.export {
        SpanExport::Off => return Ok(None),
        SpanExport::JaegerAgent { host, port } => {
            let exporter = AgentExporter::new(host, *port, settings.service_name.clone())
                .map_err(|error| opentelemetry::trace::TraceError::Other(Box::new(error)))?;
            let batch = batch
                .with_max_export_batch_size(limits.max_export_batch_size.unwrap_or(SPANS_PER_BATCH))
                .with_max_export_timeout(limits.export_timeout.unwrap_or(AGENT_EXPORT_TIMEOUT));
            install(exporter, batch, resource)
        }
        SpanExport::Otlp(otlp) => {
            // The batch processor drops an export that outlives this, whatever the transport
            // does; the exporter itself reads `OTEL_EXPORTER_OTLP_TIMEOUT` as seconds.
            let timeout = limits
                .export_timeout
                .map_or(otlp.timeout, |timeout| timeout.min(otlp.timeout));
            let mut batch = batch.with_max_export_timeout(timeout);
            if let Some(size) = limits.max_export_batch_size {
                batch = batch.with_max_export_batch_size(size);
            }
            install(otlp_exporter(otlp, timeout)?, batch, resource)
        }
    };
    Ok(Some(tracer))
}

/// An OTLP exporter over the settings' transport, async on the host's runtime: reqwest for
/// HTTP, tonic for gRPC (connected lazily, so a collector that is not up yet is no error).
fn otlp_exporter(
    otlp: &OtlpSettings,
    timeout: Duration,
) -> Result<opentelemetry_otlp::SpanExporter, opentelemetry::trace::TraceError> {
    use opentelemetry_otlp::WithExportConfig;
    match otlp.protocol {
        OtlpProtocol::HttpProtobuf => {
            // Not the exporter's default client: that one follows redirects (resending the
            // headers, API keys included, wherever a collector points) and honours
            // `HTTP_PROXY`. A collector's answer is read within the timeout.
            let client = otlp_reqwest::Client::builder()
                .redirect(otlp_reqwest::redirect::Policy::none())
                .no_proxy()
                .timeout(timeout)
                .connect_timeout(timeout)
                .build()
                .map_err(|error| opentelemetry::trace::TraceError::Other(Box::new(error)))?;
            let invalid = |error: String| opentelemetry::trace::TraceError::from(error);
            let endpoint = otlp
                .endpoint
                .parse()
                .map_err(|_| invalid("endpoint".into()))?;
            let mut headers = otlp_http::HeaderMap::new();
            for (name, value) in &otlp.headers {
                // Checked as HTTP headers at start.
                let name: otlp_http::HeaderName =
                    name.parse().map_err(|_| invalid("header name".into()))?;
                let value = value.parse().map_err(|_| invalid("header value".into()))?;
                headers.insert(name, value);
            }
            opentelemetry_otlp::new_exporter()
                .http()
                .with_http_client(ToEndpoint {
                    client,
                    endpoint,
                    headers,
                })
                .with_endpoint(&otlp.endpoint)
                .with_timeout(timeout)
                .build_span_exporter()
        }
        OtlpProtocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (name, value) in &otlp.headers {
                // Checked as HTTP headers at start; gRPC metadata keys are the same, lower-cased.
                if let (Ok(key), Ok(value)) = (
                    tonic::metadata::AsciiMetadataKey::from_bytes(
                        name.to_ascii_lowercase().as_bytes(),
                    ),
                    value.parse(),
                ) {
                    metadata.insert(key, value);
                }
            }
            // A channel of ours: the exporter's own would take its endpoint and timeout from
            // the raw variables, over the values given here.
            let channel = tonic::transport::Channel::from_shared(otlp.endpoint.clone())
                .map_err(|error| opentelemetry::trace::TraceError::Other(Box::new(error)))?
                .timeout(timeout)
                .connect_lazy();
            // The exporter adds the variables' headers to the metadata it is given; the
            // interceptor, which runs last, sends only the host's. (Its error type is tonic's.)
            #[allow(clippy::result_large_err)]
            let host_metadata = move |mut request: tonic::Request<()>| {
                *request.metadata_mut() = metadata.clone();
                Ok(request)
            };
            opentelemetry_otlp::new_exporter()
                .tonic()
                .with_channel(channel)
                .with_interceptor(host_metadata)
                .build_span_exporter()
        }
    }
}

/// The OTLP/HTTP client: sends every export to the endpoint, with the headers, the settings
/// name. opentelemetry-otlp 0.16 reads the `OTEL_EXPORTER_OTLP_*` variables again itself, raw,
/// and lets them win over what it is given (a blank endpoint becomes a URL of its own, the
/// variable's headers are added last); the host reads each variable once, and this is where its
/// reading wins.
#[derive(Debug)]
struct ToEndpoint {
    client: otlp_reqwest::Client,
    endpoint: otlp_http::Uri,
    /// The settings' headers, sent in place of any the exporter added.
    headers: otlp_http::HeaderMap,
}

impl opentelemetry_http::HttpClient for ToEndpoint {
    fn send<'client, 'call>(
        &'client self,
        mut request: otlp_http::Request<Vec<u8>>,
    ) -> std::pin::Pin<
        Box<
            dyn Future<
                    Output = Result<
                        otlp_http::Response<bytes::Bytes>,
                        opentelemetry_http::HttpError,
                    >,
                > + Send
                + 'call,
        >,
    >
    where
        'client: 'call,
        Self: 'call,
    {
        *request.uri_mut() = self.endpoint.clone();
        let content = [
            otlp_http::header::CONTENT_TYPE,
            otlp_http::header::CONTENT_ENCODING,
        ]
        .map(|name| {
            request
                .headers()
                .get(&name)
                .cloned()
                .map(|value| (name, value))
        });
        let headers = request.headers_mut();
        headers.clone_from(&self.headers);
        headers.extend(content.into_iter().flatten());
        self.client.send(request)
    }
}

/// Sends `exporter`'s spans in batches from a task of its own, and installs the provider.
fn install<E: SpanExporter + 'static>(
    exporter: E,
    batch: BatchConfigBuilder,
    resource: Resource,
) -> opentelemetry_sdk::trace::Tracer {
    // The queue is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048): when the exporter falls behind,
    // new spans are dropped, never waited for.
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch.build())
        .build();
    let provider = opentelemetry_sdk::trace::TracerProvider::builder()
        .with_span_processor(processor)
        .with_config(opentelemetry_sdk::trace::config().with_resource(resource))
        .build();
    let tracer = provider.tracer("host");
    opentelemetry::global::set_tracer_provider(provider);
    tracer
}

/// What every span says of the process that sent it: the service and its version, this
/// process among the service's replicas, the machine, and `OTEL_RESOURCE_ATTRIBUTES`.
fn resource(settings: &TelemetrySettings) -> Resource {
    let detected = Resource::new([
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", uuid::Uuid::new_v4().to_string()),
        KeyValue::new("host.name", host_name()),
    ]);
    let from_environment = Resource::new(
        settings
            .resource_attributes
            .iter()
            .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
    );
    let name = Resource::new([KeyValue::new("service.name", settings.service_name.clone())]);
    // Later wins: what the user set over what was detected, the service name over both.
    detected.merge(&from_environment).merge(&name)
}

/// This machine's host name, as `hostname` prints it.
fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the pointer and length describe `buffer`, which gethostname writes within.
    let status = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return "unknown".to_string();
    }
    let end = buffer
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}
