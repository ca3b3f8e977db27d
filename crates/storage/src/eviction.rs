//! Eviction order and watermark arithmetic shared by every backend.
//!
//! API (the log backend may reuse it):
//! - [`EvictionOrder<K>`]: tracks units of eviction (an object key, a bucket id, …) with their
//!   size. `insert(k, size)` on a write (a write counts as an access under both policies and moves
//!   `k` to the newest end), `touch(&k)` on a read (moves to the newest end under LRU, no-op under
//!   FIFO), `set_size(&k, size)` keeps the position, `remove(&k)`, `pop_victim()` returns the
//!   oldest `(k, size)` and forgets it, `iter_oldest_first()` lists in eviction order.
//!   O(log n) per operation; not thread-safe (wrap it in a lock).
//! - [`bytes_to_free`]: given the config, capacity, current use and incoming bytes, how many bytes
//!   eviction must free before the write (0 when under the high watermark), or `NoSpace` when the
//!   write cannot fit even into an empty store / when eviction is disabled and it does not fit.

use crate::backend::{EvictionConfig, EvictionPolicy, StorageError};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Eviction order of units `K` (oldest first) under FIFO or LRU.
#[derive(Debug)]
pub struct EvictionOrder<K> {
    policy: EvictionPolicy,
    next_tick: u64,
    by_tick: BTreeMap<u64, K>,
    entries: HashMap<K, (u64, u64)>,
    total_bytes: u64,
}

impl<K: Eq + Hash + Clone> EvictionOrder<K> {
    pub fn new(policy: EvictionPolicy) -> Self {
        EvictionOrder {
            policy,
            next_tick: 0,
            by_tick: BTreeMap::new(),
            entries: HashMap::new(),
            total_bytes: 0,
        }
    }

    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Records a write of `key` (newest end), replacing any previous entry.
    pub fn insert(&mut self, key: K, size_bytes: u64) {
        self.remove(&key);
        let tick = self.next_tick;
        self.next_tick += 1;
        self.by_tick.insert(tick, key.clone());
        self.entries.insert(key, (tick, size_bytes));
        self.total_bytes += size_bytes;
    }

    /// Records a read of `key`: LRU moves it to the newest end; FIFO ignores reads.
    pub fn touch(&mut self, key: &K) {
        if self.policy != EvictionPolicy::Lru {
            return;
        }
        if let Some((tick, size)) = self.entries.get(key).copied() {
            self.by_tick.remove(&tick);
            let new_tick = self.next_tick;
            self.next_tick += 1;
            self.by_tick.insert(new_tick, key.clone());
            self.entries.insert(key.clone(), (new_tick, size));
        }
    }

    /// Changes the size of `key` without moving it.
    pub fn set_size(&mut self, key: &K, size_bytes: u64) {
        if let Some(entry) = self.entries.get_mut(key) {
            self.total_bytes = self.total_bytes - entry.1 + size_bytes;
            entry.1 = size_bytes;
        }
    }

    /// Forgets `key`; returns its size.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        let (tick, size) = self.entries.remove(key)?;
        self.by_tick.remove(&tick);
        self.total_bytes -= size;
        Some(size)
    }

    /// Removes and returns the next victim (oldest write under FIFO, least recent access under LRU).
    pub fn pop_victim(&mut self) -> Option<(K, u64)> {
        let (_, key) = self.by_tick.pop_first()?;
        let (_, size) = self.entries.remove(&key)?;
        self.total_bytes -= size;
        Some((key, size))
    }

    /// Units in eviction order, oldest first.
    pub fn iter_oldest_first(&self) -> impl Iterator<Item = &K> + '_ {
        self.by_tick.values()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of the sizes of every tracked unit.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
}

/// Bytes eviction must free before writing `incoming_bytes` into a store holding `used_bytes` of
/// `capacity_bytes`. Above the high watermark, evict down to the low watermark (including the
/// incoming bytes); never more than `used_bytes`.
pub fn bytes_to_free(
    config: &EvictionConfig,
    capacity_bytes: u64,
    used_bytes: u64,
    incoming_bytes: u64,
) -> Result<u64, StorageError> {
    let after = used_bytes.saturating_add(incoming_bytes);
    let no_space = || StorageError::NoSpace {
        needed: incoming_bytes,
        available: capacity_bytes.saturating_sub(used_bytes),
    };
    if incoming_bytes > capacity_bytes {
        return Err(no_space());
    }
    if !config.enabled {
        return if after > capacity_bytes {
            Err(no_space())
        } else {
            Ok(0)
        };
    }
    let high = (capacity_bytes as f64 * config.high_watermark_ratio) as u64;
    if after <= high.max(1).min(capacity_bytes) && after <= capacity_bytes {
        return Ok(0);
    }
    let low = (capacity_bytes as f64 * config.low_watermark_ratio) as u64;
    let need = after
        .saturating_sub(low)
        .max(after.saturating_sub(capacity_bytes));
    Ok(need.min(used_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_ignores_reads_lru_does_not() {
        let mut fifo = EvictionOrder::new(EvictionPolicy::Fifo);
        let mut lru = EvictionOrder::new(EvictionPolicy::Lru);
        for k in ["a", "b", "c"] {
            fifo.insert(k, 1);
            lru.insert(k, 1);
        }
        fifo.touch(&"a");
        lru.touch(&"a");
        assert_eq!(fifo.pop_victim(), Some(("a", 1)));
        assert_eq!(lru.pop_victim(), Some(("b", 1)));
        assert_eq!(
            lru.iter_oldest_first().copied().collect::<Vec<_>>(),
            vec!["c", "a"]
        );
        assert_eq!(lru.total_bytes(), 2);
    }

    #[test]
    fn rewrite_moves_to_newest_and_set_size_keeps_position() {
        let mut o = EvictionOrder::new(EvictionPolicy::Fifo);
        o.insert(1u64, 10);
        o.insert(2, 20);
        o.insert(1, 5);
        o.set_size(&2, 7);
        assert_eq!(o.total_bytes(), 12);
        assert_eq!(o.pop_victim(), Some((2, 7)));
        assert_eq!(o.remove(&1), Some(5));
        assert!(o.is_empty());
        assert_eq!(o.total_bytes(), 0);
    }

    #[test]
    fn watermarks() {
        let cfg = EvictionConfig {
            policy: EvictionPolicy::Fifo,
            enabled: true,
            high_watermark_ratio: 0.9,
            low_watermark_ratio: 0.5,
        };
        assert_eq!(bytes_to_free(&cfg, 100, 50, 40).unwrap(), 0);
        assert_eq!(bytes_to_free(&cfg, 100, 50, 41).unwrap(), 41);
        assert_eq!(bytes_to_free(&cfg, 100, 10, 100).unwrap(), 10);
        assert!(bytes_to_free(&cfg, 100, 0, 101).is_err());
        let off = EvictionConfig {
            enabled: false,
            ..cfg
        };
        assert_eq!(bytes_to_free(&off, 100, 50, 50).unwrap(), 0);
        let err = bytes_to_free(&off, 100, 50, 51).unwrap_err();
        assert_eq!(err.code(), mooncake_common::ErrorCode::FILE_WRITE_FAIL);
    }
}
