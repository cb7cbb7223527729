//! The request's server span: its name, its fields by OpenTelemetry's HTTP conventions, the
//! caller's trace it continues, and what the answer adds to it.

use http::{HeaderMap, Method, Uri};
use opentelemetry::KeyValue;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Longest `url.path` (and `url.query`) recorded on a span: a span must fit in one UDP packet
/// to the agent.
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
/// The server span of one request, continuing the caller's trace when the request carries a
/// W3C `traceparent`. Named `HTTP <METHOD>` until [`record_answer`] adds the route.
pub fn request_span(
    method: &Method,
    uri: &Uri,
    request_id: &str,
    headers: &HeaderMap,
) -> tracing::Span {
    let path = truncate(uri.path(), MAX_RECORDED_PATH);
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
    let caller_trace = caller.span().span_context().trace_id();
    // Fails only where no span is exported (no OpenTelemetry layer).
    let _ = span.set_parent(caller);
    let context = span.context();
    let exported = context.span();
    // Conventions the log lines need not repeat go onto the OpenTelemetry span alone: a
    // `tracing` field would be written on every line of the request.
    exported.set_attribute(KeyValue::new("url.scheme", "http"));
    if let Some(query) = uri.query() {
        let query = truncate(query, MAX_RECORDED_PATH).to_string();
        exported.set_attribute(KeyValue::new("url.query", query));
    }
    let (trace_id, span_id) = log_ids(exported.span_context(), caller_trace);
    span.record("trace_id", trace_id.to_string());
    span.record("span_id", span_id.to_string());
    span
}

/// The trace and span ids the request's log lines carry: the exported span's, or, where spans
/// are not exported (`OTEL_TRACES_EXPORTER=none`, `OTEL_SDK_DISABLED`), ids of the host's own:
/// the caller's trace when it sent one (`caller_trace` is valid), else a new one, so that every
/// line of a request still carries a trace id to correlate by.
fn log_ids(exported: &SpanContext, caller_trace: TraceId) -> (TraceId, SpanId) {
    if exported.is_valid() {
        return (exported.trace_id(), exported.span_id());
    }
    let ids = RandomIdGenerator::default();
    let trace_id = if caller_trace == TraceId::INVALID {
        ids.new_trace_id()
    } else {
        caller_trace
    };
    (trace_id, ids.new_span_id())
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
    // On the OpenTelemetry span itself: it started when the request's ids were read from it,
    // and a started span takes a new name only this way.
    let context = span.context();
    let exported = context.span();
    exported.update_name(format!("HTTP {method_name} {route}"));
    if record_route {
        span.record("http.route", route);
    }
    // As an integer attribute: tracing-opentelemetry would record a `u16`'s u64 as text.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
        // The conventions' `error.type` of a server error is its status code.
        exported.set_attribute(KeyValue::new("error.type", status.to_string()));
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
    use opentelemetry::trace::{TraceFlags, TraceState};

    use super::*;

    #[test]
    fn log_ids_are_the_exported_spans_when_there_is_one() {
        let exported = SpanContext::new(
            TraceId::from(7),
            SpanId::from(9),
            TraceFlags::SAMPLED,
            true,
            TraceState::NONE,
        );
        assert_eq!(
            log_ids(&exported, TraceId::from(3)),
            (TraceId::from(7), SpanId::from(9))
        );
    }

    #[test]
    fn without_an_exported_span_the_log_ids_continue_the_callers_trace() {
        let (trace_id, span_id) = log_ids(&SpanContext::NONE, TraceId::from(3));
        assert_eq!(trace_id, TraceId::from(3));
        assert_ne!(span_id, SpanId::INVALID);
    }

    #[test]
    fn without_an_exported_span_or_a_caller_each_request_starts_a_trace_of_its_own() {
        let (first, first_span) = log_ids(&SpanContext::NONE, TraceId::INVALID);
        let (second, _) = log_ids(&SpanContext::NONE, TraceId::INVALID);
        assert_ne!(first, TraceId::INVALID);
        assert_ne!(first_span, SpanId::INVALID);
        assert_ne!(first, second);
    }

    #[test]
    fn only_the_nine_standard_methods_are_named() {
        assert_eq!(standard_method(&Method::GET), Some("GET"));
        assert_eq!(standard_method(&Method::from_bytes(b"BREW").unwrap()), None);
    }
}
