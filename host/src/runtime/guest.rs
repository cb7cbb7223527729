//! A loaded guest: pre-instantiated once, instantiated afresh for every request
//! ([`Guest::handle`]), within its deadline, slots and memory budget. A guest answers through
//! WASIp2's `wasi:http/incoming-handler@0.2` or WASIp3's `wasi:http/handler@0.3.0`; everything
//! around the call is the same for both. The guest serving new requests is one value
//! ([`Serving`]), swapped whole by a reload, while requests already running keep theirs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use opentelemetry::context::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use wasmtime::component::InstancePre;
use wasmtime::error::Context as _;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::handler::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{p2, p3};

use crate::error::{MAX_ERROR_CODE_TEXT, RequestError, bounded_debug, one_line};
use crate::interfaces::bindings::ServicePre;
use crate::observability::request_report::{CostReport, timed};
use crate::observability::routes::RouteTemplates;
use crate::runtime::capacity::{GuestCapacity, GuestLimits, InstanceReuse};
use crate::runtime::guest_body::GuestBody;
use crate::runtime::held::TooMuchHeld;
use crate::runtime::outbound::OutboundRules;
use crate::runtime::pool::BUDGET_SPENT;
use crate::runtime::reuse::{Handed, ReusedInstances};
use crate::runtime::slots::InstancePermit;
use crate::runtime::store::{Outbound, RequestContext, RequestState, new_store};

/// A loaded guest and the version its health probe reported.
pub struct ServingGuest {
    /// The pre-instantiated component; cheap to clone.
    pub guest: Guest,
    /// `version` from the guest's `/api/health`, for logs.
    pub version: String,
}

/// The guest serving new requests.
pub struct Serving(RwLock<Arc<ServingGuest>>);

impl Serving {
    /// Serves with `guest` until a swap.
    pub fn new(guest: ServingGuest) -> Serving {
        Serving(RwLock::new(Arc::new(guest)))
    }

    /// The guest serving new requests now.
    pub fn current(&self) -> Arc<ServingGuest> {
        // Only an `Arc` is cloned under the lock: the per-request cost is one atomic increment.
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Serves new requests with `guest` from now on; returns the guest it replaces.
    pub fn swap(&self, guest: ServingGuest) -> Arc<ServingGuest> {
        let mut serving = self.0.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut serving, Arc::new(guest))
    }
}

/// The trap raised when a request outlives its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request's deadline passed")]
struct DeadlineExceeded;

/// A fresh instance's deadline, which holds only until its response head is out: the body's
/// own bounds ([`GuestBody`]) stop it after that.
struct HeadDeadline {
    at: Instant,
    head_out: AtomicBool,
}

impl HeadDeadline {
    /// Whether the deadline has passed with the head not yet out.
    fn passed(&self) -> bool {
        !self.head_out.load(Ordering::Relaxed) && Instant::now() >= self.at
    }

    /// Ends `backstop` past the deadline, unless the head is out by then.
    async fn backstop(&self, backstop: Duration) {
        tokio::time::sleep_until((self.at + backstop).into()).await;
        if self.head_out.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    }
}

/// A guest's export that answers requests, linked and ready to be instantiated.
#[derive(Clone)]
pub(crate) enum HandlerPre {
    /// `wasi:http/incoming-handler@0.2.x`: the response goes out through an outparam.
    P2(ServicePre<RequestState>),
    /// `wasi:http/handler@0.3.0`: the response is returned, its body a stream the guest writes
    /// while the instance's event loop runs.
    P3(p3::bindings::ServicePre<RequestState>),
}

impl HandlerPre {
    /// The handler `instance_pre` exports: WASIp3's first when it was compiled for the WASIp3
    /// engine (`wasip3`), else WASIp2's; the error says why the expected one is not there.
    pub(crate) fn new(
        instance_pre: InstancePre<RequestState>,
        wasip3: bool,
    ) -> wasmtime::Result<HandlerPre> {
        if wasip3 {
            return p3::bindings::ServicePre::new(instance_pre)
                .map(HandlerPre::P3)
                .context("it exports no usable wasi:http/handler@0.3");
        }
        ServicePre::new(instance_pre)
            .map(HandlerPre::P2)
            .context("it exports neither wasi:http/incoming-handler@0.2 nor wasi:http/handler@0.3")
    }

