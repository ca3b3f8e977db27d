//! The accept loop and the per-connection loop.
//!
//! Each connection is one task: it decodes every whole frame it has, calls the handler inline
//! (master operations are microseconds and synchronous), appends the answers to one write buffer
//! and flushes it once, so a pipelined burst costs one `write` syscall. Shutdown is a watch
//! channel every task selects on.
//!
//! **Deferred answers.** A handler may hold an answer back until something outside it happened
//! ([`Handler::handle_deferred`] returns a [`Deferred`]: the master's reply waits until its
//! change is durable in the op-log). The connection keeps reading and serving the requests
//! behind it; their answers go out as soon as they are ready, so a held answer may be overtaken
//! (the client matches answers by request id). At most [`MAX_HELD_ANSWERS`] answers wait per
//! connection: past that the connection stops reading until one is sent. A connection that
//! ends drops the answers still held (the peer sees the connection close, as after a crash).

use bytes::BytesMut;
use mooncake_common::{AuthToken, ErrorCode};
use mooncake_proto::methods::{Authenticate, Method};
use mooncake_proto::{encode_error, encode_header, FrameDecoder, FrameHeader, FrameKind, Reply};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::admission::{Admission, Admit, Kick, Slot, NOT_HOLDING};
use crate::budget::{BudgetShare, FrameBuf, RequestBudget, SMALL_FRAME_BYTES};

/// A protocol-level failure of one request (unknown method, undecodable body): answered with an
/// error frame; the connection stays open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub code: ErrorCode,
    pub message: String,
}

impl HandlerError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        HandlerError {
            code,
            message: message.into(),
        }
    }
}

/// An answer held back until its future resolves (see the module doc): `Ok(())` sends the body
/// the handler wrote, `Err(body)` sends `body` in its place.
pub struct Deferred(Pin<Box<dyn Future<Output = Result<(), BytesMut>> + Send + Sync>>);

