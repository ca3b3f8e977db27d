//! A complete small batch spelled out byte by byte (docs/oplog.md, "Batch format"): the encoder
//! must produce exactly these bytes and the decoder must give the batch back.
#![allow(clippy::unwrap_used)]

use mooncake_common::SegmentId;
use mooncake_master::Mutation;
use mooncake_oplog::{batch, Batch};

fn example() -> Batch {
    Batch {
        batch_id: 3,
        view: 2,
        first_seq: 5,
        mutations: vec![
            Mutation::SegmentUnmounted {
                id: SegmentId::new(1, 2),
            },
            Mutation::Erase {
                tenant: None,
                key: "k".to_string(),
            },
            Mutation::DiscardedReleased { up_to_ms: 300 },
        ],
    }
}

fn expected_bytes() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"MCOL"); // magic
    b.extend_from_slice(&[1, 0, 0, 0]); // version 1, 3 reserved bytes
    b.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]); // batch id 3
    b.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]); // view 2
    b.extend_from_slice(&[5, 0, 0, 0, 0, 0, 0, 0]); // first sequence 5
    b.extend_from_slice(&[3, 0, 0, 0]); // 3 entries
    b.extend_from_slice(&[27, 0, 0, 0]); // 27 bytes of entries
                                         // Entry seq 5: 17 bytes, tag 6 (SegmentUnmounted), the id as two u64 (1, 2).
    b.extend_from_slice(&[17, 6]);
    b.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    // Entry seq 6: 4 bytes, tag 2 (Erase), no tenant, key "k".
    b.extend_from_slice(&[4, 2, 0, 1, b'k']);
    // Entry seq 7: 3 bytes, tag 9 (DiscardedReleased), up_to_ms 300 as a varint.
    b.extend_from_slice(&[3, 9, 0xac, 0x02]);
    // CRC32C of every byte above, little-endian.
    b.extend_from_slice(&0x84db_ae04u32.to_le_bytes());
    b
}

#[test]
fn the_encoder_writes_the_documented_bytes_and_the_decoder_reads_them_back() {
    let bytes = batch::encode(&example());
    let expected = expected_bytes();
    assert_eq!(
        bytes[..bytes.len() - 4],
        expected[..expected.len() - 4],
        "fields differ"
    );
    assert_eq!(
        crc32c::crc32c(&bytes[..bytes.len() - 4]),
        0x84db_ae04,
        "checksum"
    );
    assert_eq!(bytes, expected);
    let back = batch::decode(&expected).unwrap();
    assert_eq!(back, example());
    assert_eq!(back.last_seq(), 7);
}

#[test]
fn every_single_byte_flip_and_every_truncation_is_refused() {
    let bytes = expected_bytes();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[i] ^= 1 << bit;
            assert!(batch::decode(&damaged).is_err(), "byte {i} bit {bit}");
        }
        assert!(batch::decode(&bytes[..i]).is_err(), "truncated to {i}");
    }
}
