//! Restore from a snapshot, and the checks that make the restored state safe to serve
//! (docs/master.md, "Restore").
//!
//! [`MasterService::restore`] rebuilds an empty master from a [`MasterState`] in bulk: the memory
//! ranges of every segment are collected, overlaps resolved (the higher replica id wins; a
//! discarded range beats any replica), each segment's allocator rebuilt once around the ranges
//! kept, and the objects inserted shard by shard, one write lock per shard. What comes back:
//!
//! - **segments** wait for their owner ([`crate::segments::MountedSegment::waiting_until_ms`]):
//!   space reserved, not used for placement. The owner's MountSegment/ReMountSegment with the same
//!   id and equal fields ends the wait; a segment not taken back in time is dropped with its
//!   replicas by [`MasterService::run_restore_deadlines_once`].
//! - **complete objects**, every one, their memory replicas *unverified*: not readable, not a
//!   copy source, not evictable, until the node owning the segment confirms that the bytes of the
//!   range still have the object's checksum ([`MasterService::get_unverified_replicas`],
//!   [`MasterService::confirm_replicas`]). A mismatch, or no answer within the verification
//!   deadline after the re-mount, drops the replica (its range is freed, the object erased when
//!   nothing is left). Objects without a checksum cannot be checked: they are dropped unless
//!   `verify_required` is off (a FINAL snapshot), in which case they are accepted at re-mount.
//! - **puts in flight** (PROCESSING objects, copy/move targets) are not restored: their ranges go
//!   to the discarded list until `now + put_start_release_timeout`, so a late write by the old
//!   writer cannot land in memory that is handed out again. Copy/move tasks are dropped.
//! - the discarded list, the tenant policy (with the quota charges of every object), group
//!   routes, soft-pin deadlines, and a next replica id past every id seen.
//!
//! **Observers.** Restore runs on an empty master before it serves. With an observer installed it
//! observes the restored state as an empty master would have to replay it (segments mounted with
//! their status, the policy, every object, the discarded list), so `apply` of the observed
//! sequence rebuilds an equal export; the later verification drops are observed like any other
//! change (`Object`/`Erase`, `SegmentUnmounted`). Waiting and unverified are not state: a master
//! that takes over from those records must restore them again (and so verify again).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mooncake_common::{
    ClientId, ErrorCode, ReplicaId, ReplicaStatus, SegmentId, SegmentStatus, TenantId,
};
use smallvec::SmallVec;
use thiserror::Error;

use crate::allocator::{BufferHandle, SegmentAllocator, SegmentInfo};
use crate::deferred::DiscardedBuffers;
use crate::handle::MasterService;
use crate::index::{group_hash, key_hash, routed, shard_of, Tenant, SHARD_COUNT};
use crate::mutation::{MasterState, Mutation, ObjectRecord, ReplicaPlace, SegmentRecord};
use crate::object::{ObjectEntry, Replica, ReplicaData};
use crate::unverified::{PendingReplica, PendingSegment, Taken, VerificationStats};

/// How long a re-mounted segment's node has to confirm its restored replicas (ms).
pub const DEFAULT_VERIFY_TIMEOUT_MS: u64 = 60_000;
/// Most replicas one [`MasterService::get_unverified_replicas`] page returns.
pub const MAX_UNVERIFIED_PAGE: usize = 4096;
/// A page stops once its ranges add up to this many bytes (at least one replica per page), so
/// that checking one page takes the node a bounded time.
pub const MAX_UNVERIFIED_PAGE_BYTES: u64 = 1 << 30;
/// Most ids one [`MasterService::confirm_replicas`] call may carry in each list.
pub const MAX_CONFIRM_IDS: usize = 65_536;

/// How to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Objects without a checksum are dropped (their bytes cannot be checked). Turn off only for
    /// a FINAL snapshot (taken after the RPC server stopped, never served from since).
    pub verify_required: bool,
    /// How long a restored segment waits for its owner (`None`: `client_live_ttl_sec`).
    pub owner_wait_ms: Option<u64>,
    /// How long a re-mounted segment's node has to confirm its replicas.
    pub verify_timeout_ms: u64,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            verify_required: true,
            owner_wait_ms: None,
            verify_timeout_ms: DEFAULT_VERIFY_TIMEOUT_MS,
        }
    }
}

