//! Spans to a Jaeger agent: Jaeger's Thrift `Batch`, sent as the agent's one-way
//! `Agent.emitBatch` call in the compact protocol, one UDP datagram per call, each under the
//! agent's limit.
//!
//! The exporter of the host's own: the OpenTelemetry project's Jaeger exporter is retired (the
//! specification deprecates it in favour of OTLP, which Jaeger takes too), but the agent's UDP
//! port is what the contract names. The names, types and field ids below are those of Jaeger's
//! `jaeger.thrift` and `agent.thrift`; the Apache Thrift crate's compact protocol writes them.

use std::borrow::Cow;
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
    /// The SDK's resource: `Process.tags`.
    resource: Resource,
    /// Bytes of the encoded `Process`, which every datagram carries.
    process_bytes: usize,
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
        let mut exporter = AgentExporter {
            socket,
            service_name,
            resource: Resource::builder_empty().build(),
            process_bytes: 0,
            calls: AtomicI32::new(0),
            max_datagram: MAX_DATAGRAM_BYTES,
        };
        exporter.set_resource(&Resource::builder_empty().build());
        Ok(exporter)
    }

    /// Sends `batch` in as few datagrams as fit; a span that alone exceeds a datagram is
    /// dropped, and said in the export's error once the rest is sent (a guest's spans are
    /// bounded far below it).
    fn send(&self, batch: &[SpanData]) -> OTelSdkResult {
        let process = self.process_bytes;
        let mut spans: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0;
        let mut oversized = 0;
        for span in batch {
            // Writing to memory cannot fail, but a span that could not be written is dropped
            // alone, as one too large is.
            let Ok(encoded) = encode_span(span) else {
                oversized += 1;
                continue;
            };
            if call_bytes(process, bytes + encoded.len()) > self.max_datagram && !spans.is_empty() {
                self.emit(&spans)?;
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
            self.emit(&spans)?;
        }
        if oversized > 0 {
            return Err(OTelSdkError::InternalFailure(format!(
                "{oversized} span(s) larger than one datagram to the agent, or not encodable, \
                 were dropped"
            )));
        }
        Ok(())
    }

    /// One `emitBatch` call of `spans`, already encoded, in one datagram.
    fn emit(&self, spans: &[Vec<u8>]) -> OTelSdkResult {
        let sequence = self.calls.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let datagram = self.encode_call(sequence, spans).map_err(encoding_failed)?;
        self.socket.send(&datagram).map_err(|error| {
            OTelSdkError::InternalFailure(format!("sending to the agent: {error}"))
        })?;
        Ok(())
    }

    /// The `emitBatch` call numbered `sequence`: its argument `batch` (field 1) holds the
    /// `process` (field 1) and the list of `spans` (field 2).
    fn encode_call(&self, sequence: i32, spans: &[Vec<u8>]) -> thrift::Result<Vec<u8>> {
        let span_bytes = spans.iter().map(Vec::len).sum::<usize>();
        let mut datagram = Vec::with_capacity(call_bytes(self.process_bytes, span_bytes));
        let mut call = Compact::writing_to(&mut datagram);
        let head = TMessageIdentifier::new("emitBatch", TMessageType::OneWay, sequence);
        call.0.write_message_begin(&head)?;
        call.struct_begin()?;
        call.field(1, TType::Struct)?;
        call.struct_begin()?;
        call.field(1, TType::Struct)?;
        write_process(&mut call, &self.service_name, &self.resource)?;
        call.list_field(2, TType::Struct, spans.len())?;
        for span in spans {
            // Each element is a whole struct of its own, encoded alone: the same bytes.
            datagram.extend_from_slice(span);
        }
        // The stops of `Batch` and of the arguments: a stop is one byte whatever came before.
        let mut call = Compact::writing_to(&mut datagram);
        call.0.write_field_stop()?;
        call.0.write_field_stop()?;
        Ok(datagram)
    }
}

fn encoding_failed(error: thrift::Error) -> OTelSdkError {
    OTelSdkError::InternalFailure(format!("encoding spans for the agent: {error}"))
}

