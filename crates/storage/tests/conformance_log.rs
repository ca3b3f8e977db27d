//! The conformance suite against the offset-allocator log backend.
#[macro_use]
mod conformance;

use mooncake_storage::log::LogBackend;
use mooncake_storage::{BackendConfig, StorageBackend, StorageError};

fn open_log(config: BackendConfig) -> Result<Box<dyn StorageBackend>, StorageError> {
    Ok(Box::new(LogBackend::open(config)?))
}

conformance_suite!(log, open_log);
