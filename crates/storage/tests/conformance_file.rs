//! The conformance suite against the file-per-key backend.
#[macro_use]
mod conformance;

use mooncake_storage::{open_backend, BackendConfig, BackendKind};

conformance_suite!(file, |c: BackendConfig| open_backend(BackendKind::File, c));
