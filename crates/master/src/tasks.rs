//! The client-executed copy/move task queue (spec/master.md §9): CreateCopyTask,
//! CreateMoveTask, FetchTasks, MarkTaskToComplete, QueryTask, and the cleanup step.
//!
//! A task is queued for the client that owns the source segment; that client fetches it
//! (PENDING → PROCESSING), runs it with CopyStart/End or MoveStart/End, and marks it SUCCESS or
//! FAILED. Limits and timeouts are upstream's defaults ([`TaskLimits`]): at most 10 000 pending
//! and 10 000 processing tasks, pending and processing tasks fail after 300 s, and at most
//! 10 000 finished tasks are kept (oldest pruned first) by [`MasterService::run_task_cleanup_once`].

use std::collections::{HashMap, VecDeque};

use mooncake_common::{
    ClientId, ErrorCode, QueryTaskResponse, SegmentStatus, TaskAssignment, TaskCompleteRequest,
    TaskId, TaskStatus, TaskType,
};

use crate::object::Replica;
use crate::service::MasterService;

/// Task-queue limits (upstream `max_total_*_tasks`, `*_task_timeout_sec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    pub max_pending: usize,
    pub max_processing: usize,
    pub max_finished: usize,
    pub pending_timeout_ms: u64,
    pub processing_timeout_ms: u64,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            max_pending: 10_000,
            max_processing: 10_000,
            max_finished: 10_000,
            pending_timeout_ms: 300_000,
            processing_timeout_ms: 300_000,
        }
    }
}

#[derive(Debug)]
struct TaskRecord {
    assignment: TaskAssignment,
    status: TaskStatus,
    client: ClientId,
    updated_ms: u64,
    message: String,
}

#[derive(Debug, Default)]
pub(crate) struct TaskManager {
    limits: TaskLimits,
    tasks: HashMap<TaskId, TaskRecord>,
    pending: HashMap<ClientId, VecDeque<TaskId>>,
    pending_count: usize,
    processing_count: usize,
    finished: VecDeque<TaskId>,
}

impl TaskManager {
    fn finish(&mut self, id: TaskId, status: TaskStatus, message: String, now_ms: u64) {
        let Some(t) = self.tasks.get_mut(&id) else {
            return;
        };
        match t.status {
            TaskStatus::Pending => {
                self.pending_count -= 1;
                if let Some(q) = self.pending.get_mut(&t.client) {
                    q.retain(|x| *x != id);
                }
            }
            TaskStatus::Processing => self.processing_count -= 1,
            _ => return,
        }
        t.status = status;
        t.message = message;
        t.updated_ms = now_ms;
        self.finished.push_back(id);
    }

    fn prune_finished(&mut self) -> usize {
        let mut pruned = 0;
        while self.finished.len() > self.limits.max_finished {
            if let Some(id) = self.finished.pop_front() {
                self.tasks.remove(&id);
                pruned += 1;
            }
        }
        pruned
    }
}

impl MasterService {
    /// Replaces the task-queue limits (the server maps its `max_total_*_tasks` and
    /// `*_task_timeout_sec` flags here).
    pub fn set_task_limits(&self, limits: TaskLimits) {
        self.tasks.lock().limits = limits;
    }

    /// The segment names holding a COMPLETE, live memory replica of `key`.
    fn replica_segment_names(&self, key: &str, tenant: &str) -> Result<Vec<String>, ErrorCode> {
        let t = self.resolve_tenant(tenant)?;
        let hash = self.route(t, key);
        let shard = self.index.shard(hash).read();
        let entry = shard
            .tenant(t)
            .and_then(|s| s.find(hash, key))
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        Ok(entry
            .meta
            .replicas
            .iter()
            .filter(|r| r.is_complete() && r.is_valid())
            .filter_map(Replica::segment_name)
            .map(|n| n.to_string())
            .collect())
    }

    fn enqueue_task(
        &self,
        task_type: TaskType,
        key: &str,
        tenant: &str,
        source: &str,
        targets: &[String],
    ) -> Result<TaskId, ErrorCode> {
        let owner = {
            let segs = self.segments.inner.read();
            let id = segs
                .by_name
                .get(source)
                .and_then(|ids| ids.first())
                .ok_or(ErrorCode::INVALID_PARAMS)?;
            segs.mounted
                .get(id)
                .map(|s| s.client)
                .ok_or(ErrorCode::INVALID_PARAMS)?
        };
        let now = self.clock.now_ms();
        let mut tm = self.tasks.lock();
        if tm.pending_count >= tm.limits.max_pending {
            return Err(ErrorCode::TASK_PENDING_LIMIT_EXCEEDED);
        }
        let id = TaskId::random();
        tm.tasks.insert(
            id,
            TaskRecord {
                assignment: TaskAssignment {
                    id,
                    task_type,
                    key: key.to_string(),
                    tenant_id: tenant.to_string(),
                    source: source.to_string(),
                    targets: targets.to_vec(),
                    created_at_ms: now,
                },
                status: TaskStatus::Pending,
                client: owner,
                updated_ms: now,
                message: String::new(),
            },
        );
        tm.pending.entry(owner).or_default().push_back(id);
        tm.pending_count += 1;
        Ok(id)
    }

