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
//!
//! Files, by concern (each adds methods to [`StoreClient`]):
//! - `mod.rs`: the client, its config, connect / close / abort, small accessors;
//! - `write.rs`: put, upsert and their batches; the write leg (`write_replicas`, `write_many`,
//!   `write_target`);
//! - `read.rs`: get, get_into and the batch reads; replica choice and the read leg
//!   (`replica_order`, `read_planned`, `read_request`, `check_read`);
//! - `metadata.rs`: existence, sizes, descriptors, removal, replica clearing;
//! - `buffers.rs`: registered buffers and the per-operation pins of caller memory;
//! - `endpoints.rs`: the cache of parsed peer endpoints;
//! - `heartbeat.rs`: mounting the segment, the heartbeat and re-mount;
//! - `drain.rs`: moving this client's objects elsewhere before it leaves;
//! - `tasks.rs`: the copy and move tasks the master queues for this client;
//! - `verify.rs`: checking the replicas a restored master holds for this client's segments;
//! - `addressing.rs`: buffer address ↔ (segment, offset); `error.rs`: [`StoreError`].

pub mod addressing;
mod buffers;
pub mod disk;
mod disk_node;
mod disk_read;
mod drain;
mod endpoints;
mod error;
mod heartbeat;
mod metadata;
mod pins;
mod ranges;
mod read;
mod sessions;
mod tasks;
mod verify;
mod write;

pub use disk::{DiskConfig, DiskStats, DiskTier};
pub use drain::DrainReport;
pub use error::StoreError;
pub use mooncake_transfer::local_host_id;
pub use mooncake_transfer::memory::Access;
pub use ranges::{RangeRead, RangeWrite};
pub use tasks::{NODE_TASK_POLL, TASK_BATCH};
pub use verify::VerifyReport;

use mooncake_common::{AuthToken, ClientId, Segment};
use mooncake_rpc::ClientConfig;
use mooncake_transfer::{MemoryHandle, TransferConfig, TransferEngine, TransportMode};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::master_client::MasterClient;
use addressing::MAX_SEGMENT_BYTES;
use endpoints::EndpointCache;

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The bytes were written and the object is visible.
    Stored,
    /// The key already existed, complete; the first write stays and nothing was written.
    /// Upstream reports success here too; engines rely on it. (A key another write still holds
    /// in flight is not this: the put fails with REPLICA_IS_NOT_READY.)
    AlreadyPresent,
}

