//! Byte formats of the log backend: the data-file header, the record header and the checkpoint.
//!
//! Every multi-byte integer is little-endian. `docs/storage-log.md` describes each layout byte by
//! byte; the tests at the bottom of this file decode the fixed example printed there.
//! Decoders never panic and never trust a length before checking it against a bound.

/// Allocation unit and alignment of everything in the data file.
pub const BLOCK_BYTES: u64 = 4096;
/// Name of the data file inside the backend's root directory.
pub const DATA_FILE: &str = "log.data";
/// Name the data file has while it is being created (removed at open if found).
pub const DATA_FILE_TMP: &str = "log.data.tmp";
/// Name of the checkpoint file.
pub const CHECKPOINT_FILE: &str = "log.ckpt";
/// Name of a checkpoint being written (removed at open if found).
pub const CHECKPOINT_TMP: &str = "log.ckpt.tmp";
/// Empty file whose `flock` keeps a second backend (or process) from opening the same root.
pub const LOCK_FILE: &str = "log.lock";

/// Hard bound on key length on disk, whatever the configured limit (decoders refuse more).
pub const MAX_KEY_BYTES_ON_DISK: u32 = 64 * 1024;
/// Hard bound on value length on disk (decoders refuse more).
pub const MAX_VALUE_BYTES_ON_DISK: u64 = 1 << 40;

// ---------------------------------------------------------------------------------------------
// Data-file header (two copies in block 0: at byte 0 and at byte 2048).

pub const FILE_MAGIC: [u8; 8] = *b"MCLOGDAT";
pub const FILE_VERSION: u32 = 1;
pub const FILE_HEADER_BYTES: usize = 40;
/// Offset of the second copy of the file header inside block 0.
pub const FILE_HEADER_COPY_OFFSET: usize = 2048;

/// The data file's identity and geometry. The data region starts at byte `BLOCK_BYTES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Random id stamped into every record header; a header with another id is not ours.
    pub file_id: u64,
    /// Size of the data region in blocks (the file is `(1 + data_blocks) × 4096` bytes).
    pub data_blocks: u64,
}

impl FileHeader {
    pub fn encode(&self) -> [u8; FILE_HEADER_BYTES] {
        let mut out = [0u8; FILE_HEADER_BYTES];
        out[0..8].copy_from_slice(&FILE_MAGIC);
        out[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.file_id.to_le_bytes());
        out[24..32].copy_from_slice(&self.data_blocks.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        // 36..40 reserved, zero.
        out
    }

    /// Encodes block 0 of the data file: both copies of the header, the rest zero.
    pub fn encode_block(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_BYTES as usize];
        let header = self.encode();
        block[..FILE_HEADER_BYTES].copy_from_slice(&header);
        block[FILE_HEADER_COPY_OFFSET..FILE_HEADER_COPY_OFFSET + FILE_HEADER_BYTES]
            .copy_from_slice(&header);
        block
    }