impl Deferred {
    pub fn new(ready: impl Future<Output = Result<(), BytesMut>> + Send + Sync + 'static) -> Self {
        Deferred(Box::pin(ready))
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

/// Serves requests. Called on the connection's task: it must not block for long.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request of `method` with `body`; appends the response body to `out`.
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError>;

    /// [`Handler::handle`], whose answer may be held back until a [`Deferred`] resolves. The
    /// server calls this one; by default it never defers.
    fn handle_deferred(
        &self,
        method: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Deferred>, HandlerError> {
        self.handle(method, body, out).map(|()| None)
    }
}

/// Most deferred answers one connection holds back before it stops reading requests (ready
/// answers are never held: they overtake deferred ones).
pub const MAX_HELD_ANSWERS: usize = 4096;

/// Default of [`ServerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of [`ServerConfig::max_connections_per_address`].
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// Default of [`ServerConfig::handshake_timeout`]: our clients send their first request right
/// after connecting.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServerConfig::frame_timeout`].
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of [`ServerConfig::min_request_bytes_per_sec`] (a 16 MiB frame gets 10 + 16 s).
pub const DEFAULT_MIN_REQUEST_BYTES_PER_SEC: u64 = 1 << 20;
/// Default of [`ServerConfig::max_buffered_request_bytes`].
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = 256 << 20;
/// Default of [`ServerConfig::shed_after`].
pub const DEFAULT_SHED_AFTER: Duration = Duration::from_secs(1);
/// Default of [`ServerConfig::evict_idle_after`]: well above the store client's 1 s ping period.
pub const DEFAULT_EVICT_IDLE_AFTER: Duration = Duration::from_secs(60);

/// TCP keepalive on accepted connections: a peer whose host vanished (no FIN, no RST) is
/// detected after about idle + count × interval = 90 s, even with no idle timeout.
const KEEPALIVE_IDLE_SECS: i32 = 60;
const KEEPALIVE_INTERVAL_SECS: i32 = 10;
const KEEPALIVE_PROBES: i32 = 3;
/// Accept queue length asked of the kernel (capped at `net.core.somaxconn`): a burst of
/// connections is queued rather than dropped (a dropped SYN is retried only a second later).
const LISTEN_BACKLOG: u32 = 4096;
/// A connection with nothing buffered frees its buffers after this long without a byte.
const RELEASE_BUFFERS_AFTER: Duration = Duration::from_secs(1);
/// Least spare room for one read.
const MIN_READ_SPARE: usize = 4096;
/// How long the last words to a closing connection (an error frame) may take.
const FAREWELL_TIMEOUT: Duration = Duration::from_millis(100);
/// What a request before `Authenticate` is answered (with `ILLEGAL_CLIENT`) on a server with a
/// token.
const AUTH_REQUIRED: &str = "authentication required: this master was started with \
     --auth_token_file; give the client the token (MC_AUTH_TOKEN or MC_AUTH_TOKEN_FILE)";

/// Server limits and modes. Every field has a default (the `DEFAULT_*` constants).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once. Default 1024.
    pub max_connections: usize,
    /// Connections served at once from one IP address. Default 256.
    pub max_connections_per_address: usize,
    /// Largest accepted frame, header included. Default 16 MiB.
    pub max_frame_bytes: usize,
    /// Largest request frame per method id (header included), checked from the header before
    /// the body is read; `None`: `max_frame_bytes` for every method. The master uses
    /// `mooncake_proto::max_request_frame_bytes`.
    pub max_request_frame_bytes: Option<fn(u16) -> usize>,
    /// Opt-in low-latency mode: after answering, spin on the socket for this long before parking.
    pub busy_poll: Option<Duration>,
    /// Close an identified connection (one that sent a valid request) that sent nothing for this
    /// long (`None`: never, the default, as upstream's `rpc_conn_timeout_seconds = 0`).
    pub idle_timeout: Option<Duration>,
    /// Close a connection that has not completed a valid request this long after its accept
    /// (`None`: never). Default 10 s.
    pub handshake_timeout: Option<Duration>,
    /// Time allowed to every frame (and every flush of answers) on top of its length at
    /// `min_request_bytes_per_sec`. Default 10 s.
    pub frame_timeout: Duration,
    /// Slowest transfer rate a frame may take once started. Default 1 MiB/s.
    pub min_request_bytes_per_sec: u64,
    /// Bytes of frames over 64 KiB that all connections together may hold (raised to
    /// `max_frame_bytes` if below). Default 256 MiB.
    pub max_buffered_request_bytes: usize,
    /// How long a large frame waits for budget before shedding the oldest frame that holds some.
    /// Default 1 s.
    pub shed_after: Duration,
    /// When the server is full and no connection is unidentified, an identified connection idle
    /// at least this long (and with no request in progress) makes room. Default 60 s.
    pub evict_idle_after: Duration,
    /// The shared token every connection must present with `Authenticate` (method 47) before
    /// any other request (`None`, the default: no authentication; `Authenticate` is accepted
    /// whatever it carries). A connection that has not authenticated stays unidentified: it
    /// goes first when room is needed and is closed by the handshake timeout.
    pub auth_token: Option<AuthToken>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_frame_bytes: mooncake_proto::DEFAULT_MAX_FRAME_BYTES,
            max_request_frame_bytes: None,
            busy_poll: None,
            idle_timeout: None,
            handshake_timeout: Some(DEFAULT_HANDSHAKE_TIMEOUT),
            frame_timeout: DEFAULT_FRAME_TIMEOUT,
            min_request_bytes_per_sec: DEFAULT_MIN_REQUEST_BYTES_PER_SEC,
            max_buffered_request_bytes: DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
            shed_after: DEFAULT_SHED_AFTER,
            evict_idle_after: DEFAULT_EVICT_IDLE_AFTER,
            auth_token: None,
        }
    }
}

impl ServerConfig {
    /// How long a frame (or a flush) of `len` bytes may take.
    fn allowance(&self, len: usize) -> Duration {
        let rate = self.min_request_bytes_per_sec.max(1) as f64;
        self.frame_timeout + Duration::from_secs_f64(len as f64 / rate)
    }

    fn request_limit(&self, method: u16) -> usize {
        match self.max_request_frame_bytes {
            Some(limit) => limit(method).min(self.max_frame_bytes),
            None => self.max_frame_bytes,
        }
    }
}

/// Counters of a running server.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_open: AtomicU64,
    /// Connections pushed out to make room for a new one.
    pub connections_evicted: AtomicU64,
    /// Connections closed for completing no valid request within the handshake timeout.
    pub handshake_timeouts: AtomicU64,
    /// Identified connections closed by the idle timeout.
    pub idle_timeouts: AtomicU64,
    /// Connections closed because a frame (or a flush of answers) took too long.
    pub frame_timeouts: AtomicU64,
    pub requests: AtomicU64,
    pub request_errors: AtomicU64,
    pub frame_errors: AtomicU64,
    /// Frames refused from their header: over their method's limit.
    pub oversized_requests: AtomicU64,
    /// Frames over 64 KiB, which take request-buffer budget.
    pub large_frames: AtomicU64,
    /// Large frames that had to wait for budget.
    pub budget_waits: AtomicU64,
    /// Partial frames dropped (with their connection) to give their budget to an older wait.
    pub frames_shed: AtomicU64,
    /// Connections closed for a wrong token, or for a request before authenticating.
    pub auth_failures: AtomicU64,
}

