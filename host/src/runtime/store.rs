//! What one request's wasm store holds, and so everything the guest can reach: the
//! `wasi:http` interfaces, clocks and randomness, and the service's `users` and `telemetry`
//! interfaces, each on its own state; and the limits wasmtime enforces on the instance.
//!
//! It gets no preopened directories, no environment, no arguments and no sockets: the WASI
//! context is empty but for stdout and stderr, whose lines become the request's log lines
//! ([`crate::interfaces::stdio`]); outgoing HTTP requests reach only what the operator allows
//! ([`crate::runtime::outbound`]). What its handles hold on
//! the host's side is weighed after every host call and charged to the memory budget
//! ([`crate::runtime::held`]).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use rustc_hash::FxHashMap;
use wasmtime::component::{GuestTaskId, ResourceTable};
use wasmtime::{CallHook, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::interfaces::otel::{GuestOtel, OtelView};
use crate::interfaces::stdio::{GuestOutput, Stream};
use crate::interfaces::telemetry::{GuestTelemetry, TelemetryView};
use crate::interfaces::users::{UserCalls, UsersView};
use crate::observability::metrics::Metrics;
use crate::observability::request_report::{
    CostReport, HostCalls, HostInterface, RequestRecord, RequestSpan,
};
use crate::observability::routes::RouteTemplates;
use crate::runtime::capacity::InstanceLimiter;
use crate::runtime::held::{BODY_BUFFER_CHUNKS, BODY_CHUNK_BYTES, FIELDS_LIMIT_BYTES, HeldObjects};
use crate::runtime::outbound::{OutboundRules, OutboundSockets, OutgoingCalls};
use crate::user_store::UserStore;

/// Resource handles one request's guest may hold at once (streams, fields, spans...): far more
/// than a request needs, far fewer than wasmtime's default million, which a guest leaking
/// handles in a loop turns into gigabytes of host memory.
pub const MAX_RESOURCES_PER_REQUEST: usize = 16 * 1024;
/// Handles one request's WASIp2 instance may hold at once in its own tables: the resources it
/// holds, bounded above.
pub const MAX_COMPONENT_HANDLES_PER_REQUEST: usize = MAX_RESOURCES_PER_REQUEST;
/// Handles one request's WASIp3 instance may hold at once: its resources, and its streams,
/// futures and subtasks, each a few hundred bytes of the host's memory that the held-object
/// account does not see (wasmtime keeps them). wasmtime's default of 100,000 let a guest making
/// streams in a loop hold 29 MB before it trapped; at 2,048 it is about 0.6 MB, and a request
/// needs a few dozen.
pub const MAX_COMPONENT_HANDLES_PER_WASIP3_REQUEST: usize = 2 * 1024;

/// What the host knows of one request before its guest runs.
#[derive(Clone)]
pub struct RequestContext {
    /// The shared store behind the `users` interface.
    users: Arc<UserStore>,
    /// The client's address, for its share of the instance slots; `None` for requests the
    /// host sends itself.
    peer: Option<IpAddr>,
    /// What the host learns of the request while serving it: its route, a fault, its cost.
    record: Arc<RequestRecord>,
    /// Where the request is reported; `None` for requests the host sends itself.
    reporting: Option<Reporting>,
    /// Set by the connection when its client took too little of a response for the stall
    /// bound.
    client_stalled: Arc<AtomicBool>,
}

/// Where a client's request is traced, logged and counted.
#[derive(Clone)]
struct Reporting {
    metrics: Arc<Metrics>,
    /// The request's server span: the parent of every span the guest opens.
    request_span: RequestSpan,
}

impl RequestContext {
    /// A client's request from `peer` inside `request_span`, on `users`, counted in `metrics`,
    /// what is learnt of it while serving it kept in `record`.
    pub fn new(
        users: Arc<UserStore>,
        peer: Option<IpAddr>,
        metrics: Arc<Metrics>,
        request_span: RequestSpan,
        record: Arc<RequestRecord>,
    ) -> RequestContext {
        RequestContext {
            users,
            peer,
            record,
            reporting: Some(Reporting {
                metrics,
                request_span,
            }),
            client_stalled: Arc::default(),
        }
    }

    /// The same request, whose connection sets `client_stalled` when its client takes too
    /// little of a response for the stall bound.
    pub fn with_client_stalled(self, client_stalled: Arc<AtomicBool>) -> RequestContext {
        RequestContext {
            client_stalled,
            ..self
        }
    }

    /// Set when the request's client took too little of its response for the stall bound.
    pub fn client_stalled(&self) -> &Arc<AtomicBool> {
        &self.client_stalled
    }

    /// A request the host sends itself (a health probe), on `users`: no span, no log lines,
    /// no metrics.
    pub fn quiet(users: Arc<UserStore>) -> RequestContext {
        RequestContext {
            users,
            peer: None,
            record: Arc::default(),
            reporting: None,
            client_stalled: Arc::default(),
        }
    }

    /// The shared store behind the `users` interface.
    pub fn users(&self) -> &Arc<UserStore> {
        &self.users
    }

    /// The client's address, if the request came from one.
    pub fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    /// What the host learns of the request while serving it.
    pub fn record(&self) -> &Arc<RequestRecord> {
        &self.record
    }

    /// What reports the instance's cost when it ends, if the request is a client's.
    pub fn cost_report(&self) -> Option<CostReport> {
        self.reporting.as_ref().map(|reporting| CostReport {
            span: reporting.request_span.clone(),
            metrics: Arc::clone(&reporting.metrics),
            record: Arc::clone(&self.record),
        })
    }

    /// The metrics the request is counted in, if it is a client's.
    pub fn metrics(&self) -> Option<Arc<Metrics>> {
        self.reporting
            .as_ref()
            .map(|reporting| Arc::clone(&reporting.metrics))
    }
}

/// The data of one request's `wasmtime::Store` (or, with reuse, of one instance's).
pub struct RequestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// Resources (streams, requests, responses, span handles) the guest holds handles to.
    table: ResourceTable,
    /// The host's side of the request the guest is serving now (boxed: a reused instance
    /// swaps it at every host call).
    request: Box<RequestParts>,
    /// The instance's resource limits and the host-wide memory budget, enforced by wasmtime.
    limits: InstanceLimiter,
    /// What the objects in `table` hold of the memory budget.
    held: HeldObjects,
    /// The requests of a reused instance, each found by its task; `None` for a fresh one.
    reused: Option<ReusedRequests>,
}

