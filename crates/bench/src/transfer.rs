//! `mooncake bench transfer`: the data plane between two processes, per transport, next to the
//! limits measured in the same run (iperf3 on loopback, single-thread memcpy).
//!
//! The bench starts itself again as the serving process (`--serve`, hidden), which allocates
//! one shareable segment and prints its endpoint. This process then reads and writes that
//! segment through each transport with 1 and N entries in flight, and prints one Markdown table.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use mooncake_transfer::{
    Batch, Endpoint, MemoryHandle, SegmentOptions, TransferConfig, TransferEngine, TransferRequest,
    TransportMode,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Seconds each repetition of a case runs (after a short warm-up).
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Transfer sizes (units accepted: 4KiB, 1MiB...).
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB,1MiB,16MiB")]
    sizes: Vec<String>,
    /// Transports to measure: tcp, shm.
    #[arg(long, value_delimiter = ',', default_value = "tcp,shm")]
    transports: Vec<String>,
    /// TCP connections per peer to measure (compared with iperf3 -P of the same count).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    tcp_streams: Vec<usize>,
    /// Entries in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    inflight: Vec<usize>,
    /// Entries per batch for the batch rows (one batch of small entries at a time); 1 = none.
    #[arg(long, default_value_t = 64)]
    batch_entries: usize,
    /// Entry sizes of the batch rows.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB")]
    batch_sizes: Vec<String>,
    /// Copy threads of the engine (shared-memory and local copies).
    #[arg(long, default_value_t = 2)]
    copy_threads: usize,
    /// Repetitions of each case (the table shows medians).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Seconds of each iperf3 run.
    #[arg(long, default_value_t = 3)]
    iperf_seconds: u64,
    /// Internal: run as the serving process with a segment of this many bytes.
    #[arg(long, hide = true)]
    serve_bytes: Option<usize>,
}

const MB: f64 = 1e6;

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(bytes) = args.serve_bytes {
        return serve(bytes);
    }
    let sizes = parse_sizes(&args.sizes)?;
    let batch_sizes = parse_sizes(&args.batch_sizes)?;
    let max_size = sizes.iter().copied().max().unwrap_or(0).max(1);
    let max_inflight = args.inflight.iter().copied().max().unwrap_or(1).max(1);
    let slot = max_size;
    let batch_bytes = batch_sizes.iter().copied().max().unwrap_or(0) * args.batch_entries;
    let region_bytes = (slot * max_inflight).max(batch_bytes);

    let mut server = ServerProcess::spawn(region_bytes)?;
    println!(
        "serving process: pid {}, endpoint {}",
        server.child.id(),
        server.endpoint
    );
    println!("(MB = 10^6 bytes; latency = submit to completion of one entry)\n");

    // TCP limit: iperf3 with the same number of streams, with its default 128 KiB writes and
    // with 1 MiB writes, run before and after the cases; the best figure is the limit.
    let iperf_runs = |when: &str| -> Vec<(usize, &'static str, Option<f64>)> {
        let mut runs = Vec::new();
        for &streams in &args.tcp_streams {
            for (label, block) in [("default 128 KiB writes", None), ("-l 1M", Some("1M"))] {
                let value = iperf3_mb_s(streams, block, args.iperf_seconds);
                eprintln!("iperf3 {when}: {streams} stream(s), {label}: {value:?} MB/s");
                runs.push((streams, label, value));
            }
        }
        runs
    };
    let mut iperf = if args.transports.iter().any(|t| t == "tcp") {
        iperf_runs("before")
    } else {
        Vec::new()
    };

    let mut rows = Vec::new();
    for transport in &args.transports {
        let configs: Vec<(String, TransportMode, usize)> = match transport.as_str() {
            "tcp" => args
                .tcp_streams
                .iter()
                .map(|&n| (format!("tcp ({n} conn)"), TransportMode::Tcp, n))
                .collect(),
            "shm" => vec![(
                format!("shm ({} copy thr)", args.copy_threads),
                TransportMode::Shm,
                1,
            )],
            other => bail!("unknown transport {other:?} (tcp, shm)"),
        };
        for (label, mode, streams) in configs {
            rows.extend(measure_transport(
                &args,
                &server,
                (&label, mode, streams),
                (&sizes, &batch_sizes),
                (slot, region_bytes),
            )?);
        }
    }
    server.stop();
    if !iperf.is_empty() {
        iperf.extend(iperf_runs("after"));
    }

    print_tables(&args, &iperf, &rows);
    Ok(())
}

