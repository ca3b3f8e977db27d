//! The requesting side of the TCP transport: a bounded pool of long-lived connections per peer.
//!
//! Chunks of every batch bound for one peer go into the peer's queue. Each connection has a
//! sender thread (takes a chunk when it has a free pipeline slot, writes the header and, for a
//! write, the payload straight from local memory) and a receiver thread (reads responses in
//! order and, for a read, the payload straight into local memory). A chunk is reported only
//! when both threads are done with its memory.

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};

use crate::auth::{Capability, CAPABILITY_BYTES};
use crate::batch::{Chunk, Op};
use crate::endpoint::Endpoint;
use crate::error::TransferError;
use crate::tcp::io::{recv_exact, send_pieces, IoFail, POLL_INTERVAL};
use crate::wire::{Header, Kind, WireError, HEADER_BYTES};

/// Most requests sent with one `sendmsg`.
const MAX_COALESCED: usize = 64;
/// Stop adding writes to a coalesced group past this much payload (large payloads gain
/// nothing from sharing a system call).
const COALESCE_PAYLOAD_BYTES: usize = 1 << 20;

/// Settings of one peer's pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolConfig {
    pub connections: usize,
    pub pipeline_depth: usize,
    pub connect_timeout: Duration,
    pub entry_timeout: Duration,
    pub idle_close: Duration,
}

/// A chunk on the wire: reported once both the sender and the receiver released it.
#[derive(Debug)]
struct Pending {
    request_id: u64,
    kind: Kind,
    local_ptr: usize,
    len_bytes: usize,
    deadline: Instant,
    chunk: Mutex<Option<Chunk>>,
    result: Mutex<Option<Result<(), TransferError>>>,
    holders: AtomicU8,
}

impl Pending {
    fn release(&self, result: Option<Result<(), TransferError>>) {
        if let Some(result) = result {
            let mut slot = self.result.lock();
            if slot.is_none() || result.is_err() && matches!(*slot, Some(Ok(()))) {
                *slot = Some(result);
            }
        }
        if self.holders.fetch_sub(1, Ordering::AcqRel) == 1 {
            let outcome = self
                .result
                .lock()
                .take()
                .unwrap_or(Err(TransferError::ShuttingDown));
            if let Some(chunk) = self.chunk.lock().take() {
                chunk.finish(outcome);
            }
        }
    }
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    inflight: Mutex<VecDeque<Arc<Pending>>>,
    slot_freed: Condvar,
    broken: AtomicBool,
    /// Left the pool's `live` count itself (idle close).
    retired: AtomicBool,
    /// The capability this connection presented for each segment (grants are per connection;
    /// only the sender thread touches this).
    granted: Mutex<HashMap<u64, Capability>>,
}

impl Conn {
    fn break_with(&self) {
        self.broken.store(true, Ordering::SeqCst);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.slot_freed.notify_all();
    }
}

#[derive(Debug, Default)]
struct PeerState {
    live: usize,
    conns: Vec<Arc<Conn>>,
    threads: Vec<JoinHandle<()>>,
}

/// The pool of one peer.
#[derive(Debug)]
pub(crate) struct TcpPeer {
    endpoint: Arc<Endpoint>,
    config: PoolConfig,
    queue_tx: Sender<Chunk>,
    queue_rx: Receiver<Chunk>,
    state: Mutex<PeerState>,
    closed: AtomicBool,
    next_request_id: AtomicU64,
}

impl TcpPeer {
    pub(crate) fn new(endpoint: Arc<Endpoint>, config: PoolConfig) -> Arc<TcpPeer> {
        let (queue_tx, queue_rx) = crossbeam_channel::unbounded();
        Arc::new(TcpPeer {
            endpoint,
            config,
            queue_tx,
            queue_rx,
            state: Mutex::new(PeerState::default()),
            closed: AtomicBool::new(false),
            next_request_id: AtomicU64::new(1),
        })
    }

    /// Number of connection threads alive (connecting or connected).
    pub(crate) fn live_connections(&self) -> usize {
        self.state.lock().live
    }

    /// No connection thread and nothing queued: the pool can be dropped.
    pub(crate) fn is_idle(&self) -> bool {
        self.state.lock().live == 0 && self.queue_rx.is_empty()
    }

