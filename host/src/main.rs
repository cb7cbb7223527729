//! Starts the host: configuration, telemetry, the guest, the listener, then serve until a signal.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use host::config::Config;
use host::edge::server::{self, App};
use host::observability::pipeline::{self, Telemetry};
use host::runtime::cache::ComponentCache;
use host::runtime::reload::Reloader;
use host::runtime::{Runtime, Serving, ServingGuest};
use host::user_store::UserStore;
use tokio::net::TcpListener;

// Every request allocates and frees its store, WASI and HTTP resources, span and metric labels
// across threads; mimalloc's thread-local free lists serve that pattern about 10 % faster than
// glibc's malloc here (bench/PROFILE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long the exit waits for the runtime's last tasks after the telemetry's flush.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// Scheduler ticks between two polls of the network by a busy worker.
const EVENT_INTERVAL: u32 = 4;

fn main() -> ExitCode {
    let config = match Config::read(std::env::args_os(), |name| std::env::var_os(name)) {
        Ok(config) => config,
        Err(not_read) if not_read.is_error => {
            // An error names what the user set: the variable when the value came from one.
            eprint!("{}", not_read.message);
            return ExitCode::from(2);
        }
        // `--help` and `--version`.
        Err(not_read) => {
            print!("{}", not_read.message);
            return ExitCode::SUCCESS;
        }
    };
    let telemetry_settings = match config.telemetry(&|name| std::env::var_os(name)) {
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
    // The OTLP exporters' connections live in the runtime, so telemetry starts inside it.
    let telemetry = runtime.block_on(async { pipeline::init(&telemetry_settings) });
    let outcome = runtime.block_on(run(config, &telemetry));
    // Flush spans, metrics and logs from this (blocking) thread while the runtime still runs
    // the exporters' connections; then let the runtime go.
    drop(telemetry);
    // A task stuck in the blocking pool (a name lookup on a dead resolver) must not hold the exit.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
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

async fn run(config: Config, telemetry: &Telemetry) -> anyhow::Result<()> {
    let cache = ComponentCache::new(&config.runtime.cache_dir);
    let runtime = Arc::new(
        Runtime::new(cache, config.runtime.limits())?
            .allowing_outbound(config.runtime.allow_outbound.clone()),
    );
    let loading = Instant::now();
    let (guest, cache) = runtime.load(&config.runtime.guest)?;
    // Start and reload follow one rule: a guest serves only once it has answered its probe 200
    // (`--probe-path off` loads one without a probe).
    let version = guest
        .probe_version(&config.runtime.probe_path)
        .await
        .with_context(|| {
            format!(
                "guest component {} failed its probe; rebuild it (`make build`), fix it, or start with --probe-path off",
                config.runtime.guest.display()
            )
        })?;
    tracing::info!(
        guest = %config.runtime.guest.display(),
        version,
        cache = cache.as_str(),
        instances = guest.instances(),
        load_ms = loading.elapsed().as_millis() as u64,
        "guest loaded"
    );
    let users = Arc::new(UserStore::open(config.store_choice()?, config.users.max_users).await?);
    tracing::info!(
        store = users.kind(),
        max_users = config.users.max_users,
        "user store ready"
    );
    let serving = Arc::new(Serving::new(ServingGuest { guest, version }));
    let metrics = telemetry.metrics();
    let app = Arc::new(
        App::new(
            Arc::clone(&serving),
            users,
            Arc::clone(&metrics),
            config.edge.client_limits(config.runtime.response_stall()),
        )
        .with_host_pages(config.edge.host_pages()),
    );
    if let Some(every) = telemetry.metric_push_interval() {
        tokio::spawn(Arc::clone(&app).refresh_users_stored(every));
    }

    let reloader = Arc::new(Reloader::new(
        runtime,
        serving,
        metrics,
        config.runtime.guest.clone(),
        config.runtime.probe_path.clone(),
    ));
    Arc::clone(&reloader).reload_on_sighup();
    let _watcher = config
        .runtime
        .watch
        .then(|| reloader.watch().context("cannot watch the guest file"))
        .transpose()?;

    let addr = config.edge.listen_addr();
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
