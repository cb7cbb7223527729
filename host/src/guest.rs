//! The guest component: compiled and linked once, instantiated afresh for every request.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::sync::oneshot;
use tracing::Instrument;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Engine, Store};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;

use crate::bindings::{ServicePre, telemetry, users};
use crate::cache::{CacheOutcome, ComponentCache};
use crate::error::{Error, one_line};
use crate::metrics::Metrics;
use crate::request_state::RequestState;
use crate::responses::ResponseBody;
use crate::user_store::UserStore;

/// The wasm engine and the linker that provides the guest's imports. Built once per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RequestState>,
    cache: ComponentCache,
}

impl Runtime {
    /// An engine and a linker with full WASI p2 (a Rust `std` guest imports `wasi:cli` and
    /// friends beyond the proxy world), `wasi:http`, and the service's `users` and `telemetry`.
    /// Compiled components are cached in `cache`.
    pub fn new(cache: ComponentCache) -> Result<Runtime, Error> {
        let engine =
            Engine::new(&wasmtime::Config::new()).map_err(|e| Error::Runtime(one_line(e)))?;
        let mut linker = Linker::new(&engine);
        let link = |linker: &mut Linker<RequestState>| -> wasmtime::Result<()> {
            wasmtime_wasi::p2::add_to_linker_async(linker)?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
            users::add_to_linker::<_, HasSelf<_>>(linker, |state| state)?;
            telemetry::add_to_linker::<_, HasSelf<_>>(linker, |state| state)?;
            Ok(())
        };
        link(&mut linker).map_err(|e| Error::Runtime(one_line(e)))?;
        Ok(Runtime {
            engine,
            linker,
            cache,
        })
    }

    /// Reads, compiles (or takes from the cache), links and pre-instantiates the component at
    /// `path`. Blocking: compiling takes tens to hundreds of milliseconds.
    pub fn load(&self, path: &Path) -> Result<(Guest, CacheOutcome), Error> {
        let bytes = std::fs::read(path).map_err(|io_error| Error::GuestUnreadable {
            path: path.to_owned(),
            io_error,
        })?;
        let invalid = |error: wasmtime::Error| Error::GuestInvalid {
            path: path.to_owned(),
            reason: one_line(error),
        };
        let (component, outcome) = self
            .cache
            .load_or_compile(&self.engine, &bytes)
            .map_err(invalid)?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(invalid)?;
        let pre = ServicePre::new(instance_pre).map_err(invalid)?;
        Ok((Guest { pre }, outcome))
    }
}

/// A loaded guest, ready to be instantiated.
#[derive(Clone)]
pub struct Guest {
    pre: ServicePre<RequestState>,
}

impl Guest {
    /// Runs one request through a fresh instance and returns its response.
    ///
    /// The instance runs in its own task: once it has sent the response head it keeps going,
    /// streaming the body, while the caller returns the response to hyper.
    /// The instance's task runs inside the caller's current span, so the guest's own spans and
    /// logs nest under the request's.
    pub async fn handle(
        &self,
        state: RequestState,
        request: http::Request<Full<Bytes>>,
        metrics: Option<&Arc<Metrics>>,
    ) -> Result<http::Response<ResponseBody>, Error> {
        let mut store = Store::new(self.pre.engine(), state);
        let (sender, receiver) = oneshot::channel();
        let setup = |store: &mut Store<RequestState>| -> wasmtime::Result<_> {
            let request = store
                .data_mut()
                .http()
                .new_incoming_request(Scheme::Http, request)?;
            let response_out = store.data_mut().http().new_response_outparam(sender)?;
            Ok((request, response_out))
        };
        let (request, response_out) =
            setup(&mut store).map_err(|e| Error::GuestFailed(one_line(e)))?;
        let pre = self.pre.clone();
        let metrics = metrics.cloned();
        let task = tokio::spawn(
            async move {
                let started = Instant::now();
                let service = pre.instantiate_async(&mut store).await?;
                if let Some(metrics) = metrics {
                    metrics.observe_instantiation(started.elapsed());
                }
                service
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, request, response_out)
                    .await
            }
            .in_current_span(),
        );
        match receiver.await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(code)) => Err(Error::GuestFailed(format!(
                "guest answered with error {code:?}"
            ))),
            // The sender is dropped with the store: the task has ended without a response.
            Err(_) => Err(Error::GuestFailed(match task.await {
                Ok(Ok(())) => "guest returned without sending a response".to_string(),
                Ok(Err(trap)) => one_line(trap),
                Err(join_error) => join_error.to_string(),
            })),
        }
    }

    /// Sends one `GET /api/health` through a fresh instance, with telemetry off and an empty
    /// store of its own, and returns the reported `version` (`unknown` when the 200's body has
    /// none). Anything but a 200 within [`PROBE_TIMEOUT`] is an error.
    pub async fn probe_version(&self) -> Result<String, Error> {
        let probe = async {
            let request = http::Request::get("/api/health")
                .header(http::header::HOST, "localhost")
                .body(Full::new(Bytes::new()))
                .expect("a static request is valid");
            let state = RequestState::quiet(Arc::new(UserStore::new(0)));
            let response = self.handle(state, request, None).await?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            if status != http::StatusCode::OK {
                return Err(Error::GuestFailed(format!(
                    "health probe answered {status}"
                )));
            }
            let version = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|health| health["version"].as_str().map(str::to_string));
            Ok(version.unwrap_or_else(|| "unknown".to_string()))
        };
        tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .map_err(|_| Error::GuestFailed("health probe timed out".to_string()))?
    }
}

/// How long the health probe of a new guest may take.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
