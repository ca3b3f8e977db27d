//! Restore from a snapshot's state: round trip, the overlap rule, puts in flight, segments
//! waiting for their owner, re-mount checks, verification, objects without a checksum, the
//! observer's view, and exact accounting throughout.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use mooncake_common::{
    ClientId, Clock, ErrorCode, ManualClock, ObjectMeta, ReplicaId, ReplicaStatus, ReplicaType,
    ReplicateConfig, Segment, SegmentId, SegmentStatus, TenantId,
};
use mooncake_master::mutation::{
    BufferRecord, DiscardedRecord, ReplicaPlace, ReplicaRecord, SegmentRecord,
};
use mooncake_master::{
    MasterService, MasterServiceConfig, MasterState, Mutation, MutationObserver, ObjectRecord,
    RestoreError, RestoreOptions,
};

const SEG: u64 = 1 << 20;

fn sid(id: u64) -> SegmentId {
    SegmentId::new(id, 0)
}

/// A deterministic checksum for a key (the master never sees bytes; it only stores it).
fn crc_of(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) & 0xffff_ffff
}

/// PutStart + PutEnd with the key's checksum recorded.
fn put_crc(m: &MasterService, client: ClientId, key: &str, size: u64, config: &ReplicateConfig) {
    put_crc_in(m, client, key, size, config, "");
}

fn put_crc_in(
    m: &MasterService,
    client: ClientId,
    key: &str,
    size: u64,
    config: &ReplicateConfig,
    tenant: &str,
) {
    m.put_start(client, key, size, config, tenant).unwrap();
    let meta = ObjectMeta {
        key: key.to_string(),
        object_checksum: Some(crc_of(key)),
    };
    m.put_end(client, &meta, ReplicaType::ALL, tenant).unwrap();
}

/// A master with segments 1, 2 (client 1) and 3 (client 2).
fn source() -> (Arc<ManualClock>, MasterService) {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    m.mount_segment(&seg(2, "b", SEG), C1).unwrap();
    m.mount_segment(&seg(3, "c", SEG), C2).unwrap();
    (clock, m)
}

/// An empty master at the same time as `clock`.
fn target_with(
    config: MasterServiceConfig,
    clock: &ManualClock,
) -> (Arc<ManualClock>, MasterService) {
    let (c, m) = master_with(config);
    c.set(clock.now_ms());
    (c, m)
}

fn target(clock: &ManualClock) -> (Arc<ManualClock>, MasterService) {
    target_with(MasterServiceConfig::default(), clock)
}

type FreeRanges = Vec<(SegmentId, Option<Vec<(u64, u64)>>)>;

fn free_ranges(m: &MasterService) -> FreeRanges {
    m.segment_usage()
        .into_iter()
        .map(|u| (u.id, m.segment_free_ranges(u.id)))
        .collect()
}

/// Re-mounts `client`'s segments of `m` (as the store client does on NEED_REMOUNT).
fn remount(m: &MasterService, segments: &[Segment], client: ClientId) {
    m.remount_segments(segments, client).unwrap();
}

/// Confirms every pending replica of `segment` as verified, page by page; returns how many.
fn confirm_all(m: &MasterService, client: ClientId, segment: SegmentId) -> u64 {
    let mut after = ReplicaId(0);
    let mut total = 0;
    for _ in 0..1000 {
        let page = m
            .get_unverified_replicas(client, segment, after, 2)
            .unwrap();
        let Some(last) = page.last() else {
            return total;
        };
        after = last.id;
        let ids: Vec<ReplicaId> = page.iter().map(|r| r.id).collect();
        total += m
            .confirm_replicas(client, segment, &ids, &[])
            .unwrap()
            .verified;
    }
    panic!("paging did not end");
}

