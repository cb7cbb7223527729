//! The telemetry settings: where log lines go and which they keep, and which exporter each
//! signal has. The OpenTelemetry SDK reads its own variables (endpoints, headers, timeouts,
//! compression, batches); the host reads only what the SDK leaves to its caller: each signal's
//! exporter and transport, `OTEL_SDK_DISABLED`, the resource, and the Jaeger agent (an exporter
//! of the host's). The SDK ignores a value it cannot use without a word, so every documented
//! variable is checked once at start, before any builder reads it: a bad value is an error that
//! names its variable. An empty value counts as unset, as the SDK specification says.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

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

    /// UDP port of the Jaeger agent.
    #[arg(
        long,
        env = "OTEL_EXPORTER_JAEGER_AGENT_PORT",
        default_value_t = DEFAULT_JAEGER_AGENT_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub jaeger_agent_port: u16,
}

/// The environment, as the configuration reads it: a variable's value by name.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// What a variable's value must be for the SDK (or the host) to read it as meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One of these words, in any case; `true`: or a comma-separated list of them.
    Word(&'static [&'static str], bool),
    /// A whole number in this range, with nothing around it (the SDK ignores any other).
    Number(u64, u64),
    /// A `QUEUE` number no larger than the queue this variable names (the SDK would shrink it).
    Batch(&'static str),
    /// An `http://` URL with a host.
    Url,
    /// `key=value,...`, values percent-encoded; `true`: each one an HTTP header the SDK sends.
    Pairs(bool),
    /// One of these words, exactly: the SDK matches them case-sensitively.
    Exact(&'static [&'static str]),
    /// A fraction from 0 to 1.
    Ratio,
}

use Kind::{Batch, Exact, Number, Pairs, Ratio, Url, Word};

const PROTOCOL: Kind = Word(&["http/protobuf", "grpc"], false);
/// No compression feature is built in: the SDK would ignore `gzip` and send uncompressed.
const COMPRESSION: Kind = Word(&["none"], false);
const HEADERS: Kind = Pairs(true);
const MILLIS: Kind = Number(1, 3_600_000);
/// A minute is already far beyond any collector's answer.
const TIMEOUT: Kind = Number(1, 60_000);
/// At about 1 KiB a span, 64 MiB at most.
const QUEUE: Kind = Number(1, 65_536);

