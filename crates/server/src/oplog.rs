//! The master's op-log in the process (`--enable_oplog`, docs/oplog.md): the start from the
//! log in etcd, the sink and writer that make every mutation durable, and the rule that decides
//! when a mutating RPC may answer.
//!
//! - Before a mutating call is applied ([`OpLogHandle::gate`]): while the writer cannot reach
//!   etcd the call is refused with `ETCD_OPERATION_ERROR` (retryable) and changes nothing; once
//!   this master is fenced, `UNAVAILABLE_IN_CURRENT_STATUS`. Reads are never gated.
//! - After it ([`OpLogHandle::wait_target`]): with `--oplog_ack=durable` (default) the reply of
//!   every call that is not a grant waits until everything the master observed up to then is
//!   durable; with `visible` it does not wait. A grant (PutStart, UpsertStart, CopyStart,
//!   MoveStart and their batches: the calls that hand out space) waits, in both modes, only
//!   until every removal whose space it could have been given is durable — usually nothing to
//!   wait for — or, when this leader's lease runs out soon, until everything is durable (a
//!   stale leader then learns that it is fenced before anyone writes into space it handed
//!   out). A wait longer than `--oplog_ack_timeout_ms` answers `ETCD_OPERATION_ERROR`.
//!   The RPC server holds the reply back ([`mooncake_rpc::Deferred`]) and keeps serving the
//!   connection meanwhile, so many waiting calls share one etcd transaction.

use std::sync::Arc;
use std::time::Duration;

use mooncake_common::ErrorCode;
use mooncake_master::{MasterService, MasterServiceConfig, MasterState};
use mooncake_oplog::checkpoint::bootstrap;
use mooncake_oplog::election::Fence;
use mooncake_oplog::etcd::{oplog_root, EtcdLog, Prefix};
use mooncake_oplog::follow::LogFollower;
use mooncake_oplog::{AckError, OpLogSink, OpLogWriter, WriterConfig, WriterHealth};
use mooncake_proto::methods::{self as m, Method};
use mooncake_snapshot::SnapshotDir;
use parking_lot::Mutex;

use crate::config::{OpLogAck, OpLogSettings, SnapshotSettings};

/// Deadline of one etcd call of the writer and of the start.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// When a mutating call's reply waits for durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckClass {
    /// Hands out space: waits in both modes.
    Grant,
    /// Any other mutation: waits with `--oplog_ack=durable`.
    Ack,
}

/// The class of method `id`; `None` for calls that change no durable state.
pub fn method_class(id: u16) -> Option<AckClass> {
    const GRANT: &[u16] = &[
        m::PutStart::ID,
        m::BatchPutStart::ID,
        m::UpsertStart::ID,
        m::BatchUpsertStart::ID,
        m::CopyStart::ID,
        m::MoveStart::ID,
    ];
    const ACK: &[u16] = &[
        m::PutEnd::ID,
        m::BatchPutEnd::ID,
        m::PutRevoke::ID,
        m::BatchPutRevoke::ID,
        m::Remove::ID,
        m::BatchRemove::ID,
        m::RemoveByRegex::ID,
        m::RemoveAll::ID,
        m::BatchReplicaClear::ID,
        m::MountSegment::ID,
        m::ReMountSegment::ID,
        m::UnmountSegment::ID,
        m::GracefulUnmountSegment::ID,
        m::UpsertEnd::ID,
        m::BatchUpsertEnd::ID,
        m::UpsertRevoke::ID,
        m::BatchUpsertRevoke::ID,
        m::CopyEnd::ID,
        m::CopyRevoke::ID,
        m::MoveEnd::ID,
        m::MoveRevoke::ID,
        m::ConfirmReplicas::ID,
    ];
    if GRANT.contains(&id) {
        Some(AckClass::Grant)
    } else if ACK.contains(&id) {
        Some(AckClass::Ack)
    } else {
        None
    }
}

