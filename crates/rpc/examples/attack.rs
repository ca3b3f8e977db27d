//! Loopback attack on a live `mooncake master` and `mooncake store` while a client works
//! (`scripts/attack.sh` starts both and runs this; docs/security.md has one run's figures).
//!
//! Phases:
//! 1. *baseline*: a store client (TCP data path) puts and gets a fresh 64 KiB key in a loop;
//! 2. *attack*: the same loop while, together:
//!    - an idle flood of `--idle` connections (default 1,100) to the master's RPC port that send
//!      nothing, from 127.0.0.3-7 (so the per-address cap alone does not stop them), reopened
//!      whenever the master closes one;
//!    - `--half` connections (default 100) from 127.0.0.2 that each make one valid call (so
//!      they count as identified clients and are never evicted) and then send 15 MiB of a frame
//!      announcing 16 MiB (BatchPutStart, a bulk method) and stall; reopened when closed;
//!    - an idle flood of `--node-idle` connections (default 1,100) to the node's data port, from
//!      127.0.0.3-7, reopened when closed;
//!    - every 2 s a brand-new client connects, reads a key and leaves (new clients get in);
//! 3. *after*: attackers gone, memory sampled again.
//!
//! Prints one table: the client's success rate and p50/p99 per phase, newcomers' success, and
//! the master's and node's RSS (and the node's threads) before, at the peak during, and after.
//! Exits 1 when a target is missed (success ≥ 99 %, attacked p99 ≤ 3 × baseline p99).
//! Connects only to the addresses given, which must be loopback.
#![allow(clippy::unwrap_used)]

use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::ReplicateConfig;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Method ids (crates/proto/src/methods.rs).
const SERVICE_READY: u16 = 28;
const BATCH_PUT_START: u16 = 7;
/// Source addresses of the idle floods (the half-sent frames come from 127.0.0.2).
const FLOOD_SOURCES: [u8; 5] = [3, 4, 5, 6, 7];

struct Args {
    master: SocketAddr,
    node_data: SocketAddr,
    master_pid: u32,
    node_pid: u32,
    baseline: Duration,
    attack: Duration,
    after: Duration,
    value_bytes: usize,
    idle: usize,
    half: usize,
    node_idle: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut values = std::collections::HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {flag:?}"))?
            .to_string();
        let value = args
            .next()
            .ok_or_else(|| format!("--{name} needs a value"))?;
        values.insert(name, value);
    }
    let get = |name: &str, default: Option<&str>| -> Result<String, String> {
        values
            .get(name)
            .cloned()
            .or(default.map(str::to_string))
            .ok_or_else(|| format!("--{name} is required"))
    };
    let addr = |name: &str| -> Result<SocketAddr, String> {
        let text = get(name, None)?;
        // Accept a transfer endpoint (`tcp://host:port?inst=…`) as well as `host:port`.
        let text = text.trim_start_matches("tcp://");
        let text = text.split('?').next().unwrap_or(text);
        let addr: SocketAddr = text
            .parse()
            .map_err(|e| format!("--{name} {text:?}: {e}"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("--{name} {addr} is not a loopback address"));
        }
        Ok(addr)
    };
    let number = |name: &str, default: &str| -> Result<u64, String> {
        get(name, Some(default))?
            .parse()
            .map_err(|e| format!("--{name}: {e}"))
    };
    let seconds = |name: &str, default: &str| -> Result<Duration, String> {
        let value: f64 = get(name, Some(default))?
            .parse()
            .map_err(|e| format!("--{name}: {e}"))?;
        Ok(Duration::from_secs_f64(value))
    };
    Ok(Args {
        master: addr("master")?,
        node_data: addr("node-data")?,
        master_pid: number("master-pid", "0")? as u32,
        node_pid: number("node-pid", "0")? as u32,
        baseline: seconds("baseline-secs", "15")?,
        attack: seconds("attack-secs", "40")?,
        after: seconds("after-secs", "10")?,
        value_bytes: number("value-bytes", "65536")? as usize,
        idle: number("idle", "1100")? as usize,
        half: number("half", "100")? as usize,
        node_idle: number("node-idle", "1100")? as usize,
    })
}

fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read/write the struct passed by pointer, which is live.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// A blocking TCP connection from `local` (a 127.0.0.x address) to `server`.
fn connect_from(local: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
    let SocketAddr::V4(server) = server else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns (wrapped in a TcpStream,
    // which closes it, as soon as it exists); the address structs are live and their size is
    // passed alongside.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let me = sockaddr(local, 0);
        if libc::bind(fd, (&me as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let them = sockaddr(*server.ip(), server.port());
        if libc::connect(fd, (&them as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// Whether the server closed `stream` (EOF or error); the stream must be non-blocking.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 64];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false, // an error frame on its way; the close follows
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

/// Counters the attackers keep.
#[derive(Default)]
struct AttackStats {
    idle_reopened: AtomicU64,
    half_reopened: AtomicU64,
    half_bytes_sent: AtomicU64,
    node_reopened: AtomicU64,
}

/// Holds `count` idle connections to `server` from the flood sources; reopens closed ones.
fn idle_flood(server: SocketAddr, count: usize, stop: &AtomicBool, reopened: &AtomicU64) {
    let source = |i: usize| Ipv4Addr::new(127, 0, 0, FLOOD_SOURCES[i % FLOOD_SOURCES.len()]);
    let open = |i: usize| {
        connect_from(source(i), server)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .ok()
    };
    let mut conns: Vec<Option<TcpStream>> = (0..count).map(open).collect();
    while !stop.load(Ordering::Relaxed) {
        for (i, conn) in conns.iter_mut().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let gone = match conn {
                Some(stream) => closed(stream),
                None => true,
            };
            if gone {
                *conn = open(i);
                reopened.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn request_header(method: u16, request_id: u64, body_len: usize) -> Vec<u8> {
    let frame_len = (mooncake_proto::HEADER_BYTES - 4 + body_len) as u32;
    let mut out = Vec::with_capacity(mooncake_proto::HEADER_BYTES);
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.push(mooncake_proto::PROTOCOL_VERSION);
    out.push(0); // request
    out.extend_from_slice(&method.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out
}

/// `count` connections from 127.0.0.2, each identified by one valid call, then pushing 15 MiB
/// of a 16 MiB frame and stalling; reopened (and restarted) when the master closes them.
fn half_sent_frames(server: SocketAddr, count: usize, stop: &AtomicBool, stats: &AttackStats) {
    let frame_total = 16 * MIB;
    let mut opening = request_header(SERVICE_READY, 1, 0);
    opening.extend(request_header(
        BATCH_PUT_START,
        2,
        frame_total - mooncake_proto::HEADER_BYTES,
    ));
    let mut stream_bytes = opening;
    stream_bytes.resize(
        stream_bytes.len() - mooncake_proto::HEADER_BYTES + 15 * MIB,
        0x11,
    );
    let open = || {
        connect_from(Ipv4Addr::new(127, 0, 0, 2), server)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .ok()
    };
    let mut conns: Vec<(Option<TcpStream>, usize)> = (0..count).map(|_| (open(), 0)).collect();
    while !stop.load(Ordering::Relaxed) {
        let mut progressed = false;
        for (conn, sent) in conns.iter_mut() {
            let Some(stream) = conn else {
                *conn = open();
                *sent = 0;
                stats.half_reopened.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            if *sent < stream_bytes.len() {
                match stream.write(&stream_bytes[*sent..]) {
                    Ok(n) => {
                        *sent += n;
                        stats.half_bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                        progressed |= n > 0;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => *conn = None,
                }
            } else if closed(stream) {
                *conn = None;
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Resident memory (KiB) and thread count of a process, from /proc.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

#[derive(Clone, Copy, Default)]
struct Sample {
    master_rss_kib: u64,
    node_rss_kib: u64,
    node_threads: u64,
}

impl Sample {
    fn now(master_pid: u32, node_pid: u32) -> Sample {
        let (master_rss_kib, _) = rss_and_threads(master_pid);
        let (node_rss_kib, node_threads) = rss_and_threads(node_pid);
        Sample {
            master_rss_kib,
            node_rss_kib,
            node_threads,
        }
    }

    fn max(self, other: Sample) -> Sample {
        Sample {
            master_rss_kib: self.master_rss_kib.max(other.master_rss_kib),
            node_rss_kib: self.node_rss_kib.max(other.node_rss_kib),
            node_threads: self.node_threads.max(other.node_threads),
        }
    }
}

/// What one phase of the client loop did.
#[derive(Default)]
struct LoopStats {
    ops: u64,
    ok: u64,
    latencies_us: Vec<u64>,
    first_error: Option<String>,
}

impl LoopStats {
    fn success_pct(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        100.0 * self.ok as f64 / self.ops as f64
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.latencies_us.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[index] as f64 / 1000.0
    }
}

fn store_config(master: SocketAddr) -> StoreConfig {
    StoreConfig {
        master_addr: master.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        // The node is on this host: force TCP so the data path crosses the flooded port.
        transport: mooncake_transfer::TransportMode::Tcp,
        ..StoreConfig::default()
    }
}

/// One op: put a fresh key, get it back and compare, then remove it (untimed).
async fn client_loop(
    client: &StoreClient,
    value: &[u8],
    run_for: Duration,
    tag: &str,
) -> LoopStats {
    let mut stats = LoopStats::default();
    let config = ReplicateConfig::default();
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed() < run_for {
        i += 1;
        let key = format!("attack-{tag}-{i}");
        let op = Instant::now();
        let outcome = async {
            client
                .put(&key, value, &config)
                .await
                .map_err(|e| format!("put: {e}"))?;
            let got = client.get(&key).await.map_err(|e| format!("get: {e}"))?;
            if got != value {
                return Err("get returned different bytes".to_string());
            }
            Ok(())
        }
        .await;
        let took = op.elapsed();
        stats.ops += 1;
        match outcome {
            Ok(()) => {
                stats.ok += 1;
                stats.latencies_us.push(took.as_micros() as u64);
            }
            Err(why) => {
                if stats.first_error.is_none() {
                    stats.first_error = Some(why);
                }
            }
        }
        let _ = client.remove(&key, true).await;
    }
    stats
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("attack: {why}");
            eprintln!(
                "usage: attack --master HOST:PORT --node-data HOST:PORT|ENDPOINT --master-pid PID \
                 --node-pid PID [--baseline-secs 15] [--attack-secs 40] [--after-secs 10] \
                 [--value-bytes 65536] [--idle 1100] [--half 100] [--node-idle 1100]"
            );
            std::process::exit(2);
        }
    };
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let value: Vec<u8> = (0..args.value_bytes).map(|i| (i % 251) as u8).collect();
    let client = runtime
        .block_on(StoreClient::connect(store_config(args.master)))
        .unwrap_or_else(|e| panic!("cannot join the cluster at {}: {e}", args.master));
    // A key newcomers read during the attack.
    runtime
        .block_on(client.put("attack-newcomer-key", &value, &ReplicateConfig::default()))
        .unwrap();

    eprintln!("attack: baseline for {:?}", args.baseline);
    let before = Sample::now(args.master_pid, args.node_pid);
    let baseline = runtime.block_on(client_loop(&client, &value, args.baseline, "base"));

    eprintln!(
        "attack: {} idle RPC + {} half-sent 16 MiB frames + {} idle data-port connections for {:?}",
        args.idle, args.half, args.node_idle, args.attack
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AttackStats::default());
    let threads = start_attackers(&args, &stop, &stats);
    let peak = Arc::new(parking_lot::Mutex::new(Sample::default()));
    let sampler = spawn_sampler(&args, &stop, &peak);
    let newcomers = spawn_newcomers(args.master, &stop, value.clone());
    let attacked = runtime.block_on(client_loop(&client, &value, args.attack, "attack"));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    let _ = sampler.join();
    let (new_tried, new_ok, new_error) = newcomers.join().unwrap_or((0, 0, None));
    let during = *peak.lock();

    eprintln!("attack: attackers gone; waiting {:?}", args.after);
    let after_loop = runtime.block_on(client_loop(&client, &value, args.after, "after"));
    let after = Sample::now(args.master_pid, args.node_pid);
    let _ = runtime.block_on(client.remove("attack-newcomer-key", true));
    let _ = runtime.block_on(client.close());

    let met = print_report(
        [&baseline, &attacked, &after_loop],
        [before, during, after],
        &stats,
        (new_tried, new_ok, new_error),
    );
    if !met {
        std::process::exit(1);
    }
}

/// The three attacks, each on its own thread until `stop`: half-sent 16 MiB frames and an idle
/// flood against the master, an idle flood against the node's data port.
fn start_attackers(
    args: &Args,
    stop: &Arc<AtomicBool>,
    stats: &Arc<AttackStats>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    {
        let (stop, stats, master) = (stop.clone(), stats.clone(), args.master);
        let half = args.half;
        threads.push(std::thread::spawn(move || {
            half_sent_frames(master, half, &stop, &stats)
        }));
    }
    {
        let (stop, stats, master) = (stop.clone(), stats.clone(), args.master);
        let idle = args.idle;
        threads.push(std::thread::spawn(move || {
            idle_flood(master, idle, &stop, &stats.idle_reopened)
        }));
    }
    {
        let (stop, stats, node) = (stop.clone(), stats.clone(), args.node_data);
        let idle = args.node_idle;
        threads.push(std::thread::spawn(move || {
            idle_flood(node, idle, &stop, &stats.node_reopened)
        }));
    }
    threads
}

/// Samples both processes' RSS and thread counts every 100 ms into `peak` until `stop`.
fn spawn_sampler(
    args: &Args,
    stop: &Arc<AtomicBool>,
    peak: &Arc<parking_lot::Mutex<Sample>>,
) -> std::thread::JoinHandle<()> {
    let (stop, peak) = (stop.clone(), peak.clone());
    let (master_pid, node_pid) = (args.master_pid, args.node_pid);
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let now = Sample::now(master_pid, node_pid);
            let mut peak = peak.lock();
            *peak = peak.max(now);
            drop(peak);
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Every 2 s until `stop`, a new client joins, reads the newcomer key and leaves; returns
/// (tried, served, first failure).
fn spawn_newcomers(
    master: SocketAddr,
    stop: &Arc<AtomicBool>,
    expected: Vec<u8>,
) -> std::thread::JoinHandle<(u64, u64, Option<String>)> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (mut tried, mut ok) = (0u64, 0u64);
        let mut first_error = None;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(2));
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tried += 1;
            let outcome = rt.block_on(async {
                let fresh = StoreClient::connect(store_config(master))
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let got = fresh
                    .get("attack-newcomer-key")
                    .await
                    .map_err(|e| format!("get: {e}"));
                let _ = fresh.close().await;
                if got? == expected {
                    Ok(())
                } else {
                    Err("wrong bytes".to_string())
                }
            });
            match outcome {
                Ok(()) => ok += 1,
                Err(why) => {
                    first_error.get_or_insert(why);
                }
            }
        }
        (tried, ok, first_error)
    })
}

/// Prints the phase table, RSS and thread peaks, attack counters and the targets; true when
/// every target is met.
fn print_report(
    [baseline, attacked, after_loop]: [&LoopStats; 3],
    [before, during, after]: [Sample; 3],
    stats: &AttackStats,
    (new_tried, new_ok, new_error): (u64, u64, Option<String>),
) -> bool {
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!("| phase    | client ops | success  | p50 ms | p99 ms |");
    println!("|----------|-----------:|---------:|-------:|-------:|");
    for (name, s) in [
        ("baseline", baseline),
        ("attack", attacked),
        ("after", after_loop),
    ] {
        println!(
            "| {name:<8} | {:>10} | {:>7.2}% | {:>6.2} | {:>6.2} |",
            s.ops,
            s.success_pct(),
            s.percentile_ms(0.5),
            s.percentile_ms(0.99)
        );
    }
    println!();
    println!(
        "new clients during the attack (connect + get + leave, every 2 s): {new_ok}/{new_tried}"
    );
    println!();
    println!("|                 | before | peak during | after |");
    println!("|-----------------|-------:|------------:|------:|");
    println!(
        "| master RSS, MiB | {:>6.0} | {:>11.0} | {:>5.0} |",
        mib(before.master_rss_kib),
        mib(during.master_rss_kib),
        mib(after.master_rss_kib)
    );
    println!(
        "| node RSS, MiB   | {:>6.0} | {:>11.0} | {:>5.0} |",
        mib(before.node_rss_kib),
        mib(during.node_rss_kib),
        mib(after.node_rss_kib)
    );
    println!(
        "| node threads    | {:>6} | {:>11} | {:>5} |",
        before.node_threads, during.node_threads, after.node_threads
    );
    println!();
    println!(
        "attackers: {} MiB of half-sent frames pushed, reopened after a close: {} half-sent, {} idle RPC, {} idle data-port",
        stats.half_bytes_sent.load(Ordering::Relaxed) / MIB as u64,
        stats.half_reopened.load(Ordering::Relaxed),
        stats.idle_reopened.load(Ordering::Relaxed),
        stats.node_reopened.load(Ordering::Relaxed),
    );
    for (name, s) in [
        ("baseline", baseline),
        ("attack", attacked),
        ("after", after_loop),
    ] {
        if let Some(why) = &s.first_error {
            println!("first {name} failure: {why}");
        }
    }
    if let Some(why) = new_error {
        println!("first new-client failure: {why}");
    }
    let p99_ratio = attacked.percentile_ms(0.99) / baseline.percentile_ms(0.99);
    let success_ok = attacked.success_pct() >= 99.0;
    let p99_ok = p99_ratio <= 3.0;
    let newcomers_ok = new_ok == new_tried;
    println!(
        "targets: success >= 99%: {} ({:.2}%); attacked p99 <= 3x baseline: {} ({p99_ratio:.2}x); new clients all served: {}",
        yes(success_ok),
        attacked.success_pct(),
        yes(p99_ok),
        yes(newcomers_ok)
    );
    success_ok && p99_ok && newcomers_ok
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}
