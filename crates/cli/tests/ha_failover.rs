//! High availability with real processes: a real etcd started by the test, two `mooncake
//! master --enable_ha` processes, a `mooncake store` node and this test process as the client,
//! both given both masters' addresses (`a,b`: calls follow the leader).
//!
//! - The first master leads, the second is a hot standby; `/role`, `/ha_status` and `/leader`
//!   say so on both. The leader is SIGKILLed: the standby takes over with a higher view
//!   version, every object acknowledged before reads back byte-exact, every acknowledged
//!   removal stays removed, and writes succeed again.
//! - Fencing: the leader is SIGSTOPped until the standby has taken over, then SIGCONTed. A put
//!   sent to it while it was stopped, and every put after, is refused; it reports that it
//!   stepped down, and the new leader holds everything acknowledged before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{http, pattern, signal, wait_exit, MasterOptions, MasterProcess, StoreNode};
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{ErrorCode, ReplicateConfig};
use mooncake_oplog::test_etcd::EtcdServer;
use mooncake_transfer::TransportMode;

const WAIT: Duration = Duration::from_secs(90);

fn start_master(etcd: &EtcdServer, cluster: &str, log: &Path) -> MasterProcess {
    let endpoints = format!("--etcd_endpoints={}", etcd.endpoint());
    let cluster = format!("--cluster_id={cluster}");
    MasterProcess::spawn(MasterOptions {
        extra: &["--enable_ha", &endpoints, &cluster],
        stderr: std::fs::File::create(log).unwrap().into(),
        log: "info",
        ..MasterOptions::default()
    })
    .unwrap_or_else(|status| panic!("master exited: {status}"))
}

fn get(addr: SocketAddr, path: &str) -> String {
    let (status, body) = http("GET", addr, path, b"");
    assert_eq!(status, 200, "{path}: {body}");
    body.trim().to_string()
}

