//! The one module that owns every metric name, served in Prometheus text format at `/metrics`.
//!
//! Labels carry route templates (`/api/users/{id}`) or `unmatched`, never raw paths, so the
//! number of series stays bounded whatever clients send.

use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::observability::request_span::{OTHER_METHOD, standard_method};
#[cfg(doc)]
use crate::observability::routes::UNMATCHED;

/// Request latency buckets, in seconds: 0.5 ms to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Guest instantiation buckets, in seconds: 10 µs to 100 ms.
const INSTANTIATION_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
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
}

/// The host's metrics, registered in a registry of their own.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    user_lookups: IntCounterVec,
    users_stored: IntGauge,
    guest_instantiation: Histogram,
    guest_reloads: IntCounterVec,
    store_operation: HistogramVec,
    store_errors: IntCounterVec,
    guest_telemetry_dropped: IntCounterVec,
}

impl Metrics {
    /// Registers every metric, process metrics included.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests answered, by method, route and status.",
            ),
            &["method", "route", "status"],
        )
        .expect("metric definition is valid");
        let request_duration = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time from receiving a request to having its response head, by method and route.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["method", "route"],
        )
        .expect("metric definition is valid");
        let user_lookups = IntCounterVec::new(
            Opts::new("user_lookups_total", "User lookups by id, by result."),
            &["result"],
        )
        .expect("metric definition is valid");
        let users_stored = IntGauge::new("users_stored", "Users in the store.")
            .expect("metric definition is valid");
        let guest_instantiation = Histogram::with_opts(
            HistogramOpts::new(
                "guest_instantiation_seconds",
                "Time to instantiate the guest component for one request.",
            )
            .buckets(INSTANTIATION_BUCKETS.to_vec()),
        )
        .expect("metric definition is valid");
        let guest_reloads = IntCounterVec::new(
            Opts::new(
                "guest_reloads_total",
                "Guest reloads (SIGHUP or file change), by result.",
            ),
            &["result"],
        )
        .expect("metric definition is valid");
        let store_operation = HistogramVec::new(
            HistogramOpts::new(
                "user_store_operation_seconds",
                "Time of one user store call, by operation and store (memory or postgres).",
            )
            .buckets(STORE_BUCKETS.to_vec()),
            &["operation", "store"],
        )
        .expect("metric definition is valid");
        let store_errors = IntCounterVec::new(
            Opts::new(
                "user_store_errors_total",
                "User store calls that failed (store unreachable, failing or too slow), by operation.",
            ),
            &["operation"],
        )
        .expect("metric definition is valid");
        let guest_telemetry_dropped = IntCounterVec::new(
            Opts::new(
                "guest_telemetry_dropped_total",
                "Guest spans, attributes and log events dropped by the per-request quotas, and \
                 routes labelled _OTHER past the per-guest cap, by signal.",
            ),
            &["signal"],
        )
        .expect("metric definition is valid");
        let collectors: [Box<dyn prometheus::core::Collector>; 9] = [
            Box::new(guest_telemetry_dropped.clone()),
            Box::new(store_operation.clone()),
            Box::new(store_errors.clone()),
            Box::new(guest_reloads.clone()),
            Box::new(requests.clone()),
            Box::new(request_duration.clone()),
            Box::new(user_lookups.clone()),
            Box::new(users_stored.clone()),
            Box::new(guest_instantiation.clone()),
        ];
        for collector in collectors {
            registry.register(collector).expect("names are unique");
        }
        // Both results exist from the start, so rates are defined before the first lookup.
        for result in ["success", "failure"] {
            user_lookups.with_label_values(&[result]);
            guest_reloads.with_label_values(&[result]);
        }
        for operation in STORE_OPERATIONS {
            store_errors.with_label_values(&[operation]);
        }
        for signal in ["span", "attribute", "log"] {
            guest_telemetry_dropped.with_label_values(&[signal]);
        }
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("names are unique");
        Metrics {
            registry,
            requests,
            request_duration,
            user_lookups,
            users_stored,
            guest_instantiation,
            guest_reloads,
            store_operation,
            store_errors,
            guest_telemetry_dropped,
        }
    }

    /// Counts one answered request and its latency. `route` is a template or [`UNMATCHED`].
    pub fn observe_request(
        &self,
        method: &http::Method,
        route: &str,
        status: u16,
        elapsed: Duration,
    ) {
        let method = method_label(method);
        self.requests
            .with_label_values(&[method, route, &status.to_string()])
            .inc();
        self.request_duration
            .with_label_values(&[method, route])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one lookup of a user by id.
    pub fn observe_lookup(&self, result: LookupResult) {
        let label = match result {
            LookupResult::Success => "success",
            LookupResult::Failure => "failure",
        };
        self.user_lookups.with_label_values(&[label]).inc();
    }

    /// Counts one guest reload, accepted (`true`) or rejected.
    pub fn observe_reload(&self, accepted: bool) {
        let label = if accepted { "success" } else { "failure" };
        self.guest_reloads.with_label_values(&[label]).inc();
    }

    /// Records how long one guest instantiation took.
    pub fn observe_instantiation(&self, elapsed: Duration) {
        self.guest_instantiation.observe(elapsed.as_secs_f64());
    }

    /// Records one user store call: its time, and whether it failed.
    pub fn observe_store_call(
        &self,
        operation: &'static str,
        store: &'static str,
        elapsed: Duration,
        failed: bool,
    ) {
        self.store_operation
            .with_label_values(&[operation, store])
            .observe(elapsed.as_secs_f64());
        if failed {
            self.store_errors.with_label_values(&[operation]).inc();
        }
    }

    /// Counts what one request's guest telemetry quotas dropped.
    pub fn observe_dropped_guest_telemetry(&self, dropped: DroppedGuestTelemetry) {
        for (signal, count) in [
            ("span", dropped.spans),
            ("attribute", dropped.attributes),
            ("log", dropped.log_events),
        ] {
            self.guest_telemetry_dropped
                .with_label_values(&[signal])
                .inc_by(count);
        }
    }

    /// Counts one route a guest named that was labelled `_OTHER`.
    pub fn observe_folded_route(&self) {
        self.guest_telemetry_dropped
            .with_label_values(&["route"])
            .inc();
    }

    /// Every metric in the Prometheus text exposition format, with `users_stored` set to
    /// `users_stored` (read from the store at scrape time, so it is never stale). `None` (the
    /// store could not tell) keeps the last value.
    pub fn render(&self, users_stored: Option<u64>) -> String {
        if let Some(count) = users_stored {
            self.users_stored
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("encoding into memory cannot fail");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
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
    use crate::observability::routes::UNMATCHED;

    #[test]
    fn requests_are_counted_by_method_route_and_status() {
        let metrics = Metrics::new();
        metrics.observe_request(
            &http::Method::GET,
            "/api/health",
            200,
            Duration::from_millis(1),
        );
        metrics.observe_request(
            &http::Method::GET,
            "/api/health",
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
        metrics.observe_request(&custom, UNMATCHED, 404, Duration::ZERO);
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
