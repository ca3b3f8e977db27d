//! The local disk tier at the master (upstream's `enable_offload`, spec master.md §11): which
//! node holds which object on its own disk (LOCAL_DISK replicas), and the offload tasks that put
//! them there.
//!
//! - A node with a disk calls `mount_local_disk`; the master records its disk endpoint (where
//!   readers ask it for objects), capacity and usage. Without `enable_offload` the call is
//!   refused with UNABLE_OFFLOAD.
//! - **Eager** (default): at PutEnd, one COMPLETE memory replica whose segment belongs to a
//!   node with a mounted disk is pinned (`refcnt += 1`: eviction leaves it alone) and a task
//!   `{tenant, key, size, buffer_address}` goes into that node's mailbox. **On eviction**
//!   (`offload_on_evict`): the task is queued when memory eviction picks the object instead, and
//!   the object keeps its memory replica until a later cycle finds its disk copy.
//! - The node drains its mailbox (`offload_heartbeat`), writes the bytes from its segment to its
//!   disk, and answers each task (`notify_offload`): stored → a COMPLETE LOCAL_DISK replica
//!   owned by the node is added; refused → nothing. Either way the pin is released and the task
//!   is gone: every task ends in exactly one answer (or in its node's death, which takes the
//!   source replica with it). A mailbox holds at most `offloading_queue_limit` tasks; beyond
//!   that objects are simply not queued.
//! - Lock order: a shard lock, then the segment lock, then the offload lock; the offload lock is
//!   never held while taking another.
//! - A LOCAL_DISK replica is never added for a node without a mounted disk; a node that expires
//!   (client_ttl) loses its mount and every LOCAL_DISK replica it owned.
//! - **Removal** of an object with LOCAL_DISK replicas queues a drop of its record for each owner
//!   (`take_disk_drops`, `disk_objects_dropped`) and remembers the key as removed until a node
//!   reports the record deleted or stores a newer value of the key; an advertisement of a
//!   remembered key is refused (the node deletes the record and reports it): a node restarted on
//!   its disk never brings a removed key back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mooncake_common::{
    ClientId, DiskObject, ErrorCode, LocalDiskDescriptor, OffloadOutcome, OffloadTask, ReplicaId,
    ReplicaStatus,
};

use crate::handle::MasterService;
use crate::index::{key_hash, Tenant};
use crate::object::{
    ObjectEntry, ObjectKey, ObjectMetadata, ObjectTimes, Place, Replica, ReplicaData, Replicas,
};
use crate::writers::WriterId;

/// One node's mounted disk.
#[derive(Debug)]
struct DiskMount {
    endpoint: String,
    capacity_bytes: u64,
    used_bytes: u64,
    mailbox: VecDeque<OffloadTask>,
    /// `(tenant, key)` of every task queued or handed out and not answered yet → the pinned
    /// source replica.
    pending: HashMap<(String, String), ReplicaId>,
    /// Promotion tasks not handed out yet, and those not answered yet → the target replica.
    promotions: VecDeque<OffloadTask>,
    promoting: HashMap<(String, String), ReplicaId>,
    /// `(tenant, key)` of removed objects whose record the node must delete, not handed out yet.
    drops: VecDeque<(String, String)>,
}

/// Removed keys remembered at most (the oldest are forgotten first).
const REMOVED_LIMIT: usize = 1 << 20;

/// The disks of every node.
#[derive(Debug, Default)]
pub(crate) struct OffloadState {
    mounts: HashMap<ClientId, DiskMount>,
    /// Keys removed while some node held them on disk, whose record no node has reported gone
    /// yet → the sequence number of the removal (`removed_order` forgets the oldest).
    removed: HashMap<(String, String), u64>,
    removed_order: VecDeque<(u64, (String, String))>,
    removals: u64,
}

