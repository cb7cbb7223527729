//! A guest's response body that ends only when the guest's task has ended well.

use std::sync::Arc;

use bytes::Bytes;
use opentelemetry::trace::TraceContextExt;

use crate::error::one_line;
use crate::observability::metrics::{Metrics, TRAP_MOMENTS};
use crate::observability::request_fields::{self, RequestFields};
use crate::observability::request_span::log_records_exported;
use crate::runtime::store::ServingInstance;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

/// A guest's response body that ends only when the guest's task has ended well.
///
/// wasmtime-wasi-http ends a body normally when its instance goes away mid-stream (a trap, the
/// deadline): with chunked encoding the client would see a cut-short body as complete. Here the
/// end of the body waits for the task's outcome, and a failed task turns it into an error, so
/// hyper breaks the connection instead. A body dropped before its end (a `HEAD`, a client gone)
/// leaves a watcher on the task: a guest that fails then is logged and counted all the same.
pub struct GuestBody {
    inner: HyperOutgoingBody,
    task: Option<tokio::task::JoinHandle<wasmtime::Result<()>>>,
    failure: FailureReport,
    /// What ends with the body of a reused instance's request (`runtime::reuse`).
    _request: Option<Box<dyn Send>>,
    /// The reused instance writing the body: a body whose stream ends once it has failed was
    /// cut short.
    instance: Option<Arc<ServingInstance>>,
    /// When a reused instance's body is cut short if it has not ended: the instance outlives
    /// the request, so nothing else ends a body the guest keeps open.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

/// Where a guest that fails after its response head is reported.
struct FailureReport {
    /// The request's log fields, for the line of a failure.
    request: Option<Arc<RequestFields>>,
    /// The request's span ids, when that line also goes out as a log record.
    exported: Option<opentelemetry::Context>,
    /// Where the trap is counted, for a client's request.
    metrics: Option<Arc<Metrics>>,
}

impl FailureReport {
    /// The ERROR line and the count of a guest that failed with `trap` after its head;
    /// `read` says whether the client was still reading the body.
    fn report(&self, trap: &wasmtime::Error, read: bool) {
        let error = one_line(&**trap);
        let _current = self.exported.clone().map(opentelemetry::Context::attach);
        request_fields::in_request(self.request.as_ref(), || {
            if read {
                tracing::error!(
                    error,
                    "guest failed while streaming its body; response cut short"
                );
            } else {
                tracing::error!(
                    error,
                    "guest failed after its response head, its body unread by the client"
                );
            }
        });
        if let Some(metrics) = &self.metrics {
            metrics.observe_guest_trap(TRAP_MOMENTS[1]);
        }
    }
}

impl GuestBody {
    pub(crate) fn new(
        inner: HyperOutgoingBody,
        task: tokio::task::JoinHandle<wasmtime::Result<()>>,
        metrics: Option<Arc<Metrics>>,
    ) -> GuestBody {
        GuestBody {
            inner,
            task: Some(task),
            failure: FailureReport {
                request: request_fields::current(),
                exported: log_records_exported().then(request_ids),
                metrics,
            },
            _request: None,
            instance: None,
            deadline: None,
        }
    }

    /// The body of a reused `instance`'s response, cut short if it has not ended by `deadline`:
    /// the instance outlives it, and `request` ends with it (the instance's failure is logged
    /// when the instance ends).
    pub(super) fn reused(
        inner: HyperOutgoingBody,
        request: impl Send + 'static,
        instance: Option<Arc<ServingInstance>>,
        deadline: std::time::Instant,
    ) -> GuestBody {
        GuestBody {
            inner,
            task: None,
            failure: FailureReport {
                request: None,
                exported: None,
                metrics: None,
            },
            _request: Some(Box::new(request)),
            instance,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline.into()))),
        }
    }
}

impl Drop for GuestBody {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let failure = FailureReport {
            request: self.failure.request.take(),
            exported: self.failure.exported.take(),
            metrics: self.failure.metrics.take(),
        };
        // The task is bounded by the request's deadline: the watcher ends with it.
        runtime.spawn(async move {
            if let Ok(Err(trap)) = task.await {
                failure.report(&trap, false);
            }
        });
    }
}

/// The ids of the current span alone: a clone of the context itself would keep the request's
/// span from ending until hyper drops the body.
fn request_ids() -> opentelemetry::Context {
    let ids = opentelemetry::Context::map_current(|current| current.span().span_context().clone());
    opentelemetry::Context::new().with_remote_span_context(ids)
}

impl http_body::Body for GuestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        // Polled first, whether or not the body has a frame ready: a guest that writes as fast
        // as the client reads would otherwise never let it fire.
        let past_deadline = self
            .deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {}
            _ if past_deadline => {
                return Poll::Ready(Some(Err(wasmtime_wasi_http::Error::InternalError(Some(
                    "the reused instance had not ended the body by the deadline".to_string(),
                )))));
            }
            other => return other,
        }
        let Some(task) = self.task.as_mut() else {
            let cut = self
                .instance
                .as_ref()
                .is_some_and(|instance| instance.failure().is_some());
            return Poll::Ready(cut.then(|| {
                Err(wasmtime_wasi_http::Error::InternalError(Some(
                    "the reused instance failed while streaming the body".to_string(),
                )))
            }));
        };
        let Poll::Ready(outcome) = std::pin::Pin::new(task).poll(cx) else {
            return Poll::Pending;
        };
        self.task = None;
        match outcome {
            Ok(Ok(())) => Poll::Ready(None),
            Ok(Err(trap)) => {
                self.failure.report(&trap, true);
                Poll::Ready(Some(Err(wasmtime_wasi_http::Error::InternalError(Some(
                    "the guest failed while streaming its body".to_string(),
                )))))
            }
            Err(join_error) => Poll::Ready(Some(Err(wasmtime_wasi_http::Error::InternalError(
                Some(join_error.to_string()),
            )))),
        }
    }

    fn is_end_stream(&self) -> bool {
        // A reused instance's body ends only through `poll_frame`, which checks the instance.
        self.task.is_none() && self.instance.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
