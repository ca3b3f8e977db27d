//! Restored objects: records turned into entries around the handles the rebuilt allocators gave
//! their replicas, bucketed by shard and inserted one shard lock at a time; the discarded list
//! (the snapshot's entries, then the ranges of puts in flight) and the pending verifications.

use std::collections::HashMap;

use mooncake_common::{ReplicaId, ReplicaStatus, SegmentId, TenantId};
use smallvec::SmallVec;

use super::claims::{Claimed, Segments, SlotState};
use super::{Fate, RestoreDrops, RestoreReport};
use crate::allocator::BufferHandle;
use crate::deferred::DiscardedBuffers;
use crate::handle::MasterService;
use crate::index::{group_hash, key_hash, routed, shard_of, Tenant, SHARD_COUNT};
use crate::mutation::{DiscardedRecord, ObjectRecord, ReplicaPlace};
use crate::object::{ObjectEntry, Replica, ReplicaData};
use crate::unverified::{PendingReplica, PendingSegment, VerificationStats};

/// A restored object on its way into its shard: tenant, routing hash, entry.
type Bucketed = (Option<TenantId>, u64, Box<ObjectEntry>);

/// A memory replica to verify: segment position, id, offset, length.
type Unverified = (usize, ReplicaId, u64, u64);

/// What the objects left for the later steps.
pub(super) struct Placed {
    /// Entries by shard.
    buckets: Vec<Vec<Bucketed>>,
    /// Pending verifications by segment position.
    pub(super) pending: Vec<Vec<PendingReplica>>,
    /// The keys of the objects with a pending verification (`PendingReplica::object` indexes it).
    pub(super) keys: Vec<(Option<TenantId>, Box<str>)>,
    /// The ranges of puts in flight, for the discarded list.
    pub(super) in_flight: Vec<BufferHandle>,
}

/// One object's replicas, rebuilt.
struct Rebuilt {
    replicas: SmallVec<[Replica; 1]>,
    /// Some replica lost an overlap.
    lost_to_overlap: bool,
    unverified: SmallVec<[Unverified; 2]>,
}

/// The replicas of `record` (its slots start at `first_slot`) with the handles the rebuild gave
/// them; the memory ranges of replicas not complete go to `in_flight`.
fn rebuild_replicas(
    record: &ObjectRecord,
    first_slot: usize,
    processing: bool,
    claimed: &mut Claimed,
    seg_pos: &HashMap<SegmentId, usize>,
    in_flight: &mut Vec<BufferHandle>,
) -> Rebuilt {
    let mut out = Rebuilt {
        replicas: SmallVec::new(),
        lost_to_overlap: false,
        unverified: SmallVec::new(),
    };
    for (j, rr) in record.replicas.iter().enumerate() {
        let slot = first_slot + j;
        out.lost_to_overlap |= claimed.slot_state[slot] == SlotState::LostOverlap;
        let complete = !processing && rr.status == ReplicaStatus::COMPLETE;
        let data = match &rr.place {
            ReplicaPlace::Memory(_) | ReplicaPlace::NoF(_) => {
                let Some(h) = claimed.slot_handles[slot].take() else {
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
                    ReplicaPlace::NoF(_) => ReplicaData::NoF(h),
                    _ => ReplicaData::Memory(h),
                }
            }
            _ if !complete => continue,
            ReplicaPlace::Disk(d) => ReplicaData::Disk(Box::new(d.clone())),
            ReplicaPlace::LocalDisk(d) => ReplicaData::LocalDisk(Box::new(d.clone())),
            ReplicaPlace::Dfs(d) => ReplicaData::Dfs(Box::new(d.clone())),
        };
        let on_segment = matches!(data, ReplicaData::Memory(_) | ReplicaData::NoF(_));
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

impl MasterService {
    /// Turns the records into entries, bucketed by shard, counting in `drops` those left out.
    pub(super) fn place_objects(
        &self,
        segs: &Segments,
        objects: Vec<ObjectRecord>,
        fates: &[Fate],
        claimed: &mut Claimed,
        drops: &mut RestoreDrops,
    ) -> Placed {
        let mut placed = Placed {
            buckets: Vec::new(),
            pending: Vec::new(),
            keys: Vec::new(),
            in_flight: Vec::new(),
        };
        placed.buckets.resize_with(SHARD_COUNT, Vec::new);
        placed.pending.resize_with(segs.records.len(), Vec::new);
        for (i, record) in objects.into_iter().enumerate() {
            match fates[i] {
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
            let processing = fates[i] == Fate::Processing;
            let rebuilt = rebuild_replicas(
                &record,
                claimed.first_slot[i],
                processing,
                claimed,
                &segs.pos,
                &mut placed.in_flight,
            );
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
            self.bucket_object(record, rebuilt, &mut placed, drops);
        }
        placed
    }

    /// Builds `record`'s entry around its rebuilt replicas (its task dropped, its group route and
    /// soft pin set) and puts it into its shard's bucket, its replicas among the pending.
    fn bucket_object(
        &self,
        mut record: ObjectRecord,
        rebuilt: Rebuilt,
        placed: &mut Placed,
        drops: &mut RestoreDrops,
    ) {
        if record.task.take().is_some() {
            drops.tasks += 1;
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
        let entry = self.entry_of(&record, group, rebuilt.replicas, account);
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
            placed
                .keys
                .push((record.tenant.clone(), record.key.into_boxed_str()));
        }
        placed.buckets[shard_of(hash)].push((record.tenant, hash, entry));
    }

    /// Inserts the buckets, one write lock per shard. (A duplicate key keeps its first record;
    /// the entries the second left among the pending verifications are stale, so harmless.)
    pub(super) fn insert_buckets(&self, placed: &mut Placed, report: &mut RestoreReport) {
        for (i, bucket) in std::mem::take(&mut placed.buckets).into_iter().enumerate() {
            if bucket.is_empty() {
                continue;
            }
            let mut shard = self.index.shard_at(i).write();
            let defaults = bucket.iter().filter(|(t, _, _)| t.is_none()).count();
            shard
                .tenant_or_insert(Tenant::Default)
                .reserve(Tenant::Default, defaults);
            for (tenant_id, hash, entry) in bucket {
                let tenant = Tenant::of(tenant_id.as_ref());
                let state = shard.tenant_or_insert(tenant);
                if state.find(hash, &entry.key).is_some() {
                    report.dropped.invalid_objects += 1;
                    continue;
                }
                report.objects += 1;
                report.unverified_replicas +=
                    entry.meta.replicas.iter().filter(|r| r.unverified).count();
                state.insert(tenant, hash, entry);
            }
        }
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

    /// Installs the pending verifications by segment (the counters start again).
    pub(super) fn install_pending(
        &self,
        segs: &Segments,
        pending: Vec<Vec<PendingReplica>>,
        keys: Vec<(Option<TenantId>, Box<str>)>,
        verify_timeout_ms: u64,
    ) {
        let mut u = self.unverified.lock();
        u.verify_timeout_ms = verify_timeout_ms;
        u.stats = VerificationStats::default();
        u.keys = keys;
        for (seg, list) in segs.records.iter().zip(pending) {
            if !list.is_empty() {
                u.segments.insert(seg.segment.id, PendingSegment::new(list));
            }
        }
    }
}
