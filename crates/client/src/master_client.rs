//! `MasterClient`: typed, pipelined calls to the master over one reused connection.
//!
//! Every method of `mooncake_proto::methods` is one `call`; the convenience wrappers below cover
//! what the store client uses. Errors are typed: a transport failure (`Rpc`, with `RPC_FAIL` or
//! `RPC_TIMEOUT`) is kept apart from the master refusing the operation (`Master`, with upstream's
//! code, e.g. `OBJECT_NOT_FOUND`).

use mooncake_common::{
    ClientId, ErrorCode, GetReplicaListResponse, ObjectMeta, PingResponse, ReplicaDescriptor,
    ReplicaType, ReplicateConfig, Segment, SegmentId,
};
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode, encode, CodecError, Reply};
use mooncake_rpc::{ClientConfig, RpcClient, RpcError};
use std::net::SocketAddr;
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

/// A typed client of one master.
#[derive(Debug)]
pub struct MasterClient {
    rpc: RpcClient,
}

impl MasterClient {
    /// A client of the master at `addr`; connects on first use and reconnects after failures.
    pub fn new(addr: SocketAddr, config: ClientConfig) -> Self {
        MasterClient {
            rpc: RpcClient::new(addr, config),
        }
    }

    /// The master's address.
    pub fn addr(&self) -> SocketAddr {
        self.rpc.addr()
    }

    /// How often a caller read its own answer from the socket (see `RpcClient::caller_reads`).
    pub fn caller_reads(&self) -> u64 {
        self.rpc.caller_reads()
    }

    /// How calls waited for their answers (see `RpcClient::poll_stats`).
    pub fn poll_stats(&self) -> mooncake_rpc::PollStats {
        self.rpc.poll_stats()
    }

    /// Sends any master request and returns its output.
    pub async fn call<M: Method>(&self, request: &M) -> Result<M::Output, MasterError> {
        let body = encode(request)?;
        let answer = self.rpc.call(M::ID, &body).await?;
        let reply: Reply<M> = decode(&answer)?;
        reply.map_err(MasterError::Master)
    }

    pub async fn service_ready(&self) -> Result<String, MasterError> {
        self.call(&m::ServiceReady {}).await
    }

    pub async fn ping(&self, client: ClientId) -> Result<PingResponse, MasterError> {
        self.call(&m::Ping { client }).await
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

    pub async fn unmount_segment(
        &self,
        segment_id: SegmentId,
        client: ClientId,
    ) -> Result<(), MasterError> {
        self.call(&m::UnmountSegment { segment_id, client }).await
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

    pub async fn put_start(
        &self,
        client: ClientId,
        key: &str,
        value_len: u64,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, MasterError> {
        self.call(&m::PutStart {
            client,
            key: key.to_string(),
            value_len,
            config: config.clone(),
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn put_end(
        &self,
        client: ClientId,
        meta: ObjectMeta,
        tenant: &str,
    ) -> Result<(), MasterError> {
        self.call(&m::PutEnd {
            client,
            meta,
            replica_type: ReplicaType::ALL,
            tenant: tenant.to_string(),
        })
        .await
    }

    pub async fn put_revoke(
        &self,
        client: ClientId,
        key: &str,
        tenant: &str,
    ) -> Result<(), MasterError> {
        self.call(&m::PutRevoke {
            client,
            key: key.to_string(),
            replica_type: ReplicaType::ALL,
            tenant: tenant.to_string(),
        })
        .await
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

    pub async fn remove_all(&self, force: bool, tenant: &str) -> Result<i64, MasterError> {
        self.call(&m::RemoveAll {
            force,
            tenant: tenant.to_string(),
        })
        .await
    }
}
