//! The node's side of a master restore: after the master restored its state from a snapshot and
//! this client mounted its segments again, the master holds the restored replicas of those
//! segments unreadable until this client confirms that the bytes in each range still have the
//! object's checksum. [`StoreClient::verify_restored_replicas`] pages through them
//! (`GetUnverifiedReplicas`), computes CRC32C of each range in its own segment memory (the same
//! [`checksum_of`] the put path records at PutEnd) and reports the verdicts (`ConfirmReplicas`).
//! Reads of this client's memory by peers go on meanwhile; nothing here writes to it.

use mooncake_common::{ErrorCode, ReplicaId, SegmentId};
use mooncake_proto::methods::UnverifiedReplica;
use mooncake_transfer::MemoryHandle;
use std::sync::atomic::Ordering;

use super::{checksum_of, Inner, StoreClient, StoreError};

/// Replicas asked for per page (the master caps a page at 4096 and about 1 GiB of ranges).
const PAGE_REPLICAS: u64 = 4096;
/// Bytes copied out of the segment per checksum step.
const CHUNK_BYTES: usize = 1 << 20;

/// What one verification pass found, over every segment of this client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Segments that had restored replicas to check.
    pub segments: u64,
    /// Replicas whose bytes matched (readable again).
    pub verified: u64,
    /// Replicas whose bytes did not match (or lay outside the segment); the master dropped them.
    pub mismatched: u64,
}

impl StoreClient {
    /// Checks every restored replica the master holds for this client's segments and reports
    /// the verdicts. Nothing to do (the usual case, or a master without restore) is an empty
    /// report. The heartbeat runs it after each re-mount.
    pub async fn verify_restored_replicas(&self) -> Result<VerifyReport, StoreError> {
        self.check_open()?;
        verify_restored(&self.inner).await
    }
}

/// CRC32C of `len` bytes at `offset` of `memory`, or `None` when the range is not inside it.
fn range_checksum(memory: &MemoryHandle, offset: u64, len: u64, buf: &mut [u8]) -> Option<u64> {
    let start = usize::try_from(offset).ok()?;
    let len = usize::try_from(len).ok()?;
    if start.checked_add(len)? > memory.len_bytes() {
        return None;
    }
    if len <= buf.len() {
        memory.read_at(start, &mut buf[..len]).ok()?;
        return Some(checksum_of(&[&buf[..len]]));
    }
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut done = 0;
    while done < len {
        let step = buf.len().min(len - done);
        memory.read_at(start + done, &mut buf[..step]).ok()?;
        digest.update(&buf[..step]);
        done += step;
    }
    Some(digest.finalize())
}

/// Splits a page into matching and not matching ids (CPU work: run off the async threads).
fn check_page(
    memory: &MemoryHandle,
    page: &[UnverifiedReplica],
) -> (Vec<ReplicaId>, Vec<ReplicaId>) {
    let largest = page.iter().map(|r| r.len).max().unwrap_or(0);
    let mut buf = vec![
        0u8;
        usize::try_from(largest)
            .unwrap_or(CHUNK_BYTES)
            .min(CHUNK_BYTES)
    ];
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for r in page {
        if range_checksum(memory, r.offset, r.len, &mut buf) == Some(r.checksum) {
            good.push(r.id);
        } else {
            bad.push(r.id);
        }
    }
    (good, bad)
}

pub(super) async fn verify_restored(inner: &Inner) -> Result<VerifyReport, StoreError> {
    let segments: Vec<(SegmentId, MemoryHandle)> = inner
        .segments
        .lock()
        .iter()
        .map(|s| (s.segment.id, s.memory.clone()))
        .collect();
    let mut report = VerifyReport::default();
    for (segment, memory) in segments {
        let mut after = ReplicaId(0);
        let mut counted = false;
        loop {
            let page = match inner
                .master
                .get_unverified_replicas(inner.client_id, segment, after, PAGE_REPLICAS)
                .await
            {
                Ok(page) => page,
                // A master that does not restore has nothing to check.
                Err(error) if error.code() == ErrorCode::NOT_SUPPORTED => return Ok(report),
                Err(error) => return Err(error.into()),
            };
            let Some(last) = page.last().map(|r| r.id) else {
                break;
            };
            // Pages move forward (ids ascending above `after`); anything else ends the pass.
            if last <= after || page.iter().any(|r| r.id <= after) {
                return Err(StoreError::InvalidParams(format!(
                    "the master's unverified replicas of segment {segment} do not advance past {}",
                    after.0
                )));
            }
            after = last;
            if !counted {
                report.segments += 1;
                counted = true;
            }
            let memory = memory.clone();
            let (good, bad) = tokio::task::spawn_blocking(move || check_page(&memory, &page))
                .await
                .map_err(|e| StoreError::InvalidParams(format!("checksum task failed: {e}")))?;
            report.verified += good.len() as u64;
            report.mismatched += bad.len() as u64;
            inner
                .stats
                .verified_replicas
                .fetch_add(good.len() as u64, Ordering::Relaxed);
            inner
                .stats
                .mismatched_replicas
                .fetch_add(bad.len() as u64, Ordering::Relaxed);
            inner
                .master
                .confirm_replicas(inner.client_id, segment, good, bad)
                .await?;
        }
    }
    Ok(report)
}
