//! Model-based property tests. Random sequences of mount / unmount / graceful unmount /
//! put-start / put-end / revoke / upsert / get / batch get / exist / remove / batch remove /
//! remove-all / ping / remount / client monitor / eviction / advance-clock / reaper steps run
//! against the master and a small reference model; after every step the visible keys, every object's lease and every segment's
//! `used` bytes must agree with the model, and the master's own accounting check (no overlapping
//! buffers, used = Σ live buffers) must pass. A second property drives one allocator directly with
//! random sizes. The master's own random choices are seeded from `MC_TEST_SEED` (printed on
//! failure; proptest keeps the failing operations in its regression file).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use mooncake_common::{
    ClientId, ClientStatus, Clock, ErrorCode, ManualClock, ObjectMeta, ReplicaType, SegmentId,
};
use mooncake_master::allocator::{SegmentAllocator, SegmentInfo};
use mooncake_master::MasterService;
use proptest::prelude::*;

const UNIT: u64 = 64;
const SEGMENTS: u64 = 3;
const SEG_UNITS: u64 = 6;
const KEYS: usize = 6;
const DISCARD_MS: u64 = 30_000;
const RELEASE_MS: u64 = 600_000;
const CLIENT_TTL_MS: u64 = 10_000;

#[derive(Debug, Clone)]
enum Op {
    Mount(u64),
    Graceful {
        seg: u64,
        grace_ms: u64,
    },
    RunGraceful,
    BatchGet(Vec<usize>),
    BatchRemove {
        keys: Vec<usize>,
        force: bool,
    },
    RemoveAll {
        force: bool,
    },
    Unmount(u64),
    PutStart {
        key: usize,
        client: u64,
        replicas: usize,
        units: u64,
    },
    PutEnd {
        key: usize,
        client: u64,
    },
    Revoke {
        key: usize,
        client: u64,
    },
    Get(usize),
    Exist(usize),
    Remove {
        key: usize,
        force: bool,
    },
    Advance(u64),
    Reap,
    ReleaseDiscarded,
    Upsert {
        key: usize,
        client: u64,
        units: u64,
    },
    Ping(u64),
    Remount,
    Monitor,
    Evict,
}

