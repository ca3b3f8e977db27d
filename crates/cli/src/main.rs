//! `mooncake`: one binary for every role. Each subcommand parses its flags and calls a crate.

mod drain;
mod node;
mod quickstart;
mod tasks;
mod verbs;

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
    /// Run the master (metadata service). Takes every flag of upstream's `mooncake_master`
    /// (gflags syntax) and `--config_path FILE` (upstream's YAML or JSON, or TOML).
    /// `mooncake master --help` lists them with what mooncake-rs does with each.
    #[command(disable_help_flag = true)]
    Master {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A store node: contributes memory to a master and serves transfers until SIGINT/SIGTERM.
    Store(node::Args),
    /// The real client of standalone mode, with upstream `mooncake_client`'s flags
    /// (`--master_server_address`, `--host`, `--port`, `--global_segment_size`, …); stores of
    /// this host attach with `setup_dummy`. Also runs as `mooncake_client` (a link to this binary).
    #[command(disable_help_flag = true)]
    Client {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A master and two store nodes on loopback, a few thousand verified puts and gets, a table.
    Quickstart(quickstart::Args),
    /// Store a file (or `-` for stdin) under KEY.
    Put(verbs::PutArgs),
    /// Print the value of KEY (or write it with `-o FILE`).
    Get(verbs::GetArgs),
    /// List keys, optionally only those matching a regular expression.
    Ls(verbs::LsArgs),
    /// Remove KEY.
    Rm(verbs::RmArgs),
    /// Add a replica of KEY on another node (a task the node holding KEY runs); prints the
    /// task id.
    Copy(tasks::CopyArgs),
    /// Move KEY's replica from one node to another (a task the source node runs); prints the
    /// task id.
    Move(tasks::MoveArgs),
    /// The state of a copy or move task.
    Task(tasks::TaskArgs),
    /// Move every object off segments (a drain job): they end DRAINED and empty.
    Drain(drain::DrainArgs),
    /// Segments, usage and key count of the cluster.
    Stat(verbs::StatArgs),
    /// Ask the master to write a snapshot now (into its --snapshot_dir); prints the file, its
    /// size in bytes, the object count and the milliseconds it took.
    Snapshot(verbs::SnapshotArgs),
    /// Benchmarks that print tables, each next to a peer measured in the same run. Without a
    /// subcommand: the store client cases (`bench store` with its defaults).
    Bench {
        #[command(subcommand)]
        command: Option<mooncake_bench::BenchCommand>,
    },
}

fn init_logging() {
    init_logging_at("info");
}

/// Logging to stderr at `default` unless `MOONCAKE_LOG` says otherwise.
fn init_logging_at(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOONCAKE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    // Colours only on a terminal: a log file or pipe gets plain text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

/// mimalloc instead of glibc's malloc for every Rust allocation of this binary. The master keeps
/// one 112-byte entry per object, allocated between the short-lived buffers of each RPC batch;
/// under glibc that pattern cost about 74 bytes of RSS per object beyond the live bytes (259
/// bytes per object with glibc against 185 with mimalloc, same binary, 500,000 objects). With the
/// 112-byte entry: 163 (glibc) against 126.5 (mimalloc 2) at 1,000,000 objects; mimalloc 3 held
/// 154, hence the `v2` feature (docs/decisions.md). Size classes live in their own pages, so the
/// entries pack.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tune_malloc();
    // Run as `mooncake_client` (a link to this binary): upstream's real client, its flags.
    let mut argv = std::env::args();
    let program = argv.next().unwrap_or_default();
    if std::path::Path::new(&program).file_name() == Some(std::ffi::OsStr::new("mooncake_client")) {
        init_logging();
        std::process::exit(node::run_real_client(argv.collect()));
    }
    if let Err(error) = run(Cli::parse()) {
        eprintln!("mooncake: {error:#}");
        std::process::exit(1);
    }
}

/// (Rust allocations go to mimalloc, above; this still tunes glibc's malloc for the C code in the
/// process.) glibc's malloc gives freed memory at the top of the heap back to the kernel once more than
/// 128 KiB is free there (`M_TRIM_THRESHOLD`), and serves blocks over 128 KiB (adapting up to
/// 32 MiB) with fresh `mmap`s. A client that reads values into new buffers and frees them (a
/// `get_batch` of 32 × 64 KiB, a 16 MiB `get`) then page-faults and zero-fills every buffer
/// again: measured 1.1 ms instead of 0.33 ms per 32 × 64 KiB batch (docs/decisions.md). This
/// process keeps up to 256 MiB of freed heap and takes blocks up to 32 MiB from the heap.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; called before any other thread runs.
        // A refused value (returns 0) leaves glibc's default, which is only slower.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Master { args } => {
            let argv = std::iter::once("mooncake master".to_string()).chain(args);
            match mooncake_server::MasterConfig::load(argv) {
                Ok((config, resolved)) => {
                    init_logging_at(config.log_filter());
                    std::process::exit(mooncake_server::run_until_signal(config, resolved))
                }
                Err(mooncake_server::ConfigError::Help(text)) => {
                    print!("{text}");
                    std::process::exit(0);
                }
                Err(error) => {
                    eprintln!("mooncake master: {error}");
                    std::process::exit(error.exit_code());
                }
            }
        }
        Command::Store(args) => {
            init_logging();
            node::run(args)
        }
        Command::Client { args } => {
            init_logging();
            std::process::exit(node::run_real_client(args))
        }
        Command::Quickstart(args) => {
            init_logging_at("error");
            quickstart::run(args)
        }
        Command::Put(args) => {
            init_logging_at("warn");
            verbs::put(args)
        }
        Command::Get(args) => {
            init_logging_at("warn");
            verbs::get(args)
        }
        Command::Ls(args) => {
            init_logging_at("warn");
            verbs::ls(args)
        }
        Command::Rm(args) => {
            init_logging_at("warn");
            verbs::rm(args)
        }
        Command::Copy(args) => {
            init_logging_at("warn");
            tasks::copy(args)
        }
        Command::Move(args) => {
            init_logging_at("warn");
            tasks::move_key(args)
        }
        Command::Task(args) => {
            init_logging_at("warn");
            tasks::task(args)
        }
        Command::Drain(args) => {
            init_logging_at("warn");
            drain::drain(args)
        }
        Command::Stat(args) => {
            init_logging_at("warn");
            verbs::stat(args)
        }
        Command::Snapshot(args) => {
            init_logging_at("warn");
            verbs::snapshot(args)
        }
        Command::Bench { command } => {
            init_logging_at("warn");
            match command {
                Some(command) => mooncake_bench::run(command),
                None => mooncake_bench::store::run(mooncake_bench::store::Args::defaults()),
            }
        }
    }
}
