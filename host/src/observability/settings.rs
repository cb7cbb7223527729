//! The telemetry settings: where log lines go and which they keep, and where spans go and what
//! describes the process on them. The OpenTelemetry SDK's variables are read as every SDK reads
//! them (each is also a flag, its name in lower case with dashes), checked once at start: a bad
//! value is an error that names its variable, never a silent fallback. An empty value counts as
//! unset, as the SDK specification says.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

use crate::error::Error;

/// The service name on every span unless `OTEL_SERVICE_NAME` says otherwise.
pub const DEFAULT_SERVICE_NAME: &str = "tutorial-service";
/// The Jaeger agent's host unless `OTEL_EXPORTER_JAEGER_AGENT_HOST` says otherwise.
pub const DEFAULT_JAEGER_AGENT_HOST: &str = "localhost";
/// The Jaeger agent's UDP port unless `OTEL_EXPORTER_JAEGER_AGENT_PORT` says otherwise.
pub const DEFAULT_JAEGER_AGENT_PORT: u16 = 6831;
/// Where the JSON log lines are appended, relative to the working directory.
pub const DEFAULT_LOG_FILE: &str = "logs/app.log";
/// The log filter unless `RUST_LOG` says otherwise: the host's own lines from `info`, the
/// PostgreSQL client's from `warn` (its `info` lines are the server's notices, such as a table
/// that already exists at every start).
pub const DEFAULT_LOG_FILTER: &str = "info,tokio_postgres=warn";

/// Where log lines and spans go, and what names this process on its spans.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryArgs {
    /// File the JSON log lines are appended to.
    #[arg(long, env = "LOG_FILE", default_value = DEFAULT_LOG_FILE)]
    pub log_file: PathBuf,

    /// Which log lines are kept, as `tracing`'s filter directives (`info`, `host=debug,warn`);
    /// spans are exported whatever it says [default: info,tokio_postgres=warn].
    #[arg(long, env = "RUST_LOG")]
    pub log_filter: Option<String>,

    /// Name reported with every span [default: tutorial-service].
    #[arg(long, env = "OTEL_SERVICE_NAME")]
    pub service_name: Option<String>,

    /// Host of the Jaeger agent the spans go to, over UDP [default: localhost].
    #[arg(long, env = "OTEL_EXPORTER_JAEGER_AGENT_HOST")]
    pub jaeger_agent_host: Option<String>,

    /// UDP port of the Jaeger agent [default: 6831].
    #[arg(long, env = "OTEL_EXPORTER_JAEGER_AGENT_PORT", value_parser = optional_port)]
    pub jaeger_agent_port: Option<MaybePort>,

    /// The OpenTelemetry SDK's variables.
    #[command(flatten)]
    pub otel: OtelVariables,
}

// The SDK's variables, by name; each is described once, in `OTEL_VARIABLES`.
const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const METRICS_EXPORTER: &str = "OTEL_METRICS_EXPORTER";
const LOGS_EXPORTER: &str = "OTEL_LOGS_EXPORTER";
const METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
const OTLP_METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
const OTLP_METRICS_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL";
const OTLP_METRICS_HEADERS: &str = "OTEL_EXPORTER_OTLP_METRICS_HEADERS";
const OTLP_METRICS_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT";
const OTLP_METRICS_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION";
const OTLP_LOGS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT";
const OTLP_LOGS_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL";
const OTLP_LOGS_HEADERS: &str = "OTEL_EXPORTER_OTLP_LOGS_HEADERS";
const OTLP_LOGS_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT";
const OTLP_LOGS_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION";
const BLRP_SCHEDULE_DELAY: &str = "OTEL_BLRP_SCHEDULE_DELAY";
const BLRP_MAX_QUEUE_SIZE: &str = "OTEL_BLRP_MAX_QUEUE_SIZE";
const BLRP_MAX_EXPORT_BATCH_SIZE: &str = "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE";
const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
const OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
const OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
const OTLP_TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
const OTLP_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_COMPRESSION";
const OTLP_TRACES_COMPRESSION: &str = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION";
const BSP_SCHEDULE_DELAY: &str = "OTEL_BSP_SCHEDULE_DELAY";
const BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
const BSP_MAX_EXPORT_BATCH_SIZE: &str = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE";
const BSP_EXPORT_TIMEOUT: &str = "OTEL_BSP_EXPORT_TIMEOUT";
const BSP_MAX_CONCURRENT_EXPORTS: &str = "OTEL_BSP_MAX_CONCURRENT_EXPORTS";

