//! Why a snapshot could not be written or read.

use std::io;

use thiserror::Error;

/// Why a snapshot could not be written or read. The Display names the reason (for a log line).
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// Reading or writing the file or directory failed.
    #[error("snapshot i/o error: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a valid snapshot: bad magic, a CRC mismatch, a field out of range,
    /// bytes after the trailer.
    #[error("corrupt snapshot: {reason}")]
    Corrupt { reason: String },
    /// The file ends before its trailer does.
    #[error("truncated snapshot: {reason}")]
    Truncated { reason: String },
    /// A snapshot written in a format version this build cannot read.
    #[error(
        "unsupported snapshot format version {0} (this build reads version {current})",
        current = crate::FORMAT_VERSION
    )]
    UnsupportedVersion(u16),
    /// A snapshot of the op-log could not be built or published (etcd, the log, the master that
    /// does not write the log).
    #[error("snapshot of the op-log: {0}")]
    OpLog(String),
}

impl SnapshotError {
    pub(crate) fn corrupt(reason: impl Into<String>) -> Self {
        SnapshotError::Corrupt {
            reason: reason.into(),
        }
    }

    pub(crate) fn truncated(reason: impl Into<String>) -> Self {
        SnapshotError::Truncated {
            reason: reason.into(),
        }
    }

    /// True for [`SnapshotError::Corrupt`] and [`SnapshotError::Truncated`]: the file is bad
    /// (an older snapshot may be good), as opposed to an i/o failure or a newer format.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            SnapshotError::Corrupt { .. } | SnapshotError::Truncated { .. }
        )
    }
}
