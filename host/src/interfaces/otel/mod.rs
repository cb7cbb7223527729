//! The standard `wasi:otel` interfaces (0.2.0-rc.2, wit/deps/otel.wit): a guest that runs its
//! own OpenTelemetry SDK hands the host its finished spans, log records and metrics.
//!
//! - `tracing` ([`spans`]): the guest's spans join the request's trace, checked (trace, parent,
//!   times) and exported with the ids the guest gave them;
//! - `logs` ([`records`]): each record becomes a host log line inside the request's span;
//! - `metrics` ([`measurements`]): data points go to the host's `guest.*` instruments.
//!
//! Everything is bounded before it is read, by the per-request quotas of the `telemetry`
//! interface ([`GuestTelemetry::admit`]); what is dropped is counted in
//! `guest_telemetry_dropped_total`. Short strings (ids, names, units) are metered
//! ([`lift::metered_text`]): past an allowance, the request's later ones are not read at all.

mod measurements;
mod records;
mod spans;
mod wire;

use std::collections::HashMap;
use std::time::SystemTime;

use opentelemetry::trace::{SpanContext, SpanId, TraceId};
use opentelemetry::{Array, StringValue, Value as OtelValue};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmList, WasmStr};

use crate::interfaces::bindings::wasi::otel::tracing::SpanContext as WitSpanContext;
use crate::interfaces::lift::{self, Allowance, InGuest, Lifted, RawValue};
use crate::interfaces::telemetry::GuestTelemetry;
use crate::observability::request_report::{HostCalls, HostInterface};

use self::wire::{WireKeyValue, WireLogRecord, WireResourceMetrics, WireSpanContext, WireSpanData};

/// The proposal's version this host implements.
pub const WASI_OTEL_VERSION: &str = "0.2.0-rc.2";

/// Span ids one request's guest may announce with `on-start` and be remembered as parents;
/// later ones are not (their children are then dropped as orphans).
pub const MAX_KNOWN_SPANS_PER_REQUEST: usize = 256;
/// Events kept on one guest span; the rest are counted in its dropped events.
pub const MAX_EVENTS_PER_SPAN: usize = 32;
/// Links kept on one guest span; the rest are counted in its dropped links.
pub const MAX_LINKS_PER_SPAN: usize = 8;
/// Metric data points one request's guest may hand over, over all its exports.
pub const MAX_METRIC_POINTS_PER_REQUEST: u32 = 256;
/// Attributes kept on one metric data point; a point with more is dropped (its series would
/// not be the one the guest meant).
pub const MAX_ATTRIBUTES_PER_POINT: usize = 4;
/// Bytes of metric names, units, descriptions and point attributes one request may pass.
pub const MAX_METRIC_BYTES_PER_REQUEST: usize = 64 * 1024;
/// Bytes of trace and span ids one request's guest may pass: every id it hands over (its spans',
/// their parents', their links', its log records') is 16 or 32 bytes, so this is far above
/// what 128 spans with 8 links each and 256 log records name.
pub const MAX_ID_BYTES_PER_REQUEST: usize = 128 * 1024;
/// How far before the request began, or after the host received it, a guest's time may lie:
/// a span or event outside that window is dropped (a guest's clock is the host's).
pub const CLOCK_SLACK: std::time::Duration = std::time::Duration::from_secs(1);

/// The store data of a request whose guest may use `wasi:otel`.
pub trait OtelView: HostCalls + Send + 'static {
    /// The request's `wasi:otel` state, and its guest telemetry (whose quotas it shares).
    fn otel(&mut self) -> (&mut GuestOtel, &mut GuestTelemetry);
}

/// What one request's guest has handed over through `wasi:otel`.
pub struct GuestOtel {
    /// When the request's instance was made: the earliest time a guest span may start.
    began: SystemTime,
    /// The request's server span, read once.
    server: Option<SpanContext>,
    /// Span ids the guest started or ended: the parents its spans may name.
    known_spans: Vec<SpanId>,
    /// Span ids already ended: a second `on-end` of one is dropped.
    ended: Vec<SpanId>,
    /// Metric data points and bytes left for this request.
    metric_points: u32,
    metric_bytes: Allowance,
    /// The last cumulative value of each series the guest reported, so that a second export in
    /// one request adds only what is new.
    last_values: HashMap<String, measurements::Seen>,
    /// Histogram measurements this request may still record.
    histogram_measurements: u64,
    /// Bytes of ids the guest may still pass ([`MAX_ID_BYTES_PER_REQUEST`]).
    id_bytes: Allowance,
}

