//! A real OTLP receiver in the test process, on either transport: an HTTP endpoint that decodes
//! `ExportTraceServiceRequest` protobuf bodies, or a gRPC `TraceService`. It keeps every span
//! it receives, flattened with its resource.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use serde_json::Value;

/// One span as the collector got it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    /// Hex, as Jaeger shows it.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SpanKind` of the protocol: 2 is server, 3 client.
    pub kind: i32,
    pub attributes: HashMap<String, Value>,
    /// The attributes of the resource the span came with.
    pub resource: HashMap<String, Value>,
}

impl ReceivedSpan {
    pub fn str_attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).and_then(Value::as_str)
    }
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Every export is accepted at once.
    Answers,
    /// Every export is read and then left without an answer, for ever.
    NeverAnswers,
}

/// A collector listening on `127.0.0.1`, serving from a thread of its own.
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Requests received, answered or not.
    exports: Arc<Mutex<u64>>,
    /// The headers (gRPC: metadata) of every export received.
    headers: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl Collector {
    /// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf).
    pub fn http(behaviour: Behaviour) -> Collector {
        Collector::start(move |listener, received| {
            Box::pin(serve_http(listener, received, behaviour))
        })
    }

    /// An OTLP/gRPC receiver (`TraceService/Export`).
    pub fn grpc(behaviour: Behaviour) -> Collector {
        Collector::start(move |listener, received| {
            Box::pin(serve_grpc(listener, received, behaviour))
        })
    }

    fn start(
        serve: impl FnOnce(
            tokio::net::TcpListener,
            Received,
        ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + 'static,
    ) -> Collector {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let exports = Arc::new(Mutex::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let received = Received {
            spans: Arc::clone(&spans),
            exports: Arc::clone(&exports),
            headers: Arc::clone(&headers),
        };
        let (addr_sender, addr_receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_sender.send(listener.local_addr().unwrap()).unwrap();
                serve(listener, received).await;
            });
        });
        let addr = addr_receiver.recv().unwrap();
        Collector {
            addr,
            spans,
            exports,
            headers,
        }
    }

    /// The headers of every export received so far.
    pub fn headers(&self) -> Vec<HashMap<String, String>> {
        self.headers.lock().unwrap().clone()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Export requests received so far, answered or not.
    pub fn exports(&self) -> u64 {
        *self.exports.lock().unwrap()
    }

    /// Waits up to 10 s until the spans received satisfy `done`; returns them either way.
    pub fn wait_for(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where the serving task puts what it receives.
#[derive(Clone)]
struct Received {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    exports: Arc<Mutex<u64>>,
    headers: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl Received {
    fn keep(&self, headers: &http::HeaderMap, request: ExportTraceServiceRequest) {
        let headers = headers
            .iter()
            .map(|(name, value)| {
                (
                    name.to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect();
        self.headers.lock().unwrap().push(headers);
        *self.exports.lock().unwrap() += 1;
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|resource| attributes(&resource.attributes))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    spans.push(ReceivedSpan {
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        kind: span.kind,
                        attributes: attributes(&span.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }
}

async fn serve_http(listener: tokio::net::TcpListener, received: Received, behaviour: Behaviour) {
    use http_body_util::BodyExt;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let received = received.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                let received = received.clone();
                async move {
                    let path_ok = request.uri().path() == "/v1/traces";
                    let (parts, body) = request.into_parts();
                    let body: hyper::body::Incoming = body;
                    let decoded = match body.collect().await {
                        Ok(collected) => {
                            ExportTraceServiceRequest::decode(collected.to_bytes()).ok()
                        }
                        Err(_) => None,
                    };
                    let status = match (path_ok, decoded) {
                        (true, Some(request)) => {
                            received.keep(&parts.headers, request);
                            200
                        }
                        _ => 400,
                    };
                    if behaviour == Behaviour::NeverAnswers {
                        std::future::pending::<()>().await;
                    }
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    hyper::Response::builder()
                        .status(status)
                        .header("content-type", "application/x-protobuf")
                        .body(http_body_util::Full::new(bytes::Bytes::from(answer)))
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

async fn serve_grpc(listener: tokio::net::TcpListener, received: Received, behaviour: Behaviour) {
    let incoming = tokio_stream_of(listener);
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(GrpcReceiver {
            received,
            behaviour,
        }))
        .serve_with_incoming(incoming)
        .await
        .unwrap();
}

/// The listener's connections as the stream tonic serves from.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

struct GrpcReceiver {
    received: Received,
    behaviour: Behaviour,
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        // tonic 0.11's metadata is on http 0.2: copied over as text.
        let mut headers = http::HeaderMap::new();
        for (name, value) in request.metadata().clone().into_headers().iter() {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_str().as_bytes()),
                http::HeaderValue::from_bytes(value.as_bytes()),
            ) {
                headers.append(name, value);
            }
        }
        self.received.keep(&headers, request.into_inner());
        if self.behaviour == Behaviour::NeverAnswers {
            std::future::pending::<()>().await;
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attributes(pairs: &[KeyValue]) -> HashMap<String, Value> {
    pairs
        .iter()
        .map(|pair| (pair.key.clone(), any_value(pair.value.as_ref())))
        .collect()
}

fn any_value(value: Option<&AnyValue>) -> Value {
    match value.and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => Value::from(text.as_str()),
        Some(any_value::Value::IntValue(number)) => Value::from(*number),
        Some(any_value::Value::BoolValue(flag)) => Value::from(*flag),
        Some(any_value::Value::DoubleValue(number)) => Value::from(*number),
        Some(other) => Value::from(format!("{other:?}")),
        None => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
