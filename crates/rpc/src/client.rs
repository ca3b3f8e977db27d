//! A client connection that multiplexes concurrent calls over one TCP stream.
//!
//! A call encodes its frame, takes the write half's lock just long enough to write it, and waits
//! on a oneshot that the connection's reader task completes when the answer with its request id
//! arrives. In busy-poll mode a caller on its own thread (`block_on`) whose calls do not overlap
//! others' reads the socket itself instead, spinning first when that pays (`crate::poll`), and
//! hands out whatever answers it reads; meanwhile the reader task stays out of the way. A call
//! that times out removes its entry, so a late answer is dropped. When the connection breaks,
//! every waiting call fails with `Disconnected` and the next call reconnects.

use crate::poll::{self, now_ns, PollPolicy, SpinClock, Verdict};
use bytes::{Bytes, BytesMut};
use mooncake_common::{AuthToken, ErrorCode};
use mooncake_proto::methods::{Authenticate, Method, TokenBytes};
use mooncake_proto::{
    decode_error_body, encode_frame, FrameDecoder, FrameError, FrameHeader, FrameKind,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Why a call failed.
#[derive(Debug, Clone, Error)]
pub enum RpcError {
    #[error("could not connect to {addr}: {message}")]
    Connect { addr: SocketAddr, message: String },
    #[error("connection lost: {0}")]
    Disconnected(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("server answered {code}: {message}")]
    Remote { code: ErrorCode, message: String },
    #[error("bad frame from server: {0}")]
    Frame(#[from] FrameError),
    #[error("request of {len} bytes exceeds the frame limit of {max}")]
    TooLarge { len: usize, max: usize },
}

impl RpcError {
    /// The upstream error code a caller sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Timeout(_) => ErrorCode::RPC_TIMEOUT,
            RpcError::Remote { code, .. } => *code,
            RpcError::TooLarge { .. } => ErrorCode::INVALID_PARAMS,
            RpcError::Connect { .. } | RpcError::Disconnected(_) | RpcError::Frame(_) => {
                ErrorCode::RPC_FAIL
            }
        }
    }
}

/// Client limits and modes.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
    /// Deadline of one call, from send to answer.
    pub call_timeout: Duration,
    pub max_frame_bytes: usize,
    /// Low-latency mode: while a call waits for its answer, the socket is polled for up to this
    /// long before parking in epoll, so the answer is picked up without waking a parked thread
    /// (when [`ClientConfig::poll_policy`] says spinning pays). A caller on its own thread
    /// (`block_on`: the Python binding, the blocking client) whose calls do not overlap others'
    /// reads its answer itself: it spins, then waits on the socket itself (a multi-thread
    /// runtime's `block_on` only), so no thread has to be woken to hand the answer over (32-key
    /// batch lookups from Python after a copy: 90-110 µs to 53-67 µs, docs/decisions.md). For
    /// calls made by runtime tasks the connection's reader polls; a call sent while it is parked
    /// wakes it (that wake-up overlaps the round trip). Sequential 4 KiB gets went from 1.3× to
    /// about 0.7× a blocking-read ping-pong between two processes. Spinning costs at most this
    /// much CPU per call; with no call in flight the reader parks (after lingering half of it
    /// when the caller has been sending calls back to back). Default 100 µs; `None` turns
    /// polling off (every answer goes through the reader task).
    pub busy_poll: Option<Duration>,
    /// When to spin for an answer within `busy_poll`. Default [`PollPolicy::Adaptive`]: only
    /// while the host has a core to spare and spinning keeps paying on the thread (spinners
    /// that outnumber cores take the cores the server and the other processes need);
    /// [`PollPolicy::Always`] spins on every call, as an explicit budget from the user asks.
    pub poll_policy: PollPolicy,
    /// The cluster's shared token: when set, every new connection first sends `Authenticate`
    /// (method 47) with it and is used only once the server accepted it. A server without a
    /// token accepts any. Default `None`.
    pub auth_token: Option<AuthToken>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(10),
            max_frame_bytes: mooncake_proto::DEFAULT_MAX_FRAME_BYTES,
            busy_poll: Some(DEFAULT_BUSY_POLL),
            poll_policy: PollPolicy::Adaptive,
            auth_token: None,
        }
    }
}

impl ClientConfig {
    /// A budget the user chose (an environment variable, a flag), in microseconds: `0` turns
    /// polling off; any other value spins up to that long on every call
    /// ([`PollPolicy::Always`]) instead of the adaptive default.
    pub fn set_busy_poll_us(&mut self, us: u64) {
        self.busy_poll = (us > 0).then(|| Duration::from_micros(us));
        self.poll_policy = PollPolicy::Always;
    }
}