impl Default for GuestOtel {
    fn default() -> GuestOtel {
        GuestOtel {
            began: SystemTime::now(),
            server: None,
            known_spans: Vec::new(),
            ended: Vec::new(),
            metric_points: MAX_METRIC_POINTS_PER_REQUEST,
            metric_bytes: Allowance {
                bytes: MAX_METRIC_BYTES_PER_REQUEST,
                attributes: MAX_METRIC_POINTS_PER_REQUEST * MAX_ATTRIBUTES_PER_POINT as u32,
            },
            last_values: HashMap::new(),
            histogram_measurements: measurements::MAX_HISTOGRAM_MEASUREMENTS_PER_REQUEST,
            id_bytes: Allowance {
                bytes: MAX_ID_BYTES_PER_REQUEST,
                attributes: 0,
            },
        }
    }
}

impl GuestOtel {
    /// The request's server span context: invalid for the host's own probes and when no
    /// spans are exported.
    fn server(&mut self, telemetry: &GuestTelemetry) -> &SpanContext {
        self.server
            .get_or_insert_with(|| telemetry.request_span().span_context())
    }

    /// Whether `span` is the server span or one of the guest's spans of this request.
    fn is_known(&self, span: SpanId) -> bool {
        self.server.as_ref().map(SpanContext::span_id) == Some(span)
            || self.known_spans.contains(&span)
    }

    /// Remembers `span` as a parent the guest's later spans may name, while there is room.
    fn remember(&mut self, span: SpanId) {
        if self.known_spans.len() < MAX_KNOWN_SPANS_PER_REQUEST && !self.known_spans.contains(&span)
        {
            self.known_spans.push(span);
        }
    }

    /// The guest span the guest names by `trace` and `span`, if it is the request's server span
    /// or one of the guest's own: what a log record may be attached to.
    fn known_context(&mut self, trace: TraceId, span: SpanId) -> Option<SpanContext> {
        let server = self.server.clone()?;
        (server.is_valid() && server.trace_id() == trace && self.is_known(span)).then(|| {
            SpanContext::new(
                trace,
                span,
                server.trace_flags(),
                false,
                server.trace_state().clone(),
            )
        })
    }
}

/// Links `wasi:otel`'s four interfaces (`types` has no functions).
pub fn add_to_linker<T: OtelView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.instance(&format!("wasi:otel/types@{WASI_OTEL_VERSION}"))?;
    let mut tracing = linker.instance(&format!("wasi:otel/tracing@{WASI_OTEL_VERSION}"))?;
    tracing.func_wrap(
        "outer-span-context",
        |mut store: StoreContextMut<'_, T>, (): ()| {
            store.data_mut().count_call(HostInterface::Otel);
            let (otel, telemetry) = store.data_mut().otel();
            Ok((wit_span_context(otel.server(telemetry)),))
        },
    )?;
    tracing.func_wrap(
        "on-start",
        |mut store: StoreContextMut<'_, T>, (context,): (WireSpanContext,)| {
            store.data_mut().count_call(HostInterface::Otel);
            spans::on_start(&mut store, &context)
        },
    )?;
    tracing.func_wrap(
        "on-end",
        |mut store: StoreContextMut<'_, T>, (span,): (WireSpanData,)| {
            store.data_mut().count_call(HostInterface::Otel);
            spans::on_end(&mut store, &span)
        },
    )?;
    let mut logs = linker.instance(&format!("wasi:otel/logs@{WASI_OTEL_VERSION}"))?;
    logs.func_wrap(
        "on-emit",
        |mut store: StoreContextMut<'_, T>, (record,): (WireLogRecord,)| {
            store.data_mut().count_call(HostInterface::Otel);
            records::on_emit(&mut store, &record)
        },
    )?;
    let mut metrics = linker.instance(&format!("wasi:otel/metrics@{WASI_OTEL_VERSION}"))?;
    metrics.func_wrap(
        "export",
        |mut store: StoreContextMut<'_, T>, (metrics,): (WireResourceMetrics,)| {
            store.data_mut().count_call(HostInterface::Otel);
            Ok((measurements::export(&mut store, &metrics)?,))
        },
    )?;
    Ok(())
}

