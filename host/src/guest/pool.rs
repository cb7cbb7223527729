//! Linear memories and async stacks that guest instances reuse, one after another, without a
//! single `mprotect` or `munmap` per request.
//!
//! Why not wasmtime's pooling allocator: with signals-based traps on, it hands a memory slot to
//! a new instance only after shrinking the slot's accessible pages back to the module's initial
//! size (`mprotect(PROT_NONE)`), because code compiled for guard pages relies on the pages past
//! `memory.size` faulting. Taking access away flushes the TLB of every core running the process:
//! an inter-processor interrupt per request for any guest whose allocator grows its memory (a
//! `no_std` guest with dlmalloc does, in every fresh instance). bench/PROFILE.md measures it.
//!
//! Here memories have no guard pages and no reservation ([`configure`]), so Cranelift checks
//! every access against the memory's current size, with its Spectre mitigation (an
//! out-of-bounds address becomes null) still on. Nothing relies on page protection, so a region
//! is mapped read/write once, handed from instance to instance, and only zeroed in between.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use wasmtime::{LinearMemory, MemoryCreator, MemoryType, StackCreator, StackMemory};

/// The engine settings these pools need: memories without guard pages or reservation, whose
/// every access is bounds-checked, created by `memories`; async stacks from `stacks`.
pub(super) fn configure(
    config: &mut wasmtime::Config,
    memories: Arc<MemoryPool>,
    stacks: Arc<StackPool>,
) {
    config
        .memory_reservation(0)
        .memory_guard_size(0)
        .guard_before_linear_memory(false)
        .memory_reservation_for_growth(0)
        // A copy-on-write image needs an mmap wasmtime owns; data segments are copied instead.
        .memory_init_cow(false)
        .async_stack_size(stacks.stack_bytes)
        .with_host_memory(memories)
        .with_host_stack(stacks);
}

/// Bytes at the start of each memory that are zeroed in place between instances and stay
/// resident; a Rust guest touches well under this (its stack, data and a little heap).
const KEEP_RESIDENT_BYTES: usize = 2 << 20;

