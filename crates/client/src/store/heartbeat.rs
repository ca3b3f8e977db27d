//! The segment this client contributes and keeping it known to the master: `mount_segment`,
//! the heartbeat (`Ping` every `heartbeat_interval`) and the re-mount the master asks for with
//! `NEED_REMOUNT` after it restarted or expired this client.

use mooncake_common::{ClientStatus, Segment, SegmentId};
use mooncake_transfer::SegmentOptions;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::addressing::segment_base;
use super::{Inner, MountedSegment, StoreClient, StoreError};

impl StoreClient {
    /// Allocates `size_bytes` of shareable memory and mounts it at the master.
    pub async fn mount_segment(&self, size_bytes: u64) -> Result<Segment, StoreError> {
        self.check_open()?;
        let inner = &self.inner;
        let len = usize::try_from(size_bytes)
            .map_err(|_| StoreError::InvalidParams("segment too large".to_string()))?;
        let memory = inner
            .engine
            .allocate_segment(len, SegmentOptions::default())?;
        let base = segment_base(memory.id()).ok_or_else(|| {
            StoreError::InvalidParams(format!("segment id {} out of range", memory.id()))
        })?;
        let endpoint = inner.engine.endpoint();
        let segment = Segment {
            id: SegmentId::random(),
            name: endpoint.tcp_authority(),
            base,
            size: size_bytes,
            te_endpoint: endpoint.to_string(),
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

    /// Sends one heartbeat now; re-mounts every segment when the master asks for it.
    pub async fn heartbeat(&self) -> Result<ClientStatus, StoreError> {
        heartbeat_once(&self.inner).await
    }
}

async fn heartbeat_once(inner: &Inner) -> Result<ClientStatus, StoreError> {
    let response = inner.master.ping(inner.client_id).await?;
    if response.client_status == ClientStatus::NEED_REMOUNT {
        let segments: Vec<Segment> = inner
            .segments
            .lock()
            .iter()
            .map(|s| s.segment.clone())
            .collect();
        inner
            .master
            .remount_segments(segments, inner.client_id)
            .await?;
        inner.stats.remounts.fetch_add(1, Ordering::Relaxed);
    }
    Ok(response.client_status)
}

/// Pings every `period` until the client is dropped or closed; warns once per run of failures.
pub(super) async fn heartbeat_loop(inner: std::sync::Weak<Inner>, period: Duration) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = false;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        match heartbeat_once(&inner).await {
            Ok(_) => {
                inner.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed);
                reported = false;
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
