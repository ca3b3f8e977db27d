//! `mooncake bench` / `mooncake bench store`: the cases of upstream's `upstream_bench.py`
//! (../shared/bench/peer/) against a `mooncake master` child process this command starts, with
//! the same columns, plus a 32-byte TCP ping-pong between two processes measured in the same run
//! as the floor under every round trip.
//!
//! Client A (this process) owns the only memory segment, as in upstream's run; the cross-process
//! cases start client B (`mooncake bench store-peer`, segment 0), so every byte B moves crosses
//! to A's segment through the transfer engine (`--transport`: shared memory by default, or TCP).
//! Throughput = ops / time inside the measured calls; cleanup between rounds is not timed.

use anyhow::{bail, Context};
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::ReplicateConfig;
use mooncake_transfer::TransportMode;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::quickstart::fill_pattern;

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
    #[arg(long, default_value = "4KiB,64KiB,1MiB,16MiB", value_delimiter = ',', value_parser = crate::node::parse_size_arg)]
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
    #[arg(long, default_value = "512MiB", value_parser = crate::node::parse_size_arg)]
    pub segment_size: u64,
    /// Most live bytes per put round / get key set.
    #[arg(long, default_value = "128MiB", value_parser = crate::node::parse_size_arg)]
    pub window_bytes: u64,
    #[arg(long, default_value_t = 1024)]
    pub max_window: usize,
    /// Items per batch in the batch cases.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    #[arg(long, default_value = "64KiB", value_parser = crate::node::parse_size_arg)]
    pub batch_value: u64,
    /// Value size of the cross-process cases.
    #[arg(long, default_value = "1MiB", value_parser = crate::node::parse_size_arg)]
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
    /// Upstream's table (e.g. ../shared/bench/peer/reference/upstream_results.txt): adds a
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
    #[arg(long, value_parser = crate::node::parse_size_arg)]
    pub inline_copy_bytes: Option<u64>,
    /// Transfer engine: entries from this size on are split over the copy threads.
    #[arg(long, value_parser = crate::node::parse_size_arg)]
    pub parallel_copy_bytes: Option<u64>,
    /// Transfer engine: local/shared-memory writes from this size on use streaming stores
    /// (a size past every value, e.g. 1TiB, turns them off).
    #[arg(long, value_parser = crate::node::parse_size_arg)]
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

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub case: String,
    pub api: &'static str,
    pub size: u64,
    pub items: usize,
    pub ops: usize,
    pub errors: usize,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub note: String,
}

/// Nearest-rank percentile (upstream_bench.py's rounding differs by at most one rank).
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as isize - 1;
    sorted[rank.clamp(0, sorted.len() as isize - 1) as usize]
}

fn row(
    case: &str,
    api: &'static str,
    size: u64,
    items: usize,
    lats: &[Duration],
    errors: usize,
    note: String,
) -> Row {
    let mut secs: Vec<f64> = lats.iter().map(|d| d.as_secs_f64()).collect();
    secs.sort_by(f64::total_cmp);
    let busy: f64 = secs.iter().sum();
    Row {
        case: case.to_string(),
        api,
        size,
        items,
        ops: secs.len(),
        errors,
        ops_per_s: if busy > 0.0 {
            secs.len() as f64 / busy
        } else {
            0.0
        },
        p50_us: pct(&secs, 0.50) * 1e6,
        p99_us: pct(&secs, 0.99) * 1e6,
        note,
    }
}

fn fmt_size(n: u64) -> String {
    let n = n as usize;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{}MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{}KiB", n / KIB)
    } else {
        format!("{n}B")
    }
}

const HEADER: &str = "case                   api       value  batch      ops   errs       ops/s     items/s      MiB/s     p50_us     p99_us";

fn format_row(r: &Row) -> String {
    let items_s = r.ops_per_s * r.items as f64;
    format!(
        "{:<22} {:<6} {:>8} {:>6} {:>8} {:>6} {:>11.1} {:>11.1} {:>10.1} {:>10.1} {:>10.1}",
        r.case,
        r.api,
        if r.size > 0 {
            fmt_size(r.size)
        } else {
            "-".into()
        },
        format!("x{}", r.items),
        r.ops,
        r.errors,
        r.ops_per_s,
        items_s,
        items_s * r.size as f64 / MIB as f64,
        r.p50_us,
        r.p99_us
    )
}