/// The host's side of one request: its outgoing calls, its `users`, `telemetry` and
/// `wasi:otel` state, and its record. A fresh instance has one for its life; a reused one
/// takes each request's for the host calls of that request's task ([`RequestSlot`]).
pub struct RequestParts {
    hooks: OutgoingRequests,
    users: UserCalls,
    telemetry: GuestTelemetry,
    /// What the guest handed over through `wasi:otel` so far (its spans, its metric series).
    otel: GuestOtel,
    /// What the host learns of the request; its host calls are counted in its cost.
    record: Arc<RequestRecord>,
}

impl RequestParts {
    /// The parts of the request `context`, for a guest whose route labels are
    /// `route_templates`, its outgoing calls within `outbound`.
    pub fn new(
        context: RequestContext,
        route_templates: Arc<RouteTemplates>,
        outbound: Outbound,
    ) -> RequestParts {
        let RequestContext {
            users,
            record,
            reporting,
            ..
        } = context;
        let calls = OutgoingCalls::new(
            outbound.rules,
            outbound.sockets,
            outbound.deadline,
            reporting
                .as_ref()
                .map_or_else(opentelemetry::Context::new, |reporting| {
                    reporting.request_span.context().clone()
                }),
            Arc::clone(&record),
        );
        let (users, telemetry) = match reporting {
            Some(reporting) => (
                UserCalls::new(users, Arc::clone(&reporting.metrics), Arc::clone(&record)),
                GuestTelemetry::new(
                    reporting.request_span,
                    Arc::clone(&record),
                    route_templates,
                    Some(reporting.metrics),
                ),
            ),
            None => (
                UserCalls::quiet(users, Arc::clone(&record)),
                GuestTelemetry::off(),
            ),
        };
        RequestParts {
            hooks: OutgoingRequests(calls),
            users,
            telemetry,
            otel: GuestOtel::default(),
            record,
        }
    }
}

