//! A child process for the transfer tests: starts an engine with one segment, prints
//! `READY <endpoint> <segment id>` and serves until killed or stdin closes.
//!
//! Usage: `mooncake-transfer-peer <segment bytes> [tcp|shm|auto]`. The segment is filled with
//! the pattern `byte(i) = (i * 31 + 7) % 251` so the parent can verify reads.

use std::io::{BufRead, Write};

use mooncake_transfer::{SegmentOptions, TransferConfig, TransferEngine};

fn main() {
    if let Err(err) = run() {
        eprintln!("transfer peer: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().unwrap_or_else(|| "67108864".into()).parse()?;
    let transport = args.next().unwrap_or_else(|| "auto".into()).parse()?;
    let engine = TransferEngine::start(TransferConfig {
        transport,
        ..TransferConfig::default()
    })?;
    let segment = engine.allocate_segment(size, SegmentOptions::default())?;
    let pattern: Vec<u8> = (0..size).map(|i| ((i * 31 + 7) % 251) as u8).collect();
    segment.write_at(0, &pattern)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {} {}", engine.endpoint(), segment.id())?;
    out.flush()?;
    drop(out);
    // Serve until the parent closes our stdin (or kills us).
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        if line.is_err() {
            break;
        }
    }
    Ok(())
}
