//! Telemetry set-up: the one place that installs the log writers and the exporters of all
//! three signals, and flushes them at shutdown.
//!
//! Log lines go, as JSON, to stdout and to the log file, each written in batches by a
//! tracing-appender worker of its own ([`log_writer`]), and, when `OTEL_LOGS_EXPORTER` says so, to an OTLP collector as log
//! records. Spans go to a Jaeger agent over UDP or to an OTLP collector
//! (`OTEL_TRACES_EXPORTER`). The metrics are served at `/metrics` and, when
//! `OTEL_METRICS_EXPORTER` says so, pushed to an OTLP collector. Every
//! export is batched on a thread of the SDK's, off the request path, from a bounded queue, one
//! export at a time, each given up at its timeout. `RUST_LOG` filters the logs only: spans are
//! exported whatever the log level.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, SdkTracerProvider, Span, SpanData, SpanProcessor,
};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::observability::jaeger_agent::{AgentExporter, HOST_TRACER};
use crate::observability::log_writer::{self, LogWriterGuard, MAX_PENDING_BYTES};
use crate::observability::logs::{JsonLines, JsonMembers};
use crate::observability::metrics::Metrics;
use crate::observability::otlp::{self, Reported};
use crate::observability::request_report;
use crate::observability::settings::{DEFAULT_LOG_FILTER, SpanExport, TelemetrySettings};

/// How long the exit waits for the last spans, metrics and log records to leave, in all.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(5);

/// One export to the Jaeger agent: a UDP send never waits, so this is never reached.
const AGENT_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Spans per export to the Jaeger agent unless `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` says otherwise.
/// A request span is about 350 bytes in Thrift, so 128 of them fit one 65,000-byte datagram.
const SPANS_PER_AGENT_BATCH: usize = 128;

/// Targets whose events never become OTLP log records: the exporters' own HTTP and gRPC stacks,
/// whose lines about sending a record would each make another record.
const EXPORTER_TARGETS: [&str; 6] = ["opentelemetry", "hyper", "h2", "tonic", "tower", "reqwest"];

/// The span exporter's processor, which the guests' `wasi:otel` spans are handed to as they
/// come (already ended, with the guest's own ids): set once, when spans are exported.
static GUEST_SPANS: OnceLock<Arc<dyn SpanProcessor>> = OnceLock::new();

/// Exports a span a guest ended through `wasi:otel`, beside the host's own, through the same
/// bounded queue; dropped when no spans are exported.
pub fn export_guest_span(span: SpanData) {
    if let Some(processor) = GUEST_SPANS.get() {
        processor.on_end(span);
    }
}

/// A span processor shared by the tracer provider and [`export_guest_span`].
#[derive(Debug)]
struct Shared(Arc<dyn SpanProcessor>);

impl SpanProcessor for Shared {
    fn on_start(&self, span: &mut Span, context: &Context) {
        self.0.on_start(span, context);
    }