/// Every OpenTelemetry variable that is not a flag, what its value must be, and its line under
/// `--help`. One line each: a table.
#[rustfmt::skip]
const VARIABLES: &[(&str, Kind, &str)] = &[
    ("OTEL_TRACES_EXPORTER", Word(&["jaeger", "otlp", "none"], false), "jaeger (UDP agent) | otlp | none [otlp when an OTLP endpoint for spans is set, else jaeger]"),
    ("OTEL_METRICS_EXPORTER", Word(&["otlp", "prometheus", "none"], true), "otlp | none | prometheus (/metrics only), or a list [otlp when an OTLP endpoint for metrics is set, else none]"),
    ("OTEL_LOGS_EXPORTER", Word(&["otlp", "none"], false), "otlp | none [otlp when an OTLP endpoint for logs is set, else none]"),
    ("OTEL_SDK_DISABLED", Word(&["true", "false"], false), "true: export no span, metric or log record (/metrics stays)"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", Url, "Collector base URL, for all three signals [http://localhost:4318; grpc: :4317]"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Url, "Full URL for spans, used as is"),
    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", Url, "Full URL for metrics, used as is"),
    ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", Url, "Full URL for logs, used as is"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", PROTOCOL, "http/protobuf (the default) | grpc"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", PROTOCOL, "The same, for spans only"),
    ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", PROTOCOL, "The same, for metrics only"),
    ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", PROTOCOL, "The same, for logs only"),
    ("OTEL_EXPORTER_OTLP_HEADERS", HEADERS, "key=value,... sent with every export, values percent-encoded"),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", HEADERS, "The same, for spans only (replaces it)"),
    ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", HEADERS, "The same, for metrics only"),
    ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", HEADERS, "The same, for logs only"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", TIMEOUT, "Milliseconds one export may take [10000]"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", TIMEOUT, "The same, for spans only"),
    ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", TIMEOUT, "The same, for metrics only"),
    ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", TIMEOUT, "The same, for logs only"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", COMPRESSION, "none, the only value of this build"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", COMPRESSION, "The same, for spans only"),
    ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", COMPRESSION, "The same, for metrics only"),
    ("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", COMPRESSION, "The same, for logs only"),
    ("OTEL_METRIC_EXPORT_INTERVAL", MILLIS, "Milliseconds between two pushes of every metric [60000]"),
    ("OTEL_BSP_SCHEDULE_DELAY", MILLIS, "Milliseconds between span batches [5000]"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", QUEUE, "Spans waiting for export at most; more are dropped [2048]"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", Batch("OTEL_BSP_MAX_QUEUE_SIZE"), "Spans per batch [128 to the agent, 512 over OTLP]"),
    ("OTEL_BSP_EXPORT_TIMEOUT", TIMEOUT, "Milliseconds one span export may take [5000 to the agent; OTLP: its timeout]"),
    ("OTEL_BSP_MAX_CONCURRENT_EXPORTS", Number(1, 16), "Span exports at once [1]"),
    ("OTEL_BLRP_SCHEDULE_DELAY", MILLIS, "Milliseconds between log record batches [1000]"),
    ("OTEL_BLRP_MAX_QUEUE_SIZE", QUEUE, "Log records waiting at most; more are dropped [2048]"),
    ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", Batch("OTEL_BLRP_MAX_QUEUE_SIZE"), "Log records per batch [512]"),
    ("OTEL_RESOURCE_ATTRIBUTES", Pairs(false), "key=value,... on every signal's resource, values percent-encoded"),
    ("OTEL_TRACES_SAMPLER", Exact(&["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"]), "Which traces are recorded [parentbased_always_on]"),
    ("OTEL_TRACES_SAMPLER_ARG", Ratio, "The ratio of the traceidratio samplers, 0 to 1 [1]"),
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", Number(0, u32::MAX as u64), "Attributes kept on one span [128]"),
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", Number(0, u32::MAX as u64), "Events kept on one span [128]"),
    ("OTEL_SPAN_LINK_COUNT_LIMIT", Number(0, u32::MAX as u64), "Links kept on one span [128]"),
    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", Word(&["cumulative"], false), "cumulative, the only one: /metrics and the push show the same sums"),
];

/// The names of the variables of [`VARIABLES`].
pub fn variables() -> impl Iterator<Item = &'static str> {
    VARIABLES.iter().map(|(name, _, _)| *name)
}

/// The section of `--help` that lists the variables of [`VARIABLES`], which have no flags.
pub fn variables_help() -> String {
    let mut help = String::from(
        "OpenTelemetry (environment variables only, checked at start: a value the SDK would \
         refuse or ignore is an error; the SDK reads them, the host the exporters, protocols, \
         OTEL_SDK_DISABLED and OTEL_RESOURCE_ATTRIBUTES; no spaces around a number or a URL):\n",
    );
    for (name, _, line) in VARIABLES {
        help.push_str(&format!("  {name}\n          {line}\n"));
    }
    help
}

/// Checks every variable of [`VARIABLES`] that `var` gives, as the SDK will read it; the error
/// names the variable and never repeats its value (headers hold keys).
pub fn check(var: Env) -> Result<(), Error> {
    let general_headers = text(var, "OTEL_EXPORTER_OTLP_HEADERS").is_some();
    for &(name, kind, _) in VARIABLES {
        let Some(value) = var(name) else { continue };
        let reason = match value.to_str() {
            None => Some("not UTF-8 text".to_string()),
            // The SDK takes a signal's own headers, even blank, over the general ones, and
            // spaces for a URL.
            Some(value)
                if value.trim().is_empty()
                    && (kind == HEADERS && general_headers || kind == Url && !value.is_empty()) =>
            {
                Some("blank, which the SDK would not take for unset; unset it".into())
            }
            // Commas alone: no header, yet it replaces the general ones all the same.
            Some(value)
                if kind == HEADERS
                    && name != "OTEL_EXPORTER_OTLP_HEADERS"
                    && general_headers
                    && key_value_list(value, true).is_ok_and(|pairs| pairs.is_empty()) =>
            {
                Some("holds no header, yet would replace OTEL_EXPORTER_OTLP_HEADERS".into())
            }
            Some(value) if value.trim().is_empty() => None,
            Some(value) => checked(kind, value, var).err(),
        };
        if let Some(reason) = reason {
            return Err(Error::TelemetrySetting {
                variable: name,
                reason,
            });
        }
    }
    Ok(())
}

/// Why `value` is not what `kind` asks, if it is not.
fn checked(kind: Kind, value: &str, var: Env) -> Result<(), String> {
    match kind {
        Word(words, list) => {
            let known = |word: &str| words.iter().any(|w| w.eq_ignore_ascii_case(word.trim()));
            let or_list = if list { ", or a list of them" } else { "" };
            (value.split(',').all(known) && (list || !value.contains(',')))
                .then_some(())
                .ok_or_else(|| format!("expected {}{or_list}", words.join(" | ")))
        }
        Number(low, high) => match value.parse::<u64>() {
            Ok(number) if (low..=high).contains(&number) => Ok(()),
            _ => Err(format!("expected a whole number from {low} to {high}")),
        },
        Batch(queue) => match checked(QUEUE, value, var).map(|()| value.parse::<u64>()) {
            Ok(Ok(size)) if size > number(var, queue).unwrap_or(2048) => {
                Err(format!("larger than {queue}"))
            }
            other => other.map(drop),
        },
        Url => checked_url(value),
        Pairs(headers) => key_value_list(value, headers).map(drop),
        Exact(words) => (words.contains(&value))
            .then_some(())
            .ok_or_else(|| format!("expected {} (in lower case)", words.join(" | "))),
        Ratio => match value.parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(()),
            _ => Err("expected a fraction from 0 to 1".to_string()),
        },
    }
}

