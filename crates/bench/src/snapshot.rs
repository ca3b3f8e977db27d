//! `mooncake bench snapshot`: a master snapshot of N objects (16-byte keys, one memory replica;
//! the setup of `cargo bench -p mooncake-master --bench restore`), in process: take time, file
//! size, bytes per object beyond the key, restore time (decode + `MasterService::restore` into a
//! fresh master), and the p99 of a reader thread's GetReplicaList while the take runs, next to
//! its p99 with no take.
//!
//! On a shared machine wall times move with the load, so every step also reports the CPU time
//! it used (the reader thread's excluded), and two floors are measured in the same run: writing
//! and fsyncing as many bytes as the snapshot file, and a plain walk over the master's objects
//! (every shard read-locked in turn, each object's view built and dropped).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use mooncake_common::SystemClock;
use mooncake_master::bench_support::{filled_master, key, mix, KEY_BYTES, SEGMENTS};
use mooncake_master::{MasterService, RestoreOptions, SHARD_COUNT};
use mooncake_snapshot::{
    decode, join_on_threads, EncodeOptions, SnapshotDir, COMPRESS_THREADS, DECODE_THREADS,
};

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

/// CPU time (user + system) of this process, or of the calling thread.
fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn process_cpu() -> f64 {
    cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn thread_cpu() -> f64 {
    cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID)
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// Wall and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (wall, cpu) = (Instant::now(), process_cpu());
    let out = f();
    (out, wall.elapsed().as_secs_f64(), process_cpu() - cpu)
}

/// What the reader thread saw: latencies (ns) and its own CPU time.
struct Reads {
    lat: Vec<u64>,
    cpu: f64,
}

/// Reads random keys until `stop`.
fn reader(master: &MasterService, objects: usize, stop: &AtomicBool) -> Reads {
    let cpu = thread_cpu();
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
    Reads {
        lat,
        cpu: thread_cpu() - cpu,
    }
}

fn p99_us(mut lat: Vec<u64>) -> (f64, usize) {
    if lat.is_empty() {
        return (0.0, 0);
    }
    lat.sort_unstable();
    let i = (lat.len() * 99 / 100).min(lat.len() - 1);
    (lat[i] as f64 / 1000.0, lat.len())
}

/// Runs `busy` on this thread while the reader runs; returns its result, its wall and CPU
/// seconds (the reader's CPU excluded), and the reader's p99.
fn with_reader<T>(
    master: &MasterService,
    objects: usize,
    busy: impl FnOnce() -> T,
) -> (T, f64, f64, (f64, usize)) {
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let h = s.spawn(|| reader(master, objects, &stop));
        thread::sleep(Duration::from_millis(20));
        let (out, wall, cpu) = timed(busy);
        stop.store(true, Ordering::Relaxed);
        let reads = h.join().unwrap_or(Reads {
            lat: Vec::new(),
            cpu: 0.0,
        });
        // The reader ran longer than `busy` (its start and stop); at most its whole CPU time.
        (out, wall, (cpu - reads.cpu).max(0.0), p99_us(reads.lat))
    })
}

/// The floor of a take's file work: `bytes` bytes written in 1 MiB pieces, then fsync.
fn write_floor(dir: &std::path::Path, bytes: u64) -> anyhow::Result<(f64, f64)> {
    let path = dir.join("floor.bin");
    let piece: Vec<u8> = (0..1u64 << 20).map(|i| mix(i) as u8).collect();
    let (written, wall, cpu) = timed(|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&path)?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(piece.len() as u64) as usize;
            f.write_all(&piece[..n])?;
            left -= n as u64;
        }
        f.sync_all()
    });
    let _ = std::fs::remove_file(&path);
    written.context("write floor")?;
    Ok((wall, cpu))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let objects = args.objects.max(1);
    let load_before = load_average();
    let started = Instant::now();
    let (master, _) = filled_master(objects).map_err(|e| anyhow!("{e}"))?;
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
        ..EncodeOptions::default()
    };
    // The reader alone, for as long as a take roughly lasts.
    let ((), _, _, idle) = with_reader(&master, objects, || {
        thread::sleep(Duration::from_millis(1000))
    });
    let (report, take_wall, take_cpu, during) =
        with_reader(&master, objects, || dir.take(&master, 0, &opts));
    let report = report.context("take")?;

    // Floors, same run: the file work alone, and a walk over every object.
    let (write_wall, write_cpu) = write_floor(&path, report.bytes)?;
    let (walked, walk_wall, walk_cpu) = timed(|| {
        (0..SHARD_COUNT)
            .map(|i| {
                master.visit_shard(i, |o| {
                    std::hint::black_box(o);
                })
            })
            .sum::<usize>()
    });
    drop(master);

    let bytes = std::fs::read(&report.path).context("read snapshot")?;
    let (decoded, decode_wall, decode_cpu) = timed(|| decode(&bytes));
    let (_, state) = decoded.context("decode")?;
    let fresh = MasterService::new(Default::default(), Arc::new(SystemClock::new()))?;
    let (restored, restore_wall, restore_cpu) = timed(|| {
        let opts = RestoreOptions {
            join: Some(join_on_threads),
            ..RestoreOptions::default()
        };
        fresh.restore(state, opts)
    });
    let restored = restored.map_err(|e| anyhow!("restore: {e}"))?;
    if restored.objects != objects || walked != objects {
        return Err(anyhow!(
            "restored {} and walked {walked} objects of {objects}",
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
    let row = |what: &str, wall: f64, cpu: f64| {
        println!("| {what} | {wall:.3} s | {cpu:.3} s |");
    };
    println!(
        "objects {objects}, {level}, compression threads {COMPRESS_THREADS}, decode threads \
         {DECODE_THREADS}, restore in two halves"
    );
    println!(
        "load average before {load_before}, after {}; {} CPUs",
        load_average(),
        thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!("| step | wall | CPU |");
    println!("| --- | --- | --- |");
    row(
        "snapshot take (write + fsync + rename)",
        take_wall,
        take_cpu,
    );
    row("floor: write + fsync as many bytes", write_wall, write_cpu);
    row("floor: walk every object (views)", walk_wall, walk_cpu);
    row("restore: decode", decode_wall, decode_cpu);
    row("restore: MasterService::restore", restore_wall, restore_cpu);
    row(
        "restore total",
        decode_wall + restore_wall,
        decode_cpu + restore_cpu,
    );
    println!();
    println!("| measure | value |");
    println!("| --- | --- |");
    println!("| file bytes | {} |", report.bytes);
    println!("| bytes/object (all) | {per_object:.1} |");
    println!(
        "| bytes/object beyond the {KEY_BYTES}-byte key | {:.1} |",
        per_object - KEY_BYTES as f64
    );
    println!(
        "| take / floors (write + walk), wall | {:.2} |",
        take_wall / (write_wall + walk_wall).max(1e-9)
    );
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