/// What the start read from etcd.
#[derive(Debug)]
pub struct LogStart {
    /// The durable prefix (`None`: an empty log).
    pub prefix: Option<Prefix>,
    /// The fold of every batch (`None` when the log is empty).
    pub state: Option<MasterState>,
}

/// Connects to the op-log of `settings` in etcd.
pub async fn connect_log(settings: &OpLogSettings) -> Result<EtcdLog, String> {
    EtcdLog::connect(
        &settings.endpoints,
        oplog_root(&settings.cluster_id),
        CALL_TIMEOUT,
    )
    .await
    .map_err(|e| format!("cannot reach etcd at {:?}: {e}", settings.endpoints))
}

/// The snapshot directory a start from the log loads from (`None`: none configured).
pub fn loading_dir(snapshot: &SnapshotSettings) -> Option<SnapshotDir> {
    snapshot.dir.as_deref().map(SnapshotDir::open_for_loading)
}

/// Loads the newest snapshot of the log into `master` (empty) and returns a follower of the
/// log after it (docs/oplog.md, "Compaction"); with `--snapshot_required`, a start without such
/// a snapshot fails.
pub async fn bootstrap_from<'a>(
    master: &'a MasterService,
    log: &EtcdLog,
    snapshot: &SnapshotSettings,
) -> Result<LogFollower<'a>, String> {
    let dir = loading_dir(snapshot);
    let boot = bootstrap(master, log, dir.as_ref()).await?;
    if snapshot.required && boot.snapshot.is_none() {
        return Err(format!(
            "no snapshot of the op-log in {} verifies; --snapshot_required refuses to start \
             from the log alone",
            dir.as_ref()
                .map_or("(none)".into(), |d| d.path().display().to_string())
        ));
    }
    Ok(boot.follower)
}

/// Reads the log, after the newest snapshot of it when there is one, and folds it into a
/// state, on a scratch master with `config`.
pub async fn read_log(
    settings: &OpLogSettings,
    snapshot: &SnapshotSettings,
    config: MasterServiceConfig,
) -> Result<LogStart, String> {
    let log = connect_log(settings).await?;
    let scratch = MasterService::new(config, Arc::new(mooncake_common::SystemClock::new()))
        .map_err(|e| e.to_string())?;
    let mut follower = bootstrap_from(&scratch, &log, snapshot).await?;
    let prefix = follower.catch_up(&log).await.map_err(|e| e.to_string())?;
    let Some(prefix) = prefix else {
        return Ok(LogStart {
            prefix: None,
            state: None,
        });
    };
    tracing::info!(
        "op-log read: {} batches, {} entries",
        prefix.batch_id,
        prefix.last_seq
    );
    Ok(LogStart {
        prefix: Some(prefix),
        state: Some(scratch.export_state()),
    })
}

/// The running op-log of a master (see the module doc).
#[derive(Debug)]
pub struct OpLogHandle {
    sink: Arc<OpLogSink>,
    /// The fence of the writer's view (with an election): compaction carries it too.
    fence: Option<Fence>,
    writer: Mutex<Option<OpLogWriter>>,
    ack: OpLogAck,
    timeout: Duration,
}

impl OpLogHandle {
    /// Installs the sink on `master` (numbering from the prefix) and starts the writer, which
    /// writes `view` into its batches and, with an election, commits only while `fence` holds.
    /// Call it before the master serves.
    pub fn start(
        master: &MasterService,
        settings: &OpLogSettings,
        prefix: Option<Prefix>,
        view: u64,
        fence: Option<Fence>,
    ) -> Result<Arc<OpLogHandle>, String> {
        let sink = Arc::new(OpLogSink::new(prefix.map_or(0, |p| p.last_seq)));
        master
            .set_observer(sink.clone())
            .map_err(|e| e.to_string())?;
        let writer = OpLogWriter::start(
            sink.clone(),
            WriterConfig {
                endpoints: settings.endpoints.clone(),
                root: oplog_root(&settings.cluster_id),
                view,
                start: prefix,
                call_timeout: CALL_TIMEOUT,
                fence: fence.clone(),
            },
        )
        .map_err(|e| format!("cannot start the op-log writer: {e}"))?;
        Ok(Arc::new(OpLogHandle {
            sink,
            fence,
            writer: Mutex::new(Some(writer)),
            ack: settings.ack,
            timeout: settings.ack_timeout,
        }))
    }

