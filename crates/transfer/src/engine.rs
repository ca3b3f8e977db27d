//! The transfer engine: owns the registry, the servers, the peer pools and the copy workers,
//! and routes every chunk of a batch to memcpy, shared memory or TCP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::auth::{Capability, DataPortAuth};
use crate::batch::{Batch, BatchState, Chunk, Op, TransferRequest};
use crate::config::{TransferConfig, TransportMode};
use crate::copy::{copy_crc32c, copy_streaming};
use crate::endpoint::{local_host_id, Endpoint};
use crate::error::TransferError;
use crate::memory::Mapping;
use crate::registry::{Region, RegionKind, Registry};
use crate::shm::{self, PeerMapping, ShmServer};
use crate::tcp::client::{PoolConfig, TcpPeer};
use crate::tcp::server::{ServerLimits, ServerStats, TcpServer};

/// Above this many peer pools, pools without connections or work are dropped.
const MAX_IDLE_PEERS: usize = 1024;

/// How long a failed shared-memory handshake sends a peer's segment to TCP before retrying.
const SHM_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Options of an engine-allocated segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOptions {
    /// Same-host peers may map it over shared memory. Default true.
    pub shareable: bool,
    /// Try 2 MiB pages first (falls back to normal pages). Default false.
    pub huge_pages: bool,
    /// Back every page with memory at allocation (`MADV_POPULATE_WRITE`). Default true:
    /// a store contributes its segment up front, and the first puts into it run at memcpy
    /// speed instead of page-faulting.
    pub populate: bool,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        SegmentOptions {
            shareable: true,
            huge_pages: false,
            populate: true,
        }
    }
}

/// Engine-allocated registered memory (a segment or a local buffer). Cloning is cheap; the
/// memory stays mapped while the region is registered or any handle or transfer refers to it.
#[derive(Debug, Clone)]
pub struct MemoryHandle {
    region: Arc<Region>,
}

impl MemoryHandle {
    /// The region id; for a segment, the segment id peers address.
    pub fn id(&self) -> u64 {
        self.region.id()
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.base() as *mut u8
    }
    pub fn len_bytes(&self) -> usize {
        self.region.len_bytes()
    }
    pub fn kind(&self) -> RegionKind {
        self.region.kind()
    }
    /// True when backed by huge pages.
    pub fn huge_pages(&self) -> bool {
        self.region.mapping().is_some_and(|m| m.huge_pages())
    }
    /// Transfers currently pinning this region.
    pub fn inflight(&self) -> usize {
        self.region.inflight()
    }

    /// Copies `data` into the region at `offset` (bounds-checked).
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), TransferError> {
        self.check(offset, data.len())?;
        // SAFETY: [base+offset, +len) is inside the mapping, which `self.region` keeps alive;
        // `data` is a separate Rust allocation so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len());
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region (bounds-checked).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), TransferError> {
        self.check(offset, out.len())?;
        // SAFETY: as in write_at.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), TransferError> {
        if offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len_bytes())
        {
            Ok(())
        } else {
            Err(TransferError::OutOfBounds {
                segment_id: self.id(),
                offset: offset as u64,
                len_bytes: len as u64,
                size_bytes: self.len_bytes() as u64,
            })
        }
    }
}

enum CopyJob {
    Local(Chunk),
    Shm(Chunk),
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Local,
    Shm,
    Tcp,
}

type PeerKey = (u64, String);

#[derive(Debug)]
struct ShmFailure {
    at: Instant,
    error: TransferError,
    capability: Option<Capability>,
}

