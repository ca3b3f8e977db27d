//! The op-log against a real etcd (started by the test, stopped by PID): batches commit in
//! order and a fresh reader replays them into the leader's state; a writer whose prefix is stale
//! is fenced and acknowledges nothing; a commit retried after an ambiguous outcome is recognised;
//! while etcd is down acknowledgements wait and then answer `Unavailable`, and the writer
//! resumes by itself when etcd returns, losing nothing; with three etcd members, killing the raft
//! leader loses no write and stops no acknowledgement for good.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mooncake_oplog::etcd::{oplog_root, EtcdError, EtcdLog, Prefix};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_oplog::{AckError, OpLogSink, OpLogWriter, Replayer, WriterConfig, WriterHealth};

const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(60);

fn writer(etcd: &EtcdServer, sink: &Arc<OpLogSink>, start: Option<Prefix>) -> OpLogWriter {
    OpLogWriter::start(
        sink.clone(),
        WriterConfig {
            endpoints: vec![etcd.endpoint()],
            root: oplog_root("test"),
            view: 1,
            start,
            call_timeout: CALL_TIMEOUT,
            fence: None,
        },
    )
    .unwrap()
}

async fn log(etcd: &EtcdServer) -> EtcdLog {
    EtcdLog::connect(&[etcd.endpoint()], oplog_root("test"), CALL_TIMEOUT)
        .await
        .unwrap()
}

