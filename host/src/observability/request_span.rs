//! The request's server span: its name, its attributes by OpenTelemetry's HTTP conventions,
//! the caller's trace it continues, and what the answer adds to it; the host's spans inside it;
//! and the fields every log line of the request carries.
//!
//! A request span is one OpenTelemetry [`Context`] holding the span that is exported, built and
//! ended on the SDK directly, and the fields its log lines repeat (`request_id`, the ids,
//! method, path, route, status: [`RequestFields`]). It is made current at each poll of the
//! request's futures: the SDK's log appender reads the span's ids from it, the JSON lines
//! (`logs.rs`) the fields: one current value per request, and none of ours. Not a tracing span
//! per request: bench/PROFILE.md, section 15.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use http::{HeaderMap, Method, Uri};
use opentelemetry::context::{FutureExt, WithContext};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};

/// Longest `url.path` (and `url.query`) recorded on a span: a span must fit in one UDP packet
/// to the agent.
const MAX_RECORDED_PATH: usize = 1024;
/// The longest non-standard method recorded as `http.request.method_original`.
const MAX_RECORDED_METHOD: usize = 32;
/// The longest status description an error span carries: a trap's cause with its backtrace,
/// which the log line gives whole, is cut here so one span stays well inside a datagram.
const MAX_STATUS_DESCRIPTION_BYTES: usize = 4096;
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
/// The W3C Trace Context header that names the caller's trace.
const TRACEPARENT: &str = "traceparent";
/// `http.request.method` of a request whose method is not a standard one.
pub const OTHER_METHOD: &str = "_OTHER";

/// The host's tracer, which starts every request's server span and the host's spans inside it:
/// given once at start-up, when spans are exported.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Sets where the host's spans go; at start-up, by the telemetry pipeline.
pub fn install(tracer: SdkTracer) {
    let _ = TRACER.set(tracer);
}

/// The method's name when it is one of the nine standard ones; clients choose methods, so only
/// these may become span names or label values.
pub fn standard_method(method: &Method) -> Option<&'static str> {
    STANDARD_METHODS
        .iter()
        .find(|standard| *standard == method)
        .map(Method::as_str)
}

/// The server span of one request: the exported span, and the fields of its log lines.
/// Clones share both; the exported span ends when the last clone is dropped.
#[derive(Clone)]
pub struct RequestSpan {
    /// The fields every log line of the request carries; none for the host's own requests.
    log: Option<Arc<RequestFields>>,
    /// The exported span (none when spans are not exported or the request is the host's own)
    /// and the fields: the context the request's lines are written and its children start in.
    exported: Context,
}

impl RequestSpan {
    /// Starts the server span of a request, continuing the caller's trace when the request
    /// carries a W3C `traceparent`. Named `HTTP <METHOD>` until [`RequestSpan::record_answer`]
    /// adds the route.
    pub fn start(method: &Method, uri: &Uri, request_id: &str, headers: &HeaderMap) -> RequestSpan {
        let path = &uri.path()[..uri.path().floor_char_boundary(MAX_RECORDED_PATH)];
        // Clients choose the method: only the standard ones become span names or attribute
        // values, so the set of names stays bounded and a 5,000-byte method is not logged whole.
        let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
        let method_original = standard_method(method)
            .is_none()
            .then(|| &method.as_str()[..method.as_str().floor_char_boundary(MAX_RECORDED_METHOD)]);
        // The host's one propagator is W3C Trace Context: without a `traceparent` there is no
        // caller's trace to continue, and the global propagator is not asked.
        let caller = if headers.contains_key(TRACEPARENT) {
            opentelemetry::global::get_text_map_propagator(|propagator| {
                propagator.extract(&HeaderExtractor(headers))
            })
        } else {
            Context::new()
        };
        let exported = match TRACER.get() {
            Some(tracer) => {
                let mut attributes = Vec::with_capacity(12);
                attributes.push(KeyValue::new("http.request.method", method_name));
                if let Some(original) = method_original {
                    let original = original.to_string();
                    attributes.push(KeyValue::new("http.request.method_original", original));
                }
                attributes.push(KeyValue::new("url.path", path.to_string()));
                attributes.push(KeyValue::new("url.scheme", "http"));
                if let Some(query) = uri.query() {
                    let query = query[..query.floor_char_boundary(MAX_RECORDED_PATH)].to_string();
                    attributes.push(KeyValue::new("url.query", query));
                }
                attributes.push(KeyValue::new("request_id", request_id.to_string()));
                let span = tracer
                    .span_builder(format!("HTTP {method_name}"))
                    .with_kind(SpanKind::Server)
                    .with_attributes(attributes)
                    .start_with_context(tracer, &caller);
                Some(span)
            }
            None => None,
        };
        let log = RequestFields::new();
        let exported = match exported {
            Some(span) => Context::new().with_value(Arc::clone(&log)).with_span(span),
            None => Context::new().with_value(Arc::clone(&log)),
        };
        let caller_trace = caller.span().span_context().trace_id();
        let (trace_id, span_id) = log_ids(exported.span().span_context(), caller_trace);
        log.record_str("http.request.method", method_name);
        if let Some(original) = method_original {
            log.record_str("http.request.method_original", original);
        }
        log.record_str("url.path", path);
        log.record_str("request_id", request_id);
        log.record_ids(trace_id, span_id);
        RequestSpan {
            log: Some(log),
            exported,
        }
    }

