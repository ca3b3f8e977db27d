//! Record encodings inside chunk payloads (docs/snapshot.md, "Records"): objects (with the
//! chunk's id table), segments, discarded entries, tenant quotas, the counters.

use std::collections::HashMap;

use mooncake_common::ids::Uuid;
use mooncake_common::{
    ClientId, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, ReplicaId, ReplicaStatus,
    Segment, SegmentId, SegmentStatus, SoftPinAction, TenantId,
};
use mooncake_master::mutation::{
    BufferRecord, DiscardedRecord, PendingSoftPinRecord, ReplicaPlace, ReplicaRecord,
    ReplicationKind, ReplicationRecord, SegmentRecord,
};
use mooncake_master::{ObjectRecord, ObjectView, PlaceView};

use crate::wire::{put_str, put_uuid, put_varint, Reader};
use crate::SnapshotError;

/// Object flag bits (the record's first byte).
pub(crate) const F_TENANT: u8 = 0x01;
pub(crate) const F_CHECKSUM: u8 = 0x02;
pub(crate) const F_GROUP: u8 = 0x04;
pub(crate) const F_PROCESSING: u8 = 0x08;
pub(crate) const F_HARD_PIN: u8 = 0x10;
pub(crate) const F_SOFT_PIN: u8 = 0x20;
pub(crate) const F_PENDING_SOFT_PIN: u8 = 0x40;
pub(crate) const F_TASK: u8 = 0x80;

/// Replica place tags.
const PLACE_MEMORY: u8 = 0;
const PLACE_NOF: u8 = 1;
const PLACE_DISK: u8 = 2;
const PLACE_LOCAL_DISK: u8 = 3;
const PLACE_DFS: u8 = 4;

/// Most entries an id table, a replica list or a target list may have.
const MAX_LIST: usize = 1 << 24;

/// The ids (clients and segments) one object chunk refers to, by index. A chunk usually names a
/// few dozen (the writers and the segments): those are found by a scan, the one found last
/// tried first; past [`IdTable::SCAN`] ids a map takes over.
#[derive(Debug, Default)]
pub(crate) struct IdTable {
    ids: Vec<Uuid>,
    index: HashMap<Uuid, u32>,
    last: u32,
}

impl IdTable {
    const SCAN: usize = 64;

    fn index_of(&mut self, id: Uuid) -> u32 {
        if self.ids.get(self.last as usize) == Some(&id) {
            return self.last;
        }
        let found = if self.ids.len() <= Self::SCAN {
            self.ids.iter().position(|x| *x == id).map(|i| i as u32)
        } else {
            self.index.get(&id).copied()
        };
        let i = found.unwrap_or_else(|| {
            let i = self.ids.len() as u32;
            self.ids.push(id);
            if self.ids.len() == Self::SCAN + 1 {
                self.index = self
                    .ids
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (*x, i as u32))
                    .collect();
            } else if self.ids.len() > Self::SCAN + 1 {
                self.index.insert(id, i);
            }
            i
        });
        self.last = i;
        i
    }

    /// Writes the table: count, then each id.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        put_varint(out, self.ids.len() as u64);
        for id in &self.ids {
            put_uuid(out, *id);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.ids.clear();
        self.index.clear();
        self.last = 0;
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Vec<Uuid>, SnapshotError> {
        let n = r.count(MAX_LIST, 16)?;
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            ids.push(r.uuid()?);
        }
        Ok(ids)
    }
}

fn put_ref(out: &mut Vec<u8>, table: &mut IdTable, id: Uuid) {
    put_varint(out, u64::from(table.index_of(id)));
}

fn read_ref(r: &mut Reader<'_>, ids: &[Uuid]) -> Result<Uuid, SnapshotError> {
    let i = r.varint()?;
    usize::try_from(i)
        .ok()
        .and_then(|i| ids.get(i).copied())
        .ok_or_else(|| r.err(format!("id index {i} outside the table of {}", ids.len())))
}