    /// Queues `chunks` and makes sure the pool has its connections.
    pub(crate) fn submit(self: &Arc<Self>, chunks: Vec<Chunk>) {
        let mut state = self.state.lock();
        if self.closed.load(Ordering::SeqCst) {
            drop(state);
            for chunk in chunks {
                chunk.finish(Err(TransferError::ShuttingDown));
            }
            return;
        }
        let wanted = self
            .config
            .connections
            .min(state.live + chunks.len().max(1));
        for chunk in chunks {
            // The receiver lives in self, so the channel cannot be disconnected here.
            let _ = self.queue_tx.send(chunk);
        }
        state.threads.retain(|t| !t.is_finished());
        while state.live < wanted {
            let peer = Arc::clone(self);
            match std::thread::Builder::new()
                .name("mc-tcp-conn".into())
                .spawn(move || peer.run_connection())
            {
                Ok(handle) => {
                    state.live += 1;
                    state.threads.push(handle);
                }
                Err(_) => break,
            }
        }
        if state.live == 0 {
            let err = TransferError::PeerUnreachable {
                endpoint: self.endpoint.to_string(),
                reason: "cannot spawn a connection thread".into(),
            };
            self.fail_queued(&err);
        }
    }

    /// Closes the pool: queued chunks fail, connections break, threads are joined.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let threads = {
            let mut state = self.state.lock();
            for conn in &state.conns {
                conn.break_with();
            }
            std::mem::take(&mut state.threads)
        };
        self.fail_queued(&TransferError::ShuttingDown);
        for thread in threads {
            let _ = thread.join();
        }
    }

    fn fail_queued(&self, err: &TransferError) {
        while let Ok(chunk) = self.queue_rx.try_recv() {
            chunk.finish(Err(err.clone()));
        }
    }

    fn connect(&self) -> Result<TcpStream, TransferError> {
        let mut last = String::from("no address");
        for addr in self.endpoint.resolve()? {
            match TcpStream::connect_timeout(&addr, self.config.connect_timeout) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(TransferError::PeerUnreachable {
            endpoint: self.endpoint.to_string(),
            reason: last,
        })
    }

    /// Body of one connection's sender thread.
    fn run_connection(self: Arc<Self>) {
        let exit_error = match self.connect() {
            Ok(stream) => match self.drive(stream) {
                (_, true) => return, // idle close: already left the pool
                (err, false) => err,
            },
            Err(err) => err,
        };
        let mut state = self.state.lock();
        state.live -= 1;
        if state.live == 0 {
            // Nobody is left to serve the queue: fail what is waiting, with the reason.
            self.fail_queued(&exit_error);
        }
    }

    /// Runs one connection; returns why it ended and whether it already left the pool.
    fn drive(self: &Arc<Self>, stream: TcpStream) -> (TransferError, bool) {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(POLL_INTERVAL));
        let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
        let lost = |reason: String| TransferError::ConnectionLost {
            endpoint: self.endpoint.to_string(),
            reason,
        };
        let read_half = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => return (lost(e.to_string()), false),
        };
        let conn = Arc::new(Conn {
            stream,
            inflight: Mutex::new(VecDeque::new()),
            slot_freed: Condvar::new(),
            broken: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            granted: Mutex::new(HashMap::new()),
        });
        self.state.lock().conns.push(Arc::clone(&conn));
        let receiver = {
            let conn = Arc::clone(&conn);
            let peer = Arc::clone(self);
            std::thread::Builder::new()
                .name("mc-tcp-recv".into())
                .spawn(move || peer.receive_loop(&conn, read_half))
        };
        let exit = match receiver {
            Ok(receiver) => {
                let exit = self.send_loop(&conn);
                conn.break_with();
                let _ = receiver.join();
                exit
            }
            Err(e) => lost(e.to_string()),
        };
        // The receiver failed everything in flight on its way out; nothing else holds `conn`.
        self.state.lock().conns.retain(|c| !Arc::ptr_eq(c, &conn));
        (exit, conn.retired.load(Ordering::SeqCst))
    }

    fn send_loop(&self, conn: &Conn) -> TransferError {
        let mut idle_since = Instant::now();
        loop {
            {
                let mut inflight = conn.inflight.lock();
                while inflight.len() >= self.config.pipeline_depth {
                    if conn.broken.load(Ordering::SeqCst) {
                        break;
                    }
                    conn.slot_freed.wait_for(&mut inflight, POLL_INTERVAL);
                }
            }
            if conn.broken.load(Ordering::SeqCst) || self.closed.load(Ordering::SeqCst) {
                return self.lost("connection closed");
            }
            let chunk = match self.queue_rx.recv_timeout(POLL_INTERVAL) {
                Ok(chunk) => chunk,
                Err(RecvTimeoutError::Timeout) => {
                    let busy = !conn.inflight.lock().is_empty();
                    if busy {
                        idle_since = Instant::now();
                    } else if idle_since.elapsed() > self.config.idle_close {
                        // Leave the pool under its lock, and only if nothing is queued: a
                        // submit either queued before (we stay) or sees us gone (and spawns).
                        let mut state = self.state.lock();
                        if self.queue_rx.is_empty() {
                            state.live -= 1;
                            conn.retired.store(true, Ordering::SeqCst);
                            return self.lost("idle connection closed");
                        }
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return self.lost("pool closed"),
            };
            idle_since = Instant::now();
            // Take whatever else is already queued (up to the free pipeline slots) and send the
            // whole group with one sendmsg: fewer system calls and wake-ups per request.
            let free = self
                .config
                .pipeline_depth
                .saturating_sub(conn.inflight.lock().len())
                .max(1);
            let mut group = vec![chunk];
            let mut group_payload = group[0].payload_len();
            while group.len() < free.min(MAX_COALESCED) && group_payload < COALESCE_PAYLOAD_BYTES {
                match self.queue_rx.try_recv() {
                    Ok(next) => {
                        group_payload += next.payload_len();
                        group.push(next);
                    }
                    Err(_) => break,
                }
            }
            if let Err(err) = self.send_group(conn, group) {
                return err;
            }
        }
    }

    /// Registers a group of chunks as in flight and sends their requests (and write payloads)
    /// in order. Expired chunks fail without being sent.
    fn send_group(&self, conn: &Conn, group: Vec<Chunk>) -> Result<(), TransferError> {
        let now = Instant::now();
        let mut pendings: Vec<Arc<Pending>> = Vec::with_capacity(group.len());
        let mut heads: Vec<[u8; HEADER_BYTES]> = Vec::with_capacity(group.len());
        // Capabilities presented by grants in this group, in order (their bytes are sent).
        let mut caps: Vec<[u8; CAPABILITY_BYTES]> = Vec::new();
        {
            let mut granted = conn.granted.lock();
            let mut inflight = conn.inflight.lock();
            if conn.broken.load(Ordering::SeqCst) {
                drop(inflight);
                // Never reached the wire: back to the queue for another connection (or failed
                // with the reason by the last connection to leave).
                for chunk in group {
                    let _ = self.queue_tx.send(chunk);
                }
                return Err(self.lost("connection closed"));
            }
            for chunk in group {
                if now > chunk.deadline() {
                    chunk.finish(Err(self.timeout()));
                    continue;
                }
                if let Some(cap) = chunk.remote.capability() {
                    if granted.get(&chunk.segment_id) != Some(cap) {
                        // The owner serves this segment on this connection only after it saw
                        // the capability: present it first (answered in order, like any request).
                        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
                        heads.push(Header::grant(request_id, chunk.segment_id).encode());
                        caps.push(*cap.as_bytes());
                        granted.insert(chunk.segment_id, *cap);
                        let pending = Arc::new(Pending {
                            request_id,
                            kind: Kind::GrantRequest,
                            local_ptr: 0,
                            len_bytes: 0,
                            deadline: chunk.deadline(),
                            chunk: Mutex::new(None),
                            result: Mutex::new(None),
                            holders: AtomicU8::new(2),
                        });
                        inflight.push_back(Arc::clone(&pending));
                        pendings.push(pending);
                    }
                }
                let kind = match chunk.op {
                    Op::Read => Kind::ReadRequest,
                    Op::Write => Kind::WriteRequest,
                };
                let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
                heads.push(
                    Header::request(
                        kind,
                        request_id,
                        chunk.segment_id,
                        chunk.remote_offset,
                        chunk.len_bytes as u64,
                    )
                    .encode(),
                );
                let pending = Arc::new(Pending {
                    request_id,
                    kind,
                    local_ptr: chunk.local_ptr() as usize,
                    len_bytes: chunk.len_bytes,
                    deadline: chunk.deadline(),
                    chunk: Mutex::new(Some(chunk)),
                    result: Mutex::new(None),
                    holders: AtomicU8::new(2),
                });
                inflight.push_back(Arc::clone(&pending));
                pendings.push(pending);
            }
        }
        if pendings.is_empty() {
            return Ok(());
        }
        let mut pieces: Vec<(*const u8, usize)> = Vec::with_capacity(2 * pendings.len());
        let mut next_cap = caps.iter();
        for (head, pending) in heads.iter().zip(&pendings) {
            pieces.push((head.as_ptr(), HEADER_BYTES));
            match pending.kind {
                Kind::WriteRequest => {
                    pieces.push((pending.local_ptr as *const u8, pending.len_bytes));
                }
                Kind::GrantRequest => {
                    if let Some(cap) = next_cap.next() {
                        pieces.push((cap.as_ptr(), CAPABILITY_BYTES));
                    }
                }
                _ => {}
            }
        }
        let deadline = pendings.iter().map(|p| p.deadline).min().unwrap_or(now);
        let closed = &self.closed;
        let wait = || {
            if closed.load(Ordering::Relaxed) || conn.broken.load(Ordering::Relaxed) {
                Err(IoFail::Stopped)
            } else if Instant::now() > deadline {
                Err(IoFail::Timeout)
            } else {
                Ok(())
            }
        };
        // SAFETY: headers live in `heads` and capabilities in `caps` (neither changes from here
        // on); each write payload is inside the local region pinned by its chunk, which its
        // `pending` keeps alive until both holders released it.
        let sent = unsafe { send_pieces(conn.stream.as_raw_fd(), &pieces, wait) };
        match sent {
            Ok(()) => {
                for pending in &pendings {
                    pending.release(None);
                }
                Ok(())
            }
            Err(fail) => {
                let err = self.io_error(&fail);
                for pending in &pendings {
                    pending.release(Some(Err(err.clone())));
                }
                Err(err)
            }
        }
    }

    fn receive_loop(&self, conn: &Conn, stream: TcpStream) {
        let fd = stream.as_raw_fd();
        let err = loop {
            match self.receive_one(conn, fd) {
                Ok(()) => {}
                Err(err) => break err,
            }
        };
        conn.break_with();
        let drained: Vec<Arc<Pending>> = conn.inflight.lock().drain(..).collect();
        for pending in drained {
            pending.release(Some(Err(err.clone())));
        }
        conn.slot_freed.notify_all();
    }

    fn receive_one(&self, conn: &Conn, fd: i32) -> Result<(), TransferError> {
        let mut raw = [0u8; HEADER_BYTES];
        let front_deadline = || conn.inflight.lock().front().map(|p| p.deadline);
        let wait_header = |_done: usize| {
            if conn.broken.load(Ordering::Relaxed) || self.closed.load(Ordering::Relaxed) {
                return Err(IoFail::Stopped);
            }
            match front_deadline() {
                Some(deadline) if Instant::now() > deadline => Err(IoFail::Timeout),
                _ => Ok(()),
            }
        };
        // SAFETY: raw is a local array of HEADER_BYTES bytes.
        unsafe { recv_exact(fd, raw.as_mut_ptr(), HEADER_BYTES, wait_header) }
            .map_err(|fail| self.io_error(&fail))?;
        let header = Header::decode(&raw).map_err(|source| self.protocol(source))?;
        let pending = conn.inflight.lock().front().cloned().ok_or_else(|| {
            self.protocol(WireError::Unexpected {
                expected: "nothing (no request in flight)",
                got: header.kind,
                request_id: header.request_id,
            })
        })?;
        if header.request_id != pending.request_id || header.kind != pending.kind.response() {
            return Err(self.protocol(WireError::Unexpected {
                expected: "the response to the oldest request in flight",
                got: header.kind,
                request_id: header.request_id,
            }));
        }
        let result = if !header.status.is_ok() {
            Err(TransferError::Rejected {
                code: header.status,
            })
        } else if header.kind == Kind::ReadResponse {
            if header.length != pending.len_bytes as u64 {
                return Err(self.protocol(WireError::Unexpected {
                    expected: "a read response of the requested length",
                    got: header.kind,
                    request_id: header.request_id,
                }));
            }
            let deadline = pending.deadline;
            let wait = |_: usize| {
                if conn.broken.load(Ordering::Relaxed) || self.closed.load(Ordering::Relaxed) {
                    Err(IoFail::Stopped)
                } else if Instant::now() > deadline {
                    Err(IoFail::Timeout)
                } else {
                    Ok(())
                }
            };
            // SAFETY: [local_ptr, +len) is inside the local region pinned by the chunk held by
            // `pending`; the receiver is its only writer.
            unsafe { recv_exact(fd, pending.local_ptr as *mut u8, pending.len_bytes, wait) }
                .map_err(|fail| self.io_error(&fail))?;
            Ok(())
        } else {
            Ok(())
        };
        conn.inflight.lock().pop_front();
        conn.slot_freed.notify_all();
        pending.release(Some(result));
        Ok(())
    }

    fn lost(&self, reason: &str) -> TransferError {
        TransferError::ConnectionLost {
            endpoint: self.endpoint.to_string(),
            reason: reason.into(),
        }
    }

    fn timeout(&self) -> TransferError {
        TransferError::Timeout {
            timeout_ms: self.config.entry_timeout.as_millis() as u64,
        }
    }

    fn protocol(&self, source: WireError) -> TransferError {
        TransferError::Protocol {
            endpoint: self.endpoint.to_string(),
            source,
        }
    }

    fn io_error(&self, fail: &IoFail) -> TransferError {
        if self.closed.load(Ordering::Relaxed) {
            // We closed the socket ourselves (engine shutdown / forget_peer).
            return TransferError::ShuttingDown;
        }
        match fail {
            IoFail::Timeout => self.timeout(),
            other => self.lost(&other.to_string()),
        }
    }
}
