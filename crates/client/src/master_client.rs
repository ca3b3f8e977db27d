//! `MasterClient`: typed, pipelined calls to the master over one reused connection.
//!
//! Every method of `mooncake_proto::methods` is one `call`; the convenience wrappers below cover
//! what the store client uses. The two-phase writes take a [`WriteMode`]: each start, end and
//! revoke request (single and batch) of a put or an upsert is built in one method here.
//!
//! Errors are typed: a transport failure (`Rpc`, with `RPC_FAIL` or `RPC_TIMEOUT`) is kept apart
//! from the master refusing the operation (`Master`, with upstream's code, e.g.
//! `OBJECT_NOT_FOUND`).

use mooncake_common::{
    ClientId, ErrorCode, GetReplicaListResponse, ObjectMeta, PingResponse, ReplicaDescriptor,
    ReplicaId, ReplicaType, ReplicateConfig, Segment, SegmentId,
};
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode, encode, CodecError, Reply};
use mooncake_rpc::{ClientConfig, RpcClient, RpcError};
use parking_lot::RwLock;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::leader::EtcdLeader;
use thiserror::Error;

/// Why a master call failed.
#[derive(Debug, Clone, Error)]
pub enum MasterError {
    /// The master answered and refused the operation.
    #[error("master refused: {0}")]
    Master(ErrorCode),
    /// The call did not complete (connection, timeout, protocol).
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error(transparent)]
    Codec(#[from] CodecError),
}

impl MasterError {
    /// The upstream error code a caller (or Python) sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            MasterError::Master(code) => *code,
            MasterError::Rpc(error) => error.code(),
            MasterError::Codec(error) => error.code(),
        }
    }
}

/// Which two-phase write a request belongs to: a put (write-once: an existing key is refused
/// with OBJECT_ALREADY_EXISTS) or an upsert (replace). The requests of both carry the same
/// fields, except that the batch end and revoke of an upsert have no replica type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    Put,
    Upsert,
}

/// Sends the put or the upsert form of one request. The two request types carry the same
/// fields, so the request is written once: `call_by_mode!(self, mode, A or B { fields })`.
macro_rules! call_by_mode {
    ($client:ident, $mode:expr, $put:ident or $upsert:ident { $($field:ident),* $(,)? }) => {
        match $mode {
            WriteMode::Put => $client.call(&m::$put { $($field),* }).await,
            WriteMode::Upsert => $client.call(&m::$upsert { $($field),* }).await,
        }
    };
}

async fn call_at<M: Method>(rpc: &RpcClient, body: &[u8]) -> Result<M::Output, MasterError> {
    let answer = rpc.call(M::ID, body).await?;
    let reply: Reply<M> = decode(&answer)?;
    reply.map_err(MasterError::Master)
}

/// The socket address of a leader key's value.
fn leader_addr(address: &str) -> Result<SocketAddr, MasterError> {
    use std::net::ToSocketAddrs;
    address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            tracing::warn!("the leader key names {address:?}, which is not an address");
            MasterError::Master(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS)
        })
}

/// A typed client of the master: one address, the masters of a high-availability group of
/// which one leads, or the leader etcd names (docs/ha.md, "Clients").
///
/// With several masters, calls go to the one that answered last. A call that a master refused
/// with `UNAVAILABLE_IN_CURRENT_STATUS` (a standby, or a leader that stepped down: it applied
/// nothing) or that could not connect is sent to the next master at once, each master once at
/// most. A call whose connection broke or timed out after it was sent is not resent (it may
/// have been applied): it fails, and the next call starts at the next master. Following etcd,
/// such a failure reads the leader key again and switches to a leader with a higher view
/// (never a lower one); a call that was not applied is then sent to it once.
#[derive(Debug)]
pub struct MasterClient {
    masters: RwLock<Arc<Vec<RpcClient>>>,
    current: AtomicUsize,
    config: ClientConfig,
    discovery: Option<Discovery>,
}

/// The leader key this client follows and the highest view it saw.
#[derive(Debug)]
struct Discovery {
    etcd: EtcdLeader,
    view: AtomicU64,
    reading: tokio::sync::Mutex<()>,
}

