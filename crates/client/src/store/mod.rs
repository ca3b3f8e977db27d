//! The store client: contributes a segment of memory to the cluster (optional), and puts and
//! gets objects by moving bytes directly between its memory and the segments the master chose.
//!
//! Put = PutStart → write every memory replica in one transfer batch → PutEnd (PutRevoke on any
//! failure). Get = one master round trip (descriptors + lease) → read the best replica (this
//! process, then this host over shared memory, then remote), trying the next replica when a
//! transfer fails; the bytes are refused when the lease ran out mid-read (the memory may have
//! been reused) or their checksum does not match the one recorded at PutEnd.
//!
//! Caller memory is used in place: a plain `put` registers the caller's slice for the duration of
//! the transfer (no staging copy, so no cap from a staging buffer), and buffers registered with
//! [`StoreClient::register_buffer`] skip even that. A guard unregisters on every exit path,
//! including cancellation, and unregistering waits for in-flight transfers, so the engine never
//! touches caller memory after an operation returns or is dropped.

pub mod addressing;
mod error;

pub use error::StoreError;

use mooncake_common::{
    ClientId, ClientStatus, ErrorCode, GetReplicaListResponse, ObjectMeta, ReplicaDescriptor,
    ReplicaKind, ReplicaStatus, ReplicaType, ReplicateConfig, Segment, SegmentId,
};
use mooncake_proto::methods as m;
use mooncake_rpc::ClientConfig;
use mooncake_transfer::{
    crc32c_combine, Endpoint, MemoryHandle, SegmentOptions, TransferConfig, TransferEngine,
    TransferError, TransferRequest, TransportMode,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::master_client::{MasterClient, MasterError};
use addressing::{segment_base, split_address, MAX_SEGMENT_BYTES};

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The bytes were written and the object is visible.
    Stored,
    /// The key already existed (or another client was writing it); the first write stays and
    /// nothing was written. Upstream reports success here too; engines rely on it.
    AlreadyPresent,
}

/// Settings of a store client.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The master's RPC address (`host:port`).
    pub master_addr: String,
    /// Host (or `host:port`) peers use to reach this client's transfer server.
    pub local_hostname: String,
    /// Bytes of memory this client contributes to the cluster (0 = none: a pure requester).
    pub global_segment_size: u64,
    /// Accepted for compatibility with upstream's setup. Puts and gets use the caller's memory in
    /// place, so this does not cap object sizes; it is reserved for buffer-returning APIs.
    pub local_buffer_size: u64,
    /// `"tcp"` (the only protocol; same-host peers still use shared memory unless
    /// `transport` says otherwise).
    pub protocol: String,
    /// `auto` (shared memory with same-host peers, TCP otherwise), `tcp` or `shm`.
    pub transport: TransportMode,
    /// Tenant of every key (empty = `default`).
    pub tenant: String,
    /// Record a CRC32C at PutEnd and verify it on every get.
    pub verify_checksums: bool,
    /// Ping period (upstream: 1 s).
    pub heartbeat_interval: Duration,
    /// Master RPC settings (timeouts, busy polling).
    pub rpc: ClientConfig,
    /// Transfer engine settings (bind address and advertised host are derived from
    /// `local_hostname`).
    pub transfer: TransferConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            master_addr: "127.0.0.1:50051".to_string(),
            local_hostname: "127.0.0.1".to_string(),
            global_segment_size: 16 << 20,
            local_buffer_size: 16 << 20,
            protocol: "tcp".to_string(),
            transport: TransportMode::Auto,
            tenant: String::new(),
            verify_checksums: true,
            heartbeat_interval: Duration::from_secs(1),
            rpc: ClientConfig::default(),
            transfer: TransferConfig::default(),
        }
    }
}

/// A segment this client contributed.
#[derive(Debug)]
struct MountedSegment {
    memory: MemoryHandle,
    segment: Segment,
}

/// Counters a client keeps about itself.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub heartbeats_ok: AtomicU64,
    pub heartbeat_failures: AtomicU64,
    pub remounts: AtomicU64,
    pub replica_fallbacks: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    config: StoreConfig,
    master: MasterClient,
    engine: TransferEngine,
    client_id: ClientId,
    segments: Mutex<Vec<MountedSegment>>,
    /// Parsed endpoints of peers, by the string the master carries.
    endpoints: Mutex<EndpointCache>,
    /// Buffers registered by the caller: start address → (length, region id).
    user_buffers: Mutex<HashMap<usize, (usize, u64)>>,
    closed: AtomicBool,
    stats: StoreStats,
}

/// Parsed endpoints by the string the master carries (about 150 bytes each). The entry used
/// last is checked first, by comparing the bytes: the keys of a batch mostly live on one node,
/// and hashing the string twice per key with SipHash plus the lookup were 1.0-1.6% of the
/// CPU samples of a Python 32 × 64 KiB `batch_get_into` loop (`perf`).
#[derive(Debug, Default)]
struct EndpointCache {
    last: Option<(Arc<str>, Arc<Endpoint>)>,
    by_text: HashMap<Arc<str>, Arc<Endpoint>>,
}

impl EndpointCache {
    /// Most endpoints kept (a client talks to every node of a cluster, not more).
    const MAX_ENTRIES: usize = 65_536;

    fn get(&mut self, text: &str) -> Option<Arc<Endpoint>> {
        if let Some((last_text, endpoint)) = &self.last {
            if **last_text == *text {
                return Some(Arc::clone(endpoint));
            }
        }
        let (key, endpoint) = self.by_text.get_key_value(text)?;
        let found = (Arc::clone(key), Arc::clone(endpoint));
        let endpoint = Arc::clone(&found.1);
        self.last = Some(found);
        Some(endpoint)
    }

    fn insert(&mut self, text: &str, endpoint: &Arc<Endpoint>) {
        if self.by_text.len() >= Self::MAX_ENTRIES {
            self.by_text.clear();
        }
        let key: Arc<str> = Arc::from(text);
        self.by_text.insert(Arc::clone(&key), Arc::clone(endpoint));
        self.last = Some((key, Arc::clone(endpoint)));
    }
}

