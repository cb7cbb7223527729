//! The `telemetry` WIT interface: the guest's spans become exported spans inside the request's
//! server span, and its log events `tracing` events inside the request, so they are exported and
//! logged with its ids; the route it names labels the request.
//!
//! Each function is written once, on [`GuestTelemetry`]: a call is first admitted against the
//! request's quotas (nothing it passes is read otherwise), its strings are then lifted within
//! the allowance left ([`crate::interfaces::lift`]), and only then recorded.

use std::sync::Arc;

use opentelemetry::trace::{SpanContext, SpanKind, TraceContextExt};
use opentelemetry::{Context, KeyValue, Value as OtelValue};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable, ResourceType, WasmList, WasmStr};

use crate::interfaces::bindings::GuestSpan;
use crate::interfaces::bindings::telemetry::{Attribute, Level, Value};
use crate::interfaces::lift::{self, Allowance, InGuest, Lifted, WireAttribute};
use crate::observability::logs;
use crate::observability::metrics::{DroppedGuestTelemetry, Metrics};
use crate::observability::request_report::{
    self, HostCalls, HostInterface, RequestRecord, RequestSpan,
};
use crate::observability::routes::{self, Label, RouteTemplates};

/// The `target` of every log event the guest reports.
pub const GUEST_TARGET: &str = "guest";

/// What one request's guest may report: beyond it, spans, attributes and log events are
/// dropped, counted in `guest_telemetry_dropped_total`, and said once in a WARN line. A guest in a
/// loop cannot grow host memory, the exporter's queue or the log file without bound.
pub const MAX_SPANS_PER_REQUEST: u32 = 128;
/// See [`MAX_SPANS_PER_REQUEST`]: attributes over all spans and log events.
pub const MAX_ATTRIBUTES_PER_REQUEST: u32 = 1024;
/// See [`MAX_SPANS_PER_REQUEST`].
pub const MAX_LOG_EVENTS_PER_REQUEST: u32 = 256;
/// See [`MAX_SPANS_PER_REQUEST`]: bytes of names, keys, values and messages together.
pub const MAX_BYTES_PER_REQUEST: usize = 256 * 1024;
/// Bytes one guest span may carry (name, keys, values): well under the 65,000-byte UDP datagram
/// of the Jaeger agent, where one larger span would lose its whole batch of other requests'
/// spans. Longer names and text values are cut to [`lift::MAX_VALUE_BYTES`].
pub const MAX_BYTES_PER_SPAN: usize = 16 * 1024;
/// Bytes of route templates one request's guest may name; later `set-route` calls are not read
/// (the last route read stands). Far above what any handler names (100,000 short names fit).
pub const MAX_ROUTE_BYTES_PER_REQUEST: usize = 1024 * 1024;
/// Log fields the guest's attributes may not replace; a guest attribute of one of these names is
/// written as `guest.<name>`.
pub const RESERVED_LOG_KEYS: &[&str] = &[
    "timestamp",
    "level",
    "message",
    "target",
    "request_id",
    "trace_id",
    "span_id",
];

/// The store data of a request whose guest may use the `telemetry` interface.
pub trait TelemetryView: HostCalls + Send + 'static {
    /// The request's guest telemetry, and the table its span handles live in.
    fn telemetry(&mut self) -> (&mut GuestTelemetry, &mut ResourceTable);
}

/// One request's guest telemetry: where it goes, its open spans, and what is left of its
/// quotas.
pub struct GuestTelemetry {
    /// Off for the host's own probes: handles are given, nothing is recorded.
    enabled: bool,
    /// The request's server span: the parent of every span the guest opens.
    request_span: RequestSpan,
    /// The request's record, where the route the guest names goes.
    record: Arc<RequestRecord>,
    /// The templates the serving guest has named.
    route_templates: Arc<RouteTemplates>,
    /// The host's metrics; `None` for requests the host sends itself.
    metrics: Option<Arc<Metrics>>,
    /// Open spans, innermost last.
    open: Vec<OpenSpan>,
    spans: u32,
    log_events: u32,
    /// Bytes and attributes the guest may still pass.
    allowance: Allowance,
    /// Bytes of the route templates read so far, against [`MAX_ROUTE_BYTES_PER_REQUEST`].
    route_bytes: usize,
    dropped: DroppedGuestTelemetry,
}