fn put_buffer(out: &mut Vec<u8>, table: &mut IdTable, b: &BufferRecord) {
    put_ref(out, table, b.segment.0);
    put_varint(out, b.offset);
    put_varint(out, b.len);
}

fn read_buffer(r: &mut Reader<'_>, ids: &[Uuid]) -> Result<BufferRecord, SnapshotError> {
    Ok(BufferRecord {
        segment: SegmentId(read_ref(r, ids)?),
        offset: r.varint()?,
        len: r.varint()?,
    })
}

fn put_place(out: &mut Vec<u8>, table: &mut IdTable, place: &PlaceView<'_>) {
    match place {
        PlaceView::Memory(b) => {
            out.push(PLACE_MEMORY);
            put_buffer(out, table, b);
        }
        PlaceView::NoF(b) => {
            out.push(PLACE_NOF);
            put_buffer(out, table, b);
        }
        PlaceView::Disk(d) => {
            out.push(PLACE_DISK);
            put_str(out, &d.file_path);
            put_varint(out, d.object_size);
        }
        PlaceView::LocalDisk(d) => {
            out.push(PLACE_LOCAL_DISK);
            put_ref(out, table, d.client_id.0);
            put_varint(out, d.object_size);
            put_str(out, &d.transport_endpoint);
        }
        PlaceView::Dfs(d) => {
            out.push(PLACE_DFS);
            put_str(out, &d.file_path);
            put_varint(out, d.offset);
            put_varint(out, d.object_size);
            put_varint(out, d.aligned_size);
            put_varint(out, u64::from(d.shard_idx));
        }
    }
}

fn read_place(r: &mut Reader<'_>, ids: &[Uuid]) -> Result<ReplicaPlace, SnapshotError> {
    Ok(match r.u8()? {
        PLACE_MEMORY => ReplicaPlace::Memory(read_buffer(r, ids)?),
        PLACE_NOF => ReplicaPlace::NoF(read_buffer(r, ids)?),
        PLACE_DISK => ReplicaPlace::Disk(DiskDescriptor {
            file_path: r.string()?,
            object_size: r.varint()?,
        }),
        PLACE_LOCAL_DISK => ReplicaPlace::LocalDisk(LocalDiskDescriptor {
            client_id: ClientId(read_ref(r, ids)?),
            object_size: r.varint()?,
            transport_endpoint: r.string()?,
        }),
        PLACE_DFS => ReplicaPlace::Dfs(DfsDescriptor {
            file_path: r.string()?,
            offset: r.varint()?,
            object_size: r.varint()?,
            aligned_size: r.varint()?,
            shard_idx: r.varint_u32()?,
        }),
        t => return Err(r.err(format!("unknown replica place tag {t}"))),
    })
}

fn replica_status(r: &Reader<'_>, b: u8) -> Result<ReplicaStatus, SnapshotError> {
    ReplicaStatus::from_number(i32::from(b)).ok_or_else(|| r.err(format!("replica status {b}")))
}

