//! Opt-in instance reuse, with `wasmtime serve`'s meaning: an instance serves up to
//! `--max-instance-reuse-count` requests, up to `--max-instance-concurrent-reuse-count` of them
//! at once (a WASIp2 instance one at a time, its export being synchronous), and goes away after
//! `--idle-instance-timeout-ms` without one. The workers,
//! their queue and their expiry are wasmtime-wasi-http's own ([`ProxyHandler`]); this module
//! gives them the host's stores, limits and per-request parts.
//!
//! What reuse gives up: requests that share an instance share its memory (what one request
//! left there, the next can read), its memory limit and byte bounds, and its captured output;
//! a trap or an expired deadline ends the instance and fails every request inside it, no
//! other. Each request keeps its own server span, route, host-call counts and `users`,
//! `telemetry` and `wasi:otel` state: a host call is served with the parts of the task that
//! made it ([`RequestState::adopt`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use wasmtime::component::GuestTaskId;
use wasmtime::{Engine, Store, StoreContextMut, UpdateDeadline};
use wasmtime_wasi_http::handler::{
    ExpirationError, HandlerState, Instance, InstantiationError, ProxyHandler, ProxyPre,
    ShouldAccept, TrapOrPanicError, WorkerExpiration, WorkerState, WorkerStatus,
};
use wasmtime_wasi_http::{WasiBody, WasiHttpView};
use wasmtime_wasi_http::{p2, p3};

use crate::error::{MAX_ERROR_CODE_TEXT, RequestError, bounded_debug, one_line};
use crate::interfaces::stdio::GuestOutput;
use crate::observability::metrics::Metrics;
use crate::observability::request_report::{CostReport, RequestRecord, RequestSpan};
use crate::observability::routes::RouteTemplates;
use crate::runtime::capacity::{BodyBounds, GuestCapacity, GuestLimits, InstanceReuse};
use crate::runtime::guest_body::GuestBody;
use crate::runtime::held::{BODY_CHUNK_BYTES, TooMuchHeld};
use crate::runtime::outbound::OutboundSockets;
use crate::runtime::pool::BUDGET_SPENT;
use crate::runtime::slots::{InstancePermit, SLOT_WAIT};
use crate::runtime::store::{
    Counted, InstanceFailure, Outbound, RequestContext, RequestParts, RequestSlot, RequestState,
    Served, ServingInstance, Taken, new_reused_store,
};
use crate::user_store::UserStore;

/// How long a request waits in the queue for a reused instance that says it is free to take
/// it. An instance takes requests only between turns of its event loop: one whose task
/// computes, or holds its store in a host call, says it is free and takes nothing until it is
/// done. Past this, the request goes to an instance of its own, and so do the next ones until
/// that instance is back.
pub const QUEUE_WAIT: Duration = Duration::from_millis(250);

/// The reused instances of one guest.
pub(super) struct ReusedInstances {
    pre: Arc<ProxyPre<RequestState>>,
    engine: Engine,
    reuse: InstanceReuse,
    limits: GuestLimits,
    capacity: Arc<GuestCapacity>,
    /// Made with the first client request, whose context names the user store and metrics.
    handler: OnceLock<ProxyHandler<Instances>>,
    /// Set once an instance has left a request unanswered, so that it is said once.
    left_unanswered: AtomicBool,
    /// Tells its instances to go, at a reload.
    retirement: Arc<Retirement>,
    /// Requests withdrawn from the queue that no instance has taken since.
    untaken: Arc<AtomicUsize>,
    /// Instances being made now.
    making: Arc<AtomicUsize>,
    /// Instances that said, at their latest turn, that they would take a request.
    free: Arc<AtomicUsize>,
    /// What a withdrawn request's copy is served with.
    refusal: Arc<Refusal>,
}