/// Machine-readable line the peer prints for each row.
fn encode_row(r: &Row) -> String {
    format!(
        "ROW\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        r.case, r.api, r.size, r.items, r.ops, r.errors, r.ops_per_s, r.p50_us, r.p99_us, r.note
    )
}

fn decode_row(line: &str) -> Option<Row> {
    let f: Vec<&str> = line.strip_prefix("ROW\t")?.split('\t').collect();
    if f.len() < 9 {
        return None;
    }
    let api = match f[1] {
        "plain" => "plain",
        "zcopy" => "zcopy",
        _ => "meta",
    };
    Some(Row {
        case: f[0].to_string(),
        api,
        size: f[2].parse().ok()?,
        items: f[3].parse().ok()?,
        ops: f[4].parse().ok()?,
        errors: f[5].parse().ok()?,
        ops_per_s: f[6].parse().ok()?,
        p50_us: f[7].parse().ok()?,
        p99_us: f[8].parse().ok()?,
        note: f.get(9).unwrap_or(&"").to_string(),
    })
}

/// Upstream's ops/s and p50 by (case, value) from its printed table.
fn load_upstream(path: &str) -> anyhow::Result<Vec<(String, String, f64, f64)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 11 || !matches!(w[1], "plain" | "zcopy" | "meta") {
            continue;
        }
        if let (Ok(ops), Ok(p50)) = (w[6].parse::<f64>(), w[9].parse::<f64>()) {
            out.push((w[0].to_string(), w[2].to_string(), ops, p50));
        }
    }
    Ok(out)
}

struct Deadline {
    end: Instant,
    max_ops: usize,
}

impl Deadline {
    fn new(seconds: f64, max_ops: usize) -> Deadline {
        Deadline {
            end: Instant::now() + Duration::from_secs_f64(seconds),
            max_ops,
        }
    }
    fn done(&self, ops: usize) -> bool {
        ops >= self.max_ops || Instant::now() >= self.end
    }
}

fn value_bytes(size: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    fill_pattern(&mut v, seed);
    v
}

/// A buffer registered with the client for zero-copy calls; unregistered on drop.
struct Registered<'a> {
    client: &'a StoreClient,
    buf: Vec<u8>,
}

impl<'a> Registered<'a> {
    fn new(client: &'a StoreClient, len: usize) -> anyhow::Result<Registered<'a>> {
        let mut buf = vec![0u8; len.max(1)];
        // SAFETY: `buf` lives in the returned value, which unregisters it before dropping it.
        unsafe { client.register_buffer(buf.as_mut_ptr(), buf.len()) }?;
        Ok(Registered { client, buf })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self.client.unregister_buffer(self.buf.as_mut_ptr());
    }
}

struct Bench<'a> {
    a: &'a Args,
    s: &'a StoreClient,
    tag: String,
    results: Vec<Row>,
    config: ReplicateConfig,
}