    /// The span of a request the host sends itself, or of a test: nothing is exported or
    /// logged under it.
    pub fn none() -> RequestSpan {
        RequestSpan {
            log: None,
            exported: Context::new(),
        }
    }

    /// The context the host's and the guest's spans of this request start under.
    pub fn context(&self) -> &Context {
        &self.exported
    }

    /// The exported span's ids: invalid when spans are not exported.
    pub fn span_context(&self) -> SpanContext {
        self.exported.span().span_context().clone()
    }

    /// Whether the exported span records what is set on it (spans are exported, and the
    /// caller did not ask for its trace to be left out).
    pub fn is_recording(&self) -> bool {
        self.exported.span().is_recording()
    }

    /// Records the route the guest named first: in the log lines from now on, and on the span.
    pub fn record_route(&self, route: &str) {
        self.record_log_str("http.route", route);
        if self.is_recording() {
            let route = KeyValue::new("http.route", route.to_string());
            self.exported.span().set_attribute(route);
        }
    }

    /// Records which guest answers the request (guests change with a swap).
    pub fn record_guest_version(&self, version: &str) {
        self.record_log_str("guest.version", version);
        if self.is_recording() {
            let version = KeyValue::new("guest.version", version.to_string());
            self.exported.span().set_attribute(version);
        }
    }

    /// Sets attributes on the exported span alone: what the log lines have no use for. Callers
    /// check [`RequestSpan::is_recording`] before they make them.
    pub fn set_attributes(&self, attributes: Vec<KeyValue>) {
        self.exported.span().set_attributes(attributes);
    }

    /// Records the answer: its route in the span's name (`HTTP <METHOD> <route>`) and, unless
    /// the span already carries it, in `http.route`; its status; a 5xx marks the span an error,
    /// described by the host's `cause` when it knows one (the words of the request's log line).
    pub fn record_answer(
        &self,
        method: &Method,
        route: &str,
        record_route: bool,
        status: u16,
        cause: Option<&str>,
    ) {
        if record_route {
            self.record_log_str("http.route", route);
        }
        if let Some(log) = &self.log {
            log.record_i64("http.response.status_code", i64::from(status));
        }
        if !self.is_recording() {
            return;
        }
        let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
        let span = self.exported.span();
        span.update_name(format!("HTTP {method_name} {route}"));
        if record_route {
            span.set_attribute(KeyValue::new("http.route", route.to_string()));
        }
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            let cause = cause.unwrap_or_default();
            let description = &cause[..cause.floor_char_boundary(MAX_STATUS_DESCRIPTION_BYTES)];
            span.set_status(Status::error(description.to_string()));
            // The conventions' `error.type` of a server error is its status code.
            span.set_attribute(KeyValue::new("error.type", status.to_string()));
        }
    }

    /// Runs `f` inside the request: its log lines carry the request's fields (and, as OTLP
    /// log records, its ids).
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _current = self.exported.clone().attach();
        f()
    }

    /// Runs `f` inside the request, its OTLP log records carrying the ids of `span`: the
    /// request's span or one inside it.
    pub fn in_span<R>(&self, span: &Context, f: impl FnOnce() -> R) -> R {
        let span = match carried_by(span) {
            Some(_) => span.clone(),
            None => with_fields(span.clone(), self.log.as_ref()),
        };
        let _current = span.attach();
        f()
    }

    /// `future`, inside the request at each poll, as [`RequestSpan::in_scope`].
    pub fn instrument<F: Future>(&self, future: F) -> WithContext<F> {
        future.with_context(self.exported.clone())
    }

    fn record_log_str(&self, name: &'static str, value: &str) {
        if let Some(log) = &self.log {
            log.record_str(name, value);
        }
    }
}

