//! Transfers through each transport (local memcpy, shared memory, TCP) between real engines:
//! sizes from 1 B to 64 MiB at unaligned offsets, content verified byte for byte, batches of
//! 1,000 mixed entries, bounds and registration checks, fallback, async waiting.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{engine, pattern};
use mooncake_common::ErrorCode;
use mooncake_transfer::{
    Endpoint, EntryStatus, MemoryHandle, SegmentOptions, TransferError, TransferRequest,
    TransportMode,
};
use rand::{Rng, SeedableRng};

const MIB: usize = 1 << 20;
const SIZES: [usize; 9] = [
    1,
    7,
    4095,
    4096 + 3,
    65_537,
    MIB + 13,
    4 * MIB - 1,
    16 * MIB + 5,
    64 * MIB,
];
const REMOTE_OFFSET: usize = 4099; // unaligned
const LOCAL_OFFSET: usize = 13; // unaligned
const GUARD: usize = 64; // bytes checked untouched around every target range

#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    Local,
    Shm,
    Tcp,
}

/// Writes then reads back every size, checking the target range and the bytes around it.
fn round_trip_all_sizes(via: Via) {
    let server = engine(TransportMode::Auto, 60_000);
    let segment = server
        .allocate_segment(
            64 * MIB + 2 * REMOTE_OFFSET + GUARD,
            SegmentOptions::default(),
        )
        .unwrap();
    let client_mode = match via {
        Via::Shm => TransportMode::Shm,
        _ => TransportMode::Tcp,
    };
    let client_engine = engine(client_mode, 60_000);
    let client = if via == Via::Local {
        &server
    } else {
        &client_engine
    };
    let local = client
        .allocate_local_buffer(64 * MIB + 2 * LOCAL_OFFSET + GUARD)
        .unwrap();
    let remote: Arc<Endpoint> = Arc::clone(server.endpoint());

    for (i, &size) in SIZES.iter().enumerate() {
        let data = pattern(size, i as u64);
        // Reset both sides to a known background.
        let background = vec![0xAAu8; segment.len_bytes()];
        segment.write_at(0, &background).unwrap();
        local.write_at(0, &vec![0x55u8; local.len_bytes()]).unwrap();
        local.write_at(LOCAL_OFFSET, &data).unwrap();

        let write = TransferRequest::write(
            local.as_ptr().wrapping_add(LOCAL_OFFSET),
            size as u64,
            &remote,
            segment.id(),
            REMOTE_OFFSET as u64,
        );
        let batch = client.submit(&[write.with_checksum()]);
        assert_eq!(batch.wait(), vec![Ok(())], "{via:?} write of {size} bytes");
        // Chunked entries combine their pieces' checksums into the whole value's CRC32C.
        let expected = crc32c::crc32c(&data);
        assert_eq!(batch.checksum(0), Some(expected), "{via:?} write checksum");
        let mut got = vec![0u8; size + 2 * GUARD];
        segment.read_at(REMOTE_OFFSET - GUARD, &mut got).unwrap();
        assert!(
            got[..GUARD].iter().all(|&b| b == 0xAA),
            "{via:?} {size}: bytes before target changed"
        );
        assert!(
            got[GUARD..GUARD + size] == data[..],
            "{via:?} {size}: written content differs"
        );
        assert!(
            got[GUARD + size..].iter().all(|&b| b == 0xAA),
            "{via:?} {size}: bytes after target changed"
        );

        // Read it back into a cleared local range.
        local.write_at(0, &vec![0x55u8; local.len_bytes()]).unwrap();
        let read = TransferRequest::read(
            local.as_ptr().wrapping_add(LOCAL_OFFSET),
            size as u64,
            &remote,
            segment.id(),
            REMOTE_OFFSET as u64,
        );
        let batch = client.submit(&[read.with_checksum()]);
        assert_eq!(batch.wait(), vec![Ok(())], "{via:?} read of {size} bytes");
        assert_eq!(batch.checksum(0), Some(expected), "{via:?} read checksum");
        let mut back = vec![0u8; size + LOCAL_OFFSET + GUARD];
        local.read_at(0, &mut back).unwrap();
        assert!(
            back[..LOCAL_OFFSET].iter().all(|&b| b == 0x55),
            "{via:?} {size}: local bytes before changed"
        );
        assert!(
            back[LOCAL_OFFSET..LOCAL_OFFSET + size] == data[..],
            "{via:?} {size}: read content differs"
        );
        assert!(
            back[LOCAL_OFFSET + size..].iter().all(|&b| b == 0x55),
            "{via:?} {size}: local bytes after changed"
        );
    }

    // The bytes really went the intended way.
    let served = server
        .server_stats()
        .requests_served
        .load(Ordering::Relaxed);
    match via {
        Via::Tcp => {
            assert!(
                served >= 2 * SIZES.len(),
                "TCP served only {served} requests"
            );
            assert_eq!(client.shm_mapped_segments(), 0);
        }
        Via::Shm => {
            assert_eq!(
                served, 0,
                "shared-memory transfers must not touch the TCP server"
            );
            assert_eq!(client.shm_mapped_segments(), 1);
        }
        Via::Local => {
            assert_eq!(served, 0, "local transfers must not touch the TCP server");
            assert_eq!(client.shm_mapped_segments(), 0);
        }
    }
}

