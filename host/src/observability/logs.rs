//! JSON log lines: one object per event with `timestamp`, `level` (upper case), `message`,
//! `target`, inside a request its fields (`request_id`, `trace_id`, `span_id`, method, route,
//! status: [`request_span`]), the fields of every span the event happened in, and the event's
//! own fields.
//!
//! A line is written straight from JSON text: each span keeps its fields rendered once, as they
//! are recorded ([`JsonMembers`]), and the line copies them, so nothing is parsed back or built
//! as a tree for every event; a guest's fields join it as the JSON text of each value. Keys come
//! in the order they were first set, each once: the host's, then the guest's, sorted
//! (bench/PROFILE.md, sections 8, 10 and 17).

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;
use serde_json::value::RawValue;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::observability::request_report::{self, REQUEST_FIELD_NAMES};

/// The event field that carries a guest's log attributes, as one JSON object: the guest names its
/// fields at run time, and `tracing` field names are fixed at compile time. Its keys are merged
/// into the line.
pub const GUEST_FIELDS: &str = "guest_fields";

/// The [`GUEST_FIELDS`] value for a guest's attributes: one JSON object, its keys sorted and
/// each once (of a key given twice, the last value), written as text without a map in between.
/// It is also the attribute of that name on an OpenTelemetry log record.
pub fn guest_fields(attributes: impl IntoIterator<Item = (String, Value)>) -> String {
    let attributes = each_key_once(attributes.into_iter().collect());
    let mut text = Vec::with_capacity(128);
    text.push(b'{');
    for (index, (key, value)) in attributes.iter().enumerate() {
        if index > 0 {
            text.push(b',');
        }
        serde_json::to_writer(&mut text, key).expect("a string always serializes");
        text.push(b':');
        serde_json::to_writer(&mut text, value).expect("a JSON value always serializes");
    }
    text.push(b'}');
    String::from_utf8(text).expect("serde_json writes UTF-8")
}

/// Stores a span's fields as JSON members, `"name":value`, one per line, in the order they were
/// recorded: a later `record` of a field appends a member that replaces the earlier one when a
/// line is written.
///
/// `tracing_subscriber`'s `JsonFields` parses and rewrites its one object at every `record`
/// (bench/PROFILE.md, section 5); JSON text never holds a raw line break, so a line is always one
/// whole member.
pub struct JsonMembers;

impl<'writer> FormatFields<'writer> for JsonMembers {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut members = MemberWriter {
            writer,
            result: Ok(()),
        };
        fields.record(&mut members);
        members.result
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        self.format_fields(current.as_writer(), fields)
    }
}

/// Writes each field it visits as one `"name":value` line.
struct MemberWriter<'writer> {
    writer: Writer<'writer>,
    result: fmt::Result,
}

impl MemberWriter<'_> {
    fn member(&mut self, field: &Field, value: impl fmt::Display) {
        // Field names are fixed in the code, dotted identifiers: one that would need escaping
        // (none does) is left out rather than break the member it starts.
        if self.result.is_ok() && !needs_escaping(field.name()) {
            self.result = writeln!(self.writer, "\"{}\":{value}", field.name());
        }
    }
}

impl Visit for MemberWriter<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, json_string(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.member(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, json_string(&format!("{value:?}")));
    }
}

/// Whether `text` holds a character a JSON string must escape.
fn needs_escaping(text: &str) -> bool {
    text.bytes()
        .any(|byte| byte < b' ' || byte == b'"' || byte == b'\\')
}

