//! One request's record: what the host learns of a request while serving it. The route its
//! guest named, the first thing that failed on the host's side, and what its instance cost (the
//! time to instantiate it, the time it ran, its linear memory's high-water mark and the host calls
//! it made per interface). Made where the request enters, shared with every part that adds to it
//! (the guest's `telemetry` calls, the store calls, the memory limiter, outgoing calls), and read
//! when the answer is traced, logged and counted; the cost is reported once the instance ends
//! (answered, trapped, or stopped at its deadline), on the request's server span (`wasm.*`
//! attributes) and in the per-route `wasm_*` metrics.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use opentelemetry::KeyValue;

use crate::observability::metrics::Metrics;
use crate::observability::request_span::RequestSpan;
use crate::observability::routes::UNMATCHED;

/// What the host learns of one request while serving it, shared by everything that serves it.
#[derive(Debug, Default)]
pub struct RequestRecord {
    named: Mutex<Named>,
    /// What its instance costs; only grows, so it needs no lock.
    pub cost: RequestCost,
}

#[derive(Debug, Default)]
struct Named {
    /// The last route the guest (or the host, for its own page) named.
    route: Option<Arc<str>>,
    /// The route recorded on the span, if one was: an OpenTelemetry span appends an attribute
    /// at every set, so a guest naming routes in a loop must not reach the span each time.
    route_on_span: Option<Arc<str>>,
    /// What failed on the host's side, for the request's one ERROR or WARN line.
    fault: Option<String>,
}

impl RequestRecord {
    fn named(&self) -> MutexGuard<'_, Named> {
        self.named.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the request's route (the last one named wins). Returns it when the span should
    /// carry it now, that is when it is the request's first.
    pub fn name_route(&self, route: Arc<str>) -> Option<Arc<str>> {
        let mut named = self.named();
        named.route = Some(Arc::clone(&route));
        if named.route_on_span.is_some() {
            return None;
        }
        named.route_on_span = Some(Arc::clone(&route));
        Some(route)
    }

    /// The route named last, or [`UNMATCHED`]; and whether the span still needs it recorded
    /// (it carries none, or an earlier one).
    pub fn route(&self) -> (Arc<str>, bool) {
        let named = self.named();
        let route = named.route.clone().unwrap_or_else(|| Arc::from(UNMATCHED));
        let on_span = named.route_on_span.as_ref() == Some(&route);
        (route, !on_span)
    }

    /// Records what failed on the host's side, unless an earlier fault is recorded: the first
    /// explains the rest.
    pub fn fault(&self, cause: impl FnOnce() -> String) {
        let mut named = self.named();
        if named.fault.is_none() {
            named.fault = Some(cause());
        }
    }

    /// Records `cause` in place of any earlier fault: the one that decided the answer.
    pub fn deciding_fault(&self, cause: String) {
        self.named().fault = Some(cause);
    }

    /// The recorded fault, if any.
    pub fn take_fault(&self) -> Option<String> {
        self.named().fault.take()
    }
}

/// The host's own interfaces a guest may call, each counted apart. WASI calls (`wasi:http`,
/// clocks, random) are not counted: they are wasmtime's, linked unwrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum HostInterface {
    /// `tutorial:service/users`.
    Users,
    /// `tutorial:service/telemetry`.
    Telemetry,
    /// `wasi:otel` (tracing, logs and metrics).
    Otel,
}

impl HostInterface {
    /// Every interface, in the order of [`RequestCost::host_calls`].
    pub const ALL: [HostInterface; 3] = [
        HostInterface::Users,
        HostInterface::Telemetry,
        HostInterface::Otel,
    ];

    /// Its name in the `interface` label and the span attribute `wasm.host_calls.<name>`.
    pub fn name(self) -> &'static str {
        match self {
            HostInterface::Users => "users",
            HostInterface::Telemetry => "telemetry",
            HostInterface::Otel => "otel",
        }
    }

    /// The span attribute with its calls: `wasm.host_calls.<name>`.
    pub fn span_attribute(self) -> &'static str {
        match self {
            HostInterface::Users => "wasm.host_calls.users",
            HostInterface::Telemetry => "wasm.host_calls.telemetry",
            HostInterface::Otel => "wasm.host_calls.otel",
        }
    }
}

