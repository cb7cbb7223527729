//! One request as the host reports it: its server span (its name, its attributes by
//! OpenTelemetry's HTTP conventions, the caller's trace it continues, what the answer adds), the
//! fields every log line of the request carries, and its record: the route its guest named, the
//! first thing that failed on the host's side, and what its instance cost.
//!
//! A request span is one OpenTelemetry [`Context`] holding the span that is exported, built and
//! ended on the SDK directly, and the fields its log lines repeat ([`RequestFields`]). It is made
//! current at each poll of the request's futures: the SDK's log appender reads the span's ids
//! from it, the JSON lines (`logs.rs`) the fields. Not a tracing span per request:
//! bench/PROFILE.md, section 15. The [`RequestRecord`] is shared with what adds to it (the
//! guest's `telemetry` calls, the store calls, the memory limiter, outgoing calls) and read once
//! when the answer is traced, logged and counted; the cost is reported when the instance ends
//! ([`CostReport`]), as `wasm.*` span attributes and the per-route `wasm_*` metrics.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use http::{HeaderMap, Method, Uri};
use opentelemetry::context::{FutureExt, WithContext};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer};

use crate::observability::metrics::Metrics;
use crate::observability::routes::{OTHER_METHOD, UNMATCHED, standard_method};

/// Longest `url.path` (and `url.query`) recorded on a span: a span must fit in one UDP packet
/// to the agent.
const MAX_RECORDED_PATH: usize = 1024;
/// The longest non-standard method recorded as `http.request.method_original`.
const MAX_RECORDED_METHOD: usize = 32;
/// The longest status description an error span carries: a trap's cause with its backtrace,
/// which the log line gives whole, is cut here so one span stays well inside a datagram.
const MAX_STATUS_DESCRIPTION_BYTES: usize = 4096;
/// The W3C Trace Context header that names the caller's trace.
const TRACEPARENT: &str = "traceparent";

/// The host's tracer, which starts every request's server span and the host's spans inside it:
/// given once at start-up, when spans are exported.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Sets where the host's spans go; at start-up, by the telemetry pipeline.
pub fn install(tracer: SdkTracer) {
    let _ = TRACER.set(tracer);
}

/// The server span of one request: the exported span, and the fields of its log lines.
/// Clones share both; the exported span ends when the last clone is dropped.
#[derive(Clone)]
pub struct RequestSpan {
    /// The fields every log line of the request carries; none for the host's own requests.
    log: Option<Arc<RequestFields>>,
    /// The exported span (none when spans are not exported or the request is the host's own)
    /// and the fields: the context the request's lines are written and its children start in.
    exported: Context,
}

impl RequestSpan {
    /// Starts the server span of a request, continuing the caller's trace when the request
    /// carries a W3C `traceparent`. Named `HTTP <METHOD>` until [`RequestSpan::record_answer`]
    /// adds the route.
    pub fn start(method: &Method, uri: &Uri, request_id: &str, headers: &HeaderMap) -> RequestSpan {
        let path = &uri.path()[..uri.path().floor_char_boundary(MAX_RECORDED_PATH)];
        // Clients choose the method: only the standard ones become span names or attribute
        // values, so the set of names stays bounded and a 5,000-byte method is not logged whole.
        let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
        let method_original = standard_method(method)
            .is_none()
            .then(|| &method.as_str()[..method.as_str().floor_char_boundary(MAX_RECORDED_METHOD)]);
        // The host's one propagator is W3C Trace Context: without a `traceparent` there is no
        // caller's trace to continue, and the global propagator is not asked.
        let caller = if headers.contains_key(TRACEPARENT) {
            opentelemetry::global::get_text_map_propagator(|propagator| {
                propagator.extract(&HeaderExtractor(headers))
            })
        } else {
            Context::new()
        };
        let exported = match TRACER.get() {
            Some(tracer) => {
                let mut attributes = Vec::with_capacity(12);
                attributes.push(KeyValue::new("http.request.method", method_name));
                if let Some(original) = method_original {
                    let original = original.to_string();
                    attributes.push(KeyValue::new("http.request.method_original", original));
                }
                attributes.push(KeyValue::new("url.path", path.to_string()));
                attributes.push(KeyValue::new("url.scheme", "http"));
                if let Some(query) = uri.query() {
                    let query = query[..query.floor_char_boundary(MAX_RECORDED_PATH)].to_string();
                    attributes.push(KeyValue::new("url.query", query));
                }
                attributes.push(KeyValue::new("request_id", request_id.to_string()));
                let span = tracer
                    .span_builder(format!("HTTP {method_name}"))
                    .with_kind(SpanKind::Server)
                    .with_attributes(attributes)
                    .start_with_context(tracer, &caller);
                Some(span)
            }
            None => None,
        };
        let log = RequestFields::new();
        let exported = match exported {
            Some(span) => Context::new().with_value(Arc::clone(&log)).with_span(span),
            None => Context::new().with_value(Arc::clone(&log)),
        };
        let caller_trace = caller.span().span_context().trace_id();
        let (trace_id, span_id) = log_ids(exported.span().span_context(), caller_trace);
        log.record_str("http.request.method", method_name);
        if let Some(original) = method_original {
            log.record_str("http.request.method_original", original);
        }
        log.record_str("url.path", path);
        log.record_str("request_id", request_id);
        log.record_ids(trace_id, span_id);
        RequestSpan {
            log: Some(log),
            exported,
        }
    }