/// Settings of a store client.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The master's RPC address (`host:port`), the addresses of a high-availability group's
    /// masters separated by `,`, or `etcd://h1:2379,h2:2379`: the leader etcd names for
    /// `MC_STORE_CLUSTER_ID` (calls follow the leader: `MasterClient`, docs/ha.md).
    pub master_addr: String,
    /// Host (or `host:port`) peers use to reach this client's transfer server.
    pub local_hostname: String,
    /// Bytes of memory this client contributes to the cluster (0 = none: a pure requester).
    pub global_segment_size: u64,
    /// The largest object a call may read or write in memory that is not inside a registered
    /// buffer (upstream stages such calls through an arena of this size; we use the caller's
    /// memory in place and keep the cap, see `check_staging`). `u64::MAX` (the default) caps
    /// nothing; 0 allows only registered memory.
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
    /// How often a client with a segment asks the master for the copy and move tasks queued
    /// for it (`tasks.rs`). `None` (the default, as upstream's clients): after each heartbeat.
    /// Store nodes ask every 100 ms ([`NODE_TASK_POLL`]), so a drain job or a copy starts
    /// within that instead of up to a heartbeat later.
    pub task_poll_interval: Option<Duration>,
    /// Ports the transfer server tries, in random order, when `local_hostname` names none
    /// (upstream's client range 12300–14300); `None` lets the kernel pick any free port.
    pub auto_port_range: Option<RangeInclusive<u16>>,
    /// Master RPC settings (timeouts, busy polling).
    pub rpc: ClientConfig,
    /// Transfer engine settings (bind address and advertised host are derived from
    /// `local_hostname`).
    pub transfer: TransferConfig,
    /// The cluster's shared token (docs/security.md): presented to the master on every
    /// connection and keying this client's data-port capabilities. `None` (the default): the
    /// environment's (`MC_AUTH_TOKEN`, else the file `MC_AUTH_TOKEN_FILE`), if any.
    pub auth_token: Option<AuthToken>,
    /// A local disk tier (`store/disk.rs`): objects are offloaded to it and read back from it
    /// as LOCAL_DISK replicas. `None` (the default): memory only.
    pub disk: Option<DiskConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            master_addr: "127.0.0.1:50051".to_string(),
            local_hostname: "127.0.0.1".to_string(),
            global_segment_size: 16 << 20,
            local_buffer_size: u64::MAX,
            protocol: "tcp".to_string(),
            transport: TransportMode::Auto,
            tenant: String::new(),
            verify_checksums: true,
            heartbeat_interval: Duration::from_secs(1),
            task_poll_interval: None,
            auto_port_range: Some(AUTO_PORT_MIN..=AUTO_PORT_MAX),
            rpc: ClientConfig::default(),
            transfer: TransferConfig::default(),
            auth_token: None,
            disk: None,
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
    /// Writes whose transfer to a segment failed for reasons of its node, reported to the
    /// master and started again on a new allocation (each write at most once).
    pub write_retries: AtomicU64,
    /// Restored replicas this client confirmed to a restored master.
    pub verified_replicas: AtomicU64,
    /// Restored replicas whose bytes did not match (the master dropped them).
    pub mismatched_replicas: AtomicU64,
    /// Reads of LOCAL_DISK replicas served by the client that owns them (upstream's offload
    /// RPC). This client reads memory replicas only, so it stays 0 until the SSD tier reads
    /// land.
    pub offload_rpc_reads: AtomicU64,
    /// Copy/move tasks this client ran and reported SUCCESS.
    pub tasks_succeeded: AtomicU64,
    /// Copy/move tasks this client ran and reported FAILED (each attempt counts).
    pub tasks_failed: AtomicU64,
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
    /// Buffers registered by the caller (or allocated for it): start address → registration.
    user_buffers: Mutex<BTreeMap<usize, buffers::Registered>>,
    /// Memory allocated for the caller by `allocate_registered`, freed with the client.
    pool: Mutex<Vec<MemoryHandle>>,
    /// Open get and put sessions (`sessions.rs`).
    sessions: sessions::Sessions,
    closed: AtomicBool,
    /// A ping answered OK at least once (a later NEED_REMOUNT means a re-join).
    was_ok: AtomicBool,
    /// Re-mounted, and the restored replicas of the segments not yet checked.
    verify_pending: AtomicBool,
    stats: StoreStats,
    /// Keys whose pinned read finished, to release with the next pinned read or heartbeat
    /// (`pins.rs`).
    finished_reads: Mutex<Vec<String>>,
    /// The master answered a pinned lookup `NOT_SUPPORTED` (it predates read pins).
    pins_unsupported: AtomicBool,
    /// Keys an existence check pinned, released by the next pinned lookup (not the heartbeat:
    /// the pin protects the load that follows the check) or at close (`pins.rs`).
    held_exists: Mutex<Vec<String>>,
    /// Whether the master serves pinned existence checks: `pins::UNKNOWN`, `SERVED`, `REFUSED`.
    exist_pins: AtomicU8,
    /// RPC settings for peers' disk servers (the master's, with the resolved token).
    peer_rpc: ClientConfig,
    /// This node's disk tier, its server and the endpoint the master hands to readers.
    disk: Option<Arc<DiskTier>>,
    disk_server: Mutex<Option<mooncake_rpc::RpcServer>>,
    disk_endpoint: Mutex<String>,
    /// Clients of other nodes' disk servers, by endpoint.
    disk_peers: Mutex<std::collections::HashMap<String, Arc<MasterClient>>>,
    /// A task runner is fetching and running this client's tasks (`tasks.rs`).
    task_runner: AtomicBool,
}

/// An async store client. Cheap to clone; all clones share one connection and engine.
#[derive(Debug, Clone)]
pub struct StoreClient {
    inner: Arc<Inner>,
    heartbeat: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// Where the master is (`StoreConfig::master_addr`).
enum Masters {
    /// One address, or the masters of a high-availability group.
    Listed(Vec<SocketAddr>),
    /// The leader etcd names.
    Etcd(crate::leader::EtcdLeader),
}

fn masters_of(addr: &str, timeout: std::time::Duration) -> Result<Masters, StoreError> {
    match crate::leader::EtcdLeader::from_address(addr, timeout) {
        Some(etcd) => Ok(Masters::Etcd(etcd.map_err(StoreError::InvalidParams)?)),
        None => resolve_masters(addr).map(Masters::Listed),
    }
}

/// The master addresses of `addrs`: one address, or several separated by `,` (the masters of
/// a high-availability group).
fn resolve_masters(addrs: &str) -> Result<Vec<SocketAddr>, StoreError> {
    addrs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(resolve)
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err(StoreError::InvalidParams("no master address given".into()))
            } else {
                Ok(v)
            }
        })
}

