//! An instance's allocations, from a fixed arena by moving a pointer while they fit.
//!
//! The host makes an instance for one request and throws it away after: nothing allocated in
//! it outlives the request, so most of it never needs giving back one by one. A general
//! allocator (dlmalloc, in `wasm.rs`) pays for that anyway: it sets itself up in every new
//! instance, grows the memory for its first chunk (a call into the host), and keeps free lists.
//! An [`Arena`] hands out its bytes in order and takes back only the block at its top (a `Vec`
//! growing as it is written, a value dropped right after it was made). Whatever it cannot take
//! (it is full) goes to the general allocator, so a request that allocates and frees a lot,
//! such as a long list read page by page, still runs in bounded memory: the arena wastes at
//! most its own size. [`ArenaFirst`] puts the two together as one `GlobalAlloc`.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::{Cell, UnsafeCell};
use core::ptr::{self, NonNull};

/// `SIZE` bytes handed out in order; see the module's documentation. It must stay where it is
/// while it lends (a `static`): its blocks point into it.
// Aligned to 16, the largest alignment of a primitive type on wasm32: most blocks need no padding.
#[repr(C, align(16))]
pub struct Arena<const SIZE: usize> {
    bytes: UnsafeCell<[u8; SIZE]>,
    /// Bytes from the start in use: everything below may be lent out, nothing above is.
    top: Cell<usize>,
}

// SAFETY: without the `atomics` target feature a wasm instance runs one thread, so the arena is
// never reached from two at once. Natively (the tests) each arena stays on its own thread.
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
unsafe impl<const SIZE: usize> Sync for Arena<SIZE> {}

impl<const SIZE: usize> Arena<SIZE> {
    /// An arena with nothing lent out. All zero bytes: as a `static`, it costs the component
    /// no data, only memory its instance reads as zero.
    pub const fn new() -> Self {
        Arena {
            bytes: UnsafeCell::new([0; SIZE]),
            top: Cell::new(0),
        }
    }

    fn base(&self) -> usize {
        self.bytes.get() as usize
    }

    /// A block for `layout` above everything lent out, or `None` when it does not fit. An
    /// empty block is refused: at the arena's end it would point past it, at no block of its own.
    pub fn alloc(&self, layout: Layout) -> Option<NonNull<u8>> {
        if layout.size() == 0 {
            return None;
        }
        let base = self.base();
        // An alignment is a power of two: rounding up is adding and masking.
        let mask = layout.align() - 1;
        let start = (base.checked_add(self.top.get())?.checked_add(mask)? & !mask) - base;
        let end = start.checked_add(layout.size())?;
        if end > SIZE {
            return None;
        }
        self.top.set(end);
        // SAFETY: `start + size <= SIZE`: the block lies within the arena.
        NonNull::new(unsafe { self.bytes.get().cast::<u8>().add(start) })
    }

    /// Whether `ptr` points into this arena: only then may it be given to
    /// [`Arena::release_if_top`] or [`Arena::resize_in_place`].
    pub fn owns(&self, ptr: *mut u8) -> bool {
        (self.base()..self.base() + SIZE).contains(&(ptr as usize))
    }

    /// Takes back a block this arena lent for `layout`, if it is the topmost; any other is
    /// left where it is until the instance ends.
    ///
    /// # Safety
    ///
    /// `ptr` was lent by this arena for `layout`, and is not used after.
    pub unsafe fn release_if_top(&self, ptr: *mut u8, layout: Layout) {
        debug_assert!(self.owns(ptr));
        if self.is_top(ptr, layout.size()) {
            self.top.set(ptr as usize - self.base());
        }
    }