struct Inner {
    config: TransferConfig,
    registry: Arc<Registry>,
    endpoint: Arc<Endpoint>,
    /// With the cluster's token: the capabilities of this engine's segments.
    auth: Option<DataPortAuth>,
    host_id: String,
    page_bytes: usize,
    closed: AtomicBool,
    copy_tx: Sender<CopyJob>,
    copy_rx: Receiver<CopyJob>,
    copy_threads: Mutex<Vec<JoinHandle<()>>>,
    peers: Mutex<HashMap<PeerKey, Arc<TcpPeer>>>,
    shm_maps: Mutex<HashMap<(u64, u64), Arc<PeerMapping>>>,
    /// Recent failed handshakes per (instance, segment), with the capability they presented:
    /// another capability (a fresh descriptor) tries again at once.
    shm_failures: Mutex<HashMap<(u64, u64), ShmFailure>>,
    tcp_server: Mutex<Option<TcpServer>>,
    shm_server: Mutex<Option<ShmServer>>,
    server_stats: Arc<ServerStats>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("endpoint", &self.endpoint.to_string())
            .finish_non_exhaustive()
    }
}

/// A running transfer engine. Dropping it shuts it down: servers stop, pending entries fail
/// with `ShuttingDown`, threads are joined.
#[derive(Debug)]
pub struct TransferEngine {
    inner: Arc<Inner>,
}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

