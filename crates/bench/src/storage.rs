//! `mooncake bench storage`: write and read MB/s and ops/s of each SSD-tier backend, per value
//! size and durability policy, next to raw sequential file throughput of the same disk measured
//! in the same run (a `dd`/`fio`-style loop: sequential `value`-sized writes to one file with the
//! same fsync cadence as the policy — none / one fdatasync per batch / one per write — then
//! sequential reads).
//!
//! The raw file is preallocated (`fallocate`) before it is written, as `fio` lays out its files.
//! Each (value size, policy) group runs `--rounds` times, raw and backends interleaved with the
//! backend order rotated per round; the table prints medians, so one noisy round on a shared disk
//! does not decide a ratio.
//!
//! Reads are cold by default: after the write phase every file of the store (and the raw file)
//! is fdatasync'ed and dropped from the page cache with `posix_fadvise(DONTNEED)`.

use anyhow::{bail, Context};
use mooncake_storage::testkit::{drop_page_cache, fill_pattern, preallocate};
use mooncake_storage::{open_backend, BackendConfig, BackendKind, Durability, EvictionConfig};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Backends to measure: file, bucket, log.
    #[arg(long, value_delimiter = ',', default_value = "file,bucket,log")]
    backends: Vec<String>,
    /// Durability policies: none, batch, always.
    #[arg(long, value_delimiter = ',', default_value = "none,batch,always")]
    durability: Vec<String>,
    /// Value sizes (units accepted: 64KiB, 1MiB...).
    #[arg(long, value_delimiter = ',', default_value = "64KiB,1MiB")]
    sizes: Vec<String>,
    /// Bytes written per cell (the cell also stops after --seconds).
    #[arg(long, default_value = "256MiB")]
    bytes: String,
    /// Upper bound on the write phase of one cell, in seconds (and on its read phase).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Bytes per put_batch (entries per batch = this / value size, at least 1, at most 256).
    #[arg(long, default_value = "16MiB")]
    batch_bytes: String,
    /// Directory on the disk to measure (a scratch subdirectory is created and removed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Repetitions of each (value size, policy) group; the table shows medians.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keep the page cache before reads (measures the software path instead of the device).
    #[arg(long)]
    hot_reads: bool,
}

const MB: f64 = 1e6;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rate {
    pub bytes: u64,
    pub ops: u64,
    pub secs: f64,
}

