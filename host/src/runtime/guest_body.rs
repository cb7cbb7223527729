//! A guest's response body: bounded by progress once its head is out, and ended only when the
//! guest's task has ended well.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use opentelemetry::trace::TraceContextExt;
use tokio::time::{Instant, Sleep};

use crate::error::one_line;
use crate::observability::metrics::{Metrics, TRAP_MOMENTS};
use crate::observability::request_report;
use crate::runtime::capacity::BodyBounds;
use crate::runtime::store::{OpenBodies, ServingInstance};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

/// A guest's response body, bounded by progress instead of the request's deadline, that ends
/// only when the guest's task has ended well.
///
/// Once the head is out, the body streams as long as both sides make progress: it is cut when
/// the guest writes none of it for [`BodyBounds::stall`] (hyper asks for a frame and none comes),
/// when the client takes less than 240 bytes a second of it for as long (hyper stops asking,
/// and the connection's write stall closes it), or when it has streamed for
/// [`BodyBounds::timeout`]. Each cut says which bound in its log line and stops a fresh
/// instance; a reused one is stopped by its expiry (`runtime::reuse`) once a body has waited on
/// it for the stall bound.
///
/// wasmtime-wasi-http ends a body normally when its instance goes away mid-stream: with chunked
/// encoding the client would see a cut-short body as complete. Here the end of the body waits
/// for the task's outcome, and a failed task turns it into an error, so hyper breaks the
/// connection instead. A body dropped before its end (a `HEAD`, a client gone) leaves a watcher
/// on the task, which gives it a stall's time to end: a guest that fails then is logged and
/// counted all the same.
pub struct GuestBody {
    inner: HyperOutgoingBody,
    /// The fresh instance's task; `None` for a reused instance, or once it has ended.
    task: Option<tokio::task::JoinHandle<wasmtime::Result<()>>>,
    report: CutReport,
    /// What ends with the body of a reused instance's request (`runtime::reuse`).
    _request: Option<Box<dyn Send>>,
    /// The reused instance writing the body: a body whose stream ends once it has failed was
    /// cut short.
    instance: Option<Arc<ServingInstance>>,
    clock: ProgressClock,
}

/// The body's bounds, measured.
struct ProgressClock {
    bounds: BodyBounds,
    /// When the body has streamed for the whole of `bounds.timeout`.
    ends: Instant,
    /// Since when hyper has waited on the guest; `None` while the guest keeps up.
    waiting_since: Option<Instant>,
    /// Wakes the body at the next bound due while it waits on the guest.
    timer: Pin<Box<Sleep>>,
    /// Set once the guest has ended the stream: the body then waits for its task to end.
    stream_ended: bool,
    ended: bool,
}

/// The bound a body was cut at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The guest wrote none of it for the stall bound.
    GuestStalled,
    /// It streamed for the whole of its timeout.
    TimedOut,
}

impl ProgressClock {
    fn new(bounds: BodyBounds) -> ProgressClock {
        let now = Instant::now();
        ProgressClock {
            bounds,
            ends: now + bounds.timeout,
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep_until(now + bounds.timeout)),
            stream_ended: false,
            ended: false,
        }
    }

    /// The guest handed hyper a frame at `now`: the cut due, if the body's time is up.
    fn frame(&mut self, now: Instant) -> Option<Cut> {
        self.waiting_since = None;
        (now >= self.ends).then_some(Cut::TimedOut)
    }

    /// Whether hyper waits on the guest for the body's next bytes.
    fn waits(&self) -> bool {
        self.waiting_since.is_some() && !self.ended
    }

    /// hyper waits on the guest at `now`: the cut due, else `None` with the timer set to wake
    /// `cx` when the next one comes due.
    fn waiting(&mut self, now: Instant, cx: &mut Context<'_>) -> Option<Cut> {
        let since = *self.waiting_since.get_or_insert(now);
        let (due, cut) = if since + self.bounds.stall < self.ends {
            (since + self.bounds.stall, Cut::GuestStalled)
        } else {
            (self.ends, Cut::TimedOut)
        };
        if now >= due {
            return Some(cut);
        }
        if self.timer.deadline() != due {
            self.timer.as_mut().reset(due);
        }
        self.timer.as_mut().poll(cx).is_ready().then_some(cut)
    }

    /// Why the body was cut at `cut`, for its log line.
    fn cause(&self, cut: Cut) -> String {
        match cut {
            Cut::GuestStalled if self.stream_ended => format!(
                "the guest ended its body but ran on for {} ms (--response-stall-ms)",
                self.bounds.stall.as_millis()
            ),
            Cut::GuestStalled => format!(
                "the guest wrote none of its body for {} ms (--response-stall-ms)",
                self.bounds.stall.as_millis()
            ),
            Cut::TimedOut => format!(
                "the body was still streaming {} ms after its head (--response-timeout-ms)",
                self.bounds.timeout.as_millis()
            ),
        }
    }
}

