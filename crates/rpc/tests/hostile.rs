//! Hostile and faulty peers against the RPC server on real loopback sockets: idle floods past the
//! connection limit, connections that never send a valid request, half-sent large frames,
//! frames over their method's limit, and peers that never read their answers. Every wait is
//! bounded (20 s) and the limits are set small so that the effects show in a second or two.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, BytesMut};
use mooncake_common::ErrorCode;
use mooncake_proto::{decode_error_body, encode_header, FrameDecoder, FrameHeader, FrameKind};
use mooncake_rpc::{
    ClientConfig, Handler, HandlerError, RpcClient, RpcError, RpcServer, ServerConfig,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const ECHO: u16 = 1;
const REVERSE: u16 = 2;
const MIB: usize = 1 << 20;
/// Longest any test waits for an effect.
const PATIENCE: Duration = Duration::from_secs(20);

struct TestHandler;

impl Handler for TestHandler {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        match method {
            ECHO => out.put_slice(body),
            REVERSE => out.extend(body.iter().rev()),
            other => {
                return Err(HandlerError::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("unknown method {other}"),
                ))
            }
        }
        Ok(())
    }
}

async fn start(config: ServerConfig) -> RpcServer {
    RpcServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(TestHandler),
        config,
    )
    .await
    .unwrap()
}

fn client(addr: SocketAddr) -> RpcClient {
    RpcClient::new(
        addr,
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        },
    )
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

/// Connects from a chosen loopback address (127.0.0.x).
async fn connect_from(local: IpAddr, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(local, 0)).unwrap();
    socket.connect(server).await.unwrap()
}

fn request(method: u16, request_id: u64, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    let header = FrameHeader {
        kind: FrameKind::Request,
        method,
        request_id,
    };
    encode_header(&mut out, header, body.len());
    out.put_slice(body);
    out
}

/// Reads frames until the peer closes (or `PATIENCE` runs out); returns them and whether the
/// stream ended.
async fn read_until_closed(stream: &mut TcpStream) -> (Vec<(FrameHeader, Vec<u8>)>, bool) {
    let decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        while let Ok(Some(frame)) = decoder.decode(&mut buf) {
            frames.push((frame.header, frame.body.to_vec()));
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (frames, true),
            Ok(Ok(_)) => {}
            Err(_) => return (frames, false),
        }
    }
}

async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The finding: 1,100 connections that send nothing used to fill the 1,024-connection limit for
/// ever, and every new client failed with RPC_FAIL. Now each newcomer pushes out the oldest
/// connection that never sent a valid request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_flood_past_the_connection_limit_does_not_lock_out_a_new_client() {
    raise_fd_limit(4096);
    let server = start(ServerConfig::default()).await;
    let addr = server.local_addr();
    let regular = client(addr);
    assert_eq!(&regular.call(ECHO, b"before").await.unwrap()[..], b"before");
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept the whole flood before the newcomer arrives.
    eventually("flood accepted", || {
        let stats = server.stats();
        stats.connections_accepted.load(Ordering::Relaxed)
            + stats.connections_refused.load(Ordering::Relaxed)
            >= 1101
    })
    .await;
    let newcomer = client(addr);
    let answer = newcomer.call(ECHO, b"let me in").await;
    assert_eq!(&answer.unwrap()[..], b"let me in");
    // The client that was there first kept its connection.
    assert_eq!(&regular.call(ECHO, b"after").await.unwrap()[..], b"after");
    assert!(server.open_connections() <= 1024);
    assert!(server.stats().connections_evicted.load(Ordering::Relaxed) >= 77);
    drop(idle);
    server.shutdown().await;
}

/// A connection that sends nothing, or only requests the handler refuses, is told why and closed
/// after the handshake timeout.
#[tokio::test]
async fn a_connection_without_a_valid_request_is_closed_after_the_handshake_timeout() {
    let server = start(ServerConfig {
        handshake_timeout: Some(Duration::from_secs(1)),
        ..ServerConfig::default()
    })
    .await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut refused = TcpStream::connect(server.local_addr()).await.unwrap();
    refused.write_all(&request(999, 7, b"?")).await.unwrap();
    for (what, stream) in [("silent", &mut silent), ("refused", &mut refused)] {
        let (frames, closed) = read_until_closed(stream).await;
        assert!(closed, "{what}: still open after {PATIENCE:?}");
        let last = frames.last().unwrap();
        assert_eq!(last.0.kind, FrameKind::Error, "{what}");
        assert_eq!(
            decode_error_body(&last.1).0,
            ErrorCode::RPC_TIMEOUT,
            "{what}"
        );
    }
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(server.stats().handshake_timeouts.load(Ordering::Relaxed), 2);
    server.shutdown().await;
}

