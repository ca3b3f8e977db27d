//! File-per-key backend: one file per object under hashed subdirectories.
//!
//! Layout: `<root>/<h0>/<h1>/<hash>-<slot>` where `hash` is a stable 64-bit hash of the key
//! (16 hex digits), `h0`/`h1` its first two bytes in hex, and `slot` (0..[`MAX_SLOTS`]) separates
//! distinct keys whose hashes collide. Each file is one record of the shared format
//! ([`crate::record`], magic `MCFK`): header with the full key, value length, sequence number and
//! CRC-32C, then the key, then the value.
//!
//! Writes go to `<name>.<seq>.tmp` in the same directory, then `rename` over the final name, so a
//! reader or a crash sees the whole old file or the whole new one. Durability:
//! - `None`: no fsync; a process crash loses nothing acknowledged (page cache), a machine crash
//!   can lose recent writes (whole files; the rename makes them atomic on journaled file systems).
//! - `Batch`: the batch's temp files are written, one `syncfs` of the store's file system makes
//!   them durable, they are renamed, and a second `syncfs` makes the renames durable, before
//!   `put_batch` returns: two flushes per batch rather than one fdatasync per file (`syncfs` also
//!   flushes other writers' dirty pages on that file system, so its latency depends on them).
//! - `Always`: fdatasync, rename and directory fsync per record.
//!
//! Start-up walks the two directory levels, deletes `*.tmp` leftovers, reads each file's header
//! and key (not the value: O(files), not O(bytes)), and drops (deletes) files whose header, key
//! checksum, length or hash do not match. Files with foreign names are ignored. A value whose
//! CRC fails is found on its first read, reported as `Corrupt` and the file deleted.

use crate::backend::{
    BackendConfig, Durability, EvictionListener, ObjectInfo, StorageBackend, StorageError, Usage,
};
use crate::eviction::{bytes_to_free, EvictionOrder};
use crate::record::{self, RecordHeader, HEADER_BYTES, MAGIC_FILE};
use crate::util::{check_entry, check_key, io, refuse_all, refuse_batch, sync_dir};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Distinct keys with one 64-bit hash that can be stored at once.
pub const MAX_SLOTS: u16 = 64;

#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: u64,
    slot: u16,
    size: u64,
    seq: u64,
}

#[derive(Debug, Default)]
struct Index {
    map: HashMap<String, Entry>,
    /// (hash, slot) → key, so that a new key whose hash collides gets a free slot.
    paths: HashMap<(u64, u16), String>,
    used_bytes: u64,
}

type Listener = Arc<EvictionListener>;

/// The file-per-key backend. See the module docs.
pub struct FileBackend {
    root: PathBuf,
    config: BackendConfig,
    /// Serializes writers (put, remove, eviction, dropping corrupt files).
    writer: Mutex<()>,
    index: RwLock<Index>,
    /// Lock order: `order` before `index` when both are held (only eviction does).
    order: Mutex<EvictionOrder<String>>,
    listener: RwLock<Option<Listener>>,
    closed: AtomicBool,
    next_seq: AtomicU64,
}

impl std::fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackend")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// Stable 64-bit hash of a key (FNV-1a, then a finalizer to spread the bits).
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

fn dir_of(root: &Path, hash: u64) -> PathBuf {
    root.join(format!("{:02x}", hash >> 56))
        .join(format!("{:02x}", (hash >> 48) & 0xff))
}

fn path_of(root: &Path, hash: u64, slot: u16) -> PathBuf {
    dir_of(root, hash).join(format!("{hash:016x}-{slot}"))
}

fn parse_name(name: &str) -> Option<(u64, u16)> {
    let (h, s) = name.split_once('-')?;
    if h.len() != 16 {
        return None;
    }
    let hash = u64::from_str_radix(h, 16).ok()?;
    let slot: u16 = s.parse().ok()?;
    (slot < MAX_SLOTS && s == slot.to_string()).then_some((hash, slot))
}

