//! The client-executed copy/move task queue (as upstream's master) as plain data: task records,
//! per-client pending queues, limits and timeouts. The RPCs over it are `tasks_rpc.rs`.
//!
//! A task is queued for the client that owns the source segment; that client fetches it
//! (PENDING → PROCESSING), runs it with CopyStart/End or MoveStart/End, and marks it SUCCESS or
//! FAILED. Limits and timeouts are upstream's defaults ([`TaskLimits`]): at most 10 000 pending
//! and 10 000 processing tasks, pending and processing tasks fail after 300 s, and at most
//! 10 000 finished tasks are kept (oldest pruned first) by [`TaskManager::cleanup`].
//!
//! A task the client reports FAILED goes back to PENDING up to `max_retry_attempts` times
//! (upstream's default 10), each time fetchable only after a backoff that doubles from
//! [`RETRY_BACKOFF_BASE_MS`] up to [`RETRY_BACKOFF_CAP_MS`]; its message keeps the last reason.
//! The report after the last retry makes it FAILED for good.

use std::collections::{HashMap, VecDeque};

use mooncake_common::{
    ClientId, ErrorCode, QueryTaskResponse, TaskAssignment, TaskCompleteRequest, TaskId, TaskStatus,
};

/// Task-queue limits (upstream `max_total_*_tasks`, `*_task_timeout_sec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    pub max_pending: usize,
    pub max_processing: usize,
    pub max_finished: usize,
    pub pending_timeout_ms: u64,
    pub processing_timeout_ms: u64,
    /// Times a task reported FAILED is queued again before it stays FAILED.
    pub max_retry_attempts: u32,
}

/// The wait before a task's first retry; each later retry waits twice the one before.
pub const RETRY_BACKOFF_BASE_MS: u64 = 200;
/// The longest wait before a retry.
pub const RETRY_BACKOFF_CAP_MS: u64 = 10_000;

/// The wait before retry number `attempt` (1-based).
fn retry_backoff_ms(attempt: u32) -> u64 {
    let doublings = attempt.saturating_sub(1).min(16);
    RETRY_BACKOFF_BASE_MS
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_CAP_MS)
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            max_pending: 10_000,
            max_processing: 10_000,
            max_finished: 10_000,
            pending_timeout_ms: 300_000,
            processing_timeout_ms: 300_000,
            max_retry_attempts: 10,
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
    /// Retries so far (FAILED reports that queued the task again).
    retries: u32,
    /// A retried task is not handed out before this time.
    not_before_ms: u64,
}

