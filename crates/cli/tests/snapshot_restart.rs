//! Snapshots and restore with real processes: `mooncake master` with a snapshot directory,
//! `mooncake store` nodes, this test process as the client. The master is stopped with SIGTERM
//! or SIGKILL and started again on the same port with `--enable_snapshot_restore`; the nodes
//! re-mount and check their restored replicas. Every loop is bounded in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::http;
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{ErrorCode, ReplicaKind, ReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::TransportMode;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mooncake");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `mooncake master` on a fixed RPC port (a restarted master must be found where the nodes
/// look for it), its stderr in a file; killed on drop.
struct Master {
    child: Child,
    rpc: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

/// Spawns a master; `None` when it exited before its "listening" line (its status).
fn spawn_master(port: u16, dir: &Path, log: &Path, extra: &[&str]) -> Result<Master, ExitStatus> {
    let stderr = std::fs::File::create(log).unwrap();
    let mut child = Command::new(BIN)
        .arg("master")
        .args([
            "--rpc_address=127.0.0.1".to_string(),
            format!("--port={port}"),
            "--metrics_host=127.0.0.1".into(),
            "--metrics_port=0".into(),
            format!("--snapshot_dir={}", dir.display()),
        ])
        .args(extra)
        .env("MOONCAKE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start mooncake master");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            if line.is_empty() {
                return Err(wait_exit(&mut child, Duration::from_secs(10)).unwrap());
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let find = |tag: &str| {
                let i = words.iter().position(|w| *w == tag).unwrap();
                words[i + 1]
                    .trim_start_matches("http://")
                    .parse::<SocketAddr>()
                    .unwrap()
            };
            return Ok(Master {
                rpc: find("rpc"),
                metrics: find("metrics"),
                child,
                log: log.to_path_buf(),
            });
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Err(status);
        }
        assert!(Instant::now() < deadline, "master did not start in 30 s");
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
}

impl Master {
    fn start(port: u16, dir: &Path, log: &Path, extra: &[&str]) -> Master {
        // The previous master's port may take a moment to be free again.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match spawn_master(port, dir, log, extra) {
                Ok(master) => {
                    assert_eq!(master.rpc.port(), port);
                    return master;
                }
                Err(status) if Instant::now() < deadline => {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    assert!(text.contains("cannot listen"), "{status}: {text}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(status) => panic!("master exited: {status}"),
            }
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metric(&self, name: &str) -> f64 {
        let (status, body) = http("GET", self.metrics, "/metrics", b"");
        assert_eq!(status, 200);
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    }

    fn terminate(mut self) -> (ExitStatus, String) {
        signal(&self.child, libc::SIGTERM);
        let status = wait_exit(&mut self.child, Duration::from_secs(30)).expect("SIGTERM exit");
        (status, self.log_text())
    }

    fn kill(mut self) {
        signal(&self.child, libc::SIGKILL);
        wait_exit(&mut self.child, Duration::from_secs(10)).expect("SIGKILL exit");
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `mooncake store` node; killed on drop.
struct StoreNode {
    child: Child,
    endpoint: String,
}

impl StoreNode {
    fn start(port: u16, segment: &str) -> StoreNode {
        let mut child = Command::new(BIN)
            .args([
                "store",
                "--master",
                &format!("127.0.0.1:{port}"),
                "--segment-size",
                segment,
                "--transport",
                "tcp",
            ])
            .env("MOONCAKE_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start mooncake store");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("store node did not start in 20 s");
        let endpoint = line
            .split_whitespace()
            .skip_while(|w| *w != "endpoint")
            .nth(1)
            .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
            .to_string();
        StoreNode { child, endpoint }
    }

    fn kill(mut self) {
        signal(&self.child, libc::SIGKILL);
        wait_exit(&mut self.child, Duration::from_secs(10)).expect("node exit");
    }
}

impl Drop for StoreNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Mixed sizes: 200 B, 1 KiB … 1 MiB.
fn size_of(i: usize) -> usize {
    [200, 1 << 10, 7 << 10, 64 << 10, 300 << 10, 1 << 20][i % 6]
}

async fn put_objects(c: &StoreClient, prefix: &str, n: usize) -> Vec<(String, Vec<u8>)> {
    let one = ReplicateConfig::default();
    let mut objects = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let value = pattern(size_of(i), (i as u64) << 8 | prefix.len() as u64);
        c.put(&key, &value, &one).await.unwrap();
        objects.push((key, value));
    }
    objects
}

/// Polls (at most 30 s) until every object reads back; asserts each is byte-exact.
async fn wait_readable(c: &StoreClient, objects: &[(String, Vec<u8>)]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for (key, value) in objects {
        loop {
            match c.get(key).await {
                Ok(got) => {
                    assert!(got == *value, "{key}: bytes differ after restore");
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{key} not readable 30 s after the restart: {e}"),
            }
        }
    }
}

/// Polls (at most 30 s) until `key` is OBJECT_NOT_FOUND; it must never read back other bytes
/// than `original` meanwhile.
async fn wait_absent(c: &StoreClient, key: &str, original: Option<&[u8]>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.get(key).await {
            Ok(got) => {
                assert!(
                    Some(got.as_slice()) == original,
                    "{key} came back with other bytes"
                );
            }
            Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => return,
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "{key} still present after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn replica_range(c: &StoreClient, key: &str) -> (String, u64, u64) {
    let reply = c
        .master()
        .call(&m::GetReplicaList {
            key: key.into(),
            tenant: String::new(),
        })
        .await
        .unwrap();
    match &reply.replicas[0].kind {
        ReplicaKind::Memory(mem) => (
            mem.transport_endpoint.to_string(),
            mem.buffer_address,
            mem.size,
        ),
        other => panic!("not a memory replica: {other:?}"),
    }
}

fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mcs"))
        .collect();
    files.sort();
    files.reverse();
    files
}

/// `mooncake snapshot --master ADDR`: its stdout.
fn snapshot_verb(port: u16) -> String {
    let out = Command::new(BIN)
        .args(["snapshot", "--master", &format!("127.0.0.1:{port}")])
        .env("MOONCAKE_LOG", "error")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn sigterm_takes_a_final_snapshot_and_a_restart_serves_every_object_byte_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let log = tmp.path().join("master.log");
    let port = free_port();
    let flags = ["--enable_snapshot", "--snapshot_interval_seconds=3600"];
    let master = Master::start(port, &dir, &log, &flags);
    let _a = StoreNode::start(port, "64MiB");
    let _b = StoreNode::start(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let objects = rt.block_on(put_objects(&c, "term", 48));

    let (status, text) = master.terminate();
    assert!(status.success(), "{status}: {text}");
    assert!(
        text.contains("final snapshot written"),
        "no final snapshot line in: {text}"
    );
    assert_eq!(snapshot_files(&dir).len(), 1);

    // While the master is down calls fail with a transport code, within the RPC timeout.
    let started = Instant::now();
    let error = rt.block_on(c.get(&objects[0].0)).unwrap_err();
    assert!(
        matches!(error.code(), ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    let log2 = tmp.path().join("master2.log");
    let mut restore = flags.to_vec();
    restore.push("--enable_snapshot_restore");
    let master = Master::start(port, &dir, &log2, &restore);
    assert!(master.log_text().contains("restoring snapshot"));
    assert_eq!(
        master.metric("mooncake_rs_restore_objects"),
        objects.len() as f64
    );
    // The same client, no re-put: every object reads back once its node re-mounted.
    rt.block_on(wait_readable(&c, &objects));
    assert_eq!(master.metric("mooncake_rs_restore_waiting_segments"), 0.0);
    let (status, _) = master.terminate();
    assert!(status.success());
}

#[test]
fn sigkill_after_a_snapshot_keeps_its_objects_and_never_serves_reused_space() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &[]);
    let _node = StoreNode::start(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let before = rt.block_on(put_objects(&c, "before", 24));
    let out = snapshot_verb(port);
    assert!(
        out.starts_with("snapshot ") && out.contains(" objects 24 "),
        "{out}"
    );

    // After the snapshot: new objects, and one snapshotted object removed and its space reused.
    let after = rt.block_on(put_objects(&c, "after", 6));
    let (removed_key, removed_value) = before[5].clone();
    let (endpoint, address, len) = rt.block_on(replica_range(&c, &removed_key));
    rt.block_on(c.remove(&removed_key, true)).unwrap();
    let reuse = pattern(removed_value.len(), 0xdead);
    let mut reused = false;
    for i in 0..8 {
        let key = format!("reuse-{i}");
        rt.block_on(c.put(&key, &reuse, &ReplicateConfig::default()))
            .unwrap();
        let (e, a, l) = rt.block_on(replica_range(&c, &key));
        if e == endpoint && a < address + len && address < a + l {
            reused = true;
            break;
        }
    }
    assert!(reused, "no put reused the removed object's range");
    master.kill();

    let master = Master::start(
        port,
        &dir,
        &tmp.path().join("m2.log"),
        &["--enable_snapshot_restore"],
    );
    let kept: Vec<_> = before
        .iter()
        .filter(|(k, _)| *k != removed_key)
        .cloned()
        .collect();
    rt.block_on(wait_readable(&c, &kept));
    // The removed object's restored replica points at bytes the node handed to another put:
    // the node's checksum check fails and the master drops it.
    rt.block_on(wait_absent(&c, &removed_key, Some(&removed_value)));
    for (key, _) in &after {
        rt.block_on(wait_absent(&c, key, None));
    }
    assert!(master.metric("mooncake_rs_restore_dropped_replicas_total") >= 1.0);
    master.kill();
}

#[test]
fn a_node_that_dies_while_the_master_is_down_loses_its_replicas_after_client_ttl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let flags = [
        "--enable_snapshot",
        "--snapshot_interval_seconds=3600",
        "--client_ttl=2",
    ];
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &flags);
    let a = StoreNode::start(port, "64MiB");
    let b = StoreNode::start(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let objects = rt.block_on(put_objects(&c, "ttl", 24));
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    for object in &objects {
        let (endpoint, _, _) = rt.block_on(replica_range(&c, &object.0));
        if endpoint == a.endpoint {
            on_a.push(object.clone());
        } else {
            assert_eq!(endpoint, b.endpoint);
            on_b.push(object.clone());
        }
    }
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "placement used one node"
    );
    let (status, _) = master.terminate();
    assert!(status.success());
    b.kill();

    let mut restore = flags.to_vec();
    restore.push("--enable_snapshot_restore");
    let master = Master::start(port, &dir, &tmp.path().join("m2.log"), &restore);
    rt.block_on(wait_readable(&c, &on_a));
    for (key, value) in &on_b {
        rt.block_on(wait_absent(&c, key, Some(value)));
    }
    assert!(master.metric("mooncake_rs_restore_expired_segments_total") >= 1.0);
    rt.block_on(wait_readable(&c, &on_a));
    master.kill();
}

#[test]
fn a_corrupt_or_truncated_newest_snapshot_falls_back_and_both_bad_start_empty_or_refuse() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &[]);
    let _node = StoreNode::start(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let first = rt.block_on(put_objects(&c, "old", 6));
    snapshot_verb(port);
    let _second = rt.block_on(put_objects(&c, "new", 6));
    let (status, body) = http("POST", master.metrics, "/api/v1/snapshot", b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"objects\":12"), "{body}");
    master.kill();
    let files = snapshot_files(&dir);
    assert_eq!(files.len(), 2);
    let (newest, older) = (files[0].clone(), files[1].clone());

    for damage in ["flip", "truncate"] {
        let mut bytes = std::fs::read(&newest).unwrap();
        let pristine = bytes.clone();
        if damage == "flip" {
            let at = bytes.len() / 2;
            bytes[at] ^= 0x40;
        } else {
            bytes.truncate(bytes.len() - 3);
        }
        std::fs::write(&newest, &bytes).unwrap();
        let log = tmp.path().join(format!("{damage}.log"));
        let master = Master::start(port, &dir, &log, &["--enable_snapshot_restore"]);
        let text = master.log_text();
        assert!(
            text.contains(&format!("snapshot {} skipped", newest.display())),
            "{damage}: {text}"
        );
        assert!(
            text.contains(&format!("restoring snapshot {}", older.display())),
            "{damage}: {text}"
        );
        assert_eq!(master.metric("mooncake_rs_restore_objects"), 6.0);
        assert_eq!(master.metric("mooncake_rs_restore_skipped_files"), 1.0);
        rt.block_on(wait_readable(&c, &first));
        master.kill();
        std::fs::write(&newest, &pristine).unwrap();
    }

    // Both bad: an empty start with an error line, or a refusal with --snapshot_required.
    for file in [&newest, &older] {
        let bytes = std::fs::read(file).unwrap();
        std::fs::write(file, &bytes[..bytes.len() / 2]).unwrap();
    }
    let master = Master::start(
        port,
        &dir,
        &tmp.path().join("empty.log"),
        &["--enable_snapshot_restore"],
    );
    let text = master.log_text();
    assert!(
        text.contains("ERROR") && text.contains("verifies (2 skipped): starting empty"),
        "{text}"
    );
    assert_eq!(master.metric("mooncake_rs_restore_objects"), 0.0);
    master.kill();
    let log = tmp.path().join("required.log");
    let refused = spawn_master(
        port,
        &dir,
        &log,
        &["--enable_snapshot_restore", "--snapshot_required"],
    );
    let status = refused.err().expect("--snapshot_required started empty");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("--snapshot_required"), "{text}");
}

/// Puts `n` small objects in batches of 500.
async fn put_many(c: &StoreClient, prefix: &str, n: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:06}")).collect();
    let value = [7u8; 64];
    for chunk in keys.chunks(500) {
        let items: Vec<(&str, &[u8])> = chunk.iter().map(|k| (k.as_str(), &value[..])).collect();
        for result in c.put_batch(&items, &ReplicateConfig::default()).await {
            result.unwrap();
        }
    }
}

#[test]
fn sigkill_during_a_snapshot_leaves_the_previous_one_intact_and_used() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &[]);
    let _node = StoreNode::start(port, "256MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let kept = rt.block_on(put_objects(&c, "kept", 6));
    snapshot_verb(port);
    let previous = snapshot_files(&dir);
    assert_eq!(previous.len(), 1);
    let previous_bytes = std::fs::read(&previous[0]).unwrap();
    // Enough objects that writing the next snapshot takes a while.
    rt.block_on(put_many(&c, "bulk", 20_000));

    // Start takes until one is caught in the act (its temp file exists), then SIGKILL.
    let metrics = master.metrics;
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut caught = None;
    while caught.is_none() && Instant::now() < deadline {
        let take = std::thread::spawn(move || http("POST", metrics, "/api/v1/snapshot", b""));
        while !take.is_finished() {
            let temp = std::fs::read_dir(&dir)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.to_string_lossy().ends_with(".mcs.tmp"));
            if let Some(temp) = temp {
                signal(&master.child, libc::SIGKILL);
                caught = Some(temp);
                break;
            }
        }
        // A take that completed uncaught is the previous snapshot of the next attempt.
        let _ = take.join();
    }
    let temp = caught.expect("no take was caught writing its temp file in 40 s");
    drop(master);
    // The newest complete file is untouched by the killed take.
    let newest_complete = snapshot_files(&dir)[0].clone();
    if newest_complete == previous[0] {
        assert_eq!(std::fs::read(&previous[0]).unwrap(), previous_bytes);
    }
    assert!(mooncake_snapshot_verifies(&newest_complete));

    let log = tmp.path().join("m2.log");
    let master = Master::start(port, &dir, &log, &["--enable_snapshot_restore"]);
    let text = master.log_text();
    assert!(
        text.contains(&format!("restoring snapshot {}", newest_complete.display())),
        "{text}"
    );
    assert!(
        !temp.exists(),
        "the killed take's temp file was not removed"
    );
    rt.block_on(wait_readable(&c, &kept));
    master.kill();
}

fn mooncake_snapshot_verifies(path: &Path) -> bool {
    mooncake_snapshot::decode(&std::fs::read(path).unwrap()).is_ok()
}