    fn engine(&self) -> &Engine {
        match self {
            HandlerPre::P2(pre) => pre.engine(),
            HandlerPre::P3(pre) => pre.engine(),
        }
    }
}

/// What a guest answered: its response, or the error code it gave instead (as bounded text).
type Answer = Result<http::Response<HyperOutgoingBody>, String>;

/// A loaded guest, ready to be instantiated.
#[derive(Clone)]
pub struct Guest {
    pre: HandlerPre,
    limits: GuestLimits,
    /// The pools and slots every instance of every guest shares.
    capacity: Arc<GuestCapacity>,
    /// The route templates this guest has named, each labelled (a bounded set per guest).
    route_templates: Arc<RouteTemplates>,
    /// The destinations its instances may call.
    outbound: Arc<OutboundRules>,
    /// Its instances reused, when reuse is on.
    reused: Option<Arc<ReusedInstances>>,
}

impl Guest {
    /// A guest of `pre`, whose instances live within `limits`, share `capacity` and may call
    /// what `outbound` allows.
    pub(crate) fn new(
        pre: HandlerPre,
        limits: GuestLimits,
        capacity: Arc<GuestCapacity>,
        outbound: Arc<OutboundRules>,
    ) -> wasmtime::Result<Guest> {
        let reused = if limits.reuse.is_on() {
            let (proxy, reuse) = match &pre {
                // A WASIp2 export is synchronous: an instance serves one request at a time.
                HandlerPre::P2(pre) => (
                    ProxyPre::P2(p2::bindings::ProxyPre::new(pre.instance_pre().clone())?),
                    InstanceReuse {
                        concurrent: 1,
                        ..limits.reuse
                    },
                ),
                HandlerPre::P3(pre) => (ProxyPre::P3(pre.clone()), limits.reuse),
            };
            let engine = pre.engine().clone();
            Some(Arc::new(ReusedInstances::new(
                proxy,
                engine,
                reuse,
                limits,
                Arc::clone(&capacity),
            )))
        } else {
            None
        };
        Ok(Guest {
            pre,
            limits,
            capacity,
            route_templates: Arc::default(),
            outbound,
            reused,
        })
    }

    /// The engine this guest was compiled for: with component-model concurrency for a WASIp3
    /// guest or a reused one, without it for a WASIp2 guest served fresh.
    pub fn engine(&self) -> &Engine {
        self.pre.engine()
    }

    /// How this guest's instances serve requests, for the log.
    pub fn instances(&self) -> String {
        match &self.reused {
            Some(reused) => {
                let reuse = reused.reuse();
                format!(
                    "reused: up to {} requests each, {} at once, dropped after {} ms idle",
                    reuse.requests,
                    reuse.concurrent,
                    reuse.idle_timeout.as_millis()
                )
            }
            None => "fresh per request".to_string(),
        }
    }

    /// Has its reused instances go as soon as they have no request: it serves no new one.
    pub fn retire(&self) {
        if let Some(reused) = &self.reused {
            reused.retire();
        }
    }

