//! A Jaeger agent stand-in: listens on a real UDP socket and decodes what arrives as Thrift
//! compact `Agent.emitBatch` messages, with the `thrift` crate's protocol implementation.
//!
//! Only the fields the tests look at are kept; every other field is skipped by type, as any
//! Thrift reader does.

use std::net::UdpSocket;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thrift::protocol::{TCompactInputProtocol, TInputProtocol, TType};

/// One decoded `emitBatch`.
#[derive(Debug, Clone)]
pub struct Batch {
    /// `Process.serviceName`.
    pub service_name: String,
    /// The batch's spans.
    pub spans: Vec<Span>,
}

/// One decoded Jaeger span.
#[derive(Debug, Clone, Default)]
pub struct Span {
    /// The 128-bit trace id.
    pub trace_id: u128,
    /// The span id.
    pub span_id: u64,
    /// The parent's span id, 0 for a root span.
    pub parent_span_id: u64,
    /// `operationName`.
    pub operation_name: String,
    /// Tags as key and value rendered as text.
    pub tags: Vec<(String, TagValue)>,
}

/// A Jaeger tag value.
#[derive(Debug, Clone, PartialEq)]
pub enum TagValue {
    /// `vStr`
    Str(String),
    /// `vDouble`
    Double(f64),
    /// `vBool`
    Bool(bool),
    /// `vLong`
    Long(i64),
    /// `vBinary`
    Binary(Vec<u8>),
}

impl Span {
    /// The value of tag `key`, if present.
    pub fn tag(&self, key: &str) -> Option<&TagValue> {
        self.tags.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The value of a string tag.
    pub fn str_tag(&self, key: &str) -> Option<&str> {
        match self.tag(key)? {
            TagValue::Str(text) => Some(text),
            _ => None,
        }
    }

    /// The value of an integer tag.
    pub fn long_tag(&self, key: &str) -> Option<i64> {
        match self.tag(key)? {
            TagValue::Long(number) => Some(*number),
            _ => None,
        }
    }
}

/// A UDP socket standing in for the agent, with a thread decoding every packet.
pub struct Agent {
    /// The port to give the host as `OTEL_EXPORTER_JAEGER_AGENT_PORT`.
    pub port: u16,
    batches: mpsc::Receiver<Batch>,
    received: Vec<Batch>,
}

impl Agent {
    /// Binds `127.0.0.1:0` and starts decoding.
    pub fn start() -> Agent {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let (sender, batches) = mpsc::channel();
        std::thread::spawn(move || {
            let mut packet = vec![0; 65_536];
            while let Ok(length) = socket.recv(&mut packet) {
                let batch = decode_emit_batch(&packet[..length])
                    .expect("a packet is a Thrift compact emitBatch");
                if sender.send(batch).is_err() {
                    break;
                }
            }
        });
        Agent {
            port,
            batches,
            received: Vec::new(),
        }
    }

    /// Collects batches until `done` holds for every span received so far, or panics after 20 s.
    pub fn wait_for(&mut self, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .batches
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(batch) => self.received.push(batch),
                Err(_) if Instant::now() >= deadline => {
                    panic!("spans never arrived; received: {spans:#?}")
                }
                Err(_) => {}
            }
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.received
            .iter()
            .flat_map(|batch| batch.spans.clone())
            .collect()
    }

    /// Every batch received so far.
    pub fn batches(&self) -> &[Batch] {
        &self.received
    }
}

/// Decodes one `Agent.emitBatch` message (Thrift compact protocol, one-way call).
pub fn decode_emit_batch(packet: &[u8]) -> thrift::Result<Batch> {
    let mut protocol = TCompactInputProtocol::new(packet);
    let message = protocol.read_message_begin()?;
    assert_eq!(message.name, "emitBatch");
    let mut batch = None;
    read_struct(&mut protocol, |protocol, id, _| {
        if id != 1 {
            return Ok(false);
        }
        batch = Some(read_batch(protocol)?);
        Ok(true)
    })?;
    protocol.read_message_end()?;
    batch.ok_or_else(|| thrift::Error::from("emitBatch without a batch"))
}

type Protocol<'a> = TCompactInputProtocol<&'a [u8]>;

/// Reads a struct, calling `field` for each field; a field it does not take (false) is skipped.
fn read_struct<'a>(
    protocol: &mut Protocol<'a>,
    mut field: impl FnMut(&mut Protocol<'a>, i16, TType) -> thrift::Result<bool>,
) -> thrift::Result<()> {
    protocol.read_struct_begin()?;
    loop {
        let identifier = protocol.read_field_begin()?;
        if identifier.field_type == TType::Stop {
            break;
        }
        let id = identifier.id.unwrap_or_default();
        if !field(protocol, id, identifier.field_type)? {
            protocol.skip(identifier.field_type)?;
        }
        protocol.read_field_end()?;
    }
    protocol.read_struct_end()
}

fn read_list<'a, T>(
    protocol: &mut Protocol<'a>,
    mut element: impl FnMut(&mut Protocol<'a>) -> thrift::Result<T>,
) -> thrift::Result<Vec<T>> {
    let list = protocol.read_list_begin()?;
    let items = (0..list.size)
        .map(|_| element(protocol))
        .collect::<thrift::Result<Vec<T>>>()?;
    protocol.read_list_end()?;
    Ok(items)
}

fn read_batch(protocol: &mut Protocol<'_>) -> thrift::Result<Batch> {
    let mut batch = Batch {
        service_name: String::new(),
        spans: Vec::new(),
    };
    read_struct(protocol, |protocol, id, _| {
        match id {
            1 => read_struct(protocol, |protocol, id, _| {
                if id != 1 {
                    return Ok(false);
                }
                batch.service_name = protocol.read_string()?;
                Ok(true)
            })?,
            2 => batch.spans = read_list(protocol, read_span)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(batch)
}

fn read_span(protocol: &mut Protocol<'_>) -> thrift::Result<Span> {
    let mut span = Span::default();
    let (mut low, mut high) = (0i64, 0i64);
    read_struct(protocol, |protocol, id, _| {
        match id {
            1 => low = protocol.read_i64()?,
            2 => high = protocol.read_i64()?,
            3 => span.span_id = protocol.read_i64()? as u64,
            4 => span.parent_span_id = protocol.read_i64()? as u64,
            5 => span.operation_name = protocol.read_string()?,
            10 => span.tags = read_list(protocol, read_tag)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    span.trace_id = (u128::from(high as u64) << 64) | u128::from(low as u64);
    Ok(span)
}

fn read_tag(protocol: &mut Protocol<'_>) -> thrift::Result<(String, TagValue)> {
    let mut key = String::new();
    let mut value = None;
    read_struct(protocol, |protocol, id, _| {
        match id {
            1 => key = protocol.read_string()?,
            3 => value = Some(TagValue::Str(protocol.read_string()?)),
            4 => value = Some(TagValue::Double(protocol.read_double()?)),
            5 => value = Some(TagValue::Bool(protocol.read_bool()?)),
            6 => value = Some(TagValue::Long(protocol.read_i64()?)),
            7 => value = Some(TagValue::Binary(protocol.read_bytes()?)),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok((
        key,
        value.ok_or_else(|| thrift::Error::from("tag without a value"))?,
    ))
}

/// The server span of the request whose `x-request-id` was `request_id`, if it arrived.
pub fn server_span<'a>(spans: &'a [Span], request_id: &str) -> Option<&'a Span> {
    spans.iter().find(|span| {
        span.str_tag("span.kind") == Some("server")
            && span.str_tag("request_id") == Some(request_id)
    })
}
