//! The mutation seam replays: a seeded random workload (puts, ends, revokes, upserts, removes and
//! their batches, regex and remove-all, replica clears, copies and moves, soft and hard pins,
//! groups, tenants with quotas and quota changes, eviction with the clock advanced, put and task
//! timeouts, soft-pin expiry, mounts, unmounts, graceful unmounts, drain status, client death by
//! the monitor) runs on master A with a recording observer. Every recorded mutation is applied,
//! in order, to an empty master B; at checkpoints and at the end the two exports must be equal,
//! and so must every segment's used bytes, buffer count and free ranges, the tenant quota
//! snapshots, and both masters' own accounting checks. A path that forgets to observe a change
//! makes the exports (or B's allocators) differ.
//!
//! Seeds: `MC_TEST_SEED` replays a failing run (its seed is printed on failure).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use mooncake_common::{
    ClientId, ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId,
    SegmentStatus, SoftPinAction, TenantId,
};
use mooncake_master::{
    MasterService, MasterServiceConfig, Mutation, MutationObserver, TenantPolicy,
};

/// Records every observed mutation.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Mutation>>);

impl MutationObserver for Recorder {
    fn observe(&self, m: &Mutation) {
        self.0.lock().unwrap().push(m.clone());
    }
}

const KEYS: u64 = 20;
const SEGMENTS: u64 = 4;
const SEG_BYTES: u64 = 32 * 1024;
const CHECK_EVERY: usize = 16;
const STEPS: usize = 800;

struct World {
    rng: fastrand::Rng,
    clock: Arc<ManualClock>,
    a: MasterService,
    b: MasterService,
    log: Arc<Recorder>,
    applied: usize,
    tenants: Vec<&'static str>,
    /// Generation of each segment id (a re-mount after an unmount gets a fresh id).
    generation: [u64; SEGMENTS as usize + 1],
    /// Client 2 stopped pinging.
    c2_dead: bool,
}

fn owner(seg: u64) -> ClientId {
    if seg <= 2 {
        C1
    } else {
        C2
    }
}

impl World {
    fn new(seed: u64, multi_tenant: bool) -> World {
        let config = MasterServiceConfig {
            enable_multi_tenants: multi_tenant,
            ..Default::default()
        };
        let clock = Arc::new(ManualClock::new(T0_MS));
        let a = MasterService::with_seed(config.clone(), clock.clone(), seed).unwrap();
        let b = MasterService::with_seed(config, Arc::new(ManualClock::new(T0_MS)), 0).unwrap();
        let log = Arc::new(Recorder::default());
        a.set_observer(log.clone()).unwrap();
        let tenants = if multi_tenant {
            vec!["", "t1", "t2"]
        } else {
            vec![""]
        };
        let mut w = World {
            rng: fastrand::Rng::with_seed(seed),
            clock,
            a,
            b,
            log,
            applied: 0,
            tenants,
            generation: [0; SEGMENTS as usize + 1],
            c2_dead: false,
        };
        if multi_tenant {
            let mut p = TenantPolicy::default();
            // Σ requests (120 KiB) fit in the capacity (128 KiB) until client 2's segments go;
            // then the effective quotas are proportional.
            p.tenants.insert(TenantId::default(), 64 * 1024);
            p.tenants.insert(TenantId::new("t1").unwrap(), 32 * 1024);
            p.tenants.insert(TenantId::new("t2").unwrap(), 24 * 1024);
            w.a.apply_tenant_policy(p).unwrap();
        }
        for s in 1..=SEGMENTS {
            w.mount(s);
        }
        w
    }

    fn segment(&self, s: u64) -> Segment {
        Segment {
            id: SegmentId::new(s, self.generation[s as usize]),
            ..seg(s, &format!("s{s}"), SEG_BYTES)
        }
    }

    fn mount(&mut self, s: u64) {
        let _ = self.a.mount_segment(&self.segment(s), owner(s));
    }

    fn key(&mut self) -> String {
        format!("k{}", self.rng.u64(..KEYS))
    }