impl ReusedInstances {
    /// Instances of `pre`, compiled for `engine`, reused as `reuse` says, each within `limits`
    /// and `capacity`.
    pub(super) fn new(
        pre: ProxyPre<RequestState>,
        engine: Engine,
        reuse: InstanceReuse,
        limits: GuestLimits,
        capacity: Arc<GuestCapacity>,
    ) -> ReusedInstances {
        ReusedInstances {
            pre: Arc::new(pre),
            engine,
            reuse,
            limits,
            handler: OnceLock::new(),
            left_unanswered: AtomicBool::new(false),
            retirement: Arc::default(),
            untaken: Arc::default(),
            making: Arc::default(),
            free: Arc::default(),
            refusal: Arc::new(Refusal {
                users: Arc::new(UserStore::memory(0)),
                sockets: capacity.outbound_sockets.clone(),
            }),
            capacity,
        }
    }

    /// Has every instance go once it has no request left, the idle ones at once: the guest
    /// serves no new request.
    pub(super) fn retire(&self) {
        self.retirement.retire();
    }

    /// How its instances are reused.
    pub(super) fn reuse(&self) -> InstanceReuse {
        self.reuse
    }

    /// Serves a client's request (`context`, counted in `metrics`) in a reused instance, its
    /// labels from `route_templates` and its outgoing calls within `outbound`, or gives it back
    /// when none takes it within [`QUEUE_WAIT`]. The request holds its instance slot
    /// (`permit`) as a fresh instance does: running until its head is out, then streaming, or
    /// taken back by a request that finds none free.
    pub(super) async fn handle(
        &self,
        context: RequestContext,
        metrics: Arc<Metrics>,
        route_templates: Arc<RouteTemplates>,
        outbound: Outbound,
        request: http::Request<WasiBody>,
        permit: InstancePermit,
    ) -> Result<Handed, RequestError> {
        // A request withdrawn earlier is still in the queue: the instance that said it was
        // free has not come back for it, and would not for this one either.
        if self.untaken.load(Ordering::SeqCst) > 0 {
            let cost = context.cost_report();
            return Ok(Handed::Untaken(UntakenRequest {
                context,
                request,
                cost,
            }));
        }
        let handler = self.handler.get_or_init(|| {
            ProxyHandler::new(Instances {
                pre: Arc::clone(&self.pre),
                engine: self.engine.clone(),
                reuse: self.reuse,
                limits: self.limits,
                capacity: Arc::clone(&self.capacity),
                users: Arc::clone(context.users()),
                metrics,
                retirement: Arc::clone(&self.retirement),
                making: Arc::clone(&self.making),
                free: Arc::clone(&self.free),
            })
        });
        let untouched = context.clone();
        let record = Arc::clone(context.record());
        let cost = context.cost_report();
        let client_stalled = Arc::clone(context.client_stalled());
        let parts = RequestParts::new(context, route_templates, outbound);
        let (head, body) = request.into_parts();
        let head_copy = copy_of(&head);
        let (body, lent) = LentBody::lend(body);
        let request = http::Request::from_parts(head, lent);
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        let mut ending = RequestEnd {
            cost,
            record,
            slot: Arc::new(RequestSlot::new(parts)),
            body,
            ended: Some(ended),
            answered: false,
            // As a fresh instance's slot is held at most to its backstop.
            hold_until: Instant::now() + self.limits.request_timeout + Duration::from_secs(1),
            refusal: Arc::clone(&self.refusal),
        };
        // The slot is held in a task of its own, which ends with the request or is stopped to
        // give the slot to another (`InstanceSlots::start_streaming`).
        let hold = SlotHold {
            _permit: permit.clone(),
            request: Arc::clone(&ending.slot),
            stops_instance: self.reuse.concurrent == 1,
            ended: false,
        };
        let slot_holder = tokio::spawn(async move {
            let _ = end.await;
            hold.give_back();
        });
        // The instance's own expiry ends a request at its deadline; this is the backstop.
        let backstop = self.limits.request_timeout * 2 + Duration::from_secs(1);
        let answering =
            tokio::time::timeout(backstop, handler.handle(Arc::clone(&ending.slot), request));
        tokio::pin!(answering);
        let queued = Instant::now();
        let answer = loop {
            match tokio::time::timeout(QUEUE_WAIT, &mut answering).await {
                Ok(answer) => break answer,
                // With no instance saying it is free, wasmtime-wasi-http makes one that takes
                // the request, as under `wasmtime serve`.
                Err(_) if self.free.load(Ordering::SeqCst) == 0 => {}
                // An instance being made takes this request or the queue's next: the wait goes
                // on while one is, up to the slot wait in all.
                Err(_)
                    if self.making.load(Ordering::SeqCst) > 0 && queued.elapsed() < SLOT_WAIT => {}
                Err(_)
                    if ending
                        .slot
                        .withdraw(|| self.refusal.parts(), Some(&self.untaken)) =>
                {
                    return Ok(Handed::Untaken(ending.give_back(untouched, head_copy)));
                }
                Err(_) => break answering.await,
            }
        };
        // Answered, or past the backstop (its instance stopped): its slot is free to go when the
        // request ends.
        ending.answered = true;
        let answer = answer.map_err(|_| RequestError::Timeout)?;
        let served = ending.slot.served();
        match answer {
            Ok(response) => {
                let instance = served.map(|served| Arc::clone(&served.instance));
                self.capacity
                    .slots
                    .start_streaming(&permit, slot_holder.abort_handle());
                let bounds = self.limits.body;
                Ok(Handed::Answered(response.map(|body| {
                    GuestBody::reused(body, ending, instance, bounds, client_stalled)
                })))
            }
            Err(error) => {
                // The request's task may have vanished with its instance, whose error reaches
                // the worker, not here: wait for the instance to say why, or to show it lives
                // on past the request. Either comes at once; the bound is for a busy machine.
                let mut lives_on = false;
                if let Some(served) = served
                    && (error.is::<TrapOrPanicError>() || is_unanswered(&error))
                {
                    lives_on = served
                        .instance
                        .outcome(served.ordinal, Duration::from_secs(1))
                        .await;
                }
                // Alive past the request, the instance may have failed since in another: not
                // this request's cause.
                let failure = if lives_on && is_unanswered(&error) {
                    RequestError::NoResponse
                } else {
                    failure(error, served)
                };
                if let (RequestError::NoResponse, Some(served)) = (&failure, served)
                    && served.instance.retire()
                    && !self.left_unanswered.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        "a reused instance returned without answering a request, and takes no \
                         more, as will any other that does: a guest whose runtime answers one \
                         request per instance (componentize-js's) must be served fresh"
                    );
                }
                Err(failure)
            }
        }
    }
}

