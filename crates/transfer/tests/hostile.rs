//! Hostile and idle peers against the TCP data server: a flood of connections that send nothing
//! must neither lock out requesters nor cost a thread each, idle connections are closed after
//! the idle timeout, and one address cannot take the whole server. Waits are bounded (20 s).
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::pattern;
use mooncake_transfer::{
    MemoryHandle, SegmentOptions, TransferConfig, TransferEngine, TransferRequest, TransportMode,
};

const PATIENCE: Duration = Duration::from_secs(20);

/// Threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Raises this process's open-file limit to its hard limit (floods open thousands of sockets).
fn raise_fd_limit(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read/write the struct passed by pointer, which is live.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    assert!(
        limit.rlim_cur >= needed,
        "this test needs {needed} open files; the hard limit is {}",
        limit.rlim_max
    );
}

fn data_port(engine: &TransferEngine) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], engine.endpoint().port()))
}

/// A server engine with a 64 KiB segment of a known pattern.
struct Server {
    engine: TransferEngine,
    _segment: MemoryHandle,
    segment: u64,
    data: Vec<u8>,
}

fn server_with_segment(config: TransferConfig) -> Server {
    let engine = TransferEngine::start(config).unwrap();
    let handle = engine
        .allocate_segment(64 << 10, SegmentOptions::default())
        .unwrap();
    let data = pattern(64 << 10, 5);
    handle.write_at(0, &data).unwrap();
    Server {
        segment: handle.id(),
        _segment: handle,
        engine,
        data,
    }
}

/// Reads 4 KiB of the server's segment over TCP from a fresh requester engine.
fn read_over_tcp(server: &TransferEngine, segment: u64, expected: &[u8]) {
    let requester = TransferEngine::start(TransferConfig {
        transport: TransportMode::Tcp,
        entry_timeout_ms: 10_000,
        ..TransferConfig::default()
    })
    .unwrap();
    let local = requester.allocate_local_buffer(4096).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 4096, server.endpoint(), segment, 0);
    let result = requester.submit(&[read]).wait();
    assert_eq!(result.len(), 1);
    if let Err(err) = &result[0] {
        panic!("read from the server failed: {err} (code {})", err.code());
    }
    let mut got = vec![0u8; 4096];
    local.read_at(0, &mut got).unwrap();
    assert!(got == expected[..4096], "read returned wrong bytes");
}

/// Waits until `stream` is closed by the server (EOF or reset); false after `PATIENCE`.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut byte = [0u8; 1];
    while Instant::now() < deadline {
        match stream.read(&mut byte) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The finding: 1,100 connections that send nothing used to hold 1,024 threads and every slot,
/// and new requesters failed (TRANSFER_FAIL) until the flood went away. Now each newcomer closes
/// a connection that never sent a valid request, and idle connections hold no thread.
#[test]
fn an_idle_flood_does_not_lock_out_requesters_nor_hold_a_thread_each() {
    raise_fd_limit(4096);
    let Server {
        engine: server,
        segment,
        data,
        _segment,
    } = server_with_segment(TransferConfig::default());
    let addr = data_port(&server);
    let threads_before = thread_count();
    let flood: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // The kernel hands connections to accept in order: the requester's comes after the flood.
    read_over_tcp(&server, segment, &data);
    let threads_after = thread_count();
    assert!(
        threads_after < threads_before + 64,
        "1,100 idle connections made {} threads",
        threads_after.saturating_sub(threads_before)
    );
    drop(flood);
}

/// With room for all of them, 1,500 idle connections are all kept, parked in the poller: the
/// server's thread count does not follow the connection count.
#[test]
fn idle_connections_are_kept_without_a_thread_each() {
    raise_fd_limit(4096);
    let Server {
        engine: server,
        segment,
        data,
        _segment,
    } = server_with_segment(TransferConfig {
        max_server_connections: 2048,
        max_server_connections_per_peer: 2048,
        ..TransferConfig::default()
    });
    let addr = data_port(&server);
    let threads_before = thread_count();
    let mut flood: Vec<TcpStream> = (0..1500)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    read_over_tcp(&server, segment, &data);
    let stats = server.server_stats();
    assert_eq!(stats.connections_evicted.load(Ordering::Relaxed), 0);
    assert_eq!(stats.connections_refused.load(Ordering::Relaxed), 0);
    assert!(stats.workers.load(Ordering::Relaxed) <= 4);
    assert!(thread_count() < threads_before + 64);
    // Still open: a request on one of them is served.
    let header = mooncake_transfer::wire::Header::request(
        mooncake_transfer::wire::Kind::ReadRequest,
        9,
        segment,
        0,
        8,
    )
    .encode();
    let probe = flood.last_mut().unwrap();
    std::io::Write::write_all(probe, &header).unwrap();
    let mut answer = [0u8; mooncake_transfer::wire::HEADER_BYTES + 8];
    probe.set_read_timeout(Some(PATIENCE)).unwrap();
    probe.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[mooncake_transfer::wire::HEADER_BYTES..], &data[..8]);
}