/// The master refused the call or could not be reached before the call was sent: nothing was
/// applied.
fn not_applied(error: &MasterError) -> bool {
    error.code() == ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
        || matches!(error, MasterError::Rpc(RpcError::Connect { .. }))
}

/// The call may have failed because this master is not (or no longer) the leader.
fn moved(error: &MasterError) -> bool {
    not_applied(error)
        || error.code() == ErrorCode::RPC_FAIL
        || error.code() == ErrorCode::RPC_TIMEOUT
}

impl MasterClient {
    /// A client of the master at `addr`; connects on first use and reconnects after failures.
    pub fn new(addr: SocketAddr, config: ClientConfig) -> Self {
        Self::with_masters(&[addr], config)
    }

    /// A client of a group of masters, one of which leads (at least one address).
    pub fn with_masters(addrs: &[SocketAddr], config: ClientConfig) -> Self {
        MasterClient {
            masters: RwLock::new(Arc::new(
                addrs
                    .iter()
                    .map(|&a| RpcClient::new(a, config.clone()))
                    .collect(),
            )),
            current: AtomicUsize::new(0),
            config,
            discovery: None,
        }
    }

    /// A client of the leader `etcd` names now, following it to every later leader. Fails
    /// with `UNAVAILABLE_IN_CURRENT_STATUS` when no master leads.
    pub async fn following(etcd: EtcdLeader, config: ClientConfig) -> Result<Self, MasterError> {
        let view = etcd.read().await.map_err(|why| {
            tracing::warn!("{why}");
            MasterError::Master(ErrorCode::ETCD_OPERATION_ERROR)
        })?;
        let view = view.ok_or(MasterError::Master(
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        ))?;
        let addr = leader_addr(&view.address)?;
        let mut client = Self::with_masters(&[addr], config);
        client.discovery = Some(Discovery {
            etcd,
            view: AtomicU64::new(view.version),
            reading: tokio::sync::Mutex::new(()),
        });
        Ok(client)
    }

    fn list(&self) -> Arc<Vec<RpcClient>> {
        self.masters.read().clone()
    }

    /// The address of the master calls go to now.
    pub fn addr(&self) -> SocketAddr {
        let list = self.list();
        list[self.current.load(Ordering::Relaxed) % list.len()].addr()
    }

    /// How often a caller read its own answer from the socket (see `RpcClient::caller_reads`).
    pub fn caller_reads(&self) -> u64 {
        self.list().iter().map(RpcClient::caller_reads).sum()
    }

    /// How calls to the current master waited for their answers (see `RpcClient::poll_stats`).
    pub fn poll_stats(&self) -> mooncake_rpc::PollStats {
        let list = self.list();
        list[self.current.load(Ordering::Relaxed) % list.len()].poll_stats()
    }

    /// Sends any master request and returns its output.
    pub async fn call<M: Method>(&self, request: &M) -> Result<M::Output, MasterError> {
        let body = encode(request)?;
        let list = self.list();
        let result = self.call_listed::<M>(&list, &body).await;
        let (Some(d), Err(error)) = (&self.discovery, &result) else {
            return result;
        };
        if moved(error) && self.follow(d, &list).await && not_applied(error) {
            return self.call_listed::<M>(&self.list(), &body).await;
        }
        result
    }

    /// Reads the leader key again; switches to a leader with a higher view. Returns whether
    /// calls now go elsewhere than `failed`.
    async fn follow(&self, d: &Discovery, failed: &Arc<Vec<RpcClient>>) -> bool {
        let _one_reader = d.reading.lock().await;
        if !Arc::ptr_eq(failed, &self.list()) {
            return true; // another call switched already
        }
        let view = match d.etcd.read().await {
            Ok(Some(view)) if view.version > d.view.load(Ordering::Relaxed) => view,
            Ok(_) => return false,
            Err(why) => {
                tracing::warn!("{why}");
                return false;
            }
        };
        let Ok(addr) = leader_addr(&view.address) else {
            return false;
        };
        tracing::info!(leader = %addr, view = view.version, "following the new leader");
        *self.masters.write() = Arc::new(vec![RpcClient::new(addr, self.config.clone())]);
        self.current.store(0, Ordering::Relaxed);
        d.view.store(view.version, Ordering::Relaxed);
        true
    }

