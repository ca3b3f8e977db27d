//! The master's RPC handler: decodes each request, checks the protocol limits, calls the master
//! core and encodes its `Result<T, ErrorCode>`. Counts every request for `/metrics`.

use bytes::BytesMut;
use mooncake_common::ErrorCode;
use mooncake_master::MasterService;
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode, encode_into, Limits, Reply};
use mooncake_rpc::{Deferred, Handler, HandlerError};
use std::sync::Arc;

use crate::ha::HaStatus;
use crate::metrics::RpcMetrics;
use crate::oplog::{method_class, OpLogHandle, OpLogSlot};
use crate::snapshot::Snapshotter;

/// The version string `ServiceReady` answers.
pub const VERSION: &str = concat!("mooncake-rs ", env!("CARGO_PKG_VERSION"));

/// Serves master RPCs over a shared [`MasterService`].
#[derive(Debug)]
pub struct MasterRpc {
    master: Arc<MasterService>,
    metrics: Arc<RpcMetrics>,
    limits: Limits,
    snapshots: Option<Arc<Snapshotter>>,
    oplog: Arc<OpLogSlot>,
    ha: Arc<HaStatus>,
}

impl MasterRpc {
    pub fn new(master: Arc<MasterService>, metrics: Arc<RpcMetrics>, limits: Limits) -> Self {
        MasterRpc {
            master,
            metrics,
            limits,
            snapshots: None,
            oplog: Arc::default(),
            ha: HaStatus::single(),
        }
    }

    /// Serves `TakeSnapshot` with `snapshots` (without: `NOT_SUPPORTED`).
    pub fn with_snapshots(mut self, snapshots: Option<Arc<Snapshotter>>) -> Self {
        self.snapshots = snapshots;
        self
    }

    /// Gates and acknowledges mutating calls with the op-log in `oplog`, once it is there
    /// (crate::oplog).
    pub fn with_oplog(mut self, oplog: Arc<OpLogSlot>) -> Self {
        self.oplog = oplog;
        self
    }

    /// Answers every call with `UNAVAILABLE_IN_CURRENT_STATUS` while `ha` says this master
    /// does not serve (a standby, a leader not yet serving or stepped down: crate::ha).
    pub fn with_ha(mut self, ha: Arc<HaStatus>) -> Self {
        self.ha = ha;
        self
    }

    /// Decodes `M`, checks limits, runs `op`, counts the call (a failure when the reply is an
    /// error), encodes the reply.
    fn serve<M: Method>(
        &self,
        body: &[u8],
        out: &mut BytesMut,
        op: impl FnOnce(&MasterService, &M) -> Reply<M>,
    ) -> Result<Option<PendingAck>, HandlerError> {
        self.serve_observed(body, out, op, |metrics, _, reply| {
            metrics.record(M::ID, reply.is_err())
        })
    }

    /// [`MasterRpc::serve`] with the counting done by `observe` (batch items, gets, puts).
    fn serve_observed<M: Method>(
        &self,
        body: &[u8],
        out: &mut BytesMut,
        op: impl FnOnce(&MasterService, &M) -> Reply<M>,
        observe: impl FnOnce(&RpcMetrics, &M, &Reply<M>),
    ) -> Result<Option<PendingAck>, HandlerError> {
        let request: M = match decode(body) {
            Ok(request) => request,
            Err(error) => {
                self.metrics.record(M::ID, true);
                return Err(HandlerError::new(
                    error.code(),
                    format!("{}: {error}", M::NAME),
                ));
            }
        };
        let logged = self
            .oplog
            .get()
            .and_then(|h| method_class(M::ID).map(|class| (h, class)));
        let reply = match request.check_limits(&self.limits) {
            Ok(()) => match logged.map(|(h, _)| h.gate()) {
                Some(Err(code)) => Err(code),
                _ => op(&self.master, &request),
            },
            Err(code) => Err(code),
        };
        let pending = match (logged, &reply) {
            (Some((h, class)), Ok(_)) => h
                .wait_target(class, self.ha.lease_ends_within(GRANT_LEASE_MARGIN))
                .map(|target| PendingAck {
                    oplog: h.clone(),
                    target,
                    refuse: refuse_with::<M>,
                }),
            _ => None,
        };
        // A reply that then fails to become durable was counted as the call's outcome here.
        observe(&self.metrics, &request, &reply);
        encode_into(&reply, out).map_err(|e| HandlerError::new(e.code(), e.to_string()))?;
        Ok(pending)
    }

