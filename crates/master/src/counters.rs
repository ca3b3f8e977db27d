//! Monotonic counters of events only the core sees (upstream's `master_put_start_*_cnt`), read
//! by the server's `/metrics`. A component: plain atomics, never names `MasterService`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic event counters kept by the core (upstream's `master_put_start_*_cnt`).
#[derive(Debug, Default)]
pub struct MasterCounters {
    /// Unfinished puts whose buffers were moved to the discarded list (pre-empted by a newer
    /// PutStart or UpsertStart, or reaped by the put timeout).
    put_start_discards: AtomicU64,
    /// Discarded puts whose buffers were freed at their release time.
    put_start_releases: AtomicU64,
}

impl MasterCounters {
    pub(crate) fn count_discard(&self) {
        self.put_start_discards.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_releases(&self, puts: usize) {
        self.put_start_releases
            .fetch_add(puts as u64, Ordering::Relaxed);
    }

    pub fn put_start_discards(&self) -> u64 {
        self.put_start_discards.load(Ordering::Relaxed)
    }

    pub fn put_start_releases(&self) -> u64 {
        self.put_start_releases.load(Ordering::Relaxed)
    }
}
