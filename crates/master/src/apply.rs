//! The other side of the mutation seam: [`MasterService::apply`] builds state from observed
//! mutations (snapshot restore and a hot standby), [`MasterService::export_state`] and
//! [`MasterService::for_each_object_record`] read the live state back as records.
//!
//! Applying the mutations a master observed, in order, to an empty master with the same config
//! gives an equal export, allocators included (the replay test `tests/replay.rs` checks this on
//! random workloads). `apply` observes nothing itself (the mutation is already in the caller's
//! hands). An error means the stream does not fit the state (a bug or a damaged log): the key or
//! segment it names is left as far as the mutation got, and the master should be rebuilt from a
//! snapshot rather than served.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mooncake_common::{ErrorCode, SegmentId, SegmentStatus, TenantId};
use smallvec::SmallVec;
use thiserror::Error;

use crate::allocator::{BufferHandle, ClaimError};
use crate::deferred::DiscardedBuffers;
use crate::handle::MasterService;
use crate::index::{group_hash, key_hash, routed, Tenant, SHARD_COUNT};
use crate::mutation::{
    BufferRecord, DiscardedRecord, MasterState, Mutation, ObjectRecord, ReplicaPlace,
    ReplicationKind, SegmentRecord,
};
use crate::object::{
    ObjectEntry, ObjectExtra, ObjectKey, ObjectMetadata, ObjectTimes, PendingSoftPin, Place,
    Replica, ReplicaData, Replicas, ReplicationTask, TaskKind, FLAG_HARD_PIN, FLAG_PROCESSING,
};
use crate::quota::TenantAccount;
use crate::writers::WriterId;

/// Why a mutation could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApplyError {
    #[error("segment {0} is not mounted (or is unmounting)")]
    UnknownSegment(SegmentId),
    #[error("cannot claim [{offset}, +{len}) in segment {segment}: {reason}")]
    Claim {
        segment: SegmentId,
        offset: u64,
        len: u64,
        reason: ClaimError,
    },
    #[error("object {key:?} has size 0 or no replica")]
    EmptyObject { key: String },
    #[error("{what} refused: {code}")]
    Refused { what: &'static str, code: ErrorCode },
}

impl From<ApplyError> for ErrorCode {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Refused { code, .. } => code,
            _ => ErrorCode::INVALID_PARAMS,
        }
    }
}

fn refused(what: &'static str) -> impl Fn(ErrorCode) -> ApplyError {
    move |code| ApplyError::Refused { what, code }
}

impl MasterService {
    /// Applies one observed mutation (see the module doc).
    pub fn apply(&self, mutation: &Mutation) -> Result<(), ApplyError> {
        match mutation {
            Mutation::Object(record) => self.apply_object(record),
            Mutation::Erase { tenant, key } => {
                self.apply_erase(Tenant::of(tenant.as_ref()), key);
                Ok(())
            }
            Mutation::SegmentMounted { segment, client } => {
                self.segments
                    .inner
                    .write()
                    .mount(segment, *client)
                    .map_err(refused("mount"))?;
                self.recompute_quotas();
                Ok(())
            }
            Mutation::SegmentStatus { id, status } => self
                .segments
                .inner
                .write()
                .set_status(*id, *status)
                .map(drop)
                .map_err(refused("segment status change")),
            Mutation::GracefulUnmount {
                id,
                client,
                deadline_ms,
            } => self
                .segments
                .inner
                .write()
                .start_graceful_unmount(*id, *client, *deadline_ms)
                .map(drop)
                .map_err(refused("graceful unmount")),
            Mutation::SegmentUnmounted { id } => self.apply_unmount(*id),
            Mutation::TenantPolicy(policy) => {
                if !self.config.enable_multi_tenants {
                    return Err(ApplyError::Refused {
                        what: "tenant policy",
                        code: ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                    });
                }
                self.set_policy(policy.clone(), false);
                Ok(())
            }
            Mutation::Discarded(record) => self.apply_discarded(record),
            Mutation::DiscardedReleased { up_to_ms } => {
                let due = self.discarded.lock().take_due(*up_to_ms);
                drop(due);
                Ok(())
            }
        }
    }

