//! Suspected segments: a client that failed to write a replica reports the segment's endpoint
//! (`ReportTransferFailure`), and the master stops placing new replicas on every segment served
//! there at once, instead of for the `client_live_ttl` it takes to notice a dead node.
//!
//! Invariants:
//! - A suspected segment is out of `allocatable` and in `suspected`; nothing else changes: its
//!   replicas stay readable (readers still try it), its status stays what it was.
//! - Only a segment that was placeable (OK, allocator alive, not waiting for its owner) becomes
//!   suspected; while suspected, nothing puts it back into placement (`set_status` and `adopt`
//!   check the set).
//! - The suspicion clears when the owner shows it is alive: its Ping, MountSegment or
//!   ReMountSegment. An unmount forgets it (the normal sweep of a dead node).
//!
//! A report proves nothing (any client may send one, and a network blip looks like a death),
//! which is why the owner's next ping (every second) undoes it. Not durable state: no mutation
//! is observed, a snapshot or a standby never sees it.

use mooncake_common::{ClientId, ErrorCode, SegmentId, SegmentStatus};

use crate::handle::MasterService;
use crate::segments::Segments;

impl Segments {
    /// Suspects every placeable segment whose transfer endpoint is `endpoint`; returns how
    /// many became suspected now.
    pub(crate) fn suspect_endpoint(&mut self, endpoint: &str) -> u64 {
        let mut newly = 0;
        for (id, seg) in &self.mounted {
            let placeable = seg.status == SegmentStatus::OK && seg.waiting_until_ms.is_none();
            if seg.segment.te_endpoint != endpoint || !placeable || self.suspected.contains(id) {
                continue;
            }
            let Some(allocator) = &seg.allocator else {
                continue;
            };
            self.allocatable.remove(allocator, &seg.host_id);
            self.suspected.insert(*id);
            newly += 1;
        }
        newly
    }

    /// Clears the suspicion of `client`'s segments: each goes back into placement.
    pub(crate) fn clear_suspicion(&mut self, client: ClientId) {
        let Some(ids) = self.client_segments.get(&client) else {
            return;
        };
        let cleared: Vec<SegmentId> = ids
            .iter()
            .filter(|id| self.suspected.contains(id))
            .copied()
            .collect();
        for id in cleared {
            self.suspected.remove(&id);
            let Some(seg) = self.mounted.get(&id) else {
                continue;
            };
            // Only a suspected segment that is still placeable returns (see the invariants).
            if seg.status == SegmentStatus::OK && seg.waiting_until_ms.is_none() {
                if let Some(allocator) = &seg.allocator {
                    self.allocatable.insert(allocator.clone(), &seg.host_id);
                }
            }
        }
    }
}

impl MasterService {
    /// ReportTransferFailure: `client` failed to move bytes to or from a segment served at
    /// `endpoint`. Every placeable segment there leaves placement until its owner pings again.
    /// Returns how many segments became suspected now (0: unknown endpoint, or already
    /// suspected). An empty endpoint is INVALID_PARAMS.
    pub fn report_transfer_failure(
        &self,
        client: ClientId,
        endpoint: &str,
    ) -> Result<u64, ErrorCode> {
        if endpoint.is_empty() {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let _ = client; // who reported is not checked: see the module doc
        Ok(self.segments.inner.write().suspect_endpoint(endpoint))
    }

    /// The owner `client` showed it is alive: its suspected segments return to placement.
    pub(crate) fn owner_alive(&self, client: ClientId) {
        if self.segments.inner.read().suspected.is_empty() {
            return;
        }
        self.segments.inner.write().clear_suspicion(client);
    }

    /// Ids of the suspected segments (tests and the audit).
    pub fn suspected_segments(&self) -> Vec<SegmentId> {
        let mut ids: Vec<SegmentId> = self
            .segments
            .inner
            .read()
            .suspected
            .iter()
            .copied()
            .collect();
        ids.sort();
        ids
    }
}
