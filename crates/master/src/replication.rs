//! CopyStart/End/Revoke and MoveStart/End/Revoke (as upstream's master).
//!
//! A start records one task on the object (at most one per object), pins the source replica
//! (`refcnt += 1`: eviction, Remove and Upsert leave it alone) and appends PROCESSING targets
//! allocated with `AllocateFrom` on the named segments, charged to the tenant's quota. End marks
//! the targets COMPLETE (a move also removes the source); Revoke erases the targets. Both unpin
//! the source and drop the task. Tasks older than `put_start_release_timeout` are revoked by
//! `run_put_timeouts_once`.

use mooncake_common::{
    ClientId, CopyStartResponse, ErrorCode, MoveStartResponse, ReplicaDescriptor, ReplicaStatus,
    SegmentStatus,
};

use crate::handle::MasterService;
use crate::index::key_hash;
use crate::object::{ObjectMetadata, Removed, Replica, ReplicaData, ReplicationTask, TaskKind};

impl MasterService {
    /// Checks that every target name is mounted (SEGMENT_NOT_FOUND) and OK
    /// (UNAVAILABLE_IN_CURRENT_STATUS).
    fn check_targets(&self, targets: &[&str]) -> Result<(), ErrorCode> {
        for t in targets {
            if self.query_segment_status(t)? != SegmentStatus::OK {
                return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
            }
        }
        Ok(())
    }

