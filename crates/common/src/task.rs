//! Copy/move tasks and replication responses (as upstream's master).

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, TaskId};
use crate::numbered::numbered_enum;
use crate::replica::ReplicaDescriptor;

numbered_enum!(
    /// What a client-executed task does (upstream numbers).
    TaskType: i32 (I32) {
        /// Copy the object's replica to new target segments (CopyStart/End).
        ReplicaCopy = 0 => "REPLICA_COPY",
        /// Move the replica from the source segment to the target (MoveStart/End).
        ReplicaMove = 1 => "REPLICA_MOVE",
    }
);

numbered_enum!(
    /// A task's state (upstream numbers: FAILED is 2, SUCCESS 3).
    TaskStatus: i32 (I32) {
        Pending = 0 => "PENDING",
        Processing = 1 => "PROCESSING",
        Failed = 2 => "FAILED",
        Success = 3 => "SUCCESS",
    }
);

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_numbers() {
        assert_eq!(TaskType::ReplicaCopy.as_number(), 0);
        assert_eq!(TaskType::ReplicaMove.as_number(), 1);
        assert_eq!(TaskStatus::Pending.as_number(), 0);
        assert_eq!(TaskStatus::Processing.as_number(), 1);
        assert_eq!(TaskStatus::Failed.as_number(), 2);
        assert_eq!(TaskStatus::Success.as_number(), 3);
        assert_eq!(TaskStatus::from_number(4), None);
        assert_eq!(TaskStatus::Success.name(), "SUCCESS");
    }
}
