//! SIGKILL crash tests of the file-per-key backend (harness in `tests/crash/mod.rs`; more kill
//! points: `scripts/crash-storage.sh`).
mod crash;

use mooncake_storage::{BackendKind, Durability};

#[test]
fn file_batch_survives_sigkill() {
    crash::run(
        BackendKind::File,
        Durability::Batch,
        crash::kill_points(12),
        1,
    );
}

#[test]
fn file_always_survives_sigkill() {
    crash::run(
        BackendKind::File,
        Durability::Always,
        crash::kill_points(8),
        2,
    );
}

#[test]
fn file_none_survives_sigkill() {
    crash::run(
        BackendKind::File,
        Durability::None,
        crash::kill_points(5),
        3,
    );
}
