//! Bucket backend (being built).
use crate::backend::{BackendConfig, StorageError};

#[derive(Debug, Clone, Copy)]
pub struct BucketOptions {
    pub bucket_size_limit_bytes: u64,
    pub bucket_keys_limit: usize,
    pub seal_after_ms: u64,
}

impl Default for BucketOptions {
    fn default() -> Self {
        BucketOptions {
            bucket_size_limit_bytes: 256 << 20,
            bucket_keys_limit: 500,
            seal_after_ms: 1000,
        }
    }
}

#[derive(Debug)]
pub struct BucketBackend;

impl BucketBackend {
    pub fn open(config: BackendConfig) -> Result<BucketBackend, StorageError> {
        Self::open_with(config, BucketOptions::default())
    }
    pub fn open_with(
        _config: BackendConfig,
        _o: BucketOptions,
    ) -> Result<BucketBackend, StorageError> {
        Err(StorageError::InvalidConfig("bucket not built".into()))
    }
}
