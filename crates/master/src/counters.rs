//! Monotonic counters of events only the core sees (upstream's `master_put_start_*_cnt`, inline
//! eviction), read by the server's `/metrics`. A component: plain atomics, never names `MasterService`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic event counters kept by the core (upstream's `master_put_start_*_cnt`).
#[derive(Debug, Default)]
pub struct MasterCounters {
    /// Unfinished puts whose buffers were moved to the discarded list (pre-empted by a newer
    /// PutStart or UpsertStart, or reaped by the put timeout).
    put_start_discards: AtomicU64,
    /// Discarded puts whose buffers were freed at their release time.
    put_start_releases: AtomicU64,
    /// PutStarts that ran inline eviction (found no space where a segment could hold the value).
    inline_evictions: AtomicU64,
    /// Of those, the ones that evicted at least one object.
    inline_evictions_done: AtomicU64,
    /// Objects and bytes inline eviction took.
    inline_evicted_objects: AtomicU64,
    inline_evicted_bytes: AtomicU64,
    /// Bytes tenant-scoped eviction (a quota deficit) freed, per tenant name.
    tenant_evicted_bytes: parking_lot::Mutex<BTreeMap<String, u64>>,
}

impl MasterCounters {
    pub(crate) fn count_discard(&self) {
        self.put_start_discards.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_releases(&self, puts: usize) {
        self.put_start_releases
            .fetch_add(puts as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_inline_eviction(&self, objects: usize, bytes: u64) {
        self.inline_evictions.fetch_add(1, Ordering::Relaxed);
        if objects > 0 {
            self.inline_evictions_done.fetch_add(1, Ordering::Relaxed);
            self.inline_evicted_objects
                .fetch_add(objects as u64, Ordering::Relaxed);
            self.inline_evicted_bytes
                .fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub(crate) fn count_tenant_eviction(&self, tenant: &str, bytes: u64) {
        if bytes > 0 {
            *self
                .tenant_evicted_bytes
                .lock()
                .entry(tenant.to_string())
                .or_default() += bytes;
        }
    }

    /// Bytes freed by tenant-scoped eviction, per tenant that had some (upstream's
    /// `mooncake_tenant_evict_bytes_total{tenant_id}`).
    pub fn tenant_evicted_bytes(&self) -> Vec<(String, u64)> {
        self.tenant_evicted_bytes
            .lock()
            .iter()
            .map(|(t, b)| (t.clone(), *b))
            .collect()
    }

    /// Inline evictions run (PutStarts that found no space, counted once each, whatever they
    /// freed).
    pub fn inline_evictions(&self) -> u64 {
        self.inline_evictions.load(Ordering::Relaxed)
    }

    /// Inline evictions that evicted at least one object.
    pub fn inline_evictions_done(&self) -> u64 {
        self.inline_evictions_done.load(Ordering::Relaxed)
    }

    pub fn inline_evicted_objects(&self) -> u64 {
        self.inline_evicted_objects.load(Ordering::Relaxed)
    }

    pub fn inline_evicted_bytes(&self) -> u64 {
        self.inline_evicted_bytes.load(Ordering::Relaxed)
    }

    pub fn put_start_discards(&self) -> u64 {
        self.put_start_discards.load(Ordering::Relaxed)
    }

    pub fn put_start_releases(&self) -> u64 {
        self.put_start_releases.load(Ordering::Relaxed)
    }
}
