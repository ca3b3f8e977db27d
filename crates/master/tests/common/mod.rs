//! Shared helpers for the master's integration tests: a master on a manual clock, segments and
//! one-call puts.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::{Arc, OnceLock};

use mooncake_common::{
    ClientId, ManualClock, ObjectMeta, ReplicaDescriptor, ReplicaType, ReplicateConfig, Segment,
    SegmentId, TenantId,
};
use mooncake_master::{MasterService, MasterServiceConfig, TenantPolicy};

pub const T0_MS: u64 = 1_000_000;
pub const LEASE_MS: u64 = 10_000;
pub const C1: ClientId = ClientId::new(1, 1);
pub const C2: ClientId = ClientId::new(2, 2);

pub fn master_with(config: MasterServiceConfig) -> (Arc<ManualClock>, MasterService) {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let master = MasterService::with_seed(config, clock.clone(), test_seed()).unwrap();
    (clock, master)
}

pub fn master() -> (Arc<ManualClock>, MasterService) {
    master_with(MasterServiceConfig::default())
}

/// A multi-tenant master whose policy registers `default`, `t1`, `t2`, `a` and `b` with 1 TiB
/// each (effective quotas are then bounded by the mounted capacity).
pub fn mt_master() -> (Arc<ManualClock>, MasterService) {
    let (clock, m) = master_with(MasterServiceConfig {
        enable_multi_tenants: true,
        ..Default::default()
    });
    let mut policy = TenantPolicy::default();
    for t in ["default", "t1", "t2", "a", "b"] {
        policy.tenants.insert(TenantId::new(t).unwrap(), 1 << 40);
    }
    m.apply_tenant_policy(policy).unwrap();
    (clock, m)
}

/// Segment `id` named `name`, `size` bytes, at a base derived from the id.
pub fn seg(id: u64, name: &str, size: u64) -> Segment {
    Segment {
        id: SegmentId::new(id, 0),
        name: name.to_string(),
        base: 0x1_0000_0000 * id,
        size,
        te_endpoint: format!("ep-{name}"),
        protocol: "tcp".to_string(),
        host_id: String::new(),
    }
}

pub fn cfg(replicas: usize) -> ReplicateConfig {
    ReplicateConfig::with_replicas(replicas)
}

/// PutStart + PutEnd with `replicas` replicas; returns the descriptors.
pub fn put(
    m: &MasterService,
    client: ClientId,
    key: &str,
    size: u64,
    replicas: usize,
) -> Vec<ReplicaDescriptor> {
    let d = m.put_start(client, key, size, &cfg(replicas), "").unwrap();
    m.put_end(client, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
    d
}

pub fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Panics with the report's problems if accounting is off.
pub fn assert_accounting(m: &MasterService) {
    let r = m.check_accounting();
    assert!(
        r.problems.is_empty(),
        "accounting problems: {:#?}",
        r.problems
    );
}

/// Used bytes of segment `id` (None if unmounted or dead).
pub fn used(m: &MasterService, id: u64) -> Option<u64> {
    m.segment_usage()
        .into_iter()
        .find(|u| u.id == SegmentId::new(id, 0))
        .and_then(|u| u.used_bytes)
}

/// The seed of this test process: `MC_TEST_SEED` when set (decimal), else a fresh random one,
/// drawn once. Every master the helpers build is seeded with it (its placements, batch orders and
/// task ids), and so are the randomized workloads. The first call installs a panic hook that
/// prints the seed, so a failing run replays with
/// `MC_TEST_SEED=<seed> cargo nextest run -p mooncake-master <test>`.
pub fn test_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = match std::env::var("MC_TEST_SEED") {
            Ok(text) => text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("MC_TEST_SEED={text:?} is not a u64")),
            Err(_) => fastrand::u64(..),
        };
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("this run's seed: replay with MC_TEST_SEED={seed}");
        }));
        seed
    })
}
