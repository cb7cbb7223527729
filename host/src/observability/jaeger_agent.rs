//! Spans to a Jaeger agent: Jaeger's Thrift `Batch`, sent as the agent's one-way
//! `Agent.emitBatch` call in the compact protocol, one UDP datagram per call, each under the
//! agent's limit.
//!
//! The exporter of the host's own: the OpenTelemetry project's Jaeger exporter is retired (the
//! specification deprecates it in favour of OTLP, which Jaeger takes too), but the agent's UDP
//! port is what the contract names. The names, types and field ids below are those of Jaeger's
//! `jaeger.thrift` and `agent.thrift`; the `thrift` crate writes the protocol.

use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use thrift::protocol::{
    TCompactOutputProtocol, TFieldIdentifier, TListIdentifier, TMessageIdentifier, TMessageType,
    TOutputProtocol, TStructIdentifier, TType,
};

/// The largest datagram the agent reads (its default `--processor.jaeger-compact.server-max-packet-size`).
pub const MAX_DATAGRAM_BYTES: usize = 65_000;

/// Bytes that close an `emitBatch` call after its spans: the stop of `Batch`'s fields, then of
/// the call's arguments.
const CALL_END: [u8; 2] = [0, 0];

/// Jaeger's `TagType`.
#[derive(Clone, Copy)]
enum TagType {
    String = 0,
    Double = 1,
    Bool = 2,
    Long = 3,
}

/// Jaeger's `SpanRefType`: a link is a `FOLLOWS_FROM` reference (the parent is `parentSpanId`).
const FOLLOWS_FROM: i32 = 1;

/// Sends spans to one agent over UDP.
#[derive(Debug)]
pub struct AgentExporter {
    socket: UdpSocket,
    /// `Process.serviceName`.
    service_name: String,
    /// Jaeger's `Process` of this service and the SDK's resource, encoded once.
    process: Vec<u8>,
    /// `emitBatch` calls sent, for their sequence ids.
    calls: AtomicI32,
    /// The largest datagram sent.
    max_datagram: usize,
}

impl AgentExporter {
    /// An exporter to the agent at `host:port`, naming the process `service_name`. The address
    /// is resolved once, now.
    pub fn new(host: &str, port: u16, service_name: String) -> std::io::Result<AgentExporter> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let agent: SocketAddr = (host, port).to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the agent's host has no address",
            )
        })?;
        let local: SocketAddr = if agent.is_ipv6() {
            "[::]:0".parse().expect("a valid address")
        } else {
            "0.0.0.0:0".parse().expect("a valid address")
        };
        let socket = UdpSocket::bind(local)?;
        socket.connect(agent)?;
        // A send never waits for long: a full socket buffer loses the datagram, as UDP may.
        socket.set_write_timeout(Some(Duration::from_millis(100)))?;
        let process = encode(|protocol| {
            write_process(protocol, &service_name, &Resource::builder_empty().build())
        })
        .map_err(std::io::Error::other)?;
        Ok(AgentExporter {
            socket,
            service_name,
            process,
            calls: AtomicI32::new(0),
            max_datagram: MAX_DATAGRAM_BYTES,
        })
    }

    /// Sends `batch` in as few datagrams as fit; a span that alone exceeds a datagram is
    /// dropped, and said in the export's error once the rest is sent (a guest's spans are
    /// bounded far below it).
    fn send(&self, batch: &[SpanData]) -> OTelSdkResult {
        let process = &self.process;
        let mut spans: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0;
        let mut oversized = 0;
        for span in batch {
            let encoded = encode(|protocol| write_span(protocol, span))?;
            if call_bytes(process, bytes + encoded.len()) > self.max_datagram && !spans.is_empty() {
                self.emit(process, &spans)?;
                spans.clear();
                bytes = 0;
            }
            if call_bytes(process, encoded.len()) > self.max_datagram {
                oversized += 1;
                continue;
            }
            bytes += encoded.len();
            spans.push(encoded);
        }
        if !spans.is_empty() {
            self.emit(process, &spans)?;
        }
        if oversized > 0 {
            return Err(OTelSdkError::InternalFailure(format!(
                "{oversized} span(s) larger than one datagram to the agent were dropped"
            )));
        }
        Ok(())
    }

    /// One `emitBatch` call of `spans`, already encoded, in one datagram.
    fn emit(&self, process: &[u8], spans: &[Vec<u8>]) -> OTelSdkResult {
        let sequence = self.calls.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let mut datagram = call_head(sequence, process, spans.len())?;
        for span in spans {
            datagram.extend_from_slice(span);
        }
        datagram.extend_from_slice(&CALL_END);
        self.socket.send(&datagram).map_err(|error| {
            OTelSdkError::InternalFailure(format!("sending to the agent: {error}"))
        })?;
        Ok(())
    }
}

