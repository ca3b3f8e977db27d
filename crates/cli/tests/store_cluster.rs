//! A real cluster on loopback, every role its own process: `mooncake master`, two
//! `mooncake store` nodes, and two clients (this test process with `StoreClient`, and the
//! `mooncake put/get/ls/rm/stat` verbs as separate processes). Every loop is bounded in time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pattern, verb, verb_ok, MasterProcess, StoreNode};
use mooncake_client::{PutOutcome, StoreClient, StoreConfig, StoreError};
use mooncake_common::{ClientId, ErrorCode, ReplicaKind, ReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::TransportMode;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn client(master: SocketAddr) -> StoreClient {
    client_over(master, TransportMode::Auto).await
}

async fn client_over(master: SocketAddr, transport: TransportMode) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: master.to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        transport,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

fn memory_endpoint(replica: &mooncake_common::ReplicaDescriptor) -> String {
    match &replica.kind {
        ReplicaKind::Memory(memory) => memory.transport_endpoint.to_string(),
        other => panic!("not a memory replica: {other:?}"),
    }
}

#[test]
fn cluster_of_processes_moves_every_size_byte_exact() {
    let master = MasterProcess::start(&[]);
    let node_a = StoreNode::start(&master.rpc.to_string(), "200MiB", &[]);
    let node_b = StoreNode::start(&master.rpc.to_string(), "200MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let two = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        let sizes = [1usize, 4095, 65_537, (1 << 20) + 3, 16 << 20, 64 << 20];
        let nodes = [node_a.endpoint.clone(), node_b.endpoint.clone()];
        for (i, &len) in sizes.iter().enumerate() {
            let key = format!("obj/{len}");
            let value = pattern(len, i as u64);
            assert_eq!(c.put(&key, &value, &two).await.unwrap(), PutOutcome::Stored);
            // Two replicas, on the two distinct nodes (this client owns no memory).
            let replicas = c.get_replica_desc(&key).await.unwrap();
            let mut on: Vec<String> = replicas.iter().map(memory_endpoint).collect();
            on.sort();
            let mut expected = nodes.to_vec();
            expected.sort();
            assert_eq!(on, expected, "{key}: replicas not on the two nodes");
            assert!(c.get(&key).await.unwrap() == value, "{key}: get differs");
            // Zero copy into a registered buffer with slack after the object.
            let mut buf = vec![0xEEu8; len + 17];
            // SAFETY: `buf` outlives the registration (unregistered below).
            unsafe { c.register_buffer(buf.as_mut_ptr(), buf.len()) }.unwrap();
            assert_eq!(c.get_into(&key, &mut buf).await.unwrap(), len as u64);
            c.unregister_buffer(buf.as_mut_ptr()).unwrap();
            assert!(buf[..len] == value[..], "{key}: get_into differs");
            assert!(
                buf[len..].iter().all(|&b| b == 0xEE),
                "{key}: wrote past the object"
            );
            if len >= 16 << 20 {
                // Free the space for the next size.
                c.remove(&key, true).await.unwrap();
            }
        }
        // Batches: 32 × 64 KiB and mixed small sizes, plain and into caller buffers.
        let keys: Vec<String> = (0..40).map(|i| format!("batch/{i}")).collect();
        let values: Vec<Vec<u8>> = (0..40)
            .map(|i| pattern(if i % 8 == 0 { 1 + i } else { 65_536 }, 100 + i as u64))
            .collect();
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        for result in c.put_batch(&items, &two).await {
            assert_eq!(result.unwrap(), PutOutcome::Stored);
        }
        let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        for (got, want) in c.get_batch(&refs).await.into_iter().zip(&values) {
            assert!(got.unwrap() == *want);
        }
        let mut bufs: Vec<Vec<u8>> = values.iter().map(|v| vec![0u8; v.len()]).collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        for (n, want) in c
            .get_batch_into(&refs, &mut outs)
            .await
            .into_iter()
            .zip(&values)
        {
            assert_eq!(n.unwrap(), want.len() as u64);
        }
        assert!(bufs == values, "get_batch_into differs");

        // The second client is another process: the CLI verbs.
        let m = master.rpc.to_string();
        let dir = std::env::temp_dir().join(format!("mooncake-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out_path = dir.join("out.bin");
        let got = verb(
            &[
                "get",
                "--master",
                &m,
                "obj/1048579",
                "-o",
                out_path.to_str().unwrap(),
            ],
            None,
        );
        assert!(
            got.status.success(),
            "{}",
            String::from_utf8_lossy(&got.stderr)
        );
        assert!(std::fs::read(&out_path).unwrap() == pattern((1 << 20) + 3, 3));
        let from_stdin = pattern(300_001, 77);
        let put = verb(&["put", "--master", &m, "from-cli", "-"], Some(&from_stdin));
        assert!(
            put.status.success(),
            "{}",
            String::from_utf8_lossy(&put.stderr)
        );
        assert!(c.get("from-cli").await.unwrap() == from_stdin);
        let said = String::from_utf8_lossy(&put.stderr).to_string();
        assert!(said.contains("300001 bytes, 1 replica"), "{said}");
        // Five asked, two nodes: the verb says how many the master placed.
        let five = verb(
            &["put", "--master", &m, "five", "-", "--replicas", "5"],
            Some(b"v"),
        );
        let said = String::from_utf8_lossy(&five.stderr).to_string();
        assert!(five.status.success(), "{said}");
        assert!(said.contains("kept 2 of 5 replicas"), "{said}");
        assert_eq!(c.get_replica_desc("five").await.unwrap().len(), 2);
        let to_stdout = verb(&["get", "--master", &m, "obj/65537"], None);
        assert!(to_stdout.status.success());
        assert!(to_stdout.stdout == pattern(65_537, 2));
        let ls = verb(&["ls", "--master", &m, "^obj/"], None);
        let listed = String::from_utf8_lossy(&ls.stdout).to_string();
        let mut listed: Vec<&str> = listed.lines().collect();
        listed.sort();
        assert_eq!(listed, ["obj/1", "obj/1048579", "obj/4095", "obj/65537"]);
        let stat = verb(&["stat", "--master", &m], None);
        let stat_text = String::from_utf8_lossy(&stat.stdout).to_string();
        assert!(stat.status.success());
        assert!(stat_text.contains("segments 2"), "{stat_text}");
        assert!(stat_text.contains("keys 46"), "{stat_text}");
        let rm = verb(&["rm", "--master", &m, "from-cli", "--force"], None);
        assert!(
            rm.status.success(),
            "{}",
            String::from_utf8_lossy(&rm.stderr)
        );
        let missing = verb(&["get", "--master", &m, "from-cli"], None);
        assert!(!missing.status.success());
        assert!(String::from_utf8_lossy(&missing.stderr).contains("OBJECT_NOT_FOUND"));
        let _ = std::fs::remove_dir_all(&dir);
        c.close().await.unwrap();
    });
}

#[test]
fn bad_input_gets_a_clear_code_and_changes_nothing() {
    let master = MasterProcess::start(&[]);
    let _node = StoreNode::start(&master.rpc.to_string(), "32MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let one = ReplicateConfig::default();
        c.put("present", b"12345678", &one).await.unwrap();
        let used = || async {
            let segments = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
            let keys = c
                .master()
                .call(&m::GetAllKeys {
                    tenant: String::new(),
                })
                .await
                .unwrap();
            (
                segments.iter().filter_map(|s| s.used_bytes).sum::<u64>(),
                keys.len(),
            )
        };
        let before = used().await;

        // Upstream's master refuses empty keys and zero-length values with INVALID_PARAMS.
        let empty_key = c.put("", b"x", &one).await.unwrap_err();
        assert_eq!(empty_key.code(), ErrorCode::INVALID_PARAMS, "{empty_key}");
        let empty_value = c.put("zero", b"", &one).await.unwrap_err();
        assert_eq!(
            empty_value.code(),
            ErrorCode::INVALID_PARAMS,
            "{empty_value}"
        );
        let long_key = "k".repeat(4097);
        let too_long = c.put(&long_key, b"x", &one).await.unwrap_err();
        assert_eq!(too_long.code(), ErrorCode::INVALID_KEY, "{too_long}");
        assert_eq!(
            c.get(&long_key).await.unwrap_err().code(),
            ErrorCode::INVALID_KEY
        );
        // A key of exactly the limit works.
        let max_key = "k".repeat(4096);
        assert_eq!(
            c.put(&max_key, b"ok", &one).await.unwrap(),
            PutOutcome::Stored
        );
        assert_eq!(c.get(&max_key).await.unwrap(), b"ok");
        c.remove(&max_key, true).await.unwrap();

        let mut small = [0xAAu8; 7];
        let err = c.get_into("present", &mut small).await.unwrap_err();
        assert!(matches!(
            err,
            StoreError::BufferTooSmall {
                buffer_bytes: 7,
                object_bytes: 8
            }
        ));
        assert_eq!(err.code(), ErrorCode::BUFFER_OVERFLOW);
        assert_eq!(small, [0xAA; 7], "a refused get_into must not write");
        let mut one_small = vec![0u8; 4];
        let mut outs: Vec<&mut [u8]> = vec![one_small.as_mut_slice()];
        let batch = c.get_batch_into(&["present"], &mut outs).await;
        assert_eq!(
            batch[0].as_ref().unwrap_err().code(),
            ErrorCode::BUFFER_OVERFLOW
        );

        // "put_from an unregistered buffer": the Rust API takes slices, so there is no raw
        // pointer to be unregistered; an unregistered slice is pinned for the call and works.
        // What *can* be wrong is unregistering memory that was never registered.
        let mut loose = pattern(4096, 9);
        assert_eq!(
            c.put("loose", &loose, &one).await.unwrap(),
            PutOutcome::Stored
        );
        let err = c.unregister_buffer(loose.as_mut_ptr()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::INVALID_PARAMS);
        c.remove("loose", true).await.unwrap();

        assert_eq!(used().await, before, "a refused call changed the store");
        assert_eq!(c.get("present").await.unwrap(), b"12345678");
        c.close().await.unwrap();
    });
}

#[test]
fn a_killed_node_leaves_replicated_objects_readable_and_nothing_hangs() {
    let master = MasterProcess::start(&[]);
    let mut doomed = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let survivor = StoreNode::start(&master.rpc.to_string(), "64MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let two = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        let one = ReplicateConfig::default();
        let mut replicated = Vec::new();
        for i in 0..8 {
            let key = format!("two/{i}");
            let value = pattern(200_000 + i, i as u64);
            c.put(&key, &value, &two).await.unwrap();
            replicated.push((key, value));
        }
        let mut single_on_doomed = Vec::new();
        for i in 0..16 {
            let key = format!("one/{i}");
            c.put(&key, &pattern(50_000, 1000 + i as u64), &one)
                .await
                .unwrap();
            let on = memory_endpoint(&c.get_replica_desc(&key).await.unwrap()[0]);
            if on == doomed.endpoint {
                single_on_doomed.push(key);
            }
        }
        // A client that reaches the nodes over TCP only, connected before the kill.
        let tcp = client_over(master.rpc, TransportMode::Tcp).await;
        doomed.signal(libc::SIGKILL);
        assert!(doomed.wait(Duration::from_secs(10)).is_some());
        let started = Instant::now();
        for reader in [&c, &tcp] {
            for (key, value) in &replicated {
                let got = tokio::time::timeout(Duration::from_secs(10), reader.get(key))
                    .await
                    .expect("get hung after a node died")
                    .unwrap();
                assert!(got == *value, "{key}");
            }
        }
        assert!(
            tcp.stats()
                .replica_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
        for key in &single_on_doomed {
            let value = pattern(50_000, 1000 + key[4..].parse::<u64>().unwrap());
            // Over TCP the dead node cannot answer: a transfer error, quickly.
            let result = tokio::time::timeout(Duration::from_secs(10), tcp.get(key))
                .await
                .expect("get of an object on the dead node hung");
            assert!(result.is_err(), "{key} read over TCP from a dead node");
            // Over shared memory the reader may still hold the dead node's segment mapped (the
            // memory outlives the process): it then reads the right bytes, checksum-verified.
            let result = tokio::time::timeout(Duration::from_secs(10), c.get(key))
                .await
                .expect("get of an object on the dead node hung");
            if let Ok(bytes) = result {
                assert!(
                    bytes == value,
                    "{key}: wrong bytes from a dead node's memory"
                );
            }
        }
        assert!(started.elapsed() < Duration::from_secs(20));
        // Until the master expires the dead node (client_ttl) it keeps its segments, but a put
        // whose transfer there fails reports it, is revoked and is written once more: every
        // put succeeds, without hanging, and lives on the survivor.
        for i in 0..4 {
            let key = format!("after/{i}");
            let value = pattern(100_000, 5 + i);
            let put = tokio::time::timeout(Duration::from_secs(10), tcp.put(&key, &value, &one))
                .await
                .expect("put hung after a node died");
            assert_eq!(put.unwrap(), PutOutcome::Stored, "{key}");
            let on = memory_endpoint(&tcp.get_replica_desc(&key).await.unwrap()[0]);
            assert_eq!(on, survivor.endpoint);
            assert!(tcp.get(&key).await.unwrap() == value);
        }
        tcp.close().await.unwrap();
        c.close().await.unwrap();
    });
}

#[test]
fn objects_only_on_a_killed_node_are_gone_after_client_ttl() {
    let master = MasterProcess::start(&["--client_ttl=2"]);
    let doomed = StoreNode::start(&master.rpc.to_string(), "32MiB", &[]);
    let _survivor = StoreNode::start(&master.rpc.to_string(), "32MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let mut on_doomed = Vec::new();
        for i in 0..12 {
            let key = format!("one/{i}");
            c.put(&key, &pattern(10_000, i), &ReplicateConfig::default())
                .await
                .unwrap();
            if memory_endpoint(&c.get_replica_desc(&key).await.unwrap()[0]) == doomed.endpoint {
                on_doomed.push(key);
            }
        }
        assert!(!on_doomed.is_empty());
        doomed.signal(libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(15);
        for key in &on_doomed {
            loop {
                match c.get(key).await {
                    Err(e) if e.master_code() == Some(ErrorCode::OBJECT_NOT_FOUND) => break,
                    _ if Instant::now() > deadline => panic!("{key} still listed after client_ttl"),
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        let segments = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
        assert_eq!(segments.len(), 1);
        // New objects now land on the survivor only.
        for i in 0..4 {
            let key = format!("after/{i}");
            c.put(&key, &pattern(1000, i), &ReplicateConfig::default())
                .await
                .unwrap();
            let on = memory_endpoint(&c.get_replica_desc(&key).await.unwrap()[0]);
            assert_ne!(on, doomed.endpoint);
        }
        c.close().await.unwrap();
    });
}

#[test]
fn a_writer_that_dies_mid_put_frees_its_key_and_space_after_its_client_ttl() {
    // The discard timeout (300 s) is far beyond the poll bound: only the writer's client TTL
    // (2 s) can free the key here.
    let master = MasterProcess::start(&["--client_ttl=2", "--put_start_discard_timeout_sec=300"]);
    let _node = StoreNode::start(&master.rpc.to_string(), "32MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let one = ReplicateConfig::default();
        let used = || async {
            let detail = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
            detail.iter().filter_map(|s| s.used_bytes).sum::<u64>()
        };
        // The writer pings once (the master tracks it), starts an 8 MiB put and goes silent,
        // as a process killed mid-put does.
        let writer = ClientId::random();
        c.master().ping(writer).await.unwrap();
        c.master()
            .put_start(writer, "trap", 8 << 20, &one, "")
            .await
            .unwrap();
        assert_eq!(used().await, 8 << 20);
        // Another client's put: refused as "in flight" (never a success that stored nothing)
        // until the writer's TTL runs out and the master reaps its put; then it stores.
        let value = pattern(4096, 5);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match c.put("trap", &value, &one).await {
                Ok(PutOutcome::Stored) => break,
                Err(e) if e.master_code() == Some(ErrorCode::REPLICA_IS_NOT_READY) => {}
                other => panic!("a put of a key in flight must not succeed: {other:?}"),
            }
            assert!(
                Instant::now() < deadline,
                "the dead writer's key stayed taken"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(c.get("trap").await.unwrap() == value);
        // The dead writer's 8 MiB is free, not discarded for the release timeout.
        let deadline = Instant::now() + Duration::from_secs(30);
        while used().await != 4096 {
            assert!(Instant::now() < deadline, "still used: {}", used().await);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let late = c
            .master()
            .put_end(writer, mooncake_common::ObjectMeta::new("trap"), "")
            .await
            .unwrap_err();
        assert_eq!(late.code(), ErrorCode::ILLEGAL_CLIENT, "{late}");
        c.close().await.unwrap();
    });
}

#[test]
fn sigterm_unmounts_the_node() {
    let master = MasterProcess::start(&[]);
    let mut node = StoreNode::start(&master.rpc.to_string(), "16MiB", &[]);
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let detail = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
        assert_eq!(detail.len(), 1);
        assert_eq!(detail[0].capacity_bytes, 16 << 20);
        node.signal(libc::SIGTERM);
        let status = node
            .wait(Duration::from_secs(10))
            .expect("store node did not exit");
        assert!(status.success(), "{status}");
        let detail = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
        assert!(detail.is_empty(), "segment still mounted: {detail:?}");
        let err = c
            .put("k", b"v", &ReplicateConfig::default())
            .await
            .unwrap_err();
        assert_eq!(
            err.master_code(),
            Some(ErrorCode::NO_AVAILABLE_HANDLE),
            "{err}"
        );
        c.close().await.unwrap();
    });
}

#[test]
fn master_restart_makes_nodes_remount_and_clients_reconnect() {
    let master = MasterProcess::start(&["--client_ttl=2"]);
    let rpc = master.rpc;
    let log_path = std::env::temp_dir().join(format!("mc-rejoin-{}.log", std::process::id()));
    let log_file = std::fs::File::create(&log_path).unwrap();
    let _node = StoreNode::start_logging(&rpc.to_string(), "32MiB", &[], "info", log_file.into());
    let rt = runtime();
    rt.block_on(async {
        let c = client(rpc).await;
        c.put("before", b"old", &ReplicateConfig::default())
            .await
            .unwrap();
        drop(master);
        let port = format!("--rpc_port={}", rpc.port());
        let restarted = MasterProcess::start(&[&port, "--client_ttl=2"]);
        assert_eq!(restarted.rpc, rpc);
        // The node's heartbeat gets NEED_REMOUNT and mounts its segment again.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let detail = c.master().call(&m::GetSegmentsDetail {}).await;
            if detail.is_ok_and(|d| d.len() == 1) {
                break;
            }
            assert!(Instant::now() < deadline, "node did not re-mount");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The node says so in its log, naming the master.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let said = log
                .lines()
                .any(|l| l.contains("re-joined the master") && l.contains(&rpc.to_string()));
            if said {
                break;
            }
            assert!(Instant::now() < deadline, "no re-join line in {log}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = std::fs::remove_file(&log_path);
        // The master's index is not persistent yet: the old object is gone (reported, expected).
        assert_eq!(
            c.get("before").await.unwrap_err().master_code(),
            Some(ErrorCode::OBJECT_NOT_FOUND)
        );
        c.put("after", b"new", &ReplicateConfig::default())
            .await
            .unwrap();
        assert_eq!(c.get("after").await.unwrap(), b"new");
        c.close().await.unwrap();
    });
}

#[test]
fn a_node_restarted_under_the_same_address_mounts_again() {
    let master = MasterProcess::start(&[]);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let host = format!("127.0.0.1:{port}");
    let mut first = StoreNode::start(&master.rpc.to_string(), "16MiB", &["--host", &host]);
    first.signal(libc::SIGTERM);
    assert!(first
        .wait(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let second = StoreNode::start(&master.rpc.to_string(), "16MiB", &["--host", &host]);
    assert!(
        second.endpoint.starts_with(&format!("tcp://{host}")),
        "{}",
        second.endpoint
    );
    let rt = runtime();
    rt.block_on(async {
        let c = client(master.rpc).await;
        let detail = c.master().call(&m::GetSegmentsDetail {}).await.unwrap();
        assert_eq!(detail.len(), 1);
        let value = pattern(70_000, 1);
        c.put("k", &value, &ReplicateConfig::default())
            .await
            .unwrap();
        assert!(c.get("k").await.unwrap() == value);
        c.close().await.unwrap();
    });
}

#[test]
fn quickstart_runs_a_cluster_and_verifies_every_byte() {
    let text = verb_ok(&["quickstart", "--scale", "0.05", "--segment-size", "64MiB"]);
    assert!(text.contains("0 mismatches"), "{text}");
    for size in ["4 KiB", "64 KiB", "1 MiB", "16 MiB"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(size) && l.contains(" get ")),
            "no {size} row in {text}"
        );
    }
}

#[test]
fn bench_store_runs_every_case_briefly() {
    let text = verb_ok(&[
        "bench",
        "store",
        "--seconds",
        "0.05",
        "--sizes",
        "4KiB,1MiB",
        "--window-bytes",
        "8MiB",
        "--pingpong-iterations",
        "200",
    ]);
    for case in [
        "put ",
        "get ",
        "put_from",
        "get_into",
        "is_exist(hit)",
        "batch_is_exist",
        "put_batch",
        "get_batch",
        "batch_put_from",
        "batch_get_into",
        "xclient_get ",
        "xclient_get_into",
        "xclient_put ",
        "xclient_put_from",
        "ping-pong",
    ] {
        assert!(text.contains(case), "no {case:?} in\n{text}");
    }
    assert!(!text.contains("FAIL"), "{text}");
}

/// The scaling case starts its client processes, runs every mode at every P and prints one
/// row each (with no failed call: the binary exits non-zero otherwise) next to both floors.
#[test]
fn bench_scaling_runs_every_mode_with_several_client_processes() {
    let text = verb_ok(&[
        "bench",
        "scaling",
        "--procs",
        "1,2",
        "--seconds",
        "0.1",
        "--keys",
        "256",
        "--pingpong-iterations",
        "200",
    ]);
    for floor in ["(blocking floor)", "(spinning floor)"] {
        assert!(text.contains(floor), "no {floor} in\n{text}");
    }
    for procs in ["1", "2"] {
        for mode in ["is_exist", "batch_is_exist", "get"] {
            let row = text.lines().find(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words.first() == Some(&mode) && words.get(1) == Some(&procs)
            });
            let row = row.unwrap_or_else(|| panic!("no {mode} row for P={procs} in\n{text}"));
            // calls/s, then the errors column last.
            let words: Vec<&str> = row.split_whitespace().collect();
            assert!(words[2].parse::<f64>().unwrap() > 0.0, "{row}");
            assert_eq!(words.last(), Some(&"0"), "{row}");
        }
    }
}

#[test]
fn bench_store_runs_with_every_tuning_flag_names_them_and_verifies_reads() {
    // Every transfer setting off its default (one copy thread, no inline copies, splits from
    // 256 KiB, no streaming stores, one TCP connection, no busy polling), over TCP so the
    // cross-process cases go through the peer's own engine: the bench must still verify
    // every read, and the header must say which settings ran.
    let text = verb_ok(&[
        "bench",
        "store",
        "--transport",
        "tcp",
        "--seconds",
        "0.05",
        "--sizes",
        "64KiB,1MiB",
        "--window-bytes",
        "8MiB",
        "--skip",
        "exist,pingpong",
        "--copy-threads",
        "1",
        "--inline-copy-bytes",
        "0",
        "--parallel-copy-bytes",
        "256KiB",
        "--streaming-write-bytes",
        "1TiB",
        "--tcp-connections",
        "1",
        "--busy-poll-us",
        "0",
    ]);
    assert!(text.contains("client busy-poll off"), "{text}");
    assert!(
        text.contains(
            "transfer tuning (both processes): --copy-threads 1 --inline-copy-bytes 0 \
             --parallel-copy-bytes 262144 --streaming-write-bytes 1099511627776 --tcp-connections 1"
        ),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" plain ") || l.contains(" zcopy "))
        .collect();
    assert!(rows.len() >= 12, "too few rows in\n{text}");
    for row in &rows {
        // columns: case api value batch ops errs ...
        let errs = row.split_whitespace().nth(5);
        assert_eq!(errs, Some("0"), "errors in {row:?}");
    }
    assert!(text.contains("xclient_get_into"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
}