    /// [`MasterRpc::serve`] for a batch whose reply has one result per item.
    fn serve_batch<M, T>(
        &self,
        body: &[u8],
        out: &mut BytesMut,
        items: impl FnOnce(&M) -> usize,
        op: impl FnOnce(&MasterService, &M) -> Reply<M>,
    ) -> Result<Option<PendingAck>, HandlerError>
    where
        M: Method<Output = Vec<Result<T, ErrorCode>>>,
    {
        self.serve_observed(body, out, op, |metrics, request, reply| {
            let (failed, call_failed) = match reply {
                Ok(results) => (results.iter().filter(|r| r.is_err()).count(), false),
                Err(_) => (0, true),
            };
            metrics.record_batch(M::ID, items(request), failed, call_failed);
        })
    }
}

type ReadReply = Result<mooncake_common::GetReplicaListResponse, ErrorCode>;

/// What a read feeds besides its answer: promotion on hit counts disk-only objects
/// (`MasterService::note_read`), hot-key replication counts read heat and, in enforce mode,
/// rotates the replicas of a multi-replica answer (`MasterService::note_heat`).
fn note_read(ms: &MasterService, key: &str, tenant: &str, reply: &mut ReadReply) {
    ms.note_read(key, tenant, reply);
    ms.note_heat(key, tenant, reply);
}

/// [`note_read`] for each key of a batch read.
fn note_reads(ms: &MasterService, keys: &[String], tenant: &str, replies: &mut [ReadReply]) {
    for (key, reply) in keys.iter().zip(replies) {
        note_read(ms, key, tenant, reply);
    }
}

/// A grant replies without waiting for its own change only while this leader's lease has at
/// least this long to run (docs/oplog.md, "When a reply waits").
const GRANT_LEASE_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A reply encoded and held until the op-log makes `target` durable; if it never does, the
/// reply is replaced by `refuse`'s error.
struct PendingAck {
    oplog: Arc<OpLogHandle>,
    target: u64,
    refuse: fn(ErrorCode, &mut BytesMut),
}

impl PendingAck {
    /// The reply's wait, for the RPC server to hold it back without blocking the connection.
    fn deferred(self) -> Deferred {
        Deferred::new(async move {
            self.oplog.wait(self.target).await.map_err(|code| {
                let mut body = BytesMut::new();
                (self.refuse)(code, &mut body);
                body
            })
        })
    }

    /// The reply's wait, blocking the thread: replaces `out` on failure.
    fn wait_blocking(self, out: &mut BytesMut) {
        if let Err(code) = self.oplog.wait_blocking(self.target) {
            out.clear();
            (self.refuse)(code, out);
        }
    }
}

/// Encodes `M`'s error reply `code` (an error reply always encodes).
fn refuse_with<M: Method>(code: ErrorCode, out: &mut BytesMut) {
    let reply: Reply<M> = Err(code);
    if encode_into(&reply, out).is_err() {
        out.clear();
    }
}

impl Handler for MasterRpc {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        if let Some(pending) = self.dispatch(method, body, out)? {
            pending.wait_blocking(out);
        }
        Ok(())
    }

    /// Holds the reply of a mutating call back until the op-log says it may go.
    fn handle_deferred(
        &self,
        method: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Deferred>, HandlerError> {
        Ok(self.dispatch(method, body, out)?.map(PendingAck::deferred))
    }
}

