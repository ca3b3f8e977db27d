//! Reading LOCAL_DISK replicas: one LoadDiskObjects request per owning node for all the keys a
//! read plan wants from it; the node loads them into its staging memory and answers their
//! addresses, which the plan then reads like memory replicas (one transfer batch, checksummed as
//! the bytes land); the loads are released once the batch is done.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::{MemoryDescriptor, ReplicaDescriptor, ReplicaKind};
use mooncake_proto::methods as m;

use super::read::PlannedRead;
use super::{StoreClient, StoreError};
use crate::master_client::MasterClient;

/// What staging the disk entries of a plan gave: per tag, the memory descriptor to read instead
/// (with the lease deadline) or the error; and the loads to release afterwards.
#[derive(Debug, Default)]
pub(super) struct StagedDisk {
    pub by_tag: HashMap<usize, Result<(ReplicaDescriptor, Instant), StoreError>>,
    pub loads: Vec<(Arc<MasterClient>, u64)>,
}

impl StoreClient {
    /// A client of the disk server at `endpoint` (`host:port`), cached.
    fn disk_peer(&self, endpoint: &str) -> Result<Arc<MasterClient>, StoreError> {
        if let Some(peer) = self.inner.disk_peers.lock().get(endpoint) {
            return Ok(peer.clone());
        }
        let addr = endpoint
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| StoreError::InvalidParams(format!("disk endpoint {endpoint:?}")))?;
        let peer = Arc::new(MasterClient::new(addr, self.inner.peer_rpc.clone()));
        self.inner
            .disk_peers
            .lock()
            .insert(endpoint.to_string(), peer.clone());
        Ok(peer)
    }

    /// Loads the LOCAL_DISK entries of `plan` at their nodes (one request per node).
    pub(super) async fn stage_disk_reads(&self, plan: &[PlannedRead<'_>]) -> StagedDisk {
        let mut staged = StagedDisk::default();
        let mut by_node: HashMap<&str, Vec<(usize, &str, u64)>> = HashMap::new();
        for (tag, _, len, replica, key) in plan {
            if let ReplicaKind::LocalDisk(d) = &replica.kind {
                by_node
                    .entry(d.transport_endpoint.as_str())
                    .or_default()
                    .push((*tag, *key, *len as u64));
            }
        }
        for (endpoint, items) in by_node {
            let asked = Instant::now();
            let answer = match self.disk_peer(endpoint) {
                Ok(peer) => {
                    let request = m::LoadDiskObjects {
                        tenant: self.tenant().to_string(),
                        keys: items.iter().map(|(_, k, _)| k.to_string()).collect(),
                        sizes: items.iter().map(|(_, _, n)| *n).collect(),
                    };
                    peer.call(&request)
                        .await
                        .map(|loaded| (peer, loaded))
                        .map_err(StoreError::from)
                }
                Err(error) => Err(error),
            };
            let (peer, loaded) = match answer {
                Ok(answer) => answer,
                Err(error) => {
                    for (tag, ..) in items {
                        staged.by_tag.insert(tag, Err(error.clone()));
                    }
                    continue;
                }
            };
            self.inner
                .stats
                .offload_rpc_reads
                .fetch_add(1, Ordering::Relaxed);
            let deadline = asked + Duration::from_millis(loaded.lease_ms);
            let endpoint: Arc<str> = Arc::from(loaded.endpoint.as_str());
            let protocol: Arc<str> = Arc::from("tcp");
            for (i, (tag, key, size)) in items.into_iter().enumerate() {
                let result = match loaded.addresses.get(i) {
                    Some(Ok(address)) => Ok((
                        ReplicaDescriptor {
                            id: mooncake_common::ReplicaId(0),
                            status: mooncake_common::ReplicaStatus::COMPLETE,
                            kind: ReplicaKind::Memory(MemoryDescriptor {
                                size,
                                buffer_address: *address,
                                protocol: protocol.clone(),
                                transport_endpoint: endpoint.clone(),
                            }),
                        },
                        deadline,
                    )),
                    Some(Err(code)) => Err(StoreError::from(
                        crate::master_client::MasterError::Master(*code),
                    )),
                    None => Err(StoreError::NoReadableReplica {
                        key: key.to_string(),
                    }),
                };
                staged.by_tag.insert(tag, result);
            }
            staged.loads.push((peer, loaded.batch_id));
        }
        staged
    }

    /// Releases the loads of a finished plan (in the background: the reader does not wait).
    pub(super) fn release_disk_loads(&self, loads: Vec<(Arc<MasterClient>, u64)>) {
        if loads.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for (peer, batch_id) in loads {
                let _ = peer.call(&m::ReleaseDiskObjects { batch_id }).await;
            }
        });
    }
}
