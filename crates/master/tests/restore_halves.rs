//! Restore with `RestoreOptions::join`: the bulk steps split in two halves run on two threads
//! give exactly what one thread gives: the state, the free ranges, the report, the pending
//! verifications, and the rule that a key given twice keeps the record met first.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ObjectMeta, ReplicaId, ReplicaType, SegmentId, TenantId};
use mooncake_master::{MasterService, MasterServiceConfig, MasterState, RestoreOptions};

const SEG: u64 = 16 << 20;

/// The fork-join a server passes: `b` on a scoped thread, `a` here.
fn on_threads(a: &mut (dyn FnMut() + Send), b: &mut (dyn FnMut() + Send)) {
    std::thread::scope(|s| {
        let h = s.spawn(b);
        a();
        h.join().unwrap();
    });
}

/// A master of three segments and 3,000 objects in three tenants, with groups, soft pins,
/// two replicas on some, some without a checksum, and holes left by removals.
fn source() -> MasterService {
    let (_, m) = mt_master();
    for (id, client) in [(1, C1), (2, C1), (3, C2)] {
        m.mount_segment(&seg(id, &format!("s{id}"), SEG), client)
            .unwrap();
    }
    for i in 0..3000u64 {
        let tenant = ["", "t1", "t2"][(i % 3) as usize];
        let mut config = cfg(1 + (i % 2) as usize);
        if i % 7 == 0 {
            config.group_ids = Some(vec![format!("g{}", i % 5)]);
        }
        if i % 11 == 0 {
            config.soft_pin_action = mooncake_common::SoftPinAction::Enable;
            config.soft_pin_ttl_ms = Some(60_000);
        }
        let key = format!("key-{i}");
        let client = if i % 4 == 0 { C2 } else { C1 };
        m.put_start(client, &key, 100 + i % 900, &config, tenant)
            .unwrap();
        let meta = ObjectMeta {
            key: key.clone(),
            object_checksum: (i % 13 != 0).then_some(i * 31),
        };
        m.put_end(client, &meta, ReplicaType::ALL, tenant).unwrap();
        if i % 17 == 0 {
            m.remove(&key, true, tenant).unwrap();
        }
    }
    m
}

/// Everything a restore leaves behind that the two ways must agree on.
fn outcome(state: MasterState, opts: RestoreOptions) -> impl PartialEq + std::fmt::Debug {
    let (_, m) = master_with(MasterServiceConfig {
        enable_multi_tenants: true,
        ..Default::default()
    });
    assert!(!state.tenant_policy.tenants.is_empty());
    let report = m.restore(state, opts).unwrap();
    assert!(
        report.objects > 2000 && report.unverified_replicas > 3000,
        "{report:?}"
    );
    assert_accounting(&m);
    let free: Vec<_> = m
        .segment_usage()
        .into_iter()
        .map(|u| (u.id, m.segment_free_ranges(u.id), u.used_bytes))
        .collect();
    m.remount_segments(&[seg(1, "s1", SEG), seg(2, "s2", SEG)], C1)
        .unwrap();
    m.remount_segments(&[seg(3, "s3", SEG)], C2).unwrap();
    let pending: Vec<Vec<(ReplicaId, u64, u64, u64)>> = [(1, C1), (2, C1), (3, C2)]
        .into_iter()
        .map(|(id, client)| {
            m.get_unverified_replicas(client, SegmentId::new(id, 0), ReplicaId(0), 100_000)
                .unwrap()
                .into_iter()
                .map(|r| (r.id, r.offset, r.len, r.checksum))
                .collect()
        })
        .collect();
    let t1 = m.tenant_object_count(&TenantId::new("t1").unwrap());
    (
        report,
        m.export_state(),
        free,
        pending,
        m.grouped_key_count(),
        t1,
    )
}

#[test]
fn two_halves_on_two_threads_restore_exactly_what_one_thread_restores() {
    let mut state = source().export_state();
    // Not in key order, as a live take writes them; with one key twice (the first is kept).
    state.objects.reverse();
    let mut twice = state.objects[2].clone();
    twice.size += 1;
    state.objects.push(twice);
    for verify_required in [true, false] {
        let sequential = RestoreOptions {
            verify_required,
            ..Default::default()
        };
        let halves = RestoreOptions {
            join: Some(on_threads),
            ..sequential
        };
        let one = outcome(state.clone(), sequential);
        let two = outcome(state.clone(), halves);
        assert_eq!(one, two, "verify_required {verify_required}");
    }
}
