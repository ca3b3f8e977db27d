//! A client connection that multiplexes concurrent calls over one TCP stream.
//!
//! A call encodes its frame, takes the write half's lock just long enough to write it, and waits
//! on a oneshot that the connection's reader task completes when the answer with its request id
//! arrives. In busy-poll mode a caller on its own thread (`block_on`) reads the socket itself
//! for a while instead, handing out whatever answers it reads. A call that times out removes
//! its entry, so a late answer is dropped. When the connection breaks, every waiting call fails
//! with `Disconnected` and the next call reconnects.

use bytes::{Bytes, BytesMut};
use mooncake_common::ErrorCode;
use mooncake_proto::{
    decode_error_body, encode_frame, FrameDecoder, FrameError, FrameHeader, FrameKind,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use thiserror::Error;
use tokio::io::AsyncWriteExt;
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
    /// long before parking in epoll, so the answer is picked up without waking a parked thread.
    /// A caller on its own thread (`block_on`: the Python binding, the blocking client) polls
    /// itself, so no thread needs a wake-up on its side (32-key batch lookups from Python after
    /// a copy: 90-110 µs to 53-67 µs, docs/decisions.md). For calls made by runtime tasks the
    /// connection's reader polls; a call sent while it is parked wakes it (that wake-up
    /// overlaps the round trip). Sequential 4 KiB gets went from 1.3× to about 0.7× a
    /// blocking-read ping-pong between two processes. Costs at most this much CPU per call;
    /// with no call in flight the reader parks (after lingering half of it when the caller has
    /// been sending calls back to back). Default 100 µs; `None` turns it off.
    pub busy_poll: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(10),
            max_frame_bytes: mooncake_proto::DEFAULT_MAX_FRAME_BYTES,
            busy_poll: Some(DEFAULT_BUSY_POLL),
        }
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
    /// Whether a caller polls the socket itself (the reader task need not spin for its call).
    caller_polling: AtomicBool,
    /// When a call last found another in flight (`now_ns`; `NEVER` before).
    overlap_at_ns: AtomicU64,
    /// The client's count of reads by polling callers.
    caller_reads: Arc<AtomicU64>,
}

/// The read half of a connection and the bytes read from it but not yet handed out. Whoever
/// holds `state` reads and hands out answers: the reader task, or a caller polling for its own
/// answer (see [`RpcClient::call`]). The read half lives as long as either holds this, so its
/// file descriptor stays valid for both.
#[derive(Debug)]
struct Inbox {
    half: OwnedReadHalf,
    state: Mutex<InboxState>,
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
}

impl Connection {
    /// Whether the reader should poll: a call waits for an answer and no caller polls (that
    /// caller hands out every answer it reads; two spinners would take the core the server
    /// needs).
    fn awaited(&self) -> bool {
        !self.caller_polling.load(Ordering::Relaxed) && !self.pending.lock().is_empty()
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
    caller_reads: Arc<AtomicU64>,
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
            caller_reads: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many times a caller waiting on its own thread read answers from the socket itself
    /// (busy-poll mode, calls made through `block_on`), rather than the connection's reader task.
    pub fn caller_reads(&self) -> u64 {
        self.caller_reads.load(Ordering::Relaxed)
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
        });
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(writer),
            outbox: Mutex::new(Outbox::default()),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            reader: Arc::new(ReaderSignal::default()),
            inbox: Arc::clone(&inbox),
            caller_polling: AtomicBool::new(false),
            overlap_at_ns: AtomicU64::new(NEVER),
            caller_reads: Arc::clone(&self.caller_reads),
        });
        tokio::spawn(read_loop(
            inbox,
            Arc::clone(&connection.reader),
            Arc::downgrade(&connection),
            self.config.busy_poll,
        ));
        *self.connection.lock() = Some(connection.clone());
        Ok(connection)
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
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let header = FrameHeader {
            kind: FrameKind::Request,
            method,
            request_id,
        };
        let (tx, mut rx) = oneshot::channel();
        let alone = {
            let mut pending = connection.pending.lock();
            pending.insert(request_id, tx);
            pending.len() == 1
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
        // connection have not overlapped others' lately polls the socket for its answer itself:
        // no thread has to be woken to read it, nor to hand it over. Concurrent calls (several
        // threads on one connection) wait as a task's call does: the reader task polls for all
        // of them and hands out their answers, one spinner instead of one per thread (polling
        // whenever no other call was in flight, without the 50 ms window, two Python threads
        // did 31-34k calls/s against 36-39k with it).
        let caller_polls = match self.config.busy_poll {
            Some(budget) if sequential && tokio::task::try_id().is_none() => {
                PollingGuard::try_new(&connection).map(|guard| (budget, guard))
            }
            _ => None,
        };
        // The reader marks itself parked before its last look at `pending` (both SeqCst): it
        // either sees this call and keeps polling, or this sees it parked and wakes it.
        let reader_polls = self.config.busy_poll.filter(|_| caller_polls.is_none());
        if let Some(budget) = reader_polls {
            let signal = &connection.reader;
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

        if let Some((budget, _polling)) = caller_polls {
            let answer = crate::spin_for(budget, || {
                if let Some(answer) = try_answer(&mut rx) {
                    return Some(answer);
                }
                connection.poll_inbox();
                try_answer(&mut rx)
            })
            .await;
            if let Some(answer) = answer {
                return finish(answer);
            }
        }
        // A task's call awaits: in busy-poll mode the connection's reader task spins on the
        // socket (spinning here would starve that reader on a current-thread runtime).
        match tokio::time::timeout(self.config.call_timeout, &mut rx).await {
            Ok(reply) => finish(reply.ok()),
            Err(_) => {
                connection.pending.lock().remove(&request_id);
                Err(RpcError::Timeout(self.config.call_timeout))
            }
        }
    }
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

/// The connection's one polling caller, while it lives (also when the call is dropped).
struct PollingGuard<'a>(&'a Connection);

