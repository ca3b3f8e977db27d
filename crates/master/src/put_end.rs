//! PutEnd / PutRevoke and their batches (as upstream's master); UpsertEnd and UpsertRevoke are
//! the same calls. Both go through the write seam (`seam.rs`): existence, then the writer, then
//! the state.

use mooncake_common::{ClientId, ErrorCode, ObjectMeta, ReplicaStatus, ReplicaType, SoftPinAction};

use crate::handle::MasterService;
use crate::object::{ObjectMetadata, Replica, FLAG_PROCESSING};

impl MasterService {
    /// PutEnd: marks the selected PROCESSING replicas COMPLETE (the object becomes readable).
    /// OBJECT_NOT_FOUND if missing, ILLEGAL_CLIENT if `client` is not the writer; a retry after
    /// completion is OK; INVALID_WRITE if the object is not being written and a selected replica
    /// is not COMPLETE. Applies the put's soft-pin request when this completes the first replica,
    /// stores the checksum, and counts as an access (no read lease is granted).
    pub fn put_end(
        &self,
        client: ClientId,
        meta: &ObjectMeta,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let key = meta.key.as_str();
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        let now = self.clock.now_ms();
        let pin_deadline =
            self.edit_written_entry(&mut shard, tenant, hash, key, client, |m, edit| {
                if !m.is_processing() {
                    let done = m
                        .replicas
                        .iter()
                        .filter(|r| replica_type.selects(r.replica_type()))
                        .all(Replica::is_complete);
                    return if done {
                        Ok(None)
                    } else {
                        Err(ErrorCode::INVALID_WRITE)
                    };
                }
                edit.changed();
                Ok(Self::complete_put(m, meta, replica_type, now))
            })?;
        if let Some(deadline_ms) = pin_deadline {
            self.push_soft_pin(tenant, key, deadline_ms);
        }
        drop(shard);
        self.offload_after_put(tenant, key);
        Ok(())
    }

    /// PutEnd's state change on an object being written: the selected PROCESSING replicas become
    /// COMPLETE, the pending soft pin applies when this completes the first replica (returns its
    /// deadline to queue), the checksum is stored, the object leaves processing once every
    /// replica is complete, and it counts as an access.
    fn complete_put(
        m: &mut ObjectMetadata,
        meta: &ObjectMeta,
        replica_type: ReplicaType,
        now: u64,
    ) -> Option<u64> {
        let had_complete = m.has_complete();
        for r in m.replicas.iter_mut() {
            if replica_type.selects(r.replica_type()) && r.status == ReplicaStatus::PROCESSING {
                r.status = ReplicaStatus::COMPLETE;
            }
        }
        let mut pin_deadline = None;
        if !had_complete && m.has_complete() {
            if let Some(pin) = m.extra.as_mut().and_then(|e| e.pending_soft_pin.take()) {
                match pin.action {
                    SoftPinAction::Enable if pin.ttl_ms > 0 => {
                        let deadline = now.saturating_add(pin.ttl_ms);
                        m.set_soft_pin_deadline_ms(deadline);
                        pin_deadline = Some(deadline);
                    }
                    SoftPinAction::Enable | SoftPinAction::Disable => m.set_soft_pin_deadline_ms(0),
                    SoftPinAction::Preserve => {}
                }
                m.compact_extra();
            }
        }
        if meta.object_checksum.is_some()
            || matches!(
                replica_type,
                ReplicaType::ALL | ReplicaType::MEMORY | ReplicaType::NOF_SSD
            )
        {
            m.set_checksum(meta.object_checksum);
        }
        if m.all_complete() {
            m.set(FLAG_PROCESSING, false);
        }
        m.grant_lease(now, 0);
        m.touch(now);
        pin_deadline
    }

    /// PutRevoke: erases the selected PROCESSING replicas and frees their buffers at once.
    /// OBJECT_NOT_FOUND, ILLEGAL_CLIENT, or INVALID_WRITE when the object is not being written
    /// or a selected replica is not PROCESSING (Revoke is not idempotent).
    pub fn put_revoke(
        &self,
        client: ClientId,
        key: &str,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        self.edit_written_entry(&mut shard, tenant, hash, key, client, |m, edit| {
            let selected = |r: &Replica| replica_type.selects(r.replica_type());
            if !m.is_processing()
                || m.replicas
                    .iter()
                    .any(|r| selected(r) && r.status != ReplicaStatus::PROCESSING)
            {
                return Err(ErrorCode::INVALID_WRITE);
            }
            edit.free(m.extract_replicas(selected));
            edit.changed();
            if !m.is_valid() {
                // Nothing left: the seam erases the object.
                return Ok(());
            }
            let processing = m
                .replicas
                .iter()
                .any(|r| r.status == ReplicaStatus::PROCESSING);
            m.set(FLAG_PROCESSING, processing);
            if !processing {
                if let Some(e) = m.extra.as_mut() {
                    e.pending_soft_pin = None;
                }
                m.compact_extra();
            }
            Ok(())
        })
    }

    /// BatchPutEnd: PutEnd per entry, one result per entry, in order.
    pub fn batch_put_end(
        &self,
        client: ClientId,
        metas: &[ObjectMeta],
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        metas
            .iter()
            .map(|m| self.put_end(client, m, replica_type, tenant))
            .collect()
    }

    /// BatchPutRevoke: PutRevoke per key, one result per key, in order.
    pub fn batch_put_revoke(
        &self,
        client: ClientId,
        keys: &[String],
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        keys.iter()
            .map(|k| self.put_revoke(client, k, replica_type, tenant))
            .collect()
    }
}