/// What the copy of a withdrawn request is served with, if an instance takes it after all: an
/// empty store that takes nothing, no span, no call out, so nothing of it is done twice.
struct Refusal {
    users: Arc<UserStore>,
    sockets: OutboundSockets,
}

impl Refusal {
    fn parts(&self) -> RequestParts {
        RequestParts::new(
            RequestContext::quiet(Arc::clone(&self.users)),
            Arc::default(),
            Outbound {
                rules: Arc::default(),
                sockets: self.sockets.clone(),
                deadline: Instant::now(),
            },
        )
    }
}

/// What became of a client's request handed to the reused instances.
pub(super) enum Handed {
    /// An instance took it and answered.
    Answered(http::Response<GuestBody>),
    /// No instance took it: it comes back whole, for an instance of its own.
    Untaken(UntakenRequest),
}

/// A client's request no reused instance took, as it came, with its cost report.
pub(super) struct UntakenRequest {
    pub context: RequestContext,
    pub request: http::Request<WasiBody>,
    pub cost: Option<CostReport>,
}

/// A copy of `head` without its extensions, which the host does not use.
fn copy_of(head: &http::request::Parts) -> http::request::Parts {
    let (mut copy, ()) = http::Request::new(()).into_parts();
    copy.method = head.method.clone();
    copy.uri = head.uri.clone();
    copy.version = head.version;
    copy.headers = head.headers.clone();
    copy
}

