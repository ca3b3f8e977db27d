//! The node side of the disk tier, around [`DiskTier`]: the disk server readers call (methods
//! 70–71, docs/wire.md), mounting the disk at the master and advertising what it holds, the
//! offload heartbeat, and telling the master about disk evictions before their space is reused.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::BytesMut;
use mooncake_common::disk::split_storage_key;
use mooncake_common::{storage_key, DiskObject, ErrorCode};
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode, encode_into, Limits, Reply};
use mooncake_rpc::{Handler, HandlerError, RpcServer, ServerConfig};
use tokio::task::JoinSet;

use super::disk::DiskTier;
use super::{Inner, StoreClient, StoreError};
use crate::master_client::MasterError;

/// Objects per AdvertiseDiskObjects call (upstream's scan batch is 20 000 keys; a smaller batch
/// keeps each call well under the frame limit with long keys).
const ADVERTISE_BATCH: usize = 1000;

/// Serves LoadDiskObjects and ReleaseDiskObjects over a node's disk.
#[derive(Debug)]
pub(super) struct DiskServer {
    disk: Arc<DiskTier>,
    endpoint: String,
    limits: Limits,
}

impl DiskServer {
    fn serve<M: Method>(
        &self,
        body: &[u8],
        out: &mut BytesMut,
        op: impl FnOnce(&M) -> Reply<M>,
    ) -> Result<(), HandlerError> {
        let request: M =
            decode(body).map_err(|e| HandlerError::new(e.code(), format!("{}: {e}", M::NAME)))?;
        let reply = match request.check_limits(&self.limits) {
            Ok(()) => op(&request),
            Err(code) => Err(code),
        };
        encode_into(&reply, out).map_err(|e| HandlerError::new(e.code(), e.to_string()))
    }
}

impl Handler for DiskServer {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        match method {
            m::LoadDiskObjects::ID => self.serve(body, out, |r: &m::LoadDiskObjects| {
                let keys: Vec<String> = r.keys.iter().map(|k| storage_key(&r.tenant, k)).collect();
                let (batch_id, addresses) = self.disk.load(&keys, &r.sizes);
                Ok(m::LoadedDiskObjects {
                    batch_id,
                    endpoint: self.endpoint.clone(),
                    lease_ms: self.disk.lease().as_millis() as u64,
                    addresses,
                })
            }),
            m::ReleaseDiskObjects::ID => self.serve(body, out, |r: &m::ReleaseDiskObjects| {
                self.disk.release(r.batch_id);
                Ok(())
            }),
            other => Err(HandlerError::new(
                ErrorCode::NOT_SUPPORTED,
                format!("method {other} is not served by a store node's disk server"),
            )),
        }
    }
}

fn master_code(result: Result<(), MasterError>) -> Result<(), StoreError> {
    result.map_err(StoreError::from)
}

impl StoreClient {
    /// Starts the disk server on this client's host (port 0), mounts the disk at the master,
    /// advertises what it holds, installs the eviction listener and starts the offload heartbeat.
    pub(super) async fn start_disk(&self, disk: Arc<DiskTier>) -> Result<RpcServer, StoreError> {
        let host = super::transfer_bind(&self.inner.config.local_hostname)?;
        let mut addr = host.addr;
        addr.set_port(0);
        let server_config = ServerConfig {
            auth_token: self.inner.peer_rpc.auth_token.clone(),
            ..ServerConfig::default()
        };
        let handler = Arc::new(DiskServer {
            disk: disk.clone(),
            endpoint: self.endpoint(),
            limits: Limits::default(),
        });
        let server = RpcServer::bind(addr, handler, server_config)
            .await
            .map_err(|e| {
                StoreError::InvalidParams(format!("disk server: cannot bind {addr}: {e}"))
            })?;
        let advertised_host = host.advertise.unwrap_or_else(|| addr.ip().to_string());
        let endpoint = format!("{advertised_host}:{}", server.local_addr().port());
        *self.inner.disk_endpoint.lock() = endpoint;
        self.mount_disk().await?;
        let weak = Arc::downgrade(&self.inner);
        let runtime = tokio::runtime::Handle::current();
        disk.backend()
            .set_eviction_listener(Box::new(move |keys| evicted(&weak, &runtime, keys)));
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(offload_loop(weak));
        Ok(server)
    }