impl SpanExporter for AgentExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.send(&batch)
    }

    fn set_resource(&mut self, resource: &Resource) {
        if let Ok(process) =
            encode(|protocol| write_process(protocol, &self.service_name, resource))
        {
            self.process = process;
        }
    }
}

/// Bytes of an `emitBatch` call beside its process and spans, at most: the message head with the
/// method's name and a sequence id, the argument's, fields' and list's heads, and the end.
const CALL_FRAMING_BYTES: usize = 64;

/// The name of the host's own tracer (observability/pipeline.rs), whose spans carry no scope
/// tags: every span of the host would otherwise repeat it.
pub const HOST_TRACER: &str = "host";

/// The size, at most, of an `emitBatch` call whose spans take `span_bytes`.
fn call_bytes(process: &[u8], span_bytes: usize) -> usize {
    CALL_FRAMING_BYTES + process.len() + span_bytes
}

/// What `write` writes, as bytes.
fn encode(
    write: impl FnOnce(&mut TCompactOutputProtocol<&mut Vec<u8>>) -> thrift::Result<()>,
) -> Result<Vec<u8>, OTelSdkError> {
    let mut bytes = Vec::new();
    write(&mut TCompactOutputProtocol::new(&mut bytes))
        .map_err(|error| OTelSdkError::InternalFailure(format!("Thrift encoding: {error}")))?;
    Ok(bytes)
}

/// An `emitBatch` call up to its first span: the message head, the argument `batch` (field 1),
/// its `process` (field 1), and the head of its `spans` list (field 2) of `count`.
fn call_head(sequence: i32, process: &[u8], count: usize) -> Result<Vec<u8>, OTelSdkError> {
    let mut head = encode(|protocol| {
        protocol.write_message_begin(&TMessageIdentifier::new(
            "emitBatch",
            TMessageType::OneWay,
            sequence,
        ))?;
        protocol.write_struct_begin(&TStructIdentifier::new("Agent_emitBatch_args"))?;
        protocol.write_field_begin(&TFieldIdentifier::new("batch", TType::Struct, 1))?;
        protocol.write_struct_begin(&TStructIdentifier::new("Batch"))?;
        protocol.write_field_begin(&TFieldIdentifier::new("process", TType::Struct, 1))
    })?;
    head.extend_from_slice(process);
    // The list's field head continues the field ids of `Batch`: written by a protocol that has
    // seen field 1, so its delta is right.
    let list = encode(|protocol| {
        protocol.write_struct_begin(&TStructIdentifier::new("Batch"))?;
        protocol.write_field_begin(&TFieldIdentifier::new("process", TType::Struct, 1))?;
        protocol.write_field_end()?;
        protocol.write_field_begin(&TFieldIdentifier::new("spans", TType::List, 2))?;
        let count = i32::try_from(count).unwrap_or(i32::MAX);
        protocol.write_list_begin(&TListIdentifier::new(TType::Struct, count))
    })?;
    // The field head of `process` (one byte: delta 1, type struct) came first in `list`.
    head.extend_from_slice(&list[1..]);
    Ok(head)
}

