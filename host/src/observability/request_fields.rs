//! The fields every log line of a request carries (`request_id`, `trace_id`, `span_id`, method,
//! path, route, status, guest version), carried by the request's OpenTelemetry [`Context`].
//!
//! The request's context is made current at each poll of its futures anyway (its span is the
//! parent of the log records the SDK's appender exports), so the JSON line format (`logs.rs`)
//! reads the fields from there too: one current value per request, and none of ours. Not a
//! tracing span per request: bench/PROFILE.md, section 15.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use opentelemetry::Context;
use opentelemetry::trace::{SpanId, TraceId};

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
pub fn current() -> Option<Arc<RequestFields>> {
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
    use super::*;

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
        assert!(current().is_none());
        let _outer = with_fields(Context::new(), Some(&outer)).attach();
        {
            let _inner = with_fields(Context::new(), Some(&inner)).attach();
            assert!(Arc::ptr_eq(&current().unwrap(), &inner));
        }
        assert!(Arc::ptr_eq(&current().unwrap(), &outer));
    }
}
