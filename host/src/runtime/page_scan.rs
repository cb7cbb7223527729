//! Which pages of an anonymous mapping the kernel holds something for, read from the page
//! tables in one walk: the `PAGEMAP_SCAN` ioctl on `/proc/self/pagemap` (Linux 6.7 and later).
//!
//! The pools reset every memory and stack between instances (`pool.rs`). What they need to
//! know of each page is one of three things: it was never touched (it reads as zero, nothing to
//! do), it is in memory (write zeroes over it, and keep it for the next instance), or its
//! contents are somewhere else, swapped out (give it back, which drops the swapped copy).
//! `mincore` tells only "in memory or not", a byte per page, so "not" had to be split into
//! "never touched" and "swapped out" by asking whether the machine has swap at all, before and
//! after the scan. This scan reports the swapped-out pages by name, in runs, so that question,
//! and the byte per page, are not needed.
//!
//! The ioctl's structures and numbers are the kernel's `include/uapi/linux/fs.h`, written out
//! here because the `libc` crate does not carry them yet. Where the kernel lacks the ioctl,
//! [`scan_held_pages`] says so and the pools fall back to `mincore`.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// What a run of pages holds, as far as the reset is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldPages {
    /// In memory, and may hold data.
    Resident,
    /// Mapped to the kernel's shared zero page: read and never written, so already zero.
    SharedZero,
    /// Not in memory, yet not empty: swapped out (or on its way between places, which the
    /// kernel reports the same way). Its data lives on outside the page tables.
    Elsewhere,
}

/// Calls `each` with every run of pages within `range` (addresses, page-aligned) that the
/// kernel holds something for, in address order; a page it does not report was never touched
/// and reads as zero. Returns the address the scan reached: `range.end`, or less if the kernel
/// refused a scan (none before Linux 6.7, no `/proc`, or a call that failed partway), the rest
/// then unscanned.
pub(super) fn scan_held_pages(
    range: Range<usize>,
    mut each: impl FnMut(Range<usize>, HeldPages),
) -> usize {
    let Some(pagemap) = pagemap() else {
        return range.start;
    };
    // Runs per call: a reset finds a handful (a stack's top, a memory's data and stack); more
    // only cost another call, which resumes where this one stopped.
    let mut runs = [PageRegion::default(); 32];
    let mut reached = range.start;
    while reached < range.end {
        let mut scan = ScanArguments::new(reached..range.end, &mut runs);
        // SAFETY: `scan` describes a range of this process's address space (the kernel only
        // reads its page tables) and points at `runs`, which outlives the call and whose
        // length `scan` gives.
        let found = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut scan) };
        let Ok(found) = usize::try_from(found) else {
            return reached;
        };
        for run in &runs[..found.min(runs.len())] {
            if let Some((pages, held)) = run.within(reached..range.end) {
                each(pages, held);
            }
        }
        // The kernel stops early when `runs` is full, and says where.
        let walked_to = scan.walk_end as usize;
        if walked_to <= reached {
            return reached;
        }
        reached = walked_to.min(range.end);
    }
    reached
}

/// `/proc/self/pagemap`, opened once, if the kernel answers `PAGEMAP_SCAN` on it.
fn pagemap() -> Option<&'static File> {
    static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
    PAGEMAP
        .get_or_init(|| {
            let file = File::open("/proc/self/pagemap").ok()?;
            // An empty scan: a kernel without the ioctl fails it (ENOTTY), one with it finds
            // nothing to report.
            let mut scan = ScanArguments::new(0..0, &mut []);
            // SAFETY: an empty range, and no room to write runs into.
            let answered = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN as _, &mut scan) };
            (answered >= 0).then_some(file)
        })
        .as_ref()
}

/// The page is mapped to memory (`PAGE_IS_PRESENT`).
const PAGE_IS_PRESENT: u64 = 1 << 3;
/// The page has a swap entry: swapped out, or a migration in progress (`PAGE_IS_SWAPPED`).
const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// The page is the shared zero page (`PAGE_IS_PFNZERO`).
const PAGE_IS_PFNZERO: u64 = 1 << 5;