/// Jaeger's `Process`: the service's name and the resource's other attributes.
fn write_process(
    protocol: &mut impl TOutputProtocol,
    service_name: &str,
    resource: &Resource,
) -> thrift::Result<()> {
    protocol.write_struct_begin(&TStructIdentifier::new("Process"))?;
    write_string_field(protocol, "serviceName", 1, service_name)?;
    let tags: Vec<(&Key, &Value)> = resource
        .iter()
        .filter(|(key, _)| key.as_str() != "service.name")
        .collect();
    protocol.write_field_begin(&TFieldIdentifier::new("tags", TType::List, 2))?;
    protocol.write_list_begin(&TListIdentifier::new(TType::Struct, tags.len() as i32 + 1))?;
    for (key, value) in tags {
        write_tag(protocol, key.as_str(), value)?;
    }
    write_tag(
        protocol,
        "service.name",
        &Value::from(service_name.to_string()),
    )?;
    protocol.write_list_end()?;
    protocol.write_field_end()?;
    protocol.write_field_stop()?;
    protocol.write_struct_end()
}

/// Jaeger's `Span`: the ids, the name, links as references, the times in microseconds, the
/// attributes, kind and status as tags, and events as logs.
fn write_span(protocol: &mut impl TOutputProtocol, span: &SpanData) -> thrift::Result<()> {
    let context = &span.span_context;
    let (trace_high, trace_low) = split_trace_id(context.trace_id().to_bytes());
    protocol.write_struct_begin(&TStructIdentifier::new("Span"))?;
    write_i64_field(protocol, "traceIdLow", 1, trace_low)?;
    write_i64_field(protocol, "traceIdHigh", 2, trace_high)?;
    write_i64_field(
        protocol,
        "spanId",
        3,
        i64::from_be_bytes(context.span_id().to_bytes()),
    )?;
    let parent = i64::from_be_bytes(span.parent_span_id.to_bytes());
    write_i64_field(protocol, "parentSpanId", 4, parent)?;
    write_string_field(protocol, "operationName", 5, &span.name)?;
    if !span.links.is_empty() {
        protocol.write_field_begin(&TFieldIdentifier::new("references", TType::List, 6))?;
        protocol.write_list_begin(&TListIdentifier::new(
            TType::Struct,
            span.links.len() as i32,
        ))?;
        for link in span.links.iter() {
            let (high, low) = split_trace_id(link.span_context.trace_id().to_bytes());
            protocol.write_struct_begin(&TStructIdentifier::new("SpanRef"))?;
            write_i32_field(protocol, "refType", 1, FOLLOWS_FROM)?;
            write_i64_field(protocol, "traceIdLow", 2, low)?;
            write_i64_field(protocol, "traceIdHigh", 3, high)?;
            let span_id = i64::from_be_bytes(link.span_context.span_id().to_bytes());
            write_i64_field(protocol, "spanId", 4, span_id)?;
            protocol.write_field_stop()?;
            protocol.write_struct_end()?;
        }
        protocol.write_list_end()?;
        protocol.write_field_end()?;
    }
    write_i32_field(
        protocol,
        "flags",
        7,
        i32::from(context.trace_flags().to_u8()),
    )?;
    write_i64_field(
        protocol,
        "startTime",
        8,
        micros_since_epoch(span.start_time),
    )?;
    let duration = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    write_i64_field(protocol, "duration", 9, duration.as_micros() as i64)?;
    let tags = span_tags(span);
    protocol.write_field_begin(&TFieldIdentifier::new("tags", TType::List, 10))?;
    protocol.write_list_begin(&TListIdentifier::new(TType::Struct, tags.len() as i32))?;
    for (key, value) in &tags {
        write_tag(protocol, key, value)?;
    }
    protocol.write_list_end()?;
    protocol.write_field_end()?;
    if !span.events.is_empty() {
        protocol.write_field_begin(&TFieldIdentifier::new("logs", TType::List, 11))?;
        protocol.write_list_begin(&TListIdentifier::new(
            TType::Struct,
            span.events.len() as i32,
        ))?;
        for event in span.events.iter() {
            protocol.write_struct_begin(&TStructIdentifier::new("Log"))?;
            write_i64_field(
                protocol,
                "timestamp",
                1,
                micros_since_epoch(event.timestamp),
            )?;
            protocol.write_field_begin(&TFieldIdentifier::new("fields", TType::List, 2))?;
            let count = event.attributes.len() as i32 + 1;
            protocol.write_list_begin(&TListIdentifier::new(TType::Struct, count))?;
            write_tag(protocol, "event", &Value::from(event.name.to_string()))?;
            for attribute in &event.attributes {
                write_tag(protocol, attribute.key.as_str(), &attribute.value)?;
            }
            protocol.write_list_end()?;
            protocol.write_field_end()?;
            protocol.write_field_stop()?;
            protocol.write_struct_end()?;
        }
        protocol.write_list_end()?;
        protocol.write_field_end()?;
    }
    protocol.write_field_stop()?;
    protocol.write_struct_end()
}

