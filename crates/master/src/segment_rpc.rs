//! The segment RPCs (as upstream's master) over the segment manager (`segments.rs`): mount,
//! remount, unmount, graceful unmount and its deadline step, drain status, status queries, and
//! the unmount sweep (`clear_invalid_handles`). Each state change is observed under the segment
//! manager's write lock (`SegmentMounted`, `SegmentStatus`, `GracefulUnmount`, `SegmentUnmounted`).
//!
//! An unmount is *prepare* (under the lock: the segment leaves placement, its allocator's strong
//! reference is taken out, `SegmentUnmounted` is observed) → the allocator dies (every replica on
//! it is unreadable from that instant) → *sweep* every shard (without the segment lock) →
//! *commit* (under the lock: the segment is forgotten).

use mooncake_common::{ClientId, ErrorCode, Segment, SegmentId, SegmentStatus};

use crate::handle::MasterService;
use crate::index::SHARD_COUNT;
use crate::mutation::Mutation;
use crate::segments::{Mounted, SegmentUsage, Segments};

impl MasterService {
    /// MountSegment: `base == 0` or `size == 0` → INVALID_PARAMS; the same id mounted and OK →
    /// OK without counting capacity twice; mounted in another status →
    /// UNAVAILABLE_IN_CURRENT_STATUS. Mount does not make the client OK (only ReMount does).
    /// A restored segment waiting for its owner is taken back by the same client with equal
    /// fields (its replicas then await verification); another client → SEGMENT_ALREADY_EXISTS,
    /// changed fields → INVALID_PARAMS.
    pub fn mount_segment(&self, segment: &Segment, client: ClientId) -> Result<(), ErrorCode> {
        let _ = self.clients.push(client);
        let mounted = {
            let mut segs = self.segments.inner.write();
            let mounted = segs.mount(segment, client)?;
            if mounted == Mounted::New {
                self.emit(|| Mutation::SegmentMounted {
                    segment: segment.clone(),
                    client,
                });
                segs.allocatable
                    .start_ramp(&segment.name, self.clock.now_ms());
            }
            mounted
        };
        if mounted == Mounted::Adopted {
            self.begin_verification(&[segment.id]);
        }
        self.owner_alive(client);
        self.recompute_quotas();
        Ok(())
    }

    /// ReMountSegment: every already-mounted segment must belong to `client` with equal fields
    /// (else INVALID_PARAMS, restored segments included); an OK client gets OK at once; otherwise
    /// mounts each segment (a status error rolls back the ones just mounted and the restored ones
    /// just taken back), takes back its restored segments (their replicas then await
    /// verification) and marks the client OK.
    pub fn remount_segments(
        &self,
        segments: &[Segment],
        client: ClientId,
    ) -> Result<(), ErrorCode> {
        let _ = self.clients.push(client);
        let adopted = {
            let mut segs = self.segments.inner.write();
            let done = segs.remount(segments, client)?;
            for id in done.fresh {
                if let Some(s) = segs.mounted.get(&id) {
                    self.emit(|| Mutation::SegmentMounted {
                        segment: s.segment.clone(),
                        client,
                    });
                }
            }
            done.adopted
        };
        self.begin_verification(&adopted);
        self.owner_alive(client);
        self.recompute_quotas();
        Ok(())
    }

    /// UnmountSegment: unknown → OK; already unmounting → UNAVAILABLE_IN_CURRENT_STATUS.
    /// Otherwise the segment's allocator dies (every replica on it becomes unreadable at once),
    /// the shards are swept of its COMPLETE replicas and of objects left without a valid replica,
    /// and the segment is forgotten. Like upstream, `client` is not checked against the owner.
    pub fn unmount_segment(
        &self,
        segment_id: SegmentId,
        client: ClientId,
    ) -> Result<(), ErrorCode> {
        let _ = client;
        let prepared = {
            let mut segs = self.segments.inner.write();
            let prepared = segs.prepare_unmount(segment_id)?;
            if prepared.is_some() {
                self.emit(|| Mutation::SegmentUnmounted { id: segment_id });
            }
            prepared
        };
        let Some(allocator) = prepared else {
            return Ok(());
        };
        drop(allocator);
        self.clear_invalid_handles();
        self.segments.inner.write().commit_unmount(segment_id);
        self.recompute_quotas();
        Ok(())
    }

    /// GracefulUnmountSegment: the segment leaves placement but stays readable until
    /// `now + grace_period_ms`, when [`MasterService::run_graceful_unmounts_once`] unmounts it.
    pub fn graceful_unmount_segment(
        &self,
        segment_id: SegmentId,
        client: ClientId,
        grace_period_ms: u64,
    ) -> Result<(), ErrorCode> {
        let deadline_ms = self.clock.now_ms().saturating_add(grace_period_ms);
        let mut segs = self.segments.inner.write();
        if segs.start_graceful_unmount(segment_id, client, deadline_ms)? {
            self.emit(|| Mutation::GracefulUnmount {
                id: segment_id,
                client,
                deadline_ms,
            });
        }
        Ok(())
    }

