//! Compaction (docs/oplog.md, "Compaction"): a snapshot of the log's fold at a durable prefix
//! (built on a scratch master from the previous snapshot and the log after it, so it holds
//! exactly the entries up to the prefix), then the deletion from etcd of the batches that every
//! snapshot the directory keeps already includes. And the other way: a start from the newest
//! snapshot of the log and the batches after it ([`bootstrap`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mooncake_common::SystemClock;
use mooncake_master::{MasterService, MasterServiceConfig, MasterState};
use mooncake_snapshot::{EncodeOptions, SnapshotDir, SnapshotMeta, TakeReport};

use crate::etcd::{EtcdLog, Prefix};
use crate::follow::LogFollower;

/// A follower positioned after the snapshot loaded into its master (if any).
#[derive(Debug)]
pub struct Bootstrapped<'a> {
    pub follower: LogFollower<'a>,
    /// The snapshot loaded: its file, header and object count.
    pub snapshot: Option<(PathBuf, SnapshotMeta, usize)>,
}

/// Loads into the empty `master` the newest snapshot of the log in `dir` (one with an op-log
/// position; the newest that verifies, damaged newer files logged and passed over) and returns
/// a follower that continues the log after it. Fails loudly, never skipping, when the log was
/// compacted past what a usable snapshot includes (or there is none).
pub async fn bootstrap<'a>(
    master: &'a MasterService,
    log: &EtcdLog,
    dir: Option<&SnapshotDir>,
) -> Result<Bootstrapped<'a>, String> {
    let read = |e: crate::etcd::EtcdError| format!("cannot read the op-log's compaction keys: {e}");
    let floor = log.read_floor().await.map_err(read)?;
    let latest = log.read_latest().await.map_err(read)?;
    let floor_seq = floor.map_or(0, |f| f.last_seq);
    let loaded = match dir {
        Some(dir) => newest_of_the_log(dir)?,
        None => None,
    };
    let Some((path, meta, state)) = loaded else {
        if let Some(f) = floor {
            return Err(format!(
                "the op-log was compacted up to sequence {} (batch {}) and {}: the master cannot \
                 start from the log alone; give it the snapshot directory the leader writes to \
                 (--snapshot_dir)",
                f.last_seq,
                f.batch_id,
                match dir {
                    Some(d) => format!("no snapshot of the log in {} verifies", d.path().display()),
                    None => "no snapshot directory is configured".into(),
                }
            ));
        }
        return Ok(Bootstrapped {
            follower: LogFollower::new(master),
            snapshot: None,
        });
    };
    if meta.oplog_position < floor_seq {
        return Err(format!(
            "the newest snapshot of the log that verifies, {}, includes sequence {}, but the \
             op-log was compacted up to sequence {floor_seq}: the entries between are lost",
            path.display(),
            meta.oplog_position
        ));
    }
    master
        .load_state(&state)
        .map_err(|e| format!("snapshot {} does not load: {e}", path.display()))?;
    tracing::info!(
        "op-log: loaded snapshot {} (sequence {}, {} objects); following the log after it",
        path.display(),
        meta.oplog_position,
        state.objects.len()
    );
    let objects = state.objects.len();
    // The batch the snapshot ends with, when a published prefix names it: the follower reads
    // from there, so a compaction running meanwhile (which deletes at most up to the newest
    // published snapshot) cannot take a batch it still reads. Else from the floor on.
    let after_batch = [latest, floor]
        .into_iter()
        .flatten()
        .find(|p| p.last_seq == meta.oplog_position)
        .or(floor)
        .map_or(0, |p| p.batch_id);
    Ok(Bootstrapped {
        follower: LogFollower::at(master, after_batch, meta.oplog_position),
        snapshot: Some((path, meta, objects)),
    })
}

