//! The one module that owns every metric name: each instrument is defined once, with the
//! OpenTelemetry metrics API, and read by two readers of the same SDK: `/metrics` (Prometheus
//! text format, through opentelemetry-prometheus into the prometheus crate's registry and
//! encoder) and, when the settings say so, the periodic OTLP push. The two show the
//! same instruments with the same names, units and attributes, so they cannot disagree.
//!
//! Labels carry route templates (`/api/users/{id}`) or `unmatched`, never raw paths, so the
//! number of series stays bounded whatever clients send.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _, UpDownCounter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::observability::otlp::Reported;
#[cfg(doc)]
use crate::observability::routes::UNMATCHED;
use crate::observability::routes::{OTHER_METHOD, standard_method};

/// The OTLP push of the metrics, when there is one.
pub type PushReader = PeriodicReader<Reported<opentelemetry_otlp::MetricExporter>>;

/// Request latency buckets, in seconds: 0.5 ms to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Guest instantiation buckets, in seconds: 10 µs to 100 ms.
const INSTANTIATION_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
];

/// Linear-memory high-water buckets, in bytes: 64 KiB (one page) to 1 GiB, by fours.
const MEMORY_BUCKETS: &[f64] = &[
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
    268_435_456.0,
    1_073_741_824.0,
];

/// User store call buckets, in seconds: 50 µs to 5 s.
const STORE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
];

/// The `operation` label values of the user store's metrics: the calls of the `users` interface.
pub const STORE_OPERATIONS: [&str; 3] = ["list", "get", "create"];

/// The `result` label values of `user_lookups_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupResult {
    /// The user was found (200).
    Success,
    /// No such user, or an id that is not a UUID (404).
    Failure,
}

/// What one request's guest telemetry quotas dropped, counted in
/// `guest_telemetry_dropped_total` by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DroppedGuestTelemetry {
    /// Spans not opened.
    pub spans: u64,
    /// Attributes not recorded.
    pub attributes: u64,
    /// Log events not written.
    pub log_events: u64,
    /// `wasi:otel` metric data points not recorded.
    pub metric_points: u64,
    /// Lines the guest wrote to stdout or stderr past the request's bounds.
    pub output_lines: u64,
}

/// When a guest's trap can come, as `guest_traps_total` labels it: before its response head,
/// or while its body streams.
pub const TRAP_MOMENTS: [&str; 2] = ["before_head", "in_body"];

/// The prefix of every instrument a guest's `wasi:otel` metrics are recorded in: no host
/// metric starts with it, so a guest cannot name, or disturb, one of the host's. `/metrics`
/// shows `orders.placed` as `guest_otel_orders_placed`.
pub const GUEST_METRIC_PREFIX: &str = "guest.otel.";
/// The longest metric name a guest may use (OpenTelemetry's 255, less the prefix).
pub const MAX_GUEST_METRIC_NAME: usize = 255 - GUEST_METRIC_PREFIX.len();
/// Distinct metric names the guests of one host may use, over its lifetime; a point of any
/// other is dropped. Each name's series are bounded by the SDK's cardinality limit (2,000).
pub const MAX_GUEST_METRICS: usize = 32;
/// Endings a guest's metric may not have on `/metrics`: they would pass for a histogram's
/// series.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_count", "_sum"];

/// One data point a guest exported, checked: recorded in the host's instrument of its name.
pub struct GuestMeasurement<'a> {
    /// The guest's name for the metric (prefixed with [`GUEST_METRIC_PREFIX`] here).
    pub name: &'a str,
    /// Its description, used when its instrument is made.
    pub description: &'a str,
    /// Its unit, used when its instrument is made.
    pub unit: &'a str,
    /// What to record.
    pub value: GuestValue,
}

/// What a guest's data point adds to its instrument.
#[derive(Debug, Clone, PartialEq)]
pub enum GuestValue {
    /// An increment of a sum.
    Sum {
        /// A counter when true, an up-down counter otherwise.
        monotonic: bool,
        /// What the data point adds.
        added: f64,
    },
    /// A gauge's value.
    Gauge(f64),
    /// Measurements (value, how many times) of a histogram whose buckets are `bounds`.
    Histogram {
        /// The buckets' upper bounds, for a new instrument.
        bounds: Vec<f64>,
        /// Each value, and how many times it is recorded.
        values: Vec<(f64, u64)>,
    },
}

