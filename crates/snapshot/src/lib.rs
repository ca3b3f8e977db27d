//! The master's snapshot: its durable state ([`MasterState`]) as one versioned, chunked,
//! checksummed binary file, and the directory that keeps the newest few.
//!
//! **Owns**: the byte format (docs/snapshot.md has every field), the streaming take from a live
//! master ([`write_snapshot`]: each shard's records encoded under its read lock, no lock held
//! across shards, chunks compressed on [`COMPRESS_THREADS`] threads), the verifying decoder
//! ([`decode`]: every CRC, the header, the trailer, object chunks on up to [`DECODE_THREADS`]
//! threads; hostile input gets a [`SnapshotError`], never a panic or an allocation the input
//! does not justify), and the
//! snapshot directory ([`SnapshotDir`]: temp file → fsync → rename → fsync directory, retention,
//! loading the newest snapshot that verifies).
//!
//! **Must never**: restore (that is [`mooncake_master::MasterService::restore`]), run timers or
//! long-lived threads (the compression and decoding threads live for one call), or hold a
//! master lock while writing or compressing.

mod decode;
mod dir;
mod encode;
mod error;
mod format;
pub mod mutations;
mod records;
mod wire;

use std::path::PathBuf;
use std::time::Duration;

pub use decode::{decode, DECODE_THREADS};
pub use dir::{LoadOutcome, SnapshotDir};
pub use encode::{encode_state, write_snapshot, COMPRESS_THREADS, IN_FLIGHT};
pub use error::SnapshotError;
pub use format::{FORMAT_VERSION, MAGIC, MAX_CHUNK_RAW_BYTES, MAX_ZSTD_RATIO};
pub use mutations::{decode_mutation, encode_mutation};

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
    /// For tests only: a pause after each chunk is written, so that a test can catch a take in
    /// progress (the server sets it from `MC_SNAPSHOT_TEST_CHUNK_DELAY_MS`). Zero: none.
    pub test_chunk_delay: Duration,
}

impl EncodeOptions {
    /// Chunks stored uncompressed.
    pub fn uncompressed() -> Self {
        EncodeOptions {
            zstd_level: None,
            ..EncodeOptions::default()
        }
    }
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            zstd_level: Some(1),
            test_chunk_delay: Duration::ZERO,
        }
    }
}

/// What [`SnapshotDir::take`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeReport {
    /// The snapshot id (its header's, and its file name's number).
    pub id: u64,
    /// The snapshot file (final name).
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Objects in it.
    pub objects: u64,
    /// From the start of the take to the directory's fsync.
    pub duration: Duration,
}

/// A fork-join for [`mooncake_master::RestoreOptions::join`]: `b` on a thread of its own, `a` on
/// the calling one (both on the calling one when no thread can be started). A panic in either
/// is passed on.
pub fn join_on_threads(a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
    // `b` is taken by whoever runs it: the thread, or this one when the thread did not start.
    let b = std::sync::Mutex::new(Some(b));
    let run_b = || {
        let taken = b.lock().map(|mut slot| slot.take()).unwrap_or(None);
        if let Some(b) = taken {
            b();
        }
    };
    std::thread::scope(|scope| {
        let started = std::thread::Builder::new()
            .name("mc-restore".into())
            .spawn_scoped(scope, run_b);
        a();
        match started {
            Ok(handle) => {
                if let Err(panic) = handle.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            Err(_) => run_b(),
        }
    });
}
