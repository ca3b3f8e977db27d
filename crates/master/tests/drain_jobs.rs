//! Drain jobs at the master (the process tests in mooncake-cli run them with real nodes).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{DrainJobRequest, DrainJobStatus, ReplicateConfig};

#[test]
fn a_new_drain_job_is_planned_at_creation() {
    // The moves are queued for the source's owner when the job is created, so they can start
    // at the owner's next fetch, not one job step later.
    let (_, m) = master();
    m.remount_segments(&[seg(1, "a", 1 << 20)], C1).unwrap();
    m.remount_segments(&[seg(2, "b", 1 << 20)], C2).unwrap();
    let on_a = ReplicateConfig {
        preferred_segments: vec!["a".to_string()],
        ..cfg(1)
    };
    for i in 0..5 {
        let key = format!("k/{i}");
        m.put_start(C1, &key, 1000, &on_a, "").unwrap();
        m.put_end(
            C1,
            &mooncake_common::ObjectMeta::new(&key),
            mooncake_common::ReplicaType::ALL,
            "",
        )
        .unwrap();
    }
    let id = m
        .create_drain_job(&DrainJobRequest {
            segments: vec!["a".to_string()],
            target_segments: vec!["b".to_string()],
            max_concurrency: 4,
        })
        .unwrap();
    let view = m.query_drain_job(id).unwrap();
    assert_eq!(view.status, DrainJobStatus::Running, "{view:?}");
    assert_eq!((view.total_units, view.active_units), (5, 5), "{view:?}");
    assert_eq!(m.fetch_tasks(C1, 16).len(), 5);

    // An empty source is drained at once.
    m.mount_segment(&seg(3, "c", 1 << 20), C1).unwrap();
    let id = m
        .create_drain_job(&DrainJobRequest {
            segments: vec!["c".to_string()],
            target_segments: Vec::new(),
            max_concurrency: 4,
        })
        .unwrap();
    assert_eq!(
        m.query_drain_job(id).unwrap().status,
        DrainJobStatus::Succeeded
    );
    assert_accounting(&m);
}
