//! SIGKILL crash tests of the bucket backend (harness in `tests/crash/mod.rs`; more kill
//! points: `scripts/crash-storage.sh`).
mod crash;

use mooncake_storage::{BackendKind, Durability};

#[test]
fn bucket_batch_survives_sigkill() {
    crash::run(
        BackendKind::Bucket,
        Durability::Batch,
        crash::kill_points(12),
        1,
    );
}

#[test]
fn bucket_always_survives_sigkill() {
    crash::run(
        BackendKind::Bucket,
        Durability::Always,
        crash::kill_points(8),
        2,
    );
}

#[test]
fn bucket_none_survives_sigkill() {
    crash::run(
        BackendKind::Bucket,
        Durability::None,
        crash::kill_points(5),
        3,
    );
}