/// Starts a span of the host's named `name` under `parent`, with `attributes`, in a context
/// that keeps `parent`'s request fields; without a span when `parent` holds none (spans are not
/// exported, or the request is the host's own).
pub fn start_child(
    parent: &Context,
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Context {
    match TRACER.get() {
        Some(tracer) if parent.has_active_span() => {
            let span = tracer
                .span_builder(name)
                .with_kind(kind)
                .with_attributes(attributes)
                .start_with_context(tracer, parent);
            parent.with_span(span)
        }
        _ => no_span_under(parent),
    }
}

/// A context with no span that keeps `parent`'s request fields: where a child would be, when
/// none is exported.
pub fn no_span_under(parent: &Context) -> Context {
    with_fields(Context::new(), carried_by(parent).as_ref())
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

/// Every name a request's fields may have: a guest's log field of one of these names is kept
/// beside it as `guest.<name>`, whether or not the request has recorded it yet.
pub const REQUEST_FIELD_NAMES: [&str; 9] = [
    "http.request.method",
    "http.request.method_original",
    "http.route",
    "url.path",
    "http.response.status_code",
    "guest.version",
    "request_id",
    "trace_id",
    "span_id",
];

/// A request's log fields, each name once: of a name recorded twice, the later value is the one
/// a line carries.
pub struct RequestFields {
    members: Mutex<Vec<(&'static str, FieldValue)>>,
}

/// A request field's value as recorded: most requests write no line, so it becomes JSON text
/// only when a line carries it ([`FieldValue::to_json`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// A string.
    Text(String),
    /// A number.
    Number(i64),
    /// A trace id, written as its 32 hex digits.
    Trace(TraceId),
    /// A span id, written as its 16 hex digits.
    Span(SpanId),
}

impl FieldValue {
    /// The value as JSON text.
    pub fn to_json(&self) -> String {
        match self {
            FieldValue::Text(text) => serde_json::to_string(text).expect("a string serializes"),
            FieldValue::Number(number) => number.to_string(),
            FieldValue::Trace(trace_id) => format!("\"{trace_id}\""),
            FieldValue::Span(span_id) => format!("\"{span_id}\""),
        }
    }
}

impl RequestFields {
    /// A request with no field recorded yet.
    pub fn new() -> Arc<RequestFields> {
        Arc::new(RequestFields {
            // Room for a request's fields and its later records without growing.
            members: Mutex::new(Vec::with_capacity(12)),
        })
    }

    /// Records `name` as the string `value`.
    pub fn record_str(&self, name: &'static str, value: &str) {
        self.record(name, FieldValue::Text(value.to_owned()));
    }

    /// Records `name` as the number `value`.
    pub fn record_i64(&self, name: &'static str, value: i64) {
        self.record(name, FieldValue::Number(value));
    }

    /// Records the request's `trace_id` and `span_id`.
    pub fn record_ids(&self, trace_id: TraceId, span_id: SpanId) {
        self.record("trace_id", FieldValue::Trace(trace_id));
        self.record("span_id", FieldValue::Span(span_id));
    }

    /// Sets `name`, in place if it is set already: a request holds each name once, so its list
    /// is bounded by [`REQUEST_FIELD_NAMES`] whoever records.
    fn record(&self, name: &'static str, value: FieldValue) {
        // A log line adds these members without searching it for their names (`logs.rs`).
        debug_assert!(
            REQUEST_FIELD_NAMES.contains(&name),
            "{name} is no request field"
        );
        let mut members = self.lock();
        match members.iter_mut().find(|(recorded, _)| *recorded == name) {
            Some((_, recorded)) => *recorded = value,
            None => members.push((name, value)),
        }
    }

    /// The fields recorded so far, earliest first; held while a line copies them.
    pub fn members(&self) -> MutexGuard<'_, Vec<(&'static str, FieldValue)>> {
        self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(&'static str, FieldValue)>> {
        // A panic while recording leaves a list of whole members: still usable.
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fields of the request whose context is current, if any.
pub fn current_fields() -> Option<Arc<RequestFields>> {
    Context::map_current(carried_by)
}

/// The fields `context` carries, if it is a request's.
pub fn carried_by(context: &Context) -> Option<Arc<RequestFields>> {
    context.get::<Arc<RequestFields>>().cloned()
}

/// `context`, carrying `request`'s fields as well (when there is a request).
pub fn with_fields(context: Context, request: Option<&Arc<RequestFields>>) -> Context {
    match request {
        Some(request) => context.with_value(Arc::clone(request)),
        None => context,
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

    fn recorded(request: &RequestFields) -> Vec<(&'static str, String)> {
        let members = request.members();
        members
            .iter()
            .map(|(name, value)| (*name, value.to_json()))
            .collect()
    }

    #[test]
    fn values_are_written_as_json_each_name_once_with_its_latest_value() {
        let request = RequestFields::new();
        request.record_str("request_id", "a\"b");
        request.record_ids(TraceId::from(0xab), SpanId::from(0xcd));
        request.record_i64("http.response.status_code", 404);
        request.record_str("http.route", "/api/users/{id}");
        for status in 0..1000 {
            request.record_i64("http.response.status_code", status);
        }
        assert_eq!(
            recorded(&request),
            [
                ("request_id", "\"a\\\"b\"".to_string()),
                ("trace_id", format!("\"{}ab\"", "0".repeat(30))),
                ("span_id", format!("\"{}cd\"", "0".repeat(14))),
                ("http.response.status_code", "999".to_string()),
                ("http.route", "\"/api/users/{id}\"".to_string()),
            ]
        );
    }

    #[test]
    fn the_current_fields_are_those_of_the_innermost_request_context_attached() {
        let outer = RequestFields::new();
        let inner = RequestFields::new();
        assert!(current_fields().is_none());
        let _outer = with_fields(Context::new(), Some(&outer)).attach();
        {
            let _inner = with_fields(Context::new(), Some(&inner)).attach();
            assert!(Arc::ptr_eq(&current_fields().unwrap(), &inner));
        }
        assert!(Arc::ptr_eq(&current_fields().unwrap(), &outer));
    }
}
