//! Nodes leaving without losing objects, every role a real process: a `mooncake store` that gets
//! SIGTERM moves its objects to the other node before it unmounts, and a drain job
//! (`/api/v1/drain_jobs`, `mooncake drain`) empties a node under a reader. Every wait is a
//! bounded poll.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cluster::{client, runtime};
use common::{http, pattern, verb_ok, MasterProcess, StoreNode};
use mooncake_client::StoreClient;
use mooncake_common::ReplicateConfig;
use mooncake_proto::methods as m;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn value_of(i: usize, len: usize) -> Vec<u8> {
    pattern(len, i as u64 + 1)
}

/// Puts `count` objects of `len` bytes on `node` (its name preferred).
async fn fill(c: &StoreClient, node: &StoreNode, count: usize, len: usize) -> Vec<String> {
    let on = ReplicateConfig {
        preferred_segments: vec![node.name.clone()],
        ..ReplicateConfig::default()
    };
    let keys: Vec<String> = (0..count).map(|i| format!("obj/{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        c.put(key, &value_of(i, len), &on).await.unwrap();
    }
    keys
}

/// Reads every key again and again until stopped; counts reads that returned bytes, and
/// returned bytes that differ from what was put (must stay 0).
struct Reader {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Reader {
    fn start(master: SocketAddr, count: usize, len: usize) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let wrong = Arc::new(AtomicU64::new(0));
        let (s, o, w) = (stop.clone(), ok.clone(), wrong.clone());
        let thread = std::thread::spawn(move || {
            runtime().block_on(async {
                let c = client(master).await;
                while !s.load(Ordering::Relaxed) {
                    for i in 0..count {
                        if let Ok(bytes) = c.get(&format!("obj/{i}")).await {
                            o.fetch_add(1, Ordering::Relaxed);
                            if bytes != value_of(i, len) {
                                w.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                let _ = c.close().await;
            })
        });
        Reader {
            stop,
            ok,
            wrong,
            thread,
        }
    }

    /// Stops it; returns (reads that returned bytes, wrong ones).
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.ok.load(Ordering::Relaxed),
            self.wrong.load(Ordering::Relaxed),
        )
    }
}

/// Every object reads back byte-exact through a fresh client.
fn assert_all_readable(master: SocketAddr, count: usize, len: usize) {
    runtime().block_on(async {
        let c = client(master).await;
        for i in 0..count {
            let got = c.get(&format!("obj/{i}")).await;
            assert!(got.unwrap() == value_of(i, len), "obj/{i} differs");
        }
        c.close().await.unwrap();
    });
}

fn node_logging(
    master: &MasterProcess,
    size: &str,
    extra: &[&str],
    log: &std::path::Path,
) -> StoreNode {
    let file = std::fs::File::create(log).unwrap();
    StoreNode::start_logging(
        &master.rpc.to_string(),
        size,
        extra,
        "info",
        Stdio::from(file),
    )
}

fn log_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("mc-drain-{tag}-{}.log", std::process::id()))
}

/// SIGTERM on a node under a reader: it moves its objects to the other node, unmounts and
/// exits 0; no read returned wrong bytes, and every object is readable afterwards.
#[test]
fn sigterm_moves_every_object_to_the_other_node() {
    let master = MasterProcess::start(&[]);
    let log = log_path("sigterm");
    let mut a = node_logging(&master, "64MiB", &["--drain-on-shutdown-secs=60"], &log);
    let _b = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let (count, len) = (300, 64 << 10);
    runtime().block_on(async {
        let c = client(master.rpc).await;
        fill(&c, &a, count, len).await;
        c.close().await.unwrap();
    });
    let reader = Reader::start(master.rpc, count, len);
    a.signal(libc::SIGTERM);
    let status = a.wait(Duration::from_secs(90)).expect("node did not exit");
    assert!(status.success(), "{status}");
    let (ok, wrong) = reader.finish();
    assert_eq!(wrong, 0, "reads returned wrong bytes ({ok} reads)");
    assert_all_readable(master.rpc, count, len);
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(text.contains("dropping 0 "), "{text}");
}

/// With no room elsewhere, a node on SIGTERM moves what fits within its grace period, drops the
/// rest with the count in its log, and still exits 0.
#[test]
fn sigterm_without_room_elsewhere_drops_the_rest_and_says_how_many() {
    let master = MasterProcess::start(&[]);
    let log = log_path("noroom");
    let mut a = node_logging(&master, "32MiB", &["--drain-on-shutdown-secs=2"], &log);
    let _b = StoreNode::start(&master.rpc.to_string(), "4MiB", &[]);
    let (count, len) = (12, 1 << 20);
    runtime().block_on(async {
        let c = client(master.rpc).await;
        fill(&c, &a, count, len).await;
        c.close().await.unwrap();
    });
    a.signal(libc::SIGTERM);
    let status = a.wait(Duration::from_secs(60)).expect("node did not exit");
    assert!(status.success(), "{status}");
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let dropped: u64 = text
        .split("dropping ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {text}"));
    assert!(dropped > 0 && dropped < count as u64, "{text}");
    // What moved reads back exact.
    runtime().block_on(async {
        let c = client(master.rpc).await;
        let mut read = 0;
        for i in 0..count {
            if let Ok(bytes) = c.get(&format!("obj/{i}")).await {
                assert!(bytes == value_of(i, len));
                read += 1;
            }
        }
        // The full target evicts to make room as any full store does, so some moved objects
        // may be gone too; none of the dropped ones is read.
        assert!(
            read >= 1 && read <= count as u64 - dropped,
            "{read} read, {dropped} dropped"
        );
        c.close().await.unwrap();
    });
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A drain job empties a node holding 1,000 objects while a reader reads them all
/// continuously: no read returns wrong bytes, the job SUCCEEDS with every unit counted, the
/// segment ends DRAINED and empty, and after the node is SIGKILLed every object is still read.
#[test]
fn drain_job_empties_a_node_under_a_reader() {
    let master = MasterProcess::start(&[]);
    let a = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let _b = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let (count, len) = (1000, 16 << 10);
    runtime().block_on(async {
        let c = client(master.rpc).await;
        fill(&c, &a, count, len).await;
        c.close().await.unwrap();
    });
    let reader = Reader::start(master.rpc, count, len);
    let body = format!(r#"{{"segments": ["{}"]}}"#, a.name);
    let (status, text) = http(
        "POST",
        master.metrics,
        "/api/v1/drain_jobs",
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    let id = json(&text)["job_id"].as_str().unwrap().to_string();
    let query = format!("/api/v1/drain_jobs/query?job_id={id}");
    let seg = format!("/api/v1/segments/status?segment={}", a.name);
    let (_, text) = http("GET", master.metrics, &seg, b"");
    assert_eq!(json(&text)["status_name"], "DRAINING", "{text}");
    let stat = verb_ok(&["stat", "--master", &master.rpc.to_string()]);
    assert!(stat.contains(&id), "{stat}");
    let deadline = Instant::now() + Duration::from_secs(180);
    let job = loop {
        let (_, text) = http("GET", master.metrics, &query, b"");
        let job = json(&text);
        if job["status_name"] != "RUNNING"
            && job["status_name"] != "CREATED"
            && job["status_name"] != "PLANNING"
        {
            break job;
        }
        assert!(Instant::now() < deadline, "job still running: {job}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(job["status_name"], "SUCCEEDED", "{job}");
    assert_eq!(job["succeeded_units"], count as u64, "{job}");
    assert_eq!(job["migrated_bytes"], (count * len) as u64, "{job}");
    let (ok, wrong) = reader.finish();
    assert_eq!(wrong, 0, "reads returned wrong bytes ({ok} reads)");
    assert!(ok >= count as u64, "the reader read {ok} times");
    let (_, text) = http("GET", master.metrics, &seg, b"");
    assert_eq!(json(&text)["status_name"], "DRAINED", "{text}");
    runtime().block_on(async {
        let c = client(master.rpc).await;
        let segments = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
        let drained = segments.iter().find(|s| s.name == a.name).unwrap();
        assert_eq!(drained.used_bytes, Some(0), "{drained:?}");
        c.close().await.unwrap();
    });
    a.kill();
    assert_all_readable(master.rpc, count, len);
}

/// Upstream's edge answers of the drain endpoints, and `mooncake drain --wait` on a small node.
#[test]
fn drain_job_errors_and_the_drain_verb() {
    let master = MasterProcess::start(&[]);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "16MiB", &[]);
    let b = StoreNode::start(&ma, "16MiB", &[]);
    let post = |body: &str| {
        http(
            "POST",
            master.metrics,
            "/api/v1/drain_jobs",
            body.as_bytes(),
        )
    };
    assert_eq!(post(r#"{"segments": ["nope:1"]}"#).0, 404);
    assert_eq!(post(r#"{"segments": []}"#).0, 400);
    assert_eq!(post("not json").0, 400);
    let twice = format!(r#"{{"segments": ["{0}", "{0}"]}}"#, a.name);
    assert_eq!(post(&twice).0, 400);
    let into_itself = format!(
        r#"{{"segments": ["{0}"], "target_segments": ["{0}"]}}"#,
        a.name
    );
    assert_eq!(post(&into_itself).0, 400);
    let q = |path: &str| http("GET", master.metrics, path, b"").0;
    assert_eq!(q("/api/v1/drain_jobs/query?job_id=x"), 400);
    assert_eq!(q("/api/v1/drain_jobs/query?job_id=1-2"), 404);
    // Cancel puts the segment back to OK. B holds objects and is stopped, so its moves stay
    // queued and the job is still running when the cancel comes (an empty source would be
    // drained at creation).
    runtime().block_on(async {
        let c = client(master.rpc).await;
        let on_b = ReplicateConfig {
            preferred_segments: vec![b.name.clone()],
            ..ReplicateConfig::default()
        };
        for i in 0..3 {
            c.put(&format!("on-b/{i}"), &value_of(i, 1000), &on_b)
                .await
                .unwrap();
        }
        c.close().await.unwrap();
    });
    b.signal(libc::SIGSTOP);
    let (_, text) = post(&format!(r#"{{"segments": ["{}"]}}"#, b.name));
    let id = json(&text)["job_id"].as_str().unwrap().to_string();
    let cancel = format!("/api/v1/drain_jobs/cancel?job_id={id}");
    let (status, text) = http("POST", master.metrics, &cancel, b"");
    b.signal(libc::SIGCONT);
    assert_eq!(status, 200, "{text}");
    assert_eq!(json(&text)["status"], "CANCELED");
    let (_, text) = http(
        "GET",
        master.metrics,
        &format!("/api/v1/segments/status?segment={}", b.name),
        b"",
    );
    assert_eq!(json(&text)["status_name"], "OK", "{text}");
    // The verb waits for the job and prints how it ended.
    let (count, len) = (20, 100_000);
    runtime().block_on(async {
        let c = client(master.rpc).await;
        fill(&c, &a, count, len).await;
        c.close().await.unwrap();
    });
    let out = verb_ok(&["drain", "--master", &ma, &a.name, "--to", &b.name, "--wait"]);
    assert!(out.contains("SUCCEEDED"), "{out}");
    assert_all_readable(master.rpc, count, len);
}
