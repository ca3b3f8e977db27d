//! Fuzzes the decoders of everything the storage backends read back from disk: the record header
//! (and key check) of the file-per-key and bucket layouts, a bucket's `.meta`, and the log
//! backend's data-file header, record header and checkpoint.
//!
//! The first input byte picks the decoder; for odd picks the target rewrites the structure's
//! CRC over the rest of the input first, so that the fuzzer reaches the field checks behind it.
//! Nothing may panic; whatever a decoder accepts must satisfy its bounds and re-encode to the
//! bytes it came from (a `.meta` to bytes that decode to the same value: its entries need not be
//! in key order on disk).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_storage::bucket::{decode_meta, encode_meta};
use mooncake_storage::log::{Checkpoint, FileHeader, RecordHeader as LogRecordHeader};
use mooncake_storage::record::{self, RecordHeader, HEADER_BYTES, MAGIC_BUCKET, MAGIC_FILE};

/// The key limit the record decoders run with (the default `Limits::max_key_bytes`).
const MAX_KEY: usize = 4096;
/// Mirrors of the log format's private layout constants (docs/storage-log.md).
const LOG_FILE_HEADER_CRC_AT: usize = 32;
const LOG_RECORD_HEADER_BYTES: usize = 48;
const LOG_RECORD_CRC_AT: usize = 44;
const LOG_MAX_KEY_BYTES: u32 = 64 * 1024;
const LOG_MAX_VALUE_BYTES: u64 = 1 << 40;

/// Writes the CRC-32C of `bytes[..at]` (and `extra`) at `bytes[at..at + 4]`, if it fits.
fn fix_crc(bytes: &mut [u8], at: usize, extra: &[u8]) {
    if bytes.len() >= at + 4 {
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..at]), extra);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Writes the CRC-32C of everything but the last 4 bytes into the last 4 bytes.
fn fix_trailing_crc(bytes: &mut [u8]) {
    if let Some(at) = bytes.len().checked_sub(4) {
        fix_crc(bytes, at, &[]);
    }
}

fn record_header(data: &mut [u8], fix: bool) {
    if data.len() < HEADER_BYTES {
        return;
    }
    let (head, key) = data.split_at_mut(HEADER_BYTES);
    if fix {
        // meta_crc covers header bytes 0..36 and the key.
        fix_crc(head, 36, key);
    }
    let head: &[u8; HEADER_BYTES] = (&*head).try_into().expect("split at HEADER_BYTES");
    for magic in [MAGIC_FILE, MAGIC_BUCKET] {
        // A limit of u64::MAX lets a header claim any value length: sizes must not overflow.
        let Ok(header) = RecordHeader::decode(head, magic, MAX_KEY, u64::MAX) else {
            continue;
        };
        assert!(header.key_len as usize <= MAX_KEY);
        assert!(header.record_bytes() >= HEADER_BYTES as u64 + u64::from(header.key_len));
        if key.len() == header.key_len as usize && record::check_key(head, key).is_ok() {
            let mut whole = head.to_vec();
            whole.extend_from_slice(key);
            assert_eq!(header.encode(magic, key), whole);
        }
    }
}

fn bucket_meta(data: &mut [u8], fix: bool) {
    if fix {
        fix_trailing_crc(data);
    }
    if let Some(meta) = decode_meta(data, MAX_KEY) {
        assert!(meta
            .live
            .keys()
            .all(|k| !k.is_empty() && k.len() <= MAX_KEY));
        let again = encode_meta(meta.bucket_id, meta.data_len, &meta.live);
        assert_eq!(decode_meta(&again, MAX_KEY), Some(meta));
    }
}

fn log_file_header(data: &mut [u8], fix: bool) {
    if fix {
        fix_crc(data, LOG_FILE_HEADER_CRC_AT, &[]);
    }
    if let Ok(header) = FileHeader::decode(data) {
        assert!(header.data_blocks > 0);
        // Bytes 36..40 are reserved and not checked; everything before them is canonical.
        assert_eq!(header.encode()[..36], data[..36]);
    }
    let _ = FileHeader::decode_block(data);
}

fn log_record_header(data: &mut [u8], fix: bool) {
    if fix {
        fix_crc(data, LOG_RECORD_CRC_AT, &[]);
    }
    if let Ok(header) = LogRecordHeader::decode(data) {
        assert!(header.key_len > 0 && header.key_len <= LOG_MAX_KEY_BYTES);
        assert!(header.value_len <= LOG_MAX_VALUE_BYTES);
        let mut out = [0u8; LOG_RECORD_HEADER_BYTES];
        header.encode_into(&mut out);
        assert_eq!(out[..], data[..LOG_RECORD_HEADER_BYTES]);
        let _ = mooncake_storage::log::record_blocks(u64::from(header.key_len), header.value_len);
    }
}

fn log_checkpoint(data: &mut [u8], fix: bool) {
    if fix {
        fix_trailing_crc(data);
    }
    if let Ok(checkpoint) = Checkpoint::decode(data) {
        // Every entry took at least 33 bytes of the input, so the decoder allocated no more.
        assert!(checkpoint.entries.len() <= data.len() / 33);
        assert_eq!(checkpoint.encode(), data);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&pick, rest)) = input.split_first() else {
        return;
    };
    let mut data = rest.to_vec();
    let fix = pick & 1 == 1;
    match (pick >> 1) % 5 {
        0 => record_header(&mut data, fix),
        1 => bucket_meta(&mut data, fix),
        2 => log_file_header(&mut data, fix),
        3 => log_record_header(&mut data, fix),
        _ => log_checkpoint(&mut data, fix),
    }
});
