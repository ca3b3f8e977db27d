//! The record format shared by the file-per-key and bucket backends (`docs/storage.md` §Record).
//!
//! ```text
//! offset size field
//!  0     4    magic          b"MCFK" (file-per-key) or b"MCBK" (bucket)
//!  4     2    version        u16 LE = 1
//!  6     2    flags          u16 LE; bit 0 = TOMBSTONE (bucket only); other bits must be 0
//!  8     4    key_len        u32 LE
//! 12     4    value_crc      u32 LE, CRC-32C (Castagnoli) of the value bytes
//! 16     8    value_len      u64 LE
//! 24     8    seq            u64 LE, write sequence number (FIFO order across restarts)
//! 32     4    reserved       0
//! 36     4    meta_crc       u32 LE, CRC-32C of bytes 0..36 followed by the key bytes
//! 40     key_len             key bytes
//! 40+k   value_len           value bytes
//! ```
//! `meta_crc` lets start-up trust the key and lengths after reading only the header and key;
//! `value_crc` is checked on every read before the bytes are handed out.

use std::fmt;

pub const HEADER_BYTES: usize = 40;
pub const VERSION: u16 = 1;
pub const FLAG_TOMBSTONE: u16 = 1;
pub const MAGIC_FILE: [u8; 4] = *b"MCFK";
pub const MAGIC_BUCKET: [u8; 4] = *b"MCBK";

/// A decoded, validated record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub flags: u16,
    pub key_len: u32,
    pub value_crc: u32,
    pub value_len: u64,
    pub seq: u64,
}

/// Why a header or key failed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    BadMagic,
    BadVersion(u16),
    UnknownFlags(u16),
    KeyTooLong(u32),
    ValueTooLarge(u64),
    MetaChecksum,
    ValueChecksum,
    KeyMismatch,
    Truncated,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::BadMagic => write!(f, "bad magic"),
            RecordError::BadVersion(v) => write!(f, "unsupported version {v}"),
            RecordError::UnknownFlags(x) => write!(f, "unknown flags {x:#x}"),
            RecordError::KeyTooLong(n) => write!(f, "key length {n} over the limit"),
            RecordError::ValueTooLarge(n) => write!(f, "value length {n} over the limit"),
            RecordError::MetaChecksum => write!(f, "header/key checksum mismatch"),
            RecordError::ValueChecksum => write!(f, "value checksum mismatch"),
            RecordError::KeyMismatch => write!(f, "stored key differs from the requested key"),
            RecordError::Truncated => write!(f, "record extends past the end of the file"),
        }
    }
}

impl RecordHeader {
    /// Header + key bytes for a record holding `key` and a value with `value_len`/`value_crc`.
    pub fn encode(&self, magic: [u8; 4], key: &[u8]) -> Vec<u8> {
        debug_assert_eq!(self.key_len as usize, key.len());
        let mut out = Vec::with_capacity(HEADER_BYTES + key.len());
        out.extend_from_slice(&magic);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.key_len.to_le_bytes());
        out.extend_from_slice(&self.value_crc.to_le_bytes());
        out.extend_from_slice(&self.value_len.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let meta_crc = crc32c::crc32c_append(crc32c::crc32c(&out), key);
        out.extend_from_slice(&meta_crc.to_le_bytes());
        out.extend_from_slice(key);
        debug_assert_eq!(out.len(), HEADER_BYTES + key.len());
        out
    }