    /// MountLocalDisk, then AdvertiseDiskObjects for every object the backend holds.
    async fn mount_disk(&self) -> Result<(), StoreError> {
        let Some(disk) = self.inner.disk.clone() else {
            return Ok(());
        };
        let usage = disk.backend().usage();
        let endpoint = self.inner.disk_endpoint.lock().clone();
        master_code(
            self.inner
                .master
                .call(&m::MountLocalDisk {
                    client: self.client_id(),
                    endpoint,
                    capacity_bytes: usage.capacity_bytes,
                    used_bytes: usage.used_bytes,
                })
                .await,
        )?;
        let objects: Vec<DiskObject> = disk
            .backend()
            .scan()
            .into_iter()
            .filter_map(|o| {
                let (tenant, key) = split_storage_key(&o.key)?;
                Some(DiskObject {
                    tenant: tenant.to_string(),
                    key: key.to_string(),
                    size: o.size_bytes,
                })
            })
            .collect();
        for chunk in objects.chunks(ADVERTISE_BATCH) {
            let results = self
                .inner
                .master
                .call(&m::AdvertiseDiskObjects {
                    client: self.client_id(),
                    objects: chunk.to_vec(),
                })
                .await?;
            let refused = results.iter().filter(|r| r.is_err()).count();
            if refused > 0 {
                tracing::info!(
                    refused,
                    "disk objects the master did not take (removed, another value, or a bad tenant)"
                );
            }
            // Removed while on this disk: delete them, so no later advertisement revives them.
            let removed: Vec<DiskObject> = chunk
                .iter()
                .zip(&results)
                .filter(|(_, r)| matches!(r, Err(ErrorCode::OBJECT_NOT_FOUND)))
                .map(|(o, _)| o.clone())
                .collect();
            self.report_deleted(delete_records(&disk, removed).await?)
                .await?;
        }
        Ok(())
    }

    /// NotifyDiskDrops for `gone` (nothing to say when empty).
    async fn report_deleted(&self, gone: Vec<DiskObject>) -> Result<(), StoreError> {
        if gone.is_empty() {
            return Ok(());
        }
        self.inner
            .master
            .call(&m::NotifyDiskDrops {
                client: self.client_id(),
                objects: gone,
            })
            .await?;
        Ok(())
    }

    /// Deletes the records of objects removed at the master (TakeDiskDrops) and reports them
    /// gone (NotifyDiskDrops), while full batches come.
    async fn drop_once(&self, disk: &Arc<DiskTier>) -> Result<(), StoreError> {
        loop {
            let drops = self
                .inner
                .master
                .call(&m::TakeDiskDrops {
                    client: self.client_id(),
                    max: DROPS_PER_HEARTBEAT,
                })
                .await?;
            let full = drops.len() as u64 >= DROPS_PER_HEARTBEAT;
            if drops.is_empty() {
                return Ok(());
            }
            self.report_deleted(delete_records(disk, drops).await?)
                .await?;
            if !full {
                return Ok(());
            }
        }
    }
}

/// Records taken per TakeDiskDrops call.
const DROPS_PER_HEARTBEAT: u64 = 1024;

/// Deletes `objects`' records from `disk` (on a blocking thread); the ones that are gone.
async fn delete_records(
    disk: &Arc<DiskTier>,
    objects: Vec<DiskObject>,
) -> Result<Vec<DiskObject>, StoreError> {
    if objects.is_empty() {
        return Ok(objects);
    }
    let disk = disk.clone();
    tokio::task::spawn_blocking(move || {
        let keys: Vec<String> = objects
            .iter()
            .map(|o| storage_key(&o.tenant, &o.key))
            .collect();
        let gone = disk.delete(&keys);
        objects
            .into_iter()
            .zip(gone)
            .filter_map(|(o, gone)| gone.then_some(o))
            .collect()
    })
    .await
    .map_err(|e| StoreError::InvalidParams(format!("disk delete worker: {e}")))
}

/// The backend evicted `keys`: tell the master before their space is reused (the listener runs
/// on the blocking thread that called `put_batch`, never on a runtime worker).
fn evicted(inner: &Weak<Inner>, runtime: &tokio::runtime::Handle, keys: &[String]) {
    let Some(inner) = inner.upgrade() else { return };
    let objects: Vec<DiskObject> = keys
        .iter()
        .filter_map(|k| {
            let (tenant, key) = split_storage_key(k)?;
            Some(DiskObject {
                tenant: tenant.to_string(),
                key: key.to_string(),
                size: 0,
            })
        })
        .collect();
    if let Some(disk) = &inner.disk {
        disk.stats()
            .evicted
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
    }
    let request = m::EvictDiskObjects {
        client: inner.client_id,
        objects,
    };
    if let Err(error) = runtime.block_on(inner.master.call(&request)) {
        // A reader the master still sends here gets OBJECT_NOT_FOUND: a clean miss.
        tracing::warn!(%error, "could not tell the master about evicted disk objects");
    }
}

