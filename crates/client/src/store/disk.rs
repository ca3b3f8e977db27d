//! A store node's local disk tier (LOCAL_DISK replicas): the backend over one directory that
//! this process alone owns, the staging memory readers pull loaded objects from, and the
//! offload step that writes objects from the node's own segment memory to the backend.
//!
//! - **Ownership**: `open` takes an exclusive `flock` on `<dir>/mooncake-disk.lock` for the
//!   life of the process; a second process pointed at the same directory is refused with a clear
//!   error, so two writers can never interleave records in one directory.
//! - **Storage key** = `tenant NUL key` (`mooncake_common::storage_key`), so a scan after a
//!   restart gives back each object's tenant and key.
//! - **Offload**: the bytes go from the segment (the master pinned the source replica) straight
//!   into `put_batch`: no intermediate copy.
//! - **Loads** (`load`): each object is read into a 4 KiB-aligned slot of the staging segment,
//!   registered with the transfer engine; the reader pulls it from there and releases the
//!   batch, or the lease (`lease`) runs out and the slots are reclaimed on the next shortage.
//!   A record whose CRC fails is a per-key error (the backend drops it), never bytes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mooncake_common::{storage_key, ErrorCode, OffloadOutcome, OffloadTask};
use mooncake_storage::{
    open_backend, BackendConfig, BackendKind, Durability, EvictionConfig, StorageBackend,
    StorageError,
};
use mooncake_transfer::{MemoryHandle, SegmentOptions, TransferEngine};
use parking_lot::Mutex;

use super::addressing::{segment_base, split_address};
use super::StoreError;

/// Name of the lock file that makes a disk directory single-owner.
pub const LOCK_FILE: &str = "mooncake-disk.lock";
/// Staging slots are aligned to this (upstream's 4 KiB).
const SLOT_ALIGN: u64 = 4096;

/// Settings of a node's disk tier.
#[derive(Debug, Clone)]
pub struct DiskConfig {
    /// The directory (created if missing; must not be a symlink or contain `..`).
    pub dir: PathBuf,
    /// Bytes of values the disk may hold (> 0).
    pub capacity_bytes: u64,
    /// `log` (default), `bucket` or `file`.
    pub backend: BackendKind,
    /// When writes reach the platter (`batch`: one fsync per offload batch).
    pub durability: Durability,
    /// Staging memory for loads: the most bytes of loaded objects readers may hold at once
    /// (upstream's `MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES`). An object larger than this cannot
    /// be read from disk.
    pub staging_bytes: u64,
    /// How long a reader may take to pull a loaded object (upstream's buffer GC TTL, 5 s).
    pub lease: Duration,
    /// Period of the offload heartbeat when the mailbox was empty.
    pub offload_interval: Duration,
    /// Tasks taken per offload heartbeat.
    pub offload_batch: u64,
    /// Offload batches written at once (at least 1; default 1). With 2, one batch's
    /// `fdatasync` overlaps the next one's checksum and copy; `mooncake bench disk-tier`
    /// measures both (docs/disk-tier.md, "Decisions").
    pub offload_writes: usize,
    /// Eviction under watermarks (the backend's defaults: FIFO, 0.95 / 0.85).
    pub eviction: EvictionConfig,
    /// `dir` may be shared by several processes (Python `setup(ssd_offload_path=…)` of many
    /// ranks): each process takes the first `dir/client-N` whose lock is free. Without it the
    /// directory itself is locked and a second process is refused.
    pub shared: bool,
}

impl DiskConfig {
    pub fn new(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        DiskConfig {
            dir: dir.into(),
            capacity_bytes,
            backend: BackendKind::Log,
            durability: Durability::Batch,
            staging_bytes: 256 << 20,
            lease: Duration::from_secs(5),
            offload_interval: Duration::from_millis(100),
            offload_batch: 64,
            offload_writes: 1,
            eviction: EvictionConfig::default(),
            shared: false,
        }
    }

    /// Checks the settings and the directory (created when missing).
    fn check(&self) -> Result<(), StoreError> {
        let bad = |why: String| Err(StoreError::InvalidParams(why));
        let dir = &self.dir;
        if dir.as_os_str().is_empty() {
            return bad("disk dir is empty".into());
        }
        if dir.components().any(|c| c == Component::ParentDir) {
            return bad(format!("disk dir {} contains '..'", dir.display()));
        }
        if self.capacity_bytes == 0 {
            return bad("disk capacity must be above 0".into());
        }
        if self.staging_bytes < SLOT_ALIGN {
            return bad("disk staging memory must be at least 4 KiB".into());
        }
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                bad(format!("disk dir {} is a symlink", dir.display()))
            }
            Ok(meta) if !meta.is_dir() => {
                bad(format!("disk dir {} is not a directory", dir.display()))
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
                .or_else(|e| bad(format!("cannot create disk dir {}: {e}", dir.display()))),
            Err(e) => bad(format!("disk dir {}: {e}", dir.display())),
        }
    }
}

