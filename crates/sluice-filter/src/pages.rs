//! Transparent huge pages for a set's two big arrays (its table and its arena).
//!
//! A lookup in a 10M-value set reads two places at random in ~260 MiB: with 4 KiB pages
//! both miss the TLB, and the page walks miss the caches too. With 2 MiB pages the same
//! memory needs 130 TLB entries instead of 67,000. Most Linux systems (Debian's default
//! among them) give huge pages only to memory that asks for them (`madvise` mode), so the set
//! asks: `MADV_HUGEPAGE` on memory not yet touched (pages faulted in later come huge), and
//! `MADV_COLLAPSE` (Linux 6.1+) on memory already written, which the kernel then copies into
//! huge pages at once. Both are advice: they never change the memory's contents, and where
//! the kernel refuses (older kernels, THP disabled, no free huge pages) nothing changes but
//! speed.
//!
//! One of the workspace's two modules allowed `unsafe` (the other is `sluice-js`'s
//! `raw.rs`): `madvise` is an FFI call. Each call gets a range inside memory the caller
//! borrows, rounded inward to whole huge pages, so the kernel is only ever told about pages
//! of that allocation.

#![allow(unsafe_code)]

use std::mem::size_of_val;

/// Arrays smaller than this are left alone (a huge page or two gains nothing).
const MIN_BYTES: usize = 8 << 20;

/// The huge page size on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Asks that pages of `memory` not yet touched come as huge pages when first written.
pub(crate) fn prefer_huge<T>(memory: &mut [T]) {
    advise(memory.as_mut_ptr().cast(), size_of_val(memory), Advice::Huge);
}

/// Asks that the pages of `memory`, already written, be made huge pages now.
pub(crate) fn collapse<T>(memory: &[T]) {
    advise(memory.as_ptr().cast_mut().cast(), size_of_val(memory), Advice::Collapse);
}

#[derive(Clone, Copy)]
enum Advice {
    Huge,
    Collapse,
}

#[cfg(target_os = "linux")]
fn advise(start: *mut u8, len: usize, advice: Advice) {
    if len < MIN_BYTES {
        return;
    }
    let start_address = start as usize;
    let first = start_address.next_multiple_of(HUGE_PAGE);
    let last = (start_address + len) / HUGE_PAGE * HUGE_PAGE;
    if last <= first {
        return;
    }
    let advice = match advice {
        Advice::Huge => libc::MADV_HUGEPAGE,
        Advice::Collapse => libc::MADV_COLLAPSE,
    };
    // SAFETY: [first, last) lies inside the caller's borrowed allocation (rounded inward),
    // and both advices leave the memory's contents as they are: only how the kernel backs
    // it changes. A refusal (EINVAL on old kernels, EAGAIN without free huge pages) is
    // ignored on purpose.
    let _ = unsafe { libc::madvise(start.add(first - start_address).cast(), last - first, advice) };
}

#[cfg(not(target_os = "linux"))]
fn advise(_: *mut u8, _: usize, _: Advice) {}
