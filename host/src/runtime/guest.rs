//! A loaded guest: pre-instantiated once, instantiated afresh for every request
//! ([`Guest::handle`]), within its deadline, slots and memory budget.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use crate::error::{RequestError, bounded_debug, one_line};
use crate::interfaces::bindings::ServicePre;
use crate::observability::record::timed;
use crate::observability::request_fields::in_current_request;
use crate::observability::request_span::in_log_context;
use crate::observability::routes::RouteTemplates;
use crate::runtime::capacity::{GuestCapacity, GuestLimits};
use crate::runtime::guest_body::GuestBody;
use crate::runtime::held::TooMuchHeld;
use crate::runtime::outbound::OutboundRules;
use crate::runtime::pool::BUDGET_SPENT;
use crate::runtime::store::{Outbound, RequestContext, RequestState, new_store};

/// The most of a guest's error code the host writes in its log line.
const MAX_ERROR_CODE_TEXT: usize = 512;

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
    /// The destinations its instances may call.
    outbound: Arc<OutboundRules>,
}

impl Guest {
    /// A guest of `pre`, whose instances live within `limits`, share `capacity` and may call
    /// what `outbound` allows.
    pub(crate) fn new(
        pre: ServicePre<RequestState>,
        limits: GuestLimits,
        capacity: Arc<GuestCapacity>,
        outbound: Arc<OutboundRules>,
    ) -> Guest {
        Guest {
            pre,
            limits,
            capacity,
            route_templates: Arc::default(),
            outbound,
        }
    }

    /// Runs one request through a fresh instance and returns its response.
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
        let permit = self.capacity.slots.acquire_running(context.peer()).await?;
        let held = self.capacity.held_objects(request.headers());
        let metrics = context.metrics();
        let body_metrics = metrics.clone();
        let record = Arc::clone(context.record());
        let cost_report = context.cost_report();
        let deadline = Instant::now() + self.limits.request_timeout;
        let mut store = new_store(
            self.pre.engine(),
            context,
            Arc::clone(&self.route_templates),
            self.capacity.limiter(Arc::clone(&record)),
            held,
            Outbound {
                rules: Arc::clone(&self.outbound),
                deadline,
            },
        );
        // Every tick the guest yields its thread; past the deadline it traps.
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
        // A guest blocked in a host call (a client that does not read its body, a slow store)
        // cannot be interrupted by epochs: this is the backstop, for the whole exchange.
        let backstop = self.limits.request_timeout + Duration::from_secs(1);
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
            let mut store = store;
            let exchange = async {
                let started = Instant::now();
                let service = pre.instantiate_async(&mut store).await?;
                let took = started.elapsed();
                record.cost.instantiated(took);
                if let Some(metrics) = metrics {
                    metrics.observe_instantiation(took);
                }
                service
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, request, response_out)
                    .await
            };
            tokio::time::timeout(backstop, timed(exchange, &record.cost))
                .await
                .unwrap_or_else(|_| Err(DeadlineExceeded.into()))
        });
        // Lines written in the task (by wasmtime-wasi-http, the store's drivers) carry the
        // request's fields, and go out as log records with its ids: its OpenTelemetry context
        // is the current one here.
        let instance = in_log_context(instance, opentelemetry::Context::current);
        let task = tokio::spawn(in_current_request(instance));
        let Ok(answer) = tokio::time::timeout(backstop, receiver).await else {
            task.abort();
            return Err(RequestError::Timeout);
        };
        match answer {
            Ok(Ok(response)) => {
                self.capacity
                    .slots
                    .start_streaming(&permit, task.abort_handle());
                Ok(response.map(|body| GuestBody::new(body, task, body_metrics)))
            }
            Ok(Err(code)) => Err(RequestError::ErrorCode(bounded_debug(
                &code,
                MAX_ERROR_CODE_TEXT,
            ))),
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
                Ok(Err(trap)) => RequestError::Trapped(trap),
                Err(join_error) => RequestError::Task(join_error),
            }),
        }
    }
}
