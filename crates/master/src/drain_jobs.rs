//! Drain jobs (upstream's `/api/v1/drain_jobs`; also methods 82–85): take whole segments out of
//! service without losing objects. Creating a job checks its segments (mounted, OK, distinct)
//! and targets (mounted, OK, not a source), turns the sources DRAINING at once (no new
//! allocations; reads go on) and takes the job's first step. The job step
//! ([`MasterService::run_drain_jobs_once`], every 50 ms in the server) plans each source with
//! `drain.rs` (one move task per object, run by the source's owner) and follows the tasks. When none is active it counts what is
//! left on the sources: nothing → the sources become DRAINED and the job SUCCEEDED; something
//! (objects written meanwhile, tasks that failed after their retries) → planned again, at most
//! [`MAX_PASSES`] passes; after that, or when a pass can plan nothing, the job is FAILED with
//! the count in its message and the sources go back to OK holding what could not move: objects
//! are reported, never dropped. Cancel marks the job CANCELED, fails its tasks still PENDING,
//! and puts the sources back to OK. Jobs live in memory (at most [`MAX_JOBS`], finished ones
//! pruned oldest first), like the task queue.

use std::collections::{HashMap, VecDeque};

use mooncake_common::{
    DrainJobRequest, DrainJobStatus, DrainJobView, ErrorCode, SegmentId, SegmentStatus, TaskId,
    TaskStatus, Uuid,
};

use crate::handle::MasterService;

/// Planning passes a job makes before it gives up on what is left.
pub const MAX_PASSES: u32 = 3;
/// Jobs kept (finished ones beyond this are forgotten, oldest first).
pub const MAX_JOBS: usize = 1000;

#[derive(Debug)]
struct Unit {
    task: TaskId,
    bytes: u64,
    /// `Some(true)` succeeded, `Some(false)` failed, `None` still queued or running.
    done: Option<bool>,
}

#[derive(Debug)]
struct DrainJob {
    view: DrainJobView,
    sources: Vec<SegmentId>,
    targets: Vec<String>,
    units: Vec<Unit>,
    passes: u32,
}

/// Every drain job. One mutex, taken before the segment, shard and task locks.
#[derive(Debug, Default)]
pub(crate) struct DrainJobs {
    jobs: HashMap<TaskId, DrainJob>,
    order: VecDeque<TaskId>,
}

fn finished(status: DrainJobStatus) -> bool {
    matches!(
        status,
        DrainJobStatus::Succeeded | DrainJobStatus::Failed | DrainJobStatus::Canceled
    )
}

impl MasterService {
    /// Resolves and checks a job's sources: SEGMENT_NOT_FOUND (unknown), INVALID_PARAMS (none or
    /// repeated), UNAVAILABLE_IN_CURRENT_STATUS (not OK).
    fn drain_sources(&self, names: &[String]) -> Result<Vec<SegmentId>, ErrorCode> {
        if names.is_empty() {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let segs = self.segments.inner.read();
        let mut ids = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            let found = segs.by_name.get(name.as_str()).map(Vec::as_slice);
            let Some(found) = found.filter(|f| !f.is_empty()) else {
                return Err(ErrorCode::SEGMENT_NOT_FOUND);
            };
            for id in found {
                if segs.mounted.get(id).map(|s| s.status) != Some(SegmentStatus::OK) {
                    return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
                }
                ids.push(*id);
            }
        }
        Ok(ids)
    }

