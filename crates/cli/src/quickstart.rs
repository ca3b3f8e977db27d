//! `mooncake quickstart`: a whole cluster in one command. Starts a master and two store nodes on
//! loopback (in this process, each node with its own transfer engine), puts and gets a few
//! thousand objects of mixed sizes through a third client that contributes no memory (so every
//! byte crosses to a node), verifies every byte, prints a table and how to reach the cluster.

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use mooncake_client::{PutOutcome, StoreClient, StoreConfig};
use mooncake_common::{format_size, ReplicateConfig};
use mooncake_server::{MasterConfig, RunningMaster};
use mooncake_transfer::TransportMode;
use std::time::{Duration, Instant};

use mooncake_bench::fill_pattern;
use mooncake_bench::pingpong::Latency;

/// Flags of `mooncake quickstart`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Leave the cluster up after the run until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// RPC port of the embedded master (0 = any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Memory each of the two store nodes contributes.
    #[arg(long, default_value = "320MiB", value_parser = crate::node::parse_size_arg)]
    pub segment_size: u64,
    /// Multiply the object counts by this factor (1 = 3,216 objects, 528 MiB each way).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Transport between the client and the nodes: `auto`, `tcp` or `shm`.
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
}

/// Object sizes and how many of each (at scale 1).
const MIX: [(usize, usize); 4] = [
    (4 << 10, 2000),
    (64 << 10, 1000),
    (1 << 20, 200),
    (16 << 20, 16),
];

struct Row {
    size: usize,
    count: usize,
    put: Latency,
    get: Latency,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let master_config = MasterConfig {
        rpc_address: "127.0.0.1".into(),
        port: args.port,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        ..MasterConfig::default()
    };
    let resolved = master_config
        .validate()
        .map_err(|e| anyhow::anyhow!("master config: {e}"))?;
    let master = RunningMaster::start(&master_config, &resolved)
        .await
        .context("starting the embedded master")?;
    let master_addr = master.rpc_addr().to_string();
    let connect = |segment: u64| {
        StoreClient::connect(StoreConfig {
            master_addr: master_addr.clone(),
            local_hostname: "127.0.0.1".into(),
            global_segment_size: segment,
            transport: args.transport,
            ..StoreConfig::default()
        })
    };
    let node_a = connect(args.segment_size).await.context("store node 1")?;
    let node_b = connect(args.segment_size).await.context("store node 2")?;
    let client = connect(0).await.context("client")?;
    println!("mooncake quickstart: master {master_addr}");
    println!(
        "  store node 1 {} ({})",
        node_a.endpoint(),
        format_size(args.segment_size)
    );
    println!(
        "  store node 2 {} ({})",
        node_b.endpoint(),
        format_size(args.segment_size)
    );
    println!(
        "  client       {} (no memory of its own: every byte goes to a node and back)",
        client.endpoint()
    );

    let mix: Vec<(usize, usize)> = MIX
        .iter()
        .map(|&(size, count)| (size, ((count as f64 * args.scale).round() as usize).max(1)))
        .collect();
    let total_ops: u64 = mix.iter().map(|&(_, n)| 2 * n as u64).sum();
    let bar = ProgressBar::new(total_ops);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} ops {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut rows = Vec::new();
    let mut failures = 0usize;
    for &(size, count) in &mix {
        bar.set_message(format!("{} objects", format_size(size as u64)));
        let (row, mismatches) = run_size(&client, &bar, size, count, args.segment_size).await?;
        rows.push(row);
        failures += mismatches;
    }
    bar.finish_and_clear();

    print_table(&rows, failures, started);
    if failures > 0 {
        bail!("{failures} objects read back different bytes");
    }

    print_next_steps(args.keep_running, &master_addr);
    if args.keep_running {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        println!("stopping");
    }
    let _ = client.close().await;
    let _ = node_a.close().await;
    let _ = node_b.close().await;
    tokio::time::timeout(Duration::from_secs(5), master.shutdown())
        .await
        .ok();
    Ok(())
}