/// How long after two calls of a connection last overlapped its callers start polling for their
/// own answers again (see [`RpcClient::call`]).
const SEQUENTIAL_AFTER: Duration = Duration::from_millis(50);

/// `Connection::overlap_at_ns` of a connection whose calls never overlapped.
const NEVER: u64 = u64::MAX;

/// Default of [`ClientConfig::busy_poll`].
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(100);

type Reply = Result<(FrameKind, Bytes), RpcError>;

/// Frames waiting to be written. Whoever finds `flushing` false becomes the flusher and writes
/// everything queued (its own frame and those appended meanwhile) in as few syscalls as possible;
/// the others only append. Sequential calls pay one write each; pipelined bursts share writes.
#[derive(Debug, Default)]
struct Outbox {
    buf: BytesMut,
    flushing: bool,
}

#[derive(Debug)]
struct Connection {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    outbox: Mutex<Outbox>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    alive: AtomicBool,
    /// Busy-poll mode: how calls wake a parked reader (shared with the reader, which holds the
    /// connection itself only weakly).
    reader: Arc<ReaderSignal>,
    /// The read side, shared with the reader task (a caller may read its own answer).
    inbox: Arc<Inbox>,
    /// When a call last found another in flight (`now_ns`; `NEVER` before).
    overlap_at_ns: AtomicU64,
    /// The client's counters.
    counters: Arc<Counters>,
}

/// What [`RpcClient::poll_stats`] reports.
#[derive(Debug, Default)]
struct Counters {
    caller_reads: AtomicU64,
    spins: AtomicU64,
    skipped_host_busy: AtomicU64,
    skipped_backing_off: AtomicU64,
}

/// How the calls of one client waited for their answers (diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Reads of the socket by callers waiting for their own answers (on their own threads).
    pub caller_reads: u64,
    /// Calls whose caller spun for its answer.
    pub spins: u64,
    /// Calls whose caller would have spun but did not: the host had no core to spare.
    pub skipped_host_busy: u64,
    /// ... or spinning had gone badly on the caller's thread just before.
    pub skipped_backing_off: u64,
}

/// The read half of a connection and the bytes read from it but not yet handed out. Whoever
/// holds `state` reads and hands out answers: the reader task, or a caller polling for its own
/// answer (see [`RpcClient::call`]). The read half lives as long as either holds this, so its
/// file descriptor stays valid for both.
#[derive(Debug)]
struct Inbox {
    half: OwnedReadHalf,
    state: Mutex<InboxState>,
    /// Whether a caller reads the socket for its own answer ([`PollingGuard`]). Set under
    /// `state`'s lock, and the reader task reads only under that lock after finding it clear: it
    /// never takes an answer a polling caller waits for.
    caller_polling: AtomicBool,
}

#[derive(Debug)]
struct InboxState {
    buf: BytesMut,
    decoder: FrameDecoder,
    /// Set once the connection is over (end of stream, socket error, bad frame): why.
    closed: Option<String>,
}

/// Busy-poll mode: `parked` is set while the reader waits in epoll; a call that finds it set
/// wakes the reader through `wake` so it polls for the answer (the wake-up then overlaps the
/// round trip instead of following it).
#[derive(Debug, Default)]
struct ReaderSignal {
    parked: AtomicBool,
    wake: tokio::sync::Notify,
    /// When the reader last handed out an answer (`now_ns`).
    answered_at_ns: AtomicU64,
    /// Whether the latest call was sent within half the poll budget of the answer before it.
    last_gap_short: AtomicBool,
    /// Whether the last two calls were (the reader then lingers after an answer).
    quick_follow_up: AtomicBool,
    /// Set while the reader waits for a polling caller to finish (it reads nothing meanwhile);
    /// a call that needs the reader then wakes it through `wake`.
    deferring: AtomicBool,
}

impl Connection {
    /// Whether the reader should poll: a call waits for an answer and no caller polls (that
    /// caller hands out every answer it reads; two spinners would take the core the server
    /// needs).
    fn awaited(&self) -> bool {
        !self.inbox.caller_polling.load(Ordering::SeqCst) && !self.pending.lock().is_empty()
    }

    fn fail_all(&self, why: &str) {
        self.alive.store(false, Ordering::Release);
        let waiting: Vec<_> = self.pending.lock().drain().collect();
        for (_, tx) in waiting {
            let _ = tx.send(Err(RpcError::Disconnected(why.to_string())));
        }
    }
}

/// A reconnecting, multiplexing RPC client for one server address. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct RpcClient {
    addr: SocketAddr,
    config: ClientConfig,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Serializes reconnection attempts (the fast path above never awaits).
    connect_lock: tokio::sync::Mutex<()>,
    next_request_id: AtomicU64,
    counters: Arc<Counters>,
}

