//! The benchmarks behind `mooncake bench …`, one module per family. Each prints its table next to
//! a peer measured in the same run (the TCP ping-pong floor, iperf3, memcpy, raw file I/O).
//!
//! Contract with the binary: several benchmarks start their peer processes by running the current
//! executable again, as `EXE master …` (a master child), `EXE bench store-peer …`, `EXE bench scaling-worker …`,
//! `EXE bench pingpong-serve …` and `EXE bench transfer --serve-bytes …`. The binary that calls
//! [`run`] must therefore be `mooncake`, routing `bench` to [`BenchCommand`] and `master` to the
//! master process, as `crates/cli` does.

mod disk_tier;
mod master;
mod oplog;
mod oplog_compaction;
mod ops;
pub mod pingpong;
pub mod scaling;
mod snapshot;
mod storage;
pub mod store;
mod transfer;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Master RPC over TCP: latency next to the ping-pong floor, throughput 1–64 in flight.
    Master(master::Args),
    /// The op-log's floors and costs: raw etcd transaction latency (a real etcd started for the
    /// run), then PutStart+PutEnd on a master without the op-log, with durable acks and with
    /// visible acks, sequential and with 256 in flight.
    Oplog(oplog::Args),
    /// The op-log's footprint in etcd after many puts (default 1,000,000), with and without
    /// compaction: keys under the log, etcd's database size and the part in use, and the size
    /// after a defragmentation.
    OplogCompaction(oplog_compaction::Args),
    /// Master snapshot in process: take time, bytes per object, restore time, and a reader's
    /// GetReplicaList p99 during the take next to its p99 without one.
    Snapshot(snapshot::Args),
    /// Work store nodes do for the master, with real processes: a drain's MB/s next to the
    /// store-to-store write rate and a reader's p99 during it; a new node's share of bytes and
    /// batch puts' p99 during its join ramp next to the steady state.
    Ops(ops::Args),
    /// Data plane: MB/s and latency per transport next to iperf3 and memcpy.
    Transfer(transfer::Args),
    /// SSD tier: MB/s and ops/s per backend and durability policy next to raw file throughput.
    Storage(storage::Args),
    /// Disk tier of a running store: offload MB/s and 1 MiB LOCAL_DISK get MB/s next to raw
    /// sequential write and read of the same disk, and memory-tier put/get with offload off and
    /// on, all in one run.
    DiskTier(disk_tier::Args),
    /// Store client: upstream_bench.py's cases against a master child, next to the ping-pong
    /// floor (also what plain `mooncake bench` runs).
    Store(store::Args),
    /// P client processes (P = 1, 2, 4, 8) against one master: calls/s, p50/p99, master and
    /// client CPU of is_exist, batch_is_exist and 4 KiB get, next to a blocking and a spinning
    /// ping-pong floor.
    Scaling(scaling::Args),
    /// A client process of the scaling benchmark (started by `bench scaling`).
    #[command(hide = true)]
    ScalingWorker(scaling::WorkerArgs),
    /// Client B of the store benchmark's cross-process cases (started by `bench store`).
    #[command(hide = true)]
    StorePeer(store::PeerArgs),
    /// The TCP floor: sequential 32-byte round trips between two processes.
    Pingpong {
        /// Both sides spin on non-blocking sockets instead of blocking.
        #[arg(long)]
        spin: bool,
        #[arg(long, default_value_t = 20_000)]
        iterations: usize,
    },
    /// Child side of `pingpong` (started by the benchmarks themselves).
    #[command(hide = true)]
    PingpongServe {
        #[arg(long)]
        spin: bool,
    },
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Transfer(args) => transfer::run(args),
        BenchCommand::Storage(args) => storage::run(args),
        BenchCommand::DiskTier(args) => disk_tier::run(args),
        BenchCommand::Master(args) => master::run(args),
        BenchCommand::Oplog(args) => oplog::run(args),
        BenchCommand::OplogCompaction(args) => oplog_compaction::run(args),
        BenchCommand::Ops(args) => ops::run(args),
        BenchCommand::Snapshot(args) => snapshot::run(args),
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::StorePeer(args) => store::run_peer(args),
        BenchCommand::Scaling(args) => scaling::run(args),
        BenchCommand::ScalingWorker(args) => scaling::run_worker(args),
        BenchCommand::Pingpong { spin, iterations } => {
            let latency = pingpong::measure(spin, iterations)?;
            let mode = if spin { "spinning" } else { "blocking" };
            println!(
                "tcp ping-pong, {} bytes, {mode} reads, two processes",
                pingpong::MESSAGE_BYTES
            );
            println!(
                "ops {:>8}  ops/s {:>10.0}  p50 {:>7.1} us  p99 {:>7.1} us",
                latency.ops, latency.ops_per_sec, latency.p50_us, latency.p99_us
            );
            Ok(())
        }
        BenchCommand::PingpongServe { spin } => pingpong::serve(spin),
    }
}

/// utime + stime of process `pid`, in seconds (`None` once it is gone).
pub(crate) fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks.max(1.0))
}

/// Parses a size flag with units (`4KiB`, `1MiB`, plain bytes).
fn parse_size_arg(text: &str) -> Result<u64, String> {
    mooncake_common::parse_size(text).map_err(|e| format!("{text:?}: {e}"))
}

/// Deterministic bytes for `seed` (fast: one xorshift word per 8 bytes). The store benchmark and
/// `mooncake quickstart` write these and compare what they read back.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    state ^= state << 13;
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b = (state >> (8 * i)) as u8;
    }
}
