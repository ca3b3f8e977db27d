//! The election and the hot standby's follower against a real etcd (started by the test,
//! stopped by PID):
//!
//! - a follower reading the log as a writer grows it holds the leader's state after every
//!   catch-up, and a second catch-up with nothing new changes nothing;
//! - a gap in the sequence numbers or a flipped byte halts it, and it stays halted even once
//!   the log looks fine again;
//! - only one candidate wins the leader key; the next leader's view version is higher; a writer
//!   fenced by a view commits while the key is its view's and is fenced once it is not.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use mooncake_oplog::batch;
use mooncake_oplog::election::{Election, Renewal};
use mooncake_oplog::etcd::{oplog_root, EtcdLog, Prefix};
use mooncake_oplog::follow::{FollowError, LogFollower};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_oplog::{AckError, OpLogWriter, WriterConfig, WriterHealth};

const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(60);

async fn log(etcd: &EtcdServer, cluster: &str) -> EtcdLog {
    EtcdLog::connect(&[etcd.endpoint()], oplog_root(cluster), CALL_TIMEOUT)
        .await
        .unwrap()
}

fn config(etcd: &EtcdServer, cluster: &str) -> WriterConfig {
    WriterConfig {
        endpoints: vec![etcd.endpoint()],
        root: oplog_root(cluster),
        view: 1,
        start: None,
        call_timeout: CALL_TIMEOUT,
        fence: None,
    }
}

