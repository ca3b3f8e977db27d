//! Taking and restoring snapshots of the master (docs/snapshot.md, "Taking" and "Restoring at
//! start").
//!
//! A [`Snapshotter`] writes snapshots of the live master into its [`SnapshotDir`]: periodically
//! on a thread of its own ([`PeriodicSnapshots`], never on the RPC runtime's workers), on demand
//! (the `TakeSnapshot` RPC, `POST /api/v1/snapshot`, `mooncake snapshot`), and once more after
//! the RPC server stopped at SIGTERM/SIGINT. The take walks the master shard by shard, holding
//! one shard's read lock at a time, so readers and writers keep being served. Concurrent takes
//! are serialized by the directory.
//!
//! [`load_at_start`] picks the newest snapshot that verifies for `--enable_snapshot_restore`,
//! logging every file it skips and why.

use mooncake_master::{MasterService, MasterState, RestoreOptions, RestoreReport};
use mooncake_snapshot::{join_on_threads, EncodeOptions, SnapshotDir, SnapshotError, TakeReport};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::{OpLogSettings, SnapshotSettings};
use crate::metrics::{counter, gauge, Histogram, SnapshotDurationBuckets};
use crate::oplog::{connect_log, OpLogHandle, OpLogSlot};
use mooncake_master::MasterServiceConfig;
use mooncake_oplog::checkpoint::{checkpoint, Checkpoint};
use mooncake_oplog::WriterHealth;

/// For tests only: milliseconds every snapshot pauses after each chunk it writes, so that a test
/// can act while a take is in progress (kill the process, outlast a call's deadline).
pub const TEST_CHUNK_DELAY_ENV: &str = "MC_SNAPSHOT_TEST_CHUNK_DELAY_MS";