    async fn call_listed<M: Method>(
        &self,
        list: &[RpcClient],
        body: &[u8],
    ) -> Result<M::Output, MasterError> {
        let n = list.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut i = 0;
        loop {
            let at = (first + i) % n;
            let result = call_at::<M>(&list[at], body).await;
            let Err(error) = &result else {
                return result;
            };
            if n == 1 {
                return result;
            }
            let next = (at + 1) % n;
            let _ = self
                .current
                .compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed);
            i += 1;
            if !moved(error) {
                // The master answered: it is the right one.
                let _ =
                    self.current
                        .compare_exchange(next, at, Ordering::Relaxed, Ordering::Relaxed);
                return result;
            }
            if !not_applied(error) || i == n {
                return result;
            }
        }
    }

    pub async fn service_ready(&self) -> Result<String, MasterError> {
        self.call(&m::ServiceReady {}).await
    }

    pub async fn ping(&self, client: ClientId) -> Result<PingResponse, MasterError> {
        self.call(&m::Ping { client }).await
    }

    /// ReportTransferFailure: this client failed to move bytes to a segment served at
    /// `endpoint`; the master stops placing new replicas there until its owner pings. Returns
    /// how many segments became suspected (a master without the method answers NOT_SUPPORTED).
    pub async fn report_transfer_failure(
        &self,
        client: ClientId,
        endpoint: &str,
    ) -> Result<u64, MasterError> {
        let endpoint = endpoint.to_string();
        self.call(&m::ReportTransferFailure { client, endpoint })
            .await
    }

    pub async fn mount_segment(
        &self,
        segment: Segment,
        client: ClientId,
    ) -> Result<(), MasterError> {
        self.call(&m::MountSegment { segment, client }).await
    }

    pub async fn remount_segments(
        &self,
        segments: Vec<Segment>,
        client: ClientId,
    ) -> Result<(), MasterError> {
        self.call(&m::ReMountSegment { segments, client }).await
    }

    /// Restored replicas of `segment_id` waiting for this client's checksum check, ids above
    /// `after` (method 44, docs/wire.md).
    pub async fn get_unverified_replicas(
        &self,
        client: ClientId,
        segment_id: SegmentId,
        after: ReplicaId,
        limit: u64,
    ) -> Result<Vec<m::UnverifiedReplica>, MasterError> {
        self.call(&m::GetUnverifiedReplicas {
            client,
            segment_id,
            after,
            limit,
        })
        .await
    }

    /// This client's verdicts on restored replicas of `segment_id` (method 45).
    pub async fn confirm_replicas(
        &self,
        client: ClientId,
        segment_id: SegmentId,
        verified: Vec<ReplicaId>,
        mismatched: Vec<ReplicaId>,
    ) -> Result<m::ConfirmReplicasResponse, MasterError> {
        self.call(&m::ConfirmReplicas {
            client,
            segment_id,
            verified,
            mismatched,
        })
        .await
    }

    pub async fn unmount_segment(
        &self,
        segment_id: SegmentId,
        client: ClientId,
    ) -> Result<(), MasterError> {
        self.call(&m::UnmountSegment { segment_id, client }).await
    }

    /// Unmounts a segment after `grace_period_ms`, during which its objects stay readable but
    /// nothing new is placed there.
    pub async fn graceful_unmount_segment(
        &self,
        segment_id: SegmentId,
        client: ClientId,
        grace_period_ms: u64,
    ) -> Result<(), MasterError> {
        self.call(&m::GracefulUnmountSegment {
            segment_id,
            client,
            grace_period_ms,
        })
        .await
    }

    pub async fn exist_key(&self, key: &str, tenant: &str) -> Result<bool, MasterError> {
        self.call(&m::ExistKey {
            key: key.to_string(),
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn batch_exist_key(
        &self,
        keys: Vec<String>,
        tenant: &str,
    ) -> Result<Vec<Result<bool, ErrorCode>>, MasterError> {
        self.call(&m::BatchExistKey {
            keys,
            tenant: tenant.to_string(),
        })
        .await
    }

    /// ExistKey with a read pin on a hit instead of the lease, releasing `release` first
    /// (methods 54–55, docs/wire.md).
    pub async fn exist_key_pinned(
        &self,
        key: &str,
        tenant: &str,
        release: Vec<String>,
    ) -> Result<bool, MasterError> {
        self.call(&m::ExistKeyPinned {
            key: key.to_string(),
            tenant: tenant.to_string(),
            release,
        })
        .await
    }

    pub async fn batch_exist_key_pinned(
        &self,
        keys: Vec<String>,
        tenant: &str,
        release: Vec<String>,
    ) -> Result<Vec<Result<bool, ErrorCode>>, MasterError> {
        self.call(&m::BatchExistKeyPinned {
            keys,
            tenant: tenant.to_string(),
            release,
        })
        .await
    }

    pub async fn get_replica_list(
        &self,
        key: &str,
        tenant: &str,
    ) -> Result<GetReplicaListResponse, MasterError> {
        self.call(&m::GetReplicaList {
            key: key.to_string(),
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn batch_get_replica_list(
        &self,
        keys: Vec<String>,
        tenant: &str,
    ) -> Result<Vec<Result<GetReplicaListResponse, ErrorCode>>, MasterError> {
        self.call(&m::BatchGetReplicaList {
            keys,
            tenant: tenant.to_string(),
        })
        .await
    }

    /// GetReplicaList with a read pin instead of the lease, releasing `release` first
    /// (methods 50–52, docs/wire.md).
    pub async fn get_replica_list_pinned(
        &self,
        key: &str,
        tenant: &str,
        release: Vec<String>,
    ) -> Result<GetReplicaListResponse, MasterError> {
        self.call(&m::GetReplicaListPinned {
            key: key.to_string(),
            tenant: tenant.to_string(),
            release,
        })
        .await
    }

    pub async fn batch_get_replica_list_pinned(
        &self,
        keys: Vec<String>,
        tenant: &str,
        release: Vec<String>,
    ) -> Result<Vec<Result<GetReplicaListResponse, ErrorCode>>, MasterError> {
        self.call(&m::BatchGetReplicaListPinned {
            keys,
            tenant: tenant.to_string(),
            release,
        })
        .await
    }

    /// Releases one read pin of each key; answers how many keys the master found.
    pub async fn release_reads(&self, keys: Vec<String>, tenant: &str) -> Result<u64, MasterError> {
        self.call(&m::ReleaseReads {
            keys,
            tenant: tenant.to_string(),
        })
        .await
    }

    /// PutStart (or UpsertStart): allocates the replicas of `key`; the caller then writes them
    /// and ends the write with [`MasterClient::write_end`] or [`MasterClient::write_revoke`].
    pub async fn write_start(
        &self,
        mode: WriteMode,
        client: ClientId,
        key: &str,
        value_len: u64,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, MasterError> {
        let (key, config, tenant) = (key.to_string(), config.clone(), tenant.to_string());
        call_by_mode!(self, mode, PutStart or UpsertStart {
            client, key, value_len, config, tenant
        })
    }

    /// PutEnd (or UpsertEnd) of every replica: the object becomes readable.
    pub async fn write_end(
        &self,
        mode: WriteMode,
        client: ClientId,
        meta: ObjectMeta,
        tenant: &str,
    ) -> Result<(), MasterError> {
        let (replica_type, tenant) = (ReplicaType::ALL, tenant.to_string());
        call_by_mode!(self, mode, PutEnd or UpsertEnd { client, meta, replica_type, tenant })
    }

    /// PutRevoke (or UpsertRevoke) of every replica: the write is abandoned.
    pub async fn write_revoke(
        &self,
        mode: WriteMode,
        client: ClientId,
        key: &str,
        tenant: &str,
    ) -> Result<(), MasterError> {
        let (key, replica_type, tenant) = (key.to_string(), ReplicaType::ALL, tenant.to_string());
        call_by_mode!(self, mode, PutRevoke or UpsertRevoke { client, key, replica_type, tenant })
    }

    /// BatchPutStart (or BatchUpsertStart): one answer per key, in order.
    pub async fn batch_write_start(
        &self,
        mode: WriteMode,
        client: ClientId,
        keys: Vec<String>,
        value_lens: Vec<u64>,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>, MasterError> {
        let (config, tenant) = (config.clone(), tenant.to_string());
        call_by_mode!(self, mode, BatchPutStart or BatchUpsertStart {
            client, keys, value_lens, config, tenant
        })
    }

    /// BatchPutEnd (or BatchUpsertEnd, which carries no replica type: it ends every replica):
    /// one answer per meta, in order.
    pub async fn batch_write_end(
        &self,
        mode: WriteMode,
        client: ClientId,
        metas: Vec<ObjectMeta>,
        tenant: &str,
    ) -> Result<Vec<Result<(), ErrorCode>>, MasterError> {
        let tenant = tenant.to_string();
        match mode {
            WriteMode::Put => {
                let replica_type = ReplicaType::ALL;
                let request = m::BatchPutEnd {
                    client,
                    metas,
                    replica_type,
                    tenant,
                };
                self.call(&request).await
            }
            WriteMode::Upsert => {
                self.call(&m::BatchUpsertEnd {
                    client,
                    metas,
                    tenant,
                })
                .await
            }
        }
    }

    /// BatchPutRevoke (or BatchUpsertRevoke, which carries no replica type: it revokes every
    /// replica): one answer per key, in order.
    pub async fn batch_write_revoke(
        &self,
        mode: WriteMode,
        client: ClientId,
        keys: Vec<String>,
        tenant: &str,
    ) -> Result<Vec<Result<(), ErrorCode>>, MasterError> {
        let tenant = tenant.to_string();
        match mode {
            WriteMode::Put => {
                let replica_type = ReplicaType::ALL;
                let request = m::BatchPutRevoke {
                    client,
                    keys,
                    replica_type,
                    tenant,
                };
                self.call(&request).await
            }
            WriteMode::Upsert => {
                self.call(&m::BatchUpsertRevoke {
                    client,
                    keys,
                    tenant,
                })
                .await
            }
        }
    }

    /// [`MasterClient::write_start`] of a put.
    pub async fn put_start(
        &self,
        client: ClientId,
        key: &str,
        value_len: u64,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, MasterError> {
        self.write_start(WriteMode::Put, client, key, value_len, config, tenant)
            .await
    }

    /// [`MasterClient::write_end`] of a put.
    pub async fn put_end(
        &self,
        client: ClientId,
        meta: ObjectMeta,
        tenant: &str,
    ) -> Result<(), MasterError> {
        self.write_end(WriteMode::Put, client, meta, tenant).await
    }

    pub async fn remove(&self, key: &str, force: bool, tenant: &str) -> Result<(), MasterError> {
        self.call(&m::Remove {
            key: key.to_string(),
            force,
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn batch_remove(
        &self,
        keys: Vec<String>,
        force: bool,
        tenant: &str,
    ) -> Result<Vec<Result<(), ErrorCode>>, MasterError> {
        self.call(&m::BatchRemove {
            keys,
            force,
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn remove_by_regex(
        &self,
        regex: &str,
        force: bool,
        tenant: &str,
    ) -> Result<i64, MasterError> {
        self.call(&m::RemoveByRegex {
            regex: regex.to_string(),
            force,
            tenant: tenant.to_string(),
        })
        .await
    }

    /// Drops `client`'s replicas of `keys` on `segment_name` ("" = every segment) whose read
    /// lease expired; returns the keys cleared.
    pub async fn batch_replica_clear(
        &self,
        keys: Vec<String>,
        client: ClientId,
        segment_name: &str,
        tenant: &str,
    ) -> Result<Vec<String>, MasterError> {
        self.call(&m::BatchReplicaClear {
            keys,
            client,
            segment_name: segment_name.to_string(),
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn remove_all(&self, force: bool, tenant: &str) -> Result<i64, MasterError> {
        self.call(&m::RemoveAll {
            force,
            tenant: tenant.to_string(),
        })
        .await
    }
}
