//! `mooncake drain SEGMENT… [--to SEGMENT…] [--wait]`: a drain job (the master's, as upstream's
//! `/api/v1/drain_jobs`): the segments go DRAINING, their objects move to other segments, then
//! DRAINED. Prints the job id; with `--wait`, a progress bar on stderr until the job ends (exit 1
//! when it FAILED, with the reason). `--cancel JOB` cancels a job.

use mooncake_common::{format_size, DrainJobRequest, DrainJobStatus, DrainJobView, TaskId};
use mooncake_proto::methods as m;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::verbs::{connect, Target};

#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Segments (node names `host:port`, as `mooncake stat` lists them) to drain.
    #[arg(required_unless_present = "cancel")]
    pub segments: Vec<String>,
    /// Segments to move to (default: any other OK segment); repeat for several.
    #[arg(long = "to")]
    pub to: Vec<String>,
    /// Wait for the job to end, with a progress bar (exit 1 when it failed).
    #[arg(long)]
    pub wait: bool,
    /// The longest `--wait` waits.
    #[arg(long, default_value_t = 3600)]
    pub timeout_seconds: u64,
    /// Cancel this job instead (its segments go back to OK).
    #[arg(long)]
    pub cancel: Option<TaskId>,
    #[command(flatten)]
    pub target: Target,
}

pub fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let client = connect(&args.target)?;
    let master = client.client().master();
    if let Some(id) = args.cancel {
        let answer = client.block_on(master.call(&m::CancelDrainJob { id }));
        let _ = client.close();
        answer.map_err(|e| anyhow::anyhow!("cancel {id}: {} ({e})", e.code()))?;
        println!("job {id} CANCELED");
        return Ok(());
    }
    let request = DrainJobRequest {
        segments: args.segments.clone(),
        target_segments: args.to.clone(),
        max_concurrency: 4,
    };
    let created = client.block_on(master.call(&m::CreateDrainJob { request }));
    let id = match created {
        Ok(id) => id,
        Err(e) => {
            let _ = client.close();
            anyhow::bail!(
                "drain: {} ({e}); segments must be mounted, OK and distinct, targets OK and not \
                 among them",
                e.code()
            );
        }
    };
    println!("job {id}");
    if !args.wait {
        let _ = client.close();
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds.max(1));
    let mut err = std::io::stderr();
    let last = loop {
        let view = client.block_on(master.call(&m::QueryDrainJob { id }));
        let view = match view {
            Ok(view) => view,
            Err(e) => {
                let _ = client.close();
                anyhow::bail!("job {id}: {} ({e})", e.code());
            }
        };
        let _ = write!(err, "\r{}", progress_line(&view));
        let _ = err.flush();
        let over = matches!(
            view.status,
            DrainJobStatus::Succeeded | DrainJobStatus::Failed | DrainJobStatus::Canceled
        );
        if over || Instant::now() >= deadline {
            break view;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = writeln!(err);
    let _ = client.close();
    println!("job {id} {}: {}", last.status.name(), last.message);
    match last.status {
        DrainJobStatus::Succeeded => Ok(()),
        DrainJobStatus::Failed | DrainJobStatus::Canceled => {
            anyhow::bail!("job {id} {}", last.status.name())
        }
        _ => anyhow::bail!(
            "job {id} still {} after {} s",
            last.status.name(),
            args.timeout_seconds
        ),
    }
}

/// `[#######-------------] 350/1000 objects  1.2 MiB of 3.4 MiB  RUNNING`.
pub fn progress_line(view: &DrainJobView) -> String {
    const WIDTH: u64 = 20;
    let done = view.succeeded_units;
    let total = view.total_units.max(done);
    let filled = (done * WIDTH).checked_div(total).unwrap_or(0);
    format!(
        "[{}{}] {done}/{total} objects  {} of {}  failed {}  blocked {}  {}",
        "#".repeat(filled as usize),
        "-".repeat((WIDTH - filled) as usize),
        format_size(view.migrated_bytes),
        format_size(view.total_bytes),
        view.failed_units,
        view.blocked_units,
        view.status.name()
    )
}
