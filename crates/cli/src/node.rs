//! `mooncake store`: a node daemon that contributes memory to a master and serves transfers of
//! the objects placed in it, until SIGINT or SIGTERM: then it moves its objects to other nodes
//! (for at most `--drain-on-shutdown-secs`), unmounts and exits 0. When it is
//! killed instead, the master expires it after `client_ttl` and the rest of the cluster goes on.
//!
//! `mooncake client` (also run as `mooncake_client`): the same with upstream `mooncake_client`'s
//! flags, plus the attach port that `setup_dummy` stores of this host connect to
//! (`mooncake_client::standalone`).

use anyhow::Context;
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_transfer::TransportMode;
use std::io::Write;

/// Flags of `mooncake store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The master's RPC address, a high-availability group's masters as `h1:p1,h2:p2`, or `etcd://h1:2379` (the leader etcd names).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub master: String,
    /// Memory contributed to the cluster (`4GiB`, `512MiB`, `1073741824`).
    #[arg(long, default_value = "4GiB", value_parser = parse_size_arg)]
    pub segment_size: u64,
    /// Host (or `host:port`) that peers use to reach this node's transfer server.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// How same-host peers reach this node's memory: `auto` (shared memory, else TCP), `tcp`, `shm`.
    #[arg(long, default_value = "auto")]
    pub transport: TransportMode,
    /// File holding the cluster's shared token (the master's `--auth_token_file`): presented
    /// to the master, and required of every peer that reads or writes this node's memory.
    /// Without it, `MC_AUTH_TOKEN` / `MC_AUTH_TOKEN_FILE` apply.
    #[arg(long = "auth_token_file", alias = "auth-token-file")]
    pub auth_token_file: Option<std::path::PathBuf>,
    /// On SIGTERM or SIGINT, move this node's objects to other nodes for at most this many
    /// seconds before unmounting (objects not moved by then are dropped, their count logged);
    /// 0 unmounts at once.
    #[arg(long, default_value_t = 5)]
    pub drain_on_shutdown_secs: u64,
    /// A local disk tier in this directory (owned by this process alone): objects are offloaded
    /// to it and read back from it when memory evicted them (the master needs
    /// `--enable_offload`).
    #[arg(long = "disk-dir", alias = "disk_dir")]
    pub disk_dir: Option<std::path::PathBuf>,
    /// Bytes of values the disk tier may hold (`64GiB`); required with `--disk-dir`.
    #[arg(long = "disk-capacity", alias = "disk_capacity", value_parser = parse_size_arg)]
    pub disk_capacity: Option<u64>,
    /// Disk layout: `log` (offset-allocator log, default), `bucket` or `file` (file per key).
    #[arg(long = "disk-backend", alias = "disk_backend", default_value = "log")]
    pub disk_backend: mooncake_storage::BackendKind,
    /// Staging memory for disk reads in flight (`256MiB`): the largest object readable from disk.
    #[arg(long = "disk-staging", default_value = "256MiB", value_parser = parse_size_arg)]
    pub disk_staging: u64,
}

/// The disk tier settings from the flags (`None` without `--disk-dir`).
fn disk_config(args: &Args) -> anyhow::Result<Option<mooncake_client::DiskConfig>> {
    let Some(dir) = &args.disk_dir else {
        if args.disk_capacity.is_some() {
            anyhow::bail!("--disk-capacity needs --disk-dir");
        }
        return Ok(None);
    };
    let Some(capacity) = args.disk_capacity else {
        anyhow::bail!("--disk-dir needs --disk-capacity (the bytes the disk tier may hold)");
    };
    let mut config = mooncake_client::DiskConfig::new(dir.clone(), capacity);
    config.backend = args.disk_backend;
    config.staging_bytes = args.disk_staging;
    Ok(Some(config))
}

/// Parses `4GiB`-style sizes for clap.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    mooncake_common::parse_size(text).map_err(|e| format!("{text:?}: {e}"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.segment_size == 0 {
        anyhow::bail!("--segment-size must be above 0 (a node without memory serves nothing)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // Handlers first: a signal that arrives as soon as the endpoint line is out must still
        // unmount instead of killing the process.
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        let auth_token = match &args.auth_token_file {
            Some(path) => {
                Some(mooncake_client::auth::read_token_file(path).map_err(anyhow::Error::msg)?)
            }
            None => None,
        };
        let disk = disk_config(&args)?;
        let config = StoreConfig {
            master_addr: args.master.clone(),
            local_hostname: args.host.clone(),
            global_segment_size: args.segment_size,
            transport: args.transport,
            auth_token,
            disk,
            task_poll_interval: Some(mooncake_client::NODE_TASK_POLL),
            ..StoreConfig::default()
        };
        let client = StoreClient::connect(config)
            .await
            .with_context(|| format!("joining the cluster of master {}", args.master))?;
        println!(
            "mooncake store: endpoint {} segment {} master {} client {} name {}",
            client.endpoint(),
            mooncake_common::format_size(args.segment_size),
            args.master,
            client.client_id(),
            client.segment_name()
        );
        if let Some(disk) = client.disk() {
            let usage = disk.backend().usage();
            println!(
                "mooncake store: disk {} backend {} capacity {} objects {} server {}",
                disk.config().dir.display(),
                disk.config().backend,
                mooncake_common::format_size(usage.capacity_bytes),
                usage.object_count,
                client.disk_endpoint()
            );
        }
        std::io::stdout().flush()?;
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        if args.drain_on_shutdown_secs > 0 {
            drain_before_exit(&client, args.drain_on_shutdown_secs).await;
        }
        tracing::info!("shutting down: unmounting");
        client.close().await.context("unmounting at shutdown")?;
        println!("mooncake store: unmounted, bye");
        Ok(())
    })
}

/// Moves the node's objects elsewhere for at most `secs` seconds and logs what was left.
async fn drain_before_exit(client: &StoreClient, secs: u64) {
    tracing::info!("shutting down: moving this node's objects to other nodes (at most {secs} s)");
    match client
        .drain_segments(std::time::Duration::from_secs(secs))
        .await
    {
        Ok(report) => {
            let line = format!(
                "drained at shutdown: moved {} of {} objects to other nodes; dropping {} not \
                 moved within {secs} s ({} had no room elsewhere)",
                report.moved, report.objects, report.left, report.unmovable
            );
            if report.left > 0 {
                tracing::warn!("{line}");
            } else {
                tracing::info!("{line}");
            }
        }
        Err(error) => tracing::warn!(%error, "draining at shutdown failed: unmounting now"),
    }
}

/// `mooncake client ARGS` / `mooncake_client ARGS`: upstream's real client flags. Returns the
/// exit code (0 after SIGINT/SIGTERM, 1 when it cannot join, 2 for bad flags).
pub fn run_real_client(args: Vec<String>) -> i32 {
    use mooncake_client::standalone::{run_until_signal, ArgsError, RealClientArgs};
    match RealClientArgs::parse(args) {
        Ok(args) => run_until_signal(args),
        Err(ArgsError::Help(usage)) => {
            print!("{usage}");
            0
        }
        Err(ArgsError::Bad(message)) => {
            eprintln!("mooncake_client: {message}\n{}", RealClientArgs::usage());
            2
        }
    }
}