#[test]
fn tcp_reads_and_writes_1b_to_64mib_at_unaligned_offsets() {
    round_trip_all_sizes(Via::Tcp);
}

#[test]
fn shm_reads_and_writes_1b_to_64mib_at_unaligned_offsets() {
    round_trip_all_sizes(Via::Shm);
}

#[test]
fn local_memcpy_reads_and_writes_1b_to_64mib_at_unaligned_offsets() {
    round_trip_all_sizes(Via::Local);
}

/// 1,000 entries: half reads of pre-filled ranges, half writes to disjoint ranges, random sizes
/// (1 B .. 256 KiB) and unaligned offsets, all in one batch.
fn mixed_batch(mode: TransportMode) {
    let server = engine(TransportMode::Auto, 60_000);
    let client = engine(mode, 60_000);
    let slot = 256 * 1024 + 64;
    let entries = 1000;
    let segment = server
        .allocate_segment(slot * entries, SegmentOptions::default())
        .unwrap();
    let local = client.allocate_local_buffer(slot * entries).unwrap();
    let seg_data = pattern(segment.len_bytes(), 1);
    let local_data = pattern(local.len_bytes(), 2);
    segment.write_at(0, &seg_data).unwrap();
    local.write_at(0, &local_data).unwrap();
    let remote = Arc::clone(server.endpoint());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut plan = Vec::new();
    let requests: Vec<TransferRequest> = (0..entries)
        .map(|i| {
            let len = rng.gen_range(1..=256 * 1024);
            let remote_off = i * slot + rng.gen_range(0..64);
            let local_off = i * slot + rng.gen_range(0..64);
            let is_read = i % 2 == 0;
            plan.push((is_read, len, remote_off, local_off));
            let local_ptr = local.as_ptr().wrapping_add(local_off);
            if is_read {
                TransferRequest::read(
                    local_ptr,
                    len as u64,
                    &remote,
                    segment.id(),
                    remote_off as u64,
                )
            } else {
                TransferRequest::write(
                    local_ptr,
                    len as u64,
                    &remote,
                    segment.id(),
                    remote_off as u64,
                )
            }
        })
        .collect();
    let batch = client.submit(&requests);
    assert_eq!(batch.len(), entries);
    let results = batch.wait();
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result, &Ok(()), "entry {i} ({:?})", plan[i]);
        assert_eq!(batch.status(i), Some(EntryStatus::Completed));
    }
    for (i, &(is_read, len, remote_off, local_off)) in plan.iter().enumerate() {
        let mut got = vec![0u8; len];
        if is_read {
            local.read_at(local_off, &mut got).unwrap();
            assert!(
                got[..] == seg_data[remote_off..remote_off + len],
                "read entry {i} differs"
            );
        } else {
            segment.read_at(remote_off, &mut got).unwrap();
            assert!(
                got[..] == local_data[local_off..local_off + len],
                "write entry {i} differs"
            );
        }
    }
}

#[test]
fn batch_of_1000_mixed_entries_over_tcp() {
    mixed_batch(TransportMode::Tcp);
}

#[test]
fn batch_of_1000_mixed_entries_over_shm() {
    mixed_batch(TransportMode::Shm);
}

fn assert_rejected(result: &Result<(), TransferError>, code: ErrorCode, what: &str) {
    match result {
        Err(err) => assert_eq!(err.code(), code, "{what}: {err}"),
        Ok(()) => panic!("{what}: accepted"),
    }
}