/// What restore left out, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreDrops {
    /// Segment records refused (zero base or size, overflow, duplicate id, unmounting status).
    pub invalid_segments: usize,
    /// Memory replicas that lost an overlap to a newer replica or a discarded range.
    pub overlap_replicas: usize,
    /// Objects left without a replica by overlaps.
    pub overlap_objects: usize,
    /// Objects being written (PROCESSING) at snapshot time; their ranges are discarded.
    pub processing_objects: usize,
    /// Objects without a checksum while verification is required.
    pub no_checksum_objects: usize,
    /// Objects whose every replica lay on a segment the snapshot lacks, or outside it.
    pub lost_segment_objects: usize,
    /// Objects that cannot be restored: size 0, no replica, a duplicate key, a named tenant with
    /// multi-tenancy off.
    pub invalid_objects: usize,
    /// Copy/move tasks dropped (their targets' ranges are discarded; the objects are kept).
    pub tasks: usize,
}

impl RestoreDrops {
    /// Objects not restored, all reasons together.
    pub fn objects(&self) -> usize {
        self.overlap_objects
            + self.processing_objects
            + self.no_checksum_objects
            + self.lost_segment_objects
            + self.invalid_objects
    }
}

/// What [`MasterService::restore`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Segments restored (each waiting for its owner).
    pub segments: usize,
    /// Objects restored.
    pub objects: usize,
    /// Memory replicas restored, each waiting for verification.
    pub unverified_replicas: usize,
    /// Buffers on the discarded list (the snapshot's and those of puts in flight).
    pub discarded_buffers: usize,
    /// The next replica id the restored master hands out.
    pub next_replica_id: u64,
    pub dropped: RestoreDrops,
}

/// Why restore refused to start (nothing was changed).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RestoreError {
    #[error("restore needs an empty master ({objects} objects, {segments} segments present)")]
    NotEmpty { objects: usize, segments: usize },
}

/// One restored replica for its node to check: CRC32C of `len` bytes at `offset` in the segment
/// must equal `checksum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnverifiedReplica {
    pub id: ReplicaId,
    pub offset: u64,
    pub len: u64,
    pub checksum: u64,
}

/// What one [`MasterService::confirm_replicas`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfirmOutcome {
    /// Replicas that became readable.
    pub verified: u64,
    /// Replicas dropped (mismatched).
    pub dropped: u64,
}

/// What one [`MasterService::run_restore_deadlines_once`] dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreDeadlineReport {
    /// Restored segments whose owner did not re-mount in time (unmounted with their replicas).
    pub segments_expired: usize,
    /// Replicas not confirmed within the verification deadline.
    pub replicas_timed_out: usize,
}

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

/// A restored object on its way into its shard: tenant, routing hash, entry.
type Bucketed = (Option<TenantId>, u64, Box<ObjectEntry>);

/// What happens to a restored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Keep,
    Processing,
    Invalid,
    NoChecksum,
}

/// The state of one replica slot after the allocators were rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Not a memory range, or refused (unknown segment, out of bounds, zero length).
    Unclaimed,
    Kept,
    LostOverlap,
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