/// `_IOWR('f', 16, struct pm_scan_arg)` in the generic encoding (x86-64, arm64, riscv): read
/// and write (3) in bits 30 and 31, the argument's size from bit 16, the type `'f'` from bit 8,
/// the number 16. Where an architecture encodes it otherwise, the kernel refuses the call (ENOTTY
/// or EINVAL) and the pools use `mincore`; the tests fail instead on a kernel that has the ioctl.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((size_of::<ScanArguments>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// The kernel's `struct page_region`: pages `start..end` share `categories`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

impl PageRegion {
    /// The pages of this run that lie within `asked`, and what they hold; `None` if none do.
    /// Whatever the kernel wrote, the caller writes only to pages it asked about.
    fn within(&self, asked: Range<usize>) -> Option<(Range<usize>, HeldPages)> {
        let start = usize::try_from(self.start).ok()?.max(asked.start);
        let end = usize::try_from(self.end).ok()?.min(asked.end);
        if start >= end {
            return None;
        }
        let held = if self.categories & PAGE_IS_PRESENT == 0 {
            HeldPages::Elsewhere
        } else if self.categories & PAGE_IS_PFNZERO != 0 {
            HeldPages::SharedZero
        } else {
            HeldPages::Resident
        };
        Some((start..end, held))
    }
}

/// The kernel's `struct pm_scan_arg`.
#[repr(C)]
#[derive(Debug)]
struct ScanArguments {
    /// The structure's own size, so the kernel knows which version it reads.
    size: u64,
    /// No flags: report only, never write-protect.
    flags: u64,
    start: u64,
    end: u64,
    /// Written by the kernel: where the walk stopped.
    walk_end: u64,
    /// Where the kernel writes the runs it found, and how many fit.
    vec: u64,
    vec_len: u64,
    /// Most pages to report; 0 is no limit.
    max_pages: u64,
    category_inverted: u64,
    /// Categories a page must all have to be reported: none.
    category_mask: u64,
    /// Categories a page must have one of to be reported.
    category_anyof_mask: u64,
    /// Categories written into each run; pages merge into one run while these agree.
    return_mask: u64,
}

