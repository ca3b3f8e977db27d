//! Concurrent stress: writer/reader/remover/upserter/copier threads on overlapping keys, plus a
//! thread that unmounts and re-mounts a segment, a client that repeatedly dies (stops pinging)
//! and re-mounts, and one that moves the clock and runs the background steps (put timeouts,
//! soft-pin expiry, eviction, client monitor, task cleanup), for a bounded time. Afterwards: every segment's `used` equals the sum of its live buffers,
//! nothing overlaps, cleaning everything up returns every byte, and no thread is stuck. The
//! workers' operations and the master's random choices are seeded from `MC_TEST_SEED` (printed on
//! failure; the thread interleaving is not reproducible).
//!
//! A hot standby follows the whole run: every mutation the master observes is applied to a second
//! master at once, in the observed order (the observer runs under the master's locks). It must
//! apply without error and end with the same export and the same allocators, which checks the
//! seam's ordering rules (emit before free, records against unmounts) under real concurrency.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use mooncake_common::{ClientId, ManualClock, ObjectMeta, ReplicaType, SegmentId};
use mooncake_master::{MasterService, Mutation, MutationObserver};

const RUN_FOR: Duration = Duration::from_millis(2_500);
const MIN_OPS: u64 = 1_000;
const MAX_RUN: Duration = Duration::from_secs(60);
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
const KEYS: u64 = 96;

/// Applies every observed mutation to its own master, in observed order.
#[derive(Debug)]
struct Standby {
    master: MasterService,
    /// Serializes the applies (and records the first failures).
    errors: std::sync::Mutex<Vec<String>>,
}

impl MutationObserver for Standby {
    fn observe(&self, m: &Mutation) {
        let mut errors = self.errors.lock().unwrap();
        if let Err(e) = self.master.apply(m) {
            if errors.len() < 8 {
                errors.push(format!("{e}: {m:?}"));
            }
        }
    }
}

/// The standby agrees with the master (which must be quiescent).
fn assert_standby_agrees(m: &MasterService, standby: &Standby, when: &str) {
    let errors = standby.errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{when}: mutations that did not apply: {errors:#?}"
    );
    let (a, mut b) = (m.export_state(), standby.master.export_state());
    assert_eq!(a.objects.len(), b.objects.len(), "{when}: object count");
    // Replica ids are compared through the objects. The counters may differ: an id handed to a
    // replica whose segment was unmounted before its object was observed is in no record, so the
    // standby never learns it (the id belonged to nothing that survives). The standby must still
    // never be ahead of the master, and never reuse an id it holds (`apply` keeps it above them).
    assert!(
        b.next_replica_id <= a.next_replica_id,
        "{when}: the standby's next replica id {} is ahead of the master's {}",
        b.next_replica_id,
        a.next_replica_id
    );
    let max_held = b
        .objects
        .iter()
        .flat_map(|o| o.replicas.iter().map(|r| r.id.0))
        .max()
        .unwrap_or(0);
    assert!(
        b.next_replica_id > max_held,
        "{when}: the standby would hand out id {} again (it holds up to {max_held})",
        b.next_replica_id
    );
    b.next_replica_id = a.next_replica_id;
    if a != b {
        let first_object = a
            .objects
            .iter()
            .zip(&b.objects)
            .find(|(x, y)| x != y)
            .map(|(x, y)| format!("master {x:#?}\nstandby {y:#?}"));
        panic!(
            "{when}: the standby's export differs from the master's: objects {} (first differing: \
             {first_object:?}), segments equal {}, discarded equal {} ({:?} vs {:?}), policy equal \
             {}",
            a.objects == b.objects,
            a.segments == b.segments,
            a.discarded == b.discarded,
            a.discarded,
            b.discarded,
            a.tenant_policy == b.tenant_policy,
        );
    }
    for s in &a.segments {
        let id = s.segment.id;
        assert_eq!(
            m.segment_free_ranges(id),
            standby.master.segment_free_ranges(id),
            "{when}: free ranges of segment {id}"
        );
    }
    assert_accounting(&standby.master);
}

