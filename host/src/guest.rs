//! The guest component: compiled and linked once, instantiated afresh for every request.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tracing::Instrument;
use wasmtime::component::Linker;
use wasmtime::{
    Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store,
    StoreLimitsBuilder, UpdateDeadline,
};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use crate::bindings::ServicePre;
use crate::cache::{CacheOutcome, ComponentCache};
use crate::error::{Error, one_line};
use crate::request_body::GuestRequestBody;
use crate::request_state::RequestState;
use crate::responses::ResponseBody;
use crate::routes::RouteTemplates;
use crate::user_store::UserStore;

/// The wasm engine and the linker that provides the guest's imports. Built once per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RequestState>,
    cache: ComponentCache,
    limits: GuestLimits,
    /// The instance slots, shared by every guest this runtime loads.
    slots: InstanceSlots,
    /// Advances the engine's epoch, which drives deadlines and yields; stops when dropped.
    _ticker: EpochTicker,
}

/// What one guest instance may use.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimits {
    /// Wall-clock time one request may run inside the guest.
    pub request_timeout: Duration,
    /// Linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// Instances working towards their response head at once (a reload's health probe counts
    /// as one).
    pub max_instances: u32,
    /// Instances beyond those that have sent their head and stream the rest of the body, so
    /// clients that read slowly do not hold the slots new requests need. The pooling allocator
    /// reserves `max_instances + max_streaming` slots, plus one spare.
    pub max_streaming: u32,
}

/// The two budgets of instance slots. Every live instance holds one permit of one of them.
#[derive(Clone)]
struct InstanceSlots {
    /// Instances that have not yet sent their response head.
    running: Arc<Semaphore>,
    /// Instances streaming a body whose head has gone out.
    streaming: Arc<Semaphore>,
}

/// The permit one instance holds: first for running, then, once its head is out, for streaming
/// if one is free (else it keeps the running one to the end).
type InstancePermit = Arc<std::sync::Mutex<OwnedSemaphorePermit>>;

impl InstanceSlots {
    /// Waits up to [`SLOT_WAIT`] for a running slot.
    async fn acquire_running(&self) -> Result<InstancePermit, Error> {
        let permit = tokio::time::timeout(SLOT_WAIT, Arc::clone(&self.running).acquire_owned())
            .await
            .map_err(|_| Error::Busy)?
            .expect("the slot semaphores are never closed");
        Ok(Arc::new(std::sync::Mutex::new(permit)))
    }

    /// Moves an instance whose head has gone out from the running budget to the streaming one,
    /// freeing its running slot for a new request; a no-op when every streaming slot is taken.
    fn start_streaming(&self, permit: &InstancePermit) {
        if let Ok(streaming) = Arc::clone(&self.streaming).try_acquire_owned() {
            let mut held = permit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The running permit is released here, the instance counted under streaming.
            *held = streaming;
        }
    }
}

/// How often the epoch advances: the granularity of deadlines, and how long a guest computes
/// before it yields its thread to other requests.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Bytes of each memory and table slot reset by memset and kept resident between requests.
const KEEP_RESIDENT_BYTES: usize = 2 << 20;
/// Slots decommitted per system call.
const DECOMMIT_BATCH: usize = 16;

/// How long a request waits for a free instance slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);

/// Upper bounds per component, for the pooling allocator's slots: a Rust `wasm32-wasip2`
/// component has one memory, a few tables and a handful of core instances (its module and the
/// canonical-ABI shims); these leave room for other toolchains' guests.
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 8;

impl Runtime {
    /// An engine and a linker with full WASI p2 (a Rust `std` guest imports `wasi:cli` and
    /// friends beyond the proxy world), `wasi:http`, and the service's `users` and `telemetry`.
    /// Compiled components are cached in `cache`; every instance lives within `limits`.
    pub fn new(cache: ComponentCache, limits: GuestLimits) -> Result<Runtime, Error> {
        let engine =
            Engine::new(&engine_config(&limits)).map_err(|e| Error::Runtime(one_line(e)))?;
        let mut linker = Linker::new(&engine);
        let link = |linker: &mut Linker<RequestState>| -> wasmtime::Result<()> {
            wasmtime_wasi::p2::add_to_linker_async(linker)?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
            crate::users::add_to_linker(linker)?;
            crate::telemetry::add_to_linker(linker)?;
            Ok(())
        };
        link(&mut linker).map_err(|e| Error::Runtime(one_line(e)))?;
        let _ticker = EpochTicker::start(engine.clone());
        let slots = InstanceSlots {
            running: Arc::new(Semaphore::new(limits.max_instances as usize)),
            streaming: Arc::new(Semaphore::new(limits.max_streaming as usize)),
        };
        Ok(Runtime {
            engine,
            linker,
            cache,
            limits,
            slots,
            _ticker,
        })
    }

