//! The invariants of upstream's master that the core covers (1, 2, 4, 5, 6, 8, 10), each as
//! a named test, plus the secondary tests in scope. Time moves only through the manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    Clock, ErrorCode, ObjectMeta, ReplicaStatus, ReplicaType, ReplicateConfig, SegmentId,
    SegmentStatus, SoftPinAction,
};

// ----- invariant 1: no torn reads ----------------------------------------------------------

#[test]
fn inv1_processing_object_is_invisible_to_every_read() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    let descs = m.put_start(C1, "k", 100, &cfg(2), "").unwrap();
    assert_eq!(descs.len(), 2);
    assert!(descs.iter().all(|d| d.status == ReplicaStatus::PROCESSING));

    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    assert_eq!(m.exist_key("k", ""), Ok(false));
    assert_eq!(
        m.batch_get_replica_list(&keys(&["k"]), "")[0],
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    assert_eq!(m.batch_exist_key(&keys(&["k"]), ""), vec![Ok(false)]);
    assert!(m.get_replica_list_by_regex("k", "").unwrap().is_empty());
    assert!(m.get_all_keys("").unwrap().is_empty());
    // A PutEnd that selects no replica of the object (DISK) completes nothing.
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::DISK, "")
        .unwrap();
    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    // Failed reads granted no lease (PutEnd's 0 ms grant leaves it expired).
    assert!(m.object_info("k", "").unwrap().unwrap().lease_timeout_ms <= T0_MS);

    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::MEMORY, "")
        .unwrap();
    let got = m.get_replica_list("k", "").unwrap();
    assert_eq!(got.replicas.len(), 2);
    assert!(got
        .replicas
        .iter()
        .all(|d| d.status == ReplicaStatus::COMPLETE));
    assert_eq!(m.get_all_keys("").unwrap(), vec!["k".to_string()]);
    assert_eq!(m.get_replica_list_by_regex("^k$", "").unwrap().len(), 1);
}

// ----- invariant 2: leases protect readers -------------------------------------------------

#[test]
fn inv2_lease_blocks_non_force_removals_until_it_expires() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    put(&m, C1, "k", 64, 1);
    // PutEnd grants no protecting lease: removable at once.
    put(&m, C1, "fresh", 64, 1);
    assert_eq!(m.remove("fresh", false, ""), Ok(()));

    m.get_replica_list("k", "").unwrap();
    let t_get = clock.now_ms();
    assert_eq!(
        m.object_info("k", "").unwrap().unwrap().lease_timeout_ms,
        t_get + LEASE_MS
    );
    assert_eq!(m.remove("k", false, ""), Err(ErrorCode::OBJECT_HAS_LEASE));
    assert_eq!(
        m.batch_remove(&keys(&["k"]), false, ""),
        vec![Err(ErrorCode::OBJECT_HAS_LEASE)]
    );
    assert_eq!(m.remove_all(false, ""), 0);
    assert_eq!(m.remove_by_regex("k", false, ""), Ok(0));
    assert!(m.batch_replica_clear(&keys(&["k"]), C1, "", "").is_empty());

    // Exist also grants; a later grant extends, an earlier-ending one never shrinks.
    clock.advance(4_000);
    assert_eq!(m.exist_key("k", ""), Ok(true));
    let lease = m.object_info("k", "").unwrap().unwrap().lease_timeout_ms;
    assert_eq!(lease, t_get + 4_000 + LEASE_MS);
    clock.advance(LEASE_MS - 1);
    assert_eq!(
        m.remove("k", false, ""),
        Err(ErrorCode::OBJECT_HAS_LEASE),
        "1 ms before expiry"
    );
    clock.advance(1);
    // Expired exactly at now == lease_timeout.
    assert_eq!(
        m.batch_replica_clear(&keys(&["k"]), C1, "", ""),
        keys(&["k"])
    );
    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );

    // The other removals succeed after expiry too.
    for (i, remover) in ["remove", "all", "regex"].iter().enumerate() {
        let key = format!("x{i}");
        put(&m, C1, &key, 64, 1);
        m.get_replica_list(&key, "").unwrap();
        clock.advance(LEASE_MS);
        match *remover {
            "remove" => assert_eq!(m.remove(&key, false, ""), Ok(())),
            "all" => assert_eq!(m.remove_all(false, ""), 1),
            _ => assert_eq!(m.remove_by_regex(&key, false, ""), Ok(1)),
        }
    }
    // Force removes a leased object.
    put(&m, C1, "leased", 64, 1);
    m.get_replica_list("leased", "").unwrap();
    assert_eq!(m.remove("leased", true, ""), Ok(()));
    assert_accounting(&m);
}

