//! In-process helpers for the tests that drive `mooncake store` nodes with a Rust client: a
//! runtime, a client with no segment, placement on one node, and a key's memory holders.

use std::net::SocketAddr;

use mooncake_client::{StoreClient, StoreConfig};
use mooncake_common::{ReplicaKind, ReplicateConfig};

use super::StoreNode;

/// A two-worker runtime for the test's client calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A client of `master` that owns no segment.
pub async fn client(master: SocketAddr) -> StoreClient {
    StoreClient::connect(StoreConfig {
        master_addr: master.to_string(),
        global_segment_size: 0,
        ..StoreConfig::default()
    })
    .await
    .unwrap()
}

/// Placement on `node`'s segment.
pub fn on(node: &StoreNode) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segments: vec![node.name.clone()],
        ..ReplicateConfig::default()
    }
}

/// The endpoints of `key`'s memory replicas, sorted.
pub async fn holders(c: &StoreClient, key: &str) -> Vec<String> {
    let mut v: Vec<String> = c
        .get_replica_desc(key)
        .await
        .unwrap()
        .iter()
        .filter_map(|r| match &r.kind {
            ReplicaKind::Memory(mem) => Some(mem.transport_endpoint.to_string()),
            _ => None,
        })
        .collect();
    v.sort();
    v
}