/// A workload with mixed sizes, replicas, groups, pins, removals (holes), an upsert and a
/// drained segment: everything complete.
fn workload(m: &MasterService) {
    for i in 0..40u64 {
        let mut config = cfg(1 + (i % 3) as usize);
        if i % 7 == 0 {
            config.with_hard_pin = true;
        }
        if i % 5 == 0 {
            config.group_ids = Some(vec![format!("g{}", i % 2)]);
        }
        if i % 11 == 0 {
            config.soft_pin_action = mooncake_common::SoftPinAction::Enable;
            config.soft_pin_ttl_ms = Some(60_000);
        }
        put_crc(
            m,
            if i % 4 == 0 { C2 } else { C1 },
            &format!("k{i}"),
            100 + i * 37,
            &config,
        );
    }
    for i in (0..40).step_by(6) {
        m.remove(&format!("k{i}"), true, "").unwrap();
    }
    m.upsert_start(C1, "k1", 5000, &cfg(1), "").unwrap();
    m.upsert_end(
        C1,
        &ObjectMeta {
            key: "k1".into(),
            object_checksum: Some(7),
        },
        ReplicaType::ALL,
        "",
    )
    .unwrap();
    m.set_segment_status(sid(2), SegmentStatus::DRAINING)
        .unwrap();
}

#[test]
fn export_then_restore_gives_the_same_state_and_nothing_is_readable_before_verification() {
    let (clock, a) = source();
    workload(&a);
    let exported = a.export_state();
    assert!(!exported.objects.is_empty());
    let (_, b) = target(&clock);
    let report = b
        .restore(exported.clone(), RestoreOptions::default())
        .unwrap();
    assert_eq!(report.segments, 3);
    assert_eq!(report.objects, exported.objects.len());
    assert_eq!(report.dropped.objects(), 0, "{report:?}");
    assert_eq!(report.dropped.overlap_replicas, 0);
    let replicas: usize = exported.objects.iter().map(|o| o.replicas.len()).sum();
    assert_eq!(report.unverified_replicas, replicas);
    assert_eq!(b.export_state(), exported);
    assert_eq!(free_ranges(&b), free_ranges(&a));
    for (ua, ub) in a.segment_usage().into_iter().zip(b.segment_usage()) {
        assert_eq!(ua.used_bytes, ub.used_bytes);
        assert_eq!(ua.status, ub.status);
        assert!(ub.waiting_for_owner && !ua.waiting_for_owner);
    }
    assert_accounting(&b);
    // Routes are derived: the source still holds those of removed keys until its collector runs.
    a.run_route_gc_once();
    assert_eq!(b.grouped_key_count(), a.grouped_key_count());
    assert_eq!(b.waiting_segments(), vec![sid(1), sid(2), sid(3)]);
    // Nothing is readable, and nothing is placed on a waiting segment.
    for o in &exported.objects {
        assert_eq!(
            b.get_replica_list(&o.key, "").unwrap_err(),
            ErrorCode::REPLICA_IS_NOT_READY,
            "{}",
            o.key
        );
        assert!(!b.exist_key(&o.key, "").unwrap());
    }
    assert!(b.get_all_keys("").unwrap().is_empty());
    assert_eq!(
        b.put_start(C1, "new", 10, &cfg(1), "").unwrap_err(),
        ErrorCode::NO_AVAILABLE_HANDLE
    );
    assert_eq!(b.memory_usage_bytes(), (0, 0));
    // Ping says re-mount, as after any master restart.
    assert_eq!(
        b.ping(C1).unwrap().client_status,
        mooncake_common::ClientStatus::NEED_REMOUNT
    );
    assert!(report.next_replica_id >= exported.next_replica_id);
}

#[test]
fn restore_keeps_tenants_their_quota_charges_and_policy() {
    let (clock, a) = mt_master();
    a.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    a.mount_segment(&seg(2, "b", SEG), C2).unwrap();
    for (i, t) in ["", "t1", "t2", "t1"].iter().enumerate() {
        for j in 0..5u64 {
            put_crc_in(&a, C1, &format!("k{i}-{j}"), 1000 + j, &cfg(2), t);
        }
    }
    let exported = a.export_state();
    let (_, b) = target_with(
        MasterServiceConfig {
            enable_multi_tenants: true,
            ..Default::default()
        },
        &clock,
    );
    let report = b
        .restore(exported.clone(), RestoreOptions::default())
        .unwrap();
    assert_eq!(report.objects, 20);
    assert_eq!(b.export_state(), exported);
    assert_eq!(b.tenant_policy(), a.tenant_policy());
    assert_eq!(
        b.list_tenant_quotas(None).unwrap(),
        a.list_tenant_quotas(None).unwrap()
    );
    let charges = b.check_quota_accounting();
    assert!(
        charges.iter().all(|(_, charged, held)| charged == held),
        "{charges:?}"
    );
    assert_eq!(charges, a.check_quota_accounting());
    assert_eq!(
        b.tenant_object_count(&TenantId::new("t1").unwrap()),
        a.tenant_object_count(&TenantId::new("t1").unwrap())
    );
    assert_accounting(&b);

    // Named tenants with multi-tenancy off cannot be served: dropped and counted.
    let (_, c) = target(&clock);
    let report = c.restore(exported, RestoreOptions::default()).unwrap();
    assert_eq!(report.objects, 5);
    assert_eq!(report.dropped.invalid_objects, 15);
    assert_accounting(&c);
}

