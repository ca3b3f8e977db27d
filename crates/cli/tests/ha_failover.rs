//! High availability with real processes: a real etcd started by the test, two `mooncake
//! master --enable_ha` processes, a `mooncake store` node and this test process as the client,
//! given both masters' addresses (`a,b`) or `etcd://` (the leader key): calls follow the
//! leader.
//!
//! - The first master leads, the second is a hot standby; `/role`, `/ha_status` and `/leader`
//!   say so on both. The leader is SIGKILLed: the standby takes over with a higher view
//!   version, every object acknowledged before reads back byte-exact, every acknowledged
//!   removal stays removed, and writes succeed again.
//! - After compaction: the leader takes snapshots of the log (compacting it) into a directory
//!   shared with the other masters; a standby started afterwards starts from the newest
//!   snapshot and the log after it, and takes over a SIGKILLed leader with every acknowledged
//!   object; a standby without the directory halts at start instead of serving a partial log.
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
    start_master_on(&etcd.endpoint(), cluster, log)
}

/// A master of `cluster` on the etcd members `endpoints` (comma-separated).
fn start_master_on(endpoints: &str, cluster: &str, log: &Path) -> MasterProcess {
    start_master_with(endpoints, cluster, log, &[])
}

/// [`start_master_on`] with more flags.
fn start_master_with(endpoints: &str, cluster: &str, log: &Path, more: &[&str]) -> MasterProcess {
    let endpoints = format!("--etcd_endpoints={endpoints}");
    let cluster = format!("--cluster_id={cluster}");
    let mut extra = vec!["--enable_ha", &endpoints, &cluster];
    extra.extend_from_slice(more);
    MasterProcess::spawn(MasterOptions {
        extra: &extra,
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
    etcd: EtcdServer,
    first: MasterProcess,
    second: MasterProcess,
    _node: StoreNode,
    masters: String,
    _tmp: tempfile::TempDir,
}

/// With `node_via_etcd` the node is given `etcd://…` (the cluster must then be upstream's
/// default `mooncake_cluster`), else both masters' addresses.
fn cluster(name: &str, node_via_etcd: bool) -> Cluster {
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
    let node_master = if node_via_etcd {
        format!("etcd://127.0.0.1:{}", etcd.client_port)
    } else {
        masters.clone()
    };
    let node = StoreNode::start(&node_master, "64MiB", &["--transport", "tcp"]);
    Cluster {
        etcd,
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
        etcd,
        first,
        second,
        _node,
        masters,
        _tmp,
    } = cluster("mooncake_cluster", true);
    let rt = runtime();
    let c = rt.block_on(client(&masters));
    // This client and the node find the leader in etcd (upstream's default cluster id).
    let via_etcd = rt.block_on(client(&format!("etcd://127.0.0.1:{}", etcd.client_port)));
    let (kept, removed) = rt.block_on(write_some(&via_etcd, "k"));
    let (_, old_view) = leader(second.metrics);
    let mut first = first;
    signal(&first.child, libc::SIGKILL);
    wait_exit(&mut first.child, Duration::from_secs(10)).expect("SIGKILL exit");

    wait_for(second.metrics, "/role", "leader");
    assert_eq!(get(second.metrics, "/ha_status"), "serving");
    let (address, view) = leader(second.metrics);
    assert_eq!(address, second.rpc.to_string());
    assert!(view > old_view, "view {view} after {old_view}");
    rt.block_on(check_after_failover(&via_etcd, &kept, &removed));
    rt.block_on(common::wait_readable_within(&c, &kept, WAIT));
}

#[test]
fn a_standby_started_after_compaction_starts_from_the_newest_snapshot_and_takes_over() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let dir = format!("--snapshot_dir={}", tmp.path().join("shared").display());
    let cluster = "mooncake_cluster"; // what `etcd://` clients look up
    let first = start_master_with(&endpoint, cluster, &tmp.path().join("m1.log"), &[&dir]);
    wait_for(first.metrics, "/role", "leader");
    let via_etcd = format!("etcd://127.0.0.1:{}", etcd.client_port);
    let _node = StoreNode::start(&via_etcd, "64MiB", &["--transport", "tcp"]);
    let rt = runtime();
    let c = rt.block_on(client(&via_etcd));
    let (mut kept, mut removed) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let (k, r) = rt.block_on(write_some(&c, &format!("r{round}-")));
        kept.extend(k);
        removed.extend(r);
        let out = common::verb_ok(&["snapshot", "--master", &first.rpc.to_string()]);
        assert!(out.starts_with("snapshot "), "{out}");
    }
    let (k, r) = rt.block_on(write_some(&c, "tail-"));
    kept.extend(k);
    removed.extend(r);
    let floor = rt.block_on(async {
        let log = mooncake_oplog::etcd::EtcdLog::connect(
            std::slice::from_ref(&endpoint),
            mooncake_oplog::etcd::oplog_root(cluster),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        log.read_floor().await.unwrap()
    });
    assert!(floor.is_some(), "the log was compacted");
    // Without the snapshots the compacted log cannot be replayed: that standby halts.
    let blind = start_master_with(&endpoint, cluster, &tmp.path().join("m3.log"), &[]);
    wait_for(blind.metrics, "/ha_status", "halted");
    let second = start_master_with(&endpoint, cluster, &tmp.path().join("m2.log"), &[&dir]);
    wait_for(second.metrics, "/ha_status", "standby");
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(tmp.path().join("m2.log")).unwrap_or_default();
        if text.contains("op-log: loaded snapshot") {
            break;
        }
        assert!(Instant::now() < deadline, "no snapshot loaded: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut first = first;
    signal(&first.child, libc::SIGKILL);
    wait_exit(&mut first.child, Duration::from_secs(10)).expect("SIGKILL exit");
    wait_for(second.metrics, "/role", "leader");
    rt.block_on(check_after_failover(&c, &kept, &removed));
    assert_eq!(get(blind.metrics, "/ha_status"), "halted");
}

#[test]
fn a_leader_stopped_until_the_standby_took_over_acknowledges_nothing_after_and_steps_down() {
    let Cluster {
        etcd: _etcd,
        first,
        second,
        _node,
        masters,
        _tmp,
    } = cluster("ha-stop", false);
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

/// Masters on fixed ports (a restarted one keeps its address, which the node and the client
/// were given).
struct Group {
    etcd: EtcdServer,
    cluster: String,
    ports: [u16; 2],
    masters: [Option<MasterProcess>; 2],
    dir: tempfile::TempDir,
    starts: usize,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Group {
    /// Starts master `i` on its port (retried while the previous process's port is not free).
    fn start(&mut self, i: usize) {
        self.starts += 1;
        let log = self.dir.path().join(format!("m{i}-{}.log", self.starts));
        let endpoints = format!("--etcd_endpoints={}", self.etcd.endpoint());
        let cluster = format!("--cluster_id={}", self.cluster);
        let deadline = Instant::now() + WAIT;
        loop {
            match MasterProcess::spawn(MasterOptions {
                port: self.ports[i],
                extra: &["--enable_ha", &endpoints, &cluster],
                stderr: std::fs::File::create(&log).unwrap().into(),
                log: "info",
                ..MasterOptions::default()
            }) {
                Ok(m) => {
                    self.masters[i] = Some(m);
                    return;
                }
                Err(status) => {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    assert!(
                        text.contains("cannot listen") && Instant::now() < deadline,
                        "{status}: {text}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    fn metrics(&self, i: usize) -> SocketAddr {
        self.masters[i].as_ref().unwrap().metrics
    }

    fn addresses(&self) -> String {
        format!("127.0.0.1:{},127.0.0.1:{}", self.ports[0], self.ports[1])
    }

    /// The index of the serving leader (waits for one).
    fn leader(&self) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            for i in 0..2 {
                if self.masters[i].is_some() && get(self.metrics(i), "/role") == "leader" {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self, i: usize) {
        let mut m = self.masters[i].take().unwrap();
        signal(&m.child, libc::SIGKILL);
        wait_exit(&mut m.child, Duration::from_secs(10)).expect("SIGKILL exit");
    }
}

/// What the writer did: acknowledged puts (with their bytes), acknowledged removals, and when
/// each acknowledgement arrived.
#[derive(Default)]
struct Written {
    kept: Vec<(String, Vec<u8>)>,
    removed: Vec<String>,
    acked_at: Vec<Instant>,
}

/// Puts (and removes every tenth key) until `stop`; reads back an earlier key after each put:
/// a read either fails or gives exactly the bytes that were put.
async fn write_until(
    c: StoreClient,
    written: std::sync::Arc<std::sync::Mutex<Written>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let key = format!("w{i}");
        let value = pattern(4096 + (i as usize % 7) * 1000, i);
        i += 1;
        if c.put(&key, &value, &ReplicateConfig::default())
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let now = Instant::now();
        let removed = i.is_multiple_of(10) && remove_surely(&c, &key).await;
        let earlier = {
            let mut w = written.lock().unwrap();
            w.acked_at.push(now);
            if removed {
                w.removed.push(key);
            } else {
                w.kept.push((key, value));
            }
            w.kept.get((i as usize * 7919) % w.kept.len()).cloned()
        };
        if let Some((key, value)) = earlier {
            if let Ok(got) = c.get(&key).await {
                assert!(got == value, "{key}: other bytes than were put");
            }
        }
    }
}

/// Removes `key`, retrying a removal whose outcome is unknown (a failover broke the call) until
/// the master says it is gone.
async fn remove_surely(c: &StoreClient, key: &str) -> bool {
    let deadline = Instant::now() + WAIT;
    loop {
        match c.remove(key, true).await {
            Ok(()) => return true,
            Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => return true,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{key}: removal still failing after {WAIT:?}: {e}"),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Failover under load, `HA_FAILOVER_ROUNDS` times (default 10; scripts/ha-failover-loop.sh
/// runs 100): a writer puts, removes and reads back through both masters; the leader is
/// SIGKILLed; the time from the kill to the next acknowledged put is recorded; the killed master
/// starts again as a standby. Afterwards every acknowledged put reads back byte-exact and no
/// acknowledged removal came back. Prints the failover times (no assertion on them).
#[test]
fn failover_loop_under_load_loses_no_acknowledged_write() {
    let rounds: usize = std::env::var("HA_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut group = Group {
        etcd: EtcdServer::start(),
        cluster: "ha-loop".into(),
        ports: [free_port(), free_port()],
        masters: [None, None],
        dir: tempfile::tempdir().unwrap(),
        starts: 0,
    };
    group.start(0);
    wait_for(group.metrics(0), "/role", "leader");
    group.start(1);
    wait_for(group.metrics(1), "/ha_status", "standby");
    let _nodes = [
        StoreNode::start(&group.addresses(), "64MiB", &["--transport", "tcp"]),
        StoreNode::start(&group.addresses(), "64MiB", &["--transport", "tcp"]),
    ];
    let rt = runtime();
    let c = rt.block_on(client(&group.addresses()));
    let written = std::sync::Arc::new(std::sync::Mutex::new(Written::default()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = rt.spawn(write_until(c.clone(), written.clone(), stop.clone()));

    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let leader = group.leader();
        let standby = 1 - leader;
        wait_for(group.metrics(standby), "/ha_status", "standby");
        let before = written.lock().unwrap().acked_at.len();
        let deadline = Instant::now() + WAIT;
        while written.lock().unwrap().acked_at.len() < before + 50 {
            assert!(
                Instant::now() < deadline,
                "round {round}: no writes before the kill"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let killed_at = Instant::now();
        group.kill(leader);
        let deadline = Instant::now() + WAIT;
        let first = loop {
            let after = written
                .lock()
                .unwrap()
                .acked_at
                .iter()
                .rev()
                .take_while(|t| **t > killed_at)
                .last()
                .copied();
            if let Some(t) = after {
                break t;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no acknowledged write within {WAIT:?} of the kill"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        times.push(first - killed_at);
        group.start(leader);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(writer).unwrap();

    let w = std::mem::take(&mut *written.lock().unwrap());
    rt.block_on(common::wait_readable_within(&c, &w.kept, WAIT));
    for key in &w.removed {
        match rt.block_on(c.get(key)) {
            Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => {}
            other => panic!("{key}: removed, yet {other:?}"),
        }
    }
    times.sort();
    println!(
        "failover: {rounds} rounds, {} puts acknowledged ({} then removed), kill to first acknowledged write p50 {} ms, p99 {} ms, max {} ms",
        w.kept.len() + w.removed.len(),
        w.removed.len(),
        percentile(&times, 0.5).as_millis(),
        percentile(&times, 0.99).as_millis(),
        times.last().map_or(0, |t| t.as_millis()),
    );
}

/// etcd down for 10 s under an HA pair: no write is acknowledged while it is down (each fails
/// with an error), the leader steps down once its lease could have run out, and once etcd is
/// back the standby takes over by itself with everything acknowledged before.
#[test]
fn an_etcd_outage_loses_nothing_acknowledged_and_service_resumes_by_itself() {
    let Cluster {
        mut etcd,
        first,
        second,
        _node,
        masters,
        _tmp,
    } = cluster("ha-etcd", false);
    let rt = runtime();
    let c = rt.block_on(client(&masters));
    let (mut kept, removed) = rt.block_on(write_some(&c, "e"));
    etcd.kill();
    let down = Instant::now();
    let mut refused = 0;
    let mut i = 0usize;
    while refused < 3 || down.elapsed() < Duration::from_secs(10) {
        assert!(down.elapsed() < WAIT, "puts neither failed nor succeeded");
        let (key, value) = (format!("down{i}"), pattern(4096, 100 + i as u64));
        i += 1;
        match rt.block_on(c.put(&key, &value, &ReplicateConfig::default())) {
            Ok(_) => kept.push((key, value)),
            Err(_) => refused += 1,
        }
    }
    wait_for(first.metrics, "/ha_status", "stepped_down");
    etcd.restart();
    wait_for(second.metrics, "/role", "leader");
    rt.block_on(check_after_failover(&c, &kept, &removed));
}

/// With a three-member etcd, killing one member stops neither the leader's writes nor a later
/// failover: puts keep being acknowledged, and after the leader is SIGKILLed the standby takes
/// over with everything acknowledged.
#[test]
fn a_three_member_etcd_that_loses_a_member_keeps_writes_and_failover_working() {
    let tmp = tempfile::tempdir().unwrap();
    let mut members = EtcdServer::start_cluster(3);
    let endpoints = members
        .iter()
        .map(EtcdServer::endpoint)
        .collect::<Vec<_>>()
        .join(",");
    let mut masters = [
        Some(start_master_on(
            &endpoints,
            "ha-3",
            &tmp.path().join("m1.log"),
        )),
        None,
    ];
    let first = masters[0].as_ref().unwrap().metrics;
    wait_for(first, "/role", "leader");
    masters[1] = Some(start_master_on(
        &endpoints,
        "ha-3",
        &tmp.path().join("m2.log"),
    ));
    let second = masters[1].as_ref().unwrap().metrics;
    wait_for(second, "/ha_status", "standby");
    let list = masters
        .iter()
        .map(|m| m.as_ref().unwrap().rpc.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let _node = StoreNode::start(&list, "64MiB", &["--transport", "tcp"]);
    let rt = runtime();
    let c = rt.block_on(client(&list));
    let (mut kept, removed) = rt.block_on(write_some(&c, "t"));

    members[0].kill();
    let deadline = Instant::now() + WAIT;
    let mut i = 0u64;
    while kept.len() < 34 {
        assert!(
            Instant::now() < deadline,
            "no puts acknowledged after a member died"
        );
        let (key, value) = (format!("after-member{i}"), pattern(4096, 500 + i));
        i += 1;
        if rt
            .block_on(c.put(&key, &value, &ReplicateConfig::default()))
            .is_ok()
        {
            kept.push((key, value));
        }
    }

    let deadline = Instant::now() + WAIT;
    let leader = loop {
        let found = [first, second]
            .iter()
            .position(|&m| get(m, "/role") == "leader");
        if let Some(i) = found {
            break i;
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut dead = masters[leader].take().unwrap();
    signal(&dead.child, libc::SIGKILL);
    wait_exit(&mut dead.child, Duration::from_secs(10)).expect("SIGKILL exit");
    wait_for([first, second][1 - leader], "/role", "leader");
    rt.block_on(check_after_failover(&c, &kept, &removed));
}
