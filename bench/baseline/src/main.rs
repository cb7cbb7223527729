//! Benchmark baseline: what answering `GET /api/health` costs a native tokio + hyper server,
//! with no wasm, no telemetry and no routing. `make bench` runs it beside the host.
//!
//! Usage: `baseline PORT`.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const HEALTH: &str = r#"{"status":"healthy","version":"0.1.0"}"#;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|port| port.parse().ok())
        .unwrap_or(8081);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_request| async {
                let response = Response::builder()
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from_static(HEALTH.as_bytes())))
                    .expect("a static response is valid");
                Ok::<_, Infallible>(response)
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
