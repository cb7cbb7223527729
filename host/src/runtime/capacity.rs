//! How many guest instances may live at once and what each may hold: the one place that sizes
//! the memory and stack pools, the stores' limits and the slot budgets from the flags.
//!
//! The rule it keeps: whoever holds an instance slot always finds a memory region and a stack
//! in the pools. Every fresh instance holds its request's slot ([`crate::runtime::slots`]), every
//! reused one a place among as many as there are slots, for its whole life (`runtime::reuse`);
//! a store gives its regions and stacks back before its slot (`Guest::handle`, `reuse::Worker`),
//! and the pools hold enough for every slot ([`GuestCapacity::regions`],
//! [`GuestCapacity::stacks`]). So a request beyond the slots waits for one, then gets 503; it
//! never finds the pools empty (a 500).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::observability::request_report::RequestRecord;
use crate::runtime::held::HeldObjects;
use crate::runtime::outbound::OutboundSockets;
use crate::runtime::pool::{BudgetSpent, MemoryBudget, MemoryPool, StackPool};
use crate::runtime::slots::InstanceSlots;

/// Upper bounds per component (per store, by its limiter): a Rust `wasm32-wasip2`
/// component has one memory, a few tables and a handful of core instances (its module and the
/// canonical-ABI shims); these leave room for other toolchains' guests.
const CORE_INSTANCES_PER_COMPONENT: usize = 32;
/// See [`CORE_INSTANCES_PER_COMPONENT`]: the pools hold this many regions per slot.
const MEMORIES_PER_COMPONENT: usize = 2;
/// See [`CORE_INSTANCES_PER_COMPONENT`].
const TABLES_PER_COMPONENT: usize = 8;
/// Elements one table may hold (the bound wasmtime's pooling allocator sets by default).
const TABLE_ELEMENTS: usize = 20_000;
/// Async stacks per slot: a store runs its instantiation and its call on one fiber at a time;
/// two leave room for wasmtime keeping one stack while it starts the next.
const STACKS_PER_INSTANCE: usize = 2;
/// The part of the memory budget one instance's host objects may hold at most: one eighth.
pub const HELD_SHARE_OF_BUDGET: usize = 8;
/// Each instance's async stack: the host calls it makes run on it too (wasmtime's default).
pub const GUEST_STACK_BYTES: usize = 2 << 20;

/// What one guest instance may use.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimits {
    /// Wall-clock time one request may run inside the guest before its response head.
    pub request_timeout: Duration,
    /// What bounds a response's body once its head is out.
    pub body: BodyBounds,
    /// Linear memory one instance may grow to.
    pub memory_bytes: usize,
    /// Linear memory all instances together may grow to; past it a `memory.grow` fails and an
    /// instance that cannot start is answered 503.
    pub memory_budget_bytes: usize,
    /// Instances working towards their response head at once (a reload's health probe counts
    /// as one).
    pub max_instances: u32,
    /// Instances beyond those that have sent their head and stream the rest of the body, so
    /// clients that read slowly do not hold the slots new requests need. The memory and stack
    /// pools hold enough for every slot ([`GuestCapacity`]).
    pub max_streaming: u32,
    /// How a WASIp3 guest's instances are reused; by default not at all.
    pub reuse: InstanceReuse,
}

/// What bounds a guest's response body, whose head has gone out, instead of the deadline: a
/// body that makes progress on both sides streams until `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyBounds {
    /// How long it may stream in all.
    pub timeout: Duration,
    /// How long it may make no progress: its guest writing none of it, or its client reading
    /// none.
    pub stall: Duration,
}

/// `--max-instance-reuse-count` and its two companions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceReuse {
    /// Requests one instance serves in its life; 1 is a fresh instance per request.
    pub requests: u32,
    /// Requests one instance serves at once.
    pub concurrent: u32,
    /// How long an instance waits for another request before it goes.
    pub idle_timeout: Duration,
}

impl InstanceReuse {
    /// Whether an instance serves more than one request.
    pub fn is_on(self) -> bool {
        self.requests > 1
    }
}

/// The pools, budget and slots sized for one set of [`GuestLimits`].
pub struct GuestCapacity {
    limits: GuestLimits,
    /// Linear memories of every instance, within [`GuestLimits::memory_budget_bytes`].
    pub memories: Arc<MemoryPool>,
    /// Async stacks of every instance.
    pub stacks: Arc<StackPool>,
    /// What all instances together may make the host hold: their linear memory and their
    /// objects on the host's side.
    pub budget: Arc<MemoryBudget>,
    /// The running and streaming instance slots.
    pub(super) slots: InstanceSlots,
    /// The sockets and name lookups of every instance's outgoing calls.
    pub outbound_sockets: OutboundSockets,
}

impl GuestCapacity {
    /// Pools and slots for `limits`.
    pub fn new(limits: GuestLimits) -> GuestCapacity {
        let budget = Arc::new(MemoryBudget::new(limits.memory_budget_bytes));
        GuestCapacity {
            memories: Arc::new(MemoryPool::new(
                Self::regions(&limits),
                limits.memory_bytes,
                Arc::clone(&budget),
            )),
            stacks: Arc::new(StackPool::new(Self::stacks(&limits), GUEST_STACK_BYTES)),
            budget,
            slots: InstanceSlots::new(limits.max_instances, limits.max_streaming),
            outbound_sockets: OutboundSockets::default(),
            limits,
        }
    }

    /// Instances that may live at once: every running and streaming slot, plus one spare so
    /// that a store still being torn down never makes a newly permitted one wait.
    pub fn instances(limits: &GuestLimits) -> usize {
        limits.max_instances as usize + limits.max_streaming as usize + 1
    }