    /// Loads `state` into this empty master exactly as it was exported: every segment mounted
    /// with its status and graceful deadline, the tenant policy, every object at its exact
    /// ranges, the discarded list and the next replica id, so that [`MasterService::export_state`]
    /// gives `state` back and the allocators hold the same ranges. Unlike
    /// [`MasterService::restore`] nothing is verified, dropped or made to wait: this builds a
    /// replica on which the op-log after a snapshot is replayed (docs/oplog.md, "Compaction").
    /// Observes nothing.
    pub fn load_state(&self, state: &MasterState) -> Result<(), ApplyError> {
        for s in &state.segments {
            self.load_segment(s)?;
        }
        self.recompute_quotas();
        if self.config.enable_multi_tenants {
            self.set_policy(state.tenant_policy.clone(), false);
        }
        for o in &state.objects {
            self.apply_object(o)?;
        }
        for d in &state.discarded {
            self.apply_discarded(d)?;
        }
        self.next_replica_id
            .fetch_max(state.next_replica_id, Ordering::Relaxed);
        Ok(())
    }

    /// Mounts one exported segment and brings it to its status.
    fn load_segment(&self, s: &SegmentRecord) -> Result<(), ApplyError> {
        let mut segs = self.segments.inner.write();
        segs.mount(&s.segment, s.client).map_err(refused("mount"))?;
        let id = s.segment.id;
        let status = refused("segment status");
        match s.status {
            SegmentStatus::DRAINING => segs.set_status(id, SegmentStatus::DRAINING).map(drop),
            SegmentStatus::DRAINED => segs
                .set_status(id, SegmentStatus::DRAINING)
                .and_then(|_| segs.set_status(id, SegmentStatus::DRAINED))
                .map(drop),
            SegmentStatus::GRACEFULLY_UNMOUNTING => segs
                .start_graceful_unmount(id, s.client, s.graceful_deadline_ms.unwrap_or(0))
                .map(drop),
            _ => Ok(()),
        }
        .map_err(status)
    }

    /// Claims `b` in its segment's allocator.
    fn claim(&self, b: &BufferRecord) -> Result<BufferHandle, ApplyError> {
        let segs = self.segments.inner.read();
        let allocator = segs
            .allocator_of(b.segment)
            .ok_or(ApplyError::UnknownSegment(b.segment))?;
        allocator
            .claim(b.offset, b.len)
            .map_err(|reason| ApplyError::Claim {
                segment: b.segment,
                offset: b.offset,
                len: b.len,
                reason,
            })
    }

    /// The place of an existing replica, as a record would list it.
    fn place_of(&self, r: &Replica) -> Option<ReplicaPlace> {
        let buffer = |h: &BufferHandle| {
            Some(BufferRecord {
                segment: h.allocator()?.info().segment_id,
                offset: h.offset(),
                len: h.len(),
            })
        };
        Some(match r.data.place() {
            Place::Memory(h) => ReplicaPlace::Memory(buffer(h)?),
            Place::NoF(h) => ReplicaPlace::NoF(buffer(h)?),
            Place::Disk(d) => ReplicaPlace::Disk(d.clone()),
            Place::LocalDisk(d) => ReplicaPlace::LocalDisk(d.clone()),
            Place::Dfs(d) => ReplicaPlace::Dfs(d.clone()),
        })
    }

    /// Makes the entry of `record.key` exactly `record`: replicas with the same id and place are
    /// kept, the others dropped (freed), new ones claimed at their exact ranges.
    fn apply_object(&self, record: &ObjectRecord) -> Result<(), ApplyError> {
        if record.size == 0 || record.replicas.is_empty() {
            return Err(ApplyError::EmptyObject {
                key: record.key.clone(),
            });
        }
        let tenant = Tenant::of(record.tenant.as_ref());
        let key = record.key.as_str();
        let own = key_hash(tenant, key);
        let _stripe = self.index.stripe(own).lock();
        let old_hash = self.route_from(tenant, key, own);
        let group = record.group.as_deref().filter(|g| !g.is_empty());
        let new_hash = group.map_or(own, |g| routed(own, group_hash(g)));
        let old = {
            let mut shard = self.index.shard(old_hash).write();
            let old = shard
                .tenant_mut(tenant)
                .and_then(|s| s.remove(old_hash, key));
            shard.drop_tenant_if_empty(tenant);
            old
        };
        // Every old replica leaves (refunded); those the record keeps move into the new entry.
        let mut leaving: SmallVec<[Replica; 2]> =
            old.map(|mut e| e.meta.take_replicas()).unwrap_or_default();
        let mut kept: Vec<Option<Replica>> = record
            .replicas
            .iter()
            .map(|rr| {
                let pos = leaving
                    .iter()
                    .position(|r| r.id == rr.id && self.place_of(r).as_ref() == Some(&rr.place))?;
                Some(leaving.remove(pos))
            })
            .collect();
        drop(leaving);
        let mut replicas = Replicas::new();
        for (rr, kept) in record.replicas.iter().zip(kept.iter_mut()) {
            let data = match kept.take() {
                Some(r) => r.data,
                None => match &rr.place {
                    ReplicaPlace::Memory(b) => ReplicaData::Memory(self.claim(b)?),
                    ReplicaPlace::NoF(b) => ReplicaData::nof(self.claim(b)?),
                    ReplicaPlace::Disk(d) => ReplicaData::disk(d.clone()),
                    ReplicaPlace::LocalDisk(d) => ReplicaData::local_disk(d.clone()),
                    ReplicaPlace::Dfs(d) => ReplicaData::dfs(d.clone()),
                },
            };
            replicas.push(Replica {
                id: rr.id,
                status: rr.status,
                refcnt: u16::try_from(rr.refcnt).unwrap_or(u16::MAX),
                unverified: false,
                data,
            });
        }
        let account = self.replay_account(tenant);
        let entry = self.entry_of(record, group, replicas, account, self.clock.now_ms());
        if group.is_some() || old_hash != own {
            self.routes.set(tenant, key, own, group.map(group_hash));
        }
        let max_id = record.replicas.iter().map(|r| r.id.0).max().unwrap_or(0);
        self.next_replica_id
            .fetch_max(max_id.saturating_add(1), Ordering::Relaxed);
        {
            let mut shard = self.index.shard(new_hash).write();
            let state = shard.tenant_or_insert(tenant);
            state.insert(tenant, new_hash, entry);
        }
        if record.soft_pin_deadline_ms != 0 {
            self.push_soft_pin(tenant, key, record.soft_pin_deadline_ms);
        }
        Ok(())
    }