/// Thrift's compact protocol into a buffer in memory, field by id (it never writes names).
/// Field and list ends write nothing in this protocol, so they are not called.
struct Compact<'a>(TCompactOutputProtocol<&'a mut Vec<u8>>);

impl<'a> Compact<'a> {
    fn writing_to(out: &'a mut Vec<u8>) -> Compact<'a> {
        Compact(TCompactOutputProtocol::new(out))
    }

    fn struct_begin(&mut self) -> thrift::Result<()> {
        self.0.write_struct_begin(&TStructIdentifier {
            name: String::new(),
        })
    }

    fn struct_end(&mut self) -> thrift::Result<()> {
        self.0.write_field_stop()?;
        self.0.write_struct_end()
    }

    fn field(&mut self, id: i16, field_type: TType) -> thrift::Result<()> {
        self.0.write_field_begin(&TFieldIdentifier {
            name: None,
            field_type,
            id: Some(id),
        })
    }

    fn i32_field(&mut self, id: i16, value: i32) -> thrift::Result<()> {
        self.field(id, TType::I32)?;
        self.0.write_i32(value)
    }

    fn i64_field(&mut self, id: i16, value: i64) -> thrift::Result<()> {
        self.field(id, TType::I64)?;
        self.0.write_i64(value)
    }

    fn string_field(&mut self, id: i16, value: &str) -> thrift::Result<()> {
        self.field(id, TType::String)?;
        self.0.write_string(value)
    }

    fn list_field(&mut self, id: i16, element: TType, count: usize) -> thrift::Result<()> {
        self.field(id, TType::List)?;
        let count = i32::try_from(count).map_err(|_| thrift::Error::from("list too long"))?;
        self.0
            .write_list_begin(&TListIdentifier::new(element, count))
    }
}

impl SpanExporter for AgentExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.send(&batch)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
        let mut process = Vec::new();
        self.process_bytes = write_process(
            &mut Compact::writing_to(&mut process),
            &self.service_name,
            resource,
        )
        .map_or(0, |()| process.len());
    }
}

/// Bytes of an `emitBatch` call beside its process and spans, at most: the message head with the
/// method's name and a sequence id, the argument's, fields' and list's heads, and the end.
const CALL_FRAMING_BYTES: usize = 64;

/// The name of the host's own tracer (observability/pipeline.rs), whose spans carry no scope
/// tags: every span of the host would otherwise repeat it.
pub const HOST_TRACER: &str = "host";

/// The size, at most, of an `emitBatch` call whose process takes `process` bytes and whose
/// spans take `span_bytes`.
fn call_bytes(process: usize, span_bytes: usize) -> usize {
    CALL_FRAMING_BYTES + process + span_bytes
}

/// Bytes set aside for one encoded span: a request's span takes about this many, so it is
/// written without growing the buffer again and again.
const SPAN_CAPACITY: usize = 512;

/// Jaeger's `Process`: the service's name and the resource's other attributes.
fn write_process(
    out: &mut Compact<'_>,
    service_name: &str,
    resource: &Resource,
) -> thrift::Result<()> {
    out.struct_begin()?;
    out.string_field(1, service_name)?;
    let tags: Vec<(&Key, &Value)> = resource
        .iter()
        .filter(|(key, _)| key.as_str() != "service.name")
        .collect();
    out.list_field(2, TType::Struct, tags.len() + 1)?;
    for (key, value) in tags {
        write_tag(out, key.as_str(), value)?;
    }
    write_tag(out, "service.name", &Value::from(service_name.to_string()))?;
    out.struct_end()
}

