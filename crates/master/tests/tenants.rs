//! Multi-tenancy and quota (upstream's invariant 9).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ClientId, ErrorCode, ManualClock, ObjectMeta, ReplicaType, TenantId};
use mooncake_master::{MasterService, MasterServiceConfig, TenantPolicy};
use std::sync::Arc;

fn tenant_master(quotas: &[(&str, u64)]) -> (Arc<ManualClock>, MasterService) {
    tenant_master_with(MasterServiceConfig::default(), quotas)
}

fn tenant_master_with(
    config: MasterServiceConfig,
    quotas: &[(&str, u64)],
) -> (Arc<ManualClock>, MasterService) {
    let (clock, m) = master_with(MasterServiceConfig {
        enable_multi_tenants: true,
        ..config
    });
    let mut p = TenantPolicy::default();
    for (t, q) in quotas {
        p.tenants.insert(TenantId::new(t).unwrap(), *q);
    }
    m.apply_tenant_policy(p).unwrap();
    (clock, m)
}

fn tput(
    m: &MasterService,
    key: &str,
    size: u64,
    replicas: usize,
    t: &str,
) -> Result<(), ErrorCode> {
    m.put_start(C1, key, size, &cfg(replicas), t)?;
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, t)
}

fn charged(m: &MasterService, t: &str) -> u64 {
    m.list_tenant_quotas(Some(t)).unwrap()[0].charged_bytes
}

fn assert_conserved(m: &MasterService) {
    for (t, charged, held) in m.check_quota_accounting() {
        assert_eq!(charged, held, "tenant {t}: charged != Σ held replica bytes");
    }
    for s in m.list_tenant_quotas(None).unwrap() {
        if s.has_explicit_policy {
            assert!(
                s.charged_bytes <= s.effective_quota_bytes,
                "{s:?} over its effective quota"
            );
        }
    }
}

#[test]
fn inv9_tenancy_and_quota() {
    let (clock, m) = tenant_master(&[("t1", 1000), ("t2", 500)]);
    m.mount_segment(&seg(1, "a", 10_000), C1).unwrap();
    m.mount_segment(&seg(2, "b", 10_000), C1).unwrap();
    // Same key, two tenants: two objects.
    tput(&m, "k", 100, 1, "t1").unwrap();
    tput(&m, "k", 200, 1, "t2").unwrap();
    assert_eq!(m.object_count(), 2);
    assert_eq!(m.object_info("k", "t2").unwrap().unwrap().size, 200);
    // Unregistered tenants (including `default` here) cannot write.
    for t in ["t3", "", "default"] {
        assert_eq!(
            m.put_start(C1, "x", 1, &cfg(1), t),
            Err(ErrorCode::TENANT_NOT_REGISTERED),
            "{t:?}"
        );
    }
    // Charged = Σ size × replicas; a 2-replica put in flight charges both.
    m.put_start(C1, "two", 300, &cfg(2), "t1").unwrap();
    assert_eq!(charged(&m, "t1"), 100 + 600);
    assert_conserved(&m);
    // Admission never passes the effective quota: 700 + 2 × 200 > 1000, and tenant-scoped
    // eviction cannot help while `k` is leased and `two` is being written.
    m.get_replica_list("k", "t1").unwrap();
    assert_eq!(
        m.put_start(C1, "big", 200, &cfg(2), "t1"),
        Err(ErrorCode::TENANT_QUOTA_EXCEEDED)
    );
    assert_eq!(
        charged(&m, "t1"),
        700,
        "a refused charge leaves nothing behind"
    );
    // Revoke refunds.
    m.put_revoke(C1, "two", ReplicaType::ALL, "t1").unwrap();
    assert_eq!(charged(&m, "t1"), 100);
    // Remove refunds.
    m.remove("k", true, "t1").unwrap();
    assert_eq!(charged(&m, "t1"), 0);
    // Expiry (put timeout) refunds.
    m.put_start(C1, "slow", 50, &cfg(1), "t2").unwrap();
    assert_eq!(charged(&m, "t2"), 250);
    clock.advance(600_001);
    m.run_put_timeouts_once();
    assert_eq!(charged(&m, "t2"), 200);
    assert_conserved(&m);
    // Effective quotas sum to at most the capacity.
    m.set_tenant_quota("t3", 1 << 40).unwrap();
    let total: u64 = m
        .list_tenant_quotas(None)
        .unwrap()
        .iter()
        .map(|s| s.effective_quota_bytes)
        .sum();
    assert_eq!(total, 20_000, "proportional shares of the mounted capacity");
    assert_accounting(&m);
}