/// Why no instance could be made for a request.
#[derive(Debug, thiserror::Error)]
enum InstanceRefused {
    /// Every instance slot stayed taken.
    #[error("every instance slot stayed taken")]
    Busy,
    /// The memory budget refused the new instance its memory.
    #[error("{}", BUDGET_SPENT)]
    OverBudget,
    /// Instantiating took longer than a request may.
    #[error("instantiating the guest outlived the deadline")]
    Timeout,
}

/// The request error `error` from wasmtime-wasi-http's handler means, `served` saying which
/// instance served the request, if one did.
fn failure(error: wasmtime::Error, served: Option<&Served>) -> RequestError {
    if let Some(refused) = error.downcast_ref::<InstantiationError<Arc<RequestSlot>>>() {
        return match refused.error.downcast_ref::<InstanceRefused>() {
            Some(InstanceRefused::Busy) => RequestError::Busy,
            Some(InstanceRefused::OverBudget) => RequestError::OverBudget(error),
            Some(InstanceRefused::Timeout) => RequestError::Timeout,
            None if one_line(&**refused.error).contains(BUDGET_SPENT) => {
                RequestError::OverBudget(error)
            }
            None => RequestError::Setup(error),
        };
    }
    let expired = served.is_some_and(|served| served.instance.expired.load(Ordering::SeqCst));
    if error.is::<ExpirationError>() || expired {
        return RequestError::Timeout;
    }
    if let Some(code) = error.downcast_ref::<p3::bindings::http::types::ErrorCode>() {
        return RequestError::ErrorCode(bounded_debug(code, MAX_ERROR_CODE_TEXT));
    }
    if let Some(code) = error.downcast_ref::<p2::bindings::http::types::ErrorCode>() {
        return RequestError::ErrorCode(bounded_debug(code, MAX_ERROR_CODE_TEXT));
    }
    let instance_failure = served.and_then(|served| served.instance.failure());
    if instance_failure.is_none() && is_unanswered(&error) {
        return RequestError::NoResponse;
    }
    let by_budget = instance_failure.is_some_and(|failed| failed.by_budget)
        || error
            .downcast_ref::<TooMuchHeld>()
            .is_some_and(TooMuchHeld::by_budget);
    // `TrapOrPanicError` is wasmtime's word for a failure it could not trace to one request:
    // its text may carry another request's data, so it is named without it (the instance's
    // WARN line, when it ends, has it).
    let error = match instance_failure {
        _ if error.is::<TrapOrPanicError>() => {
            error.context("the reused instance serving it failed")
        }
        Some(failed) => error.context(format!(
            "the reused instance serving it failed: {}",
            failed.cause
        )),
        None => error,
    };
    // A refusal the instance met while the request was inside it.
    let refused = |now: fn(&ServingInstance) -> bool, before: fn(&Served) -> bool| {
        served.is_some_and(|served| now(&served.instance) && !before(served))
    };
    if by_budget
        || refused(
            |i| i.record.cost.was_over_budget(),
            |s| s.over_budget_before,
        )
    {
        RequestError::OverBudget(error)
    } else if refused(|i| i.record.cost.was_over_limit(), |s| s.over_limit_before) {
        RequestError::OverLimit(error)
    } else {
        RequestError::Trapped(error)
    }
}

/// Whether `error` is wasmtime-wasi-http's word, alone, for a WASIp2 handler that ended
/// without setting its response, which it also says when the instance failed meanwhile.
fn is_unanswered(error: &wasmtime::Error) -> bool {
    error.root_cause().to_string() == "guest never invoked `response-outparam::set` method"
}