/// The exclusive lock on a disk directory, held while the value lives.
#[derive(Debug)]
struct DirLock {
    _file: File,
}

fn lock_dir(dir: &Path) -> Result<DirLock, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            StoreError::InvalidParams(format!(
                "disk dir {}: cannot open {LOCK_FILE}: {e}",
                dir.display()
            ))
        })?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |_| {
            StoreError::InvalidParams(format!(
                "disk dir {} is in use by another process (it holds {}); give each process its own directory",
                dir.display(),
                path.display()
            ))
        },
    )?;
    Ok(DirLock { _file: file })
}

/// Subdirectories a shared directory may hold (one per process using it at once).
const MAX_SHARED_OWNERS: usize = 1024;

/// The first `dir/client-N` whose lock is free, created when missing, and its lock.
fn lock_free_subdir(dir: &Path) -> Result<(PathBuf, DirLock), StoreError> {
    for n in 0..MAX_SHARED_OWNERS {
        let sub = dir.join(format!("client-{n}"));
        std::fs::create_dir_all(&sub).map_err(|e| {
            StoreError::InvalidParams(format!("cannot create disk dir {}: {e}", sub.display()))
        })?;
        if let Ok(lock) = lock_dir(&sub) {
            return Ok((sub, lock));
        }
    }
    Err(StoreError::InvalidParams(format!(
        "disk dir {}: all {MAX_SHARED_OWNERS} per-client subdirectories are in use",
        dir.display()
    )))
}

/// First-fit allocator of the staging segment, with leases per load batch.
#[derive(Debug, Default)]
struct Slots {
    /// Free ranges: offset → length (merged).
    free: BTreeMap<u64, u64>,
    /// Batch id → its slots and the lease deadline.
    leases: HashMap<u64, (Vec<(u64, u64)>, Instant)>,
    next_batch: u64,
}

