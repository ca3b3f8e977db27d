//! The byte format: round trip of random states, a fixed example checked byte for byte, and
//! every single-byte flip and every truncation of a small snapshot refused.
#![allow(clippy::unwrap_used)]

use mooncake_common::{
    ClientId, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, ReplicaId, ReplicaStatus,
    Segment, SegmentId, SegmentStatus, SoftPinAction, TenantId,
};
use mooncake_master::mutation::{
    BufferRecord, DiscardedRecord, PendingSoftPinRecord, ReplicaPlace, ReplicaRecord,
    ReplicationKind, ReplicationRecord, SegmentRecord,
};
use mooncake_master::{MasterState, ObjectRecord, TenantPolicy};
use mooncake_snapshot::{decode, encode_state, EncodeOptions, SnapshotError, SnapshotMeta};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
    fn any_u64(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(200),
            1 => u64::MAX - self.below(3),
            _ => self.next(),
        }
    }
    fn text(&mut self, max: u64) -> String {
        let n = self.below(max + 1);
        (0..n)
            .map(|_| ['a', 'z', '0', '-', 'é', '字', '/'][self.below(7) as usize])
            .collect()
    }
}

fn uuid(r: &mut Rng) -> (u64, u64) {
    (r.below(4), r.any_u64())
}

fn place(r: &mut Rng) -> ReplicaPlace {
    let (a, b) = uuid(r);
    let buffer = BufferRecord {
        segment: SegmentId::new(a, b),
        offset: r.any_u64(),
        len: r.any_u64(),
    };
    match r.below(5) {
        0 => ReplicaPlace::Memory(buffer),
        1 => ReplicaPlace::NoF(buffer),
        2 => ReplicaPlace::Disk(DiskDescriptor {
            file_path: r.text(20),
            object_size: r.any_u64(),
        }),
        3 => ReplicaPlace::LocalDisk(LocalDiskDescriptor {
            client_id: ClientId::new(a, b),
            object_size: r.any_u64(),
            transport_endpoint: r.text(10),
        }),
        _ => ReplicaPlace::Dfs(DfsDescriptor {
            file_path: r.text(20),
            offset: r.any_u64(),
            object_size: r.any_u64(),
            aligned_size: r.any_u64(),
            shard_idx: r.next() as u32,
        }),
    }
}

fn object(r: &mut Rng, i: usize) -> ObjectRecord {
    let tenants = [None, Some("t1"), Some("team-b"), Some("default")];
    let tenant = tenants[r.below(4) as usize].map(|t| TenantId::new(t).unwrap());
    let statuses = ReplicaStatus::VALUES;
    let replicas = (0..1 + r.below(3))
        .map(|_| ReplicaRecord {
            id: ReplicaId(r.any_u64()),
            status: statuses[r.below(statuses.len() as u64) as usize],
            refcnt: r.next() as u32 % 4,
            place: place(r),
        })
        .collect();
    let (a, b) = uuid(r);
    ObjectRecord {
        tenant,
        key: format!("{}-{i}", r.text(12)),
        size: r.any_u64(),
        checksum: r.coin().then(|| r.next()),
        data_type: r.next() as u8,
        group: r.coin().then(|| r.text(6)),
        writer: ClientId::new(a, b),
        put_start_ms: r.any_u64(),
        processing: r.coin(),
        hard_pin: r.coin(),
        soft_pin_deadline_ms: if r.coin() { 0 } else { 1 + r.below(1 << 40) },
        pending_soft_pin: r.coin().then(|| PendingSoftPinRecord {
            action: SoftPinAction::VALUES[r.below(3) as usize],
            ttl_ms: r.any_u64(),
        }),
        replicas,
        task: r.coin().then(|| ReplicationRecord {
            client: ClientId::new(b, a),
            start_ms: r.any_u64(),
            kind: if r.coin() {
                ReplicationKind::Copy
            } else {
                ReplicationKind::Move
            },
            source: ReplicaId(r.any_u64()),
            targets: (0..r.below(3)).map(|_| ReplicaId(r.next())).collect(),
        }),
    }
}

