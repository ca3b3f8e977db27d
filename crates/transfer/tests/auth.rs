//! Data-port access control: an engine started with the cluster's token serves a segment, over
//! TCP and over shared memory, only to a requester that presents the segment's capability (the
//! one the owner's `segment_endpoint` carries). Without it, with another segment's, or with one
//! derived from another token, every read and write is refused with ILLEGAL_CLIENT and neither
//! the segment nor the requester's buffer changes, whether the requester is an engine or a raw
//! socket guessing segment ids. An engine without a token behaves as before.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::pattern;
use mooncake_common::{AuthToken, ErrorCode};
use mooncake_transfer::wire::{Header, Kind, HEADER_BYTES};
use mooncake_transfer::{
    derive_capability, Endpoint, SegmentOptions, TransferConfig, TransferEngine, TransferError,
    TransferRequest, TransportMode,
};

const SECRET: &str = "the cluster's shared secret, 0123";
const SEGMENT_BYTES: usize = 1 << 16;

fn token(text: &str) -> AuthToken {
    AuthToken::from_bytes(text.as_bytes()).unwrap()
}

fn engine(transport: TransportMode, auth_token: Option<AuthToken>) -> TransferEngine {
    TransferEngine::start(TransferConfig {
        transport,
        entry_timeout_ms: 10_000,
        auth_token,
        ..TransferConfig::default()
    })
    .unwrap()
}

/// The owner's endpoint carrying `capability` (as a descriptor from the master would).
fn endpoint_with(
    owner: &TransferEngine,
    capability: Option<mooncake_transfer::Capability>,
) -> Arc<Endpoint> {
    Arc::new(Endpoint::clone(owner.endpoint()).with_capability(capability))
}

fn assert_code(result: &Result<(), TransferError>, code: ErrorCode, what: &str) {
    match result {
        Err(error) => assert_eq!(error.code(), code, "{what}: {error}"),
        Ok(()) => panic!("{what}: accepted"),
    }
}

#[test]
fn tcp_serves_a_segment_only_with_its_capability() {
    let owner = engine(TransportMode::Auto, Some(token(SECRET)));
    let segment = owner
        .allocate_segment(SEGMENT_BYTES, SegmentOptions::default())
        .unwrap();
    let other = owner
        .allocate_segment(SEGMENT_BYTES, SegmentOptions::default())
        .unwrap();
    let before = pattern(SEGMENT_BYTES, 1);
    segment.write_at(0, &before).unwrap();
    let requester = engine(TransportMode::Tcp, None);
    let local = requester.allocate_local_buffer(SEGMENT_BYTES).unwrap();
    let local_before = pattern(SEGMENT_BYTES, 2);
    local.write_at(0, &local_before).unwrap();

    let right = derive_capability(&token(SECRET), owner.endpoint().instance_id(), segment.id());
    let stolen_token = derive_capability(
        &token("another cluster's secret 456789"),
        owner.endpoint().instance_id(),
        segment.id(),
    );
    let other_segment =
        derive_capability(&token(SECRET), owner.endpoint().instance_id(), other.id());
    let cases = [
        (endpoint_with(&owner, None), "no capability"),
        (
            endpoint_with(&owner, Some(stolen_token)),
            "another token's capability",
        ),
        (
            endpoint_with(&owner, Some(other_segment)),
            "another segment's capability",
        ),
    ];
    for (remote, what) in &cases {
        let results = requester.transfer_sync(&[
            TransferRequest::write(local.as_ptr(), 4096, remote, segment.id(), 0),
            TransferRequest::read(local.as_ptr(), 4096, remote, segment.id(), 8192),
        ]);
        for result in &results {
            assert_code(result, ErrorCode::ILLEGAL_CLIENT, what);
        }
    }
    let stats = owner.server_stats();
    assert_eq!(stats.unauthorized_requests.load(Ordering::Relaxed), 6);
    // One refused grant per connection that carried a wrong capability (the pool may use
    // several connections).
    assert!(stats.grants_refused.load(Ordering::Relaxed) >= 2);
    assert_eq!(stats.requests_served.load(Ordering::Relaxed), 0);
    let mut after = vec![0u8; SEGMENT_BYTES];
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before, "a refused write changed the segment");
    local.read_at(0, &mut after).unwrap();
    assert!(
        after == local_before,
        "a refused read changed the requester's buffer"
    );

    // The endpoint the owner mounts the segment with carries the right capability.
    let mounted = Arc::new(Endpoint::parse(&owner.segment_endpoint(segment.id())).unwrap());
    assert_eq!(mounted.capability(), Some(&right));
    let results = requester.transfer_sync(&[
        TransferRequest::write(local.as_ptr(), 4096, &mounted, segment.id(), 0),
        TransferRequest::read(
            local.as_ptr().wrapping_add(8192),
            4096,
            &mounted,
            segment.id(),
            16384,
        ),
    ]);
    assert_eq!(results, vec![Ok(()), Ok(())]);
    segment.read_at(0, &mut after).unwrap();
    assert_eq!(&after[..4096], &local_before[..4096], "the write landed");
    assert_eq!(&after[4096..], &before[4096..]);
    let mut read = vec![0u8; 4096];
    local.read_at(8192, &mut read).unwrap();
    assert_eq!(&read[..], &before[16384..16384 + 4096], "the read arrived");
    // The grant is per segment: the same connections still may not touch the other segment.
    let results = requester.transfer_sync(&[TransferRequest::read(
        local.as_ptr(),
        16,
        &mounted,
        other.id(),
        0,
    )]);
    assert_code(
        &results[0],
        ErrorCode::ILLEGAL_CLIENT,
        "a grant for one segment only",
    );
}