    fn on_end(&self, span: SpanData) {
        self.0.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    // The resource was given to the processor before it was shared.
}

/// The host's telemetry: its metrics, and the exporters and log writers that dropping this
/// flushes.
///
/// Drop it from a blocking context (not a runtime worker) while the runtime still runs: the
/// last exports are sent through it.
#[must_use = "dropping the telemetry stops logging and exporting"]
pub struct Telemetry {
    metrics: Arc<Metrics>,
    /// Time between two pushes of the metrics, when they are pushed.
    metric_push_interval: Option<Duration>,
    tracer: Option<SdkTracerProvider>,
    meter: SdkMeterProvider,
    logger: Option<SdkLoggerProvider>,
    _log_writer: LogWriterGuard,
}

impl Telemetry {
    /// The host's metrics, served at `/metrics` and pushed where the settings say.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Time between two pushes of the metrics, when they are pushed.
    pub fn metric_push_interval(&self) -> Option<Duration> {
        self.metric_push_interval
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // The last exports wait on collectors: each signal on a thread of its own, all three
        // at once, so that a collector that never answers delays the exit by at most
        // `FLUSH_DEADLINE` and costs the other signals nothing.
        let deadline = Instant::now() + FLUSH_DEADLINE;
        let (done, flushed) = std::sync::mpsc::channel::<()>();
        let flush = |shutdown: Box<dyn FnOnce(Duration) + Send>| {
            let done = done.clone();
            std::thread::spawn(move || {
                shutdown(FLUSH_DEADLINE);
                drop(done);
            });
        };
        if let Some(tracer) = self.tracer.take() {
            flush(Box::new(move |limit| {
                drop(tracer.shutdown_with_timeout(limit))
            }));
        }
        let meter = self.meter.clone();
        flush(Box::new(move |limit| {
            drop(meter.shutdown_with_timeout(limit))
        }));
        if let Some(logger) = self.logger.take() {
            flush(Box::new(move |limit| {
                drop(logger.shutdown_with_timeout(limit))
            }));
        }
        drop(done);
        // Every sender dropped: all three finished, or the deadline passed.
        let _ = flushed.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

/// Installs logging (stdout and the settings' log file) and the exporters. Never fails: a log
/// file that cannot be opened or an exporter that cannot start is one warning, and the service
/// runs on. Must run inside the tokio runtime (the OTLP exporters' connections live there).
pub fn init(settings: &TelemetrySettings) -> Telemetry {
    let mut log_outputs: Vec<(&str, Box<dyn Write + Send>)> =
        vec![("stdout", Box::new(std::io::stdout()))];
    let file_error = match open_append(&settings.log_file) {
        Ok(file) => {
            log_outputs.push(("file", Box::new(file)));
            None
        }
        Err(error) => Some(error),
    };
    let (log_lines, log_writer) = log_writer::start(log_outputs, MAX_PENDING_BYTES);
    let log_level = || {
        EnvFilter::try_new(&settings.log_filter)
            .unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER))
    };
    // A request's fields come from its OpenTelemetry context, not from a span: spans are filtered by the
    // level like events. The filter's level hint matters: it sets the `log` crate's maximum
    // level, and cranelift logs every compilation step through `log` at debug and trace.
    let logs = tracing_subscriber::fmt::layer()
        .event_format(JsonLines)
        .fmt_fields(JsonMembers)
        .with_writer(log_lines.clone())
        .with_filter(log_level());

    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let resource = resource(settings);
    let mut problems = Vec::new();
    let logger = logger_provider(settings, &resource)
        .map_err(|error| problems.push(("log records", error)))
        .ok()
        .flatten();
    let tracer = tracer_provider(settings, &resource)
        .map_err(|error| problems.push(("spans", error)))
        .ok()
        .flatten();
    if let Some(provider) = &tracer {
        request_report::install(provider.tracer(HOST_TRACER));
    }
    let log_records = logger.as_ref().map(|provider| {
        // With a hint that passes the log filter's on: without one, the subscriber's maximum
        // level (and the `log` crate's, cranelift's) would become TRACE.
        let not_an_exporter = filter_fn(|metadata| !is_exporter(metadata.target()))
            .with_max_level_hint(tracing::level_filters::LevelFilter::TRACE);
        OpenTelemetryTracingBridge::new(provider).with_filter(log_level().and(not_an_exporter))
    });
    let metric_reader = settings
        .metric_export
        .as_ref()
        .map(|otlp| {
            let exporter = otlp::metric_exporter(otlp)?;
            Ok::<_, OTelSdkError>(
                PeriodicReader::builder(Reported::new(exporter, "metric"))
                    .with_interval(settings.metric_interval)
                    .build(),
            )
        })
        .transpose()
        .map_err(|error| problems.push(("metrics", error)))
        .ok()
        .flatten();
    let metric_push_interval = metric_reader.as_ref().map(|_| settings.metric_interval);
    let (metrics, meter) = Metrics::exported(resource, metric_reader);
    metrics.observe_dropped_log_lines(move || log_lines.dropped_by_output());
    tracing_subscriber::registry()
        .with(logs)
        .with(log_records)
        .init();

