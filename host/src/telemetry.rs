//! The `telemetry` WIT interface: the guest's spans and log events become `tracing` spans and
//! events inside the request's server span, so they are exported and logged with its ids.

use opentelemetry::{KeyValue, Value as OtelValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, Linker, Resource, ResourceType, WasmList, WasmStr};

use std::sync::Arc;

use crate::bindings::telemetry::{Attribute, Host, HostSpan, Level, Value};
use crate::request_state::RequestState;
use crate::routes::{self, Label, MAX_TEMPLATE_BYTES};

/// The `target` of every log event and span the guest reports.
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
/// spans. Longer names and text values are cut to [`MAX_VALUE_BYTES`].
pub const MAX_BYTES_PER_SPAN: usize = 16 * 1024;
/// Bytes of route templates one request's guest may name; later `set-route` calls are not read
/// (the last route read stands). Far above what any handler names (100,000 short names fit).
pub const MAX_ROUTE_BYTES_PER_REQUEST: usize = 1024 * 1024;
/// The longest span name, attribute key, text value or log message kept; longer ones are cut.
pub const MAX_VALUE_BYTES: usize = 4 * 1024;
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

/// A span the guest opened; it ends when the guest drops its handle. The host keeps the span
/// itself (in [`GuestTelemetry`]), so the resource table never holds one.
pub struct GuestSpan;

/// One request's guest telemetry: its open spans and what is left of its quotas.
#[derive(Default)]
pub struct GuestTelemetry {
    /// Open spans, innermost last.
    open: Vec<OpenSpan>,
    spans: u32,
    attributes: u32,
    log_events: u32,
    bytes: usize,
    /// Bytes of the route templates read so far, against [`MAX_ROUTE_BYTES_PER_REQUEST`].
    route_bytes: usize,
    dropped: Dropped,
}

/// What went over a quota in one request.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Spans not opened.
    pub spans: u64,
    /// Attributes not recorded.
    pub attributes: u64,
    /// Log events not written.
    pub log_events: u64,
}

struct OpenSpan {
    rep: u32,
    span: tracing::Span,
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
}

impl OpenSpan {
    /// Ends the span with its attributes.
    fn end(self) {
        for (key, value) in self.attributes {
            set_attribute(&self.span, Attribute { key, value });
        }
    }
}

impl GuestTelemetry {
    /// Whether a new span may still be opened: checked before its name is read.
    fn may_open_span(&self) -> bool {
        self.spans < MAX_SPANS_PER_REQUEST && self.bytes < MAX_BYTES_PER_REQUEST
    }

    /// Whether a new log event may still be written: checked before its message is read.
    fn may_log(&self) -> bool {
        self.log_events < MAX_LOG_EVENTS_PER_REQUEST && self.bytes < MAX_BYTES_PER_REQUEST
    }

    /// Whether an attribute may still be set on the span `rep`: checked before it is read.
    fn may_set_attribute(&self, rep: u32) -> bool {
        self.attributes < MAX_ATTRIBUTES_PER_REQUEST
            && self.bytes < MAX_BYTES_PER_REQUEST
            && self.open.iter().any(|open| open.rep == rep)
    }

    /// Whether another route template may still be read.
    fn may_name_route(&self) -> bool {
        self.route_bytes < MAX_ROUTE_BYTES_PER_REQUEST
    }

    /// Takes `bytes` from the byte quota, if that much is left.
    fn take_bytes(&mut self, bytes: usize) -> bool {
        let fits = self.bytes + bytes <= MAX_BYTES_PER_REQUEST;
        if fits {
            self.bytes += bytes;
        }
        fits
    }

    /// The attributes the quotas let through; the rest are counted as dropped.
    fn admit(&mut self, attributes: Vec<Attribute>) -> Vec<Attribute> {
        let mut admitted = Vec::new();
        for attribute in attributes {
            let attribute = cut_attribute(attribute);
            let size = attribute.key.len() + value_bytes(&attribute.value);
            if self.attributes < MAX_ATTRIBUTES_PER_REQUEST && self.take_bytes(size) {
                self.attributes += 1;
                admitted.push(attribute);
            } else {
                self.dropped.attributes += 1;
            }
        }
        admitted
    }