    pub fn decode(bytes: &[u8]) -> Result<FileHeader, &'static str> {
        let b = bytes
            .get(..FILE_HEADER_BYTES)
            .ok_or("file header truncated")?;
        if b[0..8] != FILE_MAGIC {
            return Err("bad file magic");
        }
        if le_u32(b, 32) != crc32c::crc32c(&b[0..32]) {
            return Err("file header checksum mismatch");
        }
        if le_u32(b, 8) != FILE_VERSION {
            return Err("unsupported file version");
        }
        if u64::from(le_u32(b, 12)) != BLOCK_BYTES {
            return Err("unsupported block size");
        }
        let header = FileHeader {
            file_id: le_u64(b, 16),
            data_blocks: le_u64(b, 24),
        };
        if header.data_blocks == 0 || header.data_blocks > (u64::MAX / BLOCK_BYTES) - 1 {
            return Err("data region size out of range");
        }
        Ok(header)
    }

    /// Decodes block 0: the first copy, else the second.
    pub fn decode_block(block: &[u8]) -> Result<FileHeader, &'static str> {
        match FileHeader::decode(block) {
            Ok(h) => Ok(h),
            Err(first) => block
                .get(FILE_HEADER_COPY_OFFSET..)
                .ok_or(first)
                .and_then(|copy| FileHeader::decode(copy).map_err(|_| first)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Record header.

pub const RECORD_MAGIC: [u8; 4] = *b"MCLR";
pub const RECORD_VERSION: u16 = 1;
pub const RECORD_HEADER_BYTES: usize = 48;
/// Flag bit 0: the record holds a live value. Every written record has it; any other bit set
/// makes the header invalid (removal zeroes the header instead of writing a tombstone).
pub const FLAG_LIVE: u16 = 1;

/// The fixed part of a record. The key follows at byte 48, then zero padding to a 4 KiB
/// boundary, then the value, then zero padding to a 4 KiB boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub key_len: u32,
    pub value_len: u64,
    pub seq: u64,
    pub file_id: u64,
    /// CRC32C over the key bytes followed by the value bytes (padding excluded).
    pub data_crc: u32,
}

impl RecordHeader {
    pub fn encode_into(&self, out: &mut [u8]) {
        debug_assert!(out.len() >= RECORD_HEADER_BYTES);
        out[0..4].copy_from_slice(&RECORD_MAGIC);
        out[4..6].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&FLAG_LIVE.to_le_bytes());
        out[8..12].copy_from_slice(&self.key_len.to_le_bytes());
        out[12..16].copy_from_slice(&0u32.to_le_bytes());
        out[16..24].copy_from_slice(&self.value_len.to_le_bytes());
        out[24..32].copy_from_slice(&self.seq.to_le_bytes());
        out[32..40].copy_from_slice(&self.file_id.to_le_bytes());
        out[40..44].copy_from_slice(&self.data_crc.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..44]);
        out[44..48].copy_from_slice(&crc.to_le_bytes());
    }

    /// Cheap pre-check used by the recovery scan before a full decode.
    pub fn has_magic(bytes: &[u8]) -> bool {
        bytes.get(0..4) == Some(&RECORD_MAGIC[..])
    }

    pub fn decode(bytes: &[u8]) -> Result<RecordHeader, &'static str> {
        let b = bytes
            .get(..RECORD_HEADER_BYTES)
            .ok_or("record header truncated")?;
        if b[0..4] != RECORD_MAGIC {
            return Err("bad record magic");
        }
        if le_u32(b, 44) != crc32c::crc32c(&b[0..44]) {
            return Err("record header checksum mismatch");
        }
        if le_u16(b, 4) != RECORD_VERSION {
            return Err("unsupported record version");
        }
        if le_u16(b, 6) != FLAG_LIVE || le_u32(b, 12) != 0 {
            return Err("unknown record flags");
        }
        let header = RecordHeader {
            key_len: le_u32(b, 8),
            value_len: le_u64(b, 16),
            seq: le_u64(b, 24),
            file_id: le_u64(b, 32),
            data_crc: le_u32(b, 40),
        };
        if header.key_len == 0 || header.key_len > MAX_KEY_BYTES_ON_DISK {
            return Err("key length out of range");
        }
        if header.value_len > MAX_VALUE_BYTES_ON_DISK {
            return Err("value length out of range");
        }
        Ok(header)
    }
}

/// Blocks taken by the header and the key (at least one).
pub fn head_blocks(key_len: u64) -> u64 {
    (RECORD_HEADER_BYTES as u64 + key_len).div_ceil(BLOCK_BYTES)
}

/// Blocks taken by the value (zero for an empty value).
pub fn value_blocks(value_len: u64) -> u64 {
    value_len.div_ceil(BLOCK_BYTES)
}

/// Blocks taken by a whole record.
pub fn record_blocks(key_len: u64, value_len: u64) -> u64 {
    head_blocks(key_len) + value_blocks(value_len)
}

/// CRC32C of `key ‖ value`, as stored in [`RecordHeader::data_crc`]. Computed with `crc-fast`
/// (VPCLMULQDQ folding where the CPU has it, about twice the `crc32c` crate's SSE4.2 loop on
/// 1 MiB values): every put and every read of a value pays it, so it is the backend's largest
/// CPU cost per byte after the copy itself. Same CRC32C (Castagnoli) value either way.
pub fn data_crc(key: &[u8], value: &[u8]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    digest.update(key);
    digest.update(value);
    // CRC-32 values fit 32 bits.
    digest.finalize() as u32
}