impl Slots {
    fn take(&mut self, len: u64) -> Option<u64> {
        let (&offset, &free) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&offset);
        if free > len {
            self.free.insert(offset + len, free - len);
        }
        Some(offset)
    }

    fn give(&mut self, offset: u64, len: u64) {
        let mut start = offset;
        let mut end = offset + len;
        if let Some((&prev, &plen)) = self.free.range(..offset).next_back() {
            if prev + plen == offset {
                self.free.remove(&prev);
                start = prev;
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
    }

    /// Frees the slots of every batch whose lease ran out; true if any was.
    fn reclaim_expired(&mut self, now: Instant) -> bool {
        let expired: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in &expired {
            self.release(*id);
        }
        !expired.is_empty()
    }

    fn release(&mut self, batch: u64) -> bool {
        match self.leases.remove(&batch) {
            Some((slots, _)) => {
                for (offset, len) in slots {
                    self.give(offset, len);
                }
                true
            }
            None => false,
        }
    }
}

/// Counters of a node's disk tier.
#[derive(Debug, Default)]
pub struct DiskStats {
    pub offloaded: AtomicU64,
    pub offloaded_bytes: AtomicU64,
    pub offload_failures: AtomicU64,
    pub loads: AtomicU64,
    pub loaded_bytes: AtomicU64,
    /// Loads refused: the record was missing or failed its checksum, or no staging memory.
    pub load_failures: AtomicU64,
    /// Objects the backend evicted (the master was told first).
    pub evicted: AtomicU64,
}

/// A node's disk tier. See the module doc.
pub struct DiskTier {
    config: DiskConfig,
    backend: Box<dyn StorageBackend>,
    staging: MemoryHandle,
    slots: Mutex<Slots>,
    stats: DiskStats,
    _lock: DirLock,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.config.dir)
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

/// The upstream code of a backend error, for a reader.
fn code_of(error: &StorageError) -> ErrorCode {
    match error {
        StorageError::NotFound => ErrorCode::OBJECT_NOT_FOUND,
        other => other.code(),
    }
}

impl DiskTier {
    /// Checks `config`, locks the directory, opens (recovering) the backend and allocates the
    /// staging segment in `engine`.
    pub fn open(mut config: DiskConfig, engine: &TransferEngine) -> Result<DiskTier, StoreError> {
        config.check()?;
        let lock = if config.shared {
            let (dir, lock) = lock_free_subdir(&config.dir)?;
            config.dir = dir;
            lock
        } else {
            lock_dir(&config.dir)?
        };
        let backend_config = BackendConfig::new(
            config.dir.join(config.backend.name()),
            config.capacity_bytes,
        )
        .with_durability(config.durability)
        .with_eviction(config.eviction);
        let backend = open_backend(config.backend, backend_config).map_err(|e| {
            StoreError::InvalidParams(format!(
                "disk dir {}: cannot open the {} backend: {e}",
                config.dir.display(),
                config.backend
            ))
        })?;
        let len = usize::try_from(config.staging_bytes)
            .map_err(|_| StoreError::InvalidParams("staging memory too large".into()))?;
        let staging = engine.allocate_segment(
            len,
            SegmentOptions {
                shareable: true,
                huge_pages: false,
                populate: false,
            },
        )?;
        let mut slots = Slots::default();
        slots.free.insert(0, config.staging_bytes);
        Ok(DiskTier {
            config,
            backend,
            staging,
            slots: Mutex::new(slots),
            stats: DiskStats::default(),
            _lock: lock,
        })
    }

    pub fn config(&self) -> &DiskConfig {
        &self.config
    }

    pub fn backend(&self) -> &dyn StorageBackend {
        &*self.backend
    }

    pub fn stats(&self) -> &DiskStats {
        &self.stats
    }

    /// Writes each task's bytes from the node's `segments` to the backend; one outcome per task.
    /// A task whose source is not inside one of `segments` is refused.
    pub fn offload(&self, tasks: &[OffloadTask], segments: &[MemoryHandle]) -> Vec<OffloadOutcome> {
        let mut keys = Vec::with_capacity(tasks.len());
        let mut slices: Vec<Option<&[u8]>> = Vec::with_capacity(tasks.len());
        for t in tasks {
            keys.push(storage_key(&t.tenant, &t.key));
            slices.push(source_slice(t, segments));
        }
        let entries: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&slices)
            .filter_map(|(k, s)| s.map(|s| (k.as_str(), s)))
            .collect();
        let mut written = self.backend.put_batch(&entries).into_iter();
        let mut out = Vec::with_capacity(tasks.len());
        for (t, s) in tasks.iter().zip(&slices) {
            let stored = s.is_some() && matches!(written.next(), Some(Ok(())));
            let counter = if stored {
                self.stats
                    .offloaded_bytes
                    .fetch_add(t.size, Ordering::Relaxed);
                &self.stats.offloaded
            } else {
                &self.stats.offload_failures
            };
            counter.fetch_add(1, Ordering::Relaxed);
            out.push(OffloadOutcome {
                tenant: t.tenant.clone(),
                key: t.key.clone(),
                stored,
            });
        }
        out
    }

    /// Loads each promotion task's object from the backend straight into its target (a
    /// PROCESSING memory replica the master allocated on one of `segments`); one outcome per
    /// task. Blocks on disk I/O.
    pub fn promote(&self, tasks: &[OffloadTask], segments: &[MemoryHandle]) -> Vec<OffloadOutcome> {
        let keys: Vec<String> = tasks
            .iter()
            .map(|t| storage_key(&t.tenant, &t.key))
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for (t, key) in tasks.iter().zip(&keys) {
            let stored = match segment_range(t, segments) {
                Some((ptr, len)) => {
                    // SAFETY: inside a mapping `segments` keeps alive; the master allocated this
                    // range for the promotion's replica alone (PROCESSING: nobody reads it,
                    // nothing else is placed there) until the task is answered.
                    let target = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                    let mut buffers = [target];
                    matches!(
                        self.backend.get_batch(&[key.as_str()], &mut buffers).pop(),
                        Some(Ok(n)) if n == t.size
                    )
                }
                None => false,
            };
            out.push(OffloadOutcome {
                tenant: t.tenant.clone(),
                key: t.key.clone(),
                stored,
            });
        }
        out
    }

    /// Deletes the records of `keys` (storage keys) and makes the deletions durable; per key,
    /// whether it is gone (deleted, or absent already). Blocks on disk I/O.
    pub fn delete(&self, keys: &[String]) -> Vec<bool> {
        let gone: Vec<bool> = keys
            .iter()
            .map(|k| self.backend.remove(k).is_ok())
            .collect();
        if let Err(error) = self.backend.flush() {
            tracing::warn!(%error, "flushing deleted disk records failed");
            return vec![false; keys.len()];
        }
        gone
    }

    /// Reserves a staging slot of `len` bytes, reclaiming expired leases once when short.
    fn reserve(&self, slots: &mut Slots, len: u64) -> Option<(u64, u64)> {
        let aligned = len.div_ceil(SLOT_ALIGN).max(1) * SLOT_ALIGN;
        let offset = slots.take(aligned).or_else(|| {
            slots
                .reclaim_expired(Instant::now())
                .then(|| slots.take(aligned))
                .flatten()
        })?;
        Some((offset, aligned))
    }

    /// Loads each `(storage key, size)` into staging memory: the batch id, and per key the
    /// buffer address to read (or why not). Blocks on disk I/O.
    pub fn load(&self, keys: &[String], sizes: &[u64]) -> (u64, Vec<Result<u64, ErrorCode>>) {
        let mut slots = self.slots.lock();
        let mut reserved: Vec<Option<(u64, u64)>> = Vec::with_capacity(keys.len());
        for &size in sizes {
            reserved.push(if size == 0 {
                None
            } else {
                self.reserve(&mut slots, size)
            });
        }
        slots.next_batch += 1;
        let batch = slots.next_batch;
        drop(slots);
        let base = self.staging.as_ptr();
        let mut load_keys = Vec::new();
        let mut buffers: Vec<&mut [u8]> = Vec::new();
        for ((key, &size), slot) in keys.iter().zip(sizes).zip(&reserved) {
            if let Some((offset, _)) = slot {
                load_keys.push(key.as_str());
                // SAFETY: every slot is a distinct range inside the staging mapping (which
                // `self.staging` keeps alive), reserved for this call alone.
                buffers.push(unsafe {
                    std::slice::from_raw_parts_mut(base.add(*offset as usize), size as usize)
                });
            }
        }
        let mut loaded = self.backend.get_batch(&load_keys, &mut buffers).into_iter();
        let region_base = segment_base(self.staging.id()).unwrap_or(0);
        let mut held = Vec::new();
        let mut freed = Vec::new();
        let mut out = Vec::with_capacity(keys.len());
        for (&size, slot) in sizes.iter().zip(reserved) {
            let Some((offset, aligned)) = slot else {
                let code = if size == 0 {
                    ErrorCode::INVALID_PARAMS
                } else {
                    ErrorCode::BUFFER_OVERFLOW
                };
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                out.push(Err(code));
                continue;
            };
            let result = match loaded.next() {
                Some(Ok(n)) if n == size => Ok(region_base + offset),
                Some(Ok(_)) => Err(ErrorCode::INVALID_PARAMS),
                Some(Err(e)) => Err(code_of(&e)),
                None => Err(ErrorCode::INTERNAL_ERROR),
            };
            if result.is_ok() {
                self.stats.loads.fetch_add(1, Ordering::Relaxed);
                self.stats.loaded_bytes.fetch_add(size, Ordering::Relaxed);
                held.push((offset, aligned));
            } else {
                self.stats.load_failures.fetch_add(1, Ordering::Relaxed);
                freed.push((offset, aligned));
            }
            out.push(result);
        }
        let mut slots = self.slots.lock();
        for (offset, len) in freed {
            slots.give(offset, len);
        }
        if !held.is_empty() {
            slots
                .leases
                .insert(batch, (held, Instant::now() + self.config.lease));
        }
        (batch, out)
    }

    /// The reader is done with `batch`: its staging slots are free again.
    pub fn release(&self, batch: u64) -> bool {
        self.slots.lock().release(batch)
    }

    /// How long a reader may hold a load.
    pub fn lease(&self) -> Duration {
        self.config.lease
    }
}

