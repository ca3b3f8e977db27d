//! Offset-allocator log backend: one preallocated data file, space handed out by an offset
//! allocator in 4 KiB blocks, one checksummed record per object, a sharded in-memory index, and a
//! checkpoint of that index plus a scan for recovery. Formats: `docs/storage-log.md`.
//!
//! How the pieces keep recovery exact:
//! - Every record carries its key, a sequence number (unique, increasing), the data file's random
//!   id and CRC32Cs of its header and of key ‖ value. Among intact records of one key, the highest
//!   sequence number wins.
//! - Removal, eviction, overwrite and a failed checksum **zero the old record's header block**
//!   (instead of writing a tombstone) before the record's space is given back. No tombstone means
//!   no tombstone space to account for or collect; the price is one 4 KiB write per removal. Under
//!   `Batch`/`Always` a `remove` syncs before it returns; evictions are synced with the batch that
//!   caused them; the zeroing of a replaced record needs no sync of its own because the newer
//!   record (already synced) outranks it.
//! - Freed space is **quarantined** until the next checkpoint is durable. Hence within one
//!   checkpoint epoch every block is written at most once, every record written after checkpoint
//!   C lies in space that was free in C, and recovery only scans that space.
//! - A checkpoint snapshots the index under the write side of `gate` (put, get and remove hold the
//!   read side from index lookup or allocation to index update), `fdatasync`s the data file, and
//!   writes `log.ckpt` (temp file → fsync → rename → fsync dir). Only then is the quarantine
//!   released to the allocator.

mod alloc;
mod format;
mod index;
mod recovery;

pub use alloc::{OffsetAllocator, RangeError};
pub use format::{
    data_crc, encode_record, head_blocks, record_blocks, value_blocks, Checkpoint, CheckpointEntry,
    FileHeader, RecordHeader, BLOCK_BYTES, CHECKPOINT_FILE, DATA_FILE, LOCK_FILE,
    RECORD_HEADER_BYTES,
};
pub use recovery::{data_blocks_for, RecoveryReport};

use crate::backend::{
    BackendConfig, Durability, EvictionListener, EvictionPolicy, ObjectInfo, StorageBackend,
    StorageError, Usage,
};
use crate::util::refuse_batch;
use index::{Entry, Index};
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

static ZERO_BLOCK: [u8; BLOCK_BYTES as usize] = [0; BLOCK_BYTES as usize];
/// Most iovecs handed to one `pwritev` (Linux's `IOV_MAX` is 1024).
const MAX_IOVECS: usize = 1024;
/// Rounds of "checkpoint to recycle quarantined space / evict more, then allocate again" a batch
/// may take before the entries that still do not fit fail with `NoSpace`.
const MAX_ALLOC_ROUNDS: usize = 4;

/// Tuning of the log backend beyond [`BackendConfig`]; [`LogBackend::open`] uses the defaults.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// A checkpoint is taken after a write once this long has passed since the last one.
    pub checkpoint_interval_ms: u64,
    /// Also checkpoint after a write once quarantined space exceeds this share of the file.
    pub checkpoint_quarantine_ratio: f64,
    /// Data region = capacity + max(capacity × this, `min_headroom_bytes`), for record heads,
    /// padding and quarantined space.
    pub headroom_ratio: f64,
    pub min_headroom_bytes: u64,
    /// Check the CRC of every checkpointed record's value at open (reads all live data once).
    /// Without it a damaged value is found on first read (reported `Corrupt`, then dropped).
    pub verify_on_open: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            checkpoint_interval_ms: 60_000,
            checkpoint_quarantine_ratio: 0.25,
            headroom_ratio: 0.125,
            min_headroom_bytes: 4 << 20,
            verify_on_open: true,
        }
    }
}

/// Counters of one open backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub checkpoints: u64,
    pub evicted_objects: u64,
    pub corrupt_reads: u64,
    pub quarantined_blocks: u64,
    pub free_blocks: u64,
    pub data_blocks: u64,
}