#[test]
fn server_rejects_out_of_bounds_and_unregistered_ranges_leaving_memory_untouched() {
    let server = engine(TransportMode::Auto, 10_000);
    let client = engine(TransportMode::Tcp, 10_000);
    let segment = server
        .allocate_segment(1 << 16, SegmentOptions::default())
        .unwrap();
    let private = server.allocate_local_buffer(1 << 16).unwrap(); // not remote-accessible
    let before = pattern(segment.len_bytes(), 3);
    segment.write_at(0, &before).unwrap();
    private.write_at(0, &before).unwrap();
    let local = client.allocate_local_buffer(1 << 17).unwrap();
    local.write_at(0, &pattern(1 << 17, 4)).unwrap();
    let remote = Arc::clone(server.endpoint());
    let size = segment.len_bytes() as u64;
    let ptr = local.as_ptr();
    let cases = [
        (
            TransferRequest::write(ptr, 16, &remote, segment.id(), size),
            ErrorCode::INVALID_PARAMS,
            "write at end",
        ),
        (
            TransferRequest::write(ptr, 2, &remote, segment.id(), size - 1),
            ErrorCode::INVALID_PARAMS,
            "write across end",
        ),
        (
            TransferRequest::write(ptr, size + 1, &remote, segment.id(), 0),
            ErrorCode::INVALID_PARAMS,
            "write larger than segment",
        ),
        (
            TransferRequest::read(ptr, 16, &remote, segment.id(), size + 100),
            ErrorCode::INVALID_PARAMS,
            "read past end",
        ),
        (
            TransferRequest::write(ptr, 16, &remote, 999_999, 0),
            ErrorCode::SEGMENT_NOT_FOUND,
            "write to unknown segment",
        ),
        (
            TransferRequest::write(ptr, 16, &remote, private.id(), 0),
            ErrorCode::SEGMENT_NOT_FOUND,
            "write to a local buffer",
        ),
        (
            TransferRequest::read(ptr, 16, &remote, private.id(), 0),
            ErrorCode::SEGMENT_NOT_FOUND,
            "read of a local buffer",
        ),
    ];
    let requests: Vec<TransferRequest> = cases.iter().map(|(r, _, _)| r.clone()).collect();
    let results = client.transfer_sync(&requests);
    for ((_, code, what), result) in cases.iter().zip(&results) {
        assert_rejected(result, *code, what);
        assert!(
            matches!(result, Err(TransferError::Rejected { .. })),
            "{what}: must be the server's verdict, got {result:?}"
        );
    }
    assert_eq!(
        server
            .server_stats()
            .requests_rejected
            .load(Ordering::Relaxed),
        cases.len()
    );
    let mut after = vec![0u8; before.len()];
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before, "segment changed by rejected writes");
    private.read_at(0, &mut after).unwrap();
    assert!(after == before, "private buffer changed");

    // The connection survived the rejections: a valid write on the same pool works.
    let ok = TransferRequest::write(ptr, 100, &remote, segment.id(), 10);
    assert_eq!(client.transfer_sync(&[ok]), vec![Ok(())]);

    // Local side: an unregistered local range is refused before anything is sent.
    let mut stray = vec![0u8; 64];
    let bad_local = TransferRequest::read(stray.as_mut_ptr(), 64, &remote, segment.id(), 0);
    let past_local = TransferRequest::read(
        ptr.wrapping_add((1 << 17) - 8),
        64,
        &remote,
        segment.id(),
        0,
    );
    let results = client.transfer_sync(&[bad_local, past_local]);
    for result in &results {
        assert!(
            matches!(result, Err(TransferError::LocalRangeNotRegistered { .. })),
            "{result:?}"
        );
    }
    assert!(stray.iter().all(|&b| b == 0));
}

#[test]
fn shm_bounds_are_checked_and_unregistered_segments_refused() {
    let server = engine(TransportMode::Auto, 10_000);
    let client = engine(TransportMode::Shm, 10_000);
    let segment = server
        .allocate_segment(8192, SegmentOptions::default())
        .unwrap();
    let before = pattern(8192, 5);
    segment.write_at(0, &before).unwrap();
    let local = client.allocate_local_buffer(16384).unwrap();
    let remote = Arc::clone(server.endpoint());
    let ok = TransferRequest::read(local.as_ptr(), 10, &remote, segment.id(), 0);
    let past = TransferRequest::write(local.as_ptr(), 10, &remote, segment.id(), 8190);
    let results = client.transfer_sync(&[ok, past.clone()]);
    assert_eq!(results[0], Ok(()));
    assert!(
        matches!(results[1], Err(TransferError::OutOfBounds { .. })),
        "{:?}",
        results[1]
    );
    let mut after = vec![0u8; 8192];
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before);

    // After the owner unregisters, a peer holding a mapping is refused (control word).
    server.unregister(segment.id()).unwrap();
    let again = TransferRequest::write(local.as_ptr(), 10, &remote, segment.id(), 0);
    let results = client.transfer_sync(&[again]);
    assert!(
        matches!(results[0], Err(TransferError::SegmentNotFound { .. })),
        "{:?}",
        results[0]
    );
    segment.read_at(0, &mut after).unwrap();
    assert!(after == before, "revoked segment was written");
}

