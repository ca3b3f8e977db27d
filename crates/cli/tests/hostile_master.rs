//! The real `mooncake master`, with its default limits, against hostile peers on loopback: an
//! idle connection flood past its 1,024-connection limit, 100 connections that each send 15 MiB
//! of a 16 MiB frame and stall, and a frame over its method's size limit. Every wait is bounded.
#![allow(clippy::unwrap_used)]

mod common;

use common::MasterProcess;
use mooncake_client::MasterClient;
use mooncake_common::ErrorCode;
use mooncake_proto::methods::{self as m, Method};
use mooncake_proto::{decode_error_body, FrameDecoder, FrameKind};
use mooncake_rpc::ClientConfig;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client_of(master: &MasterProcess) -> MasterClient {
    MasterClient::new(
        master.rpc,
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

/// The header of a request frame whose body is `body_len` bytes (docs/wire.md).
fn request_header(method: u16, request_id: u64, body_len: usize) -> Vec<u8> {
    let frame_len = u32::try_from(mooncake_proto::HEADER_BYTES - 4 + body_len).unwrap();
    let mut out = Vec::with_capacity(mooncake_proto::HEADER_BYTES);
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.push(mooncake_proto::PROTOCOL_VERSION);
    out.push(FrameKind::Request as u8);
    out.extend_from_slice(&method.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out
}

/// The finding: 1,100 connections that send nothing filled the master's 1,024 connections for
/// ever and every client's first call failed with RPC_FAIL (-900).
#[test]
fn an_idle_flood_does_not_lock_clients_out_of_the_master() {
    raise_fd_limit(4096);
    let master = MasterProcess::start(&[]);
    let rt = runtime();
    let early = client_of(&master);
    rt.block_on(early.service_ready()).unwrap();
    let flood: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(master.rpc).unwrap())
        .collect();
    // The master accepts in order: the newcomer's connection comes after the whole flood.
    let newcomer = client_of(&master);
    let ready = rt.block_on(newcomer.service_ready());
    assert!(ready.is_ok(), "new client locked out: {ready:?}");
    // The client connected before the flood kept its connection.
    rt.block_on(early.service_ready()).unwrap();
    drop(flood);
}

/// The finding: 100 connections each sending 15 MiB of a 16 MiB frame took the master from
/// 77 MB to 1.56 GB. Now large frames share a 256 MiB budget (the rest wait, unread), so the
/// master stays within its baseline plus the budget plus small per-connection buffers, and the
/// memory comes back when the connections go.
#[test]
fn half_sent_frames_do_not_exhaust_the_masters_memory() {
    raise_fd_limit(4096);
    let master = MasterProcess::start(&[]);
    let rt = runtime();
    let regular = client_of(&master);
    rt.block_on(regular.service_ready()).unwrap();
    let baseline_kib = master.rss_kib();

    let frame_total = 16 * MIB;
    let header = request_header(
        m::BatchPutStart::ID,
        1,
        frame_total - mooncake_proto::HEADER_BYTES,
    );
    let payload = vec![0x11u8; 15 * MIB - header.len()];
    let mut attackers: Vec<(TcpStream, usize)> = (0..100)
        .map(|_| {
            let mut stream = TcpStream::connect(master.rpc).unwrap();
            stream.write_all(&header).unwrap();
            stream.set_nonblocking(true).unwrap();
            (stream, 0)
        })
        .collect();
    // Push as much of the 15 MiB per connection as the master takes, for at most 15 s, while
    // watching its memory.
    let mut peak_kib = baseline_kib;
    let started = Instant::now();
    let mut last_progress = Instant::now();
    while started.elapsed() < Duration::from_secs(15)
        && last_progress.elapsed() < Duration::from_secs(3)
    {
        let mut progressed = false;
        for (stream, sent) in attackers.iter_mut() {
            if *sent >= payload.len() {
                continue;
            }
            match stream.write(&payload[*sent..]) {
                Ok(n) => {
                    *sent += n;
                    progressed |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // Shed or timed out by the master: this one is over.
                Err(_) => *sent = payload.len(),
            }
        }
        if progressed {
            last_progress = Instant::now();
        }
        peak_kib = peak_kib.max(master.rss_kib());
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent_mib: usize = attackers.iter().map(|(_, sent)| *sent).sum::<usize>() / MIB;
    // Small calls are served throughout.
    rt.block_on(regular.service_ready()).unwrap();
    peak_kib = peak_kib.max(master.rss_kib());
    let grew_mib = peak_kib.saturating_sub(baseline_kib) / 1024;
    eprintln!(
        "master RSS: baseline {} MiB, peak {} MiB under {sent_mib} MiB of half-sent frames",
        baseline_kib / 1024,
        peak_kib / 1024
    );
    assert!(
        grew_mib < 400,
        "master RSS grew by {grew_mib} MiB under the attack (baseline {} MiB, {sent_mib} MiB sent)",
        baseline_kib / 1024
    );
    drop(attackers);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now_kib = master.rss_kib();
        if now_kib < baseline_kib + 64 * 1024 {
            eprintln!("master RSS after: {} MiB", now_kib / 1024);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "master RSS stayed at {} MiB after the attack (baseline {} MiB)",
            now_kib / 1024,
            baseline_kib / 1024
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(regular.service_ready()).unwrap();
}

/// Most master methods are small: a frame announcing 1 MiB for `ExistKey` is refused from its
/// header (BUFFER_OVERFLOW, with its request id) before any body is sent.
#[test]
fn a_frame_over_its_methods_limit_is_refused_from_its_header() {
    let master = MasterProcess::start(&[]);
    let mut raw = TcpStream::connect(master.rpc).unwrap();
    raw.write_all(&request_header(m::ExistKey::ID, 42, MIB))
        .unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let (header, total) = loop {
        if let Some(found) = FrameDecoder::default().peek_header(&got).unwrap() {
            if got.len() >= found.1 {
                break found;
            }
        }
        let n = raw
            .read(&mut chunk)
            .expect("no answer to an oversized header");
        assert!(n > 0, "closed without an answer");
        got.extend_from_slice(&chunk[..n]);
    };
    assert_eq!(header.kind, FrameKind::Error);
    assert_eq!(header.request_id, 42);
    let body = &got[mooncake_proto::HEADER_BYTES..total];
    assert_eq!(decode_error_body(body).0, ErrorCode::BUFFER_OVERFLOW);
}
