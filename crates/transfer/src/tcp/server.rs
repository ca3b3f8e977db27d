//! The serving side of the TCP transport.
//!
//! Threads: one accept thread, one poller thread and a pool of workers. A connection with a
//! request in progress (or one that sent its last request less than [`PARK_AFTER`] ago) is
//! served by a worker, which blocks on its socket exactly as a thread per connection would: a
//! busy connection never leaves its worker, so the data path is unchanged. A connection quiet
//! for `PARK_AFTER` is *parked*: its worker hands it to the poller (one `epoll` set for all of
//! them) and takes the next one. When a parked connection becomes readable the poller hands it
//! to an idle worker, or starts one; a worker with nothing to do for [`WORKER_IDLE_EXIT`] ends.
//! So idle connections cost a socket and a table entry, not a thread, and new connections are
//! parked until their first byte arrives.
//!
//! Limits (docs/security.md): at most `max_connections` open, at most `max_connections_per_peer`
//! from one IP address; a parked connection quiet for `idle_timeout` is closed. When a new
//! connection would exceed a limit, the server makes room by closing a parked connection:
//! first the oldest that never sent a valid request, then the one idle longest if it has been
//! idle for [`EVICT_IDLE_AFTER`]; it refuses the newcomer (closes it) only when neither exists.
//! A connection handles its requests in order; each request's range is checked against the
//! registry (and pinned) before a byte of memory is touched, and once a header started, the
//! whole request must arrive within the I/O timeout.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use parking_lot::{Condvar, Mutex};

use crate::auth::{DataPortAuth, CAPABILITY_BYTES};
use crate::error::TransferError;
use crate::registry::Registry;
use crate::tcp::io::{discard, recv_exact, send_all, IoFail, POLL_INTERVAL};
use crate::wire::{Header, Kind, HEADER_BYTES};

/// A connection silent this long between requests leaves its worker for the poller.
pub const PARK_AFTER: Duration = POLL_INTERVAL;
/// A worker with no connection to serve for this long ends.
pub const WORKER_IDLE_EXIT: Duration = Duration::from_secs(10);
/// Under pressure, a connection that served requests may be closed to make room once it has
/// been idle this long (requesters close their own idle connections after 60 s by default).
pub const EVICT_IDLE_AFTER: Duration = Duration::from_secs(30);
/// Accept queue length asked of the kernel (which caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: i32 = 4096;
/// Readiness events taken per `epoll_wait`.
const EVENTS_PER_WAIT: usize = 256;
/// Segments one connection may hold grants for (a node serves a handful of segments); a grant
/// beyond it is refused with BUFFER_OVERFLOW.
pub const MAX_GRANTS_PER_CONNECTION: usize = 1024;

/// Counters of the serving side (read by tests and the bench).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests whose range passed the registry check and whose bytes were moved.
    pub requests_served: AtomicUsize,
    /// Well-formed requests refused by the registry check (bounds, unknown segment).
    pub requests_rejected: AtomicUsize,
    /// Connections closed because of a malformed header.
    pub malformed_headers: AtomicUsize,
    /// Connections closed at accept because the limits were reached and none could make room.
    pub connections_refused: AtomicUsize,
    /// Parked connections closed to make room for a new one.
    pub connections_evicted: AtomicUsize,
    /// Parked connections closed by the idle timeout.
    pub idle_timeouts: AtomicUsize,
    /// Connections closed because a request header did not complete within the I/O timeout.
    pub stalled_headers: AtomicUsize,
    /// Grants refused: a capability that does not open its segment (token configured).
    pub grants_refused: AtomicUsize,
    /// Reads and writes refused because their connection held no grant for the segment (token
    /// configured); the segment's memory was not touched.
    pub unauthorized_requests: AtomicUsize,
    /// Worker threads alive now.
    pub workers: AtomicUsize,
}

/// The limits of one server (from `TransferConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerLimits {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// How long one request may take to arrive/leave once started.
    pub io_timeout: Duration,
    /// How long a connection may stay parked.
    pub idle_timeout: Duration,
}

/// One connection.
#[derive(Debug)]
struct Conn {
    id: u64,
    stream: TcpStream,
    ip: IpAddr,
    accepted_ns: u64,
    /// End of its last request (or its accept), ns since `Shared::epoch`.
    last_active_ns: AtomicU64,
    /// Whether a request of it passed the registry check.
    served: AtomicBool,
    /// The part of the next request header read so far while parked (a worker is only given
    /// a connection once its whole header is here).
    header: Mutex<PartialHeader>,
    /// Segments this connection presented a valid capability for (with a token configured).
    granted: Mutex<Vec<u64>>,
}

