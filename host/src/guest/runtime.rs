//! The wasm engine, its memory and stack pools and epoch ticker, and the linker: built once per
//! process; loading a component makes a [`Guest`].

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Engine, InstanceAllocationStrategy};

use super::Guest;
use super::pool::{MemoryPool, StackPool};
use super::slots::InstanceSlots;
use crate::bindings::ServicePre;
use crate::cache::{CacheOutcome, ComponentCache};
use crate::error::Error;
use crate::request_state::RequestState;

/// The wasm engine and the linker that provides the guest's imports. Built once per process.
pub struct Runtime {
    engine: Engine,
    linker: Linker<RequestState>,
    cache: ComponentCache,
    limits: GuestLimits,
    /// The instance slots, shared by every guest this runtime loads.
    slots: InstanceSlots,
    /// Advances the engine's epoch, which drives deadlines and yields; stops when dropped.
    _ticker: EpochTicker,
}

/// What one guest instance may use.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimits {
    /// Wall-clock time one request may run inside the guest.
    pub request_timeout: Duration,
    /// Linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// Instances working towards their response head at once (a reload's health probe counts
    /// as one).
    pub max_instances: u32,
    /// Instances beyond those that have sent their head and stream the rest of the body, so
    /// clients that read slowly do not hold the slots new requests need. The memory and stack
    /// pools hold enough for `max_instances + max_streaming` instances, plus one spare.
    pub max_streaming: u32,
}

/// How often the epoch advances: the granularity of deadlines, and how long a guest computes
/// before it yields its thread to other requests.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Each instance's async stack: the host calls it makes run on it too (wasmtime's default).
const GUEST_STACK_BYTES: usize = 2 << 20;

/// How long a request waits for a free instance slot before it is answered 503.
pub const SLOT_WAIT: Duration = Duration::from_secs(1);

/// Upper bounds per component (per store, by its limiter): a Rust `wasm32-wasip2`
/// component has one memory, a few tables and a handful of core instances (its module and the
/// canonical-ABI shims); these leave room for other toolchains' guests.
pub(super) const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
pub(super) const MEMORIES_PER_COMPONENT: u32 = 2;
pub(super) const TABLES_PER_COMPONENT: u32 = 8;
/// Elements one table may hold (the bound wasmtime's pooling allocator sets by default).
pub(super) const TABLE_ELEMENTS: usize = 20_000;

impl Runtime {
    /// An engine and a linker with full WASI p2 (a Rust `std` guest imports `wasi:cli` and
    /// friends beyond the proxy world), `wasi:http`, and the service's `users` and `telemetry`.
    /// Compiled components are cached in `cache`; every instance lives within `limits`.
    pub fn new(cache: ComponentCache, limits: GuestLimits) -> Result<Runtime, Error> {
        let engine = Engine::new(&engine_config(&limits)).map_err(Error::Runtime)?;
        let mut linker = Linker::new(&engine);
        let link = |linker: &mut Linker<RequestState>| -> wasmtime::Result<()> {
            wasmtime_wasi::p2::add_to_linker_async(linker)?;
            wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
            crate::users::add_to_linker(linker)?;
            crate::telemetry::add_to_linker(linker)?;
            Ok(())
        };
        link(&mut linker).map_err(Error::Runtime)?;
        let _ticker = EpochTicker::start(engine.clone());
        let slots = InstanceSlots::new(limits.max_instances, limits.max_streaming);
        Ok(Runtime {
            engine,
            linker,
            cache,
            limits,
            slots,
            _ticker,
        })
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
        let instance_pre = self.linker.instantiate_pre(&component).map_err(invalid)?;
        let pre = ServicePre::new(instance_pre).map_err(invalid)?;
        let guest = Guest {
            pre,
            limits: self.limits,
            slots: self.slots.clone(),
            route_templates: Arc::default(),
        };
        Ok((guest, outcome))
    }
}

/// Epoch interruption (deadlines and yields), and memories and stacks from pools sized by
/// `limits`, reused from instance to instance without changing page protections (see
/// [`super::pool`]).
fn engine_config(limits: &GuestLimits) -> wasmtime::Config {
    let slots = (limits.max_instances + limits.max_streaming + 1) as usize;
    let memories = Arc::new(MemoryPool::new(
        slots * MEMORIES_PER_COMPONENT as usize,
        limits.memory_bytes,
    ));
    // A store runs its instantiation and its call on one fiber at a time; two per slot leave
    // room for wasmtime keeping one stack while it starts the next.
    let stacks = Arc::new(StackPool::new(slots * 2, GUEST_STACK_BYTES));
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        .allocation_strategy(InstanceAllocationStrategy::OnDemand);
    super::pool::configure(&mut config, memories, stacks);
    config
}

/// A thread that advances an engine's epoch every [`EPOCH_TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("epoch-ticker".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
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