/// An async store client. Cheap to clone; all clones share one connection and engine.
#[derive(Debug, Clone)]
pub struct StoreClient {
    inner: Arc<Inner>,
    heartbeat: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

fn resolve(addr: &str) -> Result<SocketAddr, StoreError> {
    addr.to_socket_addrs()
        .map_err(|e| StoreError::InvalidParams(format!("master address {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| {
            StoreError::InvalidParams(format!("master address {addr:?} resolves to nothing"))
        })
}

/// Splits `local_hostname` into the host to advertise and the socket address to bind.
fn transfer_bind(local_hostname: &str) -> Result<(String, SocketAddr), StoreError> {
    let (host, port) = match local_hostname.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.starts_with('[') => {
            let port: u16 = port.parse().map_err(|_| {
                StoreError::InvalidParams(format!("local_hostname {local_hostname:?}: bad port"))
            })?;
            (
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
                port,
            )
        }
        _ => (local_hostname.to_string(), 0),
    };
    if host.is_empty() {
        return Err(StoreError::InvalidParams(
            "local_hostname is empty".to_string(),
        ));
    }
    let bind = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| {
            StoreError::InvalidParams(format!("local_hostname {host:?} does not resolve: {e}"))
        })?
        .next()
        .ok_or_else(|| {
            StoreError::InvalidParams(format!("local_hostname {host:?} resolves to nothing"))
        })?;
    Ok((host, bind))
}

impl StoreClient {
    /// Connects to the master, starts the transfer engine, mounts the global segment (if any)
    /// and starts the heartbeat. Must be called inside a tokio runtime.
    pub async fn connect(config: StoreConfig) -> Result<StoreClient, StoreError> {
        if config.protocol != "tcp" {
            return Err(StoreError::InvalidParams(format!(
                "protocol {:?} is not supported (tcp; same-host peers use shared memory automatically)",
                config.protocol
            )));
        }
        if config.global_segment_size > MAX_SEGMENT_BYTES {
            return Err(StoreError::InvalidParams(format!(
                "global_segment_size {} exceeds the 1 TiB limit",
                config.global_segment_size
            )));
        }
        let master_addr = resolve(&config.master_addr)?;
        let (host, bind) = transfer_bind(&config.local_hostname)?;
        let mut transfer = config.transfer.clone();
        transfer.tcp_bind_addr = bind;
        transfer.advertise_host = Some(host);
        transfer.transport = config.transport;
        let engine = TransferEngine::start(transfer)?;
        let master = MasterClient::new(master_addr, config.rpc.clone());
        master.service_ready().await?;
        let inner = Arc::new(Inner {
            master,
            engine,
            client_id: ClientId::random(),
            segments: Mutex::new(Vec::new()),
            endpoints: Mutex::new(EndpointCache::default()),
            user_buffers: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            stats: StoreStats::default(),
            config,
        });
        let client = StoreClient {
            inner,
            heartbeat: Arc::new(Mutex::new(None)),
        };
        if client.inner.config.global_segment_size > 0 {
            client
                .mount_segment(client.inner.config.global_segment_size)
                .await?;
        }
        let weak = Arc::downgrade(&client.inner);
        let period = client.inner.config.heartbeat_interval;
        *client.heartbeat.lock() = Some(tokio::spawn(heartbeat_loop(weak, period)));
        Ok(client)
    }

    /// This client's id at the master.
    pub fn client_id(&self) -> ClientId {
        self.inner.client_id
    }

    /// The endpoint string peers use to reach this client's segments.
    pub fn endpoint(&self) -> String {
        self.inner.engine.endpoint().to_string()
    }

    /// The master client (for calls this type does not wrap).
    pub fn master(&self) -> &MasterClient {
        &self.inner.master
    }

    /// Heartbeat and fallback counters.
    pub fn stats(&self) -> &StoreStats {
        &self.inner.stats
    }

    /// How often a call to the master read its answer from the socket on the calling thread
    /// (busy-poll mode, calls through `block_on`; see `mooncake_rpc::ClientConfig::busy_poll`).
    pub fn master_caller_reads(&self) -> u64 {
        self.inner.master.caller_reads()
    }

    /// How calls to the master waited for their answers: the busy-poll mode's verdicts (see
    /// `mooncake_rpc::ClientConfig::poll_policy`) and the callers' own reads.
    pub fn master_poll_stats(&self) -> mooncake_rpc::PollStats {
        self.inner.master.poll_stats()
    }

    /// The segments this client contributed.
    pub fn segments(&self) -> Vec<Segment> {
        self.inner
            .segments
            .lock()
            .iter()
            .map(|s| s.segment.clone())
            .collect()
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    fn tenant(&self) -> &str {
        &self.inner.config.tenant
    }

    /// Allocates `size_bytes` of shareable memory and mounts it at the master.
    pub async fn mount_segment(&self, size_bytes: u64) -> Result<Segment, StoreError> {
        self.check_open()?;
        let inner = &self.inner;
        let len = usize::try_from(size_bytes)
            .map_err(|_| StoreError::InvalidParams("segment too large".to_string()))?;
        let memory = inner
            .engine
            .allocate_segment(len, SegmentOptions::default())?;
        let base = segment_base(memory.id()).ok_or_else(|| {
            StoreError::InvalidParams(format!("segment id {} out of range", memory.id()))
        })?;
        let endpoint = inner.engine.endpoint();
        let segment = Segment {
            id: SegmentId::random(),
            name: endpoint.tcp_authority(),
            base,
            size: size_bytes,
            te_endpoint: endpoint.to_string(),
            protocol: inner.config.protocol.clone(),
            host_id: endpoint.host_id().unwrap_or_default().to_string(),
        };
        if let Err(error) = inner
            .master
            .mount_segment(segment.clone(), inner.client_id)
            .await
        {
            let _ = inner.engine.unregister(memory.id());
            return Err(error.into());
        }
        inner.segments.lock().push(MountedSegment {
            memory,
            segment: segment.clone(),
        });
        Ok(segment)
    }

    /// Sends one heartbeat now; re-mounts every segment when the master asks for it.
    pub async fn heartbeat(&self) -> Result<ClientStatus, StoreError> {
        heartbeat_once(&self.inner).await
    }

    // ----- writes --------------------------------------------------------------------------------

    /// Stores `value` under `key` unless the key exists or is being written.
    pub async fn put(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.put_parts(key, &[value], config).await
    }

    /// Stores the concatenation of `parts` (no concatenation copy is made).
    pub async fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.write_object(WriteMode::Put, key, parts, config).await
    }

