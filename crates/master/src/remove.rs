//! Removals: Remove (+ batch, + regex), RemoveAll, BatchReplicaClear (as upstream's master).
//!
//! Every removal first drops replicas on dead segments (lazy cleanup); an object left invalid is
//! erased and reported as OBJECT_NOT_FOUND. Remove's checks, in upstream's order: missing →
//! OBJECT_NOT_FOUND; leased and not forced → OBJECT_HAS_LEASE; a replica not COMPLETE →
//! REPLICA_IS_NOT_READY, even when forced. Pins never block removal. Key calls go through the
//! write seam (`seam.rs`); the sweeps observe each erasure before dropping the entry.

use mooncake_common::{ClientId, ErrorCode};

use crate::handle::MasterService;
use crate::index::{shard_of, Shard, Tenant, SHARD_COUNT};
use crate::object::ObjectMetadata;

/// What to do with one object.
enum Verdict {
    Keep,
    Erase,
}

impl MasterService {
    /// Upstream's Remove checks; a held read pin counts as a lease (`read_pins.rs`).
    fn check_removable(
        &self,
        meta: &ObjectMetadata,
        now_ms: u64,
        force: bool,
    ) -> Result<(), ErrorCode> {
        if !force && (meta.is_leased(now_ms) || meta.is_read_pinned(self.read_epoch(now_ms))) {
            return Err(ErrorCode::OBJECT_HAS_LEASE);
        }
        if !meta.all_complete() {
            return Err(ErrorCode::REPLICA_IS_NOT_READY);
        }
        if meta.has_task() || meta.replicas.iter().any(|r| r.refcnt > 0) {
            return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK);
        }
        Ok(())
    }

    /// Remove's logic on one key of a write-locked shard.
    fn remove_in_shard(
        &self,
        shard: &mut Shard,
        tenant: Tenant<'_>,
        hash: u64,
        key: &str,
        now_ms: u64,
        force: bool,
    ) -> Result<(), ErrorCode> {
        self.edit_live_entry(shard, tenant, hash, key, |meta, edit| {
            self.check_removable(meta, now_ms, force)?;
            self.forget_disk_copies(tenant, key, meta);
            edit.erase();
            Ok(())
        })
    }

    /// Remove: erases the object and frees its buffers. See the module doc for the checks.
    pub fn remove(&self, key: &str, force: bool, tenant: &str) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        self.remove_in_shard(&mut shard, tenant, hash, key, self.clock.now_ms(), force)
    }

    /// Runs `f` per key with its shard write-locked, each shard locked once, keys grouped by
    /// shard; `f` gets the input index.
    fn for_each_key_locked(
        &self,
        tenant: Tenant<'_>,
        keys: &[String],
        mut f: impl FnMut(usize, &mut Shard, u64, &str),
    ) {
        let mut order: Vec<(usize, u32, u64)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let hash = self.route(tenant, k);
                (shard_of(hash), i as u32, hash)
            })
            .collect();
        order.sort_unstable_by_key(|&(s, i, _)| (s, i));
        let mut i = 0;
        while i < order.len() {
            let shard_index = order[i].0;
            let mut shard = self.index.shard_at(shard_index).write();
            while i < order.len() && order[i].0 == shard_index {
                let (_, idx, hash) = order[i];
                f(idx as usize, &mut shard, hash, &keys[idx as usize]);
                i += 1;
            }
        }
    }

    /// BatchRemove: Remove per key, one result per key in input order, each shard locked once.
    pub fn batch_remove(
        &self,
        keys: &[String],
        force: bool,
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        let tenant = match self.resolve_tenant(tenant) {
            Ok(t) => t,
            Err(code) => return vec![Err(code); keys.len()],
        };
        let now = self.clock.now_ms();
        let mut out = vec![Err(ErrorCode::OBJECT_NOT_FOUND); keys.len()];
        self.for_each_key_locked(tenant, keys, |i, shard, hash, key| {
            out[i] = self.remove_in_shard(shard, tenant, hash, key, now, force);
        });
        out
    }

    /// Walks the objects of `tenants` (all when `None`), erasing those `judge` condemns.
    /// Returns how many were erased by verdict (invalid objects are erased but not counted).
    fn sweep(
        &self,
        only: Option<Tenant<'_>>,
        mut judge: impl FnMut(&str, &mut ObjectMetadata) -> Verdict,
    ) -> i64 {
        let mut erased = 0i64;
        for i in 0..SHARD_COUNT {
            let mut shard = self.index.shard_at(i).write();
            for (tenant, state) in shard.tenants_mut() {
                if only.is_some_and(|t| t != tenant) {
                    continue;
                }
                state.objects.retain(|entry| {
                    entry.meta.drop_dead_replicas();
                    let keep = entry.meta.is_valid()
                        && match judge(&entry.key, &mut entry.meta) {
                            Verdict::Keep => true,
                            Verdict::Erase => {
                                self.forget_disk_copies(tenant, &entry.key, &entry.meta);
                                erased += 1;
                                false
                            }
                        };
                    if !keep {
                        self.emit_erase(tenant, &entry.key);
                    }
                    keep
                });
            }
            shard.others.retain(|_, s| s.len() > 0);
        }
        erased
    }

    /// RemoveByRegex: removes every key of the tenant matching `pattern` that passes Remove's
    /// checks (the others are skipped silently). Returns the count. Bad pattern → INVALID_PARAMS.
    pub fn remove_by_regex(
        &self,
        pattern: &str,
        force: bool,
        tenant: &str,
    ) -> Result<i64, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let re = Self::compile_pattern(pattern)?;
        let now = self.clock.now_ms();
        Ok(self.sweep(Some(tenant), |key, meta| {
            if re.is_match(key) && self.check_removable(meta, now, force).is_ok() {
                Verdict::Erase
            } else {
                Verdict::Keep
            }
        }))
    }

    /// RemoveAll: removes every object that passes Remove's checks, in one tenant, or in all
    /// tenants when `tenant` is empty. Returns the count (a plain number, as upstream); an
    /// invalid tenant removes nothing and returns 0.
    pub fn remove_all(&self, force: bool, tenant: &str) -> i64 {
        let only = if tenant.is_empty() {
            None
        } else {
            match self.resolve_tenant(tenant) {
                Ok(t) => Some(t),
                Err(_) => return 0,
            }
        };
        let now = self.clock.now_ms();
        self.sweep(only, |_, meta| {
            if self.check_removable(meta, now, force).is_ok() {
                Verdict::Erase
            } else {
                Verdict::Keep
            }
        })
    }

    /// BatchReplicaClear: for each key written by `client` whose lease has expired, with an
    /// empty `segment_name` erase the whole object (only if every replica is COMPLETE), otherwise
    /// erase its COMPLETE replicas on segments named `segment_name` (and the object if nothing
    /// valid remains). Returns the keys that were cleared, in input order; the rest are skipped
    /// silently.
    pub fn batch_replica_clear(
        &self,
        keys: &[String],
        client: ClientId,
        segment_name: &str,
        tenant: &str,
    ) -> Vec<String> {
        let Ok(tenant) = self.resolve_tenant(tenant) else {
            return Vec::new();
        };
        let now = self.clock.now_ms();
        let mut cleared = vec![false; keys.len()];
        self.for_each_key_locked(tenant, keys, |i, shard, hash, key| {
            let done = self.edit_live_entry(shard, tenant, hash, key, |meta, edit| {
                if !meta.writer.is(client)
                    || meta.is_leased(now)
                    || meta.is_read_pinned(self.read_epoch(now))
                    || meta.has_task()
                {
                    return Ok(false);
                }
                if segment_name.is_empty() {
                    if meta.all_complete() {
                        self.forget_disk_copies(tenant, key, meta);
                        edit.erase();
                        return Ok(true);
                    }
                    return Ok(false);
                }
                let gone = meta.extract_replicas(|r| {
                    r.is_complete()
                        && r.handle()
                            .and_then(|h| h.allocator())
                            .is_some_and(|a| &*a.info().name == segment_name)
                });
                let any = !gone.is_empty();
                edit.free(gone);
                Ok(any)
            });
            cleared[i] = done == Ok(true);
        });
        keys.iter()
            .zip(cleared)
            .filter(|(_, c)| *c)
            .map(|(k, _)| k.clone())
            .collect()
    }
}