    /// Makes a block this arena lent for `layout` `new_size` bytes long where it stands, if it
    /// can: a block shrinks anywhere, and grows only at the top, while the arena has room.
    ///
    /// # Safety
    ///
    /// `ptr` was lent by this arena for `layout` and is still in use.
    pub unsafe fn resize_in_place(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> bool {
        debug_assert!(self.owns(ptr));
        let start = ptr as usize - self.base();
        if self.is_top(ptr, layout.size()) {
            match start.checked_add(new_size) {
                Some(end) if end <= SIZE => {
                    self.top.set(end);
                    true
                }
                _ => false,
            }
        } else {
            new_size <= layout.size()
        }
    }

    fn is_top(&self, ptr: *mut u8, size: usize) -> bool {
        ptr as usize - self.base() + size == self.top.get()
    }
}

impl<const SIZE: usize> Default for Arena<SIZE> {
    fn default() -> Self {
        Self::new()
    }
}

/// A global allocator that lends from its arena while a block fits there, and from `general`
/// otherwise; like any `GlobalAlloc`, it returns null when `general` does.
pub struct ArenaFirst<const SIZE: usize, A> {
    arena: Arena<SIZE>,
    general: A,
}

impl<const SIZE: usize, A> ArenaFirst<SIZE, A> {
    /// An empty arena in front of `general`.
    pub const fn new(general: A) -> Self {
        ArenaFirst {
            arena: Arena::new(),
            general,
        }
    }
}

// SAFETY: a block comes from the arena or from `general`, and `Arena::owns` tells which (the
// arena's bytes are its own, never `general`'s), so each call for a block goes to the allocator
// that lent it, with the layout it was lent for.
unsafe impl<const SIZE: usize, A: GlobalAlloc> GlobalAlloc for ArenaFirst<SIZE, A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.arena.alloc(layout) {
            Some(block) => block.as_ptr(),
            None => unsafe { self.general.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.arena.alloc(layout) {
            // The arena's bytes may have been lent and taken back already.
            Some(block) => unsafe {
                block.as_ptr().write_bytes(0, layout.size());
                block.as_ptr()
            },
            None => unsafe { self.general.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.arena.owns(ptr) {
            unsafe { self.arena.release_if_top(ptr, layout) }
        } else {
            unsafe { self.general.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !self.arena.owns(ptr) {
            return unsafe { self.general.realloc(ptr, layout, new_size) };
        }
        if unsafe { self.arena.resize_in_place(ptr, layout, new_size) } {
            return ptr;
        }
        // SAFETY: `realloc`'s caller guarantees that `new_size`, rounded up to the alignment,
        // does not overflow `isize`; the old block is live and the new one is another.
        unsafe {
            let moved = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !moved.is_null() {
                ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.arena.release_if_top(ptr, layout);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::System;

    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    fn release(arena: &Arena<64>, ptr: *mut u8, size: usize) {
        unsafe { arena.release_if_top(ptr, layout(size, 1)) }
    }

    fn resize(arena: &Arena<64>, ptr: *mut u8, size: usize, new_size: usize) -> bool {
        unsafe { arena.resize_in_place(ptr, layout(size, 1), new_size) }
    }

    #[test]
    fn blocks_come_in_order_each_aligned_as_asked() {
        let arena = Arena::<256>::new();
        let first = arena.alloc(layout(3, 1)).unwrap().as_ptr();
        let second = arena.alloc(layout(8, 8)).unwrap().as_ptr();
        let third = arena.alloc(layout(1, 32)).unwrap().as_ptr();
        assert!(arena.owns(first) && arena.owns(second) && arena.owns(third));
        assert_eq!(second as usize % 8, 0);
        assert_eq!(third as usize % 32, 0);
        assert!(second as usize >= first as usize + 3);
        assert!(third as usize >= second as usize + 8);
    }

    #[test]
    fn a_block_that_does_not_fit_is_refused_and_the_arena_stays_usable() {
        let arena = Arena::<64>::new();
        assert!(arena.alloc(layout(48, 1)).is_some());
        assert!(arena.alloc(layout(17, 1)).is_none());
        assert!(arena.alloc(layout(isize::MAX as usize, 1)).is_none());
        assert!(arena.alloc(layout(1, 1 << 20)).is_none());
        assert!(arena.alloc(layout(0, 1)).is_none());
        assert!(arena.alloc(layout(16, 1)).is_some());
        assert!(arena.alloc(layout(1, 1)).is_none());
    }

    #[test]
    fn only_the_topmost_block_is_taken_back() {
        let arena = Arena::<64>::new();
        let below = arena.alloc(layout(16, 1)).unwrap().as_ptr();
        let top = arena.alloc(layout(16, 1)).unwrap().as_ptr();
        release(&arena, below, 16);
        // The block below stays lent, and so does the top one: 32 bytes are left.
        assert!(arena.alloc(layout(33, 1)).is_none());
        release(&arena, top, 16);
        assert_eq!(arena.alloc(layout(16, 1)).unwrap().as_ptr(), top);
    }

    #[test]
    fn the_topmost_block_grows_in_place_until_the_arena_is_full() {
        let arena = Arena::<64>::new();
        let block = arena.alloc(layout(8, 1)).unwrap().as_ptr();
        assert!(resize(&arena, block, 8, 40));
        assert!(resize(&arena, block, 40, 64));
        assert!(!resize(&arena, block, 64, 65));
        assert!(arena.alloc(layout(1, 1)).is_none());
        // Shrunk, it gives its tail back.
        assert!(resize(&arena, block, 64, 16));
        assert!(arena.alloc(layout(48, 1)).is_some());
    }

    #[test]
    fn a_block_below_the_top_only_shrinks_in_place_and_gives_nothing_back() {
        let arena = Arena::<64>::new();
        let below = arena.alloc(layout(16, 1)).unwrap().as_ptr();
        let _top = arena.alloc(layout(16, 1)).unwrap();
        assert!(!resize(&arena, below, 16, 17));
        assert!(resize(&arena, below, 16, 8));
        assert!(arena.alloc(layout(33, 1)).is_none());
    }

    #[test]
    fn a_pointer_past_the_arena_is_not_its_own() {
        let arena = Arena::<64>::new();
        let block = arena.alloc(layout(64, 1)).unwrap().as_ptr();
        assert!(arena.owns(block));
        assert!(arena.owns(block.wrapping_add(63)));
        assert!(!arena.owns(block.wrapping_add(64)));
        let elsewhere = Box::new(0u8);
        assert!(!arena.owns(&*elsewhere as *const u8 as *mut u8));
    }

    #[test]
    fn zeroed_blocks_are_zero_even_where_the_arena_lent_bytes_before() {
        let allocator = ArenaFirst::<64, System>::new(System);
        unsafe {
            let dirty = allocator.alloc(layout(32, 1));
            dirty.write_bytes(0xAB, 32);
            allocator.dealloc(dirty, layout(32, 1));
            let zeroed = allocator.alloc_zeroed(layout(32, 1));
            assert_eq!(zeroed, dirty, "the arena lends the same bytes again");
            assert!((0..32).all(|at| *zeroed.add(at) == 0));
            allocator.dealloc(zeroed, layout(32, 1));
        }
    }

    #[test]
    fn a_block_that_outgrows_the_arena_moves_to_the_general_allocator_with_its_bytes() {
        let allocator = ArenaFirst::<64, System>::new(System);
        unsafe {
            let block = allocator.alloc(layout(16, 1));
            assert!(allocator.arena.owns(block));
            (0..16).for_each(|at| *block.add(at) = at as u8);
            let grown = allocator.realloc(block, layout(16, 1), 200);
            assert!(!allocator.arena.owns(grown));
            assert!((0..16).all(|at| *grown.add(at) == at as u8));
            // The arena took its block back, and the general allocator's is freed by it.
            assert_eq!(allocator.alloc(layout(64, 1)), block);
            allocator.dealloc(grown, layout(200, 1));
            let large = allocator.alloc(layout(65, 1));
            assert!(!large.is_null() && !allocator.arena.owns(large));
            allocator.dealloc(large, layout(65, 1));
        }
    }
}