/// What one request's outgoing calls may reach, and until when.
pub struct Outbound {
    /// The destinations allowed.
    pub rules: Arc<OutboundRules>,
    /// The host's sockets and name lookups, shared with every other request.
    pub sockets: OutboundSockets,
    /// The request's deadline, which no call outlives.
    pub deadline: Instant,
}

/// The store of one request described by `context`, for an instance of a guest whose route
/// labels are `route_templates`, within `limits`, its objects' weight charged to `held`, its
/// outgoing calls within `outbound`.
pub fn new_store(
    engine: &Engine,
    context: RequestContext,
    route_templates: Arc<RouteTemplates>,
    limits: InstanceLimiter,
    held: HeldObjects,
    outbound: Outbound,
) -> Store<RequestState> {
    let output = GuestOutput::new(context.reporting.as_ref().map(|reporting| {
        (
            reporting.request_span.clone(),
            Arc::clone(&reporting.metrics),
        )
    }));
    let request = Box::new(RequestParts::new(context, route_templates, outbound));
    store_of(engine, request, output, limits, held, None)
}

/// The store of an instance that serves several requests, each with its own parts
/// ([`RequestState::adopt`]); between them, host calls land in `idle` (a quiet request's).
/// Its output, bounded as one request's, is logged in `output`, outside any request.
pub fn new_reused_store(
    engine: &Engine,
    idle: Box<RequestParts>,
    output: GuestOutput,
    limits: InstanceLimiter,
    held: HeldObjects,
) -> Store<RequestState> {
    store_of(
        engine,
        idle,
        output,
        limits,
        held,
        Some(ReusedRequests::default()),
    )
}

fn store_of(
    engine: &Engine,
    request: Box<RequestParts>,
    output: GuestOutput,
    limits: InstanceLimiter,
    held: HeldObjects,
    reused: Option<ReusedRequests>,
) -> Store<RequestState> {
    let wasi = WasiCtx::builder()
        .stdout(output.stream(Stream::Stdout))
        .stderr(output.stream(Stream::Stderr))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_RESOURCES_PER_REQUEST);
    let mut http = WasiHttpCtx::new();
    http.set_field_size_limit(FIELDS_LIMIT_BYTES);
    let state = RequestState {
        wasi,
        http,
        table,
        request,
        limits,
        held,
        reused,
    };
    let mut store = Store::new(engine, state);
    store.set_max_component_handles(if engine.get_concurrency_support() {
        MAX_COMPONENT_HANDLES_PER_WASIP3_REQUEST
    } else {
        MAX_COMPONENT_HANDLES_PER_REQUEST
    });
    store.limiter(|state| &mut state.limits);
    store.call_hook(|mut store, transition| {
        match transition {
            CallHook::CallingHost if store.data().reused.is_some() => {
                // The request's task: the oldest of the call stack, which the host called.
                let task = store.async_call_stack().ok().and_then(Iterator::last);
                store.data_mut().enter(task);
            }
            CallHook::ReturningFromHost => {
                let state = store.data_mut();
                state.held.settle(&mut state.table)?;
                state.leave();
            }
            _ => {}
        }
        Ok(())
    });
    store
}

/// One request's parts while it is served by a reused instance: in the instance's store during
/// its task's host calls, here between them, and dropped when the request ends, wherever they
/// are then.
pub struct RequestSlot {
    parts: Mutex<Option<Box<RequestParts>>>,
    ended: AtomicBool,
    /// Set when the request was taken back before an instance took it: an instance that
    /// takes it later serves it with parts that refuse it everything.
    withdrawn: AtomicBool,
    /// Counts the withdrawn request until an instance takes it, or it goes untaken, when it
    /// was withdrawn from a queue that had stalled (not for a client that left).
    untaken: Mutex<Option<Counted>>,
    /// Set when the instance that took the request has done with it: answered, or expired.
    done: AtomicBool,
    /// Wakes those waiting for `done`.
    done_told: tokio::sync::Notify,
    /// The instance serving the request, once one does.
    instance: OnceLock<Served>,
}

