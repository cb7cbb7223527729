//! JSON log lines: one object per event with `timestamp`, `level` (upper case), `message`,
//! `target`, the fields of every span the event happened in (so, inside a request, its
//! `request_id`, `trace_id`, `span_id`, method, route and status), and the event's own fields.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{JsonVisitor, Writer};
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

/// Stores a span's fields as JSON objects, one for the fields it was created with and one more
/// for each later `record`, separated by a space, for [`JsonLines`] to read.
///
/// `tracing_subscriber`'s `JsonFields` keeps a single object, so every `record` parses it and
/// writes it anew: with four records per request span (trace and span ids, status) that was
/// about 9 % of the host's CPU under load. Appending costs only the new fields.
pub struct JsonFieldSets;

impl<'writer> FormatFields<'writer> for JsonFieldSets {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = JsonVisitor::new(&mut writer);
        fields.record(&mut visitor);
        visitor.finish()
    }
}

/// Formats each event as one JSON object on one line. Span fields are read from the objects
/// [`JsonFieldSets`] stored for them, later ones winning; `otel.*` fields steer the exporter and
/// are left out.
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
                let field_sets = serde_json::Deserializer::from_str(fields)
                    .into_iter::<Map<String, Value>>()
                    .map_while(Result::ok);
                for field_set in field_sets {
                    line.extend(
                        field_set
                            .into_iter()
                            .filter(|(key, _)| !key.starts_with("otel.")),
                    );
                }
            }
        }
        let mut fields = EventFields {
            line: &mut line,
            library_target: None,
        };
        event.record(&mut fields);
        let target = fields
            .library_target
            .take()
            .unwrap_or_else(|| event.metadata().target().to_string());
        line.insert("target".into(), target.into());
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Copies an event's fields into the line, merging [`GUEST_FIELDS`].
///
/// A library's line that came through the `log` crate carries `log.target`, `log.module_path`,
/// `log.file` and `log.line`: the last two point into the build machine's cargo registry. Its
/// target becomes the line's `target`, and the rest is left out.
struct EventFields<'a> {
    line: &'a mut Map<String, Value>,
    library_target: Option<String>,
}

impl EventFields<'_> {
    fn insert(&mut self, field: &Field, value: Value) {
        match field.name() {
            "log.target" => self.library_target = value.as_str().map(str::to_string),
            name if name.starts_with("log.") => {}
            name => {
                self.line.insert(name.into(), value);
            }
        }
    }
}

impl Visit for EventFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == GUEST_FIELDS
            && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&text)
        {
            // The guest never replaces a field the host put on the line (`http.route`, the
            // request's ids...): a clashing one is kept beside it as `guest.<name>`.
            for (key, value) in fields {
                let key = if self.line.contains_key(&key) {
                    format!("guest.{key}")
                } else {
                    key
                };
                self.line.insert(key, value);
            }
            return;
        }
        self.insert(field, text.into());
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing::field::Empty;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// An `io::Write` into a buffer the test reads afterwards.
    #[derive(Clone, Default)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for SharedBuffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The lines `run` logs through a layer set up as the host sets up its own.
    fn lines_logged_by(run: impl FnOnce()) -> Vec<Map<String, Value>> {
        let buffer = SharedBuffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .fmt_fields(JsonFieldSets)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, run);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
            .collect()
    }

    #[test]
    fn a_line_carries_its_spans_fields_with_the_latest_value_of_each() {
        let lines = lines_logged_by(|| {
            let span = tracing::info_span!(
                "request",
                otel.name = "HTTP GET /x",
                request_id = "id-1",
                status = Empty,
                trace_id = Empty,
            );
            span.record("trace_id", "abc");
            span.record("status", 200);
            span.record("status", 503);
            let _entered = span.enter();
            tracing::warn!(detail = "late", "it failed");
        });
        assert_eq!(lines.len(), 1);
        let line = &lines[0];
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["trace_id"], "abc");
        assert_eq!(line["status"], 503);
        assert_eq!(line["detail"], "late");
        assert_eq!(line["message"], "it failed");
        assert_eq!(line["level"], "WARN");
        assert!(line.contains_key("timestamp") && line.contains_key("target"));
        assert!(!line.contains_key("otel.name"), "{line:?}");
    }

    #[test]
    fn a_librarys_line_names_its_target_and_no_build_paths() {
        let lines = lines_logged_by(|| {
            tracing::info!(
                log.target = "tokio_postgres::connection",
                log.module_path = "tokio_postgres::connection",
                log.file = "/root/.cargo/registry/src/tokio-postgres-0.7/src/connection.rs",
                log.line = 12,
                "NOTICE: relation already exists, skipping"
            );
        });
        let line = &lines[0];
        assert_eq!(line["target"], "tokio_postgres::connection");
        assert!(line.keys().all(|key| !key.starts_with("log.")), "{line:?}");
    }

    #[test]
    fn an_inner_span_overrides_an_outer_spans_field_of_the_same_name() {
        let lines = lines_logged_by(|| {
            let outer = tracing::info_span!("outer", user = "outer", route = "/a");
            let _outer = outer.enter();
            let inner = tracing::info_span!("inner", user = Empty);
            inner.record("user", "inner");
            let _inner = inner.enter();
            tracing::info!("inside");
        });
        assert_eq!(lines[0]["user"], "inner");
        assert_eq!(lines[0]["route"], "/a");
    }
}