/// What a call would report, admitted or not before anything it passes is read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Report {
    Span,
    LogEvent,
    /// An attribute on the open span with this handle.
    Attribute {
        span: u32,
    },
}

struct OpenSpan {
    rep: u32,
    /// The span, in the context the guest's spans inside it start under.
    span: Context,
    /// Set when the span ends, so a later value replaces an earlier one of the same key.
    attributes: Vec<(String, Value)>,
    /// Bytes of its name and attributes, against [`MAX_BYTES_PER_SPAN`].
    bytes: usize,
}

impl OpenSpan {
    /// Sets `attribute` if the span's own byte budget allows it; `false` when it does not.
    fn set(&mut self, attribute: Attribute) -> bool {
        let size = attribute.key.len() + value_bytes(&attribute.value);
        if self.bytes + size > MAX_BYTES_PER_SPAN {
            return false;
        }
        self.bytes += size;
        replace_attribute(&mut self.attributes, attribute);
        true
    }

    /// Ends the span with its attributes.
    fn end(self) {
        let span = self.span.span();
        if !self.attributes.is_empty() {
            span.set_attributes(
                self.attributes
                    .into_iter()
                    .map(|(key, value)| key_value(Attribute { key, value })),
            );
        }
        span.end();
    }
}

impl GuestTelemetry {
    /// Telemetry of a request inside `request_span`: the route its guest names goes to
    /// `record`, labelled by `route_templates`; what its quotas drop is counted in `metrics`.
    pub fn new(
        request_span: RequestSpan,
        record: Arc<RequestRecord>,
        route_templates: Arc<RouteTemplates>,
        metrics: Option<Arc<Metrics>>,
    ) -> GuestTelemetry {
        GuestTelemetry {
            enabled: true,
            request_span,
            record,
            route_templates,
            metrics,
            open: Vec::new(),
            spans: 0,
            log_events: 0,
            allowance: Allowance {
                bytes: MAX_BYTES_PER_REQUEST,
                attributes: MAX_ATTRIBUTES_PER_REQUEST,
            },
            route_bytes: 0,
            dropped: DroppedGuestTelemetry::default(),
        }
    }

    /// Telemetry that records nothing: for the host's own probes.
    pub fn off() -> GuestTelemetry {
        let mut telemetry =
            GuestTelemetry::new(RequestSpan::none(), Arc::default(), Arc::default(), None);
        telemetry.enabled = false;
        telemetry
    }

    /// The innermost span of this request that is still open, as the context its children
    /// start under.
    pub fn innermost_context(&self) -> &Context {
        self.open
            .last()
            .map_or(self.request_span.context(), |open| &open.span)
    }

    /// The allowance a call may lift within, if telemetry is on and the quotas hold one more
    /// `report`; otherwise the report and the `attributes` it passes are counted as dropped
    /// (when on), and `None`.
    pub(crate) fn admit(&mut self, report: Report, attributes: usize) -> Option<Allowance> {
        if !self.enabled {
            return None;
        }
        let room = self.allowance.bytes > 0
            && match report {
                Report::Span => self.spans < MAX_SPANS_PER_REQUEST,
                Report::LogEvent => self.log_events < MAX_LOG_EVENTS_PER_REQUEST,
                Report::Attribute { span } => {
                    self.allowance.attributes > 0 && self.open.iter().any(|open| open.rep == span)
                }
            };
        if room {
            return Some(self.allowance);
        }
        match report {
            Report::Span => self.dropped.spans += 1,
            Report::LogEvent => self.dropped.log_events += 1,
            Report::Attribute { .. } => {}
        }
        self.dropped.attributes += attributes as u64;
        None
    }

    /// Settles a span or log event admitted by [`GuestTelemetry::admit`] and reported elsewhere
    /// (through `wasi:otel`): `left` is what its lifting left of the allowance, `kept` whether
    /// it was recorded, `dropped_attributes` how many of its attributes were not.
    pub(crate) fn settle(
        &mut self,
        report: Report,
        left: Allowance,
        kept: bool,
        dropped_attributes: u64,
    ) {
        self.allowance = left;
        self.dropped.attributes += dropped_attributes;
        match (report, kept) {
            (Report::Span, true) => self.spans += 1,
            (Report::Span, false) => self.dropped.spans += 1,
            (Report::LogEvent, true) => self.log_events += 1,
            (Report::LogEvent, false) => self.dropped.log_events += 1,
            (Report::Attribute { .. }, _) => {}
        }
    }