/// One row of the transfer table: transport label, streams, case, result, memcpy limit.
type Row = (String, usize, Case, CaseResult, Option<f64>);

fn parse_sizes(texts: &[String]) -> anyhow::Result<Vec<usize>> {
    texts
        .iter()
        .map(|text| {
            let size =
                mooncake_common::parse_size(text).with_context(|| format!("size {text:?}"))?;
            Ok(usize::try_from(size)?)
        })
        .collect()
}

/// Every case of one transport configuration (`label`, mode, streams), each `reps` times, a
/// shared-memory case right after its memcpy limit.
fn measure_transport(
    args: &Args,
    server: &ServerProcess,
    (label, mode, streams): (&str, TransportMode, usize),
    (sizes, batch_sizes): (&[usize], &[usize]),
    (slot, region_bytes): (usize, usize),
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let engine = TransferEngine::start(TransferConfig {
        transport: mode,
        connections_per_peer: streams,
        copy_threads: args.copy_threads,
        enable_shm_server: false,
        ..TransferConfig::default()
    })?;
    let local = engine.allocate_local_buffer(region_bytes)?;
    local.write_at(0, &vec![0xa5; region_bytes])?; // fault every page in up front
                                                   // Single-entry batches with 1 / N outstanding, then whole batches of small entries.
    let mut shapes: Vec<(usize, usize, &[usize])> =
        args.inflight.iter().map(|&n| (n, 1, sizes)).collect();
    if args.batch_entries > 1 {
        shapes.push((1, args.batch_entries, batch_sizes));
    }
    for &(inflight, batch_entries, shape_sizes) in &shapes {
        for &size in shape_sizes {
            for write in [false, true] {
                let case = Case {
                    size,
                    inflight,
                    batch_entries,
                    write,
                    slot,
                };
                // Shared-memory limit: single-thread memcpy of the same size over the same
                // working set (one slot per entry in flight), measured right before the
                // case so both see the same machine load.
                // Each case runs `reps` times (limit, then case); the row shows the
                // medians, which a shared, noisy machine needs.
                let mut rates = Vec::new();
                let mut limits = Vec::new();
                let mut latencies_us = Vec::new();
                for _ in 0..args.reps.max(1) {
                    if mode != TransportMode::Tcp {
                        limits.push(if batch_entries > 1 {
                            memcpy_mb_s(size, batch_entries, size, args.seconds)
                        } else {
                            memcpy_mb_s(size, inflight, slot, args.seconds)
                        });
                    }
                    let (mb_s, mut lat) = case.run(&engine, &local, server, args.seconds)?;
                    rates.push(mb_s);
                    latencies_us.append(&mut lat);
                }
                latencies_us.sort_by(f64::total_cmp);
                let result = CaseResult {
                    mb_s: median(&mut rates),
                    p50_us: percentile(&latencies_us, 0.50),
                    p99_us: percentile(&latencies_us, 0.99),
                };
                let memcpy_limit = (!limits.is_empty()).then(|| median(&mut limits));
                rows.push((label.to_string(), streams, case, result, memcpy_limit));
            }
        }
    }
    Ok(rows)
}