fn resolve(addr: &str) -> Result<SocketAddr, StoreError> {
    addr.to_socket_addrs()
        .map_err(|e| StoreError::InvalidParams(format!("master address {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| {
            StoreError::InvalidParams(format!("master address {addr:?} resolves to nothing"))
        })
}

/// Upstream's client port range (`MC_STORE_CLIENT_MIN_PORT` / `MC_STORE_CLIENT_MAX_PORT`).
pub const AUTO_PORT_MIN: u16 = 12300;
pub const AUTO_PORT_MAX: u16 = 14300;
/// Ports tried in the automatic range before giving up (upstream: 20 setup retries).
const AUTO_PORT_ATTEMPTS: usize = 64;

/// Where the transfer server binds and what it advertises, from `local_hostname`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TransferBind {
    /// Host peers are told (`None`: an unspecified address such as 0.0.0.0 was given, so the
    /// engine advertises this machine's hostname).
    advertise: Option<String>,
    addr: SocketAddr,
    /// True when `local_hostname` named the port.
    port_given: bool,
}

/// Splits `local_hostname` into the host to advertise and the socket address to bind.
fn transfer_bind(local_hostname: &str) -> Result<TransferBind, StoreError> {
    let (host, port) = match local_hostname.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.starts_with('[') => {
            let port: u16 = port.parse().map_err(|_| {
                StoreError::InvalidParams(format!("local_hostname {local_hostname:?}: bad port"))
            })?;
            (
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
                Some(port),
            )
        }
        _ => (local_hostname.to_string(), None),
    };
    if host.is_empty() {
        return Err(StoreError::InvalidParams(
            "local_hostname is empty".to_string(),
        ));
    }
    let addr = (host.as_str(), port.unwrap_or(0))
        .to_socket_addrs()
        .map_err(|e| {
            StoreError::InvalidParams(format!("local_hostname {host:?} does not resolve: {e}"))
        })?
        .next()
        .ok_or_else(|| {
            StoreError::InvalidParams(format!("local_hostname {host:?} resolves to nothing"))
        })?;
    Ok(TransferBind {
        advertise: (!addr.ip().is_unspecified()).then_some(host),
        addr,
        port_given: port.is_some(),
    })
}

