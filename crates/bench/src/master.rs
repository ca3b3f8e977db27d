//! `mooncake bench master`: the master over real TCP from another process — sequential latency
//! next to the kernel's ping-pong floor, aggregate throughput with 1–64 requests in flight, batch
//! throughput, and the master's CPU time per operation.

use anyhow::{bail, Context};
use mooncake_client::MasterClient;
use mooncake_common::{ClientId, ObjectMeta, ReplicateConfig, Segment, SegmentId};
use mooncake_proto::methods as m;
use mooncake_rpc::ClientConfig;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::pingpong::{self, Latency};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Benchmark a running master instead of starting one (its CPU time is then not reported).
    #[arg(long)]
    master: Option<SocketAddr>,
    /// Seconds per measured cell.
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// Keys written before the read cases.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Also run the opt-in low-latency mode (master and client spin this many µs before parking).
    #[arg(long, default_value_t = 50)]
    busy_poll_us: u64,
}

pub(crate) struct MasterChild {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl MasterChild {
    pub(crate) fn start(extra: &[String]) -> anyhow::Result<MasterChild> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("master")
            .args([
                "--rpc_address=127.0.0.1",
                "--port=0",
                "--metrics_host=127.0.0.1",
                "--metrics_port=0",
            ])
            .args(extra)
            .env("MOONCAKE_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the master")?;
        let stdout = child.stdout.take().context("master stdout")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "rpc")
            .nth(1)
            .and_then(|w| w.parse().ok())
            .with_context(|| format!("no rpc address in {line:?}"))?;
        Ok(MasterChild { child, addr })
    }

    /// utime + stime of the master, in seconds.
    fn cpu_seconds(&self) -> Option<f64> {
        crate::proc_cpu_seconds(self.child.id())
    }
}

impl Drop for MasterChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Op {
    Exist,
    GetReplicaList,
    PutStartEnd,
    BatchExist128,
}

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Exist => "ExistKey",
            Op::GetReplicaList => "GetReplicaList",
            Op::PutStartEnd => "PutStart+PutEnd",
            Op::BatchExist128 => "BatchExistKey(128)",
        }
    }
    fn keys_per_op(self) -> usize {
        if self == Op::BatchExist128 {
            128
        } else {
            1
        }
    }
}

pub(crate) struct Ctx {
    mc: MasterClient,
    client: ClientId,
    keys: Vec<String>,
    prefix: String,
    next_put: std::cell::Cell<usize>,
}

async fn one(ctx: &Ctx, op: Op, i: usize) -> anyhow::Result<()> {
    match op {
        Op::Exist => {
            ctx.mc.exist_key(&ctx.keys[i % ctx.keys.len()], "").await?;
        }
        Op::GetReplicaList => {
            ctx.mc
                .get_replica_list(&ctx.keys[i % ctx.keys.len()], "")
                .await?;
        }
        Op::PutStartEnd => {
            let n = ctx.next_put.get();
            ctx.next_put.set(n + 1);
            let key = format!("{}-{n}", ctx.prefix);
            ctx.mc
                .put_start(ctx.client, &key, 1024, &ReplicateConfig::default(), "")
                .await?;
            ctx.mc.put_end(ctx.client, ObjectMeta::new(key), "").await?;
        }
        Op::BatchExist128 => {
            let start = (i * 128) % ctx.keys.len();
            let keys: Vec<String> = (0..128)
                .map(|j| ctx.keys[(start + j) % ctx.keys.len()].clone())
                .collect();
            ctx.mc
                .call(&m::BatchExistKey {
                    keys,
                    tenant: String::new(),
                })
                .await?;
        }
    }
    Ok(())
}

