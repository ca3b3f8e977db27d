//! Bucket backend: objects packed into `<id>.bucket` data files, each with a `<id>.meta` file.
//!
//! A data file is a sequence of records of the shared format ([`crate::record`], magic `MCBK`):
//! header with key, value length, sequence number and CRC-32C, then key, then value, no padding.
//! A tombstone record (flag bit 0, no value) marks a key removed while its bucket was open.
//! The `.meta` file (format in `docs/storage.md`) lists the live records of a *sealed* bucket and
//! the data file's length, under its own CRC-32C.
//!
//! Writes append to the one *open* bucket and are acknowledged once written per [`Durability`]
//! (`Batch`: one fdatasync per `put_batch`; `Always`: one per record; `None`: page cache only),
//! so no acknowledged object waits in memory for its bucket to fill. The open bucket is *sealed*
//! (its `.meta` written: temp → fsync → rename → fsync dir) when it reaches
//! `bucket_size_limit_bytes` or `bucket_keys_limit` records, when it is older than
//! `seal_after_ms` at the next write, on `flush` and on `close`.
//!
//! Start-up: every bucket whose `.meta` is intact and whose data-file length equals the length
//! recorded there is loaded from the meta. Any other data file (no meta — the open bucket of a
//! crashed process —, corrupt meta, or length mismatch) is scanned record by record: a record
//! whose header+key checksum fails ends the scan (its length cannot be trusted) and the file is
//! truncated there; a record whose value checksum fails is skipped. The survivors are sealed.
//! Later records (higher bucket id, then higher offset) win over earlier ones. Sealed buckets are
//! immutable; removing or overwriting a key that lives in one rewrites its meta (temp + rename),
//! and a bucket with no live key left is deleted.
//!
//! Eviction works on whole sealed buckets (FIFO: oldest id; LRU: least recently read or written),
//! in upstream's order: index → listener → delete `.meta` → delete `.bucket`. Space accounting
//! (`used_bytes`) counts live values; bytes of dead records in a bucket are reclaimed only when
//! the bucket is deleted.

use crate::backend::{
    BackendConfig, Durability, EvictionListener, ObjectInfo, StorageBackend, StorageError, Usage,
};
use crate::eviction::{bytes_to_free, EvictionOrder};
use crate::fd_cache::FdCache;
use crate::record::{self, RecordHeader, FLAG_TOMBSTONE, HEADER_BYTES, MAGIC_BUCKET};
use crate::util::{check_entry, check_key, io, refuse_all, refuse_batch, sync_dir};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Knobs of the bucket backend (upstream's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketOptions {
    /// Seal the open bucket once its data file reaches this size (upstream 256 MiB).
    pub bucket_size_limit_bytes: u64,
    /// Seal the open bucket once it holds this many records (upstream 500).
    pub bucket_keys_limit: usize,
    /// Seal the open bucket at the next write once it is this old.
    pub seal_after_ms: u64,
}

impl Default for BucketOptions {
    fn default() -> Self {
        BucketOptions {
            bucket_size_limit_bytes: 256 << 20,
            bucket_keys_limit: 500,
            seal_after_ms: 1000,
        }
    }
}

/// Where a live object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    bucket: u64,
    offset: u64,
    size: u64,
}

/// Live records of one bucket: key → (record offset, value length).
type Live = BTreeMap<String, (u64, u64)>;

#[derive(Debug, Default)]
struct Index {
    map: HashMap<String, Loc>,
    /// Live records of every sealed bucket.
    sealed: BTreeMap<u64, SealedBucket>,
    used_bytes: u64,
}

#[derive(Debug)]
struct SealedBucket {
    live: Live,
    data_len: u64,
}

#[derive(Debug)]
struct OpenBucket {
    id: u64,
    file: File,
    len: u64,
    records: usize,
    live: Live,
    opened_at: Instant,
    /// Bytes appended since the last fdatasync.
    dirty: bool,
}

#[derive(Debug)]
struct Writer {
    open: Option<OpenBucket>,
    next_id: u64,
}

/// The bucket backend. See the module docs.
pub struct BucketBackend {
    root: PathBuf,
    config: BackendConfig,
    options: BucketOptions,
    writer: Mutex<Writer>,
    index: RwLock<Index>,
    /// Sealed buckets in eviction order. Lock order: `writer` → `order` → `index`.
    order: Mutex<EvictionOrder<u64>>,
    handles: FdCache<u64>,
    listener: RwLock<Option<Arc<EvictionListener>>>,
    closed: AtomicBool,
    next_seq: AtomicU64,
}