/// The offset-allocator log backend. See the module documentation.
pub struct LogBackend {
    /// Holds the `flock` on `log.lock` (released by `close` or when dropped).
    lock: File,
    config: BackendConfig,
    options: LogOptions,
    file: File,
    file_id: u64,
    data_blocks: u64,
    index: Index,
    allocator: Mutex<alloc::OffsetAllocator>,
    /// Freed `(start_block, blocks)` waiting for the next durable checkpoint.
    quarantine: Mutex<Vec<(u64, u64)>>,
    quarantine_blocks: AtomicU64,
    /// Read side: any operation between index lookup/allocation and index update. Write side:
    /// the checkpoint's snapshot. Fair (a waiting checkpoint stops new readers, so a stream of
    /// reads cannot starve it); hence no code path takes the read side twice, and the eviction
    /// listener (called with it held) may use `exists`, `size_of`, `scan` and `usage` only.
    gate: RwLock<()>,
    /// Serialises checkpoints; holds the time of the last one.
    checkpoint_lock: Mutex<Instant>,
    /// Serialises capacity checks and eviction.
    eviction_lock: Mutex<()>,
    next_seq: AtomicU64,
    /// Source of eviction-order stamps.
    clock: AtomicU64,
    used_bytes: AtomicU64,
    /// Value bytes of puts admitted but not yet indexed.
    reserved_bytes: AtomicU64,
    object_count: AtomicU64,
    listener: RwLock<Option<EvictionListener>>,
    closed: AtomicBool,
    abandoned: AtomicBool,
    report: RecoveryReport,
    checkpoints: AtomicU64,
    evicted_objects: AtomicU64,
    corrupt_reads: AtomicU64,
}

impl std::fmt::Debug for LogBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogBackend")
            .field("root", &self.config.root)
            .field("data_blocks", &self.data_blocks)
            .field("usage", &self.usage())
            .finish_non_exhaustive()
    }
}

/// One entry of a batch that passed validation.
struct Item<'a> {
    index: usize,
    key: &'a str,
    value: &'a [u8],
    head_blocks: u64,
    blocks: u64,
}

fn io(op: &'static str) -> impl Fn(io::Error) -> StorageError {
    move |source| StorageError::Io { op, source }
}

fn block_to_offset(block: u64) -> u64 {
    (1 + block) * BLOCK_BYTES
}

fn offset_to_block(offset: u64) -> u64 {
    offset / BLOCK_BYTES - 1
}

/// `pwritev` of all of `parts` at `offset`, retrying short writes and `EINTR`.
fn pwrite_all(file: &File, parts: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut idx = 0;
    let mut skip = 0usize;
    let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len().min(MAX_IOVECS));
    while idx < parts.len() {
        if parts[idx].len() == skip {
            idx += 1;
            skip = 0;
            continue;
        }
        iov.clear();
        iov.push(IoSlice::new(&parts[idx][skip..]));
        for p in parts[idx + 1..].iter().take(MAX_IOVECS - 1) {
            iov.push(IoSlice::new(p));
        }
        let written = match rustix::io::pwritev(file, &iov, offset) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => n,
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) => return Err(e.into()),
        };
        offset += written as u64;
        let mut left = written;
        while left > 0 && idx < parts.len() {
            let avail = parts[idx].len() - skip;
            if left >= avail {
                left -= avail;
                idx += 1;
                skip = 0;
            } else {
                skip += left;
                left = 0;
            }
        }
    }
    Ok(())
}

impl LogBackend {
    /// Opens the backend in `config.root` (creating the data file on first use) with default
    /// [`LogOptions`], recovering the index from the checkpoint and the scan.
    pub fn open(config: BackendConfig) -> Result<LogBackend, StorageError> {
        Self::open_with(config, LogOptions::default())
    }

