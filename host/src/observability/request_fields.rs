//! The fields every log line of a request carries (`request_id`, `trace_id`, `span_id`, method,
//! path, route, status, guest version), and which request a thread is serving now.
//!
//! They were the fields of a `tracing` span, entered at every poll of the request's futures.
//! The registry's span, its records, enters, exits and close were about 6 % of the real guest's
//! request (bench/PROFILE.md, section 15); here a request's fields are one shared list, and
//! serving a request is one thread-local pointer set around each poll. The JSON line format
//! (`logs.rs`) reads them from there.

use std::cell::RefCell;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

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

/// A request's log fields, each as its JSON text. Recorded in order: of a name recorded twice,
/// the later value is the one a line carries.
pub struct RequestFields {
    members: Mutex<Vec<(&'static str, String)>>,
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

    /// Records `name` as the JSON string `value`.
    pub fn record_str(&self, name: &'static str, value: &str) {
        let json = serde_json::to_string(value).expect("a string always serializes");
        self.record(name, json);
    }

    /// Records `name` as the JSON number `value`.
    pub fn record_i64(&self, name: &'static str, value: i64) {
        self.record(name, value.to_string());
    }

    fn record(&self, name: &'static str, json: String) {
        self.lock().push((name, json));
    }

    /// The fields recorded so far, earliest first; held while a line copies them.
    pub fn members(&self) -> MutexGuard<'_, Vec<(&'static str, String)>> {
        self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(&'static str, String)>> {
        // A panic while recording leaves a list of whole members: still usable.
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The request this thread is serving now, if any.
pub fn current() -> Option<Arc<RequestFields>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Runs `f` serving `request`: the lines it writes carry the request's fields. The request
/// served before is served again afterwards, even if `f` panics.
pub fn in_request<R>(request: &Arc<RequestFields>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<RequestFields>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| *current.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(Some(Arc::clone(request)))));
    f()
}

/// `future`, serving `request` at each of its polls (when there is one).
pub async fn scoped<F: Future>(request: Option<Arc<RequestFields>>, future: F) -> F::Output {
    let Some(request) = request else {
        return future.await;
    };
    let mut future = pin!(future);
    std::future::poll_fn(|cx| in_request(&request, || future.as_mut().poll(cx))).await
}

/// `future`, serving at each of its polls the request this thread serves now: for a task
/// spawned on the request's behalf.
pub fn in_current_request<F: Future>(future: F) -> impl Future<Output = F::Output> {
    scoped(current(), future)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(request: &RequestFields) -> Vec<(&'static str, String)> {
        request.members().clone()
    }

    #[test]
    fn values_are_recorded_as_json_in_order() {
        let request = RequestFields::new();
        request.record_str("request_id", "a\"b");
        request.record_i64("http.response.status_code", 404);
        request.record_str("http.route", "/api/users/{id}");
        assert_eq!(
            recorded(&request),
            [
                ("request_id", "\"a\\\"b\"".to_string()),
                ("http.response.status_code", "404".to_string()),
                ("http.route", "\"/api/users/{id}\"".to_string()),
            ]
        );
    }

    #[test]
    fn a_thread_serves_a_request_only_inside_it_and_the_outer_one_again_after() {
        let outer = RequestFields::new();
        let inner = RequestFields::new();
        assert!(current().is_none());
        in_request(&outer, || {
            in_request(&inner, || {
                assert!(Arc::ptr_eq(&current().unwrap(), &inner));
            });
            assert!(Arc::ptr_eq(&current().unwrap(), &outer));
        });
        assert!(current().is_none());
    }

    #[test]
    fn a_panic_inside_a_request_leaves_the_thread_serving_none() {
        let request = RequestFields::new();
        let caught = std::panic::catch_unwind(|| in_request(&request, || panic!("in the request")));
        assert!(caught.is_err());
        assert!(current().is_none());
    }

    #[tokio::test]
    async fn a_scoped_future_serves_its_request_at_every_poll_and_not_between() {
        let request = RequestFields::new();
        let seen = scoped(Some(Arc::clone(&request)), async {
            let first = current();
            tokio::task::yield_now().await;
            (first, current())
        })
        .await;
        assert!(Arc::ptr_eq(&seen.0.unwrap(), &request));
        assert!(Arc::ptr_eq(&seen.1.unwrap(), &request));
        assert!(current().is_none());
    }

    #[tokio::test]
    async fn a_task_spawned_in_a_request_serves_it() {
        let request = RequestFields::new();
        let task = in_request(&request, || {
            tokio::spawn(in_current_request(async { current() }))
        });
        assert!(Arc::ptr_eq(&task.await.unwrap().unwrap(), &request));
    }
}
