//! Compaction of the op-log against a real etcd (started by the test, stopped by PID), with a
//! seeded random workload growing the log:
//!
//! - every snapshot cycle deletes the batches the oldest kept snapshot includes: the batch keys
//!   up to the floor are gone, etcd holds only the batches after it (the key count stays bounded
//!   over many cycles), and a master started afresh from the newest snapshot and the log after it
//!   holds exactly the leader's state; a hot follower that keeps up is never cut off, one that
//!   fell behind the floor halts loudly, one that started from the newest snapshot just before
//!   a compaction does not;
//! - a compaction whose fence no longer holds (another master leads) deletes nothing;
//! - with the log compacted, a start without a usable snapshot (none, all damaged, no directory)
//!   fails loudly naming the compacted sequence, and a damaged newest snapshot falls back to the
//!   older one, which the floor still covers.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mooncake_common::SystemClock;
use mooncake_master::{MasterService, MasterServiceConfig};
use mooncake_oplog::checkpoint::{bootstrap, checkpoint, Checkpoint};
use mooncake_oplog::election::Fence;
use mooncake_oplog::etcd::EtcdError;
use mooncake_oplog::etcd::{oplog_root, EtcdLog, Prefix};
use mooncake_oplog::follow::{FollowError, LogFollower};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_oplog::{OpLogWriter, WriterConfig};
use mooncake_snapshot::{EncodeOptions, SnapshotDir};

const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(60);

struct World {
    _etcd: EtcdServer,
    w: Workload,
    log: EtcdLog,
    _writer: OpLogWriter,
    _tmp: tempfile::TempDir,
    dir: SnapshotDir,
}