/// Why `url` is not an `http://` URL with a host. `https://` is refused at start rather than
/// failing at every export: this build carries no TLS stack.
fn checked_url(url: &str) -> Result<(), String> {
    let parsed: http::Uri = url
        .parse()
        .map_err(|_| "not a URL (expected http://host:port)")?;
    if parsed
        .authority()
        .is_some_and(|at| at.as_str().contains('@'))
    {
        return Err("credentials in the URL are not supported; send them as headers".into());
    }
    match parsed.scheme_str() {
        Some("http") if parsed.host().is_some_and(|host| !host.is_empty()) => Ok(()),
        Some("https") => Err("https is not supported by this build (no TLS); use http://".into()),
        _ => Err("expected an http:// URL with a host".into()),
    }
}

/// A W3C-baggage-like list, `key=value,key=value`, values percent-decoded, spaces around items
/// trimmed, as the SDK splits headers. With `headers`, each pair must be one the SDK sends (it
/// drops any other without a word). The error never repeats the text: it may hold a secret.
fn key_value_list(list: &str, headers: bool) -> Result<Vec<(String, String)>, String> {
    if list.len() > MAX_LIST_BYTES {
        return Err("longer than 8 KiB".into());
    }
    let mut pairs = Vec::new();
    for item in list
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (key, value) = item
            .split_once('=')
            .ok_or("expected key=value pairs separated by commas")?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err("a key is empty".into());
        }
        // The SDK would send a `%` that starts no escape as it is: never what was meant.
        let hex = |after: &str| {
            after
                .get(..2)
                .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        if !value.split('%').skip(1).all(hex) {
            return Err(
                "a `%` starts no escape of two hex digits (write a literal % as %25)".into(),
            );
        }
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| "a value is not UTF-8 once percent-decoded")?;
        if headers && (value.is_empty() || http::HeaderValue::from_str(&value).is_err()) {
            return Err("a header value is empty or not valid in HTTP".into());
        }
        if headers && http::HeaderName::from_bytes(key.as_bytes()).is_err() {
            return Err("a header name is not a valid HTTP name".into());
        }
        if headers && key.to_ascii_lowercase().ends_with("-bin") {
            return Err("binary (`-bin`) headers are not supported".into());
        }
        pairs.push((key.to_string(), value.into_owned()));
        if pairs.len() > MAX_PAIRS {
            return Err("more than 64 pairs".into());
        }
    }
    Ok(pairs)
}