    /// The start common to Copy and Move. Returns the source descriptor and the new targets'.
    fn replication_start(
        &self,
        client: ClientId,
        key: &str,
        tenant: &str,
        source: &str,
        targets: &[&str],
        kind: TaskKind,
    ) -> Result<(ReplicaDescriptor, Vec<ReplicaDescriptor>), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        self.check_targets(targets)?;
        let own = key_hash(tenant, key);
        let _stripe = self.index.stripe(own).lock();
        let account = self.tenant_account(tenant)?;
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        let now = self.clock.now_ms();
        self.edit_live_entry(&mut shard, tenant, hash, key, |m, edit| {
            if m.has_task() {
                return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK);
            }
            let src_index = m
                .replicas
                .iter()
                .position(|r| r.is_readable() && r.segment_name().is_some_and(|n| &*n == source))
                .ok_or(ErrorCode::REPLICA_NOT_FOUND)?;
            let held: Vec<std::sync::Arc<str>> = m
                .replicas
                .iter()
                .filter_map(Replica::segment_name)
                .collect();
            let mut fresh: Vec<&str> = Vec::new();
            for t in targets {
                if !held.iter().any(|h| &**h == *t) && !fresh.contains(t) {
                    fresh.push(t);
                }
            }
            let size = m.size;
            let src_desc = m.replicas[src_index]
                .descriptor(size)
                .ok_or(ErrorCode::REPLICA_IS_GONE)?;
            let want = size.saturating_mul(fresh.len() as u64);
            if let Some(acc) = &account {
                acc.try_charge(want)
                    .map_err(|_| ErrorCode::TENANT_QUOTA_EXCEEDED)?;
            }
            let mut handles = Vec::with_capacity(fresh.len());
            {
                let segs = self.segments.inner.read();
                for t in &fresh {
                    match segs.allocatable.allocate_from(t, size, &self.rng) {
                        Ok(h) => handles.push(h),
                        Err(e) => {
                            drop(handles);
                            if let Some(acc) = &account {
                                acc.refund(want);
                            }
                            return Err(e);
                        }
                    }
                }
            }
            if let Some(acc) = &account {
                // The object's account may be absent (written with quotas off): then nothing was
                // charged for it and the targets must not be either.
                if m.account().is_none() {
                    acc.refund(want);
                }
            }
            let mut target_ids = Vec::with_capacity(handles.len());
            let mut target_descs = Vec::with_capacity(handles.len());
            for h in handles {
                let r = Replica {
                    id: self.next_replica_id(),
                    status: ReplicaStatus::PROCESSING,
                    refcnt: 0,
                    unverified: false,
                    data: ReplicaData::Memory(h),
                };
                target_ids.push(r.id);
                if let Some(d) = r.descriptor(size) {
                    target_descs.push(d);
                }
                m.replicas.push(r);
            }
            let src = &mut m.replicas[src_index];
            src.refcnt = src.refcnt.saturating_add(1);
            let source_id = src.id;
            m.extra_mut().task = Some(ReplicationTask {
                client,
                start_ms: now,
                kind,
                source: source_id,
                targets: target_ids,
            });
            edit.changed();
            Ok((src_desc, target_descs))
        })
    }

    /// Ends (`commit`) or revokes a task of `kind`: see the module doc.
    fn replication_finish(
        &self,
        client: ClientId,
        key: &str,
        tenant: &str,
        kind: TaskKind,
        commit: bool,
    ) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        self.edit_entry(&mut shard, tenant, hash, key, |m, edit| {
            let task = m.task().ok_or(ErrorCode::OBJECT_NO_REPLICATION_TASK)?;
            if task.client != client {
                return Err(ErrorCode::ILLEGAL_CLIENT);
            }
            if task.kind != kind {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            let gone = {
                let alive = |id| m.replicas.iter().any(|r| r.id == id && r.is_valid());
                !alive(task.source) || !task.targets.iter().all(|&t| alive(t))
            };
            edit.changed();
            edit.free(Self::drop_task(m, commit && !gone));
            m.drop_dead_replicas();
            if gone {
                Err(ErrorCode::REPLICA_IS_GONE)
            } else {
                Ok(())
            }
        })
        .unwrap_or(Err(ErrorCode::OBJECT_NO_REPLICATION_TASK))
    }

    /// Drops the object's task: with `commit`, targets become COMPLETE (and a move's source
    /// goes); without, targets are erased. The source is unpinned either way. Returns the
    /// replicas taken out, to be freed once the change is observed.
    pub(crate) fn drop_task(m: &mut ObjectMetadata, commit: bool) -> Removed {
        let Some(task) = m.extra.as_mut().and_then(|e| e.task.take()) else {
            return Removed::new();
        };
        m.compact_extra();
        for r in m.replicas.iter_mut() {
            if r.id == task.source {
                r.refcnt = r.refcnt.saturating_sub(1);
            }
            if commit && task.targets.contains(&r.id) && r.status == ReplicaStatus::PROCESSING {
                r.status = ReplicaStatus::COMPLETE;
            }
        }
        if commit {
            if task.kind == TaskKind::Move {
                return m.extract_replicas(|r| r.id == task.source);
            }
            Removed::new()
        } else {
            m.extract_replicas(|r| task.targets.contains(&r.id))
        }
    }

    /// CopyStart: see the module doc. Errors in check order: unknown target →
    /// SEGMENT_NOT_FOUND, non-OK target → UNAVAILABLE_IN_CURRENT_STATUS, OBJECT_NOT_FOUND,
    /// OBJECT_HAS_REPLICATION_TASK, no COMPLETE live replica on `source` → REPLICA_NOT_FOUND;
    /// then TENANT_QUOTA_EXCEEDED or NO_AVAILABLE_HANDLE from the allocation.
    pub fn copy_start(
        &self,
        client: ClientId,
        key: &str,
        tenant: &str,
        source: &str,
        targets: &[String],
    ) -> Result<CopyStartResponse, ErrorCode> {
        let t: Vec<&str> = targets.iter().map(String::as_str).collect();
        let (source, targets) =
            self.replication_start(client, key, tenant, source, &t, TaskKind::Copy)?;
        Ok(CopyStartResponse { source, targets })
    }

    /// CopyEnd: OBJECT_NO_REPLICATION_TASK, ILLEGAL_CLIENT (another client), INVALID_PARAMS (a
    /// move task), REPLICA_IS_GONE (source or a target vanished; the task is cleaned up).
    pub fn copy_end(&self, client: ClientId, key: &str, tenant: &str) -> Result<(), ErrorCode> {
        self.replication_finish(client, key, tenant, TaskKind::Copy, true)
    }

    /// CopyRevoke: erases the targets, unpins the source, drops the task (CopyEnd's errors).
    pub fn copy_revoke(&self, client: ClientId, key: &str, tenant: &str) -> Result<(), ErrorCode> {
        self.replication_finish(client, key, tenant, TaskKind::Copy, false)
    }

    /// MoveStart: `source == target` → INVALID_PARAMS; otherwise CopyStart's checks with one
    /// target, absent from the answer when the target already holds a replica.
    pub fn move_start(
        &self,
        client: ClientId,
        key: &str,
        tenant: &str,
        source: &str,
        target: &str,
    ) -> Result<MoveStartResponse, ErrorCode> {
        if source == target {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let (source, mut targets) =
            self.replication_start(client, key, tenant, source, &[target], TaskKind::Move)?;
        Ok(MoveStartResponse {
            source,
            target: targets.pop(),
        })
    }

    /// MoveEnd: completes the target and removes the source replica (CopyEnd's errors).
    pub fn move_end(&self, client: ClientId, key: &str, tenant: &str) -> Result<(), ErrorCode> {
        self.replication_finish(client, key, tenant, TaskKind::Move, true)
    }

    /// MoveRevoke: erases the target, keeps the source (CopyEnd's errors).
    pub fn move_revoke(&self, client: ClientId, key: &str, tenant: &str) -> Result<(), ErrorCode> {
        self.replication_finish(client, key, tenant, TaskKind::Move, false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use mooncake_common::{
        ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId, TenantId,
    };

    use super::*;
    use crate::{MasterServiceConfig, TenantPolicy};

    fn segment(id: u64, name: &str) -> Segment {
        Segment {
            id: SegmentId::new(id, id),
            name: name.into(),
            base: id << 30,
            size: 1 << 20,
            te_endpoint: name.into(),
            protocol: "tcp".into(),
            host_id: String::new(),
        }
    }

    /// CopyStart on a named tenant's object whose only replica died (its segment's allocator is
    /// gone, the unmount sweep not run yet) erases the object; the tenant's now empty state in
    /// that shard must go with it, as on every other write path.
    #[test]
    fn copy_start_on_a_dead_object_drops_the_empty_tenant_state() {
        let m = MasterService::new(
            MasterServiceConfig {
                enable_multi_tenants: true,
                ..Default::default()
            },
            Arc::new(ManualClock::new(1_000)),
        )
        .unwrap();
        let mut p = TenantPolicy::default();
        p.tenants.insert(TenantId::new("t1").unwrap(), 1 << 30);
        m.apply_tenant_policy(p).unwrap();
        let c = ClientId::new(1, 1);
        let a = segment(1, "a");
        m.mount_segment(&a, c).unwrap();
        m.put_start(c, "k", 10, &ReplicateConfig::default(), "t1")
            .unwrap();
        m.put_end(c, &ObjectMeta::new("k"), ReplicaType::ALL, "t1")
            .unwrap();
        assert_eq!(m.tenant_state_count(), 1);
        // The unmount's first step only: the allocator dies, the shards are not swept.
        drop(m.segments.inner.write().prepare_unmount(a.id).unwrap());
        m.mount_segment(&segment(2, "b"), c).unwrap();
        assert_eq!(
            m.copy_start(c, "k", "t1", "a", &["b".to_string()]),
            Err(ErrorCode::OBJECT_NOT_FOUND)
        );
        assert_eq!(m.object_count(), 0);
        assert_eq!(
            m.tenant_state_count(),
            0,
            "an empty tenant state was left behind"
        );
    }
}
