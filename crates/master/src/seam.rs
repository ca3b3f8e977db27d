//! The write seam: where every change to the index becomes a [`Mutation`] for the observer.
//!
//! Key-based writes go through [`MasterService::edit_entry`] (or its `edit_live_entry` /
//! `edit_written_entry` forms, which first drop dead replicas, erase an entry left without a valid
//! replica and check the writer): the closure changes the entry and says what it did in an
//! [`Edit`]; the helper then erases the entry if asked or if nothing valid is left (dropping the
//! tenant's empty state), emits `Object` or `Erase` under the shard write lock, and only then moves
//! taken replicas to the discarded list or frees them. Sweeps that walk whole shards call
//! [`MasterService::emit_swept`] inside their `retain` closure, before an erased entry is dropped.
//!
//! **Emit before free.** A buffer freed before its change is observed could be re-allocated by
//! another key and that key's record observed first; a replayed master would then see the range
//! claimed twice. So every live replica leaves an object through `extract_replicas` and is kept
//! alive until the emission (or moved to the discarded list, whose emission is under its lock).
//!
//! **Segments.** A record lists a memory replica only while its segment is mounted and alive,
//! judged under the segment manager's read lock held across building and observing the record.
//! An unmount emits `SegmentUnmounted` under the write lock, so a record is observed either before
//! it (with the replica) or after it (without).
//!
//! Without an observer every emission is one predictable branch: no record is built, no lock
//! taken.

use mooncake_common::{ClientId, ErrorCode};

use crate::handle::MasterService;
use crate::index::{Shard, Tenant};
use crate::mutation::{Mutation, MutationObserver, ObjectRecord};
use crate::object::{ObjectEntry, ObjectMetadata, Removed};

/// What a write did to one entry; filled in by the closure given to [`MasterService::edit_entry`].
#[derive(Debug, Default)]
pub(crate) struct Edit {
    changed: bool,
    erase: bool,
    /// Replicas taken out, freed after the change is observed.
    freed: Removed,
    /// Replicas taken out to be discarded until `discard_at_ms`, after the change is observed.
    discarded: Removed,
    discard_at_ms: u64,
}

impl Edit {
    /// The entry's durable state changed (its record must be observed).
    pub fn changed(&mut self) {
        self.changed = true;
    }

    /// The entry must be erased.
    pub fn erase(&mut self) {
        self.erase = true;
    }

    /// Replicas taken out of the entry, to be freed once the change is observed.
    pub fn free(&mut self, replicas: Removed) {
        if !replicas.is_empty() {
            self.changed = true;
            self.freed.extend(replicas);
        }
    }

    /// Replicas taken out of the entry, to be kept on the discarded list until `release_at_ms`.
    pub fn discard(&mut self, replicas: Removed, release_at_ms: u64) {
        if !replicas.is_empty() {
            self.changed = true;
            self.discarded.extend(replicas);
            self.discard_at_ms = release_at_ms;
        }
    }
}

impl MasterService {
    /// The installed observer, if any (one load and a branch).
    #[inline]
    pub(crate) fn observer(&self) -> Option<&dyn MutationObserver> {
        self.observer.get().map(|o| &**o)
    }

    /// Observes a mutation built only when an observer is installed. Call it under the lock
    /// that serializes the change.
    #[inline]
    pub(crate) fn emit(&self, build: impl FnOnce() -> Mutation) {
        if let Some(o) = self.observer() {
            o.observe(&build());
        }
    }

    /// Observes the state of `entry` after a change: its record, or `Erase` when it has no valid
    /// replica. Call it under the entry's shard write lock, never under the segment manager's.
    #[inline]
    pub(crate) fn emit_entry(&self, tenant: Tenant<'_>, entry: &ObjectEntry) {
        if let Some(o) = self.observer() {
            self.observe_entry(o, tenant, entry);
        }
    }