/// Puts, reads back (verifying every byte) and removes `count` objects of `size` bytes, in rounds
/// that fit in one node; returns the latencies and the number of mismatches.
async fn run_size(
    client: &StoreClient,
    bar: &ProgressBar,
    size: usize,
    count: usize,
    segment_size: u64,
) -> anyhow::Result<(Row, usize)> {
    let config = ReplicateConfig::default();
    let mut mismatches = 0usize;
    // Live bytes per round stay under the capacity of one node.
    let per_round = ((segment_size as usize / 2) / size).clamp(1, count);
    let mut value = vec![0u8; size];
    let mut read = vec![0u8; size];
    let mut put_samples = Vec::with_capacity(count);
    let mut get_samples = Vec::with_capacity(count);
    let mut done = 0;
    while done < count {
        let n = per_round.min(count - done);
        let keys: Vec<String> = (done..done + n)
            .map(|i| format!("quickstart/{size}/{i}"))
            .collect();
        for (j, key) in keys.iter().enumerate() {
            fill_pattern(&mut value, (size * 1_000_003 + done + j) as u64);
            let t = Instant::now();
            let outcome = client
                .put(key, &value, &config)
                .await
                .with_context(|| format!("put {key}"))?;
            put_samples.push(t.elapsed());
            if outcome != PutOutcome::Stored {
                bail!("put {key}: the key was already present");
            }
            bar.inc(1);
        }
        for (j, key) in keys.iter().enumerate() {
            let t = Instant::now();
            let got = client
                .get_into(key, &mut read)
                .await
                .with_context(|| format!("get {key}"))?;
            get_samples.push(t.elapsed());
            fill_pattern(&mut value, (size * 1_000_003 + done + j) as u64);
            if got as usize != size || read != value {
                mismatches += 1;
                bar.println(format!("MISMATCH: {key} read back different bytes"));
            }
            bar.inc(1);
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for result in client.batch_remove(&refs, true).await? {
            result.map_err(|code| anyhow::anyhow!("remove: {code}"))?;
        }
        done += n;
    }
    let put_busy = put_samples.iter().sum();
    let get_busy = get_samples.iter().sum();
    let row = Row {
        size,
        count,
        put: Latency::from_samples(&mut put_samples, put_busy),
        get: Latency::from_samples(&mut get_samples, get_busy),
    };
    Ok((row, mismatches))
}

/// The result table: one line per value size and operation, then the totals.
fn print_table(rows: &[Row], failures: usize, started: Instant) {
    println!();
    println!(
        "{:<8} {:>7} {:<4} {:>10} {:>10} {:>10} {:>10}",
        "value", "objects", "op", "ops/s", "MB/s", "p50_us", "p99_us"
    );
    println!("{}", "-".repeat(65));
    for row in rows {
        for (op, latency) in [("put", row.put), ("get", row.get)] {
            println!(
                "{:<8} {:>7} {:<4} {:>10.0} {:>10.1} {:>10.1} {:>10.1}",
                format_size(row.size as u64),
                row.count,
                op,
                latency.ops_per_sec,
                latency.ops_per_sec * row.size as f64 / 1e6,
                latency.p50_us,
                latency.p99_us
            );
        }
    }
    let objects: usize = rows.iter().map(|r| r.count).sum();
    let bytes: u64 = rows.iter().map(|r| (r.count * r.size) as u64).sum();
    println!(
        "\n{objects} objects, {} each way, {} verified byte for byte, {failures} mismatches, {:.1} s",
        format_size(bytes),
        if failures == 0 { "all" } else { "NOT all" },
        started.elapsed().as_secs_f64()
    );
}

/// How to run a cluster that stays up, with the addresses to use.
fn print_next_steps(keep_running: bool, master_addr: &str) {
    if keep_running {
        println!("\nThe cluster stays up until Ctrl-C. Point other programs at it:");
    } else {
        println!("\nTo run a cluster that stays up:");
        println!("  mooncake quickstart --keep-running --port 50051");
        println!("or start its parts yourself:");
        println!("  mooncake master --rpc_port=50051 --rpc_address=127.0.0.1");
        println!("  mooncake store --master 127.0.0.1:50051 --segment-size 4GiB");
    }
    let shown = if keep_running {
        master_addr.to_string()
    } else {
        "127.0.0.1:50051".to_string()
    };
    println!("  mooncake put --master {shown} hello ./file.bin");
    println!("  mooncake get --master {shown} hello -o copy.bin");
    println!("  mooncake ls --master {shown}; mooncake stat --master {shown}");
    println!("  Rust: StoreClient::connect(StoreConfig {{ master_addr: \"{shown}\".into(), global_segment_size: 0, ..Default::default() }})");
}