    /// Ends every span still open, innermost first: each end then closes one span, where the
    /// other order would close the whole chain at once, recursively (10,000 nested spans
    /// overflowed the stack that way).
    pub fn end_all(&mut self) -> Dropped {
        while let Some(open) = self.open.pop() {
            open.end();
        }
        std::mem::take(&mut self.dropped)
    }
}

impl RequestState {
    /// The innermost span of this request that is still open.
    pub(crate) fn innermost_span(&self) -> &tracing::Span {
        self.guest_telemetry
            .open
            .last()
            .map_or(&self.request_span, |open| &open.span)
    }
}

impl HostSpan for RequestState {
    fn new(
        &mut self,
        name: String,
        attributes: Vec<Attribute>,
    ) -> wasmtime::Result<Resource<GuestSpan>> {
        let handle = self.table.push(GuestSpan)?;
        if !self.telemetry_enabled {
            return Ok(handle);
        }
        let name = cut(name, MAX_VALUE_BYTES);
        let telemetry = &mut self.guest_telemetry;
        if telemetry.spans >= MAX_SPANS_PER_REQUEST || !telemetry.take_bytes(name.len()) {
            telemetry.dropped.spans += 1;
            telemetry.dropped.attributes += attributes.len() as u64;
            return Ok(handle);
        }
        telemetry.spans += 1;
        let admitted = telemetry.admit(attributes);
        let span = tracing::info_span!(
            target: GUEST_TARGET,
            parent: self.innermost_span(),
            "guest span",
            otel.name = name,
        );
        let mut open = OpenSpan {
            rep: handle.rep(),
            span,
            attributes: Vec::new(),
            bytes: name.len(),
        };
        let mut refused = 0;
        for attribute in admitted {
            if !open.set(attribute) {
                refused += 1;
            }
        }
        self.guest_telemetry.dropped.attributes += refused;
        self.guest_telemetry.open.push(open);
        Ok(handle)
    }

    fn set_attribute(
        &mut self,
        handle: Resource<GuestSpan>,
        attribute: Attribute,
    ) -> wasmtime::Result<()> {
        if !self.telemetry_enabled {
            return Ok(());
        }
        let telemetry = &mut self.guest_telemetry;
        if !telemetry.open.iter().any(|open| open.rep == handle.rep()) {
            // A span that went over the quota: its attributes are dropped with it.
            telemetry.dropped.attributes += 1;
            return Ok(());
        }
        if let Some(attribute) = telemetry.admit(vec![attribute]).pop()
            && let Some(open) = telemetry
                .open
                .iter_mut()
                .find(|open| open.rep == handle.rep())
            && !open.set(attribute)
        {
            telemetry.dropped.attributes += 1;
        }
        Ok(())
    }

    fn drop(&mut self, handle: Resource<GuestSpan>) -> wasmtime::Result<()> {
        let open = &mut self.guest_telemetry.open;
        if let Some(position) = open.iter().position(|open| open.rep == handle.rep()) {
            open.remove(position).end();
        }
        self.table.delete(handle)?;
        Ok(())
    }
}

impl Host for RequestState {
    fn set_route(&mut self, template: String) -> wasmtime::Result<()> {
        if self.telemetry_enabled {
            let label = self.route_templates.label(&template);
            set_route(self, label, cut_str(&template, MAX_TEMPLATE_BYTES));
        }
        Ok(())
    }

