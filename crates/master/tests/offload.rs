//! The master's side of the local disk tier (`offload.rs`): eager offload tasks pin their source
//! replica until the node answers; every task ends in one answer; a stored answer adds a
//! LOCAL_DISK replica and eviction then drops only the memory replica; a refused answer only
//! unpins; no disk replica for an unmounted node; a node's expiry takes its disk replicas; every
//! removal path tells the node to drop the record, an advertisement of a removed key is refused
//! until the node reports it deleted, and a newer offload of the key cancels the drop.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{DiskObject, ErrorCode, OffloadOutcome, ReplicaKind, ReplicaType};
use mooncake_master::MasterServiceConfig;

fn offload_master() -> (
    std::sync::Arc<mooncake_common::ManualClock>,
    mooncake_master::MasterService,
) {
    master_with(MasterServiceConfig {
        enable_offload: true,
        ..Default::default()
    })
}

fn kinds(m: &mooncake_master::MasterService, key: &str) -> Vec<ReplicaType> {
    m.get_replica_list(key, "")
        .map(|r| r.replicas.iter().map(|d| d.kind.replica_type()).collect())
        .unwrap_or_default()
}

fn outcome(key: &str, stored: bool) -> OffloadOutcome {
    OffloadOutcome {
        tenant: String::new(),
        key: key.to_string(),
        stored,
    }
}

#[test]
fn a_master_without_offload_refuses_a_disk() {
    let (_, m) = master();
    assert_eq!(
        m.mount_local_disk(C1, "h:1", 1 << 30, 0),
        Err(ErrorCode::UNABLE_OFFLOAD)
    );
}

#[test]
fn every_task_ends_in_one_answer_and_pins_return_to_zero() {
    let (_, m) = offload_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    for k in ["k1", "k2", "k3"] {
        put(&m, C2, k, 1000, 1);
    }
    let s = m.offload_stats();
    assert_eq!((s.queued, s.in_flight), (3, 3));
    // Pinned: even a forced Remove leaves the source replica alone.
    assert_eq!(
        m.remove("k1", true, ""),
        Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK)
    );
    let tasks = m.offload_heartbeat(C1, 10, 0).unwrap();
    assert_eq!(tasks.len(), 3);
    assert!(
        m.offload_heartbeat(C1, 10, 0).unwrap().is_empty(),
        "tasks handed out twice"
    );
    let answers = m.notify_offload(C1, &[outcome("k1", true), outcome("k2", false)]);
    assert_eq!(answers, vec![Ok(()), Ok(())]);
    // A second answer for the same task is refused.
    assert_eq!(
        m.notify_offload(C1, &[outcome("k1", true)]),
        vec![Err(ErrorCode::INVALID_PARAMS)]
    );
    assert_eq!(m.notify_offload(C1, &[outcome("k3", true)]), vec![Ok(())]);
    let s = m.offload_stats();
    assert_eq!(
        (s.queued, s.stored, s.refused, s.in_flight),
        (3, 2, 1, 0),
        "{s:?}"
    );
    assert_eq!(
        kinds(&m, "k1"),
        vec![ReplicaType::MEMORY, ReplicaType::LOCAL_DISK]
    );
    assert_eq!(kinds(&m, "k2"), vec![ReplicaType::MEMORY]);
    assert_accounting(&m);
}

#[test]
fn an_offloaded_object_loses_only_its_memory_replica_to_eviction() {
    let (clock, m) = offload_master();
    m.mount_segment(&seg(1, "a", 10_000), C1).unwrap();
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    for i in 0..10 {
        put(&m, C2, &format!("k{i}"), 1000, 1);
    }
    let tasks = m.offload_heartbeat(C1, 100, 0).unwrap();
    let outcomes: Vec<OffloadOutcome> = tasks.iter().map(|t| outcome(&t.key, true)).collect();
    assert!(m.notify_offload(C1, &outcomes).iter().all(Result::is_ok));
    clock.advance(2 * LEASE_MS);
    let report = m.run_eviction_once();
    assert!(report.evicted_objects > 0, "{report:?}");
    let mut disk_only = 0;
    for i in 0..10 {
        let k = kinds(&m, &format!("k{i}"));
        assert!(k.contains(&ReplicaType::LOCAL_DISK), "k{i}: {k:?}");
        if k == vec![ReplicaType::LOCAL_DISK] {
            disk_only += 1;
        }
    }
    assert_eq!(disk_only, report.evicted_objects);
    let d = m.get_replica_list("k0", "").unwrap();
    match &d.replicas.last().unwrap().kind {
        ReplicaKind::LocalDisk(l) => {
            assert_eq!(
                (l.client_id, l.object_size, l.transport_endpoint.as_str()),
                (C1, 1000, "h:1")
            )
        }
        other => panic!("{other:?}"),
    }
    assert_accounting(&m);
}

