//! Failure behaviour: a peer process killed (SIGKILL) or frozen (SIGSTOP) mid-transfer,
//! unregistering memory while transfers run, and malformed bytes on the TCP port.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine, pattern, peer_pattern_byte, PeerProcess};
use mooncake_common::ErrorCode;
use mooncake_transfer::wire::{Header, Kind, HEADER_BYTES, MAX_PAYLOAD_BYTES};
use mooncake_transfer::{
    EntryStatus, SegmentOptions, TransferError, TransferRequest, TransportMode,
};

const MIB: usize = 1 << 20;

#[test]
fn peer_killed_mid_transfer_fails_entries_within_timeout_and_pool_recovers() {
    let timeout_ms = 8_000;
    let mut victim = PeerProcess::spawn(16 * MIB);
    let survivor = engine(TransportMode::Auto, timeout_ms);
    let survivor_segment = survivor
        .allocate_segment(4 * MIB, SegmentOptions::default())
        .unwrap();
    survivor_segment.write_at(0, &pattern(4 * MIB, 9)).unwrap();
    let client = engine(TransportMode::Tcp, timeout_ms);
    let local = client.allocate_local_buffer(16 * MIB).unwrap();

    // Far more than can move before the kill: 400 reads of 4 MiB (1.6 GB).
    let requests: Vec<TransferRequest> = (0..400)
        .map(|i| {
            let off = (i % 4) * 4 * MIB;
            TransferRequest::read(
                local.as_ptr().wrapping_add(off),
                (4 * MIB) as u64,
                &victim.endpoint,
                victim.segment_id,
                off as u64,
            )
        })
        .collect();
    let batch = client.submit(&requests);
    let started = Instant::now();
    while batch.status(0) == Some(EntryStatus::Pending) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "first entry never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(batch.status(0), Some(EntryStatus::Completed));
    let mut first = vec![0u8; 4096];
    local.read_at(0, &mut first).unwrap();
    assert!(
        first
            .iter()
            .enumerate()
            .all(|(i, &b)| b == peer_pattern_byte(i)),
        "first entry content"
    );

    victim.kill();
    let killed_at = Instant::now();
    let results = batch
        .wait_timeout(Duration::from_millis(timeout_ms + 2_000))
        .expect("entries still pending after the timeout: the engine hung");
    let settle = killed_at.elapsed();
    let failed: Vec<&TransferError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!failed.is_empty(), "the kill landed after the whole batch");
    for err in &failed {
        assert_eq!(err.code(), ErrorCode::TRANSFER_FAIL, "{err}");
    }
    assert!(
        settle < Duration::from_millis(timeout_ms),
        "took {settle:?} to fail the entries"
    );
    eprintln!(
        "{} of 400 entries failed, all within {settle:?} of the kill",
        failed.len()
    );

    // Other peers are unaffected.
    let remote = Arc::clone(survivor.endpoint());
    let read = TransferRequest::read(
        local.as_ptr(),
        (4 * MIB) as u64,
        &remote,
        survivor_segment.id(),
        0,
    );
    assert_eq!(client.transfer_sync(&[read]), vec![Ok(())]);
    let mut got = vec![0u8; 4 * MIB];
    local.read_at(0, &mut got).unwrap();
    assert!(got == pattern(4 * MIB, 9));

    // The dead peer now fails fast (connection refused), without waiting for the timeout.
    let again = TransferRequest::read(local.as_ptr(), 4096, &victim.endpoint, victim.segment_id, 0);
    let t = Instant::now();
    let results = client.transfer_sync(&[again]);
    assert!(
        matches!(results[0], Err(TransferError::PeerUnreachable { .. })),
        "{:?}",
        results[0]
    );
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "dead peer took {:?}",
        t.elapsed()
    );

    // A new peer process is reachable through the same engine.
    let fresh = PeerProcess::spawn(MIB);
    let read = TransferRequest::read(
        local.as_ptr(),
        MIB as u64,
        &fresh.endpoint,
        fresh.segment_id,
        0,
    );
    assert_eq!(client.transfer_sync(&[read]), vec![Ok(())]);
    local.read_at(0, &mut first).unwrap();
    assert!(first
        .iter()
        .enumerate()
        .all(|(i, &b)| b == peer_pattern_byte(i)));
}

