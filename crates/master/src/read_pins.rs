//! Read pins (not upstream's): the protection of a read that our client completes and then
//! releases (RPC methods 50–52), instead of the full read lease (docs/master.md "Read pins").
//!
//! A pinned read answers as GetReplicaList but, instead of raising the lease to `now + ttl`,
//! raises the object's reader count; the client releases it once its transfer is over, batched
//! (piggybacked on its next pinned read, or sent on its own with the heartbeat). Eviction and
//! Remove treat a held pin as a lease. A pin that is never released (the client died) lapses
//! between one and one and a half lease TTLs after the object's last pin ([`ReadEpoch`]).
//! The pinned forms of ExistKey (methods 54–55) protect a hit the same way until the caller's
//! next lookup, which carries the release. Descriptor readers (GetReplicaList) and upstream's
//! ExistKey keep the full lease.

use mooncake_common::{ErrorCode, GetReplicaListResponse};

use crate::handle::MasterService;
use crate::object::{ObjectEntry, ReadEpoch};

impl MasterService {
    /// The read-pin epoch of `now_ms`.
    pub(crate) fn read_epoch(&self, now_ms: u64) -> ReadEpoch {
        ReadEpoch::at(now_ms, self.config.default_kv_lease_ttl_ms)
    }

    fn pin_entry(
        &self,
        entry: &ObjectEntry,
        now_ms: u64,
        at: ReadEpoch,
    ) -> Result<GetReplicaListResponse, ErrorCode> {
        let replicas = Self::readable(&entry.meta)?;
        entry.meta.pin_read(at);
        entry.meta.touch(now_ms);
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: self.config.default_kv_lease_ttl_ms,
            object_checksum: entry.meta.checksum(),
        })
    }

    /// GetReplicaList for a read the caller completes and then releases with
    /// [`MasterService::release_reads`]: the same answer and errors, a read pin instead of the
    /// lease. The answer's `lease_ttl_ms` is the time the pin is sure to hold unreleased.
    pub fn get_replica_list_pinned(
        &self,
        key: &str,
        tenant: &str,
    ) -> Result<GetReplicaListResponse, ErrorCode> {
        self.read_entry(key, tenant, |_, entry| {
            let now = self.clock.now_ms();
            self.pin_entry(entry, now, self.read_epoch(now))
        })
    }

    /// BatchGetReplicaList with read pins ([`MasterService::get_replica_list_pinned`] per key, in
    /// input order, each shard locked once).
    pub fn batch_get_replica_list_pinned(
        &self,
        keys: &[String],
        tenant: &str,
    ) -> Vec<Result<GetReplicaListResponse, ErrorCode>> {
        let tenant = match self.resolve_tenant(tenant) {
            Ok(t) => t,
            Err(code) => return vec![Err(code); keys.len()],
        };
        let at = self.read_epoch(self.clock.now_ms());
        self.batch_lookup(tenant, keys, |_, entry, now| self.pin_entry(entry, now, at))
    }

    /// Whether the entry is readable; a hit takes a read pin (and counts as an access).
    fn exist_pinned_entry(entry: &ObjectEntry, now_ms: u64, at: ReadEpoch) -> bool {
        let found = Self::has_readable(&entry.meta);
        if found {
            entry.meta.pin_read(at);
            entry.meta.touch(now_ms);
        }
        found
    }

    /// ExistKey for a lookup whose load follows: the same answer, but a hit takes a read pin
    /// (released by the caller with its next lookup, the lease TTL as the backstop) instead of
    /// the read lease. A missing key is `Ok(false)`.
    pub fn exist_key_pinned(&self, key: &str, tenant: &str) -> Result<bool, ErrorCode> {
        match self.read_entry(key, tenant, |_, entry| {
            let now = self.clock.now_ms();
            Ok(Self::exist_pinned_entry(entry, now, self.read_epoch(now)))
        }) {
            Err(ErrorCode::OBJECT_NOT_FOUND) => Ok(false),
            other => other,
        }
    }

    /// BatchExistKey with read pins on the hits ([`MasterService::exist_key_pinned`] per key, in
    /// input order, each shard locked once).
    pub fn batch_exist_key_pinned(
        &self,
        keys: &[String],
        tenant: &str,
    ) -> Vec<Result<bool, ErrorCode>> {
        let at = self.read_epoch(self.clock.now_ms());
        self.batch_exist_with(keys, tenant, |_, entry, now| {
            Self::exist_pinned_entry(entry, now, at)
        })
    }

    /// Releases one read pin of each key (a key named twice, twice). Keys that are gone or hold
    /// no pin are skipped; an unknown tenant releases nothing. Returns the keys found.
    pub fn release_reads(&self, keys: &[String], tenant: &str) -> usize {
        let Ok(tenant) = self.resolve_tenant(tenant) else {
            return 0;
        };
        let at = self.read_epoch(self.clock.now_ms());
        let mut found = 0;
        self.for_each_by_shard(tenant, keys, |_, _, entry| {
            if let Some(entry) = entry {
                entry.meta.unpin_read(at);
                found += 1;
            }
        });
        found
    }
}
