//! The SSD tier of a store node: backends that keep objects on local disk and survive crashes.
//!
//! Owns: on-disk layouts (file-per-key, bucket, offset-allocator log), their indexes, eviction
//! under watermarks, crash recovery, and the factory [`open_backend`]. Must never: return bytes
//! whose checksum or key does not match, panic on anything read from disk, acknowledge a write
//! before it is stored per its [`Durability`], or talk to the network.
//!
//! Layouts and what each durability policy can lose: `docs/storage.md` (file-per-key, bucket)
//! and `docs/storage-log.md` (log).

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod backend;
pub mod bucket;
pub mod eviction;
pub mod fd_cache;
pub mod file;
pub mod log;
pub mod record;
pub mod testkit;
mod util;

pub use backend::{
    BackendConfig, Durability, EvictionConfig, EvictionListener, EvictionPolicy, Limits,
    ObjectInfo, StorageBackend, StorageError, Usage,
};
pub use bucket::{BucketBackend, BucketOptions};
pub use file::FileBackend;

use std::fmt;
use std::str::FromStr;

/// Which backend [`open_backend`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// One file per object (`file.rs`).
    File,
    /// Objects packed into `<id>.bucket` files with a `<id>.meta` each (`bucket.rs`).
    Bucket,
    /// One preallocated data file managed by an offset allocator (`log/`).
    Log,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [BackendKind::File, BackendKind::Bucket, BackendKind::Log];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::File => "file",
            BackendKind::Bucket => "bucket",
            BackendKind::Log => "log",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Self, StorageError> {
        match s {
            "file" | "file_per_key" => Ok(BackendKind::File),
            "bucket" => Ok(BackendKind::Bucket),
            "log" | "offset" | "offset_allocator" => Ok(BackendKind::Log),
            _ => Err(StorageError::InvalidConfig(format!(
                "unknown backend kind {s:?}"
            ))),
        }
    }
}

impl FromStr for Durability {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Self, StorageError> {
        match s {
            "none" => Ok(Durability::None),
            "batch" => Ok(Durability::Batch),
            "always" => Ok(Durability::Always),
            _ => Err(StorageError::InvalidConfig(format!(
                "unknown durability {s:?}"
            ))),
        }
    }
}

impl FromStr for EvictionPolicy {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Self, StorageError> {
        match s {
            "fifo" => Ok(EvictionPolicy::Fifo),
            "lru" => Ok(EvictionPolicy::Lru),
            _ => Err(StorageError::InvalidConfig(format!(
                "unknown eviction policy {s:?}"
            ))),
        }
    }
}

/// Opens (creating or recovering) a backend of `kind` over `config.root`.
pub fn open_backend(
    kind: BackendKind,
    config: BackendConfig,
) -> Result<Box<dyn StorageBackend>, StorageError> {
    match kind {
        BackendKind::File => Ok(Box::new(FileBackend::open(config)?)),
        BackendKind::Bucket => Ok(Box::new(BucketBackend::open(config)?)),
        BackendKind::Log => Ok(Box::new(log::LogBackend::open(config)?)),
    }
}
