//! The batch: a run of consecutive op-log entries as one checksummed value (docs/oplog.md,
//! "Batch format"). The header names the batch id, the view (leadership term) of the writer and
//! the sequence number of the first entry; entry `i` has sequence `first_seq + i`.

use mooncake_master::Mutation;
use mooncake_snapshot::{decode_mutation, encode_mutation};

use crate::OpLogError;

/// The first four bytes of every batch.
pub const MAGIC: [u8; 4] = *b"MCOL";
/// The format version this build writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the entries.
pub const HEADER_LEN: usize = 40;
/// Bytes after the entries (the CRC32C).
pub const TRAILER_LEN: usize = 4;
/// Most entry bytes one batch may carry (etcd refuses requests above 1.5 MiB by default).
pub const MAX_ENTRY_BYTES: usize = 1 << 20;
/// Most entries one batch may carry.
pub const MAX_ENTRIES: u32 = 1 << 16;

/// A batch as it travels: its header fields and the encoded entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub batch_id: u64,
    /// The leadership view of the master that wrote it.
    pub view: u64,
    pub first_seq: u64,
    pub mutations: Vec<Mutation>,
}

impl Batch {
    /// The sequence number of the last entry (`first_seq` − 1 for an empty batch).
    pub fn last_seq(&self) -> u64 {
        (self.first_seq + self.mutations.len() as u64).saturating_sub(1)
    }
}

/// Appends one entry (its length as a LEB128 varint, then the mutation) to `out`.
pub fn put_entry(out: &mut Vec<u8>, m: &Mutation) {
    let mut body = Vec::with_capacity(64);
    encode_mutation(&mut body, m);
    put_entry_bytes(out, &body);
}

/// Appends one already encoded mutation as an entry.
pub fn put_entry_bytes(out: &mut Vec<u8>, body: &[u8]) {
    let mut v = body.len() as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out.extend_from_slice(body);
}

/// Seals `count` entries (as [`put_entry`] wrote them into `entries`) into a batch.
pub fn seal(batch_id: u64, view: u64, first_seq: u64, count: u32, entries: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + entries.len() + TRAILER_LEN);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&batch_id.to_le_bytes());
    out.extend_from_slice(&view.to_le_bytes());
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.extend_from_slice(entries);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Encodes a whole batch.
pub fn encode(batch: &Batch) -> Vec<u8> {
    let mut entries = Vec::new();
    for m in &batch.mutations {
        put_entry(&mut entries, m);
    }
    seal(
        batch.batch_id,
        batch.view,
        batch.first_seq,
        batch.mutations.len() as u32,
        &entries,
    )
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The header of a batch whose CRC verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub batch_id: u64,
    pub view: u64,
    pub first_seq: u64,
    pub count: u32,
}

/// Checks the frame (magic, version, lengths, CRC) and returns the header and the entry bytes.
pub fn verify(bytes: &[u8]) -> Result<(BatchHeader, &[u8]), OpLogError> {
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(OpLogError::corrupt(format!(
            "batch of {} bytes is shorter than header and checksum",
            bytes.len()
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(OpLogError::corrupt("bad magic"));
    }
    if bytes[4] != VERSION {
        return Err(OpLogError::corrupt(format!(
            "unsupported batch version {}",
            bytes[4]
        )));
    }
    if bytes[5..8] != [0, 0, 0] {
        return Err(OpLogError::corrupt("reserved bytes are not zero"));
    }
    let len = le_u32(bytes, 36) as usize;
    if len > MAX_ENTRY_BYTES || bytes.len() != HEADER_LEN + len + TRAILER_LEN {
        return Err(OpLogError::corrupt(format!(
            "entries length {len} does not match a batch of {} bytes",
            bytes.len()
        )));
    }
    let body_end = HEADER_LEN + len;
    let stored = le_u32(bytes, body_end);
    let computed = crc32c::crc32c(&bytes[..body_end]);
    if stored != computed {
        return Err(OpLogError::corrupt(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        )));
    }
    let header = BatchHeader {
        batch_id: le_u64(bytes, 8),
        view: le_u64(bytes, 16),
        first_seq: le_u64(bytes, 24),
        count: le_u32(bytes, 32),
    };
    if header.count == 0 || header.count > MAX_ENTRIES {
        return Err(OpLogError::corrupt(format!(
            "entry count {} outside 1..={MAX_ENTRIES}",
            header.count
        )));
    }
    if header.first_seq == 0
        || header
            .first_seq
            .checked_add(u64::from(header.count))
            .is_none()
    {
        return Err(OpLogError::corrupt(format!(
            "first sequence {} with {} entries",
            header.first_seq, header.count
        )));
    }
    Ok((header, &bytes[HEADER_LEN..body_end]))
}

/// Decodes and verifies a whole batch: frame, checksum and every entry.
pub fn decode(bytes: &[u8]) -> Result<Batch, OpLogError> {
    let (h, mut entries) = verify(bytes)?;
    let mut mutations = Vec::with_capacity((h.count as usize).min(entries.len()));
    for i in 0..h.count {
        let (len, used) = read_varint(entries)
            .ok_or_else(|| OpLogError::corrupt(format!("entry {i}: bad length")))?;
        let end = used
            .checked_add(usize::try_from(len).unwrap_or(usize::MAX))
            .filter(|&end| end <= entries.len())
            .ok_or_else(|| OpLogError::corrupt(format!("entry {i}: length {len} past the end")))?;
        let m = decode_mutation(&entries[used..end])
            .map_err(|e| OpLogError::corrupt(format!("entry {i}: {e}")))?;
        mutations.push(m);
        entries = &entries[end..];
    }
    if !entries.is_empty() {
        return Err(OpLogError::corrupt(format!(
            "{} bytes after the last entry",
            entries.len()
        )));
    }
    Ok(Batch {
        batch_id: h.batch_id,
        view: h.view,
        first_seq: h.first_seq,
        mutations,
    })
}

/// A LEB128 varint at the start of `b`: its value and the bytes it took.
fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        if i == 9 && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}