/// The SDK's variables this host reads, each with its help: the one declaration of each, from
/// which the flags, `--help` and [`OtelVariables`] are made.
const OTEL_VARIABLES: &[(&str, &str)] = &[
    (
        TRACES_EXPORTER,
        "Where spans go: jaeger (UDP agent) | otlp | none [otlp when an OTLP endpoint for \
         spans is set, else jaeger]",
    ),
    (
        METRICS_EXPORTER,
        "Metrics pushed beside /metrics: otlp | none (or prometheus: /metrics only) [otlp \
         when an OTLP endpoint for metrics is set, else none]",
    ),
    (
        LOGS_EXPORTER,
        "Log lines also sent as OTLP log records: otlp | none [otlp when an OTLP endpoint \
         for logs is set, else none]",
    ),
    (
        SDK_DISABLED,
        "true: export no spans, metrics or logs (/metrics stays)",
    ),
    (
        OTLP_ENDPOINT,
        "Collector base URL, for all three signals [http://localhost:4318; over grpc :4317]",
    ),
    (
        OTLP_TRACES_ENDPOINT,
        "Full URL for spans (wins over the base URL)",
    ),
    (OTLP_PROTOCOL, "http/protobuf (the default) | grpc"),
    (
        OTLP_TRACES_PROTOCOL,
        "The same, for spans only (wins over the above)",
    ),
    (
        OTLP_HEADERS,
        "key=value,... sent with every export, values percent-encoded",
    ),
    (
        OTLP_TRACES_HEADERS,
        "The same, for spans only (wins over the above)",
    ),
    (OTLP_TIMEOUT, "Milliseconds one export may take [10000]"),
    (
        OTLP_TRACES_TIMEOUT,
        "The same, for spans only (wins over the above)",
    ),
    (OTLP_COMPRESSION, "none (the only value this build accepts)"),
    (OTLP_TRACES_COMPRESSION, "The same, for spans only"),
    (
        OTLP_METRICS_ENDPOINT,
        "Full URL for metrics (wins over the base URL)",
    ),
    (OTLP_METRICS_PROTOCOL, "Protocol for metrics only"),
    (OTLP_METRICS_HEADERS, "Headers for metrics only"),
    (OTLP_METRICS_TIMEOUT, "Timeout for metrics only"),
    (OTLP_METRICS_COMPRESSION, "Compression for metrics only"),
    (
        METRIC_EXPORT_INTERVAL,
        "Milliseconds between two pushes of every metric [60000]",
    ),
    (
        OTLP_LOGS_ENDPOINT,
        "Full URL for logs (wins over the base URL)",
    ),
    (OTLP_LOGS_PROTOCOL, "Protocol for logs only"),
    (OTLP_LOGS_HEADERS, "Headers for logs only"),
    (OTLP_LOGS_TIMEOUT, "Timeout for logs only"),
    (OTLP_LOGS_COMPRESSION, "Compression for logs only"),
    (
        BLRP_SCHEDULE_DELAY,
        "Milliseconds between log record batches [1000]",
    ),
    (
        BLRP_MAX_QUEUE_SIZE,
        "Log records waiting for export at most; more are dropped [2048]",
    ),
    (BLRP_MAX_EXPORT_BATCH_SIZE, "Log records per batch [512]"),
    (
        RESOURCE_ATTRIBUTES,
        "key=value,... on every span's resource, values percent-encoded",
    ),
    (
        BSP_SCHEDULE_DELAY,
        "Milliseconds between span batches [5000]",
    ),
    (
        BSP_MAX_QUEUE_SIZE,
        "Spans waiting for export at most; more are dropped [2048]",
    ),
    (
        BSP_MAX_EXPORT_BATCH_SIZE,
        "Spans per batch [128 to the agent, 512 over OTLP]",
    ),
    (
        BSP_EXPORT_TIMEOUT,
        "Milliseconds one export to the agent may take [5000]",
    ),
    (BSP_MAX_CONCURRENT_EXPORTS, "Exports at once [1]"),
];

/// The values of the SDK's variables (or of their flags) that were set, by variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtelVariables(BTreeMap<&'static str, String>);

impl OtelVariables {
    /// The value of `variable`, if it was set.
    pub fn get(&self, variable: &str) -> Option<String> {
        self.0.get(variable).cloned()
    }
}

/// `--otel-traces-exporter` for `OTEL_TRACES_EXPORTER`.
fn flag_of(variable: &str) -> String {
    variable.to_ascii_lowercase().replace('_', "-")
}

impl FromArgMatches for OtelVariables {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let set = OTEL_VARIABLES.iter().filter_map(|(variable, _)| {
            let value = matches.get_one::<String>(variable)?;
            Some((*variable, value.clone()))
        });
        Ok(OtelVariables(set.collect()))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = OtelVariables::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for OtelVariables {
    fn augment_args(command: Command) -> Command {
        let command = command.next_help_heading("OpenTelemetry SDK");
        OTEL_VARIABLES
            .iter()
            .fold(command, |command, (variable, help)| {
                command.arg(
                    Arg::new(*variable)
                        .long(flag_of(variable))
                        .env(*variable)
                        // Headers and resource attributes may hold keys: no value is shown.
                        .hide_env_values(true)
                        .value_name("VALUE")
                        .help(*help),
                )
            })
    }

    fn augment_args_for_update(command: Command) -> Command {
        OtelVariables::augment_args(command)
    }
}

/// The collector's address over HTTP unless told otherwise.
pub const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318";
/// The collector's address over gRPC unless told otherwise.
pub const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
/// What one export may take unless `OTEL_EXPORTER_OTLP_TIMEOUT` says otherwise (the SDK's 10 s).
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(10);
/// The default time between two pushes of the metrics (the SDK specification's minute).
pub const DEFAULT_METRIC_EXPORT_INTERVAL: Duration = Duration::from_secs(60);
/// Longest accepted export timeout: a minute is already far beyond any collector's answer.
const MAX_OTLP_TIMEOUT_MS: u64 = 60_000;
/// The largest span queue accepted: at about 1 KiB a span, 64 MiB at most.
const MAX_QUEUE_SIZE: u64 = 65_536;
/// Most `key=value` pairs in a list variable, and the longest such variable: they travel with
/// every export.
const MAX_PAIRS: usize = 64;
const MAX_LIST_BYTES: usize = 8 * 1024;

/// Where the host's spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanExport {
    /// Nowhere: `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`.
    Off,
    /// Thrift over UDP to a Jaeger agent, at this `host:port`.
    JaegerAgent {
        /// The agent's host name or address.
        host: String,
        /// The agent's UDP port.
        port: u16,
    },
    /// OTLP to a collector.
    Otlp(OtlpSettings),
}

