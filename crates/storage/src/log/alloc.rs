//! Offset allocator over the data region, in blocks (4 KiB units).
//!
//! Best fit with coalescing: free ranges are kept twice, by offset (to merge neighbours on free)
//! and by `(length, offset)` (to find the smallest range that fits, lowest offset first). It holds
//! no state that the set of live records does not determine, so recovery rebuilds it with
//! [`OffsetAllocator::from_live`].

use std::collections::{BTreeMap, BTreeSet};

/// Why a range was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// The range is empty or runs past the end of the region.
    OutOfRange { start: u64, blocks: u64 },
    /// The range overlaps another live (when rebuilding) or free (when freeing) range.
    Overlap { start: u64, blocks: u64 },
}

#[derive(Debug, Clone)]
pub struct OffsetAllocator {
    total_blocks: u64,
    free_blocks: u64,
    /// start → length of every free range; ranges never touch (they are merged).
    by_offset: BTreeMap<u64, u64>,
    /// (length, start) of every free range.
    by_size: BTreeSet<(u64, u64)>,
}

impl OffsetAllocator {
    /// An allocator with the whole region free.
    pub fn new(total_blocks: u64) -> Self {
        let mut a = OffsetAllocator {
            total_blocks,
            free_blocks: 0,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        if total_blocks > 0 {
            a.insert_free(0, total_blocks);
        }
        a
    }

    /// Rebuilds the allocator from the live ranges `(start, blocks)` (any order): everything
    /// else is free. Refuses overlapping or out-of-range input.
    pub fn from_live(
        total_blocks: u64,
        live: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<Self, RangeError> {
        let mut live: Vec<(u64, u64)> = live.into_iter().collect();
        live.sort_unstable();
        let mut a = OffsetAllocator {
            total_blocks,
            free_blocks: 0,
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        let mut cursor = 0u64;
        for (start, blocks) in live {
            let end = start
                .checked_add(blocks)
                .filter(|&end| blocks > 0 && end <= total_blocks)
                .ok_or(RangeError::OutOfRange { start, blocks })?;
            if start < cursor {
                return Err(RangeError::Overlap { start, blocks });
            }
            if start > cursor {
                a.insert_free(cursor, start - cursor);
            }
            cursor = end;
        }
        if cursor < total_blocks {
            a.insert_free(cursor, total_blocks - cursor);
        }
        Ok(a)
    }

    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn used_blocks(&self) -> u64 {
        self.total_blocks - self.free_blocks
    }

    /// Length of the largest free range.
    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(len, _)| len)
    }

    /// Takes `blocks` contiguous blocks (best fit, lowest offset among equals); `None` when no
    /// free range is long enough.
    pub fn allocate(&mut self, blocks: u64) -> Option<u64> {
        if blocks == 0 {
            return None;
        }
        let &(len, start) = self.by_size.range((blocks, 0)..).next()?;
        self.remove_free(start, len);
        if len > blocks {
            self.insert_free(start + blocks, len - blocks);
        }
        Some(start)
    }

    /// Returns a range, merging it with free neighbours. Refuses a range that is out of bounds or
    /// overlaps free space (a double free), leaving the allocator unchanged.
    pub fn free(&mut self, start: u64, blocks: u64) -> Result<(), RangeError> {
        let end = start
            .checked_add(blocks)
            .filter(|&end| blocks > 0 && end <= self.total_blocks)
            .ok_or(RangeError::OutOfRange { start, blocks })?;
        let before = self
            .by_offset
            .range(..=start)
            .next_back()
            .map(|(&s, &l)| (s, l));
        let after = self.by_offset.range(start..).next().map(|(&s, &l)| (s, l));
        if before.is_some_and(|(s, l)| s + l > start) || after.is_some_and(|(s, _)| s < end) {
            return Err(RangeError::Overlap { start, blocks });
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((s, l)) = before.filter(|&(s, l)| s + l == start) {
            self.remove_free(s, l);
            new_start = s;
        }
        if let Some((s, l)) = after.filter(|&(s, _)| s == end) {
            self.remove_free(s, l);
            new_end = s + l;
        }
        self.insert_free(new_start, new_end - new_start);
        Ok(())
    }

    /// The free ranges `(start, blocks)` in offset order.
    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_offset.iter().map(|(&s, &l)| (s, l))
    }

    /// Checks the internal invariants; `Err` says which one broke. Used by tests.
    pub fn check(&self) -> Result<(), String> {
        let mut sum = 0u64;
        let mut prev_end: Option<u64> = None;
        for (&s, &l) in &self.by_offset {
            if l == 0 || s + l > self.total_blocks {
                return Err(format!("range {s}+{l} out of bounds"));
            }
            if let Some(pe) = prev_end {
                if s <= pe {
                    return Err(format!(
                        "range {s}+{l} touches or overlaps previous end {pe}"
                    ));
                }
            }
            if !self.by_size.contains(&(l, s)) {
                return Err(format!("range {s}+{l} missing from size index"));
            }
            prev_end = Some(s + l);
            sum += l;
        }
        if self.by_size.len() != self.by_offset.len() {
            return Err("size index has extra ranges".into());
        }
        if sum != self.free_blocks {
            return Err(format!("free sum {sum} != counter {}", self.free_blocks));
        }
        Ok(())
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.by_offset.insert(start, len);
        self.by_size.insert((len, start));
        self.free_blocks += len;
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.by_offset.remove(&start);
        self.by_size.remove(&(len, start));
        self.free_blocks -= len;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A tiny deterministic generator so the test needs no dependency.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    #[test]
    fn allocations_never_overlap_and_accounting_is_exact() {
        let total = 1000;
        let mut a = OffsetAllocator::new(total);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut rng = Lcg(7);
        for step in 0..5000 {
            if live.is_empty() || !rng.next().is_multiple_of(3) {
                let len = 1 + rng.next() % 40;
                if let Some(start) = a.allocate(len) {
                    assert!(start + len <= total);
                    for &(s, l) in &live {
                        assert!(
                            start + len <= s || s + l <= start,
                            "step {step}: {start}+{len} overlaps {s}+{l}"
                        );
                    }
                    live.push((start, len));
                } else {
                    assert!(
                        a.largest_free() < len,
                        "refused {len} with a range that fits"
                    );
                }
            } else {
                let i = (rng.next() as usize) % live.len();
                let (s, l) = live.swap_remove(i);
                a.free(s, l).unwrap();
            }
            let used: u64 = live.iter().map(|&(_, l)| l).sum();
            assert_eq!(a.used_blocks(), used, "step {step}");
            a.check().unwrap();
        }
    }

    #[test]
    fn freeing_everything_coalesces_into_one_range() {
        let mut a = OffsetAllocator::new(64);
        let ranges: Vec<_> = (0..16).map(|_| (a.allocate(4).unwrap(), 4)).collect();
        assert_eq!(a.free_blocks(), 0);
        assert_eq!(a.allocate(1), None);
        for &(s, l) in ranges.iter().step_by(2) {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.largest_free(), 4, "holes are not adjacent");
        for &(s, l) in ranges.iter().skip(1).step_by(2) {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.free_ranges().collect::<Vec<_>>(), vec![(0, 64)]);
        a.check().unwrap();
    }

    #[test]
    fn best_fit_prefers_the_smallest_range_that_fits() {
        let mut a = OffsetAllocator::from_live(100, [(0, 10), (12, 20), (35, 65)]).unwrap();
        // Free: [10,12) len 2, [32,35) len 3.
        assert_eq!(a.allocate(3), Some(32));
        assert_eq!(a.allocate(2), Some(10));
        assert_eq!(a.allocate(1), None);
    }

    #[test]
    fn double_free_and_out_of_range_are_refused() {
        let mut a = OffsetAllocator::new(10);
        let s = a.allocate(5).unwrap();
        a.free(s, 5).unwrap();
        assert_eq!(
            a.free(s, 5),
            Err(RangeError::Overlap {
                start: s,
                blocks: 5
            })
        );
        assert_eq!(
            a.free(8, 5),
            Err(RangeError::OutOfRange {
                start: 8,
                blocks: 5
            })
        );
        assert_eq!(
            a.free(3, 0),
            Err(RangeError::OutOfRange {
                start: 3,
                blocks: 0
            })
        );
        a.check().unwrap();
        assert_eq!(a.free_blocks(), 10);
    }

    #[test]
    fn rebuild_from_live_ranges_matches_the_allocator_that_made_them() {
        let mut a = OffsetAllocator::new(500);
        let mut rng = Lcg(99);
        let mut live = Vec::new();
        for _ in 0..200 {
            let len = 1 + rng.next() % 9;
            if let Some(s) = a.allocate(len) {
                live.push((s, len));
            }
            if rng.next().is_multiple_of(4) && !live.is_empty() {
                let (s, l) = live.swap_remove(0);
                a.free(s, l).unwrap();
            }
        }
        let rebuilt = OffsetAllocator::from_live(500, live.iter().copied()).unwrap();
        rebuilt.check().unwrap();
        assert_eq!(
            rebuilt.free_ranges().collect::<Vec<_>>(),
            a.free_ranges().collect::<Vec<_>>()
        );
        assert_eq!(rebuilt.free_blocks(), a.free_blocks());
    }

    #[test]
    fn rebuild_refuses_overlapping_or_out_of_range_live_ranges() {
        assert_eq!(
            OffsetAllocator::from_live(10, [(0, 5), (4, 2)]).unwrap_err(),
            RangeError::Overlap {
                start: 4,
                blocks: 2
            }
        );
        assert_eq!(
            OffsetAllocator::from_live(10, [(8, 3)]).unwrap_err(),
            RangeError::OutOfRange {
                start: 8,
                blocks: 3
            }
        );
        let full = OffsetAllocator::from_live(10, [(5, 5), (0, 5)]).unwrap();
        assert_eq!(full.free_blocks(), 0);
    }
}
