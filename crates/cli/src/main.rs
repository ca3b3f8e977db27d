//! `mooncake`: one binary for every role. Each subcommand parses its flags and calls a crate.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "mooncake",
    version,
    about = "mooncake-rs: a distributed KV-cache store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks that print tables, each next to a peer measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(command) => bench::run(command),
    }
}
