//! A fixed example: a small hand-built state whose uncompressed snapshot is checked byte for
//! byte against the layout in docs/snapshot.md (written out field by field below), and whose
//! bytes decode back to the state.
#![allow(clippy::unwrap_used)]

use mooncake_common::TenantId;
use mooncake_common::{ClientId, ReplicaId, ReplicaStatus, Segment, SegmentId, SegmentStatus};
use mooncake_master::mutation::{
    BufferRecord, DiscardedRecord, ReplicaPlace, ReplicaRecord, SegmentRecord,
};
use mooncake_master::{MasterState, ObjectRecord, TenantPolicy};
use mooncake_snapshot::{decode, encode_state, EncodeOptions, SnapshotMeta};

fn state() -> MasterState {
    let mut tenant_policy = TenantPolicy::default();
    tenant_policy
        .tenants
        .insert(TenantId::new("t1").unwrap(), 1000);
    MasterState {
        segments: vec![SegmentRecord {
            segment: Segment {
                id: SegmentId::new(5, 0),
                name: "n".into(),
                base: 0x1000,
                size: 0x10000,
                te_endpoint: "e".into(),
                protocol: "tcp".into(),
                host_id: String::new(),
            },
            client: ClientId::new(1, 2),
            status: SegmentStatus::OK,
            graceful_deadline_ms: None,
        }],
        objects: vec![ObjectRecord {
            tenant: Some(TenantId::new("t1").unwrap()),
            key: "k".into(),
            size: 4096,
            checksum: Some(0x0102_0304_0506_0708),
            data_type: 0,
            group: None,
            writer: ClientId::new(1, 2),
            put_start_ms: 100,
            processing: false,
            hard_pin: true,
            soft_pin_deadline_ms: 0,
            pending_soft_pin: None,
            replicas: vec![ReplicaRecord {
                id: ReplicaId(7),
                status: ReplicaStatus::COMPLETE,
                refcnt: 0,
                place: ReplicaPlace::Memory(BufferRecord {
                    segment: SegmentId::new(5, 0),
                    offset: 0x40,
                    len: 4096,
                }),
            }],
            task: None,
        }],
        discarded: vec![DiscardedRecord {
            release_at_ms: 200,
            buffers: vec![BufferRecord {
                segment: SegmentId::new(5, 0),
                offset: 0x2000,
                len: 0x100,
            }],
        }],
        tenant_policy,
        next_replica_id: 8,
    }
}

fn meta() -> SnapshotMeta {
    SnapshotMeta {
        id: 1,
        created_ms: 2,
        oplog_position: 3,
        master_version: "v1".into(),
    }
}