impl SpanExport {
    /// The exporter's name and where it sends, for the start-up line (never the headers, which
    /// may hold keys).
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            SpanExport::Off => ("none", String::new()),
            SpanExport::JaegerAgent { host, port } => {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                ("jaeger", format!("udp://{host}:{port}"))
            }
            SpanExport::Otlp(settings) => match settings.protocol {
                OtlpProtocol::HttpProtobuf => ("otlp/http", settings.endpoint.clone()),
                OtlpProtocol::Grpc => ("otlp/grpc", settings.endpoint.clone()),
            },
        }
    }
}

/// Where spans go and what describes this process on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// The file the JSON log lines are appended to.
    pub log_file: PathBuf,
    /// Which log lines are kept (`tracing` filter directives).
    pub log_filter: String,
    /// `service.name` of every span; wins over one in `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: String,
    /// The exporter and its destination.
    pub export: SpanExport,
    /// How spans are queued and batched on their way out.
    pub batch: BatchSettings,
    /// Where the metrics are pushed, besides `/metrics`, if anywhere.
    pub metric_export: Option<OtlpSettings>,
    /// Time between two pushes of the metrics.
    pub metric_interval: Duration,
    /// Where log lines go as OTLP log records, besides stdout and the log file, if anywhere.
    pub log_export: Option<OtlpSettings>,
    /// How log records are queued and batched on their way out.
    pub log_batch: LogBatchSettings,
    /// `OTEL_RESOURCE_ATTRIBUTES`, on the resource of every span.
    pub resource_attributes: Vec<(String, String)>,
}

impl TelemetryArgs {
    /// The settings these values make: flags and variables, then the defaults. An empty value
    /// counts as unset, as the SDKs treat their variables; a bad one is an error naming it.
    pub fn settings(&self) -> Result<TelemetrySettings, Error> {
        let var = |name: &str| self.otel.get(name);
        let text = |setting: &Option<String>, default: &str| {
            setting
                .clone()
                .filter(|value| !value.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        let jaeger_agent = (
            text(&self.jaeger_agent_host, DEFAULT_JAEGER_AGENT_HOST),
            self.jaeger_agent_port
                .and_then(|MaybePort(port)| port)
                .unwrap_or(DEFAULT_JAEGER_AGENT_PORT),
        );
        let resource_attributes = resource_attributes(&var)?;
        // `OTEL_SERVICE_NAME` wins over a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, which
        // wins over the default, as the SDK specification orders them.
        let named_in_attributes = resource_attributes
            .iter()
            .rev()
            .find(|(key, value)| key == "service.name" && !value.is_empty())
            .map(|(_, value)| value.as_str());
        Ok(TelemetrySettings {
            log_file: self.log_file.clone(),
            log_filter: text(&self.log_filter, DEFAULT_LOG_FILTER),
            service_name: text(
                &self.service_name,
                named_in_attributes.unwrap_or(DEFAULT_SERVICE_NAME),
            ),
            export: span_export(&var, jaeger_agent)?,
            batch: batch_settings(&var)?,
            metric_export: otlp_export(&var, &METRICS)?,
            metric_interval: millis(&var, METRIC_EXPORT_INTERVAL, 1..=3_600_000)?
                .map_or(DEFAULT_METRIC_EXPORT_INTERVAL, Duration::from_millis),
            log_export: otlp_export(&var, &LOGS)?,
            log_batch: log_batch_settings(&var)?,
            resource_attributes,
        })
    }
}

/// A port setting: a port, or nothing when the setting is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaybePort(pub Option<u16>);

fn optional_port(value: &str) -> Result<MaybePort, String> {
    if value.is_empty() {
        return Ok(MaybePort(None));
    }
    match value.parse::<u16>() {
        Ok(port) if port > 0 => Ok(MaybePort(Some(port))),
        _ => Err("expected a port, 1 to 65535".to_string()),
    }
}

/// How spans reach an OTLP collector.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// HTTP with protobuf bodies, or gRPC.
    pub protocol: OtlpProtocol,
    /// The URL exports go to: over HTTP the full path (`.../v1/traces`), over gRPC the server.
    pub endpoint: String,
    /// Sent with every export; they often hold an API key, so `Debug` leaves their values out.
    pub headers: Vec<(String, String)>,
    /// The longest one export may take; a slower collector loses that batch.
    pub timeout: Duration,
}

impl std::fmt::Debug for OtlpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("OtlpSettings")
            .field("protocol", &self.protocol)
            .field("endpoint", &self.endpoint)
            .field("header_names", &header_names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// OTLP's two transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`: a POST of a protobuf body to `/v1/traces` (port 4318).
    HttpProtobuf,
    /// `grpc`: the `TraceService/Export` call (port 4317).
    Grpc,
}

/// The batch span processor's settings, checked: the SDK would panic on a zero delay or queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// Time between two batches.
    pub schedule_delay: Duration,
    /// Spans waiting at most; a span beyond is dropped, never waited for.
    pub max_queue_size: usize,
    /// Spans per export, when set; else the exporter's own default.
    pub max_export_batch_size: Option<usize>,
    /// The longest one export may take, when set; else the exporter's own default.
    pub export_timeout: Option<Duration>,
    /// Exports in flight at once.
    pub max_concurrent_exports: usize,
}

