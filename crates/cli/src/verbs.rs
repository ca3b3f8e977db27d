//! Verbs for people: `mooncake put|get|ls|rm|stat --master ADDR …`. Each one connects as a pure
//! requester (no memory contributed), does its one thing and exits; errors print the upstream
//! code name and exit 1.

use anyhow::Context;
use mooncake_client::{BlockingStoreClient, PutOutcome, StoreConfig};
use mooncake_common::{format_size, ReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::TransportMode;
use std::io::{Read, Write};

/// Where the cluster is.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The master's RPC address, a high-availability group's masters as `h1:p1,h2:p2`, or `etcd://h1:2379` (the leader etcd names).
    #[arg(long, default_value = "127.0.0.1:50051", global = true)]
    pub master: String,
    /// Tenant of the keys (empty = `default`).
    #[arg(long, default_value = "", global = true)]
    pub tenant: String,
    /// Transport to the store nodes: `auto`, `tcp` or `shm`.
    #[arg(long, default_value = "auto", global = true)]
    pub transport: TransportMode,
}

#[derive(Debug, clap::Args)]
pub struct PutArgs {
    pub key: String,
    /// File to store, or `-` for standard input.
    pub file: String,
    /// Copies on distinct nodes.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    pub key: String,
    /// Write the value here instead of standard output.
    #[arg(short, long)]
    pub output: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Only keys matching this regular expression.
    pub regex: Option<String>,
    /// Also print each object's size.
    #[arg(short, long)]
    pub long: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    pub key: String,
    /// Remove even while readers hold a lease.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub target: Target,
    /// How long to wait for the snapshot to be written (its own deadline: a take of a large
    /// master can outlast the usual RPC timeout).
    #[arg(long, default_value_t = 600)]
    pub timeout_seconds: u64,
}

pub fn connect(target: &Target) -> anyhow::Result<BlockingStoreClient> {
    connect_with(target, StoreConfig::default().rpc.call_timeout)
}

/// [`connect`] with `call_timeout` as every master call's deadline.
fn connect_with(
    target: &Target,
    call_timeout: std::time::Duration,
) -> anyhow::Result<BlockingStoreClient> {
    let mut config = StoreConfig {
        master_addr: target.master.clone(),
        global_segment_size: 0,
        tenant: target.tenant.clone(),
        transport: target.transport,
        // A one-shot requester owns no segment: nothing to keep alive at the master.
        heartbeat_interval: std::time::Duration::from_secs(3600),
        ..StoreConfig::default()
    };
    config.rpc.call_timeout = call_timeout;
    BlockingStoreClient::connect(config, 1)
        .with_context(|| format!("connecting to master {}", target.master))
}

fn code_error(what: &str, error: mooncake_client::StoreError) -> anyhow::Error {
    let code = error.code();
    let hint = if code == mooncake_common::ErrorCode::OBJECT_HAS_LEASE {
        "; it was read within its lease (default 5 s): retry later or pass --force"
    } else {
        ""
    };
    anyhow::anyhow!("{what}: {code} ({error}){hint}")
}

pub fn put(args: PutArgs) -> anyhow::Result<()> {
    let value = if args.file == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file))?
    };
    let client = connect(&args.target)?;
    let config = ReplicateConfig {
        replica_num: args.replicas,
        ..ReplicateConfig::default()
    };
    let outcome = client.put_counted(&args.key, &value, &config);
    let _ = client.close();
    match outcome.map_err(|e| code_error("put", e))? {
        (PutOutcome::Stored, kept) => eprintln!(
            "stored {:?}: {} bytes, {}",
            args.key,
            value.len(),
            replicas_kept(kept, args.replicas)
        ),
        (PutOutcome::AlreadyPresent, _) => {
            eprintln!("{:?} already exists; the first value stays", args.key)
        }
    }
    Ok(())
}

