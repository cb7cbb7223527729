//! Starts the host: configuration, logging, the guest, the listener, then serve until a signal.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use host::config::Config;
use host::guest::Runtime;
use host::server::{self, App};
use host::user_store::UserStore;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let guest = Runtime::new()?.load(&config.guest)?;
    let users = Arc::new(UserStore::new(config.max_users));
    let app = Arc::new(App::new(guest, users, config.max_body_bytes));

    let addr = config.listen_addr();
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(guest = %config.guest.display(), "listening on http://{}", listener.local_addr()?);

    server::serve(listener, app, shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on the first SIGTERM or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