/// Header bytes read ahead of a worker.
#[derive(Debug)]
struct PartialHeader {
    bytes: [u8; HEADER_BYTES],
    len: usize,
    /// When the first of them arrived (ns since `Shared::epoch`).
    since_ns: u64,
}

impl Default for PartialHeader {
    fn default() -> Self {
        PartialHeader {
            bytes: [0; HEADER_BYTES],
            len: 0,
            since_ns: 0,
        }
    }
}

/// What a non-blocking read of the next header found.
enum HeaderRead {
    Complete,
    Partial,
    Closed,
}

impl Conn {
    /// Reads what has arrived of the next header, never past it (the payload stays in the
    /// socket for the worker).
    fn read_header(&self, now_ns: u64) -> HeaderRead {
        let mut header = self.header.lock();
        while header.len < HEADER_BYTES {
            let have = header.len;
            let spare = &mut header.bytes[have..];
            // SAFETY: `spare` is a live buffer of `spare.len()` writable bytes; the descriptor is
            // open while `self.stream` lives.
            let n = unsafe {
                libc::recv(
                    self.stream.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                return HeaderRead::Closed;
            }
            if n < 0 {
                let err = std::io::Error::last_os_error();
                return match err.kind() {
                    std::io::ErrorKind::WouldBlock => HeaderRead::Partial,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => HeaderRead::Closed,
                };
            }
            if have == 0 {
                header.since_ns = now_ns;
            }
            header.len += n as usize;
        }
        HeaderRead::Complete
    }

    /// Moves the header bytes read ahead into `raw`; returns how many there were.
    fn take_header(&self, raw: &mut [u8; HEADER_BYTES]) -> usize {
        let mut header = self.header.lock();
        let len = std::mem::take(&mut header.len);
        raw[..len].copy_from_slice(&header.bytes[..len]);
        len
    }

    /// Keeps the start of a header for later (the connection is being parked).
    fn stash_header(&self, bytes: &[u8], since_ns: u64) {
        let mut header = self.header.lock();
        header.bytes[..bytes.len()].copy_from_slice(bytes);
        header.len = bytes.len();
        header.since_ns = since_ns;
    }
}

#[derive(Debug)]
struct Entry {
    conn: Arc<Conn>,
    /// In the poller's set (not on a worker).
    parked: bool,
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(count) = self.per_ip.get_mut(&entry.conn.ip) {
            *count -= 1;
            if *count == 0 {
                self.per_ip.remove(&entry.conn.ip);
            }
        }
        Some(entry)
    }
}

#[derive(Debug, Default)]
struct Workers {
    /// Connections handed over by the poller, not yet taken by a worker.
    queue: VecDeque<Arc<Conn>>,
    /// Workers waiting for a connection.
    idle: usize,
    /// Workers alive.
    alive: usize,
}

#[derive(Debug)]
struct Shared {
    registry: Arc<Registry>,
    /// Set when the engine has the cluster's token: segments are served to granted
    /// connections only.
    auth: Option<DataPortAuth>,
    stop: AtomicBool,
    limits: ServerLimits,
    stats: Arc<ServerStats>,
    epoll: OwnedFd,
    epoch: Instant,
    table: Mutex<Table>,
    workers: Mutex<Workers>,
    work_ready: Condvar,
}

