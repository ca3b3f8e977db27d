//! The in-memory index: key → record location, in 64 shards for concurrency, plus the eviction
//! order (a map from an ever-increasing stamp to the key).
//!
//! Lock order: a shard lock may be held while taking the order lock, never the other way round.

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};

pub const SHARDS: usize = 64;

/// Where one live record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Byte offset of the record's header in the data file.
    pub offset: u64,
    /// Blocks the record occupies.
    pub blocks: u64,
    pub value_len: u64,
    pub seq: u64,
    /// CRC32C of key ‖ value.
    pub data_crc: u32,
    /// Position in the eviction order (write time for FIFO, last access for LRU).
    pub stamp: u64,
}

#[derive(Debug)]
pub struct Index {
    shards: Vec<RwLock<HashMap<String, Entry>>>,
    order: Mutex<BTreeMap<u64, String>>,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            order: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Index {
    pub fn shard(&self, key: &str) -> &RwLock<HashMap<String, Entry>> {
        let h = crc32c::crc32c(key.as_bytes()) as usize;
        &self.shards[h % SHARDS]
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        self.shard(key).read().get(key).copied()
    }

    /// Inserts unless the index holds a newer record of the key. Returns `Ok(previous)` when
    /// inserted, `Err(())` when the given entry is older than the stored one (the caller frees it).
    pub fn insert_if_newer(&self, key: &str, entry: Entry) -> Result<Option<Entry>, ()> {
        let mut shard = self.shard(key).write();
        let previous = shard.get(key).copied();
        if previous.is_some_and(|p| p.seq > entry.seq) {
            return Err(());
        }
        shard.insert(key.to_owned(), entry);
        let mut order = self.order.lock();
        if let Some(p) = previous {
            order.remove(&p.stamp);
        }
        order.insert(entry.stamp, key.to_owned());
        Ok(previous)
    }

    /// Removes `key` if present (when `seq` is given, only if the stored record has that seq).
    pub fn remove(&self, key: &str, seq: Option<u64>) -> Option<Entry> {
        let mut shard = self.shard(key).write();
        let entry = *shard.get(key)?;
        if seq.is_some_and(|s| s != entry.seq) {
            return None;
        }
        shard.remove(key);
        self.order.lock().remove(&entry.stamp);
        Some(entry)
    }

    /// Moves `key` to the young end of the eviction order (LRU touch).
    pub fn touch(&self, key: &str, seq: u64, stamp: u64) {
        let mut shard = self.shard(key).write();
        if let Some(entry) = shard.get_mut(key).filter(|e| e.seq == seq) {
            let old = entry.stamp;
            entry.stamp = stamp;
            let mut order = self.order.lock();
            order.remove(&old);
            order.insert(stamp, key.to_owned());
        }
    }

    /// Removes the oldest entry in eviction order whose key `skip` does not refuse.
    pub fn pop_oldest(&self, skip: impl Fn(&str) -> bool) -> Option<(String, Entry)> {
        let mut skipped: Vec<(u64, String)> = Vec::new();
        let mut found = None;
        // Bounded: every turn removes one order entry (re-inserted below when skipped).
        loop {
            let Some((stamp, key)) = self.order.lock().pop_first() else {
                break;
            };
            if skip(&key) {
                skipped.push((stamp, key));
                continue;
            }
            let mut shard = self.shard(&key).write();
            match shard.get(&key).copied() {
                Some(entry) if entry.stamp == stamp => {
                    shard.remove(&key);
                    found = Some((key, entry));
                    break;
                }
                // The entry moved (touched or replaced) after we popped its old stamp: it is
                // still in the order under its new stamp; keep looking.
                _ => continue,
            }
        }
        if !skipped.is_empty() {
            let mut order = self.order.lock();
            for (stamp, key) in skipped {
                order.insert(stamp, key);
            }
        }
        found
    }

    /// Every `(key, entry)`.
    pub fn snapshot(&self) -> Vec<(String, Entry)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            out.extend(shard.read().iter().map(|(k, e)| (k.clone(), *e)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(seq: u64, stamp: u64) -> Entry {
        Entry {
            offset: 4096,
            blocks: 1,
            value_len: 1,
            seq,
            data_crc: 0,
            stamp,
        }
    }

    #[test]
    fn older_record_never_replaces_a_newer_one() {
        let index = Index::default();
        assert_eq!(index.insert_if_newer("k", entry(5, 1)), Ok(None));
        assert_eq!(index.insert_if_newer("k", entry(3, 2)), Err(()));
        assert_eq!(index.get("k").unwrap().seq, 5);
        assert_eq!(
            index.insert_if_newer("k", entry(9, 3)),
            Ok(Some(entry(5, 1)))
        );
    }

    #[test]
    fn pop_oldest_follows_stamps_and_skips_protected_keys() {
        let index = Index::default();
        index.insert_if_newer("a", entry(1, 10)).unwrap();
        index.insert_if_newer("b", entry(2, 20)).unwrap();
        index.insert_if_newer("c", entry(3, 30)).unwrap();
        index.touch("a", 1, 40);
        assert_eq!(index.pop_oldest(|k| k == "b").unwrap().0, "c");
        assert_eq!(index.pop_oldest(|_| false).unwrap().0, "b");
        assert_eq!(index.pop_oldest(|_| false).unwrap().0, "a");
        assert!(index.pop_oldest(|_| false).is_none());
    }
}
