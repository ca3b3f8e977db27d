//! Suspected segments (ReportTransferFailure): out of placement at once, still readable, back
//! in placement when their owner pings or mounts again, forgotten when unmounted.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ErrorCode, ObjectMeta, ReplicaType, SegmentId, SegmentStatus};
use mooncake_master::MasterService;

const MIB: u64 = 1 << 20;

/// The endpoints of the replicas `key` got at PutStart (ended at once).
fn placed_on(m: &MasterService, key: &str) -> Vec<String> {
    put(m, C1, key, 100, 1)
        .iter()
        .filter_map(|d| d.memory().map(|x| x.transport_endpoint.to_string()))
        .collect()
}

/// Segment 1 "a" owned by C1 and segment 2 "b" owned by C2, both OK.
fn two_owners() -> MasterService {
    let (_, m) = master();
    m.remount_segments(&[seg(1, "a", MIB)], C1).unwrap();
    m.remount_segments(&[seg(2, "b", MIB)], C2).unwrap();
    m
}

#[test]
fn a_reported_segment_gets_no_new_replicas_but_stays_readable() {
    let m = two_owners();
    // Something on "a" before the report.
    let mut on_a = None;
    for i in 0..64 {
        let key = format!("before/{i}");
        if placed_on(&m, &key) == ["ep-a"] {
            on_a = Some(key);
            break;
        }
    }
    let on_a = on_a.expect("random placement never chose a in 64 puts");
    assert_eq!(m.report_transfer_failure(C2, "ep-a").unwrap(), 1);
    assert_eq!(m.suspected_segments(), vec![SegmentId::new(1, 0)]);
    for i in 0..64 {
        let key = format!("after/{i}");
        assert_eq!(placed_on(&m, &key), ["ep-b"], "{key} placed on a suspect");
    }
    // Readers still get the replica on the suspected segment.
    let replicas = m.get_replica_list(&on_a, "").unwrap().replicas;
    assert_eq!(replicas.len(), 1, "{on_a}");
    // A second report changes nothing; an unknown endpoint suspects nothing.
    assert_eq!(m.report_transfer_failure(C2, "ep-a").unwrap(), 0);
    assert_eq!(m.report_transfer_failure(C2, "ep-nowhere").unwrap(), 0);
    assert_eq!(
        m.report_transfer_failure(C2, ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_accounting(&m);
}

#[test]
fn the_owners_ping_or_remount_clears_the_suspicion() {
    let m = two_owners();
    m.report_transfer_failure(C2, "ep-a").unwrap();
    // Another client's ping does not clear it.
    m.ping(C2).unwrap();
    assert_eq!(m.suspected_segments().len(), 1);
    m.ping(C1).unwrap();
    assert!(m.suspected_segments().is_empty());
    let mut on_a = false;
    for i in 0..64 {
        on_a |= placed_on(&m, &format!("k/{i}")) == ["ep-a"];
    }
    assert!(on_a, "a never placed again after its owner pinged");

    m.report_transfer_failure(C2, "ep-a").unwrap();
    m.remount_segments(&[seg(1, "a", MIB)], C1).unwrap();
    assert!(m.suspected_segments().is_empty());
    assert_accounting(&m);
}

#[test]
fn with_every_segment_suspected_a_put_finds_no_space_and_nothing_is_left_behind() {
    let m = two_owners();
    m.report_transfer_failure(C1, "ep-a").unwrap();
    m.report_transfer_failure(C1, "ep-b").unwrap();
    let refused = m.put_start(C1, "k", 100, &cfg(1), "").unwrap_err();
    assert_eq!(refused, ErrorCode::NO_AVAILABLE_HANDLE);
    m.ping(C2).unwrap();
    m.put_start(C1, "k", 100, &cfg(1), "").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert_accounting(&m);
}

#[test]
fn a_drain_does_not_put_a_suspect_back_into_placement() {
    let m = two_owners();
    m.report_transfer_failure(C2, "ep-a").unwrap();
    let a = SegmentId::new(1, 0);
    m.set_segment_status(a, SegmentStatus::DRAINING).unwrap();
    m.set_segment_status(a, SegmentStatus::OK).unwrap();
    for i in 0..32 {
        assert_eq!(placed_on(&m, &format!("k/{i}")), ["ep-b"]);
    }
    // The owner's ping puts it back exactly once (no duplicate in placement).
    m.ping(C1).unwrap();
    m.unmount_segment(a, C1).unwrap();
    for i in 0..32 {
        assert_eq!(placed_on(&m, &format!("z/{i}")), ["ep-b"]);
    }
    assert_accounting(&m);
}

#[test]
fn an_unmounted_suspect_is_forgotten() {
    let (clock, m) = master();
    m.remount_segments(&[seg(1, "a", MIB)], C1).unwrap();
    m.remount_segments(&[seg(2, "b", MIB)], C2).unwrap();
    m.ping(C1).unwrap();
    m.ping(C2).unwrap();
    m.report_transfer_failure(C2, "ep-a").unwrap();
    // C1 stops pinging: the monitor unmounts its segment and the suspicion goes with it.
    assert_eq!(m.run_client_monitor_once(), 0);
    clock.advance(5_000);
    m.ping(C2).unwrap();
    assert_eq!(m.run_client_monitor_once(), 0);
    clock.advance(6_000);
    m.ping(C2).unwrap();
    assert_eq!(m.run_client_monitor_once(), 1);
    assert!(m.suspected_segments().is_empty());
    assert_accounting(&m);
}
