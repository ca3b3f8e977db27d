//! Leaving the cluster without losing objects: [`StoreClient::drain_segments`] asks the master
//! to drain each of this client's segments (DrainSegment: the segment goes DRAINING, so new
//! puts avoid it while reads go on, and every object on it gets a move task queued for this
//! client), runs those tasks at once, and plans again for objects still there (written while
//! it ran, or whose task failed) until none is left or the time is up. `mooncake store` does
//! this on SIGTERM before it unmounts.

use mooncake_common::SegmentId;
use mooncake_proto::methods as m;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{StoreClient, StoreError};

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Objects on this client's segments when the drain began.
    pub objects: u64,
    /// Move tasks that succeeded.
    pub moved: u64,
    /// Objects still on this client's segments at the end (lost at unmount unless another
    /// replica exists).
    pub left: u64,
    /// Of those, objects no other segment had room for (in the last plan).
    pub unmovable: u64,
}

/// Pause between plans while retried tasks wait for their backoff.
const REPLAN_PAUSE: Duration = Duration::from_millis(100);

impl StoreClient {
    /// Moves the objects on this client's segments to other segments for at most `within`
    /// (module doc). The segments stay mounted (DRAINING); `close` unmounts them.
    pub async fn drain_segments(&self, within: Duration) -> Result<DrainReport, StoreError> {
        self.check_open()?;
        let deadline = Instant::now() + within;
        let ids: Vec<SegmentId> = self.segments().iter().map(|s| s.id).collect();
        let moved_before = self.inner.stats.tasks_succeeded.load(Ordering::Relaxed);
        let mut report = DrainReport {
            objects: self.objects_on(&ids).await?,
            ..DrainReport::default()
        };
        report.left = report.objects;
        while report.left > 0 && Instant::now() < deadline {
            report.unmovable = 0;
            for id in &ids {
                let plan = self
                    .inner
                    .master
                    .call(&m::DrainSegment {
                        client: self.inner.client_id,
                        segment_id: *id,
                    })
                    .await?;
                report.unmovable += plan.unmovable;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Out of time mid-run: the tasks in flight are dropped (their objects count as
            // left).
            if let Ok(ran) = tokio::time::timeout(left, self.run_queued_tasks()).await {
                if ran? == 0 {
                    tokio::time::sleep(REPLAN_PAUSE.min(left)).await;
                }
            }
            report.left = self.objects_on(&ids).await?;
        }
        report.moved = self
            .inner
            .stats
            .tasks_succeeded
            .load(Ordering::Relaxed)
            .saturating_sub(moved_before);
        Ok(report)
    }

    /// Objects with a live replica on any of the segments `ids`.
    async fn objects_on(&self, ids: &[SegmentId]) -> Result<u64, StoreError> {
        let mut total = 0;
        for id in ids {
            total += self
                .inner
                .master
                .call(&m::CountSegmentObjects { segment_id: *id })
                .await?;
        }
        Ok(total)
    }
}
