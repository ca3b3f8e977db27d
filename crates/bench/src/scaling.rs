//! `mooncake bench scaling`: P client processes against one master child, each calling one
//! operation in a tight loop (`is_exist`, `batch_is_exist` of `--batch` keys, a 4 KiB `get`),
//! all starting at the same instant. Prints the aggregate calls/s (and keys/s), p50/p99 over
//! every call of every process, the CPU of the master and of the clients, the share of calls
//! whose caller spun for its answer, next to a blocking and a spinning TCP ping-pong between two
//! processes measured in the same run (the floors of a round trip without and with polling).
//!
//! This process starts the master (`EXE master …`), owns the only memory segment and puts the
//! keys, then starts the clients (`EXE bench scaling-worker …`, segment 0, so every `get`
//! crosses to this process's segment). A client answers `READY` once connected and checked,
//! then runs one case per `RUN` line and answers with a `DONE` line; stdin closing ends it.

use anyhow::{bail, Context};
use mooncake_client::StoreClient;
use mooncake_common::ReplicateConfig;
use mooncake_transfer::TransportMode;
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::pingpong::{self, Latency};
use crate::store::{client_config, runtime, start_master, KillOnDrop};

/// What each client calls in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    #[value(name = "is_exist")]
    IsExist,
    #[value(name = "batch_is_exist")]
    BatchIsExist,
    #[value(name = "get")]
    Get,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::IsExist => "is_exist",
            Mode::BatchIsExist => "batch_is_exist",
            Mode::Get => "get",
        }
    }
}

/// Flags of the scaling benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Client process counts, one round of every mode each.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    pub procs: Vec<usize>,
    #[arg(
        long,
        default_value = "is_exist,batch_is_exist,get",
        value_delimiter = ','
    )]
    pub modes: Vec<Mode>,
    /// Measured time per (P, mode).
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Keys put before the rounds (every client cycles over them).
    #[arg(long, default_value_t = 1024)]
    pub keys: usize,
    /// Keys per `batch_is_exist` call.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Value size of the keys (what `get` reads).
    #[arg(long, default_value = "4KiB", value_parser = crate::parse_size_arg)]
    pub value_size: u64,
    /// The clients' busy-poll budget on every call (0 = off; default: the client's default,
    /// adaptive).
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    /// Transport between the clients and the segment: `auto` (shared memory on one host), `tcp`.
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
    /// Round trips of each ping-pong floor.
    #[arg(long, default_value_t = 20_000)]
    pub pingpong_iterations: usize,
}

/// Flags of a client process (started by `bench scaling`).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub master: String,
    #[arg(long)]
    pub prefix: String,
    #[arg(long)]
    pub keys: usize,
    #[arg(long)]
    pub batch: usize,
    #[arg(long)]
    pub value_size: u64,
    #[arg(long)]
    pub busy_poll_us: Option<u64>,
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
}

fn key(prefix: &str, i: usize) -> String {
    format!("{prefix}/{i:06}")
}

/// Latency histogram: 16 buckets per power of two of nanoseconds (6% resolution), mergeable
/// across processes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
}