impl std::fmt::Debug for BucketBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketBackend")
            .field("root", &self.root)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn data_path(root: &Path, id: u64) -> PathBuf {
    root.join(format!("{id}.bucket"))
}

fn meta_path(root: &Path, id: u64) -> PathBuf {
    root.join(format!("{id}.meta"))
}

fn remove_quietly(path: &Path) {
    let _ = fs::remove_file(path);
}

// ------------------------------------------------------------------------------------------------
// .meta format

pub const META_MAGIC: [u8; 4] = *b"MCBM";
pub const META_VERSION: u16 = 1;
const META_HEADER_BYTES: usize = 32;
const META_ENTRY_FIXED_BYTES: usize = 20;

/// Encodes a bucket's meta: header, entries `{offset u64, value_len u64, key_len u32, key}`,
/// then CRC-32C of everything before it.
pub fn encode_meta(bucket_id: u64, data_len: u64, live: &BTreeMap<String, (u64, u64)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        META_HEADER_BYTES + live.keys().map(|k| k.len() + 20).sum::<usize>() + 4,
    );
    out.extend_from_slice(&META_MAGIC);
    out.extend_from_slice(&META_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&bucket_id.to_le_bytes());
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&(live.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for (key, (offset, value_len)) in live {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&value_len.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A decoded meta file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub bucket_id: u64,
    pub data_len: u64,
    pub live: BTreeMap<String, (u64, u64)>,
}

/// Decodes and checks a meta file; `None` when anything is off (the data file is then scanned).
pub fn decode_meta(bytes: &[u8], max_key_bytes: usize) -> Option<Meta> {
    if bytes.len() < META_HEADER_BYTES + 4 {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    let u16_at = |i: usize| u16::from_le_bytes([body[i], body[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[i..i + 8]);
        u64::from_le_bytes(b)
    };
    if body[0..4] != META_MAGIC || u16_at(4) != META_VERSION || u16_at(6) != 0 || u32_at(28) != 0 {
        return None;
    }
    let bucket_id = u64_at(8);
    let data_len = u64_at(16);
    let count = u32_at(24) as usize;
    if count > (body.len() - META_HEADER_BYTES) / META_ENTRY_FIXED_BYTES {
        return None;
    }
    let mut live = BTreeMap::new();
    let mut at = META_HEADER_BYTES;
    for _ in 0..count {
        if at + META_ENTRY_FIXED_BYTES > body.len() {
            return None;
        }
        let offset = u64_at(at);
        let value_len = u64_at(at + 8);
        let key_len = u32_at(at + 16) as usize;
        at += META_ENTRY_FIXED_BYTES;
        if key_len == 0 || key_len > max_key_bytes || at + key_len > body.len() {
            return None;
        }
        let key = std::str::from_utf8(&body[at..at + key_len])
            .ok()?
            .to_string();
        at += key_len;
        let end = offset
            .checked_add(HEADER_BYTES as u64 + key_len as u64)?
            .checked_add(value_len)?;
        if end > data_len {
            return None;
        }
        live.insert(key, (offset, value_len));
    }
    (at == body.len()).then_some(Meta {
        bucket_id,
        data_len,
        live,
    })
}

// ------------------------------------------------------------------------------------------------
// recovery

enum Op {
    Put(String, u64, u64),
    Del(String),
}

/// Scans a data file record by record. Returns the operations of the intact records, in order,
/// and the length of the intact prefix.
fn scan_data(file: &File, config: &BackendConfig) -> Result<(Vec<Op>, u64), StorageError> {
    let file_len = file.metadata().map_err(io("read"))?.len();
    let mut ops = Vec::new();
    let mut at = 0u64;
    let mut value = Vec::new();
    while at + HEADER_BYTES as u64 <= file_len {
        let mut hdr = [0u8; HEADER_BYTES];
        file.read_exact_at(&mut hdr, at).map_err(io("read"))?;
        let Ok(header) = RecordHeader::decode(
            &hdr,
            MAGIC_BUCKET,
            config.limits.max_key_bytes,
            config.limits.max_value_bytes,
        ) else {
            break;
        };
        let end = at.saturating_add(header.record_bytes());
        if end > file_len || header.key_len == 0 {
            break;
        }
        let mut key = vec![0u8; header.key_len as usize];
        file.read_exact_at(&mut key, at + HEADER_BYTES as u64)
            .map_err(io("read"))?;
        if record::check_key(&hdr, &key).is_err() {
            break;
        }
        // Header and key are intact, so the record's length is trustworthy from here on.
        let Ok(key) = String::from_utf8(key) else {
            at = end;
            continue;
        };
        if header.is_tombstone() {
            if header.value_len == 0 {
                ops.push(Op::Del(key));
            }
        } else {
            value.resize(header.value_len as usize, 0);
            file.read_exact_at(
                &mut value,
                at + HEADER_BYTES as u64 + u64::from(header.key_len),
            )
            .map_err(io("read"))?;
            if record::check_value(&header, &value).is_ok() {
                ops.push(Op::Put(key, at, header.value_len));
            }
        }
        at = end;
    }
    Ok((ops, at))
}

/// The most bytes start-up reads from one `.meta` file; a larger one is treated as corrupt.
pub const MAX_META_BYTES: u64 = 256 << 20;

fn read_meta_bounded(path: &Path) -> Option<Vec<u8>> {
    let len = fs::metadata(path).ok()?.len();
    if len > MAX_META_BYTES {
        return None;
    }
    fs::read(path).ok()
}

fn list_ids(root: &Path) -> Result<BTreeSet<u64>, StorageError> {
    let mut ids = BTreeSet::new();
    for e in fs::read_dir(root).map_err(io("open"))? {
        let e = e.map_err(io("open"))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".meta.tmp") {
            remove_quietly(&e.path());
            continue;
        }
        let stem = name
            .strip_suffix(".bucket")
            .or_else(|| name.strip_suffix(".meta"));
        if let Some(id) = stem.and_then(|s| s.parse::<u64>().ok()) {
            if stem == Some(id.to_string().as_str()) {
                ids.insert(id);
            }
        }
    }
    Ok(ids)
}

/// Applies one bucket's recovered records to the index in order: a later put of a key moves it
/// out of its older bucket (which is marked dirty and remembers the key that `left` it), a delete
/// drops it.
fn replay_ops(
    index: &mut Index,
    id: u64,
    ops: Vec<Op>,
    dirty: &mut BTreeSet<u64>,
    left: &mut BTreeMap<u64, Vec<String>>,
) {
    for op in ops {
        match op {
            Op::Put(key, offset, size) => {
                let loc = Loc {
                    bucket: id,
                    offset,
                    size,
                };
                if let Some(old) = index.map.insert(key.clone(), loc) {
                    index.used_bytes -= old.size;
                    if let Some(b) = index.sealed.get_mut(&old.bucket) {
                        b.live.remove(&key);
                    }
                    if old.bucket != id {
                        dirty.insert(old.bucket);
                        left.entry(old.bucket).or_default().push(key.clone());
                    }
                }
                index.used_bytes += size;
                if let Some(b) = index.sealed.get_mut(&id) {
                    b.live.insert(key, (offset, size));
                }
            }
            Op::Del(key) => {
                if let Some(old) = index.map.remove(&key) {
                    index.used_bytes -= old.size;
                    if let Some(b) = index.sealed.get_mut(&old.bucket) {
                        b.live.remove(&key);
                    }
                    dirty.insert(old.bucket);
                    if old.bucket != id {
                        left.entry(old.bucket).or_default().push(key);
                    }
                }
            }
        }
    }
}

/// Persists what recovery changed: new metas for scanned buckets, rewritten metas for buckets
/// that lost keys, deletion of empty buckets.
fn persist_recovery(
    root: &Path,
    index: &mut Index,
    dirty: BTreeSet<u64>,
    left: &BTreeMap<u64, Vec<String>>,
    durable: bool,
) -> Result<(), StorageError> {
    // Persist what recovery changed: new metas for scanned buckets, rewritten metas for
    // buckets that lost keys, deletion of empty buckets.
    // Keys that left a bucket because of a later record get a tombstone in it (as in normal
    // operation), so that a later scan of that bucket cannot resurrect them.
    for id in dirty {
        let Some(b) = index.sealed.get_mut(&id) else {
            continue;
        };
        if b.live.is_empty() {
            index.sealed.remove(&id);
            remove_quietly(&data_path(root, id));
            remove_quietly(&meta_path(root, id));
        } else {
            if let Some(keys) = left.get(&id) {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                b.data_len = append_tombstones(root, id, b.data_len, &keys, 0, durable)?;
            }
            write_meta(root, id, b.data_len, &b.live, durable)?;
        }
    }
    let empty: Vec<u64> = index
        .sealed
        .iter()
        .filter(|(_, b)| b.live.is_empty())
        .map(|(id, _)| *id)
        .collect();
    for id in empty {
        index.sealed.remove(&id);
        remove_quietly(&data_path(root, id));
        remove_quietly(&meta_path(root, id));
    }
    Ok(())
}

impl BucketBackend {
    /// Opens or recovers the store under `config.root` with default [`BucketOptions`].
    pub fn open(config: BackendConfig) -> Result<BucketBackend, StorageError> {
        Self::open_with(config, BucketOptions::default())
    }

    /// Opens or recovers the store under `config.root`.
    pub fn open_with(
        config: BackendConfig,
        options: BucketOptions,
    ) -> Result<BucketBackend, StorageError> {
        config.validate()?;
        if options.bucket_size_limit_bytes == 0 || options.bucket_keys_limit == 0 {
            return Err(StorageError::InvalidConfig(
                "bucket limits must be > 0".into(),
            ));
        }
        let root = config.root.clone();
        fs::create_dir_all(&root).map_err(io("open"))?;
        let durable = config.durability != Durability::None;
        let mut index = Index::default();
        let mut max_id = 0u64;
        let mut dirty: BTreeSet<u64> = BTreeSet::new();
        let mut left: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for id in list_ids(&root)? {
            max_id = max_id.max(id);
            let dpath = data_path(&root, id);
            let mpath = meta_path(&root, id);
            let file = match OpenOptions::new().read(true).write(true).open(&dpath) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    remove_quietly(&mpath);
                    continue;
                }
                Err(e) => {
                    return Err(StorageError::Io {
                        op: "open",
                        source: e,
                    })
                }
            };
            let data_len = file.metadata().map_err(io("open"))?.len();
            let meta = read_meta_bounded(&mpath)
                .and_then(|b| decode_meta(&b, config.limits.max_key_bytes))
                .filter(|m| m.bucket_id == id && m.data_len == data_len);
            let ops: Vec<Op> = match meta {
                Some(m) => {
                    let mut v: Vec<(u64, Op)> = m
                        .live
                        .into_iter()
                        .map(|(k, (o, s))| (o, Op::Put(k, o, s)))
                        .collect();
                    v.sort_by_key(|(o, _)| *o);
                    v.into_iter().map(|(_, op)| op).collect()
                }
                None => {
                    let (ops, good_len) = scan_data(&file, &config)?;
                    if good_len != data_len {
                        file.set_len(good_len).map_err(io("write"))?;
                    }
                    if durable {
                        file.sync_all().map_err(io("sync"))?;
                    }
                    dirty.insert(id);
                    ops
                }
            };
            let final_len = file.metadata().map_err(io("open"))?.len();
            index.sealed.insert(
                id,
                SealedBucket {
                    live: Live::new(),
                    data_len: final_len,
                },
            );
            replay_ops(&mut index, id, ops, &mut dirty, &mut left);
        }
        persist_recovery(&root, &mut index, dirty, &left, durable)?;
        if durable {
            sync_dir(&root)?;
        }
        let mut order = EvictionOrder::new(config.eviction.policy);
        for (id, b) in &index.sealed {
            order.insert(*id, b.live.values().map(|(_, s)| *s).sum());
        }
        let now_ids = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() << 12)
            .unwrap_or(0);
        let max_open = config.limits.max_open_files;
        Ok(BucketBackend {
            root,
            options,
            writer: Mutex::new(Writer {
                open: None,
                next_id: (max_id + 1).max(now_ids),
            }),
            index: RwLock::new(index),
            order: Mutex::new(order),
            handles: FdCache::new(max_open),
            listener: RwLock::new(None),
            closed: AtomicBool::new(false),
            // Informational in bucket records: order comes from (bucket id, offset).
            next_seq: AtomicU64::new(1),
            config,
        })
    }

    fn durable(&self) -> bool {
        self.config.durability != Durability::None
    }

    /// Seals the open bucket: data fsync, meta written durably, bucket handed to eviction.
    fn seal(&self, w: &mut Writer) -> Result<(), StorageError> {
        let Some(open) = w.open.take() else {
            return Ok(());
        };
        if self.durable() && open.dirty {
            open.file.sync_data().map_err(io("sync"))?;
        }
        if open.live.is_empty() {
            remove_quietly(&data_path(&self.root, open.id));
            self.handles.forget(&open.id);
            return Ok(());
        }
        write_meta(&self.root, open.id, open.len, &open.live, self.durable())?;
        let live_bytes = open.live.values().map(|(_, s)| *s).sum();
        let mut order = self.order.lock();
        let mut index = self.index.write();
        index.sealed.insert(
            open.id,
            SealedBucket {
                live: open.live,
                data_len: open.len,
            },
        );
        order.insert(open.id, live_bytes);
        Ok(())
    }

    fn create_bucket(&self, w: &mut Writer) -> Result<(), StorageError> {
        let id = w.next_id;
        w.next_id += 1;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(data_path(&self.root, id))
            .map_err(io("write"))?;
        if self.durable() {
            sync_dir(&self.root)?;
        }
        w.open = Some(OpenBucket {
            id,
            file,
            len: 0,
            records: 0,
            live: Live::new(),
            opened_at: Instant::now(),
            dirty: false,
        });
        Ok(())
    }

    /// Appends one record to the open bucket (creating it if needed); returns its offset.
    fn append(
        &self,
        w: &mut Writer,
        key: &str,
        value: &[u8],
        flags: u16,
    ) -> Result<(u64, u64), StorageError> {
        if w.open.is_none() {
            self.create_bucket(w)?;
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let header = RecordHeader {
            flags,
            key_len: key.len() as u32,
            value_crc: crc32c::crc32c(value),
            value_len: value.len() as u64,
            seq,
        };
        let head = header.encode(MAGIC_BUCKET, key.as_bytes());
        let Some(open) = w.open.as_mut() else {
            return Err(StorageError::Closed);
        };
        let at = open.len;
        let written = open
            .file
            .write_all_at(&head, at)
            .and_then(|()| open.file.write_all_at(value, at + head.len() as u64));
        if let Err(e) = written {
            // Cut the partial record off; if even that fails, seal here (the meta records the
            // good length, and start-up truncates the rest).
            if open.file.set_len(at).is_err() {
                let _ = self.seal(w);
            }
            return Err(StorageError::Io {
                op: "write",
                source: e,
            });
        }
        open.len = at + header.record_bytes();
        open.records += 1;
        open.dirty = true;
        if self.config.durability == Durability::Always {
            open.file.sync_data().map_err(io("sync"))?;
            open.dirty = false;
        }
        Ok((at, seq))
    }

    fn open_is_full(&self, w: &Writer) -> bool {
        w.open.as_ref().is_some_and(|o| {
            o.len >= self.options.bucket_size_limit_bytes
                || o.records >= self.options.bucket_keys_limit
        })
    }

    /// Forgets `key` in the sealed bucket `id`: meta rewritten, or the bucket deleted when empty.
    fn drop_from_sealed(&self, id: u64, key: &str) -> Result<(), StorageError> {
        let (now_empty, data_len, live) = {
            let mut index = self.index.write();
            let Some(b) = index.sealed.get_mut(&id) else {
                return Ok(());
            };
            b.live.remove(key);
            (b.live.is_empty(), b.data_len, b.live.clone())
        };
        if now_empty {
            {
                let mut order = self.order.lock();
                order.remove(&id);
                self.index.write().sealed.remove(&id);
            }
            self.delete_bucket_files(id);
            if self.durable() {
                sync_dir(&self.root)?;
            }
            Ok(())
        } else {
            // A tombstone in the bucket's own data file, so that a scan of it (if its meta is
            // ever lost or damaged) cannot bring the key back; then the meta, which covers the
            // new length.
            let new_len = self.append_tombstone_to_sealed(id, data_len, key)?;
            if let Some(b) = self.index.write().sealed.get_mut(&id) {
                b.data_len = new_len;
            }
            self.order
                .lock()
                .set_size(&id, live.values().map(|(_, s)| *s).sum());
            write_meta(&self.root, id, new_len, &live, self.durable())
        }
    }

    /// Appends a TOMBSTONE for `key` at `data_len` of sealed bucket `id`; returns the new length.
    fn append_tombstone_to_sealed(
        &self,
        id: u64,
        data_len: u64,
        key: &str,
    ) -> Result<u64, StorageError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        append_tombstones(&self.root, id, data_len, &[key], seq, self.durable())
    }

    /// Deletes a bucket's files: data first, then meta. A crash between leaves a meta without
    /// data, which start-up deletes; the other order would leave data without meta, which
    /// start-up treats as an unsealed bucket and scans — resurrecting what was dropped.
    fn delete_bucket_files(&self, id: u64) {
        self.handles.forget(&id);
        remove_quietly(&data_path(&self.root, id));
        remove_quietly(&meta_path(&self.root, id));
    }

    /// Evicts whole sealed buckets until `incoming` fits. Caller holds the writer lock.
    fn evict_for(&self, w: &mut Writer, incoming: u64) {
        if !self.config.eviction.enabled {
            return;
        }
        let used = self.index.read().used_bytes;
        let need = match bytes_to_free(
            &self.config.eviction,
            self.config.capacity_bytes,
            used,
            incoming,
        ) {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        let mut victims = Vec::new();
        let mut keys = Vec::new();
        let mut freed = 0u64;
        while freed < need {
            let victim = self.order.lock().pop_victim();
            let id = match victim {
                Some((id, _)) => id,
                None if w.open.as_ref().is_some_and(|o| !o.live.is_empty()) => {
                    // Only the open bucket is left: seal it so it can go too.
                    if self.seal(w).is_err() {
                        break;
                    }
                    continue;
                }
                None => break,
            };
            let mut index = self.index.write();
            if let Some(b) = index.sealed.remove(&id) {
                for (key, _) in b.live {
                    if let Some(loc) = index.map.get(&key).copied() {
                        if loc.bucket == id {
                            index.map.remove(&key);
                            index.used_bytes -= loc.size;
                            freed += loc.size;
                            keys.push(key);
                        }
                    }
                }
            }
            victims.push(id);
        }
        if victims.is_empty() {
            return;
        }
        let listener = self.listener.read().clone();
        if let (Some(listener), false) = (listener, keys.is_empty()) {
            listener(&keys);
        }
        for id in victims {
            self.delete_bucket_files(id);
        }
        if self.durable() {
            let _ = sync_dir(&self.root);
        }
    }

    fn lookup(&self, key: &str) -> Result<Loc, StorageError> {
        check_key(key, &self.config.limits)?;
        self.index
            .read()
            .map
            .get(key)
            .copied()
            .ok_or(StorageError::NotFound)
    }

    fn read_one(&self, key: &str, loc: Loc, buf: &mut [u8]) -> Result<u64, StorageError> {
        let file = self
            .handles
            .get_or_open(&loc.bucket, || {
                File::open(data_path(&self.root, loc.bucket))
            })
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    StorageError::NotFound
                } else {
                    StorageError::Io {
                        op: "open",
                        source: e,
                    }
                }
            })?;
        let corrupt = |e: record::RecordError| StorageError::Corrupt {
            key: key.to_string(),
            reason: e.to_string(),
        };
        if (buf.len() as u64) < loc.size {
            return Err(StorageError::BufferTooSmall {
                buffer: buf.len(),
                value: loc.size,
            });
        }
        // Header and key in one read (the key's length is the requested key's).
        let mut head = vec![0u8; HEADER_BYTES + key.len()];
        read_at(&file, &mut head, loc.offset)
            .map_err(|e| e.unwrap_or_else(|| corrupt(record::RecordError::Truncated)))?;
        let mut hdr = [0u8; HEADER_BYTES];
        hdr.copy_from_slice(&head[..HEADER_BYTES]);
        let header = RecordHeader::decode(
            &hdr,
            MAGIC_BUCKET,
            self.config.limits.max_key_bytes,
            self.config.limits.max_value_bytes,
        )
        .map_err(corrupt)?;
        if header.is_tombstone()
            || header.value_len != loc.size
            || header.key_len as usize != key.len()
        {
            return Err(corrupt(record::RecordError::KeyMismatch));
        }
        let stored_key = &head[HEADER_BYTES..];
        record::check_key(&hdr, stored_key).map_err(corrupt)?;
        if stored_key != key.as_bytes() {
            return Err(corrupt(record::RecordError::KeyMismatch));
        }
        let value = &mut buf[..loc.size as usize];
        read_at(
            &file,
            value,
            loc.offset + HEADER_BYTES as u64 + key.len() as u64,
        )
        .map_err(|e| e.unwrap_or_else(|| corrupt(record::RecordError::Truncated)))?;
        record::check_value(&header, value).map_err(corrupt)?;
        Ok(loc.size)
    }

    /// Drops a record whose read failed its checks, if the index still points at it.
    fn drop_corrupt(&self, key: &str, loc: Loc) {
        let mut w = self.writer.lock();
        {
            let mut index = self.index.write();
            if index.map.get(key) != Some(&loc) {
                return;
            }
            index.map.remove(key);
            index.used_bytes -= loc.size;
        }
        if w.open.as_ref().is_some_and(|o| o.id == loc.bucket) {
            if let Some(o) = w.open.as_mut() {
                o.live.remove(key);
            }
            let _ = self.append(&mut w, key, &[], FLAG_TOMBSTONE);
        } else {
            let _ = self.drop_from_sealed(loc.bucket, key);
        }
    }
}

