//! The file layout (docs/snapshot.md): its constants, and the header, written and verified.
//! Chunks are written by `encode` and read by `decode`.

use crate::{SnapshotError, SnapshotMeta};

/// The first 8 bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"MOONSNAP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Largest uncompressed chunk payload a reader accepts (and a writer produces).
pub const MAX_CHUNK_RAW_BYTES: u32 = 1 << 28;
/// Largest ratio of a zstd chunk's uncompressed to stored length a reader accepts (a writer
/// stores a chunk that compresses better than this uncompressed).
pub const MAX_ZSTD_RATIO: u32 = 256;
/// Longest `master_version` kept in a header.
pub const MAX_VERSION_STRING_BYTES: usize = 1024;

/// Bytes of the fixed header fields before the version string.
const HEADER_FIXED: usize = 38;
/// A chunk header's size.
pub(crate) const CHUNK_HEADER: usize = 20;
/// The trailer's size.
pub(crate) const TRAILER: usize = 24;

pub(crate) const KIND_END: u8 = 0;
pub(crate) const KIND_SEGMENTS: u8 = 1;
pub(crate) const KIND_TENANT_POLICY: u8 = 2;
pub(crate) const KIND_OBJECTS: u8 = 3;
pub(crate) const KIND_DISCARDED: u8 = 4;
pub(crate) const KIND_COUNTERS: u8 = 5;
/// Kinds at or above this are optional: a reader that does not know one skips it.
pub(crate) const KIND_OPTIONAL_MIN: u8 = 0x80;

pub(crate) const CODEC_RAW: u8 = 0;
pub(crate) const CODEC_ZSTD: u8 = 1;

fn version_string(meta: &SnapshotMeta) -> &str {
    let v = meta.master_version.as_str();
    if v.len() <= MAX_VERSION_STRING_BYTES {
        return v;
    }
    let mut end = MAX_VERSION_STRING_BYTES;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

pub(crate) fn header_bytes(meta: &SnapshotMeta) -> Vec<u8> {
    let version = version_string(meta);
    let len = HEADER_FIXED + version.len() + 4;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&meta.id.to_le_bytes());
    out.extend_from_slice(&meta.created_ms.to_le_bytes());
    out.extend_from_slice(&meta.oplog_position.to_le_bytes());
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Reads and verifies the header; returns the meta and the header's length.
pub(crate) fn decode_header(bytes: &[u8]) -> Result<(SnapshotMeta, usize), SnapshotError> {
    let head = &bytes[..bytes.len().min(MAGIC.len())];
    if head != &MAGIC[..head.len()] {
        return Err(SnapshotError::corrupt("not a snapshot file (bad magic)"));
    }
    if bytes.len() < 12 {
        return Err(SnapshotError::truncated(format!(
            "{} bytes, shorter than the header's fixed part",
            bytes.len()
        )));
    }
    let header_len = usize::from(le_u16(bytes, 10));
    if header_len < 16 {
        return Err(SnapshotError::corrupt(format!(
            "header length {header_len} is below 16"
        )));
    }
    if bytes.len() < header_len {
        return Err(SnapshotError::truncated(format!(
            "{} bytes, the header alone is {header_len}",
            bytes.len()
        )));
    }
    let crc = le_u32(bytes, header_len - 4);
    if crc32c::crc32c(&bytes[..header_len - 4]) != crc {
        return Err(SnapshotError::corrupt("header CRC mismatch"));
    }
    let version = le_u16(bytes, 8);
    if version != FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    if header_len < HEADER_FIXED + 4 {
        return Err(SnapshotError::corrupt(format!(
            "header length {header_len} is below {}",
            HEADER_FIXED + 4
        )));
    }
    let version_len = usize::from(le_u16(bytes, 36));
    if HEADER_FIXED + version_len + 4 != header_len || version_len > MAX_VERSION_STRING_BYTES {
        return Err(SnapshotError::corrupt(format!(
            "header length {header_len} does not fit a version string of {version_len} bytes"
        )));
    }
    let master_version = std::str::from_utf8(&bytes[HEADER_FIXED..HEADER_FIXED + version_len])
        .map_err(|_| SnapshotError::corrupt("master version is not UTF-8"))?
        .to_string();
    let meta = SnapshotMeta {
        id: le_u64(bytes, 12),
        created_ms: le_u64(bytes, 20),
        oplog_position: le_u64(bytes, 28),
        master_version,
    };
    Ok((meta, header_len))
}