/// A running server. Dropping it without [`RpcServer::shutdown`] also stops it (the tasks see the
/// shutdown channel close).
#[derive(Debug)]
pub struct RpcServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
    stats: Arc<ServerStats>,
    shared: Arc<dyn SharedView>,
}

/// What the public handle reads of the shared state (hides the handler type).
trait SharedView: Send + Sync + std::fmt::Debug {
    fn buffered_request_bytes(&self) -> usize;
    fn open_connections(&self) -> usize;
}

struct Shared<H> {
    handler: Arc<H>,
    config: ServerConfig,
    stats: Arc<ServerStats>,
    admission: Admission,
    budget: RequestBudget,
    budget_bytes: usize,
}

impl<H> std::fmt::Debug for Shared<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> SharedView for Shared<H> {
    fn buffered_request_bytes(&self) -> usize {
        self.budget_bytes
            .saturating_sub(self.budget.available_bytes())
    }

    fn open_connections(&self) -> usize {
        self.admission.len()
    }
}

impl RpcServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving with `handler`.
    pub async fn bind<H: Handler>(
        addr: SocketAddr,
        handler: Arc<H>,
        config: ServerConfig,
    ) -> std::io::Result<RpcServer> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(LISTEN_BACKLOG)?;
        let local_addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let stats = Arc::new(ServerStats::default());
        let budget_bytes = config
            .max_buffered_request_bytes
            .max(config.max_frame_bytes);
        let shared = Arc::new(Shared {
            handler,
            admission: Admission::new(
                config.max_connections,
                config.max_connections_per_address,
                config.evict_idle_after,
            ),
            budget: RequestBudget::new(budget_bytes, config.max_frame_bytes),
            budget_bytes,
            config,
            stats: stats.clone(),
        });
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        Ok(RpcServer {
            local_addr,
            shutdown,
            accept_task,
            stats,
            shared,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Live counters.
    pub fn stats(&self) -> &Arc<ServerStats> {
        &self.stats
    }

    /// Bytes of large frames held right now (at most the budget).
    pub fn buffered_request_bytes(&self) -> usize {
        self.shared.buffered_request_bytes()
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections()
    }

    /// Stops accepting, closes every connection after the frame it is handling, and waits.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.accept_task.await;
    }
}

async fn accept_loop<H: Handler>(
    listener: TcpListener,
    shared: Arc<Shared<H>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        set_keepalive(&stream);
        let stats = &shared.stats;
        let slot = match shared.admission.admit(peer.ip()) {
            Admit::Yes { slot, evicted } => {
                if evicted {
                    stats.connections_evicted.fetch_add(1, Ordering::Relaxed);
                }
                slot
            }
            Admit::No(why) => {
                stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                connections.spawn(farewell(
                    stream,
                    0,
                    ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                    why.to_string(),
                ));
                continue;
            }
        };
        stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _leave = LeaveTable {
                admission: &shared.admission,
                stats: &shared.stats,
                id: slot.id,
            };
            let mut connection = Connection::new(stream, &shared, &slot);
            if let Err(error) = connection.serve(shutdown).await {
                tracing::debug!(%peer, %error, "connection closed with error");
            }
        });
    }
    connections.shutdown().await;
}

/// Takes a connection out of the table when its task ends (or is aborted at shutdown).
struct LeaveTable<'a> {
    admission: &'a Admission,
    stats: &'a ServerStats,
    id: u64,
}

impl Drop for LeaveTable<'_> {
    fn drop(&mut self) {
        self.admission.release(self.id);
        self.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keepalive probes after `KEEPALIVE_IDLE_SECS` of silence (best effort).
fn set_keepalive(stream: &TcpStream) {
    let fd = stream.as_raw_fd();
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_SECS),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            KEEPALIVE_INTERVAL_SECS,
        ),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES),
    ];
    for (level, name, value) in options {
        // SAFETY: `fd` is the open socket owned by `stream`; the option value is a live c_int
        // whose size is passed alongside.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            );
        }
    }
}

/// Tells a peer why it is being closed (bounded in time), then closes.
async fn farewell(mut stream: TcpStream, request_id: u64, code: ErrorCode, why: String) {
    let mut out = BytesMut::new();
    encode_error(&mut out, 0, request_id, code, &why);
    let _ = tokio::time::timeout(FAREWELL_TIMEOUT, stream.write_all(&out)).await;
}