fn op(uniform: bool) -> impl Strategy<Value = Op> {
    let units = if uniform {
        Just(1u64).boxed()
    } else {
        (1u64..=3).boxed()
    };
    prop_oneof![
        1 => (1..=SEGMENTS).prop_map(Op::Mount),
        1 => (1..=SEGMENTS, prop_oneof![Just(0u64), Just(5_000), Just(40_000)])
            .prop_map(|(seg, grace_ms)| Op::Graceful { seg, grace_ms }),
        1 => Just(Op::RunGraceful),
        2 => prop::collection::vec(0..KEYS, 0..8).prop_map(Op::BatchGet),
        1 => (prop::collection::vec(0..KEYS, 0..6), any::<bool>())
            .prop_map(|(keys, force)| Op::BatchRemove { keys, force }),
        1 => any::<bool>().prop_map(|force| Op::RemoveAll { force }),
        1 => (1..=SEGMENTS).prop_map(Op::Unmount),
        6 => (0..KEYS, 1u64..=2, 1usize..=3, units.clone())
            .prop_map(|(key, client, replicas, units)| Op::PutStart { key, client, replicas, units }),
        5 => (0..KEYS, 1u64..=2).prop_map(|(key, client)| Op::PutEnd { key, client }),
        1 => (0..KEYS, 1u64..=2).prop_map(|(key, client)| Op::Revoke { key, client }),
        3 => (0..KEYS).prop_map(Op::Get),
        2 => (0..KEYS).prop_map(Op::Exist),
        2 => (0..KEYS, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        3 => prop_oneof![Just(1u64), Just(5_000), Just(10_000), Just(31_000), Just(600_000)]
            .prop_map(Op::Advance),
        1 => Just(Op::Reap),
        1 => Just(Op::ReleaseDiscarded),
        2 => (0..KEYS, 1u64..=2, units)
            .prop_map(|(key, client, units)| Op::Upsert { key, client, units }),
        2 => (1u64..=2).prop_map(Op::Ping),
        1 => Just(Op::Remount),
        2 => Just(Op::Monitor),
        3 => Just(Op::Evict),
    ]
}

#[derive(Debug, Clone)]
struct ModelObject {
    writer: u64,
    size: u64,
    complete: bool,
    put_start_ms: u64,
    lease_ms: u64,
    last_access_ms: u64,
    /// Segment of each live replica.
    segs: Vec<u64>,
}

#[derive(Debug, Default)]
struct Model {
    /// Mounted segments; `Some(deadline)` while gracefully unmounting.
    mounted: BTreeMap<u64, Option<u64>>,
    objects: BTreeMap<usize, ModelObject>,
    /// (segment, bytes, release_at)
    discarded: Vec<(u64, u64, u64)>,
    /// Clients made OK by ReMount; pings waiting for the monitor; client deadlines.
    ok_clients: std::collections::BTreeSet<u64>,
    pinged: Vec<u64>,
    deadlines: BTreeMap<u64, u64>,
    need_eviction: bool,
}

impl Model {
    /// A start tracks its writer as a first heartbeat would; a tracked client keeps its deadline.
    fn track(&mut self, c: u64, now: u64) {
        self.deadlines.entry(c).or_insert(now + CLIENT_TTL_MS);
    }

    fn used(&self, seg: u64) -> u64 {
        let live: u64 = self
            .objects
            .values()
            .map(|o| o.segs.iter().filter(|&&s| s == seg).count() as u64 * o.size)
            .sum();
        let discarded: u64 = self
            .discarded
            .iter()
            .filter(|d| d.0 == seg)
            .map(|d| d.1)
            .sum();
        live + discarded
    }

    fn unmount(&mut self, id: u64) {
        self.mounted.remove(&id);
        for o in self.objects.values_mut() {
            o.segs.retain(|&s| s != id);
        }
        self.objects.retain(|_, o| !o.segs.is_empty());
        self.discarded.retain(|d| d.0 != id);
    }

    /// Remove's checks, in upstream's order.
    fn remove(&mut self, k: usize, force: bool, now: u64) -> Result<(), ErrorCode> {
        match self.objects.get(&k) {
            None => Err(ErrorCode::OBJECT_NOT_FOUND),
            Some(o) if !force && now < o.lease_ms => Err(ErrorCode::OBJECT_HAS_LEASE),
            Some(o) if !o.complete => Err(ErrorCode::REPLICA_IS_NOT_READY),
            Some(_) => {
                self.objects.remove(&k);
                Ok(())
            }
        }
    }

    fn free(&self, seg: u64) -> u64 {
        SEG_UNITS * UNIT - self.used(seg)
    }

    /// Segments a new allocation of `size` may use.
    fn fits(&self, size: u64) -> Vec<u64> {
        self.mounted
            .iter()
            .filter(|(_, graceful)| graceful.is_none())
            .map(|(s, _)| *s)
            .filter(|&s| self.free(s) >= size)
            .collect()
    }

    fn ok_names(&self) -> usize {
        self.mounted.values().filter(|g| g.is_none()).count()
    }

    /// Checks a fresh allocation's descriptors and records the new PROCESSING object.
    #[allow(clippy::too_many_arguments)]
    fn record_alloc(
        &mut self,
        got: Result<Vec<mooncake_common::ReplicaDescriptor>, ErrorCode>,
        k: usize,
        c: u64,
        size: u64,
        replicas: usize,
        now: u64,
        uniform: bool,
        op: &Op,
    ) {
        let fits = self.fits(size);
        match got {
            Ok(descs) => {
                let segs: Vec<u64> = descs
                    .iter()
                    .map(|d| seg_of_endpoint(&d.memory().unwrap().transport_endpoint))
                    .collect();
                let mut distinct = segs.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), segs.len(), "replicas on distinct names");
                assert!(!segs.is_empty() && segs.len() <= replicas);
                for s in &segs {
                    assert_eq!(self.mounted.get(s), Some(&None), "allocated on non-OK {s}");
                    assert!(self.free(*s) >= size, "allocated beyond capacity on {s}");
                }
                if uniform {
                    assert_eq!(segs.len(), replicas.min(fits.len()), "best effort count");
                }
                self.objects.insert(
                    k,
                    ModelObject {
                        writer: c,
                        size,
                        complete: false,
                        put_start_ms: now,
                        lease_ms: 0,
                        last_access_ms: now,
                        segs,
                    },
                );
            }
            Err(code) => {
                assert_eq!(code, ErrorCode::NO_AVAILABLE_HANDLE, "{op:?}");
                if uniform {
                    assert!(fits.is_empty(), "failed although {fits:?} had room");
                }
                if self.ok_names() >= replicas {
                    self.need_eviction = true;
                }
            }
        }
    }
}

