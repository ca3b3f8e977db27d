//! Eviction cycle and client-death sweep over 1,000,000 objects
//! (`cargo bench -p mooncake-master --bench eviction_sweep`).
//!
//! Prints, in milliseconds (median of 3 runs, each on a freshly filled master), next to a naive
//! peer measured in the same run:
//! - one eviction cycle (`run_eviction_once`) on a full store of 1,000,000 objects (watermark
//!   0.90, ratio 0.05, so 15 % of the objects go), and on a store just over the watermark;
//!   peer: one `RwLock<HashMap<String, Entry>>`, collect `(last_access, key)` of every object,
//!   sort, remove the oldest 15 %;
//! - the client-death sweep (`run_client_monitor_once` for a client owning half of the
//!   1,000,000 objects); peer: `HashMap::retain` dropping the dead client's half;
//! - the longest a GetReplicaList on another shard waited while the sweep ran (a reader thread
//!   timing each call), next to the time of one shard's share of the sweep (total / 1024).
//!
//! `MASTER_BENCH_OBJECTS` overrides the object count.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use mooncake_common::{
    ClientId, ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId,
};
use mooncake_master::{MasterService, MasterServiceConfig};

const VALUE: u64 = 4096;
const A: ClientId = ClientId::new(1, 1);
const B: ClientId = ClientId::new(2, 2);

