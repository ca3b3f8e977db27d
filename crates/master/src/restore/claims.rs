//! The ranges restore claims: each segment's memory ranges, held by replicas or by the snapshot's
//! discarded list, collected, de-overlapped (the higher replica id wins; a discarded range beats
//! any replica) and handed to one allocator rebuild per segment.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use mooncake_common::{SegmentId, SegmentStatus};

use super::{both, Fate, Join, RestoreDrops};
use crate::allocator::{BufferHandle, SegmentAllocator, SegmentInfo};
use crate::mutation::{DiscardedRecord, ObjectRecord, SegmentRecord};

/// Who holds a claimed range.
#[derive(Debug, Clone, Copy)]
enum Holder {
    /// A replica, by its slot in the flattened replica list.
    Replica(usize),
    /// Buffer `.1` of the snapshot's discarded entry `.0`.
    Discarded(usize, usize),
}

/// One range a segment's rebuilt allocator must hold.
#[derive(Debug, Clone, Copy)]
struct Claim {
    offset: u64,
    len: u64,
    /// Overlaps are won by the higher priority: the replica id; discarded ranges `u64::MAX`.
    prio: u64,
    holder: Holder,
}

/// The state of one replica slot after the allocators were rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Not a memory range, or refused (unknown segment, out of bounds, zero length).
    Unclaimed,
    Kept,
    LostOverlap,
}

/// Segment id → position, hashed with foldhash (looked up once per replica).
pub(super) type SegmentPositions = HashMap<SegmentId, usize, foldhash::fast::RandomState>;

/// The segment records restore accepted, in order, and the position of each id.
pub(super) struct Segments {
    pub(super) records: Vec<SegmentRecord>,
    pub(super) pos: SegmentPositions,
}

/// The replicas of all objects flattened into slots (object `i`'s replicas start at
/// `first_slot[i]`), and the ranges claimed on each segment.
struct ClaimSet {
    first_slot: Vec<usize>,
    slots: usize,
    /// Claims by segment position.
    claims: Vec<Vec<Claim>>,
    /// The highest replica id of any record.
    max_id: u64,
}

/// What the rebuild left: the allocators (by segment position) and, for every replica slot and
/// discarded buffer, the handle it now holds.
pub(super) struct Claimed {
    pub(super) first_slot: Vec<usize>,
    pub(super) slot_handles: Vec<Option<BufferHandle>>,
    pub(super) slot_state: Vec<SlotState>,
    /// By discarded entry, then buffer.
    pub(super) discarded_handles: Vec<Vec<Option<BufferHandle>>>,
    pub(super) allocators: Vec<Arc<SegmentAllocator>>,
    pub(super) max_id: u64,
}

/// Which claims to keep: on overlap, the higher priority wins. One sorted pass finds whether
/// anything overlaps at all (the common case: nothing); only then are the claims taken in
/// descending priority, each kept when it touches no range kept before it.
fn resolve_overlaps(claims: &[Claim]) -> Vec<bool> {
    let mut by_offset: Vec<usize> = (0..claims.len()).collect();
    by_offset.sort_unstable_by_key(|&i| (claims[i].offset, claims[i].len));
    let mut end = 0u64;
    let mut overlap = false;
    for &i in &by_offset {
        if claims[i].offset < end {
            overlap = true;
            break;
        }
        end = claims[i].offset + claims[i].len;
    }
    if !overlap {
        return vec![true; claims.len()];
    }
    let mut by_prio = by_offset;
    by_prio.sort_by_key(|&i| std::cmp::Reverse(claims[i].prio));
    let mut kept_ranges = std::collections::BTreeMap::<u64, u64>::new();
    let mut kept = vec![false; claims.len()];
    for i in by_prio {
        let (start, stop) = (claims[i].offset, claims[i].offset + claims[i].len);
        let before = kept_ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e > start);
        let after = kept_ranges
            .range((Bound::Excluded(start), Bound::Unbounded))
            .next()
            .is_some_and(|(&s, _)| s < stop);
        if !before && !after {
            kept_ranges.insert(start, stop);
            kept[i] = true;
        }
    }
    kept
}

/// A segment record restore accepts.
fn valid_segment(r: &SegmentRecord) -> bool {
    let s = &r.segment;
    s.base != 0
        && s.size != 0
        && s.base.checked_add(s.size).is_some()
        && matches!(
            r.status,
            SegmentStatus::OK
                | SegmentStatus::DRAINING
                | SegmentStatus::DRAINED
                | SegmentStatus::GRACEFULLY_UNMOUNTING
        )
}

/// A range restore may claim on `seg`: not empty, and inside the segment.
fn in_bounds(seg: &SegmentRecord, offset: u64, len: u64) -> bool {
    len > 0
        && offset
            .checked_add(len)
            .is_some_and(|e| e <= seg.segment.size)
}

