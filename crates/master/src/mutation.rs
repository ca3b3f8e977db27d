//! The master's durable state as records, and the one seam every change to it passes through.
//!
//! A [`Mutation`] describes one change of durable state *after* it happened: an object's full
//! record, an erasure, a segment event, the tenant policy, the discarded list. A
//! [`MutationObserver`] installed on the master sees every mutation, in order, under the lock
//! that serialized the change; applying the observed sequence to an empty master
//! (`MasterService::apply`) rebuilds the same state (`MasterService::export_state` of both is
//! equal, allocators included). An op-log writer, a snapshotter and a hot standby are built on
//! that; docs/master.md ("The mutation seam") has the ordering rules.
//!
//! **What is state**: objects (everything in [`ObjectRecord`]), mounted segments with their status
//! and graceful-unmount deadline, the tenant policy, and the discarded buffers (they hold
//! allocator ranges, so allocators can only be rebuilt exactly with them).
//!
//! **What is not**, and why:
//! - read leases and last-access times: written by reads under a shard *read* lock (atomics);
//!   observing them would put a record on every read. A rebuilt object starts unleased, with its
//!   last access at the time it was applied.
//! - client liveness (ping queue, deadlines, the OK set, a client's host): it describes the
//!   connections of *this* process; after a take-over clients ping and re-mount again.
//! - the client task queue (`tasks.rs`): advisory work for clients that times out on its own; a
//!   copy or move once started is in its object's record.
//! - derived data: effective quotas and charges (from the policy, the capacity and the objects),
//!   group routes (from the objects' groups), the soft-pin heap (from the objects' deadlines),
//!   placement sets and capacity (from the segments), the need-eviction flag.
//! - replicas on a segment whose allocator is gone: a record lists only valid replicas, and an
//!   object with none is an [`Mutation::Erase`]. The lazy drop of such replicas emits nothing
//!   ([`Mutation::SegmentUnmounted`] already implies it).

use mooncake_common::{
    ClientId, DataType, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, ReplicaId,
    ReplicaStatus, Segment, SegmentId, SegmentStatus, SoftPinAction, TenantId,
};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};

use crate::allocator::BufferHandle;
use crate::index::Tenant;
use crate::object::ObjectEntry;
use crate::quota::TenantPolicy;

/// One change of the master's durable state, as it is after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// The object's full durable state after a change (created, written, completed, pinned,
    /// replicas added or dropped, task started or ended).
    Object(ObjectRecord),
    /// The object is gone. Applying it to a master without the key is a no-op.
    Erase {
        tenant: Option<TenantId>,
        key: String,
    },
    /// A segment was mounted (MountSegment, or a segment ReMountSegment mounted afresh).
    SegmentMounted { segment: Segment, client: ClientId },
    /// A drain-job status change (OK ⇄ DRAINING → DRAINED).
    SegmentStatus {
        id: SegmentId,
        status: SegmentStatus,
    },
    /// A graceful unmount started: the segment leaves placement and is unmounted at the deadline.
    GracefulUnmount {
        id: SegmentId,
        client: ClientId,
        deadline_ms: u64,
    },
    /// A segment was unmounted (by the RPC, a graceful deadline or its client's death): every
    /// replica on it is gone, objects left with none are erased, its discarded buffers too.
    SegmentUnmounted { id: SegmentId },
    /// The tenant policy changed (loaded, or a quota set or deleted).
    TenantPolicy(TenantPolicy),
    /// Buffers moved to the discarded list (a pre-empted or timed-out put, an upsert's old
    /// value). Observed after the change of the object they came from.
    Discarded(DiscardedRecord),
    /// Every discarded entry with `release_at_ms <= up_to_ms` was freed.
    DiscardedReleased { up_to_ms: u64 },
}

/// A buffer: `len` bytes at `offset` from its segment's base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BufferRecord {
    pub segment: SegmentId,
    pub offset: u64,
    pub len: u64,
}

/// Where a replica lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaPlace {
    Memory(BufferRecord),
    NoF(BufferRecord),
    Disk(DiskDescriptor),
    LocalDisk(LocalDiskDescriptor),
    Dfs(DfsDescriptor),
}

impl ReplicaPlace {
    /// The buffer of a memory-like replica.
    pub fn buffer(&self) -> Option<&BufferRecord> {
        match self {
            ReplicaPlace::Memory(b) | ReplicaPlace::NoF(b) => Some(b),
            _ => None,
        }
    }
}