impl Rate {
    pub(crate) fn mb_s(&self) -> f64 {
        self.bytes as f64 / MB / self.secs.max(1e-9)
    }
    pub(crate) fn ops_s(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::None => "none",
        Durability::Batch => "batch",
        Durability::Always => "always",
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let total_bytes = mooncake_common::parse_size(&args.bytes).context("--bytes")?;
    let batch_bytes = mooncake_common::parse_size(&args.batch_bytes).context("--batch-bytes")?;
    let mut sizes = Vec::new();
    for s in &args.sizes {
        sizes.push(usize::try_from(
            mooncake_common::parse_size(s).context("--sizes")?,
        )?);
    }
    let mut kinds = Vec::new();
    for b in &args.backends {
        kinds.push(
            b.parse::<BackendKind>()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    let mut policies = Vec::new();
    for d in &args.durability {
        policies.push(
            d.parse::<Durability>()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    if sizes.contains(&0) || total_bytes == 0 {
        bail!("sizes and --bytes must be > 0");
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = base.join(format!("mooncake-bench-storage-{}", std::process::id()));
    fs::create_dir_all(&scratch).with_context(|| format!("create {}", scratch.display()))?;
    let limit = Duration::from_secs_f64(args.seconds);
    let result = (|| -> anyhow::Result<()> {
        println!(
            "SSD tier: {} per cell (or {:.1} s), {} per batch, {} reads, scratch dir {}",
            mooncake_common::format_size(total_bytes),
            args.seconds,
            mooncake_common::format_size(batch_bytes),
            if args.hot_reads {
                "page-cache"
            } else {
                "cold (fadvise DONTNEED)"
            },
            scratch.display()
        );
        println!();
        println!(
            "| backend | durability | value | write MB/s | write ops/s | raw write MB/s | \
             write / raw | read MB/s | read ops/s | raw read MB/s | read / raw |"
        );
        println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for &size in &sizes {
            let per_batch = ((batch_bytes as usize) / size).clamp(1, 256);
            let mut value = vec![0u8; size];
            fill_pattern(size as u64, &mut value);
            for &policy in &policies {
                let mut raw_rounds: Vec<(Rate, Rate)> = Vec::new();
                let mut cells: Vec<Vec<Result<(Rate, Rate), String>>> =
                    vec![Vec::new(); kinds.len()];
                for round in 0..args.rounds.max(1) {
                    let raw_dir = scratch.join("raw");
                    fs::create_dir_all(&raw_dir)?;
                    raw_rounds.push(raw_sequential(
                        &raw_dir,
                        &value,
                        per_batch,
                        policy,
                        total_bytes,
                        limit,
                        args.hot_reads,
                    )?);
                    fs::remove_dir_all(&raw_dir)?;
                    for i in 0..kinds.len() {
                        let k = (i + round) % kinds.len();
                        let kind = kinds[k];
                        let dir = scratch.join(kind.name());
                        let cell = backend_cell(
                            kind,
                            &dir,
                            &value,
                            per_batch,
                            policy,
                            total_bytes,
                            limit,
                            args.hot_reads,
                        );
                        let _ = fs::remove_dir_all(&dir);
                        cells[k].push(cell.map_err(|e| format!("{e:#}")));
                    }
                }
                let (raw_w, raw_r) = medians(&raw_rounds);
                let size_text = mooncake_common::format_size(size as u64);
                let policy_text = durability_name(policy);
                println!(
                    "| raw file | {policy_text} | {size_text} | {:.0} | {:.0} | | | {:.0} | {:.0} | | |",
                    raw_w.mb_s(),
                    raw_w.ops_s(),
                    raw_r.mb_s(),
                    raw_r.ops_s()
                );
                for (kind, results) in kinds.iter().zip(&cells) {
                    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
                        println!(
                            "| {kind} | {policy_text} | {size_text} | error: {e} | | | | | | | |"
                        );
                        continue;
                    }
                    let ok: Vec<(Rate, Rate)> = results.iter().flatten().copied().collect();
                    let (w, r) = medians(&ok);
                    println!(
                        "| {kind} | {policy_text} | {size_text} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {:.2} |",
                        w.mb_s(),
                        w.ops_s(),
                        raw_w.mb_s(),
                        w.mb_s() / raw_w.mb_s().max(1e-9),
                        r.mb_s(),
                        r.ops_s(),
                        raw_r.mb_s(),
                        r.mb_s() / raw_r.mb_s().max(1e-9),
                    );
                }
            }
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&scratch);
    result
}

/// Median (by MB/s) of the write rates and of the read rates, taken separately.
fn medians(rounds: &[(Rate, Rate)]) -> (Rate, Rate) {
    let pick = |mut v: Vec<Rate>| {
        v.sort_by(|a, b| a.mb_s().total_cmp(&b.mb_s()));
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    (
        pick(rounds.iter().map(|r| r.0).collect()),
        pick(rounds.iter().map(|r| r.1).collect()),
    )
}

/// Sequential writes of `value` to one file with the policy's fsync cadence, then reads.
pub(crate) fn raw_sequential(
    dir: &Path,
    value: &[u8],
    per_batch: usize,
    policy: Durability,
    total_bytes: u64,
    limit: Duration,
    hot_reads: bool,
) -> anyhow::Result<(Rate, Rate)> {
    let path = dir.join("raw.dat");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let batch_bytes = (value.len() * per_batch) as u64;
    preallocate(&f, total_bytes.div_ceil(batch_bytes) * batch_bytes)?;
    f.sync_all()?;
    let mut w = Rate::default();
    let start = Instant::now();
    while w.bytes < total_bytes && start.elapsed() < limit {
        for _ in 0..per_batch {
            f.write_all(value)?;
            w.bytes += value.len() as u64;
            w.ops += 1;
            if policy == Durability::Always {
                f.sync_data()?;
            }
        }
        if policy == Durability::Batch {
            f.sync_data()?;
        }
    }
    w.secs = start.elapsed().as_secs_f64();
    drop(f);
    if !hot_reads {
        drop_page_cache(dir)?;
    }
    let mut f = File::open(&path)?;
    let mut buf = vec![0u8; value.len()];
    let mut r = Rate::default();
    let start = Instant::now();
    while r.bytes < w.bytes && start.elapsed() < limit {
        f.read_exact(&mut buf)?;
        r.bytes += buf.len() as u64;
        r.ops += 1;
    }
    r.secs = start.elapsed().as_secs_f64();
    Ok((w, r))
}

/// Writes batches of `value` under distinct keys, then reads them back in the same batches.
#[allow(clippy::too_many_arguments)]
fn backend_cell(
    kind: BackendKind,
    dir: &Path,
    value: &[u8],
    per_batch: usize,
    policy: Durability,
    total_bytes: u64,
    limit: Duration,
    hot_reads: bool,
) -> anyhow::Result<(Rate, Rate)> {
    let _ = fs::remove_dir_all(dir);
    // Room for everything a cell can write, so no eviction runs during the measurement.
    let capacity = (total_bytes + (value.len() * per_batch) as u64) * 2 + (64 << 20);
    let config = BackendConfig::new(dir, capacity)
        .with_durability(policy)
        .with_eviction(EvictionConfig {
            enabled: false,
            ..EvictionConfig::default()
        });
    let backend = open_backend(kind, config).map_err(|e| anyhow::anyhow!("open: {e}"))?;
    let mut keys: Vec<String> = Vec::new();
    let mut w = Rate::default();
    let start = Instant::now();
    while w.bytes < total_bytes && start.elapsed() < limit {
        let first = keys.len();
        for i in 0..per_batch {
            keys.push(format!("bench-{}", first + i));
        }
        let entries: Vec<(&str, &[u8])> =
            keys[first..].iter().map(|k| (k.as_str(), value)).collect();
        for r in backend.put_batch(&entries) {
            r.map_err(|e| anyhow::anyhow!("put: {e}"))?;
        }
        w.bytes += (value.len() * per_batch) as u64;
        w.ops += per_batch as u64;
    }
    w.secs = start.elapsed().as_secs_f64();
    backend.flush().map_err(|e| anyhow::anyhow!("flush: {e}"))?;
    if !hot_reads {
        drop_page_cache(dir)?;
    }
    let mut bufs: Vec<Vec<u8>> = (0..per_batch).map(|_| vec![0u8; value.len()]).collect();
    let mut r = Rate::default();
    let start = Instant::now();
    for chunk in keys.chunks(per_batch) {
        if start.elapsed() >= limit {
            break;
        }
        let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let mut refs: Vec<&mut [u8]> = bufs
            .iter_mut()
            .take(chunk.len())
            .map(|b| b.as_mut_slice())
            .collect();
        for res in backend.get_batch(&names, &mut refs) {
            let n = res.map_err(|e| anyhow::anyhow!("get: {e}"))?;
            r.bytes += n;
            r.ops += 1;
        }
    }
    r.secs = start.elapsed().as_secs_f64();
    if bufs.first().is_some_and(|b| b.as_slice() != value) {
        bail!("read back different bytes");
    }
    backend.close().map_err(|e| anyhow::anyhow!("close: {e}"))?;
    Ok((w, r))
}