fn test_chunk_delay() -> Option<Duration> {
    std::env::var(TEST_CHUNK_DELAY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Counters and gauges of snapshots taken and of the restore at start.
#[derive(Debug, Default)]
pub struct SnapshotMetrics {
    pub taken: AtomicU64,
    pub failed: AtomicU64,
    /// Duration of the last successful take (µs).
    pub last_duration_us: AtomicU64,
    /// Durations of the successful takes (ms): upstream's `master_snapshot_duration_ms`.
    pub durations_ms: Histogram<SnapshotDurationBuckets>,
    /// Size of the last successful snapshot file (bytes).
    pub last_bytes: AtomicU64,
    /// Objects in the last successful snapshot.
    pub last_objects: AtomicU64,
    /// Wall clock when the newest snapshot was written (unix ms; 0 = none yet).
    pub newest_ms: AtomicU64,
    /// The restore at start: 1 when a snapshot was restored.
    pub restored: AtomicU64,
    pub restored_objects: AtomicU64,
    pub restored_segments: AtomicU64,
    pub restore_dropped_objects: AtomicU64,
    /// Snapshot files skipped at start because they did not verify.
    pub restore_skipped_files: AtomicU64,
    /// 1 when the restored snapshot was the final one of a clean shutdown (objects without a
    /// checksum kept).
    pub restore_clean_shutdown: AtomicU64,
    /// With the op-log: compactions done after a snapshot, and those etcd refused or missed.
    pub compactions: AtomicU64,
    pub compactions_failed: AtomicU64,
    /// The compaction floor after the last compaction (batch id and sequence; 0 before one).
    pub floor_batch: AtomicU64,
    pub floor_seq: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SnapshotMetrics {
    /// The op-log's compaction after a snapshot of it.
    fn record_compaction(&self, done: &Checkpoint) {
        match (&done.compaction_error, done.floor) {
            (Some(_), _) => {
                self.compactions_failed.fetch_add(1, Ordering::Relaxed);
            }
            (None, floor) if done.written => {
                self.compactions.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = floor {
                    self.floor_batch.store(f.batch_id, Ordering::Relaxed);
                    self.floor_seq.store(f.last_seq, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }

    fn render_compaction(&self, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            out,
            "mooncake_rs_oplog_compactions_total",
            "Op-log compactions in etcd after a snapshot of the log",
            get(&self.compactions),
        );
        counter(
            out,
            "mooncake_rs_oplog_compactions_failed_total",
            "Snapshots of the log written whose compaction etcd refused or did not answer",
            get(&self.compactions_failed),
        );
        gauge(
            out,
            "mooncake_rs_oplog_compaction_floor_batch",
            "Op-log batches up to this id are deleted from etcd (0: none yet)",
            get(&self.floor_batch) as f64,
        );
        gauge(
            out,
            "mooncake_rs_oplog_compaction_floor_sequence",
            "The last op-log sequence the deleted batches held (0: none yet)",
            get(&self.floor_seq) as f64,
        );
    }

    fn record_take(&self, report: &TakeReport) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(report.duration.as_micros()).unwrap_or(u64::MAX);
        self.last_duration_us.store(us, Ordering::Relaxed);
        self.durations_ms.observe(us / 1000);
        self.last_bytes.store(report.bytes, Ordering::Relaxed);
        self.last_objects.store(report.objects, Ordering::Relaxed);
        self.newest_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Records what the restore at start brought back.
    pub fn record_restore(&self, report: &RestoreReport) {
        for (metric, value) in [
            (&self.restored, 1),
            (&self.restored_objects, report.objects as u64),
            (&self.restored_segments, report.segments as u64),
            (
                &self.restore_dropped_objects,
                report.dropped.objects() as u64,
            ),
        ] {
            metric.store(value, Ordering::Relaxed);
        }
    }

    /// Appends the snapshot families in Prometheus text format; `master` gives the live restore
    /// progress (segments still waiting for their owner, replicas still unverified).
    pub fn render(&self, master: &MasterService, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let newest = get(&self.newest_ms);
        let age = if newest == 0 {
            -1.0
        } else {
            now_ms().saturating_sub(newest) as f64 / 1e3
        };
        let stats = master.verification_stats();
        let counters: [(&str, &str, u64); 5] = [
            (
                "snapshots_taken_total",
                "Snapshots written successfully",
                get(&self.taken),
            ),
            (
                "snapshots_failed_total",
                "Snapshots that failed",
                get(&self.failed),
            ),
            (
                "restore_verified_replicas_total",
                "Restored replicas whose node confirmed their checksum",
                stats.verified,
            ),
            (
                "restore_dropped_replicas_total",
                "Restored replicas dropped (checksum mismatch or no confirmation in time)",
                stats.mismatched + stats.timed_out,
            ),
            (
                "restore_expired_segments_total",
                "Restored segments dropped because their owner did not re-mount in time",
                stats.segments_expired,
            ),
        ];
        let gauges: [(&str, &str, f64); 12] = [
            (
                "snapshot_duration_seconds",
                "Duration of the last successful snapshot",
                get(&self.last_duration_us) as f64 / 1e6,
            ),
            (
                "snapshot_size_bytes",
                "Size of the last successful snapshot file",
                get(&self.last_bytes) as f64,
            ),
            (
                "snapshot_objects",
                "Objects in the last successful snapshot",
                get(&self.last_objects) as f64,
            ),
            (
                "snapshot_age_seconds",
                "Age of the newest snapshot this master wrote (-1: none yet)",
                age,
            ),
            (
                "restore_restored",
                "1 when this master restored a snapshot at start",
                get(&self.restored) as f64,
            ),
            (
                "restore_clean_shutdown",
                "1 when the restored snapshot was the final one of a clean shutdown",
                get(&self.restore_clean_shutdown) as f64,
            ),
            (
                "restore_objects",
                "Objects restored from the snapshot at start",
                get(&self.restored_objects) as f64,
            ),
            (
                "restore_segments",
                "Segments restored from the snapshot at start",
                get(&self.restored_segments) as f64,
            ),
            (
                "restore_dropped_objects",
                "Objects of the snapshot not restored (in flight, overlapping, without checksum)",
                get(&self.restore_dropped_objects) as f64,
            ),
            (
                "restore_skipped_files",
                "Snapshot files skipped at start because they did not verify",
                get(&self.restore_skipped_files) as f64,
            ),
            (
                "restore_waiting_segments",
                "Restored segments still waiting for their owner to re-mount",
                master.waiting_segments().len() as f64,
            ),
            (
                "restore_unverified_replicas",
                "Restored replicas still waiting for their node's checksum check",
                stats.pending as f64,
            ),
        ];
        for (name, help, value) in counters {
            counter(out, &format!("mooncake_rs_{name}"), help, value);
        }
        self.render_compaction(out);
        // Upstream's names for the same counts (its newer master).
        counter(
            out,
            "master_snapshot_success",
            "Total number of successful snapshot operations",
            get(&self.taken),
        );
        counter(
            out,
            "master_snapshot_fail",
            "Total number of failed snapshot operations",
            get(&self.failed),
        );
        self.durations_ms.render(
            out,
            "master_snapshot_duration_ms",
            "Distribution of snapshot operation durations in milliseconds",
        );
        for (name, help, value) in gauges {
            gauge(out, &format!("mooncake_rs_{name}"), help, value);
        }
    }
}

/// With `--enable_oplog`: snapshots are of the log, taken by the master that writes it.
#[derive(Debug)]
pub struct LogSnapshots {
    /// This master's op-log, once it writes one (at start, or at promotion).
    pub slot: Arc<OpLogSlot>,
    pub settings: OpLogSettings,
    /// The settings of the scratch master the log is folded on.
    pub config: MasterServiceConfig,
}

impl LogSnapshots {
    /// This master's op-log while it writes it (not fenced).
    fn writer(&self) -> Option<&Arc<OpLogHandle>> {
        self.slot
            .get()
            .filter(|h| h.sink().health() != WriterHealth::Fenced)
    }
}

/// Writes snapshots of one master into one directory.
#[derive(Debug)]
pub struct Snapshotter {
    master: Arc<MasterService>,
    dir: SnapshotDir,
    path: PathBuf,
    options: EncodeOptions,
    metrics: Arc<SnapshotMetrics>,
    of_log: Option<LogSnapshots>,
    /// One snapshot of the log at a time: a second one's follower could otherwise find batches
    /// the first one's compaction deleted while it read.
    log_takes: parking_lot::Mutex<()>,
}

impl Snapshotter {
    /// Opens (creates) `path`; keeps the `retention` newest snapshots.
    pub fn open(
        master: Arc<MasterService>,
        path: &Path,
        retention: usize,
        metrics: Arc<SnapshotMetrics>,
    ) -> Result<Snapshotter, SnapshotError> {
        let mut options = EncodeOptions::default();
        if let Some(delay) = test_chunk_delay() {
            tracing::warn!(
                "{TEST_CHUNK_DELAY_ENV}={} ms: every snapshot pauses after each chunk (for tests \
                 only)",
                delay.as_millis()
            );
            options.test_chunk_delay = delay;
        }
        Ok(Snapshotter {
            master,
            dir: SnapshotDir::open(path, retention)?,
            path: path.to_path_buf(),
            options,
            metrics,
            of_log: None,
            log_takes: parking_lot::Mutex::new(()),
        })
    }

    /// With the op-log: every take is a snapshot of the log's fold at the durable prefix,
    /// followed by the log's compaction (docs/oplog.md, "Compaction"), instead of a walk of the
    /// live master.
    pub fn of_log(mut self, of_log: Option<LogSnapshots>) -> Self {
        self.of_log = of_log;
        self
    }

    /// False on a master with the op-log that does not write it (a standby, a leader that
    /// stepped down): the periodic thread passes.
    pub fn may_take(&self) -> bool {
        self.of_log.as_ref().is_none_or(|l| l.writer().is_some())
    }

    /// The directory snapshots go to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metrics(&self) -> &Arc<SnapshotMetrics> {
        &self.metrics
    }

    /// Takes one snapshot now (waits for a take in progress first), logs and counts it.
    /// `why` names the trigger in the log line.
    pub fn take(&self, why: &str) -> Result<TakeReport, SnapshotError> {
        let taken = match &self.of_log {
            Some(of_log) => self.take_of_log(of_log, why),
            None => self.dir.take(&self.master, 0, &self.options),
        };
        match taken {
            Ok(report) => {
                self.metrics.record_take(&report);
                tracing::info!(
                    "{why} snapshot written: {} ({} bytes, {} objects, {} ms)",
                    report.path.display(),
                    report.bytes,
                    report.objects,
                    report.duration.as_millis()
                );
                Ok(report)
            }
            Err(error) => {
                self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    "{why} snapshot into {} failed: {error}",
                    self.path.display()
                );
                Err(error)
            }
        }
    }

    /// A snapshot of the log and the compaction after it, on a thread of its own with its own
    /// runtime (callers may be on the RPC runtime or on none).
    fn take_of_log(&self, of_log: &LogSnapshots, why: &str) -> Result<TakeReport, SnapshotError> {
        let handle = of_log.writer().ok_or_else(|| {
            SnapshotError::OpLog(
                "this master does not write the op-log (a standby, or a leader that stepped \
                 down): the leader takes the snapshots"
                    .into(),
            )
        })?;
        let _one_at_a_time = self.log_takes.lock();
        let fence = handle.view_fence().cloned();
        let run = || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start a runtime: {e}"))?;
            runtime.block_on(async {
                let log = connect_log(&of_log.settings).await?.with_fence(fence);
                checkpoint(of_log.config.clone(), &log, &self.dir, &self.options).await
            })
        };
        let done = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("mc-snapshot-log".into())
                .spawn_scoped(scope, run)
                .map_err(|e| format!("cannot start the thread: {e}"))?
                .join()
                .unwrap_or_else(|_| Err("the snapshot of the log panicked".into()))
        })
        .map_err(SnapshotError::OpLog)?;
        self.metrics.record_compaction(&done);
        if !done.written {
            tracing::info!(
                "{why} snapshot: {} already includes the durable prefix (sequence {})",
                done.report.path.display(),
                done.prefix.last_seq
            );
        }
        match (&done.compaction_error, done.floor) {
            (Some(e), _) => tracing::warn!("{why} snapshot written, the log not compacted: {e}"),
            (None, Some(floor)) => tracing::info!(
                "op-log compacted: batches up to {} (sequence {}) deleted",
                floor.batch_id,
                floor.last_seq
            ),
            (None, None) => {}
        }
        Ok(done.report)
    }

    /// The snapshot of a clean shutdown, taken once the RPC and HTTP servers and the workers
    /// stopped: written like any other, then marked final (the next master may trust it for
    /// what it cannot verify, and removes the mark before it serves).
    pub fn take_final(&self) -> Result<TakeReport, SnapshotError> {
        let report = self.take("final")?;
        if let Err(error) = self.dir.mark_final(&report) {
            tracing::error!(
                "cannot mark snapshot {} as final: {error}; a restore from it will verify \
                 every replica (and drop objects without a checksum)",
                report.path.display()
            );
        }
        Ok(report)
    }

    /// [`Snapshotter::take`] from inside the tokio runtime: a worker that blocks here hands its
    /// other tasks to the runtime first, so calls keep being served during the take.
    pub fn take_blocking_in_runtime(&self, why: &str) -> Result<TakeReport, SnapshotError> {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread {
            tokio::task::block_in_place(|| self.take(why))
        } else {
            self.take(why)
        }
    }
}

/// The thread that takes a snapshot every period until stopped.
#[derive(Debug)]
pub struct PeriodicSnapshots {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl PeriodicSnapshots {
    pub fn start(snapshotter: Arc<Snapshotter>, period: Duration) -> std::io::Result<Self> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("mc-snapshot".into())
            .spawn(move || loop {
                match stopped.recv_timeout(period) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        if snapshotter.may_take() {
                            let _ = snapshotter.take("periodic");
                        }
                    }
                    _ => return,
                }
            })?;
        Ok(PeriodicSnapshots { stop, thread })
    }

    /// Stops the thread (a take in progress finishes first).
    pub fn stop(self) {
        drop(self.stop);
        if self.thread.join().is_err() {
            tracing::error!("the snapshot thread panicked");
        }
    }
}