    /// The account a replayed object of `tenant` is charged to (multi-tenancy on only).
    pub(crate) fn replay_account(&self, tenant: Tenant<'_>) -> Option<Arc<TenantAccount>> {
        if !self.config.enable_multi_tenants {
            return None;
        }
        let id = TenantId::new(tenant.name()).unwrap_or_default();
        Some(self.quota.write().account(&id))
    }

    pub(crate) fn entry_of(
        &self,
        record: &ObjectRecord,
        group: Option<&str>,
        replicas: Replicas,
        account: Option<Arc<TenantAccount>>,
        now_ms: u64,
    ) -> Box<ObjectEntry> {
        let pending_soft_pin = record.pending_soft_pin.map(|p| PendingSoftPin {
            action: p.action,
            ttl_ms: p.ttl_ms,
        });
        let task = record.task.as_ref().map(|t| ReplicationTask {
            client: t.client,
            start_ms: t.start_ms,
            kind: match t.kind {
                ReplicationKind::Copy => TaskKind::Copy,
                ReplicationKind::Move => TaskKind::Move,
            },
            source: t.source,
            targets: t.targets.clone(),
        });
        let extra =
            (group.is_some() || pending_soft_pin.is_some() || account.is_some() || task.is_some())
                .then(|| {
                    Box::new(ObjectExtra {
                        group: group.map(Box::from),
                        pending_soft_pin,
                        account: account.clone(),
                        task,
                        soft_pin_deadline_ms: 0,
                        checksum_high: 0,
                    })
                });
        let mut flags = 0;
        if record.processing {
            flags |= FLAG_PROCESSING;
        }
        if record.hard_pin {
            flags |= FLAG_HARD_PIN;
        }
        let mut meta = ObjectMetadata {
            writer: WriterId::of(record.writer),
            size: record.size,
            times: ObjectTimes::new(record.put_start_ms, now_ms),
            read_pins: std::sync::atomic::AtomicU32::new(0),
            checksum_low: 0,
            flags,
            data_type: record.data_type,
            extra,
            replicas,
        };
        meta.set_checksum(record.checksum);
        meta.set_soft_pin_deadline_ms(record.soft_pin_deadline_ms);
        if let Some(a) = &account {
            a.charge_unchecked(meta.charged_bytes());
        }
        Box::new(ObjectEntry {
            key: ObjectKey::new(&record.key),
            meta,
        })
    }

    fn apply_erase(&self, tenant: Tenant<'_>, key: &str) {
        let own = key_hash(tenant, key);
        let _stripe = self.index.stripe(own).lock();
        let hash = self.route_from(tenant, key, own);
        let mut shard = self.index.shard(hash).write();
        let gone = shard.tenant_mut(tenant).and_then(|s| s.remove(hash, key));
        shard.drop_tenant_if_empty(tenant);
        drop(gone);
    }