impl Bench<'_> {
    fn window(&self, size: u64) -> usize {
        ((self.a.window_bytes / size.max(1)) as usize).clamp(1, self.a.max_window)
    }

    async fn cleanup(&self, keys: &[String]) {
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for chunk in refs.chunks(1000) {
            let _ = self.s.batch_remove(chunk, true).await;
        }
    }

    fn add(&mut self, r: Row) {
        eprintln!("{}", format_row(&r));
        self.results.push(r);
    }

    async fn bench_put(&mut self, size: u64, zcopy: bool) -> anyhow::Result<()> {
        let val = value_bytes(size, size);
        let mut reg = if zcopy {
            let mut r = Registered::new(self.s, size as usize)?;
            r.buf.copy_from_slice(&val);
            Some(r)
        } else {
            None
        };
        let w = self.window(size);
        let name = if zcopy { "put_from" } else { "put" };
        let mut lats = Vec::new();
        let mut errors = 0;
        let mut rnd = 0;
        for record in [false, true] {
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            loop {
                let mut done = Vec::new();
                for i in 0..w {
                    let key = format!("{}/{name}/{size}/r{rnd}/{i}", self.tag);
                    let value: &[u8] = match &mut reg {
                        Some(r) => &r.buf,
                        None => &val,
                    };
                    let t = Instant::now();
                    let result = self.s.put(&key, value, &self.config).await;
                    let dt = t.elapsed();
                    done.push(key);
                    if record {
                        lats.push(dt);
                        errors += usize::from(result.is_err());
                    }
                    if dl.done(if record { lats.len() } else { 0 }) {
                        break;
                    }
                }
                rnd += 1;
                self.cleanup(&done).await;
                if !record || dl.done(lats.len()) {
                    break;
                }
            }
        }
        drop(reg);
        let api = if zcopy { "zcopy" } else { "plain" };
        self.add(row(
            name,
            api,
            size,
            1,
            &lats,
            errors,
            format!("window={w}"),
        ));
        Ok(())
    }

    async fn bench_get(&mut self, size: u64, zcopy: bool) -> anyhow::Result<()> {
        let w = self.window(size);
        let api = if zcopy { "zcopy" } else { "plain" };
        let mut keys = Vec::new();
        let mut vals = Vec::new();
        for i in 0..w {
            let key = format!("{}/getset-{api}/{size}/{i}", self.tag);
            let v = if i < 4 {
                value_bytes(size, 1_000_003 * size + i as u64)
            } else {
                value_bytes(size, size)
            };
            self.s
                .put(&key, &v, &self.config)
                .await
                .with_context(|| format!("prepare put {key}"))?;
            keys.push(key);
            if i < 4 {
                vals.push(v);
            }
        }
        let mut reg = if zcopy {
            Some(Registered::new(self.s, size as usize)?)
        } else {
            None
        };
        let mut bad = 0;
        for (k, v) in keys.iter().zip(&vals) {
            let ok = match &mut reg {
                None => self.s.get(k).await.is_ok_and(|got| got == *v),
                Some(r) => {
                    let n = self.s.get_into(k, &mut r.buf).await;
                    n.is_ok_and(|n| n == size) && r.buf[..size as usize] == v[..]
                }
            };
            bad += usize::from(!ok);
        }
        let mut lats = Vec::new();
        let mut errors = bad;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        let mut i = 0;
        let mut warm = self.a.warmup;
        while !dl.done(lats.len()) {
            let k = &keys[i % w];
            i += 1;
            let t = Instant::now();
            let ok = match &mut reg {
                None => self.s.get(k).await.is_ok_and(|g| g.len() as u64 == size),
                Some(r) => self
                    .s
                    .get_into(k, &mut r.buf)
                    .await
                    .is_ok_and(|n| n == size),
            };
            let dt = t.elapsed();
            errors += usize::from(!ok);
            if warm > 0 {
                warm -= 1;
            } else {
                lats.push(dt);
            }
        }
        drop(reg);
        self.cleanup(&keys).await;
        let verify = if bad == 0 {
            "ok".to_string()
        } else {
            format!("FAIL{bad}")
        };
        let name = if zcopy { "get_into" } else { "get" };
        self.add(row(
            name,
            api,
            size,
            1,
            &lats,
            errors,
            format!("window={w} verify={verify}"),
        ));
        Ok(())
    }

    async fn bench_exist(&mut self) -> anyhow::Result<()> {
        let k = format!("{}/exist/key", self.tag);
        self.s.put(&k, &[b'x'; 4096], &self.config).await?;
        for (label, key, expect) in [
            ("is_exist(hit)", k.clone(), true),
            ("is_exist(miss)", format!("{k}-missing"), false),
        ] {
            let mut lats = Vec::new();
            let mut errors = 0;
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            while !dl.done(lats.len()) {
                let t = Instant::now();
                let r = self.s.is_exist(&key).await;
                lats.push(t.elapsed());
                errors += usize::from(!matches!(r, Ok(v) if v == expect));
            }
            self.add(row(label, "meta", 0, 1, &lats, errors, String::new()));
        }
        let keys: Vec<String> = (0..self.a.batch)
            .map(|i| format!("{}/bexist/{i}", self.tag))
            .collect();
        let value = [b'y'; 64];
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &value[..])).collect();
        for r in self.s.put_batch(&items, &self.config).await {
            r?;
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let mut lats = Vec::new();
        let mut errors = 0;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        while !dl.done(lats.len()) {
            let t = Instant::now();
            let r = self.s.batch_is_exist(&refs).await;
            lats.push(t.elapsed());
            errors += usize::from(!r.is_ok_and(|v| v.iter().all(|x| matches!(x, Ok(true)))));
        }
        let n = keys.len();
        self.add(row(
            "batch_is_exist",
            "meta",
            0,
            n,
            &lats,
            errors,
            format!("batch={n}"),
        ));
        let mut all = keys;
        all.push(k);
        self.cleanup(&all).await;
        Ok(())
    }

    async fn bench_batch(&mut self, zcopy: bool) -> anyhow::Result<()> {
        let size = self.a.batch_value;
        let b = self.a.batch;
        let val = value_bytes(size, size);
        let mut reg = if zcopy {
            let mut r = Registered::new(self.s, size as usize * b)?;
            for chunk in r.buf.chunks_mut(size as usize) {
                chunk.copy_from_slice(&val);
            }
            Some(r)
        } else {
            None
        };
        let api = if zcopy { "zcopy" } else { "plain" };
        let rounds_per_window = (self.window(size) / b).max(1);
        let mut lats = Vec::new();
        let mut errors = 0;
        let mut rnd = 0;
        for record in [false, true] {
            let dl = Deadline::new(self.a.seconds, self.a.max_ops);
            loop {
                let mut live = Vec::new();
                for _ in 0..rounds_per_window {
                    let keys: Vec<String> = (0..b)
                        .map(|i| format!("{}/bput/{api}/{size}/r{rnd}/{i}", self.tag))
                        .collect();
                    rnd += 1;
                    let items: Vec<(&str, &[u8])> = match &reg {
                        None => keys.iter().map(|k| (k.as_str(), &val[..])).collect(),
                        Some(r) => keys
                            .iter()
                            .zip(r.buf.chunks(size as usize))
                            .map(|(k, c)| (k.as_str(), c))
                            .collect(),
                    };
                    let t = Instant::now();
                    let results = self.s.put_batch(&items, &self.config).await;
                    let dt = t.elapsed();
                    live.extend(keys.iter().cloned());
                    if record {
                        lats.push(dt);
                        errors += usize::from(results.iter().any(|r| r.is_err()));
                    }
                    if dl.done(if record { lats.len() } else { 0 }) {
                        break;
                    }
                }
                self.cleanup(&live).await;
                if !record || dl.done(lats.len()) {
                    break;
                }
            }
        }
        let put_name = if zcopy { "batch_put_from" } else { "put_batch" };
        self.add(row(
            put_name,
            api,
            size,
            b,
            &lats,
            errors,
            format!("batch={b}"),
        ));

        let keys: Vec<String> = (0..b)
            .map(|i| format!("{}/bget/{api}/{size}/{i}", self.tag))
            .collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &val[..])).collect();
        for r in self.s.put_batch(&items, &self.config).await {
            r.context("prepare put_batch")?;
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let mut lats = Vec::new();
        let mut errors = 0;
        let dl = Deadline::new(self.a.seconds, self.a.max_ops);
        let mut first = true;
        while !dl.done(lats.len()) {
            match &mut reg {
                None => {
                    let t = Instant::now();
                    let got = self.s.get_batch(&refs).await;
                    lats.push(t.elapsed());
                    let mut err = got
                        .iter()
                        .any(|g| !g.as_ref().is_ok_and(|v| v.len() as u64 == size));
                    if first {
                        err |= got.iter().any(|g| !g.as_ref().is_ok_and(|v| *v == val));
                    }
                    errors += usize::from(err);
                }
                Some(r) => {
                    if first {
                        r.buf.fill(0);
                    }
                    let mut outs: Vec<&mut [u8]> = r.buf.chunks_mut(size as usize).collect();
                    let t = Instant::now();
                    let got = self.s.get_batch_into(&refs, &mut outs).await;
                    lats.push(t.elapsed());
                    let mut err = got.iter().any(|g| !matches!(g, Ok(n) if *n == size));
                    if first {
                        err |= r.buf.chunks(size as usize).any(|c| c != &val[..]);
                    }
                    errors += usize::from(err);
                }
            }
            first = false;
        }
        drop(reg);
        self.cleanup(&keys).await;
        let get_name = if zcopy { "batch_get_into" } else { "get_batch" };
        self.add(row(
            get_name,
            api,
            size,
            b,
            &lats,
            errors,
            format!("batch={b}"),
        ));
        Ok(())
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `mooncake master` on loopback with free ports; returns it and its RPC address.
fn start_master() -> anyhow::Result<(KillOnDrop, String)> {
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

fn client_config(
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

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
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
        Some(super::pingpong::measure(false, args.pingpong_iterations)?)
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

    let upstream = match &args.upstream {
        Some(path) => load_upstream(path)?,
        None => Vec::new(),
    };
    let ratio = |r: &Row| {
        let value = if r.size > 0 {
            fmt_size(r.size)
        } else {
            "-".into()
        };
        upstream
            .iter()
            .find(|(case, v, ..)| *case == r.case && *v == value)
            .map(|(_, _, ops, p50)| {
                format!(
                    "  x{:.2} ops/s, p50 {:.2}x",
                    r.ops_per_s / ops.max(1e-9),
                    r.p50_us / p50.max(1e-9)
                )
            })
            .unwrap_or_default()
    };
    println!(
        "mooncake-rs store bench {}: transport {:?}, CRC32C {}, client busy-poll {}, segment(A) {}, peer segment(B) 0, master {}",
        env!("CARGO_PKG_VERSION"),
        args.transport,
        if args.no_checksums { "off" } else { "on (put and get)" },
        match args.busy_poll_us {
            Some(0) => "off".to_string(),
            Some(us) => format!("{us} us"),
            None => format!(
                "{} us (default: adaptive)",
                mooncake_rpc::client::DEFAULT_BUSY_POLL.as_micros()
            ),
        },
        fmt_size(args.segment_size),
        if args.master.is_some() {
            master.clone()
        } else {
            format!("{master} (child process)")
        }
    );
    println!(
        "bounds: {:.1}s or {} ops per case; window<={} live bytes; throughput = ops / time inside measured calls",
        args.seconds,
        args.max_ops,
        fmt_size(args.window_bytes)
    );
    let tuning = args.copy.to_args();
    if !tuning.is_empty() {
        println!("transfer tuning (both processes): {}", tuning.join(" "));
    }
    if !upstream.is_empty() {
        println!(
            "last columns: our ops/s / upstream's, our p50 / upstream's (same case and value)"
        );
    }
    let table = |title: &str, rows: &[&Row]| {
        if rows.is_empty() {
            return;
        }
        println!("\n== {title}");
        println!("{HEADER}  note");
        println!("{}", "-".repeat(HEADER.len()));
        for r in rows {
            println!("{}  {}{}", format_row(r), r.note, ratio(r));
        }
    };
    let single: Vec<&Row> = results
        .iter()
        .filter(|r| r.api != "meta" && r.items == 1)
        .collect();
    let meta: Vec<&Row> = results.iter().filter(|r| r.api == "meta").collect();
    let batch: Vec<&Row> = results
        .iter()
        .filter(|r| r.api != "meta" && r.items > 1)
        .collect();
    table(
        "single client (A owns the only segment; its own segment is a local memcpy)",
        &single,
    );
    table("metadata only", &meta);
    table("batch (single client A)", &batch);
    let cross_refs: Vec<&Row> = cross.iter().collect();
    table(
        &format!(
            "cross-process (B = second process, segment 0, transport {:?})",
            args.transport
        ),
        &cross_refs,
    );
    if let Some(floor) = floor {
        println!(
            "\n== floor: tcp ping-pong, {} bytes, two processes, blocking reads: p50 {:.1} us, p99 {:.1} us ({} round trips)",
            super::pingpong::MESSAGE_BYTES,
            floor.p50_us,
            floor.p99_us,
            floor.ops
        );
        let find =
            |case: &str, size: u64| results.iter().find(|r| r.case == case && r.size == size);
        for (label, r, limit) in [
            ("get 4KiB p50", find("get", 4096), 1.3),
            ("is_exist(hit) p50", find("is_exist(hit)", 0), 1.3),
            ("put 4KiB p50", find("put", 4096), 2.3),
        ] {
            if let Some(r) = r {
                let x = r.p50_us / floor.p50_us.max(1e-9);
                println!(
                    "{label:<20} {:>8.1} us = {x:.2}x ping-pong (target <= {limit}x: {})",
                    r.p50_us,
                    if x <= limit { "met" } else { "MISSED" }
                );
            }
        }
    }
    let copy_us = memcpy_p50_us(16 * MIB);
    println!(
        "== limit: single-thread memcpy of 16MiB (pre-touched, 15 copies) p50 {copy_us:.1} us = {:.0} MiB/s",
        16.0 * 1e6 / copy_us.max(1e-9)
    );
    println!("\ntotal wall time {:.1}s", started.elapsed().as_secs_f64());
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

async fn run_cross(
    args: &Args,
    store: &StoreClient,
    master: &str,
    tag: &str,
) -> anyhow::Result<Vec<Row>> {
    let size = args.cross_size;
    let count = ((args.window_bytes / size.max(1)) as usize).clamp(1, args.max_window);
    let prefix = format!("{tag}/xclient");
    let mut lats = Vec::new();
    let mut keys = Vec::new();
    for i in 0..count {
        let key = format!("{prefix}/{i}");
        let v = value_bytes(size, 7000 + i as u64);
        let t = Instant::now();
        store.put(&key, &v, &ReplicateConfig::default()).await?;
        lats.push(t.elapsed());
        keys.push(key);
    }
    let mut rows = vec![row(
        "xclient_A_put",
        "plain",
        size,
        1,
        &lats,
        0,
        format!("A local put of the {count} keys B reads"),
    )];
    for r in &rows {
        eprintln!("{}", format_row(r));
    }
    let exe = std::env::current_exe()?;
    let output = tokio::task::spawn_blocking({
        let args = args.clone();
        let master = master.to_string();
        move || {
            Command::new(exe)
                .args([
                    "bench",
                    "store-peer",
                    "--master",
                    &master,
                    "--keys",
                    &prefix,
                ])
                .args(["--count", &count.to_string(), "--size", &size.to_string()])
                .args(["--seconds", &args.seconds.to_string()])
                .args(["--max-ops", &args.max_ops.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(["--window-bytes", &args.window_bytes.to_string()])
                .args(["--max-window", &args.max_window.to_string()])
                .args([
                    "--transport",
                    &format!("{:?}", args.transport).to_lowercase(),
                ])
                .args(
                    args.busy_poll_us
                        .map(|us| ["--busy-poll-us".to_string(), us.to_string()])
                        .into_iter()
                        .flatten(),
                )
                .args(args.no_checksums.then_some("--no-checksums"))
                .args(args.copy.to_args())
                .stderr(Stdio::inherit())
                .output()
        }
    })
    .await??;
    let text = String::from_utf8_lossy(&output.stdout);
    rows.extend(text.lines().filter_map(decode_row));
    if !output.status.success() {
        bail!("the peer process failed: {}", output.status);
    }
    let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    let _ = store.batch_remove(&refs, true).await;
    Ok(rows)
}

/// Client B: reads A's keys (get, get_into) and writes into A's segment (put, put_from).
pub fn run_peer(args: PeerArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let s = StoreClient::connect(client_config(
            &args.master,
            0,
            args.transport,
            args.busy_poll_us,
            !args.no_checksums,
            &args.copy,
        ))
        .await
        .context("client B")?;
        let size = args.size;
        let keys: Vec<String> = (0..args.count)
            .map(|i| format!("{}/{i}", args.keys))
            .collect();
        let mut bad = 0;
        for (i, k) in keys.iter().take(4).enumerate() {
            let ok = s
                .get(k)
                .await
                .is_ok_and(|g| g == value_bytes(size, 7000 + i as u64));
            bad += usize::from(!ok);
        }
        let verify = if bad == 0 {
            "ok".to_string()
        } else {
            format!("FAIL{bad}")
        };
        let mut rows = Vec::new();
        for zcopy in [false, true] {
            let mut reg = if zcopy {
                Some(Registered::new(&s, size as usize)?)
            } else {
                None
            };
            let mut lats = Vec::new();
            let mut errors = bad;
            let dl = Deadline::new(args.seconds, args.max_ops);
            let mut i = 0;
            while !dl.done(lats.len()) {
                let k = &keys[i % keys.len()];
                i += 1;
                let t = Instant::now();
                let ok = match &mut reg {
                    None => s.get(k).await.is_ok_and(|g| g.len() as u64 == size),
                    Some(r) => s.get_into(k, &mut r.buf).await.is_ok_and(|n| n == size),
                };
                let dt = t.elapsed();
                if i > args.warmup {
                    lats.push(dt);
                    errors += usize::from(!ok);
                }
            }
            let (name, api) = if zcopy {
                ("xclient_get_into", "zcopy")
            } else {
                ("xclient_get", "plain")
            };
            rows.push(row(
                name,
                api,
                size,
                1,
                &lats,
                errors,
                format!("B reads A's segment; verify={verify}"),
            ));
        }
        let w = ((args.window_bytes / size.max(1)) as usize).clamp(1, args.max_window);
        let val = value_bytes(size, size);
        for zcopy in [false, true] {
            let mut reg = if zcopy {
                let mut r = Registered::new(&s, size as usize)?;
                r.buf.copy_from_slice(&val);
                Some(r)
            } else {
                None
            };
            let mut lats = Vec::new();
            let mut errors = 0;
            let mut rnd = 0;
            let dl = Deadline::new(args.seconds, args.max_ops);
            while !dl.done(lats.len()) {
                let mut done = Vec::new();
                for i in 0..w {
                    let key = format!("{}-bput/{zcopy}/r{rnd}/{i}", args.keys);
                    let value: &[u8] = match &mut reg {
                        Some(r) => &r.buf,
                        None => &val,
                    };
                    let t = Instant::now();
                    let result = s.put(&key, value, &ReplicateConfig::default()).await;
                    lats.push(t.elapsed());
                    errors += usize::from(result.is_err());
                    done.push(key);
                    if dl.done(lats.len()) {
                        break;
                    }
                }
                rnd += 1;
                let refs: Vec<&str> = done.iter().map(|k| k.as_str()).collect();
                let _ = s.batch_remove(&refs, true).await;
            }
            let (name, api) = if zcopy {
                ("xclient_put_from", "zcopy")
            } else {
                ("xclient_put", "plain")
            };
            rows.push(row(
                name,
                api,
                size,
                1,
                &lats,
                errors,
                format!("B writes to A's segment; window={w}"),
            ));
        }
        for r in &rows {
            eprintln!("{}", format_row(r));
            println!("{}", encode_row(r));
        }
        let _ = s.close().await;
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_survive_the_peer_encoding() {
        let r = Row {
            case: "xclient_get".into(),
            api: "plain",
            size: 1 << 20,
            items: 1,
            ops: 10,
            errors: 1,
            ops_per_s: 123.5,
            p50_us: 400.25,
            p99_us: 900.0,
            note: "B reads".into(),
        };
        let back = decode_row(&encode_row(&r)).expect("decodes");
        assert_eq!(format_row(&back), format_row(&r));
        assert_eq!(back.note, r.note);
        assert!(decode_row("garbage").is_none());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 0.5), 50.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert_eq!(pct(&[], 0.5), 0.0);
    }
}
