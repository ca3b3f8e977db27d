//! One request type per master RPC, its method id and its reply type.
//!
//! Each request struct is named after its method and implements [`Method`]; the reply of every
//! method is `Result<T, ErrorCode>`, so an operation's failure travels in the body with upstream's
//! code. Ids are stable wire values: never renumber, only append.
//!
//! Tenants travel as strings (empty = `default`) and are validated by the server, as upstream.

use mooncake_common::{
    ClientId, CopyStartResponse, DiskObject, DrainJobRequest, DrainJobView, ErrorCode,
    GetReplicaListResponse, MoveStartResponse, ObjectMeta, OffloadOutcome, OffloadTask,
    PingResponse, QueryTaskResponse, ReplicaDescriptor, ReplicaId, ReplicaType, ReplicateConfig,
    Segment, SegmentId, SegmentStatus, TaskAssignment, TaskCompleteRequest, TaskId,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::limits::{check_key, check_keys, check_len, Limits};

/// A master RPC: its wire id, its request (the implementing type) and its reply.
pub trait Method: Serialize + DeserializeOwned + Send + Sync + 'static {
    const ID: u16;
    const NAME: &'static str;
    /// What the call returns on success.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// Checks the request against the protocol limits (key length, batch length).
    fn check_limits(&self, limits: &Limits) -> Result<(), ErrorCode>;
}

/// The reply body of method `M`.
pub type Reply<M> = Result<<M as Method>::Output, ErrorCode>;

macro_rules! methods {
    ($(
        $(#[$doc:meta])*
        $id:literal $name:ident { $($field:ident : $ty:ty),* $(,)? } -> $out:ty
        , limits($self_:ident, $lim:ident) $check:block ;
    )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct $name { $(pub $field: $ty),* }

            impl Method for $name {
                const ID: u16 = $id;
                const NAME: &'static str = stringify!($name);
                type Output = $out;
                #[allow(unused_variables)]
                fn check_limits(&self, limits: &Limits) -> Result<(), ErrorCode> {
                    let $self_ = self;
                    let $lim = limits;
                    $check
                }
            }
        )*

        /// Every method: (id, name).
        pub const METHODS: &[(u16, &str)] = &[ $( ($id, stringify!($name)), )* ];
    };
}

/// The name of a method id, for logs and metrics.
pub fn method_name(id: u16) -> Option<&'static str> {
    METHODS
        .iter()
        .find(|(m, _)| *m == id)
        .map(|(_, name)| *name)
}