/// A client that made one valid call may then stay quiet for longer than the handshake timeout:
/// its connection is kept (no reconnect), as a blocking client quiet between calls needs.
#[tokio::test]
async fn an_identified_connection_outlives_the_handshake_timeout() {
    let server = start(ServerConfig {
        handshake_timeout: Some(Duration::from_secs(1)),
        ..ServerConfig::default()
    })
    .await;
    let regular = client(server.local_addr());
    assert_eq!(&regular.call(ECHO, b"1").await.unwrap()[..], b"1");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(&regular.call(ECHO, b"2").await.unwrap()[..], b"2");
    let stats = server.stats();
    assert_eq!(stats.connections_accepted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.handshake_timeouts.load(Ordering::Relaxed), 0);
    server.shutdown().await;
}

/// The idle timeout (`--rpc_conn_timeout_seconds`) closes identified connections that went
/// quiet; the client reconnects on its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_closes_quiet_connections_and_the_client_reconnects() {
    let server = start(ServerConfig {
        idle_timeout: Some(Duration::from_secs(1)),
        ..ServerConfig::default()
    })
    .await;
    let regular = client(server.local_addr());
    assert_eq!(&regular.call(ECHO, b"1").await.unwrap()[..], b"1");
    eventually("idle connection closed", || {
        server.stats().idle_timeouts.load(Ordering::Relaxed) == 1
    })
    .await;
    // The reader task saw the close; the next call connects again.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(&regular.call(ECHO, b"2").await.unwrap()[..], b"2");
    assert_eq!(
        server.stats().connections_accepted.load(Ordering::Relaxed),
        2
    );
    server.shutdown().await;
}

/// One address may hold at most `max_connections_per_address`: a newcomer from that address
/// pushes out that address's strangers, never another address's connections, and is refused
/// when all of its address's connections are identified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_address_cap_only_touches_that_address() {
    let server = start(ServerConfig {
        max_connections_per_address: 4,
        ..ServerConfig::default()
    })
    .await;
    let addr = server.local_addr();
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    let mut neighbour = connect_from(other, addr).await;
    let mut strangers = Vec::new();
    for _ in 0..4 {
        strangers.push(TcpStream::connect(addr).await.unwrap());
    }
    eventually("strangers accepted", || server.open_connections() == 5).await;
    let mut regulars = Vec::new();
    for i in 0..4u8 {
        let regular = client(addr);
        assert_eq!(&regular.call(ECHO, &[i]).await.unwrap()[..], &[i]);
        regulars.push(regular);
    }
    assert_eq!(
        server.stats().connections_evicted.load(Ordering::Relaxed),
        4
    );
    // All four of 127.0.0.1's connections are identified now: a fifth is refused...
    let fifth = client(addr);
    assert_eq!(
        fifth.call(ECHO, b"x").await.unwrap_err().code(),
        ErrorCode::RPC_FAIL
    );
    // ...while 127.0.0.2's stranger was never touched and can still talk.
    neighbour.write_all(&request(ECHO, 1, b"hi")).await.unwrap();
    let mut buf = BytesMut::new();
    let decoder = FrameDecoder::default();
    let frame = loop {
        if let Some(frame) = decoder.decode(&mut buf).unwrap() {
            break frame;
        }
        let n = tokio::time::timeout(PATIENCE, neighbour.read_buf(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "127.0.0.2's connection was closed");
    };
    assert_eq!(frame.header.kind, FrameKind::Response);
    assert_eq!(&frame.body[..], b"hi");
    for regular in &regulars {
        assert_eq!(&regular.call(ECHO, b"ok").await.unwrap()[..], b"ok");
    }
    server.shutdown().await;
}

/// Opens `count` connections from `from` that each send the header and `sent` bytes of a
/// `total`-byte ECHO frame, then stall. Returns the writer tasks (abort them to close the
/// connections).
async fn half_sent_frames(
    from: IpAddr,
    addr: SocketAddr,
    count: usize,
    total: usize,
    sent: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut frame = request(ECHO, 1, &vec![0x5a; total - mooncake_proto::HEADER_BYTES]);
    frame.truncate(sent);
    let frame = frame.freeze();
    let mut tasks = Vec::new();
    for _ in 0..count {
        let mut stream = connect_from(from, addr).await;
        let frame = frame.clone();
        tasks.push(tokio::spawn(async move {
            // Blocks once the server stops reading (backpressure); then holds the connection.
            let _ = stream.write_all(&frame).await;
            std::future::pending::<()>().await;
        }));
    }
    tasks
}

