//! The store benchmark's rows: summary of latencies, the fixed-width table, the line format the
//! peer process prints its rows in, and the printed report with upstream's ratios.

use anyhow::Context;
use std::time::{Duration, Instant};

use super::{memcpy_p50_us, Args, KIB, MIB};
use crate::pingpong::Latency;

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

pub(super) fn row(
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

pub(super) fn fmt_size(n: u64) -> String {
    let n = n as usize;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{}MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{}KiB", n / KIB)
    } else {
        format!("{n}B")
    }
}

pub(super) const HEADER: &str = "case                   api       value  batch      ops   errs       ops/s     items/s      MiB/s     p50_us     p99_us";

pub(super) fn format_row(r: &Row) -> String {
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
pub(super) fn encode_row(r: &Row) -> String {
    format!(
        "ROW\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        r.case, r.api, r.size, r.items, r.ops, r.errors, r.ops_per_s, r.p50_us, r.p99_us, r.note
    )
}

pub(super) fn decode_row(line: &str) -> Option<Row> {
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

/// Prints the run's header, one table per case family, the ping-pong floor with the targets and
/// the memcpy limit (stdout).
pub(super) fn print(
    args: &Args,
    master: &str,
    results: &[Row],
    cross: &[Row],
    floor: Option<Latency>,
    started: Instant,
) -> anyhow::Result<()> {
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
            master.to_string()
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
            crate::pingpong::MESSAGE_BYTES,
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
    Ok(())
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
