//! Types shared by every mooncake-rs crate: upstream's error codes, size units, ids, tenants,
//! replicate configs, replica descriptors, segments and clocks. Every type that an RPC will carry
//! implements serde's `Serialize`/`Deserialize`; enums that stand for upstream's numbers travel
//! as those numbers (`numbered`), never as their declaration index.
//!
//! This crate owns vocabulary only. It must never do I/O, spawn threads or depend on another
//! mooncake crate.
#![forbid(unsafe_code)]

pub mod auth;
pub mod clock;
pub mod config;
pub mod disk;
pub mod error;
pub mod ids;
pub mod numbered;
pub mod replica;
pub mod segment;
pub mod task;
pub mod tenant;
pub mod units;

pub use auth::{AuthToken, TokenError, AUTH_TOKEN_ENV, AUTH_TOKEN_FILE_ENV};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{DataType, ReplicateConfig, SoftPinAction};
pub use disk::{storage_key, DiskObject, OffloadOutcome, OffloadTask};
pub use error::ErrorCode;
pub use ids::{ClientId, IdParseError, ReplicaId, SegmentId, TaskId, Uuid};
pub use replica::{
    ClientStatus, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, MemoryDescriptor,
    ReplicaDescriptor, ReplicaKind, ReplicaStatus, ReplicaType, SegmentStatus,
};
pub use segment::{GetReplicaListResponse, ObjectMeta, PingResponse, Segment};
pub use task::{
    CopyStartResponse, DrainJobRequest, DrainJobStatus, DrainJobView, MoveStartResponse,
    QueryTaskResponse, TaskAssignment, TaskCompleteRequest, TaskStatus, TaskType,
};
pub use tenant::{TenantId, DEFAULT_TENANT};
pub use units::{format_size, parse_size, SizeParseError};