impl TransferEngine {
    /// Validates the config, starts the TCP server (and the shm server) and the copy workers.
    pub fn start(config: TransferConfig) -> Result<TransferEngine, TransferError> {
        config.validate()?;
        let registry = Arc::new(Registry::default());
        let server_stats = Arc::new(ServerStats::default());
        let instance_id: u64 = rand::random::<u64>() | 1; // never 0
        let auth = config
            .auth_token
            .clone()
            .map(|token| DataPortAuth::new(token, instance_id));
        let tcp_server = TcpServer::start(
            config.tcp_bind_addr,
            Arc::clone(&registry),
            auth.clone(),
            ServerLimits {
                max_connections: config.max_server_connections,
                max_connections_per_peer: config.max_server_connections_per_peer,
                io_timeout: Duration::from_millis(config.server_io_timeout_ms),
                idle_timeout: Duration::from_millis(config.server_idle_timeout_ms),
            },
            Arc::clone(&server_stats),
        )?;
        let host_id = config.host_id.clone().unwrap_or_else(local_host_id);
        let shm_server = if config.enable_shm_server {
            Some(ShmServer::start(
                &config.shm_socket_dir,
                &format!("{instance_id:016x}"),
                config.shm_socket_mode,
                Arc::clone(&registry),
                auth.clone(),
            )?)
        } else {
            None
        };
        let addr = tcp_server.local_addr();
        let host = match &config.advertise_host {
            Some(host) => host.clone(),
            None if addr.ip().is_unspecified() => {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "localhost".into())
            }
            None if addr.is_ipv6() => format!("[{}]", addr.ip()),
            None => addr.ip().to_string(),
        };
        let endpoint = Arc::new(Endpoint::new(
            host,
            addr.port(),
            instance_id,
            Some(host_id.clone()),
            shm_server.as_ref().map(|s| s.path().to_path_buf()),
        )?);
        let (copy_tx, copy_rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            config,
            registry,
            endpoint,
            auth,
            host_id,
            page_bytes: page_bytes(),
            closed: AtomicBool::new(false),
            copy_tx,
            copy_rx,
            copy_threads: Mutex::new(Vec::new()),
            peers: Mutex::new(HashMap::new()),
            shm_maps: Mutex::new(HashMap::new()),
            shm_failures: Mutex::new(HashMap::new()),
            tcp_server: Mutex::new(Some(tcp_server)),
            shm_server: Mutex::new(shm_server),
            server_stats,
        });
        let engine = TransferEngine {
            inner: Arc::clone(&inner),
        };
        for i in 0..inner.config.copy_threads {
            let worker = Arc::clone(&inner);
            let rx = inner.copy_rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("mc-copy-{i}"))
                .spawn(move || worker.copy_loop(&rx))
                .map_err(|e| TransferError::Io(format!("spawn copy thread: {e}")))?;
            inner.copy_threads.lock().push(handle);
        }
        Ok(engine)
    }

    /// The endpoint string peers use to reach this engine's segments.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.inner.endpoint
    }

    /// The endpoint string to mount segment `segment_id` with: [`TransferEngine::endpoint`]
    /// plus, when this engine has the cluster's token, the segment's capability (`&cap=HEX64`,
    /// see `auth.rs`), which requesters must present before this engine serves the segment.
    pub fn segment_endpoint(&self, segment_id: u64) -> String {
        let capability = self.inner.auth.as_ref().map(|a| a.capability(segment_id));
        Endpoint::clone(&self.inner.endpoint)
            .with_capability(capability)
            .to_string_with_capability()
    }

    /// The configuration in force.
    pub fn config(&self) -> &TransferConfig {
        &self.inner.config
    }

    /// Counters of this engine's TCP server.
    pub fn server_stats(&self) -> &ServerStats {
        &self.inner.server_stats
    }

    /// Allocates and registers a segment (remote-accessible; shareable per `options`).
    pub fn allocate_segment(
        &self,
        size_bytes: usize,
        options: SegmentOptions,
    ) -> Result<MemoryHandle, TransferError> {
        let inner = &self.inner;
        let control = shm::control_offset(size_bytes, inner.page_bytes);
        let total = control
            .checked_add(inner.page_bytes)
            .ok_or_else(|| TransferError::InvalidParams(format!("size {size_bytes} too large")))?;
        let name = format!("mooncake-segment-{size_bytes}");
        if size_bytes == 0 {
            return Err(TransferError::InvalidParams(
                "a segment needs a non-zero size".into(),
            ));
        }
        let mapping = Arc::new(Mapping::allocate(&name, total.max(1), options.huge_pages)?);
        if options.populate {
            mapping.populate()?;
        }
        // SAFETY: control < total <= mapping length, page aligned, so 8-byte aligned.
        unsafe { shm::control_word(mapping.as_ptr(), control) }
            .store(shm::CONTROL_LIVE, Ordering::Release);
        let region = inner.registry.register(
            RegionKind::Segment {
                shareable: options.shareable,
            },
            mapping.as_ptr() as usize,
            size_bytes,
            Some(mapping),
        )?;
        Ok(MemoryHandle { region })
    }

    /// Allocates and registers a local buffer (the local side of transfers only).
    pub fn allocate_local_buffer(&self, size_bytes: usize) -> Result<MemoryHandle, TransferError> {
        let mapping = Arc::new(Mapping::allocate(
            "mooncake-local-buffer",
            size_bytes,
            false,
        )?);
        let region = self.inner.registry.register(
            RegionKind::LocalBuffer,
            mapping.as_ptr() as usize,
            size_bytes,
            Some(mapping),
        )?;
        Ok(MemoryHandle { region })
    }

    /// Registers caller-owned memory as a user buffer (zero-copy local side) and returns its
    /// region id.
    ///
    /// # Safety
    /// `[ptr, ptr+len_bytes)` must stay valid for reads and writes until `unregister` of the
    /// returned id has returned `Ok` (or the engine has been dropped).
    pub unsafe fn register_user_buffer(
        &self,
        ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, TransferError> {
        let region =
            self.inner
                .registry
                .register(RegionKind::UserBuffer, ptr as usize, len_bytes, None)?;
        Ok(region.id())
    }

    /// Registers memory a caller handed over by address (the zero-copy buffers of the Python
    /// binding, which arrive as integers) after checking that all of `[ptr, ptr+len_bytes)` is
    /// mapped readable and writable in this process (one read of `/proc/self/maps`, once per
    /// registration). An address that is not mapped, or a length past the end of the mapping,
    /// is refused with INVALID_PARAMS instead of faulting in a later copy.
    ///
    /// # Safety
    /// As [`TransferEngine::register_user_buffer`]: the memory must stay mapped until the
    /// region is unregistered (the check proves it is mapped now, not later).
    pub unsafe fn register_caller_memory(
        &self,
        ptr: *mut u8,
        len_bytes: usize,
    ) -> Result<u64, TransferError> {
        if ptr.is_null() || len_bytes == 0 {
            return Err(TransferError::InvalidParams(
                "a buffer needs a non-null address and a non-zero length".into(),
            ));
        }
        crate::memory::check_mapped(ptr as usize, len_bytes, crate::memory::Access::ReadWrite)?;
        // SAFETY: forwarded to the caller's contract; the range was just checked to be mapped.
        unsafe { self.register_user_buffer(ptr, len_bytes) }
    }

    /// Maps `len_bytes` of the file at `path` from `offset` (a multiple of the page size) and
    /// registers them as a segment served to peers over TCP. A file cannot be sealed against
    /// shrinking the way a memfd is, so same-host peers are not handed it over shared memory.
    /// The file must keep at least `offset + len_bytes` bytes while the segment is registered
    /// (a shrunk file would fault the process that maps it, as with any shared mapping).
    pub fn map_file_segment(
        &self,
        path: &std::path::Path,
        offset: u64,
        len_bytes: usize,
    ) -> Result<MemoryHandle, TransferError> {
        let mapping = Arc::new(Mapping::map_file(path, offset, len_bytes)?);
        let region = self.inner.registry.register(
            RegionKind::Segment { shareable: false },
            mapping.as_ptr() as usize,
            len_bytes,
            Some(mapping),
        )?;
        Ok(MemoryHandle { region })
    }

    /// Unregisters a region, waiting up to `unregister_timeout_ms` for transfers using it.
    /// After `Ok`, no transfer touches the memory any more. On `RegionBusy` it stays registered.
    pub fn unregister(&self, region_id: u64) -> Result<(), TransferError> {
        self.unregister_timeout(
            region_id,
            Duration::from_millis(self.inner.config.unregister_timeout_ms),
        )
    }

    /// [`TransferEngine::unregister`] with an explicit wait limit.
    pub fn unregister_timeout(
        &self,
        region_id: u64,
        timeout: Duration,
    ) -> Result<(), TransferError> {
        let inner = &self.inner;
        let region = inner.registry.get(region_id);
        inner.registry.unregister(region_id, timeout)?;
        // Tell same-host peers that mapped it: their next copy is refused.
        if let Some(region) = region {
            if let (RegionKind::Segment { shareable: true }, Some(mapping)) =
                (region.kind(), region.mapping())
            {
                let control = shm::control_offset(region.len_bytes(), inner.page_bytes);
                // SAFETY: allocate_segment placed the control word at this page-aligned offset.
                unsafe { shm::control_word(mapping.as_ptr(), control) }
                    .store(shm::CONTROL_REVOKED, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Submits a batch. Never blocks on I/O and never panics: every entry ends in success or a
    /// typed error by its deadline (`entry_timeout_ms` from now). Local and shared-memory
    /// entries up to `inline_copy_max_bytes` are copied before this returns (a memcpy, no I/O).
    pub fn submit(&self, requests: &[TransferRequest]) -> Batch {
        self.inner.submit(requests)
    }

    /// Submits and blocks until every entry is over.
    pub fn transfer_sync(&self, requests: &[TransferRequest]) -> Vec<Result<(), TransferError>> {
        self.submit(requests).wait()
    }

    /// Drops the pool and shared-memory mappings of a peer (e.g. after the master reported it
    /// dead), releasing the memory its mappings kept alive.
    pub fn forget_peer(&self, endpoint: &Endpoint) {
        let inner = &self.inner;
        let peer = inner
            .peers
            .lock()
            .remove(&(endpoint.instance_id(), endpoint.tcp_authority()));
        if let Some(peer) = peer {
            peer.close();
        }
        inner
            .shm_maps
            .lock()
            .retain(|(inst, _), _| *inst != endpoint.instance_id());
        inner
            .shm_failures
            .lock()
            .retain(|(inst, _), _| *inst != endpoint.instance_id());
    }

    /// Live TCP connection threads of the pool for `endpoint` (0 when none).
    pub fn pooled_connections(&self, endpoint: &Endpoint) -> usize {
        self.inner
            .peers
            .lock()
            .get(&(endpoint.instance_id(), endpoint.tcp_authority()))
            .map_or(0, |p| p.live_connections())
    }

    /// Number of peer segments currently mapped over shared memory.
    pub fn shm_mapped_segments(&self) -> usize {
        self.inner.shm_maps.lock().len()
    }

    /// Stops everything; pending entries fail with `ShuttingDown`. Called by `Drop`.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

impl Inner {
    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(mut server) = self.tcp_server.lock().take() {
            server.shutdown();
        }
        if let Some(mut server) = self.shm_server.lock().take() {
            server.shutdown();
        }
        let peers: Vec<Arc<TcpPeer>> = self.peers.lock().drain().map(|(_, p)| p).collect();
        for peer in peers {
            peer.close();
        }
        let threads = std::mem::take(&mut *self.copy_threads.lock());
        for _ in &threads {
            let _ = self.copy_tx.send(CopyJob::Stop);
        }
        for thread in threads {
            let _ = thread.join();
        }
        // Whatever is still queued fails (dropping a chunk reports ShuttingDown).
        while let Ok(job) = self.copy_rx.try_recv() {
            drop(job);
        }
        self.shm_maps.lock().clear();
    }

    fn route(&self, remote: &Endpoint, segment_id: u64) -> Result<Route, TransferError> {
        if remote.instance_id() == self.endpoint.instance_id() {
            return Ok(Route::Local);
        }
        let same_host =
            remote.host_id() == Some(self.host_id.as_str()) && remote.shm_path().is_some();
        match self.config.transport {
            TransportMode::Tcp => Ok(Route::Tcp),
            TransportMode::Auto if !same_host => Ok(Route::Tcp),
            TransportMode::Auto => {
                let recently_failed = self.recent_shm_failure(remote, segment_id).is_some();
                Ok(if recently_failed {
                    Route::Tcp
                } else {
                    Route::Shm
                })
            }
            TransportMode::Shm if same_host => Ok(Route::Shm),
            TransportMode::Shm => Err(TransferError::ShmUnavailable {
                endpoint: remote.to_string(),
                reason: "peer is not on this host or offers no shm socket".into(),
            }),
        }
    }

    /// The error of a handshake for this peer segment that failed less than `SHM_RETRY_AFTER`
    /// ago with the same capability `remote` carries.
    fn recent_shm_failure(&self, remote: &Endpoint, segment_id: u64) -> Option<TransferError> {
        let failures = self.shm_failures.lock();
        let failure = failures.get(&(remote.instance_id(), segment_id))?;
        (failure.at.elapsed() < SHM_RETRY_AFTER
            && failure.capability.as_ref() == remote.capability())
        .then(|| failure.error.clone())
    }

    /// True when a shared-memory mapping of this peer segment is cached (no handshake needed).
    fn shm_mapped(&self, remote: &Endpoint, segment_id: u64) -> bool {
        self.shm_maps
            .lock()
            .contains_key(&(remote.instance_id(), segment_id))
    }

    fn chunk_len(&self, len: usize, route: Route) -> usize {
        let stripes = match route {
            Route::Tcp => self.config.connections_per_peer,
            Route::Local | Route::Shm if len < self.config.parallel_copy_min_bytes => 1,
            Route::Local | Route::Shm => self.config.copy_threads,
        };
        if stripes == 1 && route != Route::Tcp {
            return len; // one inline copy
        }
        len.div_ceil(stripes)
            .clamp(self.config.min_chunk_bytes, self.config.max_chunk_bytes)
    }

    fn submit(&self, requests: &[TransferRequest]) -> Batch {
        let timeout = Duration::from_millis(self.config.entry_timeout_ms);
        let state = BatchState::new(requests.len(), Instant::now() + timeout);
        if requests.len() > self.config.max_batch_entries {
            for index in 0..requests.len() {
                state.finish_entry(
                    index,
                    Err(TransferError::InvalidParams(format!(
                        "batch of {} entries exceeds max_batch_entries {}",
                        requests.len(),
                        self.config.max_batch_entries
                    ))),
                );
            }
            return Batch::new(state);
        }
        let mut tcp_groups: HashMap<PeerKey, Vec<Chunk>> = HashMap::new();
        // At most this many bytes per submit are copied on the caller's thread; the rest of a
        // large batch goes to the copy threads, so submit stays short for async callers.
        let mut inline_budget = self.config.inline_copy_max_bytes as u64;
        // Copied on this thread once every other chunk was handed out (so the copy threads and
        // TCP connections already work in parallel meanwhile).
        let mut inline_chunks: Vec<(Route, Chunk)> = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            match self.plan(&state, index, request) {
                Ok((_, chunks)) if chunks.is_empty() => state.finish_entry(index, Ok(())),
                Ok((route, chunks)) => {
                    state.set_chunks(index, chunks.len());
                    let may_inline = route != Route::Tcp
                        && (route == Route::Local
                            || self.shm_mapped(&request.remote, request.segment_id));
                    for (position, chunk) in chunks.into_iter().enumerate() {
                        // The first piece of an entry may stay here; the others of a split
                        // entry always go to the copy threads, to run in parallel with it.
                        let inline =
                            may_inline && position == 0 && chunk.len_bytes as u64 <= inline_budget;
                        if inline {
                            inline_budget -= chunk.len_bytes as u64;
                            inline_chunks.push((route, chunk));
                            continue;
                        }
                        match route {
                            Route::Tcp => tcp_groups
                                .entry((
                                    request.remote.instance_id(),
                                    request.remote.tcp_authority(),
                                ))
                                .or_default()
                                .push(chunk),
                            // A failed send means shutdown: dropping the chunk reports it.
                            Route::Local => drop(self.copy_tx.send(CopyJob::Local(chunk))),
                            Route::Shm => drop(self.copy_tx.send(CopyJob::Shm(chunk))),
                        }
                    }
                }
                Err(err) => state.finish_entry(index, Err(err)),
            }
        }
        for (_, chunks) in tcp_groups {
            self.send_tcp(chunks);
        }
        for (route, mut chunk) in inline_chunks {
            match route {
                Route::Local => {
                    let result = self.copy_local(&mut chunk);
                    chunk.finish(result);
                }
                _ => self.copy_shm(chunk),
            }
        }
        Batch::new(state)
    }

    /// Validates one entry and splits it into chunks; `Err` fails the entry at once.
    fn plan(
        &self,
        state: &Arc<BatchState>,
        index: usize,
        request: &TransferRequest,
    ) -> Result<(Route, Vec<Chunk>), TransferError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(TransferError::ShuttingDown);
        }
        let len = request.len_bytes;
        if request.remote_offset.checked_add(len).is_none() {
            return Err(TransferError::OutOfBounds {
                segment_id: request.segment_id,
                offset: request.remote_offset,
                len_bytes: len,
                size_bytes: 0,
            });
        }
        let route = self.route(&request.remote, request.segment_id)?;
        if len == 0 {
            return Ok((route, Vec::new()));
        }
        let pin = Arc::new(self.registry.acquire_local(request.local_addr, len)?);
        let len = pin.len_bytes();
        let chunk_len = self.chunk_len(len, route);
        let mut chunks = Vec::with_capacity(len.div_ceil(chunk_len));
        let mut done = 0usize;
        while done < len {
            let this = chunk_len.min(len - done);
            chunks.push(Chunk {
                batch: Arc::clone(state),
                index,
                op: request.op,
                local_ptr: request.local_addr + done,
                len_bytes: this,
                segment_id: request.segment_id,
                remote_offset: request.remote_offset + done as u64,
                remote: Arc::clone(&request.remote),
                pin: Some(Arc::clone(&pin)),
                entry_offset: done,
                checksum: request.checksum,
                crc: None,
            });
            done += this;
        }
        Ok((route, chunks))
    }

    fn send_tcp(&self, chunks: Vec<Chunk>) {
        let Some(first) = chunks.first() else { return };
        let remote = Arc::clone(&first.remote);
        let key = (remote.instance_id(), remote.tcp_authority());
        let peer = {
            let mut peers = self.peers.lock();
            if self.closed.load(Ordering::SeqCst) {
                drop(peers);
                for chunk in chunks {
                    chunk.finish(Err(TransferError::ShuttingDown));
                }
                return;
            }
            if !peers.contains_key(&key) && peers.len() >= MAX_IDLE_PEERS {
                // Bound the map: forget pools that have no connection and nothing queued.
                peers.retain(|_, peer| !peer.is_idle());
            }
            Arc::clone(peers.entry(key).or_insert_with(|| {
                TcpPeer::new(
                    remote,
                    PoolConfig {
                        connections: self.config.connections_per_peer,
                        pipeline_depth: self.config.pipeline_depth,
                        connect_timeout: Duration::from_millis(self.config.connect_timeout_ms),
                        entry_timeout: Duration::from_millis(self.config.entry_timeout_ms),
                        idle_close: Duration::from_millis(self.config.idle_connection_ms),
                    },
                )
            }))
        };
        peer.submit(chunks);
    }

    fn copy_loop(&self, rx: &Receiver<CopyJob>) {
        while let Ok(job) = rx.recv() {
            match job {
                CopyJob::Stop => break,
                CopyJob::Local(mut chunk) => {
                    let result = self.copy_local(&mut chunk);
                    chunk.finish(result);
                }
                CopyJob::Shm(chunk) => self.copy_shm(chunk),
            }
        }
    }

    fn timeout_error(&self) -> TransferError {
        TransferError::Timeout {
            timeout_ms: self.config.entry_timeout_ms,
        }
    }

    fn copy_local(&self, chunk: &mut Chunk) -> Result<(), TransferError> {
        if Instant::now() > chunk.deadline() {
            return Err(self.timeout_error());
        }
        let target = self.registry.acquire_segment(
            chunk.segment_id,
            chunk.remote_offset,
            chunk.len_bytes as u64,
        )?;
        let (src, dst) = match chunk.op {
            Op::Read => (target.ptr(), chunk.local_ptr()),
            Op::Write => (chunk.local_ptr(), target.ptr()),
        };
        // SAFETY: both ranges are pinned registered memory of len_bytes (the segment range by
        // `target`, the local range by the chunk).
        chunk.crc = unsafe { copy_chunk(src, dst, chunk, self.config.streaming_write_min_bytes) };
        Ok(())
    }

    fn copy_shm(&self, mut chunk: Chunk) {
        if Instant::now() > chunk.deadline() {
            chunk.finish(Err(self.timeout_error()));
            return;
        }
        let remote = Arc::clone(&chunk.remote);
        let mapping = match self.peer_mapping(&remote, chunk.segment_id) {
            Ok(mapping) => mapping,
            Err(err) => {
                if self.config.transport == TransportMode::Auto {
                    self.send_tcp(vec![chunk]);
                } else {
                    chunk.finish(Err(TransferError::ShmUnavailable {
                        endpoint: remote.to_string(),
                        reason: err.to_string(),
                    }));
                }
                return;
            }
        };
        let mut result = self.copy_mapped(&mapping, &mut chunk);
        // The owner may have died before or during the copy: its memory still takes the bytes,
        // but nobody serves them, and the master will drop the segment. A write that ends after
        // the owner exited fails (reads of the intact memory stay allowed, checksummed).
        if result.is_ok() && chunk.op == Op::Write && mapping.owner_exited() {
            result = Err(TransferError::ConnectionLost {
                endpoint: remote.to_string(),
                reason: "the segment's owner process exited".into(),
            });
        }
        if matches!(
            result,
            Err(TransferError::SegmentNotFound { .. } | TransferError::ConnectionLost { .. })
        ) {
            self.shm_maps
                .lock()
                .remove(&(remote.instance_id(), chunk.segment_id));
        }
        chunk.finish(result);
    }

    fn copy_mapped(&self, mapping: &PeerMapping, chunk: &mut Chunk) -> Result<(), TransferError> {
        let len = chunk.len_bytes as u64;
        let fits = chunk
            .remote_offset
            .checked_add(len)
            .is_some_and(|end| end <= mapping.size_bytes);
        if !fits {
            return Err(TransferError::OutOfBounds {
                segment_id: chunk.segment_id,
                offset: chunk.remote_offset,
                len_bytes: len,
                size_bytes: mapping.size_bytes,
            });
        }
        if !mapping.is_live() {
            return Err(TransferError::SegmentNotFound {
                segment_id: chunk.segment_id,
            });
        }
        // fits => remote_offset < size_bytes <= mapped length (a usize).
        let remote_ptr = mapping
            .mapping
            .as_ptr()
            .wrapping_add(chunk.remote_offset as usize);
        let (src, dst) = match chunk.op {
            Op::Read => (remote_ptr, chunk.local_ptr()),
            Op::Write => (chunk.local_ptr(), remote_ptr),
        };
        // SAFETY: the remote range is inside the peer mapping (checked above; `mapping` is held
        // by an Arc for the call) and the local range is pinned registered memory.
        chunk.crc = unsafe { copy_chunk(src, dst, chunk, self.config.streaming_write_min_bytes) };
        Ok(())
    }

    fn peer_mapping(
        &self,
        remote: &Endpoint,
        segment_id: u64,
    ) -> Result<Arc<PeerMapping>, TransferError> {
        let key = (remote.instance_id(), segment_id);
        if let Some(mapping) = self.shm_maps.lock().get(&key) {
            return Ok(Arc::clone(mapping));
        }
        if let Some(error) = self.recent_shm_failure(remote, segment_id) {
            return Err(error);
        }
        let socket = remote
            .shm_path()
            .ok_or_else(|| TransferError::ShmUnavailable {
                endpoint: remote.to_string(),
                reason: "no shm socket in endpoint".into(),
            })?;
        match shm::map_peer_segment(socket, segment_id, remote.capability()) {
            Ok(mapping) => {
                let mapping = Arc::new(mapping);
                let mut maps = self.shm_maps.lock();
                Ok(Arc::clone(maps.entry(key).or_insert(mapping)))
            }
            Err(err) => {
                let failure = ShmFailure {
                    at: Instant::now(),
                    error: err.clone(),
                    capability: remote.capability().copied(),
                };
                self.shm_failures.lock().insert(key, failure);
                Err(err)
            }
        }
    }
}

/// Copies a local/shared-memory chunk from `src` to `dst` (`chunk.len_bytes` each) and, when the
/// chunk asks for it, returns the CRC32C of the bytes copied, computed in the same pass (see
/// `copy::copy_crc32c`). Writes of at least `stream_min_bytes` use streaming stores: they land
/// in a segment, which this process does not read next; reads land in the caller's memory,
/// which it is about to use, so plain stores leave them in the cache.
///
/// # Safety
/// `src` and `dst` must be valid for `chunk.len_bytes` bytes (read and write respectively) for
/// the whole call, and nothing else may write them meanwhile.
unsafe fn copy_chunk(
    src: *const u8,
    dst: *mut u8,
    chunk: &Chunk,
    stream_min_bytes: usize,
) -> Option<u32> {
    let len = chunk.len_bytes;
    let (s, d) = (src as usize, dst as usize);
    if s < d.saturating_add(len) && d < s.saturating_add(len) {
        // SAFETY: the caller's contract; memmove because the ranges overlap (a segment of this
        // process mapped twice, or read into itself).
        unsafe { std::ptr::copy(src, dst, len) };
        return None; // `Chunk::report` checksums the final bytes if asked
    }
    let stream = chunk.op == Op::Write && len >= stream_min_bytes;
    // SAFETY (both calls): the caller's contract, and the ranges are disjoint (checked above).
    unsafe {
        if chunk.checksum {
            return Some(copy_crc32c(src, dst, len, stream));
        }
        if stream {
            copy_streaming(src, dst, len);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }
    None
}
