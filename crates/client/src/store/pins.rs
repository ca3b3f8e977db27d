//! Read pins (docs/master.md "Read pins"): a get asks the master for the replicas with a read
//! pin instead of the lease (`GetReplicaListPinned`, `BatchGetReplicaListPinned`) and, once its
//! transfer is over, queues the key here. The queue rides on the next pinned lookup (its
//! `release` list) or, when the client reads no more, goes out with the heartbeat
//! (`ReleaseReads`) and at close. A lookup whose call fails loses its piggybacked releases: they
//! lapse at the master after the lease TTL (re-sending could release another reader's pin).
//! A master that predates read pins answers them `NOT_SUPPORTED`: the client then reads with
//! the lease (methods 3 and 4) for the rest of its life and queues nothing.
//!
//! An existence check (`ExistKeyPinned`, `BatchExistKeyPinned`) pins its hits the same way; they
//! are held until the client's next pinned lookup (the load the check announces), which
//! releases them, or close; the heartbeat leaves them (an idle client's lapse after the TTL,
//! as upstream's lease). A master without methods 54–55 answers `NOT_SUPPORTED`: checks then
//! take the lease (methods 1 and 2). Until a master has answered one pinned check, a check
//! carries no releases, so the first refusal loses none.

use mooncake_common::{ErrorCode, GetReplicaListResponse};
use mooncake_proto::limits::DEFAULT_MAX_BATCH_LEN;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;

use crate::master_client::MasterError;

use super::{Inner, StoreClient, StoreError};

/// Releases carried by one call at most (the master's batch limit).
const MAX_RELEASES: usize = DEFAULT_MAX_BATCH_LEN;

/// Whether the master serves pinned existence checks: not known yet, yes, no.
pub(super) const UNKNOWN: u8 = 0;
const SERVED: u8 = 1;
const REFUSED: u8 = 2;

/// Up to `max` keys of `queue` (the newest).
fn take_up_to(queue: &Mutex<Vec<String>>, max: usize) -> Vec<String> {
    let mut queue = queue.lock();
    if queue.len() <= max {
        std::mem::take(&mut *queue)
    } else {
        let keep = queue.len() - max;
        queue.split_off(keep)
    }
}

fn take_finished(inner: &Inner) -> Vec<String> {
    take_up_to(&inner.finished_reads, MAX_RELEASES)
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
            self.inner.held_exists.lock().clear();
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

    /// The queued releases (up to one call's worth), for a lookup to carry: the pins of earlier
    /// existence checks, then finished reads.
    pub(super) fn take_finished_reads(&self) -> Vec<String> {
        let mut release = take_up_to(&self.inner.held_exists, MAX_RELEASES);
        let room = MAX_RELEASES - release.len();
        if room > 0 {
            release.extend(take_up_to(&self.inner.finished_reads, room));
        }
        release
    }

    /// Sends every queued release now, the held existence pins included (close).
    pub(super) async fn release_finished_reads(&self) {
        let held = std::mem::take(&mut *self.inner.held_exists.lock());
        self.inner.finished_reads.lock().extend(held);
        release_finished(&self.inner).await;
    }

    /// An existence check: `pinned` (given the releases to carry) while the master serves
    /// pinned checks, else `plain` (the lease). Answers whether the pinned form ran.
    pub(super) async fn check_exist<T>(
        &self,
        pinned: impl AsyncFnOnce(Vec<String>) -> Result<T, MasterError>,
        plain: impl AsyncFnOnce() -> Result<T, MasterError>,
    ) -> Result<(T, bool), StoreError> {
        let state = self.inner.exist_pins.load(Ordering::Relaxed);
        if state != REFUSED && self.pins_served() {
            let release = if state == SERVED {
                self.take_finished_reads()
            } else {
                Vec::new()
            };
            match pinned(release).await {
                Err(e) if e.code() == ErrorCode::NOT_SUPPORTED => {
                    self.inner.exist_pins.store(REFUSED, Ordering::Relaxed);
                }
                Ok(answer) => {
                    self.inner.exist_pins.store(SERVED, Ordering::Relaxed);
                    return Ok((answer, true));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok((plain().await?, false))
    }

    /// Holds the keys a pinned existence check found, for the next lookup to release.
    pub(super) fn hold_exists<'k>(&self, keys: impl IntoIterator<Item = &'k str>) {
        let mut held = self.inner.held_exists.lock();
        held.extend(keys.into_iter().map(str::to_string));
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
