//! The task-queue RPCs (as upstream's master): CreateCopyTask, CreateMoveTask, FetchTasks,
//! MarkTaskToComplete, QueryTask and the cleanup step, over the [`crate::tasks::TaskManager`].
//! The queue is not durable state (see `mutation.rs`): a task lost with the master times out on
//! the caller's side and is created again; a copy or move already started lives in its object.

use mooncake_common::{
    ClientId, ErrorCode, QueryTaskResponse, SegmentStatus, TaskAssignment, TaskCompleteRequest,
    TaskId, TaskType, Uuid,
};

use crate::handle::MasterService;
use crate::object::Replica;
use crate::tasks::TaskLimits;

impl MasterService {
    /// Replaces the task-queue limits (the server maps its `max_total_*_tasks` and
    /// `*_task_timeout_sec` flags here).
    pub fn set_task_limits(&self, limits: TaskLimits) {
        self.tasks.lock().set_limits(limits);
    }

    /// The segment names holding a COMPLETE, live memory replica of `key`.
    fn replica_segment_names(&self, key: &str, tenant: &str) -> Result<Vec<String>, ErrorCode> {
        self.read_entry(key, tenant, |_, entry| {
            Ok(entry
                .meta
                .replicas
                .iter()
                .filter(|r| r.is_readable())
                .filter_map(Replica::segment_name)
                .map(|n| n.to_string())
                .collect())
        })
    }

    /// A fresh task id from the master's random source (never the nil id).
    fn next_task_id(&self) -> TaskId {
        loop {
            let id = Uuid::new(self.rng.next_u64(), self.rng.next_u64());
            if !id.is_nil() {
                return TaskId(id);
            }
        }
    }

    pub(crate) fn enqueue_task(
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
        let assignment = TaskAssignment {
            id: self.next_task_id(),
            task_type,
            key: key.to_string(),
            tenant_id: tenant.to_string(),
            source: source.to_string(),
            targets: targets.to_vec(),
            created_at_ms: now,
        };
        self.tasks.lock().enqueue(assignment, owner, now)
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
        let source = names[self.rng.below(names.len())].clone();
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
        self.tasks.lock().fetch(client, batch, now)
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
        self.tasks.lock().mark_complete(client, req, now)
    }

    /// QueryTask: TASK_NOT_FOUND if unknown (or pruned).
    pub fn query_task(&self, id: TaskId) -> Result<QueryTaskResponse, ErrorCode> {
        self.tasks.lock().query(id)
    }

    /// Task cleanup (the server's 30 s tick): fails PENDING and PROCESSING tasks past their
    /// timeout, then prunes finished tasks beyond the limit. Returns how many tasks failed.
    pub fn run_task_cleanup_once(&self) -> usize {
        let now = self.clock.now_ms();
        self.tasks.lock().cleanup(now)
    }
}