/// The span's attributes, then what Jaeger shows of its kind and status (`span.kind`, `error`,
/// `otel.status_code`, `otel.status_description`) and, for a span not of the host's own tracer
/// (a guest's, through `wasi:otel`), of its scope (`otel.scope.name`, `otel.scope.version`),
/// unless an attribute already says so.
fn span_tags(span: &SpanData) -> Vec<(&str, Value)> {
    let mut tags: Vec<(&str, Value)> = span
        .attributes
        .iter()
        .map(|attribute| (attribute.key.as_str(), attribute.value.clone()))
        .collect();
    let has = |tags: &[(&str, Value)], name: &str| tags.iter().any(|(key, _)| *key == name);
    let scope = &span.instrumentation_scope;
    if !scope.name().is_empty() && scope.name() != HOST_TRACER && !has(&tags, "otel.scope.name") {
        tags.push(("otel.scope.name", Value::from(scope.name().to_string())));
        if let Some(version) = scope.version() {
            tags.push(("otel.scope.version", Value::from(version.to_string())));
        }
    }
    let kind = match span.span_kind {
        SpanKind::Client => Some("client"),
        SpanKind::Server => Some("server"),
        SpanKind::Producer => Some("producer"),
        SpanKind::Consumer => Some("consumer"),
        SpanKind::Internal => None,
    };
    if let Some(kind) = kind
        && !has(&tags, "span.kind")
    {
        tags.push(("span.kind", Value::from(kind)));
    }
    match &span.status {
        Status::Unset => {}
        Status::Ok => {
            if !has(&tags, "otel.status_code") {
                tags.push(("otel.status_code", Value::from("OK")));
            }
        }
        Status::Error { description } => {
            if !has(&tags, "error") {
                tags.push(("error", Value::Bool(true)));
            }
            if !has(&tags, "otel.status_code") {
                tags.push(("otel.status_code", Value::from("ERROR")));
            }
            if !description.is_empty() && !has(&tags, "otel.status_description") {
                tags.push((
                    "otel.status_description",
                    Value::from(description.to_string()),
                ));
            }
        }
    }
    tags
}