/// Runs `op` with `inflight` concurrent callers for `seconds`; returns (ops, elapsed, latencies).
pub(crate) async fn drive(
    ctx: Rc<Ctx>,
    op: Op,
    inflight: usize,
    seconds: f64,
) -> anyhow::Result<(usize, Duration, Vec<Duration>)> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..inflight {
        let ctx = ctx.clone();
        workers.push(tokio::task::spawn_local(async move {
            let mut samples = Vec::new();
            let mut i = w * 1_000_000_000;
            while Instant::now() < deadline {
                let t = Instant::now();
                one(&ctx, op, i).await?;
                samples.push(t.elapsed());
                i += 1;
            }
            anyhow::Ok(samples)
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    Ok((all.len(), started.elapsed(), all))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    println!(
        "mooncake bench master: client = one thread, one connection; master = separate process"
    );
    println!("seconds per cell {}, {} keys", args.seconds, args.keys);
    println!();

    let floor = pingpong::measure(false, 20_000)?;
    let spin_floor = pingpong::measure(true, 20_000)?;
    let (master, addr) = match args.master {
        Some(addr) => (None, addr),
        None => {
            let child = MasterChild::start(&[])?;
            let addr = child.addr;
            (Some(child), addr)
        }
    };
    local.block_on(&runtime, async {
        let ctx = Rc::new(setup(addr, args.keys, ClientConfig::default()).await?);
        // Sequential latency.
        let (_, elapsed, mut samples) = drive(ctx.clone(), Op::Exist, 1, args.seconds).await?;
        let seq = Latency::from_samples(&mut samples, elapsed);
        println!("== sequential round trips (p50/p99 in µs)");
        println!(
            "{:<34} {:>10} {:>9} {:>9} {:>12}",
            "case", "ops/s", "p50", "p99", "p50 / floor"
        );
        row("tcp ping-pong 32 B (blocking)", &floor, &floor);
        row("ExistKey", &seq, &floor);
        println!();

        println!("== aggregate throughput, one connection, N requests in flight");
        println!(
            "{:<20} {:>9} {:>12} {:>12} {:>9} {:>9} {:>14}",
            "case", "inflight", "ops/s", "keys/s", "p50_us", "p99_us", "master_cpu_us/op"
        );
        for op in [
            Op::Exist,
            Op::GetReplicaList,
            Op::PutStartEnd,
            Op::BatchExist128,
        ] {
            for inflight in [1usize, 4, 16, 64] {
                let cpu_before = master.as_ref().and_then(|m| m.cpu_seconds());
                let (ops, elapsed, mut samples) =
                    drive(ctx.clone(), op, inflight, args.seconds).await?;
                let cpu_after = master.as_ref().and_then(|m| m.cpu_seconds());
                let lat = Latency::from_samples(&mut samples, elapsed);
                let calls = if op == Op::PutStartEnd { ops * 2 } else { ops };
                let cpu = match (cpu_before, cpu_after) {
                    (Some(b), Some(a)) if calls > 0 => {
                        format!("{:.2}", (a - b) * 1e6 / calls as f64)
                    }
                    _ => "-".to_string(),
                };
                println!(
                    "{:<20} {:>9} {:>12.0} {:>12.0} {:>9.1} {:>9.1} {:>14}",
                    op.label(),
                    inflight,
                    lat.ops_per_sec,
                    lat.ops_per_sec * op.keys_per_op() as f64,
                    lat.p50_us,
                    lat.p99_us,
                    cpu
                );
            }
        }
        println!("(PutStart+PutEnd: ops/s counts pairs; CPU per op counts each RPC)");
        anyhow::Ok(())
    })?;
    drop(master);

    if args.master.is_none() && args.busy_poll_us > 0 {
        let spin_master = MasterChild::start(&[format!("--busy_poll_us={}", args.busy_poll_us)])?;
        let mut config = ClientConfig::default();
        config.set_busy_poll_us(args.busy_poll_us);
        local.block_on(&runtime, async {
            let ctx = Rc::new(setup(spin_master.addr, 1000, config).await?);
            let (_, elapsed, mut samples) = drive(ctx, Op::Exist, 1, args.seconds).await?;
            let lat = Latency::from_samples(&mut samples, elapsed);
            println!();
            println!(
                "== low-latency mode (--busy_poll_us={} on master and client)",
                args.busy_poll_us
            );
            println!(
                "{:<34} {:>10} {:>9} {:>9} {:>12}",
                "case", "ops/s", "p50", "p99", "p50 / floor"
            );
            row("tcp ping-pong 32 B (spinning)", &spin_floor, &spin_floor);
            row("ExistKey (busy poll)", &lat, &spin_floor);
            anyhow::Ok(())
        })?;
    }
    Ok(())
}

fn row(label: &str, lat: &Latency, floor: &Latency) {
    println!(
        "{:<34} {:>10.0} {:>9.1} {:>9.1} {:>11.2}x",
        label,
        lat.ops_per_sec,
        lat.p50_us,
        lat.p99_us,
        lat.p50_us / floor.p50_us.max(1e-9)
    );
}

pub(crate) async fn setup(
    addr: SocketAddr,
    keys: usize,
    config: ClientConfig,
) -> anyhow::Result<Ctx> {
    let mc = MasterClient::new(addr, config);
    let client = ClientId::random();
    mc.service_ready().await.context("master not answering")?;
    let segment = Segment {
        id: SegmentId::random(),
        name: format!("bench-{}", client),
        base: 1 << 40,
        size: 1 << 40,
        te_endpoint: "tcp://127.0.0.1:1".into(),
        protocol: "tcp".into(),
        host_id: "bench".into(),
    };
    mc.mount_segment(segment, client).await?;
    // Heartbeat like a real client, or the master expires us after client_ttl (10 s) and our
    // objects go with our segment.
    let pinger = MasterClient::new(addr, ClientConfig::default());
    tokio::task::spawn_local(async move {
        loop {
            let _ = pinger.ping(client).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let names: Vec<String> = (0..keys).map(|i| format!("bench-key-{i:08}")).collect();
    for chunk in names.chunks(1000) {
        let started = mc
            .call(&m::BatchPutStart {
                client,
                keys: chunk.to_vec(),
                value_lens: vec![4096; chunk.len()],
                config: ReplicateConfig::default(),
                tenant: String::new(),
            })
            .await?;
        if started.iter().any(|r| r.is_err()) {
            bail!(
                "populating the master failed: {:?}",
                started.iter().find(|r| r.is_err())
            );
        }
        let metas = chunk.iter().map(|k| ObjectMeta::new(k.clone())).collect();
        mc.call(&m::BatchPutEnd {
            client,
            metas,
            replica_type: mooncake_common::ReplicaType::ALL,
            tenant: String::new(),
        })
        .await?;
    }
    Ok(Ctx {
        mc,
        client,
        keys: names,
        prefix: format!("put-{}", client),
        next_put: std::cell::Cell::new(0),
    })
}