/// Jaeger's `Span`: the ids, the name, links as references, the times in microseconds, the
/// attributes, kind and status as tags, and events as logs.
fn encode_span(span: &SpanData) -> thrift::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(SPAN_CAPACITY);
    let mut out = Compact::writing_to(&mut bytes);
    let context = &span.span_context;
    let (trace_high, trace_low) = split_trace_id(context.trace_id().to_bytes());
    out.struct_begin()?;
    out.i64_field(1, trace_low)?; // traceIdLow
    out.i64_field(2, trace_high)?; // traceIdHigh
    out.i64_field(3, i64::from_be_bytes(context.span_id().to_bytes()))?; // spanId
    out.i64_field(4, i64::from_be_bytes(span.parent_span_id.to_bytes()))?; // parentSpanId
    out.string_field(5, &span.name)?; // operationName
    if !span.links.is_empty() {
        out.list_field(6, TType::Struct, span.links.len())?; // references
        for link in span.links.iter() {
            let (high, low) = split_trace_id(link.span_context.trace_id().to_bytes());
            out.struct_begin()?; // SpanRef
            out.i32_field(1, FOLLOWS_FROM)?; // refType
            out.i64_field(2, low)?; // traceIdLow
            out.i64_field(3, high)?; // traceIdHigh
            out.i64_field(
                4,
                i64::from_be_bytes(link.span_context.span_id().to_bytes()),
            )?;
            out.struct_end()?;
        }
    }
    out.i32_field(7, i32::from(context.trace_flags().to_u8()))?; // flags
    out.i64_field(8, micros_since_epoch(span.start_time))?; // startTime
    let duration = span
        .end_time
        .duration_since(span.start_time)
        .unwrap_or_default();
    out.i64_field(9, duration.as_micros() as i64)?; // duration
    let tags = span_tags(span);
    out.list_field(10, TType::Struct, tags.len())?; // tags
    for (key, value) in &tags {
        write_tag(&mut out, key, value)?;
    }
    if !span.events.is_empty() {
        out.list_field(11, TType::Struct, span.events.len())?; // logs
        for event in span.events.iter() {
            out.struct_begin()?; // Log
            out.i64_field(1, micros_since_epoch(event.timestamp))?; // timestamp
            out.list_field(2, TType::Struct, event.attributes.len() + 1)?; // fields
            write_tag(&mut out, "event", &Value::from(event.name.clone()))?;
            for attribute in &event.attributes {
                write_tag(&mut out, attribute.key.as_str(), &attribute.value)?;
            }
            out.struct_end()?;
        }
    }
    out.struct_end()?;
    Ok(bytes)
}

