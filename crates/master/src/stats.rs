//! What the server's `/metrics` needs from the core beyond its answers: counters of events only
//! the core sees (put discards and releases) and a census of the objects it holds.

use std::sync::atomic::{AtomicU64, Ordering};

use mooncake_common::{ReplicaStatus, ReplicaType};

use crate::handle::MasterService;
use crate::index::SHARD_COUNT;

/// Monotonic event counters kept by the core (upstream's `master_put_start_*_cnt`).
#[derive(Debug, Default)]
pub struct MasterCounters {
    /// Unfinished puts whose buffers were moved to the discarded list (pre-empted by a newer
    /// PutStart or UpsertStart, or reaped by the put timeout).
    put_start_discards: AtomicU64,
    /// Discarded puts whose buffers were freed at their release time.
    put_start_releases: AtomicU64,
}

impl MasterCounters {
    pub(crate) fn count_discard(&self) {
        self.put_start_discards.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_releases(&self, puts: usize) {
        self.put_start_releases
            .fetch_add(puts as u64, Ordering::Relaxed);
    }

    pub fn put_start_discards(&self) -> u64 {
        self.put_start_discards.load(Ordering::Relaxed)
    }

    pub fn put_start_releases(&self) -> u64 {
        self.put_start_releases.load(Ordering::Relaxed)
    }
}

/// The objects the master holds now, counted by [`MasterService::object_census`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCensus {
    /// Objects in the index (as [`MasterService::object_count`]).
    pub objects: usize,
    /// Objects with a soft pin that has not expired.
    pub soft_pinned: usize,
    /// Objects with at least one COMPLETE memory replica (readable from memory).
    pub in_memory: usize,
    /// Bytes of memory replicas in the discarded list, waiting for their release time.
    pub discarded_staging_bytes: u64,
}

impl MasterService {
    /// The core's event counters.
    pub fn counters(&self) -> &MasterCounters {
        &self.counters
    }

    /// Counts the objects shard by shard (each shard's read lock in turn, so the counts are of
    /// slightly different instants under load). Linear in the number of objects: for scrapes,
    /// not for hot paths.
    pub fn object_census(&self) -> ObjectCensus {
        let now = self.clock.now_ms();
        let mut census = ObjectCensus::default();
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            for (_, state) in shard.tenants() {
                for entry in state.objects.iter() {
                    let meta = &entry.meta;
                    census.objects += 1;
                    census.soft_pinned += usize::from(meta.soft_pinned(now));
                    census.in_memory += usize::from(meta.replicas.iter().any(|r| {
                        r.status == ReplicaStatus::COMPLETE
                            && r.replica_type() == ReplicaType::MEMORY
                            && r.is_valid()
                    }));
                }
            }
        }
        census.discarded_staging_bytes = self
            .discarded
            .lock()
            .entries
            .iter()
            .flat_map(|d| d.buffers.iter())
            .filter(|h| h.is_live())
            .map(|h| h.len())
            .sum();
        census
    }
}