/// A guest metric's instrument: the first point of a name decides its kind (and a histogram's
/// buckets).
#[derive(Clone)]
enum GuestInstrument {
    Counter(Counter<f64>),
    UpDownCounter(UpDownCounter<f64>),
    Gauge(Gauge<f64>),
    Histogram(Histogram<f64>),
}

/// The host's instruments, and the registry `/metrics` is rendered from.
pub struct Metrics {
    /// Kept for as long as the instruments: dropping the last copy shuts the readers down.
    provider: SdkMeterProvider,
    registry: Registry,
    /// Where the guests' instruments are made.
    meter: Meter,
    /// The guests' instruments, by the guests' names.
    guest_instruments: Mutex<HashMap<String, GuestInstrument>>,
    requests: Counter<u64>,
    request_duration: Histogram<f64>,
    user_lookups: Counter<u64>,
    users_stored: Gauge<u64>,
    guest_instantiation: Histogram<f64>,
    guest_reloads: Counter<u64>,
    store_operation: Histogram<f64>,
    store_errors: Counter<u64>,
    guest_telemetry_dropped: Counter<u64>,
    guest_traps: Counter<u64>,
    wasm_instantiation: Histogram<f64>,
    wasm_run: Histogram<f64>,
    wasm_memory_peak: Histogram<f64>,
    wasm_host_calls: Counter<u64>,
}

impl Metrics {
    /// Every instrument, read by `/metrics` only, process metrics included.
    pub fn new() -> Metrics {
        Metrics::exported(Resource::builder_empty().build(), None).0
    }

    /// Every instrument, read by `/metrics` and by `push` when there is one; and the provider,
    /// whose shutdown pushes the last values.
    pub fn exported(resource: Resource, push: Option<PushReader>) -> (Metrics, SdkMeterProvider) {
        let registry = Registry::new();
        // The instruments' names are the page's names: no unit or `_total` suffix added, no
        // scope labels, no `target_info` (the resource is OTLP's to carry).
        let page = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_counter_suffixes()
            .without_target_info()
            .scope_info_enabled(false)
            .build()
            .expect("a fresh registry takes the exporter");
        let mut provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(page);
        if let Some(push) = push {
            provider = provider.with_reader(push);
        }
        let provider = provider.build();
        let meter = provider.meter("host");
        #[cfg(target_os = "linux")]
        observe_process(&meter);
        (
            Metrics::define(provider.clone(), registry, &meter),
            provider,
        )
    }

