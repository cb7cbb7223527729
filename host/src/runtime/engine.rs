//! The wasm engine, its memory and stack pools and epoch ticker, and the linker: built once per
//! process; loading a component makes a [`Guest`].

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Engine, InstanceAllocationStrategy};

use crate::error::Error;
use crate::runtime::cache::{CacheOutcome, ComponentCache};
use crate::runtime::capacity::{GuestCapacity, GuestLimits};
use crate::runtime::guest::{Guest, HandlerPre};
use crate::runtime::outbound::OutboundRules;
use crate::runtime::pool::{self, POOL_TRIM_PERIOD};
use crate::runtime::store::RequestState;

/// The wasm engine and the linker that provides the guest's imports. Built once per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RequestState>,
    cache: ComponentCache,
    limits: GuestLimits,
    /// The pools, memory budget and instance slots, shared by every guest this runtime loads.
    capacity: Arc<GuestCapacity>,
    /// The destinations guests may call.
    outbound: Arc<OutboundRules>,
    /// Advances the engine's epoch, which drives deadlines and yields, and trims the pools;
    /// stops when dropped.
    _ticker: EpochTicker,
}

/// How often the epoch advances: the granularity of deadlines, and how long a guest computes
/// before it yields its thread to other requests.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

impl Runtime {
    /// An engine and a linker with full WASI p2 (a Rust `std` guest imports `wasi:cli` and
    /// friends beyond the proxy world), `wasi:http`, and the service's `users` and `telemetry`.
    /// Compiled components are cached in `cache`; every instance lives within `limits`.
    pub fn new(cache: ComponentCache, limits: GuestLimits) -> Result<Runtime, Error> {
        let capacity = Arc::new(GuestCapacity::new(limits));
        let engine = Engine::new(&engine_config(&capacity)).map_err(Error::Runtime)?;
        let mut linker = Linker::new(&engine);
        let link = |linker: &mut Linker<RequestState>| -> wasmtime::Result<()> {
            wasmtime_wasi::p2::add_to_linker_async(linker)?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
            wasmtime_wasi::p3::add_to_linker(linker)?;
            wasmtime_wasi_http::p3::add_to_linker(linker)?;
            crate::interfaces::users::add_to_linker(linker)?;
            crate::interfaces::telemetry::add_to_linker(linker)?;
            crate::interfaces::otel::add_to_linker(linker)?;
            Ok(())
        };
        link(&mut linker).map_err(Error::Runtime)?;
        let _ticker = EpochTicker::start(engine.clone(), Arc::clone(&capacity));
        Ok(Runtime {
            engine,
            linker,
            cache,
            limits,
            capacity,
            outbound: Arc::default(),
            _ticker,
        })
    }

    /// The same runtime, whose guests may call the destinations `rules` allow (none before).
    pub fn allowing_outbound(self, rules: OutboundRules) -> Runtime {
        Runtime {
            outbound: Arc::new(rules),
            ..self
        }
    }

    /// Reads, compiles (or takes from the cache), links and pre-instantiates the component at
    /// `path`. Blocking: compiling takes tens to hundreds of milliseconds.
    pub fn load(&self, path: &Path) -> Result<(Guest, CacheOutcome), Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::GuestUnreadable {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |source: wasmtime::Error| Error::GuestInvalid {
            path: path.to_owned(),
            source,
        };
        let (component, outcome) = self
            .cache
            .load_or_compile(&self.engine, &bytes)
            .map_err(invalid)?;
        // wasmtime has validated the binary; now the host's own rules.
        crate::runtime::admission::check(&bytes).map_err(|source| Error::GuestRefused {
            path: path.to_owned(),
            source,
        })?;
        let instance_pre = self.linker.instantiate_pre(&component).map_err(invalid)?;
        let pre = HandlerPre::new(instance_pre).map_err(invalid)?;
        let guest = Guest::new(
            pre,
            self.limits,
            Arc::clone(&self.capacity),
            Arc::clone(&self.outbound),
        );
        Ok((guest, outcome))
    }
}

/// Epoch interruption (deadlines and yields), and memories and stacks from `capacity`'s pools,
/// reused from instance to instance without changing page protections (see [`crate::runtime::pool`]).
fn engine_config(capacity: &GuestCapacity) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        // WASIp3 guests: `stream` and `future` types and async lifts and lowers.
        .wasm_component_model_async(true)
        .allocation_strategy(InstanceAllocationStrategy::OnDemand);
    pool::configure(
        &mut config,
        Arc::clone(&capacity.memories),
        Arc::clone(&capacity.stacks),
    );
    config
}

/// A thread that advances an engine's epoch every [`EPOCH_TICK`], and trims the pools every
/// [`POOL_TRIM_PERIOD`], until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, capacity: Arc<GuestCapacity>) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                let mut last_trim = std::time::Instant::now();
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                    if last_trim.elapsed() >= POOL_TRIM_PERIOD {
                        capacity.trim();
                        last_trim = std::time::Instant::now();
                    }
                }
            })
            .expect("spawning the epoch ticker thread");
        EpochTicker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
