//! One buffer allocator per segment, with exact accounting.
//!
//! **Algorithm.** Best-fit over a free list kept twice: by offset (`BTreeMap<offset, len>`, for
//! coalescing with neighbours) and by size (`BTreeSet<(len, offset)>`, for the best fit). Allocate
//! takes the smallest free range that fits and splits it; free re-inserts the range and merges it
//! with the free ranges that touch it. Both are O(log f) with f the number of free ranges; the
//! largest free range is the last element of the size set, so a request that cannot fit is
//! refused in O(log f) too. Requests are **not rounded**: `used` is exactly the sum of the live
//! buffers' lengths (upstream's offset allocator rounds up to bin sizes, ≤ 12.5% waste).
//!
//! **Ownership.** The segment manager owns the only long-lived `Arc<SegmentAllocator>`. A
//! [`BufferHandle`] holds a `Weak` to it plus its range and frees the range on drop, but only while
//! the allocator lives: unmounting a segment drops the strong reference, and at that instant every
//! handle into it is dead (its replica unreadable), and none of them frees anything.
//!
//! **Rebuild and claim.** [`SegmentAllocator::rebuild`] re-creates an allocator around a list of
//! live ranges (snapshot restore, failover) and returns one handle per range;
//! [`SegmentAllocator::claim`] takes one exact range out of a live allocator (replaying a mutation
//! log onto a master, see `mutation.rs`). Both refuse overlap.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use mooncake_common::{ErrorCode, SegmentId};
use parking_lot::Mutex;
use thiserror::Error;

use crate::mutation::ObserverSlot;

/// What the transfer side needs to know about the segment an allocator carves.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    pub segment_id: SegmentId,
    /// Logical name (shared with the segment manager's indexes).
    pub name: Arc<str>,
    /// Transfer endpoint, copied (by reference count) into every descriptor.
    pub endpoint: Arc<str>,
    /// Transport protocol, likewise.
    pub protocol: Arc<str>,
    /// Base address of the segment; a buffer's address is `base + offset`.
    pub base: u64,
    /// Segment length in bytes.
    pub capacity: u64,
}

/// Why a rebuild from live ranges was refused. Nothing is created in that case.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RebuildError {
    #[error("live range {index} has zero length")]
    ZeroLength { index: usize },
    #[error(
        "live range {index} [{offset}, +{len}) lies outside the segment (capacity {capacity})"
    )]
    OutOfBounds {
        index: usize,
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("live ranges overlap at offset {offset}")]
    Overlap { offset: u64 },
}

/// Why [`SegmentAllocator::claim`] refused a range. Nothing changes in that case.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClaimError {
    #[error("a claimed range must not be empty")]
    ZeroLength,
    #[error("range [{offset}, +{len}) lies outside the segment (capacity {capacity})")]
    OutOfBounds {
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("range [{offset}, +{len}) overlaps a live buffer")]
    Overlap { offset: u64, len: u64 },
}

impl From<ClaimError> for ErrorCode {
    fn from(_: ClaimError) -> ErrorCode {
        ErrorCode::INVALID_PARAMS
    }
}

impl From<RebuildError> for ErrorCode {
    fn from(_: RebuildError) -> ErrorCode {
        ErrorCode::INVALID_PARAMS
    }
}

#[derive(Debug, Default)]
struct FreeList {
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeList {
    fn insert(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_size.insert((len, offset));
    }

    fn remove(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(len, offset));
    }

    /// Best fit: the smallest free range of at least `len` bytes (lowest offset among equals).
    fn take(&mut self, len: u64) -> Option<u64> {
        let &(free_len, offset) = self.by_size.range((len, 0)..).next()?;
        self.remove(offset, free_len);
        if free_len > len {
            self.insert(offset + len, free_len - len);
        }
        Some(offset)
    }

