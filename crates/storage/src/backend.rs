//! The one trait every SSD backend implements, and the vocabulary around it.
//!
//! Contract (the conformance suite in `tests/` checks every line of it):
//! - `put_batch` returns only after every entry that reports `Ok` is stored according to the
//!   backend's [`Durability`]: under `Batch` and `Always` an acknowledged entry survives a crash
//!   (SIGKILL or power loss of the page cache); under `None` it survives a clean `close`.
//! - A read never returns bytes that are torn, corrupt or belong to another key: a record whose
//!   checksum fails is reported as [`StorageError::Corrupt`] and dropped from the index.
//! - `put` of an existing key replaces it (the master decides overwrite semantics, not the disk).
//! - Before the space of an evicted object is reused, its key is passed to the eviction listener.
//!   Order (upstream's rule): remove from the index → call the listener → free the bytes. The
//!   listener is called with no index lock held, so it may call `exists`, `size_of`, `scan` and
//!   `usage` (but not `put_batch`/`remove`, which may hold the writer lock).
//! - Every input is bounded ([`Limits`]); exceeding a bound is an error, never a panic.

use mooncake_common::ErrorCode;
use std::path::PathBuf;
use thiserror::Error;

/// One stored object as listed by [`StorageBackend::scan`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectInfo {
    pub key: String,
    pub size_bytes: u64,
}

/// Space accounting of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The most bytes of values the backend may hold (its configured capacity).
    pub capacity_bytes: u64,
    /// Bytes of values currently stored (headers and padding not included).
    pub used_bytes: u64,
    /// Number of stored objects.
    pub object_count: u64,
}

/// When writes reach stable storage. See `docs/storage.md` for what each can lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Page cache only: a crash of the machine loses recent writes; a process crash loses none
    /// that were acknowledged (the kernel still has them).
    None,
    /// One fsync per `put_batch` before it returns.
    #[default]
    Batch,
    /// An fsync after every record.
    Always,
}

/// Which object eviction removes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Oldest write first.
    #[default]
    Fifo,
    /// Least recently read or written first.
    Lru,
}

/// Eviction under watermarks: when a put would take `used_bytes` above
/// `high_watermark_ratio × capacity`, objects are evicted until `used_bytes + incoming` is at most
/// `low_watermark_ratio × capacity`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionConfig {
    pub policy: EvictionPolicy,
    /// Disable to make a full store refuse writes with `NoSpace` instead of evicting.
    pub enabled: bool,
    pub high_watermark_ratio: f64,
    pub low_watermark_ratio: f64,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        EvictionConfig {
            policy: EvictionPolicy::Fifo,
            enabled: true,
            high_watermark_ratio: 0.95,
            low_watermark_ratio: 0.85,
        }
    }
}

/// Hard bounds on what a backend accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_key_bytes: usize,
    pub max_value_bytes: u64,
    pub max_batch_entries: usize,
    pub max_open_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 4096,
            max_value_bytes: 1 << 30,
            max_batch_entries: 4096,
            max_open_files: 256,
        }
    }
}

/// Common options every backend takes.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// Directory that holds the backend's files (created if missing).
    pub root: PathBuf,
    pub capacity_bytes: u64,
    pub durability: Durability,
    pub eviction: EvictionConfig,
    pub limits: Limits,
}

