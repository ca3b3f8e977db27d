//! Errors of store operations, each with the upstream code a Python caller sees.

use mooncake_common::ErrorCode;
use mooncake_transfer::TransferError;
use thiserror::Error;

use crate::master_client::MasterError;

/// Why a store operation failed.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The master refused, or could not be reached.
    #[error(transparent)]
    Master(#[from] MasterError),
    /// Moving the bytes failed on every replica tried.
    #[error("transfer failed: {0}")]
    Transfer(#[from] TransferError),
    /// The read lease ran out before the bytes arrived: the memory may have been reused.
    #[error(
        "the read lease expired before the transfer finished ({elapsed_ms} ms > {lease_ms} ms)"
    )]
    LeaseExpired { elapsed_ms: u64, lease_ms: u64 },
    /// The bytes read do not match the checksum recorded at PutEnd.
    #[error("checksum mismatch for {key:?}")]
    ChecksumMismatch { key: String },
    /// The caller's buffer cannot hold the object.
    #[error("buffer of {buffer_bytes} bytes cannot hold the {object_bytes}-byte object")]
    BufferTooSmall {
        buffer_bytes: u64,
        object_bytes: u64,
    },
    /// The object has no replica this client can read (only media it does not serve).
    #[error("no readable memory replica for {key:?}")]
    NoReadableReplica { key: String },
    #[error("invalid argument: {0}")]
    InvalidParams(String),
    #[error("the store client is closed")]
    Closed,
}

impl StoreError {
    /// The upstream error code (what Python callers get as a negative int).
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Master(error) => error.code(),
            StoreError::Transfer(error) => match error {
                TransferError::Timeout { .. } => ErrorCode::TRANSFER_FAIL,
                other => other.code(),
            },
            StoreError::LeaseExpired { .. } => ErrorCode::LEASE_EXPIRED,
            StoreError::ChecksumMismatch { .. } => ErrorCode::CHECKSUM_MISMATCH,
            StoreError::BufferTooSmall { .. } => ErrorCode::BUFFER_OVERFLOW,
            StoreError::NoReadableReplica { .. } => ErrorCode::REPLICA_IS_NOT_READY,
            StoreError::InvalidParams(_) => ErrorCode::INVALID_PARAMS,
            StoreError::Closed => ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        }
    }

    /// The master's code when the master refused the operation.
    pub fn master_code(&self) -> Option<ErrorCode> {
        match self {
            StoreError::Master(MasterError::Master(code)) => Some(*code),
            _ => None,
        }
    }
}

impl From<ErrorCode> for StoreError {
    fn from(code: ErrorCode) -> StoreError {
        StoreError::Master(MasterError::Master(code))
    }
}