/// Why a connection ends.
enum End {
    /// The peer closed, or the server shuts down: nothing to say.
    Quiet,
    /// Tell the peer with an error frame, then close.
    Say(u64, ErrorCode, String),
    /// Refuse one request (an error frame naming its method and id), then close.
    Refuse(FrameHeader, ErrorCode, String),
}

/// What the wait for more bytes ended with.
enum Wake {
    Readable(std::io::Result<()>),
    /// Held answers resolved: their frames.
    Answered(Vec<BytesMut>),
    Timer,
    Kicked(Kick),
    Shutdown,
}

/// What is in the read buffer after answering every whole frame in it.
enum Buffered {
    /// Nothing, or the start of a small frame: read more.
    NeedMore,
    /// The start of a large frame (header included).
    Large(FrameHeader, usize),
}

struct Connection<'a, H> {
    stream: TcpStream,
    shared: &'a Shared<H>,
    slot: &'a Slot,
    decoder: FrameDecoder,
    read_buf: BytesMut,
    write_buf: BytesMut,
    body: BytesMut,
    /// When the partial frame at the front of `read_buf` started to arrive.
    partial_since: Option<Instant>,
    last_read: Instant,
    accepted: Instant,
    /// Presented the server's token (always true when the server has none).
    authenticated: bool,
    /// Deferred answers not resolved yet.
    held: Vec<Held>,
}

/// A deferred answer in [`Connection::held`]: `body` goes out under `header` once `ready`
/// resolves.
struct Held {
    header: FrameHeader,
    body: BytesMut,
    ready: Deferred,
}

/// Polls every held answer with `cx` and takes out the resolved ones as whole frames.
fn take_resolved(held: &mut Vec<Held>, cx: &mut std::task::Context<'_>) -> Vec<BytesMut> {
    let mut frames = Vec::new();
    let mut i = 0;
    while i < held.len() {
        match held[i].ready.0.as_mut().poll(cx) {
            std::task::Poll::Pending => i += 1,
            std::task::Poll::Ready(outcome) => {
                let Held { header, body, .. } = held.remove(i);
                let body = outcome.err().unwrap_or(body);
                let mut frame = BytesMut::with_capacity(mooncake_proto::HEADER_BYTES + body.len());
                encode_header(&mut frame, header, body.len());
                frame.extend_from_slice(&body);
                frames.push(frame);
            }
        }
    }
    frames
}

/// Waits until at least one held answer resolved (forever when none is held).
async fn resolved(held: &mut Vec<Held>) -> Vec<BytesMut> {
    std::future::poll_fn(|cx| {
        let frames = take_resolved(held, cx);
        if frames.is_empty() {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(frames)
        }
    })
    .await
}

impl<'a, H: Handler> Connection<'a, H> {
    fn new(stream: TcpStream, shared: &'a Shared<H>, slot: &'a Slot) -> Self {
        let now = Instant::now();
        Connection {
            stream,
            shared,
            slot,
            decoder: FrameDecoder::new(shared.config.max_frame_bytes),
            // No buffer until the peer sends something: an idle connection costs no memory.
            read_buf: BytesMut::new(),
            write_buf: BytesMut::new(),
            body: BytesMut::new(),
            partial_since: None,
            last_read: now,
            accepted: shared.admission.instant(slot.accepted_ns),
            authenticated: shared.config.auth_token.is_none(),
            held: Vec::new(),
        }
    }

    fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    async fn serve(&mut self, shutdown: watch::Receiver<bool>) -> std::io::Result<()> {
        let end = self.run(shutdown).await?;
        let (method, request_id, code, why) = match end {
            End::Quiet => return Ok(()),
            End::Say(request_id, code, why) => (0, request_id, code, why),
            End::Refuse(header, code, why) => (header.method, header.request_id, code, why),
        };
        // Answers already queued go first.
        encode_error(&mut self.write_buf, method, request_id, code, &why);
        let _ =
            tokio::time::timeout(FAREWELL_TIMEOUT, self.stream.write_all(&self.write_buf)).await;
        Ok(())
    }

    async fn run(&mut self, mut shutdown: watch::Receiver<bool>) -> std::io::Result<End> {
        loop {
            let buffered = match self.answer_buffered() {
                Ok(buffered) => buffered,
                Err(end) => return Ok(end),
            };
            if let Err(end) = self.flush().await? {
                return Ok(end);
            }
            if let Buffered::Large(header, total) = buffered {
                if let Err(end) = self.serve_large(header, total, &mut shutdown).await? {
                    return Ok(end);
                }
                continue;
            }
            if let Err(end) = self.read_more(&mut shutdown).await? {
                return Ok(end);
            }
        }
    }