/// An anonymous private mapping, unmapped when dropped.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory; who may touch it is decided by its owner.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes, read/write, backed by physical pages only once touched.
    fn new(len: usize) -> Result<Mapping, String> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let base = NonNull::new(base.cast()).ok_or("mmap returned null")?;
        Ok(Mapping { base, len })
    }

    fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Sets the first `len` bytes back to zero. Up to `keep_resident` bytes, only the resident
    /// pages are written (a page never touched is still unmapped or the kernel's zero page) and
    /// stay resident for the next instance; past it, the pages go back to the kernel, so a guest
    /// that once grew large does not keep that memory in the host for ever.
    fn reset(&self, len: usize, keep_resident: usize) {
        let page = page_size();
        let len = len.min(self.len).div_ceil(page) * page;
        let kept = keep_resident.min(len).div_ceil(page) * page;
        let mut resident = vec![0u8; kept / page];
        // SAFETY: the range lies inside this mapping; `resident` has a byte per page.
        let scanned = unsafe { libc::mincore(self.ptr().cast(), kept, resident.as_mut_ptr()) } == 0;
        for (index, state) in resident.iter().enumerate() {
            if !scanned || state & 1 == 1 {
                // SAFETY: page `index` lies inside this mapping, and no instance uses it now.
                unsafe { std::ptr::write_bytes(self.ptr().add(index * page), 0, page) };
            }
        }
        if len > kept {
            // SAFETY: the rest of the range, inside this mapping and in use by no instance; for
            // a private anonymous mapping the next read of these pages gives zeroes.
            let advised = unsafe {
                libc::madvise(self.ptr().add(kept).cast(), len - kept, libc::MADV_DONTNEED)
            };
            if advised != 0 {
                // SAFETY: as above.
                unsafe { std::ptr::write_bytes(self.ptr().add(kept), 0, len - kept) };
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: this mapping was made by `Mapping::new` and nothing refers to it any more.
        unsafe { libc::munmap(self.ptr().cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Mappings of one size, at most `max` of them, made as first needed and reused.
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
    free: Vec<Mapping>,
    /// Mappings made so far, in use or free.
    made: usize,
}

impl Mappings {
    fn new(what: &'static str, max: usize, len: usize, guard: usize) -> Arc<Mappings> {
        Arc::new(Mappings {
            state: Mutex::new(MappingsState {
                free: Vec::new(),
                made: 0,
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
}

/// Regions of linear memory, each as large as an instance may grow, reused from instance to
/// instance.
pub struct MemoryPool(Arc<Mappings>);

impl MemoryPool {
    /// A pool of at most `max` regions of `region_bytes` each, mapped as they are first needed.
    pub fn new(max: usize, region_bytes: usize) -> MemoryPool {
        MemoryPool(Mappings::new("linear memory regions", max, region_bytes, 0))
    }
}

// SAFETY: every memory made here is zero-filled (fresh or zeroed on return), never moves, holds
// its whole capacity read/write, and is handed to one instance at a time.
unsafe impl MemoryCreator for MemoryPool {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        _maximum: Option<usize>,
        _reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        if guard_size_in_bytes != 0 {
            return Err("pooled memories have no guard pages".into());
        }
        if minimum > self.0.len {
            return Err(format!(
                "a memory of {minimum} bytes is over the limit of {} bytes",
                self.0.len
            ));
        }
        let region = self.0.take()?;
        Ok(Box::new(PooledMemory {
            region: Some(region),
            size: minimum,
            high_water: minimum,
            pool: Arc::clone(&self.0),
        }))
    }
}

/// One instance's linear memory: a pooled region and how much of it the instance may address.
struct PooledMemory {
    region: Option<Mapping>,
    size: usize,
    /// The most this instance has ever been able to write: what must be zeroed on return.
    high_water: usize,
    pool: Arc<Mappings>,
}

impl PooledMemory {
    fn region(&self) -> &Mapping {
        self.region
            .as_ref()
            .expect("a pooled memory holds its region until dropped")
    }
}

// SAFETY: `as_ptr` never changes, `byte_capacity` bytes from it are mapped read/write, and
// every byte past `byte_size` is zero (the region was zeroed before this instance got it).
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
        self.size = new_size;
        self.high_water = self.high_water.max(new_size);
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.region().ptr()
    }
}

impl Drop for PooledMemory {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            region.reset(self.high_water, KEEP_RESIDENT_BYTES);
            self.pool.give_back(region);
        }
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
}

// SAFETY: every stack is `stack_bytes` read/write bytes above a guard page, used by one fiber
// at a time.
unsafe impl StackCreator for StackPool {
    fn new_stack(&self, size: usize, zeroed: bool) -> wasmtime::Result<Box<dyn StackMemory>> {
        if size > self.stack_bytes {
            wasmtime::bail!(
                "a stack of {size} bytes is over the pool's {}",
                self.stack_bytes
            );
        }
        let mapping = self.mappings.take().map_err(wasmtime::Error::msg)?;
        let stack = PooledStack {
            mapping: Some(mapping),
            guard: self.mappings.guard,
            pool: Arc::clone(&self.mappings),
        };
        if zeroed {
            let range = stack.range();
            // SAFETY: the stack's usable range, not in use by any fiber yet.
            unsafe { std::ptr::write_bytes(range.start as *mut u8, 0, range.len()) };
        }
        Ok(Box::new(stack))
    }
}

/// One fiber's stack, returned to its pool when dropped.
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
            self.pool.give_back(mapping);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn memory(pool: &MemoryPool, minimum: usize) -> Result<Box<dyn LinearMemory>, String> {
        pool.new_memory(MemoryType::new(1, None), minimum, None, Some(0), 0)
    }

    fn refusal(result: Result<Box<dyn LinearMemory>, String>) -> String {
        match result {
            Ok(_) => panic!("the pool handed out a memory it should have refused"),
            Err(reason) => reason,
        }
    }

    fn read(memory: &dyn LinearMemory, offset: usize) -> u8 {
        assert!(offset < memory.byte_capacity());
        // SAFETY: inside the region, which is mapped read/write in full.
        unsafe { memory.as_ptr().add(offset).read_volatile() }
    }

    fn write(memory: &dyn LinearMemory, offset: usize, value: u8) {
        assert!(offset < memory.byte_size());
        // SAFETY: inside the memory's current size.
        unsafe { memory.as_ptr().add(offset).write_volatile(value) }
    }

    #[test]
    fn a_region_comes_back_zeroed_wherever_its_last_instance_wrote() {
        let pool = MemoryPool::new(1, 8 * MIB);
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

    #[test]
    fn a_memory_grows_within_its_region_and_no_further() {
        let pool = MemoryPool::new(1, 4 * MIB);
        let mut memory = memory(&pool, 64 << 10).unwrap();
        memory.grow_to(4 * MIB).unwrap();
        assert_eq!(memory.byte_size(), 4 * MIB);
        assert!(memory.grow_to(4 * MIB + 65536).is_err());
        assert_eq!(memory.byte_size(), 4 * MIB);
    }

    #[test]
    fn the_pool_hands_out_at_most_its_regions_and_refuses_what_it_cannot_honour() {
        let pool = MemoryPool::new(1, 4 * MIB);
        let held = memory(&pool, 64 << 10).unwrap();
        assert!(refusal(memory(&pool, 64 << 10)).contains("in use"));
        drop(held);
        assert!(memory(&pool, 64 << 10).is_ok());
        assert!(refusal(memory(&pool, 8 * MIB)).contains("over the limit"));
        let guarded = pool.new_memory(MemoryType::new(1, None), 65536, None, Some(0), 65536);
        assert!(refusal(guarded).contains("guard"));
    }

    /// The permissions `/proc/self/maps` gives the mapping that starts at `address`.
    fn permissions_at(address: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let start = usize::from_str_radix(range.split_once('-')?.0, 16).ok()?;
                (start == address).then(|| rest[..4].to_string())
            })
            .unwrap_or_else(|| panic!("no mapping starts at {address:#x}"))
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
        assert_eq!(permissions_at(guard.start as usize), "---p");
        assert_eq!(permissions_at(range.start), "rw-p");
        assert!(
            pool.new_stack(512 << 10, false).is_err(),
            "over the pool's size"
        );
    }

    #[test]
    fn a_stack_asked_for_zeroed_comes_back_zeroed() {
        let pool = StackPool::new(1, 64 << 10);
        let stack = pool.new_stack(64 << 10, false).unwrap();
        let last = stack.range().end - 1;
        // SAFETY: the stack's top byte, used by no fiber.
        unsafe { (last as *mut u8).write_volatile(7) };
        drop(stack);
        let reused = pool.new_stack(64 << 10, true).unwrap();
        assert_eq!(reused.range().end - 1, last, "the one stack is reused");
        // SAFETY: as above.
        assert_eq!(unsafe { (last as *const u8).read_volatile() }, 0);
        assert!(
            pool.new_stack(64 << 10, false).is_err(),
            "one stack, in use"
        );
    }
}