struct Recovered {
    key: String,
    entry: Entry,
    path: PathBuf,
}

impl FileBackend {
    /// Opens or recovers the store under `config.root`.
    pub fn open(config: BackendConfig) -> Result<FileBackend, StorageError> {
        config.validate()?;
        let root = config.root.clone();
        fs::create_dir_all(&root).map_err(io("open"))?;
        let mut found: HashMap<String, Recovered> = HashMap::new();
        let mut max_seq = 0u64;
        for top in read_dir_sorted(&root)? {
            if !is_hex_dir(&top, 2) {
                continue;
            }
            for sub in read_dir_sorted(&top)? {
                if !is_hex_dir(&sub, 2) {
                    continue;
                }
                for file in read_dir_sorted(&sub)? {
                    let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
                        continue;
                    };
                    if name.ends_with(".tmp") {
                        remove_quietly(&file);
                        continue;
                    }
                    let Some((hash, slot)) = parse_name(name) else {
                        continue;
                    };
                    match recover_one(&file, hash, &config) {
                        Ok((key, header)) => {
                            max_seq = max_seq.max(header.seq);
                            let entry = Entry {
                                hash,
                                slot,
                                size: header.value_len,
                                seq: header.seq,
                            };
                            let rec = Recovered {
                                key: key.clone(),
                                entry,
                                path: file.clone(),
                            };
                            match found.get(&key) {
                                Some(old) if old.entry.seq > header.seq => remove_quietly(&file),
                                Some(old) => {
                                    remove_quietly(&old.path);
                                    found.insert(key, rec);
                                }
                                None => {
                                    found.insert(key, rec);
                                }
                            }
                        }
                        Err(_) => remove_quietly(&file),
                    }
                }
            }
        }
        let mut recovered: Vec<Recovered> = found.into_values().collect();
        recovered.sort_by_key(|r| r.entry.seq);
        let mut index = Index::default();
        let mut order = EvictionOrder::new(config.eviction.policy);
        for r in recovered {
            index.used_bytes += r.entry.size;
            index
                .paths
                .insert((r.entry.hash, r.entry.slot), r.key.clone());
            order.insert(r.key.clone(), r.entry.size);
            index.map.insert(r.key, r.entry);
        }
        Ok(FileBackend {
            root,
            writer: Mutex::new(()),
            order: Mutex::new(order),
            index: RwLock::new(index),
            listener: RwLock::new(None),
            closed: AtomicBool::new(false),
            next_seq: AtomicU64::new(max_seq + 1),
            config,
        })
    }

    fn check_open(&self) -> Result<(), StorageError> {
        if self.closed.load(Ordering::Acquire) {
            Err(StorageError::Closed)
        } else {
            Ok(())
        }
    }

    /// Evicts (index → listener → files) until `incoming` fits under the watermarks.
    /// Caller holds the writer lock.
    fn evict_for(&self, incoming: u64) {
        let used = self.index.read().used_bytes;
        let need = match bytes_to_free(
            &self.config.eviction,
            self.config.capacity_bytes,
            used,
            incoming,
        ) {
            Ok(n) if n > 0 && self.config.eviction.enabled => n,
            _ => return,
        };
        let mut victims = Vec::new();
        {
            let mut order = self.order.lock();
            let mut index = self.index.write();
            let mut freed = 0u64;
            while freed < need {
                let Some((key, _)) = order.pop_victim() else {
                    break;
                };
                if let Some(e) = index.map.remove(&key) {
                    index.used_bytes -= e.size;
                    freed += e.size;
                    victims.push((key, e));
                }
            }
        }
        if victims.is_empty() {
            return;
        }
        let keys: Vec<String> = victims.iter().map(|(k, _)| k.clone()).collect();
        let listener = self.listener.read().clone();
        if let Some(listener) = listener {
            listener(&keys);
        }
        for (_, e) in &victims {
            remove_quietly(&path_of(&self.root, e.hash, e.slot));
        }
        let mut index = self.index.write();
        for (_, e) in &victims {
            index.paths.remove(&(e.hash, e.slot));
        }
    }

    /// The (hash, slot) a key is or will be stored at; reserves a slot for a new key.
    /// Caller holds the writer lock.
    fn place(&self, key: &str) -> Result<(u64, u16, Option<Entry>), StorageError> {
        let mut index = self.index.write();
        if let Some(e) = index.map.get(key) {
            return Ok((e.hash, e.slot, Some(*e)));
        }
        let hash = key_hash(key);
        for slot in 0..MAX_SLOTS {
            if let Some(owner) = index.paths.get(&(hash, slot)) {
                if owner == key {
                    return Ok((hash, slot, None));
                }
                continue;
            }
            index.paths.insert((hash, slot), key.to_string());
            return Ok((hash, slot, None));
        }
        Err(StorageError::InvalidKey(
            "too many keys share this key's hash",
        ))
    }

    fn release_slot(&self, key: &str, hash: u64, slot: u16) {
        let mut index = self.index.write();
        if !index.map.contains_key(key) && index.paths.get(&(hash, slot)).is_some_and(|k| k == key)
        {
            index.paths.remove(&(hash, slot));
        }
    }

    fn commit(&self, key: &str, entry: Entry) {
        {
            let mut index = self.index.write();
            if let Some(old) = index.map.insert(key.to_string(), entry) {
                index.used_bytes -= old.size;
            }
            index.used_bytes += entry.size;
        }
        self.order.lock().insert(key.to_string(), entry.size);
    }

    fn lookup(&self, key: &str) -> Result<Entry, StorageError> {
        check_key(key, &self.config.limits)?;
        self.index
            .read()
            .map
            .get(key)
            .copied()
            .ok_or(StorageError::NotFound)
    }

    fn read_one(&self, key: &str, entry: Entry, buf: &mut [u8]) -> Result<u64, StorageError> {
        let path = path_of(&self.root, entry.hash, entry.slot);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NotFound)
            }
            Err(e) => {
                return Err(StorageError::Io {
                    op: "open",
                    source: e,
                })
            }
        };
        let corrupt = |reason: String| StorageError::Corrupt {
            key: key.to_string(),
            reason,
        };
        let mut hdr = [0u8; HEADER_BYTES];
        let file_len = file.metadata().map_err(io("read"))?.len();
        if file_len < HEADER_BYTES as u64 {
            return Err(corrupt(record::RecordError::Truncated.to_string()));
        }
        file.read_exact_at(&mut hdr, 0).map_err(io("read"))?;
        let header = RecordHeader::decode(
            &hdr,
            MAGIC_FILE,
            self.config.limits.max_key_bytes,
            self.config.limits.max_value_bytes,
        )
        .map_err(|e| corrupt(e.to_string()))?;
        if header.record_bytes() != file_len {
            return Err(corrupt(record::RecordError::Truncated.to_string()));
        }
        let mut stored_key = vec![0u8; header.key_len as usize];
        file.read_exact_at(&mut stored_key, HEADER_BYTES as u64)
            .map_err(io("read"))?;
        record::check_key(&hdr, &stored_key).map_err(|e| corrupt(e.to_string()))?;
        if stored_key != key.as_bytes() {
            return Err(corrupt(record::RecordError::KeyMismatch.to_string()));
        }
        let len = header.value_len;
        if (buf.len() as u64) < len {
            return Err(StorageError::BufferTooSmall {
                buffer: buf.len(),
                value: len,
            });
        }
        let value = &mut buf[..len as usize];
        file.read_exact_at(value, HEADER_BYTES as u64 + u64::from(header.key_len))
            .map_err(io("read"))?;
        record::check_value(&header, value).map_err(|e| corrupt(e.to_string()))?;
        Ok(len)
    }

    /// Drops a record whose read failed its checks, if the index still points at it.
    fn drop_corrupt(&self, key: &str, seq: u64) {
        let _w = self.writer.lock();
        let removed = {
            let mut index = self.index.write();
            match index.map.get(key) {
                Some(e) if e.seq == seq => {
                    let e = *e;
                    index.map.remove(key);
                    index.used_bytes -= e.size;
                    Some(e)
                }
                _ => None,
            }
        };
        if let Some(e) = removed {
            self.order.lock().remove(&key.to_string());
            remove_quietly(&path_of(&self.root, e.hash, e.slot));
            self.index.write().paths.remove(&(e.hash, e.slot));
        }
    }
}

