//! `mooncake bench` / `mooncake bench store`: the cases of upstream's `upstream_bench.py`
//! (upstream's harness, not in this repository) against a `mooncake master` child process this command starts, with
//! the same columns, plus a 32-byte TCP ping-pong between two processes measured in the same run
//! as the floor under every round trip.
//!
//! Client A (this process) owns the only memory segment, as in upstream's run; the cross-process
//! cases start client B (`mooncake bench store-peer`, segment 0), so every byte B moves crosses
//! to A's segment through the transfer engine (`--transport`: shared memory by default, or TCP).
//! Throughput = ops / time inside the measured calls; cleanup between rounds is not timed.

mod batch;
mod cross;
mod report;
mod single;

use anyhow::{bail, Context};
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::ReplicateConfig;
use mooncake_transfer::TransportMode;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use cross::run_cross;
pub use cross::run_peer;
use report::HEADER;
use single::{value_bytes, Bench};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// Flags of the store benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Master address to use instead of starting a `mooncake master` child.
    #[arg(long)]
    pub master: Option<String>,
    /// Transport between the clients and the segment: `auto` (shared memory on one host), `tcp`.
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
    /// Value sizes of the single-client cases.
    #[arg(long, default_value = "4KiB,64KiB,1MiB,16MiB", value_delimiter = ',', value_parser = crate::parse_size_arg)]
    pub sizes: Vec<u64>,
    /// Time bound per case.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Op-count bound per case.
    #[arg(long, default_value_t = 200_000)]
    pub max_ops: usize,
    /// Untimed ops at the start of get cases.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Client A's segment.
    #[arg(long, default_value = "512MiB", value_parser = crate::parse_size_arg)]
    pub segment_size: u64,
    /// Most live bytes per put round / get key set.
    #[arg(long, default_value = "128MiB", value_parser = crate::parse_size_arg)]
    pub window_bytes: u64,
    #[arg(long, default_value_t = 1024)]
    pub max_window: usize,
    /// Items per batch in the batch cases.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value = "64KiB", value_parser = crate::parse_size_arg)]
    pub batch_value: u64,
    /// Value size of the cross-process cases.
    #[arg(long, default_value = "1MiB", value_parser = crate::parse_size_arg)]
    pub cross_size: u64,
    /// Groups to skip: single,zcopy,exist,batch,cross,pingpong.
    #[arg(long, default_value = "", value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Ping-pong round trips for the floor.
    #[arg(long, default_value_t = 20_000)]
    pub pingpong_iterations: usize,
    /// The client's master connection polls its socket this long after each answer before
    /// parking, on every call (0 = off; default: the client's default, 100 µs while the host
    /// has a core to spare).
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Skip the CRC32C recorded at PutEnd and checked on every get (upstream has none).
    #[arg(long)]
    pub no_checksums: bool,
    #[command(flatten)]
    pub copy: CopyTuning,
    /// Upstream's table (the reference table of upstream's harness): adds a
    /// column with our ops/s divided by upstream's for the same case and value.
    #[arg(long)]
    pub upstream: Option<String>,
}

impl Args {
    /// Every flag at its default (plain `mooncake bench`).
    pub fn defaults() -> Args {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: Args,
        }
        <Wrapper as clap::Parser>::parse_from(["store"]).args
    }
}

/// Flags of the hidden peer process (client B).
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    #[arg(long)]
    pub master: String,
    #[arg(long)]
    pub keys: String,
    #[arg(long)]
    pub count: usize,
    #[arg(long)]
    pub size: u64,
    #[arg(long)]
    pub seconds: f64,
    #[arg(long)]
    pub max_ops: usize,
    #[arg(long)]
    pub warmup: usize,
    #[arg(long)]
    pub window_bytes: u64,
    #[arg(long)]
    pub max_window: usize,
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    #[arg(long)]
    pub no_checksums: bool,
    #[command(flatten)]
    pub copy: CopyTuning,
}

/// Transfer-engine copy settings, to compare them in one run.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CopyTuning {
    /// Transfer engine: memcpy threads for local and shared-memory entries (default: the
    /// engine's).
    #[arg(long)]
    pub copy_threads: Option<usize>,
    /// Transfer engine: bytes per submit the calling thread copies itself.
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub inline_copy_bytes: Option<u64>,
    /// Transfer engine: entries from this size on are split over the copy threads.
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub parallel_copy_bytes: Option<u64>,
    /// Transfer engine: local/shared-memory writes from this size on use streaming stores
    /// (a size past every value, e.g. 1TiB, turns them off).
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub streaming_write_bytes: Option<u64>,
    /// Transfer engine: TCP connections per peer (large entries are striped over them).
    #[arg(long)]
    pub tcp_connections: Option<usize>,
}

