//! Snapshots and restore with real processes: `mooncake master` with a snapshot directory,
//! `mooncake store` nodes, this test process as the client. The master is stopped with SIGTERM
//! or SIGKILL and started again on the same port with `--enable_snapshot_restore`; the nodes
//! re-mount and check their restored replicas. Every loop is bounded in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{http, pattern, signal, wait_exit, MasterOptions, MasterProcess, StoreNode, BIN};

/// The server's test-only pause after each snapshot chunk (milliseconds).
const TEST_CHUNK_DELAY_ENV: &str = "MC_SNAPSHOT_TEST_CHUNK_DELAY_MS";
use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{ErrorCode, ReplicaKind, ReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::TransportMode;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

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
    process: MasterProcess,
    log: PathBuf,
}

/// Spawns a master logging at `info` into `log`; `Err` when it exited before its "listening"
/// line (its status).
fn spawn_master(
    port: u16,
    dir: &Path,
    log: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<Master, ExitStatus> {
    let dir_flag = format!("--snapshot_dir={}", dir.display());
    let mut flags = vec![dir_flag.as_str()];
    flags.extend_from_slice(extra);
    let process = MasterProcess::spawn(MasterOptions {
        port,
        extra: &flags,
        stderr: std::fs::File::create(log).unwrap().into(),
        log: "info",
        env,
    })?;
    Ok(Master {
        process,
        log: log.to_path_buf(),
    })
}

impl Master {
    fn start(port: u16, dir: &Path, log: &Path, extra: &[&str]) -> Master {
        Master::start_with_env(port, dir, log, extra, &[])
    }

    fn start_with_env(
        port: u16,
        dir: &Path,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Master {
        // The previous master's port may take a moment to be free again.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match spawn_master(port, dir, log, extra, env) {
                Ok(master) => {
                    assert_eq!(master.process.rpc.port(), port);
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

    fn metrics(&self) -> SocketAddr {
        self.process.metrics
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metric(&self, name: &str) -> f64 {
        let (status, body) = http("GET", self.metrics(), "/metrics", b"");
        assert_eq!(status, 200);
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    }

    fn terminate(self) -> (ExitStatus, String) {
        let log = self.log.clone();
        let status = self
            .process
            .terminate(Duration::from_secs(30))
            .expect("SIGTERM exit");
        (status, std::fs::read_to_string(log).unwrap_or_default())
    }

    fn kill(mut self) {
        signal(&self.process.child, libc::SIGKILL);
        wait_exit(&mut self.process.child, Duration::from_secs(10)).expect("SIGKILL exit");
    }
}

/// A store node of the master on `port`, over TCP.
fn store_node(port: u16, segment: &str) -> StoreNode {
    StoreNode::start(
        &format!("127.0.0.1:{port}"),
        segment,
        &["--transport", "tcp"],
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(port: u16) -> StoreClient {
    client_with(port, true).await
}

/// A client; with `checksums` off its puts record no checksum at the master.
async fn client_with(port: u16, checksums: bool) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: format!("127.0.0.1:{port}"),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        transport: TransportMode::Tcp,
        verify_checksums: checksums,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
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
    common::wait_readable_within(c, objects, Duration::from_secs(30)).await
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
    let (ok, out, err) = snapshot_verb_with(port, &[]);
    assert!(ok, "{out}{err}");
    out
}

/// `mooncake snapshot --master ADDR EXTRA…`: success, stdout, stderr.
fn snapshot_verb_with(port: u16, extra: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(["snapshot", "--master", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env("MOONCAKE_LOG", "error")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The clean-shutdown marks in `dir`.
fn final_marks(dir: &Path) -> usize {
    mooncake_snapshot::SnapshotDir::open(dir, 2)
        .unwrap()
        .final_marks()
        .unwrap()
        .len()
}

#[test]
fn sigterm_takes_a_final_snapshot_and_a_restart_serves_every_object_byte_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let log = tmp.path().join("master.log");
    let port = free_port();
    let flags = ["--enable_snapshot", "--snapshot_interval_seconds=3600"];
    let master = Master::start(port, &dir, &log, &flags);
    let _a = store_node(port, "64MiB");
    let _b = store_node(port, "64MiB");
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
    let _node = store_node(port, "64MiB");
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
    let a = store_node(port, "64MiB");
    let b = store_node(port, "64MiB");
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
    let _node = store_node(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let first = rt.block_on(put_objects(&c, "old", 6));
    snapshot_verb(port);
    let _second = rt.block_on(put_objects(&c, "new", 6));
    let (status, body) = http("POST", master.metrics(), "/api/v1/snapshot", b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"objects\":12"), "{body}");
    // Upstream's snapshot families count the two takes.
    assert_eq!(master.metric("master_snapshot_success"), 2.0);
    assert_eq!(master.metric("master_snapshot_fail"), 0.0);
    assert_eq!(master.metric("master_snapshot_duration_ms_count"), 2.0);
    assert_eq!(
        master.metric("master_snapshot_duration_ms_bucket{le=\"+Inf\"}"),
        2.0
    );
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
        &[],
    );
    let status = refused.err().expect("--snapshot_required started empty");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("--snapshot_required"), "{text}");
}

#[test]
fn sigkill_during_a_snapshot_leaves_the_previous_one_intact_and_used() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    // Every take pauses 1.5 s after each chunk it writes (segments, policy, objects, …): a take
    // lasts several seconds, so the test sees it in progress without racing it.
    let delay = [(TEST_CHUNK_DELAY_ENV, "1500")];
    let log = tmp.path().join("m1.log");
    let master = Master::start_with_env(port, &dir, &log, &[], &delay);
    let _node = store_node(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let kept = rt.block_on(put_objects(&c, "kept", 6));
    snapshot_verb(port);
    let previous = snapshot_files(&dir);
    assert_eq!(previous.len(), 1);
    let previous_bytes = std::fs::read(&previous[0]).unwrap();
    let _later = rt.block_on(put_objects(&c, "later", 6));

    // Start a take; once its temp file exists (it is then pausing between chunks), SIGKILL.
    let metrics = master.metrics();
    let take = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(|| http("POST", metrics, "/api/v1/snapshot", b""));
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let temp = loop {
        let temp = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(".mcs.tmp"));
        if let Some(temp) = temp {
            break temp;
        }
        assert!(Instant::now() < deadline, "no take started in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    master.kill();
    let _ = take.join();
    // The killed take never reached its final name; the previous file is untouched.
    assert_eq!(snapshot_files(&dir), previous);
    assert_eq!(std::fs::read(&previous[0]).unwrap(), previous_bytes);
    assert!(mooncake_snapshot_verifies(&previous[0]));
    assert!(temp.exists());

    let log = tmp.path().join("m2.log");
    let master = Master::start(port, &dir, &log, &["--enable_snapshot_restore"]);
    let text = master.log_text();
    assert!(
        text.contains(&format!("restoring snapshot {}", previous[0].display())),
        "{text}"
    );
    assert!(
        !temp.exists(),
        "the killed take's temp file was not removed"
    );
    assert_eq!(master.metric("mooncake_rs_restore_objects"), 6.0);
    rt.block_on(wait_readable(&c, &kept));
    master.kill();
}

fn mooncake_snapshot_verifies(path: &Path) -> bool {
    mooncake_snapshot::decode(&std::fs::read(path).unwrap()).is_ok()
}

#[test]
fn objects_without_a_checksum_survive_a_clean_restart_but_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let flags = ["--enable_snapshot", "--snapshot_interval_seconds=3600"];
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &flags);
    let _a = store_node(port, "64MiB");
    let _b = store_node(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let plain = rt.block_on(client_with(port, false));
    let checked = rt.block_on(put_objects(&c, "checked", 12));
    let unchecked = rt.block_on(put_objects(&plain, "unchecked", 12));
    assert!(rt
        .block_on(c.get_replica_desc(&unchecked[0].0))
        .is_ok_and(|r| !r.is_empty()));

    // SIGTERM: the final snapshot, marked as the state of a clean shutdown.
    let (status, text) = master.terminate();
    assert!(
        status.success() && text.contains("final snapshot written"),
        "{text}"
    );
    assert_eq!(final_marks(&dir), 1);

    // The restart trusts it for what it cannot verify, and removes the mark before serving.
    let mut restore = flags.to_vec();
    restore.push("--enable_snapshot_restore");
    let master = Master::start(port, &dir, &tmp.path().join("m2.log"), &restore);
    assert!(
        master
            .log_text()
            .contains("the final one of a clean shutdown"),
        "{}",
        master.log_text()
    );
    assert_eq!(final_marks(&dir), 0);
    assert_eq!(master.metric("mooncake_rs_restore_clean_shutdown"), 1.0);
    assert_eq!(master.metric("mooncake_rs_restore_objects"), 24.0);
    rt.block_on(wait_readable(&c, &checked));
    rt.block_on(wait_readable(&c, &unchecked));

    // A crash of that master: the same snapshot, no longer final. Bytes without a checksum
    // cannot be checked against what the nodes hold now, so those objects are dropped; the
    // others come back.
    master.kill();
    let master = Master::start(port, &dir, &tmp.path().join("m3.log"), &restore);
    assert_eq!(master.metric("mooncake_rs_restore_clean_shutdown"), 0.0);
    assert_eq!(master.metric("mooncake_rs_restore_objects"), 12.0);
    assert_eq!(master.metric("mooncake_rs_restore_dropped_objects"), 12.0);
    rt.block_on(wait_readable(&c, &checked));
    for (key, _) in &unchecked {
        rt.block_on(wait_absent(&c, key, None));
    }
    master.kill();
}

#[test]
fn an_on_demand_snapshot_that_outlasts_the_rpc_timeout_is_reported_when_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    // Five chunks (segments, policy, objects, discarded, counters), 2.1 s after each: a take
    // lasts over 10 s, the deadline of every other call.
    let delay = [(TEST_CHUNK_DELAY_ENV, "2100")];
    let log = tmp.path().join("m.log");
    let master = Master::start_with_env(port, &dir, &log, &[], &delay);
    let _node = store_node(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    rt.block_on(put_objects(&c, "slow", 4));

    // A deadline shorter than the take: a clear error, and the take still completes.
    let (ok, out, err) = snapshot_verb_with(port, &["--timeout-seconds", "2"]);
    assert!(!ok, "{out}");
    assert!(err.contains("no answer within 2 s"), "{err}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while snapshot_files(&dir).is_empty() {
        assert!(Instant::now() < deadline, "the take did not complete");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The default: the call waits for the take with its own deadline and reports it.
    let started = Instant::now();
    let out = snapshot_verb(port);
    assert!(started.elapsed() > Duration::from_secs(10));
    assert!(
        out.starts_with("snapshot ") && out.contains(" objects 4 "),
        "{out}"
    );
    assert_eq!(snapshot_files(&dir).len(), 2);
    master.kill();
}

/// Polls (at most 30 s) until `key` reads back as `original` or is OBJECT_NOT_FOUND; it must
/// never read back other bytes meanwhile.
async fn wait_original_or_absent(c: &StoreClient, key: &str, original: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.get(key).await {
            Ok(got) => {
                assert!(got == original, "{key} came back with other bytes");
                return;
            }
            Err(e) if e.code() == ErrorCode::OBJECT_NOT_FOUND => return,
            Err(_) => {}
        }
        assert!(Instant::now() < deadline, "{key} neither readable nor gone");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn sigkill_after_a_periodic_snapshot_serves_exactly_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("snapshots");
    let port = free_port();
    let flags = ["--enable_snapshot", "--snapshot_interval_seconds=3"];
    let master = Master::start(port, &dir, &tmp.path().join("m1.log"), &flags);
    let _a = store_node(port, "64MiB");
    let _b = store_node(port, "64MiB");
    let rt = runtime();
    let c = rt.block_on(client(port));
    let before = rt.block_on(put_objects(&c, "before", 24));
    // Wait for a periodic snapshot of them, then change things and crash.
    let deadline = Instant::now() + Duration::from_secs(60);
    while master.metric("mooncake_rs_snapshots_taken_total") < 1.0 {
        assert!(Instant::now() < deadline, "no periodic snapshot in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = rt.block_on(put_objects(&c, "after", 6));
    let (removed_key, removed_value) = before[5].clone();
    rt.block_on(c.remove(&removed_key, true)).unwrap();
    let reused = rt.block_on(put_objects(&c, "reuse", 6));
    master.kill();

    // What the newest snapshot holds is what must come back: periodic snapshots keep being
    // taken, so the test reads it rather than guessing which one the crash left.
    let newest = snapshot_files(&dir)[0].clone();
    let (_, state) = mooncake_snapshot::decode(&std::fs::read(&newest).unwrap()).unwrap();
    let held: std::collections::HashSet<String> =
        state.objects.iter().map(|o| o.key.clone()).collect();
    assert!(before
        .iter()
        .all(|(k, _)| *k == removed_key || held.contains(k)));
    let master = Master::start(
        port,
        &dir,
        &tmp.path().join("m2.log"),
        &["--enable_snapshot_restore"],
    );
    assert!(master
        .log_text()
        .contains(&format!("restoring snapshot {}", newest.display())));
    let (present, absent): (Vec<_>, Vec<_>) = before
        .iter()
        .chain(&after)
        .chain(&reused)
        .filter(|(k, _)| *k != removed_key)
        .cloned()
        .partition(|(k, _)| held.contains(k));
    rt.block_on(wait_readable(&c, &present));
    for (key, _) in &absent {
        rt.block_on(wait_absent(&c, key, None));
    }
    // Removed after the snapshot: back with its own bytes if its range was not reused, else
    // dropped by its node's check; never another object's bytes. (Absent if a later periodic
    // snapshot saw the removal.)
    if held.contains(&removed_key) {
        rt.block_on(wait_original_or_absent(&c, &removed_key, &removed_value));
    } else {
        rt.block_on(wait_absent(&c, &removed_key, None));
    }
    master.kill();
}