impl Histogram {
    fn bucket(ns: u64) -> usize {
        if ns < 16 {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros();
        let mantissa = (ns >> (exp - 4)) & 15;
        ((exp - 3) * 16) as usize + mantissa as usize
    }

    /// The middle of bucket `index`, in nanoseconds.
    fn value(index: usize) -> f64 {
        if index < 16 {
            return index as f64;
        }
        let exp = (index / 16 + 3) as u32;
        let low = ((16 + (index % 16)) as u64) << (exp - 4);
        low as f64 + ((1u64 << (exp - 4)) as f64 - 1.0) / 2.0
    }

    pub fn record(&mut self, latency: Duration) {
        let i = Self::bucket(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Nearest-rank quantile in µs (0 when empty).
    pub fn quantile_us(&self, q: f64) -> f64 {
        let rank = ((q * self.total() as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(i) / 1000.0;
            }
        }
        0.0
    }

    /// `index:count` pairs of the non-empty buckets, comma-separated.
    fn encode(&self) -> String {
        let pairs: Vec<String> = (self.counts.iter().enumerate())
            .filter(|(_, &n)| n > 0)
            .map(|(i, n)| format!("{i}:{n}"))
            .collect();
        pairs.join(",")
    }

    fn decode(text: &str) -> Option<Histogram> {
        let mut h = Histogram::default();
        for pair in text.split(',').filter(|p| !p.is_empty()) {
            let (i, n) = pair.split_once(':')?;
            let (i, n): (usize, u64) = (i.parse().ok()?, n.parse().ok()?);
            if i > 64 * 16 {
                return None;
            }
            if h.counts.len() <= i {
                h.counts.resize(i + 1, 0);
            }
            h.counts[i] += n;
        }
        Some(h)
    }
}

/// What one client reports of one case.
#[derive(Debug, Default, Clone, PartialEq)]
struct Report {
    calls: u64,
    errors: u64,
    spins: u64,
    cpu: Duration,
    window: Duration,
    latencies: Histogram,
}

impl Report {
    fn line(&self) -> String {
        format!(
            "DONE {} {} {} {} {} {}",
            self.calls,
            self.errors,
            self.spins,
            self.cpu.as_nanos(),
            self.window.as_nanos(),
            self.latencies.encode()
        )
    }

    fn parse(line: &str) -> Option<Report> {
        let mut words = line.split_whitespace();
        if words.next()? != "DONE" {
            return None;
        }
        let mut number = || words.next()?.parse::<u64>().ok();
        let (calls, errors, spins) = (number()?, number()?, number()?);
        let (cpu, window) = (number()?, number()?);
        let latencies = Histogram::decode(words.next().unwrap_or(""))?;
        Some(Report {
            calls,
            errors,
            spins,
            cpu: Duration::from_nanos(cpu),
            window: Duration::from_nanos(window),
            latencies,
        })
    }
}

/// CPU time (user + system) of this process.
fn own_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

fn unix_now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One client process: connects, checks, then runs the cases it is told.
pub fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let rt = runtime()?;
    let config = client_config(
        &args.master,
        0,
        args.transport,
        args.busy_poll_us,
        true,
        &Default::default(),
    );
    let store = rt.block_on(StoreClient::connect(config))?;
    let keys: Vec<String> = (0..args.keys).map(|i| key(&args.prefix, i)).collect();
    let check = rt.block_on(async {
        let hit = store.is_exist(&keys[0]).await?;
        let miss = store.is_exist(&format!("{}/missing", args.prefix)).await?;
        let got = store.get(&keys[0]).await?;
        anyhow::Ok(hit && !miss && got.len() as u64 == args.value_size)
    })?;
    if !check {
        bail!("client check failed: is_exist or get gave the wrong answer");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let [_, mode, start_ns, seconds] = words[..] else {
            break;
        };
        let mode = <Mode as clap::ValueEnum>::from_str(mode, false).map_err(anyhow::Error::msg)?;
        let start_ns: u128 = start_ns.parse()?;
        let seconds: f64 = seconds.parse()?;
        while unix_now_ns() < start_ns {
            std::thread::sleep(Duration::from_micros(200));
        }
        let report = rt.block_on(run_case(&store, &keys, &args, mode, seconds));
        writeln!(out, "{}", report.line())?;
        out.flush()?;
    }
    let _ = rt.block_on(store.close());
    Ok(())
}

/// One client's loop of `mode` for `seconds`.
async fn run_case(
    store: &StoreClient,
    keys: &[String],
    args: &WorkerArgs,
    mode: Mode,
    seconds: f64,
) -> Report {
    let batch = args.batch.clamp(1, keys.len());
    let slices: Vec<Vec<&str>> = keys
        .chunks(batch)
        .filter(|c| c.len() == batch)
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    let spins_before = store.master_poll_stats().spins;
    let cpu_before = own_cpu();
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut report = Report::default();
    let mut i = 0usize;
    while Instant::now() < end {
        let t = Instant::now();
        let ok = match mode {
            Mode::IsExist => store.is_exist(&keys[i % keys.len()]).await.unwrap_or(false),
            Mode::BatchIsExist => store
                .batch_is_exist(&slices[i % slices.len()])
                .await
                .is_ok_and(|v| v.iter().all(|x| matches!(x, Ok(true)))),
            Mode::Get => store
                .get(&keys[i % keys.len()])
                .await
                .is_ok_and(|v| v.len() as u64 == args.value_size),
        };
        report.latencies.record(t.elapsed());
        report.calls += 1;
        report.errors += u64::from(!ok);
        i += 1;
    }
    report.window = started.elapsed();
    report.cpu = own_cpu().saturating_sub(cpu_before);
    report.spins = store.master_poll_stats().spins - spins_before;
    report
}

struct Worker {
    child: KillOnDrop,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// Closes stdin (the client closes its store and exits) and waits for the exit, for a
    /// bounded time (then the drop kills it), so the master sees a clean goodbye rather than
    /// a client to expire.
    fn finish(mut self) {
        drop(self.stdin);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.child.0.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                _ => return,
            }
        }
    }