/// What [`load_at_start`] found.
#[derive(Debug)]
pub struct StartState {
    /// The restored state, the file it came from, and how to restore it.
    pub loaded: Option<(PathBuf, MasterState, RestoreOptions)>,
    /// Files skipped because they did not verify.
    pub skipped: usize,
    /// The loaded snapshot was the final one of a clean shutdown (see
    /// [`Snapshotter::take_final`]): restored without requiring a checksum.
    pub clean_shutdown: bool,
}

/// At start, with a snapshot directory: every clean-shutdown mark is removed before this master
/// serves (its state moves away from every snapshot there). With `--enable_snapshot_restore`,
/// first the newest snapshot that verifies is loaded; every skipped file is logged with its
/// reason. With none left: an error line and an empty start, or `Err` (the process exits
/// non-zero) with `--snapshot_required`. The restore verifies every memory replica through its
/// node, and drops objects without a checksum, unless the snapshot is the final one of a clean
/// shutdown whose mark could be removed.
pub fn load_at_start(settings: &SnapshotSettings) -> Result<StartState, String> {
    let mut start = StartState {
        loaded: None,
        skipped: 0,
        clean_shutdown: false,
    };
    let Some(path) = settings.dir.as_deref() else {
        return Ok(start);
    };
    let dir = SnapshotDir::open(path, settings.retention)
        .map_err(|e| format!("cannot open the snapshot directory {}: {e}", path.display()))?;
    let outcome =
        if settings.restore {
            Some(dir.load_newest().map_err(|e| {
                format!("cannot read the snapshot directory {}: {e}", path.display())
            })?)
        } else {
            None
        };
    let cleared = dir.clear_final_marks();
    if let Err(error) = &cleared {
        tracing::error!(
            "cannot remove the clean-shutdown marks in {}: {error}",
            path.display()
        );
    }
    let Some(outcome) = outcome else {
        return Ok(start);
    };
    for (file, reason) in &outcome.skipped {
        tracing::error!(
            "snapshot {} skipped: {reason}; trying the next older one",
            file.display()
        );
    }
    start.skipped = outcome.skipped.len();
    let Some((file, meta, state)) = outcome.loaded else {
        return no_snapshot(path, start, settings.required);
    };
    start.clean_shutdown = outcome.is_final && cleared.is_ok();
    tracing::info!(
        "restoring snapshot {} (id {}, taken at unix ms {}, {} objects, {} segments{})",
        file.display(),
        meta.id,
        meta.created_ms,
        state.objects.len(),
        state.segments.len(),
        if start.clean_shutdown {
            ", the final one of a clean shutdown"
        } else {
            ""
        }
    );
    let options = RestoreOptions {
        verify_required: !start.clean_shutdown,
        join: Some(join_on_threads),
        ..RestoreOptions::default()
    };
    start.loaded = Some((file, state, options));
    Ok(start)
}