fn objects() -> usize {
    std::env::var("MASTER_BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

fn segment(id: u64, owner: u64, size: u64) -> Segment {
    Segment {
        id: SegmentId::new(id, owner),
        name: format!("seg-{id}"),
        base: 0x1000_0000_0000 * id,
        size,
        te_endpoint: format!("10.0.0.{id}:1234"),
        protocol: "tcp".into(),
        host_id: String::new(),
    }
}

fn key(i: usize) -> String {
    format!("key-{i:012}")
}

/// A master on a manual clock with `n` objects; objects `i % 2 == 0` on client A's 4 segments,
/// the others on client B's. `fill` is the fraction of the capacity they use.
fn filled(n: usize, fill: f64) -> (Arc<ManualClock>, MasterService) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let m = MasterService::new(MasterServiceConfig::default(), clock.clone()).unwrap();
    let per_seg = ((n as f64 * VALUE as f64 / fill) / 8.0).ceil() as u64;
    for (owner, ids) in [(A, 1..=4), (B, 5..=8)] {
        let segs: Vec<Segment> = ids.map(|id| segment(id, owner.0.first, per_seg)).collect();
        m.remount_segments(&segs, owner).unwrap();
    }
    let on_a = ReplicateConfig {
        preferred_segments: (1..=4).map(|i| format!("seg-{i}")).collect(),
        ..ReplicateConfig::with_replicas(1)
    };
    let on_b = ReplicateConfig {
        preferred_segments: (5..=8).map(|i| format!("seg-{i}")).collect(),
        ..ReplicateConfig::with_replicas(1)
    };
    for i in 0..n {
        if i % 1024 == 0 {
            clock.advance(1);
        }
        let k = key(i);
        let c = if i % 2 == 0 { &on_a } else { &on_b };
        m.put_start(A, &k, VALUE, c, "").unwrap();
        m.put_end(A, &ObjectMeta::new(&k), ReplicaType::ALL, "")
            .unwrap();
    }
    (clock, m)
}

struct PeerEntry {
    last_access_ms: u64,
    owner: u64,
    _addr: u64,
}

fn peer(n: usize) -> RwLock<HashMap<String, PeerEntry>> {
    let mut map = HashMap::with_capacity(n);
    for i in 0..n {
        map.insert(
            key(i),
            PeerEntry {
                last_access_ms: (i / 1024) as u64,
                owner: (i % 2) as u64,
                _addr: i as u64 * VALUE,
            },
        );
    }
    RwLock::new(map)
}

/// CPU time of the calling thread (ns), from /proc/thread-self/schedstat: on a shared, loaded
/// machine wall time includes waiting for a core; this does not.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Runs `f`, returning its result, wall ms and CPU ms.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let c = thread_cpu_ns();
    let t = Instant::now();
    let r = f();
    let wall = t.elapsed().as_secs_f64() * 1e3;
    (r, wall, (thread_cpu_ns() - c) as f64 / 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let n = objects();
    const RUNS: usize = 3;
    println!("eviction and client-death sweep, {n} objects, 4 KiB values, 8 segments, median of {RUNS} runs");

    let (mut full, mut over, mut peer_evict) = (Vec::new(), Vec::new(), Vec::new());
    let (mut full_cpu, mut over_cpu, mut peer_evict_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut evicted_full, mut evicted_over) = (0, 0);
    for _ in 0..RUNS {
        let (clock, m) = filled(n, 1.0);
        clock.advance(1);
        let (r, wall, cpu) = timed(|| m.run_eviction_once());
        full.push(wall);
        full_cpu.push(cpu);
        evicted_full = r.evicted_objects;
        assert!(r.usage_ratio_after < 0.9);
        drop(m);
        let (clock, m) = filled(n, 0.91);
        clock.advance(1);
        let (r, wall, cpu) = timed(|| m.run_eviction_once());
        over.push(wall);
        over_cpu.push(cpu);
        evicted_over = r.evicted_objects;
        drop(m);

        let p = peer(n);
        let ((), wall, cpu) = timed(|| {
            let mut map = p.write().unwrap();
            let mut all: Vec<(u64, String)> = map
                .iter()
                .map(|(k, e)| (e.last_access_ms, k.clone()))
                .collect();
            all.sort_unstable();
            for (_, k) in all.iter().take(evicted_full) {
                map.remove(k);
            }
        });
        peer_evict.push(wall);
        peer_evict_cpu.push(cpu);
    }

    let (mut sweep, mut peer_sweep, mut max_wait) = (Vec::new(), Vec::new(), Vec::new());
    let (mut sweep_cpu, mut peer_sweep_cpu) = (Vec::new(), Vec::new());
    let mut erased = 0;
    for _ in 0..RUNS {
        let (clock, m) = filled(n, 0.5);
        let m = Arc::new(m);
        m.run_client_monitor_once();
        clock.advance(10_001);
        m.ping(B).unwrap();
        // A reader on B's keys (other shards than the one being swept, most of the time).
        let stop = Arc::new(AtomicBool::new(false));
        let worst_ns = Arc::new(AtomicU64::new(0));
        let started = Arc::new(AtomicBool::new(false));
        let reader = {
            let (m, stop, worst_ns, started) =
                (m.clone(), stop.clone(), worst_ns.clone(), started.clone());
            std::thread::spawn(move || {
                let mut i = 1usize;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let _ = std::hint::black_box(m.get_replica_list(&key(i % n), ""));
                    if started.load(Ordering::Relaxed) {
                        worst_ns.fetch_max(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    i = i.wrapping_add(2 * 7919);
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        started.store(true, Ordering::Relaxed);
        let before = m.object_count();
        let (expired, wall, cpu) = timed(|| m.run_client_monitor_once());
        sweep.push(wall);
        sweep_cpu.push(cpu);
        started.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(expired, 1);
        erased = before - m.object_count();
        max_wait.push(worst_ns.load(Ordering::Relaxed) as f64 / 1e6);

        let p = peer(n);
        let ((), wall, cpu) = timed(|| p.write().unwrap().retain(|_, e| e.owner != 0));
        peer_sweep.push(wall);
        peer_sweep_cpu.push(cpu);
    }

    let m = |v: Vec<f64>| median(v);
    let (full, over, peer_evict) = (m(full), m(over), m(peer_evict));
    let (full_cpu, over_cpu, peer_evict_cpu) = (m(full_cpu), m(over_cpu), m(peer_evict_cpu));
    let (sweep, peer_sweep, max_wait) = (m(sweep), m(peer_sweep), m(max_wait));
    let (sweep_cpu, peer_sweep_cpu) = (m(sweep_cpu), m(peer_sweep_cpu));
    println!();
    println!("| operation | master core wall (CPU) | naive peer wall (CPU) | ratio peer/master, CPU | target |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| eviction cycle, full store ({evicted_full} evicted) | {full:.1} ms ({full_cpu:.1} ms) | {peer_evict:.1} ms ({peer_evict_cpu:.1} ms) | {:.2}x | < 200 ms |",
        peer_evict_cpu / full_cpu
    );
    println!("| eviction cycle, usage 0.91 ({evicted_over} evicted) | {over:.1} ms ({over_cpu:.1} ms) | - | - | < 200 ms |");
    println!(
        "| client-death sweep ({erased} of {n} erased) | {sweep:.1} ms ({sweep_cpu:.1} ms) | {peer_sweep:.1} ms ({peer_sweep_cpu:.1} ms) | {:.2}x | < 200 ms |",
        peer_sweep_cpu / sweep_cpu
    );
    println!(
        "| longest GetReplicaList during the sweep | {max_wait:.2} ms | one shard's share of the sweep: {:.3} ms | - | - |",
        sweep / 1024.0
    );
}
