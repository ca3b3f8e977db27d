//! Deferred answers over real loopback sockets: a held answer does not stop the connection from
//! reading and serving the requests behind it, whose answers overtake it; it leaves once it
//! resolves, and a deferred answer that fails goes out with its replacement body.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, BytesMut};
use mooncake_proto::{encode_header, FrameDecoder, FrameHeader, FrameKind};
use mooncake_rpc::{Deferred, Handler, HandlerError, RpcServer, ServerConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Echoes at once.
const ECHO: u16 = 1;
/// Echoes once the gate opens.
const HELD: u16 = 2;
/// Answers `refused` instead of the echo once the gate opens.
const HELD_FAILS: u16 = 3;

struct Gated {
    gate: watch::Receiver<bool>,
    handled: AtomicUsize,
}

impl Gated {
    fn wait(&self, fail: bool) -> Deferred {
        let mut gate = self.gate.clone();
        Deferred::new(async move {
            let _ = gate.wait_for(|open| *open).await;
            if fail {
                Err(BytesMut::from(&b"refused"[..]))
            } else {
                Ok(())
            }
        })
    }
}

impl Handler for Gated {
    fn handle(&self, _: u16, body: &[u8], out: &mut BytesMut) -> Result<(), HandlerError> {
        out.put_slice(body);
        Ok(())
    }

    fn handle_deferred(
        &self,
        method: u16,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<Option<Deferred>, HandlerError> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        out.put_slice(body);
        Ok(match method {
            HELD => Some(self.wait(false)),
            HELD_FAILS => Some(self.wait(true)),
            _ => None,
        })
    }
}

fn request(out: &mut BytesMut, method: u16, request_id: u64, body: &[u8]) {
    let header = FrameHeader {
        kind: FrameKind::Request,
        method,
        request_id,
    };
    encode_header(out, header, body.len());
    out.put_slice(body);
}

/// Reads `n` frames from `stream` (bounded in time), in arrival order.
async fn read_frames(stream: &mut TcpStream, n: usize) -> Vec<(u64, Vec<u8>)> {
    let decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while frames.len() < n {
        if let Some(frame) = decoder.decode(&mut buf).unwrap() {
            assert_eq!(frame.header.kind, FrameKind::Response);
            frames.push((frame.header.request_id, frame.body.to_vec()));
            continue;
        }
        let read = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf))
            .await
            .expect("answers within 30 s")
            .unwrap();
        assert!(read > 0, "the server closed after {} answers", frames.len());
    }
    frames
}

async fn start() -> (RpcServer, Arc<Gated>, watch::Sender<bool>) {
    let (open, gate) = watch::channel(false);
    let handler = Arc::new(Gated {
        gate,
        handled: AtomicUsize::new(0),
    });
    let server = RpcServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        handler.clone(),
        ServerConfig::default(),
    )
    .await
    .unwrap();
    (server, handler, open)
}

/// Polls until the handler has seen `n` requests (30 s at most).
async fn handled(handler: &Gated, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handler.handled.load(Ordering::SeqCst) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server handled {} of {n} pipelined requests while an answer was held",
            handler.handled.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn held_answers_keep_the_connection_serving_and_are_overtaken_by_ready_ones() {
    let (server, handler, open) = start().await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut out = BytesMut::new();
    request(&mut out, HELD, 1, b"one");
    request(&mut out, ECHO, 2, b"two");
    request(&mut out, HELD, 3, b"three");
    request(&mut out, ECHO, 4, b"four");
    stream.write_all(&out).await.unwrap();
    // The ready answers leave while the held ones wait.
    let ready = read_frames(&mut stream, 2).await;
    assert_eq!(ready, vec![(2, b"two".to_vec()), (4, b"four".to_vec())]);
    assert_eq!(handler.handled.load(Ordering::SeqCst), 4);
    let mut probe = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(200), stream.peek(&mut probe)).await;
    assert!(early.is_err(), "a held answer left before it resolved");
    open.send(true).unwrap();
    let mut held = read_frames(&mut stream, 2).await;
    held.sort();
    assert_eq!(held, vec![(1, b"one".to_vec()), (3, b"three".to_vec())]);
    server.shutdown().await;
}

#[tokio::test]
async fn a_held_answer_that_fails_goes_out_with_its_replacement() {
    let (server, handler, open) = start().await;
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut out = BytesMut::new();
    for id in 1..=64u64 {
        let method = if id % 2 == 0 { HELD_FAILS } else { HELD };
        request(&mut out, method, id, &id.to_le_bytes());
    }
    request(&mut out, ECHO, 65, b"after");
    stream.write_all(&out).await.unwrap();
    handled(&handler, 65).await;
    let after = read_frames(&mut stream, 1).await;
    assert_eq!(after, vec![(65, b"after".to_vec())]);
    open.send(true).unwrap();
    let mut frames = read_frames(&mut stream, 64).await;
    frames.sort();
    for (i, (id, body)) in frames.iter().enumerate() {
        let want = i as u64 + 1;
        assert_eq!(*id, want, "an answer is missing or doubled");
        let expected = match want {
            w if w % 2 == 0 => b"refused".to_vec(),
            w => w.to_le_bytes().to_vec(),
        };
        assert_eq!(body, &expected, "answer {want}");
    }
    server.shutdown().await;
}
