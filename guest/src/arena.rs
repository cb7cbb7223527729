//! The first bytes an instance allocates, from a fixed arena, by moving a pointer.
//!
//! The host makes an instance for one request and throws it away after: nothing allocated in
//! it outlives the request, so most of it never needs giving back one by one. A general
//! allocator (dlmalloc, in `wasm.rs`) pays for that anyway: it sets itself up in every new
//! instance, grows the memory for its first chunk (a call into the host), and keeps free lists.
//! An [`Arena`] hands out its bytes in order and takes back only the block at its top (a `Vec`
//! growing as it is written, a value dropped right after it was made). Whatever it cannot take
//! (it is full) goes to the general allocator, so a request that allocates and frees a lot,
//! such as a long list read page by page, still runs in bounded memory: the arena wastes at
//! most its own size.

use core::alloc::Layout;
use core::cell::{Cell, UnsafeCell};
use core::ptr::NonNull;

/// `SIZE` bytes handed out in order; see the module's documentation.
// Aligned for any type the guest allocates, so that one alignment costs no padding.
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
        NonNull::new((base + start) as *mut u8)
    }

    /// Whether `ptr` points into this arena: only then may it be given to [`Arena::free`] or
    /// [`Arena::resize_in_place`].
    pub fn owns(&self, ptr: *mut u8) -> bool {
        (self.base()..self.base() + SIZE).contains(&(ptr as usize))
    }

    /// Takes back a block this arena lent for `layout`, if it is the topmost; any other is
    /// left where it is until the instance ends.
    pub fn free(&self, ptr: *mut u8, layout: Layout) {
        if self.is_top(ptr, layout.size()) {
            self.top.set(ptr as usize - self.base());
        }
    }

    /// Makes a block this arena lent for `layout` `new_size` bytes long where it stands, if it
    /// can: a block shrinks anywhere, and grows only at the top, while the arena has room.
    pub fn resize_in_place(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
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
        arena.free(below, layout(16, 1));
        // The block below stays lent: the next block still comes after the top one.
        arena.free(top, layout(16, 1));
        assert_eq!(arena.alloc(layout(16, 1)).unwrap().as_ptr(), top);
        assert!(arena.alloc(layout(33, 1)).is_none());
    }

    #[test]
    fn the_topmost_block_grows_in_place_until_the_arena_is_full() {
        let arena = Arena::<64>::new();
        let block = arena.alloc(layout(8, 8)).unwrap().as_ptr();
        assert!(arena.resize_in_place(block, layout(8, 8), 40));
        assert!(arena.resize_in_place(block, layout(40, 8), 64));
        assert!(!arena.resize_in_place(block, layout(64, 8), 65));
        assert!(arena.alloc(layout(1, 1)).is_none());
        // Shrunk, it gives its tail back.
        assert!(arena.resize_in_place(block, layout(64, 8), 16));
        assert!(arena.alloc(layout(48, 1)).is_some());
    }

    #[test]
    fn a_block_below_the_top_only_shrinks_in_place() {
        let arena = Arena::<64>::new();
        let below = arena.alloc(layout(16, 1)).unwrap().as_ptr();
        let _top = arena.alloc(layout(16, 1)).unwrap();
        assert!(!arena.resize_in_place(below, layout(16, 1), 17));
        assert!(arena.resize_in_place(below, layout(16, 1), 8));
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
}
