//! The serving side of the TCP transport: one accept thread, one thread per connection (bounded
//! by `max_server_connections`). A connection handles its requests in order; each request's
//! range is checked against the registry (and pinned) before a byte of memory is touched.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mooncake_common::ErrorCode;
use parking_lot::Mutex;

use crate::error::TransferError;
use crate::registry::Registry;
use crate::tcp::io::{discard, recv_exact, send_all, IoFail, POLL_INTERVAL};
use crate::wire::{Header, Kind, HEADER_BYTES};

/// Counters of the serving side (read by tests and the bench).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Requests whose range passed the registry check and whose bytes were moved.
    pub requests_served: AtomicUsize,
    /// Well-formed requests refused by the registry check (bounds, unknown segment).
    pub requests_rejected: AtomicUsize,
    /// Connections closed because of a malformed header.
    pub malformed_headers: AtomicUsize,
    /// Connections closed at accept because `max_server_connections` were open.
    pub connections_refused: AtomicUsize,
}

#[derive(Debug)]
struct Shared {
    registry: Arc<Registry>,
    stop: AtomicBool,
    active: AtomicUsize,
    max_connections: usize,
    io_timeout: Duration,
    stats: Arc<ServerStats>,
    /// Clones of live connections, so that shutdown can unblock their threads.
    streams: Mutex<Vec<(u64, TcpStream)>>,
}

/// A running TCP server.
#[derive(Debug)]
pub(crate) struct TcpServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub(crate) fn start(
        bind: SocketAddr,
        registry: Arc<Registry>,
        max_connections: usize,
        io_timeout: Duration,
        stats: Arc<ServerStats>,
    ) -> Result<TcpServer, TransferError> {
        let listener =
            TcpListener::bind(bind).map_err(|e| TransferError::Io(format!("bind {bind}: {e}")))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| TransferError::Io(e.to_string()))?;
        let shared = Arc::new(Shared {
            registry,
            stop: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            max_connections,
            io_timeout,
            stats,
            streams: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name("mc-tcp-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|e| TransferError::Io(e.to_string()))?;
        Ok(TcpServer {
            local_addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes every connection and waits (bounded) for their threads.
    pub(crate) fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a throwaway connection to ourselves.
        let mut wake = self.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(handle) = self.accept_thread.take() {
            let _ = handle.join();
        }
        for (_, stream) in self.shared.streams.lock().iter() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.shared.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
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

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_conn_id = 0u64;
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else {
            // EMFILE and friends: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if shared.active.load(Ordering::SeqCst) >= shared.max_connections {
            shared
                .stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        next_conn_id += 1;
        let conn_id = next_conn_id;
        if let Ok(clone) = stream.try_clone() {
            shared.streams.lock().push((conn_id, clone));
        }
        shared.active.fetch_add(1, Ordering::SeqCst);
        let conn_shared = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("mc-tcp-serve".into())
            .spawn(move || {
                serve_connection(&stream, &conn_shared);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                conn_shared.streams.lock().retain(|(id, _)| *id != conn_id);
                conn_shared.active.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            shared.active.fetch_sub(1, Ordering::SeqCst);
            shared.streams.lock().retain(|(id, _)| *id != conn_id);
        }
    }
}

/// Serves requests until the peer closes, sends a malformed header, stalls past the I/O
/// timeout mid-request, or the server stops.
fn serve_connection(stream: &TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL_INTERVAL));
    let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
    let fd = stream.as_raw_fd();
    let stop = &shared.stop;
    loop {
        let mut raw = [0u8; HEADER_BYTES];
        // Idle between requests is fine (long-lived pooled connection); once a header started,
        // the whole request must arrive within the I/O timeout.
        let mut started: Option<Instant> = None;
        let wait_header = |done: usize| {
            if stop.load(Ordering::Relaxed) {
                return Err(IoFail::Stopped);
            }
            if done > 0 {
                let begun = *started.get_or_insert_with(Instant::now);
                if begun.elapsed() > shared.io_timeout {
                    return Err(IoFail::Timeout);
                }
            }
            Ok(())
        };
        // SAFETY: `raw` is a local array of HEADER_BYTES bytes.
        if unsafe { recv_exact(fd, raw.as_mut_ptr(), HEADER_BYTES, wait_header) }.is_err() {
            return;
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
                return;
            }
        };
        let deadline = Instant::now() + shared.io_timeout;
        let wait = |_: usize| -> Result<(), IoFail> {
            if stop.load(Ordering::Relaxed) {
                Err(IoFail::Stopped)
            } else if Instant::now() > deadline {
                Err(IoFail::Timeout)
            } else {
                Ok(())
            }
        };
        let guard =
            shared
                .registry
                .acquire_segment(request.segment_id, request.offset, request.length);
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
            _ => return,
        };
        if served.is_err() {
            return;
        }
    }
}
