//! JSON log lines: one object per event with `timestamp`, `level` (upper case), `message`,
//! `target`, the fields of every span the event happened in (so, inside a request, its
//! `request_id`, `trace_id`, `span_id`, method, route and status), and the event's own fields.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event field that carries a guest's log attributes, as one JSON object: the guest names its
/// fields at run time, and `tracing` field names are fixed at compile time. Its keys are merged
/// into the line.
pub const GUEST_FIELDS: &str = "guest_fields";

/// The [`GUEST_FIELDS`] value for a guest's attributes.
pub fn guest_fields(attributes: impl IntoIterator<Item = (String, Value)>) -> String {
    Value::Object(attributes.into_iter().collect()).to_string()
}

/// Formats each event as one JSON object on one line. Span fields are read as the JSON the
/// layer's `JsonFields` stored for them; `otel.*` fields steer the exporter and are left out.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(
                        fields
                            .into_iter()
                            .filter(|(key, _)| !key.starts_with("otel.")),
                    );
                }
            }
        }
        event.record(&mut EventFields(&mut line));
        line.insert("target".into(), event.metadata().target().into());
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Copies an event's fields into the line, merging [`GUEST_FIELDS`].
struct EventFields<'a>(&'a mut Map<String, Value>);

impl Visit for EventFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == GUEST_FIELDS
            && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&text)
        {
            self.0.extend(fields);
            return;
        }
        self.0.insert(field.name().into(), text.into());
    }
}
