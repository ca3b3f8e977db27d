//! `mooncake bench snapshot`: a master snapshot of N objects (16-byte keys, one memory replica),
//! in process: take time, file size, bytes per object beyond the key, restore time (decode +
//! `MasterService::restore` into a fresh master), and the p99 of a reader thread's
//! GetReplicaList while the take runs, next to its p99 with no take.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use mooncake_common::SystemClock;
use mooncake_common::{ClientId, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId};
use mooncake_master::{MasterService, RestoreOptions};
use mooncake_snapshot::{decode, EncodeOptions, SnapshotDir};

const VALUE_SIZE: u64 = 4096;
const SEGMENTS: u64 = 16;
const KEY_BYTES: usize = 16;
const CLIENT: ClientId = ClientId::new(7, 7);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Objects in the master.
    #[arg(long, default_value_t = 1_000_000)]
    objects: usize,
    /// zstd level per chunk (0: uncompressed).
    #[arg(long, default_value_t = 1)]
    zstd_level: i32,
    /// Directory for the snapshot files (default: a fresh one under the temp dir, removed).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

fn segment(i: u64, bytes: u64) -> Segment {
    Segment {
        id: SegmentId::new(i + 1, 0),
        name: format!("seg-{i}"),
        base: (i + 1) << 40,
        size: bytes,
        te_endpoint: format!("127.0.0.1:{}", 20_000 + i),
        protocol: "tcp".into(),
        host_id: String::new(),
    }
}

fn key(i: usize) -> String {
    format!("key-{i:012}")
}

/// A 64-bit mix, for realistic (incompressible) checksums.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn build(objects: usize) -> anyhow::Result<MasterService> {
    let seg_bytes = (objects as u64 / SEGMENTS + 1) * VALUE_SIZE * 2;
    let master = MasterService::new(Default::default(), Arc::new(SystemClock::new()))?;
    for i in 0..SEGMENTS {
        master
            .mount_segment(&segment(i, seg_bytes), CLIENT)
            .map_err(|e| anyhow!("mount: {e}"))?;
    }
    let config = ReplicateConfig::default();
    for i in 0..objects {
        let key = key(i);
        master
            .put_start(CLIENT, &key, VALUE_SIZE, &config, "")
            .map_err(|e| anyhow!("put start: {e}"))?;
        let meta = ObjectMeta {
            key,
            object_checksum: Some(mix(i as u64)),
        };
        master
            .put_end(CLIENT, &meta, ReplicaType::ALL, "")
            .map_err(|e| anyhow!("put end: {e}"))?;
    }
    Ok(master)
}

/// Reads random keys until `stop`; returns the latencies (ns).
fn reader(master: &MasterService, objects: usize, stop: &AtomicBool) -> Vec<u64> {
    let mut lat = Vec::new();
    let mut x = 0x1234_5678u64;
    while !stop.load(Ordering::Relaxed) {
        x = mix(x);
        let k = key((x % objects as u64) as usize);
        let t = Instant::now();
        let ok = master.get_replica_list(&k, "").is_ok();
        lat.push(t.elapsed().as_nanos() as u64);
        if !ok {
            break;
        }
    }
    lat
}

fn p99_us(mut lat: Vec<u64>) -> (f64, usize) {
    if lat.is_empty() {
        return (0.0, 0);
    }
    lat.sort_unstable();
    let i = (lat.len() * 99 / 100).min(lat.len() - 1);
    (lat[i] as f64 / 1000.0, lat.len())
}

/// Runs the reader for `busy`'s duration (and `busy` on this thread); returns its p99.
fn with_reader<T>(
    master: &MasterService,
    objects: usize,
    busy: impl FnOnce() -> T,
) -> (T, (f64, usize)) {
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let h = s.spawn(|| reader(master, objects, &stop));
        thread::sleep(Duration::from_millis(20));
        let out = busy();
        stop.store(true, Ordering::Relaxed);
        let lat = h.join().unwrap_or_default();
        (out, p99_us(lat))
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let objects = args.objects.max(1);
    let started = Instant::now();
    let master = build(objects)?;
    println!(
        "built {objects} objects ({KEY_BYTES}-byte keys, 1 memory replica, {SEGMENTS} segments) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let temp = args.dir.is_none();
    let path = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("mooncake-bench-snapshot-{}", std::process::id()))
    });
    let dir = SnapshotDir::open(&path, 2).context("snapshot dir")?;
    let opts = EncodeOptions {
        zstd_level: (args.zstd_level > 0).then_some(args.zstd_level),
    };
    // The reader alone, for as long as a take roughly lasts.
    let ((), idle) = with_reader(&master, objects, || {
        thread::sleep(Duration::from_millis(1000))
    });
    let (report, during) = with_reader(&master, objects, || dir.take(&master, 0, &opts));
    let report = report.context("take")?;
    let bytes = std::fs::read(&report.path).context("read snapshot")?;
    let t = Instant::now();
    let (_, state) = decode(&bytes).context("decode")?;
    let decode_s = t.elapsed().as_secs_f64();
    let fresh = MasterService::new(Default::default(), Arc::new(SystemClock::new()))?;
    let t = Instant::now();
    let restored = fresh
        .restore(state, RestoreOptions::default())
        .map_err(|e| anyhow!("restore: {e}"))?;
    let restore_s = t.elapsed().as_secs_f64();
    if restored.objects != objects {
        return Err(anyhow!(
            "restored {} objects of {objects}",
            restored.objects
        ));
    }
    if temp {
        let _ = std::fs::remove_dir_all(&path);
    }
    let per_object = report.bytes as f64 / objects as f64;
    let level = opts
        .zstd_level
        .map_or("none".to_string(), |l| format!("zstd {l}"));
    println!("| measure | value |");
    println!("| --- | --- |");
    println!("| objects | {objects} |");
    println!("| compression | {level} |");
    println!(
        "| snapshot take (write + fsync + rename) | {:.3} s |",
        report.duration.as_secs_f64()
    );
    println!("| file bytes | {} |", report.bytes);
    println!("| bytes/object (all) | {per_object:.1} |");
    println!(
        "| bytes/object beyond the {KEY_BYTES}-byte key | {:.1} |",
        per_object - KEY_BYTES as f64
    );
    println!("| restore: decode | {decode_s:.3} s |");
    println!("| restore: MasterService::restore | {restore_s:.3} s |");
    println!("| restore total | {:.3} s |", decode_s + restore_s);
    println!(
        "| reader GetReplicaList p99, no take | {:.1} us ({} reads) |",
        idle.0, idle.1
    );
    println!(
        "| reader GetReplicaList p99, during take | {:.1} us ({} reads) |",
        during.0, during.1
    );
    Ok(())
}