    /// Defines every instrument on `meter`, each series that must exist before its first event
    /// at zero.
    fn define(provider: SdkMeterProvider, registry: Registry, meter: &Meter) -> Metrics {
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let seconds = |name: &'static str, help: &'static str, buckets: &[f64]| {
            meter
                .f64_histogram(name)
                .with_description(help)
                .with_unit("s")
                .with_boundaries(buckets.to_vec())
                .build()
        };
        let metrics = Metrics {
            provider,
            registry,
            meter: meter.clone(),
            guest_instruments: Mutex::default(),
            requests: counter(
                "http_requests_total",
                "HTTP requests answered, by method, route and status.",
            ),
            request_duration: seconds(
                "http_request_duration_seconds",
                "Time from receiving a request to having its response head, by method and route.",
                DURATION_BUCKETS,
            ),
            user_lookups: counter("user_lookups_total", "User lookups by id, by result."),
            users_stored: meter
                .u64_gauge("users_stored")
                .with_description("Users in the store.")
                .build(),
            guest_instantiation: seconds(
                "guest_instantiation_seconds",
                "Time to instantiate the guest component for one request.",
                INSTANTIATION_BUCKETS,
            ),
            guest_reloads: counter(
                "guest_reloads_total",
                "Guest reloads (SIGHUP or file change), by result.",
            ),
            store_operation: seconds(
                "user_store_operation_seconds",
                "Time of one user store call, by operation and store (memory or postgres).",
                STORE_BUCKETS,
            ),
            store_errors: counter(
                "user_store_errors_total",
                "User store calls that failed (store unreachable, failing or too slow), by operation.",
            ),
            guest_telemetry_dropped: counter(
                "guest_telemetry_dropped_total",
                "Guest spans, attributes, log events, metric data points and stdout or stderr \
                 lines dropped by the per-request quotas, and routes labelled _OTHER past the \
                 per-guest cap, by signal.",
            ),
            guest_traps: counter(
                "guest_traps_total",
                "Guest instances that trapped (or passed their deadline), by when: before_head \
                 (the request answered 500 or 503) or in_body (the body cut short, read or not).",
            ),
            wasm_instantiation: seconds(
                "wasm_instantiation_seconds",
                "Time to instantiate the guest for one request, by route.",
                INSTANTIATION_BUCKETS,
            ),
            wasm_run: seconds(
                "wasm_run_seconds",
                "Time one request's instance ran (host calls inside included, waits not), by route.",
                DURATION_BUCKETS,
            ),
            wasm_memory_peak: meter
                .f64_histogram("wasm_memory_peak_bytes")
                .with_description("Linear memory one request's instance reached, by route.")
                .with_unit("By")
                .with_boundaries(MEMORY_BUCKETS.to_vec())
                .build(),
            wasm_host_calls: counter(
                "wasm_host_calls_total",
                "Calls one request's instance made to the host's interfaces (users, telemetry, \
                 otel), by route and interface.",
            ),
        };
        // Both results exist from the start, so rates are defined before the first lookup.
        for result in ["success", "failure"] {
            metrics
                .user_lookups
                .add(0, &[KeyValue::new("result", result)]);
            metrics
                .guest_reloads
                .add(0, &[KeyValue::new("result", result)]);
        }
        for operation in STORE_OPERATIONS {
            metrics
                .store_errors
                .add(0, &[KeyValue::new("operation", operation)]);
        }
        for when in TRAP_MOMENTS {
            metrics.guest_traps.add(0, &[KeyValue::new("when", when)]);
        }
        for signal in ["span", "attribute", "log", "metric", "output"] {
            metrics
                .guest_telemetry_dropped
                .add(0, &[KeyValue::new("signal", signal)]);
        }
        metrics.users_stored.record(0, &[]);
        metrics
    }

    /// Counts one answered request and its latency. `route` is a template or [`UNMATCHED`],
    /// shared (the label is a reference to it, not a copy).
    pub fn observe_request(
        &self,
        method: &http::Method,
        route: &Arc<str>,
        status: u16,
        elapsed: Duration,
    ) {
        let method = KeyValue::new("method", method_label(method));
        let route = KeyValue::new("route", Arc::clone(route));
        self.request_duration
            .record(elapsed.as_secs_f64(), &[method.clone(), route.clone()]);
        self.requests.add(
            1,
            &[method, route, KeyValue::new("status", i64::from(status))],
        );
    }

    /// Counts one lookup of a user by id.
    pub fn observe_lookup(&self, result: LookupResult) {
        let label = match result {
            LookupResult::Success => "success",
            LookupResult::Failure => "failure",
        };
        self.user_lookups.add(1, &[KeyValue::new("result", label)]);
    }

    /// Counts one guest reload, accepted (`true`) or rejected.
    pub fn observe_reload(&self, accepted: bool) {
        let label = if accepted { "success" } else { "failure" };
        self.guest_reloads.add(1, &[KeyValue::new("result", label)]);
    }

    /// Counts one instance that trapped `when` (one of [`TRAP_MOMENTS`]).
    pub fn observe_guest_trap(&self, when: &'static str) {
        self.guest_traps.add(1, &[KeyValue::new("when", when)]);
    }

    /// Records how long one guest instantiation took.
    pub fn observe_instantiation(&self, elapsed: Duration) {
        self.guest_instantiation.record(elapsed.as_secs_f64(), &[]);
    }

    /// Records one user store call: its time, and whether it failed.
    pub fn observe_store_call(
        &self,
        operation: &'static str,
        store: &'static str,
        elapsed: Duration,
        failed: bool,
    ) {
        let operation = KeyValue::new("operation", operation);
        self.store_operation.record(
            elapsed.as_secs_f64(),
            &[operation.clone(), KeyValue::new("store", store)],
        );
        if failed {
            self.store_errors.add(1, &[operation]);
        }
    }

