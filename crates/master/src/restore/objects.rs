//! Restored objects: records turned into entries around the handles the rebuilt allocators gave
//! their replicas, bucketed by shard and inserted one shard lock at a time; the discarded list
//! (the snapshot's entries, then the ranges of puts in flight) and the pending verifications.
//! Building the entries, inserting them and sorting the pending lists each run in two halves
//! (`RestoreOptions::join`).

use mooncake_common::{ReplicaId, ReplicaStatus, TenantId};
use smallvec::SmallVec;

use super::claims::{Claimed, SegmentPositions, Segments, SlotState};
use super::{both, Fate, Join, RestoreDrops, RestoreReport};
use crate::allocator::BufferHandle;
use crate::deferred::DiscardedBuffers;
use crate::handle::MasterService;
use crate::index::{group_hash, key_hash, routed, shard_of, Tenant, SHARD_COUNT};
use crate::mutation::{DiscardedRecord, ObjectRecord, ReplicaPlace};
use crate::object::{ObjectEntry, Place, Replica, ReplicaData, Replicas};
use crate::unverified::{PendingReplica, PendingSegment, VerificationStats};

/// A restored object on its way into its shard: tenant, routing hash, entry.
type Bucketed = (Option<TenantId>, u64, Box<ObjectEntry>);

/// A memory replica to verify: segment position, id, offset, length.
type Unverified = (usize, ReplicaId, u64, u64);

/// The keys of the objects with a pending verification (`PendingReplica::object` indexes it).
type Keys = Vec<(Option<TenantId>, Box<str>)>;

/// What the objects left for the later steps.
pub(super) struct Placed {
    /// Entries by shard.
    buckets: Vec<Vec<Bucketed>>,
    /// Pending verifications by segment position.
    pub(super) pending: Vec<Vec<PendingReplica>>,
    pub(super) keys: Keys,
    /// The ranges of puts in flight, for the discarded list.
    pub(super) in_flight: Vec<BufferHandle>,
    /// Objects left out, by reason.
    drops: RestoreDrops,
}

impl Placed {
    fn new(segments: usize) -> Self {
        let mut placed = Placed {
            buckets: Vec::new(),
            pending: Vec::new(),
            keys: Vec::new(),
            in_flight: Vec::new(),
            drops: RestoreDrops::default(),
        };
        placed.buckets.resize_with(SHARD_COUNT, Vec::new);
        placed.pending.resize_with(segments, Vec::new);
        placed
    }

    /// Appends what the later half placed (its entries after this half's in every bucket, so a
    /// duplicate key keeps the record met first).
    fn append(&mut self, later: Placed) {
        for (mine, theirs) in self.buckets.iter_mut().zip(later.buckets) {
            mine.extend(theirs);
        }
        let offset = self.keys.len();
        for (mine, theirs) in self.pending.iter_mut().zip(later.pending) {
            mine.extend(theirs.into_iter().map(|mut p| {
                p.object += offset;
                p
            }));
        }
        self.keys.extend(later.keys);
        self.in_flight.extend(later.in_flight);
        self.drops.add(&later.drops);
    }
}

/// One object's replicas, rebuilt.
struct Rebuilt {
    replicas: Replicas,
    /// Some replica lost an overlap.
    lost_to_overlap: bool,
    unverified: SmallVec<[Unverified; 2]>,
}

/// The replicas of `record` with the handles the rebuild gave them (`handles` and `states` are
/// its slots); the memory ranges of replicas not complete go to `in_flight`.
fn rebuild_replicas(
    record: &ObjectRecord,
    handles: &mut [Option<BufferHandle>],
    states: &[SlotState],
    processing: bool,
    seg_pos: &SegmentPositions,
    in_flight: &mut Vec<BufferHandle>,
) -> Rebuilt {
    let mut out = Rebuilt {
        replicas: Replicas::new(),
        lost_to_overlap: false,
        unverified: SmallVec::new(),
    };
    for (j, rr) in record.replicas.iter().enumerate() {
        out.lost_to_overlap |= states.get(j) == Some(&SlotState::LostOverlap);
        let complete = !processing && rr.status == ReplicaStatus::COMPLETE;
        let data = match &rr.place {
            ReplicaPlace::Memory(_) | ReplicaPlace::NoF(_) => {
                let Some(h) = handles.get_mut(j).and_then(Option::take) else {
                    continue;
                };
                if !complete {
                    in_flight.push(h);
                    continue;
                }
                if let Some(b) = rr.place.buffer() {
                    if let Some(&p) = seg_pos.get(&b.segment) {
                        out.unverified.push((p, rr.id, b.offset, b.len));
                    }
                }
                match rr.place {
                    ReplicaPlace::NoF(_) => ReplicaData::nof(h),
                    _ => ReplicaData::Memory(h),
                }
            }
            _ if !complete => continue,
            ReplicaPlace::Disk(d) => ReplicaData::disk(d.clone()),
            ReplicaPlace::LocalDisk(d) => ReplicaData::local_disk(d.clone()),
            ReplicaPlace::Dfs(d) => ReplicaData::dfs(d.clone()),
        };
        let on_segment = matches!(data.place(), Place::Memory(_) | Place::NoF(_));
        out.replicas.push(Replica {
            id: rr.id,
            status: ReplicaStatus::COMPLETE,
            refcnt: 0,
            unverified: on_segment,
            data,
        });
    }
    out
}