    /// Returns `[offset, offset+len)` and merges it with touching free ranges.
    fn give_back(&mut self, mut offset: u64, mut len: u64) {
        if let Some((&prev_off, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(prev_off + prev_len <= offset, "double free at {offset}");
            if prev_off + prev_len == offset {
                self.remove(prev_off, prev_len);
                offset = prev_off;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_offset.get(&(offset + len)) {
            self.remove(offset + len, next_len);
            len += next_len;
        }
        debug_assert!(
            self.by_offset.range(offset..offset + len).next().is_none(),
            "double free inside [{offset}, +{len})"
        );
        self.insert(offset, len);
    }
}

/// The allocator of one segment.
pub struct SegmentAllocator {
    info: SegmentInfo,
    free: Mutex<FreeList>,
    /// Sum of live buffer lengths; written under `free`'s lock, readable without it.
    used_bytes: AtomicU64,
    /// Number of live buffers; same discipline.
    live_buffers: AtomicU64,
    /// Where freed space is reported (set when the allocator joins a master's segments).
    frees: OnceLock<ObserverSlot>,
}

impl fmt::Debug for SegmentAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentAllocator")
            .field("segment_id", &self.info.segment_id)
            .field("name", &self.info.name)
            .field("capacity", &self.info.capacity)
            .field("used_bytes", &self.used_bytes())
            .finish()
    }
}

impl SegmentAllocator {
    /// An empty allocator over the whole segment.
    pub fn new(info: SegmentInfo) -> Arc<Self> {
        let mut free = FreeList::default();
        if info.capacity > 0 {
            free.insert(0, info.capacity);
        }
        Arc::new(SegmentAllocator {
            info,
            free: Mutex::new(free),
            used_bytes: AtomicU64::new(0),
            live_buffers: AtomicU64::new(0),
            frees: OnceLock::new(),
        })
    }

    /// Re-creates an allocator around `live` ranges `(offset, len)` (any order) and returns one
    /// handle per range, in input order. Fails, creating nothing, on a zero-length, out-of-bounds
    /// or overlapping range.
    pub fn rebuild(
        info: SegmentInfo,
        live: &[(u64, u64)],
    ) -> Result<(Arc<Self>, Vec<BufferHandle>), RebuildError> {
        let capacity = info.capacity;
        let mut sorted: Vec<(u64, u64, usize)> = Vec::with_capacity(live.len());
        for (index, &(offset, len)) in live.iter().enumerate() {
            if len == 0 {
                return Err(RebuildError::ZeroLength { index });
            }
            let in_bounds = matches!(offset.checked_add(len), Some(end) if end <= capacity);
            if !in_bounds {
                return Err(RebuildError::OutOfBounds {
                    index,
                    offset,
                    len,
                    capacity,
                });
            }
            sorted.push((offset, len, index));
        }
        sorted.sort_unstable();
        let mut free = FreeList::default();
        let mut cursor = 0u64;
        let mut used = 0u64;
        for &(offset, len, _) in &sorted {
            if offset < cursor {
                return Err(RebuildError::Overlap { offset });
            }
            if offset > cursor {
                free.insert(cursor, offset - cursor);
            }
            cursor = offset + len;
            used += len;
        }
        if cursor < capacity {
            free.insert(cursor, capacity - cursor);
        }
        let allocator = Arc::new(SegmentAllocator {
            info,
            free: Mutex::new(free),
            used_bytes: AtomicU64::new(used),
            live_buffers: AtomicU64::new(live.len() as u64),
            frees: OnceLock::new(),
        });
        let weak = Arc::downgrade(&allocator);
        let handles = live
            .iter()
            .map(|&(offset, len)| BufferHandle {
                allocator: weak.clone(),
                offset,
                len,
            })
            .collect();
        Ok((allocator, handles))
    }

    /// Allocates `len` bytes, or `None` when `len` is 0 or no free range is large enough.
    pub fn allocate(self: &Arc<Self>, len: u64) -> Option<BufferHandle> {
        if len == 0 {
            return None;
        }
        let offset = {
            let mut free = self.free.lock();
            let offset = free.take(len)?;
            self.used_bytes.fetch_add(len, Ordering::Relaxed);
            self.live_buffers.fetch_add(1, Ordering::Relaxed);
            offset
        };
        Some(BufferHandle {
            allocator: Arc::downgrade(self),
            offset,
            len,
        })
    }

