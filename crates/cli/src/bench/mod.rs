//! `mooncake bench …`: one module per benchmark family.

mod storage;
mod transfer;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Data plane: MB/s and latency per transport next to iperf3 and memcpy.
    Transfer(transfer::Args),
    /// SSD tier: MB/s and ops/s per backend and durability policy next to raw file throughput.
    Storage(storage::Args),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Transfer(args) => transfer::run(args),
        BenchCommand::Storage(args) => storage::run(args),
    }
}
