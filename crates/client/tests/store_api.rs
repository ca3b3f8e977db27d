//! The store client's calls behind upstream's wider Python API: ranged reads, get and put
//! sessions, caller-memory checks, the local_buffer_size cap, file and extra segments, the
//! automatic port range and the standalone (real client / dummy) mode. An in-process master on
//! 127.0.0.1:0 and real transfer engines.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use mooncake_client::standalone::{attach, RealClient, RealClientArgs};
use mooncake_client::store::{AUTO_PORT_MAX, AUTO_PORT_MIN};
use mooncake_client::{
    Access, PutOutcome, RangeRead, RangeWrite, StoreClient, StoreConfig, StoreError,
};
use mooncake_common::{ErrorCode, ReplicateConfig};
use mooncake_server::{MasterConfig, RunningMaster};

async fn start_master_with(lease: &str) -> RunningMaster {
    let config = MasterConfig {
        rpc_address: "127.0.0.1".into(),
        port: 0,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        default_kv_lease_ttl: lease.into(),
        ..MasterConfig::default()
    };
    let resolved = config.validate().unwrap();
    RunningMaster::start(&config, &resolved).await.unwrap()
}

async fn start_master() -> RunningMaster {
    start_master_with("5s").await
}

fn config(master: &RunningMaster, segment_bytes: u64) -> StoreConfig {
    StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment_bytes,
        ..StoreConfig::default()
    }
}

