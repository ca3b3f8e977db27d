//! The segment this client contributes and keeping it known to the master: `mount_segment`,
//! the heartbeat (`Ping` every `heartbeat_interval`) and the re-mount the master asks for with
//! `NEED_REMOUNT` after it restarted or expired this client, followed by the check of the
//! replicas a restored master holds for this client's segments (`verify.rs`). After each ping
//! that succeeds, a client with a segment runs the tasks the master queued for it (`tasks.rs`). While the master
//! is unreachable every ping fails within the RPC timeout and the loop keeps trying; the RPC
//! client reconnects on the next call.

use mooncake_common::{ClientStatus, Segment, SegmentId};
use mooncake_transfer::{MemoryHandle, SegmentOptions};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::addressing::{segment_base, MAX_SEGMENT_BYTES};
use super::pins;
use super::verify::verify_restored;
use super::{Inner, MountedSegment, StoreClient, StoreError};

impl StoreClient {
    /// Allocates `size_bytes` of shareable memory and mounts it at the master.
    pub async fn mount_segment(&self, size_bytes: u64) -> Result<Segment, StoreError> {
        self.check_open()?;
        let len = usize::try_from(size_bytes)
            .ok()
            .filter(|_| size_bytes <= MAX_SEGMENT_BYTES)
            .ok_or_else(|| StoreError::InvalidParams("segment too large".to_string()))?;
        let memory = self
            .inner
            .engine
            .allocate_segment(len, SegmentOptions::default())?;
        self.mount_memory(memory, size_bytes).await
    }

    /// Maps `size_bytes` of the file at `path` from `offset` (a multiple of the page size; a
    /// file in /dev/shm, or any file) and mounts them as a segment. Peers reach it over TCP
    /// (a file cannot be sealed against shrinking, so it is not handed to same-host peers).
    /// The file must keep its size while mounted.
    pub async fn mount_file_segment(
        &self,
        path: &std::path::Path,
        offset: u64,
        size_bytes: u64,
    ) -> Result<Segment, StoreError> {
        self.check_open()?;
        let len = usize::try_from(size_bytes)
            .ok()
            .filter(|_| size_bytes <= MAX_SEGMENT_BYTES)
            .ok_or_else(|| StoreError::InvalidParams("segment too large".to_string()))?;
        let memory = self.inner.engine.map_file_segment(path, offset, len)?;
        self.mount_memory(memory, size_bytes).await
    }

    /// Mounts registered segment memory at the master under a new segment id.
    async fn mount_memory(
        &self,
        memory: MemoryHandle,
        size_bytes: u64,
    ) -> Result<Segment, StoreError> {
        let inner = &self.inner;
        let base = match segment_base(memory.id()) {
            Some(base) => base,
            None => {
                let _ = inner.engine.unregister(memory.id());
                return Err(StoreError::InvalidParams(format!(
                    "segment id {} out of range",
                    memory.id()
                )));
            }
        };
        let endpoint = inner.engine.endpoint();
        let segment = Segment {
            id: SegmentId::random(),
            name: endpoint.tcp_authority(),
            base,
            size: size_bytes,
            te_endpoint: inner.engine.segment_endpoint(memory.id()),
            protocol: inner.config.protocol.clone(),
            host_id: endpoint.host_id().unwrap_or_default().to_string(),
        };
        if let Err(error) = inner
            .master
            .mount_segment(segment.clone(), inner.client_id)
            .await
        {
            let _ = inner.engine.unregister(memory.id());
            return Err(error.into());
        }
        inner.segments.lock().push(MountedSegment {
            memory,
            segment: segment.clone(),
        });
        Ok(segment)
    }