#[test]
fn restore_refuses_a_master_that_is_not_empty() {
    let (clock, a) = source();
    put_crc(&a, C1, "k", 10, &cfg(1));
    let state = a.export_state();
    assert!(matches!(
        a.restore(state.clone(), RestoreOptions::default()),
        Err(RestoreError::NotEmpty {
            objects: 1,
            segments: 3
        })
    ));
    let (_, b) = target(&clock);
    b.mount_segment(&seg(9, "z", SEG), C1).unwrap();
    assert!(matches!(
        b.restore(state, RestoreOptions::default()),
        Err(RestoreError::NotEmpty {
            objects: 0,
            segments: 1
        })
    ));
    assert_eq!(b.object_count(), 0);
}

fn segment_record(id: u64, client: ClientId) -> SegmentRecord {
    SegmentRecord {
        segment: seg(id, &format!("s{id}"), 1000),
        client,
        status: SegmentStatus::OK,
        graceful_deadline_ms: None,
    }
}

fn memory(id: u64, segment: u64, offset: u64, len: u64) -> ReplicaRecord {
    ReplicaRecord {
        id: ReplicaId(id),
        status: ReplicaStatus::COMPLETE,
        refcnt: 0,
        place: ReplicaPlace::Memory(BufferRecord {
            segment: sid(segment),
            offset,
            len,
        }),
    }
}

fn object(key: &str, size: u64, replicas: Vec<ReplicaRecord>) -> ObjectRecord {
    ObjectRecord {
        tenant: None,
        key: key.to_string(),
        size,
        checksum: Some(crc_of(key)),
        data_type: Default::default(),
        group: None,
        writer: C1,
        put_start_ms: T0_MS - 10,
        processing: false,
        hard_pin: false,
        soft_pin_deadline_ms: 0,
        pending_soft_pin: None,
        replicas,
        task: None,
    }
}

#[test]
fn on_overlap_the_newer_replica_wins_and_a_discarded_range_beats_any_replica() {
    // "old" (id 5) was removed after its shard was exported and its range partly re-used by
    // "new" (id 9) in a shard exported later; "both" lost its segment-2 replica's range to a
    // discarded buffer (exported last).
    let state = MasterState {
        segments: vec![segment_record(1, C1), segment_record(2, C1)],
        objects: vec![
            object("old", 100, vec![memory(5, 1, 0, 100)]),
            object("new", 100, vec![memory(9, 1, 50, 100)]),
            object(
                "both",
                100,
                vec![memory(3, 1, 200, 100), memory(4, 2, 0, 100)],
            ),
            object("gone", 100, vec![memory(6, 7, 0, 100)]),
            object("outside", 100, vec![memory(8, 2, 950, 100)]),
        ],
        discarded: vec![DiscardedRecord {
            release_at_ms: T0_MS + 5_000,
            buffers: vec![BufferRecord {
                segment: sid(2),
                offset: 50,
                len: 10,
            }],
        }],
        tenant_policy: Default::default(),
        next_replica_id: 3,
    };
    let (clock, m) = master();
    let report = m.restore(state, RestoreOptions::default()).unwrap();
    assert_eq!(report.objects, 2, "{report:?}");
    assert_eq!(report.dropped.overlap_replicas, 2);
    assert_eq!(report.dropped.overlap_objects, 1);
    assert_eq!(report.dropped.lost_segment_objects, 2);
    assert_eq!(report.discarded_buffers, 1);
    assert_eq!(report.next_replica_id, 10);
    assert!(m.object_info("old", "").unwrap().is_none());
    let both = m.object_info("both", "").unwrap().unwrap();
    assert_eq!(
        both.replicas.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![ReplicaId(3)]
    );
    assert_eq!(
        m.segment_free_ranges(sid(1)).unwrap(),
        vec![(0, 50), (150, 50), (300, 700)]
    );
    assert_eq!(
        m.segment_free_ranges(sid(2)).unwrap(),
        vec![(0, 50), (60, 940)]
    );
    assert_accounting(&m);
    // The discarded range is released at its own time.
    clock.set(T0_MS + 5_000);
    m.release_discarded_once();
    assert_eq!(m.segment_free_ranges(sid(2)).unwrap(), vec![(0, 1000)]);
    assert_accounting(&m);
}

