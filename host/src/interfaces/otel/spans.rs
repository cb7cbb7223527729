//! `wasi:otel/tracing`: the guest's finished spans, checked and bounded, to the host's span
//! exporter with the ids the guest gave them.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind as OtelSpanKind, Status, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use wasmtime::StoreContextMut;
use wasmtime::component::WasmList;

use super::wire::{WireEvent, WireKeyValue, WireLink, WireSpanContext, WireSpanData, WireStatus};
use super::{CLOCK_SLACK, MAX_EVENTS_PER_SPAN, MAX_LINKS_PER_SPAN, OtelView};
use crate::interfaces::bindings::wasi::otel::tracing::{Datetime, SpanKind};
use crate::interfaces::lift::{self, Allowance, InGuest};
use crate::interfaces::telemetry::{MAX_BYTES_PER_SPAN, Report};
use crate::observability::jaeger_agent::HOST_TRACER;
use crate::observability::pipeline;

/// The longest instrumentation scope name or version kept.
const MAX_SCOPE_BYTES: usize = 128;
/// The scope of a guest span whose own is unnamed, or named as the host's tracer.
const GUEST_SCOPE: &str = "guest";

/// `on-start`: the span's id becomes a parent the guest's later spans may name, if it belongs
/// to the request's trace.
pub(super) fn on_start<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    context: &WireSpanContext,
) -> wasmtime::Result<()> {
    let (otel, _) = store.data_mut().otel();
    if otel.known_spans.len() >= super::MAX_KNOWN_SPANS_PER_REQUEST {
        return Ok(());
    }
    let Some((trace, span)) = super::ids(store, context)? else {
        return Ok(());
    };
    let (otel, telemetry) = store.data_mut().otel();
    if telemetry.metrics().is_some() && otel.server(telemetry).trace_id() == trace {
        otel.remember(span);
    }
    Ok(())
}

/// `on-end`: the span, if it is the request's and its quotas hold it, to the exporter.
pub(super) fn on_end<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    span: &WireSpanData,
) -> wasmtime::Result<()> {
    let (_, telemetry) = store.data_mut().otel();
    let Some(left) = telemetry.admit(Report::Span, span.attributes.len()) else {
        return Ok(());
    };
    let checked = check(store, span)?;
    let (_, telemetry) = store.data_mut().otel();
    let Some((context, parent, start, end)) = checked else {
        telemetry.settle(Report::Span, left, false, span.attributes.len() as u64);
        return Ok(());
    };
    // The span's own budget: its share of what is left, at most what one datagram holds.
    let mut budget = Allowance {
        bytes: left.bytes.min(MAX_BYTES_PER_SPAN),
        attributes: left.attributes,
    };
    let spent = |budget: &Allowance, before: usize| Allowance {
        bytes: left.bytes - (before - budget.bytes),
        attributes: budget.attributes,
    };
    let before = budget.bytes;
    let Some(name) = lift::text(&InGuest::new(&span.name, store), &mut budget)? else {
        let (_, telemetry) = store.data_mut().otel();
        let attributes = span.attributes.len() as u64;
        telemetry.settle(Report::Span, spent(&budget, before), false, attributes);
        return Ok(());
    };
    let (attributes, dropped_attributes) = key_values(store, &span.attributes, &mut budget)?;
    let (events, dropped_events) = events(store, &span.events, (start, end), &mut budget)?;
    let (links, dropped_links) = links(store, &span.links, &mut budget)?;
    let status = match &span.status {
        WireStatus::Unset => Status::Unset,
        WireStatus::Ok => Status::Ok,
        WireStatus::Error(description) => Status::error(
            lift::text(&InGuest::new(description, store), &mut budget)?.unwrap_or_default(),
        ),
    };
    let scope = scope(store, span, &mut budget)?;
    let (otel, telemetry) = store.data_mut().otel();
    telemetry.settle(
        Report::Span,
        spent(&budget, before),
        true,
        dropped_attributes,
    );
    otel.remember(context.span_id());
    otel.ended.push(context.span_id());
    let sampled = otel.server(telemetry).is_sampled();
    let guest_dropped = |ours: u64, theirs: u32| saturating_u32(ours + u64::from(theirs));
    if sampled {
        pipeline::export_guest_span(SpanData {
            span_context: context,
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: span_kind(span.span_kind),
            name: Cow::Owned(name),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: guest_dropped(dropped_attributes, span.dropped_attributes),
            events: {
                let mut all = SpanEvents::default();
                all.events = events;
                all.dropped_count = guest_dropped(dropped_events, span.dropped_events);
                all
            },
            links: {
                let mut all = SpanLinks::default();
                all.links = links;
                all.dropped_count = guest_dropped(dropped_links, span.dropped_links);
                all
            },
            status,
            instrumentation_scope: scope,
        });
    }
    Ok(())
}

/// The span's identity and times, if it belongs to this request: its trace is the server
/// span's, its id is new and well formed, its parent is the server span or a guest span of
/// this request, and it started no earlier than the request and ended no later than now.
#[allow(clippy::type_complexity)]
fn check<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    span: &WireSpanData,
) -> wasmtime::Result<Option<(SpanContext, SpanId, SystemTime, SystemTime)>> {
    let ids = super::ids(store, &span.span_context)?;
    let parent = super::span_id(store, &span.parent_span_id)?;
    let (otel, telemetry) = store.data_mut().otel();
    let server = otel.server(telemetry).clone();
    let (Some((trace, id)), Some(parent)) = (ids, parent) else {
        return Ok(None);
    };
    let belongs = server.is_valid()
        && trace == server.trace_id()
        && id != server.span_id()
        && id != parent
        && !otel.ended.contains(&id)
        && otel.is_known(parent);
    let window = (otel.began - CLOCK_SLACK, SystemTime::now() + CLOCK_SLACK);
    let times = time(span.start_time)
        .zip(time(span.end_time))
        .filter(|(start, end)| window.0 <= *start && start <= end && *end <= window.1);
    Ok(belongs.then_some(times).flatten().map(|(start, end)| {
        let context = SpanContext::new(trace, id, server.trace_flags(), false, TraceState::NONE);
        (context, parent, start, end)
    }))
}