/// Encodes a whole record (header, key, padding, value, padding) into one buffer. Used by tests
/// and tools; the write path builds the same bytes without copying the value.
pub fn encode_record(key: &[u8], value: &[u8], seq: u64, file_id: u64) -> Vec<u8> {
    let head = head_blocks(key.len() as u64) as usize * BLOCK_BYTES as usize;
    let total = record_blocks(key.len() as u64, value.len() as u64) as usize * BLOCK_BYTES as usize;
    let mut out = vec![0u8; total];
    RecordHeader {
        key_len: key.len() as u32,
        value_len: value.len() as u64,
        seq,
        file_id,
        data_crc: data_crc(key, value),
    }
    .encode_into(&mut out);
    out[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key.len()].copy_from_slice(key);
    out[head..head + value.len()].copy_from_slice(value);
    out
}

// ---------------------------------------------------------------------------------------------
// Checkpoint.

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"MCLOGCKP";
pub const CHECKPOINT_VERSION: u32 = 1;
pub const CHECKPOINT_HEADER_BYTES: usize = 48;
/// Fixed bytes of one checkpoint entry before its key.
pub const CHECKPOINT_ENTRY_FIXED_BYTES: usize = 32;

/// One live record as listed in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub seq: u64,
    /// Byte offset of the record in the data file (a multiple of 4096, at least 4096).
    pub offset: u64,
    pub value_len: u64,
    pub data_crc: u32,
    pub key: String,
}

/// The index of the log at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub file_id: u64,
    pub data_blocks: u64,
    /// The next sequence number that was unused when the checkpoint was taken: every record
    /// written after it has `seq >= next_seq`.
    pub next_seq: u64,
    pub entries: Vec<CheckpointEntry>,
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self
            .entries
            .iter()
            .map(|e| CHECKPOINT_ENTRY_FIXED_BYTES + e.key.len())
            .sum();
        let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + body + 4);
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.file_id.to_le_bytes());
        out.extend_from_slice(&self.data_blocks.to_le_bytes());
        out.extend_from_slice(&self.next_seq.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.seq.to_le_bytes());
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.value_len.to_le_bytes());
            out.extend_from_slice(&e.data_crc.to_le_bytes());
            out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
            out.extend_from_slice(e.key.as_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Checkpoint, &'static str> {
        if bytes.len() < CHECKPOINT_HEADER_BYTES + 4 {
            return Err("checkpoint truncated");
        }
        let (body, trailer) = bytes.split_at(bytes.len() - 4);
        if body[0..8] != CHECKPOINT_MAGIC {
            return Err("bad checkpoint magic");
        }
        if le_u32(trailer, 0) != crc32c::crc32c(body) {
            return Err("checkpoint checksum mismatch");
        }
        if le_u32(body, 8) != CHECKPOINT_VERSION || le_u32(body, 12) != 0 {
            return Err("unsupported checkpoint version");
        }
        let file_id = le_u64(body, 16);
        let data_blocks = le_u64(body, 24);
        let next_seq = le_u64(body, 32);
        let count = le_u64(body, 40);
        // Every entry takes at least its fixed bytes plus one key byte: bound before allocating.
        let max_count = (body.len() - CHECKPOINT_HEADER_BYTES) / (CHECKPOINT_ENTRY_FIXED_BYTES + 1);
        if count > max_count as u64 {
            return Err("checkpoint entry count exceeds its length");
        }
        let mut entries = Vec::with_capacity(count as usize);
        let mut pos = CHECKPOINT_HEADER_BYTES;
        for _ in 0..count {
            let fixed = body
                .get(pos..pos + CHECKPOINT_ENTRY_FIXED_BYTES)
                .ok_or("checkpoint entry truncated")?;
            let key_len = le_u32(fixed, 28);
            if key_len == 0 || key_len > MAX_KEY_BYTES_ON_DISK {
                return Err("checkpoint key length out of range");
            }
            let key_start = pos + CHECKPOINT_ENTRY_FIXED_BYTES;
            let key_bytes = body
                .get(key_start..key_start + key_len as usize)
                .ok_or("checkpoint key truncated")?;
            let key = std::str::from_utf8(key_bytes)
                .map_err(|_| "checkpoint key is not UTF-8")?
                .to_owned();
            entries.push(CheckpointEntry {
                seq: le_u64(fixed, 0),
                offset: le_u64(fixed, 8),
                value_len: le_u64(fixed, 16),
                data_crc: le_u32(fixed, 24),
                key,
            });
            pos = key_start + key_len as usize;
        }
        if pos != body.len() {
            return Err("trailing bytes after checkpoint entries");
        }
        Ok(Checkpoint {
            file_id,
            data_blocks,
            next_seq,
            entries,
        })
    }
}