/// What ends with a reused instance's request (its body gone, or its failure answered): its
/// parts, and its cost report (the instance's memory peak its own).
pub(super) struct RequestEnd {
    cost: Option<CostReport>,
    record: Arc<RequestRecord>,
    slot: Arc<RequestSlot>,
    /// The client's body, lent to the instance until the request ends.
    body: Arc<Mutex<Lent>>,
    /// Dropped when the request ends, so that its slot holder gives the slot back.
    ended: Option<tokio::sync::oneshot::Sender<()>>,
    /// Set once the request's answer has come.
    answered: bool,
    /// The latest its slot is held for a request whose client left before its answer.
    hold_until: Instant,
    /// What its copy is served with, should its client leave before an instance takes it.
    refusal: Arc<Refusal>,
}

impl RequestEnd {
    /// The withdrawn request, whole again: its `context`, its `head` and its body, and its cost
    /// report, which is not made here.
    fn give_back(mut self, context: RequestContext, head: http::request::Parts) -> UntakenRequest {
        let body = self
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .body
            .take();
        // No instance took the request, so none has read its body.
        let body = body.unwrap_or_else(|| {
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync()
        });
        UntakenRequest {
            context,
            request: http::Request::from_parts(head, body),
            cost: self.cost.take(),
        }
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        // Its client gone before an instance took it, the request is withdrawn for good.
        if !self.answered {
            let refusal = Arc::clone(&self.refusal);
            self.slot.withdraw(|| refusal.parts(), None);
        }
        self.slot.end();
        if let Some(served) = self.slot.served() {
            let peak = served.instance.record.cost.read().memory_peak;
            self.record.cost.memory_grew(peak);
        }
        drop(self.cost.take());
        // Its client gone while an instance serves it, the request keeps its slot until the
        // instance has done with it (at most until its backstop), as a fresh instance keeps its
        // own, so that the slots bound what runs.
        if !self.answered
            && !self.slot.is_withdrawn()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
            && let Some(ended) = self.ended.take()
        {
            let (slot, until) = (Arc::clone(&self.slot), self.hold_until);
            runtime.spawn(async move {
                slot.done(until).await;
                drop(ended);
            });
        }
    }
}

/// A reused instance's request's hold on its instance slot.
struct SlotHold {
    _permit: InstancePermit,
    request: Arc<RequestSlot>,
    /// Whether the request has its instance to itself, one request at a time.
    stops_instance: bool,
    /// Set when the request ended; dropped before, the hold was taken back for another
    /// request.
    ended: bool,
}

impl SlotHold {
    /// Gives the slot back at the request's end.
    fn give_back(mut self) {
        self.ended = true;
    }
}

impl Drop for SlotHold {
    /// A slot taken back stops an instance that serves this request alone, as a fresh instance
    /// is stopped; one serving several at once, or that has taken a request since (a body
    /// still streaming does not keep it from taking one), streams on, within its stall and
    /// response bounds: another client's request is never stopped for it.
    fn drop(&mut self) {
        if !self.ended
            && self.stops_instance
            && !self.request.is_ended()
            && let Some(served) = self.request.served()
            && served.instance.taken() == served.ordinal
        {
            served.instance.stop();
        }
    }
}

/// A client's request body as a reused instance reads it: lent for the request's life. The
/// request owns the body ([`RequestEnd`]), its bytes and their share of the host's body budget;
/// the instance reads it through a weak reference, in copies of at most [`BODY_CHUNK_BYTES`]
/// that share nothing with the buffer. So a guest that keeps the request, its body or a stream
/// of it past the request's end holds neither the bytes nor the budget: a read then fails. The
/// body lent is one the edge has read whole, never pending: nothing waits on it when it goes.
struct LentBody {
    lent: Weak<Mutex<Lent>>,
}

/// What a request lends: its body, and what is left of the frame being copied out.
struct Lent {
    /// `None` once the request is withdrawn: it went to an instance of its own, and the copy
    /// left in the queue reads an empty body.
    body: Option<WasiBody>,
    left: Bytes,
}

impl LentBody {
    /// `body`, owned by the first half (the request) and lent through the second.
    fn lend(body: WasiBody) -> (Arc<Mutex<Lent>>, WasiBody) {
        let owned = Arc::new(Mutex::new(Lent {
            body: Some(body),
            left: Bytes::new(),
        }));
        let lent = LentBody {
            lent: Arc::downgrade(&owned),
        };
        (owned, lent.boxed_unsync())
    }
}