#[test]
fn puts_in_flight_are_not_restored_and_their_ranges_stay_reserved() {
    let (clock, a) = source();
    put_crc(&a, C1, "done", 100, &cfg(1));
    let in_flight = a.put_start(C1, "writing", 300, &cfg(2), "").unwrap();
    assert_eq!(in_flight.len(), 2);
    // A copy in flight: the object stays, its target's range is discarded, the task dropped.
    put_crc(
        &a,
        C1,
        "copied",
        200,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..cfg(1)
        },
    );
    a.copy_start(C1, "copied", "", "a", &["c".to_string()])
        .unwrap();
    let exported = a.export_state();
    let (b_clock, b) = target(&clock);
    let report = b.restore(exported, RestoreOptions::default()).unwrap();
    assert_eq!(report.objects, 2, "{report:?}");
    assert_eq!(report.dropped.processing_objects, 1);
    assert_eq!(report.dropped.tasks, 1);
    assert_eq!(report.discarded_buffers, 3);
    assert!(b.object_info("writing", "").unwrap().is_none());
    let copied = b.object_info("copied", "").unwrap().unwrap();
    assert_eq!(copied.replicas.len(), 1);
    assert_eq!(copied.replicas[0].2, ReplicaStatus::COMPLETE);
    assert_accounting(&b);
    let used_before: u64 = b.segment_usage().iter().filter_map(|u| u.used_bytes).sum();
    assert_eq!(used_before, 100 + 2 * 300 + 200 + 200);
    // The ranges are kept until now + put_start_release_timeout, then freed.
    let release_ms = b.config().put_start_release_timeout_sec * 1000;
    b_clock.set(clock.now_ms() + release_ms - 1);
    b.release_discarded_once();
    let used: u64 = b.segment_usage().iter().filter_map(|u| u.used_bytes).sum();
    assert_eq!(used, used_before);
    b_clock.set(clock.now_ms() + release_ms);
    b.release_discarded_once();
    let used: u64 = b.segment_usage().iter().filter_map(|u| u.used_bytes).sum();
    assert_eq!(used, 100 + 200);
    assert_accounting(&b);
}

#[test]
fn a_waiting_segment_whose_owner_does_not_return_is_dropped_with_its_replicas() {
    let (clock, a) = source();
    put_crc(
        &a,
        C1,
        "on-a",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..cfg(1)
        },
    );
    put_crc(
        &a,
        C2,
        "on-c",
        100,
        &ReplicateConfig {
            preferred_segment: "c".into(),
            ..cfg(1)
        },
    );
    put_crc(
        &a,
        C2,
        "on-a-and-c",
        100,
        &ReplicateConfig {
            preferred_segments: vec!["a".into(), "c".into()],
            ..cfg(2)
        },
    );
    let (b_clock, b) = target(&clock);
    b.restore(a.export_state(), RestoreOptions::default())
        .unwrap();
    let ttl_ms = b.config().client_live_ttl_sec * 1000;
    // Client 1 comes back in time and verifies; client 2 never does.
    b_clock.advance(ttl_ms / 2);
    remount(&b, &[seg(1, "a", SEG), seg(2, "b", SEG)], C1);
    assert_eq!(confirm_all(&b, C1, sid(1)), 2);
    assert_eq!(b.run_client_monitor_once(), 0);
    assert_eq!(b.waiting_segments(), vec![sid(3)]);
    b_clock.set(clock.now_ms() + ttl_ms - 1);
    assert_eq!(b.run_restore_deadlines_once().segments_expired, 0);
    b_clock.set(clock.now_ms() + ttl_ms);
    b.ping(C1).unwrap();
    b.run_client_monitor_once();
    assert!(b.waiting_segments().is_empty());
    assert_eq!(b.verification_stats().segments_expired, 1);
    assert!(b.segment_usage().iter().all(|u| u.id != sid(3)));
    assert!(b.object_info("on-c", "").unwrap().is_none());
    assert!(b.get_replica_list("on-a", "").is_ok());
    let both = b.get_replica_list("on-a-and-c", "").unwrap();
    assert_eq!(both.replicas.len(), 1);
    assert_accounting(&b);
    // The step has nothing left to do.
    assert_eq!(b.run_restore_deadlines_once(), Default::default());
}