    fn check_task_targets(&self, targets: &[String]) -> Result<(), ErrorCode> {
        if targets.is_empty() {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        for t in targets {
            match self.query_segment_status(t) {
                Ok(SegmentStatus::OK) => {}
                Ok(_) => return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
                Err(_) => return Err(ErrorCode::INVALID_PARAMS),
            }
        }
        Ok(())
    }

    /// CreateCopyTask: queues a copy of `key` to `targets`, from a random segment holding a
    /// replica, for the client owning that segment. Empty or unknown targets, or an object with
    /// no replica → INVALID_PARAMS; a non-OK target → UNAVAILABLE_IN_CURRENT_STATUS; missing
    /// object → OBJECT_NOT_FOUND; too many pending → TASK_PENDING_LIMIT_EXCEEDED.
    pub fn create_copy_task(
        &self,
        key: &str,
        tenant: &str,
        targets: &[String],
    ) -> Result<TaskId, ErrorCode> {
        self.check_task_targets(targets)?;
        let names = self.replica_segment_names(key, tenant)?;
        if names.is_empty() {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let source = names[fastrand::usize(..names.len())].clone();
        self.enqueue_task(TaskType::ReplicaCopy, key, tenant, &source, targets)
    }

    /// CreateMoveTask: queues a move of `key` from `source` to `target` for the client owning
    /// `source`. `source == target`, or a source holding no replica → INVALID_PARAMS; otherwise
    /// CreateCopyTask's errors.
    pub fn create_move_task(
        &self,
        key: &str,
        tenant: &str,
        source: &str,
        target: &str,
    ) -> Result<TaskId, ErrorCode> {
        if source == target {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let targets = [target.to_string()];
        self.check_task_targets(&targets)?;
        let names = self.replica_segment_names(key, tenant)?;
        if !names.iter().any(|n| n == source) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        self.enqueue_task(TaskType::ReplicaMove, key, tenant, source, &targets)
    }

    /// FetchTasks: up to `batch` of the client's PENDING tasks become PROCESSING (bounded by the
    /// processing limit), oldest first.
    pub fn fetch_tasks(&self, client: ClientId, batch: usize) -> Vec<TaskAssignment> {
        let now = self.clock.now_ms();
        let mut tm = self.tasks.lock();
        let room = tm.limits.max_processing.saturating_sub(tm.processing_count);
        let take = batch.min(room);
        let ids: Vec<TaskId> = match tm.pending.get_mut(&client) {
            Some(q) => {
                let n = take.min(q.len());
                q.drain(..n).collect()
            }
            None => Vec::new(),
        };
        if tm.pending.get(&client).is_some_and(VecDeque::is_empty) {
            tm.pending.remove(&client);
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(t) = tm.tasks.get_mut(&id) {
                t.status = TaskStatus::Processing;
                t.updated_ms = now;
                out.push(t.assignment.clone());
            }
        }
        tm.pending_count -= out.len();
        tm.processing_count += out.len();
        out
    }

    /// MarkTaskToComplete: unknown id → TASK_NOT_FOUND; not the assigned client →
    /// ILLEGAL_CLIENT; a status other than SUCCESS/FAILED → INVALID_PARAMS; a task already
    /// finished → OK (idempotent).
    pub fn mark_task_to_complete(
        &self,
        client: ClientId,
        req: &TaskCompleteRequest,
    ) -> Result<(), ErrorCode> {
        let now = self.clock.now_ms();
        let mut tm = self.tasks.lock();
        let t = tm.tasks.get(&req.id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
        if t.client != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        if !matches!(req.status, TaskStatus::Success | TaskStatus::Failed) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        tm.finish(req.id, req.status, req.message.clone(), now);
        tm.prune_finished();
        Ok(())
    }

    /// QueryTask: TASK_NOT_FOUND if unknown (or pruned).
    pub fn query_task(&self, id: TaskId) -> Result<QueryTaskResponse, ErrorCode> {
        let tm = self.tasks.lock();
        let t = tm.tasks.get(&id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
        Ok(QueryTaskResponse {
            id,
            task_type: t.assignment.task_type,
            status: t.status,
            created_at_ms: t.assignment.created_at_ms,
            last_updated_at_ms: t.updated_ms,
            assigned_client: t.client,
            message: t.message.clone(),
        })
    }

    /// Task cleanup (the server's 30 s tick): fails PENDING and PROCESSING tasks past their
    /// timeout, then prunes finished tasks beyond the limit. Returns how many tasks failed.
    pub fn run_task_cleanup_once(&self) -> usize {
        let now = self.clock.now_ms();
        let mut tm = self.tasks.lock();
        let lim = tm.limits;
        let due: Vec<TaskId> = tm
            .tasks
            .iter()
            .filter(|(_, t)| match t.status {
                TaskStatus::Pending => t.updated_ms.saturating_add(lim.pending_timeout_ms) <= now,
                TaskStatus::Processing => {
                    t.updated_ms.saturating_add(lim.processing_timeout_ms) <= now
                }
                _ => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            tm.finish(*id, TaskStatus::Failed, "timed out".to_string(), now);
        }
        tm.prune_finished();
        due.len()
    }
}