    fn log(
        &mut self,
        level: Level,
        message: String,
        attributes: Vec<Attribute>,
    ) -> wasmtime::Result<()> {
        if !self.telemetry_enabled {
            return Ok(());
        }
        let message = cut(message, MAX_VALUE_BYTES);
        let telemetry = &mut self.guest_telemetry;
        if telemetry.log_events >= MAX_LOG_EVENTS_PER_REQUEST
            || !telemetry.take_bytes(message.len())
        {
            telemetry.dropped.log_events += 1;
            telemetry.dropped.attributes += attributes.len() as u64;
            return Ok(());
        }
        telemetry.log_events += 1;
        let admitted = telemetry.admit(attributes);
        let fields = crate::logs::guest_fields(admitted.into_iter().map(|attribute| {
            let key = if RESERVED_LOG_KEYS.contains(&attribute.key.as_str()) {
                format!("guest.{}", attribute.key)
            } else {
                attribute.key
            };
            (key, json_value(attribute.value))
        }));
        let _inside = self.innermost_span().enter();
        match level {
            Level::Trace => {
                tracing::trace!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
        }
        Ok(())
    }
}

/// Links the `telemetry` interface by hand, rather than through `bindgen!`'s `add_to_linker`:
/// generated bindings copy every string and list a guest passes into host memory before any code
/// of ours runs (a list of attributes all naming one 64 MiB string would cost gigabytes). Here
/// they stay in guest memory and are read one by one, only while the request's quotas last.
pub fn add_to_linker(linker: &mut Linker<RequestState>) -> wasmtime::Result<()> {
    let mut instance = linker.instance("tutorial:service/telemetry@0.2.1")?;
    instance.resource(
        "span",
        ResourceType::host::<GuestSpan>(),
        |mut store, rep| HostSpan::drop(store.data_mut(), Resource::new_own(rep)),
    )?;
    instance.func_wrap(
        "[constructor]span",
        |mut store, (name, attributes): (WasmStr, WasmList<RawAttribute>)| {
            if !store.data().telemetry_enabled {
                return Ok((store.data_mut().table.push(GuestSpan)?,));
            }
            let admitted = store.data().guest_telemetry.may_open_span();
            let name = if admitted {
                lift_text(&mut store, &name)?
            } else {
                None
            };
            let Some(name) = name else {
                let state = store.data_mut();
                state.guest_telemetry.dropped.spans += 1;
                state.guest_telemetry.dropped.attributes += attributes.len() as u64;
                return Ok((state.table.push(GuestSpan)?,));
            };
            let attributes = lift_attributes(&mut store, &attributes)?;
            Ok((HostSpan::new(store.data_mut(), name, attributes)?,))
        },
    )?;
    instance.func_wrap(
        "[method]span.set-attribute",
        |mut store, (span, attribute): (Resource<GuestSpan>, RawAttribute)| {
            if !store.data().telemetry_enabled {
                return Ok(());
            }
            let admitted = store.data().guest_telemetry.may_set_attribute(span.rep());
            let attribute = if admitted {
                lift_attribute(&mut store, attribute)?
            } else {
                None
            };
            match attribute {
                Some(attribute) => HostSpan::set_attribute(store.data_mut(), span, attribute)?,
                None => store.data_mut().guest_telemetry.dropped.attributes += 1,
            }
            Ok(())
        },
    )?;
    instance.func_wrap(
        "log",
        |mut store, (level, message, attributes): (Level, WasmStr, WasmList<RawAttribute>)| {
            if !store.data().telemetry_enabled {
                return Ok(());
            }
            let message = if store.data().guest_telemetry.may_log() {
                lift_text(&mut store, &message)?
            } else {
                None
            };
            let Some(message) = message else {
                let telemetry = &mut store.data_mut().guest_telemetry;
                telemetry.dropped.log_events += 1;
                telemetry.dropped.attributes += attributes.len() as u64;
                return Ok(());
            };
            let attributes = lift_attributes(&mut store, &attributes)?;
            Host::log(store.data_mut(), level, message, attributes)
        },
    )?;
    instance.func_wrap("set-route", |mut store, (template,): (WasmStr,)| {
        if !store.data().telemetry_enabled || !store.data().guest_telemetry.may_name_route() {
            return Ok(());
        }
        let (label, first_folded, read) = {
            let template = template.to_str(&store)?;
            let label = store.data().route_templates.label(&template);
            // The template is copied only for the one WARN line a guest gets.
            let first_folded = matches!(label, Label::Folded { first: true })
                .then(|| cut_str(&template, MAX_TEMPLATE_BYTES).to_string());
            (label, first_folded, template.len())
        };
        let telemetry = &mut store.data_mut().guest_telemetry;
        telemetry.route_bytes = telemetry.route_bytes.saturating_add(read);
        set_route(
            store.data_mut(),
            label,
            first_folded.as_deref().unwrap_or_default(),
        );
        Ok(())
    })?;
    Ok(())
}

/// Labels the request with the route its guest named: on its span (and so its log lines) now
/// if it is the first, in its metrics and span name when it is answered.
fn set_route(state: &mut RequestState, label: Label, named: &str) {
    let route: Arc<str> = match label {
        Label::Template(template) => template,
        Label::Folded { first } => {
            if let Some(metrics) = &state.metrics {
                metrics.observe_folded_route();
            }
            if first {
                state.request_span.in_scope(|| {
                    tracing::warn!(
                        route = named,
                        "the guest named a route that is not a template or one too many; \
                         this and later ones are labelled `_OTHER`"
                    );
                });
            }
            Arc::from(routes::OTHER)
        }
    };
    if let Some(first) = state.matched_route.set(route) {
        // Only the request's first route reaches its span (and so its log lines) now.
        state.request_span.record("http.route", &*first);
    }
}

/// An attribute as the guest passed it, its strings still in guest memory.
#[derive(ComponentType, Lift)]
#[component(record)]
struct RawAttribute {
    key: WasmStr,
    value: RawValue,
}

/// A value as the guest passed it.
#[derive(ComponentType, Lift)]
#[component(variant)]
enum RawValue {
    #[component(name = "text")]
    Text(WasmStr),
    #[component(name = "integer")]
    Integer(i64),
    #[component(name = "float")]
    Float(f64),
    #[component(name = "boolean")]
    Boolean(bool),
}

/// The guest's string, cut to [`MAX_VALUE_BYTES`], if the request's byte quota still holds all
/// of it; `None` (and the quota spent) otherwise. Past the quota, nothing is read at all.
fn lift_text(
    store: &mut StoreContextMut<'_, RequestState>,
    text: &WasmStr,
) -> wasmtime::Result<Option<String>> {
    let spent = store.data().guest_telemetry.bytes;
    let remaining = MAX_BYTES_PER_REQUEST.saturating_sub(spent);
    if remaining == 0 {
        return Ok(None);
    }
    let lifted = {
        let text = text.to_str(&*store)?;
        (text.len() <= remaining).then(|| cut_str(&text, MAX_VALUE_BYTES).to_string())
    };
    if lifted.is_none() {
        store.data_mut().guest_telemetry.bytes = MAX_BYTES_PER_REQUEST;
    }
    Ok(lifted)
}

/// The guest's attribute, if its strings fit the quota.
fn lift_attribute(
    store: &mut StoreContextMut<'_, RequestState>,
    RawAttribute { key, value }: RawAttribute,
) -> wasmtime::Result<Option<Attribute>> {
    let Some(key) = lift_text(store, &key)? else {
        return Ok(None);
    };
    let value = match value {
        RawValue::Text(text) => match lift_text(store, &text)? {
            Some(text) => Value::Text(text),
            None => return Ok(None),
        },
        RawValue::Integer(number) => Value::Integer(number),
        RawValue::Float(number) => Value::Float(number),
        RawValue::Boolean(flag) => Value::Boolean(flag),
    };
    Ok(Some(Attribute { key, value }))
}

/// As many of the guest's attributes as the quotas allow, read one by one; the rest are counted
/// as dropped without being read.
fn lift_attributes(
    store: &mut StoreContextMut<'_, RequestState>,
    attributes: &WasmList<RawAttribute>,
) -> wasmtime::Result<Vec<Attribute>> {
    let used = store.data().guest_telemetry.attributes;
    let allowed = MAX_ATTRIBUTES_PER_REQUEST.saturating_sub(used) as usize;
    let mut lifted = Vec::new();
    for index in 0..attributes.len().min(allowed) {
        let Some(raw) = attributes.get(&mut *store, index) else {
            break;
        };
        match lift_attribute(store, raw?)? {
            Some(attribute) => lifted.push(attribute),
            None => break,
        }
    }
    let not_read = attributes.len() - lifted.len();
    store.data_mut().guest_telemetry.dropped.attributes += not_read as u64;
    Ok(lifted)
}

/// Sets `attribute` in `attributes`, replacing one with the same key, as the WIT promises.
fn replace_attribute(attributes: &mut Vec<(String, Value)>, Attribute { key, value }: Attribute) {
    match attributes.iter_mut().find(|(existing, _)| *existing == key) {
        Some((_, existing)) => *existing = value,
        None => attributes.push((key, value)),
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    let end = cut_str(&text, max).len();
    text.truncate(end);
    text
}

/// `text`'s longest prefix of at most `max` bytes that ends at a character boundary.
fn cut_str(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The attribute with its key and text value cut to [`MAX_VALUE_BYTES`].
fn cut_attribute(Attribute { key, value }: Attribute) -> Attribute {
    let value = match value {
        Value::Text(text) => Value::Text(cut(text, MAX_VALUE_BYTES)),
        other => other,
    };
    Attribute {
        key: cut(key, MAX_VALUE_BYTES),
        value,
    }
}

/// The bytes a value counts against the quota.
fn value_bytes(value: &Value) -> usize {
    match value {
        Value::Text(text) => text.len(),
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => 8,
    }
}

fn set_attribute(span: &tracing::Span, Attribute { key, value }: Attribute) {
    let value = match value {
        Value::Text(text) => OtelValue::from(text),
        Value::Integer(number) => OtelValue::I64(number),
        Value::Float(number) => OtelValue::F64(number),
        Value::Boolean(flag) => OtelValue::Bool(flag),
    };
    let KeyValue { key, value } = KeyValue::new(key, value);
    span.set_attribute(key, value);
}

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
    use crate::user_store::UserStore;

    /// A request's state with telemetry on, outside any request span.
    fn request() -> RequestState {
        RequestState::new(
            Arc::new(UserStore::memory(0)),
            None,
            tracing::Span::none(),
            Arc::default(),
        )
    }

    #[test]
    fn spans_past_the_quota_are_dropped_and_ten_thousand_leaked_ones_end_without_recursion() {
        let mut state = request();
        for i in 0..10_000 {
            // Each handle is leaked: the guest never drops it.
            HostSpan::new(&mut state, format!("s{i}"), Vec::new()).unwrap();
        }
        assert_eq!(
            state.guest_telemetry.open.len(),
            MAX_SPANS_PER_REQUEST as usize
        );
        let dropped = state.guest_telemetry.end_all();
        assert_eq!(dropped.spans, 10_000 - u64::from(MAX_SPANS_PER_REQUEST));
        assert!(state.guest_telemetry.open.is_empty());
    }

    #[test]
    fn a_named_route_labels_the_request_and_what_is_not_a_template_is_other() {
        let mut state = request();
        Host::set_route(&mut state, "/api/orders/{id}".to_string()).unwrap();
        assert_eq!(&*state.matched_route.answer().0, "/api/orders/{id}");
        Host::set_route(&mut state, "not a template".to_string()).unwrap();
        assert_eq!(&*state.matched_route.answer().0, routes::OTHER);
    }

    #[test]
    fn the_hosts_own_probe_records_no_route() {
        let mut state = RequestState::quiet(Arc::new(UserStore::memory(0)));
        Host::set_route(&mut state, "/api/health".to_string()).unwrap();
        assert_eq!(&*state.matched_route.answer().0, routes::UNMATCHED);
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
    fn attributes_past_the_count_or_byte_quota_are_dropped_and_counted() {
        let mut telemetry = GuestTelemetry::default();
        let many = (0..MAX_ATTRIBUTES_PER_REQUEST + 10)
            .map(|i| text(&format!("k{i}"), "v"))
            .collect();
        assert_eq!(
            telemetry.admit(many).len(),
            MAX_ATTRIBUTES_PER_REQUEST as usize
        );
        assert_eq!(telemetry.end_all().attributes, 10);

        let mut telemetry = GuestTelemetry::default();
        let large = "x".repeat(MAX_VALUE_BYTES);
        let many_large = (0..100).map(|i| text(&format!("{i:03}"), &large)).collect();
        let admitted = telemetry.admit(many_large).len();
        assert_eq!(admitted, MAX_BYTES_PER_REQUEST / (MAX_VALUE_BYTES + 3));
        assert_eq!(telemetry.end_all().attributes, 100 - admitted as u64);
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_VALUE_BYTES);
        let Attribute { key, value } = cut_attribute(text(&long, &long));
        assert_eq!(key.len(), MAX_VALUE_BYTES);
        assert!(matches!(value, Value::Text(value) if value.len() == MAX_VALUE_BYTES));
    }

    #[test]
    fn one_span_carries_at_most_its_byte_budget() {
        let mut open = OpenSpan {
            rep: 1,
            span: tracing::Span::none(),
            attributes: Vec::new(),
            bytes: 0,
        };
        let value = "v".repeat(MAX_VALUE_BYTES - 3);
        let set = (0..10)
            .filter(|i| open.set(text(&format!("k{i:02}"), &value)))
            .count();
        assert_eq!(set, MAX_BYTES_PER_SPAN / MAX_VALUE_BYTES);
        assert!(open.bytes <= MAX_BYTES_PER_SPAN);
    }
}