impl MasterService {
    /// Restores `state` (a snapshot's contents) into this master, which must be empty and not yet
    /// serving. See the module doc for what comes back and how it becomes readable.
    pub fn restore(
        &self,
        state: MasterState,
        opts: RestoreOptions,
    ) -> Result<RestoreReport, RestoreError> {
        let (objects, segments) = (
            self.object_count(),
            self.segments.inner.read().mounted.len(),
        );
        if objects > 0 || segments > 0 {
            return Err(RestoreError::NotEmpty { objects, segments });
        }
        let now = self.clock.now_ms();
        let owner_wait_ms = opts
            .owner_wait_ms
            .unwrap_or_else(|| self.config.client_live_ttl_sec.saturating_mul(1000));
        let MasterState {
            segments: segment_records,
            objects: object_records,
            discarded,
            tenant_policy,
            next_replica_id,
        } = state;
        let mut report = RestoreReport::default();
        let drops = &mut report.dropped;

        // Segments: position by id.
        let mut segs: Vec<SegmentRecord> = Vec::with_capacity(segment_records.len());
        let mut seg_pos: HashMap<SegmentId, usize> = HashMap::new();
        for r in segment_records {
            if !valid_segment(&r) || seg_pos.contains_key(&r.segment.id) {
                drops.invalid_segments += 1;
                continue;
            }
            seg_pos.insert(r.segment.id, segs.len());
            segs.push(r);
        }

        // What happens to each object, and the ranges its replicas claim.
        let fates: Vec<Fate> = object_records
            .iter()
            .map(|o| self.fate_of(o, opts.verify_required))
            .collect();
        let mut first_slot = Vec::with_capacity(object_records.len() + 1);
        let mut slots = 0usize;
        for o in &object_records {
            first_slot.push(slots);
            slots += o.replicas.len();
        }
        first_slot.push(slots);
        let mut claims: Vec<Vec<Claim>> = vec![Vec::new(); segs.len()];
        let in_bounds = |seg: &SegmentRecord, offset: u64, len: u64| {
            len > 0
                && offset
                    .checked_add(len)
                    .is_some_and(|e| e <= seg.segment.size)
        };
        let mut max_id = 0u64;
        for (i, o) in object_records.iter().enumerate() {
            for (j, r) in o.replicas.iter().enumerate() {
                max_id = max_id.max(r.id.0);
                if !matches!(fates[i], Fate::Keep | Fate::Processing) {
                    continue;
                }
                let Some(b) = r.place.buffer() else { continue };
                let Some(&p) = seg_pos.get(&b.segment) else {
                    continue;
                };
                if in_bounds(&segs[p], b.offset, b.len) {
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
                if let Some(&p) = seg_pos.get(&b.segment) {
                    if in_bounds(&segs[p], b.offset, b.len) {
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

        // One rebuild per segment around the ranges kept.
        let mut slot_handles: Vec<Option<BufferHandle>> = Vec::new();
        slot_handles.resize_with(slots, || None);
        let mut slot_state = vec![SlotState::Unclaimed; slots];
        let mut discarded_handles: Vec<Vec<Option<BufferHandle>>> = discarded
            .iter()
            .map(|d| {
                let mut v = Vec::new();
                v.resize_with(d.buffers.len(), || None);
                v
            })
            .collect();
        let mut names: HashMap<String, Arc<str>> = HashMap::new();
        let mut allocators: Vec<Arc<SegmentAllocator>> = Vec::with_capacity(segs.len());
        for (p, seg) in segs.iter().enumerate() {
            let claims = std::mem::take(&mut claims[p]);
            let kept = resolve_overlaps(&claims);
            let live: Vec<(u64, u64)> = claims
                .iter()
                .zip(&kept)
                .filter(|(_, k)| **k)
                .map(|(c, _)| (c.offset, c.len))
                .collect();
            let s = &seg.segment;
            let name = names
                .entry(s.name.clone())
                .or_insert_with(|| Arc::from(s.name.as_str()))
                .clone();
            let info = SegmentInfo {
                segment_id: s.id,
                name,
                endpoint: Arc::from(s.te_endpoint.as_str()),
                protocol: Arc::from(s.protocol.as_str()),
                base: s.base,
                capacity: s.size,
            };
            // The claims were bounds-checked and de-overlapped, so rebuild cannot refuse them;
            // if it did, the segment comes back empty rather than wrong.
            let (allocator, handles) = match SegmentAllocator::rebuild(info.clone(), &live) {
                Ok(built) => built,
                Err(_) => (SegmentAllocator::new(info), Vec::new()),
            };
            let mut handles = handles.into_iter();
            for (c, k) in claims.iter().zip(&kept) {
                match (c.holder, *k) {
                    (Holder::Replica(slot), true) => {
                        slot_handles[slot] = handles.next();
                        slot_state[slot] = if slot_handles[slot].is_some() {
                            SlotState::Kept
                        } else {
                            SlotState::Unclaimed
                        };
                    }
                    (Holder::Replica(slot), false) => slot_state[slot] = SlotState::LostOverlap,
                    (Holder::Discarded(e, k), true) => discarded_handles[e][k] = handles.next(),
                    (Holder::Discarded(..), false) => {}
                }
            }
            allocators.push(allocator);
        }
        drops.overlap_replicas = slot_state
            .iter()
            .filter(|s| **s == SlotState::LostOverlap)
            .count();

        // Segments, waiting for their owners; then the policy (accounts before charges).
        {
            let mut manager = self.segments.inner.write();
            let until = now.saturating_add(owner_wait_ms);
            for (seg, allocator) in segs.iter().zip(&allocators) {
                manager.insert_restored(seg, allocator.clone(), until);
            }
        }
        report.segments = segs.len();
        drop(allocators);
        if self.config.enable_multi_tenants {
            self.set_policy(tenant_policy, false);
        }

        // Objects, bucketed by shard.
        let mut buckets: Vec<Vec<Bucketed>> = Vec::new();
        buckets.resize_with(SHARD_COUNT, Vec::new);
        let mut pending: Vec<Vec<PendingReplica>> = Vec::new();
        pending.resize_with(segs.len(), Vec::new);
        let mut keys: Vec<(Option<TenantId>, Box<str>)> = Vec::new();
        let mut in_flight: Vec<BufferHandle> = Vec::new();
        for (i, mut record) in object_records.into_iter().enumerate() {
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
            let mut replicas = SmallVec::<[Replica; 1]>::new();
            let mut lost_to_overlap = false;
            let mut unverified: SmallVec<[(usize, ReplicaId, u64, u64); 2]> = SmallVec::new();
            for (j, rr) in record.replicas.iter().enumerate() {
                let slot = first_slot[i] + j;
                lost_to_overlap |= slot_state[slot] == SlotState::LostOverlap;
                let complete = !processing && rr.status == ReplicaStatus::COMPLETE;
                let data = match &rr.place {
                    ReplicaPlace::Memory(_) | ReplicaPlace::NoF(_) => {
                        let Some(h) = slot_handles[slot].take() else {
                            continue;
                        };
                        if !complete {
                            in_flight.push(h);
                            continue;
                        }
                        if let Some(b) = rr.place.buffer() {
                            if let Some(&p) = seg_pos.get(&b.segment) {
                                unverified.push((p, rr.id, b.offset, b.len));
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
                replicas.push(Replica {
                    id: rr.id,
                    status: ReplicaStatus::COMPLETE,
                    refcnt: 0,
                    unverified: on_segment,
                    data,
                });
            }
            if processing {
                drops.processing_objects += 1;
                continue;
            }
            if replicas.is_empty() {
                if lost_to_overlap {
                    drops.overlap_objects += 1;
                } else {
                    drops.lost_segment_objects += 1;
                }
                continue;
            }
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
            let entry = self.entry_of(&record, group, replicas, account);
            if !unverified.is_empty() {
                for (p, id, offset, len) in unverified {
                    pending[p].push(PendingReplica {
                        id,
                        object: keys.len(),
                        offset,
                        len,
                        checksum: record.checksum,
                        settled: false,
                    });
                }
                keys.push((record.tenant.clone(), record.key.into_boxed_str()));
            }
            buckets[shard_of(hash)].push((record.tenant, hash, entry));
        }

        // One write lock per shard. (A duplicate key keeps its first record; the entries the
        // second left among the pending verifications are stale, so harmless.)
        for (i, bucket) in buckets.into_iter().enumerate() {
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
                    drops.invalid_objects += 1;
                    continue;
                }
                report.objects += 1;
                report.unverified_replicas +=
                    entry.meta.replicas.iter().filter(|r| r.unverified).count();
                state.insert(tenant, hash, entry);
            }
        }

        // The discarded list: the snapshot's entries, then the ranges of the puts in flight.
        {
            let mut list = self.discarded.lock();
            for (d, buffers) in discarded.iter().zip(discarded_handles) {
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
        let next = next_replica_id.max(max_id.saturating_add(1));
        self.next_replica_id.fetch_max(next, Ordering::Relaxed);
        report.next_replica_id = self.next_replica_id.load(Ordering::Relaxed);
        self.recompute_quotas();

        // Pending verifications by segment.
        {
            let mut u = self.unverified.lock();
            u.verify_timeout_ms = opts.verify_timeout_ms;
            u.stats = VerificationStats::default();
            u.keys = keys;
            for (seg, list) in segs.iter().zip(pending) {
                if !list.is_empty() {
                    u.segments.insert(seg.segment.id, PendingSegment::new(list));
                }
            }
        }
        self.restore_active
            .store(report.segments > 0, Ordering::Release);

        if self.observer().is_some() {
            self.observe_restored();
        }
        Ok(report)
    }

    /// What restore does with `o`.
    fn fate_of(&self, o: &ObjectRecord, verify_required: bool) -> Fate {
        let named = Tenant::of(o.tenant.as_ref()) != Tenant::Default;
        if o.size == 0 || o.replicas.is_empty() || (named && !self.config.enable_multi_tenants) {
            return Fate::Invalid;
        }
        if o.processing {
            return Fate::Processing;
        }
        let on_segment = o.replicas.iter().any(|r| r.place.buffer().is_some());
        if verify_required && on_segment && o.checksum.is_none() {
            return Fate::NoChecksum;
        }
        Fate::Keep
    }

    /// Observes the restored state as the mutations an empty master replays to build it.
    #[cold]
    fn observe_restored(&self) {
        let state = self.export_state();
        for s in &state.segments {
            let id = s.segment.id;
            self.emit(|| Mutation::SegmentMounted {
                segment: s.segment.clone(),
                client: s.client,
            });
            let path: &[SegmentStatus] = match s.status {
                SegmentStatus::DRAINING => &[SegmentStatus::DRAINING],
                SegmentStatus::DRAINED => &[SegmentStatus::DRAINING, SegmentStatus::DRAINED],
                _ => &[],
            };
            for &status in path {
                self.emit(|| Mutation::SegmentStatus { id, status });
            }
            if let Some(deadline_ms) = s.graceful_deadline_ms {
                self.emit(|| Mutation::GracefulUnmount {
                    id,
                    client: s.client,
                    deadline_ms,
                });
            }
        }
        if self.config.enable_multi_tenants {
            self.emit(|| Mutation::TenantPolicy(state.tenant_policy.clone()));
        }
        for o in state.objects {
            self.emit(|| Mutation::Object(o));
        }
        for d in state.discarded {
            self.emit(|| Mutation::Discarded(d));
        }
    }

    /// Called after a mount or re-mount took restored segments back: their verification deadline
    /// starts, and replicas without a checksum (restore without required verification) are
    /// accepted at once.
    pub(crate) fn begin_verification(&self, adopted: &[SegmentId]) {
        if adopted.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        let mut unchecked = Vec::new();
        {
            let mut u = self.unverified.lock();
            let deadline = now.saturating_add(u.verify_timeout_ms);
            for id in adopted {
                let Some(seg) = u.segments.get_mut(id) else {
                    continue;
                };
                seg.verify_deadline_ms = Some(deadline);
                unchecked.extend(
                    u.take_where(*id, |p| p.checksum.is_none())
                        .into_iter()
                        .map(|t| (*id, t)),
                );
            }
        }
        let accepted = self.settle(unchecked, true);
        self.unverified.lock().stats.accepted_without_checksum += accepted;
    }

    /// Marks each pending replica verified (`ok`) or drops it, if its object still holds it
    /// unverified on that segment. Returns how many changed.
    fn settle(&self, entries: Vec<(SegmentId, Taken)>, ok: bool) -> u64 {
        let mut changed = 0;
        for (segment, (id, tenant_id, key)) in entries {
            let tenant = Tenant::of(tenant_id.as_ref());
            let hash = self.route(tenant, &key);
            let mut shard = self.index.shard(hash).write();
            let done = self.edit_entry(&mut shard, tenant, hash, &key, |meta, edit| {
                let Some(pos) = meta.replicas.iter().position(|r| {
                    r.id == id
                        && r.unverified
                        && r.handle()
                            .and_then(BufferHandle::allocator)
                            .is_some_and(|a| a.info().segment_id == segment)
                }) else {
                    return false;
                };
                if ok {
                    meta.replicas[pos].unverified = false;
                } else {
                    edit.free(meta.extract_replicas(|r| r.id == id));
                }
                true
            });
            if done == Some(true) {
                changed += 1;
            }
        }
        changed
    }

    /// `client` owns `segment_id`, which it has mounted again since the restore.
    fn check_restored_owner(
        &self,
        client: ClientId,
        segment_id: SegmentId,
    ) -> Result<(), ErrorCode> {
        let segs = self.segments.inner.read();
        let seg = segs
            .mounted
            .get(&segment_id)
            .filter(|s| s.allocator.is_some())
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        if seg.client != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        if seg.waiting_until_ms.is_some() {
            return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        }
        Ok(())
    }

    /// GetUnverifiedReplicas: the restored replicas of `segment_id` still waiting for `client`'s
    /// check, ids above `after`, at most `limit` (clamped to [1, 4096]) and about 1 GiB of ranges
    /// per page; empty when none is left. Unknown segment → SEGMENT_NOT_FOUND, another client's →
    /// ILLEGAL_CLIENT, not re-mounted yet → UNAVAILABLE_IN_CURRENT_STATUS. Counts as a ping.
    pub fn get_unverified_replicas(
        &self,
        client: ClientId,
        segment_id: SegmentId,
        after: ReplicaId,
        limit: usize,
    ) -> Result<Vec<UnverifiedReplica>, ErrorCode> {
        let _ = self.clients.push(client);
        self.check_restored_owner(client, segment_id)?;
        let limit = limit.clamp(1, MAX_UNVERIFIED_PAGE);
        let u = self.unverified.lock();
        let Some(seg) = u.segments.get(&segment_id) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for p in seg.open_after(after) {
            let Some(checksum) = p.checksum else { continue };
            if out.len() == limit || (!out.is_empty() && bytes >= MAX_UNVERIFIED_PAGE_BYTES) {
                break;
            }
            bytes = bytes.saturating_add(p.len);
            out.push(UnverifiedReplica {
                id: p.id,
                offset: p.offset,
                len: p.len,
                checksum,
            });
        }
        Ok(out)
    }

    /// ConfirmReplicas: `client`'s verdicts on restored replicas of `segment_id`: `verified` ones
    /// become readable, `mismatched` ones are dropped (their ranges freed; an object left without
    /// a replica is erased). An id in both lists counts as mismatched; unknown or already settled
    /// ids are ignored. More than 65 536 ids in a list → INVALID_PARAMS; ownership errors as
    /// [`MasterService::get_unverified_replicas`]. Counts as a ping.
    pub fn confirm_replicas(
        &self,
        client: ClientId,
        segment_id: SegmentId,
        verified: &[ReplicaId],
        mismatched: &[ReplicaId],
    ) -> Result<ConfirmOutcome, ErrorCode> {
        if verified.len() > MAX_CONFIRM_IDS || mismatched.len() > MAX_CONFIRM_IDS {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let _ = self.clients.push(client);
        self.check_restored_owner(client, segment_id)?;
        let (bad, good) = {
            let mut u = self.unverified.lock();
            let bad = u.take(segment_id, mismatched);
            let good = u.take(segment_id, verified);
            (bad, good)
        };
        let tag = |v: Vec<Taken>| v.into_iter().map(|t| (segment_id, t)).collect::<Vec<_>>();
        let outcome = ConfirmOutcome {
            dropped: self.settle(tag(bad), false),
            verified: self.settle(tag(good), true),
        };
        let mut u = self.unverified.lock();
        u.stats.mismatched += outcome.dropped;
        u.stats.verified += outcome.verified;
        Ok(outcome)
    }

    /// The restore deadlines (the client monitor runs it every tick): restored segments whose
    /// owner did not mount them again in time are unmounted with their replicas (as for a dead
    /// client: prepare → sweep → commit, each observed); replicas of re-mounted segments not
    /// confirmed by their deadline are dropped. Costs one atomic load once nothing is pending.
    pub fn run_restore_deadlines_once(&self) -> RestoreDeadlineReport {
        let mut report = RestoreDeadlineReport::default();
        if !self.restore_active.load(Ordering::Acquire) {
            return report;
        }
        let now = self.clock.now_ms();
        let mut dying = Vec::new();
        let mut prepared = Vec::new();
        {
            let mut segs = self.segments.inner.write();
            let due: Vec<SegmentId> = segs
                .mounted
                .values()
                .filter(|s| s.waiting_until_ms.is_some_and(|t| t <= now))
                .map(|s| s.segment.id)
                .collect();
            for id in due {
                if let Ok(Some(a)) = segs.prepare_unmount(id) {
                    self.emit(|| Mutation::SegmentUnmounted { id });
                    dying.push(a);
                    prepared.push(id);
                }
            }
        }
        // Every replica on those segments is unreadable from here on.
        drop(dying);
        if !prepared.is_empty() {
            self.clear_invalid_handles();
            let mut segs = self.segments.inner.write();
            for id in &prepared {
                segs.commit_unmount(*id);
            }
        }
        if !prepared.is_empty() {
            self.recompute_quotas();
        }
        report.segments_expired = prepared.len();

        // Segments still mounted (the others' entries are void).
        let (alive, waiting): (std::collections::HashSet<SegmentId>, bool) = {
            let segs = self.segments.inner.read();
            (
                segs.mounted
                    .values()
                    .filter(|s| s.allocator.is_some())
                    .map(|s| s.segment.id)
                    .collect(),
                segs.mounted.values().any(|s| s.waiting_until_ms.is_some()),
            )
        };
        let timed_out = {
            let mut u = self.unverified.lock();
            u.stats.segments_expired += prepared.len() as u64;
            u.prune(|id| alive.contains(&id));
            let due: Vec<SegmentId> = u
                .segments
                .iter()
                .filter(|(_, s)| s.verify_deadline_ms.is_some_and(|d| d <= now))
                .map(|(id, _)| *id)
                .collect();
            let mut out = Vec::new();
            for id in due {
                out.extend(u.take_where(id, |_| true).into_iter().map(|t| (id, t)));
            }
            out
        };
        let dropped = self.settle(timed_out, false);
        report.replicas_timed_out = dropped as usize;
        let mut u = self.unverified.lock();
        u.stats.timed_out += dropped;
        u.prune(|_| true);
        if !waiting && u.segments.is_empty() {
            self.restore_active.store(false, Ordering::Release);
        }
        report
    }

    /// Verification counters since the last restore, with the replicas still pending.
    pub fn verification_stats(&self) -> VerificationStats {
        let u = self.unverified.lock();
        VerificationStats {
            pending: u.pending(),
            ..u.stats
        }
    }

    /// Restored segments still waiting for their owner.
    pub fn waiting_segments(&self) -> Vec<SegmentId> {
        let segs = self.segments.inner.read();
        let mut out: Vec<SegmentId> = segs
            .mounted
            .values()
            .filter(|s| s.waiting_until_ms.is_some())
            .map(|s| s.segment.id)
            .collect();
        out.sort_unstable();
        out
    }
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