fn random_state(seed: u64, objects: usize) -> MasterState {
    let mut r = Rng(seed | 1);
    let segments = (0..r.below(5))
        .map(|i| SegmentRecord {
            segment: Segment {
                id: SegmentId::new(i, r.next()),
                name: r.text(8),
                base: r.any_u64(),
                size: r.any_u64(),
                te_endpoint: r.text(12),
                protocol: "tcp".into(),
                host_id: r.text(4),
            },
            client: ClientId::new(r.next(), r.next()),
            status: SegmentStatus::VALUES[r.below(6) as usize],
            graceful_deadline_ms: r.coin().then(|| r.any_u64()),
        })
        .collect();
    let mut objects: Vec<ObjectRecord> = (0..objects).map(|i| object(&mut r, i)).collect();
    objects.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
    let discarded = (0..r.below(4))
        .map(|_| DiscardedRecord {
            release_at_ms: r.any_u64(),
            buffers: (0..1 + r.below(3))
                .map(|_| BufferRecord {
                    segment: SegmentId::new(r.below(3), r.next()),
                    offset: r.any_u64(),
                    len: r.any_u64(),
                })
                .collect(),
        })
        .collect();
    let mut tenant_policy = TenantPolicy::default();
    for t in ["default", "t1", "team-b"] {
        if r.coin() {
            tenant_policy
                .tenants
                .insert(TenantId::new(t).unwrap(), r.any_u64());
        }
    }
    MasterState {
        segments,
        objects,
        discarded,
        tenant_policy,
        next_replica_id: r.any_u64(),
    }
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        id: 1_700_000_000_123,
        created_ms: 1_700_000_000_120,
        oplog_position: 42,
        master_version: "0.1.0".into(),
    }
}

#[test]
fn random_states_round_trip_exactly() {
    for seed in 0..60u64 {
        let state = random_state(seed * 7919 + 1, (seed as usize * 37) % 400);
        for opts in [EncodeOptions::default(), EncodeOptions::uncompressed()] {
            let bytes = encode_state(&state, &meta(), &opts);
            let (m, back) = decode(&bytes).unwrap();
            assert_eq!(m, meta());
            assert_eq!(back, state, "seed {seed}");
        }
    }
}

#[test]
fn many_objects_span_several_chunks_and_round_trip() {
    let state = random_state(99, 20_000);
    let bytes = encode_state(&state, &meta(), &EncodeOptions::default());
    assert_eq!(decode(&bytes).unwrap().1, state);
}

fn small_state() -> MasterState {
    random_state(5, 3)
}

fn is_rejection(e: &SnapshotError) -> bool {
    matches!(
        e,
        SnapshotError::Corrupt { .. } | SnapshotError::Truncated { .. }
    )
}

#[test]
fn every_single_byte_flip_is_refused() {
    for opts in [EncodeOptions::default(), EncodeOptions::uncompressed()] {
        let bytes = encode_state(&small_state(), &meta(), &opts);
        assert!(decode(&bytes).is_ok());
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[i] ^= flip;
                match decode(&bad) {
                    Ok(_) => panic!("flip {flip:#x} at byte {i} of {} accepted", bytes.len()),
                    Err(e) => assert!(is_rejection(&e), "byte {i}: {e}"),
                }
            }
        }
    }
}

#[test]
fn every_truncation_and_any_appended_byte_is_refused() {
    let bytes = encode_state(&small_state(), &meta(), &EncodeOptions::default());
    for len in 0..bytes.len() {
        match decode(&bytes[..len]) {
            Ok(_) => panic!("truncation to {len} of {} accepted", bytes.len()),
            Err(e) => assert!(
                matches!(e, SnapshotError::Truncated { .. }),
                "truncation to {len}: {e}"
            ),
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        decode(&longer),
        Err(SnapshotError::Corrupt { .. })
    ));
}

#[test]
fn a_newer_format_version_is_reported_as_such() {
    let mut bytes = encode_state(&small_state(), &meta(), &EncodeOptions::default());
    bytes[8] = 2;
    let header_len = usize::from(u16::from_le_bytes([bytes[10], bytes[11]]));
    let crc = crc32c::crc32c(&bytes[..header_len - 4]);
    bytes[header_len - 4..header_len].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        decode(&bytes),
        Err(SnapshotError::UnsupportedVersion(2))
    ));
}

#[test]
fn a_large_state_is_split_into_several_chunks() {
    let state = random_state(99, 20_000);
    let one = encode_state(
        &random_state(99, 0),
        &meta(),
        &EncodeOptions::uncompressed(),
    );
    let bytes = encode_state(&state, &meta(), &EncodeOptions::uncompressed());
    // Trailer: chunk count at bytes 4..8 of the last 24.
    let count = |b: &[u8]| {
        let t = &b[b.len() - 24..];
        u32::from_le_bytes([t[4], t[5], t[6], t[7]])
    };
    assert_eq!(count(&one), 4, "segments, policy, discarded, counters");
    assert!(count(&bytes) >= 4 + 2, "{} chunks", count(&bytes));
}