/// No snapshot to restore: an empty start (a warning for an empty directory, an error when
/// files were skipped), or `Err` with `--snapshot_required`.
fn no_snapshot(path: &Path, start: StartState, required: bool) -> Result<StartState, String> {
    let skipped = start.skipped;
    let what = if skipped == 0 {
        format!("no snapshot in {}", path.display())
    } else {
        format!(
            "no snapshot in {} verifies ({skipped} skipped)",
            path.display()
        )
    };
    if required {
        return Err(format!(
            "{what}; --snapshot_required refuses to start empty"
        ));
    }
    if skipped == 0 {
        tracing::warn!("{what}: starting empty");
    } else {
        tracing::error!("{what}: starting empty");
    }
    Ok(start)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::{ConfigError, MasterConfig};
    use mooncake_common::{ClientId, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId};

    fn config(edit: impl FnOnce(&mut MasterConfig)) -> MasterConfig {
        let mut c = MasterConfig::default();
        edit(&mut c);
        c
    }

    /// The flag a validation error names.
    fn refused_flag(c: &MasterConfig, env_dir: Option<&str>) -> &'static str {
        match c.snapshot_settings(env_dir.map(Into::into)) {
            Err(ConfigError::Invalid { flag, .. }) => flag,
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn bad_snapshot_flags_are_refused_naming_the_flag() {
        let dir = |c: &mut MasterConfig| c.snapshot_dir = "/tmp/mc-snapshots".into();
        // A zero interval, with periodic snapshots on.
        let c = config(|c| {
            dir(c);
            c.enable_snapshot = true;
            c.snapshot_interval_seconds = 0;
        });
        assert_eq!(refused_flag(&c, None), "snapshot_interval_seconds");
        // Retention 0 would delete the snapshot just written.
        let c = config(|c| {
            dir(c);
            c.snapshot_retention_count = 0;
        });
        assert_eq!(refused_flag(&c, None), "snapshot_retention_count");
        // Snapshots or restore without a directory (neither flag nor environment).
        let c = config(|c| c.enable_snapshot = true);
        assert_eq!(refused_flag(&c, None), "enable_snapshot");
        let c = config(|c| c.enable_snapshot_restore = true);
        assert_eq!(refused_flag(&c, None), "enable_snapshot_restore");
        // --snapshot_required means nothing without restore.
        let c = config(|c| {
            dir(c);
            c.snapshot_required = true;
        });
        assert_eq!(refused_flag(&c, None), "snapshot_required");
        // The environment variable stands in for --snapshot_dir; the flag wins over it.
        let c = config(|c| c.enable_snapshot_restore = true);
        let s = c.snapshot_settings(Some("/tmp/from-env".into())).unwrap();
        assert_eq!(s.dir, Some(PathBuf::from("/tmp/from-env")));
        let c = config(|c| {
            dir(c);
            c.enable_snapshot = true;
        });
        let s = c.snapshot_settings(Some("/tmp/from-env".into())).unwrap();
        assert_eq!(s.dir, Some(PathBuf::from("/tmp/mc-snapshots")));
        assert_eq!(s.periodic, Some(Duration::from_secs(600)));
        assert_eq!(s.retention, 2);
    }

    fn settings(dir: &Path, restore: bool, required: bool) -> SnapshotSettings {
        SnapshotSettings {
            dir: Some(dir.to_path_buf()),
            periodic: None,
            retention: 2,
            restore,
            required,
        }
    }

    fn master() -> Arc<MasterService> {
        Arc::new(
            MasterService::new(
                Default::default(),
                Arc::new(mooncake_common::SystemClock::new()),
            )
            .unwrap(),
        )
    }

    #[test]
    fn a_directory_that_cannot_be_created_is_refused_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let unusable = file.join("snapshots");
        let metrics = Arc::new(SnapshotMetrics::default());
        assert!(Snapshotter::open(master(), &unusable, 2, metrics).is_err());
        let error = load_at_start(&settings(&unusable, true, false)).unwrap_err();
        assert!(
            error.contains("cannot open the snapshot directory"),
            "{error}"
        );
    }

    #[test]
    fn snapshot_required_refuses_an_empty_or_unusable_directory() {
        let tmp = tempfile::tempdir().unwrap();
        // Empty: refused with the flag, an empty start without it.
        let error = load_at_start(&settings(tmp.path(), true, true)).unwrap_err();
        assert!(error.contains("--snapshot_required"), "{error}");
        let start = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        assert!(start.loaded.is_none() && start.skipped == 0);
        // Only a damaged file: refused naming the count skipped.
        std::fs::write(
            tmp.path().join("snapshot-00000000000000000001.mcs"),
            b"MOONSNAP but not really",
        )
        .unwrap();
        let error = load_at_start(&settings(tmp.path(), true, true)).unwrap_err();
        assert!(
            error.contains("verifies (1 skipped)") && error.contains("--snapshot_required"),
            "{error}"
        );
        let start = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        assert!(start.loaded.is_none());
        assert_eq!(start.skipped, 1);
    }

    #[test]
    fn the_final_snapshot_is_restored_without_required_checksums_once_and_only_once() {
        let tmp = tempfile::tempdir().unwrap();
        let m = master();
        let client = ClientId::new(1, 1);
        let segment = Segment {
            id: SegmentId::new(1, 1),
            name: "s".into(),
            base: 1 << 30,
            size: 1 << 20,
            te_endpoint: "127.0.0.1:1".into(),
            protocol: "tcp".into(),
            host_id: String::new(),
        };
        m.mount_segment(&segment, client).unwrap();
        m.put_start(client, "k", 100, &ReplicateConfig::default(), "")
            .unwrap();
        let meta = ObjectMeta {
            key: "k".into(),
            object_checksum: None,
        };
        m.put_end(client, &meta, ReplicaType::ALL, "").unwrap();
        let metrics = Arc::new(SnapshotMetrics::default());
        let snapshots = Snapshotter::open(m, tmp.path(), 2, metrics).unwrap();
        // A periodic or on-demand snapshot: every replica is verified at restore, so the object
        // without a checksum cannot come back.
        snapshots.take("on-demand").unwrap();
        let start = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        let (_, state, options) = start.loaded.unwrap();
        assert!(!start.clean_shutdown && options.verify_required);
        let restored = master().restore(state, options).unwrap();
        assert_eq!(restored.objects, 0);
        assert_eq!(restored.dropped.no_checksum_objects, 1);
        // The final one: trusted once; the restoring master removes the mark before it serves.
        let report = snapshots.take_final().unwrap();
        let start = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        let (file, state, options) = start.loaded.unwrap();
        assert_eq!(file, report.path);
        assert!(start.clean_shutdown && !options.verify_required);
        assert!(options.join.is_some());
        let restored = master().restore(state, options).unwrap();
        assert_eq!(restored.objects, 1);
        let again = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        assert!(!again.clean_shutdown);
        assert!(again.loaded.unwrap().2.verify_required);
        // A master that starts without restore also clears the mark.
        snapshots.take_final().unwrap();
        load_at_start(&settings(tmp.path(), false, false)).unwrap();
        let after = load_at_start(&settings(tmp.path(), true, false)).unwrap();
        assert!(!after.clean_shutdown);
    }
}
