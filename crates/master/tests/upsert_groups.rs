//! Upsert and group routing.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, SoftPinAction};
use mooncake_master::MasterService;

fn addrs(d: &[mooncake_common::ReplicaDescriptor]) -> Vec<u64> {
    let mut v: Vec<u64> = d
        .iter()
        .filter_map(|d| d.memory().map(|m| m.buffer_address))
        .collect();
    v.sort();
    v
}

fn end(m: &MasterService, key: &str) {
    m.upsert_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

#[test]
fn same_size_upsert_returns_the_same_addresses_and_hides_the_key_until_end() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C1).unwrap();
    let first = put(&m, C1, "k", 100, 2);
    let again = m.upsert_start(C2, "k", 100, &cfg(2), "").unwrap();
    assert_eq!(addrs(&again), addrs(&first), "rewritten in place");
    assert_eq!(
        m.get_replica_list("k", ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY),
        "unreadable until End"
    );
    assert!(!m.exist_key("k", "").unwrap());
    // The writer is now C2.
    assert_eq!(
        m.upsert_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    m.upsert_end(C2, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert_eq!(
        addrs(&m.get_replica_list("k", "").unwrap().replicas),
        addrs(&first)
    );
    assert_accounting(&m);
}

#[test]
fn upsert_of_a_missing_key_is_a_put() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.upsert_start(C1, "k", 10, &cfg(1), "").unwrap();
    end(&m, "k");
    assert!(m.get_replica_list("k", "").is_ok());
}

#[test]
fn different_size_upsert_reallocates_keeping_hard_and_live_soft_pin() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let pinned = ReplicateConfig {
        with_hard_pin: true,
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(60_000),
        ..cfg(1)
    };
    m.put_start(C1, "k", 100, &pinned, "").unwrap();
    end(&m, "k");
    let before = m.object_info("k", "").unwrap().unwrap();
    assert!(before.hard_pinned && before.soft_pin_deadline_ms > 0);
    clock.advance(10);
    let d = m.upsert_start(C1, "k", 300, &cfg(1), "").unwrap();
    assert_eq!(d[0].memory().unwrap().size, 300);
    // The old buffer is discarded (not reusable before its release time).
    assert_eq!(m.discarded_replica_count(), 1);
    end(&m, "k");
    let after = m.object_info("k", "").unwrap().unwrap();
    assert_eq!(after.size, 300);
    assert!(after.hard_pinned, "hard pin kept");
    assert_eq!(
        after.soft_pin_deadline_ms, before.soft_pin_deadline_ms,
        "live soft pin kept"
    );
    assert_eq!(m.segment_usage()[0].used_bytes, Some(400));
    clock.advance(600_000);
    m.run_put_timeouts_once();
    assert_eq!(m.segment_usage()[0].used_bytes, Some(300));
    assert_accounting(&m);
}