/// Most `key=value` pairs in a list, and the longest list: they travel with every export.
const MAX_PAIRS: usize = 64;
const MAX_LIST_BYTES: usize = 8 * 1024;

/// `name`'s value trimmed, unless unset, empty or not text (which [`check`] refuses).
fn text(var: Env, name: &str) -> Option<String> {
    let value = var(name)?.into_string().ok()?;
    Some(value.trim().to_string()).filter(|value| !value.is_empty())
}

/// `name`'s value lower-cased: the words the host reads are compared without case.
fn word(var: Env, name: &str) -> Option<String> {
    text(var, name).map(|value| value.to_ascii_lowercase())
}

/// `name`'s value as a number, once [`check`] has seen it.
fn number(var: Env, name: &str) -> Option<u64> {
    text(var, name)?.parse().ok()
}

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
    /// The exporter's name and where it sends, for the start-up line.
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            SpanExport::Off => ("none", String::new()),
            SpanExport::JaegerAgent { host, port } if host.contains(':') => {
                ("jaeger", format!("udp://[{host}]:{port}"))
            }
            SpanExport::JaegerAgent { host, port } => ("jaeger", format!("udp://{host}:{port}")),
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
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: unset, the host's default to the agent is not the SDK's.
    pub span_batch_size: Option<usize>,
    /// `OTEL_BSP_EXPORT_TIMEOUT`: unset, the host's default is not the SDK's either.
    pub span_export_timeout: Option<Duration>,
    /// Where the metrics are pushed, besides `/metrics`, if anywhere.
    pub metric_export: Option<OtlpSettings>,
    /// Time between two pushes of the metrics: the host reads the stored users' count before
    /// each.
    pub metric_interval: Duration,
    /// Where log lines go as OTLP log records, besides stdout and the log file, if anywhere.
    pub log_export: Option<OtlpSettings>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, decoded: the SDK's own reading leaves `%20` as it is.
    pub resource_attributes: Vec<(String, String)>,
}