methods! {
    /// Whether `key` has a readable replica (grants a read lease when it does).
    1 ExistKey { key: String, tenant: String } -> bool,
        limits(s, l) { check_key(&s.key, l) };
    2 BatchExistKey { keys: Vec<String>, tenant: String } -> Vec<Result<bool, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l) };
    /// Readable replicas and a read lease, in one round trip.
    3 GetReplicaList { key: String, tenant: String } -> GetReplicaListResponse,
        limits(s, l) { check_key(&s.key, l) };
    4 BatchGetReplicaList { keys: Vec<String>, tenant: String }
        -> Vec<Result<GetReplicaListResponse, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l) };
    5 GetReplicaListByRegex { regex: String, tenant: String }
        -> Vec<(String, Vec<ReplicaDescriptor>)>,
        limits(s, l) { check_key(&s.regex, l) };
    /// Allocates the replicas of a new object; the caller then writes them and calls PutEnd.
    6 PutStart { client: ClientId, key: String, value_len: u64, config: ReplicateConfig, tenant: String }
        -> Vec<ReplicaDescriptor>,
        limits(s, l) { check_key(&s.key, l) };
    7 BatchPutStart { client: ClientId, keys: Vec<String>, value_lens: Vec<u64>, config: ReplicateConfig, tenant: String }
        -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l)?; check_len(s.value_lens.len(), l) };
    8 PutEnd { client: ClientId, meta: ObjectMeta, replica_type: ReplicaType, tenant: String } -> (),
        limits(s, l) { check_key(&s.meta.key, l) };
    9 BatchPutEnd { client: ClientId, metas: Vec<ObjectMeta>, replica_type: ReplicaType, tenant: String }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) { check_len(s.metas.len(), l)?; s.metas.iter().try_for_each(|m| check_key(&m.key, l)) };
    10 PutRevoke { client: ClientId, key: String, replica_type: ReplicaType, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    11 BatchPutRevoke { client: ClientId, keys: Vec<String>, replica_type: ReplicaType, tenant: String }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l) };
    12 UpsertStart { client: ClientId, key: String, value_len: u64, config: ReplicateConfig, tenant: String }
        -> Vec<ReplicaDescriptor>,
        limits(s, l) { check_key(&s.key, l) };
    13 BatchUpsertStart { client: ClientId, keys: Vec<String>, value_lens: Vec<u64>, config: ReplicateConfig, tenant: String }
        -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l)?; check_len(s.value_lens.len(), l) };
    14 UpsertEnd { client: ClientId, meta: ObjectMeta, replica_type: ReplicaType, tenant: String } -> (),
        limits(s, l) { check_key(&s.meta.key, l) };
    15 BatchUpsertEnd { client: ClientId, metas: Vec<ObjectMeta>, tenant: String }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) { check_len(s.metas.len(), l)?; s.metas.iter().try_for_each(|m| check_key(&m.key, l)) };
    16 UpsertRevoke { client: ClientId, key: String, replica_type: ReplicaType, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    17 BatchUpsertRevoke { client: ClientId, keys: Vec<String>, tenant: String }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l) };
    18 Remove { key: String, force: bool, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    19 BatchRemove { keys: Vec<String>, force: bool, tenant: String } -> Vec<Result<(), ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l) };
    /// Returns how many objects were removed.
    20 RemoveByRegex { regex: String, force: bool, tenant: String } -> i64,
        limits(s, l) { check_key(&s.regex, l) };
    21 RemoveAll { force: bool, tenant: String } -> i64,
        limits(s, l) { Ok(()) };
    /// Drops the replicas of `keys` on `segment_name` held by `client`; returns the cleared keys.
    22 BatchReplicaClear { keys: Vec<String>, client: ClientId, segment_name: String, tenant: String } -> Vec<String>,
        limits(s, l) { check_keys(&s.keys, l) };
    23 MountSegment { segment: Segment, client: ClientId } -> (),
        limits(s, l) { Ok(()) };
    24 ReMountSegment { segments: Vec<Segment>, client: ClientId } -> (),
        limits(s, l) { check_len(s.segments.len(), l) };
    25 UnmountSegment { segment_id: SegmentId, client: ClientId } -> (),
        limits(s, l) { Ok(()) };
    26 GracefulUnmountSegment { segment_id: SegmentId, client: ClientId, grace_period_ms: u64 } -> (),
        limits(s, l) { Ok(()) };
    27 Ping { client: ClientId } -> PingResponse,
        limits(s, l) { Ok(()) };
    /// The master's version string.
    28 ServiceReady {} -> String,
        limits(s, l) { Ok(()) };
    29 QuerySegmentStatus { segment_name: String } -> SegmentStatus,
        limits(s, l) { check_key(&s.segment_name, l) };
    30 QuerySegmentStatusById { segment_id: SegmentId } -> SegmentStatus,
        limits(s, l) { Ok(()) };
    /// Keys of a tenant with a readable replica (ours: upstream has this on HTTP only).
    31 GetAllKeys { tenant: String } -> Vec<String>,
        limits(s, l) { Ok(()) };
    /// Mounted segments with usage (ours: upstream has this on HTTP only).
    32 GetSegmentsDetail {} -> Vec<SegmentDetail>,
        limits(s, l) { Ok(()) };
    /// Copy `key`'s replica on segment `source` to the `targets` segments (client-executed).
    33 CopyStart { client: ClientId, key: String, tenant: String, source: String, targets: Vec<String> }
        -> CopyStartResponse,
        limits(s, l) { check_key(&s.key, l)?; check_len(s.targets.len(), l) };
    34 CopyEnd { client: ClientId, key: String, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    35 CopyRevoke { client: ClientId, key: String, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    36 MoveStart { client: ClientId, key: String, tenant: String, source: String, target: String }
        -> MoveStartResponse,
        limits(s, l) { check_key(&s.key, l) };
    37 MoveEnd { client: ClientId, key: String, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    38 MoveRevoke { client: ClientId, key: String, tenant: String } -> (),
        limits(s, l) { check_key(&s.key, l) };
    39 CreateCopyTask { key: String, tenant: String, targets: Vec<String> } -> TaskId,
        limits(s, l) { check_key(&s.key, l)?; check_len(s.targets.len(), l) };
    40 CreateMoveTask { key: String, tenant: String, source: String, target: String } -> TaskId,
        limits(s, l) { check_key(&s.key, l) };
    41 QueryTask { id: TaskId } -> QueryTaskResponse,
        limits(s, l) { Ok(()) };
    42 FetchTasks { client: ClientId, batch_size: u64 } -> Vec<TaskAssignment>,
        limits(s, l) { check_len(usize::try_from(s.batch_size).unwrap_or(usize::MAX), l) };
    43 MarkTaskToComplete { client: ClientId, request: TaskCompleteRequest } -> (),
        limits(s, l) { Ok(()) };
    /// Restored replicas of `segment_id` waiting for its owner's checksum check, ids above
    /// `after`, at most `limit` (the master caps a page at 4096 replicas and about 1 GiB of
    /// ranges); empty when none is left. Ours: restore after a master restart.
    44 GetUnverifiedReplicas { client: ClientId, segment_id: SegmentId, after: ReplicaId, limit: u64 }
        -> Vec<UnverifiedReplica>,
        limits(s, l) { check_len(usize::try_from(s.limit).unwrap_or(usize::MAX), l) };
    /// The owner's verdicts on restored replicas of `segment_id`: `verified` ones become
    /// readable, `mismatched` ones are dropped. Ours: restore after a master restart.
    45 ConfirmReplicas { client: ClientId, segment_id: SegmentId, verified: Vec<ReplicaId>, mismatched: Vec<ReplicaId> }
        -> ConfirmReplicasResponse,
        limits(s, l) { check_len(s.verified.len(), l)?; check_len(s.mismatched.len(), l) };
    /// Writes a snapshot of the master now (waits for one in progress first). `NOT_SUPPORTED`
    /// without a snapshot directory, `INTERNAL_ERROR` when writing failed (the master logs why).
    /// Ours: upstream takes snapshots only on its timer.
    46 TakeSnapshot {} -> SnapshotTaken,
        limits(s, l) { Ok(()) };
    /// Presents the cluster's shared token (docs/security.md). A master started with
    /// `--auth_token_file` requires it as the first request of every connection: before it
    /// succeeds no other method is served, and a wrong token is answered `ILLEGAL_CLIENT` with
    /// an error frame, then the connection is closed. A master without a token accepts any.
    /// Answered by the RPC layer, not the master core. Ours: upstream has no authentication.
    47 Authenticate { token: TokenBytes } -> (),
        limits(s, l) {
            if s.token.0.len() > mooncake_common::auth::MAX_TOKEN_BYTES {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            Ok(())
        };
    /// GetReplicaList for a read the caller completes and then releases: a read pin instead of
    /// the read lease (docs/master.md "Read pins"). `release` carries the caller's finished reads
    /// (one pin each), released before the lookup. Ours: upstream has only the lease.
    50 GetReplicaListPinned { key: String, tenant: String, release: Vec<String> }
        -> GetReplicaListResponse,
        limits(s, l) { check_key(&s.key, l)?; check_keys(&s.release, l) };
    /// BatchGetReplicaList with read pins, releasing `release` first. Ours.
    51 BatchGetReplicaListPinned { keys: Vec<String>, tenant: String, release: Vec<String> }
        -> Vec<Result<GetReplicaListResponse, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l)?; check_keys(&s.release, l) };
    /// Releases one read pin of each key (the caller's finished reads); answers how many keys
    /// were found. Ours.
    52 ReleaseReads { keys: Vec<String>, tenant: String } -> u64,
        limits(s, l) { check_keys(&s.keys, l) };
    /// `client` failed to move bytes to a segment served at `endpoint` (a replica descriptor's
    /// `transport_endpoint`): the master takes every segment served there out of placement
    /// until its owner pings or mounts again (readers still try it). Returns how many segments
    /// became suspected now. Ours: upstream places on a dead node until its client TTL ends.
    53 ReportTransferFailure { client: ClientId, endpoint: String } -> u64,
        limits(s, l) { check_key(&s.endpoint, l) };
    /// ExistKey for a lookup whose load follows at once: a hit takes a read pin (released by
    /// the caller's next lookup) instead of the read lease (docs/master.md "Read pins").
    /// `release` as in `GetReplicaListPinned`. Ours.
    54 ExistKeyPinned { key: String, tenant: String, release: Vec<String> } -> bool,
        limits(s, l) { check_key(&s.key, l)?; check_keys(&s.release, l) };
    /// BatchExistKey with read pins on the hits, releasing `release` first. Ours.
    55 BatchExistKeyPinned { keys: Vec<String>, tenant: String, release: Vec<String> }
        -> Vec<Result<bool, ErrorCode>>,
        limits(s, l) { check_keys(&s.keys, l)?; check_keys(&s.release, l) };
    /// Mounts (or re-mounts) `client`'s local disk: readers ask `endpoint` (the node's disk
    /// server, `host:port`) for its LOCAL_DISK objects. UNABLE_OFFLOAD on a master without
    /// `enable_offload`.
    60 MountLocalDisk { client: ClientId, endpoint: String, capacity_bytes: u64, used_bytes: u64 }
        -> (),
        limits(s, l) { check_key(&s.endpoint, l) };
    /// Takes up to `max_tasks` of `client`'s offload tasks (and records its disk usage).
    /// SEGMENT_NOT_FOUND when its disk is not mounted.
    61 OffloadHeartbeat { client: ClientId, max_tasks: u64, used_bytes: u64 }
        -> Vec<OffloadTask>,
        limits(s, l) { Ok(()) };
    /// The node's answer to each task it took: stored (a LOCAL_DISK replica is added) or not;
    /// either way the task ends and its source replica is unpinned. One result per outcome.
    62 NotifyOffload { client: ClientId, outcomes: Vec<OffloadOutcome> }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) {
            check_len(s.outcomes.len(), l)?;
            s.outcomes.iter().try_for_each(|o| check_key(&o.key, l))
        };
    /// Objects `client` holds on its disk (after a restart): each gets a LOCAL_DISK replica.
    63 AdvertiseDiskObjects { client: ClientId, objects: Vec<DiskObject> }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) {
            check_len(s.objects.len(), l)?;
            s.objects.iter().try_for_each(|o| check_key(&o.key, l))
        };
    /// `client` evicted these objects from its disk: their LOCAL_DISK replicas go.
    64 EvictDiskObjects { client: ClientId, objects: Vec<DiskObject> }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) {
            check_len(s.objects.len(), l)?;
            s.objects.iter().try_for_each(|o| check_key(&o.key, l))
        };
    /// Offload counters and disk usage of the cluster.
    65 GetOffloadStats {} -> OffloadStatsReply,
        limits(s, l) { Ok(()) };
    /// Takes up to `max_tasks` of `client`'s promotion tasks: load the object from the disk
    /// into `buffer_address` (a PROCESSING memory replica on one of the node's segments).
    66 PromotionHeartbeat { client: ClientId, max_tasks: u64 } -> Vec<OffloadTask>,
        limits(s, l) { Ok(()) };
    /// The node's answer to each promotion task it took: stored makes the memory replica
    /// COMPLETE, not stored erases it.
    67 NotifyPromotion { client: ClientId, outcomes: Vec<OffloadOutcome> }
        -> Vec<Result<(), ErrorCode>>,
        limits(s, l) {
            check_len(s.outcomes.len(), l)?;
            s.outcomes.iter().try_for_each(|o| check_key(&o.key, l))
        };
    /// Takes up to `max` records `client` must delete from its disk (their objects were
    /// removed). SEGMENT_NOT_FOUND when its disk is not mounted.
    68 TakeDiskDrops { client: ClientId, max: u64 } -> Vec<DiskObject>,
        limits(s, l) { Ok(()) };
    /// `client` deleted these records from its disk (durably): the master forgets their
    /// removal.
    69 NotifyDiskDrops { client: ClientId, objects: Vec<DiskObject> } -> (),
        limits(s, l) {
            check_len(s.objects.len(), l)?;
            s.objects.iter().try_for_each(|o| check_key(&o.key, l))
        };
    /// Every mounted local disk: its node, endpoint, capacity and usage as last reported
    /// (`mooncake stat`). Empty on a master without `enable_offload`. Ours.
    72 ListLocalDisks {} -> Vec<LocalDiskDetail>,
        limits(s, l) { Ok(()) };
    /// Served by a store node's disk server, not the master: loads each key of `tenant` (of the
    /// given size) from the node's disk into its staging memory and answers where to read it.
    70 LoadDiskObjects { tenant: String, keys: Vec<String>, sizes: Vec<u64> } -> LoadedDiskObjects,
        limits(s, l) {
            check_keys(&s.keys, l)?;
            if s.sizes.len() != s.keys.len() {
                return Err(ErrorCode::INVALID_PARAMS);
            }
            Ok(())
        };
    /// Served by a store node's disk server: the reader is done with a load's staging memory.
    71 ReleaseDiskObjects { batch_id: u64 } -> (),
        limits(s, l) { Ok(()) };
    /// The owner of segment `segment_id` drains it before leaving: the segment goes DRAINING
    /// (no new allocations, reads go on) and every object on it not already being moved gets a
    /// move task to another OK segment, queued for the owner. Calling it again plans what is
    /// left. ILLEGAL_CLIENT for another client's segment. Ours (graceful shutdown).
    80 DrainSegment { client: ClientId, segment_id: SegmentId } -> DrainPlanned,
        limits(s, l) { Ok(()) };
    /// How many objects hold a live replica (complete or being written) on the segment. Ours.
    81 CountSegmentObjects { segment_id: SegmentId } -> u64,
        limits(s, l) { Ok(()) };
    /// Upstream's `POST /api/v1/drain_jobs` as an RPC: returns the job id.
    82 CreateDrainJob { request: DrainJobRequest } -> TaskId,
        limits(s, l) { check_keys(&s.request.segments, l)?; check_keys(&s.request.target_segments, l) };
    /// Upstream's `GET /api/v1/drain_jobs/query` as an RPC.
    83 QueryDrainJob { id: TaskId } -> DrainJobView,
        limits(s, l) { Ok(()) };
    /// Upstream's `POST /api/v1/drain_jobs/cancel` as an RPC.
    84 CancelDrainJob { id: TaskId } -> (),
        limits(s, l) { Ok(()) };
    /// Every drain job the master keeps, oldest first. Ours (`mooncake stat`).
    85 ListDrainJobs {} -> Vec<DrainJobView>,
        limits(s, l) { Ok(()) };
}