    /// The span of a request the host sends itself, or of a test: nothing is exported or
    /// logged under it.
    pub fn none() -> RequestSpan {
        RequestSpan {
            log: None,
            exported: Context::new(),
        }
    }

    /// The context the host's and the guest's spans of this request start under.
    pub fn context(&self) -> &Context {
        &self.exported
    }

    /// The exported span's ids: invalid when spans are not exported.
    pub fn span_context(&self) -> SpanContext {
        self.exported.span().span_context().clone()
    }

    /// Whether the exported span records what is set on it (spans are exported, and the
    /// caller did not ask for its trace to be left out).
    pub fn is_recording(&self) -> bool {
        self.exported.span().is_recording()
    }

    /// Records the route the guest named first: in the log lines from now on, and on the span.
    pub fn record_route(&self, route: &str) {
        self.record_log_str("http.route", route);
        if self.is_recording() {
            let route = KeyValue::new("http.route", route.to_string());
            self.exported.span().set_attribute(route);
        }
    }

    /// Records which guest answers the request (guests change with a swap).
    pub fn record_guest_version(&self, version: &str) {
        self.record_log_str("guest.version", version);
        if self.is_recording() {
            let version = KeyValue::new("guest.version", version.to_string());
            self.exported.span().set_attribute(version);
        }
    }

    /// Sets attributes on the exported span alone: what the log lines have no use for. Callers
    /// check [`RequestSpan::is_recording`] before they make them.
    pub fn set_attributes(&self, attributes: Vec<KeyValue>) {
        self.exported.span().set_attributes(attributes);
    }

    /// Records the answer: its route in the span's name (`HTTP <METHOD> <route>`) and, unless
    /// the span already carries it, in `http.route`; its status; a 5xx marks the span an error,
    /// described by the host's `cause` when it knows one (the words of the request's log line).
    pub fn record_answer(
        &self,
        method: &Method,
        route: &str,
        record_route: bool,
        status: u16,
        cause: Option<&str>,
    ) {
        if record_route {
            self.record_log_str("http.route", route);
        }
        if let Some(log) = &self.log {
            log.record_i64("http.response.status_code", i64::from(status));
        }
        if !self.is_recording() {
            return;
        }
        let method_name = standard_method(method).unwrap_or(OTHER_METHOD);
        let span = self.exported.span();
        span.update_name(format!("HTTP {method_name} {route}"));
        if record_route {
            span.set_attribute(KeyValue::new("http.route", route.to_string()));
        }
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            let cause = cause.unwrap_or_default();
            let description = &cause[..cause.floor_char_boundary(MAX_STATUS_DESCRIPTION_BYTES)];
            span.set_status(Status::error(description.to_string()));
            // The conventions' `error.type` of a server error is its status code.
            span.set_attribute(KeyValue::new("error.type", status.to_string()));
        }
    }

    /// Runs `f` inside the request: its log lines carry the request's fields (and, as OTLP
    /// log records, its ids).
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _current = self.exported.clone().attach();
        f()
    }

    /// Runs `f` inside the request, its OTLP log records carrying the ids of `span`: the
    /// request's span or one inside it.
    pub fn in_span<R>(&self, span: &Context, f: impl FnOnce() -> R) -> R {
        let span = match carried_by(span) {
            Some(_) => span.clone(),
            None => with_fields(span.clone(), self.log.as_ref()),
        };
        let _current = span.attach();
        f()
    }

    /// `future`, inside the request at each poll, as [`RequestSpan::in_scope`].
    pub fn instrument<F: Future>(&self, future: F) -> WithContext<F> {
        future.with_context(self.exported.clone())
    }

    fn record_log_str(&self, name: &'static str, value: &str) {
        if let Some(log) = &self.log {
            log.record_str(name, value);
        }
    }
}

