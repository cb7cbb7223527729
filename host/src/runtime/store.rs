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
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime::{CallHook, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::interfaces::otel::{GuestOtel, OtelView};
use crate::interfaces::stdio::{GuestOutput, Stream};
use crate::interfaces::telemetry::{GuestTelemetry, TelemetryView};
use crate::interfaces::users::{UserCalls, UsersView};
use crate::observability::metrics::Metrics;
use crate::observability::record::{CostReport, HostCalls, HostInterface, RequestRecord};
use crate::observability::request_span::RequestSpan;
use crate::observability::routes::RouteTemplates;
use crate::runtime::capacity::InstanceLimiter;
use crate::runtime::held::{BODY_BUFFER_CHUNKS, BODY_CHUNK_BYTES, FIELDS_LIMIT_BYTES, HeldObjects};
use crate::runtime::outbound::{OutboundRules, OutgoingCalls};
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
}

/// Where a client's request is traced, logged and counted.
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
        }
    }

    /// A request the host sends itself (a health probe), on `users`: no span, no log lines,
    /// no metrics.
    pub fn quiet(users: Arc<UserStore>) -> RequestContext {
        RequestContext {
            users,
            peer: None,
            record: Arc::default(),
            reporting: None,
        }
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

/// The data of one request's `wasmtime::Store`.
pub struct RequestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// Resources (streams, requests, responses, span handles) the guest holds handles to.
    table: ResourceTable,
    hooks: OutgoingRequests,
    users: UserCalls,
    telemetry: GuestTelemetry,
    /// What the guest handed over through `wasi:otel` so far (its spans, its metric series).
    otel: GuestOtel,
    /// The instance's resource limits and the host-wide memory budget, enforced by wasmtime.
    limits: InstanceLimiter,
    /// What the objects in `table` hold of the memory budget.
    held: HeldObjects,
    /// What the host learns of the request; its host calls are counted in its cost.
    record: Arc<RequestRecord>,
}

/// What one request's outgoing calls may reach, and until when.
pub struct Outbound {
    /// The destinations allowed.
    pub rules: Arc<OutboundRules>,
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
    let RequestContext {
        users,
        record,
        reporting,
        ..
    } = context;
    let calls = OutgoingCalls::new(
        outbound.rules,
        outbound.deadline,
        reporting
            .as_ref()
            .map_or_else(opentelemetry::Context::new, |reporting| {
                reporting.request_span.context().clone()
            }),
        Arc::clone(&record),
    );
    let output = GuestOutput::new(reporting.as_ref().map(|reporting| {
        (
            reporting.request_span.clone(),
            Arc::clone(&reporting.metrics),
        )
    }));
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
        hooks: OutgoingRequests(calls),
        users,
        telemetry,
        otel: GuestOtel::default(),
        limits,
        held,
        record,
    };
    let mut store = Store::new(engine, state);
    store.set_max_component_handles(if engine.get_concurrency_support() {
        MAX_COMPONENT_HANDLES_PER_WASIP3_REQUEST
    } else {
        MAX_COMPONENT_HANDLES_PER_REQUEST
    });
    store.limiter(|state| &mut state.limits);
    store.call_hook(|mut store, transition| {
        if !matches!(transition, CallHook::ReturningFromHost) {
            return Ok(());
        }
        let state = store.data_mut();
        state.held.settle(&mut state.table)?;
        Ok(())
    });
    store
}

impl UsersView for RequestState {
    fn users(&mut self) -> (&mut UserCalls, &opentelemetry::Context) {
        (&mut self.users, self.telemetry.innermost_context())
    }
}

impl TelemetryView for RequestState {
    fn telemetry(&mut self) -> (&mut GuestTelemetry, &mut ResourceTable) {
        (&mut self.telemetry, &mut self.table)
    }
}

impl OtelView for RequestState {
    fn otel(&mut self) -> (&mut GuestOtel, &mut GuestTelemetry) {
        (&mut self.otel, &mut self.telemetry)
    }
}

impl HostCalls for RequestState {
    fn count_call(&mut self, interface: HostInterface) {
        self.record.cost.called(interface);
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
            hooks: &mut self.hooks,
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