/// The iperf3 limits and the transfer table, with the limit each row is compared with.
fn print_tables(args: &Args, iperf: &[(usize, &str, Option<f64>)], rows: &[Row]) {
    let best_iperf = |iperf: &[(usize, &str, Option<f64>)], streams: usize| {
        iperf
            .iter()
            .filter(|(n, _, _)| *n == streams)
            .filter_map(|(_, _, v)| *v)
            .fold(None, |best: Option<f64>, v| {
                Some(best.map_or(v, |b| b.max(v)))
            })
    };
    println!(
        "### TCP limit measured in this run (iperf3 on 127.0.0.1, before and after the cases)\n"
    );
    println!("| iperf3 streams | writes | MB/s before | MB/s after |");
    println!("|---:|---|---:|---:|");
    let half = iperf.len() / 2;
    for i in 0..half {
        let (streams, label, before) = iperf[i];
        let after = iperf[half + i].2;
        let show = |v: Option<f64>| {
            v.map_or_else(
                || "iperf3 absent or failed".to_string(),
                |v| format!("{v:.0}"),
            )
        };
        println!(
            "| {streams} | {label} | {} | {} |",
            show(before),
            show(after)
        );
    }
    if args.transports.iter().any(|t| t == "tcp") && iperf.iter().all(|(_, _, v)| v.is_none()) {
        println!("\n**iperf3 is not installed (apt-get install iperf3): TCP rows have no limit.**");
    }
    println!("\n### Transfers between two processes\n");
    println!(
        "| transport | op | size | in flight | MB/s | p50 µs | p99 µs | limit MB/s | % of limit |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (label, streams, case, result, memcpy_limit) in rows {
        let limit = memcpy_limit.or_else(|| best_iperf(iperf, *streams));
        let (limit_text, ratio) = match limit {
            Some(l) => (
                format!("{l:.0}"),
                format!("{:.0}%", 100.0 * result.mb_s / l),
            ),
            None => ("n/a".into(), "n/a".into()),
        };
        println!(
            "| {label} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {limit_text} | {ratio} |",
            if case.write { "write" } else { "read" },
            mooncake_common::format_size(case.size as u64),
            if case.batch_entries > 1 {
                format!("batch of {}", case.batch_entries)
            } else {
                case.inflight.to_string()
            },
            result.mb_s,
            result.p50_us,
            result.p99_us,
        );
    }
    println!("\nMB/s: median of {} repetitions of {} s; p50/p99 over all their entries. limit: tcp rows = best iperf3 figure above with the same stream count; shm rows = median single-thread memcpy of the same size over the same working set, each measured just before a repetition.", args.reps.max(1), args.seconds);
}

/// The serving side: one shareable segment, endpoint on stdout, serve until stdin closes.
fn serve(bytes: usize) -> anyhow::Result<()> {
    let engine = TransferEngine::start(TransferConfig::default())?;
    let segment = engine.allocate_segment(bytes, SegmentOptions::default())?;
    // Touch every page so the first measured transfers do not pay for page faults.
    segment.write_at(0, &vec![0x5a; bytes])?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {} {}", engine.endpoint(), segment.id())?;
    out.flush()?;
    drop(out);
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    Ok(())
}

struct ServerProcess {
    child: Child,
    endpoint: Arc<Endpoint>,
    segment_id: u64,
}

impl ServerProcess {
    fn spawn(bytes: usize) -> anyhow::Result<ServerProcess> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["bench", "transfer", "--serve-bytes", &bytes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the serving process")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let mut parts = line.split_whitespace();
        if parts.next() != Some("READY") {
            let _ = child.kill();
            bail!("serving process said {line:?}");
        }
        let endpoint = Arc::new(Endpoint::parse(parts.next().context("endpoint")?)?);
        let segment_id = parts.next().context("segment id")?.parse()?;
        Ok(ServerProcess {
            child,
            endpoint,
            segment_id,
        })
    }

    fn stop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    size: usize,
    inflight: usize,
    /// Entries per submitted batch (1: single-entry batches, `inflight` of them outstanding;
    /// more: one batch of this many entries at a time, each entry its own range).
    batch_entries: usize,
    write: bool,
    slot: usize,
}

#[derive(Debug)]
struct CaseResult {
    mb_s: f64,
    p50_us: f64,
    p99_us: f64,
}

impl Case {
    fn request(&self, local: &MemoryHandle, server: &ServerProcess, k: usize) -> TransferRequest {
        let offset = if self.batch_entries > 1 {
            (k % self.batch_entries) * self.size
        } else {
            (k % self.inflight) * self.slot
        };
        let ptr = local.as_ptr().wrapping_add(offset);
        if self.write {
            TransferRequest::write(
                ptr,
                self.size as u64,
                &server.endpoint,
                server.segment_id,
                offset as u64,
            )
        } else {
            TransferRequest::read(
                ptr,
                self.size as u64,
                &server.endpoint,
                server.segment_id,
                offset as u64,
            )
        }
    }