impl Body for LentBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let Some(owned) = self.lent.upgrade() else {
            return Poll::Ready(Some(Err(wasmtime_wasi_http::Error::InternalError(Some(
                "the request this body was lent by has ended".to_string(),
            )))));
        };
        let mut lent = owned.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if !lent.left.is_empty() {
                let length = lent.left.len().min(BODY_CHUNK_BYTES);
                let chunk = Bytes::copy_from_slice(&lent.left[..length]);
                lent.left.advance(length);
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            // A withdrawn request's copy reads an empty body: nothing for a guest to fail on.
            let Some(body) = lent.body.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => lent.left = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                end => return Poll::Ready(end),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.lent.upgrade().is_some_and(|owned| {
            let lent = owned.lock().unwrap_or_else(PoisonError::into_inner);
            lent.left.is_empty() && lent.body.as_ref().is_none_or(Body::is_end_stream)
        })
    }

    // Passed on, so that a body the guest forwards keeps its length.
    fn size_hint(&self) -> SizeHint {
        let Some(owned) = self.lent.upgrade() else {
            return SizeHint::default();
        };
        let lent = owned.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(body) = lent.body.as_ref() else {
            return SizeHint::with_exact(0);
        };
        let (inner, left) = (body.size_hint(), lent.left.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(left));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(left));
        }
        hint
    }
}

/// What the workers share: how to make an instance.
struct Instances {
    pre: Arc<ProxyPre<RequestState>>,
    engine: Engine,
    reuse: InstanceReuse,
    limits: GuestLimits,
    capacity: Arc<GuestCapacity>,
    users: Arc<UserStore>,
    metrics: Arc<Metrics>,
    retirement: Arc<Retirement>,
    /// Instances being made now.
    making: Arc<AtomicUsize>,
    /// Instances that say they would take a request.
    free: Arc<AtomicUsize>,
}

/// What a reload tells a guest's instances. wasmtime-wasi-http's workers outlive their
/// handler, each waiting for its idle timeout (up to an hour): without this, an old guest's
/// idle instances would keep the places the new guest's instances need.
#[derive(Default)]
struct Retirement {
    /// Set once the guest is swapped out: an instance takes no request past the one it serves.
    retired: AtomicBool,
    /// Wakes every instance's expiry to read it.
    told: Arc<Notify>,
}

impl Retirement {
    fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        self.told.notify_waiters();
    }

    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }
}

impl HandlerState for Instances {
    type StoreData = RequestState;
    type WorkerExpiration = Expiry;
    type WorkerState = Worker;

    async fn instantiate(&self) -> wasmtime::Result<Instance<RequestState, Expiry, Worker>> {
        let _making = Counted::new(&self.making);
        // Every live instance holds a place, so instances stay within the pools' regions.
        let permit = self
            .capacity
            .slots
            .acquire_instance()
            .await
            .map_err(|_| InstanceRefused::Busy)?;
        let instance = Arc::new(ServingInstance::default());
        // Between its requests' host calls, an instance has a quiet request's parts: no span,
        // no outgoing call allowed.
        let idle = Box::new(RequestParts::new(
            RequestContext::quiet(Arc::clone(&self.users)),
            Arc::default(),
            Outbound {
                rules: Arc::default(),
                sockets: self.capacity.outbound_sockets.clone(),
                deadline: Instant::now(),
            },
        ));
        let mut store = new_reused_store(
            &self.engine,
            idle,
            GuestOutput::new(Some((RequestSpan::none(), Arc::clone(&self.metrics)))),
            self.capacity.limiter(Arc::clone(&instance.record)),
            self.capacity.held_objects(&http::HeaderMap::new()),
        );
        // The guest yields at every tick; the instance's expiry, not the epoch, stops it.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));
        let started = Instant::now();
        let proxy = tokio::time::timeout(
            self.limits.request_timeout,
            self.pre.instantiate_async(&mut store),
        )
        .await
        .map_err(|_| InstanceRefused::Timeout)?
        .map_err(|error| {
            if instance.record.cost.was_over_budget() {
                InstanceRefused::OverBudget.into()
            } else {
                error
            }
        })?;
        self.metrics.observe_instantiation(started.elapsed());
        Ok(Instance {
            store,
            proxy,
            view: <RequestState as WasiHttpView>::http,
            expiration: Expiry {
                idle_timeout: self.reuse.idle_timeout,
                request_timeout: self.limits.request_timeout,
                body: self.limits.body,
                timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
                instance: Arc::clone(&instance),
                told: Box::pin(Arc::clone(&self.retirement.told).notified_owned()),
                retirement: Arc::clone(&self.retirement),
            },
            state: Worker {
                free: FreeClaim {
                    claimed: AtomicBool::new(false),
                    count: Arc::clone(&self.free),
                },
                in_hand: AtomicUsize::new(0),
                reuse: self.reuse,
                request_timeout: self.limits.request_timeout,
                instance,
                retirement: Arc::clone(&self.retirement),
                _permit: permit,
            },
        })
    }
}