    fn read_line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("a client process ended early");
        }
        Ok(line)
    }
}

fn start_workers(args: &Args, master: &str, prefix: &str, n: usize) -> anyhow::Result<Vec<Worker>> {
    let exe = std::env::current_exe().context("locating the mooncake binary")?;
    let mut workers = Vec::new();
    for _ in 0..n {
        let mut command = Command::new(&exe);
        command.args([
            "bench",
            "scaling-worker",
            "--master",
            master,
            "--prefix",
            prefix,
        ]);
        command.args(["--keys", &args.keys.to_string()]);
        command.args(["--batch", &args.batch.to_string()]);
        command.args(["--value-size", &args.value_size.to_string()]);
        command.args([
            "--transport",
            &format!("{:?}", args.transport).to_lowercase(),
        ]);
        if let Some(us) = args.busy_poll_us {
            command.args(["--busy-poll-us", &us.to_string()]);
        }
        let mut child = KillOnDrop(
            command
                .env("MOONCAKE_LOG", "warn")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting a client process")?,
        );
        let stdin = child.0.stdin.take().context("client stdin")?;
        let stdout = BufReader::new(child.0.stdout.take().context("client stdout")?);
        workers.push(Worker {
            child,
            stdin,
            stdout,
        });
    }
    for worker in &mut workers {
        let line = worker.read_line()?;
        if line.trim() != "READY" {
            bail!("client process answered {line:?} instead of READY");
        }
    }
    Ok(workers)
}

/// One row of the table.
#[derive(Debug, Clone)]
struct Row {
    case: String,
    procs: usize,
    calls_per_s: f64,
    keys_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    master_cpu: Option<f64>,
    clients_cpu: Option<f64>,
    spun: Option<f64>,
    errors: u64,
}

impl Row {
    fn floor(case: &str, latency: &Latency) -> Row {
        Row {
            case: case.to_string(),
            procs: 1,
            calls_per_s: latency.ops_per_sec,
            keys_per_s: latency.ops_per_sec,
            p50_us: latency.p50_us,
            p99_us: latency.p99_us,
            master_cpu: None,
            clients_cpu: None,
            spun: None,
            errors: 0,
        }
    }

    fn print(&self) {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
        println!(
            "{:<36} {:>2} {:>10.0} {:>11.0} {:>8.1} {:>8.1} {:>7} {:>8} {:>6} {:>6}",
            self.case,
            self.procs,
            self.calls_per_s,
            self.keys_per_s,
            self.p50_us,
            self.p99_us,
            pct(self.master_cpu),
            pct(self.clients_cpu),
            pct(self.spun),
            self.errors
        );
    }
}