// Callers pass slices whose length was checked; `get` keeps a bad offset from panicking anyway.
fn le_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        a.copy_from_slice(s);
    }
    u16::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The example record of docs/storage-log.md: key "k1", value "hello", seq 7,
    /// file id 0x1122334455667788. The expected bytes were computed independently (a bitwise
    /// CRC-32C in a few lines of Python), not by this code.
    const EXAMPLE_HEADER_HEX: &str = concat!(
        "4d434c52",
        "0100",
        "0100",
        "02000000",
        "00000000",
        "0500000000000000",
        "0700000000000000",
        "8877665544332211",
        "72e6317f",
        "a5401ea7",
    );

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn crc32c_is_castagnoli() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn data_crc_is_crc32c_of_key_then_value() {
        let bytes: Vec<u8> = (0..200_000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        for (k, v) in [(0usize, 0usize), (1, 0), (3, 1), (17, 4096), (64, 199_000)] {
            let (key, value) = (&bytes[..k], &bytes[k..k + v]);
            let expected = crc32c::crc32c_append(crc32c::crc32c(key), value);
            assert_eq!(data_crc(key, value), expected, "key {k} value {v}");
        }
    }

    #[test]
    fn example_record_decodes_as_documented() {
        let record = encode_record(b"k1", b"hello", 7, 0x1122_3344_5566_7788);
        assert_eq!(record.len(), 8192, "one head block + one value block");
        assert_eq!(hex(&record[0..48]), EXAMPLE_HEADER_HEX);
        let data_crc = u32::from_le_bytes(record[40..44].try_into().unwrap());
        assert_eq!(data_crc, 0x7f31_e672, "CRC32C of b\"k1hello\"");
        assert_eq!(&record[48..50], b"k1");
        assert!(
            record[50..4096].iter().all(|&b| b == 0),
            "key padding is zero"
        );
        assert_eq!(&record[4096..4101], b"hello");
        assert!(
            record[4101..].iter().all(|&b| b == 0),
            "value padding is zero"
        );

        let header = RecordHeader::decode(&record).unwrap();
        assert_eq!(
            header,
            RecordHeader {
                key_len: 2,
                value_len: 5,
                seq: 7,
                file_id: 0x1122_3344_5566_7788,
                data_crc,
            }
        );
    }

    /// The example checkpoint of docs/storage-log.md (bytes computed independently).
    const EXAMPLE_CHECKPOINT_HEX: &str = concat!(
        "4d434c4f47434b50",
        "01000000",
        "00000000",
        "8877665544332211",
        "2001000000000000",
        "0900000000000000",
        "0100000000000000",
        "0700000000000000",
        "0010000000000000",
        "0500000000000000",
        "72e6317f",
        "02000000",
        "6b31",
        "bc88fe5a",
    );

    /// The example data-file header of docs/storage-log.md.
    const EXAMPLE_FILE_HEADER_HEX: &str = concat!(
        "4d434c4f47444154",
        "01000000",
        "00100000",
        "8877665544332211",
        "2001000000000000",
        "b24b10e5",
        "00000000",
    );

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn example_checkpoint_decodes_as_documented() {
        let bytes = unhex(EXAMPLE_CHECKPOINT_HEX);
        assert_eq!(bytes.len(), 86);
        let ckpt = Checkpoint::decode(&bytes).unwrap();
        assert_eq!(
            ckpt,
            Checkpoint {
                file_id: 0x1122_3344_5566_7788,
                data_blocks: 288,
                next_seq: 9,
                entries: vec![CheckpointEntry {
                    seq: 7,
                    offset: 4096,
                    value_len: 5,
                    data_crc: 0x7f31_e672,
                    key: "k1".into(),
                }],
            }
        );
        assert_eq!(ckpt.encode(), bytes, "encoding is canonical");
    }

    #[test]
    fn example_file_header_decodes_as_documented() {
        let bytes = unhex(EXAMPLE_FILE_HEADER_HEX);
        let header = FileHeader::decode(&bytes).unwrap();
        assert_eq!(
            header,
            FileHeader {
                file_id: 0x1122_3344_5566_7788,
                data_blocks: 288,
            }
        );
        assert_eq!(header.encode().to_vec(), bytes);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = Checkpoint {
            file_id: 1,
            data_blocks: 8,
            next_seq: 2,
            entries: vec![CheckpointEntry {
                seq: 1,
                offset: 4096,
                value_len: 3,
                data_crc: 0,
                key: "k".into(),
            }],
        }
        .encode();
        for round in 0..20_000 {
            let len = (next() % 200) as usize;
            let mut bytes: Vec<u8> = if round % 2 == 0 {
                (0..len).map(|_| next() as u8).collect()
            } else {
                // Mutations of a valid checkpoint, with the CRC fixed up so the body is parsed.
                let mut b = valid.clone();
                let at = (next() as usize) % (b.len() - 4);
                b[at] = next() as u8;
                b.truncate(b.len() - 4);
                let crc = crc32c::crc32c(&b);
                b.extend_from_slice(&crc.to_le_bytes());
                b
            };
            let _ = RecordHeader::decode(&bytes);
            let _ = FileHeader::decode_block(&bytes);
            let _ = Checkpoint::decode(&bytes);
            bytes.truncate(len.min(bytes.len()));
            let _ = Checkpoint::decode(&bytes);
        }
    }

    #[test]
    fn record_header_rejects_every_single_bit_flip() {
        let record = encode_record(b"key", b"value", 1, 42);
        for byte in 0..RECORD_HEADER_BYTES {
            for bit in 0..8 {
                let mut copy = record[..RECORD_HEADER_BYTES].to_vec();
                copy[byte] ^= 1 << bit;
                assert!(
                    RecordHeader::decode(&copy).is_err(),
                    "flip of byte {byte} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn zeroed_header_is_not_a_record() {
        assert!(RecordHeader::decode(&[0u8; 48]).is_err());
        assert!(RecordHeader::decode(&[0u8; 10]).is_err());
    }

    #[test]
    fn block_counts() {
        assert_eq!(head_blocks(1), 1);
        assert_eq!(head_blocks(4096 - 48), 1);
        assert_eq!(head_blocks(4096 - 47), 2);
        assert_eq!(value_blocks(0), 0);
        assert_eq!(value_blocks(1), 1);
        assert_eq!(value_blocks(4096), 1);
        assert_eq!(value_blocks(4097), 2);
        assert_eq!(record_blocks(2, 1 << 20), 257);
    }

    #[test]
    fn file_header_round_trips_and_falls_back_to_its_copy() {
        let header = FileHeader {
            file_id: 9,
            data_blocks: 100,
        };
        let mut block = header.encode_block();
        assert_eq!(FileHeader::decode_block(&block), Ok(header));
        block[5] ^= 0xff;
        assert_eq!(
            FileHeader::decode_block(&block),
            Ok(header),
            "second copy used"
        );
        block[FILE_HEADER_COPY_OFFSET + 20] ^= 0xff;
        assert!(FileHeader::decode_block(&block).is_err());
    }

    #[test]
    fn checkpoint_round_trips_and_rejects_damage() {
        let ckpt = Checkpoint {
            file_id: 5,
            data_blocks: 64,
            next_seq: 12,
            entries: vec![
                CheckpointEntry {
                    seq: 3,
                    offset: 4096,
                    value_len: 10,
                    data_crc: 0xdead_beef,
                    key: "a".into(),
                },
                CheckpointEntry {
                    seq: 11,
                    offset: 12288,
                    value_len: 0,
                    data_crc: 1,
                    key: "tenant\0key".into(),
                },
            ],
        };
        let bytes = ckpt.encode();
        assert_eq!(bytes.len(), 48 + (32 + 1) + (32 + 10) + 4);
        assert_eq!(Checkpoint::decode(&bytes), Ok(ckpt));
        for cut in 0..bytes.len() {
            assert!(Checkpoint::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut copy = bytes.clone();
            copy[at] ^= 0x40;
            assert!(Checkpoint::decode(&copy).is_err(), "flip at {at}");
        }
    }

    #[test]
    fn checkpoint_with_huge_count_is_refused_without_allocating() {
        let mut bytes = Checkpoint {
            file_id: 1,
            data_blocks: 1,
            next_seq: 0,
            entries: vec![],
        }
        .encode();
        bytes.truncate(bytes.len() - 4);
        bytes[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Checkpoint::decode(&bytes),
            Err("checkpoint entry count exceeds its length")
        );
    }
}
