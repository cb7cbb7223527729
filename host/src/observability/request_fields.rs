//! The fields every log line of a request carries (`request_id`, `trace_id`, `span_id`, method,
//! path, route, status, guest version), and which request a thread is serving now.
//!
//! They were the fields of a `tracing` span, entered at every poll of the request's futures.
//! The registry's span, its records, enters, exits and close were about 6 % of the real guest's
//! request (bench/PROFILE.md, section 15); here a request's fields are one shared list, and
//! serving a request is one thread-local pointer set around each poll. The JSON line format
//! (`logs.rs`) reads them from there.

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use opentelemetry::trace::{SpanId, TraceId};
use pin_project_lite::pin_project;

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

thread_local! {
    /// The request whose future this thread is polling, if any.
    static CURRENT: RefCell<Option<Arc<RequestFields>>> = const { RefCell::new(None) };
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

/// The request this thread is serving now, if any.
pub fn current() -> Option<Arc<RequestFields>> {
    // None, too, for a line written while the thread's storage is being torn down at its exit.
    CURRENT
        .try_with(|current| current.borrow().clone())
        .ok()
        .flatten()
}

/// Runs `f` serving `request`, when there is one: the lines it writes carry the request's
/// fields. The request served before is served again afterwards, even if `f` panics.
pub fn in_request<R>(request: Option<&Arc<RequestFields>>, f: impl FnOnce() -> R) -> R {
    let Some(request) = request else {
        return f();
    };
    struct Restore(Option<Arc<RequestFields>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| *current.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(Some(Arc::clone(request)))));
    f()
}

pin_project! {
    /// A future that serves its request at each of its polls: lines written while it runs carry
    /// the request's fields.
    pub struct Scoped<F> {
        request: Option<Arc<RequestFields>>,
        // Polled where it is: a request's future is large, and moving it costs a copy.
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        in_request(this.request.as_ref(), || this.future.poll(cx))
    }
}

/// `future`, serving `request` at each of its polls (when there is one).
pub fn scoped<F: Future>(request: Option<Arc<RequestFields>>, future: F) -> Scoped<F> {
    Scoped { request, future }
}

/// `future`, serving at each of its polls the request this thread serves now: for a task
/// spawned on the request's behalf.
pub fn in_current_request<F: Future>(future: F) -> Scoped<F> {
    scoped(current(), future)
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
    fn a_thread_serves_a_request_only_inside_it_and_the_outer_one_again_after() {
        let outer = RequestFields::new();
        let inner = RequestFields::new();
        assert!(current().is_none());
        in_request(Some(&outer), || {
            in_request(Some(&inner), || {
                assert!(Arc::ptr_eq(&current().unwrap(), &inner));
            });
            assert!(Arc::ptr_eq(&current().unwrap(), &outer));
        });
        assert!(current().is_none());
    }

    #[test]
    fn a_panic_inside_a_request_leaves_the_thread_serving_none() {
        let request = RequestFields::new();
        let caught =
            std::panic::catch_unwind(|| in_request(Some(&request), || panic!("in the request")));
        assert!(caught.is_err());
        assert!(current().is_none());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_scoped_future_serves_its_request_at_every_poll_and_not_between() {
        let request = RequestFields::new();
        let (resume, paused) = tokio::sync::oneshot::channel::<()>();
        let (pausing, reached_pause) = tokio::sync::oneshot::channel::<()>();
        let scoped_task = tokio::spawn(scoped(Some(Arc::clone(&request)), async move {
            let first = current();
            pausing.send(()).unwrap();
            let _ = paused.await;
            (first, current())
        }));
        // The one thread runs the scoped task up to its pause, then this test again.
        reached_pause.await.unwrap();
        assert!(
            current().is_none(),
            "between its polls the thread serves no request"
        );
        resume.send(()).unwrap();
        let (first, second) = scoped_task.await.unwrap();
        assert!(Arc::ptr_eq(&first.unwrap(), &request));
        assert!(Arc::ptr_eq(&second.unwrap(), &request));
    }

    #[tokio::test]
    async fn a_task_spawned_in_a_request_serves_it() {
        let request = RequestFields::new();
        let task = in_request(Some(&request), || {
            tokio::spawn(in_current_request(async { current() }))
        });
        assert!(Arc::ptr_eq(&task.await.unwrap().unwrap(), &request));
    }
}