/// One half of the objects and what belongs to it: their fates, where each one's slots start
/// (one more entry than objects; global slot numbers), and the slots from `slot_base` on.
struct Half<'a> {
    records: &'a mut [ObjectRecord],
    fates: &'a [Fate],
    first_slot: &'a [usize],
    slot_base: usize,
    handles: &'a mut [Option<BufferHandle>],
    states: &'a [SlotState],
}

impl MasterService {
    /// Turns the records into entries, bucketed by shard (two halves of the records, run by
    /// `join`), counting in `drops` those left out. The records' keys are moved out.
    pub(super) fn place_objects(
        &self,
        segs: &Segments,
        objects: &mut [ObjectRecord],
        fates: &[Fate],
        claimed: &mut Claimed,
        drops: &mut RestoreDrops,
        join: Option<Join>,
    ) -> Placed {
        let now_ms = self.clock.now_ms();
        let m = objects.len() / 2;
        let split = claimed.first_slot[m];
        let (h0, h1) = claimed.slot_handles.split_at_mut(split);
        let (s0, s1) = claimed.slot_state.split_at(split);
        let (o0, o1) = objects.split_at_mut(m);
        let first_slot = &claimed.first_slot;
        let halves = [
            Half {
                records: o0,
                fates: &fates[..m],
                first_slot: &first_slot[..=m],
                slot_base: 0,
                handles: h0,
                states: s0,
            },
            Half {
                records: o1,
                fates: &fates[m..],
                first_slot: &first_slot[m..],
                slot_base: split,
                handles: h1,
                states: s1,
            },
        ];
        let [a, b] = halves;
        let (mut first, mut second) = (None, None);
        let (mut a, mut b) = (Some(a), Some(b));
        both(
            join,
            || first = a.take().map(|h| self.place_half(segs, h, now_ms)),
            || second = b.take().map(|h| self.place_half(segs, h, now_ms)),
        );
        let mut placed = first.unwrap_or_else(|| Placed::new(segs.records.len()));
        if let Some(second) = second {
            placed.append(second);
        }
        drops.add(&placed.drops);
        placed
    }

    fn place_half(&self, segs: &Segments, half: Half<'_>, now_ms: u64) -> Placed {
        let mut placed = Placed::new(segs.records.len());
        for (i, record) in half.records.iter_mut().enumerate() {
            let drops = &mut placed.drops;
            match half.fates[i] {
                Fate::Invalid => {
                    drops.invalid_objects += 1;
                    continue;
                }
                Fate::NoChecksum => {
                    drops.no_checksum_objects += 1;
                    continue;
                }
                Fate::Keep | Fate::Processing => {}
            }
            let processing = half.fates[i] == Fate::Processing;
            let slots =
                half.first_slot[i] - half.slot_base..half.first_slot[i + 1] - half.slot_base;
            let rebuilt = rebuild_replicas(
                record,
                &mut half.handles[slots.clone()],
                &half.states[slots],
                processing,
                &segs.pos,
                &mut placed.in_flight,
            );
            let drops = &mut placed.drops;
            if processing {
                drops.processing_objects += 1;
                continue;
            }
            if rebuilt.replicas.is_empty() {
                if rebuilt.lost_to_overlap {
                    drops.overlap_objects += 1;
                } else {
                    drops.lost_segment_objects += 1;
                }
                continue;
            }
            self.bucket_object(record, rebuilt, &mut placed, now_ms);
        }
        placed
    }

    /// Builds `record`'s entry around its rebuilt replicas (its task dropped, its group route and
    /// soft pin set) and puts it into its shard's bucket, its replicas among the pending. The
    /// record's key and tenant are moved out.
    fn bucket_object(
        &self,
        record: &mut ObjectRecord,
        rebuilt: Rebuilt,
        placed: &mut Placed,
        now_ms: u64,
    ) {
        if record.task.take().is_some() {
            placed.drops.tasks += 1;
        }
        record.processing = false;
        let tenant = Tenant::of(record.tenant.as_ref());
        let own = key_hash(tenant, &record.key);
        let group = record.group.as_deref().filter(|g| !g.is_empty());
        let hash = group.map_or(own, |g| routed(own, group_hash(g)));
        if let Some(g) = group {
            self.routes
                .set(tenant, &record.key, own, Some(group_hash(g)));
        }
        if record.soft_pin_deadline_ms != 0 {
            self.push_soft_pin(tenant, &record.key, record.soft_pin_deadline_ms);
        }
        let account = self.replay_account(tenant);
        let entry = self.entry_of(record, group, rebuilt.replicas, account, now_ms);
        if !rebuilt.unverified.is_empty() {
            for (p, id, offset, len) in rebuilt.unverified {
                placed.pending[p].push(PendingReplica {
                    id,
                    object: placed.keys.len(),
                    offset,
                    len,
                    checksum: record.checksum,
                    settled: false,
                });
            }
            let key = std::mem::take(&mut record.key).into_boxed_str();
            placed.keys.push((record.tenant.clone(), key));
        }
        placed.buckets[shard_of(hash)].push((record.tenant.take(), hash, entry));
    }