impl ScanArguments {
    /// A scan of `range` for pages present or swapped out, runs written into `runs`.
    fn new(range: Range<usize>, runs: &mut [PageRegion]) -> ScanArguments {
        ScanArguments {
            size: size_of::<ScanArguments>() as u64,
            flags: 0,
            start: range.start as u64,
            end: range.end as u64,
            walk_end: 0,
            vec: runs.as_mut_ptr() as u64,
            vec_len: runs.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_PFNZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::pool::{Mapping, page_size};

    /// A private anonymous mapping of `pages` pages, unmapped when dropped.
    /// A mapping of the pools' kind, `len` bytes, with page-indexed helpers.
    struct Scratch {
        mapping: Mapping,
        len: usize,
    }

    impl Scratch {
        fn new(pages: usize) -> Scratch {
            let len = pages * page();
            let mapping = Mapping::new(len).expect("a scratch mapping");
            Scratch { mapping, len }
        }

        /// Writes a byte into page `index`, at `offset` within it.
        fn write(&self, index: usize, offset: usize) {
            assert!(index * page() + offset < self.len);
            // SAFETY: inside the mapping, as checked above.
            unsafe {
                self.mapping
                    .ptr()
                    .add(index * page() + offset)
                    .write_volatile(1)
            };
        }

        /// Reads a byte of page `index`.
        fn read(&self, index: usize) -> u8 {
            assert!(index * page() < self.len);
            // SAFETY: inside the mapping, as checked above.
            unsafe { self.mapping.ptr().add(index * page()).read_volatile() }
        }

        fn page_range(&self, pages: Range<usize>) -> Range<usize> {
            let base = self.mapping.ptr() as usize;
            base + pages.start * page()..base + pages.end * page()
        }
    }

    fn page() -> usize {
        page_size()
    }

    /// Whether this kernel answers `PAGEMAP_SCAN`; a test that needs it says it is skipped.
    /// On Linux 6.7 or later, with `/proc` mounted, the ioctl is there, so a refusal means its
    /// number or structure is written wrong here: that fails, rather than skip every test that
    /// would show it.
    fn kernel_scans() -> bool {
        let scans = pagemap().is_some();
        if !scans {
            let release = kernel_release();
            assert!(
                release < (6, 7) || !std::path::Path::new("/proc/self/pagemap").exists(),
                "Linux {release:?} refused PAGEMAP_SCAN: the ioctl's encoding is wrong"
            );
            eprintln!("skipped: Linux {release:?} has no PAGEMAP_SCAN (the pools use mincore)");
        }
        scans
    }

    /// The running kernel's major and minor version, from `uname`.
    fn kernel_release() -> (u32, u32) {
        // SAFETY: `uname` fills the zeroed structure it is given.
        let mut names: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::uname(&mut names) }, 0);
        // SAFETY: `uname` ends the release with a NUL within the field.
        let release = unsafe { std::ffi::CStr::from_ptr(names.release.as_ptr()) };
        let mut numbers = release
            .to_str()
            .unwrap_or("")
            .split(|c: char| !c.is_ascii_digit())
            .map(|part| part.parse().unwrap_or(0));
        (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
    }

    #[test]
    fn a_run_reported_beyond_the_range_asked_is_cut_to_it_and_classified() {
        let run = |start: u64, end: u64, categories: u64| PageRegion {
            start,
            end,
            categories,
        };
        let asked = 0x10000..0x20000;
        assert_eq!(
            run(0x8000, 0x12000, PAGE_IS_PRESENT).within(asked.clone()),
            Some((0x10000..0x12000, HeldPages::Resident))
        );
        assert_eq!(
            run(0x1f000, 0x30000, PAGE_IS_SWAPPED).within(asked.clone()),
            Some((0x1f000..0x20000, HeldPages::Elsewhere))
        );
        assert_eq!(
            run(0x11000, 0x12000, PAGE_IS_PRESENT | PAGE_IS_PFNZERO).within(asked.clone()),
            Some((0x11000..0x12000, HeldPages::SharedZero))
        );
        assert_eq!(
            run(0x20000, 0x30000, PAGE_IS_PRESENT).within(asked.clone()),
            None
        );
        assert_eq!(run(0x12000, 0x11000, PAGE_IS_PRESENT).within(asked), None);
    }

    fn scan(range: Range<usize>) -> (Vec<(Range<usize>, HeldPages)>, usize) {
        let mut runs = Vec::new();
        let reached = scan_held_pages(range, |pages, held| runs.push((pages, held)));
        (runs, reached)
    }

    #[test]
    fn written_pages_are_resident_read_ones_shared_zero_and_untouched_ones_not_reported() {
        if !kernel_scans() {
            return;
        }
        let scratch = Scratch::new(16);
        scratch.write(2, 0);
        for index in 5..8 {
            scratch.write(index, 7);
        }
        scratch.read(9);
        let whole = scratch.page_range(0..16);
        let (runs, reached) = scan(whole.clone());
        assert_eq!(reached, whole.end);
        assert_eq!(
            runs,
            vec![
                (scratch.page_range(2..3), HeldPages::Resident),
                (scratch.page_range(5..8), HeldPages::Resident),
                (scratch.page_range(9..10), HeldPages::SharedZero),
            ]
        );
    }

    #[test]
    fn more_runs_than_one_call_holds_are_all_reported() {
        if !kernel_scans() {
            return;
        }
        // Every other page written: 100 runs of one page, more than the 32 a call reports.
        let scratch = Scratch::new(200);
        for index in (0..200).step_by(2) {
            scratch.write(index, 0);
        }
        let whole = scratch.page_range(0..200);
        let (runs, reached) = scan(whole.clone());
        assert_eq!(reached, whole.end);
        let expected: Vec<_> = (0..200)
            .step_by(2)
            .map(|index| (scratch.page_range(index..index + 1), HeldPages::Resident))
            .collect();
        assert_eq!(runs, expected);
    }

    #[test]
    fn a_scan_of_part_of_a_mapping_reports_only_that_part() {
        if !kernel_scans() {
            return;
        }
        let scratch = Scratch::new(8);
        for index in 0..8 {
            scratch.write(index, 0);
        }
        let (runs, reached) = scan(scratch.page_range(3..5));
        assert_eq!(reached, scratch.page_range(3..5).end);
        assert_eq!(runs, vec![(scratch.page_range(3..5), HeldPages::Resident)]);
    }
}