    /// Answers every whole frame in the read buffer; says what is left.
    fn answer_buffered(&mut self) -> Result<Buffered, End> {
        let mut answered = false;
        let mut left = Buffered::NeedMore;
        loop {
            let (header, total) = match self.decoder.peek_header(&self.read_buf) {
                Ok(Some(found)) => found,
                Ok(None) => break,
                Err(error) => {
                    // The stream is out of sync: say why, then close this connection only.
                    self.shared
                        .stats
                        .frame_errors
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(End::Say(0, error.code(), error.to_string()));
                }
            };
            if !self.authenticated && header.method != Authenticate::ID {
                // Refused from the header: an unauthenticated peer gets no byte buffered.
                self.shared
                    .stats
                    .auth_failures
                    .fetch_add(1, Ordering::Relaxed);
                return Err(End::Refuse(
                    header,
                    ErrorCode::ILLEGAL_CLIENT,
                    AUTH_REQUIRED.to_string(),
                ));
            }
            let mut limit = self.config().request_limit(header.method);
            if !self.authenticated {
                // A stranger's Authenticate never takes request-buffer budget.
                limit = limit.min(SMALL_FRAME_BYTES);
            }
            if total > limit {
                self.shared
                    .stats
                    .oversized_requests
                    .fetch_add(1, Ordering::Relaxed);
                return Err(End::Say(
                    header.request_id,
                    ErrorCode::BUFFER_OVERFLOW,
                    format!(
                        "request frame of {total} bytes exceeds the limit of {limit} bytes for method {}",
                        header.method
                    ),
                ));
            }
            if self.read_buf.len() < total {
                if total > SMALL_FRAME_BYTES {
                    left = Buffered::Large(header, total);
                }
                break;
            }
            let frame = self.read_buf.split_to(total);
            self.answer(header, &frame[mooncake_proto::HEADER_BYTES..])?;
            answered = true;
        }
        if self.read_buf.is_empty() {
            self.partial_since = None;
        } else if answered || self.partial_since.is_none() {
            // The rest arrived with the last read.
            self.partial_since = Some(self.last_read);
        }
        self.slot
            .partial
            .store(!self.read_buf.is_empty(), Ordering::Relaxed);
        Ok(left)
    }