/// Store data that counts the calls its guest makes to the host's interfaces: each linked
/// function of [`HostInterface::ALL`] counts itself once, first.
pub trait HostCalls {
    /// Counts one call to `interface`.
    fn count_call(&mut self, interface: HostInterface);
}

/// One request's instance cost, counted by its store and reported by its task. Every counter
/// only grows, so relaxed atomics suffice.
#[derive(Debug, Default)]
pub struct RequestCost {
    instantiation_nanos: AtomicU64,
    running_nanos: AtomicU64,
    memory_peak: AtomicUsize,
    host_calls: [AtomicU32; 3],
    /// Set when the host-wide budget, not the instance's own limit, refused it memory: the
    /// request is then answered 503 (the host is busy), not 500.
    over_budget: AtomicBool,
    /// Set when the instance's own memory limit refused it memory: a trap after it is said to
    /// follow from it.
    over_limit: AtomicBool,
}

/// A reading of a [`RequestCost`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CostReading {
    /// Time to instantiate the component.
    pub instantiation: Duration,
    /// Time the instance ran, instantiation aside: its task's polls, host calls made inside
    /// them included, waits on the client or the store not.
    pub running: Duration,
    /// The largest size its linear memories reached together, in bytes.
    pub memory_peak: usize,
    /// Calls to each of [`HostInterface::ALL`], in that order.
    pub host_calls: [u32; 3],
}

impl RequestCost {
    /// Records the instantiation time.
    pub fn instantiated(&self, took: Duration) {
        self.instantiation_nanos
            .store(nanos(took), Ordering::Relaxed);
    }