    /// Takes exactly `[offset, offset + len)` out of the free list and returns its handle: the
    /// range must lie inside one free range. Zero-length, out-of-bounds or overlapping a live
    /// buffer is refused, changing nothing.
    pub fn claim(self: &Arc<Self>, offset: u64, len: u64) -> Result<BufferHandle, ClaimError> {
        if len == 0 {
            return Err(ClaimError::ZeroLength);
        }
        let capacity = self.info.capacity;
        let end = match offset.checked_add(len) {
            Some(end) if end <= capacity => end,
            _ => {
                return Err(ClaimError::OutOfBounds {
                    offset,
                    len,
                    capacity,
                })
            }
        };
        {
            let mut free = self.free.lock();
            let (free_off, free_len) = free
                .by_offset
                .range(..=offset)
                .next_back()
                .map(|(&o, &l)| (o, l))
                .filter(|&(o, l)| o + l >= end)
                .ok_or(ClaimError::Overlap { offset, len })?;
            free.remove(free_off, free_len);
            if free_off < offset {
                free.insert(free_off, offset - free_off);
            }
            if end < free_off + free_len {
                free.insert(end, free_off + free_len - end);
            }
            self.used_bytes.fetch_add(len, Ordering::Relaxed);
            self.live_buffers.fetch_add(1, Ordering::Relaxed);
        }
        Ok(BufferHandle {
            allocator: Arc::downgrade(self),
            offset,
            len,
        })
    }

    /// Frees many ranges under one lock: sorted by offset, touching ranges merged first, so a
    /// run of neighbouring buffers (typical when the oldest objects are evicted) costs one
    /// free-list update. Every range must come from a handle of this allocator given up with
    /// [`BufferHandle::into_range`].
    pub(crate) fn release_many(&self, ranges: &mut [(u64, u64)]) {
        if ranges.is_empty() {
            return;
        }
        ranges.sort_unstable();
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        self.report_freed();
        let mut free = self.free.lock();
        let (mut start, mut len) = ranges[0];
        for &(o, l) in &ranges[1..] {
            if start + len == o {
                len += l;
            } else {
                free.give_back(start, len);
                (start, len) = (o, l);
            }
        }
        free.give_back(start, len);
        self.used_bytes.fetch_sub(total, Ordering::Relaxed);
        self.live_buffers
            .fetch_sub(ranges.len() as u64, Ordering::Relaxed);
    }

    fn release(&self, offset: u64, len: u64) {
        self.report_freed();
        let mut free = self.free.lock();
        free.give_back(offset, len);
        self.used_bytes.fetch_sub(len, Ordering::Relaxed);
        self.live_buffers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Reports the space this allocator frees from now on to `slot`'s observer (once; later
    /// calls change nothing).
    pub(crate) fn report_frees_to(&self, slot: &ObserverSlot) {
        let _ = self.frees.set(slot.clone());
    }

    /// Before a range goes back to the free list, so that an allocation that takes it happens
    /// after the report (the op-log then holds its space back until the removal is durable).
    fn report_freed(&self) {
        if let Some(slot) = self.frees.get() {
            slot.space_freed();
        }
    }

    pub fn info(&self) -> &SegmentInfo {
        &self.info
    }

    pub fn capacity(&self) -> u64 {
        self.info.capacity
    }

    /// Exact sum of the live buffers' lengths.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Number of live buffers.
    pub fn live_buffers(&self) -> u64 {
        self.live_buffers.load(Ordering::Relaxed)
    }

    /// Length of the largest free range (what the next allocation can get at most).
    pub fn largest_free_bytes(&self) -> u64 {
        self.free.lock().by_size.last().map_or(0, |&(len, _)| len)
    }

    /// The free ranges `(offset, len)` in offset order (for checks and tests).
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.free
            .lock()
            .by_offset
            .iter()
            .map(|(&o, &l)| (o, l))
            .collect()
    }
}

/// One allocated range of a segment. Frees itself on drop while its allocator lives; dead (and
/// inert) once the segment is unmounted. Not `Clone`: one range, one owner, so nothing is freed
/// twice.
pub struct BufferHandle {
    allocator: Weak<SegmentAllocator>,
    offset: u64,
    len: u64,
}

impl BufferHandle {
    /// True while the segment's allocator lives.
    pub fn is_live(&self) -> bool {
        self.allocator.strong_count() > 0
    }