/// Runs `steps` workload steps and waits until all of them are durable.
fn steps_durable(w: &mut Workload, steps: usize) {
    for _ in 0..steps {
        w.step();
    }
    let target = w.sink.assigned_seq();
    tokio::task::block_in_place(|| w.sink.wait_durable(target, WAIT)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_keeps_the_leaders_state_as_the_log_grows() {
    let etcd = EtcdServer::start();
    let mut w = Workload::new(test_seed());
    let log = log(&etcd, "grow").await;
    let standby = empty_master();
    let mut follower = LogFollower::new(&standby);
    assert_eq!(follower.catch_up(&log).await.unwrap(), None);
    let writer = OpLogWriter::start(w.sink.clone(), config(&etcd, "grow")).unwrap();
    for _ in 0..5 {
        steps_durable(&mut w, 120);
        let prefix = follower.catch_up(&log).await.unwrap().unwrap();
        assert_eq!(prefix.last_seq, w.sink.assigned_seq());
        assert_eq!(follower.applied_seq(), prefix.last_seq);
        assert_eq!(standby.export_state(), w.master.export_state());
        assert_eq!(follower.catch_up(&log).await.unwrap(), Some(prefix));
        assert_eq!(standby.export_state(), w.master.export_state());
    }
    writer.stop();
}

/// Commits the sink's queued entries as batch `prefix + 1`, numbered from `first_seq`, with
/// `damage` applied to the stored bytes.
async fn commit_forged(
    log: &EtcdLog,
    w: &Workload,
    prefix: Option<Prefix>,
    first_seq: u64,
    damage: impl FnOnce(&mut Vec<u8>),
) -> Prefix {
    let t = w.sink.take(Duration::from_millis(10)).unwrap();
    let id = prefix.map_or(1, |p| p.batch_id + 1);
    let mut bytes = batch::seal(id, 1, first_seq, t.count, &t.entries);
    damage(&mut bytes);
    let next = Prefix {
        batch_id: id,
        last_seq: first_seq + u64::from(t.count) - 1,
    };
    log.commit(prefix, next, &bytes).await.unwrap();
    next
}

async fn assert_halts_for_good(log: &EtcdLog, follower: &mut LogFollower<'_>, what: &str) {
    let first = follower.catch_up(log).await.unwrap_err();
    let FollowError::Halted(why) = &first else {
        panic!("not halted: {first:?}");
    };
    assert!(why.contains(what), "{why}");
    let again = follower.catch_up(log).await.unwrap_err();
    assert_eq!(again, first, "a halted follower stays halted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_or_a_flipped_byte_halts_the_follower_for_good() {
    let etcd = EtcdServer::start();
    for (cluster, what) in [("gap", "gap"), ("flip", "corrupt")] {
        let mut w = Workload::new(test_seed());
        for _ in 0..40 {
            w.step();
        }
        let log = log(&etcd, cluster).await;
        let p1 = commit_forged(&log, &w, None, 1, |_| {}).await;
        let standby = empty_master();
        let mut follower = LogFollower::new(&standby);
        assert_eq!(follower.catch_up(&log).await.unwrap(), Some(p1));
        for _ in 0..40 {
            w.step();
        }
        let p2 = if cluster == "gap" {
            commit_forged(&log, &w, Some(p1), p1.last_seq + 2, |_| {}).await
        } else {
            commit_forged(&log, &w, Some(p1), p1.last_seq + 1, |b| b[45] ^= 0x10).await
        };
        let before = standby.export_state();
        assert_halts_for_good(&log, &mut follower, what).await;
        assert_eq!(standby.export_state(), before, "nothing applied after");
        assert_eq!(follower.applied_seq(), p1.last_seq);
        // A good batch after the bad one does not resume it.
        for _ in 0..40 {
            w.step();
        }
        let first = p2.last_seq + 1;
        commit_forged(&log, &w, Some(p2), first, |_| {}).await;
        assert!(matches!(
            follower.catch_up(&log).await,
            Err(FollowError::Halted(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_wins_views_grow_and_a_deposed_leaders_writer_is_fenced() {
    let etcd = EtcdServer::start();
    let endpoints = [etcd.endpoint()];
    let a = Election::connect(&endpoints, "elect", CALL_TIMEOUT)
        .await
        .unwrap();
    let b = Election::connect(&endpoints, "elect", CALL_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(a.read_view().await.unwrap(), None);
    let mut held = a.try_acquire("a:1").await.unwrap().unwrap();
    let observed = b.try_acquire("b:1").await.unwrap().unwrap_err();
    assert_eq!(observed, Some(held.view.clone()));
    assert_eq!(b.read_view().await.unwrap(), Some(held.view.clone()));
    assert!(matches!(
        a.renew(&mut held).await.unwrap(),
        Renewal::Held { .. }
    ));

    // A writer fenced by a's view commits while a holds the key.
    let mut w = Workload::new(test_seed());
    let mut cfg = config(&etcd, "elect");
    cfg.view = held.view.version;
    cfg.fence = Some(a.fence(&held.view));
    let writer = OpLogWriter::start(w.sink.clone(), cfg).unwrap();
    steps_durable(&mut w, 30);

    // a loses the key (released here; an expired lease deletes it the same way) and b wins a
    // higher view: a's writer cannot commit any more.
    let old = held.view.clone();
    a.release(held).await;
    let won = b.try_acquire("b:1").await.unwrap().unwrap();
    assert!(won.view.version > old.version);
    let before = w.sink.assigned_seq();
    while w.sink.assigned_seq() == before {
        w.step();
    }
    let target = w.sink.assigned_seq();
    let err = tokio::task::block_in_place(|| w.sink.wait_durable(target, WAIT)).unwrap_err();
    assert_eq!(err, AckError::Fenced);
    assert_eq!(w.sink.health(), WriterHealth::Fenced);
    writer.stop();

    // The new leader renews; a third candidate cannot take the key from it.
    let mut won = won;
    assert!(matches!(
        b.renew(&mut won).await.unwrap(),
        Renewal::Held { .. }
    ));
    let observed = a.try_acquire("c:1").await.unwrap().unwrap_err();
    assert_eq!(observed, Some(won.view.clone()));
    b.release(won).await;
    assert_eq!(a.read_view().await.unwrap(), None);
}