/// `read_exact_at`, with "file too short" told apart (`Err(None)`) from other I/O errors.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), Option<StorageError>> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            None
        } else {
            Some(StorageError::Io {
                op: "read",
                source: e,
            })
        }
    })
}

/// Appends one TOMBSTONE per key at `data_len` of bucket `id`'s data file (one write, one
/// fdatasync when `durable`); returns the new length.
fn append_tombstones(
    root: &Path,
    id: u64,
    data_len: u64,
    keys: &[&str],
    seq: u64,
    durable: bool,
) -> Result<u64, StorageError> {
    let mut bytes = Vec::new();
    for key in keys {
        let header = RecordHeader {
            flags: FLAG_TOMBSTONE,
            key_len: key.len() as u32,
            value_crc: crc32c::crc32c(&[]),
            value_len: 0,
            seq,
        };
        bytes.extend_from_slice(&header.encode(MAGIC_BUCKET, key.as_bytes()));
    }
    let file = OpenOptions::new()
        .write(true)
        .open(data_path(root, id))
        .map_err(io("write"))?;
    file.write_all_at(&bytes, data_len).map_err(io("write"))?;
    if durable {
        file.sync_data().map_err(io("sync"))?;
    }
    Ok(data_len + bytes.len() as u64)
}

fn write_meta(
    root: &Path,
    id: u64,
    data_len: u64,
    live: &Live,
    durable: bool,
) -> Result<(), StorageError> {
    let bytes = encode_meta(id, data_len, live);
    let tmp = root.join(format!("{id}.meta.tmp"));
    let written = (|| {
        use std::io::Write;
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        if durable {
            f.sync_data()?;
        }
        fs::rename(&tmp, meta_path(root, id))
    })();
    if let Err(e) = written {
        remove_quietly(&tmp);
        return Err(StorageError::Io {
            op: "write",
            source: e,
        });
    }
    if durable {
        sync_dir(root)?;
    }
    Ok(())
}