    /// Counts what one request's guest telemetry quotas dropped.
    pub fn observe_dropped_guest_telemetry(&self, dropped: DroppedGuestTelemetry) {
        for (signal, count) in [
            ("span", dropped.spans),
            ("attribute", dropped.attributes),
            ("log", dropped.log_events),
            ("metric", dropped.metric_points),
            ("output", dropped.output_lines),
        ] {
            if count > 0 {
                self.guest_telemetry_dropped
                    .add(count, &[KeyValue::new("signal", signal)]);
            }
        }
    }

    /// Records what one request's instance cost, under its `route` (a template or
    /// [`UNMATCHED`]).
    /// `host_calls` are (interface, calls) pairs.
    pub fn observe_instance_cost(
        &self,
        route: &Arc<str>,
        instantiation: Duration,
        running: Duration,
        memory_peak: usize,
        host_calls: &[(&'static str, u32)],
    ) {
        let route = KeyValue::new("route", Arc::clone(route));
        let labels = std::slice::from_ref(&route);
        self.wasm_instantiation
            .record(instantiation.as_secs_f64(), labels);
        self.wasm_run.record(running.as_secs_f64(), labels);
        self.wasm_memory_peak.record(memory_peak as f64, labels);
        for &(interface, calls) in host_calls {
            if calls > 0 {
                self.wasm_host_calls.add(
                    u64::from(calls),
                    &[route.clone(), KeyValue::new("interface", interface)],
                );
            }
        }
    }

    /// Records one guest data point with `attributes` in the instrument of its name, made on
    /// first use; `false` (not recorded) for a name that is not an instrument name, one past
    /// [`MAX_GUEST_METRICS`], or one whose instrument is of another kind.
    pub fn observe_guest(
        &self,
        measurement: GuestMeasurement<'_>,
        attributes: &[KeyValue],
    ) -> bool {
        if !is_instrument_name(measurement.name) {
            return false;
        }
        // Keyed by the name `/metrics` shows, so that `a.b` and `a_b` are one instrument, and
        // recorded outside the lock (instruments are handles).
        let shown = page_name(measurement.name);
        let instrument = {
            let mut instruments = self
                .guest_instruments
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !instruments.contains_key(&shown) {
                if instruments.len() >= MAX_GUEST_METRICS {
                    return false;
                }
                let instrument = self.guest_instrument(&measurement);
                instruments.insert(shown.clone(), instrument);
            }
            instruments[&shown].clone()
        };
        match (&instrument, measurement.value) {
            (
                GuestInstrument::Counter(counter),
                GuestValue::Sum {
                    monotonic: true,
                    added,
                },
            ) => counter.add(added, attributes),
            (
                GuestInstrument::UpDownCounter(counter),
                GuestValue::Sum {
                    monotonic: false,
                    added,
                },
            ) => counter.add(added, attributes),
            (GuestInstrument::Gauge(gauge), GuestValue::Gauge(value)) => {
                gauge.record(value, attributes)
            }
            (GuestInstrument::Histogram(histogram), GuestValue::Histogram { values, .. }) => {
                for (value, times) in values {
                    for _ in 0..times {
                        histogram.record(value, attributes);
                    }
                }
            }
            _ => return false,
        }
        true
    }

    /// A new instrument for a guest's metric, of the kind its first point is.
    fn guest_instrument(&self, measurement: &GuestMeasurement<'_>) -> GuestInstrument {
        let name = format!("{GUEST_METRIC_PREFIX}{}", measurement.name);
        let description = measurement.description.to_string();
        let unit = measurement.unit.to_string();
        match &measurement.value {
            GuestValue::Sum {
                monotonic: true, ..
            } => GuestInstrument::Counter(
                self.meter
                    .f64_counter(name)
                    .with_description(description)
                    .with_unit(unit)
                    .build(),
            ),
            GuestValue::Sum { .. } => GuestInstrument::UpDownCounter(
                self.meter
                    .f64_up_down_counter(name)
                    .with_description(description)
                    .with_unit(unit)
                    .build(),
            ),
            GuestValue::Gauge(_) => GuestInstrument::Gauge(
                self.meter
                    .f64_gauge(name)
                    .with_description(description)
                    .with_unit(unit)
                    .build(),
            ),
            GuestValue::Histogram { bounds, .. } => GuestInstrument::Histogram(
                self.meter
                    .f64_histogram(name)
                    .with_description(description)
                    .with_unit(unit)
                    .with_boundaries(bounds.clone())
                    .build(),
            ),
        }
    }

    /// Counts one route a guest named that was labelled `_OTHER`.
    pub fn observe_folded_route(&self) {
        self.guest_telemetry_dropped
            .add(1, &[KeyValue::new("signal", "route")]);
    }

    /// Sets `users_stored`, when the store could tell (`None` keeps the last value).
    pub fn observe_users_stored(&self, users_stored: Option<u64>) {
        if let Some(count) = users_stored {
            self.users_stored.record(count, &[]);
        }
    }

    /// Counts the log lines each output (stdout, the log file) dropped because it did not take
    /// them fast enough, `log_lines_dropped_total{output}`, as `dropped` tells at each collection.
    pub fn observe_dropped_log_lines(
        &self,
        dropped: impl Fn() -> Vec<(&'static str, u64)> + Send + Sync + 'static,
    ) {
        // The callback stays registered with the meter; the handle need not be kept.
        self.provider
            .meter("host")
            .u64_observable_counter("log_lines_dropped_total")
            .with_description(
                "Log lines dropped because an output (stdout, the log file) did not take them fast enough",
            )
            .with_callback(move |observer| {
                for (output, lines) in dropped() {
                    observer.observe(lines, &[KeyValue::new("output", output)]);
                }
            })
            .build();
    }

    /// Every metric in the Prometheus text exposition format, with `users_stored` set to
    /// `users_stored` (read from the store at scrape time, so it is never stale). `None` (the
    /// store could not tell) keeps the last value.
    pub fn render(&self, users_stored: Option<u64>) -> String {
        self.observe_users_stored(users_stored);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("encoding into memory cannot fail");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

/// Whether `name` is an OpenTelemetry instrument name (a letter, then letters, digits, `_`,
/// `.`, `-` and `/`; its length is checked when it is read) that does not end as a histogram's
/// series do on `/metrics`.
fn is_instrument_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let shown = page_name(name);
    bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && bytes.all(|byte| byte.is_ascii_alphanumeric() || b"_.-/".contains(&byte))
        && !HISTOGRAM_SUFFIXES
            .iter()
            .any(|suffix| shown.ends_with(suffix))
}

/// A guest metric's name as `/metrics` shows it (after the prefix): anything but a letter or
/// digit becomes `_`.
fn page_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The prometheus crate's process metrics (`process_cpu_seconds_total`, `process_open_fds`,
/// `process_max_fds`, `process_virtual_memory_bytes`, `process_resident_memory_bytes`,
/// `process_start_time_seconds`, `process_threads`), read from `/proc` at each collection, as
/// observable instruments of the same names and descriptions: on the page and in the push.
#[cfg(target_os = "linux")]
fn observe_process(meter: &Meter) {
    use prometheus::core::Collector as _;
    use prometheus::proto::MetricType;
    let process = Arc::new(prometheus::process_collector::ProcessCollector::for_self());
    for family in process.collect() {
        let name = family.name().to_string();
        let is_counter = family.get_field_type() == MetricType::COUNTER;
        let reader = Arc::clone(&process);
        let wanted = name.clone();
        let read = move || {
            let families = reader.collect();
            let family = families.iter().find(|family| family.name() == wanted)?;
            let metric = family.get_metric().first()?;
            Some(if is_counter {
                metric.get_counter().value()
            } else {
                metric.get_gauge().value()
            })
        };
        let help = family.help().to_string();
        // The callbacks stay registered with the meter; the handles need not be kept.
        if is_counter {
            meter
                .f64_observable_counter(name)
                .with_description(help)
                .with_callback(move |observer| {
                    if let Some(value) = read() {
                        observer.observe(value, &[]);
                    }
                })
                .build();
        } else {
            meter
                .f64_observable_gauge(name)
                .with_description(help)
                .with_callback(move |observer| {
                    if let Some(value) = read() {
                        observer.observe(value, &[]);
                    }
                })
                .build();
        }
    }
}

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Standard methods by name; any other method is one `_OTHER` label (as on spans and log
/// lines), so clients cannot grow the label set.
fn method_label(method: &http::Method) -> &'static str {
    standard_method(method).unwrap_or(OTHER_METHOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outputs_dropped_log_lines_are_on_the_page() {
        let metrics = Metrics::new();
        metrics.observe_dropped_log_lines(|| vec![("stdout", 0), ("file", 3)]);
        let page = metrics.render(None);
        assert!(
            page.contains("log_lines_dropped_total{output=\"file\"} 3\n"),
            "{page}"
        );
        assert!(
            page.contains("log_lines_dropped_total{output=\"stdout\"} 0\n"),
            "{page}"
        );
    }

    #[test]
    fn a_guest_metric_name_is_an_instrument_name_not_ending_as_histogram_series_do() {
        assert!(is_instrument_name("orders.placed"));
        assert!(is_instrument_name("http/requests-total"));
        assert!(!is_instrument_name("9lives"));
        assert!(!is_instrument_name("orders placed"));
        assert!(!is_instrument_name("latency.count"));
        assert!(!is_instrument_name("latency_bucket"));
        assert_eq!(page_name("a.b-c/d"), "a_b_c_d");
    }

    #[test]
    fn names_that_show_alike_on_the_page_are_one_instrument() {
        let metrics = Metrics::new();
        let point = |name| GuestMeasurement {
            name,
            description: "",
            unit: "",
            value: GuestValue::Sum {
                monotonic: true,
                added: 1.0,
            },
        };
        assert!(metrics.observe_guest(point("a.b"), &[]));
        assert!(metrics.observe_guest(point("a_b"), &[]));
        assert!(metrics.render(None).contains("guest_otel_a_b 2"));
    }
    use crate::observability::routes::UNMATCHED;

    #[test]
    fn requests_are_counted_by_method_route_and_status() {
        let metrics = Metrics::new();
        metrics.observe_request(
            &http::Method::GET,
            &Arc::from("/api/health"),
            200,
            Duration::from_millis(1),
        );
        metrics.observe_request(
            &http::Method::GET,
            &Arc::from("/api/health"),
            200,
            Duration::from_millis(1),
        );
        let text = metrics.render(Some(0));
        assert!(
            text.contains(
                r#"http_requests_total{method="GET",route="/api/health",status="200"} 2"#
            ),
            "{text}"
        );
        assert!(text.contains("http_request_duration_seconds_bucket{method=\"GET\",route=\"/api/health\",le=\"0.0005\"} 0"));
    }

    #[test]
    fn unusual_methods_share_one_label() {
        let metrics = Metrics::new();
        let custom = http::Method::from_bytes(b"BREW").unwrap();
        metrics.observe_request(&custom, &Arc::from(UNMATCHED), 404, Duration::ZERO);
        assert!(
            metrics.render(Some(0)).contains(
                r#"http_requests_total{method="_OTHER",route="unmatched",status="404"} 1"#
            )
        );
    }

    #[test]
    fn lookups_are_counted_by_result_and_both_exist_from_the_start() {
        let metrics = Metrics::new();
        assert!(
            metrics
                .render(Some(0))
                .contains(r#"user_lookups_total{result="failure"} 0"#)
        );
        metrics.observe_lookup(LookupResult::Success);
        let text = metrics.render(Some(3));
        assert!(
            text.contains(r#"user_lookups_total{result="success"} 1"#),
            "{text}"
        );
        assert!(text.contains("users_stored 3"), "{text}");
        assert!(metrics.render(None).contains("users_stored 3"));
    }

    #[test]
    fn store_calls_are_timed_by_operation_and_store_and_failures_counted() {
        let metrics = Metrics::new();
        assert!(
            metrics
                .render(None)
                .contains(r#"user_store_errors_total{operation="create"} 0"#)
        );
        metrics.observe_store_call("get", "postgres", Duration::from_millis(2), false);
        metrics.observe_store_call("create", "postgres", Duration::from_millis(1), true);
        let text = metrics.render(None);
        assert!(
            text.contains(
                r#"user_store_operation_seconds_count{operation="get",store="postgres"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"user_store_errors_total{operation="create"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"user_store_errors_total{operation="get"} 0"#));
    }
}