impl RpcClient {
    /// A client for `addr`; it connects on the first call.
    pub fn new(addr: SocketAddr, config: ClientConfig) -> Self {
        RpcClient {
            addr,
            config,
            connection: Mutex::new(None),
            connect_lock: tokio::sync::Mutex::new(()),
            next_request_id: AtomicU64::new(1),
            counters: Arc::new(Counters::default()),
        }
    }

    /// How many times a caller waiting on its own thread read answers from the socket itself
    /// (busy-poll mode, calls made through `block_on`), rather than the connection's reader task.
    pub fn caller_reads(&self) -> u64 {
        self.counters.caller_reads.load(Ordering::Relaxed)
    }

    /// How this client's callers waited for their answers: reads of their own, and the adaptive
    /// mode's verdicts on spinning (see [`ClientConfig::poll_policy`]).
    pub fn poll_stats(&self) -> PollStats {
        let c = &self.counters;
        PollStats {
            caller_reads: c.caller_reads.load(Ordering::Relaxed),
            spins: c.spins.load(Ordering::Relaxed),
            skipped_host_busy: c.skipped_host_busy.load(Ordering::Relaxed),
            skipped_backing_off: c.skipped_backing_off.load(Ordering::Relaxed),
        }
    }

    /// Whether the client holds a live connection (it connects on the next call otherwise).
    pub fn is_connected(&self) -> bool {
        self.current_connection().is_some()
    }

    /// The server address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connects now (calls connect lazily otherwise).
    pub async fn connect(&self) -> Result<(), RpcError> {
        self.live_connection().await.map(|_| ())
    }

    fn current_connection(&self) -> Option<Arc<Connection>> {
        self.connection
            .lock()
            .as_ref()
            .filter(|c| c.alive.load(Ordering::Acquire))
            .cloned()
    }

