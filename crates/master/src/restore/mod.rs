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

use std::sync::atomic::Ordering;

use mooncake_common::{ReplicaId, SegmentStatus};
use thiserror::Error;

use crate::handle::MasterService;
use crate::index::Tenant;
use crate::mutation::{MasterState, Mutation, ObjectRecord};

mod claims;
mod objects;
mod verify;

/// How long a re-mounted segment's node has to confirm its restored replicas (ms).
pub const DEFAULT_VERIFY_TIMEOUT_MS: u64 = 60_000;
/// Most replicas one [`MasterService::get_unverified_replicas`] page returns.
pub const MAX_UNVERIFIED_PAGE: usize = 4096;
/// A page stops once its ranges add up to this many bytes (at least one replica per page), so
/// that checking one page takes the node a bounded time.
pub const MAX_UNVERIFIED_PAGE_BYTES: u64 = 1 << 30;
/// Most ids one [`MasterService::confirm_replicas`] call may carry in each list.
pub const MAX_CONFIRM_IDS: usize = 65_536;

/// Runs two pieces of work, possibly at once, and returns when both are done (a fork-join
/// supplied by the caller: the master itself never starts threads).
pub type Join = fn(&mut (dyn FnMut() + Send), &mut (dyn FnMut() + Send));

/// How to restore.
#[derive(Debug, Clone, Copy)]
pub struct RestoreOptions {
    /// Objects without a checksum are dropped (their bytes cannot be checked). Turn off only for
    /// a FINAL snapshot (taken after the RPC server stopped, never served from since).
    pub verify_required: bool,
    /// How long a restored segment waits for its owner (`None`: `client_live_ttl_sec`).
    pub owner_wait_ms: Option<u64>,
    /// How long a re-mounted segment's node has to confirm its replicas.
    pub verify_timeout_ms: u64,
    /// Splits the bulk steps (allocator rebuilds, building the entries, inserting them, sorting
    /// the pending verifications) in two halves run by this fork-join; `None` runs them one
    /// after the other. The result is the same either way.
    pub join: Option<Join>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            verify_required: true,
            owner_wait_ms: None,
            verify_timeout_ms: DEFAULT_VERIFY_TIMEOUT_MS,
            join: None,
        }
    }
}

/// Runs `a` and `b` with `join`, or one after the other.
pub(super) fn both(join: Option<Join>, mut a: impl FnMut() + Send, mut b: impl FnMut() + Send) {
    match join {
        Some(join) => join(&mut a, &mut b),
        None => {
            a();
            b();
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
    /// Adds `other`'s counts to these.
    pub(super) fn add(&mut self, other: &RestoreDrops) {
        self.invalid_segments += other.invalid_segments;
        self.overlap_replicas += other.overlap_replicas;
        self.overlap_objects += other.overlap_objects;
        self.processing_objects += other.processing_objects;
        self.no_checksum_objects += other.no_checksum_objects;
        self.lost_segment_objects += other.lost_segment_objects;
        self.invalid_objects += other.invalid_objects;
        self.tasks += other.tasks;
    }

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

/// What happens to a restored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Keep,
    Processing,
    Invalid,
    NoChecksum,
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

        // What happens to each object; the ranges claimed, one allocator rebuild per segment.
        let segs = claims::accept_segments(segment_records, &mut report.dropped);
        let fates: Vec<Fate> = object_records
            .iter()
            .map(|o| self.fate_of(o, opts.verify_required))
            .collect();
        let mut claimed = claims::claim_ranges(
            &segs,
            &object_records,
            &fates,
            &discarded,
            &mut report.dropped,
            opts.join,
        );

        // Segments, waiting for their owners; then the policy (accounts before charges).
        {
            let mut manager = self.segments.inner.write();
            let until = now.saturating_add(owner_wait_ms);
            for (seg, allocator) in segs.records.iter().zip(&claimed.allocators) {
                manager.insert_restored(seg, allocator.clone(), until);
            }
        }
        report.segments = segs.records.len();
        drop(std::mem::take(&mut claimed.allocators));
        if self.config.enable_multi_tenants {
            self.set_policy(tenant_policy, false);
        }

        // Objects, bucketed by shard, then one write lock per shard; the discarded list.
        let mut object_records = object_records;
        let mut placed = self.place_objects(
            &segs,
            &mut object_records,
            &fates,
            &mut claimed,
            &mut report.dropped,
            opts.join,
        );
        self.insert_buckets(&mut placed, &mut report, opts.join);
        self.restore_discarded(
            &discarded,
            claimed.discarded_handles,
            placed.in_flight,
            now,
            &mut report,
        );
        let next = next_replica_id.max(claimed.max_id.saturating_add(1));
        self.next_replica_id.fetch_max(next, Ordering::Relaxed);
        report.next_replica_id = self.next_replica_id.load(Ordering::Relaxed);
        self.recompute_quotas();

        self.install_pending(
            &segs,
            placed.pending,
            placed.keys,
            opts.verify_timeout_ms,
            opts.join,
        );
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
}
