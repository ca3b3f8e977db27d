//! `MasterClient`'s two-phase write requests against an in-process master on 127.0.0.1:0: each
//! `WriteMode` sends its own start (a put of an existing key is refused, an upsert replaces it),
//! and every end and revoke, single or batch, has its effect on the key.
#![allow(clippy::unwrap_used)]

use mooncake_client::{MasterError, StoreClient, StoreConfig, WriteMode};
use mooncake_common::{ErrorCode, ObjectMeta, ReplicateConfig};
use mooncake_server::{MasterConfig, RunningMaster};

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

fn refused(code: ErrorCode) -> impl Fn(&MasterError) -> bool {
    move |error| matches!(error, MasterError::Master(c) if *c == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_mode_sends_its_own_requests() {
    let master = start_master().await;
    // A node with a segment, so starts can allocate; its master client sends the requests.
    let node = StoreClient::connect(StoreConfig {
        master_addr: master.rpc_addr().to_string(),
        local_hostname: "127.0.0.1".into(),
        global_segment_size: 8 << 20,
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let (mc, me, config) = (node.master(), node.client_id(), ReplicateConfig::default());
    let tenant = "";

    // Single key: put start → end makes it visible; a second put start is refused, an upsert
    // start of the same key is granted and its end makes the key visible again.
    let replicas = mc
        .write_start(WriteMode::Put, me, "k", 100, &config, tenant)
        .await
        .unwrap();
    assert_eq!(replicas.len(), 1);
    mc.write_end(WriteMode::Put, me, ObjectMeta::new("k"), tenant)
        .await
        .unwrap();
    assert!(mc.exist_key("k", tenant).await.unwrap());
    let again = mc
        .write_start(WriteMode::Put, me, "k", 100, &config, tenant)
        .await
        .unwrap_err();
    assert!(refused(ErrorCode::OBJECT_ALREADY_EXISTS)(&again), "{again}");
    mc.write_start(WriteMode::Upsert, me, "k", 100, &config, tenant)
        .await
        .unwrap();
    mc.write_end(WriteMode::Upsert, me, ObjectMeta::new("k"), tenant)
        .await
        .unwrap();
    assert!(mc.exist_key("k", tenant).await.unwrap());
    // Revoke, in either mode, abandons a started write: the key never becomes visible.
    for (mode, key) in [(WriteMode::Put, "r1"), (WriteMode::Upsert, "r2")] {
        mc.write_start(mode, me, key, 100, &config, tenant)
            .await
            .unwrap();
        mc.write_revoke(mode, me, key, tenant).await.unwrap();
        assert!(!mc.exist_key(key, tenant).await.unwrap(), "{mode:?} {key}");
        let ended = mc
            .write_end(mode, me, ObjectMeta::new(key), tenant)
            .await
            .unwrap_err();
        assert!(
            refused(ErrorCode::OBJECT_NOT_FOUND)(&ended),
            "{mode:?}: {ended}"
        );
    }

    // Batches: the same, one answer per key in order.
    let keys = |names: &[&str]| names.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let metas = |names: &[&str]| {
        names
            .iter()
            .map(|&k| ObjectMeta::new(k))
            .collect::<Vec<_>>()
    };
    let started = mc
        .batch_write_start(
            WriteMode::Put,
            me,
            keys(&["b1", "b2"]),
            vec![10, 20],
            &config,
            tenant,
        )
        .await
        .unwrap();
    assert!(started.iter().all(Result::is_ok), "{started:?}");
    let ended = mc
        .batch_write_end(WriteMode::Put, me, metas(&["b1", "b2"]), tenant)
        .await
        .unwrap();
    assert_eq!(ended, vec![Ok(()), Ok(())]);
    let again = mc
        .batch_write_start(
            WriteMode::Put,
            me,
            keys(&["b1", "b3"]),
            vec![10, 30],
            &config,
            tenant,
        )
        .await
        .unwrap();
    assert_eq!(
        again[0].as_ref().unwrap_err(),
        &ErrorCode::OBJECT_ALREADY_EXISTS
    );
    assert!(again[1].is_ok(), "{again:?}");
    let revoked = mc
        .batch_write_revoke(WriteMode::Put, me, keys(&["b3"]), tenant)
        .await
        .unwrap();
    assert_eq!(revoked, vec![Ok(())]);
    assert!(!mc.exist_key("b3", tenant).await.unwrap());
    let upserted = mc
        .batch_write_start(
            WriteMode::Upsert,
            me,
            keys(&["b1", "b4"]),
            vec![10, 40],
            &config,
            tenant,
        )
        .await
        .unwrap();
    assert!(upserted.iter().all(Result::is_ok), "{upserted:?}");
    let ended = mc
        .batch_write_end(WriteMode::Upsert, me, metas(&["b1"]), tenant)
        .await
        .unwrap();
    assert_eq!(ended, vec![Ok(())]);
    let revoked = mc
        .batch_write_revoke(WriteMode::Upsert, me, keys(&["b4"]), tenant)
        .await
        .unwrap();
    assert_eq!(revoked, vec![Ok(())]);
    assert!(mc.exist_key("b1", tenant).await.unwrap());
    assert!(!mc.exist_key("b4", tenant).await.unwrap());

    node.close().await.unwrap();
    master.shutdown().await;
}