/// Starts a span of the host's named `name` under `parent`, with `attributes`, in a context
/// that keeps `parent`'s request fields; without a span when `parent` holds none (spans are not
/// exported, or the request is the host's own).
pub fn start_child(
    parent: &Context,
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Context {
    match TRACER.get() {
        Some(tracer) if parent.has_active_span() => {
            let span = tracer
                .span_builder(name)
                .with_kind(kind)
                .with_attributes(attributes)
                .start_with_context(tracer, parent);
            parent.with_span(span)
        }
        _ => no_span_under(parent),
    }
}

/// A context with no span that keeps `parent`'s request fields: where a child would be, when
/// none is exported.
pub fn no_span_under(parent: &Context) -> Context {
    with_fields(Context::new(), carried_by(parent).as_ref())
}

/// The trace and span ids the request's log lines carry: the exported span's, or, where spans
/// are not exported (`OTEL_TRACES_EXPORTER=none`, `OTEL_SDK_DISABLED`), ids of the host's own:
/// the caller's trace when it sent one (`caller_trace` is valid), else a new one, so that every
/// line of a request still carries a trace id to correlate by.
fn log_ids(exported: &SpanContext, caller_trace: TraceId) -> (TraceId, SpanId) {
    if exported.is_valid() {
        return (exported.trace_id(), exported.span_id());
    }
    let ids = RandomIdGenerator::default();
    let trace_id = if caller_trace == TraceId::INVALID {
        ids.new_trace_id()
    } else {
        caller_trace
    };
    (trace_id, ids.new_span_id())
}

/// Every name a request's fields may have: a guest's log field of one of these names is kept
/// beside it as `guest.<name>`, whether or not the request has recorded it yet.
pub const REQUEST_FIELD_NAMES: [&str; 9] = [
    "http.request.method",
    "http.request.method_original",
    "http.route",
    "url.path",
    "http.response.status_code",
    "guest.version",
    "request_id",
    "trace_id",
    "span_id",
];

/// A request's log fields, each name once: of a name recorded twice, the later value is the one
/// a line carries.
pub struct RequestFields {
    members: Mutex<Vec<(&'static str, FieldValue)>>,
}

/// A request field's value as recorded: most requests write no line, so it becomes JSON text
/// only when a line carries it ([`FieldValue::to_json`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// A string.
    Text(String),
    /// A number.
    Number(i64),
    /// A trace id, written as its 32 hex digits.
    Trace(TraceId),
    /// A span id, written as its 16 hex digits.
    Span(SpanId),
}

impl FieldValue {
    /// The value as JSON text.
    pub fn to_json(&self) -> String {
        match self {
            FieldValue::Text(text) => serde_json::to_string(text).expect("a string serializes"),
            FieldValue::Number(number) => number.to_string(),
            FieldValue::Trace(trace_id) => format!("\"{trace_id}\""),
            FieldValue::Span(span_id) => format!("\"{span_id}\""),
        }
    }
}

impl RequestFields {
    /// A request with no field recorded yet.
    pub fn new() -> Arc<RequestFields> {
        Arc::new(RequestFields {
            // Room for a request's fields and its later records without growing.
            members: Mutex::new(Vec::with_capacity(12)),
        })
    }

    /// Records `name` as the string `value`.
    pub fn record_str(&self, name: &'static str, value: &str) {
        self.record(name, FieldValue::Text(value.to_owned()));
    }

    /// Records `name` as the number `value`.
    pub fn record_i64(&self, name: &'static str, value: i64) {
        self.record(name, FieldValue::Number(value));
    }

    /// Records the request's `trace_id` and `span_id`.
    pub fn record_ids(&self, trace_id: TraceId, span_id: SpanId) {
        self.record("trace_id", FieldValue::Trace(trace_id));
        self.record("span_id", FieldValue::Span(span_id));
    }

    /// Sets `name`, in place if it is set already: a request holds each name once, so its list
    /// is bounded by [`REQUEST_FIELD_NAMES`] whoever records.
    fn record(&self, name: &'static str, value: FieldValue) {
        // A log line adds these members without searching it for their names (`logs.rs`).
        debug_assert!(
            REQUEST_FIELD_NAMES.contains(&name),
            "{name} is no request field"
        );
        let mut members = self.lock();
        match members.iter_mut().find(|(recorded, _)| *recorded == name) {
            Some((_, recorded)) => *recorded = value,
            None => members.push((name, value)),
        }
    }

    /// The fields recorded so far, earliest first; held while a line copies them.
    pub fn members(&self) -> MutexGuard<'_, Vec<(&'static str, FieldValue)>> {
        self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(&'static str, FieldValue)>> {
        // A panic while recording leaves a list of whole members: still usable.
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fields of the request whose context is current, if any.
pub fn current_fields() -> Option<Arc<RequestFields>> {
    Context::map_current(carried_by)
}

/// The fields `context` carries, if it is a request's.
pub fn carried_by(context: &Context) -> Option<Arc<RequestFields>> {
    context.get::<Arc<RequestFields>>().cloned()
}

/// `context`, carrying `request`'s fields as well (when there is a request).
pub fn with_fields(context: Context, request: Option<&Arc<RequestFields>>) -> Context {
    match request {
        Some(request) => context.with_value(Arc::clone(request)),
        None => context,
    }
}

/// What the host learns of one request while serving it, shared by everything that serves it.
#[derive(Debug, Default)]
pub struct RequestRecord {
    named: Mutex<Named>,
    /// What its instance costs; only grows, so it needs no lock.
    pub cost: RequestCost,
}

#[derive(Debug, Default)]
struct Named {
    /// The last route the guest (or the host, for its own page) named.
    route: Option<Arc<str>>,
    /// The route recorded on the span, if one was: an OpenTelemetry span appends an attribute
    /// at every set, so a guest naming routes in a loop must not reach the span each time.
    route_on_span: Option<Arc<str>>,
    /// What failed on the host's side, for the request's one ERROR or WARN line.
    fault: Option<String>,
}

impl RequestRecord {
    fn named(&self) -> MutexGuard<'_, Named> {
        self.named.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the request's route (the last one named wins). Returns it when the span should
    /// carry it now, that is when it is the request's first.
    pub fn name_route(&self, route: Arc<str>) -> Option<Arc<str>> {
        let mut named = self.named();
        named.route = Some(Arc::clone(&route));
        if named.route_on_span.is_some() {
            return None;
        }
        named.route_on_span = Some(Arc::clone(&route));
        Some(route)
    }

    /// The route named last, or [`UNMATCHED`]; and whether the span still needs it recorded
    /// (it carries none, or an earlier one).
    pub fn route(&self) -> (Arc<str>, bool) {
        let named = self.named();
        let route = named.route.clone().unwrap_or_else(|| Arc::from(UNMATCHED));
        let on_span = named.route_on_span.as_ref() == Some(&route);
        (route, !on_span)
    }

    /// Records what failed on the host's side, unless an earlier fault is recorded: the first
    /// explains the rest.
    pub fn fault(&self, cause: impl FnOnce() -> String) {
        let mut named = self.named();
        if named.fault.is_none() {
            named.fault = Some(cause());
        }
    }

    /// Records `cause` in place of any earlier fault: the one that decided the answer.
    pub fn deciding_fault(&self, cause: String) {
        self.named().fault = Some(cause);
    }

    /// The recorded fault, if any.
    pub fn take_fault(&self) -> Option<String> {
        self.named().fault.take()
    }
}

/// The host's own interfaces a guest may call, each counted apart. WASI calls (`wasi:http`,
/// clocks, random) are not counted: they are wasmtime's, linked unwrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum HostInterface {
    /// `tutorial:service/users`.
    Users,
    /// `tutorial:service/telemetry`.
    Telemetry,
    /// `wasi:otel` (tracing, logs and metrics).
    Otel,
}

impl HostInterface {
    /// Every interface, in the order of [`RequestCost::host_calls`].
    pub const ALL: [HostInterface; 3] = [
        HostInterface::Users,
        HostInterface::Telemetry,
        HostInterface::Otel,
    ];

    /// Its name in the `interface` label and the span attribute `wasm.host_calls.<name>`.
    pub fn name(self) -> &'static str {
        match self {
            HostInterface::Users => "users",
            HostInterface::Telemetry => "telemetry",
            HostInterface::Otel => "otel",
        }
    }

    /// The span attribute with its calls: `wasm.host_calls.<name>`.
    pub fn span_attribute(self) -> &'static str {
        match self {
            HostInterface::Users => "wasm.host_calls.users",
            HostInterface::Telemetry => "wasm.host_calls.telemetry",
            HostInterface::Otel => "wasm.host_calls.otel",
        }
    }
}