#[test]
fn quota_exceeded_runs_tenant_scoped_eviction_then_succeeds() {
    let (clock, m) = tenant_master(&[("t1", 1000), ("t2", 1000)]);
    m.mount_segment(&seg(1, "a", 100_000), C1).unwrap();
    for i in 0..10 {
        clock.advance(1);
        tput(&m, &format!("a{i}"), 100, 1, "t1").unwrap();
        tput(&m, &format!("b{i}"), 100, 1, "t2").unwrap();
    }
    assert_eq!(charged(&m, "t1"), 1000);
    // t1 is full: its two oldest objects are evicted for the 200-byte deficit; t2 is untouched.
    m.put_start(C1, "new", 200, &cfg(1), "t1").unwrap();
    assert!(m.object_info("a0", "t1").unwrap().is_none());
    assert!(m.object_info("a1", "t1").unwrap().is_none());
    assert!(m.object_info("a2", "t1").unwrap().is_some());
    assert_eq!(m.tenant_object_count(&TenantId::new("t2").unwrap()), 10);
    assert_eq!(charged(&m, "t1"), 1000);
    assert_conserved(&m);
    // When nothing of the tenant can be evicted (all leased), the put fails after the retries.
    clock.advance(1);
    for i in 2..10 {
        m.get_replica_list(&format!("a{i}"), "t1").unwrap();
    }
    assert_eq!(
        m.put_start(C1, "more", 100, &cfg(1), "t1"),
        Err(ErrorCode::TENANT_QUOTA_EXCEEDED)
    );
    assert_conserved(&m);
}

