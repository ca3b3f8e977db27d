//! The segment manager: mounted segments, their statuses and allocators, client ownership, and the
//! set of allocators placement may use (as upstream's master).
//!
//! One `RwLock` guards it all. It is never held while metadata shards are walked: unmount is
//! prepare (under the lock) → sweep the shards (without it) → commit (under it), driven by the
//! segment RPCs (`segment_rpc.rs`). Plain data: nothing here observes or sweeps objects.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mooncake_common::{ClientId, ErrorCode, Segment, SegmentId, SegmentStatus};
use parking_lot::RwLock;

use crate::allocator::{BufferHandle, SegmentAllocator, SegmentInfo};
use crate::mutation::ObserverSlot;
use crate::strategy::AllocatorSet;

/// One mounted segment.
#[derive(Debug)]
pub(crate) struct MountedSegment {
    pub segment: Segment,
    pub client: ClientId,
    pub status: SegmentStatus,
    pub host_id: Arc<str>,
    /// The only long-lived strong reference; `None` once unmounting has begun.
    pub allocator: Option<Arc<SegmentAllocator>>,
    /// Restored from a snapshot and waiting for its owner to mount it again, until this time
    /// (`restore.rs`): its space is reserved, it is not used for placement and its replicas are
    /// not readable. `None` for every segment mounted by a client.
    pub waiting_until_ms: Option<u64>,
}

/// A graceful unmount waiting for its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GracefulUnmount {
    pub deadline_ms: u64,
    pub segment_id: SegmentId,
    pub client: ClientId,
}

/// What `segment_usage` reports about one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentUsage {
    pub id: SegmentId,
    pub name: String,
    pub client: ClientId,
    pub status: SegmentStatus,
    pub base: u64,
    pub capacity_bytes: u64,
    /// `None` once the allocator is gone (unmounting).
    pub used_bytes: Option<u64>,
    pub live_buffers: Option<u64>,
    /// Restored from a snapshot, waiting for its owner to mount it again.
    pub waiting_for_owner: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Segments {
    pub mounted: HashMap<SegmentId, MountedSegment>,
    pub client_segments: HashMap<ClientId, Vec<SegmentId>>,
    pub by_name: HashMap<Arc<str>, Vec<SegmentId>>,
    pub allocatable: AllocatorSet,
    pub ok_clients: HashSet<ClientId>,
    pub client_host: HashMap<ClientId, String>,
    pub graceful: Vec<GracefulUnmount>,
    pub total_capacity_bytes: u64,
    /// Segments a client failed to write (`suspicion.rs`): out of placement, still readable,
    /// until their owner pings or mounts again, or they are unmounted.
    pub suspected: HashSet<SegmentId>,
    /// The master's observer: every allocator reports the space it frees to it.
    pub observer: ObserverSlot,
}

/// Result of a single mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mounted {
    New,
    /// The same id is already mounted and OK (idempotent).
    Existing,
    /// A restored segment waiting for its owner was taken back by it (see `adopt`).
    Adopted,
}

/// What a ReMount did: the segments mounted afresh and the restored ones taken back.
#[derive(Debug, Default)]
pub(crate) struct Remounted {
    pub fresh: Vec<SegmentId>,
    pub adopted: Vec<SegmentId>,
}