/// A raw socket guessing segment ids, as another user of the host could: every request is
/// answered ILLEGAL_CLIENT (a write's payload swallowed, never stored), a wrong grant is
/// refused, and only the owner's capability opens the segment.
#[test]
fn a_raw_peer_guessing_segment_ids_gets_nothing() {
    let owner = engine(TransportMode::Auto, Some(token(SECRET)));
    let segment = owner
        .allocate_segment(SEGMENT_BYTES, SegmentOptions::default())
        .unwrap();
    let before = pattern(SEGMENT_BYTES, 3);
    segment.write_at(0, &before).unwrap();
    let addr = owner.endpoint().resolve().unwrap()[0];
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let answer = |stream: &mut TcpStream| {
        let mut raw = [0u8; HEADER_BYTES];
        stream.read_exact(&mut raw).unwrap();
        Header::decode(&raw).unwrap()
    };
    for guess in 1..=4u64 {
        let write = Header::request(Kind::WriteRequest, guess, guess, 0, 512);
        stream.write_all(&write.encode()).unwrap();
        stream.write_all(&[0xee; 512]).unwrap();
        let got = answer(&mut stream);
        assert_eq!(
            (got.kind, got.status),
            (Kind::WriteResponse, ErrorCode::ILLEGAL_CLIENT)
        );
        let read = Header::request(Kind::ReadRequest, 100 + guess, guess, 0, 512);
        stream.write_all(&read.encode()).unwrap();
        let got = answer(&mut stream);
        assert_eq!(
            (got.kind, got.status),
            (Kind::ReadResponse, ErrorCode::ILLEGAL_CLIENT)
        );
        assert_eq!(got.payload_bytes(), 0, "no segment byte leaves");
    }
    // A guessed capability is refused, and the segment stays closed on this connection.
    stream
        .write_all(&Header::grant(200, segment.id()).encode())
        .unwrap();
    stream.write_all(&[0x42; 32]).unwrap();
    let got = answer(&mut stream);
    assert_eq!(
        (got.kind, got.status),
        (Kind::GrantResponse, ErrorCode::ILLEGAL_CLIENT)
    );
    stream
        .write_all(&Header::request(Kind::ReadRequest, 201, segment.id(), 0, 64).encode())
        .unwrap();
    assert_eq!(answer(&mut stream).status, ErrorCode::ILLEGAL_CLIENT);
    let mut after = vec![0u8; SEGMENT_BYTES];
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before, "the segment changed");

    // With the owner's capability, the same connection is served.
    let cap = derive_capability(&token(SECRET), owner.endpoint().instance_id(), segment.id());
    stream
        .write_all(&Header::grant(300, segment.id()).encode())
        .unwrap();
    stream.write_all(cap.as_bytes()).unwrap();
    assert_eq!(answer(&mut stream).status, ErrorCode::OK);
    stream
        .write_all(&Header::request(Kind::ReadRequest, 301, segment.id(), 64, 64).encode())
        .unwrap();
    let got = answer(&mut stream);
    assert_eq!(got.status, ErrorCode::OK);
    let mut payload = [0u8; 64];
    stream.read_exact(&mut payload).unwrap();
    assert_eq!(&payload[..], &before[64..128]);
}

/// Sends one shm handshake request on the owner's socket; returns the status (and whether a
/// descriptor came with the answer is not looked at: a refusal carries none by construction).
fn shm_handshake(socket: &std::path::Path, request: &[u8]) -> i32 {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut reply = [0u8; 32];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..4], b"MCSH");
    i32::from_le_bytes([reply[8], reply[9], reply[10], reply[11]])
}

fn shm_request(op: u8, segment_id: u64, capability: Option<&[u8; 32]>) -> Vec<u8> {
    let mut out = b"MCSH".to_vec();
    out.extend_from_slice(&[1, op, 0, 0]);
    out.extend_from_slice(&segment_id.to_le_bytes());
    if let Some(capability) = capability {
        out.extend_from_slice(capability);
    }
    out
}

