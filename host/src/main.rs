//! Starts the host: configuration, telemetry, the guest, the listener, then serve until a signal.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use host::cache::ComponentCache;
use host::config::{self, Config};
use host::guest::Runtime;
use host::instrument;
use host::reload::Reloader;
use host::server::{self, App, ServingGuest};
use host::user_store::UserStore;
use tokio::net::TcpListener;

// Every request allocates and frees its store, WASI and HTTP resources, span and metric labels
// across threads; mimalloc's thread-local free lists serve that pattern about 10 % faster than
// glibc's malloc here (bench/PROFILE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Scheduler ticks between two polls of the network by a busy worker.
const EVENT_INTERVAL: u32 = 4;

fn main() -> ExitCode {
    // SAFETY: first thing in `main`, before any other thread exists.
    unsafe { config::normalize_environment() };
    let args = config::normalized_args(std::env::args_os());
    let config = match Config::try_parse_from(&args) {
        Ok(config) => config,
        // `--help` and `--version` print to stdout and exit 0.
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            // An error names what the user set: the variable when the value came from one.
            eprint!("{}", config::explain(error, &args));
            return ExitCode::from(2);
        }
    };
    let telemetry_settings = match config.telemetry() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    // A worker running guests polls the network only every `event_interval` scheduler ticks; a
    // guest yields at every epoch tick, so the default (61) would let computations delay the
    // accept loop and cheap requests by tens of milliseconds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .build()
        .expect("starting the tokio runtime");
    // The exporter's batch task lives in the runtime, so telemetry starts inside it.
    let telemetry =
        runtime.block_on(async { instrument::init(&config.log_file, &telemetry_settings) });
    let outcome = runtime.block_on(run(config));
    // Flush spans and logs from this (blocking) thread while the runtime still runs the
    // exporter's task; then let the runtime go.
    drop(telemetry);
    drop(runtime);
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, every cause named: a wasmtime error's own text may hold newlines.
            let error: &(dyn std::error::Error + 'static) = error.as_ref();
            eprintln!("error: {}", host::error::one_line(error));
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    let cache = ComponentCache::new(&config.cache_dir);
    let runtime = Arc::new(Runtime::new(cache, config.guest_limits())?);
    let loading = Instant::now();
    let (guest, cache) = runtime.load(&config.guest)?;
    // Start and reload follow one rule: a guest serves only once it has answered its probe 200
    // (`--probe-path off` loads one without a probe).
    let version = guest
        .probe_version(&config.probe_path)
        .await
        .with_context(|| {
            format!(
                "guest component {} failed its probe; fix it, or start with --probe-path off",
                config.guest.display()
            )
        })?;
    tracing::info!(
        guest = %config.guest.display(),
        version,
        cache = cache.as_str(),
        load_ms = loading.elapsed().as_millis() as u64,
        "guest loaded"
    );
    let users = Arc::new(UserStore::open(config.store_choice()?, config.max_users).await?);
    tracing::info!(
        store = users.kind(),
        max_users = config.max_users,
        "user store ready"
    );
    let app = Arc::new(App::new(
        ServingGuest { guest, version },
        users,
        config.client_limits(),
    ));

    let reloader = Arc::new(Reloader::new(
        runtime,
        Arc::clone(&app),
        config.guest.clone(),
        config.probe_path.clone(),
    ));
    Arc::clone(&reloader).reload_on_sighup();
    let _watcher = config
        .watch
        .then(|| reloader.watch().context("cannot watch the guest file"))
        .transpose()?;

    let addr = config.listen_addr();
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    // Every handler is installed before the line that tells the world the host is up.
    let shutdown = shutdown_signal();
    tracing::info!(
        pid = std::process::id(),
        "listening on http://{}",
        listener.local_addr()?
    );

    server::serve(listener, app, shutdown).await;
    tracing::info!("stopped");
    Ok(())
}

/// Installs the SIGTERM and SIGINT (Ctrl-C) handlers now, and completes on the first of them.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}