    fn tenant(&mut self) -> &'static str {
        self.tenants[self.rng.usize(..self.tenants.len())]
    }

    fn client(&mut self) -> ClientId {
        if self.rng.u8(..4) == 0 {
            C2
        } else {
            C1
        }
    }

    fn put_config(&mut self) -> ReplicateConfig {
        let mut c = cfg(self.rng.usize(1..=3));
        match self.rng.u8(..12) {
            0 => c.group_ids = Some(vec![format!("g{}", self.rng.u8(..3))]),
            1 => {
                c.soft_pin_action = SoftPinAction::Enable;
                c.soft_pin_ttl_ms = Some(self.rng.u64(1..60_000));
            }
            2 => c.soft_pin_action = SoftPinAction::Enable,
            3 => c.with_hard_pin = true,
            _ => {}
        }
        c
    }

    fn source_and_target(&mut self, key: &str, tenant: &str) -> Option<(String, String)> {
        let names: Vec<String> = self
            .a
            .all_replica_descriptors(key, tenant)
            .ok()?
            .iter()
            .filter_map(|d| d.memory())
            .map(|m| m.transport_endpoint.trim_start_matches("ep-").to_string())
            .collect();
        let source = names.first()?.clone();
        let target = format!("s{}", self.rng.u64(1..=SEGMENTS));
        Some((source, target))
    }

    /// A copy or a move of `key`, then its End, its Revoke, or nothing (left to the reaper).
    fn copy_or_move(&mut self, client: ClientId, key: &str, tenant: &str) {
        let Some((source, target)) = self.source_and_target(key, tenant) else {
            return;
        };
        let a = &self.a;
        let finish = self.rng.u8(..4);
        if self.rng.bool() {
            if a.copy_start(client, key, tenant, &source, &[target])
                .is_ok()
            {
                let _ = match finish {
                    0 | 1 => a.copy_end(client, key, tenant),
                    2 => a.copy_revoke(client, key, tenant),
                    _ => Ok(()),
                };
            }
        } else if a.move_start(client, key, tenant, &source, &target).is_ok() {
            let _ = match finish {
                0 | 1 => a.move_end(client, key, tenant),
                2 => a.move_revoke(client, key, tenant),
                _ => Ok(()),
            };
        }
    }

    /// One random operation on A. Results are not checked here: only that B can follow.
    fn step(&mut self) {
        let key = self.key();
        let tenant = self.tenant();
        let client = self.client();
        let a = &self.a;
        match self.rng.u8(..40) {
            0..=6 => {
                let config = self.put_config();
                let size = self.rng.u64(1..2048);
                let a = &self.a;
                if a.put_start(client, &key, size, &config, tenant).is_ok() && self.rng.u8(..4) != 0
                {
                    let _ = a.put_end(client, &ObjectMeta::new(&key), ReplicaType::ALL, tenant);
                }
            }
            7..=9 => {
                let mut meta = ObjectMeta::new(&key);
                meta.object_checksum = self.rng.bool().then_some(42);
                let _ = a.put_end(client, &meta, ReplicaType::ALL, tenant);
            }
            10 => {
                let _ = a.put_revoke(client, &key, ReplicaType::ALL, tenant);
            }
            11 | 12 => {
                let size = self.rng.u64(1..4096);
                let config = cfg(self.rng.usize(1..=2));
                let end = self.rng.u8(..3) != 0;
                let a = &self.a;
                if a.upsert_start(client, &key, size, &config, tenant).is_ok() && end {
                    let _ = a.upsert_end(client, &ObjectMeta::new(&key), ReplicaType::ALL, tenant);
                }
            }
            13 | 14 => {
                let _ = a.remove(&key, self.rng.bool(), tenant);
            }
            15 => {
                let keys: Vec<String> = (0..4).map(|_| self.key()).collect();
                let _ = self.a.batch_remove(&keys, self.rng.bool(), tenant);
            }
            16 => {
                let pattern = format!("^k{}", self.rng.u8(..3));
                let _ = a.remove_by_regex(&pattern, self.rng.bool(), tenant);
            }
            17 if self.rng.u8(..4) == 0 => {
                let _ = a.remove_all(self.rng.bool(), "");
            }
            18 => {
                let keys: Vec<String> = (0..3).map(|_| self.key()).collect();
                let sizes: Vec<u64> = keys.iter().map(|_| self.rng.u64(1..2048)).collect();
                let a = &self.a;
                let _ = a.batch_put_start(client, &keys, &sizes, &cfg(2), tenant);
                let metas: Vec<ObjectMeta> = keys.iter().map(ObjectMeta::new).collect();
                let _ = a.batch_put_end(client, &metas, ReplicaType::ALL, tenant);
            }
            19 => {
                let keys: Vec<String> = (0..4).map(|_| self.key()).collect();
                let name = match self.rng.u8(..2) {
                    0 => String::new(),
                    _ => format!("s{}", self.rng.u64(1..=SEGMENTS)),
                };
                let _ = self.a.batch_replica_clear(&keys, client, &name, tenant);
            }
            20..=22 => self.copy_or_move(client, &key, tenant),
            23 | 24 => {
                let _ = a.get_replica_list(&key, tenant);
                let keys: Vec<String> = (0..4).map(|_| self.key()).collect();
                let _ = self.a.batch_get_replica_list(&keys, tenant);
            }
            25 | 26 => {
                self.a.run_eviction_once();
            }
            27..=29 => self.advance(),
            30 => {
                self.a.run_put_timeouts_once();
            }
            31 => {
                self.a.run_soft_pin_expiry_once();
                self.a.release_discarded_once();
            }
            32 => {
                let s = self.rng.u64(1..=SEGMENTS);
                let id = self.segment(s).id;
                let _ = self.a.unmount_segment(id, owner(s));
                self.generation[s as usize] += 1;
            }
            33 => {
                let s = self.rng.u64(1..=SEGMENTS);
                self.mount(s);
            }
            34 => {
                let s = self.rng.u64(1..=SEGMENTS);
                let id = self.segment(s).id;
                let grace = self.rng.u64(0..20_000);
                let _ = self.a.graceful_unmount_segment(id, owner(s), grace);
                self.a.run_graceful_unmounts_once();
            }
            35 => {
                let s = self.rng.u64(1..=SEGMENTS);
                let id = self.segment(s).id;
                let status = [
                    SegmentStatus::OK,
                    SegmentStatus::DRAINING,
                    SegmentStatus::DRAINED,
                ][self.rng.usize(..3)];
                let _ = self.a.set_segment_status(id, status);
            }
            36 => {
                // Client 2 dies (stops pinging) or comes back and re-mounts its segments.
                if self.c2_dead {
                    self.c2_dead = false;
                    let segments: Vec<Segment> = (3..=SEGMENTS).map(|s| self.segment(s)).collect();
                    let _ = self.a.remount_segments(&segments, C2);
                } else {
                    self.c2_dead = true;
                }
            }
            37 if !tenant.is_empty() => {
                if self.rng.bool() {
                    let quota = self.rng.u64(4096..32 * 1024);
                    let _ = self.a.set_tenant_quota(tenant, quota);
                } else {
                    let _ = self.a.delete_tenant_quota(tenant);
                }
            }
            _ => {
                let _ = a.exist_key(&key, tenant);
            }
        }
    }

    /// Moves the clock, pings from the live clients and runs the client monitor (a dead client
    /// expires once its last deadline has passed).
    fn advance(&mut self) {
        let ms = [1, 500, 5_000, 11_000, 31_000, 600_000][self.rng.usize(..6)];
        self.clock.advance(ms);
        let _ = self.a.ping(C1);
        if !self.c2_dead {
            let _ = self.a.ping(C2);
        }
        self.a.run_client_monitor_once();
        if self.c2_dead {
            // Its segments are gone: a later mount gets fresh ids.
            for s in 3..=SEGMENTS {
                if self
                    .a
                    .query_segment_status_by_id(self.segment(s).id)
                    .is_err()
                {
                    self.generation[s as usize] += 1;
                }
            }
        }
    }

    /// Applies what B has not seen yet, then compares the two masters.
    fn check(&mut self, when: &str) {
        let pending: Vec<Mutation> = self.log.0.lock().unwrap()[self.applied..].to_vec();
        for (i, m) in pending.iter().enumerate() {
            if let Err(e) = self.b.apply(m) {
                panic!(
                    "{when}: mutation #{} {m:?} does not apply: {e}",
                    self.applied + i
                );
            }
        }
        self.applied += pending.len();
        let (sa, sb) = (self.a.export_state(), self.b.export_state());
        if sa != sb {
            let first = sa
                .objects
                .iter()
                .zip(&sb.objects)
                .find(|(x, y)| x != y)
                .map(|(x, y)| format!("first difference:\n  A {x:?}\n  B {y:?}"))
                .unwrap_or_default();
            panic!(
                "{when}: exports differ ({} vs {} objects, {} vs {} segments, {} vs {} \
                 discarded)\n{first}\nA segments {:?}\nB segments {:?}",
                sa.objects.len(),
                sb.objects.len(),
                sa.segments.len(),
                sb.segments.len(),
                sa.discarded.len(),
                sb.discarded.len(),
                sa.segments,
                sb.segments,
            );
        }
        // The export loaded into an empty master is the same state again (a snapshot of the
        // log's fold, loaded to replay the log after it).
        let c = MasterService::new(self.b.config().clone(), self.clock.clone()).unwrap();
        c.load_state(&sa)
            .unwrap_or_else(|e| panic!("{when}: the export does not load: {e}"));
        assert!(c.export_state() == sa, "{when}: a loaded export differs");
        for s in &sa.segments {
            let id = s.segment.id;
            assert_eq!(
                self.a.segment_free_ranges(id),
                c.segment_free_ranges(id),
                "{when}: free ranges of segment {id} after a load"
            );
            assert_eq!(
                self.a.segment_free_ranges(id),
                self.b.segment_free_ranges(id),
                "{when}: free ranges of segment {id}"
            );
        }
        let usage = |m: &MasterService| -> Vec<_> {
            m.segment_usage()
                .into_iter()
                .filter(|u| u.used_bytes.is_some())
                .map(|u| (u.id, u.status, u.used_bytes, u.live_buffers))
                .collect()
        };
        assert_eq!(usage(&self.a), usage(&self.b), "{when}: segment usage");
        self.compare_quotas(when);
        for m in [&self.a, &self.b] {
            assert_accounting(m);
            if m.config().enable_multi_tenants {
                for (tenant, charged, held) in m.check_quota_accounting() {
                    assert_eq!(charged, held, "{when}: quota of {tenant}");
                }
            }
        }
    }
}