#[test]
fn orphan_tenants_are_closed_for_writes_but_readable_and_admin_api_works() {
    let (_, m) = master_with(MasterServiceConfig {
        enable_multi_tenants: true,
        ..Default::default()
    });
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let policy = TenantPolicy::parse_yaml(
        "version: 1\ntenants:\n  - name: t1\n    quota: 1KB\n  - name: t2\n    quota: 2048\n",
    )
    .unwrap();
    m.apply_tenant_policy(policy).unwrap();
    let s = m.list_tenant_quotas(Some("t1")).unwrap();
    assert_eq!(s[0].requested_quota_bytes, 1024);
    assert_eq!(s[0].effective_quota_bytes, 1024);
    tput(&m, "k", 10, 1, "t1").unwrap();
    // Delete: non-empty → TENANT_NOT_EMPTY; unknown → OBJECT_NOT_FOUND.
    assert_eq!(
        m.delete_tenant_quota("t1"),
        Err(ErrorCode::TENANT_NOT_EMPTY)
    );
    assert_eq!(
        m.delete_tenant_quota("zz"),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    // A proposal changes nothing until it is applied (the server persists it in between).
    let without_t2 = m.propose_tenant_quota_removal("t2").unwrap();
    assert!(!without_t2.tenants.contains_key("t2") && without_t2.tenants.contains_key("t1"));
    assert!(m.tenant_policy().tenants.contains_key("t2"));
    tput(&m, "still-open", 1, 1, "t2").unwrap();
    m.remove("still-open", true, "t2").unwrap();
    m.delete_tenant_quota("t2").unwrap();
    assert_eq!(m.tenant_policy(), without_t2);
    assert_eq!(
        m.put_start(C1, "x", 1, &cfg(1), "t2"),
        Err(ErrorCode::TENANT_NOT_REGISTERED),
        "admission closed"
    );
    // t1 becomes an orphan when the policy drops it: reads and removes still work.
    let mut only_t3 = TenantPolicy::default();
    only_t3.tenants.insert(TenantId::new("t3").unwrap(), 100);
    m.apply_tenant_policy(only_t3).unwrap();
    let s = m.list_tenant_quotas(Some("t1")).unwrap();
    assert!(s[0].admission_closed && !s[0].has_explicit_policy);
    assert_eq!(s[0].effective_quota_bytes, 0);
    assert_eq!(
        m.put_start(C1, "y", 1, &cfg(1), "t1"),
        Err(ErrorCode::TENANT_NOT_REGISTERED)
    );
    assert!(m.get_replica_list("k", "t1").is_ok());
    m.remove("k", true, "t1").unwrap();
    assert_eq!(m.set_tenant_quota("t1", 0), Err(ErrorCode::INVALID_PARAMS));
    assert_eq!(
        m.set_tenant_quota("t1", u64::MAX),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.propose_tenant_quota("t1", u64::MAX),
        Err(ErrorCode::INVALID_PARAMS)
    );
    let proposed = m.propose_tenant_quota("t1", 10).unwrap();
    assert_eq!(proposed.tenants[&TenantId::new("t1").unwrap()], 10);
    assert!(
        m.list_tenant_quotas(Some("t1")).unwrap()[0].admission_closed,
        "a proposal is not applied"
    );
    assert_eq!(
        m.set_tenant_quota("t1", 10).unwrap().effective_quota_bytes,
        10
    );
    assert_eq!(m.tenant_policy(), proposed);
}

#[test]
fn quota_admin_is_unavailable_with_multi_tenancy_off() {
    let (_, m) = master();
    assert_eq!(
        m.list_tenant_quotas(None),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
    assert_eq!(
        m.set_tenant_quota("t", 1),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
    assert_eq!(
        m.delete_tenant_quota("t"),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
    assert_eq!(
        m.propose_tenant_quota("t", 1),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
    assert_eq!(
        m.propose_tenant_quota_removal("t"),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
    assert_eq!(
        m.apply_tenant_policy(TenantPolicy::default()),
        Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
    );
}

#[test]
fn quota_is_conserved_under_puts_removes_evictions_and_client_deaths() {
    // Σ requests (3 × 30,000) fit in the smallest capacity left after a death (one 100,000
    // segment), so effective quotas stay equal to the requests throughout.
    // A low watermark so that the global eviction cycle really runs.
    let config = MasterServiceConfig {
        eviction_high_watermark_ratio: 0.1,
        ..Default::default()
    };
    let (clock, m) = tenant_master_with(config, &[("t1", 30_000), ("t2", 30_000), ("t3", 30_000)]);
    let (mut evicted, mut deaths) = (0, 0);
    let clients = [C1, C2, ClientId::new(3, 3)];
    let mut alive = [true; 3];
    let mount = |i: usize| {
        m.remount_segments(&[seg(i as u64 + 1, &format!("s{i}"), 100_000)], clients[i])
            .unwrap();
    };
    for i in 0..3 {
        mount(i);
    }
    let mut rng = fastrand::Rng::with_seed(test_seed());
    let tenants = ["t1", "t2", "t3"];
    for step in 0..3000 {
        clock.advance(rng.u64(1..50));
        let t = tenants[rng.usize(..3)];
        let key = format!("k{}", rng.u32(..300));
        match rng.u32(..100) {
            0..=49 => {
                let reps = rng.usize(1..=2);
                if m.put_start(C1, &key, rng.u64(1..2000), &cfg(reps), t)
                    .is_ok()
                    && rng.bool()
                {
                    m.put_end(C1, &ObjectMeta::new(&key), ReplicaType::ALL, t)
                        .ok();
                }
            }
            50..=59 => {
                m.put_revoke(C1, &key, ReplicaType::ALL, t).ok();
            }
            60..=74 => {
                m.remove(&key, rng.bool(), t).ok();
            }
            75..=84 => {
                m.get_replica_list(&key, t).ok();
            }
            85..=94 => {
                evicted += m.run_eviction_once().evicted_objects;
            }
            95..=97 => {
                m.run_put_timeouts_once();
            }
            _ => {
                // A client dies (stops pinging) or comes back.
                let i = rng.usize(..3);
                if alive[i] && alive.iter().filter(|a| **a).count() > 1 {
                    alive[i] = false;
                } else if !alive[i] {
                    alive[i] = true;
                    mount(i);
                }
            }
        }
        for (i, c) in clients.iter().enumerate() {
            if alive[i] {
                m.ping(*c).unwrap();
            }
        }
        if step % 10 == 0 {
            clock.advance(11_000);
            for (i, c) in clients.iter().enumerate() {
                if alive[i] {
                    m.ping(*c).unwrap();
                }
            }
            deaths += m.run_client_monitor_once();
        }
        assert_conserved(&m);
    }
    assert!(
        evicted > 0 && deaths > 0,
        "evicted {evicted}, deaths {deaths}"
    );
    assert_accounting(&m);
}

mod tenant_model {
    //! Model-based property test for tenant operations: registration, quota admission, refunds
    //! and the admin methods agree with a reference model; objects vanish only through
    //! tenant-scoped eviction, and then only unleased, complete ones.
    use super::*;
    use mooncake_master::effective_quotas;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const TENANTS: [&str; 2] = ["t1", "t2"];
    const CAPACITY: u64 = 2 * 1024;

    #[derive(Debug, Clone)]
    enum Op {
        Put {
            t: usize,
            k: usize,
            units: u64,
            reps: usize,
        },
        End {
            t: usize,
            k: usize,
        },
        Revoke {
            t: usize,
            k: usize,
        },
        Remove {
            t: usize,
            k: usize,
            force: bool,
        },
        Get {
            t: usize,
            k: usize,
        },
        SetQuota {
            t: usize,
            units: u64,
        },
        DeleteQuota {
            t: usize,
        },
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..2usize, 0..5usize, 1u64..=4, 1usize..=2)
                .prop_map(|(t, k, units, reps)| Op::Put { t, k, units, reps }),
            4 => (0..2usize, 0..5usize).prop_map(|(t, k)| Op::End { t, k }),
            1 => (0..2usize, 0..5usize).prop_map(|(t, k)| Op::Revoke { t, k }),
            2 => (0..2usize, 0..5usize, any::<bool>())
                .prop_map(|(t, k, force)| Op::Remove { t, k, force }),
            2 => (0..2usize, 0..5usize).prop_map(|(t, k)| Op::Get { t, k }),
            2 => (0..2usize, 1u64..=16).prop_map(|(t, units)| Op::SetQuota { t, units }),
            1 => (0..2usize).prop_map(|t| Op::DeleteQuota { t }),
            2 => prop_oneof![Just(1u64), Just(10_001), Just(31_000)].prop_map(Op::Advance),
        ]
    }

    #[derive(Debug, Clone)]
    struct Obj {
        bytes: u64,
        complete: bool,
        lease_ms: u64,
        start_ms: u64,
    }

    #[derive(Default)]
    struct Model {
        policy: BTreeMap<TenantId, u64>,
        objects: BTreeMap<(usize, usize), Obj>,
    }

    impl Model {
        fn charged(&self, t: usize) -> u64 {
            self.objects
                .iter()
                .filter(|((tt, _), _)| *tt == t)
                .map(|(_, o)| o.bytes)
                .sum()
        }
        fn effective(&self, t: usize) -> Option<u64> {
            let id = TenantId::new(TENANTS[t]).unwrap();
            let eff = effective_quotas(CAPACITY, &self.policy);
            self.policy.keys().position(|n| *n == id).map(|i| eff[i])
        }
    }

    fn run(ops: &[Op]) {
        let (clock, m) = master_with(MasterServiceConfig {
            enable_multi_tenants: true,
            ..Default::default()
        });
        m.mount_segment(&seg(1, "a", 1024), C1).unwrap();
        m.mount_segment(&seg(2, "b", 1024), C1).unwrap();
        let mut model = Model::default();
        for op in ops {
            let now = m.now_ms();
            match *op {
                Op::Put { t, k, units, reps } => put(&m, &mut model, op, (t, k, units, reps), now),
                Op::End { t, k } => {
                    let got = m.put_end(
                        C1,
                        &ObjectMeta::new(format!("k{k}")),
                        ReplicaType::ALL,
                        TENANTS[t],
                    );
                    match model.objects.get_mut(&(t, k)) {
                        None => assert_eq!(got, Err(ErrorCode::OBJECT_NOT_FOUND)),
                        Some(o) => {
                            assert_eq!(got, Ok(()));
                            o.complete = true;
                        }
                    }
                }
                Op::Revoke { t, k } => {
                    let got = m.put_revoke(C1, &format!("k{k}"), ReplicaType::ALL, TENANTS[t]);
                    match model.objects.get(&(t, k)) {
                        None => assert_eq!(got, Err(ErrorCode::OBJECT_NOT_FOUND)),
                        Some(o) if o.complete => assert_eq!(got, Err(ErrorCode::INVALID_WRITE)),
                        Some(_) => {
                            assert_eq!(got, Ok(()));
                            model.objects.remove(&(t, k));
                        }
                    }
                }
                Op::Remove { t, k, force } => {
                    let got = m.remove(&format!("k{k}"), force, TENANTS[t]);
                    let want = match model.objects.get(&(t, k)) {
                        None => Err(ErrorCode::OBJECT_NOT_FOUND),
                        Some(o) if !force && now < o.lease_ms => Err(ErrorCode::OBJECT_HAS_LEASE),
                        Some(o) if !o.complete => Err(ErrorCode::REPLICA_IS_NOT_READY),
                        Some(_) => {
                            model.objects.remove(&(t, k));
                            Ok(())
                        }
                    };
                    assert_eq!(got, want, "{op:?}");
                }
                Op::Get { t, k } => {
                    let got = m.get_replica_list(&format!("k{k}"), TENANTS[t]);
                    match model.objects.get_mut(&(t, k)) {
                        None => assert_eq!(got, Err(ErrorCode::OBJECT_NOT_FOUND)),
                        Some(o) if !o.complete => {
                            assert_eq!(got, Err(ErrorCode::REPLICA_IS_NOT_READY))
                        }
                        Some(o) => {
                            assert!(got.is_ok());
                            o.lease_ms = o.lease_ms.max(now + LEASE_MS);
                        }
                    }
                }
                Op::SetQuota { t, units } => {
                    let s = m.set_tenant_quota(TENANTS[t], units * 64).unwrap();
                    model
                        .policy
                        .insert(TenantId::new(TENANTS[t]).unwrap(), units * 64);
                    assert_eq!(Some(s.effective_quota_bytes), model.effective(t));
                }
                Op::DeleteQuota { t } => {
                    let got = m.delete_tenant_quota(TENANTS[t]);
                    let id = TenantId::new(TENANTS[t]).unwrap();
                    let want = if !model.policy.contains_key(&id) {
                        Err(ErrorCode::OBJECT_NOT_FOUND)
                    } else if model.objects.keys().any(|(tt, _)| *tt == t) {
                        Err(ErrorCode::TENANT_NOT_EMPTY)
                    } else {
                        model.policy.remove(&id);
                        Ok(())
                    };
                    assert_eq!(got, want, "{op:?}");
                }
                Op::Advance(ms) => {
                    clock.advance(ms);
                }
            }
            assert_charges_match(&m, &model, op);
            assert_conserved_held(&m);
        }
        assert_accounting(&m);
    }

    /// A PutStart of tenant `t`'s key `k`: refused for an unregistered tenant or a key held,
    /// otherwise placed within the tenant's quota, after tenant-scoped eviction of only `t`'s
    /// unleased complete objects. A put that found the store itself full may also have evicted
    /// other tenants' unleased complete objects inline (the whole store's victim order, as the
    /// background cycle), never more than the master counts as evicted inline.
    fn put(
        m: &MasterService,
        model: &mut Model,
        op: &Op,
        (t, k, units, reps): (usize, usize, u64, usize),
        now: u64,
    ) {
        let size = units * 64;
        let name = TENANTS[t];
        let inline_before = m.counters().inline_evicted_objects();
        let got = m.put_start(C1, &format!("k{k}"), size, &cfg(reps), name);
        let inline = m.counters().inline_evicted_objects() - inline_before;
        if model.effective(t).is_none() {
            assert_eq!(got, Err(ErrorCode::TENANT_NOT_REGISTERED), "{op:?}");
            return;
        }
        if let Some(o) = model.objects.get(&(t, k)) {
            if o.complete {
                assert_eq!(got, Err(ErrorCode::OBJECT_ALREADY_EXISTS), "{op:?}");
                return;
            }
            if o.start_ms + 30_000 >= now {
                assert_eq!(got, Err(ErrorCode::REPLICA_IS_NOT_READY), "{op:?}");
                return;
            }
            model.objects.remove(&(t, k)); // pre-empted: refunded
        }
        // Tenant-scoped eviction may have taken some of t's objects.
        let victims: Vec<(usize, usize)> = model
            .objects
            .keys()
            .copied()
            .filter(|&(tt, kk)| {
                m.object_info(&format!("k{kk}"), TENANTS[tt])
                    .unwrap()
                    .is_none()
            })
            .collect();
        let outside = victims.iter().filter(|v| v.0 != t).count() as u64;
        assert!(
            outside <= inline,
            "{outside} evicted outside the tenant, {inline} inline: {op:?}"
        );
        for v in &victims {
            let o = &model.objects[v];
            assert!(o.complete && now >= o.lease_ms, "evicted {v:?}: {o:?}");
            model.objects.remove(v);
        }
        let eff = model.effective(t).unwrap();
        match got {
            Ok(d) => {
                let bytes = size * d.len() as u64;
                assert!(model.charged(t) + bytes <= eff, "{op:?}");
                model.objects.insert(
                    (t, k),
                    Obj {
                        bytes,
                        complete: false,
                        lease_ms: 0,
                        start_ms: now,
                    },
                );
            }
            Err(ErrorCode::TENANT_QUOTA_EXCEEDED) => {
                assert!(model.charged(t) + size * reps as u64 > eff, "{op:?}");
            }
            Err(e) => assert_eq!(e, ErrorCode::NO_AVAILABLE_HANDLE, "{op:?}"),
        }
    }

    /// After every step: charged = Σ held bytes = the model's, within the quota.
    fn assert_charges_match(m: &MasterService, model: &Model, op: &Op) {
        for (t, name) in TENANTS.iter().enumerate() {
            let snap = m.list_tenant_quotas(Some(name)).ok().map(|v| v[0].clone());
            let charged = snap.as_ref().map_or(0, |s| s.charged_bytes);
            assert_eq!(charged, model.charged(t), "{name} after {op:?}");
            if let Some(s) = snap {
                assert_eq!(
                    Some(s.effective_quota_bytes).filter(|_| s.has_explicit_policy),
                    model.effective(t)
                );
            }
        }
    }

    fn assert_conserved_held(m: &MasterService) {
        for (t, charged, held) in m.check_quota_accounting() {
            assert_eq!(charged, held, "tenant {t}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn tenant_operations_agree_with_the_model(ops in prop::collection::vec(op(), 1..60)) {
            run(&ops);
        }
    }
}
