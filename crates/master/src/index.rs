//! The sharded object index (as upstream's master).
//!
//! 1024 shards, each an `RwLock` over `tenant → key → object`, plus 4096 stripe mutexes that
//! serialize PutStart on one key. One 64-bit hash of `(tenant, key)` routes everything: bits
//! 32..42 pick the shard, bits 42..54 the stripe, and the shard's hash table uses the low bits and
//! the top 7 — disjoint bit ranges, so keys that share a shard still spread over its table.
//! The default tenant hashes the key alone. Tests must not depend on exact hash values.
//! Group routing (a grouped key lives in its group's shard) is `routes.rs`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use hashbrown::HashTable;
use mooncake_common::TenantId;
use parking_lot::{Mutex, RwLock};

use crate::object::ObjectEntry;

/// Number of metadata shards.
pub const SHARD_COUNT: usize = 1024;
/// Number of PutStart stripe mutexes.
pub const STRIPE_COUNT: usize = 4096;

const HASH_SEED: u64 = 0x6d6f_6f6e_6361_6b65; // "mooncake"

/// A resolved tenant, borrowed from the caller (no allocation on the read path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tenant<'a> {
    Default,
    Named(&'a str),
}

impl<'a> Tenant<'a> {
    /// The tenant an owned id names (`None` = the default tenant).
    pub fn of(id: Option<&'a TenantId>) -> Self {
        match id {
            Some(t) if !t.is_default() => Tenant::Named(t.as_str()),
            _ => Tenant::Default,
        }
    }

    /// The owned id (`None` for the default tenant). Allocates for a named tenant.
    pub fn id(self) -> Option<TenantId> {
        match self {
            Tenant::Default => None,
            Tenant::Named(t) => TenantId::new(t).ok(),
        }
    }

    /// The tenant's name (`default` for the default tenant).
    pub fn name(self) -> &'a str {
        match self {
            Tenant::Default => mooncake_common::DEFAULT_TENANT,
            Tenant::Named(t) => t,
        }
    }
}

/// The routing hash of `(tenant, key)`.
pub(crate) fn key_hash(tenant: Tenant<'_>, key: &str) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(HASH_SEED).build_hasher();
    if let Tenant::Named(t) = tenant {
        h.write(t.as_bytes());
        h.write_u8(0);
    }
    h.write(key.as_bytes());
    h.finish()
}

/// The routing bits of a hash (those `shard_of` reads).
const SHARD_BITS: u64 = ((SHARD_COUNT as u64) - 1) << 32;

/// The hash of a group id: a grouped key lives in `shard_of(group_hash(g))`, whatever its tenant.
pub(crate) fn group_hash(group: &str) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(HASH_SEED ^ 0x67).build_hasher();
    h.write(group.as_bytes());
    h.finish()
}

/// A key's hash with its shard bits taken from its group: the shard becomes the group's, while
/// the stripe and the in-shard table bits stay the key's own.
pub(crate) fn routed(key_hash: u64, group_hash: u64) -> u64 {
    (key_hash & !SHARD_BITS) | (group_hash & SHARD_BITS)
}

pub(crate) fn shard_of(hash: u64) -> usize {
    ((hash >> 32) as usize) & (SHARD_COUNT - 1)
}

pub(crate) fn stripe_of(hash: u64) -> usize {
    ((hash >> 42) as usize) & (STRIPE_COUNT - 1)
}

/// The objects of one tenant in one shard.
#[derive(Debug, Default)]
pub(crate) struct TenantState {
    pub objects: HashTable<Box<ObjectEntry>>,
}

impl TenantState {
    pub fn find(&self, hash: u64, key: &str) -> Option<&ObjectEntry> {
        self.objects
            .find(hash, |e| e.key.as_bytes() == key.as_bytes())
            .map(|b| &**b)
    }

    pub fn remove(&mut self, hash: u64, key: &str) -> Option<Box<ObjectEntry>> {
        match self
            .objects
            .find_entry(hash, |e| e.key.as_bytes() == key.as_bytes())
        {
            Ok(occupied) => Some(occupied.remove().0),
            Err(_) => None,
        }
    }