/// What an instance took from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A client's request.
    Request,
    /// The copy of a request withdrawn after the queue stalled behind an instance that said it
    /// was free and took nothing.
    CopyFromStalledQueue,
    /// The copy of a request whose client left before any instance took it.
    CopyOfAbandoned,
}

/// One in a count, for as long as it lives.
pub struct Counted(Arc<AtomicUsize>);

impl Counted {
    /// One more in `count`.
    pub fn new(count: &Arc<AtomicUsize>) -> Counted {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(count))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a request learns of the reused instance that serves it.
#[derive(Default)]
pub struct ServingInstance {
    /// The instance's record: its memory, and the refusals of its limit and of the budget.
    pub record: Arc<RequestRecord>,
    /// Set when the instance outlived a deadline and was stopped.
    pub expired: AtomicBool,
    /// Why the instance failed (a trap, a deadline), set before its store goes: a body whose
    /// stream ends then was cut short, not finished.
    failure: OnceLock<InstanceFailure>,
    /// Set once the instance has ended, well or not; `changed` wakes those waiting for it.
    ended: AtomicBool,
    /// Requests the instance has taken.
    taken: AtomicUsize,
    /// Requests the instance has taken and finished, alive: its first `settled` requests have
    /// had their answer (a WASIp2 call has returned; a WASIp3 task may still run after it),
    /// whatever it was.
    settled: AtomicUsize,
    /// Set when the instance is to take no more requests.
    retired: AtomicBool,
    /// Set when it was stopped so that a withdrawn request's copy does no work.
    stopped_for_copy: AtomicBool,
    /// Wakes those waiting on `ended` or `settled`.
    changed: tokio::sync::Notify,
    /// The bodies the instance writes, and those of them waiting on it, for its expiry.
    bodies: Mutex<OpenBodies>,
}

/// The response bodies a reused instance writes, as its expiry needs them.
#[derive(Default)]
pub struct OpenBodies {
    /// Bodies still open.
    pub open: usize,
    /// Of those, bodies whose client waits for the guest's next bytes.
    pub waiting: usize,
    /// Since when some body has been waiting, while any is.
    pub waiting_since: Option<Instant>,
    /// Wakes the instance's expiry when a body starts waiting, or the instance is stopped.
    pub expiry: Option<std::task::Waker>,
    /// Set when a request took back the running slot the instance's one request streamed on:
    /// the instance stops, as a fresh one would.
    pub stopped: bool,
}

/// Why a reused instance failed.
pub struct InstanceFailure {
    /// The error, on one line.
    pub cause: String,
    /// Whether the memory budget, not the guest, was short.
    pub by_budget: bool,
}

impl OpenBodies {
    /// One body more (`true`) or less waiting on the instance.
    pub fn waiting_changed(&mut self, waits: bool) {
        if waits {
            self.waiting += 1;
            self.waiting_since.get_or_insert_with(Instant::now);
        } else {
            self.waiting = self.waiting.saturating_sub(1);
            if self.waiting == 0 {
                self.waiting_since = None;
            }
        }
    }
}

impl ServingInstance {
    /// Says that the instance has ended, failed as `failure` says, if it did; before its store
    /// goes.
    pub fn end(&self, failure: Option<InstanceFailure>) {
        if let Some(failure) = failure {
            let _ = self.failure.set(failure);
        }
        self.ended.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Says that every request the instance has taken has finished, and it lives on.
    pub fn settle(&self) {
        // Only the instance's worker settles it; most calls find nothing new.
        let taken = self.taken.load(Ordering::SeqCst);
        if self.settled.load(Ordering::SeqCst) < taken {
            self.settled.store(taken, Ordering::SeqCst);
            self.changed.notify_waiters();
        }
    }

    /// The bodies the instance writes, for `change` to count or its expiry to read.
    pub fn bodies<R>(&self, change: impl FnOnce(&mut OpenBodies) -> R) -> R {
        change(&mut self.bodies.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many requests the instance has taken.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    /// Has the instance's expiry stop it at once.
    pub fn stop(&self) {
        self.bodies(|bodies| {
            bodies.stopped = true;
            if let Some(expiry) = bodies.expiry.take() {
                expiry.wake();
            }
        });
    }

    /// Has the instance's expiry stop it at once, holding no request but a withdrawn one's copy.
    pub fn stop_for_copy(&self) {
        self.stopped_for_copy.store(true, Ordering::SeqCst);
        self.stop();
    }

    /// Whether the instance was stopped for a withdrawn request's copy.
    pub fn stopped_for_copy(&self) -> bool {
        self.stopped_for_copy.load(Ordering::SeqCst)
    }

    /// Keeps the instance from taking another request; `true` the first time.
    pub fn retire(&self) -> bool {
        !self.retired.swap(true, Ordering::SeqCst)
    }

    /// Whether the instance is to take no more requests.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// Why the instance failed, once it has.
    pub fn failure(&self) -> Option<&InstanceFailure> {
        self.failure.get()
    }

    /// Waits, at most `within`, until the instance has ended or has finished its `ordinal`th
    /// request and lives on; `true` for the latter. A request whose task vanished learns why
    /// that way: the instance's error, if it failed, reaches its worker, not the request.
    pub async fn outcome(&self, ordinal: usize, within: std::time::Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.settled.load(Ordering::SeqCst) >= ordinal {
                    return true;
                }
                if self.ended.load(Ordering::SeqCst) {
                    return false;
                }
                changed.await;
            }
        };
        tokio::time::timeout(within, wait).await.unwrap_or(false)
    }
}

/// The instance serving a request, and what its flags said when the request came: a refusal
/// before it is not the request's.
pub struct Served {
    /// The instance.
    pub instance: Arc<ServingInstance>,
    /// Whether the budget had refused the instance memory before.
    pub over_budget_before: bool,
    /// Whether its own limit had refused it memory before.
    pub over_limit_before: bool,
    /// When the instance took the request: its deadline counts from here, as a fresh
    /// instance's counts from its slot.
    pub accepted: Instant,
    /// Which of the instance's requests it is, from 1.
    pub ordinal: usize,
}

impl RequestSlot {
    /// A slot holding `parts`.
    pub fn new(parts: RequestParts) -> RequestSlot {
        RequestSlot {
            parts: Mutex::new(Some(Box::new(parts))),
            ended: AtomicBool::new(false),
            withdrawn: AtomicBool::new(false),
            untaken: Mutex::default(),
            done: AtomicBool::new(false),
            done_told: tokio::sync::Notify::new(),
            instance: OnceLock::new(),
        }
    }

