//! Group routing (as upstream's groups): a key put with a group id lives in the shard of
//! its group, and this index (scoped key → group hash) tells every key-based call where to look.
//!
//! Invariant, kept by PutStart/UpsertStart under the key's stripe lock: a key with a route lives
//! (if at all) in its group's shard; a key without one lives in its own shard. A route whose
//! object is gone is harmless (lookups there find nothing); it is replaced or dropped by the next
//! start of that key, or collected by [`Routes::collect_stale`].

use hashbrown::HashTable;
use mooncake_common::TenantId;
use parking_lot::RwLock;

use crate::index::{key_hash, routed, Index, Tenant};

/// One grouped key's route.
#[derive(Debug)]
struct Route {
    tenant: Option<TenantId>,
    key: Box<str>,
    group_hash: u64,
}

impl Route {
    fn matches(&self, tenant: Tenant<'_>, key: &str) -> bool {
        &*self.key == key
            && match (tenant, &self.tenant) {
                (Tenant::Default, None) => true,
                (Tenant::Named(t), Some(id)) => id.as_str() == t,
                _ => false,
            }
    }
}

/// The group routing index (scoped key → group shard), consulted before every key lookup (see
/// the module doc for its invariant).
#[derive(Debug, Default)]
pub(crate) struct Routes {
    table: RwLock<HashTable<Route>>,
    len: std::sync::atomic::AtomicUsize,
}

impl Routes {
    /// The group hash `key` is routed by, if any. Lock-free when no key is grouped.
    pub fn lookup(&self, tenant: Tenant<'_>, key: &str, hash: u64) -> Option<u64> {
        if self.len.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        self.table
            .read()
            .find(hash, |r| r.matches(tenant, key))
            .map(|r| r.group_hash)
    }

    /// Sets (`Some`) or drops (`None`) the route of `key`.
    pub fn set(&self, tenant: Tenant<'_>, key: &str, hash: u64, group: Option<u64>) {
        let mut table = self.table.write();
        let found = table.find_entry(hash, |r| r.matches(tenant, key));
        match (found, group) {
            (Ok(mut e), Some(g)) => e.get_mut().group_hash = g,
            (Ok(e), None) => {
                e.remove();
            }
            (Err(_), Some(g)) => {
                let tenant_id = tenant.id();
                table.insert_unique(
                    hash,
                    Route {
                        tenant: tenant_id,
                        key: Box::from(key),
                        group_hash: g,
                    },
                    |r| key_hash(Tenant::of(r.tenant.as_ref()), &r.key),
                );
            }
            (Err(_), None) => {}
        }
        self.len
            .store(table.len(), std::sync::atomic::Ordering::Release);
    }

    pub fn len(&self) -> usize {
        self.len.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every route's `(tenant, key)` (for the stale-route collector).
    fn keys(&self) -> Vec<(Option<TenantId>, Box<str>)> {
        self.table
            .read()
            .iter()
            .map(|r| (r.tenant.clone(), r.key.clone()))
            .collect()
    }

    /// Drops the routes of keys whose object is gone from `index`, each under the key's stripe
    /// so that a concurrent start of the key cannot be cut off from its route. Returns how many
    /// were dropped. Cheap when no key is grouped.
    pub fn collect_stale(&self, index: &Index) -> usize {
        if self.len() == 0 {
            return 0;
        }
        let mut dropped = 0;
        for (tenant_id, key) in self.keys() {
            let tenant = Tenant::of(tenant_id.as_ref());
            let own = key_hash(tenant, &key);
            let _stripe = index.stripe(own).lock();
            let Some(g) = self.lookup(tenant, &key, own) else {
                continue;
            };
            let hash = routed(own, g);
            let present = index
                .shard(hash)
                .read()
                .tenant(tenant)
                .and_then(|s| s.find(hash, &key))
                .is_some();
            if !present {
                self.set(tenant, &key, own, None);
                dropped += 1;
            }
        }
        dropped
    }
}
