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
        for opts in [EncodeOptions::default(), EncodeOptions { zstd_level: None }] {
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
    for opts in [EncodeOptions::default(), EncodeOptions { zstd_level: None }] {
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
        &EncodeOptions { zstd_level: None },
    );
    let bytes = encode_state(&state, &meta(), &EncodeOptions { zstd_level: None });
    // Trailer: chunk count at bytes 4..8 of the last 24.
    let count = |b: &[u8]| {
        let t = &b[b.len() - 24..];
        u32::from_le_bytes([t[4], t[5], t[6], t[7]])
    };
    assert_eq!(count(&one), 4, "segments, policy, discarded, counters");
    assert!(count(&bytes) >= 4 + 2, "{} chunks", count(&bytes));
}