/// `context` as the guest sees it.
fn wit_span_context(context: &SpanContext) -> WitSpanContext {
    use crate::interfaces::bindings::wasi::otel::tracing::TraceFlags;
    WitSpanContext {
        trace_id: context.trace_id().to_string(),
        span_id: context.span_id().to_string(),
        trace_flags: if context.is_sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::empty()
        },
        is_remote: context.is_remote(),
        trace_state: Vec::new(),
    }
}

/// A trace id the guest passed: at most 32 hexadecimal digits, not all zero. Read within the
/// request's id allowance.
fn trace_id<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    raw: &WasmStr,
) -> wasmtime::Result<Option<TraceId>> {
    let text = metered_id(store, raw, 32)?;
    Ok(text.and_then(|text| hex_id(&text, 32)).map(TraceId::from))
}

/// A span id the guest passed: at most 16 hexadecimal digits, not all zero. Read within the
/// request's id allowance.
fn span_id<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    raw: &WasmStr,
) -> wasmtime::Result<Option<SpanId>> {
    let text = metered_id(store, raw, 16)?;
    Ok(text
        .and_then(|text| hex_id(&text, 16))
        .map(|id| SpanId::from(id as u64)))
}

/// An id's text, if it is at most `digits` bytes and the request's id allowance holds it.
fn metered_id<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    raw: &WasmStr,
    digits: usize,
) -> wasmtime::Result<Option<String>> {
    let mut allowance = store.data_mut().otel().0.id_bytes;
    let text = lift::metered_text(&InGuest::new(raw, store), digits, &mut allowance);
    store.data_mut().otel().0.id_bytes = allowance;
    text
}

/// `text` as an id of at most `digits` hexadecimal digits (no sign, no prefix), unless zero.
/// Fewer digits are the same id with its leading zeros left out, as the `wasi:otel` SDK's
/// `format!("{:x}")` writes an id whose top digit is 0 (and its `from_hex` reads it back).
fn hex_id(text: &str, digits: usize) -> Option<u128> {
    if text.is_empty() || text.len() > digits || !text.bytes().all(|byte| byte.is_ascii_hexdigit())
    {
        return None;
    }
    u128::from_str_radix(text, 16).ok().filter(|id| *id != 0)
}

/// A guest's span context: its trace and span ids, if both are well formed.
fn ids<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    context: &WireSpanContext,
) -> wasmtime::Result<Option<(TraceId, SpanId)>> {
    let trace = trace_id(store, &context.trace_id)?;
    let span = span_id(store, &context.span_id)?;
    Ok(trace.zip(span))
}

/// The key-values of a list in guest memory, within `allowance` (their values still JSON text),
/// as [`lift::guest_attributes`] reads the project's own attributes.
fn key_values<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<WireKeyValue>,
    allowance: &mut Allowance,
) -> wasmtime::Result<Lifted> {
    lift::attributes(list.len(), allowance, |index, allowance| {
        let Some(wire) = list.get(&mut *store, index) else {
            return Ok(None);
        };
        let WireKeyValue { key, value } = wire?;
        let value = InGuest::new(&value, store);
        lift::attribute(
            &InGuest::new(&key, store),
            RawValue::Text(&value),
            allowance,
        )
    })
}

/// An attribute value from the JSON text `wasi:otel` carries it in: strings, integers, floats,
/// booleans and arrays of one of those as themselves; anything else (objects, mixed arrays,
/// text that is not JSON) as its text.
fn any_value(json: String) -> OtelValue {
    use serde_json::Value as Json;
    let parsed: Option<Json> = serde_json::from_str(&json).ok();
    match parsed {
        Some(Json::String(text)) => OtelValue::from(text),
        Some(Json::Bool(flag)) => OtelValue::Bool(flag),
        Some(Json::Number(number)) => match (number.as_i64(), number.as_f64()) {
            (Some(integer), _) => OtelValue::I64(integer),
            (None, Some(float)) if is_short(float) => OtelValue::F64(float),
            _ => OtelValue::from(json),
        },
        Some(Json::Array(items)) => array_value(&items).unwrap_or_else(|| OtelValue::from(json)),
        _ => OtelValue::from(json),
    }
}

