//! The op-log with real processes: a real etcd started by the test, `mooncake master
//! --enable_oplog`, a `mooncake store` node, this test process as the client.
//!
//! - Every put acknowledged with success is in etcd when it is acknowledged: the master is
//!   SIGKILLed (no snapshot anywhere) and started again on the same port and etcd; it rebuilds
//!   its state from the log, the node re-mounts, and every acknowledged object reads back
//!   byte-exact while every acknowledged removal stays removed.
//! - With snapshots of the log, each snapshot compacts the log in etcd (the batches up to the
//!   floor are gone); a master SIGKILLed after several cycles starts from the newest snapshot
//!   and the log after it with every acknowledged object byte-exact and every removal kept; with
//!   every snapshot damaged, the compacted log cannot be replayed and the start fails loudly.
//! - While etcd is down, writes fail with ETCD_OPERATION_ERROR (retryable) and reads keep
//!   working; once etcd is back, writes succeed again without a restart, and nothing
//!   acknowledged before, during or after is lost across another SIGKILL of the master.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use common::{pattern, signal, wait_exit, MasterOptions, MasterProcess, StoreNode};
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{ErrorCode, ReplicateConfig};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_transfer::TransportMode;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_master(
    port: u16,
    etcd: &EtcdServer,
    log: &Path,
    more: &[&str],
) -> Result<MasterProcess, ExitStatus> {
    let endpoints = format!("--etcd_endpoints={}", etcd.endpoint());
    let mut extra = vec!["--enable_oplog", &endpoints, "--cluster_id=oplog-test"];
    extra.extend_from_slice(more);
    MasterProcess::spawn(MasterOptions {
        port,
        extra: &extra,
        stderr: std::fs::File::create(log).unwrap().into(),
        log: "info",
        env: &[],
    })
}

/// A master on `port` (retried while the previous one's port is not free yet).
fn start_master(port: u16, etcd: &EtcdServer, log: &Path) -> MasterProcess {
    start_master_with(port, etcd, log, &[])
}

