//! A capped cache of open read handles, keyed by file id (bucket id). Bounds open descriptors to
//! `Limits::max_open_files`: inserting past the cap closes the least recently used handle (a
//! reader that still holds its `Arc<File>` keeps reading; the descriptor closes when it drops).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::hash::Hash;
use std::sync::Arc;

#[derive(Debug)]
pub struct FdCache<K> {
    cap: usize,
    inner: Mutex<Inner<K>>,
}

#[derive(Debug)]
struct Inner<K> {
    tick: u64,
    map: HashMap<K, (Arc<File>, u64)>,
}

impl<K: Eq + Hash + Clone> FdCache<K> {
    pub fn new(cap: usize) -> Self {
        FdCache {
            cap: cap.max(1),
            inner: Mutex::new(Inner {
                tick: 0,
                map: HashMap::new(),
            }),
        }
    }

    /// The cached handle for `key`, or the one `open` returns (cached, evicting the LRU handle
    /// when full). `open` runs under the cache lock so one file is opened once.
    pub fn get_or_open<E>(
        &self,
        key: &K,
        open: impl FnOnce() -> Result<File, E>,
    ) -> Result<Arc<File>, E> {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(entry) = inner.map.get_mut(key) {
            entry.1 = tick;
            return Ok(entry.0.clone());
        }
        let file = Arc::new(open()?);
        if inner.map.len() >= self.cap {
            let oldest = inner
                .map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                inner.map.remove(&oldest);
            }
        }
        inner.map.insert(key.clone(), (file.clone(), tick));
        Ok(file)
    }

    /// Drops the cached handle for `key` (before its file is deleted or replaced).
    pub fn forget(&self, key: &K) {
        self.inner.lock().map.remove(key);
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_is_enforced_lru() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FdCache::new(2);
        let open = |n: u32| {
            let p = dir.path().join(n.to_string());
            move || File::create(p)
        };
        cache.get_or_open(&1, open(1)).unwrap();
        cache.get_or_open(&2, open(2)).unwrap();
        cache.get_or_open(&1, open(1)).unwrap();
        cache.get_or_open(&3, open(3)).unwrap();
        assert_eq!(cache.len(), 2);
        // 2 was least recently used, so reopening it must call `open` again.
        let mut called = false;
        cache
            .get_or_open(&2, || {
                called = true;
                File::create(dir.path().join("2"))
            })
            .unwrap();
        assert!(called);
        let mut called_for_1 = false;
        let _ = cache.get_or_open(&3, || {
            called_for_1 = true;
            File::create(dir.path().join("3"))
        });
        assert!(!called_for_1, "3 was cached");
    }
}
