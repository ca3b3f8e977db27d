//! Promotion on hit (`--promotion_on_hit`, upstream's admission): a read that finds an object on
//! local disks only bumps its count in a count-min sketch; at `promotion_admission_threshold`
//! (2) the master, if memory is under the eviction watermark and fewer than
//! `promotion_queue_limit` promotions are in flight, allocates a PROCESSING memory replica on a
//! segment of the node that holds the disk copy and queues a promotion task for that node. The
//! node loads the object from its disk straight into that memory and answers: success makes the
//! replica COMPLETE (the object is in memory again), failure erases it. Every task ends in one
//! answer, or in its node's death (the replica is on its own segment).
//!
//! The sketch: 4 rows of 4096 one-byte saturating counters; all counters are halved every
//! 40 960 bumps, so old hits fade.

use std::sync::atomic::Ordering;

use mooncake_common::{
    ClientId, ErrorCode, GetReplicaListResponse, OffloadOutcome, OffloadTask, ReplicaKind,
    ReplicaStatus,
};

use crate::handle::MasterService;
use crate::index::{key_hash, Tenant};
use crate::object::{ObjectMetadata, Place, Replica, ReplicaData};
use crate::offload::tenant_name;

const ROWS: usize = 4;
const WIDTH: usize = 4096;
const HALVE_EVERY: u32 = 10 * WIDTH as u32;

/// A count-min sketch of disk hits.
#[derive(Debug)]
pub(crate) struct HitSketch {
    rows: Box<[[u8; WIDTH]; ROWS]>,
    bumps: u32,
}

impl Default for HitSketch {
    fn default() -> Self {
        HitSketch {
            rows: Box::new([[0; WIDTH]; ROWS]),
            bumps: 0,
        }
    }
}

impl HitSketch {
    /// Counts one hit of `hash`; returns its estimated count.
    pub fn bump(&mut self, hash: u64) -> u8 {
        let mut min = u8::MAX;
        for (r, row) in self.rows.iter_mut().enumerate() {
            let mixed = (hash ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let slot = &mut row[(mixed >> 52) as usize % WIDTH];
            *slot = slot.saturating_add(1);
            min = min.min(*slot);
        }
        self.bumps += 1;
        if self.bumps >= HALVE_EVERY {
            self.bumps = 0;
            for row in self.rows.iter_mut() {
                for c in row.iter_mut() {
                    *c /= 2;
                }
            }
        }
        min
    }
}

impl MasterService {
    /// Called after a read of `key` answered `reply`: a disk-only object counts a hit, and is
    /// promoted once admitted (see the module doc). No-op without `promotion_on_hit`.
    pub fn note_read(
        &self,
        key: &str,
        tenant: &str,
        reply: &Result<GetReplicaListResponse, ErrorCode>,
    ) {
        if !self.config.promotion_on_hit {
            return;
        }
        let Ok(response) = reply else { return };
        let disk_only = !response.replicas.is_empty()
            && response
                .replicas
                .iter()
                .all(|r| matches!(r.kind, ReplicaKind::LocalDisk(_)));
        if !disk_only {
            return;
        }
        let Ok(tenant) = self.resolve_tenant(tenant) else {
            return;
        };
        let count = self.hit_sketch.lock().bump(key_hash(tenant, key));
        if u32::from(count) < self.config.promotion_admission_threshold.max(1) {
            return;
        }
        if self.memory_usage_ratio() >= self.config.eviction_high_watermark_ratio {
            return;
        }
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        self.edit_entry(&mut shard, tenant, hash, key, |m, edit| {
            if self.try_start_promotion(tenant, key, m) {
                edit.changed();
            }
        });
    }

    fn memory_usage_ratio(&self) -> f64 {
        let (used, cap) = self.memory_usage_bytes();
        if cap == 0 {
            1.0
        } else {
            used as f64 / cap as f64
        }
    }