    /// Unmounts this client's segments `ids` (objects stored only there are gone at once, or
    /// after `grace` during which they stay readable and nothing new is placed there), then
    /// frees their memory (after the grace period). Every id is tried; returns the first error
    /// (`InvalidParams` for an id that is not a segment of this client).
    pub async fn unmount_segments(
        &self,
        ids: &[SegmentId],
        grace: Duration,
    ) -> Result<(), StoreError> {
        self.check_open()?;
        let inner = &self.inner;
        let mut first_error = None;
        for id in ids {
            let mounted = {
                let mut segments = inner.segments.lock();
                segments
                    .iter()
                    .position(|s| s.segment.id == *id)
                    .map(|i| segments.remove(i))
            };
            let Some(mounted) = mounted else {
                first_error.get_or_insert(StoreError::InvalidParams(format!(
                    "{id} is not a segment of this client"
                )));
                continue;
            };
            let answer = if grace.is_zero() {
                inner.master.unmount_segment(*id, inner.client_id).await
            } else {
                let ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
                inner
                    .master
                    .graceful_unmount_segment(*id, inner.client_id, ms)
                    .await
            };
            if let Err(error) = answer {
                // Still mounted at the master: keep serving it.
                inner.segments.lock().push(mounted);
                first_error.get_or_insert(error.into());
                continue;
            }
            if grace.is_zero() {
                let _ = inner.engine.unregister(mounted.memory.id());
            } else {
                // Readers may still come during the grace period: serve them until it ends.
                let weak = std::sync::Arc::downgrade(&self.inner);
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    if let Some(inner) = weak.upgrade() {
                        let _ = inner.engine.unregister(mounted.memory.id());
                    }
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sends one heartbeat now; re-mounts every segment when the master asks for it.
    pub async fn heartbeat(&self) -> Result<ClientStatus, StoreError> {
        heartbeat_once(&self.inner).await
    }
}

/// Ping; on NEED_REMOUNT re-mount every segment (same ids); after a re-mount, check the
/// restored replicas the master holds for them (`verify.rs`) until one pass succeeds.
async fn heartbeat_once(inner: &Inner) -> Result<ClientStatus, StoreError> {
    let response = inner.master.ping(inner.client_id).await?;
    if response.client_status == ClientStatus::NEED_REMOUNT {
        let segments: Vec<Segment> = inner
            .segments
            .lock()
            .iter()
            .map(|s| s.segment.clone())
            .collect();
        let count = segments.len();
        inner
            .master
            .remount_segments(segments, inner.client_id)
            .await?;
        inner.stats.remounts.fetch_add(1, Ordering::Relaxed);
        inner.verify_pending.store(true, Ordering::Release);
        if inner.was_ok.load(Ordering::Acquire) {
            tracing::info!(
                master = %inner.config.master_addr,
                segments = count,
                "re-joined the master (it restarted, or had expired this client): segments \
                 re-mounted"
            );
        }
    }
    inner.was_ok.store(true, Ordering::Release);
    if inner.verify_pending.load(Ordering::Acquire) {
        let report = verify_restored(inner).await?;
        inner.verify_pending.store(false, Ordering::Release);
        if report.segments > 0 {
            tracing::info!(
                segments = report.segments,
                verified = report.verified,
                mismatched = report.mismatched,
                "re-joined the master after it restarted: restored replicas checked \
                 (mismatched ones were dropped by the master)"
            );
        }
    }
    Ok(response.client_status)
}

/// Pings every `heartbeat_interval` until the client is dropped or closed; warns once per run
/// of failures. A client with a segment starts its task runner after each successful ping, and
/// every `task_poll_interval` in between when one is set (while the master counts it alive).
pub(super) async fn heartbeat_loop(weak: std::sync::Weak<Inner>) {
    let Some((period, task_period)) = weak.upgrade().map(|inner| {
        let config = &inner.config;
        (config.heartbeat_interval, config.task_poll_interval)
    }) else {
        return;
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut task_ticker = task_period.map(|p| {
        let mut t = tokio::time::interval(p);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut reported = false;
    loop {
        let ping = match &mut task_ticker {
            Some(tasks) => tokio::select! {
                _ = ticker.tick() => true,
                _ = tasks.tick() => false,
            },
            None => {
                ticker.tick().await;
                true
            }
        };
        let Some(inner) = weak.upgrade() else { return };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        if !ping {
            if !reported && inner.was_ok.load(Ordering::Acquire) {
                super::tasks::spawn_runner(&inner);
            }
            continue;
        }
        pins::release_finished(&inner).await;
        match heartbeat_once(&inner).await {
            Ok(_) => {
                inner.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed);
                reported = false;
                super::tasks::spawn_runner(&inner);
            }
            Err(error) => {
                inner
                    .stats
                    .heartbeat_failures
                    .fetch_add(1, Ordering::Relaxed);
                if !reported {
                    tracing::warn!(%error, "heartbeat to the master failed");
                    reported = true;
                }
            }
        }
    }
}