impl World {
    /// Tenant snapshots agree, except that A still charges in-flight replicas on dead segments
    /// (dropped lazily by the writer's next call or the reaper), which no record carries.
    fn compare_quotas(&self, when: &str) {
        let (Ok(qa), Ok(qb)) = (
            self.a.list_tenant_quotas(None),
            self.b.list_tenant_quotas(None),
        ) else {
            return;
        };
        assert_eq!(qa.len(), qb.len(), "{when}: tenants {qa:?} vs {qb:?}");
        for (x, y) in qa.iter().zip(&qb) {
            let tenant = if x.tenant_id == "default" {
                ""
            } else {
                x.tenant_id.as_str()
            };
            let dead: u64 = (0..KEYS)
                .filter_map(|k| self.a.object_info(&format!("k{k}"), tenant).ok().flatten())
                .map(|info| info.size * info.replicas.iter().filter(|r| !r.3).count() as u64)
                .sum();
            assert_eq!(
                (
                    &x.tenant_id,
                    x.requested_quota_bytes,
                    x.effective_quota_bytes,
                    x.admission_closed,
                    x.charged_bytes - dead
                ),
                (
                    &y.tenant_id,
                    y.requested_quota_bytes,
                    y.effective_quota_bytes,
                    y.admission_closed,
                    y.charged_bytes
                ),
                "{when}: quota of {}",
                x.tenant_id
            );
        }
    }
}