impl OffloadState {
    /// Remembers `key` as removed, forgetting the oldest beyond [`REMOVED_LIMIT`].
    fn remember_removed(&mut self, key: (String, String)) {
        self.removals += 1;
        self.removed.insert(key.clone(), self.removals);
        self.removed_order.push_back((self.removals, key));
        while self.removed.len() > REMOVED_LIMIT {
            let Some((seq, old)) = self.removed_order.pop_front() else {
                break;
            };
            if self.removed.get(&old) == Some(&seq) {
                self.removed.remove(&old);
            }
        }
        if self.removed_order.len() > 2 * REMOVED_LIMIT {
            let removed = &self.removed;
            self.removed_order
                .retain(|(seq, k)| removed.get(k) == Some(seq));
        }
    }
}

impl OffloadState {
    /// Promotions in flight on every node.
    pub(crate) fn mounts_promotions(&self) -> usize {
        self.mounts.values().map(|d| d.promoting.len()).sum()
    }

    /// The promotions in flight of `client`'s disk, if mounted.
    pub(crate) fn mount_of(
        &self,
        client: ClientId,
    ) -> Option<&HashMap<(String, String), ReplicaId>> {
        self.mounts.get(&client).map(|d| &d.promoting)
    }

    pub(crate) fn queue_promotion(
        &mut self,
        client: ClientId,
        key: (String, String),
        target: ReplicaId,
        task: OffloadTask,
    ) {
        if let Some(d) = self.mounts.get_mut(&client) {
            d.promoting.insert(key, target);
            d.promotions.push_back(task);
        }
    }

    pub(crate) fn take_promotions(
        &mut self,
        client: ClientId,
        max: usize,
    ) -> Result<Vec<OffloadTask>, ErrorCode> {
        let d = self
            .mounts
            .get_mut(&client)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        let n = max.min(d.promotions.len());
        Ok(d.promotions.drain(..n).collect())
    }

    pub(crate) fn finish_promotion(
        &mut self,
        client: ClientId,
        key: &(String, String),
    ) -> Option<ReplicaId> {
        self.mounts.get_mut(&client)?.promoting.remove(key)
    }
}

/// Offload bookkeeping counters (`/metrics`, and the conservation check: `queued = stored +
/// refused + dropped + in flight`).
#[derive(Debug, Default)]
pub(crate) struct OffloadCounters {
    queued: AtomicU64,
    stored: AtomicU64,
    refused: AtomicU64,
    /// Tasks that died with their node (its mount expired).
    dropped: AtomicU64,
    disk_evicted: AtomicU64,
    advertised: AtomicU64,
    /// Records nodes deleted from their disks because their object was removed.
    disk_dropped: AtomicU64,
    pub(crate) promotions: AtomicU64,
    pub(crate) promoted: AtomicU64,
    pub(crate) promotion_failures: AtomicU64,
}

/// A snapshot of the offload counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    pub queued: u64,
    pub stored: u64,
    pub refused: u64,
    pub dropped: u64,
    /// Tasks queued or handed out and not answered yet (each pins one memory replica).
    pub in_flight: u64,
    /// LOCAL_DISK replicas dropped because their node evicted them from its disk.
    pub disk_evicted: u64,
    /// LOCAL_DISK replicas registered from a node's scan of its disk (restart, re-mount).
    pub advertised: u64,
    /// Records nodes deleted from their disks because their object was removed.
    pub disk_dropped: u64,
    /// Nodes with a mounted disk, and their capacity and usage as last reported.
    pub disks: u64,
    pub disk_capacity_bytes: u64,
    pub disk_used_bytes: u64,
    /// Promotions started (a memory replica allocated for a disk-only object read often),
    /// completed, failed, and in flight.
    pub promotions: u64,
    pub promoted: u64,
    pub promotion_failures: u64,
    pub promotions_in_flight: u64,
}

/// One node's mounted disk: where readers reach it, its capacity and its usage as last reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDiskUsage {
    pub client: ClientId,
    pub endpoint: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

pub(crate) fn tenant_name(tenant: Tenant<'_>) -> String {
    match tenant {
        Tenant::Default => String::new(),
        Tenant::Named(name) => name.to_string(),
    }
}