/// A whole number from `variable` within `range`, if set.
fn millis(
    var: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>, Error> {
    match var(variable)
        .map(|value| value.trim().to_string())
        .filter(|value| !value.is_empty())
    {
        None => Ok(None),
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|value| range.contains(value))
            .map(Some)
            .ok_or_else(|| {
                bad(
                    variable,
                    &format!(
                        "expected a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )
            }),
    }
}

/// The batch processor's variables (`OTEL_BSP_*`), within bounds that keep the queue bounded.
pub fn batch_settings(var: &impl Fn(&str) -> Option<String>) -> Result<BatchSettings, Error> {
    let number = |name: &'static str, range| millis(var, name, range);
    let max_queue_size = number(BSP_MAX_QUEUE_SIZE, 1..=MAX_QUEUE_SIZE)?.unwrap_or(2048) as usize;
    let max_export_batch_size =
        number(BSP_MAX_EXPORT_BATCH_SIZE, 1..=MAX_QUEUE_SIZE)?.map(|size| size as usize);
    if max_export_batch_size.is_some_and(|batch| batch > max_queue_size) {
        return Err(bad(
            BSP_MAX_EXPORT_BATCH_SIZE,
            "larger than OTEL_BSP_MAX_QUEUE_SIZE",
        ));
    }
    Ok(BatchSettings {
        schedule_delay: Duration::from_millis(
            number(BSP_SCHEDULE_DELAY, 1..=3_600_000)?.unwrap_or(5000),
        ),
        max_queue_size,
        max_export_batch_size,
        export_timeout: number(BSP_EXPORT_TIMEOUT, 1..=MAX_OTLP_TIMEOUT_MS)?
            .map(Duration::from_millis),
        max_concurrent_exports: number(BSP_MAX_CONCURRENT_EXPORTS, 1..=16)?.unwrap_or(1) as usize,
    })
}

/// The log record processor's settings, checked as the span processor's are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogBatchSettings {
    /// Time between two batches.
    pub schedule_delay: Duration,
    /// Records waiting at most; a record beyond is dropped, never waited for.
    pub max_queue_size: usize,
    /// Records per export.
    pub max_export_batch_size: usize,
}

/// The log record processor's variables (`OTEL_BLRP_*`).
pub fn log_batch_settings(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<LogBatchSettings, Error> {
    let number = |name: &'static str, range| millis(var, name, range);
    let max_queue_size = number(BLRP_MAX_QUEUE_SIZE, 1..=MAX_QUEUE_SIZE)?.unwrap_or(2048) as usize;
    let max_export_batch_size =
        number(BLRP_MAX_EXPORT_BATCH_SIZE, 1..=MAX_QUEUE_SIZE)?.map_or(512, |size| size as usize);
    if max_export_batch_size > max_queue_size {
        return Err(bad(
            BLRP_MAX_EXPORT_BATCH_SIZE,
            "larger than OTEL_BLRP_MAX_QUEUE_SIZE",
        ));
    }
    Ok(LogBatchSettings {
        schedule_delay: Duration::from_millis(
            number(BLRP_SCHEDULE_DELAY, 1..=3_600_000)?.unwrap_or(1000),
        ),
        max_queue_size,
        max_export_batch_size,
    })
}

/// One signal's OTLP variables: its exporter, its own endpoint and transport settings, and the
/// path OTLP/HTTP appends to a base endpoint for it.
pub struct Signal {
    exporter: &'static str,
    endpoint: &'static str,
    protocol: &'static str,
    headers: &'static str,
    timeout: &'static str,
    compression: &'static str,
    http_path: &'static str,
}

/// Spans' variables.
pub const TRACES: Signal = Signal {
    exporter: TRACES_EXPORTER,
    endpoint: OTLP_TRACES_ENDPOINT,
    protocol: OTLP_TRACES_PROTOCOL,
    headers: OTLP_TRACES_HEADERS,
    timeout: OTLP_TRACES_TIMEOUT,
    compression: OTLP_TRACES_COMPRESSION,
    http_path: "v1/traces",
};
/// Metrics' variables.
pub const METRICS: Signal = Signal {
    exporter: METRICS_EXPORTER,
    endpoint: OTLP_METRICS_ENDPOINT,
    protocol: OTLP_METRICS_PROTOCOL,
    headers: OTLP_METRICS_HEADERS,
    timeout: OTLP_METRICS_TIMEOUT,
    compression: OTLP_METRICS_COMPRESSION,
    http_path: "v1/metrics",
};
/// Logs' variables.
pub const LOGS: Signal = Signal {
    exporter: LOGS_EXPORTER,
    endpoint: OTLP_LOGS_ENDPOINT,
    protocol: OTLP_LOGS_PROTOCOL,
    headers: OTLP_LOGS_HEADERS,
    timeout: OTLP_LOGS_TIMEOUT,
    compression: OTLP_LOGS_COMPRESSION,
    http_path: "v1/logs",
};

/// Whether `OTEL_SDK_DISABLED` turns every export off.
fn sdk_disabled(read: &impl Fn(&str) -> Option<String>) -> Result<bool, Error> {
    match read(SDK_DISABLED).map(|value| value.to_ascii_lowercase()) {
        None => Ok(false),
        Some(value) if value == "true" => Ok(true),
        Some(value) if value == "false" => Ok(false),
        Some(_) => Err(bad(SDK_DISABLED, "expected `true` or `false`")),
    }
}

/// The exporter `signal`'s variable names, lower-cased; unset, `otlp` when an OTLP endpoint for
/// the signal is set (Spin's rule: set the endpoint and everything flows), else `default`.
fn exporter_named(
    read: &impl Fn(&str) -> Option<String>,
    signal: &Signal,
    default: &str,
) -> String {
    match read(signal.exporter) {
        Some(value) => value.to_ascii_lowercase(),
        None if read(signal.endpoint).is_some() || read(OTLP_ENDPOINT).is_some() => {
            "otlp".to_string()
        }
        None => default.to_string(),
    }
}

/// Where `signal` (metrics or logs) is pushed over OTLP, if anywhere.
pub fn otlp_export(
    var: &impl Fn(&str) -> Option<String>,
    signal: &Signal,
) -> Result<Option<OtlpSettings>, Error> {
    let read = |name: &str| {
        var(name)
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
    };
    let disabled = sdk_disabled(&read)?;
    let otlp = otlp_settings(&read, signal)?;
    let named = exporter_named(&read, signal, "none");
    let mut export = None;
    // Metrics may name two, as `otlp,prometheus`: `/metrics` serves Prometheus always.
    let names: Vec<&str> = if signal.exporter == METRICS_EXPORTER {
        named.split(',').map(str::trim).collect()
    } else {
        vec![named.as_str()]
    };
    for name in names {
        match name {
            "otlp" => export = Some(otlp.clone()),
            "none" => {}
            "prometheus" if signal.exporter == METRICS_EXPORTER => {}
            _ if signal.exporter == METRICS_EXPORTER => {
                return Err(bad(
                    signal.exporter,
                    "expected `otlp`, `prometheus`, `none`, or a list of them",
                ));
            }
            other if other.contains(',') => {
                return Err(bad(
                    signal.exporter,
                    "expected one exporter (`otlp` or `none`), not a list",
                ));
            }
            _ => return Err(bad(signal.exporter, "expected `otlp` or `none`")),
        }
    }
    Ok(export.filter(|_| !disabled))
}

/// The span export the variables ask for. `jaeger_agent` is where the `jaeger` exporter sends
/// (its own settings are [`TelemetryArgs`]' flags).
pub fn span_export(
    var: &impl Fn(&str) -> Option<String>,
    jaeger_agent: (String, u16),
) -> Result<SpanExport, Error> {
    let read = |name: &str| {
        var(name)
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
    };
    // Every variable is checked, the ones the chosen exporter ignores too: a typo in a setting
    // meant for later should not wait until then to show.
    let disabled = sdk_disabled(&read)?;
    let otlp = otlp_settings(&read, &TRACES)?;
    let export = match exporter_named(&read, &TRACES, "jaeger").as_str() {
        "jaeger" => {
            let (host, port) = jaeger_agent;
            SpanExport::JaegerAgent { host, port }
        }
        "none" => SpanExport::Off,
        "otlp" => SpanExport::Otlp(otlp),
        other if other.contains(',') => {
            return Err(bad(
                TRACES_EXPORTER,
                "expected one exporter (`jaeger`, `otlp` or `none`), not a list",
            ));
        }
        _ => return Err(bad(TRACES_EXPORTER, "expected `jaeger`, `otlp` or `none`")),
    };
    Ok(if disabled { SpanExport::Off } else { export })
}

/// `OTEL_RESOURCE_ATTRIBUTES` as `(key, value)` pairs, values percent-decoded.
pub fn resource_attributes(
    var: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, Error> {
    match var(RESOURCE_ATTRIBUTES).filter(|value| !value.trim().is_empty()) {
        None => Ok(Vec::new()),
        Some(list) => key_value_list(RESOURCE_ATTRIBUTES, &list),
    }
}

fn otlp_settings(
    read: &impl Fn(&str) -> Option<String>,
    signal: &Signal,
) -> Result<OtlpSettings, Error> {
    // The signal's own variable wins over the general one.
    let either = |specific: &'static str, general: &'static str| {
        read(specific)
            .map(|value| (specific, value))
            .or_else(|| read(general).map(|value| (general, value)))
    };
    let protocol = match either(signal.protocol, OTLP_PROTOCOL) {
        None => OtlpProtocol::HttpProtobuf,
        Some((variable, value)) => match value.to_ascii_lowercase().as_str() {
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            "grpc" => OtlpProtocol::Grpc,
            "http/json" => {
                return Err(bad(
                    variable,
                    "`http/json` is not supported; use `http/protobuf` or `grpc`",
                ));
            }
            _ => return Err(bad(variable, "expected `http/protobuf` or `grpc`")),
        },
    };
    if let Some((variable, value)) = either(signal.compression, OTLP_COMPRESSION)
        && !value.eq_ignore_ascii_case("none")
    {
        return Err(bad(
            variable,
            "only `none` is supported (no gzip in this build)",
        ));
    }
    let endpoint = match (read(signal.endpoint), read(OTLP_ENDPOINT)) {
        (Some(own), _) => checked_url(signal.endpoint, own)?,
        (None, Some(base)) => with_path(protocol, checked_url(OTLP_ENDPOINT, base)?, signal),
        (None, None) => match protocol {
            OtlpProtocol::HttpProtobuf => {
                with_path(protocol, DEFAULT_HTTP_ENDPOINT.to_string(), signal)
            }
            OtlpProtocol::Grpc => DEFAULT_GRPC_ENDPOINT.to_string(),
        },
    };
    let headers = match either(signal.headers, OTLP_HEADERS) {
        None => Vec::new(),
        Some((variable, list)) => {
            let headers = key_value_list(variable, &list)?;
            for (name, value) in &headers {
                // Neither is echoed: a header value is often a secret.
                http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| bad(variable, "a header name is not a valid HTTP name"))?;
                http::HeaderValue::from_str(value)
                    .map_err(|_| bad(variable, "a header value is not valid in HTTP"))?;
                if name.to_ascii_lowercase().ends_with("-bin") {
                    return Err(bad(variable, "binary (`-bin`) headers are not supported"));
                }
            }
            headers
        }
    };
    let timeout = match either(signal.timeout, OTLP_TIMEOUT) {
        None => DEFAULT_OTLP_TIMEOUT,
        Some((variable, millis)) => match millis.parse::<u64>() {
            Ok(millis) if (1..=MAX_OTLP_TIMEOUT_MS).contains(&millis) => {
                Duration::from_millis(millis)
            }
            _ => return Err(bad(variable, "expected milliseconds, from 1 to 60000")),
        },
    };
    Ok(OtlpSettings {
        protocol,
        endpoint,
        headers,
        timeout,
    })
}

/// `url` if it is an `http://` URL with a host. `https://` is refused at start rather than
/// failing at every export: this build carries no TLS stack.
fn checked_url(variable: &'static str, url: String) -> Result<String, Error> {
    let parsed: http::Uri = url
        .parse()
        .map_err(|_| bad(variable, "not a URL (expected http://host:port)"))?;
    if parsed
        .authority()
        .is_some_and(|authority| authority.as_str().contains('@'))
    {
        return Err(bad(
            variable,
            "credentials in the URL are not supported; send them in OTEL_EXPORTER_OTLP_HEADERS",
        ));
    }
    match parsed.scheme_str() {
        Some("http") if parsed.host().is_some_and(|host| !host.is_empty()) => Ok(url),
        Some("https") => Err(bad(
            variable,
            "https is not supported by this build (no TLS); send to a collector over http://",
        )),
        _ => Err(bad(variable, "expected an http:// URL with a host")),
    }
}

/// A base endpoint made the signal's URL: over HTTP, `/v1/traces` (`/v1/metrics`, `/v1/logs`)
/// after its path, as the OTLP exporter specification says; over gRPC the service path is
/// fixed, so the URL is kept.
fn with_path(protocol: OtlpProtocol, base: String, signal: &Signal) -> String {
    let path = signal.http_path;
    match protocol {
        OtlpProtocol::Grpc => base,
        OtlpProtocol::HttpProtobuf if base.ends_with('/') => format!("{base}{path}"),
        OtlpProtocol::HttpProtobuf => format!("{base}/{path}"),
    }
}

/// A W3C-baggage-like list, `key=value,key=value`, values percent-decoded, spaces around items
/// trimmed. The error never repeats the text: it may hold a secret.
fn key_value_list(variable: &'static str, list: &str) -> Result<Vec<(String, String)>, Error> {
    if list.len() > MAX_LIST_BYTES {
        return Err(bad(variable, "longer than 8 KiB"));
    }
    let mut pairs = Vec::new();
    for item in list
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let Some((key, value)) = item.split_once('=') else {
            return Err(bad(
                variable,
                "expected key=value pairs separated by commas",
            ));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(bad(variable, "a key is empty"));
        }
        let value = value.trim();
        if !is_percent_encoded(value) {
            return Err(bad(
                variable,
                "a value has a `%` not followed by two hex digits (write a literal % as %25)",
            ));
        }
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| bad(variable, "a value is not UTF-8 once percent-decoded"))?;
        pairs.push((key.to_string(), value.into_owned()));
        if pairs.len() > MAX_PAIRS {
            return Err(bad(variable, "more than 64 pairs"));
        }
    }
    Ok(pairs)
}

