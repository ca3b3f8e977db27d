//! Copy and move tasks the master queues for this client (it owns their source segment), as
//! upstream's clients: each heartbeat of a client with a segment (and, for store nodes, every
//! [`NODE_TASK_POLL`] in between) starts a runner (one at a time) that fetches up to [`TASK_BATCH`] tasks with FetchTasks, runs them concurrently and
//! fetches again until the queue is empty.
//!
//! A copy is CopyStart (the master pins the source and allocates PROCESSING targets), the
//! source's bytes read from this client's segment and written to every target in one transfer
//! batch, then CopyEnd; a move is the same with MoveStart/MoveEnd (the master drops the source
//! at the end; a target that already holds a replica is not written). A failure after the start
//! revokes it (CopyRevoke/MoveRevoke: the targets are erased, the source stays). Every task is
//! reported with MarkTaskToComplete: SUCCESS, or FAILED with the reason (the master queues a
//! failed task again up to its `max_retry_attempts`).

use mooncake_common::{
    MemoryDescriptor, QueryTaskResponse, ReplicaDescriptor, ReplicaKind, TaskAssignment,
    TaskCompleteRequest, TaskId, TaskStatus, TaskType,
};
use mooncake_proto::methods as m;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mooncake_transfer::MemoryHandle;

use super::addressing::split_address;
use super::{Inner, StoreClient, StoreError};

/// Tasks fetched (and run concurrently) at a time.
pub const TASK_BATCH: u64 = 16;

/// How often `mooncake store` nodes ask for their tasks (`StoreConfig::task_poll_interval`):
/// a drain job's moves then start within this instead of up to a heartbeat (1 s) later, which
/// was most of a 512 MiB drain's time. One small FetchTasks call per node every 100 ms costs
/// the master nothing; library clients (one per engine rank) keep the heartbeat's cadence.
pub const NODE_TASK_POLL: std::time::Duration = std::time::Duration::from_millis(100);

impl StoreClient {
    /// CreateCopyTask: queues a copy of `key` (this client's tenant) to the `targets` segments,
    /// run by the node holding a replica; returns the task id.
    pub async fn create_copy_task(
        &self,
        key: &str,
        targets: &[String],
    ) -> Result<TaskId, StoreError> {
        let request = m::CreateCopyTask {
            key: key.to_string(),
            tenant: self.tenant().to_string(),
            targets: targets.to_vec(),
        };
        Ok(self.inner.master.call(&request).await?)
    }

    /// CreateMoveTask: queues a move of `key` from segment `source` to `target`, run by the
    /// source's node; returns the task id.
    pub async fn create_move_task(
        &self,
        key: &str,
        source: &str,
        target: &str,
    ) -> Result<TaskId, StoreError> {
        let request = m::CreateMoveTask {
            key: key.to_string(),
            tenant: self.tenant().to_string(),
            source: source.to_string(),
            target: target.to_string(),
        };
        Ok(self.inner.master.call(&request).await?)
    }

    /// QueryTask: the task's state (TASK_NOT_FOUND once pruned or never created).
    pub async fn query_task(&self, id: TaskId) -> Result<QueryTaskResponse, StoreError> {
        Ok(self.inner.master.call(&m::QueryTask { id }).await?)
    }

    /// Fetches this client's queued tasks and runs them until the master has none left for it
    /// (or the client closes). Returns how many tasks ran. The heartbeat calls this on its own;
    /// call it to run queued work now (a shutdown that drains its segment does).
    ///
    /// Up to [`TASK_BATCH`] run at once, as a window: once half of them are done the runner asks
    /// for as many more, so one slow move does not hold up the next batch of a drain.
    pub async fn run_queued_tasks(&self) -> Result<usize, StoreError> {
        let inner = &self.inner;
        let window = TASK_BATCH as usize;
        let mut ran = 0;
        let mut running = tokio::task::JoinSet::new();
        let mut master_has_more = true;
        let mut failure = None;
        loop {
            // A master that sent more tasks than asked for leaves no room (never an underflow).
            let room = window.saturating_sub(running.len());
            if master_has_more && room >= window / 2 && !inner.closed.load(Ordering::Acquire) {
                let fetch = m::FetchTasks {
                    client: inner.client_id,
                    batch_size: room as u64,
                };
                match inner.master.call(&fetch).await {
                    Ok(tasks) => {
                        master_has_more = !tasks.is_empty();
                        ran += tasks.len();
                        for task in tasks {
                            let client = self.clone();
                            running.spawn(async move { client.run_task(&task).await });
                        }
                    }
                    // The tasks already running finish (and report) first.
                    Err(error) => {
                        master_has_more = false;
                        failure = Some(error);
                    }
                }
            }
            if running.join_next().await.is_none() {
                break;
            }
        }
        match failure {
            Some(error) => Err(error.into()),
            None => Ok(ran),
        }
    }

    /// Runs one task and reports its outcome to the master.
    async fn run_task(&self, task: &TaskAssignment) {
        let outcome = self.execute_task(task).await;
        let stats = &self.inner.stats;
        let (status, message) = match outcome {
            Ok(()) => {
                stats.tasks_succeeded.fetch_add(1, Ordering::Relaxed);
                (TaskStatus::Success, String::new())
            }
            Err(error) => {
                stats.tasks_failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(task = %task.id, key = %task.key, %error, "task failed");
                (TaskStatus::Failed, format!("{}: {error}", error.code()))
            }
        };
        let report = m::MarkTaskToComplete {
            client: self.inner.client_id,
            request: TaskCompleteRequest {
                id: task.id,
                status,
                message,
            },
        };
        if let Err(error) = self.inner.master.call(&report).await {
            tracing::warn!(task = %task.id, %error, "reporting a task's outcome failed");
        }
    }