/// `text` as a JSON string, quoted and escaped.
fn json_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// Formats each event as one JSON object on one line, its keys in order. Span fields come
/// from the members [`JsonMembers`] stored for them, later ones winning; `otel.*` fields steer
/// the exporter and are left out.
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
        // The members of the line borrow the spans' stored text and the guest's fields (the
        // request's own are written out as JSON here, most requests writing no line): the
        // spans, the guards of their extensions and that text live until the line is written.
        let request = request_report::current_fields();
        let request_members = request.as_ref().map(|request| request.members());
        let spans: Vec<_> = ctx
            .event_scope()
            .map(|scope| scope.from_root().collect())
            .unwrap_or_default();
        let extensions: Vec<_> = spans.iter().map(|span| span.extensions()).collect();
        let mut line = Line::default();
        line.set("timestamp", timestamp());
        line.set("level", level_json(event.metadata().level()));
        // A request holds each of its names once, and none of them is the line's own.
        line.members.extend(
            request_members
                .iter()
                .flat_map(|members| members.iter())
                .map(|(name, value)| (Cow::Borrowed(*name), Cow::Owned(value.to_json()))),
        );
        for fields in extensions
            .iter()
            .filter_map(|extensions| extensions.get::<FormattedFields<N>>())
        {
            for (name, value) in fields.lines().filter_map(member) {
                if !name.starts_with("otel.") {
                    line.set(name, value);
                }
            }
        }
        let mut fields = EventFields {
            line: &mut line,
            library_target: None,
            guest_fields: None,
        };
        event.record(&mut fields);
        let EventFields {
            library_target,
            guest_fields,
            ..
        } = fields;
        let target = library_target
            .as_deref()
            .unwrap_or_else(|| event.metadata().target());
        line.set("target", json_string(target));
        if let Some(text) = &guest_fields {
            let declared = |key: &str| {
                event.metadata().fields().field(key).is_some()
                    || (request.is_some() && REQUEST_FIELD_NAMES.contains(&key))
                    || spans.iter().any(|span| span.fields().field(key).is_some())
            };
            line.add_guest_fields(text, declared);
        }
        line.write(&mut writer)
    }
}

/// The name and the JSON value of one member line stored by [`JsonMembers`].
fn member(line: &str) -> Option<(&str, &str)> {
    // The name holds no quote (see `MemberWriter::member`): the first one closes it.
    let (name, value) = line.strip_prefix('"')?.split_once('"')?;
    Some((name, value.strip_prefix(':')?))
}

/// A level as the line's JSON value, upper case.
fn level_json(level: &tracing::Level) -> &'static str {
    match *level {
        tracing::Level::TRACE => "\"TRACE\"",
        tracing::Level::DEBUG => "\"DEBUG\"",
        tracing::Level::INFO => "\"INFO\"",
        tracing::Level::WARN => "\"WARN\"",
        tracing::Level::ERROR => "\"ERROR\"",
    }
}

/// A line being put together: its members as set, each key's JSON value as text, each key
/// once, in the order it was first set. A later value of a key replaces the earlier one where it
/// stands: the host sets a line's dozen or so members this way, one search among them each. A
/// guest's fields, up to the request's 1,024 attributes, join the line already unique and apart
/// from the host's, so no key is searched for among them.
struct Line<'a> {
    members: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl Default for Line<'_> {
    fn default() -> Self {
        // Room for a request line's members (about twenty) without growing.
        Line {
            members: Vec::with_capacity(32),
        }
    }
}

impl<'a> Line<'a> {
    /// Sets `key` to the JSON text `value`, replacing an earlier value of the same key.
    fn set(&mut self, key: impl Into<Cow<'a, str>>, value: impl Into<Cow<'a, str>>) {
        let key = key.into();
        let value = value.into();
        match self.members.iter_mut().find(|(set, _)| *set == key) {
            Some((_, earlier)) => *earlier = value,
            None => self.members.push((key, value)),
        }
    }

    /// Adds the members of a guest's [`GUEST_FIELDS`] object, after every member of the host.
    /// The guest never writes a field of the host (`http.route`, the request's ids...), whether
    /// the line holds it yet or its span only declares it (`declared`): a clashing key is kept
    /// beside it as `guest.<name>`. Text that is not such an object is kept as one string.
    fn add_guest_fields(&mut self, text: &'a str, declared: impl Fn(&str) -> bool) {
        // Each value stays the text it was in the object, and each key too unless it holds an
        // escape: nothing is parsed into a tree and written again.
        let Ok(ObjectMembers(fields)) = serde_json::from_str::<ObjectMembers<'a>>(text) else {
            self.set(GUEST_FIELDS, json_string(text));
            return;
        };
        let hosts = self.members.len();
        let mut renamed_any = false;
        for (mut key, value) in each_key_once(fields) {
            while declared(&key) || self.members[..hosts].iter().any(|(host, _)| *host == key) {
                key = Cow::Owned(format!("guest.{key}"));
                renamed_any = true;
            }
            self.members.push((key, Cow::Borrowed(value.get())));
        }
        if renamed_any {
            // A renamed key may now be one the guest gave as well (`version` became
            // `guest.version`): of the two, the later in key order is kept, as if set in turn.
            let guests = each_key_once(self.members.split_off(hosts));
            self.members.extend(guests);
        }
    }

    /// Writes the line as one JSON object and a line break, in one write: the writer is
    /// reached through a trait object, and a call per token cost more than the copy.
    fn write(self, writer: &mut Writer<'_>) -> fmt::Result {
        let length: usize = self
            .members
            .iter()
            .map(|(key, value)| key.len() + value.len() + 4)
            .sum();
        let mut text = String::with_capacity(length + 3);
        text.push('{');
        for (index, (key, value)) in self.members.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            if !needs_escaping(key) {
                text.push('"');
                text.push_str(key);
                text.push('"');
            } else {
                text.push_str(&json_string(key));
            }
            text.push(':');
            text.push_str(value);
        }
        text.push_str("}\n");
        writer.write_str(&text)
    }
}

