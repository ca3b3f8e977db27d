//! Copy/move tasks and replication responses (spec/master.md §9, §12).

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, TaskId};
use crate::replica::ReplicaDescriptor;

/// What a client-executed task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskType {
    /// Copy the object's replica to new target segments (CopyStart/End).
    ReplicaCopy,
    /// Move the replica from the source segment to the target (MoveStart/End).
    ReplicaMove,
}

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskStatus {
    Pending,
    Processing,
    Success,
    Failed,
}

/// What FetchTasks hands a client: the work to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAssignment {
    pub id: TaskId,
    pub task_type: TaskType,
    pub key: String,
    pub tenant_id: String,
    /// Source segment name.
    pub source: String,
    /// Target segment names.
    pub targets: Vec<String>,
    pub created_at_ms: u64,
}

/// MarkTaskToComplete's argument.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCompleteRequest {
    pub id: TaskId,
    /// `Success` or `Failed`.
    pub status: TaskStatus,
    pub message: String,
}

/// QueryTask's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryTaskResponse {
    pub id: TaskId,
    pub task_type: TaskType,
    pub status: TaskStatus,
    pub created_at_ms: u64,
    pub last_updated_at_ms: u64,
    pub assigned_client: ClientId,
    pub message: String,
}

/// CopyStart's answer: the source replica to read and the new PROCESSING targets to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyStartResponse {
    pub source: ReplicaDescriptor,
    pub targets: Vec<ReplicaDescriptor>,
}

/// MoveStart's answer: the source, and the target unless it already held a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveStartResponse {
    pub source: ReplicaDescriptor,
    pub target: Option<ReplicaDescriptor>,
}
