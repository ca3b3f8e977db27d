//! The put path's clean-up: the discarded list (buffers of pre-empted or timed-out puts, kept
//! allocated until their release time so that a late write from the old writer cannot land in
//! reused memory) and the put-timeout reaper (as upstream's master).

use mooncake_common::ReplicaStatus;

use crate::deferred::DiscardedBuffers;
use crate::handle::MasterService;
use crate::index::SHARD_COUNT;
use crate::mutation::{BufferRecord, DiscardedRecord, Mutation};
use crate::object::{Removed, Replica, FLAG_PROCESSING};

/// What one [`MasterService::run_put_timeouts_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutTimeoutReport {
    /// Puts older than the release timeout whose PROCESSING replicas were discarded.
    pub reaped_puts: usize,
    /// Objects erased because nothing valid was left.
    pub erased_objects: usize,
    /// Discarded replicas whose buffers were freed.
    pub released_replicas: usize,
    /// Copy/move tasks older than the release timeout that were revoked.
    pub reaped_tasks: usize,
    /// Group routes of erased keys that were collected.
    pub dropped_routes: usize,
}

impl MasterService {
    /// Moves replicas to the discarded list, to be freed at `release_at_ms`. Observed under the
    /// list's lock (after the change of the object they came from, which the caller emitted).
    pub(crate) fn discard(&self, replicas: Removed, release_at_ms: u64) {
        let buffers: Vec<_> = replicas
            .into_iter()
            .filter_map(Replica::into_buffer)
            .collect();
        if buffers.is_empty() {
            return;
        }
        self.counters.count_discard();
        let mut list = self.discarded.lock();
        // The segment lock is held until the record is observed, not only while it is built: an
        // unmount observed in between would otherwise precede a record of buffers on its segment.
        let segs = self.segments.inner.read();
        self.emit(|| {
            Mutation::Discarded(DiscardedRecord {
                release_at_ms,
                buffers: buffers
                    .iter()
                    .filter_map(|h| {
                        segs.live_segment_of(h).map(|segment| BufferRecord {
                            segment,
                            offset: h.offset(),
                            len: h.len(),
                        })
                    })
                    .collect(),
            })
        });
        drop(segs);
        list.entries.push(DiscardedBuffers {
            release_at_ms,
            buffers,
        });
    }

    /// Frees the discarded buffers whose `release_at` has come. Returns how many.
    pub fn release_discarded_once(&self) -> usize {
        let now = self.clock.now_ms();
        let due: Vec<DiscardedBuffers> = {
            let mut list = self.discarded.lock();
            let due = list.take_due(now);
            if !due.is_empty() {
                // Observed before the buffers are freed (below, after the lock).
                self.emit(|| Mutation::DiscardedReleased { up_to_ms: now });
            }
            due
        };
        self.counters.count_releases(due.len());
        due.iter().map(|d| d.buffers.len()).sum()
    }

    /// Number of discarded buffers waiting for their release time.
    pub fn discarded_replica_count(&self) -> usize {
        self.discarded.lock().buffer_count()
    }

    /// The put-timeout reaper: every put whose `put_start + release_timeout` has passed loses its
    /// PROCESSING replicas to the discarded list (freed at once, their time having come) and
    /// leaves processing; objects left with nothing valid are erased; copy/move tasks as old are
    /// revoked. Then frees due discarded buffers and collects stale group routes.
    pub fn run_put_timeouts_once(&self) -> PutTimeoutReport {
        let now = self.clock.now_ms();
        let release_ms = self.config.release_timeout_ms();
        let mut report = PutTimeoutReport::default();
        for i in 0..SHARD_COUNT {
            let mut shard = self.index.shard_at(i).write();
            for (tenant, state) in shard.tenants_mut() {
                state.objects.retain(|entry| {
                    let meta = &mut entry.meta;
                    meta.drop_dead_replicas();
                    let mut changed = false;
                    let mut freed = Removed::new();
                    if meta
                        .task()
                        .is_some_and(|t| t.start_ms.saturating_add(release_ms) <= now)
                    {
                        // A copy/move abandoned for the release timeout: targets go, the
                        // source is unpinned.
                        freed = Self::drop_task(meta, false);
                        changed = true;
                        report.reaped_tasks += 1;
                    }
                    let mut stale = Removed::new();
                    let release_at = meta.put_start_ms().saturating_add(release_ms);
                    if meta.is_processing() && release_at <= now {
                        stale = meta.extract_replicas(|r| r.status == ReplicaStatus::PROCESSING);
                        meta.set(FLAG_PROCESSING, false);
                        changed = true;
                        report.reaped_puts += 1;
                    }
                    let keep = meta.is_valid();
                    report.erased_objects += usize::from(!keep);
                    if changed || !keep {
                        self.emit_swept(tenant, entry, keep);
                    }
                    self.discard(stale, release_at);
                    drop(freed);
                    keep
                });
            }
            shard.others.retain(|_, s| s.len() > 0);
        }
        report.released_replicas = self.release_discarded_once();
        report.dropped_routes = self.run_route_gc_once();
        report
    }
}
