//! Ad-hoc throughput check of the log backend against raw sequential writes of the same disk, in
//! the same run (the real benchmark is `mooncake bench storage`). Ignored by default; run with
//! `cargo test -p mooncake-storage --release --test log_throughput -- --ignored --nocapture`.
//! Environment: `LOG_BENCH_DIR` (default: the temp dir), `LOG_BENCH_MIB` (default 256).
#![allow(clippy::unwrap_used)]

use mooncake_storage::log::LogBackend;
use mooncake_storage::{BackendConfig, Durability, EvictionConfig, StorageBackend};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

const VALUE_BYTES: usize = 1 << 20;
const BATCH: usize = 8;

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("LOG_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("mooncake-log-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn total_mib() -> usize {
    std::env::var("LOG_BENCH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

/// dd-style: sequential 1 MiB writes to a new file (or one preallocated with `fallocate`, as the
/// log's data file is), `fdatasync` every `BATCH` MiB.
fn raw_sequential_mb_s(
    dir: &std::path::Path,
    values: &[Vec<u8>],
    total: usize,
    preallocate: bool,
) -> f64 {
    let path = dir.join("raw.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    if preallocate {
        rustix::fs::fallocate(
            &f,
            rustix::fs::FallocateFlags::empty(),
            0,
            (total * VALUE_BYTES) as u64,
        )
        .unwrap();
        f.sync_all().unwrap();
    }
    let start = Instant::now();
    for i in 0..total {
        f.write_all(&values[i % values.len()]).unwrap();
        if (i + 1) % BATCH == 0 {
            f.sync_data().unwrap();
        }
    }
    f.sync_data().unwrap();
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path).unwrap();
    total as f64 / secs
}

fn log_mb_s(
    dir: &std::path::Path,
    values: &[Vec<u8>],
    total: usize,
    durability: Durability,
) -> f64 {
    let root = dir.join("log");
    let mut cfg = BackendConfig::new(&root, (total as u64 + 16) << 20);
    cfg.durability = durability;
    cfg.eviction = EvictionConfig {
        enabled: false,
        ..EvictionConfig::default()
    };
    let b = LogBackend::open(cfg).unwrap();
    let keys: Vec<String> = (0..total).map(|i| format!("obj-{i:06}")).collect();
    let start = Instant::now();
    for chunk in (0..total).collect::<Vec<_>>().chunks(BATCH) {
        let entries: Vec<(&str, &[u8])> = chunk
            .iter()
            .map(|&i| (keys[i].as_str(), values[i % values.len()].as_slice()))
            .collect();
        for r in b.put_batch(&entries) {
            r.unwrap();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    b.close().unwrap();
    drop(b);
    std::fs::remove_dir_all(&root).unwrap();
    total as f64 / secs
}

#[test]
#[ignore = "benchmark: run in release with --ignored --nocapture"]
fn log_batch_write_throughput_vs_raw_sequential() {
    let dir = bench_dir();
    let total = total_mib();
    let values: Vec<Vec<u8>> = (0..16u8)
        .map(|s| {
            (0..VALUE_BYTES)
                .map(|i| (i as u8).wrapping_mul(31) ^ s)
                .collect()
        })
        .collect();
    // Alternate to spread drift of a shared disk over both.
    let mut raw = Vec::new();
    let mut pre = Vec::new();
    let mut log = Vec::new();
    let mut log_none = Vec::new();
    let reps: usize = std::env::var("LOG_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for _ in 0..reps {
        raw.push(raw_sequential_mb_s(&dir, &values, total, false));
        pre.push(raw_sequential_mb_s(&dir, &values, total, true));
        log.push(log_mb_s(&dir, &values, total, Durability::Batch));
        log_none.push(log_mb_s(&dir, &values, total, Durability::None));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (raw_m, pre_m, log_m) = (median(&mut raw), median(&mut pre), median(&mut log));
    let none_m = median(&mut log_none);
    println!(
        "| case (1 MiB values, {BATCH} per batch, {total} MiB) | MB/s (median of {reps}) | runs |"
    );
    println!("| --- | --- | --- |");
    println!("| raw sequential write + fdatasync per {BATCH} MiB | {raw_m:.0} | {raw:.0?} |");
    println!("| raw, into a preallocated file | {pre_m:.0} | {pre:.0?} |");
    println!("| log put_batch, durability batch | {log_m:.0} | {log:.0?} |");
    println!("| log put_batch, durability none (page cache) | {none_m:.0} | {log_none:.0?} |");
    println!("| ratio log / raw (new file) | {:.2} | |", log_m / raw_m);
    println!(
        "| ratio log / raw (preallocated) | {:.2} | |",
        log_m / pre_m
    );
    let _ = std::fs::remove_dir_all(&dir);
}