fn key(k: usize) -> String {
    format!("key-{k}")
}

fn client(c: u64) -> ClientId {
    ClientId::new(c, c)
}

fn segment(id: u64) -> mooncake_common::Segment {
    seg(id, &format!("s{id}"), SEG_UNITS * UNIT)
}

fn seg_of_endpoint(endpoint: &str) -> u64 {
    endpoint.trim_start_matches("ep-s").parse().unwrap()
}

fn step(m: &MasterService, clock: &ManualClock, model: &mut Model, op: &Op, uniform: bool) {
    let now = clock.now_ms();
    match *op {
        Op::Mount(id) => mount(m, model, op, id),
        Op::Unmount(id) => {
            assert_eq!(m.unmount_segment(SegmentId::new(id, 0), client(1)), Ok(()));
            model.unmount(id);
        }
        Op::Graceful { seg: id, grace_ms } => graceful(m, model, op, id, grace_ms, now),
        Op::RunGraceful => run_graceful(m, model, op, now),
        Op::BatchGet(ref ks) => {
            let names: Vec<String> = ks.iter().map(|&k| key(k)).collect();
            let got = m.batch_get_replica_list(&names, "");
            assert_eq!(got.len(), ks.len());
            for (&k, result) in ks.iter().zip(got) {
                match model.objects.get_mut(&k) {
                    None => assert_eq!(result, Err(ErrorCode::OBJECT_NOT_FOUND)),
                    Some(o) if !o.complete => {
                        assert_eq!(result, Err(ErrorCode::REPLICA_IS_NOT_READY))
                    }
                    Some(o) => {
                        assert_eq!(result.unwrap().replicas.len(), o.segs.len(), "{op:?}");
                        o.lease_ms = o.lease_ms.max(now + LEASE_MS);
                        o.last_access_ms = now;
                    }
                }
            }
        }
        Op::BatchRemove { ref keys, force } => {
            let names: Vec<String> = keys.iter().map(|&k| key(k)).collect();
            let got = m.batch_remove(&names, force, "");
            let expected: Vec<_> = keys.iter().map(|&k| model.remove(k, force, now)).collect();
            assert_eq!(got, expected, "{op:?}");
        }
        Op::RemoveAll { force } => remove_all(m, model, op, force, now),
        Op::PutStart {
            key: k,
            client: c,
            replicas,
            units,
        } => {
            let size = units * UNIT;
            let got = m.put_start(client(c), &key(k), size, &cfg(replicas), "");
            model.track(c, now);
            if let Some(o) = model.objects.get(&k) {
                if o.complete {
                    assert_eq!(got, Err(ErrorCode::OBJECT_ALREADY_EXISTS), "{op:?}");
                    return;
                }
                if o.put_start_ms + DISCARD_MS >= now {
                    assert_eq!(got, Err(ErrorCode::REPLICA_IS_NOT_READY), "{op:?}");
                    return;
                }
                let o = model.objects.remove(&k).unwrap();
                for s in o.segs {
                    model
                        .discarded
                        .push((s, o.size, o.put_start_ms + RELEASE_MS));
                }
            }
            model.record_alloc(got, k, c, size, replicas, now, uniform, op);
        }
        Op::PutEnd { key: k, client: c } => {
            let got = m.put_end(client(c), &ObjectMeta::new(key(k)), ReplicaType::ALL, "");
            let expected = match model.objects.get_mut(&k) {
                None => Err(ErrorCode::OBJECT_NOT_FOUND),
                Some(o) if o.writer != c => Err(ErrorCode::ILLEGAL_CLIENT),
                Some(o) => {
                    if !o.complete {
                        o.complete = true;
                        o.lease_ms = o.lease_ms.max(now);
                        o.last_access_ms = now;
                    }
                    Ok(())
                }
            };
            assert_eq!(got, expected, "{op:?}");
        }
        Op::Revoke { key: k, client: c } => {
            let got = m.put_revoke(client(c), &key(k), ReplicaType::ALL, "");
            let expected = match model.objects.get(&k) {
                None => Err(ErrorCode::OBJECT_NOT_FOUND),
                Some(o) if o.writer != c => Err(ErrorCode::ILLEGAL_CLIENT),
                Some(o) if o.complete => Err(ErrorCode::INVALID_WRITE),
                Some(_) => {
                    model.objects.remove(&k);
                    Ok(())
                }
            };
            assert_eq!(got, expected, "{op:?}");
        }
        Op::Get(k) => {
            let got = m.get_replica_list(&key(k), "");
            match model.objects.get_mut(&k) {
                None => assert_eq!(got, Err(ErrorCode::OBJECT_NOT_FOUND)),
                Some(o) if !o.complete => assert_eq!(got, Err(ErrorCode::REPLICA_IS_NOT_READY)),
                Some(o) => {
                    let resp = got.unwrap();
                    let mut segs: Vec<u64> = resp
                        .replicas
                        .iter()
                        .map(|d| seg_of_endpoint(&d.memory().unwrap().transport_endpoint))
                        .collect();
                    segs.sort_unstable();
                    let mut want = o.segs.clone();
                    want.sort_unstable();
                    assert_eq!(segs, want, "{op:?}");
                    assert_eq!(resp.lease_ttl_ms, LEASE_MS);
                    o.lease_ms = o.lease_ms.max(now + LEASE_MS);
                    o.last_access_ms = now;
                }
            }
        }
        Op::Exist(k) => {
            let got = m.exist_key(&key(k), "").unwrap();
            let want = model.objects.get_mut(&k).is_some_and(|o| {
                if o.complete {
                    o.lease_ms = o.lease_ms.max(now + LEASE_MS);
                    o.last_access_ms = now;
                }
                o.complete
            });
            assert_eq!(got, want, "{op:?}");
        }
        Op::Remove { key: k, force } => {
            let got = m.remove(&key(k), force, "");
            assert_eq!(got, model.remove(k, force, now), "{op:?}");
        }
        Op::Advance(ms) => {
            clock.advance(ms);
        }
        Op::Reap => reap(m, model, op, now),
        Op::ReleaseDiscarded => {
            let before = model.discarded.len();
            model.discarded.retain(|d| d.2 > now);
            assert_eq!(m.release_discarded_once(), before - model.discarded.len());
        }
        Op::Upsert {
            key: k,
            client: c,
            units,
        } => upsert(m, model, op, (k, c, units), now, uniform),
        Op::Ping(c) => ping(m, model, op, c),
        Op::Remount => {
            m.remount_segments(&[], client(1)).unwrap();
            model.pinged.push(1);
            model.ok_clients.insert(1);
        }
        Op::Monitor => monitor(m, model, op, now),
        Op::Evict => evict(m, model, now, op),
    }
}