fn kind(m: &Mutation) -> &'static str {
    match m {
        Mutation::Object(_) => "Object",
        Mutation::Erase { .. } => "Erase",
        Mutation::SegmentMounted { .. } => "SegmentMounted",
        Mutation::SegmentStatus { .. } => "SegmentStatus",
        Mutation::GracefulUnmount { .. } => "GracefulUnmount",
        Mutation::SegmentUnmounted { .. } => "SegmentUnmounted",
        Mutation::TenantPolicy(_) => "TenantPolicy",
        Mutation::Discarded(_) => "Discarded",
        Mutation::DiscardedReleased { .. } => "DiscardedReleased",
    }
}

/// Independent workloads per test, seeded `seed`, `seed + 1`, ...
const ROUNDS: u64 = 4;

fn run(multi_tenant: bool) {
    let seed = test_seed();
    for round in 0..ROUNDS {
        run_one(seed.wrapping_add(round), multi_tenant);
    }
}

fn run_one(seed: u64, multi_tenant: bool) {
    let mut w = World::new(seed, multi_tenant);
    for i in 0..STEPS {
        w.step();
        if i % CHECK_EVERY == CHECK_EVERY - 1 {
            w.check(&format!("after step {i}"));
        }
    }
    // Let every timer fire, then everything must still agree.
    w.clock.advance(700_000);
    w.a.run_put_timeouts_once();
    w.a.run_soft_pin_expiry_once();
    w.a.run_eviction_once();
    w.check("at the end");
    // The workload must really exercise the seam: most kinds of mutation seen, many objects.
    let log = w.log.0.lock().unwrap();
    let kinds: std::collections::BTreeSet<&str> = log.iter().map(kind).collect();
    if std::env::var("MC_REPLAY_STATS").is_ok() {
        let mut hist = std::collections::BTreeMap::<&str, usize>::new();
        for m in log.iter() {
            *hist.entry(kind(m)).or_default() += 1;
        }
        eprintln!("seed {seed}: {hist:?}");
    }
    let objects = log
        .iter()
        .filter(|m| matches!(m, Mutation::Object(_)))
        .count();
    assert!(objects > STEPS / 8, "too few object records: {objects}");
    for want in [
        "Object",
        "Erase",
        "SegmentMounted",
        "SegmentUnmounted",
        "Discarded",
    ] {
        assert!(
            kinds.contains(want),
            "no {want} mutation observed: {kinds:?}"
        );
    }
    if multi_tenant {
        assert!(kinds.contains("TenantPolicy"), "{kinds:?}");
    }
}