/// One instance's worker: how many requests it takes, what they learn of the instance, and
/// its place in the pools, given back after its store.
struct Worker {
    /// Whether the instance said, when last asked, that it would take a request.
    free: FreeClaim,
    /// The requests the instance had in hand when it was last asked to take one.
    in_hand: AtomicUsize,
    reuse: InstanceReuse,
    request_timeout: Duration,
    instance: Arc<ServingInstance>,
    retirement: Arc<Retirement>,
    _permit: OwnedSemaphorePermit,
}

impl WorkerState for Worker {
    type StoreData = RequestState;
    type RequestData = Arc<RequestSlot>;

    fn should_accept_request(&self, concurrent: usize, total: usize) -> ShouldAccept {
        self.in_hand.store(concurrent, Ordering::Relaxed);
        if concurrent == 0 {
            self.instance.settle();
        }
        // An instance that left a request unanswered is broken: its requests go elsewhere. An
        // instance of a guest swapped out serves the request it was made for (one may wait in
        // the old handler's queue), and no more.
        let swapped_out = self.retirement.is_retired() && total > 0;
        let answer =
            if total >= self.reuse.requests as usize || self.instance.is_retired() || swapped_out {
                ShouldAccept::Never
            } else if concurrent >= self.reuse.concurrent as usize {
                ShouldAccept::No
            } else {
                ShouldAccept::Yes
            };
        self.free.claim(matches!(answer, ShouldAccept::Yes));
        answer
    }

    fn on_request_start(
        &self,
        mut store: StoreContextMut<'_, RequestState>,
        slot: Arc<RequestSlot>,
        task: GuestTaskId,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
        // The copy of a request withdrawn from a stalled queue: the instance that stalled it (or
        // one made for the queue) takes no more, and is stopped at once if it holds nothing else.
        // A copy is served with nothing of its request's own.
        if slot.served_by(Arc::clone(&self.instance)) == Taken::CopyFromStalledQueue {
            self.instance.retire();
            let idle = self.in_hand.load(Ordering::Relaxed) == 0
                && self.instance.bodies(|bodies| bodies.open == 0);
            if idle {
                self.instance.stop_for_copy();
            }
        }
        // Dropped when the instance has done with the request: answered, or expired.
        let done = DoneWith(Arc::clone(&slot));
        store.data_mut().adopt(task, slot);
        let deadline = tokio::time::sleep(self.request_timeout);
        Box::pin(async move {
            let _done = done;
            deadline.await;
        })
    }