/// Jaeger's `Tag`: a key and one typed value.
fn write_tag(protocol: &mut impl TOutputProtocol, key: &str, value: &Value) -> thrift::Result<()> {
    protocol.write_struct_begin(&TStructIdentifier::new("Tag"))?;
    write_string_field(protocol, "key", 1, key)?;
    match value {
        Value::Bool(flag) => {
            write_i32_field(protocol, "vType", 2, TagType::Bool as i32)?;
            protocol.write_field_begin(&TFieldIdentifier::new("vBool", TType::Bool, 5))?;
            protocol.write_bool(*flag)?;
            protocol.write_field_end()?;
        }
        Value::I64(number) => {
            write_i32_field(protocol, "vType", 2, TagType::Long as i32)?;
            write_i64_field(protocol, "vLong", 6, *number)?;
        }
        Value::F64(number) => {
            write_i32_field(protocol, "vType", 2, TagType::Double as i32)?;
            protocol.write_field_begin(&TFieldIdentifier::new("vDouble", TType::Double, 4))?;
            protocol.write_double(*number)?;
            protocol.write_field_end()?;
        }
        Value::String(text) => {
            write_i32_field(protocol, "vType", 2, TagType::String as i32)?;
            write_string_field(protocol, "vStr", 3, text.as_str())?;
        }
        // An array, or a kind of value a later release adds, is written as its text.
        other => {
            write_i32_field(protocol, "vType", 2, TagType::String as i32)?;
            write_string_field(protocol, "vStr", 3, &other.to_string())?;
        }
    }
    protocol.write_field_stop()?;
    protocol.write_struct_end()
}

fn write_string_field(
    protocol: &mut impl TOutputProtocol,
    name: &str,
    id: i16,
    value: &str,
) -> thrift::Result<()> {
    protocol.write_field_begin(&TFieldIdentifier::new(name, TType::String, id))?;
    protocol.write_string(value)?;
    protocol.write_field_end()
}

fn write_i64_field(
    protocol: &mut impl TOutputProtocol,
    name: &str,
    id: i16,
    value: i64,
) -> thrift::Result<()> {
    protocol.write_field_begin(&TFieldIdentifier::new(name, TType::I64, id))?;
    protocol.write_i64(value)?;
    protocol.write_field_end()
}

fn write_i32_field(
    protocol: &mut impl TOutputProtocol,
    name: &str,
    id: i16,
    value: i32,
) -> thrift::Result<()> {
    protocol.write_field_begin(&TFieldIdentifier::new(name, TType::I32, id))?;
    protocol.write_i32(value)?;
    protocol.write_field_end()
}

/// A 128-bit trace id as Jaeger's two halves, high then low, each a signed 64-bit number.
fn split_trace_id(bytes: [u8; 16]) -> (i64, i64) {
    let (high, low) = bytes.split_at(8);
    (
        i64::from_be_bytes(high.try_into().expect("eight bytes")),
        i64::from_be_bytes(low.try_into().expect("eight bytes")),
    )
}