fn is_hex_dir(p: &Path, len: usize) -> bool {
    p.is_dir()
        && p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.len() == len && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io("open"))? {
        out.push(e.map_err(io("open"))?.path());
    }
    out.sort();
    Ok(out)
}

fn remove_quietly(path: &Path) {
    let _ = fs::remove_file(path);
}

/// Reads and checks one file's header and key at start-up.
fn recover_one(
    path: &Path,
    hash: u64,
    config: &BackendConfig,
) -> Result<(String, RecordHeader), record::RecordError> {
    let file = File::open(path).map_err(|_| record::RecordError::Truncated)?;
    let len = file
        .metadata()
        .map_err(|_| record::RecordError::Truncated)?
        .len();
    let mut hdr = [0u8; HEADER_BYTES];
    if len < HEADER_BYTES as u64 {
        return Err(record::RecordError::Truncated);
    }
    file.read_exact_at(&mut hdr, 0)
        .map_err(|_| record::RecordError::Truncated)?;
    let header = RecordHeader::decode(
        &hdr,
        MAGIC_FILE,
        config.limits.max_key_bytes,
        config.limits.max_value_bytes,
    )?;
    if header.record_bytes() != len || header.is_tombstone() {
        return Err(record::RecordError::Truncated);
    }
    let mut key = vec![0u8; header.key_len as usize];
    file.read_exact_at(&mut key, HEADER_BYTES as u64)
        .map_err(|_| record::RecordError::Truncated)?;
    record::check_key(&hdr, &key)?;
    let key = String::from_utf8(key).map_err(|_| record::RecordError::KeyMismatch)?;
    if key.is_empty() || key_hash(&key) != hash {
        return Err(record::RecordError::KeyMismatch);
    }
    Ok((key, header))
}