    fn drop(&self, store: Store<RequestState>, result: wasmtime::Result<()>) {
        // Before the store goes: the bodies its drop ends were cut short.
        self.instance.end(result.as_ref().err().map(|error| {
            InstanceFailure {
                cause: one_line(&**error),
                by_budget: error
                    .downcast_ref::<TooMuchHeld>()
                    .is_some_and(TooMuchHeld::by_budget),
            }
        }));
        drop(store);
        match result {
            Err(_) if self.instance.stopped_for_copy() => {
                tracing::debug!("a reused guest instance was stopped for a withdrawn request");
            }
            Err(error) => {
                tracing::warn!(error = one_line(&*error), "a reused guest instance ended")
            }
            Ok(()) => {}
        }
    }
}

/// Says that the instance has done with a request, when dropped.
struct DoneWith(Arc<RequestSlot>);

impl Drop for DoneWith {
    fn drop(&mut self) {
        self.0.mark_done();
    }
}

/// Whether an instance said, at its latest turn, that it would take a request; counted among
/// its guest's instances while it does, and no longer once it goes.
struct FreeClaim {
    claimed: AtomicBool,
    count: Arc<AtomicUsize>,
}

impl FreeClaim {
    fn claim(&self, free: bool) {
        if self.claimed.swap(free, Ordering::SeqCst) != free {
            if free {
                self.count.fetch_add(1, Ordering::SeqCst);
            } else {
                self.count.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for FreeClaim {
    fn drop(&mut self) {
        self.claim(false);
    }
}

/// When an instance goes: idle past the idle timeout, or when a reload tells it to; working towards a response past the
/// request deadline since its latest request came (the backstop of the per-request deadline,
/// which a guest busy in a loop keeps from firing); or, every response head out, when a body
/// has waited on it for the stall bound, when its bodies have streamed for the body's timeout,
/// or, none open, past the request deadline.
struct Expiry {
    idle_timeout: Duration,
    request_timeout: Duration,
    body: BodyBounds,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Told when it stops the instance at a deadline, so its requests are answered 503.
    instance: Arc<ServingInstance>,
    /// Ready when a reload tells the instances something; made anew each time.
    told: Pin<Box<OwnedNotified>>,
    retirement: Arc<Retirement>,
}

impl WorkerExpiration for Expiry {
    fn poll(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        status: WorkerStatus,
        since: Instant,
    ) -> Poll<()> {
        let expiry = self.get_mut();
        let stopped = expiry.instance.bodies(|bodies| {
            if !bodies
                .expiry
                .as_ref()
                .is_some_and(|waker| waker.will_wake(context.waker()))
            {
                bodies.expiry = Some(context.waker().clone());
            }
            bodies.stopped
        });
        if stopped {
            expiry.instance.expired.store(true, Ordering::SeqCst);
            return Poll::Ready(());
        }
        // Listening before the word is read, so a word said in between wakes this again.
        while expiry.told.as_mut().poll(context).is_ready() {
            let told = Arc::clone(&expiry.retirement.told).notified_owned();
            expiry.told.set(told);
        }
        let at = match status {
            WorkerStatus::Idle if expiry.retirement.is_retired() => return Poll::Ready(()),
            WorkerStatus::Idle => since + expiry.idle_timeout,
            WorkerStatus::Requests => since + expiry.request_timeout,
            // Every head is out: the instance writes bodies, or works on after its answers.
            WorkerStatus::PostReturn => {
                expiry.instance.bodies(|bodies| match bodies.waiting_since {
                    _ if bodies.open == 0 => since + expiry.request_timeout,
                    Some(waiting) => (waiting + expiry.body.stall).min(since + expiry.body.timeout),
                    None => since + expiry.body.timeout,
                })
            }
        };
        if Instant::now() >= at {
            if status != WorkerStatus::Idle {
                expiry.instance.expired.store(true, Ordering::SeqCst);
            }
            return Poll::Ready(());
        }
        expiry.timer.as_mut().reset(at.into());
        // Pending until `at`, when the worker polls again; a timer already past it expires now.
        if expiry.timer.as_mut().poll(context).is_pending() {
            return Poll::Pending;
        }
        if status != WorkerStatus::Idle {
            expiry.instance.expired.store(true, Ordering::SeqCst);
        }
        Poll::Ready(())
    }
}