/// Positions the valid segment records by id; invalid and duplicate ones are counted in `drops`.
pub(super) fn accept_segments(records: Vec<SegmentRecord>, drops: &mut RestoreDrops) -> Segments {
    let mut segs: Vec<SegmentRecord> = Vec::with_capacity(records.len());
    let mut pos = SegmentPositions::default();
    for r in records {
        if !valid_segment(&r) || pos.contains_key(&r.segment.id) {
            drops.invalid_segments += 1;
            continue;
        }
        pos.insert(r.segment.id, segs.len());
        segs.push(r);
    }
    Segments { records: segs, pos }
}

/// The ranges the replicas of kept and in-flight objects, and the discarded buffers, claim on
/// each accepted segment.
fn collect_claims(
    segs: &Segments,
    objects: &[ObjectRecord],
    fates: &[Fate],
    discarded: &[DiscardedRecord],
) -> ClaimSet {
    let mut first_slot = Vec::with_capacity(objects.len() + 1);
    let mut slots = 0usize;
    for o in objects {
        first_slot.push(slots);
        slots += o.replicas.len();
    }
    first_slot.push(slots);
    let mut claims: Vec<Vec<Claim>> = vec![Vec::new(); segs.records.len()];
    let mut max_id = 0u64;
    for (i, o) in objects.iter().enumerate() {
        for (j, r) in o.replicas.iter().enumerate() {
            max_id = max_id.max(r.id.0);
            if !matches!(fates[i], Fate::Keep | Fate::Processing) {
                continue;
            }
            let Some(b) = r.place.buffer() else { continue };
            let Some(&p) = segs.pos.get(&b.segment) else {
                continue;
            };
            if in_bounds(&segs.records[p], b.offset, b.len) {
                claims[p].push(Claim {
                    offset: b.offset,
                    len: b.len,
                    prio: r.id.0,
                    holder: Holder::Replica(first_slot[i] + j),
                });
            }
        }
    }
    for (e, d) in discarded.iter().enumerate() {
        for (k, b) in d.buffers.iter().enumerate() {
            if let Some(&p) = segs.pos.get(&b.segment) {
                if in_bounds(&segs.records[p], b.offset, b.len) {
                    claims[p].push(Claim {
                        offset: b.offset,
                        len: b.len,
                        prio: u64::MAX,
                        holder: Holder::Discarded(e, k),
                    });
                }
            }
        }
    }
    ClaimSet {
        first_slot,
        slots,
        claims,
        max_id,
    }
}

/// The allocator info of `seg`, its name shared through `names`.
fn segment_info(seg: &SegmentRecord, names: &mut HashMap<String, Arc<str>>) -> SegmentInfo {
    let s = &seg.segment;
    let name = names
        .entry(s.name.clone())
        .or_insert_with(|| Arc::from(s.name.as_str()))
        .clone();
    SegmentInfo {
        segment_id: s.id,
        name,
        endpoint: Arc::from(s.te_endpoint.as_str()),
        protocol: Arc::from(s.protocol.as_str()),
        base: s.base,
        capacity: s.size,
    }
}

/// One segment's rebuilt allocator, and what became of each of its claims: kept with a handle,
/// or lost to an overlap.
struct RebuiltSegment {
    allocator: Arc<SegmentAllocator>,
    outcomes: Vec<(Holder, Option<BufferHandle>)>,
    lost: Vec<Holder>,
}

/// Rebuilds `seg`'s allocator around the claims kept (`claims` in offset order, so that the
/// overlap check and the rebuild find their input sorted).
fn rebuild_segment(
    seg: &SegmentRecord,
    claims: &[Claim],
    names: &mut HashMap<String, Arc<str>>,
) -> RebuiltSegment {
    let kept = resolve_overlaps(claims);
    let live: Vec<(u64, u64)> = claims
        .iter()
        .zip(&kept)
        .filter(|(_, k)| **k)
        .map(|(c, _)| (c.offset, c.len))
        .collect();
    let info = segment_info(seg, names);
    // The claims were bounds-checked and de-overlapped, so rebuild cannot refuse them;
    // if it did, the segment comes back empty rather than wrong.
    let (allocator, handles) = match SegmentAllocator::rebuild(info.clone(), &live) {
        Ok(built) => built,
        Err(_) => (SegmentAllocator::new(info), Vec::new()),
    };
    let mut handles = handles.into_iter();
    let mut out = RebuiltSegment {
        allocator,
        outcomes: Vec::with_capacity(live.len()),
        lost: Vec::new(),
    };
    for (c, k) in claims.iter().zip(&kept) {
        if *k {
            out.outcomes.push((c.holder, handles.next()));
        } else {
            out.lost.push(c.holder);
        }
    }
    out
}