/// A `datetime` as a time, if it is one (nanoseconds under a second).
pub(super) fn time(datetime: Datetime) -> Option<SystemTime> {
    (datetime.nanoseconds < 1_000_000_000)
        .then(|| UNIX_EPOCH.checked_add(Duration::new(datetime.seconds, datetime.nanoseconds)))
        .flatten()
}

/// Key-values lifted within `budget` as attributes, and how many were dropped.
fn key_values<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<WireKeyValue>,
    budget: &mut Allowance,
) -> wasmtime::Result<(Vec<KeyValue>, u64)> {
    let lifted = super::key_values(store, list, budget)?;
    let attributes = lifted
        .attributes
        .into_iter()
        .map(|attribute| KeyValue::new(attribute.key, super::any_value(text_of(attribute.value))))
        .collect();
    Ok((attributes, lifted.dropped))
}

/// The text of a lifted `wasi:otel` value (always text: JSON).
fn text_of(value: crate::interfaces::bindings::telemetry::Value) -> String {
    use crate::interfaces::bindings::telemetry::Value;
    match value {
        Value::Text(text) => text,
        Value::Integer(number) => number.to_string(),
        Value::Float(number) => number.to_string(),
        Value::Boolean(flag) => flag.to_string(),
    }
}

/// The span's events within `budget`: at most [`MAX_EVENTS_PER_SPAN`], each inside the span's
/// time; and how many were dropped.
fn events<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<WireEvent>,
    (start, end): (SystemTime, SystemTime),
    budget: &mut Allowance,
) -> wasmtime::Result<(Vec<Event>, u64)> {
    let mut events = Vec::new();
    for index in 0..list.len().min(MAX_EVENTS_PER_SPAN) {
        let Some(wire) = list.get(&mut *store, index) else {
            break;
        };
        let wire = wire?;
        let Some(time) = time(wire.time).filter(|time| (start..=end).contains(time)) else {
            continue;
        };
        let Some(name) = lift::text(&InGuest::new(&wire.name, store), budget)? else {
            break;
        };
        let (attributes, dropped) = key_values(store, &wire.attributes, budget)?;
        events.push(Event::new(name, time, attributes, saturating_u32(dropped)));
    }
    let dropped = (list.len() - events.len()) as u64;
    Ok((events, dropped))
}

/// The span's links within `budget`: at most [`MAX_LINKS_PER_SPAN`], each to a well-formed
/// span context; and how many were dropped.
fn links<T: OtelView>(
    store: &mut StoreContextMut<'_, T>,
    list: &WasmList<WireLink>,
    budget: &mut Allowance,
) -> wasmtime::Result<(Vec<Link>, u64)> {
    let mut links = Vec::new();
    for index in 0..list.len().min(MAX_LINKS_PER_SPAN) {
        let Some(wire) = list.get(&mut *store, index) else {
            break;
        };
        let wire = wire?;
        let Some((trace, span)) = super::ids(store, &wire.span_context)? else {
            continue;
        };
        let (attributes, dropped) = key_values(store, &wire.attributes, budget)?;
        let context = SpanContext::new(trace, span, Default::default(), true, TraceState::NONE);
        links.push(Link::new(context, attributes, saturating_u32(dropped)));
    }
    let dropped = (list.len() - links.len()) as u64;
    Ok((links, dropped))
}

/// The tracer that made the span: its name and version, cut to [`MAX_SCOPE_BYTES`].
fn scope<T: 'static>(
    store: &StoreContextMut<'_, T>,
    span: &WireSpanData,
    budget: &mut Allowance,
) -> wasmtime::Result<InstrumentationScope> {
    let wire = &span.instrumentation_scope;
    let name = lift::text(&InGuest::new(&wire.name, store), budget)?.unwrap_or_default();
    // A guest's spans never pass for the host's own (which carry no scope tags).
    let name = match &name[..name.floor_char_boundary(MAX_SCOPE_BYTES)] {
        "" | HOST_TRACER => GUEST_SCOPE.to_string(),
        name => name.to_string(),
    };
    let mut builder = InstrumentationScope::builder(name);
    if let Some(version) = &wire.version
        && let Some(version) = lift::text(&InGuest::new(version, store), budget)?
    {
        builder = builder
            .with_version(version[..version.floor_char_boundary(MAX_SCOPE_BYTES)].to_string());
    }
    Ok(builder.build())
}

fn span_kind(kind: SpanKind) -> OtelSpanKind {
    match kind {
        SpanKind::Client => OtelSpanKind::Client,
        SpanKind::Server => OtelSpanKind::Server,
        SpanKind::Producer => OtelSpanKind::Producer,
        SpanKind::Consumer => OtelSpanKind::Consumer,
        SpanKind::Internal => OtelSpanKind::Internal,
    }
}

fn saturating_u32(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datetime_with_a_second_or_more_of_nanoseconds_is_no_time() {
        let at = |seconds, nanoseconds| {
            time(Datetime {
                seconds,
                nanoseconds,
            })
        };
        assert_eq!(
            at(1, 5),
            Some(UNIX_EPOCH + Duration::from_secs(1) + Duration::from_nanos(5))
        );
        assert_eq!(at(1, 1_000_000_000), None);
        assert_eq!(at(u64::MAX, 999_999_999), None);
    }
}