    /// [`LogBackend::open`] with explicit options.
    pub fn open_with(
        config: BackendConfig,
        options: LogOptions,
    ) -> Result<LogBackend, StorageError> {
        config.validate()?;
        if !(options.headroom_ratio >= 0.0 && options.checkpoint_quarantine_ratio > 0.0) {
            return Err(StorageError::InvalidConfig(format!(
                "log options need headroom_ratio >= 0 and checkpoint_quarantine_ratio > 0: \
                 {options:?}"
            )));
        }
        let opened = recovery::open(&config, &options)?;
        let index = Index::default();
        let mut used = 0u64;
        let mut count = 0u64;
        let mut stamp = 0u64;
        for (key, r) in &opened.records {
            // Records arrive in sequence order, so stamps give FIFO = write order.
            stamp += 1;
            used += r.value_len;
            count += 1;
            let inserted = index.insert_if_newer(
                key,
                Entry {
                    offset: r.offset,
                    blocks: r.blocks,
                    value_len: r.value_len,
                    seq: r.seq,
                    data_crc: r.data_crc,
                    stamp,
                },
            );
            debug_assert!(inserted.is_ok());
        }
        let backend = LogBackend {
            lock: opened.lock,
            file_id: opened.header.file_id,
            data_blocks: opened.header.data_blocks,
            file: opened.file,
            index,
            allocator: Mutex::new(opened.allocator),
            quarantine: Mutex::new(Vec::new()),
            quarantine_blocks: AtomicU64::new(0),
            gate: RwLock::new(()),
            checkpoint_lock: Mutex::new(Instant::now()),
            eviction_lock: Mutex::new(()),
            next_seq: AtomicU64::new(opened.next_seq),
            clock: AtomicU64::new(stamp + 1),
            used_bytes: AtomicU64::new(used),
            reserved_bytes: AtomicU64::new(0),
            object_count: AtomicU64::new(count),
            listener: RwLock::new(None),
            closed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            report: opened.report,
            checkpoints: AtomicU64::new(0),
            evicted_objects: AtomicU64::new(0),
            corrupt_reads: AtomicU64::new(0),
            config,
            options,
        };
        // Start a new epoch: the recovered set becomes the base every later scan is relative to.
        if !backend.report.created {
            backend.checkpoint()?;
        }
        Ok(backend)
    }