    async fn live_connection(&self) -> Result<Arc<Connection>, RpcError> {
        if let Some(connection) = self.current_connection() {
            return Ok(connection);
        }
        let _connecting = self.connect_lock.lock().await;
        if let Some(connection) = self.current_connection() {
            return Ok(connection);
        }
        let connect_error = |message: String| RpcError::Connect {
            addr: self.addr,
            message,
        };
        let stream =
            tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(self.addr))
                .await
                .map_err(|_| connect_error("timed out".to_string()))?
                .map_err(|e| connect_error(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        let inbox = Arc::new(Inbox {
            half: reader,
            state: Mutex::new(InboxState {
                buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
                decoder: FrameDecoder::new(self.config.max_frame_bytes),
                closed: None,
            }),
            caller_polling: AtomicBool::new(false),
        });
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(writer),
            outbox: Mutex::new(Outbox::default()),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            reader: Arc::new(ReaderSignal::default()),
            inbox: Arc::clone(&inbox),
            overlap_at_ns: AtomicU64::new(NEVER),
            counters: Arc::clone(&self.counters),
        });
        tokio::spawn(read_loop(
            inbox,
            Arc::clone(&connection.reader),
            Arc::downgrade(&connection),
            self.config
                .busy_poll
                .map(|budget| (budget, self.config.poll_policy)),
        ));
        // Published only once authenticated: no call can overtake the handshake.
        if let Some(token) = &self.config.auth_token {
            if let Err(error) = self.authenticate(&connection, token).await {
                connection.fail_all(&format!("authentication failed: {error}"));
                return Err(error);
            }
        }
        *self.connection.lock() = Some(connection.clone());
        Ok(connection)
    }

    /// Presents `token` on a new connection (`Authenticate`) and checks the answer.
    async fn authenticate(
        &self,
        connection: &Arc<Connection>,
        token: &AuthToken,
    ) -> Result<(), RpcError> {
        let request = Authenticate {
            token: TokenBytes(token.expose().to_vec()),
        };
        let body = mooncake_proto::encode(&request).map_err(|error| RpcError::Remote {
            code: error.code(),
            message: error.to_string(),
        })?;
        let answer = self.call_on(connection, Authenticate::ID, &body).await?;
        match mooncake_proto::decode::<mooncake_proto::Reply<Authenticate>>(&answer) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(code)) => Err(RpcError::Remote {
                code,
                message: "Authenticate refused".to_string(),
            }),
            Err(error) => Err(RpcError::Remote {
                code: error.code(),
                message: format!("Authenticate answer: {error}"),
            }),
        }
    }

    /// Sends one request and waits for its answer's body. Protocol-level failures (error frames)
    /// come back as `RpcError::Remote`.
    pub async fn call(&self, method: u16, body: &[u8]) -> Result<Bytes, RpcError> {
        let len = body.len() + mooncake_proto::HEADER_BYTES;
        if len > self.config.max_frame_bytes {
            return Err(RpcError::TooLarge {
                len,
                max: self.config.max_frame_bytes,
            });
        }
        let connection = self.live_connection().await?;
        self.call_on(&connection, method, body).await
    }

    /// [`RpcClient::call`] on `connection`.
    async fn call_on(
        &self,
        connection: &Arc<Connection>,
        method: u16,
        body: &[u8],
    ) -> Result<Bytes, RpcError> {
        let connection = Arc::clone(connection);
        let deadline = Instant::now() + self.config.call_timeout;
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let header = FrameHeader {
            kind: FrameKind::Request,
            method,
            request_id,
        };
        let (tx, mut rx) = oneshot::channel();
        let (alone, caller_reads_for_us) = {
            let mut pending = connection.pending.lock();
            pending.insert(request_id, tx);
            // Under `pending`'s lock, as a polling caller's exit looks at `pending`: either it
            // sees this call (and hands it to the reader) or this sees it gone.
            (
                pending.len() == 1,
                connection.inbox.caller_polling.load(Ordering::SeqCst),
            )
        };
        let now = now_ns();
        if !alone {
            connection.overlap_at_ns.store(now, Ordering::Relaxed);
        }
        let sequential =
            is_sequential(alone, now, connection.overlap_at_ns.load(Ordering::Relaxed));
        // `fail_all` clears `alive` before draining `pending`: checking after inserting means a
        // call racing with a failure is either drained (and told) or sees the failure here.
        if !connection.alive.load(Ordering::Acquire) {
            connection.pending.lock().remove(&request_id);
            return Err(RpcError::Disconnected("connection failed".to_string()));
        }
        // A caller on its own thread (`block_on`, not a runtime task) whose calls on this
        // connection have not overlapped others' lately reads the socket for its answer itself:
        // no thread has to be woken to read it, nor to hand it over. It spins first when that
        // pays (`crate::poll`), then (on a multi-thread runtime, where nothing else needs this
        // thread) waits on the socket itself. Concurrent calls (several threads on one
        // connection) wait as a task's call does: the reader task polls for all of them and
        // hands out their answers, one spinner instead of one per thread (polling whenever no
        // other call was in flight, without the 50 ms window, two Python threads did 31-34k
        // calls/s against 36-39k with it).
        let mut spin_budget = None;
        let mut may_block = false;
        let mut polling = None;
        if let Some(budget) = self.config.busy_poll {
            if sequential && tokio::task::try_id().is_none() {
                may_block = on_multi_thread_runtime();
                let counters = &self.counters;
                match poll::decide(self.config.poll_policy) {
                    Verdict::Poll => spin_budget = Some(budget),
                    Verdict::HostBusy => {
                        counters.skipped_host_busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Verdict::BackingOff => {
                        counters.skipped_backing_off.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if spin_budget.is_some() || may_block {
                    polling = PollingGuard::try_new(&connection);
                }
                if polling.is_some() && spin_budget.is_some() {
                    counters.spins.fetch_add(1, Ordering::Relaxed);
                } else {
                    spin_budget = None;
                }
            }
        }
        if polling.is_none() {
            self.reader_will_read(&connection, caller_reads_for_us);
        }
        let must_flush = {
            let mut outbox = connection.outbox.lock();
            encode_frame(&mut outbox.buf, header, body);
            !std::mem::replace(&mut outbox.flushing, true)
        };
        if must_flush {
            if let Err(error) = flush(&connection).await {
                connection.pending.lock().remove(&request_id);
                connection.fail_all(&error.to_string());
                return Err(RpcError::Disconnected(error.to_string()));
            }
        }

        if let Some(polling) = polling {
            if let Some(budget) = spin_budget {
                let (answer, spin) = poll::spin(budget, || {
                    if let Some(answer) = try_answer(&mut rx) {
                        return Some(answer);
                    }
                    connection.poll_inbox();
                    try_answer(&mut rx)
                })
                .await;
                poll::report(self.config.poll_policy, spin);
                if let Some(answer) = answer {
                    return finish(answer);
                }
            }
            if may_block {
                match wait_for_own_answer(&connection, &mut rx, deadline).await {
                    Waited::Answer(answer) => return finish(answer),
                    Waited::TimedOut => {
                        connection.pending.lock().remove(&request_id);
                        return Err(RpcError::Timeout(self.config.call_timeout));
                    }
                    Waited::Overlapped => {}
                }
            }
            // The reader task takes over (this call's entry is still pending: it is told).
            drop(polling);
        }
        // A task's call awaits: in busy-poll mode the connection's reader task spins on the
        // socket (spinning here would starve that reader on a current-thread runtime).
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, &mut rx).await {
            Ok(reply) => finish(reply.ok()),
            Err(_) => {
                connection.pending.lock().remove(&request_id);
                Err(RpcError::Timeout(self.config.call_timeout))
            }
        }
    }

    /// Readies the reader task for a call whose answer it reads: wakes it if it waits for a
    /// polling caller that has gone (`caller_reads_for_us`: one still polls, and reads this
    /// answer or hands the call over when it stops), and in busy-poll mode has it poll.
    fn reader_will_read(&self, connection: &Connection, caller_reads_for_us: bool) {
        let signal = &connection.reader;
        if !caller_reads_for_us && signal.deferring.load(Ordering::SeqCst) {
            signal.wake.notify_one();
        }
        // The reader marks itself parked before its last look at `pending` (both SeqCst): it
        // either sees this call and keeps polling, or this sees it parked and wakes it. It
        // parks so only when it would poll.
        if let Some(budget) = self.config.busy_poll {
            let gap_ns = now_ns().saturating_sub(signal.answered_at_ns.load(Ordering::Relaxed));
            let short = gap_ns < budget.as_nanos() as u64 / 2;
            // Two short gaps in a row: a put (start, copy, end) alternates short and long gaps
            // and must not have the poller linger while it copies.
            let before = signal.last_gap_short.swap(short, Ordering::Relaxed);
            signal
                .quick_follow_up
                .store(short && before, Ordering::Relaxed);
            if signal.parked.load(Ordering::SeqCst) {
                signal.wake.notify_one();
            }
        }
    }
}

/// Whether the calling thread runs a multi-thread runtime's `block_on` (or no runtime's): then
/// blocking it in `poll(2)` holds up nothing but the future it polls. On a current-thread
/// runtime the same thread runs every task (the server's, in tests), so it must not block.
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// How waiting on the socket for an answer ended.
enum Waited {
    /// The answer (`None`: the connection ended without one).
    Answer(Option<Reply>),
    TimedOut,
    /// Other calls are in flight on the connection now: the reader task should serve them all.
    Overlapped,
}

/// The first wait in `poll(2)` of a caller reading its own answer; each further one doubles, up
/// to the last. Between waits it yields, so futures polled alongside the call on its thread
/// (which a blocked thread holds up) run at least that often.
const FIRST_WAIT: Duration = Duration::from_millis(1);
const LONGEST_WAIT: Duration = Duration::from_millis(16);

/// A caller that holds the [`PollingGuard`] waits for its answer on the socket itself (blocking
/// its thread in `poll(2)`, in bounded slices) and hands out whatever it reads, until its answer
/// comes, `deadline` passes, or other calls are in flight.
async fn wait_for_own_answer(
    connection: &Connection,
    rx: &mut oneshot::Receiver<Reply>,
    deadline: Instant,
) -> Waited {
    let stream: &TcpStream = connection.inbox.half.as_ref();
    let fd = stream.as_raw_fd();
    let mut slice = FIRST_WAIT;
    // Futures polled alongside this call run (and send their own calls) before it blocks.
    tokio::task::yield_now().await;
    loop {
        if let Some(answer) = try_answer(rx) {
            return Waited::Answer(answer);
        }
        let looked = connection.poll_inbox();
        if let Some(answer) = try_answer(rx) {
            return Waited::Answer(answer);
        }
        let now = Instant::now();
        if now >= deadline {
            return Waited::TimedOut;
        }
        if connection.pending.lock().len() > 1 {
            return Waited::Overlapped;
        }
        // The socket was empty when we looked (a reader holding the lock instead reads nothing
        // while we poll: look again at once).
        if looked {
            wait_readable(fd, slice.min(deadline - now));
            slice = (slice * 2).min(LONGEST_WAIT);
        }
        tokio::task::yield_now().await;
    }
}

/// Blocks until `fd` is readable (data, end of stream or error) or `timeout` passes.
fn wait_readable(fd: std::os::fd::RawFd, timeout: Duration) {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout
        .as_micros()
        .div_ceil(1000)
        .clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `pollfd` is one valid, initialized entry, and the descriptor is open while the
    // connection lives (the caller holds it). An error or EINTR only ends the wait early.
    unsafe { libc::poll(&mut pollfd, 1, ms) };
}

/// Writes everything in the outbox, including frames appended while writing, then clears the
/// `flushing` flag.
async fn flush(connection: &Connection) -> std::io::Result<()> {
    // If this future is dropped mid-write, the stream may hold half a frame and `flushing` stays
    // set: the guard then retires the connection so the next call starts on a fresh one.
    let guard = RetireOnDrop(connection);
    let mut writer = connection.writer.lock().await;
    loop {
        let chunk = {
            let mut outbox = connection.outbox.lock();
            if outbox.buf.is_empty() {
                outbox.flushing = false;
                break;
            }
            outbox.buf.split()
        };
        writer.write_all(&chunk).await?;
    }
    std::mem::forget(guard);
    Ok(())
}

struct RetireOnDrop<'a>(&'a Connection);