async fn node(master: &RunningMaster, segment_bytes: u64) -> StoreClient {
    StoreClient::connect(config(master, segment_bytes))
        .await
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn code<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> ErrorCode {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_reads_move_the_asked_bytes_and_fail_alone() {
    let master = start_master().await;
    let store = node(&master, 64 << 20).await;
    let reader = node(&master, 0).await;
    let a = pattern(100_000, 1);
    let b = pattern(4096, 2);
    let cfg = ReplicateConfig::default();
    assert_eq!(store.put("a", &a, &cfg).await.unwrap(), PutOutcome::Stored);
    assert_eq!(store.put("b", &b, &cfg).await.unwrap(), PutOutcome::Stored);
    let mut out = vec![0u8; 300];
    let (first, rest) = out.split_at_mut(100);
    let (second, third) = rest.split_at_mut(100);
    let mut past_end = [0u8; 10];
    let mut missing = [0u8; 4];
    let mut nothing = [0u8; 0];
    let mut fragments = vec![
        RangeRead {
            key: 0,
            offset: 99_900,
            dst: first,
        },
        RangeRead {
            key: 1,
            offset: 10,
            dst: second,
        },
        RangeRead {
            key: 0,
            offset: 0,
            dst: third,
        },
        RangeRead {
            key: 1,
            offset: 4090,
            dst: &mut past_end,
        },
        RangeRead {
            key: 2,
            offset: 0,
            dst: &mut missing,
        },
        RangeRead {
            key: 0,
            offset: 5,
            dst: &mut nothing,
        },
    ];
    let results = reader
        .get_ranges(&["a", "b", "missing"], &mut fragments)
        .await;
    assert_eq!(results[0].as_ref().unwrap(), &100);
    assert_eq!(results[1].as_ref().unwrap(), &100);
    assert_eq!(results[2].as_ref().unwrap(), &100);
    assert_eq!(
        code(&results[3]),
        ErrorCode::INVALID_PARAMS,
        "range past the end"
    );
    assert_eq!(code(&results[4]), ErrorCode::OBJECT_NOT_FOUND);
    assert_eq!(results[5].as_ref().unwrap(), &0);
    drop(fragments);
    assert_eq!(&out[..100], &a[99_900..]);
    assert_eq!(&out[100..200], &b[10..110]);
    assert_eq!(&out[200..], &a[..100]);
    assert_eq!(past_end, [0u8; 10], "a refused range writes nothing");
    for client in [store, reader] {
        client.close().await.unwrap();
    }
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_sessions_write_layers_then_get_sessions_read_them_without_the_master() {
    let master = start_master().await;
    let store = node(&master, 64 << 20).await;
    let client = node(&master, 0).await;
    let (layers, page) = (4usize, 8192usize);
    let keys = ["s/0", "s/1"];
    let objects: Vec<Vec<u8>> = (0..2).map(|i| pattern(layers * page, i as u8)).collect();
    let sizes: Vec<(&str, u64)> = keys.iter().map(|k| (*k, (layers * page) as u64)).collect();
    let cfg = ReplicateConfig::default();
    for result in client.batch_put_session_start(&sizes, &cfg).await {
        result.unwrap();
    }
    // Reserved, not readable yet; a second session of the key is refused.
    assert!(!client.is_exist("s/0").await.unwrap());
    let again = client.batch_put_session_start(&sizes[..1], &cfg).await;
    assert_eq!(code(&again[0]), ErrorCode::INVALID_PARAMS);
    // Another client: the key is being written (nothing stored, not a success).
    let other = store.batch_put_session_start(&sizes[..1], &cfg).await;
    assert_eq!(code(&other[0]), ErrorCode::REPLICA_IS_NOT_READY);
    for layer in (0..layers).rev() {
        let fragments: Vec<RangeWrite<'_>> = (0..2)
            .map(|k| RangeWrite {
                key: k,
                offset: (layer * page) as u64,
                src: &objects[k][layer * page..(layer + 1) * page],
            })
            .collect();
        for result in client.put_ranges_in_session(&keys, &fragments).await {
            assert_eq!(result.unwrap(), page as u64);
        }
    }
    let past = [RangeWrite {
        key: 0,
        offset: (layers * page - 1) as u64,
        src: &[1, 2],
    }];
    let refused = client.put_ranges_in_session(&keys[..1], &past).await;
    assert_eq!(code(&refused[0]), ErrorCode::INVALID_PARAMS);
    for result in client.batch_put_session_end(&keys).await {
        result.unwrap();
    }
    assert_eq!(
        code(&client.put_ranges_in_session(&keys[..1], &past).await[0]),
        ErrorCode::INVALID_PARAMS,
        "no session after the end"
    );
    assert_eq!(
        code(&client.batch_put_session_end(&keys[..1]).await[0]),
        ErrorCode::INVALID_PARAMS
    );
    for (key, object) in keys.iter().zip(&objects) {
        assert!(&client.get(key).await.unwrap() == object, "{key}");
    }

    // A get session needs the master once: reads go on with the master gone.
    let sizes = client.batch_get_session_start(&keys).await;
    assert_eq!(*sizes[0].as_ref().unwrap(), (layers * page) as u64);
    master.shutdown().await;
    let mut out = vec![0u8; 2 * page];
    let (x, y) = out.split_at_mut(page);
    let mut fragments = [
        RangeRead {
            key: 1,
            offset: (2 * page) as u64,
            dst: x,
        },
        RangeRead {
            key: 0,
            offset: page as u64,
            dst: y,
        },
    ];
    for result in client.get_ranges_in_session(&keys, &mut fragments).await {
        assert_eq!(result.unwrap(), page as u64);
    }
    assert_eq!(&out[..page], &objects[1][2 * page..3 * page]);
    assert_eq!(&out[page..], &objects[0][page..2 * page]);
    assert_eq!(client.batch_get_session_end(&keys), 2);
    assert_eq!(client.batch_get_session_end(&keys), 0);
    client.abort();
    store.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_and_closed_put_sessions_leave_no_object_behind() {
    let master = start_master().await;
    let store = node(&master, 64 << 20).await;
    let client = node(&master, 0).await;
    let cfg = ReplicateConfig::default();
    client.batch_put_session_start(&[("r", 10)], &cfg).await[0]
        .as_ref()
        .unwrap();
    client.batch_put_session_revoke(&["r"]).await[0]
        .as_ref()
        .unwrap();
    assert_eq!(
        store.put("r", b"by another", &cfg).await.unwrap(),
        PutOutcome::Stored
    );

    client.batch_put_session_start(&[("c", 10)], &cfg).await[0]
        .as_ref()
        .unwrap();
    client.close().await.unwrap();
    assert_eq!(
        store.put("c", b"free again", &cfg).await.unwrap(),
        PutOutcome::Stored
    );
    assert_eq!(store.get("c").await.unwrap(), b"free again");
    store.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_session_whose_lease_ran_out_is_refused() {
    let master = start_master_with("300ms").await;
    let store = node(&master, 16 << 20).await;
    let cfg = ReplicateConfig::default();
    store.put("l", &pattern(64, 3), &cfg).await.unwrap();
    store.batch_get_session_start(&["l"]).await[0]
        .as_ref()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut dst = [0u8; 8];
    let mut fragments = [RangeRead {
        key: 0,
        offset: 0,
        dst: &mut dst,
    }];
    let results = store.get_ranges_in_session(&["l"], &mut fragments).await;
    assert_eq!(code(&results[0]), ErrorCode::LEASE_EXPIRED);
    // A new session renews the lease.
    store.batch_get_session_start(&["l"]).await[0]
        .as_ref()
        .unwrap();
    let results = store.get_ranges_in_session(&["l"], &mut fragments).await;
    assert_eq!(results[0].as_ref().unwrap(), &8);
    store.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_memory_is_checked_against_registrations_and_mappings() {
    let master = start_master().await;
    let store = node(&master, 16 << 20).await;
    let mut buffer = vec![0u8; 1 << 16];
    let base = buffer.as_mut_ptr();
    // SAFETY: `buffer` outlives the registration (unregistered below).
    unsafe { store.register_buffer(base, buffer.len()) }.unwrap();
    let addr = base as usize;
    let results = store.check_caller_ranges(&[
        (addr, 1 << 16, Access::ReadWrite),
        (addr + 100, 100, Access::Write),
        (addr + 100, 1 << 16, Access::Write),
        (0x1000, 4096, Access::Read),
        (addr, 1 << 62, Access::Write),
        (usize::MAX - 1, 8, Access::Read),
        (0x1000, 0, Access::Read),
    ]);
    assert!(results[0].is_ok() && results[1].is_ok() && results[6].is_ok());
    for (i, result) in results.iter().enumerate().skip(2).take(4) {
        assert_eq!(code(result), ErrorCode::INVALID_PARAMS, "range {i}");
    }
    // Unregistered but mapped memory passes; code is readable, not writable.
    let heap = vec![0u8; 4096];
    let code_addr = pattern as *const () as usize;
    let results = store.check_caller_ranges(&[
        (heap.as_ptr() as usize, heap.len(), Access::Write),
        (code_addr, 1, Access::Read),
        (code_addr, 1, Access::Write),
    ]);
    assert!(results[0].is_ok() && results[1].is_ok());
    assert_eq!(code(&results[2]), ErrorCode::INVALID_PARAMS);

    // Registration checks the range once: unmapped or overlong ranges are refused.
    // SAFETY: refused before anything is registered.
    let refused = unsafe { store.register_buffer(0x1000 as *mut u8, 4096) };
    assert_eq!(code(&refused), ErrorCode::INVALID_PARAMS);
    // SAFETY: as above.
    let refused = unsafe { store.register_buffer(heap.as_ptr() as *mut u8, 1 << 40) };
    assert_eq!(code(&refused), ErrorCode::INVALID_PARAMS);
    // A range inside a registered buffer is accepted as is and unregistered on its own.
    // SAFETY: inside `buffer`, which stays registered.
    unsafe { store.register_buffer(base.add(4096), 4096) }.unwrap();
    store.unregister_buffer(base.wrapping_add(4096)).unwrap();
    store.unregister_buffer(base).unwrap();
    assert_eq!(
        code(&store.unregister_buffer(base)),
        ErrorCode::INVALID_PARAMS
    );
    store.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_buffer_size_caps_objects_in_unregistered_memory_only() {
    let master = start_master().await;
    let store = node(&master, 32 << 20).await;
    let capped = StoreClient::connect(StoreConfig {
        local_buffer_size: 0,
        ..config(&master, 0)
    })
    .await
    .unwrap();
    let small = StoreClient::connect(StoreConfig {
        local_buffer_size: 1000,
        ..config(&master, 0)
    })
    .await
    .unwrap();
    let cfg = ReplicateConfig::default();
    let value = pattern(5000, 4);
    assert_eq!(
        code(&capped.put("cap/plain", &value, &cfg).await),
        ErrorCode::INVALID_PARAMS
    );
    assert!(
        !store.is_exist("cap/plain").await.unwrap(),
        "no key left behind"
    );
    let batch = small
        .put_batch(&[("cap/b0", &value[..500]), ("cap/b1", &value[..])], &cfg)
        .await;
    assert_eq!(batch[0].as_ref().unwrap(), &PutOutcome::Stored);
    assert_eq!(code(&batch[1]), ErrorCode::INVALID_PARAMS);
    assert!(!store.is_exist("cap/b1").await.unwrap());

    // Registered memory is zero copy and not capped.
    let mut registered = value.clone();
    let ptr = registered.as_mut_ptr();
    // SAFETY: `registered` outlives the registration.
    unsafe { capped.register_buffer(ptr, registered.len()) }.unwrap();
    assert_eq!(
        capped
            .put("cap/zero-copy", &registered, &cfg)
            .await
            .unwrap(),
        PutOutcome::Stored
    );
    registered.fill(0);
    assert_eq!(
        capped
            .get_into("cap/zero-copy", &mut registered)
            .await
            .unwrap(),
        5000
    );
    assert!(registered == value);
    // Reads into memory this client allocates, or into unregistered buffers, are capped too.
    assert_eq!(
        code(&capped.get("cap/zero-copy").await),
        ErrorCode::INVALID_PARAMS
    );
    let mut plain = vec![0u8; 5000];
    assert_eq!(
        code(&capped.get_into("cap/zero-copy", &mut plain).await),
        ErrorCode::INVALID_PARAMS
    );
    assert_eq!(small.get("cap/b0").await.unwrap(), &value[..500]);
    capped.unregister_buffer(ptr).unwrap();
    for client in [capped, small, store] {
        client.close().await.unwrap();
    }
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_segments_mount_from_files_and_memory_and_unmount_by_id() {
    let master = start_master().await;
    let owner = node(&master, 0).await;
    let writer = node(&master, 0).await;
    let dir = std::env::temp_dir().join(format!("mc-file-seg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("segment");
    std::fs::write(&path, vec![0u8; 8 << 20]).unwrap();
    let segment = owner
        .mount_file_segment(&path, 4096, 4 << 20)
        .await
        .unwrap();
    assert_eq!(owner.segments().len(), 1);
    let cfg = ReplicateConfig::default();
    let value = pattern(200_000, 5);
    writer.put("f/obj", &value, &cfg).await.unwrap();
    assert!(writer.get("f/obj").await.unwrap() == value);
    // The bytes live in the file (the only segment of the cluster).
    let file = std::fs::read(&path).unwrap();
    assert!(
        file.windows(value.len().min(64)).any(|w| w == &value[..64]),
        "the object's bytes are in the mounted file"
    );

    let memory = owner.mount_segment(8 << 20).await.unwrap();
    assert_eq!(owner.segments().len(), 2);
    owner
        .unmount_segments(&[segment.id], Duration::ZERO)
        .await
        .unwrap();
    // Gone for every reader at once, not after a TTL.
    assert_eq!(
        code(&writer.get("f/obj").await),
        ErrorCode::OBJECT_NOT_FOUND
    );
    let unknown = owner.unmount_segments(&[segment.id], Duration::ZERO).await;
    assert_eq!(code(&unknown), ErrorCode::INVALID_PARAMS);

    // A graceful unmount keeps objects readable during the grace period.
    writer.put("m/obj", &value, &cfg).await.unwrap();
    owner
        .unmount_segments(&[memory.id], Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        writer.get("m/obj").await.unwrap() == value,
        "readable in the grace period"
    );
    assert!(owner.segments().is_empty());

    let refused = owner
        .mount_file_segment(&dir.join("missing"), 0, 4096)
        .await;
    assert_eq!(code(&refused), ErrorCode::INVALID_PARAMS);
    for client in [owner, writer] {
        client.close().await.unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    master.shutdown().await;
}

fn port_of(segment_name: &str) -> u16 {
    segment_name.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_port_the_transfer_server_takes_one_of_upstreams_range() {
    let master = start_master().await;
    let auto = node(&master, 16 << 20).await;
    let port = port_of(&auto.segment_name());
    assert!((AUTO_PORT_MIN..=AUTO_PORT_MAX).contains(&port), "{port}");
    let requester = node(&master, 0).await;
    assert!((AUTO_PORT_MIN..=AUTO_PORT_MAX).contains(&port_of(&requester.segment_name())));
    let kernel = StoreClient::connect(StoreConfig {
        auto_port_range: None,
        ..config(&master, 0)
    })
    .await
    .unwrap();
    assert_ne!(port_of(&kernel.segment_name()), 0);
    for client in [auto, requester, kernel] {
        client.close().await.unwrap();
    }
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dummy_attaches_to_the_real_client_and_shares_its_memory() {
    let master = start_master().await;
    let args = RealClientArgs {
        master_server_address: master.rpc_addr().to_string(),
        host: "127.0.0.1".into(),
        port: 0,
        global_segment_size: 32 << 20,
        tenant_id: "team".into(),
        ..RealClientArgs::default()
    };
    let real = RealClient::start(&args).await.unwrap();
    let info = attach(&real.attach_addr().to_string()).await.unwrap();
    assert_eq!(info.master, master.rpc_addr().to_string());
    assert_eq!(info.tenant, "team");
    assert_eq!(info.segment, real.client().segment_name());
    let dummy = StoreClient::connect(StoreConfig {
        master_addr: info.master.clone(),
        tenant: info.tenant.clone(),
        ..config(&master, 0)
    })
    .await
    .unwrap();
    let cfg = ReplicateConfig::default();
    let value = pattern(1 << 20, 6);
    assert_eq!(
        dummy.put("d/obj", &value, &cfg).await.unwrap(),
        PutOutcome::Stored
    );
    assert!(dummy.get("d/obj").await.unwrap() == value);
    assert!(
        dummy.shm_mapped_segments() >= 1,
        "the real client's segment is mapped"
    );
    // The real client sees the dummy's keys (same tenant).
    assert!(real.client().is_exist("d/obj").await.unwrap());
    dummy.close().await.unwrap();
    real.close().await.unwrap();
    master.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_to_something_else_fails_quickly() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Not a real client: a port that answers with garbage and one that never answers.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage_addr = garbage.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let started = Instant::now();
    assert!(attach(&garbage_addr.to_string()).await.is_err());
    assert!(attach(&silent_addr.to_string()).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(30));
    // A closed port is RPC_FAIL.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    assert_eq!(
        code(&attach(&closed.to_string()).await),
        ErrorCode::RPC_FAIL
    );

    // A real client answers a wrong request with a refusal and keeps serving.
    let master = start_master().await;
    let real = RealClient::start(&RealClientArgs {
        master_server_address: master.rpc_addr().to_string(),
        host: "127.0.0.1".into(),
        port: 0,
        global_segment_size: 16 << 20,
        ..RealClientArgs::default()
    })
    .await
    .unwrap();
    let mut stream = tokio::net::TcpStream::connect(real.attach_addr())
        .await
        .unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("MCRS-ERR"), "{answer:?}");
    attach(&real.attach_addr().to_string()).await.unwrap();
    real.close().await.unwrap();
    master.shutdown().await;
}