    /// Notes that `instance` has taken the request, or, if it was withdrawn first, a copy of
    /// it that it serves with the parts that refuse it everything.
    pub fn served_by(&self, instance: Arc<ServingInstance>) -> Taken {
        // Under the parts' lock, so that a withdrawal and a take never both succeed.
        let _parts = self.lock();
        if self.is_withdrawn() {
            let untaken = self
                .untaken
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            return match untaken {
                Some(_) => Taken::CopyFromStalledQueue,
                None => Taken::CopyOfAbandoned,
            };
        }
        let ordinal = instance.taken.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self.instance.set(Served {
            over_budget_before: instance.record.cost.was_over_budget(),
            over_limit_before: instance.record.cost.was_over_limit(),
            ordinal,
            instance,
            accepted: Instant::now(),
        });
        Taken::Request
    }

    /// Takes the request back unless an instance has taken it (or it is withdrawn already);
    /// `true` if so, `untaken`, when the queue stalled, then counting it until an instance
    /// takes it. An instance that takes it later finds `refusing()` in place of its parts: no
    /// store, no span, no call out.
    pub fn withdraw(
        &self,
        refusing: impl FnOnce() -> RequestParts,
        untaken: Option<&Arc<AtomicUsize>>,
    ) -> bool {
        let mut parts = self.lock();
        if self.instance.get().is_some() || self.is_withdrawn() {
            return false;
        }
        self.withdrawn.store(true, Ordering::SeqCst);
        *self.untaken.lock().unwrap_or_else(PoisonError::into_inner) = untaken.map(Counted::new);
        let own = parts.replace(Box::new(refusing()));
        drop(parts);
        drop(own);
        true
    }