    /// Runs one request through a fresh instance (or a reused one, for a client's request
    /// when reuse is on) and returns its response.
    ///
    /// The instance runs in its own task: once it has sent the response head it keeps going,
    /// streaming the body, while the caller returns the response to hyper.
    /// The instance's task serves the caller's current request (and OpenTelemetry context, when
    /// log records are exported), so the lines written in it carry the request's fields.
    pub async fn handle<B>(
        &self,
        context: RequestContext,
        request: http::Request<B>,
    ) -> Result<http::Response<GuestBody>, RequestError>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<wasmtime_wasi_http::Error>,
    {
        // Every client request waits in its client's line for a running slot, whatever serves it.
        let permit = self.capacity.slots.acquire_running(context.peer()).await?;
        // A client's request to a reused guest; the host's own probes get a fresh instance.
        if let (Some(reused), Some(metrics)) = (&self.reused, context.metrics()) {
            let outbound = Outbound {
                rules: Arc::clone(&self.outbound),
                sockets: self.capacity.outbound_sockets.clone(),
                deadline: Instant::now() + self.limits.request_timeout,
            };
            let templates = Arc::clone(&self.route_templates);
            let request = with_absolute_uri(request)
                .map_err(RequestError::Setup)?
                .map(|body| body.map_err(Into::into).boxed_unsync());
            let handed = reused
                .handle(
                    context,
                    metrics,
                    templates,
                    outbound,
                    request,
                    permit.clone(),
                )
                .await?;
            let untaken = match handed {
                Handed::Answered(response) => return Ok(response),
                Handed::Untaken(untaken) => untaken,
            };
            // An instance of its own takes a place among the reused ones'.
            let place = self.capacity.slots.acquire_instance().await?;
            let (context, request, cost) = (untaken.context, untaken.request, untaken.cost);
            return self
                .fresh(context, request, permit, cost, Some(place))
                .await;
        }
        let cost = context.cost_report();
        self.fresh(context, request, permit, cost, None).await
    }

