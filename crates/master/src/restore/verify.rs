//! Verification of restored replicas and the restore deadlines: the node owning a re-mounted
//! segment reads its unverified replicas page by page and confirms or refutes each; replicas not
//! confirmed in time, and segments whose owner did not come back, are dropped.

use std::sync::atomic::Ordering;

use mooncake_common::{ClientId, ErrorCode, ReplicaId, SegmentId};

use super::{
    ConfirmOutcome, RestoreDeadlineReport, UnverifiedReplica, MAX_CONFIRM_IDS, MAX_UNVERIFIED_PAGE,
    MAX_UNVERIFIED_PAGE_BYTES,
};
use crate::allocator::BufferHandle;
use crate::handle::MasterService;
use crate::index::Tenant;
use crate::mutation::Mutation;
use crate::unverified::{Taken, VerificationStats};

impl MasterService {
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