fn micros_since_epoch(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as i64
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use std::pin::pin;

    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use thrift::protocol::{TCompactInputProtocol, TInputProtocol};

    use super::*;

    /// A finished server span with `attributes`.
    fn span(id: u64, attributes: Vec<KeyValue>) -> SpanData {
        let now = SystemTime::now();
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(7),
                SpanId::from(id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: Cow::Borrowed("HTTP GET /api/health"),
            start_time: now,
            end_time: now + Duration::from_millis(3),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::error("failed"),
            instrumentation_scope: InstrumentationScope::default(),
        }
    }

    /// An agent on loopback and an exporter to it.
    fn agent() -> (UdpSocket, AgentExporter) {
        let agent = UdpSocket::bind("127.0.0.1:0").unwrap();
        agent
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let port = agent.local_addr().unwrap().port();
        let mut exporter = AgentExporter::new("127.0.0.1", port, "svc".to_string()).unwrap();
        exporter.set_resource(
            &Resource::builder_empty()
                .with_attribute(KeyValue::new("host.name", "box"))
                .build(),
        );
        (agent, exporter)
    }

    /// The calls that arrived, each in a datagram of at most `limit` bytes: each call's method
    /// and type, and the number of spans in its batch.
    fn received(agent: &UdpSocket, limit: usize) -> Vec<(String, i32, usize)> {
        let mut calls = Vec::new();
        let mut buffer = vec![0; 70_000];
        while let Ok(size) = agent.recv(&mut buffer) {
            let mut protocol = TCompactInputProtocol::new(&buffer[..size]);
            let message = protocol.read_message_begin().unwrap();
            protocol.read_struct_begin().unwrap();
            assert_eq!(protocol.read_field_begin().unwrap().id, Some(1));
            protocol.read_struct_begin().unwrap();
            let process = protocol.read_field_begin().unwrap();
            assert_eq!(process.id, Some(1));
            protocol.skip(TType::Struct).unwrap();
            assert_eq!(protocol.read_field_begin().unwrap().id, Some(2));
            let list = protocol.read_list_begin().unwrap();
            for _ in 0..list.size {
                protocol.skip(TType::Struct).unwrap();
            }
            protocol.read_list_end().unwrap();
            assert_eq!(protocol.read_field_begin().unwrap().field_type, TType::Stop);
            calls.push((
                message.name,
                message.message_type as i32,
                list.size as usize,
            ));
            assert!(size <= limit, "a datagram of {size} bytes");
        }
        calls
    }

    #[test]
    fn a_batch_is_one_one_way_emit_batch_call() {
        let (agent, exporter) = agent();
        let spans = (1..=3)
            .map(|id| span(id, vec![KeyValue::new("a", 1)]))
            .collect();
        finished(exporter.export(spans)).unwrap();
        let calls = received(&agent, MAX_DATAGRAM_BYTES);
        assert_eq!(
            calls,
            vec![("emitBatch".to_string(), TMessageType::OneWay as i32, 3)]
        );
    }

    #[test]
    fn a_batch_over_one_datagram_is_split_and_loses_no_span() {
        let (agent, mut exporter) = agent();
        // Small datagrams, so the test's socket buffer holds them all.
        exporter.max_datagram = 8 * 1024;
        let large = "x".repeat(1024);
        let spans: Vec<SpanData> = (1..=100)
            .map(|id| span(id, vec![KeyValue::new("large", large.clone())]))
            .collect();
        finished(exporter.export(spans)).unwrap();
        let calls = received(&agent, 8 * 1024);
        assert!(calls.len() >= 13, "{} calls", calls.len());
        assert_eq!(calls.iter().map(|(_, _, spans)| spans).sum::<usize>(), 100);
    }

    #[test]
    fn a_span_larger_than_a_datagram_is_dropped_alone() {
        let (agent, exporter) = agent();
        let huge = "x".repeat(MAX_DATAGRAM_BYTES);
        let spans = vec![
            span(1, vec![]),
            span(2, vec![KeyValue::new("huge", huge)]),
            span(3, vec![]),
        ];
        assert!(finished(exporter.export(spans)).is_err());
        let calls = received(&agent, MAX_DATAGRAM_BYTES);
        assert_eq!(calls.iter().map(|(_, _, spans)| spans).sum::<usize>(), 2);
    }

    #[test]
    fn kind_and_status_become_jaegers_tags_unless_an_attribute_says_so() {
        let span = span(1, vec![KeyValue::new("error", false)]);
        let tags = span_tags(&span);
        let named = |name: &str| tags.iter().filter(|(key, _)| *key == name).count();
        assert_eq!(named("span.kind"), 1);
        assert_eq!(named("error"), 1);
        assert!(tags.contains(&("error", Value::Bool(false))));
        assert!(tags.contains(&("otel.status_code", Value::from("ERROR"))));
        assert!(tags.contains(&("otel.status_description", Value::from("failed"))));
    }

    #[test]
    fn an_ipv6_agent_is_reached_with_or_without_brackets() {
        let Ok(agent) = UdpSocket::bind("[::1]:0") else {
            return; // No IPv6 loopback on this machine.
        };
        let port = agent.local_addr().unwrap().port();
        for host in ["::1", "[::1]"] {
            assert!(
                AgentExporter::new(host, port, "svc".into()).is_ok(),
                "{host}"
            );
        }
    }

    /// The outcome of an export, which never waits (it is a UDP send).
    fn finished(future: impl Future<Output = OTelSdkResult>) -> OTelSdkResult {
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        match pin!(future).poll(&mut context) {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => panic!("an export waited"),
        }
    }
}