impl Drop for RetireOnDrop<'_> {
    fn drop(&mut self) {
        self.0
            .fail_all("a call was cancelled in the middle of writing its request");
    }
}

fn finish(reply: Option<Reply>) -> Result<Bytes, RpcError> {
    match reply {
        Some(Ok((FrameKind::Error, body))) => {
            let (code, message) = decode_error_body(&body);
            Err(RpcError::Remote { code, message })
        }
        Some(Ok((_, body))) => Ok(body),
        Some(Err(error)) => Err(error),
        None => Err(RpcError::Disconnected("connection closed".to_string())),
    }
}

/// Whether a call may poll for its own answer: no other call is in flight (`alone`) and none
/// overlapped another within `SEQUENTIAL_AFTER` before `now` (`last_overlap`, `NEVER` if none
/// ever did).
fn is_sequential(alone: bool, now: u64, last_overlap: u64) -> bool {
    alone
        && (last_overlap == NEVER
            || now.saturating_sub(last_overlap) > SEQUENTIAL_AFTER.as_nanos() as u64)
}

/// The answer in `rx` if it came (`Some(None)`: the connection ended without one).
fn try_answer(rx: &mut oneshot::Receiver<Reply>) -> Option<Option<Reply>> {
    match rx.try_recv() {
        Ok(reply) => Some(Some(reply)),
        Err(oneshot::error::TryRecvError::Empty) => None,
        Err(oneshot::error::TryRecvError::Closed) => Some(None),
    }
}

