//! The OTLP exporters of all three signals, and the one way a failing export is said.
//!
//! An export is tried once and given up at its timeout: opentelemetry-otlp's default retries
//! would send up to four times to a collector that fails fast, and let one export outlive its
//! timeout. Everything else the exporters read from the `OTEL_EXPORTER_OTLP_*` variables
//! themselves, once the host has checked them (settings.rs).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::GaiResolver;
use opentelemetry::context::{Context, FutureExt as _};
use opentelemetry_otlp::{RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::logs::{LogBatch, LogExporter};
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::observability::settings::{OtlpProtocol, OtlpSettings};

/// How often, at most, a failing export of one signal is said in a WARN line.
pub const EXPORT_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The most of a collector's answer that is read; an OTLP answer is a few bytes.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// An exporter whose failures are said in one WARN line a minute at most, so that a user whose
/// telemetry goes nowhere learns it without a flood of lines.
#[derive(Debug)]
pub struct Reported<E> {
    inner: E,
    /// `span`, `metric` or `log`: the WARN line starts "<signal> export failed".
    signal: &'static str,
    /// When the last line was said, and the failures since.
    last: Mutex<Option<(Instant, u64)>>,
}

impl<E> Reported<E> {
    /// `inner`, its failures said as exports of `signal`.
    pub fn new(inner: E, signal: &'static str) -> Reported<E> {
        Reported {
            inner,
            signal,
            last: Mutex::new(None),
        }
    }

    /// Says `outcome` if it is a failure: the first, then at most one a minute (the failures in
    /// between are counted in the next line).
    fn said(&self, outcome: OTelSdkResult) -> OTelSdkResult {
        let Err(error) = &outcome else {
            return outcome;
        };
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &mut *last {
            Some((said, unsaid)) if said.elapsed() < EXPORT_WARNING_INTERVAL => *unsaid += 1,
            _ => {
                let unsaid = last.map_or(0, |(_, unsaid)| unsaid);
                *last = Some((Instant::now(), 0));
                drop(last);
                tracing::warn!(
                    %error,
                    errors_since_last_line = unsaid,
                    "{} export failed; {}s are being lost (said at most once a minute)",
                    self.signal,
                    self.signal,
                );
            }
        }
        outcome
    }
}

impl<E: SpanExporter> SpanExporter for Reported<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.said(self.inner.export(batch).await)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl<E: LogExporter> LogExporter for Reported<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        self.said(self.inner.export(batch).await)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Reported<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        self.said(self.inner.export(metrics).await)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The error of an exporter that cannot be built from `settings`.
fn unbuilt(error: impl std::fmt::Display) -> OTelSdkError {
    OTelSdkError::InternalFailure(format!("cannot build the OTLP exporter: {error}"))
}

/// `builder` (a span, metric or log exporter's) finished for `settings`' transport, which the
/// SDK leaves to its caller: over HTTP with the host's client, over gRPC with the host's
/// channel (the SDK still adds the headers of the variables to each call); each export tried
/// once. The SDK reads the endpoint, headers, timeout and
/// compression from the variables, checked at start. A macro: the three builders share their
/// methods through traits, but each transport's builder is a type of its own per signal.
macro_rules! built_for {
    ($builder:expr, $settings:expr, $timeout:expr) => {{
        let (settings, timeout): (&OtlpSettings, Duration) = ($settings, $timeout);
        match settings.protocol {
            OtlpProtocol::HttpProtobuf => $builder
                .with_http()
                .with_http_client(OnRuntime::new(timeout)?)
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_retry_policy(RetryPolicy::disabled())
                .build(),
            OtlpProtocol::Grpc => $builder
                .with_tonic()
                .with_channel(grpc_channel(settings, timeout)?)
                .with_retry_policy(RetryPolicy::disabled())
                .build(),
        }
        .map_err(unbuilt)
    }};
}

/// A gRPC channel to the settings' endpoint, connected lazily (a collector that is not up yet
/// is no error at start), that gives up connecting after `timeout`: the SDK's own channel
/// bounds only a call, and a collector whose address never answers would hold each push for
/// the system's connect timeout, minutes. Must be called inside the tokio runtime.
fn grpc_channel(
    settings: &OtlpSettings,
    timeout: Duration,
) -> Result<tonic::transport::Channel, OTelSdkError> {
    channel_resolving_with(&settings.endpoint, timeout, GaiResolver::new())
}

/// A lazily connected channel to `endpoint`, its names looked up by `resolver`, whose every
/// connection, the lookup included, is given up after `timeout`. tonic's own connector bounds
/// only the TCP connects, after a lookup that a silent name server holds for as long as the
/// system's resolver waits; a connector given to tonic is bounded whole. Inside, as in tonic's
/// own, each of a name's addresses gets its share of `timeout`, so one that drops every packet
/// does not keep the next from being tried.
fn channel_resolving_with<R>(
    endpoint: &str,
    timeout: Duration,
    resolver: R,
) -> Result<tonic::transport::Channel, OTelSdkError>
where
    HttpConnector<R>: tower_service::Service<http::Uri> + Send + 'static,
    <HttpConnector<R> as tower_service::Service<http::Uri>>::Response:
        hyper::rt::Read + hyper::rt::Write + Send + Unpin,
    <HttpConnector<R> as tower_service::Service<http::Uri>>::Future: Send,
    <HttpConnector<R> as tower_service::Service<http::Uri>>::Error:
        std::error::Error + Send + Sync + 'static,
{
    let mut connector = HttpConnector::new_with_resolver(resolver);
    connector.enforce_http(false);
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeout));
    Ok(tonic::transport::Channel::from_shared(endpoint.to_owned())
        .map_err(unbuilt)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector_lazy(connector))
}