/// Polls `path` on `addr` (at most [`WAIT`]) until it answers `want`.
fn wait_for(addr: SocketAddr, path: &str, want: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = get(addr, path);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path} on {addr} answered {got:?}, not {want:?}, within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `/leader` on `addr`: the leader's address and view version.
fn leader(addr: SocketAddr) -> (String, u64) {
    let v: serde_json::Value = serde_json::from_str(&get(addr, "/leader")).unwrap();
    assert_eq!(v["present"], true, "{v}");
    (
        v["leader_address"].as_str().unwrap().to_string(),
        v["view_version"].as_u64().unwrap(),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(masters: &str) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: masters.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        transport: TransportMode::Tcp,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

/// A leader and a standby on one etcd, a node, a client of both masters.
struct Cluster {
    _etcd: EtcdServer,
    first: MasterProcess,
    second: MasterProcess,
    _node: StoreNode,
    masters: String,
    _tmp: tempfile::TempDir,
}

fn cluster(name: &str) -> Cluster {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start();
    let first = start_master(&etcd, name, &tmp.path().join("m1.log"));
    wait_for(first.metrics, "/role", "leader");
    let second = start_master(&etcd, name, &tmp.path().join("m2.log"));
    wait_for(second.metrics, "/ha_status", "standby");
    let deadline = Instant::now() + WAIT;
    while get(second.metrics, "/leader").contains("\"present\":false") {
        assert!(
            Instant::now() < deadline,
            "the standby never saw the leader"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(second.metrics, "/role"), "standby");
    assert_eq!(get(first.metrics, "/ha_status"), "serving");
    // A standby's own (empty) state is not the cluster's: it does not answer for it.
    assert_eq!(http("GET", second.metrics, "/get_all_keys", b"").0, 409);
    assert_eq!(http("GET", first.metrics, "/get_all_keys", b"").0, 200);
    assert_eq!(leader(second.metrics).0, first.rpc.to_string());
    assert_eq!(leader(first.metrics), leader(second.metrics));
    let masters = format!("{},{}", first.rpc, second.rpc);
    let node = StoreNode::start(&masters, "64MiB", &["--transport", "tcp"]);
    Cluster {
        _etcd: etcd,
        first,
        second,
        _node: node,
        masters,
        _tmp: tmp,
    }
}

/// Puts 30 objects and removes every fifth; returns (kept, removed).
async fn write_some(c: &StoreClient, tag: &str) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let mut kept = Vec::new();
    let mut removed = Vec::new();
    for i in 0..30usize {
        let key = format!("{tag}{i}");
        let value = pattern(1000 + i * 3001, i as u64);
        c.put(&key, &value, &ReplicateConfig::default())
            .await
            .unwrap();
        if i % 5 == 0 {
            c.remove(&key, true).await.unwrap();
            removed.push(key);
        } else {
            kept.push((key, value));
        }
    }
    (kept, removed)
}

/// Every kept object reads back byte-exact, every removed one is absent, and a new put
/// succeeds (retried while the new leader is not serving yet).
async fn check_after_failover(c: &StoreClient, kept: &[(String, Vec<u8>)], removed: &[String]) {
    common::wait_readable_within(c, kept, WAIT).await;
    for key in removed {
        match c.get(key).await {
            Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => {}
            other => panic!("{key}: removed, yet {other:?}"),
        }
    }
    let deadline = Instant::now() + WAIT;
    let value = pattern(5000, 99);
    loop {
        match c.put("after", &value, &ReplicateConfig::default()).await {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "no write after failover: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(c.get("after").await.unwrap(), value);
}

#[test]
fn the_standby_takes_over_a_sigkilled_leader_with_every_acknowledged_object() {
    let Cluster {
        _etcd,
        first,
        second,
        _node,
        masters,
        _tmp,
    } = cluster("ha-kill");
    let rt = runtime();
    let c = rt.block_on(client(&masters));
    let (kept, removed) = rt.block_on(write_some(&c, "k"));
    let (_, old_view) = leader(second.metrics);
    let mut first = first;
    signal(&first.child, libc::SIGKILL);
    wait_exit(&mut first.child, Duration::from_secs(10)).expect("SIGKILL exit");

    wait_for(second.metrics, "/role", "leader");
    assert_eq!(get(second.metrics, "/ha_status"), "serving");
    let (address, view) = leader(second.metrics);
    assert_eq!(address, second.rpc.to_string());
    assert!(view > old_view, "view {view} after {old_view}");
    rt.block_on(check_after_failover(&c, &kept, &removed));
}

#[test]
fn a_leader_stopped_until_the_standby_took_over_acknowledges_nothing_after_and_steps_down() {
    let Cluster {
        _etcd,
        first,
        second,
        _node,
        masters,
        _tmp,
    } = cluster("ha-stop");
    let rt = runtime();
    let c = rt.block_on(client(&masters));
    let only_first = rt.block_on(client(&first.rpc.to_string()));
    let (kept, removed) = rt.block_on(write_some(&c, "s"));

    signal(&first.child, libc::SIGSTOP);
    // A put sent to the stopped leader: its request waits in the socket.
    let value = pattern(4096, 7);
    let pending = rt.spawn(async move {
        let r = only_first
            .put("sent-while-stopped", &value, &ReplicateConfig::default())
            .await;
        (only_first, r.map(|_| ()).map_err(|e| e.code()))
    });
    wait_for(second.metrics, "/role", "leader");
    signal(&first.child, libc::SIGCONT);

    let (only_first, sent) = rt.block_on(pending).unwrap();
    assert!(sent.is_err(), "the old leader acknowledged a put: {sent:?}");
    wait_for(first.metrics, "/ha_status", "stepped_down");
    assert_eq!(get(first.metrics, "/role"), "standby");
    for i in 0..3 {
        let r = rt.block_on(only_first.put(
            &format!("late{i}"),
            &pattern(4096, i),
            &ReplicateConfig::default(),
        ));
        let code = r.map(|_| ()).map_err(|e| e.code());
        assert_eq!(code, Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
    }
    rt.block_on(check_after_failover(&c, &kept, &removed));
    assert_eq!(get(second.metrics, "/role"), "leader");
    let _ = first;
}
