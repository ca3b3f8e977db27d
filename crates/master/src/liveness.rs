//! Client liveness RPCs (as upstream's master): Ping and the monitor step that unmounts the segments
//! of clients that stopped pinging, over the [`crate::clients::ClientMonitor`].
//!
//! [`MasterService::run_client_monitor_once`] drains the ping queue into `deadline = now +
//! client_live_ttl`, and for every client whose deadline has passed: forgets its graceful
//! unmounts, OK status and host; *prepares* the unmount of each of its segments (their allocators
//! die, so every replica on them is unreadable at once; each is observed as `SegmentUnmounted`);
//! sweeps every shard once (erasing dead COMPLETE replicas and the objects left without a valid
//! replica, with their quota, and reaping the puts and upserts the expired clients left in flight:
//! their PROCESSING replicas are freed at once and the key is free for another writer); then
//! *commits* the unmounts. The segment lock is never held during the sweep.

use mooncake_common::{ClientId, ClientStatus, ErrorCode, PingResponse};

use crate::handle::MasterService;
use crate::mutation::Mutation;

impl MasterService {
    /// Ping: OK if a ReMount made the client OK, else NEED_REMOUNT (including the first ping);
    /// queues a TTL refresh. A full ping queue → INTERNAL_ERROR.
    pub fn ping(&self, client: ClientId) -> Result<PingResponse, ErrorCode> {
        if !self.clients.push(client) {
            return Err(ErrorCode::INTERNAL_ERROR);
        }
        self.owner_alive(client);
        let client_status = if self.is_client_ok(client) {
            ClientStatus::OK
        } else {
            ClientStatus::NEED_REMOUNT
        };
        Ok(PingResponse {
            view_version_id: 0,
            client_status,
        })
    }

    /// Whether ReMount has made this client OK.
    pub fn is_client_ok(&self, client: ClientId) -> bool {
        self.segments.inner.read().ok_clients.contains(&client)
    }

    /// Tracks a client that starts a put or upsert as its first heartbeat would (see
    /// [`crate::clients::ClientMonitor::track`]).
    pub(crate) fn track_writer(&self, client: ClientId) {
        let ttl_ms = self.config.client_live_ttl_sec.saturating_mul(1000);
        self.clients.track(client, self.clock.now_ms(), ttl_ms);
    }

    /// Number of clients the monitor currently tracks (with a deadline).
    pub fn tracked_client_count(&self) -> usize {
        self.clients.tracked()
    }

    /// One monitor tick: the restore deadlines first ([`MasterService::run_restore_deadlines_once`]),
    /// then refresh deadlines from the ping queue and unmount every expired client's segments
    /// (prepare → sweep all shards → commit). Returns how many clients expired.
    pub fn run_client_monitor_once(&self) -> usize {
        self.run_restore_deadlines_once();
        let now = self.clock.now_ms();
        let ttl_ms = self.config.client_live_ttl_sec.saturating_mul(1000);
        let expired = self.clients.expire(now, ttl_ms);
        if expired.is_empty() {
            return 0;
        }
        let mut allocators = Vec::new();
        let mut prepared = Vec::new();
        {
            let mut segs = self.segments.inner.write();
            for c in &expired {
                segs.graceful.retain(|g| g.client != *c);
                segs.ok_clients.remove(c);
                segs.client_host.remove(c);
                let ids = segs.client_segments.get(c).cloned().unwrap_or_default();
                for id in ids {
                    if let Ok(Some(a)) = segs.prepare_unmount(id) {
                        self.emit(|| Mutation::SegmentUnmounted { id });
                        allocators.push(a);
                        prepared.push(id);
                    }
                }
            }
        }
        // Every handle into those segments dies here: their replicas are unreadable from now on.
        drop(allocators);
        self.unmount_disks_of(&expired);
        // One pass: the replicas on those segments, and the writes the expired clients left in
        // flight (their keys are free for another writer at once, their space freed).
        self.sweep_dead(&expired);
        if !prepared.is_empty() {
            let mut segs = self.segments.inner.write();
            for id in prepared {
                segs.commit_unmount(id);
            }
        }
        self.recompute_quotas();
        expired.len()
    }
}