/// Runs `mode` on every worker at once; the aggregate row.
fn run_round(
    workers: &mut [Worker],
    master_pid: Option<u32>,
    mode: Mode,
    args: &Args,
) -> anyhow::Result<Row> {
    let start_ns = unix_now_ns() + 100_000_000;
    for worker in workers.iter_mut() {
        writeln!(
            worker.stdin,
            "RUN {} {start_ns} {}",
            mode.name(),
            args.seconds
        )?;
        worker.stdin.flush()?;
    }
    let master_before = master_pid.and_then(crate::proc_cpu_seconds);
    let mut total = Report::default();
    for worker in workers.iter_mut() {
        let line = worker.read_line()?;
        let report = Report::parse(&line).with_context(|| format!("client said {line:?}"))?;
        total.calls += report.calls;
        total.errors += report.errors;
        total.spins += report.spins;
        total.cpu += report.cpu;
        total.window = total.window.max(report.window);
        total.latencies.merge(&report.latencies);
    }
    let window = total.window.as_secs_f64().max(1e-9);
    let master_after = master_pid.and_then(crate::proc_cpu_seconds);
    let keys_per_call = if mode == Mode::BatchIsExist {
        args.batch.clamp(1, args.keys) as f64
    } else {
        1.0
    };
    let calls_per_s = total.calls as f64 / window;
    Ok(Row {
        case: mode.name().to_string(),
        procs: workers.len(),
        calls_per_s,
        keys_per_s: calls_per_s * keys_per_call,
        p50_us: total.latencies.quantile_us(0.50),
        p99_us: total.latencies.quantile_us(0.99),
        master_cpu: master_before
            .zip(master_after)
            .map(|(b, a)| (a - b) / window),
        clients_cpu: Some(total.cpu.as_secs_f64() / window),
        spun: Some(total.spins as f64 / (total.calls.max(1)) as f64),
        errors: total.errors,
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.keys == 0 || args.procs.is_empty() {
        bail!("--keys and --procs must not be empty");
    }
    let blocking = pingpong::measure(false, args.pingpong_iterations)?;
    let spinning = pingpong::measure(true, args.pingpong_iterations)?;
    let (master_child, master) = start_master()?;
    let master_pid = Some(master_child.0.id());
    let rt = runtime()?;
    let prefix = format!("scal{}", std::process::id());
    let segment = (args.keys as u64 * args.value_size * 2).max(64 << 20);
    let owner = rt.block_on(async {
        let owner = StoreClient::connect(client_config(
            &master,
            segment,
            args.transport,
            args.busy_poll_us,
            true,
            &Default::default(),
        ))
        .await
        .context("the owning client")?;
        let value = vec![0x5a; args.value_size as usize];
        for i in 0..args.keys {
            owner
                .put(&key(&prefix, i), &value, &ReplicateConfig::default())
                .await
                .context("putting the keys")?;
        }
        anyhow::Ok(owner)
    })?;
    let busy_poll = match args.busy_poll_us {
        None => "adaptive (default)".to_string(),
        Some(0) => "off".to_string(),
        Some(us) => format!("{us} us on every call"),
    };
    println!(
        "mooncake bench scaling: P client processes against one master, {} keys of {} B, \
         batch {}, {} s per case, client busy-poll {busy_poll}, {} cores, load average {}",
        args.keys,
        args.value_size,
        args.batch,
        args.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!(
        "{:<36} {:>2} {:>10} {:>11} {:>8} {:>8} {:>7} {:>8} {:>6} {:>6}",
        "case", "P", "calls/s", "keys/s", "p50 us", "p99 us", "master", "clients", "spun", "errors"
    );
    Row::floor("tcp ping-pong 32 B (blocking floor)", &blocking).print();
    Row::floor("tcp ping-pong 32 B (spinning floor)", &spinning).print();
    let mut errors = 0;
    for &procs in &args.procs {
        let mut workers = start_workers(&args, &master, &prefix, procs.max(1))?;
        for &mode in &args.modes {
            let row = run_round(&mut workers, master_pid, mode, &args)?;
            errors += row.errors;
            row.print();
        }
        workers.into_iter().for_each(Worker::finish);
    }
    println!("load average at the end {}", load_average());
    let _ = rt.block_on(owner.close());
    drop(master_child);
    if errors > 0 {
        bail!("{errors} calls failed or gave wrong answers");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn histogram_buckets_hold_their_values_within_six_percent() {
        for ns in [0u64, 1, 15, 16, 17, 31, 32, 1000, 12_345, 999_999, 1 << 40] {
            let v = Histogram::value(Histogram::bucket(ns));
            let err = (v - ns as f64).abs() / (ns.max(1) as f64);
            assert!(err <= 0.0625, "{ns}: {v}");
        }
        let mut h = Histogram::default();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile_us(0.5);
        assert!((47.0..=53.0).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((93.0..=105.0).contains(&p99), "{p99}");
    }

    #[test]
    fn reports_travel_as_one_line_and_merge() {
        let mut report = Report {
            calls: 3,
            errors: 1,
            spins: 2,
            cpu: Duration::from_micros(1500),
            window: Duration::from_millis(20),
            latencies: Histogram::default(),
        };
        for us in [10, 20, 4000] {
            report.latencies.record(Duration::from_micros(us));
        }
        let back = Report::parse(&report.line()).unwrap();
        assert_eq!(back, report);
        let mut merged = Histogram::default();
        merged.merge(&back.latencies);
        merged.merge(&report.latencies);
        assert_eq!(merged.total(), 6);
        assert!(Report::parse("DONE 1 2").is_none());
        assert!(Report::parse("DONE 1 0 0 5 5 x:1").is_none());
        assert!(Report::parse("DONE 1 0 0 5 5 99999:1").is_none());
        assert_eq!(Report::parse("DONE 0 0 0 5 5").unwrap().calls, 0);
    }
}