#[test]
fn shm_maps_only_shareable_segments_and_auto_falls_back_to_tcp() {
    let server = engine(TransportMode::Auto, 10_000);
    let private = server
        .allocate_segment(
            4096,
            SegmentOptions {
                shareable: false,
                ..SegmentOptions::default()
            },
        )
        .unwrap();
    private.write_at(0, &[9u8; 4096]).unwrap();
    let remote = Arc::clone(server.endpoint());

    let shm_only = engine(TransportMode::Shm, 10_000);
    let local = shm_only.allocate_local_buffer(4096).unwrap();
    let results = shm_only.transfer_sync(&[TransferRequest::read(
        local.as_ptr(),
        16,
        &remote,
        private.id(),
        0,
    )]);
    assert!(
        matches!(results[0], Err(TransferError::ShmUnavailable { .. })),
        "{:?}",
        results[0]
    );
    assert_eq!(shm_only.shm_mapped_segments(), 0);

    let auto = engine(TransportMode::Auto, 10_000);
    let local = auto.allocate_local_buffer(4096).unwrap();
    let results = auto.transfer_sync(&[TransferRequest::read(
        local.as_ptr(),
        16,
        &remote,
        private.id(),
        0,
    )]);
    assert_eq!(results[0], Ok(()), "auto must fall back to TCP");
    let mut got = [0u8; 16];
    local.read_at(0, &mut got).unwrap();
    assert_eq!(got, [9u8; 16]);
    assert_eq!(auto.shm_mapped_segments(), 0);
    assert!(
        server
            .server_stats()
            .requests_served
            .load(Ordering::Relaxed)
            >= 1
    );

    // A broken handshake (no socket at the advertised path) also falls back to TCP.
    let shared = server
        .allocate_segment(4096, SegmentOptions::default())
        .unwrap();
    shared.write_at(0, &[4u8; 4096]).unwrap();
    let bogus = Arc::new(
        Endpoint::new(
            remote.host(),
            remote.port(),
            remote.instance_id(),
            remote.host_id().map(String::from),
            Some("/nonexistent/mooncake/transfer.sock".into()),
        )
        .unwrap(),
    );
    let results = auto.transfer_sync(&[TransferRequest::read(
        local.as_ptr(),
        16,
        &bogus,
        shared.id(),
        0,
    )]);
    assert_eq!(results[0], Ok(()));
    local.read_at(0, &mut got).unwrap();
    assert_eq!(got, [4u8; 16]);
}

#[test]
fn shm_socket_file_has_the_configured_mode() {
    use std::os::unix::fs::PermissionsExt;
    let server = engine(TransportMode::Auto, 10_000);
    let path = server.endpoint().shm_path().unwrap().to_path_buf();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    drop(server);
    assert!(!path.exists(), "socket file removed at shutdown");
}

#[test]
fn zero_length_entries_succeed_and_statuses_can_be_polled() {
    let server = engine(TransportMode::Auto, 10_000);
    let client = engine(TransportMode::Tcp, 10_000);
    let segment = server
        .allocate_segment(1 << 20, SegmentOptions::default())
        .unwrap();
    let local = client.allocate_local_buffer(1 << 20).unwrap();
    let remote = Arc::clone(server.endpoint());
    let requests = [
        TransferRequest::read(std::ptr::null_mut(), 0, &remote, segment.id(), 0),
        TransferRequest::write(local.as_ptr(), 1 << 20, &remote, segment.id(), 0),
    ];
    let batch = client.submit(&requests);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !batch.is_done() {
        assert!(std::time::Instant::now() < deadline, "batch never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(batch.status(0), Some(EntryStatus::Completed));
    assert_eq!(batch.status(1), Some(EntryStatus::Completed));
    assert_eq!(batch.status(2), None);
    // No checksum unless asked for; none for a zero-length entry even when asked for.
    assert_eq!(batch.checksum(1), None);
    let zero = TransferRequest::read(std::ptr::null_mut(), 0, &remote, segment.id(), 0);
    let batch = client.submit(&[zero.with_checksum()]);
    assert_eq!(batch.wait(), vec![Ok(())]);
    assert_eq!(batch.checksum(0), None);
    // A failed entry has no checksum.
    let past_end = TransferRequest::read(local.as_ptr(), 16, &remote, segment.id(), 1 << 20);
    let batch = client.submit(&[past_end.with_checksum()]);
    assert!(batch.wait()[0].is_err());
    assert_eq!(batch.checksum(0), None);
}

#[test]
fn wait_async_resolves_on_a_current_thread_runtime() {
    let server = engine(TransportMode::Auto, 10_000);
    let client = engine(TransportMode::Tcp, 10_000);
    let segment = server
        .allocate_segment(4 << 20, SegmentOptions::default())
        .unwrap();
    segment.write_at(0, &pattern(4 << 20, 6)).unwrap();
    let local: MemoryHandle = client.allocate_local_buffer(4 << 20).unwrap();
    let remote = Arc::clone(server.endpoint());
    let batch = client.submit(&[TransferRequest::read(
        local.as_ptr(),
        4 << 20,
        &remote,
        segment.id(),
        0,
    )]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let results = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), batch.wait_async())
            .await
            .unwrap()
    });
    assert_eq!(results, vec![Ok(())]);
    let mut got = vec![0u8; 4 << 20];
    local.read_at(0, &mut got).unwrap();
    assert!(got == pattern(4 << 20, 6));
}

