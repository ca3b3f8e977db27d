//! A directory of snapshots: `snapshot-<id:020>.mcs`, each written as a temp file
//! (`snapshot-<id:020>.mcs.tmp`) → fsync → rename → fsync of the directory, the newest
//! `retention` kept, and a load that takes the newest file that verifies.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use mooncake_master::{MasterService, MasterState};
use parking_lot::Mutex;

use crate::decode::decode;
use crate::encode::write_snapshot_counted;
use crate::{EncodeOptions, SnapshotError, SnapshotMeta, TakeReport};

const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".mcs";
const TEMP_SUFFIX: &str = ".mcs.tmp";
/// A clean-shutdown mark: `snapshot-<id>.final` says snapshot `<id>` was taken after the master
/// stopped serving and that no master has served since.
const FINAL_SUFFIX: &str = ".final";
const ID_DIGITS: usize = 20;

/// The id of a final snapshot file name, if `name` is one.
fn id_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.len() != ID_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn is_temp(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|digits| {
            digits.len() == ID_DIGITS && digits.bytes().all(|b| b.is_ascii_digit())
        })
}

fn file_name(id: u64) -> String {
    format!("{PREFIX}{id:020}{SUFFIX}")
}

fn final_name(id: u64) -> String {
    format!("{PREFIX}{id:020}{FINAL_SUFFIX}")
}

fn is_final_mark(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(FINAL_SUFFIX))
        .is_some_and(|digits| {
            digits.len() == ID_DIGITS && digits.bytes().all(|b| b.is_ascii_digit())
        })
}

