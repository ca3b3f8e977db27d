//! Borrowed views of the live objects, read one shard at a time: what a snapshot encodes
//! straight from the index, with no owned record built per object.
//!
//! An [`ObjectView`] says exactly what an [`ObjectRecord`] says (`ObjectView::to_record` and
//! `ObjectRecord::view` convert both ways), but borrows the key, group, descriptors and task
//! targets from the entry (or the record) instead of copying them; its replicas sit inline for
//! up to two. [`MasterService::visit_shard`] hands out the views of one shard under that
//! shard's read lock.

use mooncake_common::{
    ClientId, DataType, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, ReplicaId,
    ReplicaStatus, SegmentId, TenantId,
};
use smallvec::SmallVec;
use std::sync::Arc;

use crate::allocator::{BufferHandle, SegmentAllocator};
use crate::handle::MasterService;
use crate::index::{Tenant, SHARD_COUNT};
use crate::mutation::{
    BufferRecord, ObjectRecord, PendingSoftPinRecord, ReplicaPlace, ReplicaRecord, ReplicationKind,
    ReplicationRecord,
};
use crate::object::{ObjectEntry, Place, TaskKind, FLAG_HARD_PIN};
use crate::segments::Segments;

/// Where a replica lives, borrowed ([`ReplicaPlace`] without the copies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceView<'a> {
    Memory(BufferRecord),
    NoF(BufferRecord),
    Disk(&'a DiskDescriptor),
    LocalDisk(&'a LocalDiskDescriptor),
    Dfs(&'a DfsDescriptor),
}

impl PlaceView<'_> {
    /// The buffer of a memory-like replica.
    pub fn buffer(&self) -> Option<&BufferRecord> {
        match self {
            PlaceView::Memory(b) | PlaceView::NoF(b) => Some(b),
            _ => None,
        }
    }

    fn to_place(self) -> ReplicaPlace {
        match self {
            PlaceView::Memory(b) => ReplicaPlace::Memory(b),
            PlaceView::NoF(b) => ReplicaPlace::NoF(b),
            PlaceView::Disk(d) => ReplicaPlace::Disk(d.clone()),
            PlaceView::LocalDisk(d) => ReplicaPlace::LocalDisk(d.clone()),
            PlaceView::Dfs(d) => ReplicaPlace::Dfs(d.clone()),
        }
    }
}

/// One replica, borrowed ([`ReplicaRecord`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaView<'a> {
    pub id: ReplicaId,
    pub status: ReplicaStatus,
    pub refcnt: u32,
    pub place: PlaceView<'a>,
}

/// A copy or move in flight, borrowed ([`ReplicationRecord`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskView<'a> {
    pub client: ClientId,
    pub start_ms: u64,
    pub kind: ReplicationKind,
    pub source: ReplicaId,
    pub targets: &'a [ReplicaId],
}

/// One object's durable state, borrowed ([`ObjectRecord`]; the fields mean the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectView<'a> {
    /// `None` = the default tenant.
    pub tenant: Option<&'a str>,
    pub key: &'a str,
    pub size: u64,
    pub checksum: Option<u64>,
    pub data_type: DataType,
    pub group: Option<&'a str>,
    pub writer: ClientId,
    pub put_start_ms: u64,
    pub processing: bool,
    pub hard_pin: bool,
    /// 0 = not soft-pinned.
    pub soft_pin_deadline_ms: u64,
    pub pending_soft_pin: Option<PendingSoftPinRecord>,
    /// Valid replicas only, in the object's order; never empty.
    pub replicas: SmallVec<[ReplicaView<'a>; 2]>,
    pub task: Option<TaskView<'a>>,
}

impl<'a> ObjectView<'a> {
    /// The view of `entry` as an export sees it: only valid replicas (`live` maps a buffer to
    /// its segment when that segment is mounted and alive); `None` when no valid replica is left.
    pub(crate) fn of(
        tenant: Tenant<'a>,
        entry: &'a ObjectEntry,
        live: &mut dyn FnMut(&BufferHandle) -> Option<SegmentId>,
    ) -> Option<Self> {
        let m = &entry.meta;
        if m.size == 0 {
            return None;
        }
        let mut replicas = SmallVec::new();
        for r in &m.replicas {
            let mut buffer = |h: &BufferHandle| {
                live(h).map(|segment| BufferRecord {
                    segment,
                    offset: h.offset(),
                    len: h.len(),
                })
            };
            let place = match r.data.place() {
                Place::Memory(h) => match buffer(h) {
                    Some(b) => PlaceView::Memory(b),
                    None => continue,
                },
                Place::NoF(h) => match buffer(h) {
                    Some(b) => PlaceView::NoF(b),
                    None => continue,
                },
                Place::Disk(d) => PlaceView::Disk(d),
                Place::LocalDisk(d) => PlaceView::LocalDisk(d),
                Place::Dfs(d) => PlaceView::Dfs(d),
            };
            replicas.push(ReplicaView {
                id: r.id,
                status: r.status,
                refcnt: u32::from(r.refcnt),
                place,
            });
        }
        if replicas.is_empty() {
            return None;
        }
        let extra = m.extra.as_deref();
        Some(ObjectView {
            tenant: match tenant {
                Tenant::Default => None,
                Tenant::Named(t) => Some(t),
            },
            key: entry.key.as_str(),
            size: m.size,
            checksum: m.checksum(),
            data_type: m.data_type,
            group: m.group(),
            writer: m.writer.client(),
            put_start_ms: m.put_start_ms(),
            processing: m.is_processing(),
            hard_pin: m.has(FLAG_HARD_PIN),
            soft_pin_deadline_ms: m.soft_pin_deadline_ms(),
            pending_soft_pin: extra.and_then(|e| e.pending_soft_pin).map(|p| {
                PendingSoftPinRecord {
                    action: p.action,
                    ttl_ms: p.ttl_ms,
                }
            }),
            replicas,
            task: m.task().map(|t| TaskView {
                client: t.client,
                start_ms: t.start_ms,
                kind: match t.kind {
                    TaskKind::Copy => ReplicationKind::Copy,
                    TaskKind::Move => ReplicationKind::Move,
                },
                source: t.source,
                targets: &t.targets,
            }),
        })
    }