/// The connection's one polling caller, while it lives (also when the call is dropped): while
/// it does, the reader task reads nothing.
struct PollingGuard<'a>(&'a Connection);

impl<'a> PollingGuard<'a> {
    /// `None` when another caller polls already.
    fn try_new(connection: &'a Connection) -> Option<Self> {
        // Under the read state's lock: a reader in the middle of reading finishes first, and
        // looks at the flag before it reads again.
        let _state = connection.inbox.state.lock();
        connection
            .inbox
            .caller_polling
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| PollingGuard(connection))
    }
}

impl Drop for PollingGuard<'_> {
    fn drop(&mut self) {
        let connection = self.0;
        // Under `pending`'s lock, as a new call looks at the flag: either it sees the flag
        // clear (and wakes the reader itself) or this sees it waiting.
        let waiting = {
            let pending = connection.pending.lock();
            connection
                .inbox
                .caller_polling
                .store(false, Ordering::SeqCst);
            !pending.is_empty()
        };
        // A reader that waits for us (it marks that before looking at the flag, both SeqCst)
        // must read for the calls still waiting; with none, it sleeps on.
        if waiting && connection.reader.deferring.load(Ordering::SeqCst) {
            connection.reader.wake.notify_one();
        }
    }
}

impl Connection {
    /// A polling caller's turn at the socket: unless someone else holds the read state, reads
    /// what arrived (straight from the socket, so it does not wait for the runtime's I/O driver
    /// to notice) and hands out every whole answer. `false` when it could not look.
    fn poll_inbox(&self) -> bool {
        let Some(mut state) = self.inbox.state.try_lock() else {
            return false;
        };
        let half = &self.inbox.half;
        // Counted also when the read that brought an answer then found the end of the stream.
        let mut got = false;
        let pumped = pump(&mut state, self, &self.reader, |buf| {
            let read = recv_now(half, buf);
            got |= matches!(read, Ok(n) if n > 0);
            read
        });
        drop(state);
        if got {
            self.counters.caller_reads.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(why) = pumped {
            self.fail_all(&why);
        }
        true
    }
}

impl Inbox {
    /// The reader task's read: everything the socket holds, handed out, unless a caller polls
    /// (`None`: that caller reads). `wait`: take the lock even if someone holds it; else, when
    /// someone does, it reads for us (`Some(Ok(false))`).
    fn reader_pump(
        &self,
        connection: &Connection,
        signal: &ReaderSignal,
        wait: bool,
    ) -> Option<Result<bool, String>> {
        let mut state = if wait {
            self.state.lock()
        } else {
            match self.state.try_lock() {
                Some(state) => state,
                None => return Some(Ok(false)),
            }
        };
        if self.caller_polling.load(Ordering::SeqCst) {
            return None;
        }
        Some(pump(&mut state, connection, signal, |buf| {
            self.half.try_read_buf(buf)
        }))
    }
}

/// One non-blocking `recv` into `buf`'s spare capacity, bypassing the runtime's readiness
/// tracking (a later read by the reader task that finds nothing just clears it).
fn recv_now(half: &OwnedReadHalf, buf: &mut BytesMut) -> std::io::Result<usize> {
    let stream: &TcpStream = half.as_ref();
    let spare = buf.spare_capacity_mut();
    // SAFETY: the descriptor is open while `half` lives, and recv writes at most `spare.len()`
    // bytes into `spare`, which is valid for writes.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: recv initialized the first `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Reads everything the socket holds now with `read` (which answers `WouldBlock` once it is
/// empty) and hands out every whole answer to its call. `Ok(true)` when it read something;
/// `Err(why)` once the connection is over (every later call says the same).
fn pump(
    state: &mut InboxState,
    connection: &Connection,
    signal: &ReaderSignal,
    mut read: impl FnMut(&mut BytesMut) -> std::io::Result<usize>,
) -> Result<bool, String> {
    if let Some(why) = &state.closed {
        return Err(why.clone());
    }
    let mut got = false;
    let outcome = loop {
        if state.buf.capacity() - state.buf.len() < 4096 {
            state.buf.reserve(READ_CHUNK_BYTES);
        }
        match read(&mut state.buf) {
            Ok(0) => break Err("server closed the connection".to_string()),
            Ok(_) => {
                got = true;
                if let Err(why) = hand_out(state, connection, signal) {
                    break Err(why);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(got),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e.to_string()),
        }
    };
    if let Err(why) = &outcome {
        state.closed = Some(why.clone());
    }
    outcome
}

/// Hands every whole frame in the buffer to the call that waits for it.
fn hand_out(
    state: &mut InboxState,
    connection: &Connection,
    signal: &ReaderSignal,
) -> Result<(), String> {
    loop {
        match state.decoder.decode(&mut state.buf) {
            Ok(Some(frame)) => {
                let id = frame.header.request_id;
                if id == 0 && frame.header.kind == FrameKind::Error {
                    // A connection-level error (limit reached, bad frame): fail everyone.
                    let (code, message) = decode_error_body(&frame.body);
                    return Err(format!("server closed the connection: {code}: {message}"));
                }
                let waiter = connection.pending.lock().remove(&id);
                if let Some(tx) = waiter {
                    let _ = tx.send(Ok((frame.header.kind, frame.body.freeze())));
                    signal.answered_at_ns.store(now_ns(), Ordering::Relaxed);
                }
            }
            Ok(None) => return Ok(()),
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// How much to read per syscall when the buffer runs low.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Holds the connection weakly: when the last `RpcClient` and call let go of it, the write half
/// closes, the server hangs up, and this task ends. `busy_poll`: the budget and policy of
/// busy-poll mode.
async fn read_loop(
    inbox: Arc<Inbox>,
    signal: Arc<ReaderSignal>,
    connection: Weak<Connection>,
    busy_poll: Option<(Duration, PollPolicy)>,
) {
    loop {
        {
            let Some(live) = connection.upgrade() else {
                return;
            };
            match inbox.reader_pump(&live, &signal, true) {
                None => {
                    drop(live);
                    defer_to_polling_caller(&inbox, &signal).await;
                    continue;
                }
                Some(Err(why)) => {
                    live.fail_all(&why);
                    return;
                }
                Some(Ok(true)) => continue,
                Some(Ok(false)) => {}
            }
        }
        if let Some((budget, policy)) = busy_poll {
            // Asked afresh each time the reader would poll (a call's wake-up, an answer).
            if poll::decide(policy) == Verdict::Poll {
                let expired =
                    match poll_while_awaited(&inbox, &connection, &signal, budget, policy).await {
                        Polled::Read => continue,
                        Polled::Over => return,
                        Polled::Idle => false,
                        Polled::Expired => true,
                    };
                signal.parked.store(true, Ordering::SeqCst);
                if !expired && connection.upgrade().is_some_and(|c| c.awaited()) {
                    // A call registered between the poll loop and the flag: poll for it.
                    signal.parked.store(false, Ordering::SeqCst);
                    continue;
                }
                let woken = tokio::select! {
                    ready = inbox.half.readable() => Some(ready),
                    _ = signal.wake.notified() => None,
                };
                signal.parked.store(false, Ordering::SeqCst);
                if let Some(Err(error)) = woken {
                    if let Some(live) = connection.upgrade() {
                        live.fail_all(&error.to_string());
                    }
                    return;
                }
                continue;
            }
            // Not polling now: park until the socket has something, and do not let calls wake
            // us in vain (`parked` stays clear).
        }
        if let Err(error) = inbox.half.readable().await {
            if let Some(live) = connection.upgrade() {
                live.fail_all(&error.to_string());
            }
            return;
        }
    }
}

/// How soon a reader waiting for a polling caller looks again at a socket that holds data the
/// caller has not read yet, or whose end it saw (the caller reads both itself; this only bounds
/// the wait for data nobody waits for).
const DEFER_RECHECK: Duration = Duration::from_millis(5);

/// Waits while a caller polls the socket for its own answer (it reads everything meanwhile):
/// until the flag clears or a call needs the reader. The runtime's readiness, which the caller's
/// own reads leave set, is forgotten once the socket is seen empty (so the wait is for new
/// data; forgetting it with data unread would hide that data from the reader's own reads, which
/// the runtime skips while it believes the socket empty).
async fn defer_to_polling_caller(inbox: &Inbox, signal: &ReaderSignal) {
    let stream: &TcpStream = inbox.half.as_ref();
    // Marked before looking at the flag (both SeqCst), as a caller clears the flag before
    // looking at the mark: one of the two sees the other.
    signal.deferring.store(true, Ordering::SeqCst);
    while inbox.caller_polling.load(Ordering::SeqCst) {
        tokio::select! {
            ready = stream.ready(Interest::READABLE) => {
                let open = ready.is_ok_and(|r| !r.is_read_closed() && !r.is_error());
                // `WouldBlock` (empty: readiness cleared) or the first byte's count.
                let unread = open.then(|| stream.try_io(Interest::READABLE, || peek(stream)));
                if !matches!(unread, Some(Err(ref e)) if e.kind() == std::io::ErrorKind::WouldBlock) {
                    tokio::select! {
                        _ = tokio::time::sleep(DEFER_RECHECK) => {}
                        _ = signal.wake.notified() => {}
                    }
                }
            }
            _ = signal.wake.notified() => {}
        }
    }
    signal.deferring.store(false, Ordering::SeqCst);
}

/// Whether the socket holds data, without taking it: `Ok(1)` if so, `Ok(0)` at its end,
/// `WouldBlock` when empty.
fn peek(stream: &TcpStream) -> std::io::Result<usize> {
    let mut byte = 0u8;
    // SAFETY: the descriptor is open while `stream` lives, and recv writes at most one byte
    // into `byte`.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// What polling the socket ended with.
enum Polled {
    /// Something was read and handed out.
    Read,
    /// The connection is over (every call was told) or gone.
    Over,
    /// No call awaits an answer (or a caller polls for its own).
    Idle,
    /// A call still waits, but the budget ran out.
    Expired,
}

/// Busy-poll mode: polls the socket while some call awaits its answer, for at most `budget`,
/// and for half of it when none does; takes note of how the spin went (`policy`).
async fn poll_while_awaited(
    inbox: &Inbox,
    connection: &Weak<Connection>,
    signal: &ReaderSignal,
    budget: Duration,
    policy: PollPolicy,
) -> Polled {
    let mut clock = SpinClock::start();
    let outcome = loop {
        let Some(live) = connection.upgrade() else {
            return Polled::Over;
        };
        // A polling caller may hold the state: then it reads for us.
        match inbox.reader_pump(&live, signal, false) {
            Some(Ok(true)) => break Polled::Read,
            Some(Ok(false)) => {}
            Some(Err(why)) => {
                live.fail_all(&why);
                return Polled::Over;
            }
            // A caller polls for its own answer: one spinner is enough.
            None => return Polled::Idle,
        }
        let elapsed = clock.tick();
        // With nothing awaited, linger for half the budget, but only while the caller has been
        // sending its calls right after the answers before them (small sequential calls): then its
        // answer is picked up without the wake-up a parked reader needs. A caller that works
        // between calls (copying a large value) gets no lingering: the poller would only take
        // a core from it.
        let linger = signal.quick_follow_up.load(Ordering::Relaxed);
        if (!linger || elapsed >= budget / 2) && !live.awaited() {
            // Lingering that found nothing tells nothing about contention: not recorded.
            return Polled::Idle;
        }
        if elapsed >= budget {
            break Polled::Expired;
        }
        drop(live);
        // Lets the runtime run other tasks (the caller itself on a current-thread runtime).
        tokio::task::yield_now().await;
    };
    poll::report(policy, clock.finish(matches!(outcome, Polled::Read)));
    outcome
}

#[cfg(test)]
mod tests {
    use super::{is_sequential, NEVER, SEQUENTIAL_AFTER};

    /// A call polls for itself only when alone, and not within the window after an overlap.
    #[test]
    fn callers_poll_only_when_alone_and_not_right_after_an_overlap() {
        let window = SEQUENTIAL_AFTER.as_nanos() as u64;
        let now = 10 * window;
        assert!(is_sequential(true, now, NEVER));
        assert!(!is_sequential(false, now, NEVER));
        assert!(!is_sequential(true, now, now));
        assert!(!is_sequential(true, now, now - window));
        assert!(is_sequential(true, now, now - window - 1));
        assert!(!is_sequential(false, now, now - 2 * window));
        // A clock that reads earlier than the overlap (another thread stored it meanwhile).
        assert!(!is_sequential(true, now, now + 5));
    }
}