impl MasterService {
    /// Mounts (or re-mounts) `client`'s disk: readers reach it at `endpoint`.
    /// UNABLE_OFFLOAD when the master runs without `enable_offload`.
    pub fn mount_local_disk(
        &self,
        client: ClientId,
        endpoint: &str,
        capacity_bytes: u64,
        used_bytes: u64,
    ) -> Result<(), ErrorCode> {
        if !self.config.enable_offload {
            return Err(ErrorCode::UNABLE_OFFLOAD);
        }
        if endpoint.is_empty() || capacity_bytes == 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let mut state = self.offload.lock();
        let mount = state.mounts.entry(client).or_insert_with(|| DiskMount {
            endpoint: String::new(),
            capacity_bytes: 0,
            used_bytes: 0,
            mailbox: VecDeque::new(),
            pending: HashMap::new(),
            promotions: VecDeque::new(),
            promoting: HashMap::new(),
            drops: VecDeque::new(),
        });
        mount.endpoint = endpoint.to_string();
        mount.capacity_bytes = capacity_bytes;
        mount.used_bytes = used_bytes;
        Ok(())
    }

    /// Up to `max` queued tasks of `client` (they stay pending until answered), and the node's
    /// disk usage as it reports it. SEGMENT_NOT_FOUND when its disk is not mounted (a master that
    /// restarted or expired it: the node mounts again).
    pub fn offload_heartbeat(
        &self,
        client: ClientId,
        max: usize,
        used_bytes: u64,
    ) -> Result<Vec<OffloadTask>, ErrorCode> {
        let mut state = self.offload.lock();
        let mount = state
            .mounts
            .get_mut(&client)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        mount.used_bytes = used_bytes;
        let n = max.min(mount.mailbox.len());
        Ok(mount.mailbox.drain(..n).collect())
    }

    /// Answers of `client` to its tasks, one result per outcome: INVALID_PARAMS for a task that
    /// is not pending (answered twice, or never given); OBJECT_NOT_FOUND when the object is gone
    /// (the pin went with it).
    pub fn notify_offload(
        &self,
        client: ClientId,
        outcomes: &[OffloadOutcome],
    ) -> Vec<Result<(), ErrorCode>> {
        outcomes
            .iter()
            .map(|o| self.finish_offload(client, o))
            .collect()
    }

