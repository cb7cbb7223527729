//! Linear memories and async stacks that fresh instances reuse, one after another, without a
//! single `mprotect` or `munmap` per request.
//!
//! Why not wasmtime's pooling allocator: with signals-based traps it shrinks a slot's
//! accessible pages back with `mprotect(PROT_NONE)` before each new instance, a TLB shootdown
//! on every core per request for any guest that grows its memory (bench/PROFILE.md, section 6).
//! Here memories have no guard pages ([`configure`]): Cranelift checks every access, Spectre
//! mitigation on, and a region is mapped once and reset between instances ([`Mapping::reset`]),
//! so the next instance reads zeroes whatever the kernel did with the pages (swap included).
//! Reused WASIp3 instances get reservations with guard pages instead ([`MemoryAccess::GuardPages`]).
//!
//! Bounds: regions and stacks within the guest capacity (`capacity.rs`), memories within a
//! host-wide [`MemoryBudget`], and mappings idle for a [`POOL_TRIM_PERIOD`] unmapped.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::{LinearMemory, MemoryCreator, MemoryType, StackCreator, StackMemory};

use crate::runtime::page_scan::{HeldPages, scan_held_pages};

/// How an engine's compiled code reaches linear memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemoryAccess {
    /// Every access checked against the memory's size, so memories are pooled regions handed
    /// from instance to instance without a change of page protection: for fresh instances.
    BoundsChecked,
    /// Accesses unchecked, a fault past the memory's size: a reservation with guard pages per
    /// memory, made and unmapped with its instance. For reused instances, which live for many
    /// requests: their guest code ran about a third fewer instructions than bounds-checked.
    GuardPages,
}

/// The largest 32-bit linear memory, the reservation under [`MemoryAccess::GuardPages`]: no
/// 32-bit address can reach past it, so no access needs a check.
const GUARDED_RESERVATION_BYTES: usize = 4 << 30;
/// The guard after a reservation, as wasmtime's default: an access's constant offset up to this
/// far past the end faults too.
const GUARD_BYTES: usize = 32 << 20;

/// The engine settings these pools need: memories as `access` says, created by `memories`;
/// async stacks from `stacks`.
pub(super) fn configure(
    config: &mut wasmtime::Config,
    memories: Arc<MemoryPool>,
    stacks: Arc<StackPool>,
    access: MemoryAccess,
) {
    let (reservation, guard) = match access {
        MemoryAccess::BoundsChecked => (0, 0),
        MemoryAccess::GuardPages => (GUARDED_RESERVATION_BYTES, GUARD_BYTES),
    };
    config
        .memory_reservation(reservation as u64)
        .memory_guard_size(guard as u64)
        .guard_before_linear_memory(false)
        .memory_reservation_for_growth(0)
        // A copy-on-write image needs an mmap wasmtime owns; data segments are copied instead.
        .memory_init_cow(false)
        .async_stack_size(stacks.stack_bytes)
        .with_host_memory(memories)
        .with_host_stack(stacks);
}

/// Bytes past a memory's initial size whose resident pages are zeroed in place between
/// instances and stay resident; a Rust guest touches well under this (its stack, data and a
/// little heap). The initial size itself is kept too: wasmtime writes a component's data
/// segments into it at every instantiation (a pre-initialised Python or JavaScript image is
/// 10 to 20 MiB of them), so giving those pages back would only fault them in again. Every
/// other page an instance could reach is given back to the kernel.
const KEEP_RESIDENT_BYTES: usize = 2 << 20;

/// How often the pools give back the mappings that stayed free for the whole period.
pub const POOL_TRIM_PERIOD: Duration = Duration::from_secs(5);