impl CopyTuning {
    fn apply(&self, config: &mut mooncake_transfer::TransferConfig) {
        if let Some(n) = self.copy_threads {
            config.copy_threads = n;
        }
        if let Some(n) = self.inline_copy_bytes {
            config.inline_copy_max_bytes = n as usize;
        }
        if let Some(n) = self.parallel_copy_bytes {
            config.parallel_copy_min_bytes = n as usize;
        }
        if let Some(n) = self.streaming_write_bytes {
            config.streaming_write_min_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.tcp_connections {
            config.connections_per_peer = n;
        }
    }

    /// The same flags for the peer process.
    fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (flag, value) in [
            ("--copy-threads", self.copy_threads.map(|n| n as u64)),
            ("--inline-copy-bytes", self.inline_copy_bytes),
            ("--parallel-copy-bytes", self.parallel_copy_bytes),
            ("--streaming-write-bytes", self.streaming_write_bytes),
            ("--tcp-connections", self.tcp_connections.map(|n| n as u64)),
        ] {
            if let Some(v) = value {
                out.push(flag.to_string());
                out.push(v.to_string());
            }
        }
        out
    }
}

pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `mooncake master` on loopback with free ports; returns it and its RPC address.
pub(crate) fn start_master() -> anyhow::Result<(KillOnDrop, String)> {
    start_master_with(&[])
}

/// [`start_master`] with `extra` flags.
pub(crate) fn start_master_with(extra: &[&str]) -> anyhow::Result<(KillOnDrop, String)> {
    let exe = std::env::current_exe().context("locating the mooncake binary")?;
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([
                "master",
                "--rpc_address=127.0.0.1",
                "--port=0",
                "--metrics_host=127.0.0.1",
                "--metrics_port=0",
            ])
            .args(extra)
            .env("MOONCAKE_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .context("starting mooncake master")?,
    );
    let stdout = child.0.stdout.take().context("master stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let words: Vec<&str> = line.split_whitespace().collect();
    let rpc = words
        .iter()
        .position(|w| *w == "rpc")
        .and_then(|i| words.get(i + 1))
        .with_context(|| format!("no rpc address in the master's first line {line:?}"))?;
    Ok((child, rpc.to_string()))
}

pub(crate) fn client_config(
    master: &str,
    segment: u64,
    transport: TransportMode,
    busy_us: Option<u64>,
    checksums: bool,
    copy: &CopyTuning,
) -> StoreConfig {
    let mut config = StoreConfig {
        master_addr: master.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment,
        transport,
        verify_checksums: checksums,
        ..StoreConfig::default()
    };
    if let Some(us) = busy_us {
        config.rpc.set_busy_poll_us(us);
    }
    copy.apply(&mut config.transfer);
    config
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let skip = |g: &str| args.skip.iter().any(|s| s == g);
    let floor = if skip("pingpong") {
        None
    } else {
        Some(crate::pingpong::measure(false, args.pingpong_iterations)?)
    };
    let (master_child, master) = match &args.master {
        Some(addr) => (None, addr.clone()),
        None => {
            let (child, addr) = start_master()?;
            (Some(child), addr)
        }
    };
    let rt = runtime()?;
    let (results, cross) = rt.block_on(async {
        let store = StoreClient::connect(client_config(
            &master,
            args.segment_size,
            args.transport,
            args.busy_poll_us,
            !args.no_checksums,
            &args.copy,
        ))
        .await
        .context("client A")?;
        let tag = format!("b{}_{}", std::process::id(), started.elapsed().as_nanos());
        let mut bench = Bench {
            a: &args,
            s: &store,
            tag: tag.clone(),
            results: Vec::new(),
            config: ReplicateConfig::default(),
        };
        eprintln!("{HEADER}");
        for &size in &args.sizes {
            if !skip("single") {
                bench.bench_put(size, false).await?;
                bench.bench_get(size, false).await?;
            }
            if !skip("zcopy") {
                bench.bench_put(size, true).await?;
                bench.bench_get(size, true).await?;
            }
        }
        if !skip("exist") {
            bench.bench_exist().await?;
        }
        if !skip("batch") {
            bench.bench_batch(false).await?;
            bench.bench_batch(true).await?;
        }
        let mut cross = Vec::new();
        if !skip("cross") {
            cross = run_cross(&args, &store, &master, &tag).await?;
        }
        let results = std::mem::take(&mut bench.results);
        let _ = store.close().await;
        anyhow::Ok((results, cross))
    })?;
    drop(master_child);
    report::print(&args, &master, &results, &cross, floor, started)?;
    let errors: usize = results.iter().chain(&cross).map(|r| r.errors).sum();
    if errors > 0 {
        bail!("{errors} operations failed or read wrong bytes");
    }
    Ok(())
}

/// Median time of copying `len` bytes between two pre-touched buffers (the local data path's
/// limit on this machine, measured in the same run).
fn memcpy_p50_us(len: usize) -> f64 {
    let src = value_bytes(len as u64, 1);
    let mut dst = vec![1u8; len];
    let mut samples: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
