//! The wasm engines, their shared memory and stack pools and epoch ticker, and their linkers:
//! built once per process; loading a component makes a [`Guest`].
//!
//! Two engines, because the component model's concurrency costs every call: with it on, wasmtime
//! runs even a WASIp2 guest's one synchronous call inside its event loop, which took about a
//! quarter off a WASIp2 request (`bench/runs/2026-11-29-wasip3-trial.md`). So a WASIp2 guest is
//! compiled for an engine without it, and only a WASIp3 guest for the engine that has it.

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
use crate::runtime::pool::{self, MemoryAccess, POOL_TRIM_PERIOD};
use crate::runtime::store::RequestState;

/// The wasm engines and the linkers that provide a guest's imports. Built once per process.
pub struct Runtime {
    /// For guests exporting `wasi:http/incoming-handler@0.2`: no component-model concurrency.
    wasip2: Linked,
    /// For guests exporting `wasi:http/handler@0.3.0`: component-model async, and WASIp3's
    /// interfaces beside WASIp2's.
    wasip3: Linked,
    cache: ComponentCache,
    limits: GuestLimits,
    /// The pools, memory budget and instance slots, shared by every guest this runtime loads.
    capacity: Arc<GuestCapacity>,
    /// The destinations guests may call.
    outbound: Arc<OutboundRules>,
    /// Advances the engines' epochs, which drive deadlines and yields, and trims the pools;
    /// stops when dropped.
    _ticker: EpochTicker,
}

/// An engine, and the linker of its guests' imports.
struct Linked {
    engine: Engine,
    linker: Linker<RequestState>,
}

impl Linked {
    /// An engine of `config` whose linker has WASIp2 (full: a Rust `std` guest imports
    /// `wasi:cli` and friends beyond the proxy world), WASIp3 when `wasip3`, and the service's
    /// own interfaces.
    fn new(config: &wasmtime::Config, wasip3: bool) -> wasmtime::Result<Linked> {
        let engine = Engine::new(config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        if wasip3 {
            wasmtime_wasi::p3::add_to_linker(&mut linker)?;
            wasmtime_wasi_http::p3::add_to_linker(&mut linker)?;
        }
        crate::interfaces::users::add_to_linker(&mut linker)?;
        crate::interfaces::telemetry::add_to_linker(&mut linker)?;
        crate::interfaces::otel::add_to_linker(&mut linker)?;
        Ok(Linked { engine, linker })
    }
}

/// How often the epoch advances: the granularity of deadlines, and how long a guest computes
/// before it yields its thread to other requests.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

impl Runtime {
    /// The engines and linkers, WASIp2 and WASIp3, with `wasi:http` and the service's `users`,
    /// `telemetry` and `wasi:otel`. Compiled components are cached in `cache`; every instance
    /// lives within `limits`.
    pub fn new(cache: ComponentCache, limits: GuestLimits) -> Result<Runtime, Error> {
        let capacity = Arc::new(GuestCapacity::new(limits));
        let wasip2 = engine_config(&capacity, false, MemoryAccess::BoundsChecked);
        let wasip2 = Linked::new(&wasip2, false).map_err(Error::Runtime)?;
        // With reuse on, every instance of this engine serves many requests, so the page
        // protections of its memory change only when it starts and ends.
        let access = if limits.reuse.is_on() {
            MemoryAccess::GuardPages
        } else {
            MemoryAccess::BoundsChecked
        };
        let wasip3 = engine_config(&capacity, true, access);
        let wasip3 = Linked::new(&wasip3, true).map_err(Error::Runtime)?;
        let _ticker = EpochTicker::start(
            [wasip2.engine.clone(), wasip3.engine.clone()],
            Arc::clone(&capacity),
        );
        Ok(Runtime {
            wasip2,
            wasip3,
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
        let wasip3 = crate::runtime::admission::exports_wasip3_handler(&bytes);
        // Reused instances are served by wasmtime-wasi-http's handler, which needs concurrency
        // support, whichever the export: a WASIp2 guest is then compiled for WASIp3's engine.
        let concurrent = wasip3 || self.limits.reuse.is_on();
        let linked = if concurrent {
            &self.wasip3
        } else {
            &self.wasip2
        };
        let (component, outcome) = self
            .cache
            .load_or_compile(&linked.engine, &bytes)
            .map_err(invalid)?;
        // wasmtime has validated the binary; now the host's own rules.
        crate::runtime::admission::check(&bytes).map_err(|source| Error::GuestRefused {
            path: path.to_owned(),
            source,
        })?;
        let instance_pre = linked.linker.instantiate_pre(&component).map_err(invalid)?;
        let pre = HandlerPre::new(instance_pre, wasip3).map_err(invalid)?;
        let guest = Guest::new(
            pre,
            self.limits,
            Arc::clone(&self.capacity),
            Arc::clone(&self.outbound),
        )
        .map_err(invalid)?;
        Ok((guest, outcome))
    }
}

/// Epoch interruption (deadlines and yields), and memories and stacks from `capacity`'s pools,
/// memories reached as `access` says (see [`crate::runtime::pool`]); the component model's
/// concurrency (`stream` and `future` types, async lifts and lowers) only when `wasip3`.
fn engine_config(capacity: &GuestCapacity, wasip3: bool, access: MemoryAccess) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        .concurrency_support(wasip3)
        .wasm_component_model_async(wasip3)
        .allocation_strategy(InstanceAllocationStrategy::OnDemand);
    pool::configure(
        &mut config,
        Arc::clone(&capacity.memories),
        Arc::clone(&capacity.stacks),
        access,
    );
    config
}

/// A thread that advances the engines' epochs every [`EPOCH_TICK`], and trims the pools every
/// [`POOL_TRIM_PERIOD`], until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engines: [Engine; 2], capacity: Arc<GuestCapacity>) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                let mut last_trim = std::time::Instant::now();
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
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