/// An anonymous private mapping, unmapped when dropped.
pub(super) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; who may touch it is decided by its owner.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes, read/write, backed by physical pages only once touched.
    pub(super) fn new(len: usize) -> Result<Mapping, String> {
        Mapping::map(len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// `len` bytes of address space, inaccessible until [`Mapping::open`] opens them.
    fn reserve(len: usize) -> Result<Mapping, String> {
        Mapping::map(len, libc::PROT_NONE)
    }

    fn map(len: usize, protection: libc::c_int) -> Result<Mapping, String> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                protection,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let error = std::io::Error::last_os_error();
            // The host, not the guest, is short (of address space under a limit, or of map
            // entries): refused as the budget refuses, a 503.
            if error.raw_os_error() == Some(libc::ENOMEM) {
                return Err(format!(
                    "{BUDGET_SPENT}: the host could not map {len} bytes ({error})"
                ));
            }
            return Err(format!("mmap of {len} bytes: {error}"));
        }
        let base = NonNull::new(base.cast()).ok_or("mmap returned null")?;
        Ok(Mapping { base, len })
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Makes the page-aligned `range` of the mapping read/write.
    fn open(&self, range: Range<usize>) -> Result<(), String> {
        assert!(range.end <= self.len, "opening past the mapping");
        // SAFETY: a range inside this mapping; adding access never invalidates a pointer.
        let opened = unsafe {
            libc::mprotect(
                self.ptr().add(range.start).cast(),
                range.len(),
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if opened != 0 {
            return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Makes every byte of `range` read as zero again.
    ///
    /// Within the first `keep_resident` bytes of the range, the pages in memory are written
    /// with zeroes and stay resident for the next user (no page fault, and no TLB flush, which
    /// giving a present page back would cost); pages swapped out are given back with
    /// `MADV_DONTNEED`, which drops their swapped copy; pages never touched
    /// already read as zero and are left alone. Everything past the kept bytes is given back.
    /// The page tables say which page is which ([`scan_held_pages`]); where the kernel cannot
    /// tell (no such scan, or one that failed partway), [`Mapping::reset_by_residency`] decides
    /// the rest from `mincore`.
    fn reset(&self, range: Range<usize>, keep_resident: usize) {
        let page = page_size();
        let start = range.start / page * page;
        let end = (range.end.min(self.len).div_ceil(page) * page).max(start);
        let kept_end = (start + keep_resident.div_ceil(page) * page).min(end);
        let base = self.ptr() as usize;
        let reached = scan_held_pages(base + start..base + kept_end, |pages, held| {
            let pages = pages.start - base..pages.end - base;
            match held {
                HeldPages::Resident => {
                    // SAFETY: these pages lie inside the mapping, and no instance uses them now.
                    unsafe { std::ptr::write_bytes(self.ptr().add(pages.start), 0, pages.len()) };
                }
                HeldPages::SharedZero => {}
                HeldPages::Elsewhere => self.give_back(pages),
            }
        }) - base;
        if reached < kept_end {
            self.reset_by_residency(reached..kept_end);
        }
        if kept_end < end {
            self.give_back(kept_end..end);
        }
    }

    /// [`Mapping::reset`] of a page-aligned `range` without a page-table scan: the pages
    /// `mincore` reports resident are written with zeroes and stay; every other page is given
    /// back, since not resident may mean swapped out. So correctness never rests on the
    /// residency scan; the scan only decides which pages are cheaper to keep.
    ///
    /// One shortcut: while the machine has no swap at all (checked before and after the scan),
    /// an anonymous page that is not resident has never been touched and already reads as zero,
    /// so those pages are left alone, sparing a system call per request.
    fn reset_by_residency(&self, range: Range<usize>) {
        let swap_before = swap_configured();
        let page = page_size();
        let mut resident = vec![0u8; range.len() / page];
        // SAFETY: the range lies inside this mapping; `resident` has a byte per page.
        let scanned = unsafe {
            libc::mincore(
                self.ptr().add(range.start).cast(),
                range.len(),
                resident.as_mut_ptr(),
            )
        } == 0;
        if !scanned {
            self.give_back(range);
            return;
        }
        let may_be_swapped = swap_before || swap_configured();
        // Pages not resident are given back in runs, each run with one call.
        let mut run_start = None;
        for (index, state) in resident.iter().enumerate() {
            let offset = range.start + index * page;
            if state & 1 == 1 {
                if let Some(run) = run_start.take() {
                    self.give_back(run..offset);
                }
                // SAFETY: this page lies inside the mapping, and no instance uses it now.
                unsafe { std::ptr::write_bytes(self.ptr().add(offset), 0, page) };
            } else if may_be_swapped {
                run_start.get_or_insert(offset);
            }
        }
        if let Some(run) = run_start {
            self.give_back(run..range.end);
        }
    }

    /// Gives the pages of `range` back to the kernel: the next read of any of them is a fresh
    /// zero page, whether the page was resident, swapped out or never touched.
    fn give_back(&self, range: Range<usize>) {
        // SAFETY: a page-aligned range inside this mapping, used by nobody now; for a private
        // anonymous mapping the next read of these pages gives zeroes.
        let advised = unsafe {
            libc::madvise(
                self.ptr().add(range.start).cast(),
                range.len(),
                libc::MADV_DONTNEED,
            )
        };
        if advised != 0 {
            // SAFETY: as above.
            unsafe { std::ptr::write_bytes(self.ptr().add(range.start), 0, range.len()) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: this mapping was made by `Mapping::map` and nothing refers to it any more.
        unsafe { libc::munmap(self.ptr().cast(), self.len) };
    }
}

/// Whether the machine has any swap space (a swap file or device, zswap's included), in which
/// case an anonymous page may be out of memory yet hold data.
fn swap_configured() -> bool {
    // SAFETY: `info` is a valid `sysinfo` to write into.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let known = unsafe { libc::sysinfo(&mut info) } == 0;
    // Unknown counts as configured: the slow path is always correct.
    !known || info.totalswap > 0
}

pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Mappings of one size, at most `max` of them, made as first needed, reused, and unmapped once
/// they have stayed free for a whole trim period.
struct Mappings {
    state: Mutex<MappingsState>,
    max: usize,
    /// Bytes of each mapping.
    len: usize,
    /// Bytes at the start of each mapping made inaccessible once, when it is made.
    guard: usize,
    what: &'static str,
}

struct MappingsState {
    /// Free mappings, the most recently returned last (taken first, so they stay warm).
    free: Vec<Mapping>,
    /// Mappings made and not yet unmapped, in use or free.
    made: usize,
    /// The fewest free mappings since the last trim: that many were not needed all period.
    fewest_free: usize,
}

impl Mappings {
    fn new(what: &'static str, max: usize, len: usize, guard: usize) -> Arc<Mappings> {
        Arc::new(Mappings {
            state: Mutex::new(MappingsState {
                free: Vec::new(),
                made: 0,
                fewest_free: 0,
            }),
            max,
            len,
            guard,
            what,
        })
    }

    fn take(&self) -> Result<Mapping, String> {
        let mut state = self.state.lock().expect("pool lock");
        if let Some(mapping) = state.free.pop() {
            state.fewest_free = state.fewest_free.min(state.free.len());
            return Ok(mapping);
        }
        if state.made >= self.max {
            return Err(format!("all {} {} are in use", self.max, self.what));
        }
        let mapping = Mapping::new(self.len)?;
        if self.guard > 0 {
            // SAFETY: the first bytes of the mapping made just above, page-aligned.
            let protected =
                unsafe { libc::mprotect(mapping.ptr().cast(), self.guard, libc::PROT_NONE) };
            if protected != 0 {
                return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
            }
        }
        state.made += 1;
        Ok(mapping)
    }

    fn give_back(&self, mapping: Mapping) {
        self.state.lock().expect("pool lock").free.push(mapping);
    }

    /// Unmaps the mappings that stayed free since the last trim, the least recently used
    /// first; returns how many.
    fn trim(&self) -> usize {
        let surplus: Vec<Mapping> = {
            let mut state = self.state.lock().expect("pool lock");
            let count = state.fewest_free.min(state.free.len());
            let surplus: Vec<Mapping> = state.free.drain(..count).collect();
            state.made -= count;
            state.fewest_free = state.free.len();
            surplus
        };
        // Unmapped here, outside the lock.
        surplus.len()
    }

    /// Mappings made and not yet unmapped.
    fn made(&self) -> usize {
        self.state.lock().expect("pool lock").made
    }
}

/// What a memory's growth or creation fails with when the budget, not the instance's own
/// limit, refused it.
#[derive(Debug, thiserror::Error)]
#[error("{}", BUDGET_SPENT)]
pub struct BudgetSpent;

/// The words of a [`BudgetSpent`], also in the refusal of a new memory, which wasmtime passes
/// on as text.
pub const BUDGET_SPENT: &str = "the guest memory budget is spent";

/// The memory all guest instances together may make the host hold, however many there are:
/// their linear memories, and the objects their handles keep on the host's side (weighed in
/// `runtime::held`).
pub struct MemoryBudget {
    limit: usize,
    committed: AtomicUsize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> MemoryBudget {
        MemoryBudget {
            limit,
            committed: AtomicUsize::new(0),
        }
    }

    /// Whether `bytes` more would fit now.
    pub fn has_room_for(&self, bytes: usize) -> bool {
        self.committed
            .load(Ordering::Relaxed)
            .checked_add(bytes)
            .is_some_and(|total| total <= self.limit)
    }

    /// Takes `bytes` from the budget, if they fit.
    pub fn commit(&self, bytes: usize) -> bool {
        self.committed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |committed| {
                committed
                    .checked_add(bytes)
                    .filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `bytes` taken by [`MemoryBudget::commit`].
    pub fn release(&self, bytes: usize) {
        self.committed.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes live instances hold of the budget now.
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Relaxed)
    }
}

/// Regions of linear memory, each as large as an instance may grow, reused from instance to
/// instance.
pub struct MemoryPool {
    regions: Arc<Mappings>,
    budget: Arc<MemoryBudget>,
}

impl MemoryPool {
    /// A pool of at most `max` regions of `region_bytes` each, mapped as they are first needed,
    /// whose memories together stay within `budget`.
    pub fn new(max: usize, region_bytes: usize, budget: Arc<MemoryBudget>) -> MemoryPool {
        MemoryPool {
            regions: Mappings::new("linear memory regions", max, region_bytes, 0),
            budget,
        }
    }

    /// Unmaps the regions no instance needed since the last trim; returns how many.
    pub fn trim(&self) -> usize {
        self.regions.trim()
    }

    /// Regions mapped now, in use or free.
    pub fn mapped(&self) -> usize {
        self.regions.made()
    }
}

// SAFETY: every memory made here is zero-filled (fresh or reset on return), never moves, and is
// handed to one instance at a time; a pooled one holds its whole capacity read/write, a guarded
// one its size, every byte past it faulting through the end of its guard.
unsafe impl MemoryCreator for MemoryPool {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        _maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        // wasmtime asks for the engine's reservation, zero where accesses are bounds-checked.
        if let Some(reserved) = reserved_size_in_bytes.filter(|reserved| *reserved > 0) {
            return self.guarded(minimum, reserved, guard_size_in_bytes);
        }
        if guard_size_in_bytes != 0 {
            return Err("pooled memories have no guard pages".into());
        }
        if minimum > self.regions.len {
            return Err(format!(
                "a memory of {minimum} bytes is over the limit of {} bytes",
                self.regions.len
            ));
        }
        if !self.budget.commit(minimum) {
            return Err(BUDGET_SPENT.into());
        }
        let region = match self.regions.take() {
            Ok(region) => region,
            Err(reason) => {
                self.budget.release(minimum);
                return Err(reason);
            }
        };
        Ok(Box::new(PooledMemory {
            region: Some(region),
            initial: minimum,
            size: minimum,
            pool: Arc::clone(&self.regions),
            budget: Arc::clone(&self.budget),
        }))
    }
}

impl MemoryPool {
    /// A memory of its own, not pooled, for an engine whose code relies on guard pages: the
    /// address space of `reserved` bytes and `guard` more, of which only the memory's size is
    /// accessible, so an access past it faults instead of being checked. Its bytes are taken
    /// from the same budget as a pooled memory's.
    fn guarded(
        &self,
        minimum: usize,
        reserved: usize,
        guard: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        // As large as a pooled region at most, whatever the instance's limiter would allow.
        let limit = reserved.min(self.regions.len);
        if minimum > limit {
            return Err(format!(
                "a memory of {minimum} bytes is over the limit of {limit} bytes"
            ));
        }
        let total = reserved
            .checked_add(guard)
            .ok_or("the memory's reservation overflows")?;
        // The budget first: once it is spent, nothing is mapped for a memory refused anyway.
        if !self.budget.commit(minimum) {
            return Err(BUDGET_SPENT.into());
        }
        let mapping = match Mapping::reserve(total).and_then(|mapping| {
            mapping.open(0..minimum)?;
            Ok(mapping)
        }) {
            Ok(mapping) => mapping,
            Err(reason) => {
                self.budget.release(minimum);
                return Err(reason);
            }
        };
        Ok(Box::new(GuardedMemory {
            mapping,
            reserved,
            limit,
            size: minimum,
            budget: Arc::clone(&self.budget),
        }))
    }
}

/// One instance's linear memory in a reservation of its own: its first `size` bytes read/write,
/// every other byte (up to `reserved` and through the guard after it) faulting. Unmapped, not
/// reused, when dropped: the instances that have one live for many requests.
struct GuardedMemory {
    mapping: Mapping,
    reserved: usize,
    /// The most it may grow to: a pooled region's size, within the reservation.
    limit: usize,
    size: usize,
    budget: Arc<MemoryBudget>,
}

// SAFETY: `as_ptr` never changes; the first `byte_size` bytes are read/write and zero where the
// instance has not written them (a fresh anonymous mapping); every byte past them, to the end
// of the reservation and its guard, faults; `byte_capacity` is the reservation.
unsafe impl LinearMemory for GuardedMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.reserved
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.limit {
            wasmtime::bail!("memory cannot grow past {} bytes", self.limit);
        }
        if new_size > self.size {
            if !self.budget.commit(new_size - self.size) {
                return Err(BudgetSpent.into());
            }
            if let Err(reason) = self.mapping.open(self.size..new_size) {
                self.budget.release(new_size - self.size);
                wasmtime::bail!(reason);
            }
            self.size = new_size;
        }
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.mapping.ptr()
    }
}

impl Drop for GuardedMemory {
    fn drop(&mut self) {
        self.budget.release(self.size);
    }
}

/// One instance's linear memory: a pooled region and how much of it the instance may address.
struct PooledMemory {
    region: Option<Mapping>,
    /// The memory's size at instantiation: what its data segments were written into.
    initial: usize,
    /// Bytes the instance may address; linear memories never shrink, so this is also all it
    /// could ever have written, what is reset on return and what it holds of the budget.
    size: usize,
    pool: Arc<Mappings>,
    budget: Arc<MemoryBudget>,
}

impl PooledMemory {
    fn region(&self) -> &Mapping {
        self.region
            .as_ref()
            .expect("a pooled memory holds its region until dropped")
    }
}

// SAFETY: `as_ptr` never changes, `byte_capacity` bytes from it are mapped read/write, and
// every byte past `byte_size` is zero (the region was reset before this instance got it).
unsafe impl LinearMemory for PooledMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.region().len
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.byte_capacity() {
            wasmtime::bail!("memory cannot grow past {} bytes", self.byte_capacity());
        }
        if new_size > self.size {
            if !self.budget.commit(new_size - self.size) {
                return Err(BudgetSpent.into());
            }
            self.size = new_size;
        }
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.region().ptr()
    }
}

impl Drop for PooledMemory {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            region.reset(0..self.size, self.initial + KEEP_RESIDENT_BYTES);
            self.pool.give_back(region);
        }
        self.budget.release(self.size);
    }
}