fn write_temp(path: &Path, head: &[u8], value: &[u8], sync: bool) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(head)?;
    f.write_all(value)?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

struct Pending<'a> {
    index: usize,
    key: &'a str,
    hash: u64,
    slot: u16,
    seq: u64,
    size: u64,
    tmp: PathBuf,
}

impl FileBackend {
    /// Entry `i` written to a temporary file in its slot (the slot placed, the space checked,
    /// the directory created and, with `always`, made durable); the slot is released on failure.
    fn stage<'a>(
        &self,
        i: usize,
        key: &'a str,
        value: &[u8],
        always: bool,
    ) -> Result<Pending<'a>, StorageError> {
        let size = value.len() as u64;
        let (hash, slot, old) = self.place(key)?;
        let used = self.index.read().used_bytes;
        let after = used - old.map_or(0, |e| e.size) + size;
        if after > self.config.capacity_bytes {
            self.release_slot(key, hash, slot);
            return Err(StorageError::NoSpace {
                needed: size,
                available: self.config.capacity_bytes.saturating_sub(used),
            });
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let dir = dir_of(&self.root, hash);
        if !dir.is_dir() {
            if let Err(e) = fs::create_dir_all(&dir) {
                self.release_slot(key, hash, slot);
                return Err(StorageError::Io {
                    op: "write",
                    source: e,
                });
            }
            if always {
                // The new directories must be durable before a record inside them is.
                let parents = dir.parent().map(Path::to_path_buf).into_iter();
                let synced = parents
                    .chain(std::iter::once(self.root.clone()))
                    .try_for_each(|d| sync_dir(&d));
                if let Err(e) = synced {
                    self.release_slot(key, hash, slot);
                    return Err(e);
                }
            }
        }
        let final_path = path_of(&self.root, hash, slot);
        let tmp = final_path.with_extension(format!("{seq}.tmp"));
        let header = RecordHeader {
            flags: 0,
            key_len: key.len() as u32,
            value_crc: crc32c::crc32c(value),
            value_len: size,
            seq,
        };
        let head = header.encode(MAGIC_FILE, key.as_bytes());
        if let Err(e) = write_temp(&tmp, &head, value, always) {
            remove_quietly(&tmp);
            self.release_slot(key, hash, slot);
            return Err(StorageError::Io {
                op: "write",
                source: e,
            });
        }
        Ok(Pending {
            index: i,
            key,
            hash,
            slot,
            seq,
            size,
            tmp,
        })
    }

    /// Renames the staged temporary files into place and commits them to the index.
    /// Batch: one syncfs makes every temp file durable, the renames follow, and a second
    /// syncfs makes the renames (and any new directories) durable: two flushes per batch
    /// instead of one fdatasync per file. None: renames only.
    fn publish_pending(
        &self,
        mut pending: Vec<Pending<'_>>,
        results: &mut [Result<(), StorageError>],
    ) {
        let batch = self.config.durability == Durability::Batch;
        if batch && !pending.is_empty() {
            if let Err(e) = self.syncfs() {
                for p in pending.drain(..) {
                    remove_quietly(&p.tmp);
                    self.release_slot(p.key, p.hash, p.slot);
                    results[p.index] = Err(StorageError::Io {
                        op: "sync",
                        source: std::io::Error::new(io_kind(&e), e.to_string()),
                    });
                }
            }
        }
        let mut renamed = Vec::new();
        for p in &pending {
            let final_path = path_of(&self.root, p.hash, p.slot);
            match fs::rename(&p.tmp, &final_path) {
                Ok(()) => renamed.push(p),
                Err(e) => {
                    remove_quietly(&p.tmp);
                    self.release_slot(p.key, p.hash, p.slot);
                    results[p.index] = Err(StorageError::Io {
                        op: "write",
                        source: e,
                    });
                }
            }
        }
        if batch && !renamed.is_empty() {
            if let Err(e) = self.syncfs() {
                // The renames happened but may not be durable: report the entries as failed
                // (the objects stay stored and readable; the caller may retry).
                for p in &renamed {
                    results[p.index] = Err(StorageError::Io {
                        op: "sync",
                        source: std::io::Error::new(io_kind(&e), e.to_string()),
                    });
                }
            }
        }
        for p in renamed {
            self.commit(
                p.key,
                Entry {
                    hash: p.hash,
                    slot: p.slot,
                    size: p.size,
                    seq: p.seq,
                },
            );
        }
    }
}