    /// The whole unmount at once: prepare, sweep, commit (observing nothing).
    fn apply_unmount(&self, id: SegmentId) -> Result<(), ApplyError> {
        let prepared = self
            .segments
            .inner
            .write()
            .prepare_unmount(id)
            .map_err(refused("unmount"))?
            .ok_or(ApplyError::UnknownSegment(id))?;
        drop(prepared);
        for i in 0..SHARD_COUNT {
            let mut shard = self.index.shard_at(i).write();
            for (_, state) in shard.tenants_mut() {
                state.objects.retain(|entry| {
                    entry.meta.drop_dead_replicas();
                    entry.meta.is_valid()
                });
            }
            shard.others.retain(|_, s| s.len() > 0);
        }
        self.discarded.lock().drop_dead();
        self.segments.inner.write().commit_unmount(id);
        self.recompute_quotas();
        Ok(())
    }

    fn apply_discarded(&self, record: &DiscardedRecord) -> Result<(), ApplyError> {
        let buffers = record
            .buffers
            .iter()
            .map(|b| self.claim(b))
            .collect::<Result<Vec<_>, _>>()?;
        if !buffers.is_empty() {
            self.discarded.lock().entries.push(DiscardedBuffers {
                release_at_ms: record.release_at_ms,
                buffers,
            });
        }
        Ok(())
    }

    /// Calls `f` with the record of every object that has a valid replica, shard by shard: each
    /// shard is read-locked only while its records are built, and `f` runs with no lock held.
    /// Within a shard the records are sorted by `(tenant, key)`.
    pub fn for_each_object_record(&self, mut f: impl FnMut(ObjectRecord)) {
        self.for_each_shard_records(|_, batch| batch.drain(..).for_each(&mut f));
    }

    /// Calls `f(shard, records)` once per shard, in shard order (`0..SHARD_COUNT`), with the
    /// records of that shard's objects that have a valid replica, sorted by `(tenant, key)`.
    /// Only one shard is read-locked at a time, and only while its records are built; `f` runs
    /// with no lock held and may take the records (the vector is reused, cleared, for the next
    /// shard). Shards without an object are skipped. On a master that is changing, each shard's
    /// records are that shard's state at one instant; different shards are different instants.
    pub fn for_each_shard_records(&self, mut f: impl FnMut(usize, &mut Vec<ObjectRecord>)) {
        let mut batch = Vec::new();
        for i in 0..SHARD_COUNT {
            self.visit_shard(i, |view| batch.push(view.to_record()));
            if batch.is_empty() {
                continue;
            }
            batch.sort_unstable_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
            f(i, &mut batch);
            batch.clear();
        }
    }

    /// The mounted segments (those with an allocator, graceful deadline included), by id.
    pub fn segment_records(&self) -> Vec<SegmentRecord> {
        let segs = self.segments.inner.read();
        let mut out: Vec<SegmentRecord> = segs
            .mounted
            .values()
            .filter(|s| s.allocator.is_some())
            .map(|s| SegmentRecord {
                segment: s.segment.clone(),
                client: s.client,
                status: s.status,
                graceful_deadline_ms: segs
                    .graceful
                    .iter()
                    .find(|g| g.segment_id == s.segment.id)
                    .map(|g| g.deadline_ms),
            })
            .collect();
        out.sort_by_key(|s| s.segment.id);
        out
    }

    /// The discarded list in its order, each entry with the buffers on live segments (entries
    /// left with none are omitted).
    pub fn discarded_records(&self) -> Vec<DiscardedRecord> {
        let list = self.discarded.lock();
        let segs = self.segments.inner.read();
        list.entries
            .iter()
            .filter_map(|d| {
                let buffers: Vec<BufferRecord> = d
                    .buffers
                    .iter()
                    .filter_map(|h| {
                        segs.live_segment_of(h).map(|segment| BufferRecord {
                            segment,
                            offset: h.offset(),
                            len: h.len(),
                        })
                    })
                    .collect();
                (!buffers.is_empty()).then_some(DiscardedRecord {
                    release_at_ms: d.release_at_ms,
                    buffers,
                })
            })
            .collect()
    }

    /// The next replica id this master will hand out (every id issued so far is below it).
    pub fn peek_next_replica_id(&self) -> u64 {
        self.next_replica_id.load(Ordering::Relaxed)
    }

    /// The live durable state as records (see [`MasterState`]). Each part is read under its own
    /// lock, one shard at a time: on a master that is changing, the parts are not one instant's
    /// view (an observer's log, replayed from where the export began, makes them consistent).
    pub fn export_state(&self) -> MasterState {
        let mut objects = Vec::new();
        self.for_each_object_record(|r| objects.push(r));
        objects.sort_unstable_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
        MasterState {
            segments: self.segment_records(),
            objects,
            discarded: self.discarded_records(),
            tenant_policy: self.tenant_policy(),
            next_replica_id: self.peek_next_replica_id(),
        }
    }
}