    #[cold]
    fn observe_entry(&self, o: &dyn MutationObserver, tenant: Tenant<'_>, entry: &ObjectEntry) {
        let segs = self.segments.inner.read();
        let m = match ObjectRecord::of(tenant, entry, &|h| segs.live_segment_of(h)) {
            Some(record) => Mutation::Object(record),
            None => Mutation::Erase {
                tenant: tenant.id(),
                key: entry.key.to_string(),
            },
        };
        o.observe(&m);
    }

    /// Observes that `key` was erased. Call it under the shard write lock, before the erased
    /// entry is dropped.
    #[inline]
    pub(crate) fn emit_erase(&self, tenant: Tenant<'_>, key: &str) {
        self.emit(|| Mutation::Erase {
            tenant: tenant.id(),
            key: key.to_string(),
        });
    }

    /// For sweeps: inside a `retain` closure that changed `entry`, observe it kept (`keep`) or
    /// erased, before `retain` drops it.
    #[inline]
    pub(crate) fn emit_swept(&self, tenant: Tenant<'_>, entry: &ObjectEntry, keep: bool) {
        if keep {
            self.emit_entry(tenant, entry);
        } else {
            self.emit_erase(tenant, &entry.key);
        }
    }

    /// Runs `f` on the entry of `key` in a write-locked shard (`None` when absent), then: erases
    /// it if `f` asked or nothing valid is left (and drops the tenant's state once empty), emits
    /// the change, and moves or frees the replicas `f` took out. See the module doc.
    pub(crate) fn edit_entry<R>(
        &self,
        shard: &mut Shard,
        tenant: Tenant<'_>,
        hash: u64,
        key: &str,
        f: impl FnOnce(&mut ObjectMetadata, &mut Edit) -> R,
    ) -> Option<R> {
        let state = shard.tenant_mut(tenant)?;
        let Ok(mut slot) = state
            .objects
            .find_entry(hash, |e| e.key.as_bytes() == key.as_bytes())
        else {
            return None;
        };
        let mut edit = Edit::default();
        let out = f(&mut slot.get_mut().meta, &mut edit);
        if edit.erase || !slot.get().meta.is_valid() {
            let (entry, _) = slot.remove();
            self.emit_erase(tenant, key);
            drop(entry);
            shard.drop_tenant_if_empty(tenant);
        } else if edit.changed {
            self.emit_entry(tenant, slot.get());
        }
        if !edit.discarded.is_empty() {
            self.discard(std::mem::take(&mut edit.discarded), edit.discard_at_ms);
        }
        drop(edit);
        Some(out)
    }

    /// [`MasterService::edit_entry`] on a live entry: missing → OBJECT_NOT_FOUND; replicas on dead
    /// segments are dropped first, and an entry left without a valid replica is erased →
    /// OBJECT_NOT_FOUND.
    pub(crate) fn edit_live_entry<R>(
        &self,
        shard: &mut Shard,
        tenant: Tenant<'_>,
        hash: u64,
        key: &str,
        f: impl FnOnce(&mut ObjectMetadata, &mut Edit) -> Result<R, ErrorCode>,
    ) -> Result<R, ErrorCode> {
        self.edit_entry(shard, tenant, hash, key, |meta, edit| {
            meta.drop_dead_replicas();
            if !meta.is_valid() {
                return Err(ErrorCode::OBJECT_NOT_FOUND);
            }
            f(meta, edit)
        })
        .unwrap_or(Err(ErrorCode::OBJECT_NOT_FOUND))
    }

    /// [`MasterService::edit_live_entry`] for the writer's calls: another client →
    /// ILLEGAL_CLIENT.
    pub(crate) fn edit_written_entry<R>(
        &self,
        shard: &mut Shard,
        tenant: Tenant<'_>,
        hash: u64,
        key: &str,
        client: ClientId,
        f: impl FnOnce(&mut ObjectMetadata, &mut Edit) -> Result<R, ErrorCode>,
    ) -> Result<R, ErrorCode> {
        self.edit_live_entry(shard, tenant, hash, key, |meta, edit| {
            if !meta.writer.is(client) {
                return Err(ErrorCode::ILLEGAL_CLIENT);
            }
            f(meta, edit)
        })
    }
}