/// Async stacks for guest instances, each above a guard page, reused from fiber to fiber.
pub struct StackPool {
    mappings: Arc<Mappings>,
    stack_bytes: usize,
}

impl StackPool {
    /// A pool of at most `max` stacks of `stack_bytes` each, mapped as they are first needed.
    pub fn new(max: usize, stack_bytes: usize) -> StackPool {
        let guard = page_size();
        StackPool {
            mappings: Mappings::new("guest stacks", max, guard + stack_bytes, guard),
            stack_bytes,
        }
    }

    /// Unmaps the stacks no fiber needed since the last trim; returns how many.
    pub fn trim(&self) -> usize {
        self.mappings.trim()
    }

    /// Stacks mapped now, in use or free.
    pub fn mapped(&self) -> usize {
        self.mappings.made()
    }
}

// SAFETY: every stack is `stack_bytes` read/write bytes above a guard page, used by one fiber
// at a time, and all zeroes when handed out (fresh, or reset when its last fiber gave it back).
unsafe impl StackCreator for StackPool {
    fn new_stack(&self, size: usize, _zeroed: bool) -> wasmtime::Result<Box<dyn StackMemory>> {
        if size > self.stack_bytes {
            wasmtime::bail!(
                "a stack of {size} bytes is over the pool's {}",
                self.stack_bytes
            );
        }
        let mapping = self.mappings.take().map_err(wasmtime::Error::msg)?;
        Ok(Box::new(PooledStack {
            mapping: Some(mapping),
            guard: self.mappings.guard,
            pool: Arc::clone(&self.mappings),
        }))
    }
}