#[test]
fn concurrent_put_get_remove_keeps_exact_accounting_without_deadlock() {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let seed = test_seed();
    let m = Arc::new(MasterService::with_seed(Default::default(), clock.clone(), seed).unwrap());
    let standby = Arc::new(Standby {
        master: MasterService::new(Default::default(), Arc::new(ManualClock::new(T0_MS))).unwrap(),
        errors: Default::default(),
    });
    m.set_observer(standby.clone()).unwrap();
    for id in 1..=4 {
        m.mount_segment(&seg(id, &format!("s{id}"), 64 * 1024), C1)
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    let mut threads = Vec::new();

    for w in 0..4u64 {
        threads.push(spawn_worker(&m, &stop, &ops, &done_tx, seed ^ w, w));
    }
    threads.push(spawn_segment_churn(&m, &stop, &done_tx));
    threads.push(spawn_mortal_client(&m, &stop, &done_tx));
    threads.push(spawn_clock(&m, &clock, &stop, &done_tx));
    drop(done_tx);

    // At least RUN_FOR, and on a starved machine longer, until the workers did MIN_OPS operations
    // (bounded by MAX_RUN: a run that still did too little then fails below).
    let started = Instant::now();
    while started.elapsed() < RUN_FOR
        || (ops.load(Ordering::Relaxed) < MIN_OPS && started.elapsed() < MAX_RUN)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let mut finished = 0;
    while finished < threads.len() {
        match done_rx.recv_timeout(JOIN_TIMEOUT) {
            Ok(_) => finished += 1,
            // Every sender is gone but not every thread reported: one panicked; join to show it.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!(
                    "a thread is stuck {:?} after the stop signal: deadlock",
                    started.elapsed()
                )
            }
        }
    }
    for t in threads {
        t.join().expect("a stress thread panicked");
    }
    assert!(
        ops.load(Ordering::Relaxed) >= MIN_OPS,
        "too little work: {}",
        ops.load(Ordering::Relaxed)
    );

    let report = m.check_accounting();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(report.segments_checked >= 4, "{}", report.segments_checked);
    assert_standby_agrees(&m, &standby, "after the run");

    // Clean everything: complete objects by force, in-flight puts by the reaper.
    m.remove_all(true, "");
    clock.advance(600_000);
    m.run_put_timeouts_once();
    assert_eq!(m.object_count(), 0);
    assert_eq!(m.discarded_replica_count(), 0);
    for u in m.segment_usage() {
        assert_eq!(u.used_bytes, Some(0), "segment {} leaked bytes", u.id);
        assert_eq!(u.live_buffers, Some(0));
    }
    assert_standby_agrees(&m, &standby, "after the clean-up");
    assert_eq!(standby.master.object_count(), 0);
}