#[test]
fn shm_hands_out_a_segment_only_with_its_capability() {
    let owner = engine(TransportMode::Auto, Some(token(SECRET)));
    let segment = owner
        .allocate_segment(SEGMENT_BYTES, SegmentOptions::default())
        .unwrap();
    let before = pattern(SEGMENT_BYTES, 4);
    segment.write_at(0, &before).unwrap();
    let socket = owner.endpoint().shm_path().unwrap().to_path_buf();
    let right = derive_capability(&token(SECRET), owner.endpoint().instance_id(), segment.id());
    let wrong = derive_capability(
        &token("another cluster's secret 456789"),
        owner.endpoint().instance_id(),
        segment.id(),
    );
    let illegal = ErrorCode::ILLEGAL_CLIENT.as_i32();
    // On the socket: op 1 (no capability) and op 2 with a wrong one are refused.
    assert_eq!(
        shm_handshake(&socket, &shm_request(1, segment.id(), None)),
        illegal
    );
    assert_eq!(
        shm_handshake(
            &socket,
            &shm_request(2, segment.id(), Some(wrong.as_bytes()))
        ),
        illegal
    );
    assert_eq!(
        shm_handshake(
            &socket,
            &shm_request(2, segment.id() + 1, Some(right.as_bytes()))
        ),
        illegal,
        "another segment id with this capability"
    );

    // Through an engine in shm mode: refused, nothing mapped, nothing touched.
    let requester = engine(TransportMode::Shm, None);
    let local = requester.allocate_local_buffer(SEGMENT_BYTES).unwrap();
    let local_before = pattern(SEGMENT_BYTES, 5);
    local.write_at(0, &local_before).unwrap();
    for (remote, what) in [
        (endpoint_with(&owner, None), "no capability"),
        (endpoint_with(&owner, Some(wrong)), "wrong capability"),
    ] {
        let results = requester.transfer_sync(&[
            TransferRequest::write(local.as_ptr(), 4096, &remote, segment.id(), 0),
            TransferRequest::read(local.as_ptr(), 4096, &remote, segment.id(), 4096),
        ]);
        for result in &results {
            match result {
                Err(TransferError::ShmUnavailable { reason, .. }) => {
                    assert!(reason.contains("capability"), "{what}: {reason}")
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    assert_eq!(requester.shm_mapped_segments(), 0);
    // In auto mode the refused handshake falls back to TCP, which refuses too.
    let auto = engine(TransportMode::Auto, None);
    let auto_local = auto.allocate_local_buffer(4096).unwrap();
    auto_local.write_at(0, &[7u8; 4096]).unwrap();
    let results = auto.transfer_sync(&[TransferRequest::write(
        auto_local.as_ptr(),
        4096,
        &endpoint_with(&owner, None),
        segment.id(),
        0,
    )]);
    assert_code(
        &results[0],
        ErrorCode::ILLEGAL_CLIENT,
        "auto without a capability",
    );
    let mut after = vec![0u8; SEGMENT_BYTES];
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before, "a refused peer changed the segment");
    local.read_at(0, &mut after).unwrap();
    assert!(
        after == local_before,
        "a refused read changed the requester's buffer"
    );

    // With the capability the owner mounts the segment with: mapped, copied.
    let mounted = Arc::new(Endpoint::parse(&owner.segment_endpoint(segment.id())).unwrap());
    let results = requester.transfer_sync(&[TransferRequest::read(
        local.as_ptr(),
        4096,
        &mounted,
        segment.id(),
        4096,
    )]);
    assert_eq!(results, vec![Ok(())]);
    assert_eq!(requester.shm_mapped_segments(), 1);
    let mut read = vec![0u8; 4096];
    local.read_at(0, &mut read).unwrap();
    assert_eq!(&read[..], &before[4096..8192]);
}

/// Without a token nothing changes: no capability is asked for, one presented is ignored, and
/// the mount endpoint carries none.
#[test]
fn an_engine_without_a_token_serves_as_before() {
    let owner = engine(TransportMode::Auto, None);
    let segment = owner
        .allocate_segment(SEGMENT_BYTES, SegmentOptions::default())
        .unwrap();
    segment.write_at(0, &[3u8; 4096]).unwrap();
    assert_eq!(
        owner.segment_endpoint(segment.id()),
        owner.endpoint().to_string(),
        "no capability in the mount endpoint"
    );
    let anything = derive_capability(&token(SECRET), 1, 2);
    for transport in [TransportMode::Tcp, TransportMode::Shm] {
        let requester = engine(transport, None);
        let local = requester.allocate_local_buffer(4096).unwrap();
        for remote in [
            endpoint_with(&owner, None),
            endpoint_with(&owner, Some(anything)),
        ] {
            let results = requester.transfer_sync(&[TransferRequest::read(
                local.as_ptr(),
                4096,
                &remote,
                segment.id(),
                0,
            )]);
            assert_eq!(results, vec![Ok(())], "{transport:?}");
            let mut got = [0u8; 16];
            local.read_at(0, &mut got).unwrap();
            assert_eq!(got, [3u8; 16]);
        }
    }
}