impl MasterRpc {
    fn dispatch(
        &self,
        method: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<PendingAck>, HandlerError> {
        if !self.ha.serving() {
            return Err(HandlerError::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                format!(
                    "this master is not the serving leader ({})",
                    self.ha.state_name()
                ),
            ));
        }
        match method {
            m::ExistKey::ID => self.serve(body, out, |ms, r: &m::ExistKey| {
                ms.exist_key(&r.key, &r.tenant)
            }),
            m::BatchExistKey::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchExistKey| r.keys.len(),
                |ms, r| Ok(ms.batch_exist_key(&r.keys, &r.tenant)),
            ),
            m::ExistKeyPinned::ID => self.serve(body, out, |ms, r: &m::ExistKeyPinned| {
                ms.release_reads(&r.release, &r.tenant);
                ms.exist_key_pinned(&r.key, &r.tenant)
            }),
            m::BatchExistKeyPinned::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchExistKeyPinned| r.keys.len(),
                |ms, r| {
                    ms.release_reads(&r.release, &r.tenant);
                    Ok(ms.batch_exist_key_pinned(&r.keys, &r.tenant))
                },
            ),
            m::GetReplicaList::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::GetReplicaList| {
                    let mut reply = ms.get_replica_list(&r.key, &r.tenant);
                    note_read(ms, &r.key, &r.tenant, &mut reply);
                    reply
                },
                |metrics, _, reply| {
                    metrics.record(m::GetReplicaList::ID, reply.is_err());
                    metrics.record_get(reply);
                },
            ),
            m::BatchGetReplicaList::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::BatchGetReplicaList| {
                    let mut replies = ms.batch_get_replica_list(&r.keys, &r.tenant);
                    note_reads(ms, &r.keys, &r.tenant, &mut replies);
                    Ok(replies)
                },
                |metrics, r, reply| match reply {
                    Ok(results) => {
                        let failed = results.iter().filter(|x| x.is_err()).count();
                        metrics.record_batch(
                            m::BatchGetReplicaList::ID,
                            r.keys.len(),
                            failed,
                            false,
                        );
                        results.iter().for_each(|x| metrics.record_get(x));
                    }
                    Err(_) => {
                        metrics.record_batch(m::BatchGetReplicaList::ID, r.keys.len(), 0, true)
                    }
                },
            ),
            m::GetReplicaListPinned::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::GetReplicaListPinned| {
                    ms.release_reads(&r.release, &r.tenant);
                    let mut reply = ms.get_replica_list_pinned(&r.key, &r.tenant);
                    note_read(ms, &r.key, &r.tenant, &mut reply);
                    reply
                },
                |metrics, _, reply| {
                    metrics.record(m::GetReplicaListPinned::ID, reply.is_err());
                    metrics.record_get(reply);
                },
            ),
            m::BatchGetReplicaListPinned::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::BatchGetReplicaListPinned| {
                    ms.release_reads(&r.release, &r.tenant);
                    let mut replies = ms.batch_get_replica_list_pinned(&r.keys, &r.tenant);
                    note_reads(ms, &r.keys, &r.tenant, &mut replies);
                    Ok(replies)
                },
                |metrics, r, reply| {
                    let failed = reply
                        .as_ref()
                        .map_or(0, |v| v.iter().filter(|x| x.is_err()).count());
                    metrics.record_batch(
                        m::BatchGetReplicaListPinned::ID,
                        r.keys.len(),
                        failed,
                        reply.is_err(),
                    );
                    if let Ok(results) = reply {
                        results.iter().for_each(|x| metrics.record_get(x));
                    }
                },
            ),
            m::ReleaseReads::ID => self.serve(body, out, |ms, r: &m::ReleaseReads| {
                Ok(ms.release_reads(&r.keys, &r.tenant) as u64)
            }),
            m::GetReplicaListByRegex::ID => {
                self.serve(body, out, |ms, r: &m::GetReplicaListByRegex| {
                    let mut found: Vec<_> = ms
                        .get_replica_list_by_regex(&r.regex, &r.tenant)?
                        .into_iter()
                        .collect();
                    found.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(found)
                })
            }
            m::PutStart::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::PutStart| {
                    ms.put_start(r.client, &r.key, r.value_len, &r.config, &r.tenant)
                },
                |metrics, r, reply| {
                    metrics.record(m::PutStart::ID, reply.is_err());
                    metrics.record_put_start(r.value_len, r.config.replica_num, reply, false);
                    metrics.record_tenant_quota(&r.tenant, reply);
                },
            ),
            m::BatchPutStart::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::BatchPutStart| {
                    Ok(ms.batch_put_start(r.client, &r.keys, &r.value_lens, &r.config, &r.tenant))
                },
                |metrics, r, reply| match reply {
                    Ok(results) => {
                        let failed = results.iter().filter(|x| x.is_err()).count();
                        metrics.record_batch(m::BatchPutStart::ID, r.keys.len(), failed, false);
                        for (result, len) in results.iter().zip(&r.value_lens) {
                            metrics.record_put_start(*len, r.config.replica_num, result, true);
                            metrics.record_tenant_quota(&r.tenant, result);
                        }
                    }
                    Err(_) => metrics.record_batch(m::BatchPutStart::ID, r.keys.len(), 0, true),
                },
            ),
            m::PutEnd::ID => self.serve(body, out, |ms, r: &m::PutEnd| {
                ms.put_end(r.client, &r.meta, r.replica_type, &r.tenant)
            }),
            m::BatchPutEnd::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchPutEnd| r.metas.len(),
                |ms, r| Ok(ms.batch_put_end(r.client, &r.metas, r.replica_type, &r.tenant)),
            ),
            m::PutRevoke::ID => self.serve(body, out, |ms, r: &m::PutRevoke| {
                ms.put_revoke(r.client, &r.key, r.replica_type, &r.tenant)
            }),
            m::BatchPutRevoke::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchPutRevoke| r.keys.len(),
                |ms, r| Ok(ms.batch_put_revoke(r.client, &r.keys, r.replica_type, &r.tenant)),
            ),
            m::Remove::ID => self.serve(body, out, |ms, r: &m::Remove| {
                ms.remove(&r.key, r.force, &r.tenant)
            }),
            m::BatchRemove::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchRemove| r.keys.len(),
                |ms, r| Ok(ms.batch_remove(&r.keys, r.force, &r.tenant)),
            ),
            m::RemoveByRegex::ID => self.serve(body, out, |ms, r: &m::RemoveByRegex| {
                ms.remove_by_regex(&r.regex, r.force, &r.tenant)
            }),
            m::RemoveAll::ID => self.serve(body, out, |ms, r: &m::RemoveAll| {
                Ok(ms.remove_all(r.force, &r.tenant))
            }),
            m::BatchReplicaClear::ID => self.serve_observed(
                body,
                out,
                |ms, r: &m::BatchReplicaClear| {
                    Ok(ms.batch_replica_clear(&r.keys, r.client, &r.segment_name, &r.tenant))
                },
                // The reply lists the keys cleared; the others failed.
                |metrics, r, reply| {
                    let items = r.keys.len();
                    match reply {
                        Ok(cleared) => metrics.record_batch(
                            m::BatchReplicaClear::ID,
                            items,
                            items.saturating_sub(cleared.len()),
                            false,
                        ),
                        Err(_) => metrics.record_batch(m::BatchReplicaClear::ID, items, 0, true),
                    }
                },
            ),
            m::MountSegment::ID => self.serve(body, out, |ms, r: &m::MountSegment| {
                ms.mount_segment(&r.segment, r.client)
            }),
            m::ReMountSegment::ID => self.serve(body, out, |ms, r: &m::ReMountSegment| {
                ms.remount_segments(&r.segments, r.client)
            }),
            m::UnmountSegment::ID => self.serve(body, out, |ms, r: &m::UnmountSegment| {
                ms.unmount_segment(r.segment_id, r.client)
            }),
            m::GracefulUnmountSegment::ID => {
                self.serve(body, out, |ms, r: &m::GracefulUnmountSegment| {
                    ms.graceful_unmount_segment(r.segment_id, r.client, r.grace_period_ms)
                })
            }
            m::ServiceReady::ID => {
                self.serve(body, out, |_, _: &m::ServiceReady| Ok(VERSION.to_string()))
            }
            m::QuerySegmentStatus::ID => self.serve(body, out, |ms, r: &m::QuerySegmentStatus| {
                ms.query_segment_status(&r.segment_name)
            }),
            m::QuerySegmentStatusById::ID => {
                self.serve(body, out, |ms, r: &m::QuerySegmentStatusById| {
                    ms.query_segment_status_by_id(r.segment_id)
                })
            }
            m::GetAllKeys::ID => self.serve(body, out, |ms, r: &m::GetAllKeys| {
                ms.get_all_keys(&r.tenant)
            }),
            m::GetSegmentsDetail::ID => self.serve(body, out, |ms, _: &m::GetSegmentsDetail| {
                Ok(ms
                    .segment_usage()
                    .into_iter()
                    .map(|u| m::SegmentDetail {
                        id: u.id,
                        name: u.name,
                        client: u.client,
                        status: u.status,
                        base: u.base,
                        capacity_bytes: u.capacity_bytes,
                        used_bytes: u.used_bytes,
                    })
                    .collect())
            }),
            m::Ping::ID => self.serve(body, out, |ms, r: &m::Ping| ms.ping(r.client)),
            m::DrainSegment::ID => self.serve(body, out, |ms, r: &m::DrainSegment| {
                let plan = ms.drain_own_segment(r.client, r.segment_id)?;
                Ok(m::DrainPlanned {
                    tasks: plan.tasks.len() as u64,
                    bytes: plan.bytes,
                    unmovable: plan.unmovable.len() as u64,
                    deferred: plan.deferred,
                })
            }),
            m::CountSegmentObjects::ID => {
                self.serve(body, out, |ms, r: &m::CountSegmentObjects| {
                    ms.count_objects_on_segment(r.segment_id)
                })
            }
            m::CreateDrainJob::ID => self.serve(body, out, |ms, r: &m::CreateDrainJob| {
                ms.create_drain_job(&r.request)
            }),
            m::QueryDrainJob::ID => self.serve(body, out, |ms, r: &m::QueryDrainJob| {
                ms.query_drain_job(r.id)
            }),
            m::CancelDrainJob::ID => self.serve(body, out, |ms, r: &m::CancelDrainJob| {
                ms.cancel_drain_job(r.id)
            }),
            m::ListDrainJobs::ID => self.serve(body, out, |ms, _: &m::ListDrainJobs| {
                Ok(ms.list_drain_jobs())
            }),
            m::ReportTransferFailure::ID => {
                self.serve(body, out, |ms, r: &m::ReportTransferFailure| {
                    let newly = ms.report_transfer_failure(r.client, &r.endpoint)?;
                    if newly > 0 {
                        tracing::warn!(
                            client = %r.client,
                            endpoint = %r.endpoint,
                            segments = newly,
                            "transfer failure reported: out of placement until the owner pings"
                        );
                    }
                    Ok(newly)
                })
            }
            m::UpsertStart::ID => self.serve(body, out, |ms, r: &m::UpsertStart| {
                ms.upsert_start(r.client, &r.key, r.value_len, &r.config, &r.tenant)
            }),
            m::BatchUpsertStart::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchUpsertStart| r.keys.len(),
                |ms, r| {
                    Ok(ms.batch_upsert_start(
                        r.client,
                        &r.keys,
                        &r.value_lens,
                        &r.config,
                        &r.tenant,
                    ))
                },
            ),
            m::UpsertEnd::ID => self.serve(body, out, |ms, r: &m::UpsertEnd| {
                ms.upsert_end(r.client, &r.meta, r.replica_type, &r.tenant)
            }),
            m::BatchUpsertEnd::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchUpsertEnd| r.metas.len(),
                |ms, r| Ok(ms.batch_upsert_end(r.client, &r.metas, &r.tenant)),
            ),
            m::UpsertRevoke::ID => self.serve(body, out, |ms, r: &m::UpsertRevoke| {
                ms.upsert_revoke(r.client, &r.key, r.replica_type, &r.tenant)
            }),
            m::BatchUpsertRevoke::ID => self.serve_batch(
                body,
                out,
                |r: &m::BatchUpsertRevoke| r.keys.len(),
                |ms, r| Ok(ms.batch_upsert_revoke(r.client, &r.keys, &r.tenant)),
            ),
            m::CopyStart::ID => self.serve(body, out, |ms, r: &m::CopyStart| {
                ms.copy_start(r.client, &r.key, &r.tenant, &r.source, &r.targets)
            }),
            m::CopyEnd::ID => self.serve(body, out, |ms, r: &m::CopyEnd| {
                ms.copy_end(r.client, &r.key, &r.tenant)
            }),
            m::CopyRevoke::ID => self.serve(body, out, |ms, r: &m::CopyRevoke| {
                ms.copy_revoke(r.client, &r.key, &r.tenant)
            }),
            m::MoveStart::ID => self.serve(body, out, |ms, r: &m::MoveStart| {
                ms.move_start(r.client, &r.key, &r.tenant, &r.source, &r.target)
            }),
            m::MoveEnd::ID => self.serve(body, out, |ms, r: &m::MoveEnd| {
                ms.move_end(r.client, &r.key, &r.tenant)
            }),
            m::MoveRevoke::ID => self.serve(body, out, |ms, r: &m::MoveRevoke| {
                ms.move_revoke(r.client, &r.key, &r.tenant)
            }),
            m::CreateCopyTask::ID => self.serve(body, out, |ms, r: &m::CreateCopyTask| {
                ms.create_copy_task(&r.key, &r.tenant, &r.targets)
            }),
            m::CreateMoveTask::ID => self.serve(body, out, |ms, r: &m::CreateMoveTask| {
                ms.create_move_task(&r.key, &r.tenant, &r.source, &r.target)
            }),
            m::QueryTask::ID => self.serve(body, out, |ms, r: &m::QueryTask| ms.query_task(r.id)),
            m::FetchTasks::ID => self.serve(body, out, |ms, r: &m::FetchTasks| {
                Ok(ms.fetch_tasks(
                    r.client,
                    usize::try_from(r.batch_size).unwrap_or(usize::MAX),
                ))
            }),
            m::MarkTaskToComplete::ID => self.serve(body, out, |ms, r: &m::MarkTaskToComplete| {
                ms.mark_task_to_complete(r.client, &r.request)
            }),
            m::GetUnverifiedReplicas::ID => {
                self.serve(body, out, |ms, r: &m::GetUnverifiedReplicas| {
                    let limit = usize::try_from(r.limit).unwrap_or(usize::MAX);
                    Ok(ms
                        .get_unverified_replicas(r.client, r.segment_id, r.after, limit)?
                        .into_iter()
                        .map(|u| m::UnverifiedReplica {
                            id: u.id,
                            offset: u.offset,
                            len: u.len,
                            checksum: u.checksum,
                        })
                        .collect())
                })
            }
            m::ConfirmReplicas::ID => self.serve(body, out, |ms, r: &m::ConfirmReplicas| {
                let done =
                    ms.confirm_replicas(r.client, r.segment_id, &r.verified, &r.mismatched)?;
                Ok(m::ConfirmReplicasResponse {
                    verified: done.verified,
                    dropped: done.dropped,
                })
            }),
            m::MountLocalDisk::ID => self.serve(body, out, |ms, r: &m::MountLocalDisk| {
                ms.mount_local_disk(r.client, &r.endpoint, r.capacity_bytes, r.used_bytes)
            }),
            m::OffloadHeartbeat::ID => self.serve(body, out, |ms, r: &m::OffloadHeartbeat| {
                let max = usize::try_from(r.max_tasks).unwrap_or(usize::MAX);
                ms.offload_heartbeat(r.client, max, r.used_bytes)
            }),
            m::NotifyOffload::ID => self.serve_batch(
                body,
                out,
                |r: &m::NotifyOffload| r.outcomes.len(),
                |ms, r| Ok(ms.notify_offload(r.client, &r.outcomes)),
            ),
            m::AdvertiseDiskObjects::ID => self.serve_batch(
                body,
                out,
                |r: &m::AdvertiseDiskObjects| r.objects.len(),
                |ms, r| ms.advertise_disk_objects(r.client, &r.objects),
            ),
            m::EvictDiskObjects::ID => self.serve_batch(
                body,
                out,
                |r: &m::EvictDiskObjects| r.objects.len(),
                |ms, r| Ok(ms.evict_disk_objects(r.client, &r.objects)),
            ),
            m::ListLocalDisks::ID => self.serve(body, out, |ms, _: &m::ListLocalDisks| {
                Ok(ms
                    .local_disks()
                    .into_iter()
                    .map(|d| m::LocalDiskDetail {
                        client: d.client,
                        endpoint: d.endpoint,
                        capacity_bytes: d.capacity_bytes,
                        used_bytes: d.used_bytes,
                    })
                    .collect::<Vec<_>>())
            }),
            m::TakeDiskDrops::ID => self.serve(body, out, |ms, r: &m::TakeDiskDrops| {
                ms.take_disk_drops(r.client, usize::try_from(r.max).unwrap_or(usize::MAX))
            }),
            m::NotifyDiskDrops::ID => self.serve(body, out, |ms, r: &m::NotifyDiskDrops| {
                ms.disk_objects_dropped(&r.objects);
                Ok(())
            }),
            m::GetOffloadStats::ID => self.serve(body, out, |ms, _: &m::GetOffloadStats| {
                let s = ms.offload_stats();
                Ok(m::OffloadStatsReply {
                    queued: s.queued,
                    stored: s.stored,
                    refused: s.refused,
                    dropped: s.dropped,
                    in_flight: s.in_flight,
                    disk_evicted: s.disk_evicted,
                    advertised: s.advertised,
                    disks: s.disks,
                    disk_capacity_bytes: s.disk_capacity_bytes,
                    disk_used_bytes: s.disk_used_bytes,
                    promotions: s.promotions,
                    promoted: s.promoted,
                    promotion_failures: s.promotion_failures,
                    promotions_in_flight: s.promotions_in_flight,
                })
            }),
            m::PromotionHeartbeat::ID => self.serve(body, out, |ms, r: &m::PromotionHeartbeat| {
                ms.promotion_heartbeat(r.client, usize::try_from(r.max_tasks).unwrap_or(usize::MAX))
            }),
            m::NotifyPromotion::ID => self.serve_batch(
                body,
                out,
                |r: &m::NotifyPromotion| r.outcomes.len(),
                |ms, r| Ok(ms.notify_promotion(r.client, &r.outcomes)),
            ),
            m::TakeSnapshot::ID => {
                let snapshots = self.snapshots.clone();
                self.serve(body, out, move |_, _: &m::TakeSnapshot| {
                    let Some(snapshots) = snapshots else {
                        return Err(ErrorCode::NOT_SUPPORTED);
                    };
                    match snapshots.take_blocking_in_runtime("on-demand") {
                        Ok(report) => Ok(m::SnapshotTaken {
                            path: report.path.display().to_string(),
                            bytes: report.bytes,
                            objects: report.objects,
                            duration_us: u64::try_from(report.duration.as_micros())
                                .unwrap_or(u64::MAX),
                        }),
                        Err(_) => Err(ErrorCode::INTERNAL_ERROR),
                    }
                })
            }
            other => {
                self.metrics.record(other, true);
                Err(HandlerError::new(
                    ErrorCode::NOT_SUPPORTED,
                    match mooncake_proto::method_name(other) {
                        Some(name) => {
                            format!("method {name} ({other}) is not served by this master yet")
                        }
                        None => format!("unknown method id {other}"),
                    },
                ))
            }
        }
    }
}