async fn world(cluster: &str, retention: usize) -> World {
    let etcd = EtcdServer::start();
    let w = Workload::new(test_seed());
    let log = EtcdLog::connect(&[etcd.endpoint()], oplog_root(cluster), CALL_TIMEOUT)
        .await
        .unwrap();
    let writer = OpLogWriter::start(
        w.sink.clone(),
        WriterConfig {
            endpoints: vec![etcd.endpoint()],
            root: oplog_root(cluster),
            view: 1,
            start: None,
            call_timeout: CALL_TIMEOUT,
            fence: None,
        },
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = SnapshotDir::open(tmp.path().join("snapshots"), retention).unwrap();
    World {
        _etcd: etcd,
        w,
        log,
        _writer: writer,
        _tmp: tmp,
        dir,
    }
}

impl World {
    /// Runs `steps` workload steps and waits until all of them are durable.
    fn steps_durable(&mut self, steps: usize) {
        for _ in 0..steps {
            self.w.step();
        }
        let target = self.w.sink.assigned_seq();
        tokio::task::block_in_place(|| self.w.sink.wait_durable(target, WAIT)).unwrap();
    }

    async fn checkpoint(&self) -> Checkpoint {
        checkpoint(
            MasterServiceConfig::default(),
            &self.log,
            &self.dir,
            &EncodeOptions::default(),
        )
        .await
        .unwrap()
    }

    /// A master started afresh from the newest snapshot and the log after it.
    async fn restarted(&self, dir: Option<&SnapshotDir>) -> Result<MasterService, String> {
        let m = MasterService::new(MasterServiceConfig::default(), Arc::new(SystemClock::new()))
            .unwrap();
        {
            let mut boot = bootstrap(&m, &self.log, dir).await?;
            boot.follower
                .catch_up(&self.log)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(m)
    }

    /// The id of the first batch left in etcd.
    async fn first_batch(&self) -> Option<u64> {
        let batches = self.log.read_batches(0, 1).await.unwrap();
        batches.first().map(|(id, _)| *id)
    }
}

fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_snapshot_cycle_deletes_the_batches_the_kept_snapshots_include() {
    let mut world = world("cycles", 2).await;
    let hot_standby = empty_master();
    let mut hot = LogFollower::new(&hot_standby);
    let laggard = empty_master();
    let mut lagging = LogFollower::new(&laggard);
    world.steps_durable(20);
    lagging.catch_up(&world.log).await.unwrap();
    let mut previous: Option<Prefix> = None;
    let mut most_keys = 0;
    for cycle in 0..8 {
        // Eight waits for durability: at least eight batches per cycle, however large the
        // writer's group commits are.
        for _ in 0..8 {
            world.steps_durable(10);
        }
        let cp = world.checkpoint().await;
        assert!(
            cp.written,
            "cycle {cycle}: the log grew, a snapshot is written"
        );
        assert_eq!(cp.compaction_error, None);
        assert_eq!(cp.prefix.last_seq, world.w.sink.assigned_seq());
        assert_eq!(
            cp.floor, previous,
            "cycle {cycle}: the floor is the previous snapshot's"
        );
        let floor_batch = cp.floor.map_or(0, |f| f.batch_id);
        assert_eq!(
            world.first_batch().await,
            Some(floor_batch + 1),
            "cycle {cycle}: every batch up to the floor is deleted, none after it"
        );
        // prefix, compaction/latest, compaction/floor (from the second cycle) and the batches
        // after the floor: nothing else stays.
        let keys = world.log.key_count().await.unwrap();
        let expected = (cp.prefix.batch_id - floor_batch) as i64 + 2 + i64::from(cycle > 0);
        assert_eq!(keys, expected, "cycle {cycle}: keys in etcd");
        if cycle > 1 {
            most_keys = most_keys.max(keys);
        }
        // A hot follower that keeps up is never cut off by the margin of one snapshot.
        hot.catch_up(&world.log).await.unwrap();
        assert_eq!(hot_standby.export_state(), world.w.master.export_state());
        // A master started afresh: newest snapshot + the log after it.
        let restarted = world.restarted(Some(&world.dir)).await.unwrap();
        assert_eq!(restarted.export_state(), world.w.master.export_state());
        previous = Some(cp.prefix);
    }
    // Bounded: the batches of about two snapshot periods, whatever the total written.
    let total = previous.unwrap().batch_id as i64;
    assert!(most_keys < total / 2, "{most_keys} keys of {total} batches");
    // The follower left behind at the start halts loudly, naming the compaction.
    let halted = lagging.catch_up(&world.log).await.unwrap_err();
    let FollowError::Halted(why) = &halted else {
        panic!("not halted: {halted:?}");
    };
    assert!(why.contains("was compacted"), "{why}");
    // Nothing new: no snapshot written, nothing deleted.
    let again = world.checkpoint().await;
    assert!(!again.written);
    assert_eq!(again.prefix, previous.unwrap());
    // A start that loaded the newest snapshot just before the next compaction (which deletes
    // every batch that snapshot includes) still follows the log after it.
    let starting =
        MasterService::new(MasterServiceConfig::default(), Arc::new(SystemClock::new())).unwrap();
    let mut boot = bootstrap(&starting, &world.log, Some(&world.dir))
        .await
        .unwrap();
    world.steps_durable(80);
    let cp = world.checkpoint().await;
    assert_eq!(
        cp.floor, previous,
        "the floor moved to the snapshot just loaded"
    );
    boot.follower.catch_up(&world.log).await.unwrap();
    assert_eq!(starting.export_state(), world.w.master.export_state());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_log_without_a_usable_snapshot_fails_loudly() {
    let mut world = world("lost", 2).await;
    for _ in 0..3 {
        world.steps_durable(60);
        world.checkpoint().await;
    }
    let floor = world.log.read_floor().await.unwrap().unwrap();
    let files = world.dir.list().unwrap();
    assert_eq!(files.len(), 2);
    // The newest snapshot damaged: the older one is at the floor, and the log after it is
    // still there.
    damage(&files[0].1);
    let restarted = world.restarted(Some(&world.dir)).await.unwrap();
    assert_eq!(restarted.export_state(), world.w.master.export_state());
    // Both damaged, none at all, or no directory: the start fails, never skipping.
    damage(&files[1].1);
    let compacted = format!("compacted up to sequence {}", floor.last_seq);
    let error = world.restarted(Some(&world.dir)).await.unwrap_err();
    assert!(
        error.contains(&compacted) && error.contains("verifies"),
        "{error}"
    );
    for (_, path) in &files {
        std::fs::remove_file(path).unwrap();
    }
    let error = world.restarted(Some(&world.dir)).await.unwrap_err();
    assert!(error.contains(&compacted), "{error}");
    let error = world.restarted(None).await.unwrap_err();
    assert!(
        error.contains(&compacted) && error.contains("--snapshot_dir"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_whose_fence_no_longer_holds_deletes_nothing() {
    let mut world = world("fenced", 2).await;
    world.steps_durable(40);
    let prefix = world.log.read_prefix().await.unwrap().unwrap();
    let keys = world.log.key_count().await.unwrap();
    // The fence of a view whose leader key is gone (this master lost the election).
    let stale = world.log.clone().with_fence(Some(Fence {
        key: "mooncake-store/fenced/master_view".into(),
        version: 7,
    }));
    let refused = stale.compact(prefix, None, Some(prefix)).await.unwrap_err();
    assert!(matches!(refused, EtcdError::Fenced { .. }), "{refused}");
    assert_eq!(world.log.key_count().await.unwrap(), keys);
    assert_eq!(world.log.read_floor().await.unwrap(), None);
    assert_eq!(world.first_batch().await, Some(1));
    // Unfenced (this test's single writer), the same compaction deletes every batch.
    world.log.compact(prefix, None, Some(prefix)).await.unwrap();
    assert_eq!(world.first_batch().await, None);
    assert_eq!(world.log.read_floor().await.unwrap(), Some(prefix));
}