#[test]
fn upsert_preempts_an_in_flight_put_at_once() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.put_start(C1, "k", 100, &cfg(1), "").unwrap();
    // A put is refused for 30 s (REPLICA_IS_NOT_READY); an upsert takes over immediately.
    assert_eq!(
        m.put_start(C2, "k", 100, &cfg(1), ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    m.upsert_start(C2, "k", 100, &cfg(1), "").unwrap();
    assert_eq!(m.discarded_replica_count(), 1);
    assert_eq!(
        m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    m.upsert_end(C2, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    assert!(m.get_replica_list("k", "").is_ok());
    assert_accounting(&m);
}

#[test]
fn upsert_cannot_change_the_group_and_batches_match_single_calls() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let g = ReplicateConfig {
        group_ids: Some(vec!["g1".into()]),
        ..cfg(1)
    };
    m.put_start(C1, "k", 10, &g, "").unwrap();
    end(&m, "k");
    let other = ReplicateConfig {
        group_ids: Some(vec!["g2".into()]),
        ..cfg(1)
    };
    assert_eq!(
        m.upsert_start(C1, "k", 10, &other, ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.upsert_start(C1, "k", 10, &cfg(1), ""),
        Err(ErrorCode::INVALID_PARAMS),
        "dropping the group is a change too"
    );
    m.upsert_start(C1, "k", 10, &g, "").unwrap();
    end(&m, "k");

    let ks = keys(&["x", "y", "k"]);
    let r = m.batch_upsert_start(C1, &ks, &[5, 6, 7], &cfg(1), "");
    assert!(r[0].is_ok() && r[1].is_ok());
    assert_eq!(r[2], Err(ErrorCode::INVALID_PARAMS), "k is grouped");
    assert_eq!(
        m.batch_upsert_start(C1, &ks, &[5, 6], &cfg(1), ""),
        vec![Err(ErrorCode::INVALID_PARAMS); 3]
    );
    let metas: Vec<ObjectMeta> = ["x", "y"].iter().map(|k| ObjectMeta::new(*k)).collect();
    assert_eq!(m.batch_upsert_end(C1, &metas, ""), vec![Ok(()), Ok(())]);
    m.batch_upsert_start(C1, &keys(&["x"]), &[9], &cfg(1), "")[0]
        .clone()
        .unwrap();
    assert_eq!(
        m.batch_upsert_revoke(C1, &keys(&["x", "nope"]), ""),
        vec![Ok(()), Err(ErrorCode::OBJECT_NOT_FOUND)]
    );
    assert_accounting(&m);
}

fn grouped(g: &str) -> ReplicateConfig {
    ReplicateConfig {
        group_ids: Some(vec![g.to_string()]),
        ..cfg(1)
    }
}

#[test]
fn grouped_keys_live_in_the_group_shard_and_every_key_call_finds_them() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let members: Vec<String> = (0..20).map(|i| format!("member-{i}")).collect();
    for k in &members {
        m.put_start(C1, k, 10, &grouped("conv-7"), "").unwrap();
        m.put_end(C1, &ObjectMeta::new(k), ReplicaType::ALL, "")
            .unwrap();
    }
    let shard = m.shard_of_key(&members[0], "").unwrap();
    assert!(members
        .iter()
        .all(|k| m.shard_of_key(k, "").unwrap() == shard));
    assert_eq!(m.grouped_key_count(), 20);
    for k in &members {
        assert!(m.exist_key(k, "").unwrap());
        assert!(m.get_replica_list(k, "").is_ok());
        assert_eq!(
            m.object_info(k, "").unwrap().unwrap().group.as_deref(),
            Some("conv-7")
        );
    }
    assert!(m
        .batch_get_replica_list(&members, "")
        .iter()
        .all(Result::is_ok));
    assert!(m
        .batch_exist_key(&members, "")
        .iter()
        .all(|r| *r == Ok(true)));
    assert_eq!(
        m.get_replica_list_by_regex("^member-", "").unwrap().len(),
        20
    );
    // Leased by the reads above.
    assert_eq!(
        m.remove(&members[0], false, ""),
        Err(ErrorCode::OBJECT_HAS_LEASE)
    );
    clock.advance(LEASE_MS);
    m.remove(&members[0], false, "").unwrap();
    assert_eq!(
        m.batch_remove(&members[1..3], false, ""),
        vec![Ok(()), Ok(())]
    );
    assert_eq!(m.object_count(), 17);
    // Removal dropped the membership: a plain re-put lives in the key's own shard.
    let (_, plain) = master();
    let own = plain.shard_of_key(&members[0], "").unwrap();
    put(&m, C1, &members[0], 10, 1);
    assert_eq!(m.shard_of_key(&members[0], "").unwrap(), own);
    assert!(m
        .object_info(&members[0], "")
        .unwrap()
        .unwrap()
        .group
        .is_none());
    // The routes of the removed members are collected by the reaper's route collector.
    assert_eq!(
        m.grouped_key_count(),
        19,
        "stale routes are harmless until collected"
    );
    assert_eq!(m.run_put_timeouts_once().dropped_routes, 2);
    assert_eq!(m.grouped_key_count(), 17);
    for k in &members[1..3] {
        assert_eq!(m.get_replica_list(k, ""), Err(ErrorCode::OBJECT_NOT_FOUND));
    }
    // A live grouped key cannot be put again.
    assert_eq!(
        m.put_start(C1, &members[5], 10, &cfg(1), ""),
        Err(ErrorCode::OBJECT_ALREADY_EXISTS)
    );
    assert_accounting(&m);
}

#[test]
fn a_group_shares_its_lease() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    for k in ["a", "b", "c"] {
        m.put_start(C1, k, 10, &grouped("g"), "").unwrap();
        m.put_end(C1, &ObjectMeta::new(k), ReplicaType::ALL, "")
            .unwrap();
    }
    clock.advance(1);
    m.get_replica_list("a", "").unwrap();
    for k in ["b", "c"] {
        assert_eq!(
            m.remove(k, false, ""),
            Err(ErrorCode::OBJECT_HAS_LEASE),
            "{k} shares a's lease"
        );
    }
    clock.advance(LEASE_MS);
    m.remove("b", false, "").unwrap();
}

#[test]
fn grouped_put_end_revoke_and_tenants_route_too() {
    let (_, m) = mt_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.put_start(C1, "k", 10, &grouped("g"), "t1").unwrap();
    m.put_start(C1, "k", 10, &grouped("g"), "t2").unwrap();
    m.put_revoke(C1, "k", ReplicaType::ALL, "t1").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "t2")
        .unwrap();
    assert_eq!(
        m.get_replica_list("k", "t1"),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert!(m.get_replica_list("k", "t2").is_ok());
    assert_accounting(&m);
}