impl<'a> PollingGuard<'a> {
    /// `None` when another caller polls already.
    fn try_new(connection: &'a Connection) -> Option<Self> {
        connection
            .caller_polling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| PollingGuard(connection))
    }
}

impl Drop for PollingGuard<'_> {
    fn drop(&mut self) {
        self.0.caller_polling.store(false, Ordering::Release);
    }
}

impl Connection {
    /// A polling caller's turn at the socket: unless someone else is reading, reads what
    /// arrived (straight from the socket, so it does not wait for the runtime's I/O driver to
    /// notice) and hands out every whole answer.
    fn poll_inbox(&self) {
        let Some(mut state) = self.inbox.state.try_lock() else {
            return;
        };
        let half = &self.inbox.half;
        match pump(&mut state, self, &self.reader, |buf| recv_now(half, buf)) {
            Ok(true) => {
                self.caller_reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(why) => {
                drop(state);
                self.fail_all(&why);
            }
        }
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
/// closes, the server hangs up, and this task ends.
async fn read_loop(
    inbox: Arc<Inbox>,
    signal: Arc<ReaderSignal>,
    connection: Weak<Connection>,
    busy_poll: Option<Duration>,
) {
    loop {
        {
            let Some(live) = connection.upgrade() else {
                return;
            };
            let pumped = {
                let mut state = inbox.state.lock();
                pump(&mut state, &live, &signal, |buf| {
                    inbox.half.try_read_buf(buf)
                })
            };
            match pumped {
                Err(why) => {
                    live.fail_all(&why);
                    return;
                }
                Ok(true) => continue,
                Ok(false) => {}
            }
        }
        if let Some(budget) = busy_poll {
            let expired = match poll_while_awaited(&inbox, &connection, &signal, budget).await {
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
        if let Err(error) = inbox.half.readable().await {
            if let Some(live) = connection.upgrade() {
                live.fail_all(&error.to_string());
            }
            return;
        }
    }
}

/// What polling the socket ended with.
enum Polled {
    /// Something was read and handed out.
    Read,
    /// The connection is over (every call was told) or gone.
    Over,
    /// No call awaits an answer.
    Idle,
    /// A call still waits, but the budget ran out.
    Expired,
}

/// Busy-poll mode: polls the socket while some call awaits its answer, for at most `budget`,
/// and for half of it when none does.
async fn poll_while_awaited(
    inbox: &Inbox,
    connection: &Weak<Connection>,
    signal: &ReaderSignal,
    budget: Duration,
) -> Polled {
    let started = std::time::Instant::now();
    loop {
        let Some(live) = connection.upgrade() else {
            return Polled::Over;
        };
        // A polling caller may hold the state: then it reads for us.
        if let Some(mut state) = inbox.state.try_lock() {
            match pump(&mut state, &live, signal, |buf| {
                inbox.half.try_read_buf(buf)
            }) {
                Ok(true) => return Polled::Read,
                Ok(false) => {}
                Err(why) => {
                    drop(state);
                    live.fail_all(&why);
                    return Polled::Over;
                }
            }
        }
        let elapsed = started.elapsed();
        // With nothing awaited, linger for half the budget, but only while the caller has been
        // sending its calls right after the answers before them (small sequential calls): then its
        // answer is picked up without the wake-up a parked reader needs. A caller that works
        // between calls (copying a large value) gets no lingering: the poller would only take
        // a core from it.
        let linger = signal.quick_follow_up.load(Ordering::Relaxed);
        if (!linger || elapsed >= budget / 2) && !live.awaited() {
            return Polled::Idle;
        }
        if elapsed >= budget {
            return Polled::Expired;
        }
        drop(live);
        // Lets the runtime run other tasks (the caller itself on a current-thread runtime).
        tokio::task::yield_now().await;
    }
}

/// Nanoseconds since the first call of this function in the process (a cheap shared clock for
/// atomics).
fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
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
