//! The reply rules of the op-log (crate::oplog) through the real RPC server: replies held until
//! durable while the connection keeps serving, many held calls in one batch, a fenced log
//! failing every held reply, and a grant that waits only for the removals whose space it could
//! take. Durability is marked by the test in place of the etcd writer.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaDescriptor, ReplicaType, ReplicateConfig, SystemClock,
};
use mooncake_master::bench_support::segment;
use mooncake_master::MasterService;
use mooncake_oplog::OpLogSink;
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode, encode, Limits, Reply};
use mooncake_rpc::{ClientConfig, RpcClient, RpcServer, ServerConfig};
use tokio::task::JoinHandle;

use crate::config::OpLogAck;
use crate::oplog::{OpLogHandle, OpLogSlot};
use crate::rpc_dispatch::MasterRpc;

const CLIENT: ClientId = ClientId::new(7, 7);
const VALUE: u64 = 4096;

struct Fixture {
    master: Arc<MasterService>,
    sink: Arc<OpLogSink>,
    handle: Arc<OpLogHandle>,
    server: RpcServer,
}

impl Fixture {
    /// A master with one mounted segment, its op-log durable up to now, served over loopback.
    async fn start(ack: OpLogAck) -> Fixture {
        let master =
            Arc::new(MasterService::new(Default::default(), Arc::new(SystemClock::new())).unwrap());
        let sink = Arc::new(OpLogSink::new(0));
        master.set_observer(sink.clone()).unwrap();
        master.mount_segment(&segment(0, 1 << 24), CLIENT).unwrap();
        sink.mark_durable(sink.assigned_seq());
        let handle = OpLogHandle::unwritten(sink.clone(), ack, Duration::from_secs(60));
        let slot = Arc::new(OpLogSlot::new());
        slot.set(handle.clone()).unwrap();
        let rpc =
            MasterRpc::new(master.clone(), Arc::default(), Limits::default()).with_oplog(slot);
        let server = RpcServer::bind(
            "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            Arc::new(rpc),
            ServerConfig::default(),
        )
        .await
        .unwrap();
        Fixture {
            master,
            sink,
            handle,
            server,
        }
    }

    fn client(&self) -> Arc<RpcClient> {
        let config = ClientConfig {
            call_timeout: Duration::from_secs(60),
            ..ClientConfig::default()
        };
        Arc::new(RpcClient::new(self.server.local_addr(), config))
    }

    /// Polls until the master has numbered `seq` mutations (30 s at most).
    async fn numbered(&self, seq: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.sink.assigned_seq() < seq {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the master applied {} of {seq} mutations while replies were held",
                self.sink.assigned_seq()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn call<M: Method>(client: &RpcClient, request: M) -> Reply<M> {
    let body = encode(&request).unwrap();
    let answer = client.call(M::ID, &body).await.unwrap();
    decode::<Reply<M>>(&answer).unwrap()
}

fn spawn_call<M: Method + Send + 'static>(
    client: &Arc<RpcClient>,
    request: M,
) -> JoinHandle<Reply<M>> {
    let client = client.clone();
    tokio::spawn(async move { call(&client, request).await })
}

fn put_start(key: &str) -> m::PutStart {
    m::PutStart {
        client: CLIENT,
        key: key.to_string(),
        value_len: VALUE,
        config: ReplicateConfig::default(),
        tenant: String::new(),
    }
}

fn put_end(key: &str) -> m::PutEnd {
    m::PutEnd {
        client: CLIENT,
        meta: ObjectMeta::new(key),
        replica_type: ReplicaType::MEMORY,
        tenant: String::new(),
    }
}

fn address(replicas: &[ReplicaDescriptor]) -> u64 {
    replicas[0].memory().unwrap().buffer_address
}

/// Gives the held calls a moment to (wrongly) finish, then checks that none did.
async fn still_held<T>(calls: &[JoinHandle<T>]) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let done = calls.iter().filter(|c| c.is_finished()).count();
    assert_eq!(
        done, 0,
        "{done} replies left before their change was durable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_durable_calls_are_all_held_then_answered_from_one_batch() {
    let f = Fixture::start(OpLogAck::Durable).await;
    let client = f.client();
    let keys: Vec<String> = (0..32).map(|i| format!("k{i}")).collect();
    // Grants after no removal reply at once, although nothing they did is durable.
    for key in &keys {
        call(&client, put_start(key)).await.unwrap();
    }
    assert!(f.sink.durable_seq() < f.sink.assigned_seq());
    let before = f.sink.assigned_seq();
    let ends: Vec<_> = keys
        .iter()
        .map(|k| spawn_call(&client, put_end(k)))
        .collect();
    // All 32 PutEnds are applied on the one connection while the first reply is held.
    f.numbered(before + 32).await;
    still_held(&ends).await;
    let batch = f.sink.take(Duration::from_secs(1)).unwrap();
    assert_eq!(
        batch.last_seq(),
        f.sink.assigned_seq(),
        "one batch takes every waiting entry"
    );
    assert!(batch.count >= 32);
    f.sink.mark_durable(batch.last_seq());
    for end in ends {
        assert_eq!(end.await.unwrap(), Ok(()));
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_log_fails_every_held_reply_with_unavailable() {
    let f = Fixture::start(OpLogAck::Durable).await;
    let client = f.client();
    let keys: Vec<String> = (0..16).map(|i| format!("f{i}")).collect();
    for key in &keys {
        call(&client, put_start(key)).await.unwrap();
    }
    let before = f.sink.assigned_seq();
    let ends: Vec<_> = keys
        .iter()
        .map(|k| spawn_call(&client, put_end(k)))
        .collect();
    f.numbered(before + 16).await;
    still_held(&ends).await;
    f.handle.fence();
    for end in ends {
        assert_eq!(
            end.await.unwrap(),
            Err(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
        );
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_start_waits_for_the_removal_whose_space_it_takes() {
    let f = Fixture::start(OpLogAck::Visible).await;
    let client = f.client();
    let first = call(&client, put_start("old")).await.unwrap();
    call(&client, put_end("old")).await.unwrap();
    f.sink.mark_durable(f.sink.assigned_seq());
    // The removal replies at once in visible mode but is not durable.
    call(
        &client,
        m::Remove {
            key: "old".into(),
            force: true,
            tenant: String::new(),
        },
    )
    .await
    .unwrap();
    let removal = f.sink.assigned_seq();
    assert!(f.sink.durable_seq() < removal);
    let grant = spawn_call(&f.client(), put_start("new"));
    f.numbered(removal + 1).await;
    still_held(std::slice::from_ref(&grant)).await;
    f.sink.mark_durable(removal);
    let second = grant.await.unwrap().unwrap();
    // It was given the removed object's space, once the removal was durable.
    assert_eq!(address(&second), address(&first));
    assert!(f.master.exist_key("new", "").is_ok());
    f.server.shutdown().await;
}