// ----- invariant 4: write ownership and the put state machine ------------------------------

#[test]
fn inv4_only_the_writer_may_end_or_revoke() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.put_start(C1, "k", 10, &cfg(1), "").unwrap();
    assert_eq!(
        m.put_end(C2, &ObjectMeta::new("k"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_eq!(
        m.put_revoke(C2, "k", ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY),
        "unchanged"
    );
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert!(m.get_replica_list("k", "").is_ok());
}

#[test]
fn inv4_end_is_idempotent_and_revoke_is_not() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.put_start(C1, "k", 10, &cfg(1), "").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert_eq!(
        m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, ""),
        Ok(()),
        "retry"
    );
    assert_eq!(
        m.put_revoke(C1, "k", ReplicaType::ALL, ""),
        Err(ErrorCode::INVALID_WRITE)
    );

    m.put_start(C1, "r", 10, &cfg(1), "").unwrap();
    assert_eq!(used(&m, 1), Some(20));
    assert_eq!(m.put_revoke(C1, "r", ReplicaType::ALL, ""), Ok(()));
    assert_eq!(used(&m, 1), Some(10), "revoke frees at once");
    assert_eq!(
        m.put_revoke(C1, "r", ReplicaType::ALL, ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_eq!(
        m.put_end(C1, &ObjectMeta::new("r"), ReplicaType::ALL, ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_accounting(&m);
}

#[test]
fn inv4_second_put_start_on_a_live_key_is_already_exists() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    put(&m, C1, "done", 10, 1);
    assert_eq!(
        m.put_start(C2, "done", 10, &cfg(1), ""),
        Err(ErrorCode::OBJECT_ALREADY_EXISTS)
    );
    m.put_start(C1, "inflight", 10, &cfg(1), "").unwrap();
    clock.advance(30_000); // exactly the discard timeout: still protected
                           // Nothing readable yet: not "already exists" (which a client reports as success) but
                           // upstream's code for replicas still PROCESSING.
    assert_eq!(
        m.put_start(C2, "inflight", 10, &cfg(1), ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    assert_eq!(
        m.put_start(C1, "inflight", 10, &cfg(1), ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY),
        "the writer's own second start too"
    );
    clock.advance(10 * 60_000);
    // A COMPLETE object is never pre-empted, however old.
    assert_eq!(
        m.put_start(C2, "done", 10, &cfg(1), ""),
        Err(ErrorCode::OBJECT_ALREADY_EXISTS)
    );
    assert_accounting(&m);
}

#[test]
fn inv4_stale_put_is_preempted_and_its_buffers_are_not_reused_before_release() {
    let (clock, m) = master();
    // Room for exactly two 100-byte buffers.
    m.mount_segment(&seg(1, "a", 200), C1).unwrap();
    let old = m.put_start(C1, "k", 100, &cfg(1), "").unwrap();
    let t_start = clock.now_ms();
    clock.advance(30_001);
    let new = m.put_start(C2, "k", 100, &cfg(1), "").unwrap();
    let (old_addr, new_addr) = (
        old[0].memory().unwrap().buffer_address,
        new[0].memory().unwrap().buffer_address,
    );
    assert_ne!(
        old_addr, new_addr,
        "the pre-empted buffer must not be handed out again"
    );
    assert_eq!(m.discarded_replica_count(), 1);
    // The old writer lost the object.
    assert_eq!(
        m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    // The segment is full until the old buffer's release time (put_start + 600 s).
    assert_eq!(
        m.put_start(C1, "other", 100, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    clock.set(t_start + 600_000 - 1);
    assert_eq!(m.release_discarded_once(), 0);
    assert_eq!(
        m.put_start(C1, "other", 100, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    clock.set(t_start + 600_000);
    assert_eq!(m.release_discarded_once(), 1);
    let reused = m.put_start(C1, "other", 100, &cfg(1), "").unwrap();
    assert_eq!(reused[0].memory().unwrap().buffer_address, old_addr);
    assert_accounting(&m);
}

// ----- invariant 5: exact space accounting -------------------------------------------------

#[test]
fn inv5_used_equals_live_buffers_through_the_whole_lifecycle() {
    let (clock, m) = master();
    let segments = [seg(1, "a", 10_000), seg(2, "b", 10_000), seg(3, "c", 5_000)];
    for s in &segments {
        m.mount_segment(s, C1).unwrap();
    }
    let mut total = 0;
    for i in 0..60u64 {
        let size = 1 + (i * 37) % 200;
        let key = format!("k{i}");
        match m.put_start(C1, &key, size, &cfg(1 + (i as usize % 3)), "") {
            Ok(descs) => {
                for d in &descs {
                    let mem = d.memory().unwrap();
                    let s = segments
                        .iter()
                        .find(|s| format!("ep-{}", s.name) == *mem.transport_endpoint)
                        .unwrap();
                    assert!(
                        mem.buffer_address >= s.base
                            && mem.buffer_address + mem.size <= s.base + s.size,
                        "{key}: buffer outside its segment"
                    );
                    assert_eq!(mem.size, size);
                    total += size;
                }
            }
            Err(code) => panic!("{key}: {code}"),
        }
        if i % 4 != 0 {
            m.put_end(C1, &ObjectMeta::new(&key), ReplicaType::ALL, "")
                .unwrap();
        }
        assert_accounting(&m);
    }
    let used_sum: u64 = m.segment_usage().iter().filter_map(|u| u.used_bytes).sum();
    assert_eq!(used_sum, total);
    // Remove some, revoke some, reap the rest after the release timeout.
    for i in (1..60).step_by(4) {
        m.remove(&format!("k{i}"), false, "").unwrap();
    }
    for i in (0..60).step_by(8) {
        m.put_revoke(C1, &format!("k{i}"), ReplicaType::ALL, "")
            .unwrap();
    }
    assert_accounting(&m);
    clock.advance(600_000);
    let report = m.run_put_timeouts_once();
    // 15 puts were left in flight (i % 4 == 0), 8 of them revoked (i % 8 == 0).
    assert_eq!(report.reaped_puts, 7, "{report:?}");
    assert_accounting(&m);
    // Unmount one segment: its bytes are gone with it; the others still add up.
    m.unmount_segment(SegmentId::new(3, 0), C1).unwrap();
    assert_accounting(&m);
    let remaining = m.object_count() as i64;
    assert!(remaining > 0);
    assert_eq!(m.remove_all(true, ""), remaining);
    assert_eq!(m.object_count(), 0);
    assert_eq!(used(&m, 1), Some(0));
    assert_eq!(used(&m, 2), Some(0));
    assert_accounting(&m);
}

// ----- invariant 6: placement --------------------------------------------------------------

#[test]
fn inv6_replicas_on_distinct_ok_names_preferred_first() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "a", 1 << 20), C1).unwrap(); // same name as 1
    m.mount_segment(&seg(3, "b", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(4, "c", 1 << 20), C1).unwrap();
    for i in 0..30 {
        let d = m.put_start(C1, &format!("k{i}"), 10, &cfg(5), "").unwrap();
        let mut names: Vec<_> = d
            .iter()
            .map(|d| d.memory().unwrap().transport_endpoint.to_string())
            .collect();
        assert_eq!(names.len(), 3, "best effort: 3 distinct names exist");
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 3, "replicas on distinct names");
    }
    let prefs = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["c".into(), "b".into()],
        ..Default::default()
    };
    for i in 0..10 {
        let d = m.put_start(C1, &format!("p{i}"), 10, &prefs, "").unwrap();
        let eps: Vec<_> = d
            .iter()
            .map(|d| d.memory().unwrap().transport_endpoint.to_string())
            .collect();
        assert_eq!(eps, ["ep-c", "ep-b"]);
    }
    // Nothing from DRAINING or GRACEFULLY_UNMOUNTING segments.
    m.set_segment_status(SegmentId::new(4, 0), SegmentStatus::DRAINING)
        .unwrap();
    m.graceful_unmount_segment(SegmentId::new(3, 0), C1, 60_000)
        .unwrap();
    for i in 0..20 {
        let d = m.put_start(C1, &format!("d{i}"), 10, &prefs, "").unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(&*d[0].memory().unwrap().transport_endpoint, "ep-a");
    }
    // Back to OK: allocatable again.
    m.set_segment_status(SegmentId::new(4, 0), SegmentStatus::OK)
        .unwrap();
    let d = m.put_start(C1, "back", 10, &prefs, "").unwrap();
    assert_eq!(&*d[0].memory().unwrap().transport_endpoint, "ep-c");
    assert_accounting(&m);
}

// ----- invariant 8: idempotent control plane -----------------------------------------------

#[test]
fn inv8_control_plane_is_idempotent() {
    let (_, m) = master();
    let s1 = seg(1, "a", 1000);
    m.mount_segment(&s1, C1).unwrap();
    assert_eq!(m.mount_segment(&s1, C1), Ok(()), "mounting twice is OK");
    assert_eq!(m.total_capacity_bytes(), 1000, "capacity counted once");
    assert_eq!(m.segment_usage().len(), 1);
    assert_eq!(
        m.unmount_segment(SegmentId::new(99, 0), C1),
        Ok(()),
        "unknown segment"
    );

    // ReMount: the first makes the client OK; a repeat by an OK client is OK.
    let s2 = seg(2, "b", 500);
    assert!(!m.is_client_ok(C1));
    assert_eq!(m.remount_segments(&[s1.clone(), s2.clone()], C1), Ok(()));
    assert!(m.is_client_ok(C1));
    assert_eq!(m.total_capacity_bytes(), 1500);
    assert_eq!(m.remount_segments(&[s1.clone(), s2.clone()], C1), Ok(()));
    assert_eq!(m.total_capacity_bytes(), 1500);
    // Someone else's segment id, or changed fields → INVALID_PARAMS, nothing changes.
    assert_eq!(
        m.remount_segments(std::slice::from_ref(&s1), C2),
        Err(ErrorCode::INVALID_PARAMS)
    );
    let changed = mooncake_common::Segment {
        size: 999,
        ..s1.clone()
    };
    assert_eq!(
        m.remount_segments(&[changed], C1),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(m.total_capacity_bytes(), 1500);
    assert!(!m.is_client_ok(C2));

    // Mounting an id that is mounted in a non-OK status.
    m.set_segment_status(s2.id, SegmentStatus::DRAINING)
        .unwrap();
    assert_eq!(
        m.mount_segment(&s2, C1),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
    );
    // Unmount twice.
    assert_eq!(m.unmount_segment(s2.id, C1), Ok(()));
    assert_eq!(m.unmount_segment(s2.id, C1), Ok(()));
    assert_eq!(m.total_capacity_bytes(), 1000);
    assert_eq!(
        m.query_segment_status("b"),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(m.query_segment_status("a"), Ok(SegmentStatus::OK));
}

#[test]
fn remount_rolls_back_on_a_status_error() {
    let (_, m) = master();
    let s1 = seg(1, "a", 1000);
    m.mount_segment(&s1, C1).unwrap();
    m.set_segment_status(s1.id, SegmentStatus::DRAINING)
        .unwrap();
    let fresh = seg(2, "b", 1000);
    // s1 is listed with equal fields, so validation passes; mounting it hits its DRAINING status.
    assert_eq!(
        m.remount_segments(&[fresh.clone(), s1.clone()], C1),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
    );
    assert_eq!(
        m.query_segment_status_by_id(fresh.id),
        Err(ErrorCode::SEGMENT_NOT_FOUND),
        "rolled back"
    );
    assert_eq!(m.total_capacity_bytes(), 1000);
    assert!(!m.is_client_ok(C1));
}

// ----- invariant 10: batch equivalence -----------------------------------------------------

#[test]
fn inv10_batches_equal_single_calls_in_input_order() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    for i in 0..200 {
        let key = format!("key-{i}");
        m.put_start(C1, &key, 10 + i, &cfg(1 + (i as usize % 2)), "")
            .unwrap();
        if i % 3 != 0 {
            m.put_end(C1, &ObjectMeta::new(&key), ReplicaType::ALL, "")
                .unwrap();
        }
    }
    // Complete, in-flight, missing and repeated keys, shuffled.
    let mut ks: Vec<String> = (0..260)
        .map(|i| format!("key-{}", (i * 7919) % 260))
        .collect();
    ks.push("key-5".into());
    ks.push(String::new());
    let batch = m.batch_get_replica_list(&ks, "");
    assert_eq!(batch.len(), ks.len());
    for (k, b) in ks.iter().zip(&batch) {
        assert_eq!(*b, m.get_replica_list(k, ""), "key {k}");
    }
    let exist = m.batch_exist_key(&ks, "");
    for (k, e) in ks.iter().zip(&exist) {
        assert_eq!(*e, m.exist_key(k, ""), "key {k}");
    }
    // Removal: compute the single-call answers on a twin, compare codes.
    let (_, twin) = master();
    twin.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    twin.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    for i in 0..200 {
        let key = format!("key-{i}");
        twin.put_start(C1, &key, 10 + i, &cfg(1 + (i as usize % 2)), "")
            .unwrap();
        if i % 3 != 0 {
            twin.put_end(C1, &ObjectMeta::new(&key), ReplicaType::ALL, "")
                .unwrap();
        }
    }
    let singles: Vec<_> = ks.iter().map(|k| twin.remove(k, true, "")).collect();
    assert_eq!(m.batch_remove(&ks, true, ""), singles);
    assert_accounting(&m);
}

#[test]
fn inv10_batch_length_mismatch_is_invalid_params_for_every_entry() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let ks = keys(&["a", "b", "c"]);
    let r = m.batch_put_start(C1, &ks, &[1, 2], &cfg(1), "");
    assert_eq!(r, vec![Err(ErrorCode::INVALID_PARAMS); 3]);
    let grouped = ReplicateConfig {
        group_ids: Some(vec!["g".into()]),
        ..cfg(1)
    };
    let r = m.batch_put_start(C1, &ks, &[1, 2, 3], &grouped, "");
    assert_eq!(r, vec![Err(ErrorCode::INVALID_PARAMS); 3]);
    assert_eq!(m.object_count(), 0, "nothing was created");
    assert_eq!(used(&m, 1), Some(0));
    // Matching lengths: one result per key, in order, equal to the single call.
    let ok = m.batch_put_start(C1, &ks, &[1, 0, 3], &cfg(1), "");
    assert!(ok[0].is_ok() && ok[2].is_ok());
    assert_eq!(ok[1], Err(ErrorCode::INVALID_PARAMS));
    let metas: Vec<_> = ["a", "zz", "c"]
        .iter()
        .map(|k| ObjectMeta::new(*k))
        .collect();
    assert_eq!(
        m.batch_put_end(C1, &metas, ReplicaType::ALL, ""),
        vec![Ok(()), Err(ErrorCode::OBJECT_NOT_FOUND), Ok(())]
    );
    assert_eq!(
        m.batch_put_revoke(C1, &ks, ReplicaType::ALL, ""),
        vec![
            Err(ErrorCode::INVALID_WRITE),
            Err(ErrorCode::OBJECT_NOT_FOUND),
            Err(ErrorCode::INVALID_WRITE)
        ]
    );
}

// ----- secondary tests in scope ------------------------------------------------------------

#[test]
fn discarded_buffers_are_freed_after_the_release_timeout() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    m.put_start(C1, "k", 300, &cfg(1), "").unwrap();
    let t_start = clock.now_ms();
    clock.advance(599_999);
    assert_eq!(m.run_put_timeouts_once(), Default::default());
    assert_eq!(used(&m, 1), Some(300));
    clock.set(t_start + 600_000);
    let report = m.run_put_timeouts_once();
    assert_eq!(
        (
            report.reaped_puts,
            report.erased_objects,
            report.released_replicas
        ),
        (1, 1, 1)
    );
    assert_eq!(used(&m, 1), Some(0));
    assert_eq!(m.object_info("k", "").unwrap(), None);
    assert_accounting(&m);
}

#[test]
fn soft_pin_starts_at_put_end_and_reads_do_not_extend_it() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    let pinned = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(5_000),
        ..cfg(1)
    };
    m.put_start(C1, "k", 10, &pinned, "").unwrap();
    assert_eq!(
        m.object_info("k", "")
            .unwrap()
            .unwrap()
            .soft_pin_deadline_ms,
        0,
        "not before End"
    );
    clock.advance(2_000);
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    let t_end = clock.now_ms();
    assert_eq!(
        m.object_info("k", "")
            .unwrap()
            .unwrap()
            .soft_pin_deadline_ms,
        t_end + 5_000
    );
    clock.advance(4_000);
    m.get_replica_list("k", "").unwrap();
    m.exist_key("k", "").unwrap();
    assert_eq!(
        m.object_info("k", "")
            .unwrap()
            .unwrap()
            .soft_pin_deadline_ms,
        t_end + 5_000,
        "reads don't extend"
    );
    assert_eq!(m.run_soft_pin_expiry_once(), 0);
    clock.advance(1_000);
    assert_eq!(m.run_soft_pin_expiry_once(), 1);
    assert_eq!(
        m.object_info("k", "")
            .unwrap()
            .unwrap()
            .soft_pin_deadline_ms,
        0
    );
    assert_eq!(m.pending_soft_pin_deadlines(), 0);
    // Default TTL when ENABLE comes without one.
    let default_ttl = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        ..cfg(1)
    };
    put_with(&m, "d", &default_ttl);
    assert_eq!(
        m.object_info("d", "")
            .unwrap()
            .unwrap()
            .soft_pin_deadline_ms,
        clock.now_ms() + 1_800_000
    );
    // Hard pin is recorded and does not block Remove.
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..cfg(1)
    };
    put_with(&m, "h", &hard);
    assert!(m.object_info("h", "").unwrap().unwrap().hard_pinned);
    assert_eq!(m.remove("h", false, ""), Ok(()));
    assert_eq!(
        m.remove("d", false, ""),
        Ok(()),
        "soft pin does not block Remove"
    );
}

fn put_with(m: &mooncake_master::MasterService, key: &str, config: &ReplicateConfig) {
    m.put_start(C1, key, 10, config, "").unwrap();
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

#[test]
fn force_remove_still_refuses_incomplete_objects() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    m.put_start(C1, "k", 10, &cfg(1), "").unwrap();
    assert_eq!(
        m.remove("k", true, ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    assert_eq!(m.remove_all(true, ""), 0);
    assert_eq!(m.remove_by_regex(".*", true, ""), Ok(0));
    assert_eq!(used(&m, 1), Some(10));
}

#[test]
fn invalid_regex_is_invalid_params() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    put(&m, C1, "k", 10, 1);
    assert_eq!(
        m.get_replica_list_by_regex("(unclosed", ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.remove_by_regex("[z-a]", true, ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    let huge = "a".repeat(mooncake_master::MAX_REGEX_LEN_BYTES + 1);
    assert_eq!(
        m.get_replica_list_by_regex(&huge, ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    // Search semantics (not full match), and nothing changed by the failures.
    assert_eq!(m.get_replica_list_by_regex("^k", "").unwrap().len(), 1);
    assert_eq!(m.remove_by_regex("k", true, ""), Ok(1));
}

#[test]
fn a_stale_soft_pin_deadline_does_not_clear_a_newer_pin_of_the_same_key() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    let pin = |ttl| ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(ttl),
        ..cfg(1)
    };
    put_with(&m, "k", &pin(5_000));
    let t0 = clock.now_ms();
    m.remove("k", false, "").unwrap();
    clock.advance(1_000);
    put_with(&m, "k", &pin(10_000));
    clock.set(t0 + 5_000);
    assert_eq!(
        m.run_soft_pin_expiry_once(),
        0,
        "the old deadline belongs to the removed object"
    );
    let info = m.object_info("k", "").unwrap().unwrap();
    assert_eq!(info.soft_pin_deadline_ms, t0 + 11_000);
    clock.set(t0 + 11_000);
    assert_eq!(m.run_soft_pin_expiry_once(), 1);
    // DISABLE and ENABLE with TTL 0 leave a fresh object unpinned.
    let disable = ReplicateConfig {
        soft_pin_action: SoftPinAction::Disable,
        ..cfg(1)
    };
    put_with(&m, "d", &disable);
    put_with(&m, "z", &pin(0));
    for k in ["d", "z"] {
        assert_eq!(
            m.object_info(k, "").unwrap().unwrap().soft_pin_deadline_ms,
            0,
            "{k}"
        );
    }
}

#[test]
fn checksum_is_stored_at_put_end_and_returned_by_reads() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    m.put_start(C1, "k", 10, &cfg(1), "").unwrap();
    let meta = ObjectMeta {
        key: "k".into(),
        object_checksum: Some(0xfeed),
    };
    m.put_end(C1, &meta, ReplicaType::ALL, "").unwrap();
    assert_eq!(
        m.get_replica_list("k", "").unwrap().object_checksum,
        Some(0xfeed)
    );
    // An idempotent retry changes nothing.
    let other = ObjectMeta {
        key: "k".into(),
        object_checksum: Some(1),
    };
    m.put_end(C1, &other, ReplicaType::ALL, "").unwrap();
    assert_eq!(
        m.get_replica_list("k", "").unwrap().object_checksum,
        Some(0xfeed)
    );
    put(&m, C1, "plain", 10, 1);
    assert_eq!(
        m.get_replica_list("plain", "").unwrap().object_checksum,
        None
    );
}