    /// Drain-job status changes (OK ⇄ DRAINING → DRAINED). Leaving OK stops new allocations.
    pub fn set_segment_status(
        &self,
        segment_id: SegmentId,
        status: SegmentStatus,
    ) -> Result<(), ErrorCode> {
        let mut segs = self.segments.inner.write();
        if segs.set_status(segment_id, status)? {
            self.emit(|| Mutation::SegmentStatus {
                id: segment_id,
                status,
            });
        }
        Ok(())
    }

    /// Unmounts the gracefully-unmounting segments whose deadline has passed. Returns how many.
    pub fn run_graceful_unmounts_once(&self) -> usize {
        let now = self.clock.now_ms();
        let due: Vec<_> = {
            let mut segs = self.segments.inner.write();
            let (due, keep) = segs.graceful.drain(..).partition(|g| g.deadline_ms <= now);
            segs.graceful = keep;
            due
        };
        let mut done = 0;
        for g in due {
            if self.unmount_segment(g.segment_id, g.client).is_ok() {
                done += 1;
            }
        }
        done
    }

    /// QuerySegmentStatus(name): the status of the (first) segment mounted under `name`.
    pub fn query_segment_status(&self, name: &str) -> Result<SegmentStatus, ErrorCode> {
        let segs = self.segments.inner.read();
        let id = segs
            .by_name
            .get(name)
            .and_then(|ids| ids.first())
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        segs.mounted
            .get(id)
            .map(|s| s.status)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)
    }

    /// QuerySegmentStatusById.
    pub fn query_segment_status_by_id(&self, id: SegmentId) -> Result<SegmentStatus, ErrorCode> {
        let segs = self.segments.inner.read();
        segs.mounted
            .get(&id)
            .map(|s| s.status)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)
    }

    /// Every mounted segment with its accounting, sorted by id.
    pub fn segment_usage(&self) -> Vec<SegmentUsage> {
        let segs = self.segments.inner.read();
        let mut out: Vec<_> = segs.mounted.values().map(Segments::usage).collect();
        out.sort_by_key(|u| u.id);
        out
    }

    /// The free ranges `(offset, len)` of a mounted segment's allocator, in offset order (`None`
    /// if the segment is unknown or unmounting). For checks and tests.
    pub fn segment_free_ranges(&self, id: SegmentId) -> Option<Vec<(u64, u64)>> {
        self.segments
            .inner
            .read()
            .allocator_of(id)
            .map(|a| a.free_ranges())
    }

    /// Sum of mounted segment sizes.
    pub fn total_capacity_bytes(&self) -> u64 {
        self.segments.inner.read().total_capacity_bytes
    }

    /// ClearInvalidHandles: walks every shard, erasing COMPLETE replicas whose segment is gone and
    /// every object left without a valid replica, then drops discarded buffers of dead segments.
    /// Returns the number of objects erased. The erasures are observed (already implied by the
    /// `SegmentUnmounted` observed first); the dropped replicas and buffers are not (they are not
    /// in any record).
    pub(crate) fn clear_invalid_handles(&self) -> usize {
        self.sweep_dead(&[])
    }

    /// [`MasterService::clear_invalid_handles`] that also reaps, in the same pass, the writes
    /// left in flight by `dead_writers` (clients the monitor expired): their PROCESSING replicas
    /// are taken out and freed at once, after the object's change (its record, or `Erase` when
    /// nothing valid is left) is observed.
    pub(crate) fn sweep_dead(&self, dead_writers: &[ClientId]) -> usize {
        let mut erased = 0;
        for i in 0..SHARD_COUNT {
            let mut shard = self.index.shard_at(i).write();
            for (tenant, state) in shard.tenants_mut() {
                let mut ahead = state.ahead();
                state.objects.retain(|entry| {
                    ahead.step();
                    entry.meta.drop_dead_complete_replicas();
                    let reaped = entry.meta.reap_write_of(dead_writers);
                    let disk_gone = entry.meta.drop_local_disk_of(dead_writers);
                    let keep = entry.meta.is_valid();
                    if !keep {
                        erased += 1;
                        self.emit_erase(tenant, &entry.key);
                    } else if !reaped.is_empty() || disk_gone {
                        self.emit_entry(tenant, entry);
                    }
                    // Emit before free: the reaped buffers go back to their allocators here.
                    drop(reaped);
                    keep
                });
            }
            shard.others.retain(|_, s| s.len() > 0);
        }
        self.discarded.lock().drop_dead();
        erased
    }
}