/// One replica of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub id: ReplicaId,
    pub status: ReplicaStatus,
    /// Readers pinning it (a copy or move source).
    pub refcnt: u32,
    pub place: ReplicaPlace,
}

/// A soft-pin request waiting for the PutEnd that completes the first replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSoftPinRecord {
    pub action: SoftPinAction,
    pub ttl_ms: u64,
}

/// Which kind of replication task holds an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicationKind {
    Copy,
    Move,
}

/// A copy or move in flight (CopyStart/MoveStart until End, Revoke or the reaper).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationRecord {
    pub client: ClientId,
    pub start_ms: u64,
    pub kind: ReplicationKind,
    pub source: ReplicaId,
    pub targets: Vec<ReplicaId>,
}

/// An object's full durable state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// `None` = the default tenant.
    pub tenant: Option<TenantId>,
    pub key: String,
    pub size: u64,
    pub checksum: Option<u64>,
    pub data_type: DataType,
    pub group: Option<String>,
    /// The writer (only it may End or Revoke).
    pub writer: ClientId,
    pub put_start_ms: u64,
    /// A put or upsert is in flight.
    pub processing: bool,
    pub hard_pin: bool,
    /// 0 = not soft-pinned.
    pub soft_pin_deadline_ms: u64,
    pub pending_soft_pin: Option<PendingSoftPinRecord>,
    /// Valid replicas only, in the object's order; never empty.
    pub replicas: Vec<ReplicaRecord>,
    pub task: Option<ReplicationRecord>,
}

/// A mounted segment (not one being unmounted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    pub segment: Segment,
    pub client: ClientId,
    pub status: SegmentStatus,
    /// Set while gracefully unmounting.
    pub graceful_deadline_ms: Option<u64>,
}

/// One entry of the discarded list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscardedRecord {
    pub release_at_ms: u64,
    pub buffers: Vec<BufferRecord>,
}

/// Everything durable, as `MasterService::export_state` returns it: segments by id, objects by
/// `(tenant, key)`, the discarded list in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterState {
    pub segments: Vec<SegmentRecord>,
    pub objects: Vec<ObjectRecord>,
    pub discarded: Vec<DiscardedRecord>,
    pub tenant_policy: TenantPolicy,
    /// The next replica id the master will hand out.
    pub next_replica_id: u64,
}

/// Sees every mutation of a master, in order (see the module doc). Called with the master's
/// locks held: it must be quick and must not call back into the master. Without an observer the
/// master builds no record at all.
pub trait MutationObserver: Send + Sync {
    fn observe(&self, mutation: &Mutation);

    /// Space became allocatable again: buffers were freed, or a segment was mounted (a mount
    /// after an unmount gives back the range the unmount's objects held). Called before the
    /// space can be allocated, after the change that freed it was observed, possibly with an
    /// allocator's lock held: it must be quick.
    fn space_freed(&self) {}
}

/// The master's observer, shared with its allocators so that they can report freed space
/// ([`MutationObserver::space_freed`]); empty until `MasterService::set_observer`.
#[derive(Clone, Default)]
pub(crate) struct ObserverSlot(Arc<OnceLock<Arc<dyn MutationObserver>>>);

impl ObserverSlot {
    pub fn get(&self) -> Option<&Arc<dyn MutationObserver>> {
        self.0.get()
    }

    /// Installs `observer`; `Err` when one is installed already.
    pub fn set(&self, observer: Arc<dyn MutationObserver>) -> Result<(), ()> {
        self.0.set(observer).map_err(|_| ())
    }

    /// Tells the observer, if any, that space became allocatable.
    pub fn space_freed(&self) {
        if let Some(o) = self.0.get() {
            o.space_freed();
        }
    }
}

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserverSlot")
            .field("installed", &self.0.get().is_some())
            .finish()
    }
}

impl ObjectRecord {
    /// The record of `entry` as an export sees it: only valid replicas (`live` maps a buffer to
    /// its segment when that segment is mounted and alive); `None` when no valid replica is left.
    pub(crate) fn of(
        tenant: Tenant<'_>,
        entry: &ObjectEntry,
        live: &dyn Fn(&BufferHandle) -> Option<SegmentId>,
    ) -> Option<Self> {
        crate::export::ObjectView::of(tenant, entry, &mut |h| live(h)).map(|v| v.to_record())
    }
}