    if let Some(error) = file_error {
        tracing::warn!(path = %settings.log_file.display(), %error, "cannot write the log file; logging to stdout only");
    }
    for (signal, error) in problems {
        tracing::warn!(%error, "cannot start the exporter of {signal}; they are not exported");
    }
    let (exporter, endpoint) = settings.export.describe();
    if tracer.is_none() {
        tracing::info!(exporter = "none", "spans are not exported");
    } else {
        tracing::info!(exporter, endpoint, "spans go to {endpoint}");
    }
    if let Some(otlp) = &settings.metric_export {
        let endpoint = otlp.endpoint.as_str();
        let interval_ms = settings.metric_interval.as_millis() as u64;
        tracing::info!(
            endpoint,
            interval_ms,
            "metrics go to {endpoint} as well as /metrics"
        );
    }
    if let (Some(otlp), Some(_)) = (&settings.log_export, &logger) {
        let endpoint = otlp.endpoint.as_str();
        tracing::info!(endpoint, "log records go to {endpoint}");
    }
    Telemetry {
        metrics: Arc::new(metrics),
        metric_push_interval,
        tracer,
        meter,
        logger,
        _log_writer: log_writer,
    }
}

/// Whether events of `target` come from the exporters' own HTTP and gRPC stacks (`hyper`,
/// `hyper_util::client`, `opentelemetry_sdk`, ...).
fn is_exporter(target: &str) -> bool {
    EXPORTER_TARGETS.iter().any(|exporter| {
        target
            .strip_prefix(exporter)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::") || rest.starts_with('_'))
    })
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

/// The tracer provider of the exporter `settings` choose; `None` when spans are not exported.
fn tracer_provider(
    settings: &TelemetrySettings,
    resource: &Resource,
) -> Result<Option<SdkTracerProvider>, OTelSdkError> {
    // The SDK reads the other `OTEL_BSP_*` variables itself, checked at start. The queue is
    // bounded: when the exporter falls behind, new spans are dropped, never waited for.
    let batch = BatchConfigBuilder::default();
    let mut processor = match &settings.export {
        SpanExport::Off => return Ok(None),
        SpanExport::JaegerAgent { host, port } => {
            let exporter = AgentExporter::new(host, *port, settings.service_name.clone())
                .map_err(|error| OTelSdkError::InternalFailure(error.to_string()))?;
            let batch = batch
                .with_max_export_batch_size(
                    settings.span_batch_size.unwrap_or(SPANS_PER_AGENT_BATCH),
                )
                .with_max_export_timeout(
                    settings.span_export_timeout.unwrap_or(AGENT_EXPORT_TIMEOUT),
                );
            BatchSpanProcessor::builder(Reported::new(exporter, "span"), Tokio)
                .with_batch_config(batch.build())
                .build()
        }
        SpanExport::Otlp(otlp) => {
            // `OTEL_BSP_EXPORT_TIMEOUT` bounds an export too, when it is the shorter; the SDK's
            // default (30 s) would outlast the export's own timeout.
            let timeout = settings
                .span_export_timeout
                .map_or(otlp.timeout, |timeout| timeout.min(otlp.timeout));
            let exporter = otlp::span_exporter(otlp, timeout)?;
            BatchSpanProcessor::builder(Reported::new(exporter, "span"), Tokio)
                .with_batch_config(batch.with_max_export_timeout(timeout).build())
                .build()
        }
    };
    processor.set_resource(resource);
    let processor: Arc<dyn SpanProcessor> = Arc::new(processor);
    let _ = GUEST_SPANS.set(Arc::clone(&processor));
    Ok(Some(
        SdkTracerProvider::builder()
            .with_span_processor(Shared(processor))
            .with_resource(resource.clone())
            .build(),
    ))
}

/// The logger provider that sends log records where `settings` say; `None` when they are not
/// exported.
fn logger_provider(
    settings: &TelemetrySettings,
    resource: &Resource,
) -> Result<Option<SdkLoggerProvider>, OTelSdkError> {
    let Some(otlp) = &settings.log_export else {
        return Ok(None);
    };
    let exporter = otlp::log_exporter(otlp)?;
    // The `OTEL_BLRP_*` variables, checked at start, are the SDK's to read.
    let processor =
        opentelemetry_sdk::logs::BatchLogProcessor::builder(Reported::new(exporter, "log")).build();
    Ok(Some(
        SdkLoggerProvider::builder()
            .with_log_processor(processor)
            .with_resource(resource.clone())
            .build(),
    ))
}

/// What every span, metric and log record says of the process that sent it: the service and its version, this
/// process among the service's replicas, the machine, and `OTEL_RESOURCE_ATTRIBUTES`.
fn resource(settings: &TelemetrySettings) -> Resource {
    // Later wins: what the user set over what was detected, the service name over both.
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", uuid::Uuid::new_v4().to_string()),
            KeyValue::new("host.name", host_name()),
        ])
        .with_attributes(
            settings
                .resource_attributes
                .iter()
                .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
        )
        .with_service_name(settings.service_name.clone())
        .build()
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