    /// Memory regions the pool may map: enough for every instance's every memory.
    pub fn regions(limits: &GuestLimits) -> usize {
        Self::instances(limits) * MEMORIES_PER_COMPONENT
    }

    /// Stacks the pool may map: enough for every instance's fibers.
    pub fn stacks(limits: &GuestLimits) -> usize {
        Self::instances(limits) * STACKS_PER_INSTANCE
    }

    /// The limiter of one instance's store: its own bounds, and the host-wide budget; the
    /// memory it grants, and the budget's refusals, go to the request's `record`.
    pub fn limiter(&self, record: Arc<RequestRecord>) -> InstanceLimiter {
        InstanceLimiter {
            own: StoreLimitsBuilder::new()
                .memory_size(self.limits.memory_bytes)
                .memories(MEMORIES_PER_COMPONENT)
                .tables(TABLES_PER_COMPONENT)
                .table_elements(TABLE_ELEMENTS)
                .instances(CORE_INSTANCES_PER_COMPONENT)
                .build(),
            budget: Some(Arc::clone(&self.budget)),
            record,
        }
    }

    /// The account of the objects one instance's handles hold on the host's side, for a
    /// request whose client sent `headers`, charged to the same budget as linear memory: at
    /// most the instance's own memory limit, and at most the budget over
    /// [`HELD_SHARE_OF_BUDGET`], so that a few hoarding instances never spend what every other
    /// request needs.
    pub fn held_objects(&self, headers: &http::HeaderMap) -> HeldObjects {
        let limit = self
            .limits
            .memory_bytes
            .min(self.limits.memory_budget_bytes / HELD_SHARE_OF_BUDGET);
        HeldObjects::new(Arc::clone(&self.budget), limit, headers)
    }

    /// Gives back the regions and stacks no instance needed since the last trim.
    pub fn trim(&self) {
        self.memories.trim();
        self.stacks.trim();
    }
}

/// What one instance's store may hold: its own memory, tables and instances, and no more
/// linear memory than the host-wide budget has left.
#[derive(Default)]
pub struct InstanceLimiter {
    own: StoreLimits,
    budget: Option<Arc<MemoryBudget>>,
    /// The request's record: the memory granted is added up in its cost (memories never
    /// shrink, so the sum is the high-water mark), and the budget's refusals said.
    record: Arc<RequestRecord>,
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if !self.own.memory_growing(current, desired, maximum)? {
            self.record.cost.refused_by_limit();
            return Ok(false);
        }
        let more = desired.saturating_sub(current);
        if let Some(budget) = &self.budget
            && !budget.has_room_for(more)
        {
            self.record.cost.refused_by_budget();
            return Ok(false);
        }
        self.record.cost.memory_grew(more);
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        // Another instance took the last of the budget between this one's check and its growth.
        if error.is::<BudgetSpent>() {
            self.record.cost.refused_by_budget();
        }
        self.own.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.own.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.own.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.own.instances()
    }

    fn tables(&self) -> usize {
        self.own.tables()
    }

    fn memories(&self) -> usize {
        self.own.memories()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wasmtime::{LinearMemory, MemoryCreator, MemoryType, StackCreator};

    use super::*;

    fn limits(max_instances: u32, max_streaming: u32) -> GuestLimits {
        GuestLimits {
            request_timeout: Duration::from_secs(1),
            memory_bytes: 1 << 20,
            memory_budget_bytes: usize::MAX,
            max_instances,
            max_streaming,
            ..GuestLimits::default()
        }
    }

    #[test]
    fn every_instance_slot_held_at_once_still_finds_its_regions_and_stacks() {
        let limits = limits(3, 2);
        let capacity = GuestCapacity::new(limits);
        let instances = GuestCapacity::instances(&limits);
        assert!(instances > (limits.max_instances + limits.max_streaming) as usize);
        let mut held: Vec<Box<dyn LinearMemory>> = Vec::new();
        let mut stacks = Vec::new();
        for _ in 0..instances {
            for _ in 0..MEMORIES_PER_COMPONENT {
                let memory = capacity
                    .memories
                    .new_memory(MemoryType::new(1, None), 65536, None, Some(0), 0)
                    .expect("a region for every memory of every slot");
                held.push(memory);
            }
            for _ in 0..STACKS_PER_INSTANCE {
                stacks.push(capacity.stacks.new_stack(GUEST_STACK_BYTES, false).unwrap());
            }
        }
        assert_eq!(capacity.memories.mapped(), GuestCapacity::regions(&limits));
        assert_eq!(capacity.stacks.mapped(), GuestCapacity::stacks(&limits));
    }

    #[test]
    fn the_budget_not_the_instances_own_limit_is_reported_as_over_budget() {
        let mut limits = limits(1, 0);
        limits.memory_budget_bytes = 2 << 20;
        let capacity = GuestCapacity::new(limits);
        let record = Arc::new(RequestRecord::default());
        let mut limiter = capacity.limiter(Arc::clone(&record));
        assert!(
            !limiter.memory_growing(0, 2 << 20, None).unwrap(),
            "own limit"
        );
        assert!(!record.cost.was_over_budget());
        let _hold = capacity
            .memories
            .new_memory(MemoryType::new(1, None), 1 << 20, None, Some(0), 0)
            .unwrap();
        let _other = capacity
            .memories
            .new_memory(MemoryType::new(1, None), 1 << 20, None, Some(0), 0)
            .unwrap();
        assert!(!limiter.memory_growing(0, 65536, None).unwrap(), "budget");
        assert!(record.cost.was_over_budget());
    }
}
