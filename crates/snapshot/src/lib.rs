//! The master's snapshot: its durable state ([`MasterState`]) as one versioned, chunked,
//! checksummed binary file, and the directory that keeps the newest few.
//!
//! **Owns**: the byte format (docs/snapshot.md has every field), the streaming take from a live
//! master ([`write_snapshot`]: one shard's records at a time, no lock held across shards), the
//! verifying decoder ([`decode`]: every CRC, the header, the trailer; hostile input gets a
//! [`SnapshotError`], never a panic or an allocation the input does not justify), and the
//! snapshot directory ([`SnapshotDir`]: temp file → fsync → rename → fsync directory, retention,
//! loading the newest snapshot that verifies).
//!
//! **Must never**: restore (that is [`mooncake_master::MasterService::restore`]), run timers or
//! threads, or hold a master lock while writing or compressing.

mod dir;
mod error;
mod format;
mod records;
mod wire;

use std::path::PathBuf;
use std::time::Duration;

pub use dir::{LoadOutcome, SnapshotDir};
pub use error::SnapshotError;
pub use format::{
    decode, encode_state, write_snapshot, FORMAT_VERSION, MAGIC, MAX_CHUNK_RAW_BYTES,
    MAX_ZSTD_RATIO,
};

#[doc(no_inline)]
pub use mooncake_master::MasterState;

/// What a snapshot file says about itself (its header).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotMeta {
    /// Monotonically increasing snapshot id: unix ms at the start of the take, bumped past the
    /// previous id when equal or lower. Also the file name's number.
    pub id: u64,
    /// Wall clock (unix ms) at the start of the take.
    pub created_ms: u64,
    /// The op-log sequence number the snapshot includes (0 without an op-log).
    pub oplog_position: u64,
    /// The version of the master that wrote it (at most [`format::MAX_VERSION_STRING_BYTES`]
    /// bytes are kept).
    pub master_version: String,
}

/// How to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// zstd level for every chunk; `None` stores chunks uncompressed. A chunk that zstd does not
    /// make smaller is stored uncompressed anyway.
    pub zstd_level: Option<i32>,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            zstd_level: Some(1),
        }
    }
}

/// What [`SnapshotDir::take`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeReport {
    /// The snapshot file (final name).
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Objects in it.
    pub objects: u64,
    /// From the start of the take to the directory's fsync.
    pub duration: Duration,
}