/// Where `task`'s bytes lie in one of the node's segments (pointer and length), if entirely
/// inside one.
fn segment_range(task: &OffloadTask, segments: &[MemoryHandle]) -> Option<(*mut u8, usize)> {
    let (region, offset) = split_address(task.buffer_address);
    let memory = segments.iter().find(|m| m.id() == region)?;
    let end = offset.checked_add(task.size)?;
    if end > memory.len_bytes() as u64 {
        return None;
    }
    // SAFETY: offset < end <= the mapping's length.
    Some((
        unsafe { memory.as_ptr().add(offset as usize) },
        task.size as usize,
    ))
}

/// The bytes of `task` inside one of the node's segments, if they lie entirely in one.
fn source_slice<'s>(task: &OffloadTask, segments: &'s [MemoryHandle]) -> Option<&'s [u8]> {
    let (ptr, len) = segment_range(task, segments)?;
    // SAFETY: the range lies inside a segment mapping that `segments` keeps alive; the master
    // pinned the replica there until this task is answered, so no write lands in it.
    Some(unsafe { std::slice::from_raw_parts(ptr, len) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn slots_merge_and_reuse() {
        let mut s = Slots::default();
        s.free.insert(0, 16384);
        let a = s.take(4096).unwrap();
        let b = s.take(8192).unwrap();
        assert_eq!((a, b), (0, 4096));
        s.give(a, 4096);
        s.give(b, 8192);
        assert_eq!(s.free.get(&0), Some(&16384));
        assert!(s.take(16384).is_some());
        assert!(s.take(1).is_none());
    }
}
