//! Restored replicas waiting for their node's confirmation, by segment (plain data; the steps are
//! `restore.rs`). A restored replica is readable only once the node owning its segment computed
//! the checksum of its range and it matched the object's (docs/master.md, "Restore").
//!
//! The entries point at objects by `(tenant, key, replica id)`: an entry whose object or replica
//! changed meanwhile (removed, rewritten, evicted) is stale and harmless, because a confirmation
//! acts only on a replica that still carries the unverified flag.

use std::collections::{BTreeMap, HashMap};

use mooncake_common::{ReplicaId, SegmentId, TenantId};

/// One restored replica awaiting verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingReplica {
    pub tenant: Option<TenantId>,
    pub key: Box<str>,
    pub offset: u64,
    pub len: u64,
    /// The object's checksum; `None` only when restoring without required verification (a
    /// FINAL snapshot), where such a replica is accepted as soon as its owner re-mounts.
    pub checksum: Option<u64>,
}

/// The pending replicas of one restored segment.
#[derive(Debug, Default)]
pub(crate) struct PendingSegment {
    /// Set when the owner re-mounts: what is still pending then is dropped.
    pub verify_deadline_ms: Option<u64>,
    pub replicas: BTreeMap<ReplicaId, PendingReplica>,
}

/// Counters of the verification since the restore (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerificationStats {
    /// Replicas whose node confirmed their checksum.
    pub verified: u64,
    /// Replicas accepted without a checksum at re-mount (FINAL snapshot only).
    pub accepted_without_checksum: u64,
    /// Replicas dropped because their bytes did not match.
    pub mismatched: u64,
    /// Replicas dropped because their node did not confirm them before the deadline.
    pub timed_out: u64,
    /// Restored segments dropped because their owner did not re-mount in time.
    pub segments_expired: u64,
    /// Replicas still waiting (on segments waiting for their owner or being verified).
    pub pending: u64,
}

/// Every pending verification.
#[derive(Debug, Default)]
pub(crate) struct Unverified {
    pub segments: HashMap<SegmentId, PendingSegment>,
    /// How long a re-mounted segment's node has to confirm its replicas.
    pub verify_timeout_ms: u64,
    pub stats: VerificationStats,
}

impl Unverified {
    pub fn pending(&self) -> u64 {
        self.segments
            .values()
            .map(|s| s.replicas.len() as u64)
            .sum()
    }

    /// Takes the entries `ids` names out of `segment` (unknown ids are skipped).
    pub fn take(
        &mut self,
        segment: SegmentId,
        ids: &[ReplicaId],
    ) -> Vec<(ReplicaId, PendingReplica)> {
        let Some(seg) = self.segments.get_mut(&segment) else {
            return Vec::new();
        };
        ids.iter()
            .filter_map(|id| seg.replicas.remove(id).map(|p| (*id, p)))
            .collect()
    }
}
