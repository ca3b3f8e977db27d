//! Upstream's task calls: `create_copy_task`, `create_move_task`, `query_task`, and the classes
//! their answers use (`TaskType`, `TaskStatus`, `QueryTaskResponse`).
//!
//! Ids travel as upstream's pybind `UUID`: a `(first, second)` tuple of ints. A failed create
//! answers `((0, 0), code)`, a failed query `(None, code)`, as upstream.

use mooncake_common::{
    ClientId, QueryTaskResponse as RsQueryTaskResponse, TaskId, TaskStatus as RsTaskStatus,
    TaskType as RsTaskType,
};
use pyo3::prelude::*;

use crate::codes::{code_of, NOT_READY};
use crate::store::Store;

/// What a task does (upstream numbers).
#[pyclass(eq, eq_int, module = "mooncake_rs.store")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskType {
    #[pyo3(name = "REPLICA_COPY")]
    ReplicaCopy = 0,
    #[pyo3(name = "REPLICA_MOVE")]
    ReplicaMove = 1,
}

/// A task's state (upstream numbers: FAILED is 2, SUCCESS 3).
#[pyclass(eq, eq_int, module = "mooncake_rs.store")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum TaskStatus {
    PENDING = 0,
    PROCESSING = 1,
    FAILED = 2,
    SUCCESS = 3,
}

impl From<RsTaskType> for TaskType {
    fn from(t: RsTaskType) -> Self {
        match t {
            RsTaskType::ReplicaCopy => TaskType::ReplicaCopy,
            RsTaskType::ReplicaMove => TaskType::ReplicaMove,
        }
    }
}

impl From<RsTaskStatus> for TaskStatus {
    fn from(s: RsTaskStatus) -> Self {
        match s {
            RsTaskStatus::Pending => TaskStatus::PENDING,
            RsTaskStatus::Processing => TaskStatus::PROCESSING,
            RsTaskStatus::Failed => TaskStatus::FAILED,
            RsTaskStatus::Success => TaskStatus::SUCCESS,
        }
    }
}

/// `query_task`'s answer, with upstream's attribute names.
#[pyclass(module = "mooncake_rs.store", get_all)]
#[derive(Debug, Clone)]
pub struct QueryTaskResponse {
    pub id: (u64, u64),
    #[pyo3(name = "type")]
    pub task_type: TaskType,
    pub status: TaskStatus,
    pub created_at_ms_epoch: u64,
    pub last_updated_at_ms_epoch: u64,
    pub assigned_client: (u64, u64),
    pub message: String,
}

impl From<RsQueryTaskResponse> for QueryTaskResponse {
    fn from(r: RsQueryTaskResponse) -> Self {
        let ClientId(client) = r.assigned_client;
        QueryTaskResponse {
            id: (r.id.0.first, r.id.0.second),
            task_type: r.task_type.into(),
            status: r.status.into(),
            created_at_ms_epoch: r.created_at_ms,
            last_updated_at_ms_epoch: r.last_updated_at_ms,
            assigned_client: (client.first, client.second),
            message: r.message,
        }
    }
}

#[pymethods]
impl QueryTaskResponse {
    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={}-{}, type={}, status={}, assigned_client={}-{})",
            self.id.0,
            self.id.1,
            self.task_type as i32,
            self.status as i32,
            self.assigned_client.0,
            self.assigned_client.1
        )
    }
}

/// The nil id a failed create answers.
const NIL: (u64, u64) = (0, 0);

fn id_tuple(result: Result<TaskId, mooncake_client::StoreError>) -> ((u64, u64), i32) {
    match result {
        Ok(TaskId(id)) => ((id.first, id.second), 0),
        Err(error) => (NIL, code_of(&error)),
    }
}

impl Store {
    pub(crate) fn create_copy_task_impl(
        &self,
        py: Python<'_>,
        key: &str,
        targets: &[String],
    ) -> ((u64, u64), i32) {
        let Some(conn) = self.conn() else {
            return (NIL, NOT_READY);
        };
        py.allow_threads(|| id_tuple(conn.block_on(conn.client.create_copy_task(key, targets))))
    }

    pub(crate) fn create_move_task_impl(
        &self,
        py: Python<'_>,
        key: &str,
        source: &str,
        target: &str,
    ) -> ((u64, u64), i32) {
        let Some(conn) = self.conn() else {
            return (NIL, NOT_READY);
        };
        py.allow_threads(|| {
            id_tuple(conn.block_on(conn.client.create_move_task(key, source, target)))
        })
    }

    pub(crate) fn query_task_impl(
        &self,
        py: Python<'_>,
        task_id: (u64, u64),
    ) -> (Option<QueryTaskResponse>, i32) {
        let Some(conn) = self.conn() else {
            return (None, NOT_READY);
        };
        let id = TaskId::new(task_id.0, task_id.1);
        py.allow_threads(|| match conn.block_on(conn.client.query_task(id)) {
            Ok(response) => (Some(response.into()), 0),
            Err(error) => (None, code_of(&error)),
        })
    }
}