    fn finish_offload(&self, client: ClientId, o: &OffloadOutcome) -> Result<(), ErrorCode> {
        let source = {
            let mut state = self.offload.lock();
            let task_key = (o.tenant.clone(), o.key.clone());
            let mount = state
                .mounts
                .get_mut(&client)
                .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
            let source = mount
                .pending
                .remove(&task_key)
                .ok_or(ErrorCode::INVALID_PARAMS)?;
            if o.stored {
                // A newer value is on disk: the key is live again.
                state.removed.remove(&task_key);
            }
            source
        };
        let counter = if o.stored {
            &self.offload_counters.stored
        } else {
            &self.offload_counters.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let tenant = self.resolve_tenant(&o.tenant)?;
        let hash = self.route(tenant, &o.key);
        let mut shard = self.index.shard(hash).write();
        self.edit_entry(&mut shard, tenant, hash, &o.key, |m, edit| {
            if let Some(r) = m.replicas.iter_mut().find(|r| r.id == source) {
                r.refcnt = r.refcnt.saturating_sub(1);
                edit.changed();
            }
            if o.stored {
                self.add_local_disk(m, client);
                edit.changed();
            }
        })
        .ok_or(ErrorCode::OBJECT_NOT_FOUND)
    }

    /// Adds a COMPLETE LOCAL_DISK replica owned by `client` (once per owner), if its disk is
    /// mounted. True when the object has one afterwards.
    fn add_local_disk(&self, m: &mut ObjectMetadata, client: ClientId) -> bool {
        let owned =
            |r: &Replica| matches!(r.data.place(), Place::LocalDisk(d) if d.client_id == client);
        if m.replicas.iter().any(owned) {
            return true;
        }
        let Some(endpoint) = self
            .offload
            .lock()
            .mounts
            .get(&client)
            .map(|d| d.endpoint.clone())
        else {
            return false;
        };
        m.replicas.push(Replica {
            id: self.next_replica_id(),
            status: ReplicaStatus::COMPLETE,
            refcnt: 0,
            unverified: false,
            data: ReplicaData::local_disk(LocalDiskDescriptor {
                client_id: client,
                object_size: m.size,
                transport_endpoint: endpoint,
            }),
        });
        true
    }

    /// Queues an offload of the object (eager mode: after its PutEnd). No-op without
    /// `enable_offload`, in `offload_on_evict` mode, or when it already has a disk copy.
    pub(crate) fn offload_after_put(&self, tenant: Tenant<'_>, key: &str) {
        if !self.config.enable_offload || self.config.offload_on_evict {
            return;
        }
        if self.offload.lock().mounts.is_empty() {
            return;
        }
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        self.edit_entry(&mut shard, tenant, hash, key, |m, edit| {
            if self.try_queue_offload(tenant, key, m) {
                edit.changed();
            }
        });
    }

    /// Pins a COMPLETE memory replica of `m` on a segment of a node with a mounted disk and
    /// queues its offload there. False (nothing changed) when the object is still being written,
    /// already has a disk copy or a pending task, or no such node has room in its mailbox.
    /// Called under the object's shard write lock.
    pub(crate) fn try_queue_offload(
        &self,
        tenant: Tenant<'_>,
        key: &str,
        m: &mut ObjectMetadata,
    ) -> bool {
        if !self.config.enable_offload || m.is_processing() {
            return false;
        }
        if m.replicas
            .iter()
            .any(|r| matches!(r.data.place(), Place::LocalDisk(_)))
        {
            return false;
        }
        let size = m.size;
        let limit = usize::try_from(self.config.offloading_queue_limit).unwrap_or(usize::MAX);
        let segs = self.segments.inner.read();
        let mut state = self.offload.lock();
        for r in m.replicas.iter_mut() {
            if !r.is_readable() || !matches!(r.data, ReplicaData::Memory(_)) {
                continue;
            }
            let Some(info) = r
                .handle()
                .and_then(|h| h.allocator())
                .map(|a| a.info().clone())
            else {
                continue;
            };
            let Some(owner) = segs.mounted.get(&info.segment_id).map(|s| s.client) else {
                continue;
            };
            let Some(mount) = state.mounts.get_mut(&owner) else {
                continue;
            };
            let task_key = (tenant_name(tenant), key.to_string());
            if mount.pending.contains_key(&task_key) {
                return false;
            }
            if mount.pending.len() >= limit {
                continue;
            }
            let Some(h) = r.handle() else { continue };
            let task = OffloadTask {
                tenant: task_key.0.clone(),
                key: task_key.1.clone(),
                size,
                buffer_address: info.base + h.offset(),
            };
            r.refcnt = r.refcnt.saturating_add(1);
            // The new record replaces the removed one: deleting it afterwards would lose it.
            if !mount.drops.is_empty() {
                mount.drops.retain(|d| *d != task_key);
            }
            mount.pending.insert(task_key, r.id);
            mount.mailbox.push_back(task);
            self.offload_counters.queued.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Registers objects `client` found on its disk (after a restart or re-mount): each gets a
    /// LOCAL_DISK replica owned by `client`. An object the master does not know is created as a
    /// disk-only object (no checksum: the disk record's own CRC guards its bytes); one of another
    /// size is refused with OBJECT_ALREADY_EXISTS (the disk holds an older value).
    pub fn advertise_disk_objects(
        &self,
        client: ClientId,
        objects: &[DiskObject],
    ) -> Result<Vec<Result<(), ErrorCode>>, ErrorCode> {
        if !self.offload.lock().mounts.contains_key(&client) {
            return Err(ErrorCode::SEGMENT_NOT_FOUND);
        }
        Ok(objects
            .iter()
            .map(|o| self.advertise_one(client, o))
            .collect())
    }

    fn advertise_one(&self, client: ClientId, o: &DiskObject) -> Result<(), ErrorCode> {
        if o.size == 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let tenant = self.resolve_tenant(&o.tenant)?;
        let removed = (tenant_name(tenant), o.key.clone());
        if self.offload.lock().removed.contains_key(&removed) {
            // Removed while this record was on disk: the node deletes it and says so
            // (NotifyDiskDrops); until then every advertisement of it is refused.
            return Err(ErrorCode::OBJECT_NOT_FOUND);
        }
        // The key's stripe keeps a PutStart of the same key out while a disk-only object is
        // created (as PutStart itself does).
        let _stripe = self.index.stripe(key_hash(tenant, &o.key)).lock();
        let hash = self.route(tenant, &o.key);
        let mut shard = self.index.shard(hash).write();
        let known = self.edit_entry(&mut shard, tenant, hash, &o.key, |m, edit| {
            if m.size != o.size || m.is_processing() {
                return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
            }
            if !self.add_local_disk(m, client) {
                return Err(ErrorCode::SEGMENT_NOT_FOUND);
            }
            edit.changed();
            Ok(())
        });
        match known {
            Some(result) => result?,
            None => {
                let now = self.clock.now_ms();
                let mut meta = ObjectMetadata {
                    writer: WriterId::of(client),
                    size: o.size,
                    times: ObjectTimes::new(now, now),
                    read_pins: AtomicU32::new(0),
                    checksum_low: 0,
                    flags: 0,
                    data_type: mooncake_common::config::DATA_TYPE_UNKNOWN,
                    extra: None,
                    replicas: Replicas::new(),
                };
                if !self.add_local_disk(&mut meta, client) {
                    return Err(ErrorCode::SEGMENT_NOT_FOUND);
                }
                let entry = Box::new(ObjectEntry {
                    key: ObjectKey::new(&o.key),
                    meta,
                });
                let state = shard.tenant_or_insert(tenant);
                let entry = state.insert(tenant, hash, entry);
                self.emit_entry(tenant, entry);
            }
        }
        self.offload_counters
            .advertised
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `client` evicted these objects from its disk: their LOCAL_DISK replicas owned by it go
    /// (an object left with nothing is erased). OBJECT_NOT_FOUND counts as done for the node.
    pub fn evict_disk_objects(
        &self,
        client: ClientId,
        objects: &[DiskObject],
    ) -> Vec<Result<(), ErrorCode>> {
        objects
            .iter()
            .map(|o| {
                let tenant = self.resolve_tenant(&o.tenant)?;
                let hash = self.route(tenant, &o.key);
                let mut shard = self.index.shard(hash).write();
                self.edit_entry(&mut shard, tenant, hash, &o.key, |m, edit| {
                    let before = m.replicas.len();
                    m.replicas.retain(
                        |r| !matches!(r.data.place(), Place::LocalDisk(d) if d.client_id == client),
                    );
                    if m.replicas.len() != before {
                        self.offload_counters
                            .disk_evicted
                            .fetch_add(1, Ordering::Relaxed);
                        edit.changed();
                    }
                })
                .ok_or(ErrorCode::OBJECT_NOT_FOUND)
            })
            .collect()
    }

    /// The object `key` with `m` is being removed: each node holding it on disk is told to delete
    /// its record, and the key is remembered as removed (see the module doc). Called under the
    /// object's shard write lock.
    pub(crate) fn forget_disk_copies(&self, tenant: Tenant<'_>, key: &str, m: &ObjectMetadata) {
        let mut owners = m.replicas.iter().filter_map(|r| match r.data.place() {
            Place::LocalDisk(d) => Some(d.client_id),
            _ => None,
        });
        let Some(first) = owners.next() else { return };
        let limit = usize::try_from(self.config.offloading_queue_limit).unwrap_or(usize::MAX);
        let removed = (tenant_name(tenant), key.to_string());
        let mut state = self.offload.lock();
        for owner in std::iter::once(first).chain(owners) {
            if let Some(mount) = state.mounts.get_mut(&owner) {
                if mount.drops.len() < limit {
                    mount.drops.push_back(removed.clone());
                }
            }
        }
        state.remember_removed(removed);
    }

    /// Up to `max` records `client` must delete from its disk (objects removed at the master).
    /// SEGMENT_NOT_FOUND when its disk is not mounted.
    pub fn take_disk_drops(
        &self,
        client: ClientId,
        max: usize,
    ) -> Result<Vec<DiskObject>, ErrorCode> {
        let mut state = self.offload.lock();
        let mount = state
            .mounts
            .get_mut(&client)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        let n = max.min(mount.drops.len());
        Ok(mount
            .drops
            .drain(..n)
            .map(|(tenant, key)| DiskObject {
                tenant,
                key,
                size: 0,
            })
            .collect())
    }

    /// `client` deleted these records from its disk: their keys are no longer remembered as
    /// removed.
    pub fn disk_objects_dropped(&self, objects: &[DiskObject]) {
        let mut state = self.offload.lock();
        for o in objects {
            // A node names the default tenant as its disk records do ("default").
            if let Ok(tenant) = self.resolve_tenant(&o.tenant) {
                state.removed.remove(&(tenant_name(tenant), o.key.clone()));
            }
        }
        self.offload_counters
            .disk_dropped
            .fetch_add(objects.len() as u64, Ordering::Relaxed);
    }

    /// Forgets the disks of expired clients (their pending tasks die with them: the source
    /// replicas were on their own segments). Their LOCAL_DISK replicas go in the sweep.
    pub(crate) fn unmount_disks_of(&self, expired: &[ClientId]) {
        let mut state = self.offload.lock();
        for c in expired {
            if let Some(mount) = state.mounts.remove(c) {
                self.offload_counters
                    .dropped
                    .fetch_add(mount.pending.len() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Every mounted disk, ordered by client.
    pub fn local_disks(&self) -> Vec<LocalDiskUsage> {
        let state = self.offload.lock();
        let mut out: Vec<LocalDiskUsage> = state
            .mounts
            .iter()
            .map(|(client, d)| LocalDiskUsage {
                client: *client,
                endpoint: d.endpoint.clone(),
                capacity_bytes: d.capacity_bytes,
                used_bytes: d.used_bytes,
            })
            .collect();
        out.sort_by_key(|d| d.client);
        out
    }

    /// Whether `client` has a mounted disk.
    pub fn has_local_disk(&self, client: ClientId) -> bool {
        self.offload.lock().mounts.contains_key(&client)
    }

    /// The offload counters and the disks' usage.
    pub fn offload_stats(&self) -> OffloadStats {
        let c = &self.offload_counters;
        let state = self.offload.lock();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OffloadStats {
            queued: load(&c.queued),
            stored: load(&c.stored),
            refused: load(&c.refused),
            dropped: load(&c.dropped),
            in_flight: state.mounts.values().map(|d| d.pending.len() as u64).sum(),
            disk_evicted: load(&c.disk_evicted),
            advertised: load(&c.advertised),
            disk_dropped: load(&c.disk_dropped),
            disks: state.mounts.len() as u64,
            disk_capacity_bytes: state.mounts.values().map(|d| d.capacity_bytes).sum(),
            disk_used_bytes: state.mounts.values().map(|d| d.used_bytes).sum(),
            promotions: load(&c.promotions),
            promoted: load(&c.promoted),
            promotion_failures: load(&c.promotion_failures),
            promotions_in_flight: state.mounts_promotions() as u64,
        }
    }
}

impl ObjectMetadata {
    /// Drops the LOCAL_DISK replicas owned by one of `dead`. True if any was dropped.
    pub(crate) fn drop_local_disk_of(&mut self, dead: &[ClientId]) -> bool {
        let before = self.replicas.len();
        self.replicas.retain(
            |r| !matches!(r.data.place(), Place::LocalDisk(d) if dead.contains(&d.client_id)),
        );
        self.replicas.len() != before
    }
}