/// One fiber's stack, reset and returned to its pool when dropped.
struct PooledStack {
    mapping: Option<Mapping>,
    guard: usize,
    pool: Arc<Mappings>,
}

impl PooledStack {
    fn mapping(&self) -> &Mapping {
        self.mapping
            .as_ref()
            .expect("a pooled stack holds its mapping until dropped")
    }
}

// SAFETY: `range` is read/write memory used by this fiber only; `guard_range` is the
// inaccessible page right below it.
unsafe impl StackMemory for PooledStack {
    fn top(&self) -> *mut u8 {
        let mapping = self.mapping();
        // SAFETY: one past the mapping's end, which the stack grows down from.
        unsafe { mapping.ptr().add(mapping.len) }
    }

    fn range(&self) -> Range<usize> {
        let mapping = self.mapping();
        mapping.ptr() as usize + self.guard..mapping.ptr() as usize + mapping.len
    }

    fn guard_range(&self) -> Range<*mut u8> {
        let base = self.mapping().ptr();
        // SAFETY: the guard is the mapping's first bytes.
        base..unsafe { base.add(self.guard) }
    }
}

impl Drop for PooledStack {
    fn drop(&mut self) {
        if let Some(mapping) = self.mapping.take() {
            // A fiber's frames (host calls' arguments included) never reach the next one.
            mapping.reset(self.guard..mapping.len, mapping.len);
            self.pool.give_back(mapping);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn pool(regions: usize, region_bytes: usize) -> MemoryPool {
        MemoryPool::new(
            regions,
            region_bytes,
            Arc::new(MemoryBudget::new(usize::MAX)),
        )
    }

    fn memory(pool: &MemoryPool, minimum: usize) -> Result<Box<dyn LinearMemory>, String> {
        pool.new_memory(MemoryType::new(1, None), minimum, None, Some(0), 0)
    }

    fn guarded_memory(
        pool: &MemoryPool,
        minimum: usize,
        reserved: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        pool.new_memory(
            MemoryType::new(1, None),
            minimum,
            None,
            Some(reserved),
            64 << 10,
        )
    }

    /// Whether the page at `offset` of `memory` is mapped read/write, as `/proc/self/maps`
    /// says.
    fn writable(memory: &dyn LinearMemory, offset: usize) -> bool {
        let address = memory.as_ptr() as usize + offset;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|line| {
            let mut fields = line.split_whitespace();
            let (range, permissions) = (fields.next().unwrap(), fields.next().unwrap());
            let (start, end) = range.split_once('-').unwrap();
            let start = usize::from_str_radix(start, 16).unwrap();
            let end = usize::from_str_radix(end, 16).unwrap();
            (start..end).contains(&address) && permissions.starts_with("rw")
        })
    }

    fn refusal(result: Result<Box<dyn LinearMemory>, String>) -> String {
        match result {
            Ok(_) => panic!("the pool handed out a memory it should have refused"),
            Err(reason) => reason,
        }
    }

    /// Reads a pooled memory's byte, anywhere in its region.
    fn read(memory: &dyn LinearMemory, offset: usize) -> u8 {
        assert!(offset < memory.byte_capacity());
        // SAFETY: inside the region, which is mapped read/write in full (a pooled memory).
        unsafe { memory.as_ptr().add(offset).read_volatile() }
    }

    fn write(memory: &dyn LinearMemory, offset: usize, value: u8) {
        assert!(offset < memory.byte_size());
        // SAFETY: inside the memory's current size.
        unsafe { memory.as_ptr().add(offset).write_volatile(value) }
    }

    #[test]
    fn a_guarded_memory_opens_only_its_size_and_grows_within_its_reservation() {
        let pool = pool(1, 8 * MIB);
        let mut memory = guarded_memory(&pool, 64 << 10, 4 * MIB).unwrap();
        assert_eq!(memory.byte_capacity(), 4 * MIB);
        assert!(writable(&*memory, 0));
        assert!(!writable(&*memory, 64 << 10), "past its size");
        memory.grow_to(MIB).unwrap();
        write(&*memory, MIB - 1, 7);
        assert!(!writable(&*memory, MIB));
        assert!(!writable(&*memory, 4 * MIB), "the guard");
        assert!(memory.grow_to(4 * MIB + 1).is_err(), "past its reservation");
        let mut capped = guarded_memory(&pool, 64 << 10, 16 * MIB).unwrap();
        assert!(
            capped.grow_to(8 * MIB + 1).is_err(),
            "past a pooled region's size"
        );
        capped.grow_to(8 * MIB).unwrap();
        assert_eq!(pool.mapped(), 0, "a guarded memory takes no pooled region");
    }

    #[test]
    fn guarded_memories_take_their_bytes_from_the_budget_and_give_them_back() {
        let budget = Arc::new(MemoryBudget::new(3 * MIB));
        let pool = MemoryPool::new(4, 8 * MIB, Arc::clone(&budget));
        let mut first = guarded_memory(&pool, 2 * MIB, 4 * MIB).unwrap();
        assert_eq!(budget.committed(), 2 * MIB);
        assert!(first.grow_to(4 * MIB).is_err(), "past the budget");
        assert_eq!(budget.committed(), 2 * MIB);
        assert!(refusal(guarded_memory(&pool, 2 * MIB, 4 * MIB)).contains("budget"));
        drop(first);
        assert_eq!(budget.committed(), 0);
        assert!(refusal(guarded_memory(&pool, 9 * MIB, 16 * MIB)).contains("over the limit"));
    }

    #[test]
    fn a_memory_the_host_cannot_map_is_refused_as_the_budget_refuses_and_takes_nothing() {
        let budget = Arc::new(MemoryBudget::new(64 * MIB));
        let pool = MemoryPool::new(4, 8 * MIB, Arc::clone(&budget));
        // More address space than a 64-bit process has: the kernel answers ENOMEM.
        let refused = refusal(guarded_memory(&pool, 2 * MIB, 1 << 62));
        assert!(refused.contains(BUDGET_SPENT), "{refused}");
        assert_eq!(budget.committed(), 0);
    }

    #[test]
    fn a_region_comes_back_zeroed_wherever_its_last_instance_wrote() {
        let pool = pool(1, 8 * MIB);
        let mut first = memory(&pool, 64 << 10).unwrap();
        first.grow_to(3 * MIB).unwrap();
        let offsets = [
            0,
            100 << 10,
            KEEP_RESIDENT_BYTES - 1,
            2 * MIB + 5,
            3 * MIB - 1,
        ];
        for offset in offsets {
            write(&*first, offset, 0xAA);
        }
        let base = first.as_ptr();
        drop(first);

        let second = memory(&pool, 64 << 10).unwrap();
        assert_eq!(second.as_ptr(), base, "the one region is reused");
        assert_eq!(second.byte_size(), 64 << 10);
        for offset in offsets {
            assert_eq!(
                read(&*second, offset),
                0,
                "byte {offset} kept the last write"
            );
        }
    }

    /// Which pages of `range` `mincore` reports resident.
    fn resident_pages(base: *mut u8, range: Range<usize>) -> Vec<bool> {
        let page = page_size();
        let mut states = vec![0u8; range.len() / page];
        // SAFETY: a page-aligned range of a live mapping.
        let scanned = unsafe {
            libc::mincore(
                base.add(range.start).cast(),
                range.len(),
                states.as_mut_ptr(),
            )
        };
        assert_eq!(scanned, 0);
        states.iter().map(|state| state & 1 == 1).collect()
    }

    #[test]
    fn a_reset_keeps_resident_only_what_was_resident_within_the_kept_bytes() {
        let pool = pool(1, 4 * MIB);
        let page = page_size();
        let mut first = memory(&pool, 64 << 10).unwrap();
        first.grow_to(3 * MIB).unwrap();
        // Two pages written within the kept bytes, one past them; the rest never touched.
        for offset in [0, 5 * page, (64 << 10) + KEEP_RESIDENT_BYTES + page] {
            write(&*first, offset, 1);
        }
        let base = first.as_ptr();
        drop(first);
        let resident = resident_pages(base, 0..3 * MIB);
        let expected: Vec<usize> = vec![0, 5];
        let found: Vec<usize> = (0..resident.len()).filter(|&i| resident[i]).collect();
        assert_eq!(found, expected, "resident pages after the reset");
    }

    #[test]
    fn a_reset_keeps_the_initial_memory_resident_for_the_next_image_zeroed() {
        let pool = pool(1, 16 * MIB);
        let page = page_size();
        let initial = 6 * MIB;
        let mut first = memory(&pool, initial).unwrap();
        first.grow_to(12 * MIB).unwrap();
        let kept = [0, 5 * MIB, initial + MIB];
        let given_back = initial + KEEP_RESIDENT_BYTES + page;
        for offset in kept.into_iter().chain([given_back]) {
            write(&*first, offset, 0xAA);
        }
        let base = first.as_ptr();
        drop(first);
        let resident = resident_pages(base, 0..12 * MIB);
        let found: Vec<usize> = (0..resident.len()).filter(|&i| resident[i]).collect();
        let expected: Vec<usize> = kept.iter().map(|offset| offset / page).collect();
        assert_eq!(found, expected, "resident pages after the reset");
        let second = memory(&pool, initial).unwrap();
        for offset in kept {
            assert_eq!(
                read(&*second, offset),
                0,
                "byte {offset} kept the last write"
            );
        }
    }

    #[test]
    fn the_reset_without_a_page_table_scan_zeroes_the_same_pages_and_keeps_them_resident() {
        let page = page_size();
        let mapping = Mapping::new(64 * page).unwrap();
        let written = [0, 5, 6, 40];
        for index in written {
            // SAFETY: inside the mapping.
            unsafe { mapping.ptr().add(index * page + 3).write_volatile(0xAA) };
        }
        mapping.reset_by_residency(0..64 * page);
        for index in written {
            // SAFETY: inside the mapping.
            let byte = unsafe { mapping.ptr().add(index * page + 3).read_volatile() };
            assert_eq!(byte, 0, "page {index} kept the last write");
        }
        let resident = resident_pages(mapping.ptr(), 0..64 * page);
        let found: Vec<usize> = (0..resident.len()).filter(|&i| resident[i]).collect();
        assert_eq!(found, written, "resident pages after the reset");
    }

    #[test]
    fn a_memory_grows_within_its_region_and_no_further() {
        let pool = pool(1, 4 * MIB);
        let mut memory = memory(&pool, 64 << 10).unwrap();
        memory.grow_to(4 * MIB).unwrap();
        assert_eq!(memory.byte_size(), 4 * MIB);
        assert!(memory.grow_to(4 * MIB + 65536).is_err());
        assert_eq!(memory.byte_size(), 4 * MIB);
    }

    #[test]
    fn memories_together_grow_within_the_budget_and_give_it_back_when_dropped() {
        let budget = Arc::new(MemoryBudget::new(3 * MIB));
        let pool = MemoryPool::new(4, 4 * MIB, Arc::clone(&budget));
        let mut first = memory(&pool, MIB).unwrap();
        let mut second = memory(&pool, MIB).unwrap();
        first.grow_to(2 * MIB).unwrap();
        assert_eq!(budget.committed(), 3 * MIB);
        assert!(second.grow_to(2 * MIB).is_err(), "past the budget");
        assert_eq!(second.byte_size(), MIB);
        assert!(refusal(memory(&pool, 64 << 10)).contains("budget"));
        drop(first);
        assert_eq!(budget.committed(), MIB);
        second.grow_to(3 * MIB).unwrap();
        drop(second);
        assert_eq!(budget.committed(), 0);
    }

    #[test]
    fn the_pool_hands_out_at_most_its_regions_and_refuses_what_it_cannot_honour() {
        let pool = pool(1, 4 * MIB);
        let held = memory(&pool, 64 << 10).unwrap();
        assert!(refusal(memory(&pool, 64 << 10)).contains("in use"));
        drop(held);
        assert!(memory(&pool, 64 << 10).is_ok());
        assert!(refusal(memory(&pool, 8 * MIB)).contains("over the limit"));
        let guarded = pool.new_memory(MemoryType::new(1, None), 65536, None, Some(0), 65536);
        assert!(refusal(guarded).contains("guard"));
    }

    /// The permissions `/proc/self/maps` gives the mapping that starts at `address`, if any.
    fn permissions_at(address: usize) -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().find_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            let start = usize::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            (start == address).then(|| rest[..4].to_string())
        })
    }

    #[test]
    fn regions_free_for_a_whole_trim_period_are_unmapped_and_used_ones_kept() {
        let pool = pool(4, 4 * MIB);
        let burst: Vec<_> = (0..3).map(|_| memory(&pool, 64 << 10).unwrap()).collect();
        let bases: Vec<usize> = burst
            .iter()
            .map(|memory| memory.as_ptr() as usize)
            .collect();
        drop(burst);
        assert_eq!(pool.mapped(), 3);
        assert_eq!(pool.trim(), 0, "the burst was within this period");
        // One instance at a time in the next period: one region is needed, two are not.
        drop(memory(&pool, 64 << 10).unwrap());
        assert_eq!(pool.trim(), 2);
        assert_eq!(pool.mapped(), 1);
        let unmapped = bases.iter().filter(|&&base| permissions_at(base).is_none());
        assert_eq!(
            unmapped.count(),
            2,
            "two of the burst's regions left the address space"
        );
        assert_eq!(pool.trim(), 1, "idle for a whole period");
        assert_eq!(pool.mapped(), 0);
        assert!(
            memory(&pool, 64 << 10).is_ok(),
            "a region is mapped again when needed"
        );
    }

    #[test]
    fn a_stack_sits_right_above_an_inaccessible_guard_page() {
        let pool = StackPool::new(2, 256 << 10);
        let stack = pool.new_stack(256 << 10, false).unwrap();
        let range = stack.range();
        let guard = stack.guard_range();
        assert_eq!(range.len(), 256 << 10);
        assert_eq!(stack.top() as usize, range.end);
        assert_eq!(guard.end as usize, range.start);
        assert_eq!(
            permissions_at(guard.start as usize).as_deref(),
            Some("---p")
        );
        assert_eq!(permissions_at(range.start).as_deref(), Some("rw-p"));
        assert!(
            pool.new_stack(512 << 10, false).is_err(),
            "over the pool's size"
        );
    }

    #[test]
    fn a_stack_reused_by_a_later_fiber_is_zero_even_when_not_asked_for_zeroes() {
        let pool = StackPool::new(1, 64 << 10);
        let stack = pool.new_stack(64 << 10, false).unwrap();
        let range = stack.range();
        for address in [range.start, range.start + (30 << 10), range.end - 1] {
            // SAFETY: inside the stack, used by no fiber.
            unsafe { (address as *mut u8).write_volatile(7) };
        }
        drop(stack);
        let reused = pool.new_stack(64 << 10, false).unwrap();
        assert_eq!(reused.range(), range, "the one stack is reused");
        let bytes =
            // SAFETY: the stack's whole usable range, read/write and used by no fiber.
            unsafe { std::slice::from_raw_parts(range.start as *const u8, range.len()) };
        assert!(
            bytes.iter().all(|&byte| byte == 0),
            "the last fiber's bytes are gone"
        );
        assert!(
            pool.new_stack(64 << 10, false).is_err(),
            "one stack, in use"
        );
    }
}
