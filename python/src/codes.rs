//! Upstream's return conventions: 0 or a negative `ErrorCode` for writes, the byte count or a
//! negative code for reads into caller memory.

use mooncake_client::{PutOutcome, StoreError};
use mooncake_common::ErrorCode;

/// Code returned by every call made before `setup` succeeded or after `close`.
pub(crate) const NOT_READY: i32 = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS as i32;
pub(crate) const INVALID: i32 = ErrorCode::INVALID_PARAMS as i32;

/// Upstream's code for a store error. A caller buffer too small for the object is INVALID_PARAMS
/// (-600), as upstream answers it.
pub(crate) fn code_of(error: &StoreError) -> i32 {
    match error {
        StoreError::BufferTooSmall { .. } => INVALID,
        other => other.code().as_i32(),
    }
}

/// 0 for a write that stored the value (or, for a put, found the key already there).
pub(crate) fn put_code(result: &Result<PutOutcome, StoreError>) -> i32 {
    match result {
        Ok(PutOutcome::Stored) | Ok(PutOutcome::AlreadyPresent) => 0,
        Err(error) => code_of(error),
    }
}

/// 0 for a success.
pub(crate) fn unit_code(result: &Result<(), StoreError>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(error) => code_of(error),
    }
}

/// A byte count, or a negative code.
pub(crate) fn to_i64(result: Result<u64, StoreError>) -> i64 {
    match result {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(error) => code_of(&error) as i64,
    }
}