/// The expected file, one field per line (docs/snapshot.md). CRC fields are checked below
/// against CRC32C computed over their ranges, independently of the encoder.
const EXPECTED: &[&str] = &[
    // Header (44 bytes).
    "4d4f4f4e534e4150", // magic "MOONSNAP"
    "0100",             // format version 1
    "2c00",             // header length 44
    "0100000000000000", // id 1
    "0200000000000000", // created_ms 2
    "0300000000000000", // oplog_position 3
    "0200",             // master_version length 2
    "7631",             // "v1"
    "HCRC",             // header CRC32C
    // Chunk 0: SEGMENTS, raw, 1 record, 48 bytes.
    "01",
    "00",
    "0000",
    "01000000",
    "30000000",
    "30000000",
    "C0",
    "05000000000000000000000000000000", // segment id (5, 0)
    "016e",                             // name "n"
    "8020",                             // base 0x1000
    "808004",                           // size 0x10000
    "0165",                             // te_endpoint "e"
    "03746370",                         // protocol "tcp"
    "00",                               // host_id ""
    "01000000000000000200000000000000", // client (1, 2)
    "01",                               // status OK
    "00",                               // no graceful deadline
    // Chunk 1: TENANT_POLICY, raw, 1 record, 5 bytes.
    "02",
    "00",
    "0000",
    "01000000",
    "05000000",
    "05000000",
    "C1",
    "027431", // tenant "t1"
    "e807",   // quota 1000
    // Chunk 2: OBJECTS, raw, 1 record, 61 bytes.
    "03",
    "00",
    "0000",
    "01000000",
    "3d000000",
    "3d000000",
    "C2",
    "02",                               // id table: 2 ids
    "01000000000000000200000000000000", // #0 (1, 2)
    "05000000000000000000000000000000", // #1 (5, 0)
    "13",                               // flags: tenant | checksum | hard pin
    "027431",                           // tenant "t1"
    "016b",                             // key "k"
    "8020",                             // size 4096
    "0807060504030201",                 // checksum
    "00",                               // data type
    "00",                               // writer #0
    "64",                               // put_start_ms 100
    "01",                               // 1 replica
    "07",                               // replica id 7
    "03",                               // status COMPLETE
    "00",                               // refcnt 0
    "00",                               // place MEMORY
    "01",                               // segment #1
    "40",                               // offset 0x40
    "8020",                             // len 4096
    // Chunk 3: DISCARDED, raw, 1 record, 23 bytes.
    "04",
    "00",
    "0000",
    "01000000",
    "17000000",
    "17000000",
    "C3",
    "c801",                             // release_at_ms 200
    "01",                               // 1 buffer
    "05000000000000000000000000000000", // segment (5, 0)
    "8040",                             // offset 0x2000
    "8002",                             // len 0x100
    // Chunk 4: COUNTERS, raw, 1 record, 1 byte.
    "05",
    "00",
    "0000",
    "01000000",
    "01000000",
    "01000000",
    "C4",
    "08", // next_replica_id 8
    // Trailer (24 bytes).
    "00",
    "000000",
    "05000000",         // 5 chunks
    "0100000000000000", // 1 object
    "XCRC",             // CRC32C over the 5 chunk CRCs
    "TCRC",             // trailer CRC32C
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The expected bytes, CRC fields filled in by computing CRC32C over the bytes they cover.
fn expected() -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk_crcs = Vec::new();
    let mut trailer_start = 0;
    for field in EXPECTED {
        match *field {
            "HCRC" => {
                let crc = crc32c::crc32c(&out);
                out.extend_from_slice(&crc.to_le_bytes());
            }
            f if f.starts_with('C') => {
                // A chunk CRC covers the 16 header bytes before it and the stored payload
                // after it; it is filled in when the payload is complete.
                chunk_crcs.push(out.len() - 16);
                out.extend_from_slice(&[0; 4]);
            }
            "XCRC" => {
                let mut acc = 0u32;
                for start in &chunk_crcs {
                    acc = crc32c::crc32c_append(acc, &out[start + 16..start + 20]);
                }
                out.extend_from_slice(&acc.to_le_bytes());
            }
            "TCRC" => {
                let crc = crc32c::crc32c(&out[trailer_start..]);
                out.extend_from_slice(&crc.to_le_bytes());
            }
            f => out.extend_from_slice(&hex(f)),
        }
        if *field == "000000" {
            trailer_start = out.len() - 4;
        }
    }
    // Fill the chunk CRCs: each chunk's payload ends where the next chunk (or the trailer)
    // begins.
    let mut ends: Vec<usize> = chunk_crcs.iter().skip(1).copied().collect();
    ends.push(trailer_start);
    for (start, end) in chunk_crcs.iter().zip(ends) {
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&out[*start..start + 16]),
            &out[start + 20..end],
        );
        out[start + 16..start + 20].copy_from_slice(&crc.to_le_bytes());
    }
    // The chunks' CRC over CRCs and the trailer CRC were computed before the chunk CRCs were
    // filled: recompute them now.
    let t = trailer_start;
    let mut acc = 0u32;
    for start in &chunk_crcs {
        acc = crc32c::crc32c_append(acc, &out[start + 16..start + 20]);
    }
    out[t + 16..t + 20].copy_from_slice(&acc.to_le_bytes());
    let crc = crc32c::crc32c(&out[t..t + 20]);
    out[t + 20..t + 24].copy_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn the_fixed_example_encodes_byte_for_byte() {
    let bytes = encode_state(&state(), &meta(), &EncodeOptions::uncompressed());
    let want = expected();
    assert_eq!(want.len(), 44 + 5 * 20 + 48 + 5 + 61 + 23 + 1 + 24);
    let show = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(show(&bytes), show(&want));
    assert_eq!(show(&bytes), FIXED_HEX);
}

#[test]
fn the_fixed_example_decodes_to_the_state() {
    let (m, s) = decode(&hex(FIXED_HEX)).unwrap();
    assert_eq!(m, meta());
    assert_eq!(s, state());
}

/// The whole file as one constant (what `expected()` builds, CRCs included).
const FIXED_HEX: &str = concat!(
    "4d4f4f4e534e415001002c0001000000000000000200000000000000030000000000000002007631",
    "a6814752010000000100000030000000300000006d642bd405000000000000000000000000000000",
    "016e8020808004016503746370000100000000000000020000000000000001000200000001000000",
    "050000000500000028f200ca027431e80703000000010000003d0000003d0000002ea7cf4e020100",
    "00000000000002000000000000000500000000000000000000000000000013027431016b80200807",
    "060504030201000064010703000001408020040000000100000017000000170000006dcdcd9fc801",
    "0105000000000000000000000000000000804080020500000001000000010000000100000075a152",
    "8908000000000500000001000000000000003d51461e53fea6ef",
);