    /// Reads, compiles (or takes from the cache), links and pre-instantiates the component at
    /// `path`. Blocking: compiling takes tens to hundreds of milliseconds.
    pub fn load(&self, path: &Path) -> Result<(Guest, CacheOutcome), Error> {
        let bytes = std::fs::read(path).map_err(|io_error| Error::GuestUnreadable {
            path: path.to_owned(),
            io_error,
        })?;
        let invalid = |error: wasmtime::Error| Error::GuestInvalid {
            path: path.to_owned(),
            reason: one_line(error),
        };
        let (component, outcome) = self
            .cache
            .load_or_compile(&self.engine, &bytes)
            .map_err(invalid)?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(invalid)?;
        let pre = ServicePre::new(instance_pre).map_err(invalid)?;
        let guest = Guest {
            pre,
            limits: self.limits,
            slots: self.slots.clone(),
            route_templates: Arc::default(),
        };
        Ok((guest, outcome))
    }
}

/// Epoch interruption (deadlines and yields) and a pooling allocator sized by `limits`: slots
/// are reserved once, so instantiating per request costs no `mmap`.
fn engine_config(limits: &GuestLimits) -> wasmtime::Config {
    let slots = limits.max_instances + limits.max_streaming + 1;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_stacks(slots)
        .total_core_instances(slots * CORE_INSTANCES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_memories(slots * MEMORIES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_tables(slots * TABLES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(limits.memory_bytes)
        // Reset a slot's memory and tables with memset rather than madvise: no page faults on
        // the next request, and no TLB shootdowns across cores. A Rust guest touches about one
        // MiB (its stack, data and a little heap) per request.
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        // Where Linux offers PAGEMAP_SCAN (6.7+), only the pages the guest dirtied are reset.
        .pagemap_scan(Enabled::Auto)
        // What is still decommitted is decommitted in batches, one system call per batch.
        .decommit_batch_size(DECOMMIT_BATCH);
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// A thread that advances an engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch ticker thread");
        EpochTicker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The trap raised when a request outlives its deadline.
#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request's deadline passed")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// Where a new guest is probed before it serves: a path of its own, or nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbePath {
    /// `GET` this path (and query) and expect a 200.
    Get(http::uri::PathAndQuery),
    /// Load the guest without probing it.
    Off,
}

/// The most of a probe's response body that is read.
const MAX_PROBE_BODY_BYTES: usize = 64 * 1024;

/// A loaded guest, ready to be instantiated.
#[derive(Clone)]
pub struct Guest {
    pre: ServicePre<RequestState>,
    limits: GuestLimits,
    slots: InstanceSlots,
    /// The route templates this guest has named, each labelled (a bounded set per guest).
    route_templates: Arc<RouteTemplates>,
}

impl Guest {
    /// Runs one request through a fresh instance and returns its response.
    ///
    /// The instance runs in its own task: once it has sent the response head it keeps going,
    /// streaming the body, while the caller returns the response to hyper.
    /// The instance's task runs inside the caller's current span, so the guest's own spans and
    /// logs nest under the request's.
    pub async fn handle(
        &self,
        state: RequestState,
        request: http::Request<GuestRequestBody>,
    ) -> Result<http::Response<ResponseBody>, Error> {
        let permit = self.slots.acquire_running().await?;
        let mut state = state;
        state.route_templates = Arc::clone(&self.route_templates);
        let mut store = Store::new(self.pre.engine(), state);
        store.data_mut().limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes)
            .build();
        store.limiter(|state| &mut state.limits);
        // Every tick the guest yields its thread; past the deadline it traps.
        let deadline = Instant::now() + self.limits.request_timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Err(DeadlineExceeded.into())
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let (sender, receiver) = oneshot::channel();
        let setup = |store: &mut Store<RequestState>| -> wasmtime::Result<_> {
            let request = store
                .data_mut()
                .http()
                .new_incoming_request(Scheme::Http, request)?;
            let response_out = store.data_mut().http().new_response_outparam(sender)?;
            Ok((request, response_out))
        };
        let (request, response_out) =
            setup(&mut store).map_err(|e| Error::GuestFailed(one_line(e)))?;
        let pre = self.pre.clone();
        let metrics = store.data().metrics.clone();
        // A guest blocked in a host call (a client that does not read its body, a slow store)
        // cannot be interrupted by epochs: this is the backstop, for the whole exchange.
        let backstop = self.limits.request_timeout + Duration::from_secs(1);
        let instance_permit = Arc::clone(&permit);
        let task = tokio::spawn(
            async move {
                // Locals drop in reverse order: the store (and its pool slot) before the permit,
                // so a request that gets the permit always finds a free pool slot.
                let _permit = instance_permit;
                let mut store = store;
                let exchange = async {
                    let started = Instant::now();
                    let service = pre.instantiate_async(&mut store).await?;
                    if let Some(metrics) = metrics {
                        metrics.observe_instantiation(started.elapsed());
                    }
                    service
                        .wasi_http_incoming_handler()
                        .call_handle(&mut store, request, response_out)
                        .await
                };
                tokio::time::timeout(backstop, exchange)
                    .await
                    .unwrap_or_else(|_| Err(DeadlineExceeded.into()))
            }
            .in_current_span(),
        );
        let Ok(answer) = tokio::time::timeout(backstop, receiver).await else {
            task.abort();
            return Err(Error::Timeout);
        };
        match answer {
            Ok(Ok(response)) => {
                self.slots.start_streaming(&permit);
                Ok(response.map(|body| GuestBody::new(body, task).boxed_unsync()))
            }
            Ok(Err(code)) => Err(Error::GuestFailed(format!(
                "guest answered with error {code:?}"
            ))),
            // The sender is dropped with the store: the task has ended without a response.
            Err(_) => Err(Error::GuestFailed(match task.await {
                Ok(Ok(())) => "guest returned without sending a response".to_string(),
                Ok(Err(trap)) if trap.is::<DeadlineExceeded>() => return Err(Error::Timeout),
                Ok(Err(trap)) => one_line(trap),
                Err(join_error) => join_error.to_string(),
            })),
        }
    }

    /// Sends one `GET` of the probe path through a fresh instance, with telemetry off and an
    /// empty store of its own, and returns the reported `version` (`unknown` when the 200's body
    /// is not JSON with one, or when probing is off). Anything but a 200 within
    /// [`PROBE_TIMEOUT`] is an error.
    pub async fn probe_version(&self, path: &ProbePath) -> Result<String, Error> {
        let ProbePath::Get(path) = path else {
            return Ok("unknown".to_string());
        };
        let probe = async {
            let request = http::Request::get(path.as_str())
                .header(http::header::HOST, "localhost")
                .body(GuestRequestBody::complete(Bytes::new()))
                .expect("a parsed path makes a valid request");
            let state = RequestState::quiet(Arc::new(UserStore::memory(0)));
            let response = self.handle(state, request).await?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_PROBE_BODY_BYTES)
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            if status != http::StatusCode::OK {
                return Err(Error::GuestFailed(format!(
                    "probe GET {path} answered {status}"
                )));
            }
            let version = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|health| health["version"].as_str().map(str::to_string));
            Ok(version.unwrap_or_else(|| "unknown".to_string()))
        };
        tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .map_err(|_| Error::GuestFailed(format!("probe GET {path} timed out")))?
    }
}

