//! Typed errors of the transfer engine, each mapping to one upstream [`ErrorCode`].

use mooncake_common::ErrorCode;

use crate::wire::WireError;

/// Everything that can go wrong when registering memory or moving bytes.
///
/// Cloneable because one failure (a dropped connection) is reported to every entry that was
/// in flight on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// The remote range is not inside the segment (checked by the side that owns the memory).
    #[error("range [{offset}, {offset}+{len_bytes}) is outside segment {segment_id} ({size_bytes} bytes)")]
    OutOfBounds {
        segment_id: u64,
        offset: u64,
        len_bytes: u64,
        size_bytes: u64,
    },
    /// No segment with this id is registered for remote access at the target.
    #[error("segment {segment_id} is not registered for remote access")]
    SegmentNotFound { segment_id: u64 },
    /// The owner requires the segment's capability (it was started with the cluster's token)
    /// and this requester did not present a valid one.
    #[error("segment {segment_id} needs a valid capability (the owner was started with a token)")]
    Unauthorized { segment_id: u64 },
    /// The segment exists but its owner did not register it as shareable over shared memory.
    #[error("segment {segment_id} is not registered as shareable")]
    NotShareable { segment_id: u64 },
    /// The local range of an entry is not inside one registered region.
    #[error("local range [{addr:#x}, +{len_bytes}) is not inside a registered region")]
    LocalRangeNotRegistered { addr: usize, len_bytes: u64 },
    /// A new region overlaps a registered one.
    #[error("region [{addr:#x}, +{len_bytes}) overlaps registered region {existing_id}")]
    Overlap {
        addr: usize,
        len_bytes: u64,
        existing_id: u64,
    },
    /// No region with this id is registered (unregister of an unknown id).
    #[error("region {region_id} is not registered")]
    RegionNotFound { region_id: u64 },
    /// Unregistering waited for in-flight transfers longer than allowed; the region stays registered.
    #[error("region {region_id} still has {inflight} transfers in flight after {waited_ms} ms")]
    RegionBusy {
        region_id: u64,
        inflight: usize,
        waited_ms: u64,
    },
    /// A malformed endpoint string or configuration value.
    #[error("invalid parameter: {0}")]
    InvalidParams(String),
    /// The entry did not finish before its deadline.
    #[error("transfer timed out after {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// The peer could not be reached (connect refused, unknown host...).
    #[error("peer {endpoint} unreachable: {reason}")]
    PeerUnreachable { endpoint: String, reason: String },
    /// The connection broke while the entry was in flight (peer died, reset...).
    #[error("connection to {endpoint} lost: {reason}")]
    ConnectionLost { endpoint: String, reason: String },
    /// The peer sent bytes that do not follow the wire format.
    #[error("protocol error from {endpoint}: {source}")]
    Protocol {
        endpoint: String,
        #[source]
        source: WireError,
    },
    /// The serving side rejected the request with this code.
    #[error("peer rejected the request: {code}")]
    Rejected { code: ErrorCode },
    /// Shared memory was required (`transport = shm`) but the handshake failed.
    #[error("shared-memory transport unavailable for {endpoint}: {reason}")]
    ShmUnavailable { endpoint: String, reason: String },
    /// Allocating or mapping memory failed.
    #[error("memory allocation failed: {0}")]
    Alloc(String),
    /// A local I/O failure (binding the server, creating the socket file...).
    #[error("I/O error: {0}")]
    Io(String),
    /// The engine is shutting down.
    #[error("transfer engine is shutting down")]
    ShuttingDown,
}

impl TransferError {
    /// The upstream error code callers (and Python) see.
    pub fn code(&self) -> ErrorCode {
        match self {
            TransferError::OutOfBounds { .. }
            | TransferError::LocalRangeNotRegistered { .. }
            | TransferError::Overlap { .. }
            | TransferError::NotShareable { .. }
            | TransferError::InvalidParams(_) => ErrorCode::INVALID_PARAMS,
            TransferError::SegmentNotFound { .. } | TransferError::RegionNotFound { .. } => {
                ErrorCode::SEGMENT_NOT_FOUND
            }
            TransferError::Unauthorized { .. } => ErrorCode::ILLEGAL_CLIENT,
            TransferError::RegionBusy { .. } => ErrorCode::OBJECT_REPLICA_BUSY,
            TransferError::Timeout { .. } => ErrorCode::RPC_TIMEOUT,
            TransferError::PeerUnreachable { .. }
            | TransferError::ConnectionLost { .. }
            | TransferError::Protocol { .. }
            | TransferError::ShmUnavailable { .. }
            | TransferError::Io(_) => ErrorCode::TRANSFER_FAIL,
            TransferError::Rejected { code } => *code,
            TransferError::Alloc(_) => ErrorCode::INTERNAL_ERROR,
            TransferError::ShuttingDown => ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        }
    }
}

impl TransferError {
    /// Whether the failure lies with the remote side of the entry (its node died, cannot be
    /// reached or does not serve the segment any more) rather than with the request or this
    /// process: writing the same bytes to another segment may well succeed.
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            TransferError::SegmentNotFound { .. }
                | TransferError::Timeout { .. }
                | TransferError::PeerUnreachable { .. }
                | TransferError::ConnectionLost { .. }
                | TransferError::Protocol { .. }
                | TransferError::ShmUnavailable { .. }
                | TransferError::Io(_)
        )
    }
}

impl From<TransferError> for ErrorCode {
    fn from(err: TransferError) -> ErrorCode {
        err.code()
    }
}