    /// Inserts a key known to be absent; returns the inserted entry.
    pub fn insert(
        &mut self,
        tenant: Tenant<'_>,
        hash: u64,
        entry: Box<ObjectEntry>,
    ) -> &mut ObjectEntry {
        self.objects
            .insert_unique(hash, entry, |e| key_hash(tenant, &e.key))
            .into_mut()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Makes room for `additional` more entries of `tenant` (one rehash instead of several).
    pub fn reserve(&mut self, tenant: Tenant<'_>, additional: usize) {
        self.objects
            .reserve(additional, |e| key_hash(tenant, &e.key));
    }

    /// A prefetch plan for one walk over this table: the entries' addresses in iteration order
    /// (`iter` and `retain` visit the table in the same order). Call [`Ahead::step`] once per
    /// visited entry: it asks the CPU to load the entry `AHEAD` places further, so the walk does
    /// not pay one memory round trip per boxed entry in sequence.
    pub fn ahead(&self) -> Ahead {
        let addrs: Vec<usize> = self
            .objects
            .iter()
            .map(|e| &**e as *const ObjectEntry as usize)
            .collect();
        for &a in addrs.iter().take(AHEAD) {
            prefetch(a);
        }
        Ahead { addrs, next: 0 }
    }
}

/// How many entries ahead a walk prefetches.
const AHEAD: usize = 8;

/// See [`TenantState::ahead`].
pub(crate) struct Ahead {
    addrs: Vec<usize>,
    next: usize,
}

impl Ahead {
    #[inline(always)]
    pub fn step(&mut self) {
        if let Some(&a) = self.addrs.get(self.next + AHEAD) {
            prefetch(a);
        }
        self.next += 1;
    }
}

/// Prefetch hint for the cache lines of one entry; no effect on program state.
#[inline(always)]
fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = addr as *const i8;
        // SAFETY: SSE is part of the x86_64 baseline, so the instruction exists; a prefetch
        // never faults (even on an address that is no longer mapped) and reads or writes
        // nothing observable; the addresses are those of a boxed entry (160 bytes).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// One shard: the default tenant inline (the common case costs no tenant lookup), others in a map.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    pub default: TenantState,
    pub others: HashMap<TenantId, TenantState, foldhash::fast::RandomState>,
}

impl Shard {
    pub fn tenant(&self, tenant: Tenant<'_>) -> Option<&TenantState> {
        match tenant {
            Tenant::Default => Some(&self.default),
            Tenant::Named(t) => self.others.get(t),
        }
    }

    pub fn tenant_mut(&mut self, tenant: Tenant<'_>) -> Option<&mut TenantState> {
        match tenant {
            Tenant::Default => Some(&mut self.default),
            Tenant::Named(t) => self.others.get_mut(t),
        }
    }

    /// The tenant's state, created if absent. Fails only for a name `TenantId` refuses, which
    /// callers have already validated.
    pub fn tenant_or_insert(&mut self, tenant: Tenant<'_>) -> &mut TenantState {
        match tenant {
            Tenant::Default => &mut self.default,
            Tenant::Named(t) => {
                if !self.others.contains_key(t) {
                    let id = TenantId::new(t).unwrap_or_default();
                    self.others.insert(id, TenantState::default());
                }
                self.others.get_mut(t).unwrap_or(&mut self.default)
            }
        }
    }

    /// Drops a named tenant's state once it holds nothing.
    pub fn drop_tenant_if_empty(&mut self, tenant: Tenant<'_>) {
        if let Tenant::Named(t) = tenant {
            if self.others.get(t).is_some_and(|s| s.len() == 0) {
                self.others.remove(t);
            }
        }
    }

    /// Every tenant state with its resolved name.
    pub fn tenants_mut(&mut self) -> impl Iterator<Item = (Tenant<'_>, &mut TenantState)> {
        std::iter::once((Tenant::Default, &mut self.default)).chain(
            self.others
                .iter_mut()
                .map(|(k, v)| (Tenant::Named(k.as_str()), v)),
        )
    }

    pub fn tenants(&self) -> impl Iterator<Item = (Tenant<'_>, &TenantState)> {
        std::iter::once((Tenant::Default, &self.default)).chain(
            self.others
                .iter()
                .map(|(k, v)| (Tenant::Named(k.as_str()), v)),
        )
    }
}

/// A shard lock alone on its cache line(s), so that neighbouring shards don't false-share.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct PaddedShard(pub RwLock<Shard>);

/// The whole index.
#[derive(Debug)]
pub(crate) struct Index {
    shards: Box<[PaddedShard]>,
    stripes: Box<[Mutex<()>]>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            shards: (0..SHARD_COUNT).map(|_| PaddedShard::default()).collect(),
            stripes: (0..STRIPE_COUNT).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl Index {
    pub fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[shard_of(hash)].0
    }

    pub fn shard_at(&self, index: usize) -> &RwLock<Shard> {
        &self.shards[index].0
    }

    pub fn stripe(&self, hash: u64) -> &Mutex<()> {
        &self.stripes[stripe_of(hash)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_changes_the_hash_and_routing_bits_are_disjoint() {
        let a = key_hash(Tenant::Default, "k");
        let b = key_hash(Tenant::Named("t"), "k");
        assert_ne!(a, b);
        assert_eq!(
            a,
            key_hash(Tenant::Default, "k"),
            "routing must be deterministic"
        );
        assert!(shard_of(u64::MAX) < SHARD_COUNT && stripe_of(u64::MAX) < STRIPE_COUNT);
    }

    #[test]
    fn keys_spread_over_shards() {
        let mut used = std::collections::HashSet::new();
        for i in 0..20_000 {
            used.insert(shard_of(key_hash(Tenant::Default, &format!("key-{i}"))));
        }
        assert!(used.len() > 1000, "only {} shards used", used.len());
    }
}