    /// The allocator, if it still lives.
    pub fn allocator(&self) -> Option<Arc<SegmentAllocator>> {
        self.allocator.upgrade()
    }

    /// True if this handle points into `allocator`.
    pub fn belongs_to(&self, allocator: &Arc<SegmentAllocator>) -> bool {
        std::ptr::eq(self.allocator.as_ptr(), Arc::as_ptr(allocator))
    }

    /// Offset from the segment's base.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false for a handle from [`SegmentAllocator::allocate`] (which refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives the range up without freeing it: the caller frees it later with
    /// [`SegmentAllocator::release_many`] (if the allocator still lives then). Returns the
    /// allocator reference (weak, so an unmount in between still kills it), offset and length.
    pub(crate) fn into_range(mut self) -> (Weak<SegmentAllocator>, u64, u64) {
        // The handle's Drop then sees a dangling Weak and frees nothing.
        let allocator = std::mem::take(&mut self.allocator);
        (allocator, self.offset, self.len)
    }
}

impl fmt::Debug for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferHandle")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("live", &self.is_live())
            .finish()
    }
}

impl Drop for BufferHandle {
    fn drop(&mut self) {
        if let Some(allocator) = self.allocator.upgrade() {
            allocator.release(self.offset, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn info(capacity: u64) -> SegmentInfo {
        SegmentInfo {
            segment_id: SegmentId::new(1, 1),
            name: Arc::from("seg"),
            endpoint: Arc::from("127.0.0.1:1"),
            protocol: Arc::from("tcp"),
            base: 0x1000,
            capacity,
        }
    }

    #[test]
    fn batched_release_merges_neighbours_and_is_exact() {
        let a = SegmentAllocator::new(info(100));
        let hs: Vec<BufferHandle> = (0..5).map(|_| a.allocate(20).unwrap()).collect();
        assert_eq!(a.used_bytes(), 100);
        // Give up buffers 0, 1, 3 (out of order): 0 and 1 touch, 3 stands alone.
        let mut it = hs.into_iter();
        let (h0, h1, h2, h3, h4) = (
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap(),
        );
        let mut ranges: Vec<(u64, u64)> = [h3, h0, h1]
            .into_iter()
            .map(|h| {
                let (w, o, l) = h.into_range();
                assert!(std::ptr::eq(w.as_ptr(), Arc::as_ptr(&a)));
                (o, l)
            })
            .collect();
        assert_eq!(a.used_bytes(), 100, "into_range frees nothing");
        a.release_many(&mut ranges);
        assert_eq!(a.used_bytes(), 40);
        assert_eq!(a.live_buffers(), 2);
        assert_eq!(a.free_ranges(), vec![(0, 40), (60, 20)]);
        drop((h2, h4));
        assert_eq!(a.free_ranges(), vec![(0, 100)]);
        assert_eq!(a.used_bytes(), 0);
    }

    #[test]
    fn used_is_exact_and_returns_to_zero() {
        let a = SegmentAllocator::new(info(1000));
        let h1 = a.allocate(1).unwrap();
        let h2 = a.allocate(333).unwrap();
        assert_eq!(a.used_bytes(), 334);
        assert_eq!(a.live_buffers(), 2);
        assert_eq!((h1.offset(), h2.offset()), (0, 1));
        drop(h1);
        assert_eq!(a.used_bytes(), 333);
        drop(h2);
        assert_eq!(a.used_bytes(), 0);
        assert_eq!(
            a.free_ranges(),
            vec![(0, 1000)],
            "free ranges must coalesce"
        );
    }

    #[test]
    fn zero_and_oversize_requests_fail_without_change() {
        let a = SegmentAllocator::new(info(100));
        assert!(a.allocate(0).is_none());
        assert!(a.allocate(101).is_none());
        let whole = a.allocate(100).unwrap();
        assert!(a.allocate(1).is_none());
        assert_eq!(a.used_bytes(), 100);
        drop(whole);
        assert_eq!(a.largest_free_bytes(), 100);
    }

    #[test]
    fn best_fit_reuses_the_smallest_hole() {
        let a = SegmentAllocator::new(info(100));
        let h: Vec<_> = [10, 30, 5, 20]
            .iter()
            .map(|&l| a.allocate(l).unwrap())
            .collect();
        let (off_10, off_5) = (h[0].offset(), h[2].offset());
        let mut h = h.into_iter();
        let (h10, h30, h5, h20) = (h.next(), h.next(), h.next(), h.next());
        drop(h10);
        drop(h5);
        // Holes: 10 at off_10, 5 at off_5, 35 at the tail. A 4-byte request goes to the 5 hole.
        let small = a.allocate(4).unwrap();
        assert_eq!(small.offset(), off_5);
        let mid = a.allocate(8).unwrap();
        assert_eq!(mid.offset(), off_10);
        drop((h30, h20, small, mid));
        assert_eq!(a.free_ranges(), vec![(0, 100)]);
    }

    #[test]
    fn handles_die_with_the_allocator_and_free_nothing() {
        let a = SegmentAllocator::new(info(100));
        let h = a.allocate(10).unwrap();
        assert!(h.is_live());
        drop(a);
        assert!(!h.is_live());
        assert!(h.allocator().is_none());
        drop(h); // must not panic or touch freed memory
    }

    #[test]
    fn rebuild_recreates_exact_accounting_and_free_gaps() {
        let (a, handles) =
            SegmentAllocator::rebuild(info(100), &[(50, 10), (0, 5), (90, 10)]).unwrap();
        assert_eq!(a.used_bytes(), 25);
        assert_eq!(a.live_buffers(), 3);
        assert_eq!(a.free_ranges(), vec![(5, 45), (60, 30)]);
        assert_eq!(handles[0].offset(), 50);
        drop(handles);
        assert_eq!(a.used_bytes(), 0);
        assert_eq!(a.free_ranges(), vec![(0, 100)]);
    }

    #[test]
    fn claim_takes_exact_ranges_and_refuses_overlap() {
        let a = SegmentAllocator::new(info(100));
        let h = a.claim(40, 10).unwrap();
        assert_eq!((h.offset(), h.len()), (40, 10));
        assert_eq!(a.free_ranges(), vec![(0, 40), (50, 50)]);
        assert_eq!(a.used_bytes(), 10);
        let edge = a.claim(0, 40).unwrap();
        assert_eq!(a.free_ranges(), vec![(50, 50)]);
        for (offset, len) in [(45, 10), (35, 10), (40, 1), (0, 1)] {
            assert_eq!(
                a.claim(offset, len).unwrap_err(),
                ClaimError::Overlap { offset, len }
            );
        }
        assert_eq!(a.claim(60, 0).unwrap_err(), ClaimError::ZeroLength);
        assert!(matches!(
            a.claim(95, 10).unwrap_err(),
            ClaimError::OutOfBounds { .. }
        ));
        assert!(matches!(
            a.claim(u64::MAX, 2).unwrap_err(),
            ClaimError::OutOfBounds { .. }
        ));
        assert_eq!(a.used_bytes(), 50, "refusals change nothing");
        let tail = a.claim(50, 50).unwrap();
        assert!(a.free_ranges().is_empty());
        drop((h, edge, tail));
        assert_eq!(a.free_ranges(), vec![(0, 100)]);
        assert_eq!((a.used_bytes(), a.live_buffers()), (0, 0));
    }

    #[test]
    fn rebuild_refuses_bad_ranges() {
        assert_eq!(
            SegmentAllocator::rebuild(info(100), &[(0, 0)]).unwrap_err(),
            RebuildError::ZeroLength { index: 0 }
        );
        assert!(matches!(
            SegmentAllocator::rebuild(info(100), &[(95, 10)]).unwrap_err(),
            RebuildError::OutOfBounds { index: 0, .. }
        ));
        assert!(matches!(
            SegmentAllocator::rebuild(info(100), &[(u64::MAX, 2)]).unwrap_err(),
            RebuildError::OutOfBounds { .. }
        ));
        assert_eq!(
            SegmentAllocator::rebuild(info(100), &[(0, 10), (9, 5)]).unwrap_err(),
            RebuildError::Overlap { offset: 9 }
        );
        assert_eq!(
            ErrorCode::from(RebuildError::Overlap { offset: 0 }),
            ErrorCode::INVALID_PARAMS
        );
    }
}
