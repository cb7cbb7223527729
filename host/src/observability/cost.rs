//! What one request's instance cost: the time to instantiate it, the time it ran, its linear
//! memory's high-water mark and the host calls it made per interface. Measured as the instance
//! runs, reported once when it ends (answered, trapped, or stopped at its deadline), on the
//! request's server span (`wasm.*` attributes) and in the per-route `wasm_*` metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;

use crate::observability::metrics::Metrics;
use crate::observability::request_span::RequestSpan;
use crate::observability::routes::MatchedRoute;

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

/// One request's instance cost, shared between its store (which counts) and the task that
/// reports it. Every counter only grows, so relaxed atomics suffice.
#[derive(Debug, Default)]
pub struct RequestCost {
    instantiation_nanos: AtomicU64,
    running_nanos: AtomicU64,
    memory_peak: AtomicUsize,
    host_calls: [AtomicU32; 3],
    /// Set when the host-wide budget, not the instance's own limit, refused it memory: the
    /// request is then answered 503 (the host is busy), not 500.
    over_budget: AtomicBool,
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
    /// The route the guest named, their label.
    pub route: Arc<MatchedRoute>,
    /// What is reported.
    pub cost: Arc<RequestCost>,
}

impl Drop for CostReport {
    /// Onto the exported span only, when it records: the JSON lines have no use for them (the
    /// request is over). A host interface never called gets no attribute (the span must still
    /// fit 128 to a datagram).
    fn drop(&mut self) {
        let reading = self.cost.read();
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
        let (route, _) = self.route.answer();
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
    fn running_time_adds_up_every_poll() {
        let cost = RequestCost::default();
        cost.ran(Duration::from_millis(2));
        cost.ran(Duration::from_millis(3));
        assert_eq!(cost.read().running, Duration::from_millis(5));
    }
}