/// A worker on overlapping keys: puts, revokes, upserts, copies, reads, removes.
fn spawn_worker(
    m: &Arc<MasterService>,
    stop: &Arc<AtomicBool>,
    ops: &Arc<AtomicU64>,
    done: &mpsc::Sender<&'static str>,
    seed: u64,
    w: u64,
) -> JoinHandle<()> {
    let (m, stop, ops, done) = (m.clone(), stop.clone(), ops.clone(), done.clone());
    std::thread::spawn(move || {
        let me = ClientId::new(10 + w, 0);
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("k{}", rng.u64(..KEYS));
            match rng.u8(..10) {
                0..=2 => {
                    let size = rng.u64(1..2048);
                    if m.put_start(me, &key, size, &cfg(rng.usize(1..=3)), "")
                        .is_ok()
                        && rng.u8(..8) != 0
                    {
                        let _ = m.put_end(me, &ObjectMeta::new(&key), ReplicaType::ALL, "");
                    }
                }
                3 => match rng.u8(..3) {
                    0 => {
                        let _ = m.put_revoke(me, &key, ReplicaType::ALL, "");
                    }
                    1 => {
                        if m.upsert_start(me, &key, rng.u64(1..2048), &cfg(2), "")
                            .is_ok()
                        {
                            let _ = m.upsert_end(me, &ObjectMeta::new(&key), ReplicaType::ALL, "");
                        }
                    }
                    _ => {
                        // Copy from wherever the object lives to a random segment.
                        let src = m.get_replica_list(&key, "").ok().and_then(|r| {
                            r.replicas.first().and_then(|d| {
                                d.memory().map(|x| {
                                    x.transport_endpoint.trim_start_matches("ep-").to_string()
                                })
                            })
                        });
                        if let Some(src) = src {
                            let tgt = vec![format!("s{}", rng.u64(1..=5))];
                            if m.copy_start(me, &key, "", &src, &tgt).is_ok() {
                                let _ = if rng.bool() {
                                    m.copy_end(me, &key, "")
                                } else {
                                    m.copy_revoke(me, &key, "")
                                };
                            }
                        }
                    }
                },
                4 => {
                    let _ = m.get_replica_list(&key, "");
                }
                5 => {
                    let ks: Vec<String> =
                        (0..16).map(|_| format!("k{}", rng.u64(..KEYS))).collect();
                    assert_eq!(m.batch_get_replica_list(&ks, "").len(), 16);
                    assert_eq!(m.batch_exist_key(&ks, "").len(), 16);
                }
                6 => {
                    let _ = m.exist_key(&key, "");
                }
                7 => {
                    let _ = m.remove(&key, rng.bool(), "");
                }
                8 => {
                    let ks: Vec<String> = (0..8).map(|_| format!("k{}", rng.u64(..KEYS))).collect();
                    assert_eq!(m.batch_remove(&ks, true, "").len(), 8);
                }
                _ => {
                    let _ = m.remove_by_regex(&format!("^k{}$", rng.u64(..KEYS)), false, "");
                }
            }
            n += 1;
            if n.is_multiple_of(64) {
                ops.fetch_add(64, Ordering::Relaxed);
            }
        }
        ops.fetch_add(n % 64, Ordering::Relaxed);
        done.send("worker").unwrap();
    })
}

fn spawn_segment_churn(
    m: &Arc<MasterService>,
    stop: &Arc<AtomicBool>,
    done: &mpsc::Sender<&'static str>,
) -> JoinHandle<()> {
    // Segment churn: unmount and re-mount segment 4.
    let (m, stop, done) = (m.clone(), stop.clone(), done.clone());
    std::thread::spawn(move || {
        let s4 = seg(4, "s4", 64 * 1024);
        while !stop.load(Ordering::Relaxed) {
            m.unmount_segment(SegmentId::new(4, 0), C1).unwrap();
            std::thread::yield_now();
            m.mount_segment(&s4, C1).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        done.send("churn").unwrap();
    })
}

fn spawn_mortal_client(
    m: &Arc<MasterService>,
    stop: &Arc<AtomicBool>,
    done: &mpsc::Sender<&'static str>,
) -> JoinHandle<()> {
    // A client that lives for a while, stops pinging (dies), then re-mounts.
    let (m, stop, done) = (m.clone(), stop.clone(), done.clone());
    std::thread::spawn(move || {
        let s5 = seg(5, "s5", 64 * 1024);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if i.is_multiple_of(40) {
                let _ = m.remount_segments(std::slice::from_ref(&s5), C2);
            }
            if i % 40 < 20 {
                let _ = m.ping(C2);
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        done.send("mortal client").unwrap();
    })
}

fn spawn_clock(
    m: &Arc<MasterService>,
    clock: &Arc<ManualClock>,
    stop: &Arc<AtomicBool>,
    done: &mpsc::Sender<&'static str>,
) -> JoinHandle<()> {
    // Time and background steps.
    let (m, clock, stop, done) = (m.clone(), clock.clone(), stop.clone(), done.clone());
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            clock.advance(997);
            m.ping(C1).unwrap();
            m.run_put_timeouts_once();
            m.run_soft_pin_expiry_once();
            m.release_discarded_once();
            m.run_eviction_once();
            m.run_client_monitor_once();
            m.run_task_cleanup_once();
            std::thread::sleep(Duration::from_millis(2));
        }
        done.send("clock").unwrap();
    })
}
