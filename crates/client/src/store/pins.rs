//! Read pins (docs/master.md "Read pins"): a get asks the master for the replicas with a read
//! pin instead of the lease (`GetReplicaListPinned`, `BatchGetReplicaListPinned`) and, once its
//! transfer is over, queues the key here. The queue rides on the next pinned lookup (its
//! `release` list) or, when the client reads no more, goes out with the heartbeat
//! (`ReleaseReads`) and at close. A lookup whose call fails loses its piggybacked releases: they
//! lapse at the master after the lease TTL (re-sending could release another reader's pin).
//! A master that predates read pins answers them `NOT_SUPPORTED`: the client then reads with
//! the lease (methods 3 and 4) for the rest of its life and queues nothing.

use mooncake_common::{ErrorCode, GetReplicaListResponse};
use mooncake_proto::limits::DEFAULT_MAX_BATCH_LEN;
use std::sync::atomic::Ordering;

use crate::master_client::MasterError;

use super::{Inner, StoreClient, StoreError};

/// Releases carried by one call at most (the master's batch limit).
const MAX_RELEASES: usize = DEFAULT_MAX_BATCH_LEN;

fn take_finished(inner: &Inner) -> Vec<String> {
    let mut queue = inner.finished_reads.lock();
    if queue.len() <= MAX_RELEASES {
        std::mem::take(&mut *queue)
    } else {
        let keep = queue.len() - MAX_RELEASES;
        queue.split_off(keep)
    }
}

/// Sends the queued releases (the heartbeat's and close's share).
pub(super) async fn release_finished(inner: &Inner) {
    loop {
        let keys = take_finished(inner);
        if keys.is_empty() {
            return;
        }
        if let Err(error) = inner.master.release_reads(keys, &inner.config.tenant).await {
            tracing::debug!(%error, "releasing finished reads failed (they lapse at the master)");
            return;
        }
    }
}

impl StoreClient {
    /// Whether lookups for reads take read pins (false once the master refused them).
    pub(super) fn pins_served(&self) -> bool {
        !self.inner.pins_unsupported.load(Ordering::Relaxed)
    }

    /// Whether `result` says the master does not serve read pins (then remembered).
    pub(super) fn refuses_pins<T>(&self, result: &Result<T, MasterError>) -> bool {
        let refused = matches!(result, Err(e) if e.code() == ErrorCode::NOT_SUPPORTED);
        if refused {
            self.inner.pins_unsupported.store(true, Ordering::Relaxed);
            self.inner.finished_reads.lock().clear();
        }
        refused
    }

    /// Queues the keys of finished pinned reads for release.
    pub(super) fn finish_reads<'k>(&self, keys: impl IntoIterator<Item = &'k str>) {
        if !self.pins_served() {
            return;
        }
        let mut queue = self.inner.finished_reads.lock();
        queue.extend(keys.into_iter().map(str::to_string));
    }

    /// The queued releases (up to one call's worth), for a lookup to carry.
    pub(super) fn take_finished_reads(&self) -> Vec<String> {
        take_finished(&self.inner)
    }

    /// Sends every queued release now.
    pub(super) async fn release_finished_reads(&self) {
        release_finished(&self.inner).await;
    }

    /// One key's replicas with a read pin; carries the queued releases.
    pub(super) async fn locate_pinned(
        &self,
        key: &str,
    ) -> Result<GetReplicaListResponse, StoreError> {
        let master = &self.inner.master;
        if self.pins_served() {
            let release = self.take_finished_reads();
            let result = master
                .get_replica_list_pinned(key, self.tenant(), release)
                .await;
            if !self.refuses_pins(&result) {
                return Ok(result?);
            }
        }
        Ok(master.get_replica_list(key, self.tenant()).await?)
    }
}