#[test]
fn replayed_mutations_rebuild_the_same_state_single_tenant() {
    run(false);
}

#[test]
fn replayed_mutations_rebuild_the_same_state_multi_tenant() {
    run(true);
}

#[test]
fn apply_refuses_what_does_not_fit_and_erase_is_idempotent() {
    use mooncake_master::mutation::{BufferRecord, ReplicaPlace};
    use mooncake_master::{ApplyError, ObserverAlreadySet};

    let (_, a) = master();
    let log = Arc::new(Recorder::default());
    a.set_observer(log.clone()).unwrap();
    assert_eq!(a.set_observer(log.clone()), Err(ObserverAlreadySet));
    a.mount_segment(&seg(1, "s1", 4096), C1).unwrap();
    put(&a, C1, "k", 100, 1);
    let (_, b) = master();
    let recorded = log.0.lock().unwrap().clone();
    for m in &recorded {
        b.apply(m).unwrap();
    }
    assert_eq!(a.export_state(), b.export_state());
    let Some(Mutation::Object(record)) = recorded.last().cloned() else {
        panic!("the last mutation should be PutEnd's record: {recorded:?}");
    };
    // Another key on the same range: the allocator refuses the overlap, nothing changes.
    let mut other = record.clone();
    other.key = "other".into();
    assert!(matches!(
        b.apply(&Mutation::Object(other.clone())),
        Err(ApplyError::Claim { .. })
    ));
    assert_eq!(a.export_state(), b.export_state());
    // A segment that is not mounted.
    let ReplicaPlace::Memory(buffer) = other.replicas[0].place.clone() else {
        panic!("a memory replica: {other:?}");
    };
    other.replicas[0].place = ReplicaPlace::Memory(BufferRecord {
        segment: SegmentId::new(99, 0),
        ..buffer
    });
    assert_eq!(
        b.apply(&Mutation::Object(other.clone())),
        Err(ApplyError::UnknownSegment(SegmentId::new(99, 0)))
    );
    other.replicas.clear();
    assert!(matches!(
        b.apply(&Mutation::Object(other)),
        Err(ApplyError::EmptyObject { .. })
    ));
    assert_eq!(
        b.apply(&Mutation::SegmentUnmounted {
            id: SegmentId::new(99, 0)
        }),
        Err(ApplyError::UnknownSegment(SegmentId::new(99, 0)))
    );
    assert!(matches!(
        b.apply(&Mutation::TenantPolicy(TenantPolicy::default())),
        Err(ApplyError::Refused { .. })
    ));
    // Re-applying a record is a no-op; erasing twice too.
    b.apply(&Mutation::Object(record.clone())).unwrap();
    assert_eq!(a.export_state(), b.export_state());
    let erase = Mutation::Erase {
        tenant: None,
        key: "k".into(),
    };
    b.apply(&erase).unwrap();
    b.apply(&erase).unwrap();
    assert_eq!(b.export_state().objects, vec![]);
    assert_eq!(
        used(&b, 1),
        Some(0),
        "the erased object's buffer is free again"
    );
}