/// The finding: connections each sending most of a large frame and never finishing it made the
/// server buffer all of them. Now large frames take their bytes from one shared budget: the
/// server holds at most that and stops reading from the rest; a large frame from another address
/// sheds one stalled frame and takes over its share (stalled frames of one address never shed
/// each other, so the flood cannot churn); every stalled frame is dropped at its deadline and
/// the bytes are freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_large_frames_stay_within_the_budget_and_are_dropped_at_their_deadline() {
    let budget = 6 * MIB;
    let server = start(ServerConfig {
        max_frame_bytes: 2 * MIB,
        max_buffered_request_bytes: budget,
        frame_timeout: Duration::from_secs(3),
        min_request_bytes_per_sec: 64 * MIB as u64,
        shed_after: Duration::from_millis(200),
        ..ServerConfig::default()
    })
    .await;
    let addr = server.local_addr();
    let attacker: IpAddr = "127.0.0.2".parse().unwrap();
    let stalled = half_sent_frames(attacker, addr, 12, 2 * MIB, 3 * MIB / 2).await;
    let mut peak = 0;
    eventually("the budget to fill", || {
        peak = peak.max(server.buffered_request_bytes());
        peak >= budget - 2 * MIB
    })
    .await;
    // Small calls never need budget.
    let regular = client(addr);
    assert_eq!(&regular.call(ECHO, b"small").await.unwrap()[..], b"small");
    // A large call from 127.0.0.1 waits for budget, sheds one stalled frame and completes.
    let large: Vec<u8> = (0..(3 * MIB / 2)).map(|i| (i % 251) as u8).collect();
    let answer = regular.call(REVERSE, &large).await.unwrap();
    assert!(answer.iter().rev().eq(large.iter()));
    let stats = server.stats();
    assert!(stats.budget_waits.load(Ordering::Relaxed) >= 10);
    assert_eq!(stats.frames_shed.load(Ordering::Relaxed), 1);
    // Every stalled frame is dropped at its deadline (3 s + 2 MiB at 64 MiB/s), and the bytes
    // are given back.
    eventually("stalled frames dropped", || {
        peak = peak.max(server.buffered_request_bytes());
        server.open_connections() == 1 && server.buffered_request_bytes() == 0
    })
    .await;
    assert!(peak <= budget, "held {peak} bytes, budget {budget}");
    assert!(stats.frame_timeouts.load(Ordering::Relaxed) > 0);
    assert_eq!(&regular.call(ECHO, b"still").await.unwrap()[..], b"still");
    for task in stalled {
        task.abort();
    }
    server.shutdown().await;
}

fn small_echo_large_reverse(method: u16) -> usize {
    if method == REVERSE {
        MIB
    } else {
        64 << 10
    }
}

/// A frame whose header announces more than its method may send is refused from the header, with
/// BUFFER_OVERFLOW and the request id, before any of its body is buffered.
#[tokio::test]
async fn a_frame_over_its_methods_limit_is_refused_from_its_header() {
    let server = start(ServerConfig {
        max_request_frame_bytes: Some(small_echo_large_reverse),
        ..ServerConfig::default()
    })
    .await;
    let regular = client(server.local_addr());
    let body = vec![1u8; 100 << 10];
    assert_eq!(
        regular.call(REVERSE, &body).await.unwrap().len(),
        body.len()
    );
    match regular.call(ECHO, &body).await.unwrap_err() {
        RpcError::Remote { code, .. } => assert_eq!(code, ErrorCode::BUFFER_OVERFLOW),
        other => panic!("expected BUFFER_OVERFLOW, got {other:?}"),
    }
    // Raw: a header announcing 10 MiB for ECHO and nothing else is answered at once.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut header = BytesMut::new();
    let announced = FrameHeader {
        kind: FrameKind::Request,
        method: ECHO,
        request_id: 77,
    };
    encode_header(&mut header, announced, 10 * MIB);
    raw.write_all(&header).await.unwrap();
    let (frames, closed) = read_until_closed(&mut raw).await;
    assert!(closed);
    assert_eq!(frames[0].0.request_id, 77);
    assert_eq!(
        decode_error_body(&frames[0].1).0,
        ErrorCode::BUFFER_OVERFLOW
    );
    assert_eq!(server.buffered_request_bytes(), 0);
    assert_eq!(server.stats().oversized_requests.load(Ordering::Relaxed), 2);
    server.shutdown().await;
}

/// A peer that sends requests but never reads the answers cannot park the server's answers
/// (and its connection task) for ever: the flush has the same deadline as a frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_its_answers_is_closed() {
    let server = start(ServerConfig {
        frame_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    })
    .await;
    let stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let (_read_half, mut write_half) = stream.into_split();
    let body = vec![3u8; MIB / 2];
    let writer = tokio::spawn(async move {
        for id in 0..128u64 {
            if write_half
                .write_all(&request(ECHO, id, &body))
                .await
                .is_err()
            {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    eventually("the deaf peer to be closed", || {
        server.stats().frame_timeouts.load(Ordering::Relaxed) == 1
    })
    .await;
    eventually("its connection to leave", || server.open_connections() == 0).await;
    writer.abort();
    server.shutdown().await;
}