#[test]
fn remount_of_a_restored_segment_must_match_it_and_its_owner() {
    let (clock, a) = source();
    put_crc(
        &a,
        C1,
        "k",
        100,
        &ReplicateConfig {
            preferred_segment: "a".into(),
            ..cfg(1)
        },
    );
    let (_, b) = target(&clock);
    b.restore(a.export_state(), RestoreOptions::default())
        .unwrap();
    let mine = seg(1, "a", SEG);
    // Another client: ReMount keeps upstream's INVALID_PARAMS, MountSegment says the id is taken.
    assert_eq!(
        b.remount_segments(std::slice::from_ref(&mine), C2)
            .unwrap_err(),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(
        b.mount_segment(&mine, C2).unwrap_err(),
        ErrorCode::SEGMENT_ALREADY_EXISTS
    );
    // The owner with changed fields: INVALID_PARAMS either way.
    for changed in [
        Segment {
            size: SEG * 2,
            ..mine.clone()
        },
        Segment {
            base: mine.base + 4096,
            ..mine.clone()
        },
        Segment {
            name: "other".into(),
            ..mine.clone()
        },
    ] {
        assert_eq!(
            b.remount_segments(std::slice::from_ref(&changed), C1)
                .unwrap_err(),
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            b.mount_segment(&changed, C1).unwrap_err(),
            ErrorCode::INVALID_PARAMS
        );
    }
    assert!(!b.is_client_ok(C2) && !b.is_client_ok(C1));
    assert_eq!(b.waiting_segments(), vec![sid(1), sid(2), sid(3)]);
    assert_eq!(
        b.get_unverified_replicas(C1, sid(1), ReplicaId(0), 10)
            .unwrap_err(),
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
    // The owner with the same segment: OK, placement may use the free space at once, the
    // restored replica still waits for verification.
    b.mount_segment(&mine, C1).unwrap();
    assert_eq!(b.waiting_segments(), vec![sid(2), sid(3)]);
    let placed = b.put_start(C1, "fresh", 10, &cfg(1), "").unwrap();
    assert_eq!(placed.len(), 1);
    assert_eq!(
        b.get_replica_list("k", "").unwrap_err(),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    // A ReMount with every segment completes the client (and takes segment 2 back).
    remount(&b, &[mine.clone(), seg(2, "b", SEG)], C1);
    assert!(b.is_client_ok(C1));
    assert_eq!(b.waiting_segments(), vec![sid(3)]);
    assert_eq!(
        b.get_unverified_replicas(C2, sid(1), ReplicaId(0), 10)
            .unwrap_err(),
        ErrorCode::ILLEGAL_CLIENT
    );
    assert_eq!(
        b.get_unverified_replicas(C1, sid(42), ReplicaId(0), 10)
            .unwrap_err(),
        ErrorCode::SEGMENT_NOT_FOUND
    );
    assert_accounting(&b);
}

#[test]
fn verification_confirms_drops_mismatches_and_times_out_the_rest() {
    let (clock, a) = master();
    a.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    for i in 0..6 {
        put_crc(&a, C1, &format!("k{i}"), 1000, &cfg(1));
    }
    let (b_clock, b) = target(&clock);
    b.restore(
        a.export_state(),
        RestoreOptions {
            verify_timeout_ms: 30_000,
            ..Default::default()
        },
    )
    .unwrap();
    remount(&b, &[seg(1, "a", SEG)], C1);
    // Paging: ids ascending, `after` excludes, the limit holds.
    let first = b
        .get_unverified_replicas(C1, sid(1), ReplicaId(0), 4)
        .unwrap();
    assert_eq!(first.len(), 4);
    assert!(first.windows(2).all(|w| w[0].id < w[1].id));
    let rest = b
        .get_unverified_replicas(C1, sid(1), first[3].id, 4)
        .unwrap();
    assert_eq!(rest.len(), 2);
    let all: Vec<_> = first.iter().chain(&rest).copied().collect();
    for r in &all {
        assert_eq!(r.len, 1000);
    }
    let key_of = |id: ReplicaId| {
        (0..6)
            .map(|i| format!("k{i}"))
            .find(|k| {
                b.object_info(k, "")
                    .unwrap()
                    .is_some_and(|o| o.replicas[0].0 == id)
            })
            .unwrap()
    };
    let (good, bad, silent) = (all[0], all[1], all[2]);
    let (good_key, bad_key, silent_key) = (key_of(good.id), key_of(bad.id), key_of(silent.id));
    assert_eq!(good.checksum, crc_of(&good_key));
    // An id in both lists counts as mismatched; unknown ids are ignored.
    let outcome = b
        .confirm_replicas(C1, sid(1), &[good.id, bad.id, ReplicaId(999)], &[bad.id])
        .unwrap();
    assert_eq!((outcome.verified, outcome.dropped), (1, 1));
    assert!(b.get_replica_list(&good_key, "").is_ok());
    assert!(b.exist_key(&good_key, "").unwrap());
    assert!(b.object_info(&bad_key, "").unwrap().is_none());
    // Settled ids are gone from the pages; a repeated verdict changes nothing.
    let again = b
        .confirm_replicas(C1, sid(1), &[good.id], &[bad.id])
        .unwrap();
    assert_eq!((again.verified, again.dropped), (0, 0));
    let pending = b
        .get_unverified_replicas(C1, sid(1), ReplicaId(0), 100)
        .unwrap();
    assert_eq!(pending.len(), 4);
    assert!(pending.iter().all(|r| r.id != good.id && r.id != bad.id));
    // Too many ids at once.
    let many = vec![ReplicaId(1); mooncake_master::MAX_CONFIRM_IDS + 1];
    assert_eq!(
        b.confirm_replicas(C1, sid(1), &many, &[]).unwrap_err(),
        ErrorCode::INVALID_PARAMS
    );
    // The rest is dropped at the verification deadline (from the re-mount).
    b_clock.advance(29_999);
    assert_eq!(b.run_restore_deadlines_once().replicas_timed_out, 0);
    b_clock.advance(1);
    b.ping(C1).unwrap();
    assert_eq!(b.run_restore_deadlines_once().replicas_timed_out, 4);
    assert!(b.object_info(&silent_key, "").unwrap().is_none());
    let stats = b.verification_stats();
    assert_eq!(
        (
            stats.verified,
            stats.mismatched,
            stats.timed_out,
            stats.pending
        ),
        (1, 1, 4, 0)
    );
    assert_eq!(b.object_count(), 1);
    assert_eq!(b.segment_usage()[0].used_bytes, Some(1000));
    assert_accounting(&b);
}

#[test]
fn objects_without_checksum_are_dropped_unless_the_snapshot_was_final() {
    let (clock, a) = master();
    a.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    put(&a, C1, "plain", 100, 1);
    put_crc(&a, C1, "summed", 100, &cfg(1));
    let state = a.export_state();

    let (_, strict) = target(&clock);
    let report = strict
        .restore(state.clone(), RestoreOptions::default())
        .unwrap();
    assert_eq!((report.objects, report.dropped.no_checksum_objects), (1, 1));
    assert!(strict.object_info("plain", "").unwrap().is_none());
    assert_accounting(&strict);

    let (_, trusting) = target(&clock);
    let report = trusting
        .restore(
            state,
            RestoreOptions {
                verify_required: false,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((report.objects, report.dropped.no_checksum_objects), (2, 0));
    assert_eq!(
        trusting.get_replica_list("plain", "").unwrap_err(),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    remount(&trusting, &[seg(1, "a", SEG)], C1);
    // Accepted at re-mount (nothing to check); the checksummed one still waits for its check.
    assert!(trusting.get_replica_list("plain", "").is_ok());
    assert_eq!(
        trusting.get_replica_list("summed", "").unwrap_err(),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    let page = trusting
        .get_unverified_replicas(C1, sid(1), ReplicaId(0), 10)
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].checksum, crc_of("summed"));
    assert_eq!(trusting.verification_stats().accepted_without_checksum, 1);
    assert_eq!(confirm_all(&trusting, C1, sid(1)), 1);
    assert!(trusting.get_replica_list("summed", "").is_ok());
    assert_accounting(&trusting);
}

#[test]
fn an_unverified_key_refuses_put_and_upsert_replaces_it() {
    let (clock, a) = master();
    a.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    put_crc(&a, C1, "same-size", 100, &cfg(1));
    put_crc(&a, C1, "new-size", 100, &cfg(1));
    put_crc(&a, C1, "removed", 100, &cfg(1));
    let (_, b) = target(&clock);
    b.restore(a.export_state(), RestoreOptions::default())
        .unwrap();
    remount(&b, &[seg(1, "a", SEG)], C1);
    let page = b
        .get_unverified_replicas(C1, sid(1), ReplicaId(0), 10)
        .unwrap();
    assert_eq!(page.len(), 3);
    // A put does not overwrite a restorable object.
    assert_eq!(
        b.put_start(C2, "same-size", 100, &cfg(1), "").unwrap_err(),
        ErrorCode::OBJECT_ALREADY_EXISTS
    );
    // Upserts replace it: in place (the same range, now written anew) or elsewhere.
    b.upsert_start(C2, "same-size", 100, &cfg(1), "").unwrap();
    b.upsert_end(C2, &ObjectMeta::new("same-size"), ReplicaType::ALL, "")
        .unwrap();
    b.upsert_start(C2, "new-size", 300, &cfg(1), "").unwrap();
    b.upsert_end(C2, &ObjectMeta::new("new-size"), ReplicaType::ALL, "")
        .unwrap();
    assert!(b.get_replica_list("same-size", "").is_ok());
    assert!(b.get_replica_list("new-size", "").is_ok());
    // Remove works on an unverified object.
    b.remove("removed", false, "").unwrap();
    // The node's late verdicts on the old replicas change nothing.
    let ids: Vec<ReplicaId> = page.iter().map(|r| r.id).collect();
    let outcome = b.confirm_replicas(C1, sid(1), &[], &ids).unwrap();
    assert_eq!((outcome.verified, outcome.dropped), (0, 0));
    assert!(b.get_replica_list("same-size", "").is_ok());
    assert!(b.get_replica_list("new-size", "").is_ok());
    assert_accounting(&b);
}

/// Records every observed mutation.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Mutation>>);

impl MutationObserver for Recorder {
    fn observe(&self, m: &Mutation) {
        self.0.lock().unwrap().push(m.clone());
    }
}

#[test]
fn an_observer_sees_the_restored_state_and_the_verification_drops_as_replayable_mutations() {
    let (clock, a) = source();
    workload(&a);
    a.graceful_unmount_segment(sid(3), C2, 60_000).unwrap();
    let (_, b) = target(&clock);
    let log = Arc::new(Recorder::default());
    b.set_observer(log.clone()).unwrap();
    b.restore(a.export_state(), RestoreOptions::default())
        .unwrap();
    let replay = |upto: &[Mutation]| {
        let (_, c) = target(&clock);
        for m in upto {
            c.apply(m).unwrap();
        }
        c
    };
    let c = replay(&log.0.lock().unwrap());
    assert_eq!(c.export_state(), b.export_state());
    assert_eq!(free_ranges(&c), free_ranges(&b));
    // A mismatch and a timed-out segment are observed like any other change.
    remount(&b, &[seg(1, "a", SEG), seg(2, "b", SEG)], C1);
    let page = b
        .get_unverified_replicas(C1, sid(1), ReplicaId(0), 3)
        .unwrap();
    let ids: Vec<ReplicaId> = page.iter().map(|r| r.id).collect();
    b.confirm_replicas(C1, sid(1), &[], &ids).unwrap();
    let c = replay(&log.0.lock().unwrap());
    assert_eq!(c.export_state(), b.export_state());
    assert_eq!(free_ranges(&c), free_ranges(&b));
    assert_accounting(&c);
}