/// Starts the transfer engine on `bind`. Without a port in `local_hostname`, tries random ports
/// of `auto_ports` (a port another process holds is skipped) and falls back to a port the
/// kernel picks only when the range has none free.
fn start_engine(
    mut transfer: TransferConfig,
    bind: &TransferBind,
    auto_ports: Option<&RangeInclusive<u16>>,
) -> Result<TransferEngine, StoreError> {
    transfer.advertise_host = bind.advertise.clone();
    let mut addr = bind.addr;
    if let (false, Some(range)) = (bind.port_given, auto_ports) {
        let span = u32::from(*range.end()).saturating_sub(u32::from(*range.start())) + 1;
        if !range.is_empty() {
            for _ in 0..AUTO_PORT_ATTEMPTS {
                let port = range.start() + (rand::random::<u32>() % span) as u16;
                addr.set_port(port);
                transfer.tcp_bind_addr = addr;
                match TransferEngine::start(transfer.clone()) {
                    Ok(engine) => return Ok(engine),
                    Err(mooncake_transfer::TransferError::Io(message))
                        if message.starts_with("bind ") => {}
                    Err(other) => return Err(other.into()),
                }
            }
            tracing::warn!(
                "no free port in {}..={} after {AUTO_PORT_ATTEMPTS} tries: binding any port",
                range.start(),
                range.end()
            );
        }
        addr.set_port(0);
    }
    transfer.tcp_bind_addr = addr;
    Ok(TransferEngine::start(transfer)?)
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
        let masters = masters_of(&config.master_addr, config.rpc.connect_timeout)?;
        let bind = transfer_bind(&config.local_hostname)?;
        let auth_token = match &config.auth_token {
            Some(token) => Some(token.clone()),
            None => crate::auth::token_from_env().map_err(StoreError::InvalidParams)?,
        };
        if auth_token.is_none() && !bind.addr.ip().is_loopback() {
            tracing::warn!(
                "the data port binds {} without a token: anyone who reaches it can read and \
                 overwrite this node's memory (set MC_AUTH_TOKEN, docs/security.md)",
                bind.addr.ip()
            );
        }
        let mut transfer = config.transfer.clone();
        transfer.transport = config.transport;
        transfer.auth_token = auth_token.clone();
        let engine = start_engine(transfer, &bind, config.auto_port_range.as_ref())?;
        let mut rpc = config.rpc.clone();
        rpc.auth_token = auth_token;
        let master = match masters {
            Masters::Listed(addrs) => MasterClient::with_masters(&addrs, rpc.clone()),
            Masters::Etcd(etcd) => MasterClient::following(etcd, rpc.clone()).await?,
        };
        master.service_ready().await?;
        let disk = match &config.disk {
            Some(disk) => Some(Arc::new(DiskTier::open(disk.clone(), &engine)?)),
            None => None,
        };
        let inner = Arc::new(Inner {
            master,
            engine,
            client_id: ClientId::random(),
            segments: Mutex::new(Vec::new()),
            endpoints: Mutex::new(EndpointCache::default()),
            user_buffers: Mutex::new(BTreeMap::new()),
            pool: Mutex::new(Vec::new()),
            sessions: sessions::Sessions::default(),
            closed: AtomicBool::new(false),
            was_ok: AtomicBool::new(false),
            verify_pending: AtomicBool::new(false),
            stats: StoreStats::default(),
            finished_reads: Mutex::new(Vec::new()),
            pins_unsupported: AtomicBool::new(false),
            held_exists: Mutex::new(Vec::new()),
            exist_pins: AtomicU8::new(pins::UNKNOWN),
            peer_rpc: rpc,
            disk: disk.clone(),
            disk_server: Mutex::new(None),
            disk_endpoint: Mutex::new(String::new()),
            disk_peers: Mutex::new(std::collections::HashMap::new()),
            task_runner: AtomicBool::new(false),
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
        if let Some(disk) = disk {
            let server = client.start_disk(disk).await?;
            *client.inner.disk_server.lock() = Some(server);
        }
        let weak = Arc::downgrade(&client.inner);
        *client.heartbeat.lock() = Some(tokio::spawn(heartbeat::heartbeat_loop(weak)));
        Ok(client)
    }

    /// Another handle on a client's state (its heartbeat is owned by the handles `connect`
    /// returned).
    fn from_inner(inner: Arc<Inner>) -> StoreClient {
        StoreClient {
            inner,
            heartbeat: Arc::new(Mutex::new(None)),
        }
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

    /// This node's disk tier, if it has one.
    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.inner.disk.as_ref()
    }

    /// The endpoint of this node's disk server (empty without a disk).
    pub fn disk_endpoint(&self) -> String {
        self.inner.disk_endpoint.lock().clone()
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

    /// Peer segments this client has mapped over shared memory (same-host transfers).
    pub fn shm_mapped_segments(&self) -> usize {
        self.inner.engine.shm_mapped_segments()
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

    /// The name peers and `ReplicateConfig::preferred_segment` use for this client: its first
    /// segment's name, or (with no segment) its transfer endpoint's `host:port`.
    pub fn segment_name(&self) -> String {
        if let Some(mounted) = self.inner.segments.lock().first() {
            return mounted.segment.name.clone();
        }
        self.inner.engine.endpoint().tcp_authority()
    }

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
        self.release_finished_reads().await;
        // Half-written objects of open put sessions must not stay reserved at the master.
        self.revoke_all_put_sessions().await;
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
        let server = self.inner.disk_server.lock().take();
        if let Some(server) = server {
            server.shutdown().await;
        }
        if let Some(disk) = &self.inner.disk {
            if let Err(error) = disk.backend().close() {
                first_error.get_or_insert(StoreError::InvalidParams(format!(
                    "closing the disk: {error}"
                )));
            }
        }
        self.inner.engine.shutdown();
        first_error.map_or(Ok(()), Err)
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

#[cfg(test)]
mod tests {
    use super::checksum_of;

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