/// A JSON object's members in the order the text gives them, a key given twice included. A key
/// borrows the text unless it holds an escape; each value is its text as it stands.
struct ObjectMembers<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for ObjectMembers<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = ObjectMembers<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4).min(64));
                while let Some(ObjectKey(key)) = map.next_key()? {
                    members.push((key, map.next_value()?));
                }
                Ok(ObjectMembers(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// A member's key: borrowed from the text, or unescaped into a `String` of its own.
struct ObjectKey<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for ObjectKey<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Key;
        impl<'de> serde::de::Visitor<'de> for Key {
            type Value = ObjectKey<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(ObjectKey(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
                Ok(ObjectKey(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(Key)
    }
}

/// `members` sorted by key, each key once with the last value given for it. The text
/// [`guest_fields`] writes is in that form already, and is only checked; a guest's members
/// after a rename are sorted again here.
fn each_key_once<K: Ord, V>(mut members: Vec<(K, V)>) -> Vec<(K, V)> {
    if members.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
        // Latest first, then a stable sort by key: the first of each key is the one to keep.
        members.reverse();
        members.sort_by(|(a, _), (b, _)| a.cmp(b));
        members.dedup_by(|(later, _), (kept, _)| later == kept);
    }
    members
}

/// Copies an event's fields into the line, merging [`GUEST_FIELDS`].
///
/// A library's line that came through the `log` crate carries `log.target`, `log.module_path`,
/// `log.file` and `log.line`: the last two point into the build machine's cargo registry. Its
/// target becomes the line's `target`, and the rest is left out.
struct EventFields<'line, 'a> {
    line: &'line mut Line<'a>,
    library_target: Option<String>,
    /// The [`GUEST_FIELDS`] text, added last, once every field of the host is on the line.
    guest_fields: Option<String>,
}

impl EventFields<'_, '_> {
    fn insert(&mut self, field: &Field, json: String) {
        if !field.name().starts_with("log.") {
            self.line.set(field.name(), json);
        }
    }
}

impl Visit for EventFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            GUEST_FIELDS => self.guest_fields = Some(value.to_owned()),
            "log.target" => self.library_target = Some(value.to_owned()),
            _ => self.insert(field, json_string(value)),
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, Value::from(value).to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == GUEST_FIELDS {
            self.guest_fields = Some(text);
        } else {
            self.insert(field, json_string(&text));
        }
    }
}

/// Now, as the line's timestamp: a JSON string in RFC 3339, UTC, to the microsecond
/// (`"2026-11-26T19:07:09.507647Z"`), as tracing-subscriber's `SystemTime` writes it.
fn timestamp() -> String {
    let mut text = String::with_capacity(30);
    text.push('"');
    let _ = SystemTime.format_time(&mut Writer::new(&mut text));
    text.push('"');
    text
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use serde_json::Map;
    use tracing::field::Empty;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use opentelemetry::Context;

    use crate::observability::request_report::RequestFields;

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

    /// A JSON object's members as the text has them, in order, a key given twice included.
    struct MembersInOrder(Vec<(String, Value)>);

    impl<'de> serde::Deserialize<'de> for MembersInOrder {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Members;
            impl<'de> serde::de::Visitor<'de> for Members {
                type Value = MembersInOrder;
                fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                    formatter.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<MembersInOrder, A::Error> {
                    let mut members = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        members.push(member);
                    }
                    Ok(MembersInOrder(members))
                }
            }
            deserializer.deserialize_map(Members)
        }
    }

    /// The lines `run` logs through a layer set up as the host sets up its own. Each must be one
    /// JSON object, each key once, exactly as serde_json writes its members in the line's order
    /// (nothing between tokens).
    fn lines_logged_by(run: impl FnOnce()) -> Vec<Map<String, Value>> {
        let buffer = SharedBuffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .fmt_fields(JsonMembers)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, run);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| {
                let MembersInOrder(members) =
                    serde_json::from_str(line).expect("each line is one JSON object");
                let written: Vec<String> = members
                    .iter()
                    .map(|(key, value)| format!("{}:{value}", json_string(key)))
                    .collect();
                assert_eq!(format!("{{{}}}", written.join(",")), line);
                let object: Map<String, Value> = members.into_iter().collect();
                assert_eq!(object.len(), written.len(), "a key written twice: {line}");
                object
            })
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

    #[test]
    fn span_field_texts_with_quotes_and_line_breaks_come_back_whole() {
        let lines = lines_logged_by(|| {
            let span = tracing::info_span!("request", url.path = Empty, count = 3);
            span.record("url.path", "/a\"b\nc\":{}");
            let _entered = span.enter();
            tracing::info!(ratio = 0.5, flag = true, "inside");
        });
        assert_eq!(lines[0]["url.path"], "/a\"b\nc\":{}");
        assert_eq!(lines[0]["count"], 3);
        assert_eq!(lines[0]["ratio"], 0.5);
        assert_eq!(lines[0]["flag"], true);
    }

    #[test]
    fn a_guests_fields_join_the_line_and_never_replace_the_hosts() {
        let lines = lines_logged_by(|| {
            let span = tracing::info_span!("request", request_id = "id-1");
            let _entered = span.enter();
            let fields = guest_fields([
                ("request_id".to_string(), Value::from("forged")),
                ("user \"quoted\"".to_string(), Value::from(7)),
                ("nested".to_string(), serde_json::json!({"a": [1, 2]})),
            ]);
            tracing::info!(guest_fields = %fields, "from the guest");
        });
        let line = &lines[0];
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["guest.request_id"], "forged");
        assert_eq!(line["user \"quoted\""], 7);
        assert_eq!(line["nested"], serde_json::json!({"a": [1, 2]}));
        assert!(!line.contains_key(GUEST_FIELDS), "{line:?}");
    }

    #[test]
    fn the_timestamp_is_rfc3339_utc_to_the_microsecond() {
        let timestamp: String = serde_json::from_str(&timestamp()).unwrap();
        assert_eq!(
            timestamp.len(),
            "2026-11-26T19:07:09.507647Z".len(),
            "{timestamp}"
        );
        assert!(timestamp.ends_with('Z'), "{timestamp}");
        assert_eq!(&timestamp[10..11], "T", "{timestamp}");
    }

    #[test]
    fn a_guest_may_not_write_a_field_its_span_declares_but_has_not_recorded_yet() {
        let lines = lines_logged_by(|| {
            let span = tracing::info_span!(
                "request",
                http.route = Empty,
                version = "1",
                guest.version = "2"
            );
            let _entered = span.enter();
            let fields = guest_fields([
                ("http.route".to_string(), Value::from("/forged")),
                ("version".to_string(), Value::from("3")),
            ]);
            tracing::info!(guest_fields = %fields, "from the guest");
        });
        let line = &lines[0];
        assert!(!line.contains_key("http.route"), "{line:?}");
        assert_eq!(line["guest.http.route"], "/forged");
        // Renamed, the key clashes again, and is renamed once more.
        assert_eq!(line["version"], "1");
        assert_eq!(line["guest.version"], "2");
        assert_eq!(line["guest.guest.version"], "3");
    }

    #[test]
    fn a_line_written_serving_a_request_carries_its_fields_with_the_latest_value_of_each() {
        let request = RequestFields::new();
        request.record_str("request_id", "id-1");
        request.record_str("url.path", "/a\"b\nc");
        request.record_i64("http.response.status_code", 200);
        request.record_i64("http.response.status_code", 503);
        let lines = lines_logged_by(|| {
            {
                let _request = request_report::with_fields(Context::new(), Some(&request)).attach();
                tracing::warn!(detail = "late", "failed")
            }
            tracing::info!("after the request");
        });
        let line = &lines[0];
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["url.path"], "/a\"b\nc");
        assert_eq!(line["http.response.status_code"], 503);
        assert_eq!(line["detail"], "late");
        assert!(!lines[1].contains_key("request_id"), "{:?}", lines[1]);
    }

    /// The line a guest logs with `fields` while serving a request whose `request_id` is
    /// `id-1` and which has recorded nothing else yet.
    fn guest_line_in_request(fields: &[(&str, &str)]) -> Map<String, Value> {
        let fields = guest_fields(
            fields
                .iter()
                .map(|(key, value)| (key.to_string(), Value::from(*value))),
        );
        guest_text_line_in_request(&fields)
    }

    /// The line of a guest event in a request, its fields the JSON text `fields`, both it and
    /// the message given as `&str`, as `GuestTelemetry::write_log` gives them.
    fn guest_text_line_in_request(fields: &str) -> Map<String, Value> {
        let request = RequestFields::new();
        request.record_str("request_id", "id-1");
        let mut lines = lines_logged_by(|| {
            let _request = request_report::with_fields(Context::new(), Some(&request)).attach();
            let message = "from the guest";
            tracing::info!(guest_fields = fields, message);
        });
        lines.remove(0)
    }

    #[test]
    fn guest_fields_text_with_a_key_given_twice_out_of_order_keeps_the_last_value_of_each() {
        let line = guest_text_line_in_request(r#"{"b":1,"a":2,"b":3,"c":{"d":[4]}}"#);
        assert_eq!(line["message"], "from the guest");
        assert_eq!(line["a"], 2);
        assert_eq!(line["b"], 3);
        assert_eq!(line["c"], serde_json::json!({"d": [4]}));
    }

    #[test]
    fn a_guest_key_spelled_with_escapes_is_kept_off_the_request_field_it_spells() {
        let line = guest_text_line_in_request(r#"{"request\u005fid":"forged","tab\tkey":1}"#);
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["guest.request_id"], "forged");
        assert_eq!(line["tab\tkey"], 1);
    }

    #[test]
    fn guest_fields_text_that_is_no_object_is_kept_as_one_string() {
        let line = guest_text_line_in_request(r#"["not", "an object"]"#);
        assert_eq!(line[GUEST_FIELDS], r#"["not", "an object"]"#);
        assert_eq!(line["request_id"], "id-1");
    }

    #[test]
    fn a_guest_may_not_write_a_request_field_even_one_not_recorded_yet() {
        let line = &guest_line_in_request(&[
            ("request_id", "forged"),
            ("http.route", "/forged"),
            ("user", "ada"),
        ]);
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["guest.request_id"], "forged");
        assert!(!line.contains_key("http.route"), "{line:?}");
        assert_eq!(line["guest.http.route"], "/forged");
        assert_eq!(line["user"], "ada");
    }

    #[test]
    fn a_guest_key_renamed_onto_one_the_guest_gave_too_is_on_the_line_once() {
        let line = &guest_line_in_request(&[
            ("guest.request_id", "given"),
            ("request_id", "forged"),
            ("user", "ada"),
        ]);
        // Set in key order, the renamed `request_id` comes after the guest's own
        // `guest.request_id`, and replaces it.
        assert_eq!(line["request_id"], "id-1");
        assert_eq!(line["guest.request_id"], "forged");
        assert_eq!(line["user"], "ada");
    }

    #[test]
    fn the_guest_fields_text_has_each_key_once_in_order() {
        let text = guest_fields([
            ("b".to_string(), Value::from(1)),
            ("a".to_string(), Value::from(2)),
            ("b".to_string(), Value::from(3)),
        ]);
        assert_eq!(text, r#"{"a":2,"b":3}"#);
    }

    #[test]
    fn a_guest_key_given_twice_is_on_the_line_once_with_its_last_value() {
        let lines = lines_logged_by(|| {
            let fields = guest_fields([
                ("k".to_string(), Value::from(1)),
                ("k".to_string(), Value::from(2)),
            ]);
            tracing::info!(guest_fields = %fields, "twice");
        });
        assert_eq!(lines[0]["k"], 2);
    }

    #[test]
    fn a_line_holds_every_one_of_a_guests_thousand_attributes_once() {
        let lines = lines_logged_by(|| {
            let fields = guest_fields((0..1024).map(|n| (format!("a{n}"), Value::from(n))));
            tracing::info!(guest_fields = %fields, "many");
        });
        for n in 0..1024 {
            assert_eq!(lines[0][&format!("a{n}")], n);
        }
        assert_eq!(
            lines[0].len(),
            1024 + 4,
            "the guest's keys and timestamp, level, message, target"
        );
    }
}
