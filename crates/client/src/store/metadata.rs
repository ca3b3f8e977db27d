//! Calls that touch only the master's metadata, never object bytes: existence, sizes, replica
//! descriptors, removal and replica clearing, all in this client's tenant.

use mooncake_common::{ErrorCode, ReplicaDescriptor};

use super::read::object_size;
use super::{StoreClient, StoreError};

impl StoreClient {
    /// Whether `key` is readable. A hit is protected until this client's next lookup (a read
    /// pin, `pins.rs`; the read lease with a master that lacks pinned checks).
    pub async fn is_exist(&self, key: &str) -> Result<bool, StoreError> {
        let (master, tenant) = (&self.inner.master, self.tenant());
        let (found, pinned) = self
            .check_exist(
                async |release| master.exist_key_pinned(key, tenant, release).await,
                async || master.exist_key(key, tenant).await,
            )
            .await?;
        if found && pinned {
            self.hold_exists([key]);
        }
        Ok(found)
    }

    /// [`StoreClient::is_exist`] for many keys: one answer per key, in order.
    pub async fn batch_is_exist(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<bool, ErrorCode>>, StoreError> {
        let (master, tenant) = (&self.inner.master, self.tenant());
        let (found, pinned) = self
            .check_exist(
                async |release| {
                    let owned = owned(keys);
                    master.batch_exist_key_pinned(owned, tenant, release).await
                },
                async || master.batch_exist_key(owned(keys), tenant).await,
            )
            .await?;
        if pinned {
            let hits = keys
                .iter()
                .zip(&found)
                .filter(|(_, r)| matches!(r, Ok(true)));
            self.hold_exists(hits.map(|(k, _)| *k));
        }
        Ok(found)
    }

    /// The object's size in bytes.
    pub async fn get_size(&self, key: &str) -> Result<u64, StoreError> {
        let response = self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?;
        object_size(key, &response)
    }

    /// The readable replicas of `key`.
    pub async fn get_replica_desc(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, StoreError> {
        Ok(self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?
            .replicas)
    }

    /// The readable replicas of every key, in key order (one `BatchGetReplicaList`); a key the
    /// master refused (e.g. missing) carries its code.
    pub async fn batch_get_replica_desc(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>, StoreError> {
        let answers = self
            .inner
            .master
            .batch_get_replica_list(owned(keys), self.tenant())
            .await?;
        if answers.len() != keys.len() {
            return Err(StoreError::InvalidParams(
                "master answered a batch of the wrong length".into(),
            ));
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.map(|response| response.replicas))
            .collect())
    }

    pub async fn remove(&self, key: &str, force: bool) -> Result<(), StoreError> {
        Ok(self.inner.master.remove(key, force, self.tenant()).await?)
    }

    pub async fn batch_remove(
        &self,
        keys: &[&str],
        force: bool,
    ) -> Result<Vec<Result<(), ErrorCode>>, StoreError> {
        let keys = owned(keys);
        Ok(self
            .inner
            .master
            .batch_remove(keys, force, self.tenant())
            .await?)
    }

    /// Removes every key matching `regex`; returns how many.
    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<i64, StoreError> {
        Ok(self
            .inner
            .master
            .remove_by_regex(regex, force, self.tenant())
            .await?)
    }

    /// Removes every key of this client's tenant; returns how many.
    pub async fn remove_all(&self, force: bool) -> Result<i64, StoreError> {
        Ok(self.inner.master.remove_all(force, self.tenant()).await?)
    }

    /// Drops this client's replicas of `keys` on the segment named `segment_name` ("" = every
    /// segment) whose read lease has expired; returns the keys cleared.
    pub async fn batch_replica_clear(
        &self,
        keys: &[&str],
        segment_name: &str,
    ) -> Result<Vec<String>, StoreError> {
        Ok(self
            .inner
            .master
            .batch_replica_clear(
                owned(keys),
                self.inner.client_id,
                segment_name,
                self.tenant(),
            )
            .await?)
    }
}

fn owned(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}