#[test]
fn oversized_batches_and_bad_configs_are_refused() {
    use mooncake_transfer::{TransferConfig, TransferEngine};
    let bad = TransferEngine::start(TransferConfig {
        pipeline_depth: 0,
        ..TransferConfig::default()
    });
    assert!(
        matches!(bad, Err(TransferError::InvalidParams(_))),
        "{bad:?}"
    );

    let server = engine(TransportMode::Auto, 10_000);
    let segment = server
        .allocate_segment(4096, SegmentOptions::default())
        .unwrap();
    let client = TransferEngine::start(TransferConfig {
        max_batch_entries: 4,
        transport: TransportMode::Tcp,
        ..TransferConfig::default()
    })
    .unwrap();
    let local = client.allocate_local_buffer(4096).unwrap();
    let read = TransferRequest::read(local.as_ptr(), 16, server.endpoint(), segment.id(), 0);
    let results = client.transfer_sync(&vec![read.clone(); 5]);
    assert_eq!(results.len(), 5);
    for result in &results {
        assert_eq!(
            result.as_ref().unwrap_err().code(),
            ErrorCode::INVALID_PARAMS
        );
    }
    assert_eq!(client.transfer_sync(&vec![read; 4]), vec![Ok(()); 4]);
}

#[test]
fn forget_peer_drops_its_pool_and_mappings() {
    let server = engine(TransportMode::Auto, 10_000);
    let segment = server
        .allocate_segment(4096, SegmentOptions::default())
        .unwrap();
    let client = engine(TransportMode::Auto, 10_000);
    let local = client.allocate_local_buffer(4096).unwrap();
    let remote = Arc::clone(server.endpoint());
    let read = TransferRequest::read(local.as_ptr(), 16, &remote, segment.id(), 0);
    assert_eq!(
        client.transfer_sync(std::slice::from_ref(&read)),
        vec![Ok(())]
    );
    assert_eq!(client.shm_mapped_segments(), 1);
    client.forget_peer(&remote);
    assert_eq!(client.shm_mapped_segments(), 0);
    assert_eq!(client.pooled_connections(&remote), 0);
    // Still reachable afterwards (maps again).
    assert_eq!(client.transfer_sync(&[read]), vec![Ok(())]);
    assert_eq!(client.shm_mapped_segments(), 1);
}

#[test]
fn idle_connections_close_and_the_pool_reopens_on_demand() {
    use mooncake_transfer::{TransferConfig, TransferEngine};
    let server = engine(TransportMode::Auto, 10_000);
    let segment = server
        .allocate_segment(4096, SegmentOptions::default())
        .unwrap();
    let client = TransferEngine::start(TransferConfig {
        transport: TransportMode::Tcp,
        idle_connection_ms: 300,
        ..TransferConfig::default()
    })
    .unwrap();
    let local = client.allocate_local_buffer(4096).unwrap();
    let remote = Arc::clone(server.endpoint());
    let read = TransferRequest::read(local.as_ptr(), 16, &remote, segment.id(), 0);
    for round in 0..3 {
        assert_eq!(
            client.transfer_sync(std::slice::from_ref(&read)),
            vec![Ok(())],
            "round {round}"
        );
        assert!(client.pooled_connections(&remote) >= 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while client.pooled_connections(&remote) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "idle connection never closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
