//! The master's op-log (docs/oplog.md): every mutation of the master's durable state as an
//! entry with a gap-free sequence number, runs of entries sealed into checksummed batches, and
//! the replay of batches on a standby.
//!
//! **Owns**: the batch format ([`batch`]; the mutation inside an entry is encoded by
//! `mooncake_snapshot::encode_mutation`), the leader's numbering and queue ([`OpLogSink`], the
//! master's mutation observer, with the durable mark acknowledgements wait on), and replay
//! ([`Replayer`]: in order, duplicates ignored, a gap or a bad batch halts it).
//!
//! **Must never**: skip an entry, apply past a gap, or call back into the master from the
//! observer.

pub mod batch;
#[cfg(feature = "etcd")]
pub mod checkpoint;
#[cfg(feature = "etcd")]
pub mod election;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod follow;
mod replay;
mod sink;
#[cfg(feature = "etcd")]
pub mod test_etcd;
#[cfg(feature = "etcd")]
mod writer;

use thiserror::Error;

pub use batch::Batch;
pub use replay::Replayer;
pub use sink::{AckError, OpLogSink, Taken, WriterHealth};
#[cfg(feature = "etcd")]
pub use writer::{OpLogWriter, WriterConfig, WriterStats};

/// Why the op-log cannot be read, applied or written.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum OpLogError {
    /// A batch that does not verify: bad magic or version, a length or count out of range, a
    /// checksum mismatch, an entry that does not decode.
    #[error("corrupt op-log batch: {reason}")]
    Corrupt { reason: String },
    /// The next batch does not start at the next expected sequence number.
    #[error("op-log gap: expected sequence {expected}, the next batch starts at {found}")]
    Gap { expected: u64, found: u64 },
    /// An entry the standby's state cannot take (the log and the state disagree).
    #[error("op-log entry {seq} cannot be applied: {reason}")]
    Apply { seq: u64, reason: String },
    /// Replay halted earlier for this reason and stays halted.
    #[error("op-log replay halted: {0}")]
    Halted(Box<OpLogError>),
}

impl OpLogError {
    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        OpLogError::Corrupt {
            reason: reason.into(),
        }
    }
}