    /// Inserts the buckets, one write lock per shard, the shards in two halves run by `join`.
    /// (A duplicate key keeps its first record; the entries the second left among the pending
    /// verifications are stale, so harmless.)
    pub(super) fn insert_buckets(
        &self,
        placed: &mut Placed,
        report: &mut RestoreReport,
        join: Option<Join>,
    ) {
        let mut buckets = std::mem::take(&mut placed.buckets);
        let (low, high) = buckets.split_at_mut(SHARD_COUNT / 2);
        let (mut a, mut b) = ((0, 0, 0), (0, 0, 0));
        both(
            join,
            || a = self.insert_shards(low, 0),
            || b = self.insert_shards(high, SHARD_COUNT / 2),
        );
        report.objects += a.0 + b.0;
        report.unverified_replicas += a.1 + b.1;
        report.dropped.invalid_objects += a.2 + b.2;
    }

    /// Inserts `buckets` (those of the shards from `first` on); returns the objects inserted,
    /// their unverified replicas, and the duplicates refused.
    fn insert_shards(&self, buckets: &mut [Vec<Bucketed>], first: usize) -> (usize, usize, usize) {
        let (mut objects, mut unverified, mut duplicates) = (0, 0, 0);
        for (i, bucket) in buckets.iter_mut().enumerate() {
            let bucket = std::mem::take(bucket);
            if bucket.is_empty() {
                continue;
            }
            let mut shard = self.index.shard_at(first + i).write();
            let defaults = bucket.iter().filter(|(t, _, _)| t.is_none()).count();
            shard
                .tenant_or_insert(Tenant::Default)
                .reserve(Tenant::Default, defaults);
            for (tenant_id, hash, entry) in bucket {
                let tenant = Tenant::of(tenant_id.as_ref());
                let state = shard.tenant_or_insert(tenant);
                if state.find(hash, &entry.key).is_some() {
                    duplicates += 1;
                    continue;
                }
                objects += 1;
                unverified += entry.meta.replicas.iter().filter(|r| r.unverified).count();
                state.insert(tenant, hash, entry);
            }
        }
        (objects, unverified, duplicates)
    }

    /// The discarded list: the snapshot's entries (with the handles the rebuild gave them), then
    /// the ranges of the puts in flight, released after the put-start release timeout.
    pub(super) fn restore_discarded(
        &self,
        discarded: &[DiscardedRecord],
        handles: Vec<Vec<Option<BufferHandle>>>,
        in_flight: Vec<BufferHandle>,
        now: u64,
        report: &mut RestoreReport,
    ) {
        let mut list = self.discarded.lock();
        for (d, buffers) in discarded.iter().zip(handles) {
            let buffers: Vec<BufferHandle> = buffers.into_iter().flatten().collect();
            if !buffers.is_empty() {
                report.discarded_buffers += buffers.len();
                list.entries.push(DiscardedBuffers {
                    release_at_ms: d.release_at_ms,
                    buffers,
                });
            }
        }
        if !in_flight.is_empty() {
            report.discarded_buffers += in_flight.len();
            list.entries.push(DiscardedBuffers {
                release_at_ms: now.saturating_add(self.config.release_timeout_ms()),
                buffers: in_flight,
            });
        }
    }

    /// Installs the pending verifications by segment (each list sorted by replica id, the
    /// segments in two halves run by `join`; the counters start again).
    pub(super) fn install_pending(
        &self,
        segs: &Segments,
        pending: Vec<Vec<PendingReplica>>,
        keys: Keys,
        verify_timeout_ms: u64,
        join: Option<Join>,
    ) {
        let mut lists: Vec<_> = segs
            .records
            .iter()
            .map(|s| s.segment.id)
            .zip(pending)
            .filter(|(_, list)| !list.is_empty())
            .map(|(id, list)| (id, Some(list), None))
            .collect();
        let mid = lists.len() / 2;
        let (low, high) = lists.split_at_mut(mid);
        let build = |part: &mut [(_, Option<Vec<PendingReplica>>, Option<PendingSegment>)]| {
            for (_, list, built) in part {
                *built = list.take().map(PendingSegment::new);
            }
        };
        both(join, || build(low), || build(high));
        let mut u = self.unverified.lock();
        u.verify_timeout_ms = verify_timeout_ms;
        u.stats = VerificationStats::default();
        u.keys = keys;
        for (id, _, built) in lists {
            if let Some(built) = built {
                u.segments.insert(id, built);
            }
        }
    }
}