    /// Counts metric data points the guest handed over that were not recorded.
    pub(crate) fn drop_metric_points(&mut self, points: u64) {
        self.dropped.metric_points += points;
    }

    /// The request's server span (a disabled span for the host's own probes).
    pub fn request_span(&self) -> &RequestSpan {
        &self.request_span
    }

    /// The host's metrics, unless telemetry is off.
    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref().filter(|_| self.enabled)
    }

    /// `span.constructor`: opens the span `rep` inside the innermost open one, unless its
    /// name did not fit.
    fn open_span(&mut self, rep: u32, name: Option<String>, lifted: Lifted, left: Allowance) {
        self.allowance = left;
        self.dropped.attributes += lifted.dropped;
        let Some(name) = name else {
            self.dropped.spans += 1;
            self.dropped.attributes += lifted.attributes.len() as u64;
            return;
        };
        self.spans += 1;
        let bytes = name.len();
        let span = request_report::start_child(
            self.innermost_context(),
            name,
            SpanKind::Internal,
            Vec::new(),
        );
        let mut open = OpenSpan {
            rep,
            span,
            attributes: Vec::new(),
            bytes,
        };
        for attribute in lifted.attributes {
            if !open.set(attribute) {
                self.dropped.attributes += 1;
            }
        }
        self.open.push(open);
    }

    /// `span.set-attribute`, within the span's own byte budget.
    fn set_span_attribute(&mut self, rep: u32, attribute: Option<Attribute>, left: Allowance) {
        self.allowance = left;
        let set = attribute.is_some_and(|attribute| {
            self.open
                .iter_mut()
                .find(|open| open.rep == rep)
                .is_some_and(|open| open.set(attribute))
        });
        if !set {
            self.dropped.attributes += 1;
        }
    }

    /// The guest dropped its handle `rep`: the span ends (a span over the quota was never
    /// opened).
    fn end_span(&mut self, rep: u32) {
        if let Some(position) = self.open.iter().position(|open| open.rep == rep) {
            self.open.remove(position).end();
        }
    }

    /// `log`: one event inside the innermost open span, unless its message did not fit.
    fn log(&mut self, level: Level, message: Option<String>, lifted: Lifted, left: Allowance) {
        self.allowance = left;
        self.dropped.attributes += lifted.dropped;
        let Some(message) = message else {
            self.dropped.log_events += 1;
            self.dropped.attributes += lifted.attributes.len() as u64;
            return;
        };
        self.log_events += 1;
        let fields = lifted
            .attributes
            .into_iter()
            .map(|attribute| (attribute.key, json_value(attribute.value)));
        self.write_log(level, &message, fields, None);
    }

    /// Writes one guest log line at `level` inside the innermost open span, with the guest's
    /// `fields` (a reserved key becomes `guest.<key>`). `in_guest_span` is the guest's own span
    /// it was written in, when the guest keeps its spans itself (`wasi:otel`): its id replaces
    /// the line's `span_id`, and the OpenTelemetry log record carries it.
    pub(crate) fn write_log(
        &self,
        level: Level,
        message: &str,
        fields: impl Iterator<Item = (String, serde_json::Value)>,
        in_guest_span: Option<&SpanContext>,
    ) {
        let fields = logs::guest_fields(fields.map(|(key, value)| {
            let key = if RESERVED_LOG_KEYS.contains(&key.as_str()) {
                format!("guest.{key}")
            } else {
                key
            };
            (key, value)
        }));
        let in_guest_span_context;
        let exported = match in_guest_span {
            Some(context) => {
                in_guest_span_context = Context::new().with_remote_span_context(context.clone());
                &in_guest_span_context
            }
            None => self.innermost_context(),
        };
        let span_id = in_guest_span.map(|context| context.span_id().to_string());
        let span_id = span_id.as_deref();
        // Both as `&str`: `tracing` hands a string field to the formatters as it is, where a
        // formatted one would be formatted into a `String` of its own first.
        let guest_fields = fields.as_str();
        self.request_span.in_span(exported, || match level {
            Level::Trace => {
                tracing::trace!(target: GUEST_TARGET, message, span_id, guest_fields)
            }
            Level::Debug => {
                tracing::debug!(target: GUEST_TARGET, message, span_id, guest_fields)
            }
            Level::Info => {
                tracing::info!(target: GUEST_TARGET, message, span_id, guest_fields)
            }
            Level::Warn => {
                tracing::warn!(target: GUEST_TARGET, message, span_id, guest_fields)
            }
            Level::Error => {
                tracing::error!(target: GUEST_TARGET, message, span_id, guest_fields)
            }
        });
    }

    /// The templates a `set-route` may be labelled by, if telemetry is on and the route
    /// quota holds another: checked before the template is read.
    fn admit_route(&self) -> Option<Arc<RouteTemplates>> {
        (self.enabled && self.route_bytes < MAX_ROUTE_BYTES_PER_REQUEST)
            .then(|| Arc::clone(&self.route_templates))
    }

    /// `set-route`: labels the request with the route its guest named (`read` bytes long),
    /// on its span (and so its log lines) now if it is the first, in its metrics and span name
    /// when it is answered. `named` is the template as named, for the one WARN line a guest
    /// gets when its first route is folded.
    fn set_route(&mut self, label: Label, named: Option<String>, read: usize) {
        self.route_bytes = self.route_bytes.saturating_add(read);
        let route: Arc<str> = match label {
            Label::Template(template) => template,
            Label::Folded { first } => {
                if let Some(metrics) = &self.metrics {
                    metrics.observe_folded_route();
                }
                if first {
                    self.request_span.in_scope(|| {
                        tracing::warn!(
                            route = named.as_deref().unwrap_or_default(),
                            "the guest named a route that is not a template or one too many; \
                             this and later ones are labelled `_OTHER`"
                        );
                    });
                }
                Arc::from(routes::OTHER)
            }
        };
        if let Some(first) = self.record.name_route(route) {
            // Only the request's first route reaches its span (and so its log lines) now.
            self.request_span.record_route(&first);
        }
    }

    /// Ends every span still open, innermost first: each end then closes one span, where the
    /// other order would close the whole chain at once, recursively (10,000 nested spans
    /// overflowed the stack that way). Returns what the quotas dropped.
    fn end_all(&mut self) -> DroppedGuestTelemetry {
        while let Some(open) = self.open.pop() {
            open.end();
        }
        std::mem::take(&mut self.dropped)
    }
}