/// What `LoadDiskObjects` answers: the staging memory holding each loaded object, read with the
/// transfer engine at `endpoint` until released (or until the lease of `lease_ms` runs out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedDiskObjects {
    pub batch_id: u64,
    /// The node's transfer endpoint.
    pub endpoint: String,
    pub lease_ms: u64,
    /// Per key: the buffer address (segment id << 40 | offset) of its bytes, or why not.
    pub addresses: Vec<Result<u64, ErrorCode>>,
}

/// What `GetOffloadStats` answers (see the master's `OffloadStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OffloadStatsReply {
    pub queued: u64,
    pub stored: u64,
    pub refused: u64,
    pub dropped: u64,
    pub in_flight: u64,
    pub disk_evicted: u64,
    pub advertised: u64,
    pub disks: u64,
    pub disk_capacity_bytes: u64,
    pub disk_used_bytes: u64,
    pub promotions: u64,
    pub promoted: u64,
    pub promotion_failures: u64,
    pub promotions_in_flight: u64,
}

/// The token bytes `Authenticate` carries (postcard: a varint length, then the bytes). `Debug`
/// never prints them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBytes(pub Vec<u8>);

impl std::fmt::Debug for TokenBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenBytes(<{} bytes, redacted>)", self.0.len())
    }
}

