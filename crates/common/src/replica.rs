//! Replica kinds, statuses and the descriptors the master hands to clients.
//!
//! A descriptor tells a client where one copy of an object lives. Memory and NoF descriptors carry
//! the segment's transfer endpoint and protocol as shared strings (`Arc<str>`), so building one on
//! the read path costs a reference-count increment, not a string copy.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, ReplicaId};
use crate::numbered::numbered_enum;

numbered_enum!(
    /// Medium of a replica (upstream numbers). `ALL` is only a PutEnd/PutRevoke selector meaning
    /// MEMORY + NoF + DFS; it does not include DISK or LOCAL_DISK.
    ReplicaType: i32 (I32) {
        MEMORY = 0,
        DISK = 1,
        LOCAL_DISK = 2,
        NOF_SSD = 3,
        ALL = 4,
        DFS = 100,
    }
);

numbered_enum!(
    /// A replica's state. The master creates MEMORY/NoF/DISK/DFS replicas PROCESSING and flips them
    /// to COMPLETE at PutEnd; INITIALIZED and FAILED exist for wire compatibility only.
    ReplicaStatus: i32 (I32) {
        UNDEFINED = 0,
        INITIALIZED = 1,
        PROCESSING = 2,
        COMPLETE = 3,
        REMOVED = 4,
        FAILED = 5,
    }
);

numbered_enum!(
    /// A mounted segment's state. Only OK segments take new allocations.
    SegmentStatus: i32 (I32) {
        UNDEFINED = 0,
        OK = 1,
        DRAINING = 2,
        DRAINED = 3,
        GRACEFULLY_UNMOUNTING = 4,
        UNMOUNTING = 5,
    }
);

numbered_enum!(
    /// What a Ping tells a client: OK, or re-mount your segments.
    ClientStatus: i32 (I32) {
        UNDEFINED = 0,
        OK = 1,
        NEED_REMOUNT = 2,
    }
);

impl ReplicaType {
    /// True if a PutEnd/PutRevoke with selector `self` targets a replica of type `replica`.
    pub fn selects(self, replica: ReplicaType) -> bool {
        match self {
            ReplicaType::ALL => matches!(
                replica,
                ReplicaType::MEMORY | ReplicaType::NOF_SSD | ReplicaType::DFS
            ),
            other => other == replica,
        }
    }
}

/// Where a MEMORY or NoF replica's bytes are: `buffer_address` in the segment that
/// `transport_endpoint` serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryDescriptor {
    /// Object size in bytes (the buffer's length).
    pub size: u64,
    /// Absolute address: segment base + offset.
    pub buffer_address: u64,
    /// Transport protocol of the segment (`"tcp"`, `"cxl"`, …).
    pub protocol: Arc<str>,
    /// The segment's transfer-engine endpoint.
    pub transport_endpoint: Arc<str>,
}

/// A DISK replica: a file under the master's `root_fs_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskDescriptor {
    pub file_path: String,
    pub object_size: u64,
}

/// A LOCAL_DISK replica: on a client's local SSD tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalDiskDescriptor {
    pub client_id: ClientId,
    pub object_size: u64,
    pub transport_endpoint: String,
}

/// A DFS replica: a range in a shared file-system file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DfsDescriptor {
    pub file_path: String,
    pub offset: u64,
    pub object_size: u64,
    pub aligned_size: u64,
    pub shard_idx: u32,
}

/// The medium-specific part of a descriptor, in upstream's variant order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaKind {
    Memory(MemoryDescriptor),
    NoF(MemoryDescriptor),
    Disk(DiskDescriptor),
    LocalDisk(LocalDiskDescriptor),
    Dfs(DfsDescriptor),
}

impl ReplicaKind {
    /// The replica's medium.
    pub fn replica_type(&self) -> ReplicaType {
        match self {
            ReplicaKind::Memory(_) => ReplicaType::MEMORY,
            ReplicaKind::NoF(_) => ReplicaType::NOF_SSD,
            ReplicaKind::Disk(_) => ReplicaType::DISK,
            ReplicaKind::LocalDisk(_) => ReplicaType::LOCAL_DISK,
            ReplicaKind::Dfs(_) => ReplicaType::DFS,
        }
    }
}

/// One replica as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDescriptor {
    pub id: ReplicaId,
    pub status: ReplicaStatus,
    pub kind: ReplicaKind,
}

impl ReplicaDescriptor {
    /// The memory (or NoF) location, if this is a memory-like replica.
    pub fn memory(&self) -> Option<&MemoryDescriptor> {
        match &self.kind {
            ReplicaKind::Memory(m) | ReplicaKind::NoF(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_numbers() {
        assert_eq!(ReplicaType::DFS.as_number(), 100);
        assert_eq!(ReplicaType::ALL.as_number(), 4);
        assert_eq!(ReplicaStatus::COMPLETE.as_number(), 3);
        assert_eq!(ReplicaStatus::FAILED.as_number(), 5);
        assert_eq!(SegmentStatus::GRACEFULLY_UNMOUNTING.as_number(), 4);
        assert_eq!(SegmentStatus::UNMOUNTING.as_number(), 5);
        assert_eq!(ClientStatus::NEED_REMOUNT.as_number(), 2);
        for t in ReplicaType::VALUES {
            assert_eq!(ReplicaType::from_number(t.as_number()), Some(*t));
        }
        assert_eq!(ReplicaType::from_number(5), None);
    }

    #[test]
    fn all_selector_excludes_disk_kinds() {
        assert!(ReplicaType::ALL.selects(ReplicaType::MEMORY));
        assert!(ReplicaType::ALL.selects(ReplicaType::NOF_SSD));
        assert!(ReplicaType::ALL.selects(ReplicaType::DFS));
        assert!(!ReplicaType::ALL.selects(ReplicaType::DISK));
        assert!(!ReplicaType::ALL.selects(ReplicaType::LOCAL_DISK));
        assert!(ReplicaType::DISK.selects(ReplicaType::DISK));
        assert!(!ReplicaType::MEMORY.selects(ReplicaType::NOF_SSD));
    }

    #[test]
    fn descriptors_round_trip_through_serde() {
        let d = ReplicaDescriptor {
            id: ReplicaId(7),
            status: ReplicaStatus::COMPLETE,
            kind: ReplicaKind::Memory(MemoryDescriptor {
                size: 4096,
                buffer_address: 0x1000,
                protocol: Arc::from("tcp"),
                transport_endpoint: Arc::from("10.0.0.1:1234"),
            }),
        };
        let text = serde_json::to_string(&d).unwrap_or_default();
        let back: Option<ReplicaDescriptor> = serde_json::from_str(&text).ok();
        assert_eq!(back.as_ref(), Some(&d), "{text}");
        assert_eq!(d.memory().map(|m| m.size), Some(4096));
        assert_eq!(d.kind.replica_type(), ReplicaType::MEMORY);
        let dfs = ReplicaKind::Dfs(DfsDescriptor {
            file_path: "/x".into(),
            offset: 1,
            object_size: 2,
            aligned_size: 4,
            shard_idx: 0,
        });
        let text = serde_json::to_string(&dfs).unwrap_or_default();
        assert_eq!(serde_json::from_str::<ReplicaKind>(&text).ok(), Some(dfs));
    }
}