/// GracefulUnmountSegment: a deadline for a mounted segment (a repeat keeps the first one).
fn graceful(m: &MasterService, model: &mut Model, op: &Op, id: u64, grace_ms: u64, now: u64) {
    let got = m.graceful_unmount_segment(SegmentId::new(id, 0), client(1), grace_ms);
    let client_has_segments = !model.mounted.is_empty();
    let expected = match model.mounted.get_mut(&id) {
        None if !client_has_segments => Err(ErrorCode::SEGMENT_NOT_FOUND),
        None => Err(ErrorCode::INVALID_PARAMS),
        Some(Some(_)) => Ok(()),
        Some(state) => {
            *state = Some(now + grace_ms);
            Ok(())
        }
    };
    assert_eq!(got, expected, "{op:?}");
}

/// The graceful-unmount step: every segment whose deadline passed is unmounted.
fn run_graceful(m: &MasterService, model: &mut Model, op: &Op, now: u64) {
    let due: Vec<u64> = model
        .mounted
        .iter()
        .filter(|(_, d)| d.is_some_and(|d| d <= now))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(m.run_graceful_unmounts_once(), due.len(), "{op:?}");
    for id in due {
        model.unmount(id);
    }
}

/// RemoveAll: every complete object goes, leased ones only when forced.
fn remove_all(m: &MasterService, model: &mut Model, op: &Op, force: bool, now: u64) {
    let doomed: Vec<usize> = model
        .objects
        .iter()
        .filter(|(_, o)| o.complete && (force || now >= o.lease_ms))
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(m.remove_all(force, ""), doomed.len() as i64, "{op:?}");
    for k in doomed {
        model.objects.remove(&k);
    }
}

