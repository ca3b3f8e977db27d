//! The accept loop and the per-connection loop.
//!
//! Each connection is one task: it decodes every whole frame it has, calls the handler inline
//! (master operations are microseconds and synchronous), appends the answers to one write buffer
//! and flushes it once, so a pipelined burst costs one `write` syscall. The connection limit is a
//! semaphore: a connection over the limit gets one error frame and is closed. Shutdown is a watch
//! channel every task selects on.

use bytes::BytesMut;
use mooncake_common::ErrorCode;
use mooncake_proto::{encode_error, encode_header, FrameDecoder, FrameHeader, FrameKind};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

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

/// Serves requests. Called on the connection's task: it must not block for long.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request of `method` with `body`; appends the response body to `out`.
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError>;
}

/// Server limits and modes.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once; more are answered with an error frame and closed.
    pub max_connections: usize,
    /// Largest accepted frame, header included.
    pub max_frame_bytes: usize,
    /// Opt-in low-latency mode: after answering, spin on the socket for this long before parking.
    pub busy_poll: Option<Duration>,
    /// Close a connection that sent nothing for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 1024,
            max_frame_bytes: mooncake_proto::DEFAULT_MAX_FRAME_BYTES,
            busy_poll: None,
            idle_timeout: None,
        }
    }
}

/// Counters of a running server.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_open: AtomicU64,
    pub requests: AtomicU64,
    pub request_errors: AtomicU64,
    pub frame_errors: AtomicU64,
}

/// A running server. Dropping it without [`RpcServer::shutdown`] also stops it (the tasks see the
/// shutdown channel close).
#[derive(Debug)]
pub struct RpcServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
    stats: Arc<ServerStats>,
}

impl RpcServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving with `handler`.
    pub async fn bind<H: Handler>(
        addr: SocketAddr,
        handler: Arc<H>,
        config: ServerConfig,
    ) -> std::io::Result<RpcServer> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let stats = Arc::new(ServerStats::default());
        let accept_task = tokio::spawn(accept_loop(
            listener,
            handler,
            config,
            shutdown_rx,
            stats.clone(),
        ));
        Ok(RpcServer {
            local_addr,
            shutdown,
            accept_task,
            stats,
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

    /// Stops accepting, closes every connection after the frame it is handling, and waits.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.accept_task.await;
    }
}

async fn accept_loop<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    config: ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    stats: Arc<ServerStats>,
) {
    let permits = Arc::new(Semaphore::new(config.max_connections));
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            connections.spawn(refuse(stream));
            continue;
        };
        stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        let handler = handler.clone();
        let config = config.clone();
        let shutdown = shutdown.clone();
        let stats = stats.clone();
        connections.spawn(async move {
            if let Err(error) = serve_connection(stream, &*handler, &config, shutdown, &stats).await
            {
                tracing::debug!(%peer, %error, "connection closed with error");
            }
            stats.connections_open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    connections.shutdown().await;
}

async fn refuse(mut stream: TcpStream) {
    let mut out = BytesMut::new();
    encode_error(
        &mut out,
        0,
        0,
        ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
        "connection limit reached",
    );
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.write_all(&out)).await;
}

/// How much to read per syscall when no frame is partially buffered.
const READ_CHUNK_BYTES: usize = 64 << 10;

async fn serve_connection<H: Handler>(
    mut stream: TcpStream,
    handler: &H,
    config: &ServerConfig,
    mut shutdown: watch::Receiver<bool>,
    stats: &ServerStats,
) -> std::io::Result<()> {
    let decoder = FrameDecoder::new(config.max_frame_bytes);
    let mut read_buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut write_buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut body = BytesMut::new();
    loop {
        // Answer every whole frame we hold.
        loop {
            match decoder.decode(&mut read_buf) {
                Ok(Some(frame)) => {
                    stats.requests.fetch_add(1, Ordering::Relaxed);
                    let header = frame.header;
                    if header.kind != FrameKind::Request {
                        stats.request_errors.fetch_add(1, Ordering::Relaxed);
                        encode_error(
                            &mut write_buf,
                            header.method,
                            header.request_id,
                            ErrorCode::INVALID_PARAMS,
                            "expected a request frame",
                        );
                        continue;
                    }
                    body.clear();
                    match handler.handle(header.method, &frame.body, &mut body) {
                        Ok(()) => {
                            let response = FrameHeader {
                                kind: FrameKind::Response,
                                ..header
                            };
                            encode_header(&mut write_buf, response, body.len());
                            write_buf.extend_from_slice(&body);
                        }
                        Err(error) => {
                            stats.request_errors.fetch_add(1, Ordering::Relaxed);
                            encode_error(
                                &mut write_buf,
                                header.method,
                                header.request_id,
                                error.code,
                                &error.message,
                            );
                        }
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    // The stream is out of sync: say why, then close this connection only.
                    stats.frame_errors.fetch_add(1, Ordering::Relaxed);
                    encode_error(&mut write_buf, 0, 0, error.code(), &error.to_string());
                    stream.write_all(&write_buf).await?;
                    return Ok(());
                }
            }
        }
        if !write_buf.is_empty() {
            stream.write_all(&write_buf).await?;
            write_buf.clear();
        }
        if read_buf.capacity() - read_buf.len() < 4096 {
            read_buf.reserve(READ_CHUNK_BYTES);
        }
        if let Some(budget) = config.busy_poll {
            let got = crate::spin_for(budget, || match stream.try_read_buf(&mut read_buf) {
                Ok(n) => Some(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => Some(Err(e)),
            })
            .await;
            match got {
                Some(Ok(0)) => return Ok(()),
                Some(Ok(_)) => continue,
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        let read = async {
            match config.idle_timeout {
                Some(limit) => tokio::time::timeout(limit, stream.read_buf(&mut read_buf))
                    .await
                    .unwrap_or(Ok(0)),
                None => stream.read_buf(&mut read_buf).await,
            }
        };
        tokio::select! {
            read = read => {
                if read? == 0 {
                    return Ok(());
                }
            }
            _ = shutdown.changed() => return Ok(()),
        }
    }
}