/// What one `DrainSegment` planned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainPlanned {
    /// Move tasks queued now.
    pub tasks: u64,
    /// Bytes they move.
    pub bytes: u64,
    /// Objects no other segment has room for.
    pub unmovable: u64,
    /// Objects left for a later call because the task queue was full.
    pub deferred: u64,
}

/// What `TakeSnapshot` wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotTaken {
    /// The snapshot file, as the master names it.
    pub path: String,
    pub bytes: u64,
    pub objects: u64,
    pub duration_us: u64,
}

/// One restored replica for its node to check: CRC32C of the `len` bytes at `offset` in the
/// segment must equal `checksum` (the object's, recorded at PutEnd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnverifiedReplica {
    pub id: ReplicaId,
    pub offset: u64,
    pub len: u64,
    pub checksum: u64,
}

/// What `ConfirmReplicas` changed (ids already settled or unknown count in neither).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmReplicasResponse {
    /// Replicas that became readable.
    pub verified: u64,
    /// Replicas dropped because their bytes did not match.
    pub dropped: u64,
}

/// One node's mounted local disk as `ListLocalDisks` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalDiskDetail {
    pub client: ClientId,
    /// The node's disk server (`host:port`).
    pub endpoint: String,
    pub capacity_bytes: u64,
    /// As the node last reported it (mount, offload heartbeat).
    pub used_bytes: u64,
}