/// The task queue. One mutex guards it (a leaf of the lock order).
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
    pub fn set_limits(&mut self, limits: TaskLimits) {
        self.limits = limits;
    }

    /// Queues `assignment` for `owner`. TASK_PENDING_LIMIT_EXCEEDED when the queue is full.
    pub fn enqueue(
        &mut self,
        assignment: TaskAssignment,
        owner: ClientId,
        now_ms: u64,
    ) -> Result<TaskId, ErrorCode> {
        if self.pending_count >= self.limits.max_pending {
            return Err(ErrorCode::TASK_PENDING_LIMIT_EXCEEDED);
        }
        let id = assignment.id;
        self.tasks.insert(
            id,
            TaskRecord {
                assignment,
                status: TaskStatus::Pending,
                client: owner,
                updated_ms: now_ms,
                message: String::new(),
                retries: 0,
                not_before_ms: 0,
            },
        );
        self.pending.entry(owner).or_default().push_back(id);
        self.pending_count += 1;
        Ok(id)
    }

    /// Up to `batch` of the client's PENDING tasks become PROCESSING (bounded by the processing
    /// limit), oldest first.
    pub fn fetch(&mut self, client: ClientId, batch: usize, now_ms: u64) -> Vec<TaskAssignment> {
        let room = self
            .limits
            .max_processing
            .saturating_sub(self.processing_count);
        let take = batch.min(room);
        let mut ids: Vec<TaskId> = Vec::new();
        if let Some(q) = self.pending.get_mut(&client) {
            let tasks = &self.tasks;
            let ready = |id: &TaskId| tasks.get(id).is_none_or(|t| t.not_before_ms <= now_ms);
            let mut kept = VecDeque::with_capacity(q.len());
            while let Some(id) = q.pop_front() {
                if ids.len() < take && ready(&id) {
                    ids.push(id);
                } else {
                    kept.push_back(id);
                }
            }
            *q = kept;
        }
        if self.pending.get(&client).is_some_and(VecDeque::is_empty) {
            self.pending.remove(&client);
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.status = TaskStatus::Processing;
                t.updated_ms = now_ms;
                out.push(t.assignment.clone());
            }
        }
        self.pending_count -= out.len();
        self.processing_count += out.len();
        out
    }

    /// MarkTaskToComplete's checks and state change (see `tasks_rpc.rs`).
    pub fn mark_complete(
        &mut self,
        client: ClientId,
        req: &TaskCompleteRequest,
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let t = self.tasks.get(&req.id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
        if t.client != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        if !matches!(req.status, TaskStatus::Success | TaskStatus::Failed) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        if req.status == TaskStatus::Failed && self.retry(req.id, &req.message, now_ms) {
            return Ok(());
        }
        let message = match self.tasks.get(&req.id).map_or(0, |t| t.retries) {
            0 => req.message.clone(),
            n => format!("{} (after {n} retries)", req.message),
        };
        self.finish(req.id, req.status, message, now_ms);
        self.prune_finished();
        Ok(())
    }

    /// `(tenant, key)` of every PENDING or PROCESSING task whose source is segment `source`.
    pub fn active_keys_from(&self, source: &str) -> crate::drain::KeySet {
        self.tasks
            .values()
            .filter(|t| matches!(t.status, TaskStatus::Pending | TaskStatus::Processing))
            .filter(|t| t.assignment.source == source)
            .map(|t| (t.assignment.tenant_id.clone(), t.assignment.key.clone()))
            .collect()
    }

    /// Fails a PENDING task (a canceled drain job's); a task in any other state is left alone.
    pub fn cancel_pending(&mut self, id: TaskId, now_ms: u64) {
        if self
            .tasks
            .get(&id)
            .is_some_and(|t| t.status == TaskStatus::Pending)
        {
            self.finish(id, TaskStatus::Failed, "canceled".to_string(), now_ms);
        }
    }

    /// QueryTask: TASK_NOT_FOUND if unknown (or pruned).
    pub fn query(&self, id: TaskId) -> Result<QueryTaskResponse, ErrorCode> {
        let t = self.tasks.get(&id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
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

    /// Fails PENDING and PROCESSING tasks past their timeout, then prunes finished tasks beyond
    /// the limit. Returns how many tasks failed.
    pub fn cleanup(&mut self, now_ms: u64) -> usize {
        let lim = self.limits;
        let due: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| match t.status {
                TaskStatus::Pending => {
                    t.updated_ms.saturating_add(lim.pending_timeout_ms) <= now_ms
                }
                TaskStatus::Processing => {
                    t.updated_ms.saturating_add(lim.processing_timeout_ms) <= now_ms
                }
                _ => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            self.finish(*id, TaskStatus::Failed, "timed out".to_string(), now_ms);
        }
        self.prune_finished();
        due.len()
    }

    /// Queues a PROCESSING task reported FAILED again when it has retries left; false when it
    /// has none (or is not PROCESSING).
    fn retry(&mut self, id: TaskId, reason: &str, now_ms: u64) -> bool {
        let max = self.limits.max_retry_attempts;
        let Some(t) = self.tasks.get_mut(&id) else {
            return false;
        };
        if t.status != TaskStatus::Processing || t.retries >= max {
            return false;
        }
        t.retries += 1;
        t.status = TaskStatus::Pending;
        t.updated_ms = now_ms;
        t.not_before_ms = now_ms.saturating_add(retry_backoff_ms(t.retries));
        t.message = format!("retry {} of {max} after: {reason}", t.retries);
        self.pending.entry(t.client).or_default().push_back(id);
        self.processing_count -= 1;
        self.pending_count += 1;
        true
    }

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
