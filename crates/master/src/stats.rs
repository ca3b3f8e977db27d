//! What the server's `/metrics` needs from the core beyond its answers: the event counters
//! (`crate::counters`) and a census of the objects it holds.

use mooncake_common::{ReplicaStatus, ReplicaType};

use crate::counters::MasterCounters;
use crate::handle::MasterService;
use crate::index::SHARD_COUNT;

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
