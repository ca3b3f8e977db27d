//! `mooncake bench ops`: the work store nodes do for the master, with real processes (a master and
//! `mooncake store` nodes started from this binary, all on this host).
//!
//! * **Drain.** Node A holds `--objects` objects; a drain job moves them to node B while a reader
//!   reads them all in a loop. Printed: the drain's MB/s next to the same run's store-to-store
//!   write rate (this process writing the same objects into B's segment, 16 per batch, as A's
//!   runner moves 16 at a time), and the reader's p50/p99 during the drain next to its own before
//!   it (wrong bytes and failed reads are counted; both must be 0).
//! * **Join ramp.** Nodes A and B are half full (`free_ratio_first` placement); node C joins
//!   empty; a paced batch-put workload (16 × 256 KiB per batch, 20 batches/s) runs for
//!   `--ramp-seconds`. Printed per second since the join: C's share of the bytes written and the
//!   batch puts' p99, next to the p99 of the same workload before C joined.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{DrainJobRequest, DrainJobStatus, ReplicaKind, ReplicateConfig};
use mooncake_master::strategy::JOIN_RAMP_MS;
use mooncake_proto::methods as m;

use crate::scaling::Histogram;
use crate::store::{runtime, start_master_with, KillOnDrop};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Objects the drained node holds.
    #[arg(long, default_value_t = 512)]
    pub objects: usize,
    /// Size of each drained object.
    #[arg(long, default_value = "1MiB", value_parser = crate::parse_size_arg)]
    pub object_size: u64,
    /// Memory segment of each node.
    #[arg(long, default_value = "1GiB", value_parser = crate::parse_size_arg)]
    pub segment: u64,
    /// Seconds of the join-ramp workload after the new node joins.
    #[arg(long, default_value_t = 12)]
    pub ramp_seconds: u64,
    /// Skip a part: drain, join (repeatable).
    #[arg(long)]
    pub skip: Vec<String>,
}

/// Objects per batch put (and the node's task runner moves 16 at a time).
const BATCH: usize = 16;
/// Object size of the join-ramp workload.
const RAMP_OBJECT: usize = 256 << 10;
/// Batches per second of the join-ramp workload.
const RAMP_RATE: u64 = 20;

/// A `mooncake store` child process; killed on drop.
struct Node {
    _child: KillOnDrop,
    name: String,
    endpoint: String,
}

fn start_node(master: &str, segment: u64) -> anyhow::Result<Node> {
    let exe = std::env::current_exe().context("locating the mooncake binary")?;
    let segment = segment.to_string();
    let mut child = KillOnDrop(
        Command::new(exe)
            .args(["store", "--master", master, "--segment-size", &segment])
            .args(["--drain-on-shutdown-secs", "0"])
            .env("MOONCAKE_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .context("starting mooncake store")?,
    );
    let stdout = child.0.stdout.take().context("node stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let word = |tag: &str| {
        line.split_whitespace()
            .skip_while(|w| *w != tag)
            .nth(1)
            .map(str::to_string)
            .with_context(|| format!("no {tag} in the node's first line {line:?}"))
    };
    Ok(Node {
        name: word("name")?,
        endpoint: word("endpoint")?,
        _child: child,
    })
}

async fn connect(master: &str) -> anyhow::Result<StoreClient> {
    Ok(StoreClient::connect(StoreConfig {
        master_addr: master.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        ..StoreConfig::default()
    })
    .await?)
}

fn on(node: &Node) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![node.name.clone()],
        ..ReplicateConfig::default()
    }
}

fn value(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    crate::fill_pattern(&mut v, seed);
    v
}

fn mb_per_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / 1e6 / took.as_secs_f64().max(1e-9)
}

/// Puts `keys[i]` = `values[i]` with `config`, `BATCH` per call; returns the time it took.
async fn put_all(
    c: &StoreClient,
    keys: &[String],
    values: &[Vec<u8>],
    config: &ReplicateConfig,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for (ks, vs) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
        let items: Vec<(&str, &[u8])> = ks
            .iter()
            .zip(vs)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        for r in c.put_batch(&items, config).await {
            r.context("batch put")?;
        }
    }
    Ok(started.elapsed())
}

