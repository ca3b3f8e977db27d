//! `mooncake bench oplog-compaction`: what the op-log leaves in etcd after many puts, with and
//! without compaction (docs/oplog.md, "Compaction"). Each case starts its own single-member etcd
//! (free loopback ports, stopped at the end) and a master with `--enable_oplog`; the compaction
//! case also gives it a snapshot directory and periodic snapshots. Clients put new 1 KiB
//! objects (PutStart+PutEnd, 16 connections × 16 in flight) until the count is reached. Then
//! the keys under the log, etcd's database size and the part of it in use, and the size after a
//! defragmentation; in the compaction case, the time of one more snapshot of the log taken in
//! this process as the master takes it.

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use mooncake_master::MasterServiceConfig;
use mooncake_oplog::checkpoint::checkpoint;
use mooncake_oplog::etcd::{oplog_root, EtcdLog};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_rpc::ClientConfig;
use mooncake_snapshot::{EncodeOptions, SnapshotDir};

use crate::master::{drive, setup, MasterChild, Op};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Puts per case (each one PutStart + PutEnd).
    #[arg(long, default_value_t = 1_000_000)]
    puts: usize,
    /// `--snapshot_interval_seconds` of the compaction case.
    #[arg(long, default_value_t = 10)]
    snapshot_seconds: u64,
    /// `--oplog_ack` of both cases.
    #[arg(long, default_value = "durable")]
    ack: String,
    /// Connections putting at once.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Puts in flight per connection.
    #[arg(long, default_value_t = 16)]
    per_connection: usize,
}

const CLUSTER: &str = "bench-compaction";
/// Puts are driven in rounds of this many seconds until the count is reached.
const ROUND_SECONDS: f64 = 2.0;
const MIB: f64 = 1024.0 * 1024.0;

/// One case's figures.
struct Row {
    puts: usize,
    seconds: f64,
    batches: u64,
    floor_batch: u64,
    keys: i64,
    db: i64,
    in_use: i64,
    defragmented: i64,
    /// The time of one snapshot of the log (compaction case).
    snapshot: Option<String>,
}

/// Puts new objects on `connections` connections until `puts` are done; returns the count.
async fn put_until(master: &MasterChild, args: &Args) -> anyhow::Result<usize> {
    let mut ctxs = Vec::new();
    for _ in 0..args.connections {
        ctxs.push(Rc::new(
            setup(master.addr, 0, ClientConfig::default()).await?,
        ));
    }
    let mut done = 0;
    while done < args.puts {
        let mut round = Vec::new();
        for ctx in &ctxs {
            let (ctx, k) = (ctx.clone(), args.per_connection);
            round.push(tokio::task::spawn_local(async move {
                drive(ctx, Op::PutStartEnd, k, ROUND_SECONDS).await
            }));
        }
        for cell in round {
            done += cell.await??.0;
        }
    }
    Ok(done)
}

/// One more snapshot of the log, in this process, as the master takes it: the newest snapshot
/// loaded, the log after it replayed, the fold written, the log compacted. Returns its line.
async fn time_one_snapshot(log: &EtcdLog, dir: &Path) -> anyhow::Result<String> {
    let dir = SnapshotDir::open(dir, 2)?;
    let started = Instant::now();
    let done = checkpoint(
        MasterServiceConfig::default(),
        log,
        &dir,
        &EncodeOptions::default(),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    Ok(format!(
        "one more snapshot of the log after the run: {:.2} s wall ({} objects, {} bytes; the \
         newest snapshot loaded, the log after it replayed up to batch {}, the fold written, \
         the log compacted)",
        started.elapsed().as_secs_f64(),
        done.report.objects,
        done.report.bytes,
        done.prefix.batch_id
    ))
}

async fn run_case(
    flags: &[String],
    snapshots: Option<&Path>,
    etcd: &EtcdServer,
    args: &Args,
) -> anyhow::Result<Row> {
    let master = MasterChild::start(flags)?;
    let started = Instant::now();
    let puts = put_until(&master, args).await?;
    let seconds = started.elapsed().as_secs_f64();
    drop(master);
    let log = EtcdLog::connect(
        &[etcd.endpoint()],
        oplog_root(CLUSTER),
        Duration::from_secs(10),
    )
    .await?;
    let batches = log.read_prefix().await?.map_or(0, |p| p.batch_id);
    let floor_batch = log.read_floor().await?.map_or(0, |p| p.batch_id);
    let keys = log.key_count().await?;
    let (db, in_use) = etcd.db_size().await;
    etcd.defragment().await;
    let (defragmented, _) = etcd.db_size().await;
    let snapshot = match snapshots {
        Some(dir) => Some(time_one_snapshot(&log, dir).await?),
        None => None,
    };
    Ok(Row {
        puts,
        seconds,
        batches,
        floor_batch,
        keys,
        db,
        in_use,
        defragmented,
        snapshot,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    println!(
        "mooncake bench oplog-compaction: {} puts per case (1 KiB, PutStart+PutEnd), {} \
         connections × {} in flight, --oplog_ack={}; a fresh single-member etcd per case; load \
         average {}",
        args.puts,
        args.connections,
        args.per_connection,
        args.ack,
        crate::snapshot::load_average()
    );
    let tmp = tempfile::tempdir()?;
    let base = vec![
        "--enable_oplog".to_string(),
        format!("--cluster_id={CLUSTER}"),
        format!("--oplog_ack={}", args.ack),
    ];
    let snapshots = tmp.path().join("snapshots");
    let compaction = vec![
        format!("--snapshot_dir={}", snapshots.display()),
        "--enable_snapshot".into(),
        format!("--snapshot_interval_seconds={}", args.snapshot_seconds),
    ];
    println!();
    println!(
        "{:<34} {:>9} {:>7} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
        "case",
        "puts",
        "s",
        "puts/s",
        "batches",
        "floor",
        "keys",
        "db_MiB",
        "inuse_MiB",
        "defrag_MiB"
    );
    for (label, extra, dir) in [
        ("no compaction", Vec::new(), None),
        (
            "compaction (snapshot every N s)",
            compaction,
            Some(snapshots.as_path()),
        ),
    ] {
        let etcd = EtcdServer::start();
        let mut flags = base.clone();
        flags.push(format!("--etcd_endpoints={}", etcd.endpoint()));
        flags.extend(extra);
        let row = local.block_on(&runtime, run_case(&flags, dir, &etcd, &args))?;
        println!(
            "{:<34} {:>9} {:>7.1} {:>8.0} {:>9} {:>9} {:>8} {:>9.1} {:>9.1} {:>9.1}",
            label.replace('N', &args.snapshot_seconds.to_string()),
            row.puts,
            row.seconds,
            row.puts as f64 / row.seconds,
            row.batches,
            row.floor_batch,
            row.keys,
            row.db as f64 / MIB,
            row.in_use as f64 / MIB,
            row.defragmented as f64 / MIB,
        );
        if let Some(line) = row.snapshot {
            println!("  {line}");
        }
    }
    println!();
    println!(
        "(batches: the log's batch count at the end; floor: the batch up to which the log was \
         deleted; keys: etcd keys under the log; db/inuse: etcd's database file and the part in \
         use, before defrag_MiB: the file after a defragmentation)"
    );
    Ok(())
}