    /// Whether the request was taken back before an instance took it.
    pub fn is_withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::SeqCst)
    }

    /// The instance serving the request, once one does.
    pub fn served(&self) -> Option<&Served> {
        self.instance.get()
    }

    /// Ends the request: its parts are dropped now, or as soon as its host call returns; a
    /// withdrawn request's refusing parts stay for the instance that may yet take it.
    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        if self.is_withdrawn() {
            return;
        }
        let parts = self.lock().take();
        drop(parts);
    }

    fn take(&self) -> Option<Box<RequestParts>> {
        self.lock().take()
    }

    fn put_back(&self, parts: Box<RequestParts>) {
        let mut slot = self.lock();
        if self.ended.load(Ordering::SeqCst) && !self.is_withdrawn() {
            drop(slot);
            drop(parts);
        } else {
            *slot = Some(parts);
        }
    }

    /// Says that the instance that took the request has done with it.
    pub fn mark_done(&self) {
        self.done.store(true, Ordering::SeqCst);
        self.done_told.notify_waiters();
    }

    /// Waits, at most until `until`, for the instance that took the request to be done with it.
    pub async fn done(&self, until: Instant) {
        let wait = async {
            loop {
                let told = self.done_told.notified();
                tokio::pin!(told);
                told.as_mut().enable();
                if self.done.load(Ordering::SeqCst) {
                    return;
                }
                told.await;
            }
        };
        let _ = tokio::time::timeout_at(until.into(), wait).await;
    }

    /// Whether the request has ended.
    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<RequestParts>>> {
        self.parts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A reused instance's requests, by the task serving each, and the one whose host call is
/// running.
#[derive(Default)]
struct ReusedRequests {
    /// Searched at every host call: hashed with rustc-hash, where SipHash cost more than the
    /// rest of the search. It holds the instance's requests that have not ended, a slow reader's
    /// among them, at most its reuse count.
    tasks: FxHashMap<GuestTaskId, Arc<RequestSlot>>,
    /// The slot whose parts are in the store now, and the idle parts they replaced.
    entered: Option<(Arc<RequestSlot>, Box<RequestParts>)>,
}

impl RequestState {
    /// Serves `slot`'s request in `task` of this reused instance; ended requests are
    /// forgotten (a withdrawn one not, whose task may run on), so the map holds no more than
    /// the requests the instance has taken.
    pub fn adopt(&mut self, task: GuestTaskId, slot: Arc<RequestSlot>) {
        if let Some(reused) = &mut self.reused {
            reused
                .tasks
                .retain(|_, slot| !slot.is_ended() || slot.is_withdrawn());
            reused.tasks.insert(task, slot);
        }
    }

    /// Puts the parts of `task`'s request in place for the host call it is making. A task
    /// that suspended inside a host call (waiting on a waitable set, yielding) gives its
    /// parts back first: the call being made now is another task's.
    fn enter(&mut self, task: Option<GuestTaskId>) {
        let slot = self
            .reused
            .as_ref()
            .and_then(|reused| task.and_then(|task| reused.tasks.get(&task)))
            .cloned();
        let entered = self
            .reused
            .as_ref()
            .and_then(|reused| reused.entered.as_ref());
        if let (Some(slot), Some((entered, _))) = (&slot, entered)
            && Arc::ptr_eq(slot, entered)
        {
            return;
        }
        self.leave();
        let Some(slot) = slot else {
            return;
        };
        let Some(parts) = slot.take() else {
            return;
        };
        let idle = std::mem::replace(&mut self.request, parts);
        if let Some(reused) = &mut self.reused {
            reused.entered = Some((slot, idle));
        }
    }

    /// Gives the parts of the request whose host call returned back to its slot.
    fn leave(&mut self) {
        let Some((slot, idle)) = self
            .reused
            .as_mut()
            .and_then(|reused| reused.entered.take())
        else {
            return;
        };
        slot.put_back(std::mem::replace(&mut self.request, idle));
    }
}

impl UsersView for RequestState {
    fn users(&mut self) -> (&mut UserCalls, &opentelemetry::Context) {
        let request = &mut self.request;
        (&mut request.users, request.telemetry.innermost_context())
    }
}

impl TelemetryView for RequestState {
    fn telemetry(&mut self) -> (&mut GuestTelemetry, &mut ResourceTable) {
        (&mut self.request.telemetry, &mut self.table)
    }
}

impl OtelView for RequestState {
    fn otel(&mut self) -> (&mut GuestOtel, &mut GuestTelemetry) {
        (&mut self.request.otel, &mut self.request.telemetry)
    }
}

impl HostCalls for RequestState {
    fn count_call(&mut self, interface: HostInterface) {
        self.request.record.cost.called(interface);
    }
}

impl WasiView for RequestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for RequestState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.request.hooks,
        }
    }
}