/// Rebuilds the segments whose claims are `claims` (sorted first), the first of them at
/// position `first`.
fn rebuild_segments(
    segs: &Segments,
    claims: &mut [Vec<Claim>],
    first: usize,
) -> Vec<(usize, RebuiltSegment)> {
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    claims
        .iter_mut()
        .enumerate()
        .map(|(i, claims)| {
            let p = first + i;
            claims.sort_unstable_by_key(|c| (c.offset, c.len));
            let rebuilt = rebuild_segment(&segs.records[p], claims, &mut names);
            *claims = Vec::new();
            (p, rebuilt)
        })
        .collect()
}

/// Collects the claimed ranges and rebuilds each segment's allocator once around the ranges
/// kept (the segments split between the two halves of `join`); replicas that lost an overlap
/// are counted in `drops`.
pub(super) fn claim_ranges(
    segs: &Segments,
    objects: &[ObjectRecord],
    fates: &[Fate],
    discarded: &[DiscardedRecord],
    drops: &mut RestoreDrops,
    join: Option<Join>,
) -> Claimed {
    let ClaimSet {
        first_slot,
        slots,
        mut claims,
        max_id,
    } = collect_claims(segs, objects, fates, discarded);
    let mut slot_handles: Vec<Option<BufferHandle>> = Vec::new();
    slot_handles.resize_with(slots, || None);
    let discarded_handles: Vec<Vec<Option<BufferHandle>>> = discarded
        .iter()
        .map(|d| {
            let mut v = Vec::new();
            v.resize_with(d.buffers.len(), || None);
            v
        })
        .collect();
    let mut out = Claimed {
        first_slot,
        slot_handles,
        slot_state: vec![SlotState::Unclaimed; slots],
        discarded_handles,
        allocators: Vec::with_capacity(segs.records.len()),
        max_id,
    };
    // Two halves of about equal claims: segments in order until half the claims are taken.
    let total: usize = claims.iter().map(Vec::len).sum();
    let mut seen = 0;
    let split = claims
        .iter()
        .position(|c| {
            seen += c.len();
            seen * 2 >= total
        })
        .map_or(claims.len(), |p| p + 1);
    let (first, second) = claims.split_at_mut(split);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    both(
        join,
        || a = rebuild_segments(segs, first, 0),
        || b = rebuild_segments(segs, second, split),
    );
    for (_, rebuilt) in a.into_iter().chain(b) {
        for (holder, handle) in rebuilt.outcomes {
            match holder {
                Holder::Replica(slot) => {
                    out.slot_state[slot] = if handle.is_some() {
                        SlotState::Kept
                    } else {
                        SlotState::Unclaimed
                    };
                    out.slot_handles[slot] = handle;
                }
                Holder::Discarded(e, k) => out.discarded_handles[e][k] = handle,
            }
        }
        for holder in rebuilt.lost {
            if let Holder::Replica(slot) = holder {
                out.slot_state[slot] = SlotState::LostOverlap;
            }
        }
        out.allocators.push(rebuilt.allocator);
    }
    drops.overlap_replicas = out
        .slot_state
        .iter()
        .filter(|s| **s == SlotState::LostOverlap)
        .count();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(offset: u64, len: u64, prio: u64) -> Claim {
        Claim {
            offset,
            len,
            prio,
            holder: Holder::Discarded(0, 0),
        }
    }

    #[test]
    fn disjoint_claims_are_all_kept() {
        let claims = [claim(10, 5, 1), claim(0, 10, 2), claim(15, 1, 3)];
        assert_eq!(resolve_overlaps(&claims), vec![true; 3]);
        assert!(resolve_overlaps(&[]).is_empty());
    }

    #[test]
    fn the_higher_priority_wins_each_overlap() {
        // [0,10) id 3 overlaps [5,15) id 5, which overlaps [12,20) id 9: 9 beats 5, so 3 survives.
        let claims = [claim(0, 10, 3), claim(5, 10, 5), claim(12, 8, 9)];
        assert_eq!(resolve_overlaps(&claims), vec![true, false, true]);
        // A range inside another, and an exact duplicate.
        let claims = [claim(0, 100, 7), claim(10, 5, 8), claim(50, 10, 2)];
        assert_eq!(resolve_overlaps(&claims), vec![false, true, true]);
        let claims = [claim(0, 4, 1), claim(0, 4, u64::MAX)];
        assert_eq!(resolve_overlaps(&claims), vec![false, true]);
        // Touching ranges do not overlap.
        let claims = [claim(0, 4, 1), claim(4, 4, 2), claim(3, 1, 0)];
        assert_eq!(resolve_overlaps(&claims), vec![true, true, false]);
    }
}