impl TelemetryArgs {
    /// The settings these flags and the variables `var` gives make, once every variable of
    /// [`VARIABLES`] is checked. An empty value counts as unset.
    pub fn settings(&self, var: Env) -> Result<TelemetrySettings, Error> {
        check(var)?;
        let unless_empty = |setting: &Option<String>, default: &str| {
            let setting = setting.clone().filter(|value| !value.is_empty());
            setting.unwrap_or_else(|| default.to_string())
        };
        let attributes = text(var, "OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
        let resource_attributes = key_value_list(&attributes, false).unwrap_or_default();
        // `OTEL_SERVICE_NAME` wins over a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, which
        // wins over the default, as the SDK specification orders them.
        let named_in_attributes = resource_attributes
            .iter()
            .rev()
            .find(|(key, value)| key == "service.name" && !value.is_empty())
            .map(|(_, value)| value.as_str());
        let disabled = word(var, "OTEL_SDK_DISABLED").as_deref() == Some("true");
        let export = match exporter(var, TRACES, "jaeger").as_str() {
            _ if disabled => SpanExport::Off,
            "jaeger" => SpanExport::JaegerAgent {
                host: unless_empty(&self.jaeger_agent_host, DEFAULT_JAEGER_AGENT_HOST),
                port: self.jaeger_agent_port,
            },
            "otlp" => SpanExport::Otlp(otlp_settings(var, TRACES)),
            _ => SpanExport::Off,
        };
        // Metrics may name two, as `otlp,prometheus`: `/metrics` serves Prometheus always.
        let pushed = |signal: Signal| {
            let named = exporter(var, signal, "none");
            let otlp = named.split(',').any(|name| name.trim() == "otlp");
            (otlp && !disabled).then(|| otlp_settings(var, signal))
        };
        Ok(TelemetrySettings {
            log_file: self.log_file.clone(),
            log_filter: unless_empty(&self.log_filter, DEFAULT_LOG_FILTER),
            service_name: unless_empty(
                &self.service_name,
                named_in_attributes.unwrap_or(DEFAULT_SERVICE_NAME),
            ),
            export,
            span_batch_size: number(var, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE").map(|n| n as usize),
            span_export_timeout: number(var, "OTEL_BSP_EXPORT_TIMEOUT").map(Duration::from_millis),
            metric_export: pushed(METRICS),
            // The SDK specification's minute unless set.
            metric_interval: Duration::from_millis(
                number(var, "OTEL_METRIC_EXPORT_INTERVAL").unwrap_or(60_000),
            ),
            log_export: pushed(LOGS),
            resource_attributes,
        })
    }
}

/// What the host needs to know of a signal's OTLP export; the SDK reads the rest itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// HTTP with protobuf bodies, or gRPC: the SDK leaves the transport to its caller.
    pub protocol: OtlpProtocol,
    /// The URL exports go to, as the SDK resolves it, for the start-up line.
    pub endpoint: String,
    /// The longest one export may take: the SDK bounds only its own HTTP clients' sends.
    pub timeout: Duration,
}

/// OTLP's two transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`: a POST of a protobuf body to `/v1/traces` (port 4318).
    HttpProtobuf,
    /// `grpc`: the `TraceService/Export` call (port 4317).
    Grpc,
}

