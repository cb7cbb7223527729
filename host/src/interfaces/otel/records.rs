//! `wasi:otel/logs`: each record the guest emits becomes one host log line inside the request's
//! span, as a line of the project's own `telemetry.log` does, and so also an OTLP log record
//! where those are exported.

use wasmtime::StoreContextMut;

use super::OtelView;
use super::wire::WireLogRecord;
use crate::interfaces::bindings::telemetry::Level;
use crate::interfaces::lift::{self, InGuest};
use crate::interfaces::telemetry::Report;

/// The longest `severity-text` read; longer ones are not levels anyway.
const MAX_SEVERITY_TEXT: usize = 16;

/// `on-emit`: the record as a log line, if the request's quotas hold it. Its body is the
/// message (a JSON string as itself, any other JSON value as its text), its attributes and
/// `event-name` the line's fields, its level from its severity. A trace and span id that name
/// the request's server span or a span of the guest's own attach it there; other ids are
/// ignored (the line stays in the request's span). The record's own times and resource are not
/// kept: the line is timed by the host, and describes the host's service.
pub(super) fn on_emit<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    record: &WireLogRecord,
) -> wasmtime::Result<()> {
    let passed = record.attributes.as_ref().map_or(0, |list| list.len());
    let (_, telemetry) = store.data_mut().otel();
    let Some(mut left) = telemetry.admit(Report::LogEvent, passed) else {
        return Ok(());
    };
    let severity_text = match &record.severity_text {
        Some(text) => lift::metered_text(&InGuest::new(text, store), MAX_SEVERITY_TEXT, &mut left)?,
        None => None,
    };
    let level = level(record.severity_number, severity_text.as_deref());
    let message = match &record.body {
        Some(body) => lift::text(&InGuest::new(body, store), &mut left)?.map(message),
        None => Some(String::new()),
    };
    let Some(message) = message else {
        let (_, telemetry) = store.data_mut().otel();
        telemetry.settle(Report::LogEvent, left, false, passed as u64);
        return Ok(());
    };
    let event_name = match &record.event_name {
        Some(name) => lift::text(&InGuest::new(name, store), &mut left)?,
        None => None,
    };
    let lifted = match &record.attributes {
        Some(list) => super::key_values(store, list, &mut left)?,
        None => lift::Lifted::default(),
    };
    let ids = match (&record.trace_id, &record.span_id) {
        (Some(trace), Some(span)) => {
            super::trace_id(store, trace)?.zip(super::span_id(store, span)?)
        }
        _ => None,
    };
    let (otel, telemetry) = store.data_mut().otel();
    otel.server(telemetry);
    let in_span = ids.and_then(|(trace, span)| otel.known_context(trace, span));
    let in_guest_span = in_span.filter(|context| Some(context) != otel.server.as_ref());
    let fields = event_name
        .map(|name| ("event_name".to_string(), serde_json::Value::String(name)))
        .into_iter()
        .chain(lifted.attributes.into_iter().map(|attribute| {
            let json = match attribute.value {
                crate::interfaces::bindings::telemetry::Value::Text(text) => {
                    super::json_value(text)
                }
                _ => serde_json::Value::Null,
            };
            (attribute.key, json)
        }));
    telemetry.write_log(level, &message, fields, in_guest_span.as_ref());
    telemetry.settle(Report::LogEvent, left, true, lifted.dropped);
    Ok(())
}

/// A record's level: from its severity number (OpenTelemetry's ranges: 1-4 trace, 5-8 debug,
/// 9-12 info, 13-16 warn, 17-24 error and fatal), else from its severity text, else info.
fn level(number: Option<u8>, text: Option<&str>) -> Level {
    match number {
        Some(1..=4) => return Level::Trace,
        Some(5..=8) => return Level::Debug,
        Some(9..=12) => return Level::Info,
        Some(13..=16) => return Level::Warn,
        Some(17..=24) => return Level::Error,
        _ => {}
    }
    match text.map(str::to_ascii_lowercase).as_deref() {
        Some("trace") => Level::Trace,
        Some("debug") => Level::Debug,
        Some("warn" | "warning") => Level::Warn,
        Some("error" | "fatal") => Level::Error,
        _ => Level::Info,
    }
}

/// A body's JSON text as a message: a JSON string as itself, anything else as its text. A
/// string cut at the longest value kept has lost its closing quote: it loses its opening one.
fn message(body: String) -> String {
    match serde_json::from_str::<serde_json::Value>(&body) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(_) => body,
        Err(_) => body.strip_prefix('"').map(str::to_string).unwrap_or(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_severity_number_names_the_level_and_the_text_is_read_only_without_one() {
        assert_eq!(level(Some(9), Some("ERROR")), Level::Info);
        assert_eq!(level(Some(13), None), Level::Warn);
        assert_eq!(level(Some(21), None), Level::Error);
        assert_eq!(level(Some(1), None), Level::Trace);
        assert_eq!(level(None, Some("Warning")), Level::Warn);
        assert_eq!(level(Some(0), Some("debug")), Level::Debug);
        assert_eq!(level(Some(200), None), Level::Info);
        assert_eq!(level(None, None), Level::Info);
    }

    #[test]
    fn a_json_string_body_is_its_text_and_any_other_body_its_json() {
        assert_eq!(message("\"order placed\"".into()), "order placed");
        assert_eq!(message("{\"a\":1}".into()), "{\"a\":1}");
        assert_eq!(message("not json".into()), "not json");
        assert_eq!(message("\"cut sho".into()), "cut sho");
    }
}