    /// Parses and bounds-checks a header; the key is checked separately with [`check_key`].
    pub fn decode(
        buf: &[u8; HEADER_BYTES],
        magic: [u8; 4],
        max_key_bytes: usize,
        max_value_bytes: u64,
    ) -> Result<RecordHeader, RecordError> {
        if buf[0..4] != magic {
            return Err(RecordError::BadMagic);
        }
        let u16_at = |i: usize| u16::from_le_bytes([buf[i], buf[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let version = u16_at(4);
        if version != VERSION {
            return Err(RecordError::BadVersion(version));
        }
        let flags = u16_at(6);
        if flags & !FLAG_TOMBSTONE != 0 {
            return Err(RecordError::UnknownFlags(flags));
        }
        let key_len = u32_at(8);
        if key_len as usize > max_key_bytes {
            return Err(RecordError::KeyTooLong(key_len));
        }
        let value_len = u64_at(16);
        if value_len > max_value_bytes {
            return Err(RecordError::ValueTooLarge(value_len));
        }
        if u32_at(32) != 0 {
            return Err(RecordError::UnknownFlags(0));
        }
        Ok(RecordHeader {
            flags,
            key_len,
            value_crc: u32_at(12),
            value_len,
            seq: u64_at(24),
        })
    }

    /// Total bytes of the record on disk. Saturates: a header read from disk may claim a
    /// `value_len` near `u64::MAX` when the configured limit allows it, and the callers compare
    /// this against a file length.
    pub fn record_bytes(&self) -> u64 {
        (HEADER_BYTES as u64 + u64::from(self.key_len)).saturating_add(self.value_len)
    }

    pub fn is_tombstone(&self) -> bool {
        self.flags & FLAG_TOMBSTONE != 0
    }
}

/// Verifies `meta_crc` (header bytes 0..36 + key).
pub fn check_key(buf: &[u8; HEADER_BYTES], key: &[u8]) -> Result<(), RecordError> {
    let stored = u32::from_le_bytes([buf[36], buf[37], buf[38], buf[39]]);
    if crc32c::crc32c_append(crc32c::crc32c(&buf[..36]), key) != stored {
        return Err(RecordError::MetaChecksum);
    }
    Ok(())
}

/// Verifies the value against the header's `value_crc`.
pub fn check_value(header: &RecordHeader, value: &[u8]) -> Result<(), RecordError> {
    if crc32c::crc32c(value) != header.value_crc {
        return Err(RecordError::ValueChecksum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed example printed in docs/storage.md.
    #[test]
    fn decodes_the_documented_example() {
        let value = b"hello";
        // CRC-32C("hello") = 0x9a71bb4c (a published check value of the Castagnoli polynomial).
        assert_eq!(crc32c::crc32c(value), 0x9a71_bb4c);
        let header = RecordHeader {
            flags: 0,
            key_len: 3,
            value_crc: crc32c::crc32c(value),
            value_len: 5,
            seq: 7,
        };
        let bytes = header.encode(MAGIC_FILE, b"key");
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "4d43464b01000000030000004cbb719a0500000000000000\
             070000000000000000000000d36c8fd56b6579"
        );
        let mut fixed = [0u8; HEADER_BYTES];
        fixed.copy_from_slice(&bytes[..HEADER_BYTES]);
        let decoded = RecordHeader::decode(&fixed, MAGIC_FILE, 16, 16).unwrap();
        assert_eq!(decoded, header);
        check_key(&fixed, b"key").unwrap();
        check_value(&decoded, value).unwrap();
        assert_eq!(check_key(&fixed, b"kez"), Err(RecordError::MetaChecksum));
        assert_eq!(
            check_value(&decoded, b"hellp"),
            Err(RecordError::ValueChecksum)
        );
        assert_eq!(
            RecordHeader::decode(&fixed, MAGIC_BUCKET, 16, 16),
            Err(RecordError::BadMagic)
        );
        assert_eq!(
            RecordHeader::decode(&fixed, MAGIC_FILE, 2, 16),
            Err(RecordError::KeyTooLong(3))
        );
        // A length near u64::MAX (allowed by a limit of u64::MAX) does not overflow.
        let mut huge = fixed;
        huge[16..24].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        let decoded = RecordHeader::decode(&huge, MAGIC_FILE, 16, u64::MAX).unwrap();
        assert_eq!(decoded.record_bytes(), u64::MAX);
        let mut bad = fixed;
        bad[6] = 2;
        assert_eq!(
            RecordHeader::decode(&bad, MAGIC_FILE, 16, 16),
            Err(RecordError::UnknownFlags(2))
        );
    }
}
