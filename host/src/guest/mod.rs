//! The guest component: compiled and linked once ([`Runtime`]), instantiated afresh for every
//! request ([`Guest::handle`]).
//!
//! - `runtime.rs`: the engine (epoch ticker), the linker, loading a component;
//! - `admission.rs`: what a component must be before it is linked (UTF-8 strings to the host);
//! - `capacity.rs`: the pools, memory budget, store limits and slots, all sized from the flags;
//! - `pool.rs`: the linear memories and stacks instances reuse, without page-protection changes;
//! - `slots.rs`: the two budgets of instance slots, running and streaming;
//! - `probe.rs`: the request a new guest must answer 200 before it serves;
//! - `body.rs`: a response body that breaks off when the guest fails mid-stream.

mod admission;
mod body;
mod capacity;
mod pool;
mod probe;
mod runtime;
mod slots;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tracing::Instrument;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

pub use admission::Refusal;
pub use capacity::{GuestCapacity, InstanceLimiter};
pub use pool::POOL_TRIM_PERIOD;
pub use probe::{PROBE_TIMEOUT, ProbePath};
pub use runtime::{EPOCH_TICK, GuestLimits, Runtime, SLOT_WAIT};

use crate::bindings::ServicePre;
use crate::error::RequestError;
use crate::request_body::GuestRequestBody;
use crate::request_state::RequestState;
use crate::responses::ResponseBody;
use crate::routes::RouteTemplates;
use body::GuestBody;

/// The trap raised when a request outlives its deadline.
#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request's deadline passed")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// A loaded guest, ready to be instantiated.
#[derive(Clone)]
pub struct Guest {
    pre: ServicePre<RequestState>,
    limits: GuestLimits,
    /// The pools and slots every instance of every guest shares.
    capacity: Arc<GuestCapacity>,
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
    ) -> Result<http::Response<ResponseBody>, RequestError> {
        let permit = self.capacity.slots.acquire_running().await?;
        let mut state = state;
        state.route_templates = Arc::clone(&self.route_templates);
        let over_budget = Arc::new(AtomicBool::new(false));
        state.limits = self.capacity.limiter(Arc::clone(&over_budget));
        let mut store = Store::new(self.pre.engine(), state);
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
        let (request, response_out) = setup(&mut store).map_err(RequestError::Setup)?;
        let pre = self.pre.clone();
        let metrics = store.data().metrics.clone();
        // A guest blocked in a host call (a client that does not read its body, a slow store)
        // cannot be interrupted by epochs: this is the backstop, for the whole exchange.
        let backstop = self.limits.request_timeout + Duration::from_secs(1);
        let instance_permit = Arc::clone(&permit);
        let task = tokio::spawn(
            async move {
                // Locals drop in reverse order: the store (its memory regions and stack back in
                // their pools) before the permit, so a request that gets the permit always finds
                // what it needs in the pools.
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
            return Err(RequestError::Timeout);
        };
        match answer {
            Ok(Ok(response)) => {
                self.capacity.slots.start_streaming(&permit);
                Ok(response.map(|body| GuestBody::new(body, task).boxed_unsync()))
            }
            Ok(Err(code)) => Err(RequestError::ErrorCode(format!("{code:?}"))),
            // The sender is dropped with the store: the task has ended without a response.
            Err(_) => Err(match task.await {
                Ok(Ok(())) => RequestError::NoResponse,
                Ok(Err(trap)) if trap.is::<DeadlineExceeded>() => RequestError::Timeout,
                // The host, not the guest, ran short: the instance could not get its memory
                // (a refused new memory reaches here only as wasmtime's text of the refusal).
                Ok(Err(trap))
                    if over_budget.load(Ordering::Acquire)
                        || crate::error::one_line(&*trap).contains(pool::BUDGET_SPENT) =>
                {
                    RequestError::Busy
                }
                Ok(Err(trap)) => RequestError::Trapped(trap),
                Err(join_error) => RequestError::Task(join_error),
            }),
        }
    }
}