/// A connection with no request in progress is closed after the idle timeout, whether it never
/// sent anything or was a requester's pooled connection; the requester reconnects on its next
/// transfer.
#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let Server {
        engine: server,
        segment,
        data,
        _segment,
    } = server_with_segment(TransferConfig {
        server_idle_timeout_ms: 1_000,
        ..TransferConfig::default()
    });
    let started = Instant::now();
    let mut silent = TcpStream::connect(data_port(&server)).unwrap();
    assert!(closed_by_server(&mut silent), "idle connection still open");
    assert!(started.elapsed() >= Duration::from_millis(900));

    let requester = TransferEngine::start(TransferConfig {
        transport: TransportMode::Tcp,
        entry_timeout_ms: 10_000,
        ..TransferConfig::default()
    })
    .unwrap();
    let local = requester.allocate_local_buffer(4096).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 4096, server.endpoint(), segment, 0);
    assert_eq!(requester.submit(&[read]).wait(), vec![Ok(())]);
    let stats = server.server_stats();
    eventually("the pooled connection to be closed", || {
        stats.idle_timeouts.load(Ordering::Relaxed) >= 2
    });
    eventually("the requester to see it", || {
        requester.pooled_connections(server.endpoint()) == 0
    });
    let read = TransferRequest::read(local.as_ptr(), 4096, server.endpoint(), segment, 0);
    assert_eq!(requester.submit(&[read]).wait(), vec![Ok(())]);
    let mut got = vec![0u8; 4096];
    local.read_at(0, &mut got).unwrap();
    assert!(got == data[..4096]);
}

/// One address holds at most `max_server_connections_per_peer`: its newcomers close its own
/// idle strangers, never another address's connections.
#[test]
fn the_per_peer_cap_only_touches_that_address() {
    let Server {
        engine: server,
        segment,
        data,
        _segment,
    } = server_with_segment(TransferConfig {
        max_server_connections_per_peer: 8,
        ..TransferConfig::default()
    });
    let addr = data_port(&server);
    let neighbour_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let mut neighbour = connect_from(neighbour_ip, addr);
    let mut strangers: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    read_over_tcp(&server, segment, &data);
    let stats = server.server_stats();
    assert!(stats.connections_evicted.load(Ordering::Relaxed) >= 1);
    assert!(
        closed_by_server(&mut strangers[0]),
        "oldest stranger still open"
    );
    // 127.0.0.2's connection is untouched and still served.
    let header = mooncake_transfer::wire::Header::request(
        mooncake_transfer::wire::Kind::ReadRequest,
        3,
        segment,
        8,
        8,
    )
    .encode();
    std::io::Write::write_all(&mut neighbour, &header).unwrap();
    let mut answer = [0u8; mooncake_transfer::wire::HEADER_BYTES + 8];
    neighbour.set_read_timeout(Some(PATIENCE)).unwrap();
    neighbour.read_exact(&mut answer).unwrap();
    assert_eq!(
        &answer[mooncake_transfer::wire::HEADER_BYTES..],
        &data[8..16]
    );
}

/// A blocking TCP connection from `local` (any 127.0.0.x) to `server`.
fn connect_from(local: IpAddr, server: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let to_sockaddr = |addr: SocketAddr| -> libc::sockaddr_in {
        let SocketAddr::V4(v4) = addr else {
            panic!("IPv4 only");
        };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        }
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor we own; the address structs are live and
    // their size is passed alongside.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let me = to_sockaddr(SocketAddr::new(local, 0));
        assert_eq!(
            libc::bind(fd, (&me as *const libc::sockaddr_in).cast(), len),
            0
        );
        let them = to_sockaddr(server);
        assert_eq!(
            libc::connect(fd, (&them as *const libc::sockaddr_in).cast(), len),
            0
        );
        TcpStream::from_raw_fd(fd)
    }
}

/// Connections that send part of a request header and stall wait in the poller, not on a
/// worker thread each, and are closed once the header is older than the I/O timeout; a header
/// sent in pieces slower than a worker waits is still served.
#[test]
fn partial_headers_hold_no_thread_and_are_closed_at_the_io_timeout() {
    let Server {
        engine: server,
        segment,
        data,
        _segment,
    } = server_with_segment(TransferConfig {
        server_io_timeout_ms: 1_000,
        ..TransferConfig::default()
    });
    let addr = data_port(&server);
    let header = mooncake_transfer::wire::Header::request(
        mooncake_transfer::wire::Kind::ReadRequest,
        5,
        segment,
        16,
        8,
    )
    .encode();
    let threads_before = thread_count();
    let mut stalled: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).unwrap();
            std::io::Write::write_all(&mut stream, &header[..10]).unwrap();
            stream
        })
        .collect();
    // A header in two pieces 500 ms apart (a worker gives up waiting after 200 ms).
    let mut slow = TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut slow, &header[..20]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        thread_count() < threads_before + 16,
        "200 stalled headers made {} threads",
        thread_count().saturating_sub(threads_before)
    );
    std::io::Write::write_all(&mut slow, &header[20..]).unwrap();
    let mut answer = [0u8; mooncake_transfer::wire::HEADER_BYTES + 8];
    slow.set_read_timeout(Some(PATIENCE)).unwrap();
    slow.read_exact(&mut answer).unwrap();
    assert_eq!(
        &answer[mooncake_transfer::wire::HEADER_BYTES..],
        &data[16..24]
    );
    for stream in stalled.iter_mut().take(3) {
        assert!(closed_by_server(stream), "stalled header still open");
    }
    let stats = server.server_stats();
    eventually("every stalled header closed", || {
        stats.stalled_headers.load(Ordering::Relaxed) == 200
    });
}