/// A signal: its exporter's variable, its name in its own `OTEL_EXPORTER_OTLP_*` variables, and
/// the path OTLP/HTTP appends to a base endpoint for it.
#[derive(Clone, Copy)]
struct Signal(&'static str, &'static str, &'static str);

const TRACES: Signal = Signal("OTEL_TRACES_EXPORTER", "TRACES", "v1/traces");
const METRICS: Signal = Signal("OTEL_METRICS_EXPORTER", "METRICS", "v1/metrics");
const LOGS: Signal = Signal("OTEL_LOGS_EXPORTER", "LOGS", "v1/logs");

/// The exporter `signal`'s variable names, lower-cased; unset, `otlp` when an OTLP endpoint for
/// the signal is set (Spin's rule: set the endpoint and everything flows), else `default`.
fn exporter(var: Env, signal: Signal, default: &str) -> String {
    let endpoint = otlp_variable(var, signal, "ENDPOINT");
    word(var, signal.0)
        .unwrap_or_else(|| if endpoint.is_some() { "otlp" } else { default }.to_string())
}

/// The signal's own `OTEL_EXPORTER_OTLP_<SIGNAL>_<WHAT>`, else the general one.
fn otlp_variable(var: Env, Signal(_, signal, _): Signal, what: &str) -> Option<String> {
    text(var, &format!("OTEL_EXPORTER_OTLP_{signal}_{what}"))
        .or_else(|| text(var, &format!("OTEL_EXPORTER_OTLP_{what}")))
}

/// `signal`'s transport, endpoint and timeout, as the SDK resolves them.
fn otlp_settings(var: Env, signal: Signal) -> OtlpSettings {
    let protocol = match otlp_variable(var, signal, "PROTOCOL") {
        Some(protocol) if protocol.eq_ignore_ascii_case("grpc") => OtlpProtocol::Grpc,
        _ => OtlpProtocol::HttpProtobuf,
    };
    let own = text(var, &format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.1));
    let base = text(var, "OTEL_EXPORTER_OTLP_ENDPOINT");
    let endpoint = match (own, protocol) {
        (Some(own), _) => own,
        // gRPC's path is the service's, never the endpoint's.
        (None, OtlpProtocol::Grpc) => base.unwrap_or_else(|| "http://localhost:4317".into()),
        (None, OtlpProtocol::HttpProtobuf) => {
            let base = base.unwrap_or_else(|| "http://localhost:4318".into());
            format!("{}/{}", base.strip_suffix('/').unwrap_or(&base), signal.2)
        }
    };
    // The SDK's ten seconds unless set.
    let timeout = otlp_variable(var, signal, "TIMEOUT").and_then(|millis| millis.parse().ok());
    OtlpSettings {
        protocol,
        endpoint,
        timeout: Duration::from_millis(timeout.unwrap_or(10_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TelemetryArgs {
        TelemetryArgs {
            log_file: PathBuf::from(DEFAULT_LOG_FILE),
            log_filter: None,
            service_name: None,
            jaeger_agent_host: Some("agent".to_string()),
            jaeger_agent_port: DEFAULT_JAEGER_AGENT_PORT,
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        move |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| OsString::from(value))
        }
    }

    fn settings(pairs: &[(&str, &str)]) -> TelemetrySettings {
        args().settings(&env(pairs)).unwrap()
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        args().settings(&env(pairs)).unwrap_err().to_string()
    }

    fn otlp(pairs: &[(&str, &str)]) -> OtlpSettings {
        let mut all = vec![("OTEL_TRACES_EXPORTER", "otlp")];
        all.extend_from_slice(pairs);
        match settings(&all).export {
            SpanExport::Otlp(settings) => settings,
            other => panic!("expected OTLP, got {other:?}"),
        }
    }

    #[test]
    fn a_signals_headers_that_hold_none_may_not_replace_the_general_ones() {
        let general = ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s");
        for none in [" ", ",", " , "] {
            let error = refused(&[general, ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", none)]);
            assert!(
                error.contains("OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
                "{error}"
            );
        }
        // Without general headers there is nothing to replace.
        settings(&[("OTEL_EXPORTER_OTLP_TRACES_HEADERS", ",")]);
        settings(&[("OTEL_EXPORTER_OTLP_HEADERS", ",")]);
    }

    #[test]
    fn a_sampler_or_span_limit_the_sdk_would_ignore_is_refused() {
        for (name, bad) in [
            ("OTEL_TRACES_SAMPLER", "always-off"),
            ("OTEL_TRACES_SAMPLER", "ALWAYS_OFF"),
            ("OTEL_TRACES_SAMPLER_ARG", "10%"),
            ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ("OTEL_SPAN_EVENT_COUNT_LIMIT", "-1"),
            ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ] {
            let error = refused(&[(name, bad)]);
            assert!(error.contains(name) && !error.contains(bad), "{error}");
        }
        settings(&[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_SPAN_LINK_COUNT_LIMIT", "8"),
        ]);
    }

    #[test]
    fn the_jaeger_agent_is_the_default_exporter() {
        for unset in [&[][..], &[("OTEL_TRACES_EXPORTER", "")][..]] {
            assert_eq!(
                settings(unset).export,
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
            vec![("OTEL_TRACES_EXPORTER", "none")],
            vec![("OTEL_SDK_DISABLED", "true")],
            vec![
                ("OTEL_SDK_DISABLED", "TRUE"),
                ("OTEL_TRACES_EXPORTER", "otlp"),
            ],
        ];
        for pairs in off {
            assert_eq!(settings(&pairs).export, SpanExport::Off);
        }
        assert_ne!(
            settings(&[("OTEL_SDK_DISABLED", "false")]).export,
            SpanExport::Off
        );
    }

    #[test]
    fn otlp_defaults_to_http_protobuf_on_port_4318_with_a_ten_second_timeout() {
        let settings = otlp(&[]);
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(settings.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(settings.timeout, Duration::from_secs(10));
    }

    #[test]
    fn grpc_defaults_to_port_4317_and_keeps_a_base_endpoint_as_is() {
        let grpc = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
        assert_eq!(otlp(&[grpc]).endpoint, "http://localhost:4317");
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        assert_eq!(otlp(&[grpc, base]).endpoint, "http://c:4317");
    }

    #[test]
    fn over_http_a_base_endpoint_gets_the_traces_path_and_a_traces_endpoint_is_used_as_is() {
        let endpoint = |base| otlp(&[("OTEL_EXPORTER_OTLP_ENDPOINT", base)]).endpoint;
        assert_eq!(endpoint("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(
            endpoint("http://c:4318/prefix/"),
            "http://c:4318/prefix/v1/traces"
        );
        let own = otlp(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9999/custom"),
        ]);
        assert_eq!(own.endpoint, "http://c:9999/custom");
    }

    #[test]
    fn the_spans_own_variables_win_over_the_general_ones_and_words_ignore_case() {
        let settings = otlp(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", " GRPC "),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2000"),
        ]);
        assert_eq!(settings.protocol, OtlpProtocol::Grpc);
        assert_eq!(settings.timeout, Duration::from_millis(2000));
        let off = [
            ("OTEL_TRACES_EXPORTER", "None"),
            ("OTEL_SDK_DISABLED", " false "),
        ];
        assert_eq!(self::settings(&off).export, SpanExport::Off);
    }

    #[test]
    fn an_otlp_endpoint_alone_turns_every_signals_export_on_and_an_exporter_variable_wins() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        let all = settings(&[base]);
        assert!(matches!(all.export, SpanExport::Otlp(_)));
        let metrics = all.metric_export.unwrap();
        assert_eq!(metrics.endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(
            all.log_export.unwrap().endpoint,
            "http://collector:4318/v1/logs"
        );
        // A signal's own endpoint turns on that signal only.
        let own = settings(&[(
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "http://logs:4318/custom",
        )]);
        assert_eq!(own.metric_export, None);
        assert_eq!(own.log_export.unwrap().endpoint, "http://logs:4318/custom");
        assert!(matches!(own.export, SpanExport::JaegerAgent { .. }));
        // Nothing set: nothing pushed, spans to the agent.
        let none = settings(&[]);
        assert_eq!((none.metric_export, none.log_export), (None, None));
        // The exporter variable wins over the endpoint's rule, and the SDK switch over both.
        let off = settings(&[
            base,
            ("OTEL_METRICS_EXPORTER", "none"),
            ("OTEL_TRACES_EXPORTER", "jaeger"),
        ]);
        assert_eq!(off.metric_export, None);
        assert!(matches!(off.export, SpanExport::JaegerAgent { .. }));
        let disabled = settings(&[base, ("OTEL_SDK_DISABLED", "true")]);
        assert_eq!(disabled.log_export, None);
    }

    #[test]
    fn metrics_may_name_a_list_with_prometheus_and_other_signals_may_not() {
        for (value, pushed) in [
            ("otlp,prometheus", true),
            ("prometheus", false),
            ("none", false),
        ] {
            let pairs = [("OTEL_METRICS_EXPORTER", value)];
            assert_eq!(settings(&pairs).metric_export.is_some(), pushed, "{value}");
        }
        for (exporter, value) in [
            ("OTEL_METRICS_EXPORTER", "otlp,console"),
            ("OTEL_LOGS_EXPORTER", "otlp,none"),
            ("OTEL_LOGS_EXPORTER", "prometheus"),
            ("OTEL_TRACES_EXPORTER", "otlp,jaeger"),
        ] {
            assert!(
                refused(&[(exporter, value)]).starts_with(exporter),
                "{value}"
            );
        }
    }

    #[test]
    fn resource_attributes_are_pairs_with_decoded_values() {
        let pairs = settings(&[(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=demo,team=a%20b,service.name=named",
        )]);
        assert_eq!(
            pairs.resource_attributes[..2],
            [
                ("deployment.environment".to_string(), "demo".to_string()),
                ("team".to_string(), "a b".to_string())
            ]
        );
        assert_eq!(pairs.service_name, "named");
        assert!(settings(&[]).resource_attributes.is_empty());
    }

    #[test]
    fn a_value_with_a_percent_that_starts_no_escape_is_refused_without_echoing_it() {
        let headers = "OTEL_EXPORTER_OTLP_HEADERS";
        for list in [
            "api-key=top%ZZsecret",
            "api-key=secret%",
            "api-key=secret%4",
        ] {
            let error = refused(&[(headers, list)]);
            assert!(error.contains(headers) && error.contains("%25"), "{error}");
            assert!(!error.contains("secret"), "{error}");
        }
        assert!(args().settings(&env(&[(headers, "a=100%25")])).is_ok());
    }

    #[test]
    fn a_bad_value_is_an_error_naming_its_variable_without_repeating_a_secret() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (&[("OTEL_SDK_DISABLED", "yes")], "OTEL_SDK_DISABLED"),
            (
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift")],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            // The SDK reads a URL or a number as it is: spaces around it would make it unread.
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", " http://c:4318 ")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TIMEOUT", " 500")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "  ")],
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c/v1/traces")],
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ),
            (
                &[(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "http://user:secret@collector:4318",
                )],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0")],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_HEADERS", "secretvalue")],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_HEADERS", "k=secret\u{7f}")],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_HEADERS", "trace-bin=secretvalue")],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "secret=")],
                "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "k")],
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_HEADERS", "a=secret"),
                    ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", ""),
                ],
                "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            ),
            (
                &[("OTEL_RESOURCE_ATTRIBUTES", "=secretvalue")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                &[("OTEL_RESOURCE_ATTRIBUTES", "k=%ff")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
                "OTEL_EXPORTER_OTLP_COMPRESSION",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", "zstd")],
                "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION",
            ),
            (
                &[("OTEL_METRIC_EXPORT_INTERVAL", "0")],
                "OTEL_METRIC_EXPORT_INTERVAL",
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
    fn the_batch_variables_are_bounded_and_a_batch_larger_than_its_queue_is_refused() {
        let set = settings(&[
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "50"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "700"),
        ]);
        assert_eq!(set.span_batch_size, Some(50));
        assert_eq!(set.span_export_timeout, Some(Duration::from_millis(700)));
        assert_eq!(settings(&[]).span_batch_size, None);
        for (variable, value) in [
            ("OTEL_BSP_SCHEDULE_DELAY", "0"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "10000000"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "0"),
            ("OTEL_BSP_MAX_CONCURRENT_EXPORTS", "0"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096"),
            ("OTEL_BLRP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "4096"),
        ] {
            let message = refused(&[(variable, value)]);
            assert!(message.starts_with(variable), "{message}");
        }
        let small_queue = [
            ("OTEL_BLRP_MAX_QUEUE_SIZE", "10"),
            ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "11"),
        ];
        assert!(refused(&small_queue).starts_with("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE"));
    }

    #[test]
    fn a_variable_that_is_not_text_is_named() {
        use std::os::unix::ffi::OsStringExt;
        let var = |name: &str| {
            (name == "OTEL_EXPORTER_OTLP_HEADERS").then(|| OsString::from_vec(vec![0xff]))
        };
        let message = args().settings(&var).unwrap_err().to_string();
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_HEADERS"),
            "{message}"
        );
    }

    #[test]
    fn help_lists_every_variable_once() {
        let help = variables_help();
        for name in variables() {
            assert_eq!(help.matches(&format!("  {name}\n")).count(), 1, "{name}");
        }
        assert_eq!(variables().count(), 40);
    }
}