    /// What recovery found when this backend was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    pub fn stats(&self) -> LogStats {
        LogStats {
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            evicted_objects: self.evicted_objects.load(Ordering::Relaxed),
            corrupt_reads: self.corrupt_reads.load(Ordering::Relaxed),
            quarantined_blocks: self.quarantine_blocks.load(Ordering::Relaxed),
            free_blocks: self.allocator.lock().free_blocks(),
            data_blocks: self.data_blocks,
        }
    }

    /// Stops using the backend without a checkpoint, as a killed process would (tests use it to
    /// make crash images in-process). Everything written so far stays in the file.
    #[doc(hidden)]
    pub fn abandon(self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.closed.store(true, Ordering::SeqCst);
    }

    /// `(byte offset, blocks)` of the record that holds `key`. For tests that damage records.
    #[doc(hidden)]
    pub fn record_location(&self, key: &str) -> Option<(u64, u64)> {
        self.index.get(key).map(|e| (e.offset, e.blocks))
    }

    /// Writes a checkpoint now (what `flush` does).
    pub fn checkpoint(&self) -> Result<(), StorageError> {
        let mut last = self.checkpoint_lock.lock();
        let (checkpoint, captured) = {
            let _snapshot = self.gate.write();
            let mut entries: Vec<CheckpointEntry> = self
                .index
                .snapshot()
                .into_iter()
                .map(|(key, e)| CheckpointEntry {
                    seq: e.seq,
                    offset: e.offset,
                    value_len: e.value_len,
                    data_crc: e.data_crc,
                    key,
                })
                .collect();
            entries.sort_by_key(|e| e.offset);
            let captured = std::mem::take(&mut *self.quarantine.lock());
            self.quarantine_blocks.store(0, Ordering::SeqCst);
            let checkpoint = Checkpoint {
                file_id: self.file_id,
                data_blocks: self.data_blocks,
                next_seq: self.next_seq.load(Ordering::SeqCst),
                entries,
            };
            (checkpoint, captured)
        };
        match self.write_checkpoint(&checkpoint) {
            Ok(()) => {
                let mut allocator = self.allocator.lock();
                for &(start, blocks) in &captured {
                    let freed = allocator.free(start, blocks);
                    debug_assert!(
                        freed.is_ok(),
                        "quarantined range {start}+{blocks}: {freed:?}"
                    );
                }
                *last = Instant::now();
                self.checkpoints.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let blocks: u64 = captured.iter().map(|&(_, b)| b).sum();
                self.quarantine.lock().extend(captured);
                self.quarantine_blocks.fetch_add(blocks, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    fn write_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), StorageError> {
        // Every record the checkpoint names, and every zeroed header of a record it no longer
        // names, must be on disk before the checkpoint is.
        self.file.sync_data().map_err(io("fdatasync"))?;
        let root = &self.config.root;
        let tmp = root.join(format::CHECKPOINT_TMP);
        let bytes = checkpoint.encode();
        let write = || -> io::Result<()> {
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()
        };
        write().map_err(io("write checkpoint"))?;
        std::fs::rename(&tmp, root.join(CHECKPOINT_FILE)).map_err(io("rename"))?;
        recovery::sync_dir(root)
    }

    fn maybe_checkpoint(&self) {
        // A checkpoint already running holds the lock: then none is due, and the caller must
        // not wait for it.
        let Some(last) = self.checkpoint_lock.try_lock() else {
            return;
        };
        let due = last.elapsed() >= Duration::from_millis(self.options.checkpoint_interval_ms)
            || self.quarantine_blocks.load(Ordering::Relaxed) as f64
                > self.data_blocks as f64 * self.options.checkpoint_quarantine_ratio;
        drop(last);
        if due {
            // A failure keeps the quarantine for the next attempt; the puts already succeeded.
            let _ = self.checkpoint();
        }
    }

    fn check_open(&self) -> Result<(), StorageError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(StorageError::Closed)
        } else {
            Ok(())
        }
    }

    fn check_key(&self, key: &str) -> Result<(), StorageError> {
        let max = self
            .config
            .limits
            .max_key_bytes
            .min(format::MAX_KEY_BYTES_ON_DISK as usize);
        if key.is_empty() {
            Err(StorageError::InvalidKey("empty key"))
        } else if key.len() > max {
            Err(StorageError::KeyTooLong {
                len: key.len(),
                max,
            })
        } else {
            Ok(())
        }
    }

    fn check_value(&self, len: u64) -> Result<(), StorageError> {
        let max = self
            .config
            .limits
            .max_value_bytes
            .min(format::MAX_VALUE_BYTES_ON_DISK);
        if len > max {
            Err(StorageError::ValueTooLarge { len, max })
        } else if len > self.config.capacity_bytes {
            Err(StorageError::NoSpace {
                needed: len,
                available: self.config.capacity_bytes,
            })
        } else {
            Ok(())
        }
    }

    fn quarantine_range(&self, offset: u64, blocks: u64) {
        self.quarantine
            .lock()
            .push((offset_to_block(offset), blocks));
        self.quarantine_blocks.fetch_add(blocks, Ordering::SeqCst);
    }

    /// Zeroes the header block of a record that is no longer live and quarantines its space.
    fn retire(&self, entry: &Entry) -> io::Result<()> {
        let zeroed = self.file.write_all_at(&ZERO_BLOCK, entry.offset);
        self.quarantine_range(entry.offset, entry.blocks);
        zeroed
    }

    /// Retires an entry already removed from the index and fixes the accounting.
    fn forget(&self, entry: &Entry) -> io::Result<()> {
        self.used_bytes.fetch_sub(entry.value_len, Ordering::SeqCst);
        self.object_count.fetch_sub(1, Ordering::SeqCst);
        self.retire(entry)
    }

    /// Evicts oldest objects (skipping `protected`) until `fits()` holds or nothing is left.
    /// Returns the evicted keys. Caller holds `gate` (read) and `eviction_lock`.
    fn evict_until(
        &self,
        protected: &HashSet<&str>,
        mut fits: impl FnMut(&Self, u64) -> bool,
    ) -> Vec<String> {
        let mut evicted = Vec::new();
        let mut freed_blocks = 0u64;
        while !fits(self, freed_blocks) {
            let Some((key, entry)) = self.index.pop_oldest(|k| protected.contains(k)) else {
                break;
            };
            // A failed zeroing can at worst let the key come back after a crash; the space is
            // quarantined either way.
            let _ = self.forget(&entry);
            freed_blocks += entry.blocks;
            evicted.push(key);
        }
        self.evicted_objects
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        evicted
    }

    fn notify_evicted(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        if let Some(listener) = &*self.listener.read() {
            listener(keys);
        }
    }

    /// Admits items against the capacity (evicting under the watermarks when enabled) and
    /// reserves their bytes. Returns the admitted items and the evicted keys; refused items get
    /// `NoSpace` in `results`.
    fn admit<'a>(
        &self,
        items: Vec<Item<'a>>,
        protected: &HashSet<&str>,
        results: &mut [Option<Result<(), StorageError>>],
    ) -> (Vec<Item<'a>>, Vec<String>) {
        let _evicting = self.eviction_lock.lock();
        let capacity = self.config.capacity_bytes;
        let eviction = self.config.eviction;
        let incoming: u64 = items.iter().map(|i| i.value.len() as u64).sum();
        let accounted = |s: &Self| {
            s.used_bytes.load(Ordering::SeqCst) + s.reserved_bytes.load(Ordering::SeqCst)
        };
        let mut evicted = Vec::new();
        if eviction.enabled {
            let high = (capacity as f64 * eviction.high_watermark_ratio) as u64;
            let low = (capacity as f64 * eviction.low_watermark_ratio) as u64;
            if accounted(self) + incoming > high {
                evicted = self.evict_until(protected, |s, _| accounted(s) + incoming <= low);
            }
        }
        let mut admitted = Vec::with_capacity(items.len());
        for item in items {
            let len = item.value.len() as u64;
            let now = accounted(self);
            if now + len > capacity {
                results[item.index] = Some(Err(StorageError::NoSpace {
                    needed: len,
                    available: capacity.saturating_sub(now),
                }));
            } else {
                self.reserved_bytes.fetch_add(len, Ordering::SeqCst);
                admitted.push(item);
            }
        }
        (admitted, evicted)
    }

    /// Places every item: one extent for the whole batch when possible, else one per item.
    fn allocate(&self, items: &[Item<'_>]) -> Vec<Option<u64>> {
        let mut allocator = self.allocator.lock();
        let total: u64 = items.iter().map(|i| i.blocks).sum();
        if let Some(mut block) = allocator.allocate(total) {
            return items
                .iter()
                .map(|i| {
                    let offset = block_to_offset(block);
                    block += i.blocks;
                    Some(offset)
                })
                .collect();
        }
        items
            .iter()
            .map(|i| allocator.allocate(i.blocks).map(block_to_offset))
            .collect()
    }

    fn release_unwritten(&self, items: &[Item<'_>], placed: &[Option<u64>]) {
        let mut allocator = self.allocator.lock();
        for (item, offset) in items.iter().zip(placed) {
            if let Some(offset) = offset {
                let freed = allocator.free(offset_to_block(*offset), item.blocks);
                debug_assert!(freed.is_ok());
            }
        }
    }

    /// Writes the placed items (headers built into one buffer, values straight from the caller)
    /// with as few `pwritev` calls as the placement allows, syncing per the durability policy.
    /// Returns one result per item; `Ok` carries the record's sequence number and data CRC.
    fn write_records(
        &self,
        items: &[Item<'_>],
        placed: &[u64],
    ) -> Vec<Result<(u64, u32), StorageError>> {
        let head_total: u64 = items.iter().map(|i| i.head_blocks).sum();
        let mut heads = vec![0u8; (head_total * BLOCK_BYTES) as usize];
        let mut meta = Vec::with_capacity(items.len());
        let mut at = 0usize;
        for item in items {
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            let crc = format::data_crc(item.key.as_bytes(), item.value);
            let len = (item.head_blocks * BLOCK_BYTES) as usize;
            let head = &mut heads[at..at + len];
            RecordHeader {
                key_len: item.key.len() as u32,
                value_len: item.value.len() as u64,
                seq,
                file_id: self.file_id,
                data_crc: crc,
            }
            .encode_into(head);
            head[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + item.key.len()]
                .copy_from_slice(item.key.as_bytes());
            meta.push((seq, crc, at, len));
            at += len;
        }
        let mut results: Vec<Result<(u64, u32), StorageError>> = meta
            .iter()
            .map(|&(seq, crc, _, _)| Ok((seq, crc)))
            .collect();
        let always = self.config.durability == Durability::Always;
        let mut parts: Vec<&[u8]> = Vec::with_capacity(items.len() * 3);
        let mut run_start = 0usize;
        for i in 0..items.len() {
            let (_, _, at, len) = meta[i];
            parts.push(&heads[at..at + len]);
            let value = items[i].value;
            if !value.is_empty() {
                parts.push(value);
                let pad = (value_blocks(value.len() as u64) * BLOCK_BYTES) as usize - value.len();
                if pad > 0 {
                    parts.push(&ZERO_BLOCK[..pad]);
                }
            }
            let run_continues = !always
                && i + 1 < items.len()
                && placed[i + 1] == placed[i] + items[i].blocks * BLOCK_BYTES;
            if run_continues {
                continue;
            }
            let mut outcome =
                pwrite_all(&self.file, &parts, placed[run_start]).map_err(io("write"));
            if always && outcome.is_ok() {
                outcome = self.file.sync_data().map_err(io("fdatasync"));
            }
            if let Err(e) = outcome {
                let msg = e.to_string();
                for r in &mut results[run_start..=i] {
                    *r = Err(StorageError::Io {
                        op: "write",
                        source: io::Error::other(msg.clone()),
                    });
                }
            }
            parts.clear();
            run_start = i + 1;
        }
        if self.config.durability == Durability::Batch && results.iter().any(|r| r.is_ok()) {
            if let Err(e) = self.file.sync_data() {
                let msg = e.to_string();
                for r in results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(StorageError::Io {
                        op: "fdatasync",
                        source: io::Error::other(msg.clone()),
                    });
                }
            }
        }
        results
    }

    /// Reads `key` into `buf`, verifying the CRC. Caller holds `gate` (read).
    fn read_one(&self, key: &str, buf: &mut [u8]) -> Result<u64, StorageError> {
        let entry = self.index.get(key).ok_or(StorageError::NotFound)?;
        if (buf.len() as u64) < entry.value_len {
            return Err(StorageError::BufferTooSmall {
                buffer: buf.len(),
                value: entry.value_len,
            });
        }
        let len = entry.value_len as usize;
        let value_offset = entry.offset + head_blocks(key.len() as u64) * BLOCK_BYTES;
        let failure = match self.file.read_exact_at(&mut buf[..len], value_offset) {
            Ok(()) if format::data_crc(key.as_bytes(), &buf[..len]) == entry.data_crc => None,
            Ok(()) => Some("value checksum mismatch".to_string()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Some("record truncated".to_string())
            }
            Err(source) => return Err(StorageError::Io { op: "read", source }),
        };
        if let Some(reason) = failure {
            self.corrupt_reads.fetch_add(1, Ordering::Relaxed);
            if let Some(e) = self.index.remove(key, Some(entry.seq)) {
                let _ = self.forget(&e);
            }
            return Err(StorageError::Corrupt {
                key: key.to_owned(),
                reason,
            });
        }
        if self.config.eviction.policy == EvictionPolicy::Lru {
            let stamp = self.clock.fetch_add(1, Ordering::SeqCst);
            self.index.touch(key, entry.seq, stamp);
        }
        Ok(entry.value_len)
    }
}

/// The outcome of one batch entry, `None` until it is decided.
type Outcome = Option<Result<(), StorageError>>;

impl LogBackend {
    /// The batch entries with a valid key and value, as items; the others' errors go to
    /// `results`.
    fn validate_batch<'a>(
        &self,
        entries: &[(&'a str, &'a [u8])],
        results: &mut [Outcome],
    ) -> Vec<Item<'a>> {
        let mut items = Vec::with_capacity(entries.len());
        for (index, &(key, value)) in entries.iter().enumerate() {
            let len = value.len() as u64;
            let verdict = self.check_key(key).and(self.check_value(len));
            match verdict {
                Err(e) => results[index] = Some(Err(e)),
                Ok(()) => {
                    let head = head_blocks(key.len() as u64);
                    items.push(Item {
                        index,
                        key,
                        value,
                        head_blocks: head,
                        blocks: head + value_blocks(len),
                    });
                }
            }
        }
        items
    }

    /// Not enough contiguous space for `missing` blocks: recycles quarantined space (evicting
    /// more when allowed). When that made progress, releases what `placed` got and the batch's
    /// reservation so that the whole batch is tried again, and returns true.
    fn make_room(
        &self,
        items: &[Item<'_>],
        placed: &[Option<u64>],
        missing: u64,
        protected: &HashSet<&str>,
        evicted_any: &mut bool,
    ) -> bool {
        let quarantined = self.quarantine_blocks.load(Ordering::SeqCst);
        let mut evicted = Vec::new();
        if self.config.eviction.enabled && quarantined < missing {
            let _evicting = self.eviction_lock.lock();
            evicted = self.evict_until(protected, |_, freed| quarantined + freed >= missing);
        }
        self.notify_evicted(&evicted);
        *evicted_any |= !evicted.is_empty();
        let progress = quarantined > 0 || !evicted.is_empty();
        if progress {
            self.release_unwritten(items, placed);
            let reserved: u64 = items.iter().map(|i| i.value.len() as u64).sum();
            self.reserved_bytes.fetch_sub(reserved, Ordering::SeqCst);
        }
        progress
    }

    /// Writes the items that were placed and publishes each written one; the rest are out of
    /// space.
    fn write_placed(
        &self,
        mut items: Vec<Item<'_>>,
        placed: Vec<Option<u64>>,
        results: &mut [Outcome],
    ) {
        let mut to_write = Vec::with_capacity(items.len());
        let mut offsets = Vec::with_capacity(items.len());
        for (item, offset) in items.drain(..).zip(placed) {
            match offset {
                Some(offset) => {
                    to_write.push(item);
                    offsets.push(offset);
                }
                None => {
                    self.reserved_bytes
                        .fetch_sub(item.value.len() as u64, Ordering::SeqCst);
                    let free_blocks = self.allocator.lock().largest_free();
                    results[item.index] = Some(Err(StorageError::NoSpace {
                        needed: item.blocks * BLOCK_BYTES,
                        available: free_blocks * BLOCK_BYTES,
                    }));
                }
            }
        }
        let written = self.write_records(&to_write, &offsets);
        for ((item, offset), outcome) in to_write.iter().zip(&offsets).zip(written) {
            results[item.index] = Some(self.publish(item, *offset, outcome));
            self.reserved_bytes
                .fetch_sub(item.value.len() as u64, Ordering::SeqCst);
        }
    }

    /// Puts the record of `item` written at `offset` into the index (unless a newer put of the
    /// key won), retiring what it replaced; a failed write is retired so that recovery cannot
    /// pick it up.
    fn publish(
        &self,
        item: &Item<'_>,
        offset: u64,
        outcome: Result<(u64, u32), StorageError>,
    ) -> Result<(), StorageError> {
        let len = item.value.len() as u64;
        let mine = Entry {
            offset,
            blocks: item.blocks,
            value_len: len,
            seq: 0,
            data_crc: 0,
            stamp: 0,
        };
        match outcome {
            Ok((seq, data_crc)) => {
                let entry = Entry {
                    seq,
                    data_crc,
                    stamp: self.clock.fetch_add(1, Ordering::SeqCst),
                    ..mine
                };
                match self.index.insert_if_newer(item.key, entry) {
                    Ok(previous) => {
                        self.used_bytes.fetch_add(len, Ordering::SeqCst);
                        match previous {
                            Some(old) => {
                                self.used_bytes.fetch_sub(old.value_len, Ordering::SeqCst);
                                let _ = self.retire(&old);
                            }
                            None => {
                                self.object_count.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                    // A concurrent put of the same key with a higher seq won.
                    Err(()) => {
                        let _ = self.retire(&entry);
                    }
                }
                Ok(())
            }
            Err(e) => {
                // Possibly half on disk: make sure recovery cannot pick it up.
                let _ = self.retire(&mine);
                Err(e)
            }
        }
    }
}

impl StorageBackend for LogBackend {
    fn name(&self) -> &'static str {
        "log"
    }

    fn put_batch(&self, entries: &[(&str, &[u8])]) -> Vec<Result<(), StorageError>> {
        let closed = self.closed.load(Ordering::SeqCst);
        let max = self.config.limits.max_batch_entries;
        if let Some(refused) = refuse_batch(closed, entries.len(), max, true) {
            return refused;
        }
        let mut results: Vec<Outcome> = entries.iter().map(|_| None).collect();
        let mut items = self.validate_batch(entries, &mut results);
        let protected: HashSet<&str> = items.iter().map(|i| i.key).collect();

        let mut round = 0;
        let mut evicted_any = false;
        while !items.is_empty() {
            round += 1;
            let gate = self.gate.read();
            let (admitted, evicted) = self.admit(items, &protected, &mut results);
            evicted_any |= !evicted.is_empty();
            // Listeners hear of evictions before the space can be reused: that needs a
            // checkpoint, which waits for `gate`.
            self.notify_evicted(&evicted);
            items = admitted;
            if items.is_empty() {
                break;
            }
            let placed = self.allocate(&items);
            let missing: u64 = items
                .iter()
                .zip(&placed)
                .filter(|(_, p)| p.is_none())
                .map(|(i, _)| i.blocks)
                .sum();
            if missing > 0
                && round < MAX_ALLOC_ROUNDS
                && self.make_room(&items, &placed, missing, &protected, &mut evicted_any)
            {
                drop(gate);
                if let Err(e) = self.checkpoint() {
                    let msg = e.to_string();
                    for item in &items {
                        results[item.index] = Some(Err(StorageError::Io {
                            op: "checkpoint",
                            source: io::Error::other(msg.clone()),
                        }));
                    }
                    break;
                }
                continue;
            }
            self.write_placed(items, placed, &mut results);
            drop(gate);
            break;
        }
        if evicted_any
            && self.config.durability != Durability::None
            && !results.iter().any(|r| matches!(r, Some(Ok(()))))
        {
            // Nothing was written (so nothing synced), but evictions were reported: make their
            // zeroed headers durable anyway. Best effort: the puts already failed.
            let _ = self.file.sync_data();
        }
        self.maybe_checkpoint();
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(StorageError::Io {
                        op: "write",
                        source: io::Error::other("entry was not processed"),
                    })
                })
            })
            .collect()
    }

    fn get_batch(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64, StorageError>> {
        let closed = self.closed.load(Ordering::SeqCst);
        let max = self.config.limits.max_batch_entries;
        // A key without a buffer is refused on its own (BufferTooSmall), below.
        if let Some(refused) = refuse_batch(closed, keys.len(), max, true) {
            return refused;
        }
        let _gate = self.gate.read();
        let mut results = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let result = match buffers.get_mut(i) {
                Some(buf) => self.read_one(key, buf),
                None => match self.index.get(key) {
                    Some(e) => Err(StorageError::BufferTooSmall {
                        buffer: 0,
                        value: e.value_len,
                    }),
                    None => Err(StorageError::NotFound),
                },
            };
            results.push(result);
        }
        results
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        self.index.get(key).map(|e| e.value_len)
    }

    fn remove(&self, key: &str) -> Result<bool, StorageError> {
        self.check_open()?;
        self.check_key(key)?;
        let removed = {
            let _gate = self.gate.read();
            let Some(entry) = self.index.remove(key, None) else {
                return Ok(false);
            };
            self.forget(&entry).map_err(io("write"))?;
            if self.config.durability != Durability::None {
                self.file.sync_data().map_err(io("fdatasync"))?;
            }
            true
        };
        self.maybe_checkpoint();
        Ok(removed)
    }

    fn scan(&self) -> Vec<ObjectInfo> {
        if self.closed.load(Ordering::SeqCst) {
            return Vec::new();
        }
        self.index
            .snapshot()
            .into_iter()
            .map(|(key, e)| ObjectInfo {
                key,
                size_bytes: e.value_len,
            })
            .collect()
    }

    fn usage(&self) -> Usage {
        Usage {
            capacity_bytes: self.config.capacity_bytes,
            used_bytes: self.used_bytes.load(Ordering::SeqCst),
            object_count: self.object_count.load(Ordering::SeqCst),
        }
    }

    fn set_eviction_listener(&self, listener: EvictionListener) {
        *self.listener.write() = Some(listener);
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.check_open()?;
        self.checkpoint()
    }

    fn close(&self) -> Result<(), StorageError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Err(StorageError::Closed);
        }
        let result = self.checkpoint();
        // Another backend may open the root now, even while this value is still alive.
        let _ = rustix::fs::flock(&self.lock, rustix::fs::FlockOperation::Unlock);
        result
    }
}

impl Drop for LogBackend {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::SeqCst) && !self.abandoned.load(Ordering::SeqCst) {
            // Best effort, as a clean shutdown would; a failure only means a longer scan.
            let _ = self.checkpoint();
        }
    }
}
