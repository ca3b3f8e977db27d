//! Reads: GetReplicaList (+ batch, + regex), ExistKey (+ batch), GetAllKeys, and the lease they
//! grant (as upstream's master). Reads take shard **read** locks only; the lease and last-access
//! time are atomics, so concurrent readers of one shard never wait for each other.

use std::collections::HashMap;

use mooncake_common::{ErrorCode, GetReplicaListResponse, ReplicaDescriptor, ReplicaStatus};
use regex::Regex;

use crate::handle::{MasterService, MAX_REGEX_COMPILED_BYTES, MAX_REGEX_LEN_BYTES};
use crate::index::{shard_of, Tenant, TenantState, SHARD_COUNT};
use crate::object::{ObjectEntry, ObjectInfo, ObjectMetadata, Replica};

impl MasterService {
    /// Compiles a key pattern (searched anywhere in the key). Bad or oversized → INVALID_PARAMS.
    pub(crate) fn compile_pattern(pattern: &str) -> Result<Regex, ErrorCode> {
        if pattern.len() > MAX_REGEX_LEN_BYTES {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        regex::RegexBuilder::new(pattern)
            .size_limit(MAX_REGEX_COMPILED_BYTES)
            .build()
            .map_err(|_| ErrorCode::INVALID_PARAMS)
    }

    /// The readable descriptors of an object, or the read error. No lease.
    pub(crate) fn readable(meta: &ObjectMetadata) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let mut out = Vec::with_capacity(meta.replicas.len());
        let mut valid = false;
        let mut all_removed = true;
        for r in &meta.replicas {
            valid |= r.is_valid();
            all_removed &= r.status == ReplicaStatus::REMOVED;
            if r.is_complete() && !r.unverified {
                if let Some(d) = r.descriptor(meta.size) {
                    out.push(d);
                }
            }
        }
        if !valid || meta.size == 0 {
            return Err(ErrorCode::OBJECT_NOT_FOUND);
        }
        if out.is_empty() {
            return Err(if all_removed {
                ErrorCode::OBJECT_NOT_FOUND
            } else {
                ErrorCode::REPLICA_IS_NOT_READY
            });
        }
        Ok(out)
    }

    pub(crate) fn has_readable(meta: &ObjectMetadata) -> bool {
        meta.size > 0 && meta.replicas.iter().any(Replica::is_readable)
    }

    /// Grants the read lease and refreshes the last access. A grouped object shares its lease:
    /// when the accessed member's lease is under half the TTL, every member of its group (all in
    /// this shard) is leased too.
    fn grant_read(&self, state: Option<&TenantState>, entry: &ObjectEntry, now_ms: u64) {
        let ttl = self.config.default_kv_lease_ttl_ms;
        if let (Some(group), Some(state)) = (entry.meta.group(), state) {
            if entry.meta.lease_timeout_ms() < now_ms.saturating_add(ttl / 2) {
                for member in state.objects.iter() {
                    if member.meta.group() == Some(group) {
                        member.meta.grant_lease(now_ms, ttl);
                    }
                }
            }
        }
        entry.meta.grant_lease(now_ms, ttl);
        entry.meta.touch(now_ms);
    }

    fn get_entry(
        &self,
        state: Option<&TenantState>,
        entry: &ObjectEntry,
        now_ms: u64,
    ) -> Result<GetReplicaListResponse, ErrorCode> {
        let replicas = Self::readable(&entry.meta)?;
        let ttl = self.config.default_kv_lease_ttl_ms;
        self.grant_read(state, entry, now_ms);
        Ok(GetReplicaListResponse {
            replicas,
            lease_ttl_ms: ttl,
            object_checksum: entry.meta.checksum(),
        })
    }

    fn exist_entry(&self, state: Option<&TenantState>, entry: &ObjectEntry, now_ms: u64) -> bool {
        let found = Self::has_readable(&entry.meta);
        if found {
            self.grant_read(state, entry, now_ms);
        }
        found
    }

