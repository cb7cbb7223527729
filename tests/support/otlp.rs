//! A real OTLP receiver in the test process, on either transport: an HTTP endpoint that decodes
//! the protobuf bodies posted to `/v1/traces`, `/v1/metrics` and `/v1/logs`, or the three gRPC
//! services. It keeps every span, metric data point and log record it receives, flattened.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
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

/// One metric data point as the collector got it (the newest export's points only: metrics are
/// cumulative, so the last push holds every count).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedPoint {
    pub metric: String,
    pub unit: String,
    /// `sum` (monotonic, cumulative), `gauge` or `histogram`.
    pub kind: &'static str,
    /// Attributes, as `/metrics` labels are: every value as text.
    pub attributes: HashMap<String, String>,
    /// A sum's or gauge's value, a histogram's sum.
    pub value: f64,
    /// A histogram's count.
    pub count: u64,
    /// A histogram's explicit bounds and bucket counts (not cumulative, as OTLP sends them).
    pub bounds: Vec<f64>,
    pub bucket_counts: Vec<u64>,
    /// The attributes of the resource the point came with.
    pub resource: HashMap<String, Value>,
}

/// One log record as the collector got it.
#[derive(Debug, Clone)]
pub struct ReceivedLog {
    pub severity_text: String,
    pub severity_number: i32,
    pub body: Value,
    pub attributes: HashMap<String, Value>,
    /// Hex; empty outside a trace.
    pub trace_id: String,
    pub span_id: String,
    pub resource: HashMap<String, Value>,
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
    received: Received,
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
        let received = Received::default();
        let serving = received.clone();
        let (addr_sender, addr_receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_sender.send(listener.local_addr().unwrap()).unwrap();
                serve(listener, serving).await;
            });
        });
        let addr = addr_receiver.recv().unwrap();
        Collector { addr, received }
    }

    /// The headers of every span export received so far.
    pub fn headers(&self) -> Vec<HashMap<String, String>> {
        self.received.0.lock().unwrap().span_headers.clone()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.0.lock().unwrap().spans.clone()
    }

    /// Span export requests received so far, answered or not.
    pub fn exports(&self) -> u64 {
        self.received.0.lock().unwrap().span_exports
    }

    /// Metric export requests received so far, answered or not.
    pub fn metric_exports(&self) -> u64 {
        self.received.0.lock().unwrap().metric_exports
    }

    /// Log export requests received so far, answered or not.
    pub fn log_exports(&self) -> u64 {
        self.received.0.lock().unwrap().log_exports
    }

    /// The data points of the newest metric export.
    pub fn points(&self) -> Vec<ReceivedPoint> {
        self.received.0.lock().unwrap().points.clone()
    }

    /// Every log record received so far.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        self.received.0.lock().unwrap().logs.clone()
    }

    /// Waits up to 10 s until the newest metric export satisfies `done`; returns its points
    /// either way.
    pub fn wait_for_points(&self, done: impl Fn(&[ReceivedPoint]) -> bool) -> Vec<ReceivedPoint> {
        wait(|| self.points(), done)
    }

    /// Waits up to 10 s until the log records received satisfy `done`; returns them either way.
    pub fn wait_for_logs(&self, done: impl Fn(&[ReceivedLog]) -> bool) -> Vec<ReceivedLog> {
        wait(|| self.logs(), done)
    }

    /// Waits up to 10 s until the spans received satisfy `done`; returns them either way.
    pub fn wait_for(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        wait(|| self.spans(), done)
    }
}

/// Reads `now` until `done` says yes, for 10 s at most; the last reading either way.
fn wait<T>(now: impl Fn() -> Vec<T>, done: impl Fn(&[T]) -> bool) -> Vec<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let items = now();
        if done(&items) || Instant::now() > deadline {
            return items;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where the serving task puts what it receives.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Receipts>>);

#[derive(Default)]
struct Receipts {
    spans: Vec<ReceivedSpan>,
    span_exports: u64,
    /// The headers (gRPC: metadata) of every span export.
    span_headers: Vec<HashMap<String, String>>,
    points: Vec<ReceivedPoint>,
    metric_exports: u64,
    logs: Vec<ReceivedLog>,
    log_exports: u64,
}