    /// Keeps `inflight` single-entry batches outstanding for `seconds`; returns MB/s and the
    /// latency of every measured entry (µs).
    fn run(
        &self,
        engine: &TransferEngine,
        local: &MemoryHandle,
        server: &ServerProcess,
        seconds: f64,
    ) -> anyhow::Result<(f64, Vec<f64>)> {
        let warmup = Duration::from_secs_f64((seconds / 5.0).min(0.2));
        let measure = Duration::from_secs_f64(seconds);
        let mut window: std::collections::VecDeque<(Instant, Batch)> = Default::default();
        let mut latencies_us = Vec::new();
        let mut k = 0usize;
        let started = Instant::now();
        let mut measuring_since: Option<Instant> = None;
        let mut measured_ops = 0usize;
        loop {
            while window.len() < self.inflight {
                let requests: Vec<TransferRequest> = (0..self.batch_entries)
                    .map(|j| self.request(local, server, k + j))
                    .collect();
                let submitted = Instant::now();
                let batch = engine.submit(&requests);
                window.push_back((submitted, batch));
                k += self.batch_entries;
            }
            let Some((submitted, batch)) = window.pop_front() else {
                break;
            };
            let results = batch.wait();
            let done = Instant::now();
            if let Some(Err(err)) = results.into_iter().find(|r| r.is_err()) {
                bail!("transfer failed: {err}");
            }
            match measuring_since {
                // Warm up for a while and over every slot twice (page faults, connections).
                None if started.elapsed() >= warmup && k >= 2 * self.inflight => {
                    // Start measuring from an empty pipeline boundary-free point.
                    measuring_since = Some(done);
                }
                Some(since) => {
                    latencies_us.push((done - submitted).as_secs_f64() * 1e6);
                    measured_ops += 1;
                    if done - since >= measure && measured_ops >= 4 {
                        let elapsed = (done - since).as_secs_f64();
                        // Drain the window so the next case starts clean.
                        for (_, batch) in window.drain(..) {
                            batch.wait();
                        }
                        let bytes = measured_ops * self.batch_entries * self.size;
                        let mb_s = bytes as f64 / elapsed / MB;
                        return Ok((mb_s, latencies_us));
                    }
                }
                None => {}
            }
        }
        bail!("case produced no measurement")
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// `p`-quantile of sorted values (0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)]
}

/// Single-thread memcpy bandwidth for `size`-byte copies rotating over `slots` slots of
/// `slot_bytes` (the working set of a case with `slots` entries in flight), pre-touched.
fn memcpy_mb_s(size: usize, slots: usize, slot_bytes: usize, seconds: f64) -> f64 {
    let slots = slots.max(1);
    let src = vec![0x11u8; slot_bytes * slots];
    let mut dst = vec![0x22u8; slot_bytes * slots];
    let started = Instant::now();
    let mut copies = 0usize;
    while started.elapsed().as_secs_f64() < seconds || copies < 4 {
        let at = (copies % slots) * slot_bytes;
        dst[at..at + size].copy_from_slice(&src[at..at + size]);
        std::hint::black_box(&mut dst);
        copies += 1;
    }
    (copies * size) as f64 / started.elapsed().as_secs_f64() / MB
}

/// iperf3 on 127.0.0.1 with `streams` parallel streams (and `-l block` if given), in MB/s; `None` when iperf3 is absent
/// or fails (said on stderr).
fn iperf3_mb_s(streams: usize, block: Option<&str>, seconds: u64) -> Option<f64> {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
        listener.local_addr().ok()?.port()
    };
    let server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut server = match server {
        Ok(child) => child,
        Err(err) => {
            eprintln!("iperf3 is not available ({err}); install it (apt-get install iperf3) for the TCP limit");
            return None;
        }
    };
    let mut output = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let port_text = port.to_string();
        let seconds_text = seconds.to_string();
        let streams_text = streams.to_string();
        let mut client_args = vec![
            "-c",
            "127.0.0.1",
            "-p",
            &port_text,
            "-t",
            &seconds_text,
            "-P",
            &streams_text,
            "-J",
        ];
        if let Some(block) = block {
            client_args.extend(["-l", block]);
        }
        let run = Command::new("iperf3").args(&client_args).output();
        match run {
            Ok(out) if out.status.success() => {
                output = Some(out.stdout);
                break;
            }
            _ => continue, // server not listening yet
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let json = String::from_utf8(output?).ok()?;
    // `end.sum_received.bits_per_second`, found without a JSON dependency.
    let at = json.find("\"sum_received\"")?;
    let rest = &json[at..];
    let bps_at = rest.find("\"bits_per_second\"")?;
    let number: String = rest[bps_at + "\"bits_per_second\"".len()..]
        .chars()
        .skip_while(|c| *c == ':' || c.is_whitespace())
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == 'E' || *c == '+')
        .collect();
    let bits_per_second: f64 = number.parse().ok()?;
    Some(bits_per_second / 8.0 / MB)
}