/// The put-timeout reaper: puts older than the release timeout go; due discards are released.
fn reap(m: &MasterService, model: &mut Model, op: &Op, now: u64) {
    let report = m.run_put_timeouts_once();
    let stale: Vec<usize> = model
        .objects
        .iter()
        .filter(|(_, o)| !o.complete && o.put_start_ms + RELEASE_MS <= now)
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(report.reaped_puts, stale.len(), "{op:?}");
    for k in stale {
        model.objects.remove(&k);
    }
    model.discarded.retain(|d| d.2 > now);
}

/// UpsertStart: a same-size rewrite keeps the replicas; otherwise the old buffers are discarded
/// and new ones placed.
fn upsert(
    m: &MasterService,
    model: &mut Model,
    op: &Op,
    (k, c, units): (usize, u64, u64),
    now: u64,
    uniform: bool,
) {
    let size = units * UNIT;
    let got = m.upsert_start(client(c), &key(k), size, &cfg(2), "");
    model.track(c, now);
    if let Some(o) = model.objects.get_mut(&k) {
        if o.complete && o.size == size {
            // Same size: rewritten in place, same replicas, unreadable until End.
            let got = got.unwrap();
            let mut segs: Vec<u64> = got
                .iter()
                .map(|d| seg_of_endpoint(&d.memory().unwrap().transport_endpoint))
                .collect();
            segs.sort_unstable();
            let mut want = o.segs.clone();
            want.sort_unstable();
            assert_eq!(segs, want, "{op:?}");
            o.complete = false;
            o.writer = c;
            o.put_start_ms = now;
            return;
        }
        // In flight, or a different size: the old buffers are discarded at once.
        let o = model.objects.remove(&k).unwrap();
        for s in o.segs {
            model.discarded.push((s, o.size, now + RELEASE_MS));
        }
    }
    model.record_alloc(got, k, c, size, 2, now, uniform, op);
}

/// The client monitor: clients silent past their TTL expire, client 1's segments with them.
fn monitor(m: &MasterService, model: &mut Model, op: &Op, now: u64) {
    for c in model.pinged.drain(..) {
        model.deadlines.insert(c, now + CLIENT_TTL_MS);
    }
    let expired: Vec<u64> = model
        .deadlines
        .iter()
        .filter(|(_, &d)| d < now)
        .map(|(&c, _)| c)
        .collect();
    assert_eq!(m.run_client_monitor_once(), expired.len(), "{op:?}");
    for c in expired {
        model.deadlines.remove(&c);
        model.ok_clients.remove(&c);
        // Its writes in flight are reaped at once: the keys are free, the space too.
        model.objects.retain(|_, o| o.complete || o.writer != c);
        if c == 1 {
            // Client 1 owns every segment.
            let ids: Vec<u64> = model.mounted.keys().copied().collect();
            for id in ids {
                model.unmount(id);
            }
        }
    }
}

/// MountSegment by client 1: refused while the segment is mounted.
fn mount(m: &MasterService, model: &mut Model, op: &Op, id: u64) {
    model.pinged.push(1);
    let got = m.mount_segment(&segment(id), client(1));
    if let Some(Some(_)) = model.mounted.get(&id) {
        assert_eq!(got, Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS), "{op:?}");
    } else {
        assert_eq!(got, Ok(()), "{op:?}");
        model.mounted.entry(id).or_insert(None);
    }
}

