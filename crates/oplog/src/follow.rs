//! Following the durable log (a start from the log, a hot standby): read the prefix, apply
//! every batch up to it in order with a [`Replayer`], as often as wanted. A gap in the batch
//! ids, a batch that does not verify or apply, a prefix that went back or disappeared halts the
//! follower for good: it never skips.

use mooncake_master::MasterService;

use crate::etcd::{EtcdError, EtcdLog, Prefix, MAX_BATCHES_PER_READ};
use crate::Replayer;

/// Why a follower of the log stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowError {
    /// etcd did not answer: try again later.
    Unavailable(String),
    /// The log cannot be followed (a gap, a bad batch, a prefix that went back): replay halted.
    Halted(String),
}

impl std::fmt::Display for FollowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FollowError::Unavailable(why) => write!(f, "etcd unavailable: {why}"),
            FollowError::Halted(why) => write!(f, "op-log replay halted: {why}"),
        }
    }
}

impl From<EtcdError> for FollowError {
    fn from(e: EtcdError) -> Self {
        match e {
            EtcdError::Unavailable(why) => FollowError::Unavailable(why),
            other => FollowError::Halted(other.to_string()),
        }
    }
}

/// Applies the durable log to a master, batch after batch, as far as the prefix reaches (the
/// start from the log, a hot standby). Once it has halted it stays halted.
#[derive(Debug)]
pub struct LogFollower<'a> {
    replayer: Replayer<'a>,
    batch_id: u64,
    halted: Option<String>,
}

impl<'a> LogFollower<'a> {
    /// A follower of an empty log into `master`.
    pub fn new(master: &'a MasterService) -> Self {
        LogFollower {
            replayer: Replayer::new(master, 0),
            batch_id: 0,
            halted: None,
        }
    }

    /// A follower into `master`, which holds the log's fold up to `applied_seq` (a snapshot
    /// loaded into it), reading batches after `after_batch` (the compaction floor, or 0).
    /// Batches that end at or below `applied_seq` are read and skipped.
    pub fn at(master: &'a MasterService, after_batch: u64, applied_seq: u64) -> Self {
        LogFollower {
            replayer: Replayer::new(master, applied_seq),
            batch_id: after_batch,
            halted: None,
        }
    }

    /// The last batch read.
    pub fn batch_id(&self) -> u64 {
        self.batch_id
    }

    pub fn applied_seq(&self) -> u64 {
        self.replayer.applied_seq()
    }

    /// Reads the prefix and applies every batch up to it; returns the prefix reached.
    pub async fn catch_up(&mut self, log: &EtcdLog) -> Result<Option<Prefix>, FollowError> {
        if let Some(why) = &self.halted {
            return Err(FollowError::Halted(why.clone()));
        }
        match self.step(log).await {
            Err(FollowError::Halted(why)) => {
                self.halted = Some(why.clone());
                Err(FollowError::Halted(why))
            }
            other => other,
        }
    }

    async fn step(&mut self, log: &EtcdLog) -> Result<Option<Prefix>, FollowError> {
        let halt = |why: String| Err(FollowError::Halted(why));
        let Some(prefix) = log.read_prefix().await? else {
            if self.batch_id > 0 || self.replayer.applied_seq() > 0 {
                return halt(format!(
                    "the op-log in etcd is empty, but batch {} and sequence {} were applied \
                     (the prefix disappeared, or a snapshot of another log was loaded)",
                    self.batch_id,
                    self.replayer.applied_seq()
                ));
            }
            return Ok(None);
        };
        if prefix.batch_id < self.batch_id {
            return halt(format!(
                "the prefix went back to batch {} after batch {} was applied",
                prefix.batch_id, self.batch_id
            ));
        }
        while self.batch_id < prefix.batch_id {
            let batches = log
                .read_batches(self.batch_id, MAX_BATCHES_PER_READ)
                .await?;
            let first = batches.first().map(|(id, _)| *id);
            if first != Some(self.batch_id.saturating_add(1)) {
                return halt(self.missing(log, first).await);
            }
            for (id, bytes) in batches.into_iter().filter(|(id, _)| *id <= prefix.batch_id) {
                if id != self.batch_id.saturating_add(1) {
                    return halt(self.missing(log, Some(id)).await);
                }
                if let Err(e) = self.replayer.apply_bytes(&bytes) {
                    return halt(format!("op-log batch {id}: {e}"));
                }
                self.batch_id = id;
            }
        }
        if self.replayer.applied_seq() != prefix.last_seq {
            return halt(format!(
                "op-log ends at batch {} sequence {} but its prefix says sequence {}",
                self.batch_id,
                self.replayer.applied_seq(),
                prefix.last_seq
            ));
        }
        Ok(Some(prefix))
    }

    /// Why the next batch is not there: compacted away (this follower fell behind the floor),
    /// or missing.
    async fn missing(&self, log: &EtcdLog, found: Option<u64>) -> String {
        let next = self.batch_id.saturating_add(1);
        let found = found.map_or(String::new(), |id| format!(" (found {id})"));
        match log.read_floor().await {
            Ok(Some(floor)) if floor.batch_id >= next => format!(
                "op-log batch {next} was compacted (the floor is batch {}, sequence {}): this \
                 replica fell behind the newest snapshots; restart it to start from the newest \
                 snapshot and the log after it",
                floor.batch_id, floor.last_seq
            ),
            _ => format!("op-log batch {next} is missing{found}"),
        }
    }
}