/// The chunks of a snapshot file: (kind, byte offset of the chunk header, stored length).
fn chunks_of(bytes: &[u8]) -> Vec<(u8, usize, usize)> {
    let mut pos = usize::from(u16::from_le_bytes([bytes[10], bytes[11]]));
    let mut out = Vec::new();
    while bytes[pos] != 0 {
        let h = &bytes[pos..pos + 20];
        let stored = u32::from_le_bytes([h[12], h[13], h[14], h[15]]) as usize;
        out.push((h[0], pos, stored));
        pos += 20 + stored;
    }
    out
}

/// Adds `delta` to the record count of the chunk at `at`, then makes every CRC and the trailer
/// agree again: only the payload parser can tell.
fn recount(bytes: &mut [u8], at: usize, delta: i64) {
    let count = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
    let count = (i64::from(count) + delta) as u32;
    bytes[at + 4..at + 8].copy_from_slice(&count.to_le_bytes());
    let mut crcs = 0u32;
    let mut objects = 0u64;
    for (kind, pos, stored) in chunks_of(bytes) {
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&bytes[pos..pos + 16]),
            &bytes[pos + 20..pos + 20 + stored],
        );
        bytes[pos + 16..pos + 20].copy_from_slice(&crc.to_le_bytes());
        crcs = crc32c::crc32c_append(crcs, &crc.to_le_bytes());
        if kind == 3 {
            let h = &bytes[pos..pos + 8];
            objects += u64::from(u32::from_le_bytes([h[4], h[5], h[6], h[7]]));
        }
    }
    let t = bytes.len() - 24;
    bytes[t + 8..t + 16].copy_from_slice(&objects.to_le_bytes());
    bytes[t + 16..t + 20].copy_from_slice(&crcs.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[t..t + 20]);
    bytes[t + 20..t + 24].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn a_large_state_goes_through_the_compression_and_decoding_threads_unchanged() {
    let state = random_state(4242, 40_000);
    for opts in [EncodeOptions::default(), EncodeOptions::uncompressed()] {
        let bytes = encode_state(&state, &meta(), &opts);
        let objects: Vec<_> = chunks_of(&bytes).into_iter().filter(|c| c.0 == 3).collect();
        // Enough to be split between two decoding threads (1 MiB stored, several chunks).
        assert!(objects.len() >= 3, "{} object chunks", objects.len());
        assert!(objects.iter().map(|c| c.2).sum::<usize>() >= 1 << 20);
        assert_eq!(decode(&bytes).unwrap().1, state);
    }
}

#[test]
fn the_first_bad_object_chunk_in_file_order_is_reported_whichever_thread_reads_it() {
    let state = random_state(77, 40_000);
    let good = encode_state(&state, &meta(), &EncodeOptions::uncompressed());
    let objects: Vec<usize> = chunks_of(&good)
        .into_iter()
        .filter(|c| c.0 == 3)
        .map(|c| c.1)
        .collect();
    let (first, last) = (objects[0], objects[objects.len() - 1]);
    let reason = |bytes: &[u8]| match decode(bytes) {
        Err(SnapshotError::Corrupt { reason }) => reason,
        other => panic!("not refused as corrupt: {:?}", other.map(|_| ())),
    };
    // One record too few in the last chunk (parsed by the second thread): bytes left over.
    let mut late = good.clone();
    recount(&mut late, last, -1);
    let late_reason = reason(&late);
    assert!(late_reason.contains("left over"), "{late_reason}");
    // Also one record too many in the first chunk: that one, earlier in the file, is reported.
    let mut both = late.clone();
    recount(&mut both, first, 1);
    let both_reason = reason(&both);
    assert!(both_reason.contains("more bytes"), "{both_reason}");
    assert!(!both_reason.contains("left over"), "{both_reason}");
}

#[test]
fn a_key_written_twice_by_a_live_take_keeps_the_record_written_last() {
    // An object moved to its group's shard while a take ran: the take met it in its old shard
    // (no group) and again in the new one (grouped). Another key appears once.
    let mut state = random_state(3, 3);
    let mut old = state.objects[0].clone();
    old.group = None;
    let mut moved = old.clone();
    moved.group = Some("g".into());
    moved.size = old.size.wrapping_add(1);
    let other = state.objects[1].clone();
    state.objects = vec![old.clone(), other.clone(), moved.clone()];
    let bytes = encode_state(&state, &meta(), &EncodeOptions::uncompressed());
    assert_eq!(
        decode(&bytes).unwrap().1.objects,
        vec![other.clone(), moved]
    );
    // The other way round (moved out of its group): the ungrouped copy came last and wins.
    let mut grouped = old.clone();
    grouped.group = Some("g".into());
    state.objects = vec![grouped, other.clone(), old.clone()];
    let bytes = encode_state(&state, &meta(), &EncodeOptions::uncompressed());
    assert_eq!(decode(&bytes).unwrap().1.objects, vec![other, old]);
}