impl StorageBackend for FileBackend {
    fn name(&self) -> &'static str {
        "file"
    }

    fn put_batch(&self, entries: &[(&str, &[u8])]) -> Vec<Result<(), StorageError>> {
        let closed = self.closed.load(Ordering::Acquire);
        let max = self.config.limits.max_batch_entries;
        if let Some(refused) = refuse_batch(closed, entries.len(), max, true) {
            return refused;
        }
        let limits = self.config.limits;
        let mut results: Vec<Result<(), StorageError>> = entries
            .iter()
            .map(|(k, v)| check_entry(k, v.len() as u64, &limits))
            .collect();
        let _w = self.writer.lock();
        if self.closed.load(Ordering::Acquire) {
            return refuse_all(entries.len(), || StorageError::Closed);
        }
        let incoming: u64 = entries
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|((_, v), _)| v.len() as u64)
            .sum();
        self.evict_for(incoming);
        let always = self.config.durability == Durability::Always;
        let mut pending: Vec<Pending<'_>> = Vec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            if results[i].is_err() {
                continue;
            }
            match self.stage(i, key, value, always) {
                Err(e) => results[i] = Err(e),
                Ok(p) if always => {
                    let final_path = path_of(&self.root, p.hash, p.slot);
                    results[i] = self.finish(&p, &final_path, true);
                }
                Ok(p) => pending.push(p),
            }
        }
        self.publish_pending(pending, &mut results);
        results
    }

    fn get_batch(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64, StorageError>> {
        let closed = self.closed.load(Ordering::Acquire);
        let max = self.config.limits.max_batch_entries;
        let lengths_match = buffers.len() == keys.len();
        if let Some(refused) = refuse_batch(closed, keys.len(), max, lengths_match) {
            return refused;
        }
        let mut out = Vec::with_capacity(keys.len());
        for (key, buf) in keys.iter().zip(buffers.iter_mut()) {
            let entry = match self.lookup(key) {
                Ok(e) => e,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            let r = self.read_one(key, entry, buf);
            match &r {
                Ok(_) => self.order.lock().touch(&key.to_string()),
                // Dropped only if the index still holds the copy this read found broken.
                Err(StorageError::Corrupt { .. }) => self.drop_corrupt(key, entry.seq),
                Err(_) => {}
            }
            out.push(r);
        }
        out
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        self.index.read().map.get(key).map(|e| e.size)
    }

    fn remove(&self, key: &str) -> Result<bool, StorageError> {
        self.check_open()?;
        check_key(key, &self.config.limits)?;
        let _w = self.writer.lock();
        let Some(e) = self.index.read().map.get(key).copied() else {
            return Ok(false);
        };
        let path = path_of(&self.root, e.hash, e.slot);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(StorageError::Io {
                    op: "remove",
                    source: err,
                })
            }
        }
        if self.config.durability != Durability::None {
            sync_dir(&dir_of(&self.root, e.hash))?;
        }
        {
            let mut index = self.index.write();
            index.map.remove(key);
            index.paths.remove(&(e.hash, e.slot));
            index.used_bytes -= e.size;
        }
        self.order.lock().remove(&key.to_string());
        Ok(true)
    }

    fn scan(&self) -> Vec<ObjectInfo> {
        self.index
            .read()
            .map
            .iter()
            .map(|(k, e)| ObjectInfo {
                key: k.clone(),
                size_bytes: e.size,
            })
            .collect()
    }

    fn usage(&self) -> Usage {
        let index = self.index.read();
        Usage {
            capacity_bytes: self.config.capacity_bytes,
            used_bytes: index.used_bytes,
            object_count: index.map.len() as u64,
        }
    }

    fn set_eviction_listener(&self, listener: EvictionListener) {
        *self.listener.write() = Some(Arc::new(listener));
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.check_open()?;
        let _w = self.writer.lock();
        if self.config.durability == Durability::None {
            self.syncfs()?;
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StorageError> {
        self.flush()?;
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

fn io_kind(e: &StorageError) -> std::io::ErrorKind {
    match e {
        StorageError::Io { source, .. } => source.kind(),
        _ => std::io::ErrorKind::Other,
    }
}

impl FileBackend {
    /// Flushes the whole file system holding the store (`syncfs`).
    fn syncfs(&self) -> Result<(), StorageError> {
        let root = File::open(&self.root).map_err(io("sync"))?;
        rustix::fs::syncfs(&root).map_err(|e| StorageError::Io {
            op: "sync",
            source: e.into(),
        })
    }

    /// Always-durability tail of one write: rename, directory fsync, index update.
    fn finish(&self, p: &Pending<'_>, final_path: &Path, sync: bool) -> Result<(), StorageError> {
        if let Err(e) = fs::rename(&p.tmp, final_path) {
            remove_quietly(&p.tmp);
            self.release_slot(p.key, p.hash, p.slot);
            return Err(StorageError::Io {
                op: "write",
                source: e,
            });
        }
        self.commit(
            p.key,
            Entry {
                hash: p.hash,
                slot: p.slot,
                size: p.size,
                seq: p.seq,
            },
        );
        if sync {
            sync_dir(&dir_of(&self.root, p.hash))?;
        }
        Ok(())
    }
}
