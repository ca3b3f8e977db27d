//! Snapshots of a live master: what `write_snapshot` streams decodes to the master's own
//! export, and restores into a fresh master.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;

use mooncake_common::{
    ClientId, ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId, TenantId,
};
use mooncake_master::{
    MasterService, MasterServiceConfig, MasterState, RestoreOptions, TenantPolicy,
};
use mooncake_snapshot::{decode, write_snapshot, EncodeOptions, SnapshotMeta};

const C1: ClientId = ClientId::new(1, 1);
const C2: ClientId = ClientId::new(2, 2);

fn mt_master() -> MasterService {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = MasterServiceConfig {
        enable_multi_tenants: true,
        ..Default::default()
    };
    let m = MasterService::with_seed(config, clock, 7).unwrap();
    let mut policy = TenantPolicy::default();
    for t in ["default", "t1", "t2"] {
        policy.tenants.insert(TenantId::new(t).unwrap(), 1 << 40);
    }
    m.apply_tenant_policy(policy).unwrap();
    m
}

fn seg(id: u64, size: u64) -> Segment {
    Segment {
        id: SegmentId::new(id, 0),
        name: format!("node-{id}"),
        base: 0x1_0000_0000 * id,
        size,
        te_endpoint: format!("ep-{id}"),
        protocol: "tcp".to_string(),
        host_id: String::new(),
    }
}

/// A master with two segments and `n` objects in three tenants, some with two replicas, some
/// hard-pinned, some with checksums.
pub fn populated(n: usize) -> MasterService {
    let m = mt_master();
    m.mount_segment(&seg(1, 64 << 20), C1).unwrap();
    m.mount_segment(&seg(2, 64 << 20), C2).unwrap();
    for i in 0..n {
        let tenant = ["", "t1", "t2"][i % 3];
        let key = format!("key-{i:05}");
        let mut config = ReplicateConfig {
            replica_num: 1 + i % 2,
            ..Default::default()
        };
        config.with_hard_pin = i % 5 == 0;
        let client = if i % 2 == 0 { C1 } else { C2 };
        m.put_start(client, &key, 1024 + i as u64, &config, tenant)
            .unwrap();
        let meta = ObjectMeta {
            key,
            object_checksum: (i % 4 != 0).then_some(i as u64 * 7919),
        };
        m.put_end(client, &meta, ReplicaType::ALL, tenant).unwrap();
    }
    m
}

/// `state` with its objects in `(tenant, key)` order, as `export_state` returns them (a live take
/// writes them shard by shard).
pub fn sorted(mut state: MasterState) -> MasterState {
    state
        .objects
        .sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
    state
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        id: 5,
        created_ms: 1_000_000,
        oplog_position: 9,
        master_version: "test".into(),
    }
}

#[test]
fn a_live_snapshot_decodes_to_the_masters_export() {
    let m = populated(500);
    for opts in [EncodeOptions::default(), EncodeOptions::uncompressed()] {
        let mut out = Vec::new();
        let bytes = write_snapshot(&m, &meta(), &opts, &mut out).unwrap();
        assert_eq!(bytes, out.len() as u64);
        let (got_meta, state) = decode(&out).unwrap();
        assert_eq!(got_meta, meta());
        assert_eq!(state.objects.len(), 500);
        assert_eq!(sorted(state), m.export_state());
    }
}

#[test]
fn a_decoded_live_snapshot_restores_into_a_fresh_master() {
    let m = populated(300);
    let mut out = Vec::new();
    write_snapshot(&m, &meta(), &EncodeOptions::default(), &mut out).unwrap();
    let (_, state) = decode(&out).unwrap();
    let fresh = mt_master();
    let opts = RestoreOptions {
        verify_required: false,
        ..Default::default()
    };
    let report = fresh.restore(state, opts).unwrap();
    assert_eq!(report.objects, 300);
    assert_eq!(fresh.export_state().objects, m.export_state().objects);
}