    /// Adds one stretch of running.
    pub fn ran(&self, took: Duration) {
        self.running_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// A memory grew by `grown` bytes (its creation included).
    pub fn memory_grew(&self, grown: usize) {
        self.memory_peak.fetch_add(grown, Ordering::Relaxed);
    }

    /// The host-wide memory budget refused the instance memory.
    pub fn refused_by_budget(&self) {
        self.over_budget.store(true, Ordering::Release);
    }

    /// Whether the host-wide memory budget refused the instance memory.
    pub fn was_over_budget(&self) -> bool {
        self.over_budget.load(Ordering::Acquire)
    }

    /// The instance's own memory limit refused it memory.
    pub fn refused_by_limit(&self) {
        self.over_limit.store(true, Ordering::Release);
    }

    /// Whether the instance's own memory limit refused it memory.
    pub fn was_over_limit(&self) -> bool {
        self.over_limit.load(Ordering::Acquire)
    }

    /// Counts one call to `interface`.
    pub fn called(&self, interface: HostInterface) {
        self.host_calls[interface as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// What it cost so far.
    pub fn read(&self) -> CostReading {
        CostReading {
            instantiation: Duration::from_nanos(self.instantiation_nanos.load(Ordering::Relaxed)),
            running: Duration::from_nanos(
                self.running_nanos
                    .load(Ordering::Relaxed)
                    .saturating_sub(self.instantiation_nanos.load(Ordering::Relaxed)),
            ),
            memory_peak: self.memory_peak.load(Ordering::Relaxed),
            host_calls: std::array::from_fn(|index| self.host_calls[index].load(Ordering::Relaxed)),
        }
    }
}

/// A client's request whose instance cost is reported when this is dropped: at the end of the
/// instance's task, however it ends (answered, trapped, stopped at its deadline, aborted).
pub struct CostReport {
    /// The request's server span, given the `wasm.*` attributes.
    pub span: RequestSpan,
    /// Where the per-route `wasm_*` metrics are.
    pub metrics: Arc<Metrics>,
    /// The request's record: its cost is reported, labelled with its route.
    pub record: Arc<RequestRecord>,
}

impl Drop for CostReport {
    /// Onto the exported span only, when it records: the JSON lines have no use for them (the
    /// request is over). A host interface never called gets no attribute (the span must still
    /// fit 128 to a datagram).
    fn drop(&mut self) {
        let reading = self.record.cost.read();
        let memory_peak = i64::try_from(reading.memory_peak).unwrap_or(i64::MAX);
        let host_calls = HostInterface::ALL
            .map(|interface| (interface.name(), reading.host_calls[interface as usize]));
        if self.span.is_recording() {
            let mut attributes = vec![
                KeyValue::new(
                    "wasm.instantiation.duration",
                    reading.instantiation.as_secs_f64(),
                ),
                KeyValue::new("wasm.run.duration", reading.running.as_secs_f64()),
                KeyValue::new("wasm.memory.peak", memory_peak),
            ];
            for interface in HostInterface::ALL {
                let calls = reading.host_calls[interface as usize];
                if calls > 0 {
                    attributes.push(KeyValue::new(interface.span_attribute(), i64::from(calls)));
                }
            }
            // Set all at once: one lock of the span.
            self.span.set_attributes(attributes);
        }
        let (route, _) = self.record.route();
        self.metrics.observe_instance_cost(
            &route,
            reading.instantiation,
            reading.running,
            reading.memory_peak,
            &host_calls,
        );
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs `inner`, adding the time of each of its polls to `cost` as running time.
pub async fn timed<F: Future>(inner: F, cost: &RequestCost) -> F::Output {
    let mut inner = std::pin::pin!(inner);
    std::future::poll_fn(|context| {
        let started = std::time::Instant::now();
        let poll = inner.as_mut().poll(context);
        cost.ran(started.elapsed());
        poll
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_interfaces_span_attribute_is_wasm_host_calls_and_its_name() {
        for interface in HostInterface::ALL {
            assert_eq!(
                interface.span_attribute(),
                format!("wasm.host_calls.{}", interface.name())
            );
        }
    }

    #[test]
    fn memory_peak_is_the_sum_of_every_growth_and_calls_are_counted_per_interface() {
        let cost = RequestCost::default();
        cost.memory_grew(1 << 16);
        cost.memory_grew(3 << 16);
        cost.called(HostInterface::Otel);
        cost.called(HostInterface::Otel);
        cost.called(HostInterface::Users);
        let reading = cost.read();
        assert_eq!(reading.memory_peak, 4 << 16);
        assert_eq!(
            HostInterface::ALL[HostInterface::Otel as usize],
            HostInterface::Otel
        );
        assert_eq!(reading.host_calls, [1, 0, 2]);
    }

    #[test]
    fn a_request_that_names_no_route_is_unmatched_and_the_last_named_wins() {
        let record = RequestRecord::default();
        assert_eq!(record.route(), (Arc::from(UNMATCHED), true));
        assert_eq!(record.name_route(Arc::from("/a")), Some(Arc::from("/a")));
        assert_eq!(record.route(), (Arc::from("/a"), false));
        // Later routes are not recorded on the span until the answer, and then only if new.
        assert_eq!(record.name_route(Arc::from("/b")), None);
        assert_eq!(record.name_route(Arc::from("/b")), None);
        assert_eq!(record.route(), (Arc::from("/b"), true));
    }

    #[test]
    fn the_first_fault_is_kept_unless_a_later_one_decided_the_answer() {
        let record = RequestRecord::default();
        record.fault(|| "store down".into());
        record.fault(|| "store still down".into());
        assert_eq!(record.take_fault().as_deref(), Some("store down"));
        assert_eq!(record.take_fault(), None);
        record.fault(|| "store down".into());
        record.deciding_fault("deadline".into());
        assert_eq!(record.take_fault().as_deref(), Some("deadline"));
    }

    #[test]
    fn running_time_adds_up_every_poll() {
        let cost = RequestCost::default();
        cost.ran(Duration::from_millis(2));
        cost.ran(Duration::from_millis(3));
        assert_eq!(cost.read().running, Duration::from_millis(5));
    }
}