/// The offload heartbeat: take tasks, write them, answer them; at once again while tasks come
/// (up to `offload_writes` batches being written), else after `offload_interval`. Each batch is
/// one `put_batch` (its writes, then its own `fdatasync`) answered only once that returned; with
/// two in flight one batch's sync (device time) overlaps the next batch's checksum and copy
/// (CPU time) without weakening what an acknowledged task means.
/// Disk drops and promotions run between batches, with no offload write in flight (a record
/// deleted after a newer offload of its key would lose the newer). Re-mounts the disk when the
/// master lost it.
async fn offload_loop(inner: Weak<Inner>) {
    let mut writes: JoinSet<()> = JoinSet::new();
    let mut last_drops: Option<Instant> = None;
    loop {
        let open = inner
            .upgrade()
            .filter(|s| !s.closed.load(Ordering::Acquire))
            .and_then(|s| Some((s.disk.clone()?, s)));
        let Some((disk, strong)) = open else {
            // Closing: the batches being written are answered first.
            while writes.join_next().await.is_some() {}
            return;
        };
        let client = StoreClient {
            inner: strong,
            heartbeat: Default::default(),
        };
        let interval = disk.config().offload_interval;
        if writes.is_empty() || last_drops.is_none_or(|at| at.elapsed() >= interval) {
            // Drops first: wait for the batches being written.
            while writes.join_next().await.is_some() {}
            if let Err(error) = client.drop_once(&disk).await {
                tracing::debug!(%error, "disk drop heartbeat failed");
            }
            if let Err(error) = client.promote_once(&disk).await {
                tracing::debug!(%error, "promotion heartbeat failed");
            }
            last_drops = Some(Instant::now());
        }
        let took = match client.start_offload(&disk, &mut writes).await {
            Ok(n) => n,
            Err(StoreError::Master(MasterError::Master(ErrorCode::SEGMENT_NOT_FOUND))) => {
                if let Err(error) = client.mount_disk().await {
                    tracing::warn!(%error, "re-mounting the disk failed");
                }
                0
            }
            Err(error) => {
                tracing::debug!(%error, "offload heartbeat failed");
                0
            }
        };
        drop(client);
        if writes.len() >= disk.config().offload_writes.max(1) || (took == 0 && !writes.is_empty())
        {
            // More tasks gather at the master while a batch is written: ask again once it is.
            writes.join_next().await;
        } else if took == 0 {
            tokio::time::sleep(interval).await;
        }
    }
}

/// Promotion tasks taken per heartbeat (upstream's `promotion_max_per_heartbeat` is 1; a load is
/// one disk read, so a few at once keep the heartbeat short).
const PROMOTIONS_PER_HEARTBEAT: u64 = 8;

impl StoreClient {
    /// The memory segments of this node (cheap handles).
    fn segment_memory(&self) -> Vec<mooncake_transfer::MemoryHandle> {
        self.inner
            .segments
            .lock()
            .iter()
            .map(|s| s.memory.clone())
            .collect()
    }

    /// One promotion step: take tasks, load each object into its new memory replica, answer.
    async fn promote_once(&self, disk: &Arc<DiskTier>) -> Result<usize, StoreError> {
        let tasks = self
            .inner
            .master
            .call(&m::PromotionHeartbeat {
                client: self.client_id(),
                max_tasks: PROMOTIONS_PER_HEARTBEAT,
            })
            .await?;
        if tasks.is_empty() {
            return Ok(0);
        }
        let segments = self.segment_memory();
        let loader = disk.clone();
        let n = tasks.len();
        let outcomes = tokio::task::spawn_blocking(move || loader.promote(&tasks, &segments))
            .await
            .map_err(|e| StoreError::InvalidParams(format!("promotion worker: {e}")))?;
        self.inner
            .master
            .call(&m::NotifyPromotion {
                client: self.client_id(),
                outcomes,
            })
            .await?;
        Ok(n)
    }

    /// Takes offload tasks and starts writing them (on a blocking thread) and answering them
    /// (NotifyOffload) in `writes`; returns how many tasks it took.
    async fn start_offload(
        &self,
        disk: &Arc<DiskTier>,
        writes: &mut JoinSet<()>,
    ) -> Result<usize, StoreError> {
        let tasks = self
            .inner
            .master
            .call(&m::OffloadHeartbeat {
                client: self.client_id(),
                max_tasks: disk.config().offload_batch,
                used_bytes: disk.backend().usage().used_bytes,
            })
            .await?;
        if tasks.is_empty() {
            return Ok(0);
        }
        let n = tasks.len();
        let segments = self.segment_memory();
        let writer = disk.clone();
        let inner = self.inner.clone();
        let client = self.client_id();
        writes.spawn(async move {
            let outcomes =
                tokio::task::spawn_blocking(move || writer.offload(&tasks, &segments)).await;
            let outcomes = match outcomes {
                Ok(outcomes) => outcomes,
                // A task never answered keeps its pin until the node expires (the master counts
                // it dropped then).
                Err(error) => return tracing::warn!(%error, "offload worker failed"),
            };
            let answer = m::NotifyOffload { client, outcomes };
            if let Err(error) = inner.master.call(&answer).await {
                tracing::warn!(%error, "answering offload tasks failed");
            }
        });
        Ok(n)
    }
}