/// Where a response cut after its head is reported.
struct CutReport {
    /// The request's log fields and span ids, for the line of a failure.
    request: Option<opentelemetry::Context>,
    /// Where a guest's failure is counted, for a client's request.
    metrics: Option<Arc<Metrics>>,
    /// Set by the connection when its client took too little of the response for the stall
    /// bound.
    client_stalled: Arc<AtomicBool>,
}

impl CutReport {
    /// Where the current request's cut is reported, counted in `metrics`; its connection sets
    /// `client_stalled`.
    fn current(metrics: Option<Arc<Metrics>>, client_stalled: Arc<AtomicBool>) -> CutReport {
        CutReport {
            request: Some(request_ids()),
            metrics,
            client_stalled,
        }
    }

    fn take(&mut self) -> CutReport {
        CutReport {
            request: self.request.take(),
            metrics: self.metrics.take(),
            client_stalled: Arc::clone(&self.client_stalled),
        }
    }

    /// The line of `write`, with the request's fields and span ids.
    fn in_request(&self, write: impl FnOnce()) {
        let _current = self.request.clone().map(opentelemetry::Context::attach);
        write();
    }

    /// The ERROR line and the count of a guest that failed (or was stopped) for `error` after
    /// its head; `read` says whether the client was still reading the body.
    fn guest_failed(&self, error: &str, read: bool) {
        self.in_request(|| {
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

    /// The WARN line of a client that took less than the minimum rate of its response for
    /// `stall`.
    fn client_stalled(&self, stall: std::time::Duration) {
        self.in_request(|| {
            tracing::warn!(
                stall_ms = stall.as_millis() as u64,
                "the client took less than 240 bytes a second of the body for \
                 --response-stall-ms; response cut short"
            );
        });
    }
}

/// The current request's fields and the ids of its span alone: a clone of the context itself
/// would keep the request's span from ending until hyper drops the body.
fn request_ids() -> opentelemetry::Context {
    opentelemetry::Context::map_current(|current| {
        let ids = opentelemetry::Context::new()
            .with_remote_span_context(current.span().span_context().clone());
        request_report::with_fields(ids, request_report::carried_by(current).as_ref())
    })
}

/// The error that breaks the connection of a body cut short.
fn cut_short(why: &str) -> wasmtime_wasi_http::Error {
    wasmtime_wasi_http::Error::InternalError(Some(why.to_string()))
}

impl GuestBody {
    /// The body of a fresh instance's response, whose `task` runs the instance, within
    /// `bounds` from now; a failure is counted in `metrics`, and the connection sets
    /// `client_stalled` when its client takes too little of it for the stall bound.
    pub(crate) fn new(
        inner: HyperOutgoingBody,
        task: tokio::task::JoinHandle<wasmtime::Result<()>>,
        bounds: BodyBounds,
        metrics: Option<Arc<Metrics>>,
        client_stalled: Arc<AtomicBool>,
    ) -> GuestBody {
        GuestBody {
            inner,
            task: Some(task),
            report: CutReport::current(metrics, client_stalled),
            _request: None,
            instance: None,
            clock: ProgressClock::new(bounds),
        }
    }

    /// The body of a reused `instance`'s response, within `bounds` from now: the instance
    /// outlives it, and `request` ends with it (the instance's own failure is logged when the
    /// instance ends); the connection sets `client_stalled` as for a fresh one.
    pub(super) fn reused(
        inner: HyperOutgoingBody,
        request: impl Send + 'static,
        instance: Option<Arc<ServingInstance>>,
        bounds: BodyBounds,
        client_stalled: Arc<AtomicBool>,
    ) -> GuestBody {
        let body = GuestBody {
            inner,
            task: None,
            report: CutReport::current(None, client_stalled),
            _request: Some(Box::new(request)),
            instance,
            clock: ProgressClock::new(bounds),
        };
        body.tell_instance(|bodies| bodies.open += 1);
        body
    }

    /// Tells the reused instance writing the body, if any, of a `change` in its bodies.
    fn tell_instance(&self, change: impl FnOnce(&mut OpenBodies)) {
        if let Some(instance) = &self.instance {
            instance.bodies(|bodies| {
                change(bodies);
                if let Some(expiry) = bodies.expiry.take() {
                    expiry.wake();
                }
            });
        }
    }

    /// Cuts the body at `cut`: stops a fresh instance, says why, and breaks the connection.
    fn cut(
        &mut self,
        cut: Cut,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, wasmtime_wasi_http::Error>>> {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.clock.ended = true;
        let cause = self.clock.cause(cut);
        self.report.guest_failed(&cause, true);
        Poll::Ready(Some(Err(cut_short(&cause))))
    }
}

impl Drop for GuestBody {
    fn drop(&mut self) {
        if !self.clock.ended && self.report.client_stalled.load(Ordering::Relaxed) {
            self.report.client_stalled(self.clock.bounds.stall);
        }
        let waits = self.clock.waits();
        self.tell_instance(|bodies| {
            bodies.open -= 1;
            if waits {
                bodies.waiting_changed(false);
            }
        });
        let Some(task) = self.task.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            task.abort();
            return;
        };
        let report = self.report.take();
        let stall = self.clock.bounds.stall;
        // Nobody reads the body any more: the guest gets a stall's time to end by itself.
        runtime.spawn(async move {
            let abort = task.abort_handle();
            match tokio::time::timeout(stall, task).await {
                Ok(Ok(Err(trap))) => report.guest_failed(&one_line(&*trap), false),
                Ok(_) => {}
                Err(_) => abort.abort(),
            }
        });
    }
}

impl http_body::Body for GuestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let was_waiting = self.clock.waits();
        let poll = self.poll_body(cx);
        if self.clock.waits() != was_waiting {
            self.tell_instance(|bodies| bodies.waiting_changed(!was_waiting));
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        // A reused instance's body ends only through `poll_frame`, which checks the instance.
        self.task.is_none() && self.instance.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl GuestBody {
    /// The next frame, or the body's end or cut.
    fn poll_body(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, wasmtime_wasi_http::Error>>> {
        let this = self;
        if this.clock.ended {
            return Poll::Ready(None);
        }
        let now = Instant::now();
        match http_body::Body::poll_frame(Pin::new(&mut this.inner), cx) {
            Poll::Ready(Some(Ok(frame))) => {
                return match this.clock.frame(now) {
                    Some(cut) => this.cut(cut),
                    None => Poll::Ready(Some(Ok(frame))),
                };
            }
            Poll::Ready(Some(Err(error))) => {
                this.clock.ended = true;
                return Poll::Ready(Some(Err(error)));
            }
            Poll::Pending => {
                return match this.clock.waiting(now, cx) {
                    Some(cut) => this.cut(cut),
                    None => Poll::Pending,
                };
            }
            Poll::Ready(None) => this.clock.stream_ended = true,
        }
        // The guest has ended the stream: the body ends with its task, which has a stall's time
        // to end as well.
        let Some(task) = this.task.as_mut() else {
            this.clock.ended = true;
            let cut = this
                .instance
                .as_ref()
                .is_some_and(|instance| instance.failure().is_some());
            return Poll::Ready(cut.then(|| {
                Err(cut_short(
                    "the reused instance failed while streaming the body",
                ))
            }));
        };
        let Poll::Ready(outcome) = Pin::new(task).poll(cx) else {
            return match this.clock.waiting(now, cx) {
                Some(cut) => this.cut(cut),
                None => Poll::Pending,
            };
        };
        this.task = None;
        this.clock.ended = true;
        match outcome {
            Ok(Ok(())) => Poll::Ready(None),
            Ok(Err(trap)) => {
                this.report.guest_failed(&one_line(&*trap), true);
                Poll::Ready(Some(Err(cut_short(
                    "the guest failed while streaming its body",
                ))))
            }
            Err(join_error) => Poll::Ready(Some(Err(cut_short(&join_error.to_string())))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const BOUNDS: BodyBounds = BodyBounds {
        timeout: Duration::from_secs(60),
        stall: Duration::from_secs(10),
    };

    #[tokio::test(start_paused = true)]
    async fn a_body_is_cut_once_its_guest_has_written_nothing_for_the_stall_bound() {
        let mut clock = ProgressClock::new(BOUNDS);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(clock.waiting(Instant::now(), &mut cx), None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(clock.waiting(Instant::now(), &mut cx), None);
        // A frame starts the count again.
        assert_eq!(clock.frame(Instant::now()), None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(clock.waiting(Instant::now(), &mut cx), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            clock.waiting(Instant::now(), &mut cx),
            Some(Cut::GuestStalled)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_is_cut_only_at_its_timeout() {
        let mut clock = ProgressClock::new(BOUNDS);
        for _ in 0..59 {
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(clock.frame(Instant::now()), None);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(clock.frame(Instant::now()), Some(Cut::TimedOut));
        let cause = clock.cause(Cut::TimedOut);
        assert!(cause.contains("--response-timeout-ms"), "{cause}");
    }
}
