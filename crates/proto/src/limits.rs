//! Protocol limits: every input the server accepts is bounded.

use mooncake_common::ErrorCode;

/// Longest key (bytes) a request may carry.
pub const DEFAULT_MAX_KEY_BYTES: usize = 4096;
/// Most entries in one batch request.
pub const DEFAULT_MAX_BATCH_LEN: usize = 65_536;

/// Limits checked on every request before it reaches the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_key_bytes: usize,
    pub max_batch_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_batch_len: DEFAULT_MAX_BATCH_LEN,
        }
    }
}

pub(crate) fn check_key(key: &str, limits: &Limits) -> Result<(), ErrorCode> {
    if key.len() > limits.max_key_bytes {
        return Err(ErrorCode::INVALID_KEY);
    }
    Ok(())
}

pub(crate) fn check_len(len: usize, limits: &Limits) -> Result<(), ErrorCode> {
    if len > limits.max_batch_len {
        return Err(ErrorCode::INVALID_PARAMS);
    }
    Ok(())
}

pub(crate) fn check_keys(keys: &[String], limits: &Limits) -> Result<(), ErrorCode> {
    check_len(keys.len(), limits)?;
    keys.iter().try_for_each(|key| check_key(key, limits))
}