fn start_master_with(port: u16, etcd: &EtcdServer, log: &Path, more: &[&str]) -> MasterProcess {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match spawn_master(port, etcd, log, more) {
            Ok(m) => return m,
            Err(status) if Instant::now() < deadline => {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                assert!(text.contains("cannot listen"), "{status}: {text}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(status) => panic!("master exited: {status}"),
        }
    }
}

fn kill(mut m: MasterProcess) {
    signal(&m.child, libc::SIGKILL);
    wait_exit(&mut m.child, Duration::from_secs(10)).expect("SIGKILL exit");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(port: u16) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: format!("127.0.0.1:{port}"),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        transport: TransportMode::Tcp,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

/// Polls (at most 60 s) until every object reads back; asserts each is byte-exact.
async fn wait_readable(c: &StoreClient, objects: &[(String, Vec<u8>)]) {
    common::wait_readable_within(c, objects, Duration::from_secs(60)).await
}

/// `key` is absent, now and after the node re-mounted (checked by the caller's readable keys).
async fn assert_absent(c: &StoreClient, key: &str) {
    match c.get(key).await {
        Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => {}
        other => panic!("{key}: removed, yet {other:?}"),
    }
}

#[test]
fn acknowledged_puts_and_removes_survive_a_sigkill_of_the_master_through_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start();
    let port = free_port();
    let master = start_master(port, &etcd, &tmp.path().join("m1.log"));
    let _node = StoreNode::start(
        &format!("127.0.0.1:{port}"),
        "64MiB",
        &["--transport", "tcp"],
    );
    let rt = runtime();
    let c = rt.block_on(client(port));
    let mut kept = Vec::new();
    let mut removed = Vec::new();
    for i in 0..30usize {
        let key = format!("k{i}");
        let value = pattern(1000 + i * 3001, i as u64);
        rt.block_on(c.put(&key, &value, &ReplicateConfig::default()))
            .unwrap();
        if i % 5 == 0 {
            rt.block_on(c.remove(&key, true)).unwrap();
            removed.push(key);
        } else {
            kept.push((key, value));
        }
    }
    kill(master);

    let master = start_master(port, &etcd, &tmp.path().join("m2.log"));
    let log = std::fs::read_to_string(tmp.path().join("m2.log")).unwrap_or_default();
    assert!(log.contains("op-log read"), "{log}");
    rt.block_on(wait_readable(&c, &kept));
    for key in &removed {
        rt.block_on(assert_absent(&c, key));
    }
    kill(master);
}

#[test]
fn while_etcd_is_down_writes_fail_retryably_reads_work_and_service_resumes_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start();
    let port = free_port();
    let master = start_master(port, &etcd, &tmp.path().join("m1.log"));
    let _node = StoreNode::start(
        &format!("127.0.0.1:{port}"),
        "64MiB",
        &["--transport", "tcp"],
    );
    let rt = runtime();
    let c = rt.block_on(client(port));
    let one = ReplicateConfig::default();
    let mut acked = Vec::new();
    for i in 0..10usize {
        let (key, value) = (format!("before{i}"), pattern(4096 + i, i as u64));
        rt.block_on(c.put(&key, &value, &one)).unwrap();
        acked.push((key, value));
    }
    etcd.kill();
    // Writes fail with the retryable code (none is acknowledged); reads still answer.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    let mut i = 0usize;
    while refused < 3 {
        assert!(
            Instant::now() < deadline,
            "no write was refused while etcd was down"
        );
        let (key, value) = (format!("during{i}"), pattern(4096, 1000 + i as u64));
        i += 1;
        match rt.block_on(c.put(&key, &value, &one)) {
            Ok(_) => acked.push((key, value)),
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::ETCD_OPERATION_ERROR, "{e}");
                refused += 1;
            }
        }
    }
    rt.block_on(wait_readable(&c, &acked));
    etcd.restart();
    // Writes succeed again, without restarting the master.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut j = 0usize;
    loop {
        let (key, value) = (format!("after{j}"), pattern(4096, 5000 + j as u64));
        j += 1;
        match rt.block_on(c.put(&key, &value, &one)) {
            Ok(_) => {
                acked.push((key, value));
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "writes did not resume: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    kill(master);
    let master = start_master(port, &etcd, &tmp.path().join("m2.log"));
    rt.block_on(wait_readable(&c, &acked));
    kill(master);
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let (status, body) = common::http("GET", addr, path, b"");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// Puts `n` objects named `{prefix}{i}`, removing every fourth: (kept, removed).
async fn put_and_remove(
    c: &StoreClient,
    prefix: &str,
    n: usize,
) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let (mut kept, mut removed) = (Vec::new(), Vec::new());
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let value = pattern(2000 + i * 1013, i as u64 + 7);
        c.put(&key, &value, &ReplicateConfig::default())
            .await
            .unwrap();
        if i % 4 == 0 {
            c.remove(&key, true).await.unwrap();
            removed.push(key);
        } else {
            kept.push((key, value));
        }
    }
    (kept, removed)
}

#[test]
fn a_master_restarted_after_compaction_starts_from_the_newest_snapshot_and_the_log_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let snapshots = tmp.path().join("snapshots");
    let dir_flag = format!("--snapshot_dir={}", snapshots.display());
    let flags = [dir_flag.as_str(), "--enable_snapshot_restore"];
    let etcd = EtcdServer::start();
    let port = free_port();
    let master = start_master_with(port, &etcd, &tmp.path().join("m1.log"), &flags);
    let addr = format!("127.0.0.1:{port}");
    let _node = StoreNode::start(&addr, "64MiB", &["--transport", "tcp"]);
    let rt = runtime();
    let c = rt.block_on(client(port));
    let log = rt.block_on(async {
        mooncake_oplog::etcd::EtcdLog::connect(
            &[etcd.endpoint()],
            mooncake_oplog::etcd::oplog_root("oplog-test"),
            Duration::from_secs(5),
        )
        .await
        .unwrap()
    });
    let (mut kept, mut removed) = (Vec::new(), Vec::new());
    for cycle in 0..4 {
        let (k, r) = rt.block_on(put_and_remove(&c, &format!("c{cycle}-"), 12));
        kept.extend(k);
        removed.extend(r);
        let out = common::verb_ok(&["snapshot", "--master", &addr]);
        assert!(out.starts_with("snapshot "), "{out}");
    }
    // Compacted: the floor is the snapshot before the newest; nothing up to it is left.
    let floor = rt
        .block_on(log.read_floor())
        .unwrap()
        .expect("a compaction floor");
    let metrics = http_get(master.metrics, "/metrics");
    for line in [
        "mooncake_rs_oplog_compactions_total 4".to_string(),
        format!(
            "mooncake_rs_oplog_compaction_floor_batch {}",
            floor.batch_id
        ),
        format!(
            "mooncake_rs_oplog_compaction_floor_sequence {}",
            floor.last_seq
        ),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    let first = rt.block_on(log.read_batches(0, 1)).unwrap();
    assert_eq!(first.first().map(|(id, _)| *id), Some(floor.batch_id + 1));
    // Acknowledged after the last snapshot: only in the log.
    let (k, r) = rt.block_on(put_and_remove(&c, "tail-", 8));
    kept.extend(k);
    removed.extend(r);
    kill(master);

    let master = start_master_with(port, &etcd, &tmp.path().join("m2.log"), &flags);
    let text = std::fs::read_to_string(tmp.path().join("m2.log")).unwrap_or_default();
    assert!(text.contains("op-log: loaded snapshot"), "{text}");
    rt.block_on(wait_readable(&c, &kept));
    for key in &removed {
        rt.block_on(assert_absent(&c, key));
    }
    kill(master);

    // Every snapshot damaged: the log alone cannot rebuild the state, and the start says so.
    for entry in std::fs::read_dir(&snapshots).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
    }
    let failed_log = tmp.path().join("m3.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        match spawn_master(port, &etcd, &failed_log, &flags) {
            Ok(m) => panic!(
                "a master started from a compacted log without its snapshot (pid {})",
                m.pid()
            ),
            Err(status) => {
                let text = std::fs::read_to_string(&failed_log).unwrap_or_default();
                if text.contains("cannot listen") && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                break status;
            }
        }
    };
    assert!(!status.success());
    let text = std::fs::read_to_string(&failed_log).unwrap_or_default();
    assert!(
        text.contains(&format!("compacted up to sequence {}", floor.last_seq)),
        "{text}"
    );
}