#[test]
fn frozen_peer_makes_entries_time_out_instead_of_hanging() {
    let timeout_ms = 1_500;
    let mut frozen = PeerProcess::spawn(MIB);
    let client = engine(TransportMode::Tcp, timeout_ms);
    let local = client.allocate_local_buffer(MIB).unwrap();
    // Warm the pool so the connection exists, then freeze the peer.
    let read = TransferRequest::read(local.as_ptr(), 4096, &frozen.endpoint, frozen.segment_id, 0);
    assert_eq!(
        client.transfer_sync(std::slice::from_ref(&read)),
        vec![Ok(())]
    );
    frozen.freeze();
    let t = Instant::now();
    let results = client
        .submit(&[read.clone(), read])
        .wait_timeout(Duration::from_secs(10))
        .expect("hung");
    for result in &results {
        assert!(
            matches!(result, Err(TransferError::Timeout { .. })),
            "{result:?}"
        );
        assert_eq!(result.as_ref().unwrap_err().code(), ErrorCode::RPC_TIMEOUT);
    }
    let elapsed = t.elapsed();
    assert!(
        elapsed >= Duration::from_millis(timeout_ms - 100),
        "failed too early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(timeout_ms + 1_500),
        "failed too late: {elapsed:?}"
    );
    frozen.signal(libc::SIGCONT);
    frozen.kill();
}

#[test]
fn unregister_of_a_user_buffer_waits_for_running_transfers() {
    let server = engine(TransportMode::Auto, 30_000);
    let client = engine(TransportMode::Tcp, 30_000);
    let size = 32 * MIB;
    let segment = server
        .allocate_segment(size, SegmentOptions::default())
        .unwrap();
    let data = pattern(size, 11);
    segment.write_at(0, &data).unwrap();
    let remote = Arc::clone(server.endpoint());

    let mut user = vec![0u8; size];
    // SAFETY: `user` outlives the registration: we only drop it after unregister returned Ok.
    let region = unsafe { client.register_user_buffer(user.as_mut_ptr(), size) }.unwrap();
    let requests: Vec<TransferRequest> = (0..8)
        .map(|_| TransferRequest::read(user.as_mut_ptr(), size as u64, &remote, segment.id(), 0))
        .collect();
    let batch = client.submit(&requests);
    // Too short a wait: refused, and the region stays registered.
    let busy = client.unregister_timeout(region, Duration::from_millis(1));
    assert!(
        matches!(busy, Err(TransferError::RegionBusy { .. })),
        "{busy:?}"
    );
    assert_eq!(busy.unwrap_err().code(), ErrorCode::OBJECT_REPLICA_BUSY);
    // A real wait returns only once nothing touches the memory any more.
    client
        .unregister_timeout(region, Duration::from_secs(30))
        .unwrap();
    assert!(
        batch.is_done(),
        "unregister returned while entries were still running"
    );
    assert!(batch.wait().iter().all(|r| r.is_ok()));
    assert!(user == data);
    // The range is gone: new entries on it are refused locally.
    let late = TransferRequest::read(user.as_mut_ptr(), 16, &remote, segment.id(), 0);
    assert!(matches!(
        client.transfer_sync(&[late])[0],
        Err(TransferError::LocalRangeNotRegistered { .. })
    ));
    drop(user);
}

#[test]
fn unregister_of_a_segment_while_peers_read_never_frees_memory_under_them() {
    let server = engine(TransportMode::Auto, 30_000);
    let client = engine(TransportMode::Tcp, 30_000);
    let size = 16 * MIB;
    let segment = server
        .allocate_segment(size, SegmentOptions::default())
        .unwrap();
    let data = pattern(size, 12);
    segment.write_at(0, &data).unwrap();
    let local = client.allocate_local_buffer(size).unwrap();
    let remote = Arc::clone(server.endpoint());
    let requests: Vec<TransferRequest> = (0..16)
        .map(|_| TransferRequest::read(local.as_ptr(), size as u64, &remote, segment.id(), 0))
        .collect();
    let batch = client.submit(&requests);
    std::thread::sleep(Duration::from_millis(5));
    server
        .unregister_timeout(segment.id(), Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        segment.inflight(),
        0,
        "unregister returned with transfers in flight"
    );
    let results = batch.wait();
    // Each entry either finished before the unregister or was refused after it; none saw
    // freed memory (a served read always carries the full, correct content).
    let mut refused = 0;
    for result in &results {
        match result {
            Ok(()) => {}
            Err(err) => {
                assert_eq!(err.code(), ErrorCode::SEGMENT_NOT_FOUND, "{err}");
                refused += 1;
            }
        }
    }
    if refused < results.len() {
        let mut got = vec![0u8; size];
        local.read_at(0, &mut got).unwrap();
        assert!(got == data, "a served read returned wrong bytes");
    }
}

fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got);
    got
}

#[test]
fn malformed_headers_close_the_connection_and_the_server_keeps_serving() {
    let server = engine(TransportMode::Auto, 10_000);
    let segment = server
        .allocate_segment(MIB, SegmentOptions::default())
        .unwrap();
    segment.write_at(0, &pattern(MIB, 13)).unwrap();
    let addr = format!("127.0.0.1:{}", server.endpoint().port());
    let good = Header::request(Kind::ReadRequest, 1, segment.id(), 0, 16).encode();

    let mut bad_cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xEE; HEADER_BYTES]),
        ("response kind from a client", {
            let mut h = good;
            h[5] = 0x81;
            h.to_vec()
        }),
        ("oversized length", {
            let mut h = good;
            h[40..48].copy_from_slice(&(MAX_PAYLOAD_BYTES + 1).to_le_bytes());
            h.to_vec()
        }),
        ("wrong version", {
            let mut h = good;
            h[4] = 9;
            h.to_vec()
        }),
    ];
    bad_cases.push(("status in request", {
        let mut h = good;
        h[8] = 1;
        h.to_vec()
    }));
    for (what, bytes) in &bad_cases {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(bytes).unwrap();
        let reply = read_until_closed(&mut stream);
        assert!(
            reply.is_empty(),
            "{what}: server answered {} bytes instead of closing",
            reply.len()
        );
    }
    assert_eq!(
        server
            .server_stats()
            .malformed_headers
            .load(Ordering::Relaxed),
        bad_cases.len()
    );

    // A truncated header followed by a close just ends that connection.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.write_all(&good[..20]).unwrap();
    drop(stream);

    // A well-formed request on a raw socket gets the documented response + payload.
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.write_all(&good).unwrap();
    let mut head = [0u8; HEADER_BYTES];
    stream.read_exact(&mut head).unwrap();
    let header = Header::decode(&head).unwrap();
    assert_eq!(
        (header.kind, header.status, header.request_id, header.length),
        (Kind::ReadResponse, ErrorCode::OK, 1, 16)
    );
    let mut payload = [0u8; 16];
    stream.read_exact(&mut payload).unwrap();
    assert_eq!(&payload[..], &pattern(MIB, 13)[..16]);

    // And engines keep working against this server.
    let client = engine(TransportMode::Tcp, 10_000);
    let local = client.allocate_local_buffer(MIB).unwrap();
    let read = TransferRequest::read(
        local.as_ptr(),
        MIB as u64,
        server.endpoint(),
        segment.id(),
        0,
    );
    assert_eq!(client.transfer_sync(&[read]), vec![Ok(())]);
}

#[test]
fn random_bytes_on_the_tcp_port_never_crash_the_server() {
    use rand::{Rng, SeedableRng};
    let server = engine(TransportMode::Auto, 10_000);
    let segment = server
        .allocate_segment(4096, SegmentOptions::default())
        .unwrap();
    segment.write_at(0, &[1u8; 4096]).unwrap();
    let addr = format!("127.0.0.1:{}", server.endpoint().port());
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    for round in 0..50 {
        let mut bytes = vec![0u8; rng.gen_range(1..200)];
        rng.fill(&mut bytes[..]);
        if round % 2 == 0 {
            // Valid magic/version/kind so the decoder goes deeper.
            bytes.resize(bytes.len().max(HEADER_BYTES), 0);
            bytes[..6].copy_from_slice(b"MCTX\x01\x02");
        }
        let mut stream = TcpStream::connect(&addr).unwrap();
        let _ = stream.write_all(&bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = read_until_closed(&mut stream);
    }
    let mut after = [0u8; 4096];
    segment.read_at(0, &mut after).unwrap();
    assert!(
        after.iter().all(|&b| b == 1),
        "random bytes changed the segment"
    );
    let client = engine(TransportMode::Tcp, 10_000);
    let local = client.allocate_local_buffer(4096).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 4096, server.endpoint(), segment.id(), 0);
    assert_eq!(client.transfer_sync(&[read]), vec![Ok(())]);
}

