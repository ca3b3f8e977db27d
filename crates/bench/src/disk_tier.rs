//! `mooncake bench disk-tier`: the local disk tier of a running store next to the disk itself,
//! all in one run on the same directory.
//!
//! - **Peer**: raw sequential I/O of a file in the directory (`bench storage`'s loop): 1 MiB
//!   writes with one `fdatasync` per 64 MiB (the offload batch: 64 tasks of 1 MiB, one sync per
//!   batch), then the page cache dropped (`posix_fadvise(DONTNEED)`) and sequential 1 MiB reads.
//! - **Offload**: a `mooncake master --enable_offload` child and, in this process, a store node
//!   (memory segment large enough for every object, a disk in the directory) and a reader
//!   without memory. The reader puts `--bytes` of 1 MiB objects; the time from the first put to
//!   the master counting every offload stored gives the offload MB/s (the puts themselves take a
//!   small part of it: memory copies). The node writes one offload batch at a time (the
//!   default); the row "two batches written at once" repeats the offload with two in flight,
//!   in the same round, to show what overlapping one batch's `fdatasync` with the next batch's
//!   copy gives.
//! - **LOCAL_DISK get**: the node closes and a new node opens the same directory: it re-mounts
//!   and advertises every object, which is now on disk only. Once the old node has expired at
//!   the master (`--client_ttl=2`) the page cache of the directory is dropped and the reader gets
//!   every object once (1 MiB `get`: one load request to the node, one transfer from its staging
//!   memory, checksum); then, the cache dropped again, once more 16 keys per `get_batch` (one
//!   load request for the 16, one transfer batch).
//! - **Memory tier, offload off vs on**: the same puts then two passes of gets, against a master
//!   and node without a disk, and against a master with eager offload and a node with a disk
//!   (whose offload runs during the puts).
//!
//! Each round runs all of it in turn (off and on alternating which goes first); the table shows
//! medians per row, and each round's own ratios go to stderr.

use anyhow::{bail, Context};
use mooncake_client::{DiskConfig, StoreClient};
use mooncake_common::ReplicateConfig;
use mooncake_proto::methods as m;
use mooncake_storage::testkit::drop_page_cache;
use mooncake_storage::Durability;
use mooncake_transfer::TransportMode;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::storage::{raw_sequential, Rate};
use crate::store::{client_config, runtime, start_master_with, CopyTuning};

const MIB: usize = 1 << 20;
/// Objects per offload batch (the node's default), so the raw loop syncs as often.
const OFFLOAD_BATCH: usize = 64;
/// Keys per `get_batch` of the batch row.
const GET_BATCH: usize = 16;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Bytes of 1 MiB objects per case (and of the raw file).
    #[arg(long, default_value = "256MiB", value_parser = crate::parse_size_arg)]
    bytes: u64,
    /// Directory on the disk to measure (a scratch subdirectory is created and removed);
    /// default: the system temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Rounds (raw file, disk tier, memory tier off and on, the last two in alternating order);
    /// medians printed, with each round's ratios on stderr.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Upper bound on each phase, in seconds.
    #[arg(long, default_value_t = 120.0)]
    seconds: f64,
    /// Transport between the reader and the node: `auto` (shared memory), `tcp`.
    #[arg(long, default_value = "auto")]
    transport: TransportMode,
}

/// One node (memory segment, optional disk) and one reader without memory, on a master child.
struct Cluster {
    _master: crate::store::KillOnDrop,
    node: StoreClient,
    reader: StoreClient,
}

impl Cluster {
    async fn start(
        args: &Args,
        master_flags: &[&str],
        segment: u64,
        disk: Option<DiskConfig>,
    ) -> anyhow::Result<Cluster> {
        let (master, addr) = start_master_with(master_flags)?;
        let node = connect(args, &addr, segment, disk).await.context("node")?;
        let reader = connect(args, &addr, 0, None).await.context("reader")?;
        Ok(Cluster {
            _master: master,
            node,
            reader,
        })
    }

    async fn close(self) {
        let _ = self.reader.close().await;
        let _ = self.node.close().await;
    }
}

