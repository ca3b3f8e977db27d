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
    /// Run the master (metadata service). Takes upstream's flags: `--rpc_port`, `--metrics_port`,
    /// `--default_kv_lease_ttl`, … (`_` or `-`), and `--config FILE` (TOML). `mooncake master --help`.
    #[command(disable_help_flag = true)]
    Master {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmarks that print tables, each next to a peer measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOONCAKE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Master { args } => {
            init_logging();
            let argv = std::iter::once("mooncake master".to_string()).chain(args);
            match mooncake_server::MasterConfig::load(argv) {
                Ok((config, resolved)) => {
                    std::process::exit(mooncake_server::run_until_signal(config, resolved))
                }
                Err(mooncake_server::ConfigError::Flags(message)) => {
                    // clap's own text: usage errors and --help.
                    let is_help = message.contains("Usage:") && !message.starts_with("error");
                    if is_help {
                        print!("{message}");
                        std::process::exit(0);
                    }
                    eprint!("{message}");
                    std::process::exit(2);
                }
                Err(error) => {
                    eprintln!("mooncake master: {error}");
                    std::process::exit(2);
                }
            }
        }
        Command::Bench(command) => bench::run(command),
    }
}