impl Drop for GuestTelemetry {
    /// The request is over: the guest's leaked spans end, and what its quotas dropped is counted
    /// and said once.
    fn drop(&mut self) {
        let dropped = self.end_all();
        if dropped == DroppedGuestTelemetry::default() {
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
                dropped_metric_points = dropped.metric_points,
                "the guest went over its telemetry quota; the rest was dropped"
            );
        });
    }
}

/// Links the `telemetry` interface: each function admits the call, lifts what it passes within
/// the allowance, and records it.
pub fn add_to_linker<T: TelemetryView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let mut instance = linker.instance("tutorial:service/telemetry@0.2.1")?;
    instance.resource(
        "span",
        ResourceType::host::<GuestSpan>(),
        |mut store, rep| {
            store.data_mut().count_call(HostInterface::Telemetry);
            let (telemetry, table) = store.data_mut().telemetry();
            telemetry.end_span(rep);
            table.delete(Resource::<GuestSpan>::new_own(rep))?;
            Ok(())
        },
    )?;
    instance.func_wrap(
        "[constructor]span",
        |mut store: StoreContextMut<'_, T>,
         (name, attributes): (WasmStr, WasmList<WireAttribute>)| {
            store.data_mut().count_call(HostInterface::Telemetry);
            let (telemetry, table) = store.data_mut().telemetry();
            let handle = table.push(GuestSpan)?;
            let Some(mut left) = telemetry.admit(Report::Span, attributes.len()) else {
                return Ok((handle,));
            };
            let name = lift::text(&InGuest::new(&name, &store), &mut left)?;
            let lifted = lift::guest_attributes(&mut store, &attributes, &mut left)?;
            let (telemetry, _) = store.data_mut().telemetry();
            telemetry.open_span(handle.rep(), name, lifted, left);
            Ok((handle,))
        },
    )?;
    instance.func_wrap(
        "[method]span.set-attribute",
        |mut store: StoreContextMut<'_, T>,
         (span, attribute): (Resource<GuestSpan>, WireAttribute)| {
            store.data_mut().count_call(HostInterface::Telemetry);
            let (telemetry, _) = store.data_mut().telemetry();
            let report = Report::Attribute { span: span.rep() };
            let Some(mut left) = telemetry.admit(report, 1) else {
                return Ok(());
            };
            let attribute = lift::guest_attribute(&store, &attribute, &mut left)?;
            let (telemetry, _) = store.data_mut().telemetry();
            telemetry.set_span_attribute(span.rep(), attribute, left);
            Ok(())
        },
    )?;
    instance.func_wrap(
        "log",
        |mut store: StoreContextMut<'_, T>,
         (level, message, attributes): (Level, WasmStr, WasmList<WireAttribute>)| {
            store.data_mut().count_call(HostInterface::Telemetry);
            let (telemetry, _) = store.data_mut().telemetry();
            let Some(mut left) = telemetry.admit(Report::LogEvent, attributes.len()) else {
                return Ok(());
            };
            let message = lift::text(&InGuest::new(&message, &store), &mut left)?;
            let lifted = lift::guest_attributes(&mut store, &attributes, &mut left)?;
            let (telemetry, _) = store.data_mut().telemetry();
            telemetry.log(level, message, lifted, left);
            Ok(())
        },
    )?;
    instance.func_wrap(
        "set-route",
        |mut store: StoreContextMut<'_, T>, (template,): (WasmStr,)| {
            store.data_mut().count_call(HostInterface::Telemetry);
            let (telemetry, _) = store.data_mut().telemetry();
            let Some(templates) = telemetry.admit_route() else {
                return Ok(());
            };
            let (label, named, read) = {
                let template = template.to_str(&store)?;
                let label = templates.label(&template);
                // The template is copied only for the one WARN line a guest gets.
                let named = matches!(label, Label::Folded { first: true }).then(|| {
                    template[..template.floor_char_boundary(routes::MAX_TEMPLATE_BYTES)].to_string()
                });
                (label, named, template.len())
            };
            let (telemetry, _) = store.data_mut().telemetry();
            telemetry.set_route(label, named, read);
            Ok(())
        },
    )?;
    Ok(())
}