impl BackendConfig {
    pub fn new(root: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        BackendConfig {
            root: root.into(),
            capacity_bytes,
            durability: Durability::default(),
            eviction: EvictionConfig::default(),
            limits: Limits::default(),
        }
    }

    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    pub fn with_eviction(mut self, eviction: EvictionConfig) -> Self {
        self.eviction = eviction;
        self
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Checks every field; backends call this in `open`.
    pub fn validate(&self) -> Result<(), StorageError> {
        let bad = |why: String| Err(StorageError::InvalidConfig(why));
        if self.capacity_bytes == 0 {
            return bad("capacity_bytes must be > 0".into());
        }
        let (low, high) = (
            self.eviction.low_watermark_ratio,
            self.eviction.high_watermark_ratio,
        );
        if !(high > 0.0 && high <= 1.0 && low > 0.0 && low <= high) {
            return bad(format!(
                "watermarks need 0 < low ({low}) <= high ({high}) <= 1"
            ));
        }
        let l = &self.limits;
        if l.max_key_bytes == 0 || l.max_batch_entries == 0 || l.max_open_files == 0 {
            return bad("limits must be > 0".into());
        }
        Ok(())
    }
}

/// Errors of backend operations. Each maps to an upstream [`ErrorCode`].
#[derive(Debug, Error)]
pub enum StorageError {
    #[error("key not found")]
    NotFound,
    #[error("key is {len} bytes, more than the limit of {max}")]
    KeyTooLong { len: usize, max: usize },
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    #[error("value is {len} bytes, more than the limit of {max}")]
    ValueTooLarge { len: u64, max: u64 },
    #[error("batch has {len} entries, more than the limit of {max}")]
    BatchTooLarge { len: usize, max: usize },
    #[error("caller buffer holds {buffer} bytes but the value is {value}")]
    BufferTooSmall { buffer: usize, value: u64 },
    #[error("no space: need {needed} bytes, {available} available")]
    NoSpace { needed: u64, available: u64 },
    #[error("corrupt record for key {key:?}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("backend is closed")]
    Closed,
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("I/O error during {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// The upstream error code a caller sees for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StorageError::NotFound => ErrorCode::OBJECT_NOT_FOUND,
            StorageError::KeyTooLong { .. } | StorageError::InvalidKey(_) => ErrorCode::INVALID_KEY,
            StorageError::ValueTooLarge { .. }
            | StorageError::BatchTooLarge { .. }
            | StorageError::InvalidConfig(_) => ErrorCode::INVALID_PARAMS,
            StorageError::BufferTooSmall { .. } => ErrorCode::BUFFER_OVERFLOW,
            StorageError::NoSpace { .. } => ErrorCode::FILE_WRITE_FAIL,
            StorageError::Corrupt { .. } => ErrorCode::FILE_READ_FAIL,
            StorageError::Closed => ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
            StorageError::Io { op, .. } => match *op {
                "read" => ErrorCode::FILE_READ_FAIL,
                "open" => ErrorCode::FILE_OPEN_FAIL,
                _ => ErrorCode::FILE_WRITE_FAIL,
            },
        }
    }
}

/// Called with the keys of evicted objects, before their space is reused.
pub type EvictionListener = Box<dyn Fn(&[String]) + Send + Sync>;

/// A storage backend of the SSD tier. Thread-safe: any method may be called from many threads.
pub trait StorageBackend: Send + Sync {
    /// A short name for logs and benchmark tables (`"file"`, `"bucket"`, `"log"`).
    fn name(&self) -> &'static str;

    /// Stores every `(key, value)`; one result per entry, in input order. A batch longer than
    /// `max_batch_entries` fails whole with `BatchTooLarge` (one error per entry).
    fn put_batch(&self, entries: &[(&str, &[u8])]) -> Vec<Result<(), StorageError>>;

    /// Reads each key into its buffer (which must be at least the value's size); returns the value
    /// size per entry, in input order.
    fn get_batch(&self, keys: &[&str], buffers: &mut [&mut [u8]])
        -> Vec<Result<u64, StorageError>>;

    /// The stored value size of `key`, if present.
    fn size_of(&self, key: &str) -> Option<u64>;

    /// Whether `key` is stored.
    fn exists(&self, key: &str) -> bool {
        self.size_of(key).is_some()
    }

    /// Removes `key`; `Ok(false)` when it was absent.
    fn remove(&self, key: &str) -> Result<bool, StorageError>;

    /// Every stored object (order unspecified).
    fn scan(&self) -> Vec<ObjectInfo>;

    /// Space accounting.
    fn usage(&self) -> Usage;

    /// Installs the eviction listener (replacing any previous one).
    fn set_eviction_listener(&self, listener: EvictionListener);

    /// Makes everything acknowledged so far durable regardless of policy (flushes partial buckets,
    /// writes a checkpoint where the backend has one).
    fn flush(&self) -> Result<(), StorageError>;

    /// Flushes and closes; later calls fail with `Closed`.
    fn close(&self) -> Result<(), StorageError>;
}