/// The newest snapshot in `dir` with an op-log position that verifies.
fn newest_of_the_log(
    dir: &SnapshotDir,
) -> Result<Option<(PathBuf, SnapshotMeta, MasterState)>, String> {
    let outcome = dir
        .load_newest_where(|meta| meta.oplog_position > 0)
        .map_err(|e| format!("cannot read {}: {e}", dir.path().display()))?;
    for (file, reason) in &outcome.skipped {
        tracing::error!(
            "snapshot {} skipped: {reason}; trying the next older one",
            file.display()
        );
    }
    Ok(outcome.loaded)
}

/// What [`checkpoint`] did.
#[derive(Debug)]
pub struct Checkpoint {
    /// The snapshot (an existing one when the log had not grown since it).
    pub report: TakeReport,
    /// The durable prefix it includes.
    pub prefix: Prefix,
    /// The compaction floor after it (`None`: nothing deleted yet).
    pub floor: Option<Prefix>,
    /// False when the newest snapshot already included the prefix (nothing written).
    pub written: bool,
    /// Why the log was not compacted after a snapshot was written (etcd did not answer, this
    /// master no longer leads); the next snapshot tries again.
    pub compaction_error: Option<String>,
}

/// Writes a snapshot of the log's fold at the durable prefix into `dir`, publishes it in etcd
/// and compacts the log (see the module doc). With `log` fenced, a master that no longer leads
/// deletes nothing.
pub async fn checkpoint(
    config: MasterServiceConfig,
    log: &EtcdLog,
    dir: &SnapshotDir,
    options: &EncodeOptions,
) -> Result<Checkpoint, String> {
    let started = Instant::now();
    let scratch = MasterService::new(config, Arc::new(SystemClock::new()))
        .map_err(|e| format!("cannot create the scratch master: {e}"))?;
    let mut boot = bootstrap(&scratch, log, Some(dir)).await?;
    let prefix = boot
        .follower
        .catch_up(log)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the op-log is empty: nothing to snapshot")?;
    if let Some((path, meta, objects)) = boot.snapshot.take() {
        if meta.oplog_position == prefix.last_seq {
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            let report = TakeReport {
                id: meta.id,
                path,
                bytes,
                objects: objects as u64,
                duration: started.elapsed(),
            };
            let floor = log.read_floor().await.map_err(|e| e.to_string())?;
            return Ok(Checkpoint {
                report,
                prefix,
                floor,
                written: false,
                compaction_error: None,
            });
        }
    }
    let report = dir
        .take(&scratch, prefix.last_seq, options)
        .map_err(|e| format!("cannot write the snapshot: {e}"))?;
    drop(boot);
    drop(scratch);
    let (floor, compaction_error) = match compact(log, dir.retention(), prefix).await {
        Ok(floor) => (floor, None),
        Err(e) => (None, Some(e)),
    };
    Ok(Checkpoint {
        report,
        prefix,
        floor,
        written: true,
        compaction_error,
    })
}

/// Publishes `prefix` as the newest snapshot's and moves the floor to the oldest snapshot the
/// directory keeps: the previous one published with a retention of 2 or more (so a standby
/// that lags by less than a snapshot period, or a newest file found damaged, still has its log),
/// this one with a retention of 1. Then compacts etcd's history.
async fn compact(
    log: &EtcdLog,
    retention: usize,
    prefix: Prefix,
) -> Result<Option<Prefix>, String> {
    let etcd = |e: crate::etcd::EtcdError| format!("compaction: {e}");
    let old_floor = log.read_floor().await.map_err(etcd)?;
    let previous = log.read_latest().await.map_err(etcd)?;
    let target = if retention >= 2 {
        previous
    } else {
        Some(prefix)
    };
    let floor = match (target, old_floor) {
        (Some(t), Some(o)) if t.batch_id <= o.batch_id => Some(o),
        (Some(t), _) => Some(t),
        (None, o) => o,
    };
    let revision = log.compact(prefix, old_floor, floor).await.map_err(etcd)?;
    if let Err(e) = log.compact_history(revision).await {
        tracing::warn!("op-log compaction: etcd's history was not compacted: {e}");
    }
    Ok(floor)
}