/// Store data that counts the calls its guest makes to the host's interfaces: each linked
/// function of [`HostInterface::ALL`] counts itself once, first.
pub trait HostCalls {
    /// Counts one call to `interface`.
    fn count_call(&mut self, interface: HostInterface);
}

/// One request's instance cost, counted by its store and reported by its task. Every counter
/// only grows, so relaxed atomics suffice.
#[derive(Debug, Default)]
pub struct RequestCost {
    instantiation_nanos: AtomicU64,
    running_nanos: AtomicU64,
    memory_peak: AtomicUsize,
    host_calls: [AtomicU32; 3],
    /// Set when the host-wide budget, not the instance's own limit, refused it memory: the
    /// request is then answered 503 (the host is busy), not 500.
    over_budget: AtomicBool,
    /// Set when the instance's own memory limit refused it memory: a trap after it is said to
    /// follow from it.
    over_limit: AtomicBool,
}

/// A reading of a [`RequestCost`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CostReading {
    /// Time to instantiate the component.
    pub instantiation: Duration,
    /// Time the instance ran, instantiation aside: its task's polls, host calls made inside
    /// them included, waits on the client or the store not.
    pub running: Duration,
    /// The largest size its linear memories reached together, in bytes.
    pub memory_peak: usize,
    /// Calls to each of [`HostInterface::ALL`], in that order.
    pub host_calls: [u32; 3],
}

