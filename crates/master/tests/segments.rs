//! Segment lifecycle: unmount kills every replica on the segment at once, graceful unmount keeps
//! data readable until its deadline, status rules and mount validation.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId, SegmentStatus,
};

fn on(names: &[&str], replicas: usize) -> ReplicateConfig {
    ReplicateConfig {
        replica_num: replicas,
        preferred_segments: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn unmount_makes_every_replica_on_the_segment_vanish_at_once() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 10_000), C1).unwrap();
    m.mount_segment(&seg(2, "b", 10_000), C2).unwrap();
    for (key, cfg) in [("both", on(&["a", "b"], 2)), ("only-a", on(&["a"], 1))] {
        m.put_start(C1, key, 100, &cfg, "").unwrap();
        m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
            .unwrap();
    }
    m.put_start(C1, "inflight-a", 100, &on(&["a"], 1), "")
        .unwrap();
    assert_eq!(m.get_replica_list("both", "").unwrap().replicas.len(), 2);

    m.unmount_segment(SegmentId::new(1, 0), C1).unwrap();
    let left = m.get_replica_list("both", "").unwrap().replicas;
    assert_eq!(left.len(), 1, "only the replica elsewhere survives");
    assert_eq!(&*left[0].memory().unwrap().transport_endpoint, "ep-b");
    assert_eq!(
        m.get_replica_list("only-a", ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(m.exist_key("only-a", ""), Ok(false));
    assert_eq!(
        m.put_end(C1, &ObjectMeta::new("inflight-a"), ReplicaType::ALL, ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(
        m.object_count(),
        1,
        "objects left without a valid replica are erased"
    );
    assert_eq!(
        m.query_segment_status_by_id(SegmentId::new(1, 0)),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(m.total_capacity_bytes(), 10_000);
    assert_accounting(&m);
    // The key can be written again.
    put(&m, C1, "only-a", 100, 1);
}

#[test]
fn graceful_unmount_keeps_data_readable_until_the_deadline() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 10_000), C1).unwrap();
    m.mount_segment(&seg(2, "b", 10_000), C2).unwrap();
    m.put_start(C1, "k", 100, &on(&["a"], 1), "").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();

    m.graceful_unmount_segment(SegmentId::new(1, 0), C1, 5_000)
        .unwrap();
    assert_eq!(
        m.query_segment_status("a"),
        Ok(SegmentStatus::GRACEFULLY_UNMOUNTING)
    );
    assert_eq!(
        m.graceful_unmount_segment(SegmentId::new(1, 0), C1, 1),
        Ok(()),
        "repeat is OK"
    );
    assert!(m.get_replica_list("k", "").is_ok(), "still readable");
    let d = m.put_start(C1, "new", 100, &on(&["a"], 1), "").unwrap();
    assert_eq!(
        &*d[0].memory().unwrap().transport_endpoint,
        "ep-b",
        "no new allocations on a"
    );

    clock.advance(4_999);
    assert_eq!(m.run_graceful_unmounts_once(), 0);
    assert!(m.get_replica_list("k", "").is_ok());
    clock.advance(1);
    assert_eq!(m.run_graceful_unmounts_once(), 1);
    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(
        m.query_segment_status("a"),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(m.run_graceful_unmounts_once(), 0);
    assert_accounting(&m);
}

#[test]
fn graceful_unmount_checks_owner_and_status() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1000), C2).unwrap();
    let c3 = mooncake_common::ClientId::new(3, 3);
    assert_eq!(
        m.graceful_unmount_segment(SegmentId::new(1, 0), c3, 10),
        Err(ErrorCode::SEGMENT_NOT_FOUND),
        "a client without segments"
    );
    assert_eq!(
        m.graceful_unmount_segment(SegmentId::new(2, 0), C1, 10),
        Err(ErrorCode::INVALID_PARAMS),
        "someone else's segment"
    );
    m.set_segment_status(SegmentId::new(1, 0), SegmentStatus::DRAINING)
        .unwrap();
    m.set_segment_status(SegmentId::new(1, 0), SegmentStatus::DRAINED)
        .unwrap();
    assert_eq!(
        m.graceful_unmount_segment(SegmentId::new(1, 0), C1, 10),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
    );
    assert_eq!(
        m.set_segment_status(SegmentId::new(9, 0), SegmentStatus::OK),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(
        m.set_segment_status(SegmentId::new(2, 0), SegmentStatus::DRAINED),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
        "OK → DRAINED skips DRAINING"
    );
}

#[test]
fn mount_rejects_zero_base_zero_size_and_overflow_without_change() {
    let (_, m) = master();
    let bad = [
        Segment {
            base: 0,
            ..seg(1, "a", 100)
        },
        seg(2, "b", 0),
        Segment {
            base: u64::MAX - 10,
            ..seg(3, "c", 100)
        },
    ];
    for s in &bad {
        assert_eq!(
            m.mount_segment(s, C1),
            Err(ErrorCode::INVALID_PARAMS),
            "{s:?}"
        );
    }
    assert_eq!(m.total_capacity_bytes(), 0);
    assert!(m.segment_usage().is_empty());
    assert_eq!(
        m.put_start(C1, "k", 1, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(
        !m.need_eviction(),
        "no segment names at all: eviction cannot help"
    );
    assert_eq!(m.object_count(), 0);
}

#[test]
fn full_store_is_no_available_handle_and_changes_nothing() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 100), C1).unwrap();
    // Hard-pinned: inline eviction finds nothing to take.
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        ..cfg(1)
    };
    m.put_start(C1, "k", 100, &pinned, "").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert_eq!(
        m.put_start(C1, "k2", 1, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(
        m.need_eviction(),
        "a failed allocation with enough names asks for eviction"
    );
    assert_eq!(m.object_count(), 1);
    assert_eq!(used(&m, 1), Some(100));
    assert_accounting(&m);
}