    /// CreateDrainJob: checks (module doc), sources DRAINING, the job CREATED. Returns its id.
    pub fn create_drain_job(&self, request: &DrainJobRequest) -> Result<TaskId, ErrorCode> {
        if request.max_concurrency == 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let mut jobs = self.drain_jobs.lock();
        let sources = self.drain_sources(&request.segments)?;
        for target in &request.target_segments {
            if request.segments.contains(target) {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            if self.query_segment_status(target)? != SegmentStatus::OK {
                return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
            }
        }
        for id in &sources {
            self.set_segment_status(*id, SegmentStatus::DRAINING)?;
        }
        let id = TaskId(Uuid::new(self.rng.next_u64(), self.rng.next_u64() | 1));
        let now = self.clock.now_ms();
        let view = DrainJobView {
            id,
            status: DrainJobStatus::Created,
            segments: request.segments.clone(),
            created_at_ms: now,
            last_updated_at_ms: now,
            ..DrainJobView::default()
        };
        jobs.jobs.insert(
            id,
            DrainJob {
                view,
                sources,
                targets: request.target_segments.clone(),
                units: Vec::new(),
                passes: 0,
            },
        );
        jobs.order.push_back(id);
        // The first pass is planned now, not at the next job step: its moves can start as soon
        // as the sources' owners ask for their tasks.
        if let Some(job) = jobs.jobs.get_mut(&id) {
            self.step_job(job);
        }
        jobs.prune();
        Ok(id)
    }

    /// QueryDrainJob: TASK_NOT_FOUND for an unknown (or pruned) job.
    pub fn query_drain_job(&self, id: TaskId) -> Result<DrainJobView, ErrorCode> {
        let jobs = self.drain_jobs.lock();
        let job = jobs.jobs.get(&id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
        Ok(job.view.clone())
    }

    /// Every drain job kept, oldest first.
    pub fn list_drain_jobs(&self) -> Vec<DrainJobView> {
        let jobs = self.drain_jobs.lock();
        jobs.order
            .iter()
            .filter_map(|id| jobs.jobs.get(id).map(|j| j.view.clone()))
            .collect()
    }

    /// CancelDrainJob: TASK_NOT_FOUND (unknown), UNAVAILABLE_IN_CURRENT_STATUS (finished).
    pub fn cancel_drain_job(&self, id: TaskId) -> Result<(), ErrorCode> {
        let mut jobs = self.drain_jobs.lock();
        let job = jobs.jobs.get_mut(&id).ok_or(ErrorCode::TASK_NOT_FOUND)?;
        if finished(job.view.status) {
            return Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
        }
        let now = self.clock.now_ms();
        {
            let mut tasks = self.tasks.lock();
            for unit in job.units.iter().filter(|u| u.done.is_none()) {
                tasks.cancel_pending(unit.task, now);
            }
        }
        self.restore_sources(&job.sources);
        job.view.status = DrainJobStatus::Canceled;
        job.view.message = "canceled".to_string();
        job.view.last_updated_at_ms = now;
        Ok(())
    }

    /// Sources still DRAINING go back to OK.
    fn restore_sources(&self, sources: &[SegmentId]) {
        for id in sources {
            if self.query_segment_status_by_id(*id) == Ok(SegmentStatus::DRAINING) {
                let _ = self.set_segment_status(*id, SegmentStatus::OK);
            }
        }
    }

    /// One step of every unfinished job (module doc). Returns how many jobs finished now.
    pub fn run_drain_jobs_once(&self) -> usize {
        let mut jobs = self.drain_jobs.lock();
        let mut ended = 0;
        for job in jobs.jobs.values_mut() {
            if finished(job.view.status) {
                continue;
            }
            self.step_job(job);
            ended += usize::from(finished(job.view.status));
        }
        ended
    }

    fn step_job(&self, job: &mut DrainJob) {
        let now = self.clock.now_ms();
        self.refresh_units(job);
        job.view.last_updated_at_ms = now;
        if job.view.active_units > 0 {
            return;
        }
        let mut left = 0u64;
        for id in &job.sources {
            left += self.count_objects_on_segment(*id).unwrap_or(0);
        }
        if left == 0 {
            for id in &job.sources {
                let _ = self.set_segment_status(*id, SegmentStatus::DRAINED);
            }
            job.view.status = DrainJobStatus::Succeeded;
            job.view.message = format!("{} objects moved", job.view.succeeded_units);
            return;
        }
        if job.passes < MAX_PASSES && self.plan_pass(job) > 0 {
            job.view.status = DrainJobStatus::Running;
            return;
        }
        self.restore_sources(&job.sources);
        job.view.status = DrainJobStatus::Failed;
        job.view.message = format!(
            "{left} objects could not be moved ({} with no room on the targets); they stay \
             on their segments, which are OK again",
            job.view.blocked_units
        );
    }

    /// Plans every source once more; returns how many tasks were queued.
    fn plan_pass(&self, job: &mut DrainJob) -> usize {
        job.passes += 1;
        job.view.status = DrainJobStatus::Planning;
        let mut queued = 0;
        job.view.blocked_units = 0;
        for id in &job.sources {
            match self.drain_segment(*id, &job.targets) {
                Ok(plan) => {
                    job.view.blocked_units += plan.unmovable.len() as u64;
                    for (task, bytes) in plan.tasks {
                        job.units.push(Unit {
                            task,
                            bytes,
                            done: None,
                        });
                        job.view.total_bytes += bytes;
                        queued += 1;
                    }
                }
                Err(code) => job.view.message = format!("planning failed: {code}"),
            }
        }
        job.view.total_units = job.units.len() as u64;
        job.view.active_units = queued as u64;
        queued
    }

    /// Reads the state of the job's unfinished tasks into its counts.
    fn refresh_units(&self, job: &mut DrainJob) {
        let tasks = self.tasks.lock();
        let view = &mut job.view;
        view.active_units = 0;
        for unit in job.units.iter_mut().filter(|u| u.done.is_none()) {
            match tasks.query(unit.task).map(|q| q.status) {
                Ok(TaskStatus::Success) => {
                    unit.done = Some(true);
                    view.succeeded_units += 1;
                    view.migrated_bytes += unit.bytes;
                }
                Ok(TaskStatus::Failed) | Err(_) => {
                    unit.done = Some(false);
                    view.failed_units += 1;
                }
                Ok(_) => view.active_units += 1,
            }
        }
    }
}

impl DrainJobs {
    fn prune(&mut self) {
        while self.order.len() > MAX_JOBS {
            let oldest_finished = self
                .order
                .iter()
                .position(|id| self.jobs.get(id).is_none_or(|j| finished(j.view.status)));
            let Some(i) = oldest_finished else { return };
            if let Some(id) = self.order.remove(i) {
                self.jobs.remove(&id);
            }
        }
    }
}
