//! The store client end to end: an in-process master on 127.0.0.1:0 and store clients with real
//! transfer engines (shared memory between them, or TCP when forced), moving real bytes.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use mooncake_client::{PutOutcome, StoreClient, StoreConfig, StoreError};
use mooncake_common::{ErrorCode, ReplicateConfig, SystemClock};
use mooncake_master::{MasterService, MasterServiceConfig};
use mooncake_proto::limits::Limits;
use mooncake_rpc::{Handler, HandlerError, RpcServer, ServerConfig};
use mooncake_server::metrics::RpcMetrics;
use mooncake_server::rpc_dispatch::MasterRpc;
use mooncake_server::{MasterConfig, RunningMaster};
use mooncake_transfer::TransportMode;

async fn start_master() -> RunningMaster {
    let config = MasterConfig {
        rpc_address: "127.0.0.1".into(),
        port: 0,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        ..MasterConfig::default()
    };
    let resolved = config.validate().unwrap();
    RunningMaster::start(&config, &resolved).await.unwrap()
}

async fn node(master: &RunningMaster, segment_bytes: u64, transport: TransportMode) -> StoreClient {
    let config = StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment_bytes,
        transport,
        ..StoreConfig::default()
    };
    StoreClient::connect(config).await.unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_get_round_trip_across_nodes_and_transports() {
    let master = start_master().await;
    for transport in [TransportMode::Auto, TransportMode::Tcp] {
        let a = node(&master, 64 << 20, transport).await;
        let b = node(&master, 64 << 20, transport).await;
        let reader = node(&master, 0, transport).await;
        let two = ReplicateConfig {
            replica_num: 2,
            ..ReplicateConfig::default()
        };
        for (i, len) in [1usize, 7, 4096, 65_537, 1 << 20, 5 << 20]
            .into_iter()
            .enumerate()
        {
            let key = format!("{transport:?}-obj-{i}");
            let value = pattern(len, i as u8);
            assert_eq!(
                reader.put(&key, &value, &two).await.unwrap(),
                PutOutcome::Stored,
                "{key}"
            );
            for client in [&a, &b, &reader] {
                let got = client.get(&key).await.unwrap();
                assert!(
                    got == value,
                    "{key}: {len} bytes differ via {:?}",
                    client.endpoint()
                );
            }
            assert_eq!(reader.get_size(&key).await.unwrap(), len as u64);
            assert_eq!(reader.get_replica_desc(&key).await.unwrap().len(), 2);
        }
        for client in [a, b, reader] {
            client.close().await.unwrap();
        }
    }
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_put_keeps_the_first_write_and_says_so() {
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Auto).await;
    let cfg = ReplicateConfig::default();
    assert_eq!(
        a.put("k", b"first", &cfg).await.unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(
        a.put("k", b"second!", &cfg).await.unwrap(),
        PutOutcome::AlreadyPresent
    );
    assert_eq!(a.get("k").await.unwrap(), b"first");
    a.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_a_key_another_client_is_still_writing_is_not_ready_not_success() {
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Auto).await;
    let writer = node(&master, 0, TransportMode::Auto).await;
    let cfg = ReplicateConfig::default();
    assert_eq!(
        a.put("done", b"first", &cfg).await.unwrap(),
        PutOutcome::Stored
    );
    // The writer starts a put and never finishes it (a process that died mid-put): another
    // client's put stores nothing, so it must not report success.
    writer
        .master()
        .put_start(writer.client_id(), "k", 5, &cfg, "")
        .await
        .unwrap();
    let err = a.put("k", b"second", &cfg).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::REPLICA_IS_NOT_READY, "{err}");
    let items: [(&str, &[u8]); 3] = [("k", b"x"), ("done", b"y"), ("new", b"z")];
    let results = a.put_batch(&items, &cfg).await;
    assert_eq!(
        results[0].as_ref().unwrap_err().code(),
        ErrorCode::REPLICA_IS_NOT_READY
    );
    // A complete key is still AlreadyPresent (success, the first value stays).
    assert_eq!(results[1].as_ref().unwrap(), &PutOutcome::AlreadyPresent);
    assert_eq!(results[2].as_ref().unwrap(), &PutOutcome::Stored);
    assert_eq!(
        a.put("done", b"again", &cfg).await.unwrap(),
        PutOutcome::AlreadyPresent
    );
    assert!(!a.is_exist("k").await.unwrap());
    assert_eq!(a.get("done").await.unwrap(), b"first");
    for client in [a, writer] {
        client.close().await.unwrap();
    }
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_keys_full_stores_and_small_buffers_get_clear_errors() {
    let master = start_master().await;
    let a = node(&master, 1 << 20, TransportMode::Auto).await;
    let cfg = ReplicateConfig::default();
    let err = a.get("nope").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::OBJECT_NOT_FOUND);
    assert!(!a.is_exist("nope").await.unwrap());
    // Bigger than the whole cluster: NO_AVAILABLE_HANDLE, nothing left behind.
    let err = a.put("huge", &vec![1u8; 2 << 20], &cfg).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NO_AVAILABLE_HANDLE);
    assert!(!a.is_exist("huge").await.unwrap());
    a.put("small", &pattern(1000, 3), &cfg).await.unwrap();
    let mut buf = vec![0u8; 10];
    let err = a.get_into("small", &mut buf).await.unwrap_err();
    assert!(matches!(err, StoreError::BufferTooSmall { .. }), "{err:?}");
    let mut buf = vec![0u8; 4096];
    assert_eq!(a.get_into("small", &mut buf).await.unwrap(), 1000);
    assert_eq!(&buf[..1000], &pattern(1000, 3)[..]);
    let err = a.put("", b"x", &cfg).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::INVALID_PARAMS);
    a.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_return_one_result_per_key_in_order() {
    let master = start_master().await;
    let a = node(&master, 32 << 20, TransportMode::Auto).await;
    let b = node(&master, 32 << 20, TransportMode::Auto).await;
    let values: Vec<Vec<u8>> = (0..64).map(|i| pattern(1000 + i * 100, i as u8)).collect();
    let keys: Vec<String> = (0..64).map(|i| format!("batch-{i}")).collect();
    a.put("batch-5", b"already", &ReplicateConfig::default())
        .await
        .unwrap();
    let items: Vec<(&str, &[u8])> = keys
        .iter()
        .map(|k| k.as_str())
        .zip(values.iter().map(|v| v.as_slice()))
        .collect();
    let results = a.put_batch(&items, &ReplicateConfig::default()).await;
    assert_eq!(results.len(), 64);
    for (i, r) in results.iter().enumerate() {
        let expected = if i == 5 {
            PutOutcome::AlreadyPresent
        } else {
            PutOutcome::Stored
        };
        assert_eq!(r.as_ref().unwrap(), &expected, "entry {i}");
    }
    let mut probe: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    probe.push("absent");
    let got = b.get_batch(&probe).await;
    assert_eq!(got.len(), 65);
    for i in 0..64 {
        let expected: &[u8] = if i == 5 { b"already" } else { &values[i] };
        assert_eq!(got[i].as_ref().unwrap().as_slice(), expected, "entry {i}");
    }
    assert_eq!(
        got[64].as_ref().unwrap_err().code(),
        ErrorCode::OBJECT_NOT_FOUND
    );
    // Buffers sized by the caller once the lookup told the sizes: one per key or none.
    let mut storage: Vec<Vec<u8>> = Vec::new();
    let mut seen = Vec::new();
    let probe3 = ["batch-2", "absent", "batch-3", "batch-4"];
    let sizes = b
        .get_batch_with(&probe3, |sizes| {
            seen = sizes.to_vec();
            storage = sizes
                .iter()
                .map(|s| vec![0u8; s.unwrap_or(0) as usize])
                .collect();
            // batch-3 gets no buffer, batch-4 one byte too few.
            storage[3].pop();
            storage
                .iter_mut()
                .enumerate()
                .map(|(i, b)| (i != 2).then_some(&mut b[..]))
                .collect()
        })
        .await;
    assert_eq!(
        seen,
        vec![
            Some(values[2].len() as u64),
            None,
            Some(values[3].len() as u64),
            Some(values[4].len() as u64)
        ]
    );
    assert_eq!(sizes[0].as_ref().unwrap(), &(values[2].len() as u64));
    assert_eq!(
        sizes[1].as_ref().unwrap_err().code(),
        ErrorCode::OBJECT_NOT_FOUND
    );
    assert!(matches!(
        sizes[2],
        Err(StoreError::BufferTooSmall {
            buffer_bytes: 0,
            ..
        })
    ));
    assert!(matches!(sizes[3], Err(StoreError::BufferTooSmall { .. })));
    assert_eq!(storage[0], values[2]);
    assert!(
        storage[3].iter().all(|&x| x == 0),
        "a short buffer is left untouched"
    );
    let removed = b.batch_remove(&["batch-1", "absent"], true).await.unwrap();
    assert_eq!(removed, vec![Ok(()), Err(ErrorCode::OBJECT_NOT_FOUND)]);
    assert_eq!(b.remove_by_regex("^batch-1", true).await.unwrap(), 10);
    a.close().await.unwrap();
    b.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_falls_back_to_the_next_one() {
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Tcp).await;
    let b = node(&master, 16 << 20, TransportMode::Tcp).await;
    let reader = node(&master, 0, TransportMode::Tcp).await;
    let two = ReplicateConfig {
        replica_num: 2,
        ..ReplicateConfig::default()
    };
    let value = pattern(300_000, 9);
    // The master orders replicas from a random start: with 16 keys some list `a` first.
    for i in 0..16 {
        reader
            .put(&format!("both-{i}"), &value, &two)
            .await
            .unwrap();
    }
    // Kill a's data plane without telling the master: its replicas are still listed.
    a.abort();
    for i in 0..16 {
        assert_eq!(
            reader.get(&format!("both-{i}")).await.unwrap(),
            value,
            "key {i}"
        );
    }
    let keys: Vec<String> = (0..16).map(|i| format!("both-{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
    for got in reader.get_batch(&refs).await {
        assert_eq!(got.unwrap(), value);
    }
    assert!(
        reader
            .stats()
            .replica_fallbacks
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    b.close().await.unwrap();
    reader.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_buffers_and_parts_work_without_copies() {
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Auto).await;
    let mut arena = vec![0u8; 1 << 20];
    let value = pattern(200_000, 4);
    arena[..value.len()].copy_from_slice(&value);
    // SAFETY: `arena` outlives the registration (unregistered below before it drops).
    unsafe { a.register_buffer(arena.as_mut_ptr(), arena.len()) }.unwrap();
    a.put("zc", &arena[..value.len()], &ReplicateConfig::default())
        .await
        .unwrap();
    let n = a.get_into("zc", &mut arena[500_000..]).await.unwrap();
    assert_eq!(&arena[500_000..500_000 + n as usize], &value[..]);
    a.unregister_buffer(arena.as_mut_ptr()).unwrap();
    a.put_parts(
        "parts",
        &[b"hello ", b"", b"world"],
        &ReplicateConfig::default(),
    )
    .await
    .unwrap();
    assert_eq!(a.get("parts").await.unwrap(), b"hello world");
    // Two concurrent puts of the same bytes (overlapping registrations) both work.
    let shared = pattern(100_000, 1);
    let cfg = ReplicateConfig::default();
    let (r1, r2) = tokio::join!(
        a.put("same-1", &shared, &cfg),
        a.put("same-2", &shared[10..], &cfg)
    );
    r1.unwrap();
    r2.unwrap();
    assert_eq!(a.get("same-2").await.unwrap(), &shared[10..]);
    a.close().await.unwrap();
    assert_eq!(
        a.get("zc").await.unwrap_err().code(),
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
    );
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_into_memory_straddling_a_registered_buffer_use_a_private_copy() {
    // A destination that overlaps a registered buffer without lying inside it cannot be
    // registered for the transfer (the engine refuses overlapping regions): the single and the
    // batch read must then read into private memory and copy, not fail. Without that fallback
    // both reads below return `Transfer(Overlap)`.
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Auto).await;
    let cfg = ReplicateConfig::default();
    let one = pattern(600, 9);
    let two = pattern(300, 10);
    a.put("straddle-1", &one, &cfg).await.unwrap();
    a.put("straddle-2", &two, &cfg).await.unwrap();
    let mut arena = vec![0u8; 8192];
    // SAFETY: `arena` outlives the registration (unregistered below before it drops).
    unsafe { a.register_buffer(arena.as_mut_ptr(), 1000) }.unwrap();
    // [500, 1100) straddles the end of the registered [0, 1000).
    let n = a
        .get_into("straddle-1", &mut arena[500..1500])
        .await
        .unwrap();
    assert_eq!(n, 600);
    assert_eq!(&arena[500..1100], &one[..]);
    arena[500..1100].fill(0);
    {
        let (inside, rest) = arena.split_at_mut(500);
        let straddling = &mut rest[..1000];
        let mut buffers: Vec<&mut [u8]> = vec![straddling, &mut inside[..300]];
        let results = a
            .get_batch_into(&["straddle-1", "straddle-2"], &mut buffers)
            .await;
        assert_eq!(results.len(), 2);
        assert_eq!(*results[0].as_ref().unwrap(), 600);
        assert_eq!(*results[1].as_ref().unwrap(), 300);
    }
    assert_eq!(&arena[500..1100], &one[..]);
    assert_eq!(&arena[..300], &two[..]);
    a.unregister_buffer(arena.as_mut_ptr()).unwrap();
    a.close().await.unwrap();
    master.shutdown().await;
}

#[test]
fn the_blocking_facade_serves_many_threads_at_once() {
    use mooncake_client::BlockingStoreClient;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let master = rt.block_on(start_master());
    let config = StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        global_segment_size: 32 << 20,
        ..StoreConfig::default()
    };
    let store = std::sync::Arc::new(BlockingStoreClient::connect(config, 2).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let key = format!("t{t}-{i}");
                    let value = pattern(100 + i * 37, t as u8);
                    store
                        .put(&key, &value, &ReplicateConfig::default())
                        .unwrap();
                    assert_eq!(store.get(&key).unwrap(), value, "{key}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(store.is_exist("t7-49").unwrap());
    store.close().unwrap();
    rt.block_on(master.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_replaces_in_place_and_with_a_new_size() {
    let master = start_master().await;
    let a = node(&master, 32 << 20, TransportMode::Auto).await;
    let reader = node(&master, 0, TransportMode::Auto).await;
    let one = ReplicateConfig::default();
    // Upsert of a new key is a put.
    reader.upsert("k", &pattern(5000, 1), &one).await.unwrap();
    assert_eq!(a.get("k").await.unwrap(), pattern(5000, 1));
    // Same size: rewritten in place; put would have kept the first value.
    assert_eq!(
        reader.put("k", &pattern(5000, 2), &one).await.unwrap(),
        PutOutcome::AlreadyPresent
    );
    reader.upsert("k", &pattern(5000, 2), &one).await.unwrap();
    assert_eq!(a.get("k").await.unwrap(), pattern(5000, 2));
    // Another size: reallocated.
    reader.upsert("k", &pattern(70_000, 3), &one).await.unwrap();
    assert_eq!(reader.get("k").await.unwrap(), pattern(70_000, 3));
    assert_eq!(reader.get_size("k").await.unwrap(), 70_000);
    // Batches: one result per key in order, a bad entry fails alone.
    let (v1, v2) = (pattern(100, 4), pattern(200, 5));
    let results = reader
        .upsert_batch(&[("k", &v1), ("", &v2), ("n", &v2)], &one)
        .await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(reader.get("k").await.unwrap(), v1);
    assert_eq!(reader.get("n").await.unwrap(), v2);
    // A value bigger than the whole store: clear error, the old value stays readable.
    let huge = vec![7u8; 48 << 20];
    let err = reader.upsert("n", &huge, &one).await.unwrap_err();
    assert_eq!(
        err.master_code(),
        Some(ErrorCode::NO_AVAILABLE_HANDLE),
        "{err}"
    );
    // As upstream (UpsertStart with a different size), the old replicas are discarded
    // before the new allocation, so a size-changing upsert that cannot allocate loses the key.
    assert_eq!(
        reader.get("n").await.unwrap_err().master_code(),
        Some(ErrorCode::OBJECT_NOT_FOUND)
    );
    reader.close().await.unwrap();
    a.close().await.unwrap();
    master.shutdown().await;
}

fn is_mismatch<T>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::ChecksumMismatch { .. }))
}

/// Flips one byte in the middle of every memory replica of `key`, writing straight into the
/// owning node's segment with a separate transfer engine (as a buggy or racing writer would).
async fn corrupt_replicas(client: &StoreClient, key: &str) {
    use mooncake_client::store::addressing::split_address;
    use mooncake_common::ReplicaKind;
    use mooncake_transfer::{Endpoint, TransferConfig, TransferEngine, TransferRequest};
    use std::sync::Arc;

    let vandal = TransferEngine::start(TransferConfig {
        transport: TransportMode::Tcp,
        ..TransferConfig::default()
    })
    .unwrap();
    let garbage = vandal.allocate_local_buffer(4096).unwrap();
    garbage.write_at(0, &[0xFFu8; 1]).unwrap();
    let replicas = client.get_replica_desc(key).await.unwrap();
    assert!(!replicas.is_empty());
    for replica in replicas {
        let ReplicaKind::Memory(memory) = &replica.kind else {
            panic!("{key}: not a memory replica")
        };
        let endpoint = Arc::new(Endpoint::parse(&memory.transport_endpoint).unwrap());
        let (segment, offset) = split_address(memory.buffer_address);
        let middle = offset + memory.size / 2;
        // Read the byte first so the flip always changes it.
        let local = vandal.allocate_local_buffer(4096).unwrap();
        let read = TransferRequest::read(local.as_ptr(), 1, &endpoint, segment, middle);
        let mut current = [0u8; 1];
        assert_eq!(vandal.transfer_sync(&[read]), vec![Ok(())]);
        local.read_at(0, &mut current).unwrap();
        garbage.write_at(0, &[!current[0]]).unwrap();
        let write = TransferRequest::write(garbage.as_ptr(), 1, &endpoint, segment, middle);
        assert_eq!(vandal.transfer_sync(&[write]), vec![Ok(())]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_bytes_are_refused_by_every_read_path() {
    let master = start_master().await;
    let owner = node(&master, 64 << 20, TransportMode::Auto).await;
    let reader = node(&master, 0, TransportMode::Auto).await;
    let tcp_reader = node(&master, 0, TransportMode::Tcp).await;
    let trusting = StoreClient::connect(StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 0,
        verify_checksums: false,
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    // A small value (one chunk) and one large enough to be split across copy threads / TCP
    // connections, whose chunk checksums are combined.
    let sizes = [4096usize, 9 << 20];
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("bitrot-{i}")).collect();
    for (key, &len) in keys.iter().zip(&sizes) {
        let value = pattern(len, 7);
        owner
            .put(key, &value, &ReplicateConfig::default())
            .await
            .unwrap();
        // Intact: every path reads it.
        assert!(reader.get(key).await.unwrap() == value);
        assert!(tcp_reader.get(key).await.unwrap() == value);
        corrupt_replicas(&owner, key).await;
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for client in [&owner, &reader, &tcp_reader] {
        for (key, &len) in keys.iter().zip(&sizes) {
            assert!(is_mismatch(&client.get(key).await), "get {key}");
            let mut buffer = vec![0u8; len];
            assert!(
                is_mismatch(&client.get_into(key, &mut buffer).await),
                "get_into {key}"
            );
        }
        let batch = client.get_batch(&refs).await;
        assert!(batch.iter().all(is_mismatch), "get_batch");
        let mut buffers: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        let batch = client.get_batch_into(&refs, &mut slices).await;
        assert!(batch.iter().all(is_mismatch), "get_batch_into");
    }
    // Without verification the flipped byte comes back: the checks above are what caught it.
    for (key, &len) in keys.iter().zip(&sizes) {
        let got = trusting.get(key).await.unwrap();
        let value = pattern(len, 7);
        assert_eq!(got.len(), len);
        assert_ne!(got, value, "{key}");
        let differing = got.iter().zip(&value).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 1, "{key}: exactly the flipped byte differs");
    }
    for client in [owner, reader, tcp_reader, trusting] {
        client.close().await.unwrap();
    }
    master.shutdown().await;
}

/// The metadata helpers the Python binding uses: `batch_get_replica_desc` answers each key in
/// order (a missing one with its code) and `segment_name` names the client's segment, or its
/// endpoint's `host:port` when it contributes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_descriptors_by_batch_and_segment_names() {
    let master = start_master().await;
    let a = node(&master, 16 << 20, TransportMode::Auto).await;
    let reader = node(&master, 0, TransportMode::Auto).await;
    assert_eq!(a.segment_name(), a.segments()[0].name);
    assert!(reader.segments().is_empty());
    let name = reader.segment_name();
    assert!(name.starts_with("127.0.0.1:"), "{name}");
    assert!(
        reader.endpoint().contains(&name),
        "{name} {}",
        reader.endpoint()
    );
    let config = ReplicateConfig::default();
    reader.put("d/1", &pattern(3000, 9), &config).await.unwrap();
    let answers = reader
        .batch_get_replica_desc(&["d/1", "d/missing"])
        .await
        .unwrap();
    assert_eq!(answers.len(), 2);
    let replicas = answers[0].as_ref().unwrap();
    assert_eq!(replicas, &reader.get_replica_desc("d/1").await.unwrap());
    assert_eq!(replicas.len(), 1);
    assert_eq!(answers[1], Err(ErrorCode::OBJECT_NOT_FOUND));
    assert!(reader.batch_get_replica_desc(&[]).await.unwrap().is_empty());
    reader.close().await.unwrap();
    a.close().await.unwrap();
    master.shutdown().await;
}

/// A get holds its object only while it reads (a read pin, released with the client's next
/// lookup), so a plain Remove succeeds right after it; a descriptor read keeps upstream's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_get_releases_its_object_and_descriptor_reads_keep_the_lease() {
    // Finished gets are also released by the heartbeat: this client sends none during the test
    // (and the master's client TTL outlasts any slow run), so only lookups release.
    let config = MasterConfig {
        rpc_address: "127.0.0.1".into(),
        port: 0,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        client_ttl: 600,
        ..MasterConfig::default()
    };
    let resolved = config.validate().unwrap();
    let master = RunningMaster::start(&config, &resolved).await.unwrap();
    let c = StoreClient::connect(StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 16 << 20,
        heartbeat_interval: std::time::Duration::from_secs(3600),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let one = ReplicateConfig::default();
    for key in ["a", "b", "c", "d", "e"] {
        c.put(key, &pattern(4096, 1), &one).await.unwrap();
    }
    assert_eq!(c.get("a").await.unwrap(), pattern(4096, 1));
    let batch = c.get_batch(&["b", "missing"]).await;
    assert!(batch[0].is_ok() && batch[1].is_err());
    // The releases of a and b ride on this lookup; e's own read is still held.
    c.get("e").await.unwrap();
    c.remove("a", false).await.unwrap();
    c.remove("b", false).await.unwrap();
    let held = c.remove("e", false).await.unwrap_err();
    assert_eq!(
        held.master_code(),
        Some(ErrorCode::OBJECT_HAS_LEASE),
        "{held}"
    );
    // Descriptor readers keep the full lease (10 s), as upstream.
    c.get_replica_desc("c").await.unwrap();
    c.get("d").await.unwrap();
    c.get("d").await.unwrap();
    let leased = c.remove("c", false).await.unwrap_err();
    assert_eq!(
        leased.master_code(),
        Some(ErrorCode::OBJECT_HAS_LEASE),
        "{leased}"
    );
    c.remove("c", true).await.unwrap();
    c.close().await.unwrap();
}

/// An existence check protects each hit until this client's next lookup (the load it
/// announces), which releases it: the heartbeat leaves it held, and it is not upstream's 10 s
/// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existence_check_holds_its_hits_until_the_next_lookup() {
    let master = start_master().await;
    let c = node(&master, 16 << 20, TransportMode::Auto).await;
    let one = ReplicateConfig::default();
    for key in ["a", "b", "c"] {
        c.put(key, &pattern(4096, 1), &one).await.unwrap();
    }
    assert!(c.is_exist("a").await.unwrap());
    let held = c.remove("a", false).await.unwrap_err();
    assert_eq!(
        held.master_code(),
        Some(ErrorCode::OBJECT_HAS_LEASE),
        "{held}"
    );
    // Two heartbeats go by: a check's pin is not theirs to release.
    let beats = || c.stats().heartbeats_ok.load(Ordering::Relaxed);
    let start = beats();
    let mut tries = 0;
    while beats() < start + 2 {
        tries += 1;
        assert!(tries < 600, "no heartbeat in 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let held = c.remove("a", false).await.unwrap_err();
    assert_eq!(
        held.master_code(),
        Some(ErrorCode::OBJECT_HAS_LEASE),
        "{held}"
    );
    // The next check releases a; its own hit on b is held until the get of c.
    let found = c.batch_is_exist(&["b", "missing"]).await.unwrap();
    assert_eq!(found, vec![Ok(true), Ok(false)]);
    c.remove("a", false).await.unwrap();
    let held = c.remove("b", false).await.unwrap_err();
    assert_eq!(
        held.master_code(),
        Some(ErrorCode::OBJECT_HAS_LEASE),
        "{held}"
    );
    assert_eq!(c.get("c").await.unwrap(), pattern(4096, 1));
    c.remove("b", false).await.unwrap();
    assert!(!c.is_exist("a").await.unwrap());
    c.close().await.unwrap();
    master.shutdown().await;
}

/// A master that predates some of our methods: it answers the ids in `lacks` as an old master
/// does (`NOT_SUPPORTED`, "unknown method id") and serves the rest.
struct OlderMaster {
    rpc: MasterRpc,
    lacks: std::ops::RangeInclusive<u16>,
}

impl Handler for OlderMaster {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        if self.lacks.contains(&method) {
            return Err(HandlerError::new(
                ErrorCode::NOT_SUPPORTED,
                format!("unknown method id {method}"),
            ));
        }
        self.rpc.handle(method, body, out)
    }
}

async fn older_master(lacks: std::ops::RangeInclusive<u16>) -> RpcServer {
    let core = MasterService::new(MasterServiceConfig::default(), Arc::new(SystemClock::new()));
    let rpc = MasterRpc::new(
        Arc::new(core.unwrap()),
        Arc::new(RpcMetrics::default()),
        Limits::default(),
    );
    let handler = Arc::new(OlderMaster { rpc, lacks });
    let addr = "127.0.0.1:0".parse().unwrap();
    RpcServer::bind(addr, handler, ServerConfig::default())
        .await
        .unwrap()
}

/// Our client with a master that lacks the read-pin methods (50–55: upstream's, or an older
/// one of ours) or only the pinned existence checks (54–55): every read and check works, and
/// what the master cannot pin it leases, as upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_checks_fall_back_to_the_lease_on_a_master_without_read_pins() {
    for lacks in [50..=55, 54..=55] {
        let server = older_master(lacks.clone()).await;
        let c = StoreClient::connect(StoreConfig {
            master_addr: server.local_addr().to_string(),
            local_hostname: "127.0.0.1".into(),
            global_segment_size: 16 << 20,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        let one = ReplicateConfig::default();
        for key in ["a", "b", "c", "d"] {
            c.put(key, &pattern(4096, 2), &one).await.unwrap();
        }
        for _ in 0..2 {
            assert!(c.is_exist("a").await.unwrap(), "{lacks:?}");
            let found = c.batch_is_exist(&["b", "missing"]).await.unwrap();
            assert_eq!(found, vec![Ok(true), Ok(false)], "{lacks:?}");
            assert_eq!(c.get("c").await.unwrap(), pattern(4096, 2), "{lacks:?}");
            let got = c.get_batch(&["d", "missing"]).await;
            assert!(got[0].as_ref().is_ok_and(|v| *v == pattern(4096, 2)));
            assert!(got[1].is_err(), "{lacks:?}");
        }
        // Checks took the lease: a plain remove is refused, as upstream.
        for key in ["a", "b"] {
            let leased = c.remove(key, false).await.unwrap_err();
            assert_eq!(
                leased.master_code(),
                Some(ErrorCode::OBJECT_HAS_LEASE),
                "{lacks:?}"
            );
        }
        // Reads are pinned and released by the next lookup where the master serves it, else
        // leased.
        c.get("a").await.unwrap();
        let read = c.remove("c", false).await;
        if *lacks.start() == 50 {
            let leased = read.unwrap_err();
            assert_eq!(
                leased.master_code(),
                Some(ErrorCode::OBJECT_HAS_LEASE),
                "{lacks:?}"
            );
        } else {
            read.unwrap();
            c.remove("d", false).await.unwrap();
        }
        c.close().await.unwrap();
        server.shutdown().await;
    }
}
