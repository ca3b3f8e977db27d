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

numbered_enum!(
    /// A drain job's state (upstream's names, in its order).
    DrainJobStatus: i32 (I32) {
        Created = 0 => "CREATED",
        Planning = 1 => "PLANNING",
        Running = 2 => "RUNNING",
        Succeeded = 3 => "SUCCEEDED",
        Failed = 4 => "FAILED",
        Canceled = 5 => "CANCELED",
    }
);

// The enum comes from a macro that derives no `Default`.
#[allow(clippy::derivable_impls)]
impl Default for DrainJobStatus {
    fn default() -> Self {
        DrainJobStatus::Created
    }
}

/// What a drain job drains (upstream's CreateDrainJobRequest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainJobRequest {
    /// Segment names to drain.
    pub segments: Vec<String>,
    /// Segment names to move to (empty: any other OK segment).
    pub target_segments: Vec<String>,
    /// Upstream's limit of units in flight (default 4); must be at least 1. Tasks run on the
    /// source's owner, at most 16 at a time there.
    pub max_concurrency: u32,
}

/// A drain job's state and progress (upstream's query fields, plus totals).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainJobView {
    pub id: TaskId,
    pub status: DrainJobStatus,
    pub segments: Vec<String>,
    pub created_at_ms: u64,
    pub last_updated_at_ms: u64,
    /// Move tasks planned so far (one per object and pass).
    pub total_units: u64,
    pub succeeded_units: u64,
    pub failed_units: u64,
    /// Objects the last pass found no room for.
    pub blocked_units: u64,
    /// Tasks queued or running.
    pub active_units: u64,
    pub migrated_bytes: u64,
    /// Bytes of every planned task.
    pub total_bytes: u64,
    pub message: String,
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
