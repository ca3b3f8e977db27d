//! Store nodes riding through a master restart: the master is stopped, calls fail with a clear
//! code meanwhile, a new master restored from the old one's state starts on the same port, the
//! node re-mounts its segment, checks its restored replicas and they are readable again, byte for
//! byte; a replica whose bytes changed while the master was away is dropped, never returned.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_client::{StoreClient, StoreConfig, StoreError};
use mooncake_common::{ErrorCode, ReplicaKind, ReplicateConfig};
use mooncake_master::{MasterState, RestoreOptions};
use mooncake_server::{MasterConfig, RunningMaster};
use mooncake_transfer::TransportMode;

/// How long a test waits for the node to re-join before failing.
const REJOIN_LIMIT: Duration = Duration::from_secs(60);

fn master_config(port: u16) -> MasterConfig {
    MasterConfig {
        rpc_address: "127.0.0.1".into(),
        port,
        metrics_host: "127.0.0.1".into(),
        metrics_port: 0,
        ..MasterConfig::default()
    }
}

async fn start(port: u16, initial: Option<MasterState>) -> RunningMaster {
    let config = master_config(port);
    let resolved = config.validate().unwrap();
    let initial = initial.map(|s| (s, RestoreOptions::default()));
    // The old master's port may take a moment to be free again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match RunningMaster::start_with(&config, &resolved, initial.clone()).await {
            Ok(master) => return master,
            Err(error) if Instant::now() < deadline => {
                eprintln!("restart on port {port} failed, retrying: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("cannot start the master on port {port}: {error}"),
        }
    }
}

async fn client(master_port: u16, segment_bytes: u64) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: format!("127.0.0.1:{master_port}"),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: segment_bytes,
        transport: TransportMode::Tcp,
        heartbeat_interval: Duration::from_millis(100),
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const SIZES: [usize; 6] = [1, 100, 4096, 65_537, 1 << 20, 3 << 20];

/// Puts one object of each size (from a client without a segment, so every replica lands on
/// the node's segment).
async fn put_all(writer: &StoreClient) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, len) in SIZES.into_iter().enumerate() {
        let key = format!("obj-{i}");
        let bytes = value(len, i as u8);
        writer
            .put(&key, &bytes, &ReplicateConfig::default())
            .await
            .unwrap();
        out.push((key, bytes));
    }
    out
}

/// Waits until the restored master has no replica left to verify.
async fn wait_verified(master: &RunningMaster) {
    let deadline = Instant::now() + REJOIN_LIMIT;
    loop {
        let stats = master.master().verification_stats();
        if stats.pending == 0 && master.master().waiting_segments().is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the node did not re-join and verify in time: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rejoins_a_restored_master_and_its_objects_read_back_byte_exact() {
    let first = start(0, None).await;
    let port = first.rpc_addr().port();
    let node = client(port, 64 << 20).await;
    let writer = client(port, 0).await;
    let objects = put_all(&writer).await;
    let state = first.master().export_state();
    assert_eq!(state.objects.len(), objects.len());
    first.shutdown().await;

    // While the master is down calls fail with a transport code, within the RPC timeout.
    let started = Instant::now();
    let error = writer.get(&objects[0].0).await.unwrap_err();
    assert!(
        matches!(error.code(), ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT),
        "{error}"
    );
    let error = writer
        .put("during-outage", b"x", &ReplicateConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(error.code(), ErrorCode::RPC_FAIL | ErrorCode::RPC_TIMEOUT),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let failures = node
        .stats()
        .heartbeat_failures
        .load(std::sync::atomic::Ordering::Relaxed);

    let second = start(port, Some(state)).await;
    wait_verified(&second).await;
    let stats = second.master().verification_stats();
    assert_eq!(
        (stats.verified, stats.mismatched),
        (objects.len() as u64, 0)
    );
    for (key, bytes) in &objects {
        let got = writer.get(key).await.unwrap();
        assert!(got == *bytes, "{key}: bytes differ after the restore");
    }
    assert!(
        node.stats()
            .heartbeat_failures
            .load(std::sync::atomic::Ordering::Relaxed)
            >= failures
    );
    assert_eq!(
        node.stats()
            .verified_replicas
            .load(std::sync::atomic::Ordering::Relaxed),
        objects.len() as u64
    );
    // New writes work on the re-mounted segment, without touching the restored ranges.
    writer
        .put("after", &value(5000, 9), &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(writer.get("after").await.unwrap(), value(5000, 9));
    for (key, bytes) in &objects {
        assert!(writer.get(key).await.unwrap() == *bytes, "{key}");
    }
    let report = second.master().check_accounting();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    writer.close().await.unwrap();
    node.close().await.unwrap();
    second.shutdown().await;
}

/// Flips one byte in the middle of `memory`'s range with a separate transfer engine, as a late
/// or stray writer would, while no master is running.
fn tamper(endpoint: &str, buffer_address: u64, len: u64) {
    use mooncake_client::store::addressing::split_address;
    use mooncake_transfer::{Endpoint, TransferConfig, TransferEngine, TransferRequest};

    let vandal = TransferEngine::start(TransferConfig {
        transport: TransportMode::Tcp,
        ..TransferConfig::default()
    })
    .unwrap();
    let endpoint = Arc::new(Endpoint::parse(endpoint).unwrap());
    let (segment, offset) = split_address(buffer_address);
    let middle = offset + len / 2;
    let local = vandal.allocate_local_buffer(4096).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 1, &endpoint, segment, middle);
    assert_eq!(vandal.transfer_sync(&[read]), vec![Ok(())]);
    let mut current = [0u8; 1];
    local.read_at(0, &mut current).unwrap();
    local.write_at(0, &[!current[0]]).unwrap();
    let write = TransferRequest::write(local.as_ptr(), 1, &endpoint, segment, middle);
    assert_eq!(vandal.transfer_sync(&[write]), vec![Ok(())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_changed_while_the_master_was_down_is_dropped_and_never_returned() {
    let first = start(0, None).await;
    let port = first.rpc_addr().port();
    let node = client(port, 64 << 20).await;
    let writer = client(port, 0).await;
    let objects = put_all(&writer).await;
    let (victim, _) = &objects[3];
    let replicas = writer.get_replica_desc(victim).await.unwrap();
    assert_eq!(replicas.len(), 1);
    let ReplicaKind::Memory(memory) = &replicas[0].kind else {
        panic!("not a memory replica")
    };
    let state = first.master().export_state();
    first.shutdown().await;
    tamper(
        &memory.transport_endpoint,
        memory.buffer_address,
        memory.size,
    );

    let second = start(port, Some(state)).await;
    wait_verified(&second).await;
    let stats = second.master().verification_stats();
    assert_eq!(
        (stats.verified, stats.mismatched),
        (objects.len() as u64 - 1, 1)
    );
    let error = writer.get(victim).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::OBJECT_NOT_FOUND, "{error}");
    assert!(!matches!(error, StoreError::ChecksumMismatch { .. }));
    assert!(!writer.is_exist(victim).await.unwrap());
    for (key, bytes) in objects.iter().filter(|(k, _)| k != victim) {
        assert!(writer.get(key).await.unwrap() == *bytes, "{key}");
    }
    assert_eq!(
        node.stats()
            .mismatched_replicas
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The dropped range is free again: the key can be written anew.
    writer
        .put(victim, b"fresh", &ReplicateConfig::default())
        .await
        .unwrap();
    assert_eq!(writer.get(victim).await.unwrap(), b"fresh");
    writer.close().await.unwrap();
    node.close().await.unwrap();
    second.shutdown().await;
}