/// Ping: a client the master does not know as OK is told to re-mount.
fn ping(m: &MasterService, model: &mut Model, op: &Op, c: u64) {
    let got = m.ping(client(c)).unwrap().client_status;
    let want = if model.ok_clients.contains(&c) {
        ClientStatus::OK
    } else {
        ClientStatus::NEED_REMOUNT
    };
    assert_eq!(got, want, "{op:?}");
    model.pinged.push(c);
}

/// One eviction cycle: the model predicts whether it runs and how many objects go (the exact
/// victims among equal access times depend on shard order), then checks that every victim was
/// an unleased complete object no more recently accessed than any surviving candidate.
fn evict(m: &MasterService, model: &mut Model, now: u64, op: &Op) {
    let cap = model.mounted.len() as u64 * SEG_UNITS * UNIT;
    let used: u64 = model.mounted.keys().map(|&s| model.used(s)).sum();
    let usage = if cap == 0 {
        0.0
    } else {
        used as f64 / cap as f64
    };
    let (hw, ratio): (f64, f64) = (0.90, 0.05);
    assert_eq!(m.need_eviction(), model.need_eviction, "flag before {op:?}");
    let report = m.run_eviction_once();
    let triggered = usage > hw || (model.need_eviction && ratio > 0.0);
    assert_eq!(report.triggered, triggered, "{op:?} usage {usage}");
    if !triggered {
        assert_eq!(report.evicted_objects, 0);
        return;
    }
    let target = ratio.max(usage - hw + ratio);
    let lowerbound = (target * 0.5).max(usage - hw).min(target);
    let base = model.objects.values().filter(|o| o.complete).count();
    let mut plain: Vec<(u64, usize)> = model
        .objects
        .iter()
        .filter(|(_, o)| o.complete && now >= o.lease_ms)
        .map(|(k, o)| (o.last_access_ms, *k))
        .collect();
    plain.sort_unstable();
    assert_eq!(report.evictable_objects, base, "{op:?}");
    if base == 0 {
        assert_eq!(report.evicted_objects, 0);
        model.need_eviction = false;
        return;
    }
    let e1 = ((base as f64 * target).ceil() as usize).min(plain.len());
    let released = model.discarded.iter().filter(|d| d.2 <= now).count();
    model.discarded.retain(|d| d.2 > now);
    let need = ((base as f64 * lowerbound).ceil() as usize)
        .saturating_sub(e1)
        .saturating_sub(released);
    let e2 = need.min(plain.len() - e1);
    assert_eq!(report.released_discarded, released, "{op:?}");
    assert_eq!(report.evicted_objects, e1 + e2, "{op:?}");
    // The victims: model objects the master no longer has.
    let victims: Vec<usize> = model
        .objects
        .keys()
        .copied()
        .filter(|k| m.object_info(&key(*k), "").unwrap().is_none())
        .collect();
    assert_eq!(victims.len(), e1 + e2, "{op:?}");
    let oldest_kept = plain
        .iter()
        .filter(|(_, k)| !victims.contains(k))
        .map(|(t, _)| *t)
        .min()
        .unwrap_or(u64::MAX);
    for k in &victims {
        let o = &model.objects[k];
        assert!(
            o.complete && now >= o.lease_ms,
            "evicted a leased or in-flight {k}"
        );
        assert!(
            o.last_access_ms <= oldest_kept,
            "evicted {k} before an older candidate"
        );
    }
    for k in victims {
        model.objects.remove(&k);
    }
    if report.evicted_objects > 0 || released > 0 {
        model.need_eviction = false;
    }
    assert_eq!(m.need_eviction(), model.need_eviction, "{op:?}");
}

fn compare(m: &MasterService, model: &Model, history: &[Op]) {
    let visible: Vec<String> = model
        .objects
        .iter()
        .filter(|(_, o)| o.complete)
        .map(|(k, _)| key(*k))
        .collect();
    assert_eq!(
        m.get_all_keys("").unwrap(),
        visible,
        "visible keys after {history:?}"
    );
    assert_eq!(
        m.object_count(),
        model.objects.len(),
        "object count after {history:?}"
    );
    for (k, o) in &model.objects {
        let info = m.object_info(&key(*k), "").unwrap().unwrap();
        assert_eq!(
            info.lease_timeout_ms,
            o.lease_ms,
            "lease of {} after {history:?}",
            key(*k)
        );
        assert_eq!(info.processing, !o.complete);
    }
    for u in m.segment_usage() {
        let id = u.id.0.first;
        assert_eq!(
            u.used_bytes,
            Some(model.used(id)),
            "used of segment {id} after {history:?}"
        );
    }
    assert_eq!(m.segment_usage().len(), model.mounted.len());
    let report = m.check_accounting();
    assert!(
        report.problems.is_empty(),
        "{:?} after {history:?}",
        report.problems
    );
}