/// The span's attributes, then what Jaeger shows of its kind and status (`span.kind`, `error`,
/// `otel.status_code`, `otel.status_description`) and, for a span not of the host's own tracer
/// (a guest's, through `wasi:otel`), of its scope (`otel.scope.name`, `otel.scope.version`),
/// unless an attribute already says so.
fn span_tags(span: &SpanData) -> Vec<(&str, Cow<'_, Value>)> {
    let mut tags: Vec<(&str, Cow<'_, Value>)> = span
        .attributes
        .iter()
        .map(|attribute| (attribute.key.as_str(), Cow::Borrowed(&attribute.value)))
        .collect();
    let has =
        |tags: &[(&str, Cow<'_, Value>)], name: &str| tags.iter().any(|(key, _)| *key == name);
    let scope = &span.instrumentation_scope;
    if !scope.name().is_empty() && scope.name() != HOST_TRACER && !has(&tags, "otel.scope.name") {
        tags.push((
            "otel.scope.name",
            Cow::Owned(Value::from(scope.name().to_string())),
        ));
        if let Some(version) = scope.version() {
            tags.push((
                "otel.scope.version",
                Cow::Owned(Value::from(version.to_string())),
            ));
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
        tags.push(("span.kind", Cow::Owned(Value::from(kind))));
    }
    match &span.status {
        Status::Unset => {}
        Status::Ok => {
            if !has(&tags, "otel.status_code") {
                tags.push(("otel.status_code", Cow::Owned(Value::from("OK"))));
            }
        }
        Status::Error { description } => {
            if !has(&tags, "error") {
                tags.push(("error", Cow::Owned(Value::Bool(true))));
            }
            if !has(&tags, "otel.status_code") {
                tags.push(("otel.status_code", Cow::Owned(Value::from("ERROR"))));
            }
            if !description.is_empty() && !has(&tags, "otel.status_description") {
                tags.push((
                    "otel.status_description",
                    Cow::Owned(Value::from(description.to_string())),
                ));
            }
        }
    }
    tags
}

/// Jaeger's `Tag`: a key (field 1), its `vType` (field 2) and one typed value.
fn write_tag(out: &mut Compact<'_>, key: &str, value: &Value) -> thrift::Result<()> {
    out.struct_begin()?;
    out.string_field(1, key)?;
    match value {
        Value::Bool(flag) => {
            out.i32_field(2, TagType::Bool as i32)?;
            out.field(5, TType::Bool)?; // vBool
            out.0.write_bool(*flag)?;
        }
        Value::I64(number) => {
            out.i32_field(2, TagType::Long as i32)?;
            out.i64_field(6, *number)?; // vLong
        }
        Value::F64(number) => {
            out.i32_field(2, TagType::Double as i32)?;
            out.field(4, TType::Double)?; // vDouble
            out.0.write_double(*number)?;
        }
        Value::String(text) => {
            out.i32_field(2, TagType::String as i32)?;
            out.string_field(3, text.as_str())?; // vStr
        }
        // An array, or a kind of value a later release adds, is written as its text.
        other => {
            out.i32_field(2, TagType::String as i32)?;
            out.string_field(3, &other.to_string())?;
        }
    }
    out.struct_end()
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

    use opentelemetry::trace::{Event, Link, SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use thrift::protocol::{TCompactInputProtocol, TInputProtocol, TMessageType, TType};

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
            let mut rest = &buffer[..size];
            let mut protocol = TCompactInputProtocol::new(&mut rest);
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
            // The stop of `Batch`, then of the call's arguments, and nothing after them.
            assert_eq!(protocol.read_field_begin().unwrap().field_type, TType::Stop);
            assert_eq!(protocol.read_field_begin().unwrap().field_type, TType::Stop);
            drop(protocol);
            assert!(rest.is_empty(), "{} bytes after the call", rest.len());
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
    fn call_numbers_wrap_past_the_largest_and_read_back_as_written() {
        let (agent, exporter) = agent();
        exporter.calls.store(i32::MAX, Ordering::Relaxed);
        for _ in 0..2 {
            finished(exporter.export(vec![span(1, vec![])])).unwrap();
        }
        let mut buffer = vec![0; 70_000];
        let sequences: Vec<i32> = (0..2)
            .map(|_| {
                let size = agent.recv(&mut buffer).unwrap();
                let mut protocol = TCompactInputProtocol::new(&buffer[..size]);
                protocol.read_message_begin().unwrap().sequence_number
            })
            .collect();
        assert_eq!(sequences, [i32::MIN, i32::MIN + 1]);
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

    /// A tag read back: its key, its `vType`, and its value as text.
    fn read_tag(protocol: &mut dyn TInputProtocol) -> (String, i32, String) {
        let (mut key, mut kind, mut value) = (String::new(), -1, String::new());
        protocol.read_struct_begin().unwrap();
        loop {
            let field = protocol.read_field_begin().unwrap();
            match field.id {
                None => break,
                Some(1) => key = protocol.read_string().unwrap(),
                Some(2) => kind = protocol.read_i32().unwrap(),
                Some(3) => value = protocol.read_string().unwrap(),
                Some(4) => value = protocol.read_double().unwrap().to_string(),
                Some(5) => value = protocol.read_bool().unwrap().to_string(),
                Some(6) => value = protocol.read_i64().unwrap().to_string(),
                Some(id) => panic!("a tag has no field {id}"),
            }
            protocol.read_field_end().unwrap();
        }
        protocol.read_struct_end().unwrap();
        (key, kind, value)
    }

    /// The elements of a list of structs, each read by `element`.
    fn read_structs<T>(
        protocol: &mut dyn TInputProtocol,
        mut element: impl FnMut(&mut dyn TInputProtocol) -> T,
    ) -> Vec<T> {
        let list = protocol.read_list_begin().unwrap();
        assert_eq!(list.element_type, TType::Struct);
        let elements = (0..list.size).map(|_| element(&mut *protocol)).collect();
        protocol.read_list_end().unwrap();
        elements
    }

    #[test]
    fn a_span_with_a_link_an_event_and_every_kind_of_tag_reads_back_whole() {
        let mut span = span(
            9,
            vec![
                KeyValue::new("flag", true),
                KeyValue::new("ratio", 0.25),
                KeyValue::new("count", -3),
                KeyValue::new("text", "x"),
                KeyValue::new("list", Value::Array(vec![1_i64, 2].into())),
            ],
        );
        span.links
            .links
            .push(Link::with_context(span.span_context.clone()));
        span.events.events.push(Event::new(
            "ready",
            SystemTime::now(),
            vec![KeyValue::new("n", 1)],
            0,
        ));
        let bytes = encode_span(&span).unwrap();
        let mut rest: &[u8] = &bytes;
        let mut protocol = TCompactInputProtocol::new(&mut rest);
        let (mut ids, mut tags, mut references, mut logs) = (vec![], vec![], vec![], vec![]);
        protocol.read_struct_begin().unwrap();
        loop {
            let field = protocol.read_field_begin().unwrap();
            let Some(id) = field.id else { break };
            ids.push(id);
            match id {
                5 => assert_eq!(protocol.read_string().unwrap(), "HTTP GET /api/health"),
                6 => {
                    references = read_structs(&mut protocol, |reference| {
                        reference.read_struct_begin().unwrap();
                        let fields: Vec<(Option<i16>, i64)> = (0..4)
                            .map(|_| {
                                let field = reference.read_field_begin().unwrap();
                                let value = match field.field_type {
                                    TType::I32 => i64::from(reference.read_i32().unwrap()),
                                    _ => reference.read_i64().unwrap(),
                                };
                                (field.id, value)
                            })
                            .collect();
                        assert_eq!(
                            reference.read_field_begin().unwrap().field_type,
                            TType::Stop
                        );
                        reference.read_struct_end().unwrap();
                        fields
                    })
                }
                7 => assert_eq!(protocol.read_i32().unwrap(), 1, "flags: sampled"),
                9 => assert_eq!(protocol.read_i64().unwrap(), 3_000, "duration in µs"),
                10 => tags = read_structs(&mut protocol, |tag| read_tag(tag)),
                11 => {
                    logs = read_structs(&mut protocol, |log| {
                        log.read_struct_begin().unwrap();
                        assert_eq!(log.read_field_begin().unwrap().id, Some(1));
                        log.read_i64().unwrap();
                        assert_eq!(log.read_field_begin().unwrap().id, Some(2));
                        let fields = read_structs(log, |tag| read_tag(tag));
                        assert_eq!(log.read_field_begin().unwrap().field_type, TType::Stop);
                        log.read_struct_end().unwrap();
                        fields
                    })
                }
                _ => protocol.skip(field.field_type).unwrap(),
            }
            protocol.read_field_end().unwrap();
        }
        protocol.read_struct_end().unwrap();
        drop(protocol);
        assert!(rest.is_empty(), "{} bytes after the span", rest.len());
        assert_eq!(ids, (1..=11).collect::<Vec<i16>>());
        // FOLLOWS_FROM the span itself: trace 7 (high half 0), span 9.
        assert_eq!(
            references,
            vec![vec![(Some(1), 1), (Some(2), 7), (Some(3), 0), (Some(4), 9)]]
        );
        let tag = |key: &str, kind: TagType, value: &str| {
            (key.to_string(), kind as i32, value.to_string())
        };
        for expected in [
            tag("flag", TagType::Bool, "true"),
            tag("ratio", TagType::Double, "0.25"),
            tag("count", TagType::Long, "-3"),
            tag("text", TagType::String, "x"),
            tag("list", TagType::String, "[1,2]"),
            tag("span.kind", TagType::String, "server"),
            tag("otel.status_code", TagType::String, "ERROR"),
        ] {
            assert!(tags.contains(&expected), "{expected:?} not in {tags:?}");
        }
        assert_eq!(
            logs,
            vec![vec![
                tag("event", TagType::String, "ready"),
                tag("n", TagType::Long, "1"),
            ]]
        );
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
        assert!(tags.contains(&("error", Cow::Owned(Value::Bool(false)))));
        assert!(tags.contains(&("otel.status_code", Cow::Owned(Value::from("ERROR")))));
        assert!(tags.contains(&("otel.status_description", Cow::Owned(Value::from("failed")))));
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
