//! What one request's wasm store holds, and so everything the guest can reach.
//!
//! The guest gets the `wasi:http` interfaces, clocks and randomness, and the service's `users`
//! and `telemetry` interfaces.
//! It gets no preopened directories, no environment, no arguments, no sockets and no outgoing
//! HTTP: the WASI context is empty and outgoing requests are refused.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use crate::metrics::Metrics;
use crate::routes::{MatchedRoute, RouteTemplates};
use crate::telemetry::GuestTelemetry;

/// Resource handles one request's guest may hold at once (streams, fields, spans...): far more
/// than a request needs, far fewer than wasmtime's default million, which a guest leaking
/// handles in a loop turns into gigabytes of host memory.
pub const MAX_RESOURCES_PER_REQUEST: usize = 16 * 1024;
use crate::user_store::UserStore;

/// What went wrong on the host's side of one request (a store call that failed), shared with
/// the server, whose one ERROR line for the request carries it.
#[derive(Debug, Default)]
pub struct HostFault(std::sync::Mutex<Option<String>>);

impl HostFault {
    /// Records `cause`, unless an earlier one is recorded: the first fault explains the rest.
    pub fn record(&self, cause: impl FnOnce() -> String) {
        let mut recorded = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recorded.is_none() {
            *recorded = Some(cause());
        }
    }

    /// Records `cause` in place of any earlier one: the fault that decided the answer.
    pub fn record_over(&self, cause: String) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cause);
    }

    /// The recorded cause, if any.
    pub fn take(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// The data of one request's `wasmtime::Store`.
pub struct RequestState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// Resources (streams, requests, responses) the guest holds handles to.
    pub(crate) table: ResourceTable,
    hooks: DenyOutgoingRequests,
    /// The shared store behind the `users` interface.
    pub(crate) users: Arc<UserStore>,
    /// The host's metrics; `None` for requests the host sends itself.
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// The request's server span: the parent of every span the guest opens.
    pub(crate) request_span: tracing::Span,
    /// The route the guest names for this request, shared with the server that labels it.
    pub(crate) matched_route: Arc<MatchedRoute>,
    /// The templates the serving guest has named, set by [`crate::guest::Guest::handle`].
    pub(crate) route_templates: Arc<RouteTemplates>,
    /// Store calls of this request that got a span (see `users::MAX_STORE_SPANS_PER_REQUEST`).
    pub(crate) store_spans: u32,
    /// The guest's open spans and what is left of its telemetry quotas.
    pub(crate) guest_telemetry: GuestTelemetry,
    /// The instance's resource limits and the host-wide memory budget, enforced by wasmtime.
    pub(crate) limits: crate::guest::InstanceLimiter,
    /// Where the first thing that failed on the host's side goes, for the request's ERROR
    /// line; `None` for requests the host sends itself.
    pub(crate) host_fault: Option<Arc<HostFault>>,
    /// Whether the guest's spans and logs are recorded (not for the host's own health probes).
    pub(crate) telemetry_enabled: bool,
}

impl RequestState {
    /// A fresh state for one request, sharing the host's user store and metrics, inside
    /// `request_span`; the route its guest names goes to `matched_route`.
    pub fn new(
        users: Arc<UserStore>,
        metrics: Option<Arc<Metrics>>,
        request_span: tracing::Span,
        matched_route: Arc<MatchedRoute>,
    ) -> RequestState {
        let wasi = WasiCtx::builder()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES_PER_REQUEST);
        RequestState {
            wasi,
            http: WasiHttpCtx::new(),
            table,
            hooks: DenyOutgoingRequests,
            users,
            metrics,
            request_span,
            matched_route,
            route_templates: Arc::default(),
            store_spans: 0,
            guest_telemetry: GuestTelemetry::default(),
            telemetry_enabled: true,
            host_fault: None,
            limits: crate::guest::InstanceLimiter::default(),
        }
    }

    /// A state for a request the host sends itself (a health probe): no span, no log lines,
    /// no metrics.
    pub fn quiet(users: Arc<UserStore>) -> RequestState {
        let mut state = RequestState::new(users, None, tracing::Span::none(), Arc::default());
        state.telemetry_enabled = false;
        state
    }
}

impl Drop for RequestState {
    /// The request is over: the guest's leaked spans end, and what its quotas dropped is counted
    /// and said once.
    fn drop(&mut self) {
        let dropped = self.guest_telemetry.end_all();
        if dropped == Default::default() {
            return;
        }
        if let Some(metrics) = &self.metrics {
            metrics.observe_dropped_guest_telemetry(dropped);
        }
        self.request_span.in_scope(|| {
            tracing::warn!(
                dropped_spans = dropped.spans,
                dropped_attributes = dropped.attributes,
                dropped_log_events = dropped.log_events,
                "the guest went over its telemetry quota; the rest was dropped"
            );
        });
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

/// `wasi:http` hooks that refuse every outgoing request: the guest talks to no one.
struct DenyOutgoingRequests;

impl WasiHttpHooks for DenyOutgoingRequests {
    fn send_request(
        &mut self,
        _request: http::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
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
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }

    fn p2_error_from_hyper(&mut self, _error: &hyper::Error) -> ErrorCode {
        ErrorCode::HttpProtocolError
    }
}