/// "1 replica", "2 replicas", or "kept 2 of 5 replicas" when the master placed fewer than asked
/// (one per node at most, and only where there is room).
fn replicas_kept(kept: usize, asked: usize) -> String {
    let plural = |n: usize| if n == 1 { "replica" } else { "replicas" };
    if kept < asked {
        format!("kept {kept} of {asked} {}", plural(asked))
    } else {
        format!("{kept} {}", plural(kept))
    }
}

pub fn get(args: GetArgs) -> anyhow::Result<()> {
    let client = connect(&args.target)?;
    let value = client.get(&args.key);
    let _ = client.close();
    let value = value.map_err(|e| code_error("get", e))?;
    match &args.output {
        Some(path) => std::fs::write(path, &value).with_context(|| format!("writing {path}"))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&value)?;
            out.flush()?;
        }
    }
    Ok(())
}

pub fn ls(args: LsArgs) -> anyhow::Result<()> {
    let filter = match &args.regex {
        Some(text) => Some(regex::Regex::new(text).with_context(|| format!("regex {text:?}"))?),
        None => None,
    };
    let client = connect(&args.target)?;
    let keys = client.block_on(client.client().master().call(&m::GetAllKeys {
        tenant: args.target.tenant.clone(),
    }));
    let keys = keys.map_err(|e| anyhow::anyhow!("listing keys: {} ({e})", e.code()))?;
    let mut keys: Vec<String> = keys
        .into_iter()
        .filter(|k| filter.as_ref().is_none_or(|re| re.is_match(k)))
        .collect();
    keys.sort();
    let mut out = std::io::stdout().lock();
    for key in &keys {
        if args.long {
            let size = client
                .get_size(key)
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("({})", e.code()));
            writeln!(out, "{size:>12}  {key}")?;
        } else {
            writeln!(out, "{key}")?;
        }
    }
    drop(out);
    let _ = client.close();
    Ok(())
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let client = connect(&args.target)?;
    let result = client.remove(&args.key, args.force);
    let _ = client.close();
    result.map_err(|e| code_error("rm", e))?;
    eprintln!("removed {:?}", args.key);
    Ok(())
}

pub fn stat(args: StatArgs) -> anyhow::Result<()> {
    let client = connect(&args.target)?;
    let master = client.client().master();
    let (version, segments, keys, jobs, disks) = client.block_on(async {
        (
            master.call(&m::ServiceReady {}).await,
            master.call(&m::GetSegmentsDetail {}).await,
            master
                .call(&m::GetAllKeys {
                    tenant: args.target.tenant.clone(),
                })
                .await,
            master.call(&m::ListDrainJobs {}).await,
            master.call(&m::ListLocalDisks {}).await,
        )
    });
    let _ = client.close();
    let segments = segments.map_err(|e| anyhow::anyhow!("segments: {} ({e})", e.code()))?;
    let keys = keys.map_err(|e| anyhow::anyhow!("keys: {} ({e})", e.code()))?;
    let version = version.unwrap_or_else(|e| format!("? ({e})"));
    let capacity: u64 = segments.iter().map(|s| s.capacity_bytes).sum();
    let used: u64 = segments.iter().filter_map(|s| s.used_bytes).sum();
    println!("master {} ({version})", args.target.master);
    println!(
        "segments {}  capacity {}  used {} ({:.1}%)  keys {}",
        segments.len(),
        format_size(capacity),
        format_size(used),
        if capacity == 0 {
            0.0
        } else {
            used as f64 * 100.0 / capacity as f64
        },
        keys.len()
    );
    // A master without drain jobs answers NOT_SUPPORTED: nothing to show.
    for job in jobs.unwrap_or_default() {
        println!(
            "drain job {} {}  {}",
            job.id,
            job.segments.join(","),
            crate::drain::progress_line(&job)
        );
    }
    // A master that predates local disks answers NOT_SUPPORTED: nodes show memory only.
    print_nodes(&segments, &disks.unwrap_or_default());
    if segments.is_empty() {
        return Ok(());
    }
    println!(
        "{:<36} {:<24} {:>10} {:>10} {:>7}  status",
        "segment", "name", "capacity", "used", "used%"
    );
    for s in &segments {
        let used = s.used_bytes.map(format_size).unwrap_or_else(|| "-".into());
        let pct = s
            .used_bytes
            .filter(|_| s.capacity_bytes > 0)
            .map(|u| format!("{:.1}", u as f64 * 100.0 / s.capacity_bytes as f64))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<36} {:<24} {:>10} {:>10} {:>7}  {:?}",
            s.id.to_string(),
            s.name,
            format_size(s.capacity_bytes),
            used,
            pct,
            s.status
        );
    }
    Ok(())
}