/// `wasi:http` hooks that send the outgoing requests the operator allows, and refuse the rest.
struct OutgoingRequests(OutgoingCalls);

impl WasiHttpHooks for OutgoingRequests {
    fn send_request(
        &mut self,
        request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = Result<
                    (
                        http::Response<wasmtime_wasi_http::WasiBody>,
                        Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                    ),
                    wasmtime_wasi_http::Error,
                >,
            > + Send,
    > {
        match self.0.send(request, options) {
            Ok(call) => Box::new(call.exchange()),
            Err(denied) => Box::new(async { Err(denied) }),
        }
    }

    fn p2_error_from_hyper(&mut self, _error: &hyper::Error) -> ErrorCode {
        ErrorCode::HttpProtocolError
    }

    // What an outgoing body may buffer: the weight it is charged (`runtime::held`).
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        BODY_BUFFER_CHUNKS
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK_BYTES
    }

    // A WASIp3 body's chunk: the same as a WASIp2 one's, not the 1 MiB default.
    fn p3_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK_BYTES
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    const WITHIN: Duration = Duration::from_secs(1);

    /// How long `ordinal`'s wait on `instance` lasted, `act` done on it once the wait began,
    /// and whether the instance was found to live on past the request.
    async fn waited(
        instance: &Arc<ServingInstance>,
        ordinal: usize,
        act: impl FnOnce(&ServingInstance),
    ) -> (Duration, bool) {
        let waiting = tokio::spawn({
            let instance = Arc::clone(instance);
            async move {
                let started = Instant::now();
                let lives_on = instance.outcome(ordinal, WITHIN).await;
                (started.elapsed(), lives_on)
            }
        });
        tokio::task::yield_now().await;
        act(instance);
        waiting.await.expect("the waiting task")
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_released_as_soon_as_its_instance_has_finished_it_and_lives_on() {
        let instance = Arc::new(ServingInstance::default());
        instance.taken.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            waited(&instance, 1, ServingInstance::settle).await,
            (Duration::ZERO, true)
        );
        // Settled before the wait begins: no wait at all. An end after does not change that.
        instance.end(None);
        assert_eq!(waited(&instance, 1, |_| {}).await, (Duration::ZERO, true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_not_released_by_an_earlier_one_settling_but_by_its_instance_ending() {
        let instance = Arc::new(ServingInstance::default());
        instance.taken.fetch_add(1, Ordering::SeqCst);
        instance.settle();
        instance.taken.fetch_add(1, Ordering::SeqCst);
        assert_eq!(waited(&instance, 2, |_| {}).await, (WITHIN, false));
        assert_eq!(
            waited(&instance, 2, |instance| instance.end(None)).await,
            (Duration::ZERO, false)
        );
    }

    /// The parts of a request the host sends itself on `users`, and its record.
    fn quiet_parts(users: &Arc<UserStore>) -> (RequestParts, Arc<RequestRecord>) {
        let context = RequestContext::quiet(Arc::clone(users));
        let record = Arc::clone(context.record());
        let outbound = Outbound {
            rules: Arc::default(),
            sockets: OutboundSockets::default(),
            deadline: std::time::Instant::now(),
        };
        (RequestParts::new(context, Arc::default(), outbound), record)
    }

    #[test]
    fn a_withdrawn_request_an_instance_takes_later_meets_the_refusing_parts_not_its_own() {
        let users = Arc::new(UserStore::memory(10));
        let untaken = Arc::new(AtomicUsize::new(0));
        let (own, own_record) = quiet_parts(&users);
        let slot = RequestSlot::new(own);
        let (refusing, refusing_record) = quiet_parts(&users);
        assert!(slot.withdraw(|| refusing, Some(&untaken)));
        assert_eq!(untaken.load(Ordering::SeqCst), 1);
        // The withdrawing side ends the request; the queue's copy lives on.
        slot.end();
        let instance = Arc::new(ServingInstance::default());
        assert_eq!(
            slot.served_by(Arc::clone(&instance)),
            Taken::CopyFromStalledQueue
        );
        assert_eq!(untaken.load(Ordering::SeqCst), 0, "taken at last");
        assert!(slot.served().is_none());
        assert_eq!(instance.taken(), 0, "none of its own requests");
        let parts = slot
            .take()
            .expect("the refusing parts outlive the request's end");
        assert!(Arc::ptr_eq(&parts.record, &refusing_record));
        assert!(!Arc::ptr_eq(&parts.record, &own_record));
    }

    #[test]
    fn a_request_an_instance_has_taken_is_never_withdrawn() {
        let users = Arc::new(UserStore::memory(10));
        let untaken = Arc::new(AtomicUsize::new(0));
        let (own, own_record) = quiet_parts(&users);
        let slot = RequestSlot::new(own);
        assert_eq!(
            slot.served_by(Arc::new(ServingInstance::default())),
            Taken::Request
        );
        let (refusing, _) = quiet_parts(&users);
        assert!(!slot.withdraw(|| refusing, Some(&untaken)));
        assert_eq!(untaken.load(Ordering::SeqCst), 0);
        assert!(!slot.is_withdrawn());
        let parts = slot.take().expect("its own parts");
        assert!(Arc::ptr_eq(&parts.record, &own_record));
    }

    #[test]
    fn a_withdrawn_request_no_instance_takes_leaves_the_count_when_it_goes() {
        let users = Arc::new(UserStore::memory(10));
        let untaken = Arc::new(AtomicUsize::new(0));
        let slot = RequestSlot::new(quiet_parts(&users).0);
        assert!(slot.withdraw(|| quiet_parts(&users).0, Some(&untaken)));
        assert_eq!(untaken.load(Ordering::SeqCst), 1);
        drop(slot);
        assert_eq!(untaken.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_copy_of_a_request_whose_client_left_is_no_stalled_queues() {
        let users = Arc::new(UserStore::memory(10));
        let untaken = Arc::new(AtomicUsize::new(0));
        let slot = RequestSlot::new(quiet_parts(&users).0);
        assert!(slot.withdraw(|| quiet_parts(&users).0, None));
        assert!(
            !slot.withdraw(|| quiet_parts(&users).0, Some(&untaken)),
            "withdrawn once"
        );
        assert_eq!(untaken.load(Ordering::SeqCst), 0);
        assert_eq!(
            slot.served_by(Arc::new(ServingInstance::default())),
            Taken::CopyOfAbandoned
        );
    }

    #[tokio::test]
    async fn waiting_for_an_instance_to_be_done_with_a_request_ends_when_it_is_or_at_the_bound() {
        let users = Arc::new(UserStore::memory(10));
        let slot = Arc::new(RequestSlot::new(quiet_parts(&users).0));
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let waiting = tokio::spawn({
            let slot = Arc::clone(&slot);
            async move {
                let started = Instant::now();
                slot.done(until).await;
                started.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        slot.mark_done();
        let waited = waiting.await.unwrap();
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        let never_done = RequestSlot::new(quiet_parts(&users).0);
        let started = Instant::now();
        never_done
            .done(std::time::Instant::now() + Duration::from_millis(200))
            .await;
        assert!(started.elapsed() >= Duration::from_millis(190));
    }

    #[test]
    fn an_instance_is_retired_once_and_stays_retired() {
        let instance = ServingInstance::default();
        assert!(!instance.is_retired());
        assert!(instance.retire());
        assert!(!instance.retire(), "the second retirement is not the first");
        assert!(instance.is_retired());
    }
}