    /// A handle over `sink` without a writer: entries become durable only when the caller
    /// marks them (tests of the reply rules).
    #[cfg(test)]
    pub(crate) fn unwritten(sink: Arc<OpLogSink>, ack: OpLogAck, timeout: Duration) -> Arc<Self> {
        Arc::new(OpLogHandle {
            sink,
            fence: None,
            writer: Mutex::new(None),
            ack,
            timeout,
        })
    }

    pub fn sink(&self) -> &Arc<OpLogSink> {
        &self.sink
    }

    /// The writer's fence (`None` without an election).
    pub fn view_fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// Before a mutating call: refuses it while etcd is unreachable or this master is fenced.
    pub fn gate(&self) -> Result<(), ErrorCode> {
        match self.sink.health() {
            WriterHealth::Healthy => Ok(()),
            WriterHealth::Retrying => Err(ErrorCode::ETCD_OPERATION_ERROR),
            WriterHealth::Fenced => Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
        }
    }

    /// After a mutating call of `class` that succeeded: the sequence number that must be
    /// durable before it replies, `None` when it may reply now (see the module doc).
    /// `lease_ending`: this master's leadership runs out soon.
    pub fn wait_target(&self, class: AckClass, lease_ending: bool) -> Option<u64> {
        let target = match (class, self.ack) {
            (AckClass::Ack, OpLogAck::Visible) => return None,
            (AckClass::Ack, OpLogAck::Durable) => self.sink.assigned_seq(),
            (AckClass::Grant, _) if lease_ending => self.sink.assigned_seq(),
            // Read after the allocation: any removal whose space it took is at or below it.
            (AckClass::Grant, _) => self.sink.freed_seq(),
        };
        (self.sink.durable_seq() < target).then_some(target)
    }

    /// Waits, blocking the thread, until `target` is durable.
    pub fn wait_blocking(&self, target: u64) -> Result<(), ErrorCode> {
        let wait = || self.sink.wait_durable(target, self.timeout);
        let result = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        };
        result.map_err(ack_code)
    }

    /// Waits until `target` is durable, without blocking a thread.
    pub async fn wait(&self, target: u64) -> Result<(), ErrorCode> {
        self.sink
            .durable(target, self.timeout)
            .await
            .map_err(ack_code)
    }

    /// Stops the writer (a batch it could not commit yet is dropped) and fences the sink:
    /// nothing observed from now on is queued, and every wait for durability fails.
    pub fn fence(&self) {
        if let Some(w) = self.writer.lock().take() {
            w.stop();
        }
        self.sink.set_health(WriterHealth::Fenced);
    }

    /// Waits (at most `timeout`) until everything observed is durable, then stops the writer.
    pub fn stop(&self, timeout: Duration) {
        let target = self.sink.assigned_seq();
        if self.sink.wait_durable(target, timeout).is_err() {
            tracing::warn!(
                "op-log: entries up to {target} were not all durable at shutdown (durable: {})",
                self.sink.durable_seq()
            );
        }
        if let Some(w) = self.writer.lock().take() {
            w.stop();
        }
    }
}

/// The reply to a call whose change cannot be acknowledged: retryable while etcd may return,
/// `UNAVAILABLE_IN_CURRENT_STATUS` (the client tries another master) once fenced.
fn ack_code(e: AckError) -> ErrorCode {
    match e {
        AckError::Unavailable => ErrorCode::ETCD_OPERATION_ERROR,
        AckError::Fenced => ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
    }
}

/// Where a master's op-log is once it runs: set at start, or at promotion with `--enable_ha`.
pub type OpLogSlot = std::sync::OnceLock<Arc<OpLogHandle>>;
