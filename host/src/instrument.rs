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

use http::{HeaderMap, Method};
use opentelemetry::KeyValue;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::export::trace::SpanExporter;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor};
use tracing::field::Empty;
use tracing_appender::non_blocking::WorkerGuard;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::fmt::writer::MakeWriterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::TelemetrySettings;
use crate::logs::{JsonFieldSets, JsonLines};
use crate::otel_env::{OtlpProtocol, OtlpSettings, SpanExport};

/// How long the exit waits for the last spans to leave.
const FLUSH_DEADLINE: Duration = Duration::from_secs(5);
/// One export to the Jaeger agent: a UDP send never waits, so this is never reached.
const AGENT_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest `url.path` recorded on a span: a span must fit in one UDP packet to the agent.
const MAX_RECORDED_PATH: usize = 1024;
/// The longest non-standard method recorded as `http.request.method_original`.
const MAX_RECORDED_METHOD: usize = 32;
/// The methods OpenTelemetry's HTTP conventions know; any other is recorded as [`OTHER_METHOD`].
const STANDARD_METHODS: &[Method] = &[
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];
/// `http.request.method` of a request whose method is not a standard one.
pub const OTHER_METHOD: &str = "_OTHER";

/// The method's name when it is one of the nine standard ones; clients choose methods, so only
/// these may become span names or label values.
pub fn standard_method(method: &Method) -> Option<&'static str> {
    STANDARD_METHODS
        .iter()
        .find(|standard| *standard == method)
        .map(Method::as_str)
}
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

/// Installs logging (stdout and `log_file`) and span export. Never fails: a log file that
/// cannot be opened or an exporter that cannot start is one warning, and the service runs on.
/// Must run inside the tokio runtime (the exporter's batch task lives there).
pub fn init(log_file: &Path, settings: &TelemetrySettings) -> TelemetryGuard {
    // Buffered behind the non-blocking channel: its worker flushes whenever the channel runs
    // dry, so a burst of lines is one write, not one system call per line.
    let (stdout, stdout_guard) = tracing_appender::non_blocking(BufWriter::new(std::io::stdout()));
    let (file_target, file_error): (Box<dyn Write + Send>, _) = match open_append(log_file) {
        Ok(file) => (Box::new(BufWriter::new(file)), None),
        Err(error) => (Box::new(std::io::sink()), Some(error)),
    };
    let (file, file_guard) = tracing_appender::non_blocking(file_target);
    let log_level =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
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
        tracing::warn!(path = %log_file.display(), %error, "cannot write the log file; logging to stdout only");
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

/// The log filter unless `RUST_LOG` says otherwise: the host's own lines from `info`, the
/// PostgreSQL client's from `warn` (its `info` lines are the server's notices, such as a table
/// that already exists at every start).
pub const DEFAULT_LOG_FILTER: &str = "info,tokio_postgres=warn";

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
            // The agent exporter is deprecated upstream in favour of OTLP, but the contract (and
            // Jaeger's `jaeger` receiver) speak the agent's UDP protocol; allow that warning here.
            #[allow(deprecated)]
            let exporter = opentelemetry_jaeger::new_agent_pipeline()
                .with_endpoint(agent_endpoint(host, *port))
                .with_service_name(settings.service_name.clone())
                .with_trace_config(
                    opentelemetry_sdk::trace::config().with_resource(resource.clone()),
                )
                // Without splitting, a batch over the 65,000-byte UDP limit is dropped whole.
                .with_auto_split_batch(true)
                .with_instrumentation_library_tags(false)
                // The exporter's async agent client hands tokio a blocking UDP socket (tokio
                // asserts against that); the sync client sends from the batch task, and a UDP
                // send never waits.
                .build_sync_agent_exporter()?;
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
            opentelemetry_otlp::new_exporter()
                .http()
                .with_http_client(client)
                .with_endpoint(&otlp.endpoint)
                .with_timeout(timeout)
                .with_headers(otlp.headers.iter().cloned().collect())
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
            opentelemetry_otlp::new_exporter()
                .tonic()
                .with_endpoint(&otlp.endpoint)
                .with_timeout(timeout)
                .with_metadata(metadata)
                .build_span_exporter()
        }
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

/// `host:port`, with an IPv6 address in brackets.
fn agent_endpoint(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The server span of one request, continuing the caller's trace when the request carries a
/// W3C `traceparent`. Named `HTTP <METHOD>` until [`record_answer`] adds the route.
pub fn request_span(
    method: &Method,
    path: &str,
    request_id: &str,
    headers: &HeaderMap,
) -> tracing::Span {
    let path = truncate(path, MAX_RECORDED_PATH);
    // Clients choose the method: only the standard ones become span names or attribute values,
    // so the set of names stays bounded and a 5,000-byte method is not logged whole.
    let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
    let method_original = standard_method(method)
        .is_none()
        .then(|| truncate(method.as_str(), MAX_RECORDED_METHOD));
    let span = tracing::info_span!(
        "request",
        otel.name = format!("HTTP {method_name}"),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method_name,
        http.request.method_original = method_original,
        http.route = Empty,
        url.path = path,
        http.response.status_code = Empty,
        guest.version = Empty,
        request_id,
        trace_id = Empty,
        span_id = Empty,
    );
    let caller = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    });
    span.set_parent(caller);
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", span_context.trace_id().to_string());
        span.record("span_id", span_context.span_id().to_string());
    }
    span
}

/// Records the answer on the request span: its route in the name (`HTTP <METHOD> <route>`) and,
/// unless the span already carries it, in `http.route`; its status; a 5xx marks it an error.
pub fn record_answer(
    span: &tracing::Span,
    method: &Method,
    route: &str,
    record_route: bool,
    status: u16,
) {
    let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
    span.record("otel.name", format!("HTTP {method_name} {route}"));
    if record_route {
        span.record("http.route", route);
    }
    // As an integer attribute: tracing-opentelemetry would record a `u16`'s u64 as text.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_agent_address_is_bracketed() {
        assert_eq!(agent_endpoint("::1", 6831), "[::1]:6831");
        assert_eq!(agent_endpoint("[::1]", 6831), "[::1]:6831");
        assert_eq!(agent_endpoint("jaeger", 6831), "jaeger:6831");
    }

    #[test]
    fn only_the_nine_standard_methods_are_named() {
        assert_eq!(standard_method(&Method::GET), Some("GET"));
        assert_eq!(standard_method(&Method::from_bytes(b"BREW").unwrap()), None);
    }
}