    /// Moves the held answers that resolved to the write buffer.
    fn release_held(&mut self) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let frames = take_resolved(&mut self.held, &mut cx);
        self.write_resolved(frames);
    }

    fn write_resolved(&mut self, frames: Vec<BytesMut>) {
        for frame in frames {
            self.write_buf.extend_from_slice(&frame);
        }
    }

    /// Calls the handler for one request and queues its answer (or holds it, deferred); `Err`
    /// when the connection must close (a failed authentication).
    fn answer(&mut self, header: FrameHeader, body: &[u8]) -> Result<(), End> {
        let stats = &self.shared.stats;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        if header.kind != FrameKind::Request {
            stats.request_errors.fetch_add(1, Ordering::Relaxed);
            encode_error(
                &mut self.write_buf,
                header.method,
                header.request_id,
                ErrorCode::INVALID_PARAMS,
                "expected a request frame",
            );
            return Ok(());
        }
        if header.method == Authenticate::ID {
            return self.authenticate(header, body);
        }
        self.body.clear();
        match self
            .shared
            .handler
            .handle_deferred(header.method, body, &mut self.body)
        {
            Ok(deferred) => {
                if !self.slot.identified.load(Ordering::Relaxed) {
                    self.slot.identified.store(true, Ordering::Release);
                }
                let response = FrameHeader {
                    kind: FrameKind::Response,
                    ..header
                };
                match deferred {
                    Some(ready) => self.held.push(Held {
                        header: response,
                        body: self.body.split(),
                        ready,
                    }),
                    None => {
                        encode_header(&mut self.write_buf, response, self.body.len());
                        self.write_buf.extend_from_slice(&self.body);
                    }
                }
            }
            Err(error) => {
                stats.request_errors.fetch_add(1, Ordering::Relaxed);
                encode_error(
                    &mut self.write_buf,
                    header.method,
                    header.request_id,
                    error.code,
                    &error.message,
                );
            }
        }
        Ok(())
    }

    /// `Authenticate`: checks the token (any is accepted when the server has none) and answers
    /// `Ok(())`, which identifies the connection; a wrong or undecodable token ends it.
    fn authenticate(&mut self, header: FrameHeader, body: &[u8]) -> Result<(), End> {
        let stats = &self.shared.stats;
        let request: Authenticate = match mooncake_proto::decode(body) {
            Ok(request) => request,
            Err(error) => {
                stats.request_errors.fetch_add(1, Ordering::Relaxed);
                stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                return Err(End::Refuse(
                    header,
                    error.code(),
                    format!("Authenticate: {error}"),
                ));
            }
        };
        if let Some(token) = &self.config().auth_token {
            if !token.verify(&request.token.0) {
                stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                return Err(End::Refuse(
                    header,
                    ErrorCode::ILLEGAL_CLIENT,
                    "wrong token".to_string(),
                ));
            }
        }
        self.authenticated = true;
        self.slot.identified.store(true, Ordering::Release);
        let reply: Reply<Authenticate> = Ok(());
        self.body.clear();
        if let Err(error) = mooncake_proto::encode_into(&reply, &mut self.body) {
            return Err(End::Refuse(header, error.code(), error.to_string()));
        }
        let response = FrameHeader {
            kind: FrameKind::Response,
            ..header
        };
        encode_header(&mut self.write_buf, response, self.body.len());
        self.write_buf.extend_from_slice(&self.body);
        Ok(())
    }

    /// Writes the queued answers (and the held ones now ready), within the time their length
    /// allows.
    async fn flush(&mut self) -> std::io::Result<Result<(), End>> {
        self.release_held();
        if self.write_buf.is_empty() {
            return Ok(Ok(()));
        }
        let allowance = self.config().allowance(self.write_buf.len());
        match tokio::time::timeout(allowance, self.stream.write_all(&self.write_buf)).await {
            Ok(written) => written?,
            Err(_) => {
                // A peer that does not read its answers keeps nothing of ours for long.
                self.shared
                    .stats
                    .frame_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(Err(End::Quiet));
            }
        }
        self.write_buf.clear();
        // One large answer must not pin its buffer for the rest of the connection's life.
        if self.write_buf.capacity() > SMALL_FRAME_BYTES {
            self.write_buf = BytesMut::new();
        }
        if self.body.capacity() > SMALL_FRAME_BYTES {
            self.body = BytesMut::new();
        }
        Ok(Ok(()))
    }

    /// When the connection must have made progress, and what it is closed for otherwise.
    fn deadline(&self) -> Option<(Instant, Deadline)> {
        let config = self.config();
        if let Some(started) = self.partial_since {
            let total = match self.decoder.peek_header(&self.read_buf) {
                Ok(Some((_, total))) => total,
                _ => mooncake_proto::HEADER_BYTES,
            };
            return Some((started + config.allowance(total), Deadline::Frame));
        }
        if !self.slot.identified.load(Ordering::Acquire) {
            return config
                .handshake_timeout
                .map(|limit| (self.accepted + limit, Deadline::Handshake));
        }
        config
            .idle_timeout
            .map(|limit| (self.last_read + limit, Deadline::Idle))
    }

    fn expired(&self, what: Deadline) -> End {
        let stats = &self.shared.stats;
        match what {
            Deadline::Frame => {
                stats.frame_timeouts.fetch_add(1, Ordering::Relaxed);
                End::Say(
                    0,
                    ErrorCode::RPC_TIMEOUT,
                    "frame not completed in time".to_string(),
                )
            }
            Deadline::Handshake => {
                stats.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                End::Say(
                    0,
                    ErrorCode::RPC_TIMEOUT,
                    format!(
                        "no valid request within {:?} of connecting",
                        self.config().handshake_timeout.unwrap_or_default()
                    ),
                )
            }
            Deadline::Idle => {
                stats.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                End::Quiet
            }
        }
    }

    fn kicked(&self, kick: Kick) -> End {
        match kick {
            Kick::Shed => {
                self.shared
                    .stats
                    .frames_shed
                    .fetch_add(1, Ordering::Relaxed);
                End::Say(
                    0,
                    ErrorCode::BUFFER_OVERFLOW,
                    "request buffer budget exhausted: this connection's partial frame was the oldest"
                        .to_string(),
                )
            }
            Kick::Evicted | Kick::None => End::Say(
                0,
                ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                "closed to make room for a new connection (this one had sent no valid request, or was idle)"
                    .to_string(),
            ),
        }
    }

    /// Room for the next read: at least `MIN_READ_SPARE` bytes and the rest of the small frame
    /// being read, never more than one small frame plus one read in all.
    fn make_room(&mut self) {
        let missing = match self.decoder.peek_header(&self.read_buf) {
            Ok(Some((_, total))) => total.saturating_sub(self.read_buf.len()),
            _ => 0,
        };
        let want = missing.max(MIN_READ_SPARE);
        if self.read_buf.capacity() - self.read_buf.len() >= want || self.read_buf.try_reclaim(want)
        {
            return;
        }
        let mut fresh =
            BytesMut::with_capacity((self.read_buf.len() + want).max(SMALL_FRAME_BYTES));
        fresh.extend_from_slice(&self.read_buf);
        self.read_buf = fresh;
    }

    fn note_read(&mut self) {
        self.last_read = Instant::now();
        self.slot
            .last_read_ns
            .store(self.shared.admission.now_ns(), Ordering::Relaxed);
    }

    /// Waits for and reads more bytes into the read buffer.
    async fn read_more(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> std::io::Result<Result<(), End>> {
        let busy_poll = self.config().busy_poll.filter(|_| self.held.is_empty());
        if let Some(budget) = busy_poll {
            self.make_room();
            let stream = &self.stream;
            let read_buf = &mut self.read_buf;
            let got = crate::spin_for(budget, || match stream.try_read_buf(read_buf) {
                Ok(n) => Some(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => Some(Err(e)),
            })
            .await;
            match got {
                Some(Ok(0)) => return Ok(Err(End::Quiet)),
                Some(Ok(_)) => {
                    self.note_read();
                    return Ok(Ok(()));
                }
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        loop {
            let deadline = self.deadline();
            let release_at = (self.read_buf.is_empty()
                && self.read_buf.capacity() + self.write_buf.capacity() + self.body.capacity() > 0)
                .then(|| self.last_read + RELEASE_BUFFERS_AFTER);
            let wake_at = match (deadline, release_at) {
                (Some((d, _)), Some(r)) => Some(d.min(r)),
                (Some((d, _)), None) => Some(d),
                (None, r) => r,
            };
            let may_read = self.held.len() < MAX_HELD_ANSWERS;
            let wake = tokio::select! {
                ready = self.stream.readable(), if may_read => Wake::Readable(ready),
                frames = resolved(&mut self.held) => Wake::Answered(frames),
                _ = sleep_until(wake_at) => Wake::Timer,
                kick = self.slot.kicked() => Wake::Kicked(kick),
                _ = shutdown.changed() => Wake::Shutdown,
            };
            match wake {
                Wake::Readable(ready) => ready?,
                Wake::Answered(frames) => {
                    self.write_resolved(frames);
                    return Ok(Ok(()));
                }
                Wake::Timer => {
                    if let Some((at, what)) = deadline {
                        if Instant::now() >= at {
                            return Ok(Err(self.expired(what)));
                        }
                    }
                    if self.read_buf.is_empty() {
                        self.read_buf = BytesMut::new();
                        self.write_buf = BytesMut::new();
                        self.body = BytesMut::new();
                    }
                    continue;
                }
                Wake::Kicked(kick) => return Ok(Err(self.kicked(kick))),
                Wake::Shutdown => return Ok(Err(End::Quiet)),
            }
            self.make_room();
            match self.stream.try_read_buf(&mut self.read_buf) {
                Ok(0) => return Ok(Err(End::Quiet)),
                Ok(_) => {
                    self.note_read();
                    return Ok(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes budget for the large frame at the front of the read buffer, reads the rest of it
    /// into a buffer of its exact size, answers it and frees the buffer.
    async fn serve_large(
        &mut self,
        header: FrameHeader,
        total: usize,
        shutdown: &mut watch::Receiver<bool>,
    ) -> std::io::Result<Result<(), End>> {
        let shared = self.shared;
        let stats = &shared.stats;
        stats.large_frames.fetch_add(1, Ordering::Relaxed);
        let started = self.partial_since.unwrap_or(self.last_read);
        let started_ns = shared
            .admission
            .now_ns()
            .saturating_sub(started.elapsed().as_nanos() as u64);
        let deadline = started + self.config().allowance(total);
        let need = RequestBudget::units(total);
        let share = match shared.budget.try_take(need) {
            Some(share) => share,
            None => {
                stats.budget_waits.fetch_add(1, Ordering::Relaxed);
                match self
                    .wait_for_budget(need, started_ns, deadline, shutdown)
                    .await
                {
                    Ok(share) => share,
                    Err(end) => return Ok(Err(end)),
                }
            }
        };
        let Some(mut frame) = FrameBuf::new(total) else {
            return Ok(Err(End::Say(
                header.request_id,
                ErrorCode::BUFFER_OVERFLOW,
                format!("cannot allocate a {total}-byte request buffer"),
            )));
        };
        self.slot
            .holding_since_ns
            .store(started_ns, Ordering::Release);
        frame.extend(&self.read_buf);
        self.read_buf.clear();
        let outcome = loop {
            if frame.missing() == 0 {
                break Ok(Ok(()));
            }
            let wake = tokio::select! {
                ready = self.stream.readable() => Wake::Readable(ready),
                frames = resolved(&mut self.held) => Wake::Answered(frames),
                _ = tokio::time::sleep_until(deadline.into()) => Wake::Timer,
                kick = self.slot.kicked() => Wake::Kicked(kick),
                _ = shutdown.changed() => Wake::Shutdown,
            };
            match wake {
                Wake::Readable(Ok(())) => {}
                Wake::Readable(Err(error)) => break Err(error),
                Wake::Answered(frames) => self.write_resolved(frames),
                Wake::Timer => break Ok(Err(self.expired(Deadline::Frame))),
                Wake::Kicked(kick) => break Ok(Err(self.kicked(kick))),
                Wake::Shutdown => break Ok(Err(End::Quiet)),
            }
            match self.stream.try_read(frame.spare_mut()) {
                Ok(0) => break Ok(Err(End::Quiet)),
                Ok(n) => {
                    frame.advance(n);
                    self.note_read();
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => break Err(e),
            }
        };
        let outcome = match outcome {
            Ok(Ok(())) => Ok(self.answer(header, &frame.bytes()[mooncake_proto::HEADER_BYTES..])),
            other => other,
        };
        drop(frame);
        self.slot
            .holding_since_ns
            .store(NOT_HOLDING, Ordering::Release);
        // Shed by a waiting frame: the share goes to it (the buffer is already freed).
        match self.slot.handoff.lock().take() {
            Some(waiter) => {
                let _ = waiter.send(share);
            }
            None => drop(share),
        }
        self.partial_since = None;
        self.slot.partial.store(false, Ordering::Relaxed);
        outcome
    }
}

impl<H: Handler> Connection<'_, H> {
    /// Waits until the budget has `need` units for the frame that started at `started_ns`
    /// (FIFO), shedding a stalled frame of another address after each `shed_after` of waiting
    /// and taking over its share.
    async fn wait_for_budget(
        &self,
        need: usize,
        started_ns: u64,
        deadline: Instant,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<BudgetShare, End> {
        let shared = self.shared;
        let shed_after = self.config().shed_after;
        let stalled_ns = shed_after.as_nanos().min(u64::MAX as u128) as u64;
        let mut held: Option<BudgetShare> = None;
        let mut take = Box::pin(shared.budget.clone().take(need));
        let mut handoff: Option<tokio::sync::oneshot::Receiver<BudgetShare>> = None;
        let mut shed_at = Instant::now() + shed_after;
        loop {
            enum Event {
                Share(BudgetShare),
                Handoff(Option<BudgetShare>),
                Deadline,
                Shed,
                Kicked(Kick),
                Shutdown,
            }
            let event = tokio::select! {
                share = &mut take => Event::Share(share),
                got = async {
                    match handoff.as_mut() {
                        Some(rx) => rx.await.ok(),
                        None => std::future::pending().await,
                    }
                } => Event::Handoff(got),
                _ = tokio::time::sleep_until(deadline.into()) => Event::Deadline,
                _ = tokio::time::sleep_until(shed_at.into()) => Event::Shed,
                kick = self.slot.kicked() => Event::Kicked(kick),
                _ = shutdown.changed() => Event::Shutdown,
            };
            let got = match event {
                Event::Share(share) => share,
                Event::Handoff(got) => {
                    handoff = None;
                    match got {
                        Some(share) => share,
                        // The shed frame ended without handing over (it completed meanwhile).
                        None => continue,
                    }
                }
                Event::Deadline => return Err(self.expired(Deadline::Frame)),
                Event::Shed => {
                    if handoff.is_none() {
                        handoff = shared
                            .admission
                            .shed_stalled_holder(self.slot, started_ns, stalled_ns);
                    }
                    shed_at = Instant::now() + shed_after;
                    continue;
                }
                Event::Kicked(kick) => return Err(self.kicked(kick)),
                Event::Shutdown => return Err(End::Quiet),
            };
            let mut share = match held.take() {
                Some(mut share) => {
                    share.merge(got);
                    share
                }
                None => got,
            };
            let have = share.units();
            if have >= need {
                // Dropping the pending wait gives back whatever it had been granted.
                drop(take);
                share.trim_to(need);
                return Ok(share);
            }
            held = Some(share);
            // A handed-over share covered part of it: wait for the rest only.
            take = Box::pin(shared.budget.clone().take(need - have));
        }
    }
}

/// Which deadline a connection is under.
#[derive(Debug, Clone, Copy)]
enum Deadline {
    Frame,
    Handshake,
    Idle,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
