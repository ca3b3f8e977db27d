//! `mooncake copy KEY --to SEGMENT`, `mooncake move KEY --from SEGMENT --to SEGMENT` and
//! `mooncake task ID`: the master's client-executed tasks. Copy and move queue a task for the
//! node that owns the source segment (it runs it on its next heartbeat) and print its id; with
//! `--wait` they poll the task until it is SUCCESS (exit 0) or FAILED (exit 1, with the reason).

use mooncake_common::{ErrorCode, QueryTaskResponse, TaskId, TaskStatus};
use mooncake_proto::methods as m;
use std::time::{Duration, Instant};

use crate::verbs::{connect, Target};

/// How to wait for a task.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Wait until the task succeeded or failed (exit 1 when it failed).
    #[arg(long)]
    pub wait: bool,
    /// The longest `--wait` waits.
    #[arg(long, default_value_t = 600)]
    pub timeout_seconds: u64,
}

#[derive(Debug, clap::Args)]
pub struct CopyArgs {
    pub key: String,
    /// Segment (node name `host:port`) to add a replica on; repeat for several.
    #[arg(long = "to", required = true)]
    pub to: Vec<String>,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct MoveArgs {
    pub key: String,
    /// Segment holding the replica to move.
    #[arg(long = "from")]
    pub from: String,
    /// Segment to move it to.
    #[arg(long = "to")]
    pub to: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, clap::Args)]
pub struct TaskArgs {
    /// The task id copy or move printed (`FIRST-SECOND`).
    pub id: TaskId,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub target: Target,
}

pub fn copy(args: CopyArgs) -> anyhow::Result<()> {
    let request = m::CreateCopyTask {
        key: args.key.clone(),
        tenant: args.target.tenant.clone(),
        targets: args.to.clone(),
    };
    create_and_report(&args.target, &request, &args.wait, "copy")
}

pub fn move_key(args: MoveArgs) -> anyhow::Result<()> {
    let request = m::CreateMoveTask {
        key: args.key.clone(),
        tenant: args.target.tenant.clone(),
        source: args.from.clone(),
        target: args.to.clone(),
    };
    create_and_report(&args.target, &request, &args.wait, "move")
}

pub fn task(args: TaskArgs) -> anyhow::Result<()> {
    report(&args.target, args.id, &args.wait)
}

/// Sends a task-creating request, prints the task id, then reports it (waiting if asked).
fn create_and_report<M>(
    target: &Target,
    request: &M,
    wait: &WaitArgs,
    what: &str,
) -> anyhow::Result<()>
where
    M: mooncake_proto::Method<Output = TaskId>,
{
    let client = connect(target)?;
    let created = client.block_on(client.client().master().call(request));
    let _ = client.close();
    let id =
        created.map_err(|e| anyhow::anyhow!("{what}: {} ({e}){}", e.code(), hint(e.code())))?;
    println!("task {id}");
    if wait.wait {
        report(target, id, wait)?;
    }
    Ok(())
}

fn hint(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::INVALID_PARAMS => {
            "; segments are node names as `mooncake stat` lists them, the source must hold a \
             replica and differ from the target"
        }
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS => "; the target segment is not OK (draining?)",
        _ => "",
    }
}

/// Prints the task (after it finished, with `--wait`); an error when it FAILED.
fn report(target: &Target, id: TaskId, wait: &WaitArgs) -> anyhow::Result<()> {
    let client = connect(target)?;
    let deadline = Instant::now() + Duration::from_secs(wait.timeout_seconds.max(1));
    let answer = loop {
        let answer = client.block_on(client.client().master().call(&m::QueryTask { id }));
        let done = answer.as_ref().map_or(true, |q| {
            matches!(q.status, TaskStatus::Success | TaskStatus::Failed)
        });
        if !wait.wait || done || Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = client.close();
    let q = answer.map_err(|e| anyhow::anyhow!("task {id}: {} ({e})", e.code()))?;
    print_task(&q);
    if q.status == TaskStatus::Failed {
        anyhow::bail!("task {id} failed: {}", q.message);
    }
    if wait.wait && q.status != TaskStatus::Success {
        anyhow::bail!(
            "task {id} still {} after {} s",
            q.status.name(),
            wait.timeout_seconds
        );
    }
    Ok(())
}

fn print_task(q: &QueryTaskResponse) {
    println!(
        "task {}  type {}  status {}  client {}  created_ms {}  updated_ms {}",
        q.id,
        q.task_type.name(),
        q.status.name(),
        q.assigned_client,
        q.created_at_ms,
        q.last_updated_at_ms
    );
    if !q.message.is_empty() {
        println!("message {}", q.message);
    }
}