/// Replays everything in etcd into a fresh master; checks batch ids 1, 2, 3, … and that the
/// prefix names the last batch.
async fn replay_all(log: &EtcdLog) -> (mooncake_master::MasterService, u64) {
    let master = empty_master();
    let mut r = Replayer::new(&master, 0);
    let mut last = 0;
    loop {
        let batches = log.read_batches(last, 100).await.unwrap();
        if batches.is_empty() {
            break;
        }
        for (id, bytes) in batches {
            assert_eq!(id, last + 1, "batch ids have a gap");
            r.apply_bytes(&bytes).unwrap();
            last = id;
        }
    }
    let prefix = log.read_prefix().await.unwrap().unwrap_or_default();
    assert_eq!(prefix.batch_id, last);
    assert_eq!(prefix.last_seq, r.applied_seq());
    let applied = r.applied_seq();
    (master, applied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_commit_in_order_and_replay_to_the_leaders_state() {
    let etcd = EtcdServer::start();
    let mut w = Workload::new(test_seed());
    let sink = w.sink.clone();
    let writer = writer(&etcd, &sink, None);
    for _ in 0..600 {
        w.step();
    }
    let target = sink.assigned_seq();
    tokio::task::block_in_place(|| sink.wait_durable(target, WAIT)).unwrap();
    let log = log(&etcd).await;
    let (standby, applied) = replay_all(&log).await;
    assert_eq!(applied, target);
    assert_eq!(standby.export_state(), w.master.export_state());
    assert!(
        writer
            .stats
            .batches
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    writer.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_with_a_stale_prefix_is_fenced_and_acknowledges_nothing() {
    let etcd = EtcdServer::start();
    let mut a = Workload::new(1);
    let wa = writer(&etcd, &a.sink, None);
    for _ in 0..50 {
        a.step();
    }
    let target = a.sink.assigned_seq();
    tokio::task::block_in_place(|| a.sink.wait_durable(target, WAIT)).unwrap();
    // B believes the log is empty (it missed A's commits).
    let mut b = Workload::new(2);
    let wb = writer(&etcd, &b.sink, None);
    b.step();
    let target_b = b.sink.assigned_seq();
    let err = tokio::task::block_in_place(|| b.sink.wait_durable(target_b, WAIT)).unwrap_err();
    assert_eq!(err, AckError::Fenced);
    assert_eq!(b.sink.health(), WriterHealth::Fenced);
    // A still commits; the log holds only A's history.
    for _ in 0..50 {
        a.step();
    }
    let target = a.sink.assigned_seq();
    tokio::task::block_in_place(|| a.sink.wait_durable(target, WAIT)).unwrap();
    let (standby, _) = replay_all(&log(&etcd).await).await;
    assert_eq!(standby.export_state(), a.master.export_state());
    wa.stop();
    wb.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_retried_after_an_ambiguous_outcome_is_recognised() {
    let etcd = EtcdServer::start();
    let log = log(&etcd).await;
    let first = Prefix {
        batch_id: 1,
        last_seq: 3,
    };
    log.commit(None, first, b"one").await.unwrap();
    // The same commit again (its answer was lost): success, nothing changes.
    log.commit(None, first, b"one").await.unwrap();
    // Different bytes under the same expectation: fenced.
    let err = log.commit(None, first, b"two").await.unwrap_err();
    assert!(matches!(err, EtcdError::Fenced { .. }), "{err}");
    let second = Prefix {
        batch_id: 2,
        last_seq: 5,
    };
    log.commit(Some(first), second, b"b2").await.unwrap();
    // A stale expectation cannot move the prefix.
    let stale = Prefix {
        batch_id: 2,
        last_seq: 4,
    };
    assert!(log.commit(Some(first), stale, b"x").await.is_err());
    assert_eq!(log.read_prefix().await.unwrap(), Some(second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcd_is_down_acks_fail_retryably_and_the_writer_resumes_by_itself() {
    let mut etcd = EtcdServer::start();
    let mut w = Workload::new(test_seed());
    let sink = w.sink.clone();
    let writer = writer(&etcd, &sink, None);
    for _ in 0..100 {
        w.step();
    }
    let before = sink.assigned_seq();
    tokio::task::block_in_place(|| sink.wait_durable(before, WAIT)).unwrap();
    etcd.kill();
    for _ in 0..100 {
        w.step();
    }
    let during = sink.assigned_seq();
    assert!(during > before);
    let err = tokio::task::block_in_place(|| sink.wait_durable(during, Duration::from_secs(3)))
        .unwrap_err();
    assert_eq!(err, AckError::Unavailable);
    let deadline = Instant::now() + WAIT;
    while sink.health() != WriterHealth::Retrying {
        assert!(
            Instant::now() < deadline,
            "the writer never noticed etcd is gone"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sink.durable_seq() < during);
    etcd.restart();
    tokio::task::block_in_place(|| sink.wait_durable(during, WAIT)).unwrap();
    assert_eq!(sink.health(), WriterHealth::Healthy);
    let (standby, applied) = replay_all(&log(&etcd).await).await;
    assert_eq!(applied, during);
    assert_eq!(standby.export_state(), w.master.export_state());
    writer.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_etcd_keeps_the_log_when_its_leader_is_killed() {
    let mut members = EtcdServer::start_cluster(3);
    let endpoints: Vec<String> = members.iter().map(EtcdServer::endpoint).collect();
    let mut w = Workload::new(test_seed());
    let sink = w.sink.clone();
    let writer = OpLogWriter::start(
        sink.clone(),
        WriterConfig {
            endpoints: endpoints.clone(),
            root: oplog_root("test"),
            view: 1,
            start: None,
            call_timeout: CALL_TIMEOUT,
            fence: None,
        },
    )
    .unwrap();
    for _ in 0..200 {
        w.step();
    }
    let before = sink.assigned_seq();
    tokio::task::block_in_place(|| sink.wait_durable(before, WAIT)).unwrap();
    // Kill the raft leader; the other two keep a quorum and elect another.
    let mut leader = None;
    for (i, ep) in endpoints.iter().enumerate() {
        let mut c = etcd_client::Client::connect([ep], None).await.unwrap();
        let st = c.status().await.unwrap();
        if st.header().map(|h| h.member_id()) == Some(st.leader()) {
            leader = Some(i);
        }
    }
    let leader = leader.expect("a member reports itself leader");
    members[leader].kill();
    for _ in 0..200 {
        w.step();
    }
    let after = sink.assigned_seq();
    tokio::task::block_in_place(|| sink.wait_durable(after, WAIT)).unwrap();
    let alive: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| endpoints[i].clone())
        .collect();
    let survivor = EtcdLog::connect(&alive, oplog_root("test"), CALL_TIMEOUT)
        .await
        .unwrap();
    let (standby, applied) = replay_all(&survivor).await;
    assert_eq!(applied, after);
    assert_eq!(standby.export_state(), w.master.export_state());
    writer.stop();
}
