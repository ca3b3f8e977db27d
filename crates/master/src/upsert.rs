//! UpsertStart / UpsertEnd / UpsertRevoke and their batches (as upstream's master).
//!
//! UpsertStart is validated as PutStart and, for a key that does not exist, is a PutStart. For
//! an existing key: a group change → INVALID_PARAMS; a copy/move task →
//! OBJECT_HAS_REPLICATION_TASK; a replica with `refcnt > 0` → OBJECT_REPLICA_BUSY; an in-flight
//! write is pre-empted at once (its PROCESSING replicas discarded until `now +
//! put_start_release_timeout`); then a **same-size** value is rewritten in place (COMPLETE →
//! PROCESSING, the key unreadable until End, the same descriptors returned) and a
//! **different-size** one is reallocated (old buffers discarded, hard pin and a live soft pin
//! kept). End and Revoke are PutEnd and PutRevoke.

use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaDescriptor, ReplicaType, ReplicateConfig,
};

use crate::handle::MasterService;
use crate::put::{PutArgs, StartMode};

impl MasterService {
    /// UpsertStart: see the module doc. Same arguments and errors as PutStart, plus
    /// OBJECT_HAS_REPLICATION_TASK and OBJECT_REPLICA_BUSY.
    pub fn upsert_start(
        &self,
        client: ClientId,
        key: &str,
        slice_length: u64,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let group = config
            .group_ids
            .as_ref()
            .and_then(|g| g.first())
            .map(String::as_str);
        let args = PutArgs {
            key,
            slice_length,
            config,
            group,
            preferred_override: None,
        };
        self.put_start_one(client, &args, tenant, false, StartMode::Upsert)
    }

    /// UpsertEnd: PutEnd.
    pub fn upsert_end(
        &self,
        client: ClientId,
        meta: &ObjectMeta,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        self.put_end(client, meta, replica_type, tenant)
    }

    /// UpsertRevoke: PutRevoke.
    pub fn upsert_revoke(
        &self,
        client: ClientId,
        key: &str,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        self.put_revoke(client, key, replica_type, tenant)
    }

    /// BatchUpsertStart: UpsertStart per key, with BatchPutStart's length checks.
    pub fn batch_upsert_start(
        &self,
        client: ClientId,
        keys: &[String],
        slice_lengths: &[u64],
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        self.batch_start(
            client,
            keys,
            slice_lengths,
            config,
            tenant,
            StartMode::Upsert,
        )
    }

    /// BatchUpsertEnd: UpsertEnd (all replica types) per entry, in order.
    pub fn batch_upsert_end(
        &self,
        client: ClientId,
        metas: &[ObjectMeta],
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        self.batch_put_end(client, metas, ReplicaType::ALL, tenant)
    }

    /// BatchUpsertRevoke: UpsertRevoke (all replica types) per key, in order.
    pub fn batch_upsert_revoke(
        &self,
        client: ClientId,
        keys: &[String],
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        self.batch_put_revoke(client, keys, ReplicaType::ALL, tenant)
    }
}