    /// Runs `request` (`context`) through a fresh instance on its running slot (`permit`), and
    /// under reuse its `place` among the instances; `cost` reports what the instance cost.
    async fn fresh<B>(
        &self,
        context: RequestContext,
        request: http::Request<B>,
        permit: InstancePermit,
        cost_report: Option<CostReport>,
        place: Option<OwnedSemaphorePermit>,
    ) -> Result<http::Response<GuestBody>, RequestError>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<wasmtime_wasi_http::Error>,
    {
        let held = self.capacity.held_objects(request.headers());
        let metrics = context.metrics();
        let body_metrics = metrics.clone();
        let record = Arc::clone(context.record());
        let client_stalled = Arc::clone(context.client_stalled());
        let deadline = Arc::new(HeadDeadline {
            at: Instant::now() + self.limits.request_timeout,
            head_out: AtomicBool::new(false),
        });
        let mut store = new_store(
            self.pre.engine(),
            context,
            Arc::clone(&self.route_templates),
            self.capacity.limiter(Arc::clone(&record)),
            held,
            Outbound {
                rules: Arc::clone(&self.outbound),
                sockets: self.capacity.outbound_sockets.clone(),
                deadline: deadline.at,
            },
        );
        // Every tick the guest yields its thread; past the deadline, its head not out, it traps.
        store.set_epoch_deadline(1);
        let epoch_deadline = Arc::clone(&deadline);
        store.epoch_deadline_callback(move |_| {
            if epoch_deadline.passed() {
                Err(DeadlineExceeded.into())
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let (call, answer) =
            Call::new(&self.pre, &mut store, request).map_err(RequestError::Setup)?;
        // A guest blocked in a host call (a slow store) cannot be interrupted by epochs: this is
        // the backstop, until the head is out.
        let backstop = Duration::from_secs(1);
        let task_deadline = Arc::clone(&deadline);
        let instance_permit = permit.clone();
        // Read once the instance has ended, to tell the host's shortage from the guest's fault.
        let spent = Arc::clone(&record);
        // Boxed where it is made: the instance's future (linking and the guest's call inside)
        // is kilobytes large, and each wrapper and the spawn would otherwise copy it whole.
        let instance = Box::pin(async move {
            // Locals drop in reverse order: the store (its memory regions and stack back in
            // their pools) before the permit, so a request that gets the permit always finds
            // what it needs in the pools; the cost is reported last, whatever ended the task.
            let _cost_report = cost_report;
            let _permit = instance_permit;
            let _place = place;
            let mut store = store;
            let exchange = async {
                let started = Instant::now();
                let instantiated = |took: Duration| {
                    record.cost.instantiated(took);
                    if let Some(metrics) = metrics {
                        metrics.observe_instantiation(took);
                    }
                };
                call.run(&mut store, started, instantiated, &task_deadline.head_out)
                    .await
            };
            tokio::select! {
                outcome = timed(exchange, &record.cost) => outcome,
                () = task_deadline.backstop(backstop) => Err(DeadlineExceeded.into()),
            }
        });
        // Lines written in the task (by wasmtime-wasi-http, the store's drivers) carry the
        // request's fields and ids: its OpenTelemetry context is the current one here.
        let task = tokio::spawn(instance.with_context(opentelemetry::Context::current()));
        let until_backstop = self.limits.request_timeout + backstop;
        let Ok(answer) = tokio::time::timeout(until_backstop, answer.receive()).await else {
            task.abort();
            return Err(RequestError::Timeout);
        };
        match answer {
            Ok(Ok(response)) => {
                deadline.head_out.store(true, Ordering::Relaxed);
                self.capacity
                    .slots
                    .start_streaming(&permit, task.abort_handle());
                let bounds = self.limits.body;
                Ok(response
                    .map(|body| GuestBody::new(body, task, bounds, body_metrics, client_stalled)))
            }
            Ok(Err(code)) => Err(RequestError::ErrorCode(code)),
            // The sender is dropped with the store: the task has ended without a response.
            Err(_) => Err(match task.await {
                Ok(Ok(())) => RequestError::NoResponse,
                Ok(Err(trap)) if trap.is::<DeadlineExceeded>() => RequestError::Timeout,
                // The host, not the guest, ran short: the instance could not get its memory
                // (a refused new memory reaches here only as wasmtime's text of the refusal),
                // or the objects it made on the host's side did not fit.
                Ok(Err(trap))
                    if spent.cost.was_over_budget()
                        || trap
                            .downcast_ref::<TooMuchHeld>()
                            .is_some_and(TooMuchHeld::by_budget)
                        || one_line(&*trap).contains(BUDGET_SPENT) =>
                {
                    RequestError::OverBudget(trap)
                }
                Ok(Err(trap)) if spent.cost.was_over_limit() => RequestError::OverLimit(trap),
                Ok(Err(trap)) => RequestError::Trapped(trap),
                Err(join_error) => RequestError::Task(join_error),
            }),
        }
    }
}

/// One request's call of a guest's handler, its request already in the store.
enum Call {
    P2 {
        pre: ServicePre<RequestState>,
        request: wasmtime::component::Resource<wasmtime_wasi_http::p2::types::HostIncomingRequest>,
        response_out:
            wasmtime::component::Resource<wasmtime_wasi_http::p2::types::HostResponseOutparam>,
    },
    P3 {
        pre: p3::bindings::ServicePre<RequestState>,
        request: p3::Request,
        /// Ends when the request's body has gone to the guest, with how that went.
        request_io:
            std::pin::Pin<Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>>,
        answer: oneshot::Sender<Answer>,
    },
}

impl Call {
    /// The call of `pre` with `request`, and where its answer comes.
    fn new<B>(
        pre: &HandlerPre,
        store: &mut Store<RequestState>,
        request: http::Request<B>,
    ) -> wasmtime::Result<(Call, AnswerReceiver)>
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<wasmtime_wasi_http::Error>,
    {
        match pre {
            HandlerPre::P2(pre) => {
                let request = store
                    .data_mut()
                    .http()
                    .new_incoming_request(Scheme::Http, request)?;
                let (sender, receiver) = oneshot::channel();
                let response_out = store.data_mut().http().new_response_outparam(sender)?;
                let call = Call::P2 {
                    pre: pre.clone(),
                    request,
                    response_out,
                };
                Ok((call, AnswerReceiver::P2(receiver)))
            }
            HandlerPre::P3(pre) => {
                let request = with_absolute_uri(request)?;
                let hooks = store.data_mut().http().hooks;
                let (request, request_io) = p3::Request::from_http(hooks, request);
                let (sender, receiver) = oneshot::channel();
                let call = Call::P3 {
                    pre: pre.clone(),
                    request,
                    request_io: Box::pin(request_io),
                    answer: sender,
                };
                Ok((call, AnswerReceiver::P3(receiver)))
            }
        }
    }

    /// Instantiates the guest in `store`, saying how long that took to `instantiated`, and
    /// runs the call until the instance has nothing left to do; a WASIp3 answer sets
    /// `head_out` before it goes (a WASIp2 one goes through wasmtime-wasi-http's outparam, and
    /// the caller sets it on receipt).
    async fn run(
        self,
        store: &mut Store<RequestState>,
        started: Instant,
        instantiated: impl FnOnce(Duration),
        head_out: &AtomicBool,
    ) -> wasmtime::Result<()> {
        match self {
            Call::P2 {
                pre,
                request,
                response_out,
            } => {
                let service = pre.instantiate_async(&mut *store).await?;
                instantiated(started.elapsed());
                service
                    .wasi_http_incoming_handler()
                    .call_handle(&mut *store, request, response_out)
                    .await
            }
            Call::P3 {
                pre,
                request,
                request_io,
                answer,
            } => {
                let service = pre.instantiate_async(&mut *store).await?;
                instantiated(started.elapsed());
                store
                    .run_concurrent(async move |accessor| {
                        match service.handle(accessor, request).await? {
                            Ok(response) => {
                                let response = accessor.with(|mut store| {
                                    response.into_http_with_getter(
                                        &mut store,
                                        request_io,
                                        <RequestState as WasiHttpView>::http,
                                    )
                                })?;
                                // Out of the deadline's reach before the caller hears of it.
                                head_out.store(true, Ordering::Relaxed);
                                let _ = answer.send(Ok(response));
                            }
                            Err(code) => {
                                let _ = answer.send(Err(bounded_debug(&code, MAX_ERROR_CODE_TEXT)));
                                return Ok(());
                            }
                        }
                        // The body is a stream the guest writes from its tasks: the instance
                        // runs until none is left.
                        std::future::poll_fn(|context| accessor.poll_no_interesting_tasks(context))
                            .await;
                        wasmtime::Result::<()>::Ok(())
                    })
                    .await?
            }
        }
    }
}

/// Where a call's answer comes: WASIp2's outparam, or the WASIp3 call's own.
enum AnswerReceiver {
    P2(
        oneshot::Receiver<
            Result<
                http::Response<HyperOutgoingBody>,
                wasmtime_wasi_http::p2::bindings::http::types::ErrorCode,
            >,
        >,
    ),
    P3(oneshot::Receiver<Answer>),
}

impl AnswerReceiver {
    /// The answer; `Err` when the instance ended without one.
    async fn receive(self) -> Result<Answer, oneshot::error::RecvError> {
        match self {
            AnswerReceiver::P2(receiver) => Ok(receiver
                .await?
                .map_err(|code| bounded_debug(&code, MAX_ERROR_CODE_TEXT))),
            AnswerReceiver::P3(receiver) => receiver.await,
        }
    }
}

/// `request` with a URI that names its scheme and authority, as a WASIp3 request carries them:
/// the server's request has only its path, and the authority in `Host`.
fn with_absolute_uri<B>(request: http::Request<B>) -> wasmtime::Result<http::Request<B>> {
    let (mut parts, body) = request.into_parts();
    let authority = parts
        .headers
        .get(http::header::HOST)
        .and_then(|host| http::uri::Authority::try_from(host.as_bytes()).ok());
    let mut uri = std::mem::take(&mut parts.uri).into_parts();
    if uri.authority.is_none() {
        uri.authority = authority;
    }
    // Plain HTTP is all this host serves, whatever an absolute target says; an
    // authority-form target (`CONNECT host:port`) has no path of its own.
    if uri.authority.is_some() {
        uri.scheme = Some(http::uri::Scheme::HTTP);
    }
    if uri.path_and_query.is_none() {
        uri.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    parts.uri = http::Uri::from_parts(uri).context("the request's target")?;
    Ok(http::Request::from_parts(parts, body))
}