/// A guest's response body that ends only when the guest's task has ended well.
///
/// wasmtime-wasi-http ends a body normally when its instance goes away mid-stream (a trap, the
/// deadline): with chunked encoding the client would see a cut-short body as complete. Here the
/// end of the body waits for the task's outcome, and a failed task turns it into an error, so
/// hyper breaks the connection instead.
struct GuestBody {
    inner: ResponseBody,
    task: Option<tokio::task::JoinHandle<wasmtime::Result<()>>>,
    /// The request's span, for the log line of a failure.
    span: tracing::Span,
}

impl GuestBody {
    fn new(inner: ResponseBody, task: tokio::task::JoinHandle<wasmtime::Result<()>>) -> GuestBody {
        GuestBody {
            inner,
            task: Some(task),
            span: tracing::Span::current(),
        }
    }
}

impl http_body::Body for GuestBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {}
            other => return other,
        }
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(None);
        };
        let Poll::Ready(outcome) = std::pin::Pin::new(task).poll(cx) else {
            return Poll::Pending;
        };
        self.task = None;
        match outcome {
            Ok(Ok(())) => Poll::Ready(None),
            Ok(Err(trap)) => {
                let error = one_line(trap);
                self.span.in_scope(|| {
                    tracing::error!(
                        error,
                        "guest failed while streaming its body; response cut short"
                    );
                });
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
        self.task.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// How long the health probe of a new guest may take.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