    /// The two-phase write shared by put and upsert: start (allocate) → write every replica →
    /// end, or revoke on any failure. Put's OBJECT_ALREADY_EXISTS is `AlreadyPresent`.
    async fn write_object(
        &self,
        mode: WriteMode,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.check_open()?;
        let inner = &self.inner;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let replicas = match mode.start(inner, key, total, config).await {
            Ok(replicas) => replicas,
            Err(MasterError::Master(ErrorCode::OBJECT_ALREADY_EXISTS))
                if mode == WriteMode::Put =>
            {
                return Ok(PutOutcome::AlreadyPresent)
            }
            Err(error) => return Err(error.into()),
        };
        match self.write_replicas(&replicas, parts, total).await {
            Ok(crc) => {
                let checksum = inner
                    .config
                    .verify_checksums
                    .then(|| crc.map_or_else(|| checksum_of(parts), u64::from));
                let meta = ObjectMeta {
                    key: key.to_string(),
                    object_checksum: checksum,
                };
                mode.end(inner, meta).await?;
                Ok(PutOutcome::Stored)
            }
            Err(error) => {
                let _ = mode.revoke(inner, key).await;
                Err(error)
            }
        }
    }

    /// Writes `parts` into every memory replica of `replicas`. With checksums on, returns the
    /// CRC32C of the bytes the transfer engine computed while writing the first replica (each
    /// part on the thread that copied it, while it was in cache); `None` when nothing was
    /// checksummed (no memory replica, or nothing but empty parts).
    async fn write_replicas(
        &self,
        replicas: &[ReplicaDescriptor],
        parts: &[&[u8]],
        total: u64,
    ) -> Result<Option<u32>, StoreError> {
        let pins = match self.pin_all(parts.iter().map(|p| (p.as_ptr() as usize, p.len()))) {
            Ok(pins) => pins,
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // Another operation has these bytes registered right now (e.g. two puts of one
                // buffer): write from a private copy instead.
                let copies: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
                let borrowed: Vec<&[u8]> = copies.iter().map(|c| c.as_slice()).collect();
                return Box::pin(self.write_replicas(replicas, &borrowed, total)).await;
            }
            Err(error) => return Err(error),
        };
        let mut requests = Vec::new();
        // Indices of the checksummed requests, in byte order (the first memory replica's parts).
        let mut summed = Vec::new();
        for replica in replicas {
            let ReplicaKind::Memory(memory) = &replica.kind else {
                continue;
            };
            let checksum = self.inner.config.verify_checksums && summed.is_empty();
            if memory.size != total {
                return Err(StoreError::InvalidParams(format!(
                    "master allocated {} bytes for a {total}-byte object",
                    memory.size
                )));
            }
            let endpoint = self.endpoint_of(&memory.transport_endpoint)?;
            let (segment, mut offset) = split_address(memory.buffer_address);
            for part in parts.iter().filter(|p| !p.is_empty()) {
                let mut request = TransferRequest::write(
                    part.as_ptr(),
                    part.len() as u64,
                    &endpoint,
                    segment,
                    offset,
                );
                if checksum {
                    request.checksum = true;
                    summed.push(requests.len());
                }
                requests.push(request);
                offset += part.len() as u64;
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let results = batch.wait_async().await;
        drop(pins);
        results
            .into_iter()
            .collect::<Result<Vec<()>, TransferError>>()?;
        let mut crc: Option<u32> = None;
        for index in summed {
            let (Some(piece), len) = (batch.checksum(index), requests[index].len_bytes) else {
                return Ok(None);
            };
            crc = Some(crc.map_or(piece, |before| crc32c_combine(before, piece, len)));
        }
        Ok(crc)
    }

    /// Stores many objects: one PutStart batch, one transfer batch, one PutEnd batch.
    pub async fn put_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<PutOutcome, StoreError>> {
        self.write_objects(WriteMode::Put, items, config).await
    }

    /// The batch form of [`StoreClient::write_object`]: one start batch, one transfer batch for
    /// every replica of every started key, one end batch and one revoke batch.
    async fn write_objects(
        &self,
        mode: WriteMode,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<PutOutcome, StoreError>> {
        if let Err(error) = self.check_open() {
            return items.iter().map(|_| Err(error.clone())).collect();
        }
        let inner = &self.inner;
        let keys: Vec<String> = items.iter().map(|(k, _)| k.to_string()).collect();
        let lens: Vec<u64> = items.iter().map(|(_, v)| v.len() as u64).collect();
        let started = match mode.start_batch(inner, keys.clone(), lens, config).await {
            Ok(started) if started.len() == items.len() => started,
            Ok(_) => {
                let e =
                    StoreError::InvalidParams("master answered a batch of the wrong length".into());
                return items.iter().map(|_| Err(e.clone())).collect();
            }
            Err(error) => return items.iter().map(|_| Err(error.clone().into())).collect(),
        };
        let mut results: Vec<Option<Result<PutOutcome, StoreError>>> = vec![None; items.len()];
        let mut to_write = Vec::new();
        for (i, start) in started.into_iter().enumerate() {
            match start {
                Ok(replicas) => to_write.push((i, replicas)),
                Err(ErrorCode::OBJECT_ALREADY_EXISTS) if mode == WriteMode::Put => {
                    results[i] = Some(Ok(PutOutcome::AlreadyPresent))
                }
                Err(code) => results[i] = Some(Err(code.into())),
            }
        }
        let written = self.write_many(items, &to_write).await;
        let mut ended = Vec::new();
        let mut revoked = Vec::new();
        // CRC32C the engine computed while writing each item's first replica.
        let mut crcs: Vec<Option<u32>> = vec![None; items.len()];
        for ((i, _), outcome) in to_write.iter().zip(written) {
            match outcome {
                Ok(crc) => {
                    crcs[*i] = crc;
                    ended.push(*i)
                }
                Err(error) => {
                    revoked.push(*i);
                    results[*i] = Some(Err(error));
                }
            }
        }
        if !revoked.is_empty() {
            let keys = revoked.iter().map(|&i| keys[i].clone()).collect();
            let _ = mode.revoke_batch(inner, keys).await;
        }
        if !ended.is_empty() {
            let metas: Vec<ObjectMeta> = ended
                .iter()
                .map(|&i| ObjectMeta {
                    key: keys[i].clone(),
                    object_checksum: inner
                        .config
                        .verify_checksums
                        .then(|| crcs[i].map_or_else(|| checksum_of(&[items[i].1]), u64::from)),
                })
                .collect();
            match mode.end_batch(inner, metas).await {
                Ok(each) if each.len() == ended.len() => {
                    for (&i, r) in ended.iter().zip(each) {
                        results[i] = Some(r.map(|()| PutOutcome::Stored).map_err(StoreError::from));
                    }
                }
                Ok(_) => {
                    for &i in &ended {
                        results[i] = Some(Err(StoreError::InvalidParams(
                            "the master answered an end batch of the wrong length".into(),
                        )));
                    }
                }
                Err(error) => {
                    for &i in &ended {
                        results[i] = Some(Err(error.clone().into()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost batch entry".into()))))
            .collect()
    }

    /// Stores `value` under `key`, replacing an existing value (upstream's `upsert`). The key
    /// is unreadable between the start and the end; on any failure the write is revoked.
    pub async fn upsert(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.upsert_parts(key, &[value], config).await
    }

    /// [`StoreClient::upsert`] of the concatenation of `parts`.
    pub async fn upsert_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.write_object(WriteMode::Upsert, key, parts, config)
            .await
            .map(|_| ())
    }

    /// Upserts many objects: one start batch, one transfer batch, one end batch.
    pub async fn upsert_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), StoreError>> {
        self.write_objects(WriteMode::Upsert, items, config)
            .await
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect()
    }

    /// Writes `items[i]` to `replicas` for every `(i, replicas)`; one result per pair, with the
    /// CRC32C of the first replica's write when checksums are on (see `write_replicas`).
    async fn write_many(
        &self,
        items: &[(&str, &[u8])],
        to_write: &[(usize, Vec<ReplicaDescriptor>)],
    ) -> Vec<Result<Option<u32>, StoreError>> {
        let pins = match self.pin_all(to_write.iter().map(|(i, _)| {
            let value = items[*i].1;
            (value.as_ptr() as usize, value.len())
        })) {
            Ok(pins) => pins,
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // Bytes registered by a concurrent operation: write from private copies.
                let copies: Vec<(String, Vec<u8>)> = items
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_vec()))
                    .collect();
                let borrowed: Vec<(&str, &[u8])> = copies
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                return Box::pin(self.write_many(&borrowed, to_write)).await;
            }
            Err(error) => return to_write.iter().map(|_| Err(error.clone())).collect(),
        };
        let mut requests = Vec::new();
        let mut owner = Vec::new();
        let mut early: Vec<Option<StoreError>> = vec![None; to_write.len()];
        // The request whose checksum stands for each slot's value.
        let mut summed: Vec<Option<usize>> = vec![None; to_write.len()];
        for (slot, (i, replicas)) in to_write.iter().enumerate() {
            let value = items[*i].1;
            for replica in replicas {
                let ReplicaKind::Memory(memory) = &replica.kind else {
                    continue;
                };
                if memory.size != value.len() as u64 {
                    early[slot] = Some(StoreError::InvalidParams("replica size mismatch".into()));
                    continue;
                }
                match self.endpoint_of(&memory.transport_endpoint) {
                    Ok(endpoint) => {
                        let (segment, offset) = split_address(memory.buffer_address);
                        let mut request = TransferRequest::write(
                            value.as_ptr(),
                            value.len() as u64,
                            &endpoint,
                            segment,
                            offset,
                        );
                        if self.inner.config.verify_checksums && summed[slot].is_none() {
                            request.checksum = true;
                            summed[slot] = Some(requests.len());
                        }
                        requests.push(request);
                        owner.push(slot);
                    }
                    Err(error) => early[slot] = Some(error),
                }
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let results = batch.wait_async().await;
        drop(pins);
        for (slot, result) in owner.into_iter().zip(results) {
            if let (Err(error), None) = (result, &early[slot]) {
                early[slot] = Some(error.into());
            }
        }
        early
            .into_iter()
            .zip(summed)
            .map(|(e, summed)| match e {
                Some(error) => Err(error),
                None => Ok(summed.and_then(|index| batch.checksum(index))),
            })
            .collect()
    }

    // ----- reads ---------------------------------------------------------------------------------

    /// Reads the object stored under `key`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.check_open()?;
        let asked = Instant::now();
        let response = self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?;
        let size = object_size(key, &response)?;
        let len = usize::try_from(size)
            .map_err(|_| StoreError::InvalidParams("object too large".into()))?;
        // No zero fill: the transfer writes every byte, and the length is set only after it did.
        let mut out: Vec<u8> = Vec::with_capacity(len);
        let crc = self
            .read_with_fallback(&response, out.as_mut_ptr() as usize, len, 0)
            .await?;
        // SAFETY: the read succeeded, so the engine wrote all `len` bytes of the capacity.
        unsafe { out.set_len(len) };
        self.check_read(key, &response, asked, &out, crc)?;
        Ok(out)
    }

    /// Reads the object into `buffer`; returns its size.
    pub async fn get_into(&self, key: &str, buffer: &mut [u8]) -> Result<u64, StoreError> {
        self.check_open()?;
        let asked = Instant::now();
        let response = self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?;
        let size = object_size(key, &response)?;
        if (buffer.len() as u64) < size {
            return Err(StoreError::BufferTooSmall {
                buffer_bytes: buffer.len() as u64,
                object_bytes: size,
            });
        }
        let destination = &mut buffer[..size as usize];
        match self.read_into(key, &response, asked, destination).await {
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // The buffer overlaps memory a concurrent operation registered: read privately.
                let mut private = vec![0u8; destination.len()];
                self.read_into(key, &response, asked, &mut private).await?;
                destination.copy_from_slice(&private);
            }
            other => other?,
        }
        Ok(size)
    }

    /// Reads many objects: one master round trip, then one transfer batch.
    pub async fn get_batch(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, StoreError>> {
        let asked = Instant::now();
        let located = match self.locate_batch(keys).await {
            Ok(located) => located,
            Err(error) => return keys.iter().map(|_| Err(error.clone())).collect(),
        };
        let mut buffers: Vec<Result<PendingRead, StoreError>> = located
            .into_iter()
            .map(|entry| {
                let (size, response) = entry?;
                let len = usize::try_from(size)
                    .map_err(|_| StoreError::InvalidParams("object too large".into()))?;
                // Filled by the transfer; its length is set only once every byte was written.
                Ok((Vec::with_capacity(len), len, response))
            })
            .collect();
        let first = self
            .read_first(buffers.iter_mut().enumerate().filter_map(|(i, entry)| {
                let (buf, len, response) = entry.as_mut().ok()?;
                Some((i, buf.as_mut_ptr() as usize, *len, &*response))
            }))
            .await;
        let mut results = Vec::with_capacity(keys.len());
        for (i, entry) in buffers.into_iter().enumerate() {
            let key = keys[i];
            let outcome = match entry {
                Err(error) => Err(error),
                Ok((mut buf, len, response)) => {
                    let addr = buf.as_mut_ptr() as usize;
                    let read = self
                        .after_first_read(first.get(&i), &response, addr, len)
                        .await;
                    read.and_then(|crc| {
                        // SAFETY: the read succeeded, so the engine wrote all `len` bytes.
                        unsafe { buf.set_len(len) };
                        self.check_read(key, &response, asked, &buf, crc)
                    })
                    .map(|()| buf)
                }
            };
            results.push(outcome);
        }
        results
    }

    /// Reads many objects into caller buffers (zero copy when they lie in registered memory):
    /// one master round trip, then one transfer batch. Returns each object's size. A buffer
    /// smaller than its object fails that key with `BufferTooSmall` and leaves the buffer as is.
    pub async fn get_batch_into(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64, StoreError>> {
        if keys.len() != buffers.len() {
            let e = StoreError::InvalidParams(format!(
                "{} keys but {} buffers",
                keys.len(),
                buffers.len()
            ));
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        self.get_batch_with(keys, |_| {
            buffers.iter_mut().map(|b| Some(&mut **b)).collect()
        })
        .await
    }

    /// Reads many objects into buffers the caller provides once their sizes are known: one
    /// master round trip, then `alloc` is called once with each key's size (`None` where the
    /// lookup failed) and returns one destination per key (`None` to skip the key), then one
    /// transfer batch. Returns each object's size (the bytes written at the start of its
    /// buffer). Lets bindings read straight into memory they allocate (a Python `bytes`), with
    /// no intermediate copy. A missing or short buffer fails that key and leaves it untouched.
    pub async fn get_batch_with<'b, F>(
        &self,
        keys: &[&str],
        alloc: F,
    ) -> Vec<Result<u64, StoreError>>
    where
        F: FnOnce(&[Option<u64>]) -> Vec<Option<&'b mut [u8]>>,
    {
        let asked = Instant::now();
        let located = match self.locate_batch(keys).await {
            Ok(located) => located,
            Err(error) => return keys.iter().map(|_| Err(error.clone())).collect(),
        };
        let sizes: Vec<Option<u64>> = located
            .iter()
            .map(|r| r.as_ref().ok().map(|(size, _)| *size))
            .collect();
        let mut buffers = alloc(&sizes);
        buffers.resize_with(keys.len(), || None);
        let checked: Vec<Result<(u64, GetReplicaListResponse), StoreError>> = located
            .into_iter()
            .zip(&buffers)
            .map(|(entry, buffer)| {
                let (size, response) = entry?;
                let available = buffer.as_ref().map_or(0, |b| b.len() as u64);
                if buffer.is_none() || available < size {
                    return Err(StoreError::BufferTooSmall {
                        buffer_bytes: available,
                        object_bytes: size,
                    });
                }
                Ok((size, response))
            })
            .collect();
        let first = self
            .read_first(
                checked
                    .iter()
                    .zip(buffers.iter_mut())
                    .enumerate()
                    .filter_map(|(i, (entry, buffer))| {
                        let (size, response) = entry.as_ref().ok()?;
                        let buffer = buffer.as_mut()?;
                        Some((i, buffer.as_mut_ptr() as usize, *size as usize, response))
                    }),
            )
            .await;
        let mut results = Vec::with_capacity(keys.len());
        for (i, entry) in checked.into_iter().enumerate() {
            let key = keys[i];
            let outcome = match (entry, &mut buffers[i]) {
                (Err(error), _) => Err(error),
                (Ok(_), None) => Err(StoreError::InvalidParams("no buffer".into())),
                (Ok((size, response)), Some(buffer)) => {
                    let out = &mut buffer[..size as usize];
                    if let Some(Err(StoreError::Transfer(TransferError::Overlap { .. }))) =
                        first.get(&i)
                    {
                        // The buffer overlaps memory a concurrent operation registered: read
                        // privately, then copy.
                        let mut private = vec![0u8; out.len()];
                        let read = self.read_into(key, &response, asked, &mut private).await;
                        results.push(read.map(|()| {
                            out.copy_from_slice(&private);
                            size
                        }));
                        continue;
                    }
                    let addr = out.as_mut_ptr() as usize;
                    let read = self
                        .after_first_read(first.get(&i), &response, addr, out.len())
                        .await;
                    read.and_then(|crc| self.check_read(key, &response, asked, out, crc))
                        .map(|()| size)
                }
            };
            results.push(outcome);
        }
        results
    }

    /// Preference order of readable memory replicas: this process, this host, the rest.
    fn replica_order(&self, replicas: &[ReplicaDescriptor]) -> Vec<usize> {
        let me = self.inner.engine.endpoint();
        let mut ranked: Vec<(u8, usize)> = replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.status == ReplicaStatus::COMPLETE)
            .filter_map(|(i, r)| match &r.kind {
                ReplicaKind::Memory(memory) => {
                    let rank = match self.endpoint_of(&memory.transport_endpoint) {
                        Ok(ep) if ep.instance_id() == me.instance_id() => 0,
                        Ok(ep) if ep.host_id().is_some() && ep.host_id() == me.host_id() => 1,
                        Ok(_) => 2,
                        Err(_) => 3,
                    };
                    Some((rank, i))
                }
                _ => None,
            })
            .collect();
        ranked.sort_by_key(|&(rank, i)| (rank, i));
        ranked.into_iter().map(|(_, i)| i).collect()
    }

    /// One master round trip for a batch read: each key's size and replicas, in key order.
    async fn locate_batch(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<(u64, GetReplicaListResponse), StoreError>>, StoreError> {
        self.check_open()?;
        let owned: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let responses = self
            .inner
            .master
            .batch_get_replica_list(owned, self.tenant())
            .await?;
        if responses.len() != keys.len() {
            return Err(StoreError::InvalidParams(
                "master answered a batch of the wrong length".into(),
            ));
        }
        Ok(responses
            .into_iter()
            .zip(keys)
            .map(|(r, key)| {
                let response = r.map_err(StoreError::from)?;
                Ok((object_size(key, &response)?, response))
            })
            .collect())
    }

    /// The first attempt of a batch read: every `(tag, destination, length, lookup)` from its
    /// preferred replica, all in one transfer batch (see `read_planned`).
    async fn read_first<'r>(
        &self,
        targets: impl Iterator<Item = (usize, usize, usize, &'r GetReplicaListResponse)>,
    ) -> HashMap<usize, Result<Option<u32>, StoreError>> {
        let mut plan = Vec::new();
        for (tag, addr, len, response) in targets {
            if let Some(&first) = self.replica_order(&response.replicas).first() {
                plan.push((tag, addr, len, response.replicas[first].clone()));
            }
        }
        self.read_planned(&plan).await
    }

    /// The outcome of a key of a batch read after its first attempt (`first`, from
    /// `read_planned`): that attempt's checksum when it worked, else a read from the remaining
    /// replicas; when there are none, the first attempt's error (not a bare "no replica").
    async fn after_first_read(
        &self,
        first: Option<&Result<Option<u32>, StoreError>>,
        response: &GetReplicaListResponse,
        addr: usize,
        len: usize,
    ) -> Result<Option<u32>, StoreError> {
        if let Some(Ok(crc)) = first {
            return Ok(*crc);
        }
        self.inner
            .stats
            .replica_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        match self.read_with_fallback(response, addr, len, 1).await {
            Err(StoreError::NoReadableReplica { .. }) if first.is_some_and(|r| r.is_err()) => {
                match first {
                    Some(Err(error)) => Err(error.clone()),
                    _ => Err(StoreError::NoReadableReplica { key: String::new() }),
                }
            }
            other => other,
        }
    }

    async fn read_into(
        &self,
        key: &str,
        response: &GetReplicaListResponse,
        asked: Instant,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        let crc = self
            .read_with_fallback(response, out.as_mut_ptr() as usize, out.len(), 0)
            .await?;
        self.check_read(key, response, asked, out, crc)
    }

    /// Reads from the replicas in preference order, starting at position `skip`, until one works.
    ///
    /// `[addr, addr + len)` must be writable memory the caller owns for the whole call (it may be
    /// uninitialized: it is only written, by the transfer engine, and a success means every byte
    /// was written). Returns the bytes' CRC32C when checksums are verified (see `read_planned`).
    async fn read_with_fallback(
        &self,
        response: &GetReplicaListResponse,
        addr: usize,
        len: usize,
        skip: usize,
    ) -> Result<Option<u32>, StoreError> {
        let order = self.replica_order(&response.replicas);
        let mut last_error = None;
        for &i in order.iter().skip(skip) {
            let plan = [(0usize, addr, len, response.replicas[i].clone())];
            match self.read_planned(&plan).await.remove(&0) {
                Some(Ok(crc)) => return Ok(crc),
                Some(Err(error)) => {
                    self.inner
                        .stats
                        .replica_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    last_error = Some(error);
                }
                None => {}
            }
        }
        Err(last_error.unwrap_or(StoreError::NoReadableReplica { key: String::new() }))
    }

    /// Reads each `(tag, destination address, length, replica)` in one transfer batch.
    async fn read_planned(
        &self,
        plan: &[(usize, usize, usize, ReplicaDescriptor)],
    ) -> HashMap<usize, Result<Option<u32>, StoreError>> {
        let mut results = HashMap::new();
        let pins = match self.pin_all(plan.iter().map(|(_, addr, len, _)| (*addr, *len))) {
            Ok(pins) => pins,
            Err(error) => {
                for (tag, ..) in plan {
                    results.insert(*tag, Err(error.clone()));
                }
                return results;
            }
        };
        let mut requests = Vec::new();
        let mut tags = Vec::new();
        for (tag, addr, len, replica) in plan {
            let ReplicaKind::Memory(memory) = &replica.kind else {
                results.insert(
                    *tag,
                    Err(StoreError::NoReadableReplica { key: String::new() }),
                );
                continue;
            };
            match self.endpoint_of(&memory.transport_endpoint) {
                Ok(endpoint) => {
                    let (segment, offset) = split_address(memory.buffer_address);
                    let mut request = TransferRequest::read(
                        *addr as *mut u8,
                        *len as u64,
                        &endpoint,
                        segment,
                        offset,
                    );
                    // The engine checksums each chunk on the thread that moved it, while the
                    // bytes are still in that core's cache (and in parallel for split entries).
                    request.checksum = self.inner.config.verify_checksums;
                    requests.push(request);
                    tags.push(*tag);
                }
                Err(error) => {
                    results.insert(*tag, Err(error));
                }
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let done = batch.wait_async().await;
        drop(pins);
        for (index, (tag, result)) in tags.into_iter().zip(done).enumerate() {
            let read = result.map(|()| batch.checksum(index));
            results.insert(tag, read.map_err(StoreError::from));
        }
        results
    }

    /// The lease and checksum checks after the bytes arrived. `crc` is the CRC32C the transfer
    /// engine computed over `bytes` as they landed; without it the bytes are checksummed here.
    fn check_read(
        &self,
        key: &str,
        response: &GetReplicaListResponse,
        asked: Instant,
        bytes: &[u8],
        crc: Option<u32>,
    ) -> Result<(), StoreError> {
        let elapsed_ms = asked.elapsed().as_millis() as u64;
        if response.lease_ttl_ms != u64::MAX && elapsed_ms > response.lease_ttl_ms {
            return Err(StoreError::LeaseExpired {
                elapsed_ms,
                lease_ms: response.lease_ttl_ms,
            });
        }
        if self.inner.config.verify_checksums {
            if let Some(expected) = response.object_checksum {
                let actual = match crc {
                    Some(crc) => u64::from(crc),
                    None => checksum_of(&[bytes]),
                };
                if actual != expected {
                    return Err(StoreError::ChecksumMismatch {
                        key: key.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    // ----- metadata ------------------------------------------------------------------------------

    /// Whether `key` is readable (grants a read lease when it is).
    pub async fn is_exist(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.inner.master.exist_key(key, self.tenant()).await?)
    }

    pub async fn batch_is_exist(
        &self,
        keys: &[&str],
    ) -> Result<Vec<Result<bool, ErrorCode>>, StoreError> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        Ok(self
            .inner
            .master
            .batch_exist_key(keys, self.tenant())
            .await?)
    }

    /// The object's size in bytes.
    pub async fn get_size(&self, key: &str) -> Result<u64, StoreError> {
        let response = self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?;
        object_size(key, &response)
    }

    /// The readable replicas of `key`.
    pub async fn get_replica_desc(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, StoreError> {
        Ok(self
            .inner
            .master
            .get_replica_list(key, self.tenant())
            .await?
            .replicas)
    }

    pub async fn remove(&self, key: &str, force: bool) -> Result<(), StoreError> {
        Ok(self.inner.master.remove(key, force, self.tenant()).await?)
    }

    pub async fn batch_remove(
        &self,
        keys: &[&str],
        force: bool,
    ) -> Result<Vec<Result<(), ErrorCode>>, StoreError> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        Ok(self
            .inner
            .master
            .batch_remove(keys, force, self.tenant())
            .await?)
    }

    /// Removes every key matching `regex`; returns how many.
    pub async fn remove_by_regex(&self, regex: &str, force: bool) -> Result<i64, StoreError> {
        Ok(self
            .inner
            .master
            .call(&m::RemoveByRegex {
                regex: regex.to_string(),
                force,
                tenant: self.tenant().to_string(),
            })
            .await?)
    }

    /// Removes every key of this client's tenant; returns how many.
    pub async fn remove_all(&self, force: bool) -> Result<i64, StoreError> {
        Ok(self.inner.master.remove_all(force, self.tenant()).await?)
    }

    // ----- registered buffers --------------------------------------------------------------------

    /// Registers caller memory for zero-copy `put`/`get_into` calls on slices inside it.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay valid for reads and writes until
    /// [`StoreClient::unregister_buffer`] returns `Ok` or the client is closed.
    pub unsafe fn register_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        // SAFETY: forwarded to the caller's contract.
        let region = unsafe { self.inner.engine.register_user_buffer(ptr, len) }?;
        self.inner
            .user_buffers
            .lock()
            .insert(ptr as usize, (len, region));
        Ok(())
    }

    /// Unregisters a buffer registered at `ptr`, waiting for transfers that use it.
    pub fn unregister_buffer(&self, ptr: *mut u8) -> Result<(), StoreError> {
        let entry = self.inner.user_buffers.lock().remove(&(ptr as usize));
        let Some((len, region)) = entry else {
            return Err(StoreError::InvalidParams(format!(
                "no buffer registered at {ptr:p}"
            )));
        };
        if let Err(error) = self.inner.engine.unregister(region) {
            self.inner
                .user_buffers
                .lock()
                .insert(ptr as usize, (len, region));
            return Err(error.into());
        }
        Ok(())
    }

    /// Makes every `(addr, len)` usable as the local side of transfers until the returned pins
    /// drop: ranges inside a caller-registered buffer need nothing; others are registered now.
    fn pin_all(
        &self,
        ranges: impl Iterator<Item = (usize, usize)>,
    ) -> Result<Pins<'_>, StoreError> {
        let mut pins = Pins {
            engine: &self.inner.engine,
            regions: Vec::new(),
        };
        let mut wanted: Vec<(usize, usize)> = ranges.filter(|(_, len)| *len > 0).collect();
        {
            let registered = self.inner.user_buffers.lock();
            wanted.retain(|&(addr, len)| {
                !registered
                    .iter()
                    .any(|(&start, &(rlen, _))| addr >= start && addr + len <= start + rlen)
            });
        }
        // Merge overlapping or touching ranges so each byte is registered once.
        wanted.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (addr, len) in wanted {
            match merged.last_mut() {
                Some((start, mlen)) if addr <= *start + *mlen => {
                    *mlen = (*mlen).max(addr + len - *start);
                }
                _ => merged.push((addr, len)),
            }
        }
        for (addr, len) in merged {
            // SAFETY: the ranges come from slices borrowed by the calling operation, which holds
            // them until the pins drop; `Pins::drop` unregisters (waiting out in-flight transfers)
            // before that borrow ends, on every path including cancellation.
            let region = unsafe { self.inner.engine.register_user_buffer(addr as *mut u8, len) }?;
            pins.regions.push(region);
        }
        Ok(pins)
    }

    fn endpoint_of(&self, text: &str) -> Result<Arc<Endpoint>, StoreError> {
        if let Some(endpoint) = self.inner.endpoints.lock().get(text) {
            return Ok(endpoint);
        }
        let endpoint = Arc::new(Endpoint::parse(text)?);
        self.inner.endpoints.lock().insert(text, &endpoint);
        Ok(endpoint)
    }

    // ----- shutdown ------------------------------------------------------------------------------

    /// Stops heartbeating and serving this client's segments without unmounting them, as a
    /// crashed process would; the master learns of it only when the client's TTL runs out. For
    /// failure tests and for abandoning a client whose master is gone.
    pub fn abort(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(task) = self.heartbeat.lock().take() {
            task.abort();
        }
        self.inner.engine.shutdown();
    }

    /// Unmounts every segment (its objects stay readable only where other replicas exist), stops
    /// the heartbeat and the transfer engine. Later calls fail with `Closed`.
    pub async fn close(&self) -> Result<(), StoreError> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(task) = self.heartbeat.lock().take() {
            task.abort();
        }
        let segments: Vec<MountedSegment> = std::mem::take(&mut *self.inner.segments.lock());
        let mut first_error = None;
        for mounted in segments {
            if let Err(error) = self
                .inner
                .master
                .unmount_segment(mounted.segment.id, self.inner.client_id)
                .await
            {
                first_error.get_or_insert(StoreError::from(error));
            }
            let _ = self.inner.engine.unregister(mounted.memory.id());
        }
        self.inner.engine.shutdown();
        first_error.map_or(Ok(()), Err)
    }
}

/// A batch get's destination (capacity reserved, length set once filled), its size, and where
/// to read it from.
type PendingRead = (Vec<u8>, usize, GetReplicaListResponse);

/// Registrations made for one operation; dropping them unregisters, waiting out transfers.
struct Pins<'a> {
    engine: &'a TransferEngine,
    regions: Vec<u64>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        for &region in &self.regions {
            // Unregister waits for in-flight transfers; every transfer has a deadline, so this
            // loop ends. Returning before it succeeds could let the engine touch freed memory.
            while let Err(TransferError::RegionBusy { .. }) = self.engine.unregister(region) {}
        }
    }
}

/// Which two-phase write: put (write-once) or upsert (replace). Picks the master RPCs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    Put,
    Upsert,
}

impl WriteMode {
    async fn start(
        self,
        inner: &Inner,
        key: &str,
        value_len: u64,
        config: &ReplicateConfig,
    ) -> Result<Vec<ReplicaDescriptor>, MasterError> {
        let (client, key, config, tenant) = (
            inner.client_id,
            key.to_string(),
            config.clone(),
            inner.config.tenant.clone(),
        );
        match self {
            WriteMode::Put => {
                let request = m::PutStart {
                    client,
                    key,
                    value_len,
                    config,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::UpsertStart {
                    client,
                    key,
                    value_len,
                    config,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }

    async fn end(self, inner: &Inner, meta: ObjectMeta) -> Result<(), MasterError> {
        let (client, replica_type, tenant) = (
            inner.client_id,
            ReplicaType::ALL,
            inner.config.tenant.clone(),
        );
        match self {
            WriteMode::Put => {
                let request = m::PutEnd {
                    client,
                    meta,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::UpsertEnd {
                    client,
                    meta,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }

    async fn revoke(self, inner: &Inner, key: &str) -> Result<(), MasterError> {
        let (client, key, replica_type, tenant) = (
            inner.client_id,
            key.to_string(),
            ReplicaType::ALL,
            inner.config.tenant.clone(),
        );
        match self {
            WriteMode::Put => {
                let request = m::PutRevoke {
                    client,
                    key,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::UpsertRevoke {
                    client,
                    key,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }

    async fn start_batch(
        self,
        inner: &Inner,
        keys: Vec<String>,
        value_lens: Vec<u64>,
        config: &ReplicateConfig,
    ) -> Result<Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>>, MasterError> {
        let (client, config, tenant) =
            (inner.client_id, config.clone(), inner.config.tenant.clone());
        match self {
            WriteMode::Put => {
                let request = m::BatchPutStart {
                    client,
                    keys,
                    value_lens,
                    config,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::BatchUpsertStart {
                    client,
                    keys,
                    value_lens,
                    config,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }

    async fn end_batch(
        self,
        inner: &Inner,
        metas: Vec<ObjectMeta>,
    ) -> Result<Vec<Result<(), ErrorCode>>, MasterError> {
        let (client, tenant) = (inner.client_id, inner.config.tenant.clone());
        match self {
            WriteMode::Put => {
                let replica_type = ReplicaType::ALL;
                let request = m::BatchPutEnd {
                    client,
                    metas,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::BatchUpsertEnd {
                    client,
                    metas,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }

    async fn revoke_batch(
        self,
        inner: &Inner,
        keys: Vec<String>,
    ) -> Result<Vec<Result<(), ErrorCode>>, MasterError> {
        let (client, tenant) = (inner.client_id, inner.config.tenant.clone());
        match self {
            WriteMode::Put => {
                let replica_type = ReplicaType::ALL;
                let request = m::BatchPutRevoke {
                    client,
                    keys,
                    replica_type,
                    tenant,
                };
                inner.master.call(&request).await
            }
            WriteMode::Upsert => {
                let request = m::BatchUpsertRevoke {
                    client,
                    keys,
                    tenant,
                };
                inner.master.call(&request).await
            }
        }
    }
}

/// CRC32C (Castagnoli) of the concatenated parts. `crc-fast` folds with VPCLMULQDQ where the CPU
/// has it (about 2× the `crc32c` crate's SSE4.2 loop here: 57 vs 28 GB/s on cached data) and falls
/// back to the SSE4.2 instruction or a table elsewhere; the value is the same CRC32C either way.
fn checksum_of(parts: &[&[u8]]) -> u64 {
    match parts {
        [one] => crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, one),
        _ => {
            let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
            for part in parts {
                digest.update(part);
            }
            digest.finalize()
        }
    }
}

/// The size of an object from its readable replicas.
fn object_size(key: &str, response: &GetReplicaListResponse) -> Result<u64, StoreError> {
    response
        .replicas
        .iter()
        .find_map(|r| match &r.kind {
            ReplicaKind::Memory(m) => Some(m.size),
            ReplicaKind::Disk(d) => Some(d.object_size),
            ReplicaKind::LocalDisk(d) => Some(d.object_size),
            _ => None,
        })
        .ok_or_else(|| StoreError::NoReadableReplica {
            key: key.to_string(),
        })
}

async fn heartbeat_once(inner: &Inner) -> Result<ClientStatus, StoreError> {
    let response = inner.master.ping(inner.client_id).await?;
    if response.client_status == ClientStatus::NEED_REMOUNT {
        let segments: Vec<Segment> = inner
            .segments
            .lock()
            .iter()
            .map(|s| s.segment.clone())
            .collect();
        inner
            .master
            .remount_segments(segments, inner.client_id)
            .await?;
        inner.stats.remounts.fetch_add(1, Ordering::Relaxed);
    }
    Ok(response.client_status)
}

async fn heartbeat_loop(inner: std::sync::Weak<Inner>, period: Duration) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = false;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        match heartbeat_once(&inner).await {
            Ok(_) => {
                inner.stats.heartbeats_ok.fetch_add(1, Ordering::Relaxed);
                reported = false;
            }
            Err(error) => {
                inner
                    .stats
                    .heartbeat_failures
                    .fetch_add(1, Ordering::Relaxed);
                if !reported {
                    tracing::warn!(%error, "heartbeat to the master failed");
                    reported = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{checksum_of, Endpoint, EndpointCache};
    use std::sync::Arc;

    /// The cache answers the endpoint of the string asked, whether it was the last one used or
    /// not, and starts over (forgetting all) once full.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn endpoint_cache_answers_each_string_its_own_endpoint() {
        let text = |i: u64| format!("tcp://127.0.0.1:{}?inst={i:016x}", 1000 + i % 60_000);
        let mut cache = EndpointCache::default();
        assert!(cache.get(&text(1)).is_none());
        for i in 1..=3 {
            let endpoint = Arc::new(Endpoint::parse(&text(i)).unwrap());
            cache.insert(&text(i), &endpoint);
        }
        for i in [3, 3, 1, 2, 2, 1, 3] {
            let got = cache.get(&text(i)).unwrap();
            assert_eq!(got.instance_id(), i);
            assert_eq!(got.tcp_authority(), format!("127.0.0.1:{}", 1000 + i));
        }
        assert!(cache.get(&text(4)).is_none());
        for i in 0..EndpointCache::MAX_ENTRIES as u64 {
            cache.insert(
                &text(10 + i),
                &Arc::new(Endpoint::parse(&text(10 + i)).unwrap()),
            );
        }
        assert!(cache.by_text.len() <= EndpointCache::MAX_ENTRIES);
        assert!(cache.get(&text(1)).is_none(), "a full cache starts over");
    }

    /// The fast checksum is plain CRC32C: the same value the `crc32c` crate (and the SSD tier)
    /// computes, for one part and for the same bytes split anywhere.
    #[test]
    fn checksum_is_crc32c_of_the_concatenated_parts() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        for len in [0usize, 1, 7, 64, 4096, 65_537, 300_000] {
            let whole = u64::from(crc32c::crc32c(&data[..len]));
            assert_eq!(checksum_of(&[&data[..len]]), whole, "len {len}");
            for split in [0, len / 3, len] {
                let (a, b) = data[..len].split_at(split);
                assert_eq!(checksum_of(&[a, b]), whole, "len {len} split {split}");
                assert_eq!(checksum_of(&[a, &[], b]), whole, "len {len} split {split}");
            }
        }
        assert_ne!(checksum_of(&[b"a"]), checksum_of(&[b"b"]));
    }
}