impl StorageBackend for BucketBackend {
    fn name(&self) -> &'static str {
        "bucket"
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
        let mut w = self.writer.lock();
        if self.closed.load(Ordering::Acquire) {
            return refuse_all(entries.len(), || StorageError::Closed);
        }
        if w.open.as_ref().is_some_and(|o| {
            o.opened_at.elapsed() >= Duration::from_millis(self.options.seal_after_ms)
        }) {
            let _ = self.seal(&mut w);
        }
        let incoming: u64 = entries
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|((_, v), _)| v.len() as u64)
            .sum();
        self.evict_for(&mut w, incoming);
        // (entry index, key, location) of every record written, committed after the sync.
        let mut written: Vec<(usize, &str, Loc)> = Vec::new();
        let mut pending: HashMap<&str, u64> = HashMap::new();
        let mut pending_bytes: i128 = 0;
        let mut sync_failed = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            if results[i].is_err() {
                continue;
            }
            let size = value.len() as u64;
            let (used, old) = {
                let index = self.index.read();
                let old = pending
                    .get(key)
                    .copied()
                    .or_else(|| index.map.get(*key).map(|l| l.size))
                    .unwrap_or(0);
                ((index.used_bytes as i128 + pending_bytes) as u64, old)
            };
            if used - old + size > self.config.capacity_bytes {
                results[i] = Err(StorageError::NoSpace {
                    needed: size,
                    available: self.config.capacity_bytes.saturating_sub(used),
                });
                continue;
            }
            match self.append(&mut w, key, value, 0) {
                Ok((offset, _seq)) => {
                    let Some(open) = w.open.as_mut() else {
                        continue;
                    };
                    let loc = Loc {
                        bucket: open.id,
                        offset,
                        size,
                    };
                    open.live.insert(key.to_string(), (offset, size));
                    written.push((i, key, loc));
                    pending_bytes += size as i128 - old as i128;
                    pending.insert(key, size);
                }
                Err(e) => {
                    results[i] = Err(e);
                    continue;
                }
            }
            if self.open_is_full(&w) {
                if let Err(e) = self.seal(&mut w) {
                    sync_failed = Some(e);
                }
            }
        }
        if self.config.durability == Durability::Batch {
            if let Some(open) = w.open.as_mut().filter(|o| o.dirty) {
                match open.file.sync_data() {
                    Ok(()) => open.dirty = false,
                    Err(e) => {
                        sync_failed = Some(StorageError::Io {
                            op: "sync",
                            source: e,
                        })
                    }
                }
            }
        }
        // Commit: the index points at the new records; older copies leave their buckets.
        let mut leave_sealed: Vec<(u64, String)> = Vec::new();
        for (_, key, loc) in &written {
            let old = {
                let mut index = self.index.write();
                let old = index.map.insert(key.to_string(), *loc);
                if let Some(old) = old {
                    index.used_bytes -= old.size;
                }
                index.used_bytes += loc.size;
                old
            };
            if let Some(old) = old {
                if old.bucket == loc.bucket {
                    continue;
                }
                if let Some(open) = w.open.as_mut().filter(|o| o.id == old.bucket) {
                    open.live.remove(*key);
                } else {
                    leave_sealed.push((old.bucket, key.to_string()));
                }
            }
        }
        for (id, key) in leave_sealed {
            if let Err(e) = self.drop_from_sealed(id, &key) {
                sync_failed.get_or_insert(e);
            }
        }
        if let Some(e) = sync_failed {
            let kind = match &e {
                StorageError::Io { source, .. } => source.kind(),
                _ => std::io::ErrorKind::Other,
            };
            for (i, _, _) in &written {
                results[*i] = Err(StorageError::Io {
                    op: "sync",
                    source: std::io::Error::new(kind, e.to_string()),
                });
            }
        }
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
            let loc = match self.lookup(key) {
                Ok(l) => l,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            match self.read_one(key, loc, buf) {
                Ok(n) => {
                    self.order.lock().touch(&loc.bucket);
                    out.push(Ok(n));
                }
                Err(e @ StorageError::Corrupt { .. }) => {
                    // Dropped only if the index still points at the copy this read found broken.
                    self.drop_corrupt(key, loc);
                    out.push(Err(e));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        self.index.read().map.get(key).map(|l| l.size)
    }

    fn remove(&self, key: &str) -> Result<bool, StorageError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed);
        }
        check_key(key, &self.config.limits)?;
        let mut w = self.writer.lock();
        let Some(loc) = self.index.read().map.get(key).copied() else {
            return Ok(false);
        };
        if w.open.as_ref().is_some_and(|o| o.id == loc.bucket) {
            self.append(&mut w, key, &[], FLAG_TOMBSTONE)?;
            if self.config.durability == Durability::Batch {
                if let Some(open) = w.open.as_mut() {
                    open.file.sync_data().map_err(io("sync"))?;
                    open.dirty = false;
                }
            }
            if let Some(open) = w.open.as_mut() {
                open.live.remove(key);
            }
        }
        {
            let mut index = self.index.write();
            index.map.remove(key);
            index.used_bytes -= loc.size;
        }
        if w.open.as_ref().is_none_or(|o| o.id != loc.bucket) {
            self.drop_from_sealed(loc.bucket, key)?;
        }
        if self.open_is_full(&w) {
            self.seal(&mut w)?;
        }
        Ok(true)
    }

    fn scan(&self) -> Vec<ObjectInfo> {
        self.index
            .read()
            .map
            .iter()
            .map(|(k, l)| ObjectInfo {
                key: k.clone(),
                size_bytes: l.size,
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
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed);
        }
        let mut w = self.writer.lock();
        if let Some(open) = w.open.as_ref() {
            // Sealing syncs data under Batch/Always; under None, flush makes it durable anyway.
            open.file.sync_data().map_err(io("sync"))?;
        }
        self.seal(&mut w)?;
        sync_dir(&self.root)
    }

    fn close(&self) -> Result<(), StorageError> {
        self.flush()?;
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed example printed in docs/storage.md.
    #[test]
    fn meta_decodes_the_documented_example() {
        let mut live = Live::new();
        live.insert("key".to_string(), (0, 5));
        let bytes = encode_meta(7, 48, &live);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "4d43424d01000000070000000000000030000000000000000100000000000000\
             00000000000000000500000000000000030000006b6579a89c5dbb"
        );
        let meta = decode_meta(&bytes, 16).unwrap();
        assert_eq!(
            meta,
            Meta {
                bucket_id: 7,
                data_len: 48,
                live: live.clone()
            }
        );
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert_eq!(decode_meta(&bad, 16), None, "flip at byte {i} accepted");
        }
        assert_eq!(decode_meta(&bytes[..bytes.len() - 1], 16), None);
        // A record that would extend past data_len is refused.
        assert_eq!(decode_meta(&encode_meta(7, 47, &live), 16), None);
    }
}