/// Sets `attribute` in `attributes`, replacing one with the same key, as the WIT promises.
fn replace_attribute(attributes: &mut Vec<(String, Value)>, Attribute { key, value }: Attribute) {
    match attributes.iter_mut().find(|(existing, _)| *existing == key) {
        Some((_, existing)) => *existing = value,
        None => attributes.push((key, value)),
    }
}

/// The bytes a value counts against the quota.
fn value_bytes(value: &Value) -> usize {
    match value {
        Value::Text(text) => text.len(),
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => 8,
    }
}

/// `attribute` as an OpenTelemetry attribute.
fn key_value(Attribute { key, value }: Attribute) -> KeyValue {
    let value = match value {
        Value::Text(text) => OtelValue::from(text),
        Value::Integer(number) => OtelValue::I64(number),
        Value::Float(number) => OtelValue::F64(number),
        Value::Boolean(flag) => OtelValue::Bool(flag),
    };
    KeyValue::new(key, value)
}

/// `value` as a JSON log field.
fn json_value(value: Value) -> serde_json::Value {
    match value {
        Value::Text(text) => text.into(),
        Value::Integer(number) => number.into(),
        Value::Float(number) => number.into(),
        Value::Boolean(flag) => flag.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's telemetry, on, outside any request span.
    fn request() -> GuestTelemetry {
        GuestTelemetry::new(RequestSpan::none(), Arc::default(), Arc::default(), None)
    }

    /// What the linked constructor does, with a name that is a host string.
    fn open_span(telemetry: &mut GuestTelemetry, rep: u32, name: &str) {
        if let Some(mut left) = telemetry.admit(Report::Span, 0) {
            let name = lift::text(&name, &mut left).unwrap();
            telemetry.open_span(rep, name, Lifted::default(), left);
        }
    }

    /// What the linked `set-route` does, with a host string.
    fn set_route(telemetry: &mut GuestTelemetry, template: &str) {
        if let Some(templates) = telemetry.admit_route() {
            telemetry.set_route(templates.label(template), None, template.len());
        }
    }

    #[test]
    fn spans_past_the_quota_are_dropped_and_ten_thousand_leaked_ones_end_without_recursion() {
        let mut telemetry = request();
        for rep in 0..10_000 {
            // Each handle is leaked: the guest never drops it.
            open_span(&mut telemetry, rep, &format!("s{rep}"));
        }
        assert_eq!(telemetry.open.len(), MAX_SPANS_PER_REQUEST as usize);
        let dropped = telemetry.end_all();
        assert_eq!(dropped.spans, 10_000 - u64::from(MAX_SPANS_PER_REQUEST));
        assert!(telemetry.open.is_empty());
    }

    #[test]
    fn past_the_byte_quota_a_call_is_dropped_before_anything_it_passes_is_read() {
        let mut telemetry = request();
        telemetry.allowance.bytes = 0;
        assert_eq!(telemetry.admit(Report::LogEvent, 3), None);
        assert_eq!(telemetry.admit(Report::Span, 2), None);
        let dropped = telemetry.end_all();
        assert_eq!(
            (dropped.log_events, dropped.spans, dropped.attributes),
            (1, 1, 5)
        );
    }

    #[test]
    fn an_attribute_for_a_span_that_is_not_open_is_dropped() {
        let mut telemetry = request();
        open_span(&mut telemetry, 1, "open");
        assert!(telemetry.admit(Report::Attribute { span: 1 }, 1).is_some());
        assert_eq!(telemetry.admit(Report::Attribute { span: 2 }, 1), None);
        assert_eq!(telemetry.end_all().attributes, 1);
    }

    #[test]
    fn a_named_route_labels_the_request_and_what_is_not_a_template_is_other() {
        let mut telemetry = request();
        set_route(&mut telemetry, "/api/orders/{id}");
        assert_eq!(&*telemetry.record.route().0, "/api/orders/{id}");
        set_route(&mut telemetry, "not a template");
        assert_eq!(&*telemetry.record.route().0, routes::OTHER);
    }

    #[test]
    fn the_hosts_own_probe_records_no_route_and_no_span() {
        let mut telemetry = GuestTelemetry::off();
        set_route(&mut telemetry, "/api/health");
        assert_eq!(&*telemetry.record.route().0, routes::UNMATCHED);
        open_span(&mut telemetry, 1, "probe");
        assert!(telemetry.open.is_empty());
        assert_eq!(telemetry.end_all(), DroppedGuestTelemetry::default());
    }

    #[test]
    fn routes_past_the_route_quota_are_not_read() {
        let mut telemetry = request();
        telemetry.route_bytes = MAX_ROUTE_BYTES_PER_REQUEST;
        assert!(telemetry.admit_route().is_none());
    }

    fn text(key: &str, value: &str) -> Attribute {
        Attribute {
            key: key.to_string(),
            value: Value::Text(value.to_string()),
        }
    }

    #[test]
    fn a_later_attribute_replaces_an_earlier_one_with_the_same_key() {
        let mut attributes = Vec::new();
        replace_attribute(&mut attributes, text("a", "1"));
        replace_attribute(&mut attributes, text("b", "2"));
        replace_attribute(&mut attributes, text("a", "3"));
        assert_eq!(attributes.len(), 2);
        assert!(matches!(&attributes[0], (key, Value::Text(value)) if key == "a" && value == "3"));
    }

    #[test]
    fn one_span_carries_at_most_its_byte_budget() {
        let mut open = OpenSpan {
            rep: 1,
            span: Context::new(),
            attributes: Vec::new(),
            bytes: 0,
        };
        let value = "v".repeat(lift::MAX_VALUE_BYTES - 3);
        let set = (0..10)
            .filter(|i| open.set(text(&format!("k{i:02}"), &value)))
            .count();
        assert_eq!(set, MAX_BYTES_PER_SPAN / lift::MAX_VALUE_BYTES);
        assert!(open.bytes <= MAX_BYTES_PER_SPAN);
    }
}