#[test]
fn disk_replicas_follow_their_node() {
    let (clock, m) = offload_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    // Not mounted: nothing is queued, nothing can be advertised.
    put(&m, C2, "early", 1000, 1);
    assert_eq!(m.offload_stats().queued, 0);
    let obj = |k: &str, size| DiskObject {
        tenant: String::new(),
        key: k.to_string(),
        size,
    };
    assert_eq!(
        m.advertise_disk_objects(C1, &[obj("early", 1000)]),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    // Advertised: a known object of the same size gets the replica, another size is refused,
    // an unknown one becomes a disk-only object.
    let answers = m
        .advertise_disk_objects(C1, &[obj("early", 1000), obj("early2", 7), obj("early", 5)])
        .unwrap();
    assert_eq!(
        answers,
        vec![Ok(()), Ok(()), Err(ErrorCode::OBJECT_ALREADY_EXISTS)]
    );
    assert_eq!(kinds(&m, "early2"), vec![ReplicaType::LOCAL_DISK]);
    // The node evicts one from its disk.
    assert_eq!(m.evict_disk_objects(C1, &[obj("early2", 0)]), vec![Ok(())]);
    assert_eq!(
        m.get_replica_list("early2", "").err(),
        Some(ErrorCode::OBJECT_NOT_FOUND)
    );
    // The node expires: its disk and replicas go.
    m.ping(C1).unwrap();
    m.run_client_monitor_once();
    clock.advance(60_000);
    m.run_client_monitor_once();
    assert!(!m.has_local_disk(C1));
    assert_eq!(
        m.get_replica_list("early", "").err(),
        Some(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert_accounting(&m);
}

fn disk_object(tenant: &str, key: &str) -> DiskObject {
    DiskObject {
        tenant: tenant.to_string(),
        key: key.to_string(),
        size: 1000,
    }
}

/// Offloads every queued task of C1 as stored.
fn store_all(m: &mooncake_master::MasterService) {
    let tasks = m.offload_heartbeat(C1, 100, 0).unwrap();
    let outcomes: Vec<OffloadOutcome> = tasks.iter().map(|t| outcome(&t.key, true)).collect();
    assert!(m.notify_offload(C1, &outcomes).iter().all(Result::is_ok));
}

#[test]
fn a_removed_object_is_dropped_from_its_disk_and_never_advertised_back() {
    let (_, m) = offload_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    for k in ["k1", "k2"] {
        put(&m, C2, k, 1000, 1);
    }
    store_all(&m);
    assert_eq!(m.remove("k1", true, ""), Ok(()));
    // The node is told to delete the record, once.
    let drop = DiskObject {
        size: 0,
        ..disk_object("", "k1")
    };
    assert_eq!(m.take_disk_drops(C1, 10), Ok(vec![drop]));
    assert_eq!(m.take_disk_drops(C1, 10), Ok(vec![]));
    assert_eq!(m.take_disk_drops(C2, 10), Err(ErrorCode::SEGMENT_NOT_FOUND));
    // Until the node reports it deleted, an advertisement of it is refused (a node restarted
    // before it ran the drop); other objects are taken. The node names the default tenant
    // "default", as its records do.
    let refused = m
        .advertise_disk_objects(
            C1,
            &[disk_object("default", "k1"), disk_object("default", "k2")],
        )
        .unwrap();
    assert_eq!(refused, vec![Err(ErrorCode::OBJECT_NOT_FOUND), Ok(())]);
    assert!(kinds(&m, "k1").is_empty(), "k1 came back");
    m.disk_objects_dropped(&[disk_object("default", "k1")]);
    assert_eq!(m.offload_stats().disk_dropped, 1);
    // Once deleted, the key is no longer remembered: a later record of it is a new object.
    let again = m
        .advertise_disk_objects(C1, &[disk_object("", "k1")])
        .unwrap();
    assert_eq!(again, vec![Ok(())]);
    assert_eq!(kinds(&m, "k1"), vec![ReplicaType::LOCAL_DISK]);
    assert_accounting(&m);
}

#[test]
fn a_new_offload_of_a_removed_key_cancels_its_drop_and_forgets_the_removal() {
    let (_, m) = offload_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    put(&m, C2, "k", 1000, 1);
    store_all(&m);
    assert_eq!(m.remove("k", true, ""), Ok(()));
    // Put again before the node took the drop: the new record replaces the old one, so the
    // drop (which would delete the new record) is cancelled.
    put(&m, C2, "k", 1000, 1);
    assert_eq!(m.take_disk_drops(C1, 10), Ok(vec![]));
    store_all(&m);
    // The newer value is on disk: its advertisement is taken.
    let taken = m
        .advertise_disk_objects(C1, &[disk_object("", "k")])
        .unwrap();
    assert_eq!(taken, vec![Ok(())]);
    assert_eq!(
        kinds(&m, "k"),
        vec![ReplicaType::MEMORY, ReplicaType::LOCAL_DISK]
    );
    assert_accounting(&m);
}

#[test]
fn every_removal_path_drops_disk_records() {
    let (_, m) = offload_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_local_disk(C1, "h:1", 1 << 30, 0).unwrap();
    for k in ["a1", "a2", "b1", "c1"] {
        put(&m, C2, k, 1000, 1);
    }
    store_all(&m);
    let dropped = |m: &mooncake_master::MasterService| -> Vec<String> {
        let mut keys: Vec<String> = m
            .take_disk_drops(C1, 10)
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(m.batch_remove(&["c1".to_string()], true, ""), vec![Ok(())]);
    assert_eq!(dropped(&m), ["c1"]);
    assert_eq!(m.remove_by_regex("^a", true, ""), Ok(2));
    assert_eq!(dropped(&m), ["a1", "a2"]);
    assert_eq!(m.remove_all(true, ""), 1);
    assert_eq!(dropped(&m), ["b1"]);
    assert_accounting(&m);
}
