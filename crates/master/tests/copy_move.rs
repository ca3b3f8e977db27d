//! Copy, Move and the client-executed task queue, and their interplay with eviction,
//! removal and upsert (invariant 3: `refcnt > 0` sources are never evicted).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, SegmentStatus,
    TaskCompleteRequest, TaskStatus, TaskType,
};
use mooncake_master::{MasterService, MasterServiceConfig, TaskLimits};

fn on(name: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![name.to_string()],
        ..cfg(1)
    }
}

fn three(m: &MasterService) {
    for (i, n) in ["a", "b", "c"].iter().enumerate() {
        m.mount_segment(&seg(i as u64 + 1, n, 1 << 20), C1).unwrap();
    }
}

fn put_on(m: &MasterService, key: &str, name: &str) {
    m.put_start(C1, key, 100, &on(name), "").unwrap();
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

fn endpoints(m: &MasterService, key: &str) -> Vec<String> {
    let mut v: Vec<String> = m
        .get_replica_list(key, "")
        .unwrap()
        .replicas
        .iter()
        .filter_map(|d| d.memory().map(|x| x.transport_endpoint.to_string()))
        .collect();
    v.sort();
    v
}

#[test]
fn copy_start_end_adds_complete_targets() {
    let (_, m) = master();
    three(&m);
    put_on(&m, "k", "a");
    let r = m
        .copy_start(C2, "k", "", "a", &keys(&["b", "c", "a"]))
        .unwrap();
    assert_eq!(
        r.source.memory().unwrap().transport_endpoint.as_ref(),
        "ep-a"
    );
    assert_eq!(r.targets.len(), 2, "a already holds a replica");
    // Targets are invisible until End.
    assert_eq!(endpoints(&m, "k"), vec!["ep-a"]);
    assert_eq!(
        m.copy_start(C2, "k", "", "a", &keys(&["b"])),
        Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
    );
    assert_eq!(m.copy_end(C1, "k", ""), Err(ErrorCode::ILLEGAL_CLIENT));
    assert_eq!(
        m.move_end(C2, "k", ""),
        Err(ErrorCode::INVALID_PARAMS),
        "a COPY task"
    );
    m.copy_end(C2, "k", "").unwrap();
    assert_eq!(endpoints(&m, "k"), vec!["ep-a", "ep-b", "ep-c"]);
    assert_eq!(
        m.copy_end(C2, "k", ""),
        Err(ErrorCode::OBJECT_NO_REPLICATION_TASK)
    );
    assert_accounting(&m);
}

#[test]
fn copy_start_errors_in_check_order() {
    let (_, m) = master();
    three(&m);
    put_on(&m, "k", "a");
    assert_eq!(
        m.copy_start(C1, "k", "", "a", &keys(&["zz"])),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    m.set_segment_status(
        mooncake_common::SegmentId::new(3, 0),
        SegmentStatus::DRAINING,
    )
    .unwrap();
    assert_eq!(
        m.copy_start(C1, "k", "", "a", &keys(&["c"])),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
    );
    assert_eq!(
        m.copy_start(C1, "nope", "", "a", &keys(&["b"])),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(
        m.copy_start(C1, "k", "", "b", &keys(&["b"])),
        Err(ErrorCode::REPLICA_NOT_FOUND)
    );
    assert_eq!(
        m.move_start(C1, "k", "", "a", "a"),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_accounting(&m);
}

#[test]
fn move_end_removes_the_source_and_move_end_by_another_client_is_illegal() {
    let (_, m) = master();
    three(&m);
    put_on(&m, "k", "a");
    let r = m.move_start(C2, "k", "", "a", "b").unwrap();
    assert_eq!(
        r.target
            .unwrap()
            .memory()
            .unwrap()
            .transport_endpoint
            .as_ref(),
        "ep-b"
    );
    assert_eq!(m.move_end(C1, "k", ""), Err(ErrorCode::ILLEGAL_CLIENT));
    assert_eq!(
        m.copy_end(C2, "k", ""),
        Err(ErrorCode::INVALID_PARAMS),
        "a MOVE task"
    );
    m.move_end(C2, "k", "").unwrap();
    assert_eq!(endpoints(&m, "k"), vec!["ep-b"], "source removed");
    assert_eq!(m.segment_usage()[0].used_bytes, Some(0));
    assert_accounting(&m);
}

#[test]
fn revokes_erase_targets_and_unpin_the_source() {
    let (_, m) = master();
    three(&m);
    put_on(&m, "k", "a");
    m.copy_start(C1, "k", "", "a", &keys(&["b", "c"])).unwrap();
    assert_eq!(m.copy_revoke(C2, "k", ""), Err(ErrorCode::ILLEGAL_CLIENT));
    m.copy_revoke(C1, "k", "").unwrap();
    m.move_start(C1, "k", "", "a", "c").unwrap();
    m.move_revoke(C1, "k", "").unwrap();
    assert_eq!(endpoints(&m, "k"), vec!["ep-a"]);
    let used: Vec<_> = m.segment_usage().iter().map(|u| u.used_bytes).collect();
    assert_eq!(used, vec![Some(100), Some(0), Some(0)]);
    m.remove("k", true, "").unwrap();
    assert_accounting(&m);
}

#[test]
fn a_source_under_copy_is_pinned_against_eviction_removal_and_upsert() {
    let (clock, m) = master_with(MasterServiceConfig {
        eviction_high_watermark_ratio: 0.3,
        ..Default::default()
    });
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1000), C1).unwrap();
    for i in 0..10 {
        clock.advance(1);
        put_on(&m, &format!("k{i}"), "a");
    }
    // k0 is the oldest object, but its replica is a copy source.
    m.copy_start(C2, "k0", "", "a", &keys(&["b"])).unwrap();
    // Remove's checks in upstream's order: the PROCESSING target answers first.
    assert_eq!(
        m.remove("k0", true, ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    assert_eq!(
        m.upsert_start(C1, "k0", 100, &on("a"), ""),
        Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
    );
    assert_eq!(m.remove_all(true, ""), 9, "RemoveAll skips it");
    for i in 1..10 {
        clock.advance(1);
        put_on(&m, &format!("j{i}"), "a");
    }
    let r = m.run_eviction_once();
    assert!(r.triggered && r.evicted_objects > 0);
    assert!(
        m.object_info("k0", "").unwrap().is_some(),
        "refcnt > 0 is never evicted"
    );
    m.copy_end(C2, "k0", "").unwrap();
    // A move whose target already holds a replica has no PROCESSING replica: Remove then
    // reports the task itself.
    m.move_start(C2, "k0", "", "a", "b").unwrap();
    assert_eq!(
        m.remove("k0", true, ""),
        Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
    );
    m.move_end(C2, "k0", "").unwrap();
    assert_eq!(m.object_info("k0", "").unwrap().unwrap().replicas.len(), 1);
    assert_accounting(&m);
}

#[test]
fn an_abandoned_copy_is_revoked_after_the_release_timeout() {
    let (clock, m) = master();
    three(&m);
    put_on(&m, "k", "a");
    m.copy_start(C1, "k", "", "a", &keys(&["b"])).unwrap();
    clock.advance(600_000);
    assert_eq!(m.run_put_timeouts_once().reaped_tasks, 1);
    assert_eq!(
        m.copy_end(C1, "k", ""),
        Err(ErrorCode::OBJECT_NO_REPLICATION_TASK)
    );
    assert_eq!(endpoints(&m, "k"), vec!["ep-a"]);
    m.remove("k", true, "").unwrap();
    assert_accounting(&m);
}

#[test]
fn copy_end_after_the_source_vanished_is_replica_is_gone() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    put_on(&m, "k", "b");
    m.copy_start(C1, "k", "", "b", &keys(&["a"])).unwrap();
    // C2 (owner of b) dies.
    m.ping(C1).unwrap();
    m.run_client_monitor_once();
    clock.advance(10_001);
    m.ping(C1).unwrap();
    assert_eq!(m.run_client_monitor_once(), 1);
    assert_eq!(m.copy_end(C1, "k", ""), Err(ErrorCode::REPLICA_IS_GONE));
    assert!(
        m.object_info("k", "").unwrap().is_none(),
        "nothing valid is left"
    );
    assert_accounting(&m);
}

#[test]
fn task_queue_create_fetch_complete_query() {
    let (clock, m) = master();
    let c3 = ClientId::new(3, 3);
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    m.mount_segment(&seg(3, "c", 1 << 20), c3).unwrap();
    put_on(&m, "k", "a");
    // Errors.
    assert_eq!(
        m.create_copy_task("k", "", &[]),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.create_copy_task("k", "", &keys(&["zz"])),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.create_copy_task("nope", "", &keys(&["b"])),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(
        m.create_move_task("k", "", "a", "a"),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.create_move_task("k", "", "b", "c"),
        Err(ErrorCode::INVALID_PARAMS),
        "b holds no replica"
    );
    m.set_segment_status(
        mooncake_common::SegmentId::new(3, 0),
        SegmentStatus::DRAINING,
    )
    .unwrap();
    assert_eq!(
        m.create_copy_task("k", "", &keys(&["c"])),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
    );
    m.set_segment_status(mooncake_common::SegmentId::new(3, 0), SegmentStatus::OK)
        .unwrap();

    // Queued for the owner of the source segment (C1 owns a).
    let copy = m.create_copy_task("k", "", &keys(&["b"])).unwrap();
    let mv = m.create_move_task("k", "", "a", "c").unwrap();
    assert!(m.fetch_tasks(C2, 10).is_empty());
    assert_eq!(m.query_task(copy).unwrap().status, TaskStatus::Pending);
    let got = m.fetch_tasks(C1, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, copy);
    assert_eq!(got[0].task_type, TaskType::ReplicaCopy);
    assert_eq!(got[0].source, "a");
    assert_eq!(m.query_task(copy).unwrap().status, TaskStatus::Processing);
    // The client runs it with CopyStart/End.
    m.copy_start(C1, "k", "", &got[0].source, &got[0].targets)
        .unwrap();
    m.copy_end(C1, "k", "").unwrap();
    let done = TaskCompleteRequest {
        id: copy,
        status: TaskStatus::Success,
        message: String::new(),
    };
    assert_eq!(
        m.mark_task_to_complete(C2, &done),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    m.mark_task_to_complete(C1, &done).unwrap();
    assert_eq!(m.query_task(copy).unwrap().status, TaskStatus::Success);
    assert_eq!(
        m.mark_task_to_complete(
            C1,
            &TaskCompleteRequest {
                id: mooncake_common::TaskId::new(9, 9),
                ..done.clone()
            }
        ),
        Err(ErrorCode::TASK_NOT_FOUND)
    );
    assert_eq!(
        m.query_task(mooncake_common::TaskId::new(9, 9)),
        Err(ErrorCode::TASK_NOT_FOUND)
    );
    // The move task times out while pending (300 s).
    clock.advance(300_000);
    assert_eq!(m.run_task_cleanup_once(), 1);
    let q = m.query_task(mv).unwrap();
    assert_eq!(
        (q.status, q.task_type),
        (TaskStatus::Failed, TaskType::ReplicaMove)
    );
    assert!(m.fetch_tasks(C1, 10).is_empty());
}

#[test]
fn task_queue_limits() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    put_on(&m, "k", "a");
    m.set_task_limits(TaskLimits {
        max_pending: 3,
        max_processing: 2,
        max_finished: 1,
        max_retry_attempts: 0,
        ..TaskLimits::default()
    });
    let ids: Vec<_> = (0..3)
        .map(|_| m.create_copy_task("k", "", &keys(&["b"])).unwrap())
        .collect();
    assert_eq!(
        m.create_copy_task("k", "", &keys(&["b"])),
        Err(ErrorCode::TASK_PENDING_LIMIT_EXCEEDED)
    );
    assert_eq!(m.fetch_tasks(C1, 10).len(), 2, "processing cap");
    for id in &ids[..2] {
        m.mark_task_to_complete(
            C1,
            &TaskCompleteRequest {
                id: *id,
                status: TaskStatus::Failed,
                message: "x".into(),
            },
        )
        .unwrap();
    }
    assert_eq!(
        m.query_task(ids[0]),
        Err(ErrorCode::TASK_NOT_FOUND),
        "finished tasks pruned beyond the limit"
    );
    assert_eq!(m.query_task(ids[1]).unwrap().message, "x");
    assert_eq!(m.fetch_tasks(C1, 10).len(), 1);
}

/// A task reported FAILED is queued again `max_retry_attempts` times, each retry fetchable only
/// after its backoff (which doubles); the report after the last retry is final, with the reason.
#[test]
fn failed_task_is_retried_with_backoff_then_fails() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    put_on(&m, "k", "a");
    m.set_task_limits(TaskLimits {
        max_retry_attempts: 2,
        ..TaskLimits::default()
    });
    let id = m.create_copy_task("k", "", &keys(&["b"])).unwrap();
    let failed = |why: &str| TaskCompleteRequest {
        id,
        status: TaskStatus::Failed,
        message: why.into(),
    };
    for (retry, backoff) in [(1u32, 200u64), (2, 400)] {
        assert_eq!(m.fetch_tasks(C1, 10).len(), 1, "attempt {retry}");
        m.mark_task_to_complete(C1, &failed("target unreachable"))
            .unwrap();
        let q = m.query_task(id).unwrap();
        assert_eq!(q.status, TaskStatus::Pending, "retry {retry} queued");
        assert!(q.message.contains("target unreachable"), "{}", q.message);
        assert!(m.fetch_tasks(C1, 10).is_empty(), "backoff not over yet");
        clock.advance(backoff - 1);
        assert!(m.fetch_tasks(C1, 10).is_empty(), "backoff not over yet");
        clock.advance(1);
    }
    assert_eq!(m.fetch_tasks(C1, 10).len(), 1, "last attempt");
    m.mark_task_to_complete(C1, &failed("target unreachable"))
        .unwrap();
    let q = m.query_task(id).unwrap();
    assert_eq!(q.status, TaskStatus::Failed);
    assert_eq!(q.message, "target unreachable (after 2 retries)");
    clock.advance(60_000);
    assert!(m.fetch_tasks(C1, 10).is_empty());
    // A success on a later attempt is final at once.
    let ok = m.create_copy_task("k", "", &keys(&["b"])).unwrap();
    assert_eq!(m.fetch_tasks(C1, 10).len(), 1);
    let done = TaskCompleteRequest {
        id: ok,
        status: TaskStatus::Success,
        message: String::new(),
    };
    m.mark_task_to_complete(C1, &done).unwrap();
    assert_eq!(m.query_task(ok).unwrap().status, TaskStatus::Success);
}
