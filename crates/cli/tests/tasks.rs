//! Copy and move tasks run by real `mooncake store` nodes: `mooncake copy/move/task` queue and
//! follow them, the node owning the source runs them on its heartbeat. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cluster::{client, holders, on, runtime};
use common::{pattern, verb, verb_ok, MasterProcess, StoreNode};
use mooncake_client::StoreClient;
use mooncake_proto::methods as m;
use std::time::{Duration, Instant};

async fn used_bytes(c: &StoreClient, name: &str) -> u64 {
    let segments = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
    segments
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.used_bytes)
        .unwrap_or_else(|| panic!("no segment {name} in {segments:?}"))
}

/// The task id `mooncake copy|move` printed.
fn task_id(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("task "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no task id in {stdout:?}"))
        .to_string()
}

/// `mooncake copy --to B --wait` adds a replica on B; with A (the only other holder) SIGKILLed
/// the object is still read, byte-exact, from B.
#[test]
fn copied_key_survives_the_source_node() {
    let master = MasterProcess::start(&[]);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "64MiB", &[]);
    let b = StoreNode::start(&ma, "64MiB", &[]);
    let rt = runtime();
    let value = pattern(3 << 20, 7);
    rt.block_on(async {
        let c = client(master.rpc).await;
        c.put("k", &value, &on(&a)).await.unwrap();
        assert_eq!(holders(&c, "k").await, vec![a.endpoint.clone()]);
        let out = verb_ok(&["copy", "--master", &ma, "k", "--to", &b.name, "--wait"]);
        assert!(out.contains("status SUCCESS"), "{out}");
        let mut both = vec![a.endpoint.clone(), b.endpoint.clone()];
        both.sort();
        assert_eq!(holders(&c, "k").await, both);
        c.close().await.unwrap();
    });
    a.kill();
    rt.block_on(async {
        let c = client(master.rpc).await;
        assert!(c.get("k").await.unwrap() == value, "read from B differs");
        c.close().await.unwrap();
    });
}

/// `mooncake move --from A --to B` leaves the only replica on B and frees A's space.
#[test]
fn moved_key_frees_the_source() {
    let master = MasterProcess::start(&[]);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "64MiB", &[]);
    let b = StoreNode::start(&ma, "64MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let value = pattern(1 << 20, 3);
        c.put("m", &value, &on(&a)).await.unwrap();
        assert!(used_bytes(&c, &a.name).await >= 1 << 20);
        let out = verb_ok(&[
            "move", "--master", &ma, "m", "--from", &a.name, "--to", &b.name,
        ]);
        let id = task_id(&out);
        let out = verb_ok(&["task", "--master", &ma, &id, "--wait"]);
        assert!(out.contains("type REPLICA_MOVE") && out.contains("status SUCCESS"));
        assert_eq!(holders(&c, "m").await, vec![b.endpoint.clone()]);
        assert_eq!(used_bytes(&c, &a.name).await, 0, "source space not freed");
        assert!(c.get("m").await.unwrap() == value);
        // A move whose source holds no replica is refused when created.
        let bad = verb(
            &[
                "move", "--master", &ma, "m", "--from", &a.name, "--to", &b.name,
            ],
            None,
        );
        assert!(!bad.status.success());
        assert!(String::from_utf8_lossy(&bad.stderr).contains("INVALID_PARAMS"));
        c.close().await.unwrap();
    });
}

/// A copy whose target node was SIGKILLed fails on every attempt: the master queues it again
/// `--max_retry_attempts` times, then reports it FAILED with the reason; the object stays
/// readable on its source and nothing is left allocated for it.
#[test]
fn task_to_a_dead_target_is_retried_then_failed() {
    let master = MasterProcess::start(&["--max_retry_attempts=2"]);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "64MiB", &[]);
    let b = StoreNode::start(&ma, "64MiB", &[]);
    let b_name = b.name.clone();
    let rt = runtime();
    let value = pattern(100_000, 9);
    rt.block_on(async {
        let c = client(master.rpc).await;
        c.put("d", &value, &on(&a)).await.unwrap();
        b.kill();
        let created = verb(&["copy", "--master", &ma, "d", "--to", &b_name], None);
        let stdout = String::from_utf8_lossy(&created.stdout).to_string();
        assert!(
            created.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&created.stderr)
        );
        let id = task_id(&stdout);
        let deadline = Instant::now() + Duration::from_secs(60);
        let text = loop {
            let out = verb(&["task", "--master", &ma, &id], None);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.contains("status FAILED") || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(text.contains("status FAILED"), "{text}");
        assert!(text.contains("(after 2 retries)"), "{text}");
        let waited = verb(&["task", "--master", &ma, &id, "--wait"], None);
        assert!(!waited.status.success(), "a FAILED task exits 1");
        assert_eq!(holders(&c, "d").await, vec![a.endpoint.clone()]);
        assert!(c.get("d").await.unwrap() == value);
        c.close().await.unwrap();
    });
    drop(a);
}