/// What a reader saw.
#[derive(Debug, Default)]
struct ReaderStats {
    latency: Histogram,
    wrong: u64,
    failed: u64,
}

/// Reads `keys` round-robin until `stop`, checking every byte against `values`.
async fn read_loop(
    c: StoreClient,
    keys: Arc<Vec<String>>,
    values: Arc<Vec<Vec<u8>>>,
    stop: Arc<AtomicBool>,
) -> ReaderStats {
    let mut stats = ReaderStats::default();
    let mut buf = vec![0u8; values.first().map_or(0, Vec::len)];
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let k = i % keys.len();
        i += 1;
        let started = Instant::now();
        match c.get_into(&keys[k], &mut buf).await {
            Ok(n) => {
                stats.latency.record(started.elapsed());
                if buf[..n as usize] != values[k][..] {
                    stats.wrong += 1;
                }
            }
            Err(_) => stats.failed += 1,
        }
    }
    stats
}

/// Starts [`read_loop`] on its own task; set the flag to stop it.
fn spawn_reader(
    rt: &tokio::runtime::Runtime,
    c: &StoreClient,
    keys: &Arc<Vec<String>>,
    values: &Arc<Vec<Vec<u8>>>,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<ReaderStats>) {
    let stop = Arc::new(AtomicBool::new(false));
    let handle = rt.spawn(read_loop(
        c.clone(),
        keys.clone(),
        values.clone(),
        stop.clone(),
    ));
    (stop, handle)
}

