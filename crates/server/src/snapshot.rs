//! Taking and restoring snapshots of the master (docs/snapshot.md, "Taking and restoring").
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

use mooncake_master::{MasterService, MasterState};
use mooncake_snapshot::{EncodeOptions, SnapshotDir, SnapshotError, TakeReport};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::SnapshotSettings;
use crate::metrics::{counter, gauge};

/// Counters and gauges of snapshots taken and of the restore at start.
#[derive(Debug, Default)]
pub struct SnapshotMetrics {
    pub taken: AtomicU64,
    pub failed: AtomicU64,
    /// Duration of the last successful take (µs).
    pub last_duration_us: AtomicU64,
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
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl SnapshotMetrics {
    fn record_take(&self, report: &TakeReport) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(report.duration.as_micros()).unwrap_or(u64::MAX);
        self.last_duration_us.store(us, Ordering::Relaxed);
        self.last_bytes.store(report.bytes, Ordering::Relaxed);
        self.last_objects.store(report.objects, Ordering::Relaxed);
        self.newest_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Appends the snapshot families in Prometheus text format; `master` gives the live restore
    /// progress (segments still waiting for their owner, replicas still unverified).
    pub fn render(&self, master: &MasterService, out: &mut String) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            out,
            "mooncake_rs_snapshots_taken_total",
            "Snapshots written successfully",
            get(&self.taken),
        );
        counter(
            out,
            "mooncake_rs_snapshots_failed_total",
            "Snapshots that failed",
            get(&self.failed),
        );
        gauge(
            out,
            "mooncake_rs_snapshot_duration_seconds",
            "Duration of the last successful snapshot",
            get(&self.last_duration_us) as f64 / 1e6,
        );
        gauge(
            out,
            "mooncake_rs_snapshot_size_bytes",
            "Size of the last successful snapshot file",
            get(&self.last_bytes) as f64,
        );
        gauge(
            out,
            "mooncake_rs_snapshot_objects",
            "Objects in the last successful snapshot",
            get(&self.last_objects) as f64,
        );
        let newest = get(&self.newest_ms);
        let age = if newest == 0 {
            -1.0
        } else {
            now_ms().saturating_sub(newest) as f64 / 1e3
        };
        gauge(
            out,
            "mooncake_rs_snapshot_age_seconds",
            "Age of the newest snapshot this master wrote (-1: none yet)",
            age,
        );
        gauge(
            out,
            "mooncake_rs_restore_restored",
            "1 when this master restored a snapshot at start",
            get(&self.restored) as f64,
        );
        gauge(
            out,
            "mooncake_rs_restore_objects",
            "Objects restored from the snapshot at start",
            get(&self.restored_objects) as f64,
        );
        gauge(
            out,
            "mooncake_rs_restore_segments",
            "Segments restored from the snapshot at start",
            get(&self.restored_segments) as f64,
        );
        gauge(
            out,
            "mooncake_rs_restore_dropped_objects",
            "Objects of the snapshot not restored (in flight, overlapping, without checksum)",
            get(&self.restore_dropped_objects) as f64,
        );
        gauge(
            out,
            "mooncake_rs_restore_skipped_files",
            "Snapshot files skipped at start because they did not verify",
            get(&self.restore_skipped_files) as f64,
        );
        gauge(
            out,
            "mooncake_rs_restore_waiting_segments",
            "Restored segments still waiting for their owner to re-mount",
            master.waiting_segments().len() as f64,
        );
        let stats = master.verification_stats();
        gauge(
            out,
            "mooncake_rs_restore_unverified_replicas",
            "Restored replicas still waiting for their node's checksum check",
            stats.pending as f64,
        );
        counter(
            out,
            "mooncake_rs_restore_verified_replicas_total",
            "Restored replicas whose node confirmed their checksum",
            stats.verified,
        );
        counter(
            out,
            "mooncake_rs_restore_dropped_replicas_total",
            "Restored replicas dropped (checksum mismatch or no confirmation in time)",
            stats.mismatched + stats.timed_out,
        );
        counter(
            out,
            "mooncake_rs_restore_expired_segments_total",
            "Restored segments dropped because their owner did not re-mount in time",
            stats.segments_expired,
        );
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
}

impl Snapshotter {
    /// Opens (creates) `path`; keeps the `retention` newest snapshots.
    pub fn open(
        master: Arc<MasterService>,
        path: &Path,
        retention: usize,
        metrics: Arc<SnapshotMetrics>,
    ) -> Result<Snapshotter, SnapshotError> {
        Ok(Snapshotter {
            master,
            dir: SnapshotDir::open(path, retention)?,
            path: path.to_path_buf(),
            options: EncodeOptions::default(),
            metrics,
        })
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
        match self.dir.take(&self.master, 0, &self.options) {
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
                        let _ = snapshotter.take("periodic");
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
    /// The restored state and the file it came from.
    pub loaded: Option<(PathBuf, MasterState)>,
    /// Files skipped because they did not verify.
    pub skipped: usize,
}

/// For `--enable_snapshot_restore`: the newest snapshot in `settings.dir` that verifies. Every
/// skipped file is logged with its reason. With none left: an error line and an empty start, or
/// `Err` (the process exits non-zero) with `--snapshot_required`.
pub fn load_at_start(settings: &SnapshotSettings) -> Result<StartState, String> {
    let Some(path) = settings.dir.as_deref().filter(|_| settings.restore) else {
        return Ok(StartState {
            loaded: None,
            skipped: 0,
        });
    };
    let dir = SnapshotDir::open(path, settings.retention)
        .map_err(|e| format!("cannot open the snapshot directory {}: {e}", path.display()))?;
    let outcome = dir
        .load_newest()
        .map_err(|e| format!("cannot read the snapshot directory {}: {e}", path.display()))?;
    for (file, reason) in &outcome.skipped {
        tracing::error!(
            "snapshot {} skipped: {reason}; trying the next older one",
            file.display()
        );
    }
    let skipped = outcome.skipped.len();
    match outcome.loaded {
        Some((file, meta, state)) => {
            tracing::info!(
                "restoring snapshot {} (id {}, taken at unix ms {}, {} objects, {} segments)",
                file.display(),
                meta.id,
                meta.created_ms,
                state.objects.len(),
                state.segments.len()
            );
            Ok(StartState {
                loaded: Some((file, state)),
                skipped,
            })
        }
        None => {
            let what = if skipped == 0 {
                format!("no snapshot in {}", path.display())
            } else {
                format!(
                    "no snapshot in {} verifies ({skipped} skipped)",
                    path.display()
                )
            };
            if settings.required {
                return Err(format!(
                    "{what}; --snapshot_required refuses to start empty"
                ));
            }
            if skipped == 0 {
                tracing::warn!("{what}: starting empty");
            } else {
                tracing::error!("{what}: starting empty");
            }
            Ok(StartState {
                loaded: None,
                skipped,
            })
        }
    }
}