/// One export request of any signal.
enum Export {
    Spans(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
    Logs(ExportLogsServiceRequest),
}

impl Received {
    fn keep(&self, headers: &http::HeaderMap, export: Export) {
        let mut receipts = self.0.lock().unwrap();
        match export {
            Export::Spans(request) => {
                let headers = headers
                    .iter()
                    .map(|(name, value)| {
                        (
                            name.to_string(),
                            String::from_utf8_lossy(value.as_bytes()).into_owned(),
                        )
                    })
                    .collect();
                receipts.span_headers.push(headers);
                receipts.span_exports += 1;
                receipts.spans.extend(spans_of(request));
            }
            Export::Metrics(request) => {
                receipts.metric_exports += 1;
                receipts.points = points_of(request);
            }
            Export::Logs(request) => {
                receipts.log_exports += 1;
                receipts.logs.extend(logs_of(request));
            }
        }
    }
}

fn spans_of(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
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
    spans
}

fn points_of(request: ExportMetricsServiceRequest) -> Vec<ReceivedPoint> {
    let mut points = Vec::new();
    for resource_metrics in request.resource_metrics {
        let resource = resource_metrics
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        for scope_metrics in resource_metrics.scope_metrics {
            for metric in scope_metrics.metrics {
                let point = |kind, attributes: &[KeyValue]| ReceivedPoint {
                    metric: metric.name.clone(),
                    unit: metric.unit.clone(),
                    kind,
                    attributes: label_values(attributes),
                    value: 0.0,
                    count: 0,
                    bounds: Vec::new(),
                    bucket_counts: Vec::new(),
                    resource: resource.clone(),
                };
                let number = |value: &Option<number_data_point::Value>| match value {
                    Some(number_data_point::Value::AsDouble(value)) => *value,
                    Some(number_data_point::Value::AsInt(value)) => *value as f64,
                    None => f64::NAN,
                };
                match &metric.data {
                    Some(metric::Data::Sum(sum)) => {
                        for data in &sum.data_points {
                            points.push(ReceivedPoint {
                                value: number(&data.value),
                                ..point("sum", &data.attributes)
                            });
                        }
                    }
                    Some(metric::Data::Gauge(gauge)) => {
                        for data in &gauge.data_points {
                            points.push(ReceivedPoint {
                                value: number(&data.value),
                                ..point("gauge", &data.attributes)
                            });
                        }
                    }
                    Some(metric::Data::Histogram(histogram)) => {
                        for data in &histogram.data_points {
                            points.push(ReceivedPoint {
                                value: data.sum.unwrap_or(f64::NAN),
                                count: data.count,
                                bounds: data.explicit_bounds.clone(),
                                bucket_counts: data.bucket_counts.clone(),
                                ..point("histogram", &data.attributes)
                            });
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    points
}

fn logs_of(request: ExportLogsServiceRequest) -> Vec<ReceivedLog> {
    let mut logs = Vec::new();
    for resource_logs in request.resource_logs {
        let resource = resource_logs
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        for scope_logs in resource_logs.scope_logs {
            for record in scope_logs.log_records {
                logs.push(ReceivedLog {
                    severity_text: record.severity_text,
                    severity_number: record.severity_number,
                    body: any_value(record.body.as_ref()),
                    attributes: attributes(&record.attributes),
                    trace_id: hex(&record.trace_id),
                    span_id: hex(&record.span_id),
                    resource: resource.clone(),
                });
            }
        }
    }
    logs
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
                    let path = request.uri().path().to_string();
                    let (parts, body) = request.into_parts();
                    let body: hyper::body::Incoming = body;
                    let bytes = match body.collect().await {
                        Ok(collected) => collected.to_bytes(),
                        Err(_) => bytes::Bytes::new(),
                    };
                    let decoded = match path.as_str() {
                        "/v1/traces" => ExportTraceServiceRequest::decode(bytes)
                            .ok()
                            .map(Export::Spans),
                        "/v1/metrics" => ExportMetricsServiceRequest::decode(bytes)
                            .ok()
                            .map(Export::Metrics),
                        "/v1/logs" => ExportLogsServiceRequest::decode(bytes)
                            .ok()
                            .map(Export::Logs),
                        _ => None,
                    };
                    let status = match decoded {
                        Some(export) => {
                            received.keep(&parts.headers, export);
                            200
                        }
                        None => 400,
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
    let receiver = GrpcReceiver {
        received,
        behaviour,
    };
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(receiver.clone()))
        .add_service(MetricsServiceServer::new(receiver.clone()))
        .add_service(LogsServiceServer::new(receiver))
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

#[derive(Clone)]
struct GrpcReceiver {
    received: Received,
    behaviour: Behaviour,
}

impl GrpcReceiver {
    /// Keeps `export` with its metadata, then answers, or never does.
    async fn receive<T: Default>(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        export: Export,
    ) -> Result<tonic::Response<T>, tonic::Status> {
        self.received.keep(&metadata.clone().into_headers(), export);
        if self.behaviour == Behaviour::NeverAnswers {
            std::future::pending::<()>().await;
        }
        Ok(tonic::Response::new(T::default()))
    }
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        self.receive(&metadata, Export::Spans(request.into_inner()))
            .await
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        self.receive(&metadata, Export::Metrics(request.into_inner()))
            .await
    }
}

#[tonic::async_trait]
impl LogsService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        self.receive(&metadata, Export::Logs(request.into_inner()))
            .await
    }
}

/// Attribute values as `/metrics` shows labels: text.
fn label_values(pairs: &[KeyValue]) -> HashMap<String, String> {
    attributes(pairs)
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect()
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
