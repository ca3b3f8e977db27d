//! Restored replicas waiting for their node's confirmation, by segment (plain data; the steps are
//! `restore.rs`). A restored replica is readable only once the node owning its segment computed
//! the checksum of its range and it matched the object's (docs/master.md, "Restore").
//!
//! Built once by restore and only shrinking afterwards, so each segment's entries are a vector
//! sorted by replica id (a page is a binary search and a forward walk; a verdict a binary search),
//! and the objects' keys are kept once in a shared table. An entry whose object or replica
//! changed meanwhile (removed, rewritten, evicted) is stale and harmless, because a verdict acts
//! only on a replica that still carries the unverified flag.

use std::collections::HashMap;

use mooncake_common::{ReplicaId, SegmentId, TenantId};

/// One restored replica awaiting verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingReplica {
    pub id: ReplicaId,
    /// Its object's `(tenant, key)` in [`Unverified::keys`].
    pub object: usize,
    pub offset: u64,
    pub len: u64,
    /// The object's checksum; `None` only when restoring without required verification (a
    /// FINAL snapshot), where such a replica is accepted as soon as its owner re-mounts.
    pub checksum: Option<u64>,
    /// A verdict (or a deadline) took it.
    pub settled: bool,
}

/// The pending replicas of one restored segment.
#[derive(Debug, Default)]
pub(crate) struct PendingSegment {
    /// Set when the owner re-mounts: what is still pending then is dropped.
    pub verify_deadline_ms: Option<u64>,
    /// Sorted by id.
    pub replicas: Vec<PendingReplica>,
    /// Entries not settled yet.
    pub open: usize,
}

/// A replica taken out for a verdict: its id and its object's tenant and key.
pub(crate) type Taken = (ReplicaId, Option<TenantId>, Box<str>);

impl PendingSegment {
    /// Builds a segment's list from entries in any order.
    pub fn new(mut replicas: Vec<PendingReplica>) -> Self {
        replicas.sort_unstable_by_key(|p| p.id);
        replicas.dedup_by_key(|p| p.id);
        PendingSegment {
            verify_deadline_ms: None,
            open: replicas.len(),
            replicas,
        }
    }

    /// The open entries with an id above `after`, in id order.
    pub fn open_after(&self, after: ReplicaId) -> impl Iterator<Item = &PendingReplica> {
        let start = self.replicas.partition_point(|p| p.id <= after);
        self.replicas[start..].iter().filter(|p| !p.settled)
    }

    /// Settles the open entries `select` accepts, returning their positions.
    fn settle_where(&mut self, mut select: impl FnMut(&PendingReplica) -> bool) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, p) in self.replicas.iter_mut().enumerate() {
            if !p.settled && select(p) {
                p.settled = true;
                out.push(i);
            }
        }
        self.open -= out.len();
        out
    }
}

/// Every pending verification.
#[derive(Debug, Default)]
pub(crate) struct Unverified {
    /// `(tenant, key)` of the restored objects with unverified replicas.
    pub keys: Vec<(Option<TenantId>, Box<str>)>,
    pub segments: HashMap<SegmentId, PendingSegment>,
    /// How long a re-mounted segment's node has to confirm its replicas.
    pub verify_timeout_ms: u64,
    pub stats: VerificationStats,
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

impl Unverified {
    pub fn pending(&self) -> u64 {
        self.segments.values().map(|s| s.open as u64).sum()
    }

    fn taken(&self, seg: &PendingSegment, positions: Vec<usize>) -> Vec<Taken> {
        positions
            .into_iter()
            .filter_map(|i| {
                let p = &seg.replicas[i];
                let (tenant, key) = self.keys.get(p.object)?;
                Some((p.id, tenant.clone(), key.clone()))
            })
            .collect()
    }

    /// Settles the open entries of `segment` that `select` accepts and returns them.
    pub fn take_where(
        &mut self,
        segment: SegmentId,
        select: impl FnMut(&PendingReplica) -> bool,
    ) -> Vec<Taken> {
        let Some(mut seg) = self.segments.remove(&segment) else {
            return Vec::new();
        };
        let positions = seg.settle_where(select);
        let out = self.taken(&seg, positions);
        self.segments.insert(segment, seg);
        out
    }

    /// Settles the open entries of `segment` named by `ids` (unknown or settled ids skipped).
    pub fn take(&mut self, segment: SegmentId, ids: &[ReplicaId]) -> Vec<Taken> {
        let mut wanted: Vec<ReplicaId> = ids.to_vec();
        wanted.sort_unstable();
        self.take_where(segment, |p| wanted.binary_search(&p.id).is_ok())
    }

    /// Forgets segments with nothing open whose deadline has started (or that `keep` refuses),
    /// and the key table once no segment is left.
    pub fn prune(&mut self, mut keep: impl FnMut(SegmentId) -> bool) {
        self.segments
            .retain(|id, s| keep(*id) && (s.open > 0 || s.verify_deadline_ms.is_none()));
        if self.segments.is_empty() {
            self.keys = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(id: u64, checksum: Option<u64>) -> PendingReplica {
        PendingReplica {
            id: ReplicaId(id),
            object: 0,
            offset: id * 10,
            len: 10,
            checksum,
            settled: false,
        }
    }

    #[test]
    fn entries_page_in_id_order_and_settle_once() {
        let mut u = Unverified {
            keys: vec![(None, Box::from("k"))],
            ..Default::default()
        };
        let s = SegmentId::new(1, 0);
        u.segments.insert(
            s,
            PendingSegment::new(vec![entry(7, Some(1)), entry(3, Some(1)), entry(5, None)]),
        );
        let ids = |u: &Unverified, after| -> Vec<u64> {
            u.segments[&s]
                .open_after(ReplicaId(after))
                .map(|p| p.id.0)
                .collect()
        };
        assert_eq!(ids(&u, 0), vec![3, 5, 7]);
        assert_eq!(ids(&u, 3), vec![5, 7]);
        let taken = u.take(s, &[ReplicaId(7), ReplicaId(9), ReplicaId(7)]);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, ReplicaId(7));
        assert!(u.take(s, &[ReplicaId(7)]).is_empty());
        assert_eq!(ids(&u, 0), vec![3, 5]);
        assert_eq!(u.pending(), 2);
        let none = u.take_where(s, |p| p.checksum.is_none());
        assert_eq!(none.len(), 1);
        u.prune(|_| true);
        assert_eq!(u.pending(), 1);
        u.take_where(s, |_| true);
        u.segments.get_mut(&s).unwrap().verify_deadline_ms = Some(1);
        u.prune(|_| true);
        assert!(u.segments.is_empty() && u.keys.is_empty());
    }
}
