//! Client liveness and eviction (upstream's invariants 7 and 3).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    ClientId, ClientStatus, ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, SoftPinAction,
};
use mooncake_master::{MasterServiceConfig, PING_QUEUE_CAPACITY};

fn on(name: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![name.to_string()],
        ..cfg(1)
    }
}

fn put_cfg(
    m: &mooncake_master::MasterService,
    c: ClientId,
    key: &str,
    size: u64,
    rc: &ReplicateConfig,
) {
    m.put_start(c, key, size, rc, "").unwrap();
    m.put_end(c, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

fn names_of(m: &mooncake_master::MasterService, key: &str) -> Vec<String> {
    let mut v: Vec<String> = m
        .all_replica_descriptors(key, "")
        .unwrap()
        .iter()
        .filter_map(|d| d.memory().map(|x| x.transport_endpoint.to_string()))
        .collect();
    v.sort();
    v
}

#[test]
fn inv7_client_death_unmounts_its_segments_and_sweeps_its_replicas() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    assert_eq!(
        m.ping(C1).unwrap().client_status,
        ClientStatus::NEED_REMOUNT,
        "first ping"
    );
    m.remount_segments(&[seg(1, "a", 1 << 20)], C1).unwrap();
    m.remount_segments(&[seg(2, "b", 1 << 20)], C2).unwrap();
    assert_eq!(m.ping(C1).unwrap().client_status, ClientStatus::OK);
    put_cfg(&m, C1, "only-a", 100, &on("a"));
    put_cfg(&m, C2, "only-b", 100, &on("b"));
    put(&m, C1, "both", 100, 2);
    assert_eq!(names_of(&m, "both"), vec!["ep-a", "ep-b"]);
    assert_eq!(m.run_client_monitor_once(), 0);

    // C2 keeps pinging, C1 goes silent for more than client_ttl (10 s).
    for _ in 0..10 {
        clock.advance(1000);
        m.ping(C2).unwrap();
        assert_eq!(m.run_client_monitor_once(), 0, "within the TTL");
        assert!(m.get_replica_list("only-a", "").is_ok());
    }
    clock.advance(1);
    m.ping(C2).unwrap();
    assert_eq!(m.run_client_monitor_once(), 1, "C1 expired");
    assert!(!m.is_client_ok(C1));
    assert!(m.is_client_ok(C2), "other clients are unaffected");
    assert_eq!(
        m.get_replica_list("only-a", ""),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert!(m.object_info("only-a", "").unwrap().is_none(), "erased");
    assert_eq!(names_of(&m, "both"), vec!["ep-b"], "survives on b only");
    assert_eq!(m.get_replica_list("both", "").unwrap().replicas.len(), 1);
    assert!(m.get_replica_list("only-b", "").is_ok());
    assert_eq!(m.segment_usage().len(), 1, "C1's segment unmounted");
    assert_eq!(m.total_capacity_bytes(), 1 << 20);
    assert_accounting(&m);

    // The next ping says NEED_REMOUNT; a ReMount brings it back to OK with empty segments.
    assert_eq!(
        m.ping(C1).unwrap().client_status,
        ClientStatus::NEED_REMOUNT
    );
    m.remount_segments(&[seg(1, "a", 1 << 20)], C1).unwrap();
    assert_eq!(m.ping(C1).unwrap().client_status, ClientStatus::OK);
    assert_eq!(m.segment_usage()[0].used_bytes, Some(0));
    put_cfg(&m, C1, "again", 100, &on("a"));
    assert_accounting(&m);
}

#[test]
fn client_death_makes_replicas_unreadable_before_the_sweep_finishes() {
    // The monitor kills the allocators before sweeping: a replica on the dead segment is never
    // returned, even by an object that still has a live replica elsewhere.
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.mount_segment(&seg(2, "b", 1 << 20), C2).unwrap();
    put(&m, C1, "both", 100, 2);
    m.run_client_monitor_once();
    clock.advance(10_001);
    m.ping(C2).unwrap();
    m.run_client_monitor_once();
    assert_eq!(m.run_client_monitor_once(), 0);
    clock.advance(10_001);
    // C2 did not ping within this TTL either: both gone now.
    assert_eq!(m.run_client_monitor_once(), 1);
    assert_eq!(m.object_count(), 0);
    assert_eq!(m.total_capacity_bytes(), 0);
}

#[test]
fn an_expired_writers_puts_are_reaped_at_once_key_free_and_space_freed() {
    // C1 owns the segment and keeps pinging; C2 starts a put and an upsert, then goes silent
    // (a writer process that died mid-put). Within its TTL the key is refused to others with
    // REPLICA_IS_NOT_READY; once the monitor expires C2 (10 s TTL here, not the 30 s discard
    // or 600 s release timeouts), both keys are free and their space is back at once.
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.ping(C1).unwrap();
    m.ping(C2).unwrap();
    put_cfg(&m, C1, "old", 200, &on("a"));
    m.run_client_monitor_once();
    m.put_start(C2, "dead-put", 1000, &on("a"), "").unwrap();
    m.upsert_start(C2, "old", 200, &on("a"), "").unwrap(); // same size: rewritten in place
    let used = |m: &mooncake_master::MasterService| m.segment_usage()[0].used_bytes;
    assert_eq!(used(&m), Some(1200));
    assert_eq!(
        m.put_start(C1, "dead-put", 10, &on("a"), ""),
        Err(ErrorCode::REPLICA_IS_NOT_READY)
    );
    for _ in 0..10 {
        clock.advance(1000);
        m.ping(C1).unwrap();
        assert_eq!(m.run_client_monitor_once(), 0, "within C2's TTL");
        assert_eq!(used(&m), Some(1200), "nothing freed before C2 expires");
    }
    clock.advance(1);
    m.ping(C1).unwrap();
    assert_eq!(m.run_client_monitor_once(), 1, "C2 expired");
    assert_eq!(used(&m), Some(0), "the dead writer's space is free at once");
    assert_eq!(m.discarded_replica_count(), 0);
    assert!(m.object_info("dead-put", "").unwrap().is_none(), "erased");
    assert!(
        m.object_info("old", "").unwrap().is_none(),
        "its rewrite took it"
    );
    assert_accounting(&m);
    // The key is free for another writer now; the dead writer's late End is refused.
    put_cfg(&m, C1, "dead-put", 10, &on("a"));
    assert!(m.get_replica_list("dead-put", "").is_ok());
    assert_eq!(
        m.put_end(C2, &ObjectMeta::new("dead-put"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_accounting(&m);
}

#[test]
fn a_writer_that_never_pinged_is_expired_and_its_puts_reaped() {
    // C2 starts a put and a batch put and dies before its first heartbeat: its puts are reaped
    // when its TTL from the first start runs out, not at the discard timeout.
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.ping(C1).unwrap();
    m.run_client_monitor_once();
    assert_eq!(m.tracked_client_count(), 1);
    m.put_start(C2, "dead-put", 1000, &on("a"), "").unwrap();
    assert_eq!(m.tracked_client_count(), 2, "tracked from its first start");
    clock.advance(4000);
    // A later start keeps the first deadline (only heartbeats extend it).
    let keys = vec!["dead-batch".to_string()];
    assert!(m.batch_put_start(C2, &keys, &[500], &on("a"), "")[0].is_ok());
    let used = |m: &mooncake_master::MasterService| m.segment_usage()[0].used_bytes;
    assert_eq!(used(&m), Some(1500));
    clock.advance(6000);
    m.ping(C1).unwrap();
    assert_eq!(m.run_client_monitor_once(), 0, "within C2's TTL");
    assert_eq!(used(&m), Some(1500));
    clock.advance(1);
    m.ping(C1).unwrap();
    assert_eq!(m.run_client_monitor_once(), 1, "C2 expired");
    assert_eq!(used(&m), Some(0), "the dead writer's space is free at once");
    assert!(m.object_info("dead-put", "").unwrap().is_none());
    assert!(m.object_info("dead-batch", "").unwrap().is_none());
    assert_accounting(&m);
    put_cfg(&m, C1, "dead-put", 10, &on("a"));
    // A writer that keeps pinging after its first start is not expired.
    m.put_start(C2, "live-put", 100, &on("a"), "").unwrap();
    for _ in 0..15 {
        clock.advance(1000);
        m.ping(C1).unwrap();
        m.ping(C2).unwrap();
        assert_eq!(m.run_client_monitor_once(), 0);
    }
    m.put_end(C2, &ObjectMeta::new("live-put"), ReplicaType::ALL, "")
        .unwrap();
    assert!(m.get_replica_list("live-put", "").is_ok());
}

#[test]
fn full_ping_queue_is_internal_error_and_the_monitor_drains_it() {
    let (_, m) = master();
    for i in 0..PING_QUEUE_CAPACITY {
        m.ping(ClientId::new(i as u64 % 7 + 1, 0)).unwrap();
    }
    assert_eq!(m.ping(C1), Err(ErrorCode::INTERNAL_ERROR));
    m.run_client_monitor_once();
    assert_eq!(m.tracked_client_count(), 7);
    assert!(m.ping(C1).is_ok());
}

/// A master with one 100-slot segment ("a") of `slot` bytes per object.
fn full_store(
    config: MasterServiceConfig,
    slots: u64,
    slot: u64,
) -> (
    std::sync::Arc<mooncake_common::ManualClock>,
    mooncake_master::MasterService,
) {
    let (clock, m) = master_with(config);
    m.mount_segment(&seg(1, "a", slots * slot), C1).unwrap();
    (clock, m)
}

fn soft(ttl_ms: u64) -> ReplicateConfig {
    ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(ttl_ms),
        ..cfg(1)
    }
}

fn hard() -> ReplicateConfig {
    ReplicateConfig {
        with_hard_pin: true,
        ..cfg(1)
    }
}

fn exists(m: &mooncake_master::MasterService, key: &str) -> bool {
    m.object_info(key, "").unwrap().is_some()
}

#[test]
fn eviction_full_store_10000_objects() {
    // 10,000 objects of 100 bytes fill a 1,000,000-byte segment; hw 0.9, ratio 0.05.
    let (clock, m) = full_store(MasterServiceConfig::default(), 10_000, 100);
    let mut kinds = Vec::new();
    for i in 0..10_000u64 {
        clock.advance(1);
        let key = format!("k{i}");
        let kind = match i % 20 {
            0 => "hard",
            1 => "leased",
            2 => "soft",
            3 if i % 40 == 3 => "inflight",
            _ => "plain",
        };
        match kind {
            "hard" => put_cfg(&m, C1, &key, 100, &hard()),
            "soft" => put_cfg(&m, C1, &key, 100, &soft(3_600_000)),
            "inflight" => {
                m.put_start(C1, &key, 100, &cfg(1), "").unwrap();
            }
            _ => put_cfg(&m, C1, &key, 100, &cfg(1)),
        }
        kinds.push((key, kind));
    }
    // Lease the "leased" ones now (reads also refresh their last access).
    clock.advance(1);
    for (k, kind) in &kinds {
        if *kind == "leased" {
            m.get_replica_list(k, "").unwrap();
        }
    }
    let r = m.run_eviction_once();
    assert!(r.triggered);
    assert!((r.usage_ratio_before - 1.0).abs() < 1e-9);
    assert!(
        r.usage_ratio_after < 0.9,
        "usage after one cycle {} must be below the watermark",
        r.usage_ratio_after
    );
    // target = 0.05 + (1.0 − 0.9) = 0.15 of the evictable base.
    let base = kinds
        .iter()
        .filter(|(_, k)| matches!(*k, "leased" | "soft" | "plain"))
        .count();
    assert_eq!(r.evictable_objects, base);
    assert_eq!(r.evicted_objects, (base as f64 * 0.15).ceil() as usize);
    assert_eq!(r.evicted_soft_pinned, 0);
    // Victims: exactly the oldest plain objects; nothing else was touched.
    let plain: Vec<&String> = kinds
        .iter()
        .filter(|(_, k)| *k == "plain")
        .map(|(key, _)| key)
        .collect();
    for (i, key) in plain.iter().enumerate() {
        assert_eq!(
            exists(&m, key),
            i >= r.evicted_objects,
            "{key}: oldest plain objects go first"
        );
    }
    for (key, kind) in &kinds {
        if *kind != "plain" {
            assert!(exists(&m, key), "{kind} object {key} must survive");
        }
    }
    assert_accounting(&m);
}

#[test]
fn inv3_soft_pinned_only_after_every_unpinned_and_never_when_disallowed() {
    for allow in [true, false] {
        let config = MasterServiceConfig {
            allow_evict_soft_pinned_objects: allow,
            ..Default::default()
        };
        let (clock, m) = full_store(config, 100, 100);
        // 90 soft-pinned (oldest), then 5 unpinned, 5 hard-pinned (newest).
        for i in 0..100 {
            clock.advance(1);
            let rc = match i {
                0..=89 => soft(3_600_000),
                90..=94 => cfg(1),
                _ => hard(),
            };
            put_cfg(&m, C1, &format!("k{i}"), 100, &rc);
        }
        let r = m.run_eviction_once();
        // base 95, target 0.15 → 15 wanted; only 5 unpinned exist.
        for i in 90..95 {
            assert!(!exists(&m, &format!("k{i}")), "unpinned k{i} goes first");
        }
        for i in 95..100 {
            assert!(exists(&m, &format!("k{i}")), "hard-pinned k{i} stays");
        }
        let soft_gone = (0..90).filter(|i| !exists(&m, &format!("k{i}"))).count();
        if allow {
            assert!(soft_gone > 0 && r.evicted_soft_pinned == soft_gone);
            // The oldest soft-pinned ones went.
            for i in 0..90 {
                assert_eq!(exists(&m, &format!("k{i}")), i >= soft_gone, "k{i}");
            }
        } else {
            assert_eq!(soft_gone, 0, "never when disallowed");
        }
        assert_accounting(&m);
    }
}

#[test]
fn inv3_leased_hard_pinned_and_processing_are_never_evicted() {
    let (clock, m) = full_store(MasterServiceConfig::default(), 10, 100);
    put_cfg(&m, C1, "hard", 100, &hard());
    put(&m, C1, "leased", 100, 1);
    m.put_start(C1, "writing", 100, &cfg(1), "").unwrap();
    for i in 0..7 {
        put(&m, C1, &format!("p{i}"), 100, 1);
    }
    clock.advance(1);
    m.get_replica_list("leased", "").unwrap();
    // Evict repeatedly: only the 7 plain objects can ever go.
    for _ in 0..50 {
        let (used, cap) = m.memory_usage_bytes();
        if used * 10 < cap * 9 {
            put(&m, C1, &format!("x{}", m.now_ms()), 100, 1);
        }
        clock.advance(1);
        m.run_eviction_once();
    }
    assert!(exists(&m, "hard"));
    assert!(exists(&m, "leased"));
    assert!(exists(&m, "writing"));
    assert_accounting(&m);
}

#[test]
fn allocation_failure_sets_the_flag_and_a_cycle_lets_the_retry_succeed() {
    // hw 1.0 disables the watermark: only the need-eviction flag triggers eviction. Inline
    // eviction off (budget 0): the PutStart refuses, as upstream's.
    let config = MasterServiceConfig {
        eviction_high_watermark_ratio: 1.0,
        eviction_ratio: 0.1,
        put_start_evict_budget: 0,
        ..Default::default()
    };
    let (clock, m) = full_store(config, 20, 100);
    for i in 0..20 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    assert!(
        !m.run_eviction_once().triggered,
        "no trigger without the flag"
    );
    assert!(!m.need_eviction());
    assert_eq!(
        m.put_start(C1, "new", 100, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(m.need_eviction());
    let r = m.run_eviction_once();
    assert!(r.triggered);
    assert_eq!(r.evicted_objects, 2, "ceil(20 × 0.1)");
    assert!(!exists(&m, "k0") && !exists(&m, "k1") && exists(&m, "k2"));
    assert!(!m.need_eviction(), "cleared once something was evicted");
    put(&m, C1, "new", 100, 1);
    assert_accounting(&m);
}

#[test]
fn eviction_frees_due_discarded_buffers_in_the_same_cycle() {
    let (clock, m) = full_store(MasterServiceConfig::default(), 10, 100);
    m.put_start(C1, "stale", 100, &cfg(1), "").unwrap();
    clock.advance(30_001);
    // Pre-empts the stale put: its buffer is discarded until put_start + 600 s.
    m.put_start(C2, "stale", 100, &cfg(1), "").unwrap();
    assert_eq!(m.discarded_replica_count(), 1);
    for i in 0..8 {
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    clock.advance(600_000);
    let r = m.run_eviction_once();
    assert!(r.triggered);
    assert_eq!(r.released_discarded, 1);
    assert_eq!(m.discarded_replica_count(), 0);
    assert_accounting(&m);
}

#[test]
fn groups_are_evicted_all_or_none() {
    let (clock, m) = full_store(MasterServiceConfig::default(), 10, 100);
    let grouped = ReplicateConfig {
        group_ids: Some(vec!["g".to_string()]),
        ..cfg(1)
    };
    for i in 0..3 {
        clock.advance(1);
        put_cfg(&m, C1, &format!("g{i}"), 100, &grouped);
    }
    for i in 0..7 {
        clock.advance(1);
        put(&m, C1, &format!("p{i}"), 100, 1);
    }
    // A read of the newest member leases it; the group is then skipped as a whole.
    m.exist_key("g2", "").unwrap();
    // base 10 × 0.15 → 2 victims: the group's oldest members would be first, but it is skipped.
    let r = m.run_eviction_once();
    assert_eq!(r.evicted_objects, 2);
    assert!((0..3).all(|i| exists(&m, &format!("g{i}"))));
    assert!(!exists(&m, "p0") && !exists(&m, "p1"));
    // After the lease, the group is the oldest and goes whole.
    clock.advance(LEASE_MS);
    for i in 0..2 {
        put(&m, C1, &format!("q{i}"), 100, 1);
    }
    let r = m.run_eviction_once();
    assert!(r.triggered);
    assert!(
        (0..3).all(|i| !exists(&m, &format!("g{i}"))),
        "all members together"
    );
    assert_accounting(&m);
}

#[test]
fn last_access_orders_victims_reads_refresh_it() {
    let (clock, m) = full_store(MasterServiceConfig::default(), 10, 100);
    for i in 0..10 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    // k0 is the oldest write but the most recent read.
    clock.advance(1);
    m.get_replica_list("k0", "").unwrap();
    clock.advance(LEASE_MS);
    let r = m.run_eviction_once();
    assert_eq!(r.evicted_objects, 2);
    assert!(exists(&m, "k0"));
    assert!(!exists(&m, "k1") && !exists(&m, "k2"));
}

#[test]
fn an_owner_expired_and_remounted_under_a_dead_writers_put_gets_all_its_space_back() {
    // The segment owner C1 misses its TTL while C2's put into C1's segment is in flight, and
    // re-joins (ReMount of the same segment); C2 died mid-put. In every order of the two expiries
    // (together, the writer first, the owner first while the writer still pings) the segment
    // ends wholly free, the key usable, and nothing of the dead put comes back.
    for order in ["together", "writer first", "owner first"] {
        let (clock, m) = master();
        let a = seg(1, "a", 1 << 20);
        m.mount_segment(&a, C1).unwrap();
        m.ping(C1).unwrap();
        m.ping(C2).unwrap();
        m.put_start(C2, "dead-put", 600 << 10, &on("a"), "")
            .unwrap();
        let used = |m: &mooncake_master::MasterService| {
            m.segment_usage()
                .iter()
                .find(|u| u.name == "a")
                .and_then(|u| u.used_bytes)
        };
        assert_eq!(used(&m), Some(600 << 10));
        m.run_client_monitor_once();
        clock.advance(10_001);
        match order {
            "writer first" => {
                m.ping(C1).unwrap();
                assert_eq!(m.run_client_monitor_once(), 1, "{order}: C2 expired");
                clock.advance(10_001);
                assert_eq!(m.run_client_monitor_once(), 1, "{order}: C1 expired");
            }
            "owner first" => {
                m.ping(C2).unwrap();
                assert_eq!(m.run_client_monitor_once(), 1, "{order}: C1 expired");
            }
            _ => assert_eq!(m.run_client_monitor_once(), 2, "{order}: both expired"),
        }
        assert_eq!(
            m.total_capacity_bytes(),
            0,
            "{order}: C1's segment unmounted"
        );
        // C1 comes back: its first ping says NEED_REMOUNT, it mounts the same segment again.
        assert_eq!(
            m.ping(C1).unwrap().client_status,
            ClientStatus::NEED_REMOUNT
        );
        m.remount_segments(std::slice::from_ref(&a), C1).unwrap();
        assert_eq!(
            used(&m),
            Some(0),
            "{order}: a re-mounted segment starts empty"
        );
        // Whatever is left of C2 goes at its expiry.
        clock.advance(10_001);
        m.ping(C1).unwrap();
        m.run_client_monitor_once();
        assert_eq!(used(&m), Some(0), "{order}");
        assert!(m.object_info("dead-put", "").unwrap().is_none(), "{order}");
        // The whole segment is usable again: a put of nearly all of it fits, under the key.
        put_cfg(&m, C1, "dead-put", 1000 << 10, &on("a"));
        assert!(m.get_replica_list("dead-put", "").is_ok(), "{order}");
        assert_eq!(
            m.put_end(C2, &ObjectMeta::new("dead-put"), ReplicaType::ALL, ""),
            Err(ErrorCode::ILLEGAL_CLIENT),
            "{order}"
        );
        assert_accounting(&m);
    }
}