/// Removes the temp file `path` unless another process holds its lock (a take in progress).
fn remove_unless_locked(path: &Path) -> Result<(), SnapshotError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match file.try_lock() {
        Ok(()) => match fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        },
        Err(fs::TryLockError::WouldBlock) => Ok(()),
        Err(fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What [`SnapshotDir::load_newest`] found.
#[derive(Debug)]
pub struct LoadOutcome {
    /// The newest snapshot that verified: its file, header and state.
    pub loaded: Option<(PathBuf, SnapshotMeta, MasterState)>,
    /// Every newer file that did not, newest first, with the reason.
    pub skipped: Vec<(PathBuf, SnapshotError)>,
    /// The loaded snapshot carries a clean-shutdown mark ([`SnapshotDir::mark_final`]) and no
    /// newer file was skipped: it is the state the last master stopped in, and none has served
    /// since.
    pub is_final: bool,
}

/// A directory of snapshots (see the module doc). Concurrent [`SnapshotDir::take`] calls are
/// serialized: a second caller waits for the first.
#[derive(Debug)]
pub struct SnapshotDir {
    path: PathBuf,
    retention: usize,
    /// The last id taken (serializes takes).
    last_id: Mutex<u64>,
}

impl SnapshotDir {
    /// Opens (creating it if needed) the directory, keeping the newest `retention` snapshots
    /// at each take (0 is taken as 1: the snapshot just written is never removed). Temp files
    /// left by an interrupted take are removed; a temp file another process is still writing
    /// (a master sharing the directory, in the middle of a take: it holds an exclusive lock on
    /// its temp file until the rename) is left alone.
    pub fn open(path: impl Into<PathBuf>, retention: usize) -> Result<SnapshotDir, SnapshotError> {
        let path = path.into();
        fs::create_dir_all(&path)?;
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            if entry.file_name().to_str().is_some_and(is_temp) {
                remove_unless_locked(&entry.path())?;
            }
        }
        // Probe that files can be created here (a read-only directory fails now, not at the
        // first take); named by process, so that masters opening a shared directory at once
        // do not remove each other's probe.
        let probe = path.join(format!("{PREFIX}probe-{}{TEMP_SUFFIX}", std::process::id()));
        File::create(&probe)?;
        fs::remove_file(&probe)?;
        let dir = SnapshotDir {
            path,
            retention: retention.max(1),
            last_id: Mutex::new(0),
        };
        let newest = dir.list()?.first().map_or(0, |(id, _)| *id);
        *dir.last_id.lock() = newest;
        Ok(dir)
    }

    /// The directory as it is, for loading only: nothing is created, probed or removed (a temp
    /// file there may be another master's take in progress). A directory that does not exist
    /// lists no snapshot.
    pub fn open_for_loading(path: impl Into<PathBuf>) -> SnapshotDir {
        SnapshotDir {
            path: path.into(),
            retention: 1,
            last_id: Mutex::new(0),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many snapshots each take keeps.
    pub fn retention(&self) -> usize {
        self.retention
    }

    /// Takes a snapshot of `master` (see [`crate::write_snapshot`]) into a new file, then
    /// removes all but the newest `retention` snapshots. On failure the temp file is removed
    /// and the existing snapshots are untouched.
    pub fn take(
        &self,
        master: &MasterService,
        oplog_position: u64,
        opts: &EncodeOptions,
    ) -> Result<TakeReport, SnapshotError> {
        let mut last_id = self.last_id.lock();
        let started = Instant::now();
        let created_ms = now_ms();
        let newest = self.list()?.first().map_or(0, |(id, _)| *id);
        let id = created_ms.max(last_id.max(newest).saturating_add(1));
        let meta = SnapshotMeta {
            id,
            created_ms,
            oplog_position,
            master_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let name = file_name(id);
        let path = self.path.join(&name);
        let temp = self.path.join(format!("{name}.tmp"));
        let written = self.write_file(&temp, master, &meta, opts);
        // The temp file stays open (locked) until it has its final name.
        let (bytes, objects) = match written.and_then(|(w, _locked)| {
            fs::rename(&temp, &path)?;
            File::open(&self.path)?.sync_all()?;
            Ok(w)
        }) {
            Ok(w) => w,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        };
        *last_id = id;
        self.prune();
        Ok(TakeReport {
            id,
            path,
            bytes,
            objects,
            duration: started.elapsed(),
        })
    }

    fn write_file(
        &self,
        temp: &Path,
        master: &MasterService,
        meta: &SnapshotMeta,
        opts: &EncodeOptions,
    ) -> Result<((u64, u64), File), SnapshotError> {
        let file = File::create(temp)?;
        file.lock()?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let counted = write_snapshot_counted(master, meta, opts, &mut out)?;
        out.flush()?;
        let file = out
            .into_inner()
            .map_err(|e| SnapshotError::Io(e.into_error()))?;
        file.sync_all()?;
        Ok((counted, file))
    }

    /// Removes all but the newest `retention` snapshots and their marks (best effort: a file
    /// that cannot be removed now is tried again at the next take).
    fn prune(&self) {
        if let Ok(list) = self.list() {
            for (id, path) in list.into_iter().skip(self.retention) {
                let _ = fs::remove_file(path);
                let _ = fs::remove_file(self.path.join(final_name(id)));
            }
        }
    }

    /// Marks snapshot `report` as taken at a clean shutdown: after the master stopped serving,
    /// with nothing changing its state any more (`snapshot-<id>.final`, fsynced with the
    /// directory). A restore from it may trust what it cannot verify; the master that restores
    /// it removes the mark ([`SnapshotDir::clear_final_marks`]) before it serves.
    pub fn mark_final(&self, report: &TakeReport) -> Result<(), SnapshotError> {
        let _serialized = self.last_id.lock();
        let file = File::create(self.path.join(final_name(report.id)))?;
        file.sync_all()?;
        File::open(&self.path)?.sync_all()?;
        Ok(())
    }

    /// The ids of the snapshots carrying a clean-shutdown mark.
    pub fn final_marks(&self) -> Result<Vec<u64>, SnapshotError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.path)? {
            let name = entry?.file_name();
            let id: Option<u64> = name.to_str().filter(|n| is_final_mark(n)).and_then(|n| {
                n.strip_prefix(PREFIX)?
                    .strip_suffix(FINAL_SUFFIX)?
                    .parse()
                    .ok()
            });
            out.extend(id);
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Removes every clean-shutdown mark (fsyncing the directory); returns how many there were.
    /// A master calls this before it serves: from then on the state moves away from every
    /// snapshot in the directory.
    pub fn clear_final_marks(&self) -> Result<usize, SnapshotError> {
        let _serialized = self.last_id.lock();
        let mut removed = 0;
        for entry in fs::read_dir(&self.path)? {
            let entry = entry?;
            if entry.file_name().to_str().is_some_and(is_final_mark) {
                fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
        if removed > 0 {
            File::open(&self.path)?.sync_all()?;
        }
        Ok(removed)
    }

    /// The snapshot files, newest first (temp files and other names are ignored).
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>, SnapshotError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            other => other?,
        };
        for entry in entries {
            let entry = entry?;
            if let Some(id) = entry.file_name().to_str().and_then(id_of) {
                out.push((id, entry.path()));
            }
        }
        out.sort_by_key(|e| std::cmp::Reverse(e.0));
        Ok(out)
    }

    /// The newest snapshot that verifies; every newer one that does not comes back in
    /// `skipped` with its reason (a file whose header id differs from its name's is skipped as
    /// corrupt). `loaded` is `None` when none verifies. Fails only if the directory cannot be
    /// listed.
    pub fn load_newest(&self) -> Result<LoadOutcome, SnapshotError> {
        self.load_newest_where(|_| true)
    }

    /// [`SnapshotDir::load_newest`] among the snapshots whose header `accept` takes: a file
    /// that verifies but is not accepted is passed over (neither loaded nor skipped).
    pub fn load_newest_where(
        &self,
        accept: impl Fn(&SnapshotMeta) -> bool,
    ) -> Result<LoadOutcome, SnapshotError> {
        let mut skipped = Vec::new();
        for (id, path) in self.list()? {
            let decoded = fs::read(&path)
                .map_err(SnapshotError::from)
                .and_then(|bytes| decode(&bytes));
            match decoded {
                Ok((meta, _)) if meta.id != id => {
                    let reason = format!("header says snapshot {}, the file name {id}", meta.id);
                    skipped.push((path, SnapshotError::corrupt(reason)));
                }
                Ok((meta, _)) if !accept(&meta) => {}
                Ok((meta, state)) => {
                    let is_final = skipped.is_empty() && self.path.join(final_name(id)).exists();
                    return Ok(LoadOutcome {
                        loaded: Some((path, meta, state)),
                        skipped,
                        is_final,
                    });
                }
                Err(e) => skipped.push((path, e)),
            }
        }
        Ok(LoadOutcome {
            loaded: None,
            skipped,
            is_final: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_only_in_their_exact_form() {
        assert_eq!(id_of(&file_name(42)), Some(42));
        assert_eq!(id_of(&file_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(id_of("snapshot-42.mcs"), None);
        assert_eq!(id_of("snapshot-0000000000000000004x.mcs"), None);
        assert_eq!(id_of(&format!("{}.tmp", file_name(1))), None);
        assert!(is_temp(&format!("{}.tmp", file_name(1))));
        assert!(!is_temp(&file_name(1)));
        assert!(!is_temp("other.mcs.tmp"));
        assert!(is_final_mark(&final_name(7)));
        assert_eq!(id_of(&final_name(7)), None);
        assert!(!is_final_mark(&file_name(7)));
    }
}