#[test]
fn dropping_the_engine_fails_pending_entries_promptly() {
    let frozen = PeerProcess::spawn(MIB);
    let client = engine(TransportMode::Tcp, 60_000);
    let local = client.allocate_local_buffer(MIB).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 4096, &frozen.endpoint, frozen.segment_id, 0);
    assert_eq!(
        client.transfer_sync(std::slice::from_ref(&read)),
        vec![Ok(())]
    );
    frozen.freeze();
    let batch = client.submit(&[read.clone(), read]);
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    drop(client);
    let results = batch
        .wait_timeout(Duration::from_secs(5))
        .expect("shutdown left entries pending");
    for result in &results {
        assert_eq!(result, &Err(TransferError::ShuttingDown));
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // `local` (a clone of the handle) outlives the engine: the memory stays mapped.
    local.write_at(0, &[1]).unwrap();
    frozen.signal(libc::SIGCONT);
}

#[test]
fn socket_dirs_of_killed_peers_are_cleaned_by_the_next_engine() {
    let mut victim = PeerProcess::spawn(4096);
    let socket = victim.endpoint.shm_path().unwrap().to_path_buf();
    assert!(socket.exists());
    victim.kill(); // SIGKILL: no cleanup of its own
    assert!(socket.exists(), "the kernel does not remove socket files");
    // Only sockets older than 5 s are considered (a starting engine's socket refuses too).
    let young = engine(TransportMode::Auto, 10_000);
    assert!(
        socket.exists(),
        "a fresh socket file must not be taken for stale"
    );
    drop(young);
    std::thread::sleep(Duration::from_millis(5_200));
    let _next = engine(TransportMode::Auto, 10_000);
    assert!(
        !socket.exists(),
        "stale socket {} left behind",
        socket.display()
    );
    assert!(!socket.parent().unwrap().exists());
}

/// A same-host writer that maps a peer's segment over shared memory refuses a write once the
/// owner process was SIGKILLed: the memfd still takes the bytes, but nobody will serve them and
/// the owner can no longer clear the control word. A read of the intact memory still works.
#[test]
fn a_shm_write_into_a_killed_owners_memory_fails() {
    let mut owner = PeerProcess::spawn(4 * MIB);
    let (endpoint, segment) = (Arc::clone(&owner.endpoint), owner.segment_id);
    let client = engine(TransportMode::Shm, 8_000);
    let local = client.allocate_local_buffer(MIB).unwrap();
    local.write_at(0, &pattern(4096, 3)).unwrap();
    let write = || TransferRequest::write(local.as_ptr(), 4096, &endpoint, segment, 0);
    // Alive: the write maps the segment and succeeds.
    assert_eq!(client.submit(&[write()]).wait(), vec![Ok(())]);
    assert_eq!(client.shm_mapped_segments(), 1);
    owner.kill();
    // The mapping still reads the owner's bytes.
    let into = local.as_ptr().wrapping_add(8192);
    let read = TransferRequest::read(into, 4096, &endpoint, segment, 8192);
    assert_eq!(client.submit(&[read]).wait(), vec![Ok(())]);
    let mut got = vec![0u8; 4096];
    local.read_at(8192, &mut got).unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, b)| *b == peer_pattern_byte(8192 + i)));
    let result = client.submit(&[write()]).wait();
    assert!(
        matches!(result[0], Err(TransferError::ConnectionLost { .. })),
        "write into a dead owner's memory: {result:?}"
    );
    let code = result[0].as_ref().map_err(TransferError::code).unwrap_err();
    assert_eq!(code, ErrorCode::TRANSFER_FAIL);
    // The mapping was dropped; a new handshake finds no owner and fails too.
    assert_eq!(client.shm_mapped_segments(), 0);
    assert!(client.submit(&[write()]).wait()[0].is_err());
}