fn drain(rt: &tokio::runtime::Runtime, args: &Args) -> anyhow::Result<()> {
    let (_master, master_addr) = start_master_with(&[])?;
    let a = start_node(&master_addr, args.segment)?;
    let b = start_node(&master_addr, args.segment)?;
    let c = rt.block_on(connect(&master_addr))?;
    let len = usize::try_from(args.object_size)?;
    let keys: Arc<Vec<String>> = Arc::new((0..args.objects).map(|i| format!("d/{i}")).collect());
    let values: Arc<Vec<Vec<u8>>> =
        Arc::new((0..args.objects).map(|i| value(len, i as u64)).collect());
    let total = (len * args.objects) as u64;
    // The floor: the same objects written into B's segment by this process.
    let floor_keys: Vec<String> = (0..args.objects).map(|i| format!("f/{i}")).collect();
    let floor = rt.block_on(put_all(&c, &floor_keys, &values, &on(&b)))?;
    let refs: Vec<&str> = floor_keys.iter().map(String::as_str).collect();
    rt.block_on(c.batch_remove(&refs, true))?;
    rt.block_on(put_all(&c, &keys, &values, &on(&a)))?;
    // The reader alone, for as long as the drain will roughly take (at least 2 s).
    let (stop, reader) = spawn_reader(rt, &c, &keys, &values);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let before = rt.block_on(reader)?;
    let (stop, reader) = spawn_reader(rt, &c, &keys, &values);
    let master = c.master();
    let request = DrainJobRequest {
        segments: vec![a.name.clone()],
        target_segments: vec![b.name.clone()],
        max_concurrency: 4,
    };
    let started = Instant::now();
    let id = rt.block_on(master.call(&m::CreateDrainJob { request }))?;
    let mut first_move = None;
    let view = loop {
        let view = rt.block_on(master.call(&m::QueryDrainJob { id }))?;
        if first_move.is_none() && view.migrated_bytes > 0 {
            first_move = Some(started.elapsed());
        }
        if matches!(
            view.status,
            DrainJobStatus::Succeeded | DrainJobStatus::Failed | DrainJobStatus::Canceled
        ) {
            break view;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "drain did not end in 600 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let during = rt.block_on(reader)?;
    anyhow::ensure!(
        view.status == DrainJobStatus::Succeeded,
        "drain {}: {}",
        view.status.name(),
        view.message
    );
    let moving = took.saturating_sub(first_move.unwrap_or_default());
    let floor_mbs = mb_per_s(total, floor);
    println!(
        "drain: {} objects x {} from node A to node B (same host), a reader reading them all \
         in a loop",
        args.objects,
        mooncake_common::format_size(args.object_size)
    );
    println!("| measure | MB/s or µs | vs floor |");
    println!("|---|---:|---:|");
    println!("| floor: store-to-store write into B (this process, {BATCH} per batch) | {floor_mbs:.0} MB/s | 1.00 |");
    for (what, t) in [
        ("drain, job created → SUCCEEDED", took),
        ("drain, first object moved → SUCCEEDED", moving),
    ] {
        let rate = mb_per_s(view.migrated_bytes, t);
        println!(
            "| {what} ({:.2} s, {} moved) | {rate:.0} MB/s | {:.2} |",
            t.as_secs_f64(),
            mooncake_common::format_size(view.migrated_bytes),
            rate / floor_mbs
        );
    }
    for (what, s) in [("before the drain", &before), ("during the drain", &during)] {
        println!(
            "| reader p50 / p99 {what} ({} reads, {} wrong, {} failed) | {:.0} / {:.0} µs | {:.2}x p99 |",
            s.latency.total(),
            s.wrong,
            s.failed,
            s.latency.quantile_us(0.5),
            s.latency.quantile_us(0.99),
            s.latency.quantile_us(0.99) / before.latency.quantile_us(0.99).max(1e-9)
        );
    }
    rt.block_on(c.close())?;
    Ok(())
}

/// One paced batch of the join-ramp workload: when it started (since the reference time), how
/// long it took, its keys.
struct Batch {
    at: Duration,
    took: Duration,
    keys: Vec<String>,
}

/// Batch puts of `RAMP_OBJECT`-byte objects at `RAMP_RATE` batches/s for `secs` seconds, keys
/// `prefix/N`; times are measured from `since`.
async fn paced_puts(
    c: &StoreClient,
    prefix: &str,
    secs: u64,
    since: Instant,
    payload: &[u8],
) -> anyhow::Result<Vec<Batch>> {
    let period = Duration::from_millis(1000 / RAMP_RATE);
    let start = Instant::now();
    let mut out = Vec::new();
    for n in 0..secs * RAMP_RATE {
        let due = start + period * n as u32;
        tokio::time::sleep_until(due.into()).await;
        let keys: Vec<String> = (0..BATCH).map(|i| format!("{prefix}/{n}/{i}")).collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), payload)).collect();
        let began = Instant::now();
        for r in c.put_batch(&items, &ReplicateConfig::default()).await {
            r.context("batch put")?;
        }
        out.push(Batch {
            at: began.duration_since(since),
            took: began.elapsed(),
            keys,
        });
    }
    Ok(out)
}

/// Keys of `batches` whose replica is on `endpoint`.
async fn on_endpoint(
    c: &StoreClient,
    batches: &[Batch],
    endpoint: &str,
) -> anyhow::Result<std::collections::HashSet<String>> {
    let mut found = std::collections::HashSet::new();
    let keys: Vec<&str> = batches
        .iter()
        .flat_map(|b| b.keys.iter().map(String::as_str))
        .collect();
    for chunk in keys.chunks(256) {
        let answers = c.batch_get_replica_desc(chunk).await?;
        for (key, answer) in chunk.iter().zip(answers) {
            let here = answer.unwrap_or_default().iter().any(|r| {
                matches!(&r.kind, ReplicaKind::Memory(mem) if mem.transport_endpoint.to_string() == endpoint)
            });
            if here {
                found.insert(key.to_string());
            }
        }
    }
    Ok(found)
}

fn p99_ms(batches: &[&Batch]) -> f64 {
    let mut h = Histogram::default();
    for b in batches {
        h.record(b.took);
    }
    h.quantile_us(0.99) / 1000.0
}

