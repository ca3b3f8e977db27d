//! Puts while a node dies: a real `mooncake master`, two `mooncake store` nodes and this test
//! process as the client. The client puts (single puts and batches; two writers at once after
//! the kill) before and after one node is SIGKILLed; the master keeps the dead node mounted
//! until its client TTL ends. Shown:
//! every put acknowledged after the kill reads back byte-exact once the master has dropped the
//! dead node (over shared memory a write into the dead node's still-mapped memory used to be
//! acknowledged and then lost), and nearly every put after the kill succeeds (over TCP about
//! half used to fail). Every wait is a bounded poll.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pattern, MasterProcess, StoreNode};
use mooncake_client::{PutOutcome, RangeWrite, StoreClient, StoreConfig};
use mooncake_common::{ReplicaKind, ReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::TransportMode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 64 << 10;
/// Single puts after the kill, then batches of `BATCH` items.
const SINGLE_PUTS_AFTER: usize = 120;
const BATCHES_AFTER: usize = 8;
const BATCH: usize = 8;

fn value(i: usize) -> Vec<u8> {
    pattern(VALUE_BYTES, i as u64 + 1)
}

fn endpoint_of(replica: &mooncake_common::ReplicaDescriptor) -> String {
    match &replica.kind {
        ReplicaKind::Memory(memory) => memory.transport_endpoint.to_string(),
        other => panic!("not a memory replica: {other:?}"),
    }
}

/// What the client saw after the kill.
struct AfterKill {
    acknowledged: Vec<(String, usize)>,
    attempted: usize,
    failures: Vec<String>,
}

/// Puts `after/…` keys (single puts, then batches), each bounded in time; `stream` keeps the
/// keys and values of concurrent callers apart.
async fn put_after_kill(c: &StoreClient, one: &ReplicateConfig, stream: usize) -> AfterKill {
    let mut seen = AfterKill {
        acknowledged: Vec::new(),
        attempted: 0,
        failures: Vec::new(),
    };
    let limit = Duration::from_secs(60);
    for i in 0..SINGLE_PUTS_AFTER {
        let seed = 10_000 * (stream + 1) + i;
        let key = format!("after/{seed}");
        let put = tokio::time::timeout(limit, c.put(&key, &value(seed), one))
            .await
            .expect("put hung after a node died");
        seen.attempted += 1;
        match put {
            Ok(PutOutcome::Stored) => seen.acknowledged.push((key, seed)),
            other => seen.failures.push(format!("{key}: {other:?}")),
        }
    }
    for b in 0..BATCHES_AFTER {
        let first = 10_000 * (stream + 1) + 5000 + b * BATCH;
        let seeds: Vec<usize> = (first..first + BATCH).collect();
        let keys: Vec<String> = seeds.iter().map(|s| format!("batch/{s}")).collect();
        let values: Vec<Vec<u8>> = seeds.iter().map(|&s| value(s)).collect();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        let results = tokio::time::timeout(limit, c.put_batch(&items, one))
            .await
            .expect("batch put hung after a node died");
        for ((key, seed), result) in keys.iter().zip(&seeds).zip(results) {
            seen.attempted += 1;
            match result {
                Ok(PutOutcome::Stored) => seen.acknowledged.push((key.clone(), *seed)),
                other => seen.failures.push(format!("{key}: {other:?}")),
            }
        }
    }
    seen
}

/// Put sessions opened before the kill.
const SESSIONS: usize = 16;

/// Writes every session's value after the kill (two ranges each) and ends the sessions whose
/// ranges all succeeded (revokes the others); returns the `(key, seed)` of the ended ones. A
/// session placed on the dead node cannot move: its ranges must fail, never end successfully.
async fn finish_sessions(c: &StoreClient, seeds: &[usize]) -> Vec<(String, usize)> {
    let keys: Vec<String> = seeds.iter().map(|s| format!("session/{s}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values: Vec<Vec<u8>> = seeds.iter().map(|&s| value(s)).collect();
    let half = VALUE_BYTES / 2;
    let fragments: Vec<RangeWrite<'_>> = (0..keys.len())
        .flat_map(|k| {
            [(0, &values[k][..half]), (half, &values[k][half..])].map(|(at, src)| RangeWrite {
                key: k,
                offset: at as u64,
                src,
            })
        })
        .collect();
    let written = c.put_ranges_in_session(&refs, &fragments).await;
    let mut ended = Vec::new();
    for (k, key) in refs.iter().enumerate() {
        let ok = written[2 * k].is_ok() && written[2 * k + 1].is_ok();
        if !ok {
            c.batch_put_session_revoke(&[key]).await;
        } else if c.batch_put_session_end(&[key]).await[0].is_ok() {
            ended.push((key.to_string(), seeds[k]));
        }
    }
    ended
}

/// Master + 2 nodes; warm up (so the client has mapped or connected to both nodes), SIGKILL
/// one, put, wait until the master dropped the dead node, read back every acknowledged put.
fn puts_survive_a_node_kill(transport: TransportMode) {
    let master = MasterProcess::start(&[]);
    let mut doomed = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let survivor = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = StoreClient::connect(StoreConfig {
            master_addr: master.rpc.to_string(),
            local_hostname: "127.0.0.1".into(),
            global_segment_size: 0,
            transport,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let one = ReplicateConfig::default();
        let mut on = std::collections::HashSet::new();
        for i in 0..64 {
            let key = format!("before/{i}");
            c.put(&key, &value(i), &one).await.unwrap();
            on.insert(endpoint_of(&c.get_replica_desc(&key).await.unwrap()[0]));
        }
        assert_eq!(on.len(), 2, "warm-up puts did not reach both nodes: {on:?}");
        let seeds: Vec<usize> = (900..900 + SESSIONS).collect();
        let sized: Vec<String> = seeds.iter().map(|s| format!("session/{s}")).collect();
        let sized: Vec<(&str, u64)> = sized
            .iter()
            .map(|k| (k.as_str(), VALUE_BYTES as u64))
            .collect();
        for started in c.batch_put_session_start(&sized, &one).await {
            started.unwrap();
        }

        doomed.signal(libc::SIGKILL);
        assert!(doomed.wait(Duration::from_secs(10)).is_some(), "no exit");
        let killed = Instant::now();
        // Two writers at once, so that both hit the dead node around the same time.
        let (a, b) = tokio::join!(put_after_kill(&c, &one, 0), put_after_kill(&c, &one, 1));
        let after = AfterKill {
            acknowledged: [a.acknowledged, b.acknowledged].concat(),
            attempted: a.attempted + b.attempted,
            failures: [a.failures, b.failures].concat(),
        };
        let put_for = killed.elapsed();
        let sessions_ended = finish_sessions(&c, &seeds).await;

        // The master drops the dead node after its client TTL (bounded poll).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let segments = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
            if segments.len() == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "dead node still mounted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The sweep forgot the dead node's suspicion with its segment.
        let (status, metrics) = common::http("GET", master.metrics, "/metrics", b"");
        assert_eq!(status, 200);
        assert!(
            metrics.lines().any(|l| l == "master_suspected_segments 0"),
            "suspicion outlived the unmount"
        );
        let mut lost = Vec::new();
        for (key, seed) in after.acknowledged.iter().chain(&sessions_ended) {
            match c.get(key).await {
                Ok(bytes) if bytes == value(*seed) => {
                    let replicas = c.get_replica_desc(key).await.unwrap();
                    assert_eq!(endpoint_of(&replicas[0]), survivor.endpoint, "{key}");
                }
                Ok(_) => lost.push(format!("{key}: wrong bytes")),
                Err(error) => lost.push(format!("{key}: {error}")),
            }
        }
        let retries = c.stats().write_retries.load(Ordering::Relaxed);
        println!(
            "{transport:?}: {}/{} puts after the kill acknowledged (issued over {put_for:?} \
             after the node's exit), {}/{SESSIONS} sessions ended, {} acknowledged writes \
             lost, {retries} writes retried",
            after.acknowledged.len(),
            after.attempted,
            sessions_ended.len(),
            lost.len(),
        );
        // The first puts that met the dead node were retried (the node is expired only after
        // client_ttl, long after these puts).
        assert!(retries >= 1, "no put met the dead node");
        assert!(
            lost.is_empty(),
            "{} acknowledged writes lost after the kill: {:?}",
            lost.len(),
            &lost[..lost.len().min(8)]
        );
        // At least 99% of the puts issued after the kill succeed (the survivor has room).
        assert!(
            after.acknowledged.len() * 100 >= after.attempted * 99,
            "{} of {} puts after the kill failed: {:?}",
            after.failures.len(),
            after.attempted,
            &after.failures[..after.failures.len().min(8)]
        );
        c.close().await.unwrap();
    });
}

#[test]
fn shm_puts_after_a_node_kill_are_never_acknowledged_into_dead_memory() {
    puts_survive_a_node_kill(TransportMode::Auto);
}

#[test]
fn tcp_puts_after_a_node_kill_go_to_the_survivor() {
    puts_survive_a_node_kill(TransportMode::Tcp);
}