/// One mounted segment as `GetSegmentsDetail` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDetail {
    pub id: SegmentId,
    pub name: String,
    pub client: ClientId,
    pub status: SegmentStatus,
    pub base: u64,
    pub capacity_bytes: u64,
    /// `None` while the segment is being unmounted (its allocator is gone).
    pub used_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::codec::{decode, encode};

    #[test]
    fn method_ids_are_unique_and_named() {
        let mut ids: Vec<u16> = METHODS.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), METHODS.len());
        assert_eq!(method_name(ExistKey::ID), Some("ExistKey"));
        assert_eq!(method_name(9999), None);
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let request = PutStart {
            client: ClientId::new(1, 2),
            key: "k".into(),
            value_len: 4096,
            config: ReplicateConfig::default(),
            tenant: String::new(),
        };
        let bytes = encode(&request).unwrap();
        assert_eq!(decode::<PutStart>(&bytes).unwrap(), request);

        let reply: Reply<BatchExistKey> = Ok(vec![Ok(true), Err(ErrorCode::OBJECT_NOT_FOUND)]);
        let bytes = encode(&reply).unwrap();
        assert_eq!(decode::<Reply<BatchExistKey>>(&bytes).unwrap(), reply);

        let failed: Reply<Remove> = Err(ErrorCode::OBJECT_HAS_LEASE);
        let bytes = encode(&failed).unwrap();
        assert_eq!(decode::<Reply<Remove>>(&bytes).unwrap(), failed);
    }

    #[test]
    fn garbage_and_trailing_bytes_are_decode_errors() {
        assert!(decode::<PutStart>(&[0xff; 3]).is_err());
        let mut bytes = encode(&ExistKey {
            key: "a".into(),
            tenant: String::new(),
        })
        .unwrap();
        bytes.extend_from_slice(&[0]);
        assert!(decode::<ExistKey>(&bytes).is_err());
        // A length prefix claiming 2^32 keys in a 10-byte body fails without a huge allocation.
        let hostile = [0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0, 0];
        assert!(decode::<BatchExistKey>(&hostile).is_err());
    }

    #[test]
    fn limits_refuse_long_keys_and_batches() {
        let limits = Limits {
            max_key_bytes: 8,
            max_batch_len: 2,
        };
        let ok = ExistKey {
            key: "12345678".into(),
            tenant: String::new(),
        };
        assert_eq!(ok.check_limits(&limits), Ok(()));
        let long = ExistKey {
            key: "123456789".into(),
            tenant: String::new(),
        };
        assert_eq!(long.check_limits(&limits), Err(ErrorCode::INVALID_KEY));
        let batch = BatchExistKey {
            keys: vec!["a".into(); 3],
            tenant: String::new(),
        };
        assert_eq!(batch.check_limits(&limits), Err(ErrorCode::INVALID_PARAMS));
    }
}