    /// Allocates a PROCESSING memory replica on a segment of the disk copy's node and queues
    /// the promotion there. False when the object is not disk-only and idle, a promotion of it is
    /// in flight, too many are, or no segment of the node has room.
    fn try_start_promotion(&self, tenant: Tenant<'_>, key: &str, m: &mut ObjectMetadata) -> bool {
        if m.is_processing()
            || m.has_task()
            || m.replicas
                .iter()
                .any(|r| !matches!(r.data.place(), Place::LocalDisk(_)))
        {
            return false;
        }
        let Some(owner) = m.replicas.iter().find_map(|r| match r.data.place() {
            Place::LocalDisk(d) => Some(d.client_id),
            _ => None,
        }) else {
            return false;
        };
        let limit = self.config.promotion_queue_limit as usize;
        let task_key = (tenant_name(tenant), key.to_string());
        {
            let state = self.offload.lock();
            let in_flight: usize = state.mounts_promotions();
            match state.mount_of(owner) {
                Some(p) if !p.contains_key(&task_key) && in_flight < limit => {}
                _ => return false,
            }
        }
        let Ok(account) = self.tenant_account(tenant) else {
            return false;
        };
        let charge = account.as_ref().filter(|_| m.account().is_some());
        if let Some(acc) = charge {
            if acc.try_charge(m.size).is_err() {
                return false;
            }
        }
        let handle = {
            let segs = self.segments.inner.read();
            let names: Vec<std::sync::Arc<str>> = segs
                .mounted
                .values()
                .filter(|s| s.client == owner)
                .map(|s| std::sync::Arc::from(s.segment.name.as_str()))
                .collect();
            names
                .iter()
                .find_map(|n| segs.allocatable.allocate_from(n, m.size, &self.rng).ok())
        };
        let Some(handle) = handle else {
            if let Some(acc) = charge {
                acc.refund(m.size);
            }
            return false;
        };
        let Some(info) = handle.allocator().map(|a| a.info().clone()) else {
            return false;
        };
        let replica = Replica {
            id: self.next_replica_id(),
            status: ReplicaStatus::PROCESSING,
            refcnt: 0,
            unverified: false,
            data: ReplicaData::Memory(handle),
        };
        let task = OffloadTask {
            tenant: task_key.0.clone(),
            key: task_key.1.clone(),
            size: m.size,
            buffer_address: info.base + replica.handle().map_or(0, |h| h.offset()),
        };
        let id = replica.id;
        m.replicas.push(replica);
        self.offload
            .lock()
            .queue_promotion(owner, task_key, id, task);
        self.offload_counters
            .promotions
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Up to `max` promotion tasks of `client` (pending until answered).
    pub fn promotion_heartbeat(
        &self,
        client: ClientId,
        max: usize,
    ) -> Result<Vec<OffloadTask>, ErrorCode> {
        self.offload.lock().take_promotions(client, max)
    }

    /// The node's answers to its promotion tasks, one result per outcome (INVALID_PARAMS for a
    /// task that is not pending).
    pub fn notify_promotion(
        &self,
        client: ClientId,
        outcomes: &[OffloadOutcome],
    ) -> Vec<Result<(), ErrorCode>> {
        outcomes
            .iter()
            .map(|o| self.finish_promotion(client, o))
            .collect()
    }

    fn finish_promotion(&self, client: ClientId, o: &OffloadOutcome) -> Result<(), ErrorCode> {
        let target = self
            .offload
            .lock()
            .finish_promotion(client, &(o.tenant.clone(), o.key.clone()))
            .ok_or(ErrorCode::INVALID_PARAMS)?;
        let counter = if o.stored {
            &self.offload_counters.promoted
        } else {
            &self.offload_counters.promotion_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let tenant = self.resolve_tenant(&o.tenant)?;
        let hash = self.route(tenant, &o.key);
        let mut shard = self.index.shard(hash).write();
        let now = self.clock.now_ms();
        self.edit_entry(&mut shard, tenant, hash, &o.key, |m, edit| {
            edit.changed();
            if o.stored {
                if let Some(r) = m.replicas.iter_mut().find(|r| r.id == target) {
                    r.status = ReplicaStatus::COMPLETE;
                }
                m.touch(now);
            } else {
                edit.free(m.extract_replicas(|r| r.id == target));
            }
        })
        .ok_or(ErrorCode::OBJECT_NOT_FOUND)
    }
}