    /// The owned record.
    pub fn to_record(&self) -> ObjectRecord {
        ObjectRecord {
            tenant: self.tenant.and_then(|t| TenantId::new(t).ok()),
            key: self.key.to_string(),
            size: self.size,
            checksum: self.checksum,
            data_type: self.data_type,
            group: self.group.map(str::to_string),
            writer: self.writer,
            put_start_ms: self.put_start_ms,
            processing: self.processing,
            hard_pin: self.hard_pin,
            soft_pin_deadline_ms: self.soft_pin_deadline_ms,
            pending_soft_pin: self.pending_soft_pin,
            replicas: self
                .replicas
                .iter()
                .map(|r| ReplicaRecord {
                    id: r.id,
                    status: r.status,
                    refcnt: r.refcnt,
                    place: r.place.to_place(),
                })
                .collect(),
            task: self.task.map(|t| ReplicationRecord {
                client: t.client,
                start_ms: t.start_ms,
                kind: t.kind,
                source: t.source,
                targets: t.targets.to_vec(),
            }),
        }
    }
}

impl ObjectRecord {
    /// The record as a view (borrowing its strings and descriptors).
    pub fn view(&self) -> ObjectView<'_> {
        ObjectView {
            tenant: self.tenant.as_ref().map(TenantId::as_str),
            key: &self.key,
            size: self.size,
            checksum: self.checksum,
            data_type: self.data_type,
            group: self.group.as_deref(),
            writer: self.writer,
            put_start_ms: self.put_start_ms,
            processing: self.processing,
            hard_pin: self.hard_pin,
            soft_pin_deadline_ms: self.soft_pin_deadline_ms,
            pending_soft_pin: self.pending_soft_pin,
            replicas: self
                .replicas
                .iter()
                .map(|r| ReplicaView {
                    id: r.id,
                    status: r.status,
                    refcnt: r.refcnt,
                    place: match &r.place {
                        ReplicaPlace::Memory(b) => PlaceView::Memory(*b),
                        ReplicaPlace::NoF(b) => PlaceView::NoF(*b),
                        ReplicaPlace::Disk(d) => PlaceView::Disk(d),
                        ReplicaPlace::LocalDisk(d) => PlaceView::LocalDisk(d),
                        ReplicaPlace::Dfs(d) => PlaceView::Dfs(d),
                    },
                })
                .collect(),
            task: self.task.as_ref().map(|t| TaskView {
                client: t.client,
                start_ms: t.start_ms,
                kind: t.kind,
                source: t.source,
                targets: &t.targets,
            }),
        }
    }
}

/// Maps buffers to their live segment like `Segments::live_segment_of`, without touching the
/// allocator's reference count: the mounted allocators are listed once, and a handle is matched
/// by pointer (the one matched last is tried first).
pub(crate) struct LiveSegments<'a> {
    live: Vec<(&'a Arc<SegmentAllocator>, SegmentId)>,
    last: usize,
}

impl<'a> LiveSegments<'a> {
    pub(crate) fn new(segs: &'a Segments) -> Self {
        let live = segs
            .mounted
            .iter()
            .filter_map(|(id, s)| s.allocator.as_ref().map(|a| (a, *id)))
            .collect();
        LiveSegments { live, last: 0 }
    }

    /// The segment `h` lives in, if it is mounted with this very allocator alive.
    pub(crate) fn of(&mut self, h: &BufferHandle) -> Option<SegmentId> {
        if let Some(&(a, id)) = self.live.get(self.last) {
            if h.belongs_to(a) {
                return Some(id);
            }
        }
        let i = self.live.iter().position(|&(a, _)| h.belongs_to(a))?;
        self.last = i;
        Some(self.live[i].1)
    }
}

impl MasterService {
    /// Calls `f` with the view of every object of shard `shard` (`0..SHARD_COUNT`) that has a
    /// valid replica, in the shard table's order, under that shard's read lock (and the
    /// segments' read lock): `f` must be quick and must not call into the master. Returns the
    /// number of views handed out. The views are that shard's state at one instant.
    pub fn visit_shard(&self, shard: usize, mut f: impl FnMut(&ObjectView<'_>)) -> usize {
        if shard >= SHARD_COUNT {
            return 0;
        }
        let guard = self.index.shard_at(shard).read();
        if guard.tenants().all(|(_, s)| s.len() == 0) {
            return 0;
        }
        let segs = self.segments.inner.read();
        let mut live = LiveSegments::new(&segs);
        let mut live = |h: &BufferHandle| live.of(h);
        let mut n = 0;
        for (tenant, state) in guard.tenants() {
            let mut ahead = state.ahead();
            for entry in state.objects.iter() {
                ahead.step();
                if let Some(view) = ObjectView::of(tenant, entry, &mut live) {
                    f(&view);
                    n += 1;
                }
            }
        }
        n
    }
}
