//! Small helpers shared by the file-per-key and bucket backends.

use crate::backend::{Limits, StorageError};
use std::fs::File;
use std::path::Path;

/// Wraps an I/O error with the operation it interrupted (which picks the error code).
pub(crate) fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> StorageError {
    move |source| StorageError::Io { op, source }
}

/// fsyncs a directory so that a rename or create inside it is durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), StorageError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("sync"))
}

/// Checks one entry of a put against the limits.
pub(crate) fn check_entry(key: &str, value_len: u64, limits: &Limits) -> Result<(), StorageError> {
    check_key(key, limits)?;
    if value_len > limits.max_value_bytes {
        return Err(StorageError::ValueTooLarge {
            len: value_len,
            max: limits.max_value_bytes,
        });
    }
    Ok(())
}

pub(crate) fn check_key(key: &str, limits: &Limits) -> Result<(), StorageError> {
    if key.is_empty() {
        return Err(StorageError::InvalidKey("empty key"));
    }
    if key.len() > limits.max_key_bytes {
        return Err(StorageError::KeyTooLong {
            len: key.len(),
            max: limits.max_key_bytes,
        });
    }
    Ok(())
}

/// One error per entry when a whole batch is refused.
pub(crate) fn refuse_all<T>(
    len: usize,
    err: impl Fn() -> StorageError,
) -> Vec<Result<T, StorageError>> {
    (0..len).map(|_| Err(err())).collect()
}

/// The whole-batch refusals every backend applies before it touches anything: a closed backend
/// (`Closed` per entry) and a batch over `max` entries or with mismatched lengths
/// (`BatchTooLarge` per entry). `None` when the batch may proceed.
pub(crate) fn refuse_batch<T>(
    closed: bool,
    len: usize,
    max: usize,
    lengths_match: bool,
) -> Option<Vec<Result<T, StorageError>>> {
    if closed {
        return Some(refuse_all(len, || StorageError::Closed));
    }
    if len > max || !lengths_match {
        return Some(refuse_all(len, || StorageError::BatchTooLarge { len, max }));
    }
    None
}