/// A running TCP server.
#[derive(Debug)]
pub(crate) struct TcpServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
    poll_thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub(crate) fn start(
        bind: SocketAddr,
        registry: Arc<Registry>,
        auth: Option<DataPortAuth>,
        limits: ServerLimits,
        stats: Arc<ServerStats>,
    ) -> Result<TcpServer, TransferError> {
        let listener =
            TcpListener::bind(bind).map_err(|e| TransferError::Io(format!("bind {bind}: {e}")))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| TransferError::Io(e.to_string()))?;
        // A deeper accept queue than std's default, so that a burst of connections is queued
        // rather than dropped (their SYNs would be retried only a second later).
        // SAFETY: listen(2) on the listening socket we own; no memory is passed.
        unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) };
        // SAFETY: epoll_create1 has no memory-safety preconditions.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(TransferError::Io(format!(
                "epoll_create1: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `epfd` is a descriptor we just opened and own alone.
        let epoll = unsafe { OwnedFd::from_raw_fd(epfd) };
        let shared = Arc::new(Shared {
            registry,
            auth,
            stop: AtomicBool::new(false),
            limits,
            stats,
            epoll,
            epoch: Instant::now(),
            table: Mutex::new(Table::default()),
            workers: Mutex::new(Workers::default()),
            work_ready: Condvar::new(),
        });
        let poll_shared = Arc::clone(&shared);
        let poll_thread = std::thread::Builder::new()
            .name("mc-tcp-poll".into())
            .spawn(move || poll_loop(&poll_shared))
            .map_err(|e| TransferError::Io(e.to_string()))?;
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name("mc-tcp-accept".into())
            .spawn(move || accept_loop(listener, &accept_shared));
        let accept_thread = match accept_thread {
            Ok(handle) => handle,
            Err(e) => {
                shared.stop.store(true, Ordering::SeqCst);
                let _ = poll_thread.join();
                return Err(TransferError::Io(e.to_string()));
            }
        };
        Ok(TcpServer {
            local_addr,
            shared,
            accept_thread: Some(accept_thread),
            poll_thread: Some(poll_thread),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes every connection and waits (bounded) for the threads.
    pub(crate) fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a throwaway connection to ourselves.
        let mut wake = self.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(handle) = self.accept_thread.take() {
            let _ = handle.join();
        }
        if let Some(handle) = self.poll_thread.take() {
            let _ = handle.join();
        }
        // Workers blocked on a socket see it end; idle workers see `stop`.
        let entries: Vec<Entry> = {
            let mut table = self.shared.table.lock();
            table.per_ip.clear();
            table.entries.drain().map(|(_, entry)| entry).collect()
        };
        for entry in &entries {
            let _ = entry.conn.stream.shutdown(std::net::Shutdown::Both);
        }
        drop(entries);
        {
            let mut workers = self.shared.workers.lock();
            workers.queue.clear();
        }
        self.shared.work_ready.notify_all();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.shared.workers.lock().alive > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        if self.accept_thread.is_some() {
            self.shutdown();
        }
    }
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// Admits a new connection (closing a parked one to make room if needed), or refuses it.
    fn admit(&self, stream: TcpStream, ip: IpAddr) -> Option<Arc<Conn>> {
        let now = self.now_ns();
        let mut table = self.table.lock();
        let limits = &self.limits;
        if table.per_ip.get(&ip).copied().unwrap_or(0) >= limits.max_connections_per_peer
            && !self.evict_one(&mut table, now, Some(ip))
        {
            return None;
        }
        if table.entries.len() >= limits.max_connections && !self.evict_one(&mut table, now, None) {
            return None;
        }
        table.next_id += 1;
        let conn = Arc::new(Conn {
            id: table.next_id,
            stream,
            ip,
            accepted_ns: now,
            last_active_ns: AtomicU64::new(now),
            served: AtomicBool::new(false),
            header: Mutex::new(PartialHeader::default()),
            granted: Mutex::new(Vec::new()),
        });
        table.entries.insert(
            conn.id,
            Entry {
                conn: Arc::clone(&conn),
                parked: true,
            },
        );
        *table.per_ip.entry(ip).or_insert(0) += 1;
        Some(conn)
    }

    /// Closes the parked connection (of `ip`, if given) that may best make room: the oldest that
    /// never served a request, else the one idle longest past `EVICT_IDLE_AFTER`.
    fn evict_one(&self, table: &mut Table, now: u64, ip: Option<IpAddr>) -> bool {
        let evict_after = EVICT_IDLE_AFTER.as_nanos() as u64;
        let mut stranger: Option<(u64, u64)> = None;
        let mut idle: Option<(u64, u64)> = None;
        for entry in table.entries.values() {
            let conn = &entry.conn;
            if !entry.parked || ip.is_some_and(|ip| conn.ip != ip) {
                continue;
            }
            if !conn.served.load(Ordering::Relaxed) {
                if earlier(conn.accepted_ns, stranger) {
                    stranger = Some((conn.accepted_ns, conn.id));
                }
                continue;
            }
            let last = conn.last_active_ns.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= evict_after && earlier(last, idle) {
                idle = Some((last, conn.id));
            }
        }
        let Some((_, id)) = stranger.or(idle) else {
            return false;
        };
        if let Some(entry) = table.remove(id) {
            let _ = entry.conn.stream.shutdown(std::net::Shutdown::Both);
            self.stats
                .connections_evicted
                .fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Hands `conn` to the poller until it becomes readable.
    fn park(&self, conn: &Arc<Conn>) {
        {
            let mut table = self.table.lock();
            let Some(entry) = table.entries.get_mut(&conn.id) else {
                return; // closed meanwhile
            };
            entry.parked = true;
        }
        if !self.arm(conn, libc::EPOLL_CTL_ADD) {
            self.close(conn.id);
        }
    }

    /// Registers (`EPOLL_CTL_ADD`) or re-arms (`EPOLL_CTL_MOD`) `conn` for one readiness event.
    fn arm(&self, conn: &Conn, op: libc::c_int) -> bool {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32,
            u64: conn.id,
        };
        // SAFETY: both descriptors are open (the epoll set lives in `self`, the socket in
        // `conn`); `event` is a live struct the kernel only reads.
        let done = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                op,
                conn.stream.as_raw_fd(),
                &mut event,
            )
        };
        done == 0
    }

    /// A parked connection became readable: reads what arrived of its next header and, once
    /// the header is whole, takes it out of the poller's set and gives it to a worker.
    fn wake(self: &Arc<Self>, id: u64) {
        let conn = {
            let table = self.table.lock();
            match table.entries.get(&id) {
                Some(entry) if entry.parked => Arc::clone(&entry.conn),
                _ => return,
            }
        };
        match conn.read_header(self.now_ns()) {
            HeaderRead::Closed => {
                self.close(id);
                return;
            }
            HeaderRead::Partial => {
                // Wait for the rest here, not on a worker; the sweep enforces the I/O timeout.
                if !self.arm(&conn, libc::EPOLL_CTL_MOD) {
                    self.close(id);
                }
                return;
            }
            HeaderRead::Complete => {}
        }
        {
            let mut table = self.table.lock();
            match table.entries.get_mut(&id) {
                Some(entry) if entry.parked => entry.parked = false,
                _ => return, // evicted meanwhile
            }
        }
        // SAFETY: as in `park`; DEL ignores the event argument.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                conn.stream.as_raw_fd(),
                std::ptr::null_mut(),
            );
        }
        self.dispatch(conn);
    }

    /// Queues `conn` for a worker, starting one when every worker is busy.
    fn dispatch(self: &Arc<Self>, conn: Arc<Conn>) {
        let mut workers = self.workers.lock();
        if self.stop.load(Ordering::SeqCst) {
            drop(workers);
            self.close(conn.id);
            return;
        }
        workers.queue.push_back(conn);
        if workers.queue.len() > workers.idle {
            let shared = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("mc-tcp-serve".into())
                .spawn(move || worker_loop(&shared));
            match spawned {
                Ok(_) => {
                    workers.alive += 1;
                    self.stats.workers.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) if workers.alive == 0 => {
                    // Nobody can serve it: close it rather than let it hang.
                    let orphan = workers.queue.pop_back();
                    drop(workers);
                    if let Some(conn) = orphan {
                        self.close(conn.id);
                    }
                    return;
                }
                Err(_) => {} // a busy worker takes it when it is done
            }
        }
        drop(workers);
        self.work_ready.notify_one();
    }

    /// Closes a connection and forgets it.
    fn close(&self, id: u64) {
        let entry = self.table.lock().remove(id);
        if let Some(entry) = entry {
            let _ = entry.conn.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Closes every parked connection idle past the idle timeout, or holding part of a header
    /// for longer than the I/O timeout.
    fn close_idle(&self) {
        let now = self.now_ns();
        let idle_limit = self.limits.idle_timeout.as_nanos() as u64;
        let header_limit = self.limits.io_timeout.as_nanos() as u64;
        let mut table = self.table.lock();
        let mut expired = Vec::new();
        for entry in table.entries.values().filter(|entry| entry.parked) {
            let conn = &entry.conn;
            let header = conn.header.lock();
            if header.len > 0 {
                if now.saturating_sub(header.since_ns) >= header_limit {
                    expired.push((conn.id, true));
                }
            } else if now.saturating_sub(conn.last_active_ns.load(Ordering::Relaxed)) >= idle_limit
            {
                expired.push((conn.id, false));
            }
        }
        for (id, stalled) in expired {
            if let Some(entry) = table.remove(id) {
                let _ = entry.conn.stream.shutdown(std::net::Shutdown::Both);
                let counter = if stalled {
                    &self.stats.stalled_headers
                } else {
                    &self.stats.idle_timeouts
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Whether `at` comes before the best `(time, id)` found so far (or nothing was found).
fn earlier(at: u64, best: Option<(u64, u64)>) -> bool {
    match best {
        Some((best_at, _)) => at < best_at,
        None => true,
    }
}

fn accept_loop(listener: TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else {
            // EMFILE and friends: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let ip = stream
            .peer_addr()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| addr.ip());
        let _ = stream.set_nodelay(true);
        // A worker's wait for the next header gives up (parks) after one such timeout; waits
        // inside a request check their deadline at the same rate.
        let _ = stream.set_read_timeout(Some(PARK_AFTER));
        let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
        match shared.admit(stream, ip) {
            Some(conn) => shared.park(&conn),
            None => {
                shared
                    .stats
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn poll_loop(shared: &Arc<Shared>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT];
    let mut last_sweep = Instant::now();
    while !shared.stop.load(Ordering::SeqCst) {
        // SAFETY: `events` holds EVENTS_PER_WAIT writable entries; the epoll set is open.
        let n = unsafe {
            libc::epoll_wait(
                shared.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                EVENTS_PER_WAIT as i32,
                POLL_INTERVAL.as_millis() as i32,
            )
        };
        for event in events.iter().take(usize::try_from(n).unwrap_or(0)) {
            shared.wake(event.u64);
        }
        if last_sweep.elapsed() >= POLL_INTERVAL {
            shared.close_idle();
            last_sweep = Instant::now();
        }
    }
}

fn worker_loop(shared: &Arc<Shared>) {
    while let Some(conn) = next_connection(shared) {
        if serve_connection(&conn, shared) {
            shared.park(&conn);
        } else {
            shared.close(conn.id);
        }
    }
}

/// The next connection for a worker; `None` when the worker should end (nothing to do for
/// `WORKER_IDLE_EXIT`, or the server stops), in which case it is no longer counted.
fn next_connection(shared: &Shared) -> Option<Arc<Conn>> {
    let mut workers = shared.workers.lock();
    loop {
        if let Some(conn) = workers.queue.pop_front() {
            return Some(conn);
        }
        if !shared.stop.load(Ordering::SeqCst) {
            workers.idle += 1;
            let waited = shared.work_ready.wait_for(&mut workers, WORKER_IDLE_EXIT);
            workers.idle -= 1;
            if !waited.timed_out() || !workers.queue.is_empty() {
                continue;
            }
        }
        workers.alive -= 1;
        shared.stats.workers.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
}

/// Serves requests until the connection goes quiet for `PARK_AFTER` (returns `true`: park it)
/// or must close (`false`): the peer closed, sent a malformed header, stalled past the I/O
/// timeout mid-request, or the server stops.
fn serve_connection(conn: &Conn, shared: &Shared) -> bool {
    let stream = &conn.stream;
    let fd: RawFd = stream.as_raw_fd();
    let stop = &shared.stop;
    let io_timeout = shared.limits.io_timeout;
    loop {
        let mut raw = [0u8; HEADER_BYTES];
        // The poller hands over a whole header; after a request, the next one may come within
        // `PARK_AFTER`. Whatever is still missing after that silence waits parked, in the poller,
        // so a worker never waits for a header.
        let mut have = conn.take_header(&mut raw);
        if have < HEADER_BYTES {
            let quiet = std::cell::Cell::new(false);
            let got = std::cell::Cell::new(0usize);
            let wait_header = |done: usize| {
                got.set(done);
                if !stop.load(Ordering::Relaxed) {
                    quiet.set(true);
                }
                Err(IoFail::Stopped)
            };
            // SAFETY: `raw` is a local array of HEADER_BYTES bytes and have < HEADER_BYTES.
            let received = unsafe {
                recv_exact(
                    fd,
                    raw.as_mut_ptr().add(have),
                    HEADER_BYTES - have,
                    wait_header,
                )
            };
            if received.is_err() {
                if quiet.get() {
                    have += got.get();
                    if have > 0 {
                        conn.stash_header(&raw[..have], shared.now_ns());
                    }
                }
                return quiet.get();
            }
        }
        let request = match Header::decode(&raw) {
            Ok(h) if h.kind.is_request() => h,
            _ => {
                // We cannot trust anything after a bad header (not even where the next one
                // starts), so the connection ends here. The requester sees it closed.
                shared
                    .stats
                    .malformed_headers
                    .fetch_add(1, Ordering::Relaxed);
                return false;
            }
        };
        let deadline = Instant::now() + io_timeout;
        let wait = |_: usize| -> Result<(), IoFail> {
            if stop.load(Ordering::Relaxed) {
                Err(IoFail::Stopped)
            } else if Instant::now() > deadline {
                Err(IoFail::Timeout)
            } else {
                Ok(())
            }
        };
        if request.kind == Kind::GrantRequest {
            if grant(conn, shared, &request, wait).is_err() {
                return false;
            }
            conn.last_active_ns
                .store(shared.now_ns(), Ordering::Relaxed);
            continue;
        }
        let guard = if shared.auth.is_some() && !conn.granted.lock().contains(&request.segment_id) {
            shared
                .stats
                .unauthorized_requests
                .fetch_add(1, Ordering::Relaxed);
            Err(TransferError::Unauthorized {
                segment_id: request.segment_id,
            })
        } else {
            shared
                .registry
                .acquire_segment(request.segment_id, request.offset, request.length)
        };
        if guard.is_ok() && !conn.served.load(Ordering::Relaxed) {
            conn.served.store(true, Ordering::Relaxed);
        }
        let served = match (request.kind, guard) {
            (Kind::ReadRequest, Ok(guard)) => {
                // Counted before answering, so a requester that saw the answer sees the count.
                shared.stats.requests_served.fetch_add(1, Ordering::Relaxed);
                let head = request.response(ErrorCode::OK).encode();
                // SAFETY: the guard pins [ptr, ptr+len) inside a registered segment, checked
                // against the segment's size just above.
                unsafe { send_all(fd, &head, guard.ptr(), guard.len_bytes(), || wait(0)) }
            }
            (Kind::WriteRequest, Ok(guard)) => {
                // SAFETY: as above; the payload lands directly in the segment.
                let received = unsafe { recv_exact(fd, guard.ptr(), guard.len_bytes(), wait) };
                drop(guard);
                received.and_then(|()| {
                    shared.stats.requests_served.fetch_add(1, Ordering::Relaxed);
                    let head = request.response(ErrorCode::OK).encode();
                    // SAFETY: no payload (null, 0).
                    unsafe { send_all(fd, &head, std::ptr::null(), 0, || wait(0)) }
                })
            }
            (kind, Err(err)) => {
                shared
                    .stats
                    .requests_rejected
                    .fetch_add(1, Ordering::Relaxed);
                let drained = if kind == Kind::WriteRequest {
                    // Keep the stream in sync: swallow the payload, touching no segment memory.
                    discard(fd, request.length, wait)
                } else {
                    Ok(())
                };
                drained.and_then(|()| {
                    let head = request.response(err.code()).encode();
                    // SAFETY: no payload.
                    unsafe { send_all(fd, &head, std::ptr::null(), 0, || wait(0)) }
                })
            }
            _ => return false,
        };
        if served.is_err() {
            return false;
        }
        conn.last_active_ns
            .store(shared.now_ns(), Ordering::Relaxed);
    }
}

/// Serves a grant request: reads the capability that follows the header, checks it against the
/// segment (any is accepted without a token) and answers OK, remembering the segment for this
/// connection, or ILLEGAL_CLIENT. `Err` when the connection must close.
fn grant(
    conn: &Conn,
    shared: &Shared,
    request: &Header,
    wait: impl FnMut(usize) -> Result<(), IoFail> + Copy,
) -> Result<(), IoFail> {
    let mut presented = [0u8; CAPABILITY_BYTES];
    // SAFETY: `presented` is a local array of CAPABILITY_BYTES bytes (the decoder checked the
    // header announces exactly that many).
    unsafe {
        recv_exact(
            conn.stream.as_raw_fd(),
            presented.as_mut_ptr(),
            presented.len(),
            wait,
        )?
    };
    let status = match &shared.auth {
        Some(auth) if !auth.verify(request.segment_id, &presented) => {
            shared.stats.grants_refused.fetch_add(1, Ordering::Relaxed);
            ErrorCode::ILLEGAL_CLIENT
        }
        Some(_) => {
            let mut granted = conn.granted.lock();
            if granted.contains(&request.segment_id) {
                ErrorCode::OK
            } else if granted.len() >= MAX_GRANTS_PER_CONNECTION {
                ErrorCode::BUFFER_OVERFLOW
            } else {
                granted.push(request.segment_id);
                conn.served.store(true, Ordering::Relaxed);
                ErrorCode::OK
            }
        }
        None => ErrorCode::OK,
    };
    let head = request.response(status).encode();
    let mut wait = wait;
    // SAFETY: no payload (null, 0).
    unsafe {
        send_all(conn.stream.as_raw_fd(), &head, std::ptr::null(), 0, || {
            wait(0)
        })
    }
}
