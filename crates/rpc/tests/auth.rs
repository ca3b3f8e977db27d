//! Authentication on real loopback sockets: a server started with a token serves nothing to a
//! client without it or with a wrong one (the handler is never called, the connection closes
//! with `ILLEGAL_CLIENT`), serves a client with it, refuses an unauthenticated large frame from
//! its header without buffering it, and counts unauthenticated connections as unidentified. A
//! server without a token accepts any `Authenticate`. Every wait is bounded.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, BytesMut};
use mooncake_common::{AuthToken, ErrorCode};
use mooncake_proto::methods::{Authenticate, Method, TokenBytes};
use mooncake_proto::{decode_error_body, encode_header, FrameDecoder, FrameHeader, FrameKind};
use mooncake_rpc::{
    ClientConfig, Handler, HandlerError, RpcClient, RpcError, RpcServer, ServerConfig,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ECHO: u16 = 1;
/// Longest any test waits for an effect.
const PATIENCE: Duration = Duration::from_secs(20);
const SECRET: &str = "correct horse battery staple 0123";

/// Echoes, counting every call it gets.
#[derive(Default)]
struct CountingEcho {
    calls: AtomicU64,
}

impl Handler for CountingEcho {
    fn handle(&self, method: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match method {
            ECHO => {
                out.put_slice(body);
                Ok(())
            }
            other => Err(HandlerError::new(
                ErrorCode::INVALID_PARAMS,
                format!("unknown method {other}"),
            )),
        }
    }
}

fn token(text: &str) -> AuthToken {
    AuthToken::from_bytes(text.as_bytes()).unwrap()
}

async fn start(auth_token: Option<AuthToken>) -> (RpcServer, Arc<CountingEcho>) {
    start_with(ServerConfig {
        auth_token,
        ..ServerConfig::default()
    })
    .await
}

async fn start_with(config: ServerConfig) -> (RpcServer, Arc<CountingEcho>) {
    let handler = Arc::new(CountingEcho::default());
    let server = RpcServer::bind("127.0.0.1:0".parse().unwrap(), handler.clone(), config)
        .await
        .unwrap();
    (server, handler)
}

fn client(addr: SocketAddr, auth_token: Option<AuthToken>) -> RpcClient {
    RpcClient::new(
        addr,
        ClientConfig {
            call_timeout: Duration::from_secs(10),
            auth_token,
            ..ClientConfig::default()
        },
    )
}

fn frame(method: u16, request_id: u64, body: &[u8]) -> BytesMut {
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

fn authenticate_frame(request_id: u64, secret: &[u8]) -> BytesMut {
    let body = mooncake_proto::encode(&Authenticate {
        token: TokenBytes(secret.to_vec()),
    })
    .unwrap();
    frame(Authenticate::ID, request_id, &body)
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

fn assert_refused(error: &RpcError, needle: &str) {
    assert_eq!(error.code(), ErrorCode::ILLEGAL_CLIENT, "{error}");
    assert!(error.to_string().contains(needle), "{error}");
}

#[tokio::test]
async fn a_client_without_the_token_is_refused_and_calls_nothing() {
    let (server, handler) = start(Some(token(SECRET))).await;
    let anonymous = client(server.local_addr(), None);
    let error = anonymous.call(ECHO, b"hello").await.unwrap_err();
    assert_refused(&error, "authentication required");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0, "the handler ran");
    assert!(server.stats().auth_failures.load(Ordering::SeqCst) >= 1);

    // On the wire: one error frame for the request's id and method, then the server closes.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    raw.write_all(&frame(ECHO, 77, b"x")).await.unwrap();
    let (frames, closed) = read_until_closed(&mut raw).await;
    assert!(
        closed,
        "the server keeps an unauthenticated connection open"
    );
    assert_eq!(frames.len(), 1, "{frames:?}");
    let (header, body) = &frames[0];
    assert_eq!(
        (header.kind, header.method, header.request_id),
        (FrameKind::Error, ECHO, 77)
    );
    assert_eq!(decode_error_body(body).0, ErrorCode::ILLEGAL_CLIENT);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_the_connection_closed() {
    let (server, handler) = start(Some(token(SECRET))).await;
    let impostor = client(server.local_addr(), Some(token("not the right token, no")));
    let error = impostor.call(ECHO, b"hello").await.unwrap_err();
    assert_refused(&error, "wrong token");
    assert!(!impostor.is_connected(), "a refused connection is not kept");
    // Every later call is refused the same way (each reconnects and fails to authenticate).
    let error = impostor.call(ECHO, b"again").await.unwrap_err();
    assert_refused(&error, "wrong token");
    // A prefix of the right token is wrong too.
    let prefix = client(server.local_addr(), Some(token(&SECRET[..20])));
    assert_refused(&prefix.call(ECHO, b"x").await.unwrap_err(), "wrong token");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0, "the handler ran");

    // On the wire: a wrong Authenticate, then a request pipelined behind it: the error frame
    // names Authenticate's id, the request is never answered, the connection closes.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut both = authenticate_frame(5, b"wrong wrong wrong wrong");
    both.extend_from_slice(&frame(ECHO, 6, b"y"));
    raw.write_all(&both).await.unwrap();
    let (frames, closed) = read_until_closed(&mut raw).await;
    assert!(closed);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(
        (frames[0].0.kind, frames[0].0.method, frames[0].0.request_id),
        (FrameKind::Error, Authenticate::ID, 5)
    );
    assert_eq!(
        decode_error_body(&frames[0].1),
        (ErrorCode::ILLEGAL_CLIENT, "wrong token".to_string())
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
    assert!(server.stats().auth_failures.load(Ordering::SeqCst) >= 4);
    server.shutdown().await;
}

#[tokio::test]
async fn the_right_token_is_served_on_every_connection() {
    let (server, handler) = start_with(ServerConfig {
        auth_token: Some(token(SECRET)),
        // Identified connections idle this long are closed: the client must authenticate again
        // on its next connection.
        idle_timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    })
    .await;
    // Surrounding whitespace of a token file does not matter.
    let member = Arc::new(client(
        server.local_addr(),
        Some(token(&format!("{SECRET}\n"))),
    ));
    let answer = member.call(ECHO, b"hello").await.unwrap();
    assert_eq!(&answer[..], b"hello");
    assert_eq!(
        handler.calls.load(Ordering::SeqCst),
        1,
        "Authenticate is not the handler's"
    );
    // Concurrent calls on the authenticated connection.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..32u8 {
        let member = Arc::clone(&member);
        calls.spawn(async move { (i, member.call(ECHO, &[i]).await) });
    }
    while let Some(done) = calls.join_next().await {
        let (i, answer) = done.unwrap();
        assert_eq!(&answer.unwrap()[..], &[i]);
    }
    // The server closes the idle connection; the next call reconnects and authenticates again.
    let accepted = server.stats().connections_accepted.load(Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while member.is_connected() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never closed for idling"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(&member.call(ECHO, b"again").await.unwrap()[..], b"again");
    assert_eq!(
        server.stats().connections_accepted.load(Ordering::SeqCst),
        accepted + 1
    );
    assert_eq!(handler.calls.load(Ordering::SeqCst), 34);
    assert_eq!(server.stats().auth_failures.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn an_unauthenticated_large_frame_is_refused_before_any_byte_is_buffered() {
    let (server, handler) = start(Some(token(SECRET))).await;
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    // A header announcing a 4 MiB request, and only 1 MiB of it.
    let mut head = BytesMut::new();
    let header = FrameHeader {
        kind: FrameKind::Request,
        method: ECHO,
        request_id: 9,
    };
    encode_header(&mut head, header, 4 << 20);
    raw.write_all(&head).await.unwrap();
    let _ = raw.write_all(&vec![0u8; 1 << 20]).await;
    let (frames, closed) = read_until_closed(&mut raw).await;
    assert!(closed);
    assert_eq!(
        frames.first().map(|f| f.0.request_id),
        Some(9),
        "{frames:?}"
    );
    assert_eq!(decode_error_body(&frames[0].1).0, ErrorCode::ILLEGAL_CLIENT);
    assert_eq!(server.stats().large_frames.load(Ordering::SeqCst), 0);
    assert_eq!(server.buffered_request_bytes(), 0);
    // Even a large Authenticate is refused from its header (over the 64 KiB a stranger gets).
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut head = BytesMut::new();
    let header = FrameHeader {
        kind: FrameKind::Request,
        method: Authenticate::ID,
        request_id: 10,
    };
    encode_header(&mut head, header, 1 << 20);
    raw.write_all(&head).await.unwrap();
    let (frames, closed) = read_until_closed(&mut raw).await;
    assert!(closed);
    assert_eq!(
        decode_error_body(&frames[0].1).0,
        ErrorCode::BUFFER_OVERFLOW
    );
    assert_eq!(server.stats().large_frames.load(Ordering::SeqCst), 0);
    assert_eq!(handler.calls.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}

/// Over the connection limit, a connection that has not authenticated makes room for a
/// newcomer before an authenticated one does (it is unidentified).
#[tokio::test]
async fn unauthenticated_connections_make_room_first() {
    let (server, _handler) = start_with(ServerConfig {
        auth_token: Some(token(SECRET)),
        max_connections: 2,
        ..ServerConfig::default()
    })
    .await;
    let first = client(server.local_addr(), Some(token(SECRET)));
    first.call(ECHO, b"1").await.unwrap();
    // A stranger that connected and sent nothing (it has not authenticated): it holds the
    // second slot.
    let mut stranger = TcpStream::connect(server.local_addr()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while server.open_connections() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stranger not admitted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = client(server.local_addr(), Some(token(SECRET)));
    second.call(ECHO, b"2").await.unwrap();
    let (_, closed) = read_until_closed(&mut stranger).await;
    assert!(closed, "the unauthenticated stranger was not evicted");
    // The first client kept its connection.
    let before = server.stats().connections_accepted.load(Ordering::SeqCst);
    first.call(ECHO, b"3").await.unwrap();
    assert_eq!(
        server.stats().connections_accepted.load(Ordering::SeqCst),
        before,
        "the authenticated client had to reconnect"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_without_a_token_accepts_any_authenticate() {
    let (server, handler) = start(None).await;
    let with_token = client(server.local_addr(), Some(token(SECRET)));
    assert_eq!(&with_token.call(ECHO, b"a").await.unwrap()[..], b"a");
    let without = client(server.local_addr(), None);
    assert_eq!(&without.call(ECHO, b"b").await.unwrap()[..], b"b");
    assert_eq!(handler.calls.load(Ordering::SeqCst), 2);
    assert_eq!(server.stats().auth_failures.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}