/// The span exporter to `settings`' collector, each export over HTTP given up after `timeout`
/// (the batch processor gives up a gRPC one).
pub fn span_exporter(
    settings: &OtlpSettings,
    timeout: Duration,
) -> Result<opentelemetry_otlp::SpanExporter, OTelSdkError> {
    built_for!(
        opentelemetry_otlp::SpanExporter::builder(),
        settings,
        timeout
    )
}

/// The metric exporter to `settings`' collector: cumulative sums and histograms, as `/metrics`
/// shows them, each export given up after the settings' timeout.
pub fn metric_exporter(
    settings: &OtlpSettings,
) -> Result<opentelemetry_otlp::MetricExporter, OTelSdkError> {
    let builder =
        opentelemetry_otlp::MetricExporter::builder().with_temporality(Temporality::Cumulative);
    built_for!(builder, settings, settings.timeout)
}

/// The log record exporter to `settings`' collector, each export given up after the settings'
/// timeout.
pub fn log_exporter(
    settings: &OtlpSettings,
) -> Result<opentelemetry_otlp::LogExporter, OTelSdkError> {
    built_for!(
        opentelemetry_otlp::LogExporter::builder(),
        settings,
        settings.timeout
    )
}

/// The OTLP/HTTP client: sends every export on the host's runtime (the SDK's batch processors
/// export from threads of their own, where reqwest's connections could not be driven), each
/// given up at the timeout (the SDK bounds only its own clients' sends).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    /// A client whose every export is given up after `timeout`. Not reqwest's default client:
    /// that one follows redirects (resending the headers, API keys included, wherever a
    /// collector points) and honours `HTTP_PROXY`. Must be called inside the tokio runtime.
    fn new(timeout: Duration) -> Result<OnRuntime, OTelSdkError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(unbuilt)?;
        Ok(OnRuntime {
            client,
            runtime: tokio::runtime::Handle::try_current().map_err(unbuilt)?,
        })
    }

    /// Sends `request` and reads the answer, at most `MAX_ANSWER_BYTES` of it.
    async fn send(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let exchange = async move {
            let mut response = client.execute(request).await?;
            let status = response.status();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                let room = MAX_ANSWER_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() == MAX_ANSWER_BYTES {
                    break;
                }
            }
            Ok::<_, reqwest::Error>((status, body))
        };
        // In the caller's context: the SDK's export threads mark it suppressed, so nothing the
        // HTTP stack logs while sending becomes a log record (which would be sent in turn).
        let (status, body) = self
            .runtime
            .spawn(exchange.with_context(Context::current()))
            .await??;
        let mut response = http::Response::new(Bytes::from(body));
        *response.status_mut() = status;
        Ok(response)
    }
}

impl opentelemetry_http::HttpClient for OnRuntime {
    fn send_bytes<'client, 'call>(
        &'client self,
        request: http::Request<Bytes>,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<http::Response<Bytes>, opentelemetry_http::HttpError>>
                + Send
                + 'call,
        >,
    >
    where
        'client: 'call,
        Self: 'call,
    {
        Box::pin(self.send(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_grpc_connection_whose_name_lookup_never_ends_is_given_up_at_the_timeout() {
        use tower_service::Service as _;
        // A name server that never answers.
        let silent = tower::service_fn(|_: hyper_util::client::legacy::connect::dns::Name| {
            std::future::pending::<Result<std::vec::IntoIter<std::net::SocketAddr>, std::io::Error>>(
            )
        });
        let mut channel = channel_resolving_with(
            "http://collector.invalid:4317",
            Duration::from_millis(200),
            silent,
        )
        .unwrap();
        let call = async {
            std::future::poll_fn(|context| channel.poll_ready(context)).await?;
            channel
                .call(http::Request::new(tonic::body::Body::empty()))
                .await
        };
        let started = Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(10), call).await;
        assert!(matches!(outcome, Ok(Err(_))), "the call was not given up");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