impl RequestCost {
    /// Records the instantiation time.
    pub fn instantiated(&self, took: Duration) {
        self.instantiation_nanos
            .store(nanos(took), Ordering::Relaxed);
    }

    /// Adds one stretch of running.
    pub fn ran(&self, took: Duration) {
        self.running_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// A memory grew by `grown` bytes (its creation included).
    pub fn memory_grew(&self, grown: usize) {
        self.memory_peak.fetch_add(grown, Ordering::Relaxed);
    }

    /// The host-wide memory budget refused the instance memory.
    pub fn refused_by_budget(&self) {
        self.over_budget.store(true, Ordering::Release);
    }

    /// Whether the host-wide memory budget refused the instance memory.
    pub fn was_over_budget(&self) -> bool {
        self.over_budget.load(Ordering::Acquire)
    }

    /// The instance's own memory limit refused it memory.
    pub fn refused_by_limit(&self) {
        self.over_limit.store(true, Ordering::Release);
    }

    /// Whether the instance's own memory limit refused it memory.
    pub fn was_over_limit(&self) -> bool {
        self.over_limit.load(Ordering::Acquire)
    }

    /// Counts one call to `interface`.
    pub fn called(&self, interface: HostInterface) {
        self.host_calls[interface as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// What it cost so far.
    pub fn read(&self) -> CostReading {
        CostReading {
            instantiation: Duration::from_nanos(self.instantiation_nanos.load(Ordering::Relaxed)),
            running: Duration::from_nanos(
                self.running_nanos
                    .load(Ordering::Relaxed)
                    .saturating_sub(self.instantiation_nanos.load(Ordering::Relaxed)),
            ),
            memory_peak: self.memory_peak.load(Ordering::Relaxed),
            host_calls: std::array::from_fn(|index| self.host_calls[index].load(Ordering::Relaxed)),
        }
    }
}

/// A client's request whose instance cost is reported when this is dropped: at the end of the
/// instance's task, however it ends (answered, trapped, stopped at its deadline, aborted).
pub struct CostReport {
    /// The request's server span, given the `wasm.*` attributes.
    pub span: RequestSpan,
    /// Where the per-route `wasm_*` metrics are.
    pub metrics: Arc<Metrics>,
    /// The request's record: its cost is reported, labelled with its route.
    pub record: Arc<RequestRecord>,
}

impl Drop for CostReport {
    /// Onto the exported span only, when it records: the JSON lines have no use for them (the
    /// request is over). A host interface never called gets no attribute (the span must still
    /// fit 128 to a datagram).
    fn drop(&mut self) {
        let reading = self.record.cost.read();
        let memory_peak = i64::try_from(reading.memory_peak).unwrap_or(i64::MAX);
        let host_calls = HostInterface::ALL
            .map(|interface| (interface.name(), reading.host_calls[interface as usize]));
        if self.span.is_recording() {
            let mut attributes = vec![
                KeyValue::new(
                    "wasm.instantiation.duration",
                    reading.instantiation.as_secs_f64(),
                ),
                KeyValue::new("wasm.run.duration", reading.running.as_secs_f64()),
                KeyValue::new("wasm.memory.peak", memory_peak),
            ];
            for interface in HostInterface::ALL {
                let calls = reading.host_calls[interface as usize];
                if calls > 0 {
                    attributes.push(KeyValue::new(interface.span_attribute(), i64::from(calls)));
                }
            }
            // Set all at once: one lock of the span.
            self.span.set_attributes(attributes);
        }
        let (route, _) = self.record.route();
        self.metrics.observe_instance_cost(
            &route,
            reading.instantiation,
            reading.running,
            reading.memory_peak,
            &host_calls,
        );
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `inner`, adding the time of each of its polls to `cost` as running time.
pub async fn timed<F: Future>(inner: F, cost: &RequestCost) -> F::Output {
    let mut inner = std::pin::pin!(inner);
    std::future::poll_fn(|context| {
        let started = std::time::Instant::now();
        let poll = inner.as_mut().poll(context);
        cost.ran(started.elapsed());
        poll
    })
    .await
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{TraceFlags, TraceState};

    use super::*;

    #[test]
    fn log_ids_are_the_exported_spans_when_there_is_one() {
        let exported = SpanContext::new(
            TraceId::from(7),
            SpanId::from(9),
            TraceFlags::SAMPLED,
            true,
            TraceState::NONE,
        );
        assert_eq!(
            log_ids(&exported, TraceId::from(3)),
            (TraceId::from(7), SpanId::from(9))
        );
    }

    #[test]
    fn without_an_exported_span_the_log_ids_continue_the_callers_trace() {
        let (trace_id, span_id) = log_ids(&SpanContext::NONE, TraceId::from(3));
        assert_eq!(trace_id, TraceId::from(3));
        assert_ne!(span_id, SpanId::INVALID);
    }

    #[test]
    fn without_an_exported_span_or_a_caller_each_request_starts_a_trace_of_its_own() {
        let (first, first_span) = log_ids(&SpanContext::NONE, TraceId::INVALID);
        let (second, _) = log_ids(&SpanContext::NONE, TraceId::INVALID);
        assert_ne!(first, TraceId::INVALID);
        assert_ne!(first_span, SpanId::INVALID);
        assert_ne!(first, second);
    }

    fn recorded(request: &RequestFields) -> Vec<(&'static str, String)> {
        let members = request.members();
        members
            .iter()
            .map(|(name, value)| (*name, value.to_json()))
            .collect()
    }

    #[test]
    fn values_are_written_as_json_each_name_once_with_its_latest_value() {
        let request = RequestFields::new();
        request.record_str("request_id", "a\"b");
        request.record_ids(TraceId::from(0xab), SpanId::from(0xcd));
        request.record_i64("http.response.status_code", 404);
        request.record_str("http.route", "/api/users/{id}");
        for status in 0..1000 {
            request.record_i64("http.response.status_code", status);
        }
        assert_eq!(
            recorded(&request),
            [
                ("request_id", "\"a\\\"b\"".to_string()),
                ("trace_id", format!("\"{}ab\"", "0".repeat(30))),
                ("span_id", format!("\"{}cd\"", "0".repeat(14))),
                ("http.response.status_code", "999".to_string()),
                ("http.route", "\"/api/users/{id}\"".to_string()),
            ]
        );
    }

    #[test]
    fn the_current_fields_are_those_of_the_innermost_request_context_attached() {
        let outer = RequestFields::new();
        let inner = RequestFields::new();
        assert!(current_fields().is_none());
        let _outer = with_fields(Context::new(), Some(&outer)).attach();
        {
            let _inner = with_fields(Context::new(), Some(&inner)).attach();
            assert!(Arc::ptr_eq(&current_fields().unwrap(), &inner));
        }
        assert!(Arc::ptr_eq(&current_fields().unwrap(), &outer));
    }

    #[test]
    fn each_interfaces_span_attribute_is_wasm_host_calls_and_its_name() {
        for interface in HostInterface::ALL {
            assert_eq!(
                interface.span_attribute(),
                format!("wasm.host_calls.{}", interface.name())
            );
        }
    }

    #[test]
    fn memory_peak_is_the_sum_of_every_growth_and_calls_are_counted_per_interface() {
        let cost = RequestCost::default();
        cost.memory_grew(1 << 16);
        cost.memory_grew(3 << 16);
        cost.called(HostInterface::Otel);
        cost.called(HostInterface::Otel);
        cost.called(HostInterface::Users);
        let reading = cost.read();
        assert_eq!(reading.memory_peak, 4 << 16);
        assert_eq!(
            HostInterface::ALL[HostInterface::Otel as usize],
            HostInterface::Otel
        );
        assert_eq!(reading.host_calls, [1, 0, 2]);
    }

    #[test]
    fn a_request_that_names_no_route_is_unmatched_and_the_last_named_wins() {
        let record = RequestRecord::default();
        assert_eq!(record.route(), (Arc::from(UNMATCHED), true));
        assert_eq!(record.name_route(Arc::from("/a")), Some(Arc::from("/a")));
        assert_eq!(record.route(), (Arc::from("/a"), false));
        // Later routes are not recorded on the span until the answer, and then only if new.
        assert_eq!(record.name_route(Arc::from("/b")), None);
        assert_eq!(record.name_route(Arc::from("/b")), None);
        assert_eq!(record.route(), (Arc::from("/b"), true));
    }

    #[test]
    fn the_first_fault_is_kept_unless_a_later_one_decided_the_answer() {
        let record = RequestRecord::default();
        record.fault(|| "store down".into());
        record.fault(|| "store still down".into());
        assert_eq!(record.take_fault().as_deref(), Some("store down"));
        assert_eq!(record.take_fault(), None);
        record.fault(|| "store down".into());
        record.deciding_fault("deadline".into());
        assert_eq!(record.take_fault().as_deref(), Some("deadline"));
    }

    #[test]
    fn running_time_adds_up_every_poll() {
        let cost = RequestCost::default();
        cost.ran(Duration::from_millis(2));
        cost.ran(Duration::from_millis(3));
        assert_eq!(cost.read().running, Duration::from_millis(5));
    }
}