/// Appends one object record; ids go through `table`.
pub(crate) fn put_object(out: &mut Vec<u8>, table: &mut IdTable, o: &ObjectView<'_>) {
    let mut flags = 0u8;
    let set = |flags: &mut u8, bit: u8, on: bool| {
        if on {
            *flags |= bit;
        }
    };
    set(&mut flags, F_TENANT, o.tenant.is_some());
    set(&mut flags, F_CHECKSUM, o.checksum.is_some());
    set(&mut flags, F_GROUP, o.group.is_some());
    set(&mut flags, F_PROCESSING, o.processing);
    set(&mut flags, F_HARD_PIN, o.hard_pin);
    set(&mut flags, F_SOFT_PIN, o.soft_pin_deadline_ms != 0);
    set(&mut flags, F_PENDING_SOFT_PIN, o.pending_soft_pin.is_some());
    set(&mut flags, F_TASK, o.task.is_some());
    out.push(flags);
    if let Some(t) = o.tenant {
        put_str(out, t);
    }
    put_str(out, o.key);
    put_varint(out, o.size);
    if let Some(c) = o.checksum {
        out.extend_from_slice(&c.to_le_bytes());
    }
    out.push(o.data_type);
    if let Some(g) = o.group {
        put_str(out, g);
    }
    put_ref(out, table, o.writer.0);
    put_varint(out, o.put_start_ms);
    if o.soft_pin_deadline_ms != 0 {
        put_varint(out, o.soft_pin_deadline_ms);
    }
    if let Some(p) = o.pending_soft_pin {
        out.push(p.action.as_u8());
        put_varint(out, p.ttl_ms);
    }
    put_varint(out, o.replicas.len() as u64);
    for rep in &o.replicas {
        put_varint(out, rep.id.0);
        out.push(rep.status.as_number() as u8);
        put_varint(out, u64::from(rep.refcnt));
        put_place(out, table, &rep.place);
    }
    if let Some(t) = &o.task {
        put_ref(out, table, t.client.0);
        put_varint(out, t.start_ms);
        out.push(match t.kind {
            ReplicationKind::Copy => 0,
            ReplicationKind::Move => 1,
        });
        put_varint(out, t.source.0);
        put_varint(out, t.targets.len() as u64);
        for id in t.targets {
            put_varint(out, id.0);
        }
    }
}

/// Reads one object record. `last_tenant` is the previous record's tenant (records of one
/// tenant share one name allocation).
pub(crate) fn read_object(
    r: &mut Reader<'_>,
    ids: &[Uuid],
    last_tenant: &mut Option<TenantId>,
) -> Result<ObjectRecord, SnapshotError> {
    let flags = r.u8()?;
    let tenant = if flags & F_TENANT != 0 {
        let name = r.str()?;
        match last_tenant {
            Some(t) if t.as_str() == name => Some(t.clone()),
            _ => {
                let t = TenantId::new(name)
                    .map_err(|_| r.err(format!("invalid tenant name {name:?}")))?;
                *last_tenant = Some(t.clone());
                Some(t)
            }
        }
    } else {
        None
    };
    let key = r.string()?;
    let size = r.varint()?;
    let checksum = if flags & F_CHECKSUM != 0 {
        Some(r.u64_le()?)
    } else {
        None
    };
    let data_type = r.u8()?;
    let group = if flags & F_GROUP != 0 {
        Some(r.string()?)
    } else {
        None
    };
    let writer = ClientId(read_ref(r, ids)?);
    let put_start_ms = r.varint()?;
    let soft_pin_deadline_ms = if flags & F_SOFT_PIN != 0 {
        match r.varint()? {
            0 => return Err(r.err("soft-pin flag with a zero deadline")),
            d => d,
        }
    } else {
        0
    };
    let pending_soft_pin = if flags & F_PENDING_SOFT_PIN != 0 {
        let b = r.u8()?;
        let action =
            SoftPinAction::from_u8(b).ok_or_else(|| r.err(format!("soft-pin action {b}")))?;
        Some(PendingSoftPinRecord {
            action,
            ttl_ms: r.varint()?,
        })
    } else {
        None
    };
    // A replica takes at least 5 bytes (id, status, refcnt, tag, one place byte).
    let n = r.count(MAX_LIST, 5)?;
    let mut replicas = Vec::with_capacity(n);
    for _ in 0..n {
        let id = ReplicaId(r.varint()?);
        let b = r.u8()?;
        let status = replica_status(r, b)?;
        let refcnt = r.varint_u32()?;
        let place = read_place(r, ids)?;
        replicas.push(ReplicaRecord {
            id,
            status,
            refcnt,
            place,
        });
    }
    let task = if flags & F_TASK != 0 {
        let client = ClientId(read_ref(r, ids)?);
        let start_ms = r.varint()?;
        let kind = match r.u8()? {
            0 => ReplicationKind::Copy,
            1 => ReplicationKind::Move,
            k => return Err(r.err(format!("replication kind {k}"))),
        };
        let source = ReplicaId(r.varint()?);
        let n = r.count(MAX_LIST, 1)?;
        let mut targets = Vec::with_capacity(n);
        for _ in 0..n {
            targets.push(ReplicaId(r.varint()?));
        }
        Some(ReplicationRecord {
            client,
            start_ms,
            kind,
            source,
            targets,
        })
    } else {
        None
    };
    Ok(ObjectRecord {
        tenant,
        key,
        size,
        checksum,
        data_type,
        group,
        writer,
        put_start_ms,
        processing: flags & F_PROCESSING != 0,
        hard_pin: flags & F_HARD_PIN != 0,
        soft_pin_deadline_ms,
        pending_soft_pin,
        replicas,
        task,
    })
}

