//! The RPC runtime over real loopback sockets: pipelining, errors, limits, malformed input,
//! timeouts, reconnection and shutdown.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, BytesMut};
use mooncake_common::ErrorCode;
use mooncake_proto::{decode_error_body, FrameDecoder, FrameKind};
use mooncake_rpc::{
    ClientConfig, Handler, HandlerError, RpcClient, RpcError, RpcServer, ServerConfig,
};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

const ECHO: u16 = 1;
const REVERSE: u16 = 2;

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

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn start(config: ServerConfig) -> RpcServer {
    RpcServer::bind(loopback(), Arc::new(TestHandler), config)
        .await
        .unwrap()
}

fn quick_client(addr: SocketAddr) -> RpcClient {
    let config = ClientConfig {
        call_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    RpcClient::new(addr, config)
}

/// Reads one frame from a raw socket, bounded in time.
async fn read_frame(stream: &mut TcpStream) -> Option<(mooncake_proto::FrameHeader, Vec<u8>)> {
    let decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(frame) = decoder.decode(&mut buf).unwrap() {
            return Some((frame.header, frame.body.to_vec()));
        }
        let read = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_on_one_connection_get_their_own_answers() {
    let server = start(ServerConfig::default()).await;
    let client = Arc::new(quick_client(server.local_addr()));
    let mut tasks = Vec::new();
    for i in 0..2000u32 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let body = i.to_le_bytes();
            let method = if i % 2 == 0 { ECHO } else { REVERSE };
            let answer = client.call(method, &body).await.unwrap();
            let mut expected = body.to_vec();
            if method == REVERSE {
                expected.reverse();
            }
            assert_eq!(&answer[..], &expected[..], "request {i}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        server
            .stats()
            .connections_accepted
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_method_is_an_error_answer_and_the_connection_survives() {
    let server = start(ServerConfig::default()).await;
    let client = quick_client(server.local_addr());
    let err = client.call(999, b"x").await.unwrap_err();
    assert!(
        matches!(
            err,
            RpcError::Remote {
                code: ErrorCode::INVALID_PARAMS,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        &client.call(ECHO, b"still here").await.unwrap()[..],
        b"still here"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn large_bodies_round_trip_and_oversized_requests_are_refused_locally() {
    let server = start(ServerConfig::default()).await;
    let client = quick_client(server.local_addr());
    let body: Vec<u8> = (0..(4 << 20)).map(|i| (i % 251) as u8).collect();
    assert_eq!(&client.call(ECHO, &body).await.unwrap()[..], &body[..]);
    let huge = vec![0u8; mooncake_proto::DEFAULT_MAX_FRAME_BYTES];
    let err = client.call(ECHO, &huge).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::INVALID_PARAMS);
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_frames_close_only_the_offending_connection() {
    let server = start(ServerConfig::default()).await;
    let good = quick_client(server.local_addr());
    assert_eq!(&good.call(ECHO, b"a").await.unwrap()[..], b"a");

    // Oversized length prefix.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    raw.write_all(&[0xff, 0xff, 0xff, 0x7f]).await.unwrap();
    let (header, body) = read_frame(&mut raw).await.unwrap();
    assert_eq!(header.kind, FrameKind::Error);
    assert_eq!(decode_error_body(&body).0, ErrorCode::BUFFER_OVERFLOW);
    assert!(
        read_frame(&mut raw).await.is_none(),
        "connection must be closed"
    );

    // Wrong version.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    raw.write_all(&[12, 0, 0, 0, 9, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let (_, body) = read_frame(&mut raw).await.unwrap();
    assert_eq!(decode_error_body(&body).0, ErrorCode::INVALID_VERSION);

    // A client that disconnects in the middle of a frame.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    raw.write_all(&[100, 0, 0, 0, 1, 0, 1, 0]).await.unwrap();
    drop(raw);

    // Garbage of every kind, then the well-behaved client still works.
    for seed in 0..50u8 {
        let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
        let junk: Vec<u8> = (0..64u8)
            .map(|i| seed.wrapping_mul(31).wrapping_add(i.wrapping_mul(7)))
            .collect();
        let _ = raw.write_all(&junk).await;
    }
    assert_eq!(&good.call(ECHO, b"b").await.unwrap()[..], b"b");
    assert!(
        server
            .stats()
            .frame_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused_and_the_rest_are_served() {
    let config = ServerConfig {
        max_connections: 16,
        ..ServerConfig::default()
    };
    let server = start(config).await;
    let mut held = Vec::new();
    for _ in 0..16 {
        let client = quick_client(server.local_addr());
        client.call(ECHO, b"hold").await.unwrap();
        held.push(client);
    }
    // 40 more idle connections: each is told "limit reached" and closed.
    for _ in 0..40 {
        let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
        let (header, body) = read_frame(&mut raw).await.unwrap();
        assert_eq!(header.kind, FrameKind::Error);
        assert_eq!(
            decode_error_body(&body).0,
            ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS
        );
    }
    for client in &held {
        assert_eq!(&client.call(ECHO, b"ok").await.unwrap()[..], b"ok");
    }
    let over = quick_client(server.local_addr());
    assert_eq!(
        over.call(ECHO, b"x").await.unwrap_err().code(),
        ErrorCode::RPC_FAIL
    );
    // Releasing one slot lets a new client in.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let retry = quick_client(server.local_addr());
        if retry.call(ECHO, b"in").await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "slot never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_silent_server_makes_calls_time_out_with_rpc_timeout() {
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sink = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    });
    let client = RpcClient::new(
        addr,
        ClientConfig {
            call_timeout: Duration::from_millis(200),
            ..ClientConfig::default()
        },
    );
    let started = std::time::Instant::now();
    let err = client.call(ECHO, b"anyone?").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::RPC_TIMEOUT);
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(client);
    sink.abort();
}

/// CPU time this process has used (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let of = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// In busy-poll mode the reader polls for at most its budget, then parks: a call that waits
/// long for its answer (a silent server) costs little CPU, for a task's call (the reader polls)
/// and for a caller on its own thread (it polls itself, then waits for the reader).
#[test]
fn a_long_wait_does_not_keep_anyone_spinning() {
    let rt = Arc::new(Runtime::new().unwrap());
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(loopback()))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let sink = rt.spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    let client = Arc::new(RpcClient::new(
        addr,
        ClientConfig {
            call_timeout: Duration::from_millis(600),
            busy_poll: Some(Duration::from_micros(100)),
            ..ClientConfig::default()
        },
    ));
    for from_task in [true, false] {
        let before = cpu_time();
        let started = std::time::Instant::now();
        let caller = Arc::clone(&client);
        let err = if from_task {
            rt.block_on(rt.spawn(async move { caller.call(ECHO, b"anyone?").await }))
                .unwrap()
                .unwrap_err()
        } else {
            rt.block_on(caller.call(ECHO, b"anyone?")).unwrap_err()
        };
        assert_eq!(err.code(), ErrorCode::RPC_TIMEOUT);
        assert!(started.elapsed() >= Duration::from_millis(600));
        let used = cpu_time() - before;
        assert!(
            used < Duration::from_millis(300),
            "{used:?} of CPU while waiting 600 ms (from a task: {from_task})"
        );
    }
    sink.abort();
}

#[tokio::test]
async fn the_client_reconnects_after_the_server_restarts() {
    let server = start(ServerConfig::default()).await;
    let addr = server.local_addr();
    let client = quick_client(addr);
    assert_eq!(&client.call(ECHO, b"1").await.unwrap()[..], b"1");
    server.shutdown().await;
    assert_eq!(
        client.call(ECHO, b"2").await.unwrap_err().code(),
        ErrorCode::RPC_FAIL
    );
    let server = RpcServer::bind(addr, Arc::new(TestHandler), ServerConfig::default())
        .await
        .unwrap();
    assert_eq!(&client.call(ECHO, b"3").await.unwrap()[..], b"3");
    server.shutdown().await;
}

/// The default client polls for answers; for calls made by runtime tasks the connection's
/// reader task does. A reader parked after a quiet spell is woken by the next call (on either
/// runtime flavour), and dropping the client still closes the connection (the parked reader
/// must not keep it alive).
async fn parked_reader_is_woken_and_lets_the_connection_go() {
    let server = start(ServerConfig::default()).await;
    let client = Arc::new(quick_client(server.local_addr()));
    assert!(ClientConfig::default().busy_poll.is_some());
    let caller = Arc::clone(&client);
    tokio::spawn(async move {
        for round in 0..5u32 {
            // Back-to-back calls (the reader lingers), then a pause long enough to park it.
            for i in 0..20u32 {
                let body = (round * 100 + i).to_le_bytes();
                let started = std::time::Instant::now();
                assert_eq!(&caller.call(ECHO, &body).await.unwrap()[..], &body);
                assert!(started.elapsed() < Duration::from_secs(2), "call stalled");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    // Tasks never read the socket themselves.
    assert_eq!(client.caller_reads(), 0);
    let client = Arc::into_inner(client).unwrap();
    let stats = Arc::clone(server.stats());
    assert_eq!(stats.connections_open.load(Ordering::Relaxed), 1);
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while stats.connections_open.load(Ordering::Relaxed) != 0 {
        assert!(std::time::Instant::now() < deadline, "connection kept open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_reader_is_woken_on_a_multi_thread_runtime() {
    parked_reader_is_woken_and_lets_the_connection_go().await;
}

#[tokio::test(flavor = "current_thread")]
async fn parked_reader_is_woken_on_a_current_thread_runtime() {
    parked_reader_is_woken_and_lets_the_connection_go().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll_mode_answers_the_same() {
    let config = ServerConfig {
        busy_poll: Some(Duration::from_micros(50)),
        ..ServerConfig::default()
    };
    let server = start(config).await;
    let client = RpcClient::new(
        server.local_addr(),
        ClientConfig {
            busy_poll: Some(Duration::from_micros(50)),
            ..ClientConfig::default()
        },
    );
    for i in 0..200u32 {
        assert_eq!(
            &client.call(ECHO, &i.to_le_bytes()).await.unwrap()[..],
            &i.to_le_bytes()
        );
    }
    server.shutdown().await;
}

#[tokio::test]
async fn after_shutdown_the_port_refuses_connections() {
    let server = start(ServerConfig::default()).await;
    let addr = server.local_addr();
    let client = quick_client(addr);
    client.call(ECHO, b"x").await.unwrap();
    server.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());
}

/// A caller on its own thread (`block_on` of a multi-thread runtime, as the Python binding and
/// the blocking client call) reads its answers from the socket itself, every one of them
/// (spinning or waiting on the socket, whichever the host's load allows: the reader task reads
/// nothing while a caller polls); with many threads sharing one connection (where the reader
/// task polls for them instead), each still gets its own answer.
#[test]
fn callers_on_their_own_threads_read_their_own_answers() {
    let rt = Arc::new(Runtime::new().unwrap());
    let server = rt.block_on(start(ServerConfig::default()));
    let client = Arc::new(quick_client(server.local_addr()));
    for i in 0..200u32 {
        let body = i.to_le_bytes();
        assert_eq!(&rt.block_on(client.call(ECHO, &body)).unwrap()[..], &body);
    }
    assert!(
        client.caller_reads() >= 200,
        "callers read {} times for 200 answers",
        client.caller_reads()
    );
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let (rt, client) = (Arc::clone(&rt), Arc::clone(&client));
            std::thread::spawn(move || {
                for i in 0..300u32 {
                    let body = (t * 1_000_000 + i).to_le_bytes();
                    let method = if i % 2 == 0 { ECHO } else { REVERSE };
                    let answer = rt.block_on(client.call(method, &body)).unwrap();
                    let mut expected = body.to_vec();
                    if method == REVERSE {
                        expected.reverse();
                    }
                    assert_eq!(&answer[..], &expected[..]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Without busy polling, callers wait for the reader task.
    let quiet = RpcClient::new(
        server.local_addr(),
        ClientConfig {
            busy_poll: None,
            ..ClientConfig::default()
        },
    );
    for i in 0..50u32 {
        let body = i.to_le_bytes();
        assert_eq!(&rt.block_on(quiet.call(ECHO, &body)).unwrap()[..], &body);
    }
    assert_eq!(quiet.caller_reads(), 0);
    rt.block_on(server.shutdown());
}

/// A raw server that, for each connection, reads one request and then does `then` with it.
async fn raw_server<F, Fut>(then: F) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    F: Fn(TcpStream, mooncake_proto::FrameHeader, Vec<u8>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            if let Some((header, body)) = read_frame(&mut stream).await {
                then(stream, header, body).await;
            }
        }
    });
    (addr, task)
}

fn answer_frame(header: mooncake_proto::FrameHeader, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    let response = mooncake_proto::FrameHeader {
        kind: FrameKind::Response,
        ..header
    };
    mooncake_proto::encode_frame(&mut out, response, body);
    out
}

/// An answer that comes long after the caller's poll budget is still delivered (by the reader
/// task), and one split over several writes is reassembled.
#[test]
fn a_polling_caller_gets_late_and_split_answers() {
    let rt = Runtime::new().unwrap();
    let (addr, task) = rt.block_on(raw_server(|mut stream, header, body| async move {
        let out = answer_frame(header, &body);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let (first, rest) = out.split_at(5);
        stream.write_all(first).await.unwrap();
        stream.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        stream.write_all(rest).await.unwrap();
        // Keep the connection open until the client hangs up.
        let mut sink = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut sink)).await;
    }));
    let client = quick_client(addr);
    let started = std::time::Instant::now();
    assert_eq!(
        &rt.block_on(client.call(ECHO, b"late")).unwrap()[..],
        b"late"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    task.abort();
}

/// A server that hangs up, or answers garbage, while the caller polls: the call fails at once
/// with RPC_FAIL (no hang until the call timeout), and the next call connects afresh.
#[test]
fn a_polling_caller_sees_hang_ups_and_bad_frames() {
    let rt = Runtime::new().unwrap();
    for garbage in [false, true] {
        let (addr, task) = rt.block_on(raw_server(move |mut stream, _, _| async move {
            if garbage {
                stream.write_all(&[0xFF; 64]).await.unwrap();
                let mut sink = [0u8; 64];
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut sink)).await;
            }
            // else: drop the stream (hang up) without answering.
        }));
        let client = quick_client(addr);
        let started = std::time::Instant::now();
        let error = rt.block_on(client.call(ECHO, b"x")).unwrap_err();
        assert_eq!(error.code(), ErrorCode::RPC_FAIL, "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}",
            started.elapsed()
        );
        // A second call is sent on a fresh connection (and fails the same way).
        let error = rt.block_on(client.call(ECHO, b"y")).unwrap_err();
        assert_eq!(error.code(), ErrorCode::RPC_FAIL);
        task.abort();
    }
}