    /// Start, copy the bytes, end (revoke when the copy failed).
    async fn execute_task(&self, task: &TaskAssignment) -> Result<(), StoreError> {
        let (client, master) = (self.inner.client_id, &self.inner.master);
        let (key, tenant) = (task.key.clone(), task.tenant_id.clone());
        match task.task_type {
            TaskType::ReplicaCopy => {
                let start = m::CopyStart {
                    client,
                    key: key.clone(),
                    tenant: tenant.clone(),
                    source: task.source.clone(),
                    targets: task.targets.clone(),
                };
                let started = master.call(&start).await?;
                match self.copy_replica(&started.source, &started.targets).await {
                    Ok(()) => Ok(master
                        .call(&m::CopyEnd {
                            client,
                            key,
                            tenant,
                        })
                        .await?),
                    Err(error) => {
                        let _ = master
                            .call(&m::CopyRevoke {
                                client,
                                key,
                                tenant,
                            })
                            .await;
                        Err(error)
                    }
                }
            }
            TaskType::ReplicaMove => {
                let target = task.targets.first().ok_or_else(|| {
                    StoreError::InvalidParams("a move task without a target".to_string())
                })?;
                let start = m::MoveStart {
                    client,
                    key: key.clone(),
                    tenant: tenant.clone(),
                    source: task.source.clone(),
                    target: target.clone(),
                };
                let started = master.call(&start).await?;
                let targets: Vec<ReplicaDescriptor> = started.target.into_iter().collect();
                match self.copy_replica(&started.source, &targets).await {
                    Ok(()) => Ok(master
                        .call(&m::MoveEnd {
                            client,
                            key,
                            tenant,
                        })
                        .await?),
                    Err(error) => {
                        let _ = master
                            .call(&m::MoveRevoke {
                                client,
                                key,
                                tenant,
                            })
                            .await;
                        Err(error)
                    }
                }
            }
        }
    }

    /// Reads `source` and writes its bytes to every memory replica of `targets`. Endpoints a
    /// write failed to for reasons of their node are reported to the master (as a put does).
    async fn copy_replica(
        &self,
        source: &ReplicaDescriptor,
        targets: &[ReplicaDescriptor],
    ) -> Result<(), StoreError> {
        let ReplicaKind::Memory(memory) = &source.kind else {
            return Err(StoreError::NoReadableReplica { key: String::new() });
        };
        let len = usize::try_from(memory.size)
            .map_err(|_| StoreError::InvalidParams("object too large".to_string()))?;
        if targets.is_empty() || len == 0 {
            return Ok(());
        }
        // A source in this client's own segment is written from where it lies (the master
        // pinned it for the task); any other is read into a private buffer first.
        let own = self.own_segment_bytes(memory, len);
        let mut private = Vec::new();
        let bytes: &[u8] = match &own {
            Some((segment, offset)) => {
                // SAFETY: `own_segment_bytes` checked that `[offset, offset + len)` lies inside
                // the mapping `segment` keeps alive; the master pinned the source replica until
                // this task's End or Revoke, so nothing is written into it meanwhile.
                unsafe { std::slice::from_raw_parts(segment.as_ptr().add(*offset), len) }
            }
            None => {
                private.reserve_exact(len);
                // A memory source: no key is needed to read it.
                let plan = [(
                    0usize,
                    private.as_mut_ptr() as usize,
                    len,
                    source.clone(),
                    "",
                )];
                self.read_planned(&plan)
                    .await
                    .remove(&0)
                    .unwrap_or(Err(StoreError::NoReadableReplica { key: String::new() }))?;
                // SAFETY: the read succeeded, so the engine wrote all `len` bytes.
                unsafe { private.set_len(len) };
                &private
            }
        };
        match self.write_replicas(targets, &[bytes], len as u64).await {
            Ok(_) => Ok(()),
            Err(failure) => {
                self.report_peers(&failure.peers).await;
                Err(failure.error)
            }
        }
    }

    /// The segment of this client that holds `memory`'s `len` bytes, and their offset in it, when
    /// the replica lies in this process.
    fn own_segment_bytes(
        &self,
        memory: &MemoryDescriptor,
        len: usize,
    ) -> Option<(MemoryHandle, usize)> {
        let endpoint = self.endpoint_of(&memory.transport_endpoint).ok()?;
        if endpoint.instance_id() != self.inner.engine.endpoint().instance_id() {
            return None;
        }
        let (region, offset) = split_address(memory.buffer_address);
        let segments = self.inner.segments.lock();
        let segment = segments.iter().find(|s| s.memory.id() == region)?;
        let end = offset.checked_add(len as u64)?;
        (end <= segment.memory.len_bytes() as u64)
            .then(|| (segment.memory.clone(), offset as usize))
    }
}

/// Starts a task runner for a client with a segment, unless one is running.
pub(super) fn spawn_runner(inner: &Arc<Inner>) {
    if inner.segments.lock().is_empty() || inner.task_runner.swap(true, Ordering::AcqRel) {
        return;
    }
    let client = StoreClient::from_inner(inner.clone());
    tokio::spawn(async move {
        if let Err(error) = client.run_queued_tasks().await {
            tracing::debug!(%error, "fetching tasks failed");
        }
        client.inner.task_runner.store(false, Ordering::Release);
    });
}
