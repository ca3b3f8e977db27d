//! `mooncake bench oplog`: what the op-log costs. Starts a real etcd for the run (the `etcd`
//! binary, free loopback ports, stopped at the end), measures the floor under every durable
//! acknowledgement (one etcd transaction with one compare and two puts, as the writer commits a
//! batch), then PutStart+PutEnd pairs on three masters: without the op-log, with
//! `--oplog_ack=durable`, and with `--oplog_ack=visible`, sequentially and with 256 pairs in
//! flight (16 connections × 16). Also prints the etcd keys the log holds after the run.

use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mooncake_oplog::etcd::{oplog_root, EtcdLog, Prefix};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_rpc::ClientConfig;

use crate::master::{drive, setup, MasterChild, Op};
use crate::pingpong::Latency;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds per measured cell.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Sequential etcd transactions for the floor.
    #[arg(long, default_value_t = 2000)]
    txns: usize,
    /// Connections of the in-flight cell.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Pairs in flight per connection.
    #[arg(long, default_value_t = 16)]
    per_connection: usize,
}

/// The floor: sequential commits of a small batch, each one transaction.
async fn etcd_floor(etcd: &EtcdServer, txns: usize) -> anyhow::Result<Latency> {
    let log = EtcdLog::connect(
        &[etcd.endpoint()],
        oplog_root("bench-floor"),
        Duration::from_secs(5),
    )
    .await?;
    let body = vec![0x5a; 160];
    let mut prefix: Option<Prefix> = None;
    let mut samples = Vec::with_capacity(txns);
    let started = Instant::now();
    for i in 0..txns as u64 {
        let next = Prefix {
            batch_id: i + 1,
            last_seq: i + 1,
        };
        let t = Instant::now();
        log.commit(prefix, next, &body).await?;
        samples.push(t.elapsed());
        prefix = Some(next);
    }
    Ok(Latency::from_samples(&mut samples, started.elapsed()))
}

/// Sequential pairs, then `connections` × `per_connection` pairs in flight.
async fn put_cells(master: &MasterChild, args: &Args) -> anyhow::Result<(Latency, Latency)> {
    let ctx = Rc::new(setup(master.addr, 0, ClientConfig::default()).await?);
    let (_, elapsed, mut samples) = drive(ctx, Op::PutStartEnd, 1, args.seconds).await?;
    let seq = Latency::from_samples(&mut samples, elapsed);
    let mut ctxs = Vec::new();
    for _ in 0..args.connections {
        ctxs.push(Rc::new(
            setup(master.addr, 0, ClientConfig::default()).await?,
        ));
    }
    let started = Instant::now();
    let mut cells = Vec::new();
    for ctx in ctxs {
        let (seconds, k) = (args.seconds, args.per_connection);
        cells.push(tokio::task::spawn_local(async move {
            drive(ctx, Op::PutStartEnd, k, seconds).await
        }));
    }
    let mut all = Vec::new();
    for cell in cells {
        let (_, _, samples) = cell.await??;
        all.extend(samples);
    }
    let agg = Latency::from_samples(&mut all, started.elapsed());
    Ok((seq, agg))
}

fn oplog_flags(etcd: &EtcdServer, cluster: &str, ack: &str) -> Vec<String> {
    vec![
        "--enable_oplog".into(),
        format!("--etcd_endpoints={}", etcd.endpoint()),
        format!("--cluster_id={cluster}"),
        format!("--oplog_ack={ack}"),
    ]
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let etcd = EtcdServer::start();
    println!(
        "mooncake bench oplog: etcd {} (single member, WAL fsync per commit); {} s per cell",
        etcd.endpoint(),
        args.seconds
    );
    let floor = local
        .block_on(&runtime, etcd_floor(&etcd, args.txns))
        .context("etcd floor")?;
    println!();
    println!(
        "{:<42} {:>10} {:>9} {:>9}",
        "case", "ops/s", "p50_us", "p99_us"
    );
    let row = |label: &str, l: &Latency| {
        println!(
            "{:<42} {:>10.0} {:>9.1} {:>9.1}",
            label, l.ops_per_sec, l.p50_us, l.p99_us
        );
    };
    row("etcd txn (1 compare, 2 puts), sequential", &floor);
    let inflight = args.connections * args.per_connection;
    for (label, flags) in [
        ("no op-log", Vec::new()),
        (
            "op-log, --oplog_ack=durable",
            oplog_flags(&etcd, "bench-durable", "durable"),
        ),
        (
            "op-log, --oplog_ack=visible",
            oplog_flags(&etcd, "bench-visible", "visible"),
        ),
    ] {
        let master = MasterChild::start(&flags)?;
        let (seq, agg) = local.block_on(&runtime, put_cells(&master, &args))?;
        row(&format!("put pair, {label}, 1 in flight"), &seq);
        row(&format!("put pair, {label}, {inflight} in flight"), &agg);
        drop(master);
    }
    let keys = local.block_on(&runtime, async {
        let mut total = 0;
        for cluster in ["bench-durable", "bench-visible"] {
            let log = EtcdLog::connect(
                &[etcd.endpoint()],
                oplog_root(cluster),
                Duration::from_secs(5),
            )
            .await?;
            total += log.key_count().await?;
        }
        anyhow::Ok(total)
    })?;
    println!();
    println!("(ops/s of a put pair counts pairs; etcd keys under both logs after the run: {keys})");
    Ok(())
}
