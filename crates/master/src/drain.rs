//! Draining a segment: it goes DRAINING (no new allocations, reads go on) and every object with
//! a readable replica on it gets a move task to another segment, run by the segment's owner like
//! any task (`tasks.rs`). Used by a node's graceful shutdown (DrainSegment, method 80) and by
//! the HTTP drain jobs (`drain_jobs.rs`).
//!
//! Target choice per object: among the OK segments allowed (all other OK segments, or the job's
//! targets), the one with the most free bytes that holds no replica of the object and has room
//! for it (free bytes are counted down as the plan goes, so one pass does not promise the same
//! bytes twice); failing that, an OK segment that already holds a replica (the move then only
//! drops the source); failing that the object is unmovable and reported, never dropped. An
//! object that already has a PENDING or PROCESSING task from this segment is not planned again,
//! so a drain can be planned repeatedly (objects written while it ran are picked up).

use std::collections::HashSet;
use std::sync::Arc;

use mooncake_common::{ClientId, ErrorCode, SegmentId, SegmentStatus, TaskId, TaskType};

use crate::handle::MasterService;
use crate::index::SHARD_COUNT;
use crate::object::Replica;

/// What one drain planning pass queued.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// The move tasks queued now, each with the bytes it moves.
    pub tasks: Vec<(TaskId, u64)>,
    /// Bytes those tasks move.
    pub bytes: u64,
    /// `(tenant, key)` of objects no allowed segment has room for.
    pub unmovable: Vec<(String, String)>,
    /// Objects left unplanned because the task queue was full (plan again later).
    pub deferred: u64,
}

/// One object with a readable replica on the drained segment.
struct OnSegment {
    tenant: String,
    key: String,
    size: u64,
    /// Segments holding its other replicas.
    others: Vec<Arc<str>>,
}

/// A segment a drain may move objects to.
struct Candidate {
    name: String,
    free: u64,
}

impl MasterService {
    /// Every object with a readable replica on segment `name`.
    fn objects_on_segment(&self, name: &str) -> Vec<OnSegment> {
        let mut out = Vec::new();
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            for (tenant, state) in shard.tenants() {
                for entry in state.objects.iter() {
                    let meta = &entry.meta;
                    let here = |r: &Replica| r.segment_name().is_some_and(|n| &*n == name);
                    if !meta.replicas.iter().any(|r| r.is_readable() && here(r)) {
                        continue;
                    }
                    out.push(OnSegment {
                        tenant: tenant.name().to_string(),
                        key: entry.key.to_string(),
                        size: meta.size,
                        others: meta
                            .replicas
                            .iter()
                            .filter(|r| r.is_valid() && !here(r))
                            .filter_map(Replica::segment_name)
                            .collect(),
                    });
                }
            }
        }
        out
    }

    /// How many objects hold a live replica (complete or being written) on the segment.
    /// SEGMENT_NOT_FOUND for an unknown id.
    pub fn count_objects_on_segment(&self, id: SegmentId) -> Result<u64, ErrorCode> {
        let name = self.segment_name_and_owner(id)?.0;
        let mut count = 0u64;
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            for (_, state) in shard.tenants() {
                count += state
                    .objects
                    .iter()
                    .filter(|e| {
                        e.meta
                            .replicas
                            .iter()
                            .any(|r| r.is_valid() && r.segment_name().is_some_and(|n| *n == *name))
                    })
                    .count() as u64;
            }
        }
        Ok(count)
    }

    /// The name and owner of a mounted segment (SEGMENT_NOT_FOUND otherwise).
    pub(crate) fn segment_name_and_owner(
        &self,
        id: SegmentId,
    ) -> Result<(String, ClientId, SegmentStatus), ErrorCode> {
        let segs = self.segments.inner.read();
        let s = segs.mounted.get(&id).ok_or(ErrorCode::SEGMENT_NOT_FOUND)?;
        Ok((s.segment.name.clone(), s.client, s.status))
    }

    /// The OK segments a drain of `source` may move to: every other one, or those in `targets`.
    fn drain_candidates(&self, source: &str, targets: &[String]) -> Vec<Candidate> {
        self.segment_usage()
            .into_iter()
            .filter(|u| u.status == SegmentStatus::OK && !u.waiting_for_owner)
            .filter(|u| u.name != source)
            .filter(|u| targets.is_empty() || targets.contains(&u.name))
            .filter_map(|u| {
                let used = u.used_bytes?;
                Some(Candidate {
                    name: u.name,
                    free: u.capacity_bytes.saturating_sub(used),
                })
            })
            .collect()
    }

    /// DrainSegment for the segment's owner (a node shutting down): ILLEGAL_CLIENT for another
    /// client, otherwise [`MasterService::drain_segment`] to any other OK segment.
    pub fn drain_own_segment(
        &self,
        client: ClientId,
        id: SegmentId,
    ) -> Result<DrainPlan, ErrorCode> {
        if self.segment_name_and_owner(id)?.1 != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        self.drain_segment(id, &[])
    }

    /// Marks the segment DRAINING (from OK; a DRAINING one stays) and queues a move task for
    /// every object on it not already being moved from it (see the module doc). An unmounting
    /// or DRAINED segment → UNAVAILABLE_IN_CURRENT_STATUS.
    pub fn drain_segment(&self, id: SegmentId, targets: &[String]) -> Result<DrainPlan, ErrorCode> {
        let (name, _, status) = self.segment_name_and_owner(id)?;
        match status {
            SegmentStatus::OK => self.set_segment_status(id, SegmentStatus::DRAINING)?,
            SegmentStatus::DRAINING => {}
            _ => return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS),
        }
        let mut candidates = self.drain_candidates(&name, targets);
        let active = self.tasks.lock().active_keys_from(&name);
        let mut plan = DrainPlan::default();
        for object in self.objects_on_segment(&name) {
            if active.contains(&(object.tenant.clone(), object.key.clone())) {
                continue;
            }
            let Some(target) = pick_target(&mut candidates, &object) else {
                plan.unmovable.push((object.tenant, object.key));
                continue;
            };
            match self.enqueue_task(
                TaskType::ReplicaMove,
                &object.key,
                &object.tenant,
                &name,
                &[target],
            ) {
                Ok(task) => {
                    plan.tasks.push((task, object.size));
                    plan.bytes += object.size;
                }
                Err(ErrorCode::TASK_PENDING_LIMIT_EXCEEDED) => plan.deferred += 1,
                Err(code) => return Err(code),
            }
        }
        Ok(plan)
    }
}

/// The target for one object (module doc), its size taken from the target's free bytes.
fn pick_target(candidates: &mut [Candidate], object: &OnSegment) -> Option<String> {
    let holds = |c: &Candidate| object.others.iter().any(|o| **o == *c.name);
    if let Some(best) = candidates
        .iter_mut()
        .filter(|c| !holds(c) && c.free >= object.size)
        .max_by_key(|c| c.free)
    {
        best.free -= object.size;
        return Some(best.name.clone());
    }
    candidates.iter().find(|c| holds(c)).map(|c| c.name.clone())
}

/// `(tenant, key)` pairs, for [`crate::tasks::TaskManager::active_keys_from`].
pub(crate) type KeySet = HashSet<(String, String)>;