/// A JSON array of one primitive type as an attribute array.
fn array_value(items: &[serde_json::Value]) -> Option<OtelValue> {
    use serde_json::Value as Json;
    let array = if items.iter().all(Json::is_boolean) {
        Array::Bool(items.iter().filter_map(Json::as_bool).collect())
    } else if items.iter().all(Json::is_i64) {
        Array::I64(items.iter().filter_map(Json::as_i64).collect())
    } else if items.iter().all(|item| item.as_f64().is_some_and(is_short)) {
        Array::F64(items.iter().filter_map(Json::as_f64).collect())
    } else if items.iter().all(Json::is_string) {
        Array::String(
            items
                .iter()
                .filter_map(Json::as_str)
                .map(|text| StringValue::from(text.to_string()))
                .collect(),
        )
    } else {
        return None;
    };
    Some(OtelValue::Array(array))
}

/// Whether `float` prints short: exporters and labels write floats out in full, and 1e300
/// would print as 301 digits.
fn is_short(float: f64) -> bool {
    float == 0.0 || (1e-15..1e15).contains(&float.abs())
}

/// The JSON text of a log attribute or body as a JSON value (text that is not JSON as a
/// string).
fn json_value(json: String) -> serde_json::Value {
    serde_json::from_str(&json).unwrap_or(serde_json::Value::String(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_at_most_its_hexadecimal_digits_and_never_zero() {
        assert_eq!(hex_id("00f067aa0ba902b7", 16), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(hex_id("00F067AA0BA902B7", 16), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(hex_id("0000000000000000", 16), None);
        assert_eq!(hex_id("0", 16), None);
        assert_eq!(hex_id("", 16), None);
        assert_eq!(hex_id("+0f067aa0ba902b7", 16), None);
        assert_eq!(hex_id("0x0f067aa0ba902b", 16), None);
        assert_eq!(hex_id("00f067aa0ba902b7a", 16), None);
        assert_eq!(hex_id(&"f".repeat(33), 32), None);
        assert_eq!(hex_id("zzf067aa0ba902b7", 16), None);
    }

    #[test]
    fn an_id_with_its_leading_zeros_left_out_is_the_same_id() {
        assert_eq!(hex_id("f067aa0ba902b7", 16), Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(hex_id("f067aa0ba902b7", 16), hex_id("00f067aa0ba902b7", 16));
        let trace = "0af7651916cd43dd8448eb211c80319c";
        assert_eq!(hex_id(&trace[1..], 32), hex_id(trace, 32));
        assert_eq!(hex_id("1", 32), Some(1));
    }

    #[test]
    fn attribute_values_arrive_as_json_and_keep_their_types() {
        assert_eq!(any_value("\"GET\"".into()), OtelValue::from("GET"));
        assert_eq!(any_value("42".into()), OtelValue::I64(42));
        assert_eq!(any_value("0.5".into()), OtelValue::F64(0.5));
        assert_eq!(any_value("true".into()), OtelValue::Bool(true));
        assert_eq!(
            any_value("[1,2]".into()),
            OtelValue::Array(Array::I64(vec![1, 2]))
        );
        assert_eq!(any_value("{\"a\":1}".into()), OtelValue::from("{\"a\":1}"));
        assert_eq!(any_value("not json".into()), OtelValue::from("not json"));
        assert_eq!(any_value("[1,\"a\"]".into()), OtelValue::from("[1,\"a\"]"));
        assert_eq!(any_value("1e300".into()), OtelValue::from("1e300"));
        assert_eq!(
            any_value("[1.5,1e300]".into()),
            OtelValue::from("[1.5,1e300]")
        );
    }

    #[test]
    fn a_log_value_that_is_not_json_is_kept_as_text() {
        assert_eq!(json_value("{\"a\":1}".into()), serde_json::json!({"a": 1}));
        assert_eq!(json_value("plain".into()), serde_json::json!("plain"));
    }
}