async fn connect(
    args: &Args,
    master: &str,
    segment: u64,
    disk: Option<DiskConfig>,
) -> anyhow::Result<StoreClient> {
    let mut config = client_config(
        master,
        segment,
        args.transport,
        None,
        true,
        &CopyTuning::default(),
    );
    config.disk = disk;
    Ok(StoreClient::connect(config).await?)
}

fn key(i: usize) -> String {
    format!("disk-bench/{i}")
}

/// Puts `n` objects of `value` through `c`; the rate.
async fn put_all(c: &StoreClient, n: usize, value: &[u8], limit: Duration) -> anyhow::Result<Rate> {
    let start = Instant::now();
    for i in 0..n {
        c.put(&key(i), value, &ReplicateConfig::default())
            .await
            .with_context(|| format!("put {}", key(i)))?;
        if start.elapsed() > limit {
            bail!("puts did not finish within {limit:?}");
        }
    }
    Ok(Rate {
        bytes: (n * value.len()) as u64,
        ops: n as u64,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// Gets the `n` objects `passes` times through `c`, `batch` keys per call (`get` when 1,
/// `get_batch` otherwise), checking each against `value`; the rate.
async fn get_all(
    c: &StoreClient,
    n: usize,
    passes: usize,
    batch: usize,
    value: &[u8],
) -> anyhow::Result<Rate> {
    let names: Vec<String> = (0..n).map(key).collect();
    let start = Instant::now();
    for _ in 0..passes {
        for chunk in names.chunks(batch) {
            let got = if batch == 1 {
                vec![c.get(&chunk[0]).await]
            } else {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                c.get_batch(&refs).await
            };
            for (name, got) in chunk.iter().zip(got) {
                if got.with_context(|| format!("get {name}"))? != value {
                    bail!("{name}: other bytes than were put");
                }
            }
        }
    }
    Ok(Rate {
        bytes: (n * passes * value.len()) as u64,
        ops: (n * passes) as u64,
        secs: start.elapsed().as_secs_f64(),
    })
}

async fn offload_stats(c: &StoreClient) -> anyhow::Result<m::OffloadStatsReply> {
    Ok(c.master().call(&m::GetOffloadStats {}).await?)
}

/// Polls until `done` holds for the offload stats (at most `limit`).
async fn wait_stats(
    c: &StoreClient,
    limit: Duration,
    what: &str,
    done: impl Fn(&m::OffloadStatsReply) -> bool,
) -> anyhow::Result<m::OffloadStatsReply> {
    let deadline = Instant::now() + limit;
    loop {
        let s = offload_stats(c).await?;
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("{what} not reached within {limit:?}: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A `mooncake master --enable_offload --client_ttl=2` child, a node with `disk` and a reader
/// after the reader put `n` objects, and the offload rate: from the first put until the master
/// counts every offload stored.
async fn offloaded(
    args: &Args,
    disk: &DiskConfig,
    n: usize,
    value: &[u8],
) -> anyhow::Result<(Cluster, String, Rate)> {
    let limit = Duration::from_secs_f64(args.seconds);
    let bytes = (n * value.len()) as u64;
    let flags = ["--enable_offload=true", "--client_ttl=2"];
    let (master, addr) = start_master_with(&flags)?;
    let node = connect(args, &addr, segment_for(bytes), Some(disk.clone()))
        .await
        .context("node")?;
    let reader = connect(args, &addr, 0, None).await.context("reader")?;
    let start = Instant::now();
    put_all(&reader, n, value, limit).await?;
    let stats = wait_stats(&reader, limit, "every offload stored", |s| {
        s.stored + s.refused >= n as u64
    })
    .await?;
    let offload = Rate {
        bytes,
        ops: n as u64,
        secs: start.elapsed().as_secs_f64(),
    };
    if stats.stored < n as u64 {
        bail!("offloads refused: {stats:?}");
    }
    let cluster = Cluster {
        _master: master,
        node,
        reader,
    };
    Ok((cluster, addr, offload))
}

/// Memory for every object of `bytes`, with room to spare.
fn segment_for(bytes: u64) -> u64 {
    bytes + bytes / 2
}

/// The offload rate of `n` objects into `dir` with `writes` batches written at once.
async fn offload_case(
    args: &Args,
    dir: &Path,
    n: usize,
    value: &[u8],
    writes: usize,
) -> anyhow::Result<Rate> {
    let mut disk = DiskConfig::new(dir, (n * value.len()) as u64 * 2);
    disk.offload_writes = writes;
    let (cluster, _, offload) = offloaded(args, &disk, n, value).await?;
    cluster.close().await;
    Ok(offload)
}

/// Offload MB/s, LOCAL_DISK get MB/s and LOCAL_DISK batch get MB/s of `n` objects in `dir`.
async fn disk_case(
    args: &Args,
    dir: &Path,
    n: usize,
    value: &[u8],
) -> anyhow::Result<(Rate, Rate, Rate)> {
    let limit = Duration::from_secs_f64(args.seconds);
    let bytes = (n * value.len()) as u64;
    let segment = segment_for(bytes);
    let disk = DiskConfig::new(dir, bytes * 2);
    let (cluster, addr, offload) = offloaded(args, &disk, n, value).await?;
    let Cluster {
        _master,
        node,
        reader,
    } = cluster;
    // A new node on the same directory (once the old one let go of it): every object is on
    // its disk only.
    node.close().await?;
    drop(node);
    let deadline = Instant::now() + limit;
    let node = loop {
        match connect(args, &addr, segment, Some(disk.clone())).await {
            Ok(node) => break node,
            // The old node's tasks may still hold the directory's lock for a moment.
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.context("restarted node")),
        }
    };
    wait_stats(&reader, limit, "the old node expired", |s| s.disks == 1).await?;
    drop_page_cache(dir).context("dropping the page cache")?;
    let get = get_all(&reader, n, 1, 1, value).await?;
    drop_page_cache(dir).context("dropping the page cache")?;
    let batch = get_all(&reader, n, 1, GET_BATCH, value).await?;
    let loads = reader
        .stats()
        .offload_rpc_reads
        .load(std::sync::atomic::Ordering::Relaxed);
    if loads < n as u64 {
        bail!("only {loads} of {n} gets were read from disk");
    }
    let _ = reader.close().await;
    let _ = node.close().await;
    Ok((offload, get, batch))
}

/// Memory-tier put and get rates, with a disk and eager offload (`dir`) or without.
async fn memory_case(
    args: &Args,
    dir: Option<&Path>,
    n: usize,
    value: &[u8],
) -> anyhow::Result<(Rate, Rate)> {
    let limit = Duration::from_secs_f64(args.seconds);
    let bytes = (n * value.len()) as u64;
    let segment = segment_for(bytes);
    let cluster = match dir {
        Some(dir) => {
            let _ = std::fs::remove_dir_all(dir);
            let disk = DiskConfig::new(dir, bytes * 2);
            Cluster::start(args, &["--enable_offload=true"], segment, Some(disk)).await?
        }
        None => Cluster::start(args, &[], segment, None).await?,
    };
    let put = put_all(&cluster.reader, n, value, limit).await?;
    let get = get_all(&cluster.reader, n, 2, 1, value).await?;
    if dir.is_some() {
        wait_stats(&cluster.reader, limit, "offload settled", |s| {
            s.in_flight == 0
        })
        .await?;
    }
    cluster.close().await;
    Ok((put, get))
}

/// The median (by MB/s) of `rates`.
fn median(mut rates: Vec<Rate>) -> Rate {
    rates.sort_by(|a, b| a.mb_s().total_cmp(&b.mb_s()));
    rates.get(rates.len() / 2).copied().unwrap_or_default()
}

fn row(case: &str, r: Rate, peer: Option<(&str, Rate)>) {
    let (name, ratio, peer_mb) = match peer {
        Some((name, p)) => (
            name.to_string(),
            format!("{:.2}", r.mb_s() / p.mb_s().max(1e-9)),
            format!("{:.0}", p.mb_s()),
        ),
        None => (String::new(), String::new(), String::new()),
    };
    println!(
        "| {case} | {:.0} | {:.0} | {name} | {peer_mb} | {ratio} |",
        r.mb_s(),
        r.ops_s()
    );
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = base.join(format!("mooncake-bench-disk-tier-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let result = measure(&args, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// One round: the raw file, the disk tier, then the memory tier off and on (on first when
/// `on_first`).
fn round(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    scratch: &Path,
    value: &[u8],
    n: usize,
    on_first: bool,
) -> anyhow::Result<[Rate; 10]> {
    let limit = Duration::from_secs_f64(args.seconds);
    let raw_dir = scratch.join("raw");
    std::fs::create_dir_all(&raw_dir)?;
    let (raw_write, raw_read) = raw_sequential(
        &raw_dir,
        value,
        OFFLOAD_BATCH,
        Durability::Batch,
        (n * MIB) as u64,
        limit,
        false,
    )?;
    std::fs::remove_dir_all(&raw_dir)?;
    let disk_dir = scratch.join("disk");
    let (offload, disk_get, disk_batch) = rt.block_on(disk_case(args, &disk_dir, n, value))?;
    std::fs::remove_dir_all(&disk_dir)?;
    let two_at_once = rt.block_on(offload_case(args, &disk_dir, n, value, 2))?;
    std::fs::remove_dir_all(&disk_dir)?;
    let memory_dir = scratch.join("memory");
    let mut order = [false, true];
    if on_first {
        order.reverse();
    }
    let mut off = (Rate::default(), Rate::default());
    let mut on = off;
    for offload_on in order {
        let dir = offload_on.then_some(memory_dir.as_path());
        let rates = rt.block_on(memory_case(args, dir, n, value))?;
        *if offload_on { &mut on } else { &mut off } = rates;
    }
    let _ = std::fs::remove_dir_all(&memory_dir);
    Ok([
        raw_write,
        raw_read,
        offload,
        disk_get,
        off.0,
        on.0,
        off.1,
        on.1,
        disk_batch,
        two_at_once,
    ])
}

fn measure(args: &Args, scratch: &Path) -> anyhow::Result<()> {
    let n = usize::try_from(args.bytes / MIB as u64)?.max(OFFLOAD_BATCH);
    let mut value = vec![0u8; MIB];
    crate::fill_pattern(&mut value, 7);
    let rt = runtime()?;
    let rounds = args.rounds.max(1);
    let mut all: Vec<[Rate; 10]> = Vec::new();
    for r in 0..rounds {
        all.push(round(args, &rt, scratch, &value, n, r % 2 == 1)?);
    }
    let m: Vec<Rate> = (0..10)
        .map(|i| median(all.iter().map(|r| r[i]).collect()))
        .collect();
    println!(
        "disk tier, {n} objects of 1 MiB, directory {}, transport {:?}, medians of {rounds} rounds",
        scratch.display(),
        args.transport,
    );
    println!("| case | MB/s | ops/s | peer | peer MB/s | ratio |");
    println!("|---|---:|---:|---|---:|---:|");
    row("raw sequential write, fdatasync per 64 MiB", m[0], None);
    row("raw sequential read, page cache dropped", m[1], None);
    row(
        "offload (put → LOCAL_DISK stored)",
        m[2],
        Some(("raw write", m[0])),
    );
    row(
        "offload, two batches written at once",
        m[9],
        Some(("raw write", m[0])),
    );
    row(
        "LOCAL_DISK get 1 MiB, page cache dropped",
        m[3],
        Some(("raw read", m[1])),
    );
    row(
        "LOCAL_DISK batch_get 16 × 1 MiB, page cache dropped",
        m[8],
        Some(("raw read", m[1])),
    );
    row("memory put 1 MiB, offload off", m[4], None);
    row(
        "memory put 1 MiB, eager offload on",
        m[5],
        Some(("offload off", m[4])),
    );
    row("memory get 1 MiB, offload off", m[6], None);
    row(
        "memory get 1 MiB, eager offload on",
        m[7],
        Some(("offload off", m[6])),
    );
    for (i, r) in all.iter().enumerate() {
        eprintln!(
            "round {i}: offload / raw write {:.2} (two batches at once {:.2}), disk get / raw read {:.2}, disk batch get / raw read {:.2}, put on / off {:.2}, get on / off {:.2}",
            r[2].mb_s() / r[0].mb_s().max(1e-9),
            r[9].mb_s() / r[0].mb_s().max(1e-9),
            r[3].mb_s() / r[1].mb_s().max(1e-9),
            r[8].mb_s() / r[1].mb_s().max(1e-9),
            r[5].mb_s() / r[4].mb_s().max(1e-9),
            r[7].mb_s() / r[6].mb_s().max(1e-9),
        );
    }
    Ok(())
}
