//! A client connection that multiplexes concurrent calls over one TCP stream.
//!
//! A call encodes its frame, takes the write half's lock just long enough to write it, and waits
//! on a oneshot that the connection's reader task completes when the answer with its request id
//! arrives. A call that times out removes its entry, so a late answer is dropped. When the
//! connection breaks, every waiting call fails with `Disconnected` and the next call reconnects.

use bytes::{Bytes, BytesMut};
use mooncake_common::ErrorCode;
use mooncake_proto::{
    decode_error_body, encode_frame, FrameDecoder, FrameError, FrameHeader, FrameKind,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    /// Low-latency mode: while a call waits for its answer, the connection's reader polls the
    /// socket for up to this long before parking in epoll, so the answer is picked up without
    /// waking a parked thread. A call sent while the reader is parked wakes it (that wake-up
    /// overlaps the round trip). Sequential 4 KiB gets went from 1.3× to about 0.7× a
    /// blocking-read ping-pong between two processes (docs/decisions.md). Costs at most this
    /// much CPU per call; with no call in flight the reader parks (after lingering half of it
    /// when the caller has been sending calls back to back). Default 100 µs; `None` turns it off.
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
    fn awaited(&self) -> bool {
        !self.pending.lock().is_empty()
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
        }
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
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(writer),
            outbox: Mutex::new(Outbox::default()),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            reader: Arc::new(ReaderSignal::default()),
        });
        tokio::spawn(read_loop(
            reader,
            Arc::clone(&connection.reader),
            Arc::downgrade(&connection),
            FrameDecoder::new(self.config.max_frame_bytes),
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
        connection.pending.lock().insert(request_id, tx);
        // `fail_all` clears `alive` before draining `pending`: checking after inserting means a
        // call racing with a failure is either drained (and told) or sees the failure here.
        if !connection.alive.load(Ordering::Acquire) {
            connection.pending.lock().remove(&request_id);
            return Err(RpcError::Disconnected("connection failed".to_string()));
        }
        // The reader marks itself parked before its last look at `pending` (both SeqCst): it
        // either sees this call and keeps polling, or this sees it parked and wakes it.
        if let Some(budget) = self.config.busy_poll {
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

        // In busy-poll mode the connection's reader task spins on the socket; the caller just
        // awaits (spinning here would starve that reader on a current-thread runtime).
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

/// Holds the connection weakly: when the last `RpcClient` and call let go of it, the write half
/// closes, the server hangs up, and this task ends.
async fn read_loop(
    mut reader: OwnedReadHalf,
    signal: Arc<ReaderSignal>,
    connection: Weak<Connection>,
    decoder: FrameDecoder,
    busy_poll: Option<Duration>,
) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    let why = loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    let Some(connection) = connection.upgrade() else {
                        return;
                    };
                    let id = frame.header.request_id;
                    if id == 0 && frame.header.kind == FrameKind::Error {
                        // A connection-level error (limit reached, bad frame): fail everyone.
                        let (code, message) = decode_error_body(&frame.body);
                        connection
                            .fail_all(&format!("server closed the connection: {code}: {message}"));
                        return;
                    }
                    let waiter = connection.pending.lock().remove(&id);
                    if let Some(tx) = waiter {
                        let _ = tx.send(Ok((frame.header.kind, frame.body.freeze())));
                        if busy_poll.is_some() {
                            signal.answered_at_ns.store(now_ns(), Ordering::Relaxed);
                        }
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if let Some(connection) = connection.upgrade() {
                        connection.fail_all(&error.to_string());
                    }
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 << 10);
        }
        if let Some(budget) = busy_poll {
            let expired =
                match poll_while_awaited(&reader, &mut buf, &connection, &signal, budget).await {
                    Polled::Read(Ok(0)) => break "server closed the connection".to_string(),
                    Polled::Read(Ok(_)) => continue,
                    Polled::Read(Err(error)) => break error.to_string(),
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
                read = reader.read_buf(&mut buf) => Some(read),
                _ = signal.wake.notified() => None,
            };
            signal.parked.store(false, Ordering::SeqCst);
            match woken {
                None => continue, // a call was sent: poll for its answer
                Some(Ok(0)) => break "server closed the connection".to_string(),
                Some(Ok(_)) => continue,
                Some(Err(error)) => break error.to_string(),
            }
        }
        match reader.read_buf(&mut buf).await {
            Ok(0) => break "server closed the connection".to_string(),
            Ok(_) => {}
            Err(error) => break error.to_string(),
        }
    };
    if let Some(connection) = connection.upgrade() {
        connection.fail_all(&why);
    }
}

/// What polling the socket ended with.
enum Polled {
    /// A read returned (bytes, end of stream or an error).
    Read(std::io::Result<usize>),
    /// No call awaits an answer.
    Idle,
    /// A call still waits, but the budget ran out.
    Expired,
}

/// Busy-poll mode: polls the socket while some call awaits its answer, for at most `budget`,
/// and for half of it when none does.
async fn poll_while_awaited(
    reader: &OwnedReadHalf,
    buf: &mut BytesMut,
    connection: &Weak<Connection>,
    signal: &ReaderSignal,
    budget: Duration,
) -> Polled {
    let started = std::time::Instant::now();
    loop {
        match reader.try_read_buf(buf) {
            Ok(n) => return Polled::Read(Ok(n)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Polled::Read(Err(e)),
        }
        let elapsed = started.elapsed();
        // With nothing awaited, linger for half the budget, but only while the caller has been
        // sending its calls right after the answers before them (small sequential calls): then its
        // answer is picked up without the wake-up a parked reader needs. A caller that works
        // between calls (copying a large value) gets no lingering: the poller would only take
        // a core from it.
        let linger = signal.quick_follow_up.load(Ordering::Relaxed);
        if (!linger || elapsed >= budget / 2) && !connection.upgrade().is_some_and(|c| c.awaited())
        {
            return Polled::Idle;
        }
        if elapsed >= budget {
            return Polled::Expired;
        }
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
