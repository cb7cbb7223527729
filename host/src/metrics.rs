//! The one module that owns every metric name, served in Prometheus text format at `/metrics`.
//!
//! Labels carry route templates (`/api/users/{id}`) or `unmatched`, never raw paths, so the
//! number of series stays bounded whatever clients send.

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// The `route` label of requests whose path matches no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Request latency buckets, in seconds: 0.5 ms to 10 s.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The host's metrics, registered in a registry of their own.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
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
        registry
            .register(Box::new(requests.clone()))
            .expect("names are unique");
        registry
            .register(Box::new(request_duration.clone()))
            .expect("names are unique");
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
        }
    }

    /// Counts one answered request and its latency. `route` is a template or [`UNMATCHED_ROUTE`].
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

    /// Every metric in the Prometheus text exposition format.
    pub fn render(&self) -> String {
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
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Standard methods by name; any other method is one `OTHER` label, so clients cannot grow the
/// label set.
fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    const KNOWN: &[Method] = &[
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::TRACE,
        Method::CONNECT,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("OTHER", |known| known.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let text = metrics.render();
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
        metrics.observe_request(&custom, UNMATCHED_ROUTE, 404, Duration::ZERO);
        assert!(
            metrics.render().contains(
                r#"http_requests_total{method="OTHER",route="unmatched",status="404"} 1"#
            )
        );
    }
}