/// Whether every `%` in `value` starts an escape of two hex digits: a lone one would be sent
/// as it is, which is never what was meant.
fn is_percent_encoded(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.iter().enumerate().all(|(index, &byte)| {
        byte != b'%'
            || bytes
                .get(index + 1..index + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    })
}

fn bad(variable: &'static str, reason: &str) -> Error {
    Error::TelemetrySetting {
        variable,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        move |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    fn agent() -> (String, u16) {
        ("agent".to_string(), 6831)
    }

    fn otlp(pairs: &[(&str, &str)]) -> OtlpSettings {
        let mut all = vec![(TRACES_EXPORTER, "otlp")];
        all.extend_from_slice(pairs);
        match span_export(&vars(&all), agent()).unwrap() {
            SpanExport::Otlp(settings) => settings,
            other => panic!("expected OTLP, got {other:?}"),
        }
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        span_export(&vars(pairs), agent())
            .and_then(|_| resource_attributes(&vars(pairs)).map(|_| ()))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_jaeger_agent_is_the_default_exporter() {
        for unset in [&[][..], &[(TRACES_EXPORTER, "")][..]] {
            assert_eq!(
                span_export(&vars(unset), agent()).unwrap(),
                SpanExport::JaegerAgent {
                    host: "agent".to_string(),
                    port: 6831
                }
            );
        }
    }

    #[test]
    fn none_or_a_disabled_sdk_exports_nothing() {
        let off = [
            vec![(TRACES_EXPORTER, "none")],
            vec![(SDK_DISABLED, "true")],
            vec![(SDK_DISABLED, "TRUE"), (TRACES_EXPORTER, "otlp")],
        ];
        for pairs in off {
            assert_eq!(
                span_export(&vars(&pairs), agent()).unwrap(),
                SpanExport::Off
            );
        }
        let on = span_export(&vars(&[(SDK_DISABLED, "false")]), agent()).unwrap();
        assert_ne!(on, SpanExport::Off);
    }

    #[test]
    fn otlp_defaults_to_http_protobuf_on_port_4318_with_a_ten_second_timeout() {
        let settings = otlp(&[]);
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(settings.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(settings.timeout, Duration::from_secs(10));
        assert!(settings.headers.is_empty());
    }

    #[test]
    fn grpc_defaults_to_port_4317_and_keeps_a_base_endpoint_as_is() {
        assert_eq!(
            otlp(&[(OTLP_PROTOCOL, "grpc")]).endpoint,
            "http://localhost:4317"
        );
        let settings = otlp(&[(OTLP_PROTOCOL, "grpc"), (OTLP_ENDPOINT, "http://c:4317")]);
        assert_eq!(settings.endpoint, "http://c:4317");
    }

    #[test]
    fn over_http_a_base_endpoint_gets_the_traces_path_and_a_traces_endpoint_is_used_as_is() {
        assert_eq!(
            otlp(&[(OTLP_ENDPOINT, "http://c:4318")]).endpoint,
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            otlp(&[(OTLP_ENDPOINT, "http://c:4318/prefix/")]).endpoint,
            "http://c:4318/prefix/v1/traces"
        );
        assert_eq!(
            otlp(&[
                (OTLP_ENDPOINT, "http://ignored:4318"),
                (OTLP_TRACES_ENDPOINT, "http://c:9999/custom")
            ])
            .endpoint,
            "http://c:9999/custom"
        );
    }

    #[test]
    fn headers_and_timeout_are_read_and_percent_decoded() {
        let settings = otlp(&[
            (OTLP_HEADERS, "api-key=s%3Dcret, x-tenant = blue"),
            (OTLP_TIMEOUT, "2500"),
        ]);
        assert_eq!(
            settings.headers,
            vec![
                ("api-key".to_string(), "s=cret".to_string()),
                ("x-tenant".to_string(), "blue".to_string())
            ]
        );
        assert_eq!(settings.timeout, Duration::from_millis(2500));
        assert!(!format!("{settings:?}").contains("s=cret"));
    }

    #[test]
    fn a_value_with_a_percent_that_starts_no_escape_is_refused_without_echoing_it() {
        for list in [
            "api-key=top%ZZsecret",
            "api-key=secret%",
            "api-key=secret%4",
        ] {
            let error = key_value_list(OTLP_HEADERS, list).unwrap_err().to_string();
            assert!(
                error.contains(OTLP_HEADERS) && error.contains("%25"),
                "{error}"
            );
            assert!(!error.contains("secret"), "{error}");
        }
        assert!(key_value_list(OTLP_HEADERS, "a=100%25").is_ok());
    }

    #[test]
    fn resource_attributes_are_pairs_with_decoded_values() {
        let pairs = resource_attributes(&vars(&[(
            RESOURCE_ATTRIBUTES,
            "deployment.environment=demo,team=a%20b",
        )]))
        .unwrap();
        assert_eq!(
            pairs,
            vec![
                ("deployment.environment".to_string(), "demo".to_string()),
                ("team".to_string(), "a b".to_string())
            ]
        );
        assert!(resource_attributes(&vars(&[])).unwrap().is_empty());
    }

    #[test]
    fn a_bad_value_is_an_error_naming_its_variable_without_repeating_a_secret() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(TRACES_EXPORTER, "zipkin")], TRACES_EXPORTER),
            (&[(TRACES_EXPORTER, "otlp,jaeger")], TRACES_EXPORTER),
            (&[(SDK_DISABLED, "yes")], SDK_DISABLED),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_PROTOCOL, "http/json")],
                OTLP_PROTOCOL,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_PROTOCOL, "udp")],
                OTLP_PROTOCOL,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_ENDPOINT, "c:4318")],
                OTLP_ENDPOINT,
            ),
            (
                &[
                    (TRACES_EXPORTER, "otlp"),
                    (OTLP_TRACES_ENDPOINT, "https://c/v1/traces"),
                ],
                OTLP_TRACES_ENDPOINT,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_TIMEOUT, "10s")],
                OTLP_TIMEOUT,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_TIMEOUT, "0")],
                OTLP_TIMEOUT,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_HEADERS, "secretvalue")],
                OTLP_HEADERS,
            ),
            (
                &[(TRACES_EXPORTER, "otlp"), (OTLP_HEADERS, "k=secret\u{7f}")],
                OTLP_HEADERS,
            ),
            (
                &[(RESOURCE_ATTRIBUTES, "=secretvalue")],
                RESOURCE_ATTRIBUTES,
            ),
            (&[(RESOURCE_ATTRIBUTES, "k=%ff")], RESOURCE_ATTRIBUTES),
            (&[(OTLP_COMPRESSION, "gzip")], OTLP_COMPRESSION),
            (&[(OTLP_HEADERS, "trace-bin=secretvalue")], OTLP_HEADERS),
            (&[(OTLP_TRACES_HEADERS, "k")], OTLP_TRACES_HEADERS),
            (&[(OTLP_TRACES_TIMEOUT, "0")], OTLP_TRACES_TIMEOUT),
            (&[(OTLP_TRACES_PROTOCOL, "thrift")], OTLP_TRACES_PROTOCOL),
            (
                &[(OTLP_ENDPOINT, "http://user:secret@collector:4318")],
                OTLP_ENDPOINT,
            ),
        ];
        for (pairs, variable) in cases {
            let message = refused(pairs);
            assert!(message.starts_with(variable), "{message}");
            assert!(!message.contains('\n'), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
    }

    #[test]
    fn a_bad_otlp_setting_is_refused_even_while_otlp_is_not_chosen() {
        for pairs in [[(OTLP_PROTOCOL, "udp")], [(OTLP_TIMEOUT, "soon")]] {
            let message = span_export(&vars(&pairs), agent()).unwrap_err().to_string();
            assert!(message.starts_with(pairs[0].0), "{message}");
        }
    }

    #[test]
    fn values_are_trimmed_and_enumerations_case_insensitive() {
        let settings = otlp(&[
            (OTLP_PROTOCOL, " GRPC "),
            (OTLP_ENDPOINT, " http://c:4317 "),
        ]);
        assert_eq!(settings.protocol, OtlpProtocol::Grpc);
        assert_eq!(settings.endpoint, "http://c:4317");
        let off = span_export(
            &vars(&[(TRACES_EXPORTER, "None"), (SDK_DISABLED, " false ")]),
            agent(),
        );
        assert_eq!(off.unwrap(), SpanExport::Off);
    }

    #[test]
    fn the_spans_own_variables_win_over_the_general_ones() {
        let settings = otlp(&[
            (OTLP_PROTOCOL, "grpc"),
            (OTLP_TRACES_PROTOCOL, "http/protobuf"),
            (OTLP_HEADERS, "a=general"),
            (OTLP_TRACES_HEADERS, "a=traces"),
            (OTLP_TIMEOUT, "1000"),
            (OTLP_TRACES_TIMEOUT, "2000"),
        ]);
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(
            settings.headers,
            vec![("a".to_string(), "traces".to_string())]
        );
        assert_eq!(settings.timeout, Duration::from_millis(2000));
    }

    #[test]
    fn an_otlp_endpoint_alone_turns_every_signals_export_on_and_an_exporter_variable_wins() {
        let base = [(OTLP_ENDPOINT, "http://collector:4318")];
        assert!(matches!(
            span_export(&vars(&base), agent()).unwrap(),
            SpanExport::Otlp(_)
        ));
        let metrics = otlp_export(&vars(&base), &METRICS).unwrap().unwrap();
        assert_eq!(metrics.endpoint, "http://collector:4318/v1/metrics");
        let logs = otlp_export(&vars(&base), &LOGS).unwrap().unwrap();
        assert_eq!(logs.endpoint, "http://collector:4318/v1/logs");
        // A signal's own endpoint turns on that signal only.
        let own = [(OTLP_LOGS_ENDPOINT, "http://logs:4318/custom")];
        assert_eq!(otlp_export(&vars(&own), &METRICS).unwrap(), None);
        let logs = otlp_export(&vars(&own), &LOGS).unwrap().unwrap();
        assert_eq!(logs.endpoint, "http://logs:4318/custom");
        assert!(matches!(
            span_export(&vars(&own), agent()).unwrap(),
            SpanExport::JaegerAgent { .. }
        ));
        // Nothing set: nothing pushed, spans to the agent.
        assert_eq!(otlp_export(&vars(&[]), &METRICS).unwrap(), None);
        assert_eq!(otlp_export(&vars(&[]), &LOGS).unwrap(), None);
        // The exporter variable wins over the endpoint's rule, and the SDK switch over both.
        let off = [
            base[0],
            (METRICS_EXPORTER, "none"),
            (TRACES_EXPORTER, "jaeger"),
        ];
        assert_eq!(otlp_export(&vars(&off), &METRICS).unwrap(), None);
        assert!(matches!(
            span_export(&vars(&off), agent()).unwrap(),
            SpanExport::JaegerAgent { .. }
        ));
        let disabled = [base[0], (SDK_DISABLED, "true")];
        assert_eq!(otlp_export(&vars(&disabled), &LOGS).unwrap(), None);
    }

    #[test]
    fn metrics_may_name_a_list_with_prometheus_and_other_signals_may_not() {
        for (value, pushed) in [
            ("otlp,prometheus", true),
            ("prometheus", false),
            ("none", false),
        ] {
            let pairs = [(METRICS_EXPORTER, value)];
            assert_eq!(
                otlp_export(&vars(&pairs), &METRICS).unwrap().is_some(),
                pushed,
                "{value}"
            );
        }
        for (exporter, value, signal) in [
            (METRICS_EXPORTER, "otlp,console", &METRICS),
            (LOGS_EXPORTER, "otlp,none", &LOGS),
            (LOGS_EXPORTER, "prometheus", &LOGS),
        ] {
            let error = otlp_export(&vars(&[(exporter, value)]), signal)
                .unwrap_err()
                .to_string();
            assert!(error.contains(exporter), "{error}");
        }
    }

    #[test]
    fn a_signals_own_compression_wins_over_the_general_one() {
        let pairs = [
            (OTLP_COMPRESSION, "gzip"),
            (OTLP_METRICS_COMPRESSION, "none"),
        ];
        assert!(otlp_settings(&vars(&pairs), &METRICS).is_ok());
        let error = otlp_settings(&vars(&pairs), &LOGS).unwrap_err().to_string();
        assert!(error.contains(OTLP_COMPRESSION), "{error}");
    }

    #[test]
    fn the_batch_settings_are_bounded_and_a_zero_is_refused() {
        let defaults = batch_settings(&vars(&[])).unwrap();
        assert_eq!(defaults.max_queue_size, 2048);
        assert_eq!(defaults.schedule_delay, Duration::from_secs(5));
        assert_eq!(defaults.max_export_batch_size, None);
        let set = batch_settings(&vars(&[
            (BSP_MAX_QUEUE_SIZE, "100"),
            (BSP_MAX_EXPORT_BATCH_SIZE, "50"),
            (BSP_EXPORT_TIMEOUT, "700"),
        ]))
        .unwrap();
        assert_eq!(set.max_export_batch_size, Some(50));
        assert_eq!(set.export_timeout, Some(Duration::from_millis(700)));
        for (variable, value) in [
            (BSP_SCHEDULE_DELAY, "0"),
            (BSP_MAX_QUEUE_SIZE, "0"),
            (BSP_MAX_QUEUE_SIZE, "10000000"),
            (BSP_EXPORT_TIMEOUT, "0"),
            (BSP_MAX_CONCURRENT_EXPORTS, "0"),
            (BSP_MAX_EXPORT_BATCH_SIZE, "4096"),
        ] {
            let message = batch_settings(&vars(&[(variable, value)]))
                .unwrap_err()
                .to_string();
            assert!(message.starts_with(variable), "{message}");
        }
    }
}