    /// GetReplicaList: the COMPLETE, live replicas plus the lease length, and grants the read
    /// lease. OBJECT_NOT_FOUND if missing or invalid; REPLICA_IS_NOT_READY while no replica is
    /// COMPLETE (a put in flight is never visible).
    pub fn get_replica_list(
        &self,
        key: &str,
        tenant: &str,
    ) -> Result<GetReplicaListResponse, ErrorCode> {
        self.read_entry(key, tenant, |state, entry| {
            self.get_entry(state, entry, self.clock.now_ms())
        })
    }

    /// Runs `f` on the entry of `key` (with its tenant's state) under the shard's read lock:
    /// the lookup every single-key read shares. OBJECT_NOT_FOUND if the key is absent; an
    /// unknown tenant's error as [`MasterService::resolve_tenant`] gives it.
    pub(crate) fn read_entry<R>(
        &self,
        key: &str,
        tenant: &str,
        f: impl FnOnce(Option<&TenantState>, &ObjectEntry) -> Result<R, ErrorCode>,
    ) -> Result<R, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let shard = self.index.shard(hash).read();
        let state = shard.tenant(tenant);
        let entry = state
            .and_then(|s| s.find(hash, key))
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        f(state, entry)
    }

    /// Input indices bucketed by shard, in visiting order: from a random shard walking downward
    /// (mod 1024), so concurrent batches do not all queue on shard 0. Each element is
    /// `(rank << 32 | input index, hash)`: one integer to sort by (a batch's sort was a tenth of
    /// the master's CPU under batch_is_exist with tuple keys).
    fn by_shard(&self, tenant: Tenant<'_>, keys: &[String]) -> Vec<(u64, u64)> {
        // A single key needs no spreading (and no draw).
        let start = if keys.len() > 1 {
            self.rng.below(SHARD_COUNT)
        } else {
            0
        };
        let mut order: Vec<(u64, u64)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let hash = self.route(tenant, k);
                let rank = (start + SHARD_COUNT - shard_of(hash)) % SHARD_COUNT;
                ((rank as u64) << 32 | i as u64, hash)
            })
            .collect();
        order.sort_unstable_by_key(|&(position, _)| position);
        order
    }

    /// Runs `f` on every key's entry (or `None`), locking each involved shard once for reading.
    pub(crate) fn for_each_by_shard(
        &self,
        tenant: Tenant<'_>,
        keys: &[String],
        mut f: impl FnMut(usize, Option<&TenantState>, Option<&ObjectEntry>),
    ) {
        let order = self.by_shard(tenant, keys);
        let mut i = 0;
        while i < order.len() {
            let shard_index = shard_of(order[i].1);
            let shard = self.index.shard_at(shard_index).read();
            let state = shard.tenant(tenant);
            while i < order.len() && shard_of(order[i].1) == shard_index {
                let (position, hash) = order[i];
                let idx = (position & u64::from(u32::MAX)) as usize;
                f(idx, state, state.and_then(|s| s.find(hash, &keys[idx])));
                i += 1;
            }
        }
    }

    /// BatchGetReplicaList: GetReplicaList per key (one result per key, in input order), each
    /// shard locked once. An invalid tenant fails every key with INVALID_PARAMS.
    pub fn batch_get_replica_list(
        &self,
        keys: &[String],
        tenant: &str,
    ) -> Vec<Result<GetReplicaListResponse, ErrorCode>> {
        let tenant = match self.resolve_tenant(tenant) {
            Ok(t) => t,
            Err(code) => return vec![Err(code); keys.len()],
        };
        self.batch_lookup(tenant, keys, |state, entry, now| {
            self.get_entry(state, entry, now)
        })
    }

    /// `get` on every key's entry (in input order, each shard locked once); a missing key is
    /// OBJECT_NOT_FOUND.
    pub(crate) fn batch_lookup(
        &self,
        tenant: Tenant<'_>,
        keys: &[String],
        mut get: impl FnMut(
            Option<&TenantState>,
            &ObjectEntry,
            u64,
        ) -> Result<GetReplicaListResponse, ErrorCode>,
    ) -> Vec<Result<GetReplicaListResponse, ErrorCode>> {
        let now = self.clock.now_ms();
        let mut out = vec![Err(ErrorCode::OBJECT_NOT_FOUND); keys.len()];
        self.for_each_by_shard(tenant, keys, |i, state, entry| {
            if let Some(entry) = entry {
                out[i] = get(state, entry, now);
            }
        });
        out
    }

    /// ExistKey: true iff the object has a readable replica; true grants the read lease (as
    /// upstream: it protects the load that follows). A missing key is `Ok(false)`.
    pub fn exist_key(&self, key: &str, tenant: &str) -> Result<bool, ErrorCode> {
        match self.read_entry(key, tenant, |state, entry| {
            Ok(self.exist_entry(state, entry, self.clock.now_ms()))
        }) {
            Err(ErrorCode::OBJECT_NOT_FOUND) => Ok(false),
            other => other,
        }
    }

    /// BatchExistKey: ExistKey per key, in input order, each shard locked once.
    pub fn batch_exist_key(&self, keys: &[String], tenant: &str) -> Vec<Result<bool, ErrorCode>> {
        self.batch_exist_with(keys, tenant, |state, entry, now| {
            self.exist_entry(state, entry, now)
        })
    }

    /// `exist` on every key's entry (in input order, each shard locked once); a missing key is
    /// `Ok(false)`, an unknown tenant fails every key.
    pub(crate) fn batch_exist_with(
        &self,
        keys: &[String],
        tenant: &str,
        mut exist: impl FnMut(Option<&TenantState>, &ObjectEntry, u64) -> bool,
    ) -> Vec<Result<bool, ErrorCode>> {
        let tenant = match self.resolve_tenant(tenant) {
            Ok(t) => t,
            Err(code) => return vec![Err(code); keys.len()],
        };
        let now = self.clock.now_ms();
        let mut out = vec![Ok(false); keys.len()];
        self.for_each_by_shard(tenant, keys, |i, state, entry| {
            out[i] = Ok(entry.is_some_and(|e| exist(state, e, now)));
        });
        out
    }

    /// GetReplicaListByRegex: every key of the tenant matching `pattern` (searched anywhere in
    /// the key; Rust `regex` syntax, not ECMAScript) that has a readable replica, with its
    /// descriptors; each match is leased. Bad pattern → INVALID_PARAMS.
    pub fn get_replica_list_by_regex(
        &self,
        pattern: &str,
        tenant: &str,
    ) -> Result<HashMap<String, Vec<ReplicaDescriptor>>, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let re = Self::compile_pattern(pattern)?;
        let now = self.clock.now_ms();
        let mut out = HashMap::new();
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            let Some(state) = shard.tenant(tenant) else {
                continue;
            };
            for entry in state.objects.iter() {
                if !re.is_match(&entry.key) {
                    continue;
                }
                if let Ok(resp) = self.get_entry(Some(state), entry, now) {
                    out.insert(entry.key.to_string(), resp.replicas);
                }
            }
        }
        Ok(out)
    }

    /// GetAllKeys (HTTP admin): the tenant's keys that have a readable replica, sorted. No lease.
    pub fn get_all_keys(&self, tenant: &str) -> Result<Vec<String>, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let mut out = Vec::new();
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            let Some(state) = shard.tenant(tenant) else {
                continue;
            };
            out.extend(
                state
                    .objects
                    .iter()
                    .filter(|e| Self::has_readable(&e.meta))
                    .map(|e| e.key.to_string()),
            );
        }
        out.sort_unstable();
        Ok(out)
    }

    /// A read-only view of one object (admin and tests); no lease, no cleanup. `None` if absent.
    pub fn object_info(&self, key: &str, tenant: &str) -> Result<Option<ObjectInfo>, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let shard = self.index.shard(hash).read();
        Ok(shard
            .tenant(tenant)
            .and_then(|s| s.find(hash, key))
            .map(ObjectInfo::of))
    }

    /// The descriptors an object has, readable or not, without lease (admin and tests).
    pub fn all_replica_descriptors(
        &self,
        key: &str,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.read_entry(key, tenant, |_, entry| {
            Ok(entry
                .meta
                .replicas
                .iter()
                .filter_map(|r: &Replica| r.descriptor(entry.meta.size))
                .collect())
        })
    }
}
