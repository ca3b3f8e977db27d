//! SIGKILL crash tests of the log backend (harness in `tests/crash/mod.rs`; more kill
//! points: `scripts/crash-storage.sh`).
mod crash;

use mooncake_storage::{BackendKind, Durability};

#[test]
fn log_batch_survives_sigkill() {
    crash::run(
        BackendKind::Log,
        Durability::Batch,
        crash::kill_points(12),
        1,
    );
}

#[test]
fn log_always_survives_sigkill() {
    crash::run(
        BackendKind::Log,
        Durability::Always,
        crash::kill_points(8),
        2,
    );
}

#[test]
fn log_none_survives_sigkill() {
    crash::run(BackendKind::Log, Durability::None, crash::kill_points(5), 3);
}