pub(crate) fn put_segment(out: &mut Vec<u8>, s: &SegmentRecord) {
    let seg = &s.segment;
    put_uuid(out, seg.id.0);
    put_str(out, &seg.name);
    put_varint(out, seg.base);
    put_varint(out, seg.size);
    put_str(out, &seg.te_endpoint);
    put_str(out, &seg.protocol);
    put_str(out, &seg.host_id);
    put_uuid(out, s.client.0);
    out.push(s.status.as_number() as u8);
    match s.graceful_deadline_ms {
        None => out.push(0),
        Some(d) => {
            out.push(1);
            put_varint(out, d);
        }
    }
}

pub(crate) fn read_segment(r: &mut Reader<'_>) -> Result<SegmentRecord, SnapshotError> {
    let id = SegmentId(r.uuid()?);
    let segment = Segment {
        id,
        name: r.string()?,
        base: r.varint()?,
        size: r.varint()?,
        te_endpoint: r.string()?,
        protocol: r.string()?,
        host_id: r.string()?,
    };
    let client = ClientId(r.uuid()?);
    let b = r.u8()?;
    let status = SegmentStatus::from_number(i32::from(b))
        .ok_or_else(|| r.err(format!("segment status {b}")))?;
    let graceful_deadline_ms = if r.bool()? { Some(r.varint()?) } else { None };
    Ok(SegmentRecord {
        segment,
        client,
        status,
        graceful_deadline_ms,
    })
}

pub(crate) fn put_discarded(out: &mut Vec<u8>, d: &DiscardedRecord) {
    put_varint(out, d.release_at_ms);
    put_varint(out, d.buffers.len() as u64);
    for b in &d.buffers {
        put_uuid(out, b.segment.0);
        put_varint(out, b.offset);
        put_varint(out, b.len);
    }
}

pub(crate) fn read_discarded(r: &mut Reader<'_>) -> Result<DiscardedRecord, SnapshotError> {
    let release_at_ms = r.varint()?;
    let n = r.count(MAX_LIST, 18)?;
    let mut buffers = Vec::with_capacity(n);
    for _ in 0..n {
        buffers.push(BufferRecord {
            segment: SegmentId(r.uuid()?),
            offset: r.varint()?,
            len: r.varint()?,
        });
    }
    Ok(DiscardedRecord {
        release_at_ms,
        buffers,
    })
}

pub(crate) fn put_quota(out: &mut Vec<u8>, tenant: &TenantId, quota: u64) {
    put_str(out, tenant.as_str());
    put_varint(out, quota);
}

pub(crate) fn read_quota(r: &mut Reader<'_>) -> Result<(TenantId, u64), SnapshotError> {
    let name = r.str()?;
    let tenant = TenantId::new(name).map_err(|_| r.err(format!("invalid tenant name {name:?}")))?;
    Ok((tenant, r.varint()?))
}