fn run(ops: &[Op], uniform: bool) {
    let clock = Arc::new(ManualClock::new(T0_MS));
    // The model is upstream's PutStart, which refuses a full store (inline eviction off; it has
    // its own tests in inline_eviction.rs, and the replay test runs it with the defaults).
    let config = mooncake_master::MasterServiceConfig {
        put_start_evict_budget: 0,
        ..Default::default()
    };
    let m = MasterService::with_seed(config, clock.clone(), test_seed()).unwrap();
    let mut model = Model::default();
    for i in 1..=SEGMENTS {
        step(&m, &clock, &mut model, &Op::Mount(i), uniform);
    }
    for (i, op) in ops.iter().enumerate() {
        step(&m, &clock, &mut model, op, uniform);
        compare(&m, &model, &ops[..=i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn master_agrees_with_the_model_uniform_sizes(ops in prop::collection::vec(op(true), 1..60)) {
        run(&ops, true);
    }

    #[test]
    fn master_agrees_with_the_model_mixed_sizes(ops in prop::collection::vec(op(false), 1..60)) {
        run(&ops, false);
    }

    /// One allocator under random allocate / free / rebuild: `used` is exact, free ranges are
    /// coalesced, nothing overlaps, and an allocation fails only when no free range fits.
    #[test]
    fn allocator_is_exact_and_fails_only_when_nothing_fits(
        ops in prop::collection::vec((0u8..4, 1u64..600), 1..200)
    ) {
        const CAP: u64 = 4096;
        let info = SegmentInfo {
            segment_id: SegmentId::new(1, 1),
            name: Arc::from("s"),
            endpoint: Arc::from("e"),
            protocol: Arc::from("tcp"),
            base: 1 << 20,
            capacity: CAP,
        };
        let mut alloc = SegmentAllocator::new(info.clone());
        let mut live = Vec::new();
        for (kind, n) in ops {
            match kind {
                0 | 1 => {
                    let largest = alloc.free_ranges().iter().map(|r| r.1).max().unwrap_or(0);
                    match alloc.allocate(n) {
                        Some(h) => live.push(h),
                        None => prop_assert!(largest < n, "refused {n} with a {largest} hole"),
                    }
                }
                2 if !live.is_empty() => {
                    let i = (n as usize) % live.len();
                    live.swap_remove(i);
                }
                _ => {
                    // Rebuild from the live ranges, as snapshot restore would.
                    let ranges: Vec<(u64, u64)> = live.iter().map(|h| (h.offset(), h.len())).collect();
                    let (fresh, handles) = SegmentAllocator::rebuild(info.clone(), &ranges).unwrap();
                    let old_free = alloc.free_ranges();
                    drop(std::mem::replace(&mut live, handles));
                    drop(std::mem::replace(&mut alloc, fresh));
                    prop_assert_eq!(alloc.free_ranges(), old_free);
                }
            }
            let sum: u64 = live.iter().map(|h| h.len()).sum();
            prop_assert_eq!(alloc.used_bytes(), sum);
            prop_assert_eq!(alloc.live_buffers(), live.len() as u64);
            let free = alloc.free_ranges();
            for w in free.windows(2) {
                prop_assert!(w[0].0 + w[0].1 < w[1].0, "free ranges not coalesced: {:?}", w);
            }
            let mut all: Vec<(u64, u64)> = live.iter().map(|h| (h.offset(), h.len())).collect();
            all.extend(free);
            all.sort_unstable();
            let mut end = 0;
            for (o, l) in all {
                prop_assert!(o == end, "gap or overlap at {}", o);
                end = o + l;
            }
            prop_assert_eq!(end, CAP);
        }
    }
}