impl Segments {
    fn validate(segment: &Segment) -> Result<(), ErrorCode> {
        if segment.base == 0
            || segment.size == 0
            || segment.base.checked_add(segment.size).is_none()
        {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        Ok(())
    }

    pub fn mount(&mut self, segment: &Segment, client: ClientId) -> Result<Mounted, ErrorCode> {
        Self::validate(segment)?;
        if let Some(existing) = self.mounted.get(&segment.id) {
            if existing.waiting_until_ms.is_some() {
                return self.adopt(segment, client);
            }
            return if existing.status == SegmentStatus::OK {
                Ok(Mounted::Existing)
            } else {
                Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
            };
        }
        let name: Arc<str> = self
            .by_name
            .get_key_value(segment.name.as_str())
            .map_or_else(|| Arc::from(segment.name.as_str()), |(k, _)| k.clone());
        let allocator = SegmentAllocator::new(SegmentInfo {
            segment_id: segment.id,
            name: name.clone(),
            endpoint: Arc::from(segment.te_endpoint.as_str()),
            protocol: Arc::from(segment.protocol.as_str()),
            base: segment.base,
            capacity: segment.size,
        });
        allocator.report_frees_to(&self.observer);
        // A mount after an unmount of the same range gives its space back.
        self.observer.space_freed();
        let host_id: Arc<str> = Arc::from(segment.host_id.as_str());
        self.allocatable.insert(allocator.clone(), &host_id);
        self.mounted.insert(
            segment.id,
            MountedSegment {
                segment: segment.clone(),
                client,
                status: SegmentStatus::OK,
                host_id,
                allocator: Some(allocator),
                waiting_until_ms: None,
            },
        );
        self.client_segments
            .entry(client)
            .or_default()
            .push(segment.id);
        self.by_name.entry(name).or_default().push(segment.id);
        self.total_capacity_bytes += segment.size;
        if !segment.host_id.is_empty() {
            self.client_host.insert(client, segment.host_id.clone());
        }
        Ok(Mounted::New)
    }

    /// Adds a restored segment around its rebuilt allocator, waiting for its owner until
    /// `waiting_until_ms`: counted in capacity and owned by `client`, but not in the placement
    /// set. A graceful-unmount deadline comes back with it. The caller checked the record.
    pub fn insert_restored(
        &mut self,
        record: &crate::mutation::SegmentRecord,
        allocator: Arc<SegmentAllocator>,
        waiting_until_ms: u64,
    ) {
        let segment = &record.segment;
        allocator.report_frees_to(&self.observer);
        let name = allocator.info().name.clone();
        self.mounted.insert(
            segment.id,
            MountedSegment {
                segment: segment.clone(),
                client: record.client,
                status: record.status,
                host_id: Arc::from(segment.host_id.as_str()),
                allocator: Some(allocator),
                waiting_until_ms: Some(waiting_until_ms),
            },
        );
        self.client_segments
            .entry(record.client)
            .or_default()
            .push(segment.id);
        self.by_name.entry(name).or_default().push(segment.id);
        self.total_capacity_bytes += segment.size;
        if let Some(deadline_ms) = record.graceful_deadline_ms {
            self.graceful.push(GracefulUnmount {
                deadline_ms,
                segment_id: segment.id,
                client: record.client,
            });
        }
    }

    /// The owner mounts a restored, waiting segment again: the same client with every field
    /// equal ends the wait (an OK segment joins placement at once; its replicas still await
    /// verification). Another client → SEGMENT_ALREADY_EXISTS; changed fields →
    /// INVALID_PARAMS. Nothing changes on error.
    fn adopt(&mut self, segment: &Segment, client: ClientId) -> Result<Mounted, ErrorCode> {
        let Some(existing) = self.mounted.get_mut(&segment.id) else {
            return Err(ErrorCode::SEGMENT_NOT_FOUND);
        };
        if existing.client != client {
            return Err(ErrorCode::SEGMENT_ALREADY_EXISTS);
        }
        if existing.segment != *segment {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        existing.waiting_until_ms = None;
        if existing.status == SegmentStatus::OK && !self.suspected.contains(&segment.id) {
            if let Some(a) = &existing.allocator {
                self.allocatable.insert(a.clone(), &existing.host_id);
            }
        }
        if !segment.host_id.is_empty() {
            self.client_host.insert(client, segment.host_id.clone());
        }
        Ok(Mounted::Adopted)
    }

    /// Undoes [`Segments::adopt`] (ReMount rollback): the segment waits again until `until_ms`.
    fn unadopt(&mut self, id: SegmentId, until_ms: u64) {
        let Some(seg) = self.mounted.get_mut(&id) else {
            return;
        };
        if let Some(a) = &seg.allocator {
            self.allocatable.remove(a, &seg.host_id);
        }
        seg.waiting_until_ms = Some(until_ms);
    }

    /// Undoes a mount made moments ago (ReMount rollback). Nothing can point into it yet.
    fn unmount_fresh(&mut self, id: SegmentId) {
        if self.prepare_unmount(id).is_ok() {
            self.commit_unmount(id);
        }
    }

    /// Whether a mounted segment (not waiting for its owner) is large enough for a replica of
    /// `bytes` when empty: no eviction can make room for a larger one.
    pub fn some_segment_holds(&self, bytes: u64) -> bool {
        self.mounted
            .values()
            .filter(|s| s.waiting_until_ms.is_none())
            .filter_map(|s| s.allocator.as_ref())
            .any(|a| a.capacity() >= bytes)
    }

    /// Upstream's ReMount (see `remount_segments`). Returns the ids it mounted afresh (on error
    /// those are rolled back and nothing is mounted).
    pub fn remount(
        &mut self,
        segments: &[Segment],
        client: ClientId,
    ) -> Result<Remounted, ErrorCode> {
        for segment in segments {
            if !segment.host_id.is_empty() {
                self.client_host.insert(client, segment.host_id.clone());
            }
        }
        for segment in segments {
            if let Some(existing) = self.mounted.get(&segment.id) {
                if existing.client != client || existing.segment != *segment {
                    return Err(ErrorCode::INVALID_PARAMS);
                }
            }
        }
        if self.ok_clients.contains(&client) {
            return Ok(Remounted::default());
        }
        let mut done = Remounted::default();
        let mut waited = Vec::new();
        for segment in segments {
            let until = self
                .mounted
                .get(&segment.id)
                .and_then(|s| s.waiting_until_ms);
            match self.mount(segment, client) {
                Ok(Mounted::New) => done.fresh.push(segment.id),
                Ok(Mounted::Adopted) => {
                    done.adopted.push(segment.id);
                    waited.push(until.unwrap_or_default());
                }
                Ok(Mounted::Existing)
                | Err(ErrorCode::INVALID_PARAMS | ErrorCode::SEGMENT_ALREADY_EXISTS) => {}
                Err(code) => {
                    for id in done.fresh {
                        self.unmount_fresh(id);
                    }
                    for (id, until) in done.adopted.into_iter().zip(waited) {
                        self.unadopt(id, until);
                    }
                    return Err(code);
                }
            }
        }
        self.ok_clients.insert(client);
        Ok(done)
    }

    /// First step of an unmount. `Ok(None)` for an unknown segment (idempotent); otherwise the
    /// allocator is removed from placement and its strong reference returned, to be dropped by the
    /// caller after the lock is released: every handle into the segment is dead from then on.
    pub fn prepare_unmount(
        &mut self,
        id: SegmentId,
    ) -> Result<Option<Option<Arc<SegmentAllocator>>>, ErrorCode> {
        let Some(seg) = self.mounted.get_mut(&id) else {
            return Ok(None);
        };
        if seg.status == SegmentStatus::UNMOUNTING {
            return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        }
        let allocator = seg.allocator.take();
        if let Some(a) = &allocator {
            self.allocatable.remove(a, &seg.host_id);
        }
        seg.status = SegmentStatus::UNMOUNTING;
        self.graceful.retain(|g| g.segment_id != id);
        self.suspected.remove(&id);
        Ok(Some(allocator))
    }

    /// Last step of an unmount: forget the segment.
    pub fn commit_unmount(&mut self, id: SegmentId) {
        let Some(seg) = self.mounted.remove(&id) else {
            return;
        };
        if let Some(list) = self.client_segments.get_mut(&seg.client) {
            list.retain(|s| *s != id);
            if list.is_empty() {
                self.client_segments.remove(&seg.client);
            }
        }
        let name = seg.segment.name.as_str();
        if let Some(list) = self.by_name.get_mut(name) {
            list.retain(|s| *s != id);
            if list.is_empty() {
                self.by_name.remove(name);
            }
        }
        self.total_capacity_bytes -= seg.segment.size;
    }

    /// Upstream's GracefulUnmountSegment checks and state change. `Ok(false)` when the segment
    /// was already gracefully unmounting (nothing changes).
    pub fn start_graceful_unmount(
        &mut self,
        id: SegmentId,
        client: ClientId,
        deadline_ms: u64,
    ) -> Result<bool, ErrorCode> {
        let owned = self
            .client_segments
            .get(&client)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        if !owned.contains(&id) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let seg = self
            .mounted
            .get_mut(&id)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        match seg.status {
            SegmentStatus::GRACEFULLY_UNMOUNTING => return Ok(false),
            SegmentStatus::OK | SegmentStatus::DRAINING => {}
            _ => return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
        }
        if seg.status == SegmentStatus::OK {
            if let Some(a) = &seg.allocator {
                self.allocatable.remove(a, &seg.host_id);
            }
        }
        seg.status = SegmentStatus::GRACEFULLY_UNMOUNTING;
        self.graceful.push(GracefulUnmount {
            deadline_ms,
            segment_id: id,
            client,
        });
        Ok(true)
    }

    /// Drain-job status changes: OK ⇄ DRAINING, DRAINING → DRAINED. Leaving OK removes the
    /// segment from placement; returning to OK adds it back. `Ok(false)` when the status was
    /// already `status` (nothing changes).
    pub fn set_status(&mut self, id: SegmentId, status: SegmentStatus) -> Result<bool, ErrorCode> {
        let seg = self
            .mounted
            .get_mut(&id)
            .ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        let allowed = matches!(
            (seg.status, status),
            (SegmentStatus::OK, SegmentStatus::DRAINING)
                | (SegmentStatus::DRAINING, SegmentStatus::OK)
                | (SegmentStatus::DRAINING, SegmentStatus::DRAINED)
                | (SegmentStatus::DRAINED, SegmentStatus::OK)
        );
        if seg.status == status {
            return Ok(false);
        }
        if !allowed {
            return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        }
        if let Some(a) = &seg.allocator {
            if seg.status == SegmentStatus::OK {
                self.allocatable.remove(a, &seg.host_id);
            } else if status == SegmentStatus::OK
                && seg.waiting_until_ms.is_none()
                && !self.suspected.contains(&id)
            {
                // A waiting segment joins placement only when its owner takes it back.
                self.allocatable.insert(a.clone(), &seg.host_id);
            }
        }
        seg.status = status;
        Ok(true)
    }

    /// The segment a buffer lives in, if that segment is mounted with this very allocator alive
    /// (not unmounting). Read under this lock, it orders a buffer against its segment's unmount.
    pub fn live_segment_of(&self, h: &BufferHandle) -> Option<SegmentId> {
        let id = h.allocator()?.info().segment_id;
        let seg = self.mounted.get(&id)?;
        seg.allocator
            .as_ref()
            .is_some_and(|a| h.belongs_to(a))
            .then_some(id)
    }

    /// The allocator of a mounted segment that is not unmounting.
    pub fn allocator_of(&self, id: SegmentId) -> Option<&Arc<SegmentAllocator>> {
        self.mounted.get(&id).and_then(|s| s.allocator.as_ref())
    }

    pub fn usage(seg: &MountedSegment) -> SegmentUsage {
        SegmentUsage {
            id: seg.segment.id,
            name: seg.segment.name.clone(),
            client: seg.client,
            status: seg.status,
            base: seg.segment.base,
            capacity_bytes: seg.segment.size,
            used_bytes: seg.allocator.as_ref().map(|a| a.used_bytes()),
            live_buffers: seg.allocator.as_ref().map(|a| a.live_buffers()),
            waiting_for_owner: seg.waiting_until_ms.is_some(),
        }
    }
}

/// The segment manager.
#[derive(Debug, Default)]
pub(crate) struct SegmentManager {
    pub inner: RwLock<Segments>,
}

impl SegmentManager {
    /// A manager whose allocators report freed space to `observer`.
    pub fn observed_by(observer: ObserverSlot) -> Self {
        SegmentManager {
            inner: RwLock::new(Segments {
                observer,
                ..Segments::default()
            }),
        }
    }
}
