//! Hot-key replicas with real processes: a master with `--dynamic_replication_mode=enforce`
//! gives a key read at a high rate a second memory replica on another `mooncake store` node
//! (through a copy task that node A runs), reads then alternate between both replicas (the
//! master's per-endpoint counters), and the key is still read, byte-exact, with A SIGKILLed. In
//! observe mode the same reads are counted and nothing is copied. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::cluster::{client, holders, on, runtime};
use common::{http, pattern, MasterProcess, StoreNode};
use std::time::{Duration, Instant};

/// A window of 60 s at 0.5 reads/s: the 30th read within the window makes a key hot.
const HEAT_FLAGS: [&str; 2] = [
    "--dynamic_replication_heat_window_seconds=60",
    "--dynamic_replication_admission_qps_threshold=0.5",
];

fn metrics(master: &MasterProcess) -> String {
    let (status, body) = http("GET", master.metrics, "/metrics", b"");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample line `name` (with its labels) in `/metrics`; 0 when absent.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

fn led(text: &str, endpoint: &str) -> u64 {
    sample(
        text,
        &format!("master_hot_key_reads_led_total{{endpoint=\"{endpoint}\"}}"),
    )
}

#[test]
fn a_key_read_at_a_high_rate_gets_a_second_replica_and_reads_spread() {
    let mut flags = vec!["--dynamic_replication_mode=enforce"];
    flags.extend(HEAT_FLAGS);
    let master = MasterProcess::start(&flags);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "64MiB", &[]);
    let b = StoreNode::start(&ma, "64MiB", &[]);
    let rt = runtime();
    let value = pattern(256 << 10, 5);
    rt.block_on(async {
        let c = client(master.rpc).await;
        c.put("hot", &value, &on(&a)).await.unwrap();
        c.put("cold", &pattern(1000, 6), &on(&a)).await.unwrap();
        assert_eq!(c.get("cold").await.unwrap().len(), 1000);
        let deadline = Instant::now() + Duration::from_secs(60);
        while holders(&c, "hot").await.len() < 2 {
            assert!(
                Instant::now() < deadline,
                "no second replica within 60 s of reading; metrics:\n{}",
                metrics(&master)
            );
            for _ in 0..10 {
                assert!(c.get("hot").await.unwrap() == value, "wrong bytes");
            }
        }
        let mut both = vec![a.endpoint.clone(), b.endpoint.clone()];
        both.sort();
        assert_eq!(holders(&c, "hot").await, both);
        for _ in 0..20 {
            assert!(c.get("hot").await.unwrap() == value, "wrong bytes");
        }
        let text = metrics(&master);
        assert!(
            led(&text, &a.endpoint) > 0 && led(&text, &b.endpoint) > 0,
            "reads not spread over {both:?}:\n{text}"
        );
        // One task (a second only if the first waited past the 30 s cooldown).
        assert!(
            sample(&text, "master_hot_key_copy_tasks_total") >= 1,
            "{text}"
        );
        assert_eq!(holders(&c, "cold").await, vec![a.endpoint.clone()]);
        c.close().await.unwrap();
    });
    a.kill();
    rt.block_on(async {
        let c = client(master.rpc).await;
        assert!(c.get("hot").await.unwrap() == value, "read from B differs");
        c.close().await.unwrap();
    });
    drop(b);
}

#[test]
fn observe_mode_counts_hot_keys_and_copies_nothing() {
    let mut flags = vec!["--dynamic_replication_mode=observe"];
    flags.extend(HEAT_FLAGS);
    let master = MasterProcess::start(&flags);
    let ma = master.rpc.to_string();
    let a = StoreNode::start(&ma, "64MiB", &[]);
    let b = StoreNode::start(&ma, "64MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let value = pattern(4096, 8);
        c.put("hot", &value, &on(&a)).await.unwrap();
        for _ in 0..40 {
            assert!(c.get("hot").await.unwrap() == value);
        }
        let text = metrics(&master);
        assert_eq!(sample(&text, "master_hot_key_mode"), 1, "{text}");
        assert!(
            sample(&text, "master_hot_key_reads_counted_total") >= 40,
            "{text}"
        );
        assert!(sample(&text, "master_hot_keys_total") >= 1, "{text}");
        assert_eq!(
            sample(&text, "master_hot_key_copy_tasks_total"),
            0,
            "{text}"
        );
        assert_eq!(holders(&c, "hot").await, vec![a.endpoint.clone()]);
        c.close().await.unwrap();
    });
    drop((a, b));
}