/// One node's memory (its segments) and local disk, for `mooncake stat`.
#[derive(Default)]
struct NodeUsage<'a> {
    segments: usize,
    memory: u64,
    memory_used: u64,
    disk: Option<&'a m::LocalDiskDetail>,
}

/// Prints memory and disk usage per node (client), one line each.
fn print_nodes(segments: &[m::SegmentDetail], disks: &[m::LocalDiskDetail]) {
    let mut nodes: std::collections::BTreeMap<String, NodeUsage<'_>> = Default::default();
    for s in segments {
        let node = nodes.entry(s.client.to_string()).or_default();
        node.segments += 1;
        node.memory += s.capacity_bytes;
        node.memory_used += s.used_bytes.unwrap_or(0);
    }
    for d in disks {
        nodes.entry(d.client.to_string()).or_default().disk = Some(d);
    }
    if nodes.is_empty() {
        return;
    }
    println!(
        "{:<36} {:>4} {:>10} {:>10} {:>10} {:>10}  disk endpoint",
        "node", "segs", "memory", "mem used", "disk", "disk used"
    );
    for (client, n) in &nodes {
        let (disk, disk_used, endpoint) = match n.disk {
            Some(d) => (
                format_size(d.capacity_bytes),
                format_size(d.used_bytes),
                d.endpoint.as_str(),
            ),
            None => ("-".into(), "-".into(), "-"),
        };
        println!(
            "{:<36} {:>4} {:>10} {:>10} {:>10} {:>10}  {endpoint}",
            client,
            n.segments,
            format_size(n.memory),
            format_size(n.memory_used),
            disk,
            disk_used
        );
    }
}

/// `mooncake snapshot`: the master writes a snapshot now; prints the file, its size, the object
/// count and how long it took. The call waits for the take with its own deadline
/// (`--timeout-seconds`), not the 10 s of other calls.
pub fn snapshot(args: SnapshotArgs) -> anyhow::Result<()> {
    let timeout = std::time::Duration::from_secs(args.timeout_seconds.max(1));
    let client = connect_with(&args.target, timeout)?;
    let master = client.client().master();
    let taken = client.block_on(async { master.call(&m::TakeSnapshot {}).await });
    let _ = client.close();
    let taken = taken.map_err(|e| match e.code() {
        mooncake_common::ErrorCode::NOT_SUPPORTED => anyhow::anyhow!(
            "snapshot: NOT_SUPPORTED (the master has no snapshot directory: start it with \
             --snapshot_dir=DIR)"
        ),
        mooncake_common::ErrorCode::RPC_TIMEOUT => anyhow::anyhow!(
            "snapshot: no answer within {} s (--timeout-seconds); the take may still complete: \
             the master's log says when",
            timeout.as_secs()
        ),
        code => anyhow::anyhow!("snapshot: {code} ({e}); the master's log says why"),
    })?;
    println!(
        "snapshot {}  bytes {}  objects {}  ms {:.1}",
        taken.path,
        taken.bytes,
        taken.objects,
        taken.duration_us as f64 / 1e3
    );
    Ok(())
}