fn join(rt: &tokio::runtime::Runtime, args: &Args) -> anyhow::Result<()> {
    let (_master, master_addr) = start_master_with(&["--allocation_strategy=free_ratio_first"])?;
    let a = start_node(&master_addr, args.segment)?;
    let b = start_node(&master_addr, args.segment)?;
    let mounted = Instant::now();
    let c = rt.block_on(connect(&master_addr))?;
    let payload = value(RAMP_OBJECT, 11);
    // A and B half full.
    let per_node = usize::try_from(args.segment / 2)? / RAMP_OBJECT;
    for (node, tag) in [(&a, "fa"), (&b, "fb")] {
        let keys: Vec<String> = (0..per_node).map(|i| format!("{tag}/{i}")).collect();
        let values = vec![payload.clone(); BATCH];
        for chunk in keys.chunks(BATCH) {
            rt.block_on(put_all(&c, chunk, &values[..chunk.len()], &on(node)))?;
        }
    }
    // Past A's and B's own join ramps, the steady state on two nodes.
    std::thread::sleep(Duration::from_millis(JOIN_RAMP_MS).saturating_sub(mounted.elapsed()));
    let steady = rt.block_on(paced_puts(&c, "s", 4, Instant::now(), &payload))?;
    let steady_keys: Vec<&str> = steady
        .iter()
        .flat_map(|b| b.keys.iter().map(String::as_str))
        .collect();
    rt.block_on(c.batch_remove(&steady_keys, true))?;
    let steady_p99 = p99_ms(&steady.iter().collect::<Vec<_>>());
    let new = start_node(&master_addr, args.segment)?;
    let joined = Instant::now();
    let ramp = rt.block_on(paced_puts(&c, "r", args.ramp_seconds, joined, &payload))?;
    let on_new = rt.block_on(on_endpoint(&c, &ramp, &new.endpoint))?;
    println!(
        "join ramp: nodes A and B half full ({} each), node C joins empty, then {RAMP_RATE} batch \
         puts/s of {BATCH} x {} (free_ratio_first; ramp {} s)",
        mooncake_common::format_size(args.segment),
        mooncake_common::format_size(RAMP_OBJECT as u64),
        JOIN_RAMP_MS / 1000
    );
    println!(
        "steady state before C joined: batch put p99 {steady_p99:.2} ms ({} batches)",
        steady.len()
    );
    println!(
        "| second after C joined | batches | C's share of bytes | batch put p99 | vs steady p99 |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for s in 0..args.ramp_seconds {
        let in_second: Vec<&Batch> = ramp.iter().filter(|b| b.at.as_secs() == s).collect();
        if in_second.is_empty() {
            continue;
        }
        let keys: u64 = in_second.iter().map(|b| b.keys.len() as u64).sum();
        let on_c = in_second
            .iter()
            .flat_map(|b| &b.keys)
            .filter(|k| on_new.contains(*k))
            .count() as u64;
        let p99 = p99_ms(&in_second);
        println!(
            "| {s}–{} | {} | {:.2} | {p99:.2} ms | {:.2}x |",
            s + 1,
            in_second.len(),
            on_c as f64 / keys as f64,
            p99 / steady_p99.max(1e-9)
        );
    }
    let all: Vec<&Batch> = ramp.iter().collect();
    println!(
        "whole ramp: batch put p99 {:.2} ms ({:.2}x steady); C got {} of {} objects",
        p99_ms(&all),
        p99_ms(&all) / steady_p99.max(1e-9),
        on_new.len(),
        ramp.len() * BATCH
    );
    rt.block_on(c.close())?;
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = runtime()?;
    let skip = |part: &str| args.skip.iter().any(|s| s == part);
    if !skip("drain") {
        drain(&rt, &args)?;
        println!();
    }
    if !skip("join") {
        join(&rt, &args)?;
    }
    Ok(())
}
