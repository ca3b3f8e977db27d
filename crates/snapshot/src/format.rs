//! The file layout (docs/snapshot.md): header, chunks, trailer; the encoder (from a live master
//! or from a [`MasterState`]) and the verifying decoder.

use std::io::{Read, Write};

use mooncake_master::mutation::{DiscardedRecord, SegmentRecord};
use mooncake_master::{MasterService, MasterState, ObjectRecord, TenantPolicy};

use crate::records::{self, IdTable};
use crate::wire::Reader;
use crate::{EncodeOptions, SnapshotError, SnapshotMeta};

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
const CHUNK_HEADER: usize = 20;
/// The trailer's size.
const TRAILER: usize = 24;
/// A writer starts a new chunk once the payload reaches this size.
const CHUNK_TARGET_BYTES: usize = 1 << 20;
/// ... or this many records.
const CHUNK_TARGET_RECORDS: u32 = 65_536;

pub(crate) const KIND_END: u8 = 0;
pub(crate) const KIND_SEGMENTS: u8 = 1;
pub(crate) const KIND_TENANT_POLICY: u8 = 2;
pub(crate) const KIND_OBJECTS: u8 = 3;
pub(crate) const KIND_DISCARDED: u8 = 4;
pub(crate) const KIND_COUNTERS: u8 = 5;
/// Kinds at or above this are optional: a reader that does not know one skips it.
pub(crate) const KIND_OPTIONAL_MIN: u8 = 0x80;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

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

fn header_bytes(meta: &SnapshotMeta) -> Vec<u8> {
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

/// Writes chunks to `out`, keeping what the trailer needs.
struct Encoder<'w> {
    out: &'w mut dyn Write,
    opts: EncodeOptions,
    bytes: u64,
    chunks: u32,
    objects: u64,
    chunks_crc: u32,
    /// Record bytes of the chunk being built, its record count, the id table (objects).
    body: Vec<u8>,
    count: u32,
    table: IdTable,
    payload: Vec<u8>,
}

impl<'w> Encoder<'w> {
    fn new(
        out: &'w mut dyn Write,
        meta: &SnapshotMeta,
        opts: &EncodeOptions,
    ) -> Result<Self, SnapshotError> {
        let header = header_bytes(meta);
        out.write_all(&header)?;
        Ok(Encoder {
            out,
            opts: *opts,
            bytes: header.len() as u64,
            chunks: 0,
            objects: 0,
            chunks_crc: 0,
            body: Vec::with_capacity(CHUNK_TARGET_BYTES),
            count: 0,
            table: IdTable::default(),
            payload: Vec::new(),
        })
    }

    fn full(&self) -> bool {
        self.body.len() >= CHUNK_TARGET_BYTES || self.count >= CHUNK_TARGET_RECORDS
    }

    /// Writes the records built so far as one chunk of `kind` (nothing when there are none,
    /// unless `always`).
    fn flush(&mut self, kind: u8, always: bool) -> Result<(), SnapshotError> {
        if self.count == 0 && !always {
            return Ok(());
        }
        let raw: &[u8] = if kind == KIND_OBJECTS {
            self.payload.clear();
            self.table.write(&mut self.payload);
            self.payload.extend_from_slice(&self.body);
            &self.payload
        } else {
            &self.body
        };
        let compressed = match self.opts.zstd_level {
            Some(level) if !raw.is_empty() => zstd::bulk::compress(raw, level)
                .ok()
                .filter(|c| c.len() < raw.len() && raw.len() / c.len() < MAX_ZSTD_RATIO as usize),
            _ => None,
        };
        let (codec, stored) = match &compressed {
            Some(c) => (CODEC_ZSTD, c.as_slice()),
            None => (CODEC_RAW, raw),
        };
        let mut header = [0u8; CHUNK_HEADER];
        header[0] = kind;
        header[1] = codec;
        header[4..8].copy_from_slice(&self.count.to_le_bytes());
        header[8..12].copy_from_slice(&(raw.len() as u32).to_le_bytes());
        header[12..16].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..16]), stored);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(stored)?;
        self.bytes += (CHUNK_HEADER + stored.len()) as u64;
        self.chunks += 1;
        self.chunks_crc = crc32c::crc32c_append(self.chunks_crc, &crc.to_le_bytes());
        if kind == KIND_OBJECTS {
            self.objects += u64::from(self.count);
        }
        self.body.clear();
        self.table.clear();
        self.count = 0;
        Ok(())
    }

    fn objects(&mut self, objects: &[ObjectRecord]) -> Result<(), SnapshotError> {
        for o in objects {
            records::put_object(&mut self.body, &mut self.table, o);
            self.count += 1;
            if self.full() {
                self.flush(KIND_OBJECTS, false)?;
            }
        }
        Ok(())
    }

    fn segments(&mut self, segments: &[SegmentRecord]) -> Result<(), SnapshotError> {
        for s in segments {
            if self.full() {
                self.flush(KIND_SEGMENTS, true)?;
            }
            records::put_segment(&mut self.body, s);
            self.count += 1;
        }
        self.flush(KIND_SEGMENTS, true)
    }

    fn policy(&mut self, policy: &TenantPolicy) -> Result<(), SnapshotError> {
        for (tenant, quota) in &policy.tenants {
            if self.full() {
                self.flush(KIND_TENANT_POLICY, true)?;
            }
            records::put_quota(&mut self.body, tenant, *quota);
            self.count += 1;
        }
        self.flush(KIND_TENANT_POLICY, true)
    }

    fn discarded(&mut self, discarded: &[DiscardedRecord]) -> Result<(), SnapshotError> {
        for d in discarded {
            if self.full() {
                self.flush(KIND_DISCARDED, true)?;
            }
            records::put_discarded(&mut self.body, d);
            self.count += 1;
        }
        self.flush(KIND_DISCARDED, true)
    }

    fn counters(&mut self, next_replica_id: u64) -> Result<(), SnapshotError> {
        crate::wire::put_varint(&mut self.body, next_replica_id);
        self.count = 1;
        self.flush(KIND_COUNTERS, true)
    }

    /// Writes the trailer; returns (bytes written in all, objects).
    fn finish(self) -> Result<(u64, u64), SnapshotError> {
        let mut t = [0u8; TRAILER];
        t[0] = KIND_END;
        t[4..8].copy_from_slice(&self.chunks.to_le_bytes());
        t[8..16].copy_from_slice(&self.objects.to_le_bytes());
        t[16..20].copy_from_slice(&self.chunks_crc.to_le_bytes());
        let crc = crc32c::crc32c(&t[..20]);
        t[20..24].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&t)?;
        Ok((self.bytes + TRAILER as u64, self.objects))
    }
}

/// Streams a snapshot of a live `master` to `out`: the segments, the tenant policy, one chunk
/// per shard of objects (built under that shard's read lock only, encoded and compressed with
/// no lock held), the discarded list, the next replica id. Returns the bytes written.
pub fn write_snapshot(
    master: &MasterService,
    meta: &SnapshotMeta,
    opts: &EncodeOptions,
    out: &mut dyn Write,
) -> Result<u64, SnapshotError> {
    write_snapshot_counted(master, meta, opts, out).map(|(bytes, _)| bytes)
}

/// [`write_snapshot`], also returning the number of objects written.
pub(crate) fn write_snapshot_counted(
    master: &MasterService,
    meta: &SnapshotMeta,
    opts: &EncodeOptions,
    out: &mut dyn Write,
) -> Result<(u64, u64), SnapshotError> {
    let mut enc = Encoder::new(out, meta, opts)?;
    enc.segments(&master.segment_records())?;
    enc.policy(&master.tenant_policy())?;
    let mut failed = None;
    master.for_each_shard_records(|_, batch| {
        if failed.is_some() {
            return;
        }
        if let Err(e) = enc
            .objects(batch)
            .and_then(|()| enc.flush(KIND_OBJECTS, false))
        {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    enc.discarded(&master.discarded_records())?;
    enc.counters(master.peek_next_replica_id())?;
    enc.finish()
}

/// The snapshot of `state` as bytes (objects in the order given, in chunks of at most 65,536
/// records or about 1 MiB).
pub fn encode_state(state: &MasterState, meta: &SnapshotMeta, opts: &EncodeOptions) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = encode_state_to(state, meta, opts, &mut out);
    out
}

fn encode_state_to(
    state: &MasterState,
    meta: &SnapshotMeta,
    opts: &EncodeOptions,
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    let mut enc = Encoder::new(out, meta, opts)?;
    enc.segments(&state.segments)?;
    enc.policy(&state.tenant_policy)?;
    enc.objects(&state.objects)?;
    enc.flush(KIND_OBJECTS, false)?;
    enc.discarded(&state.discarded)?;
    enc.counters(state.next_replica_id)?;
    enc.finish().map(drop)
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Reads and verifies the header; returns the meta and the header's length.
fn decode_header(bytes: &[u8]) -> Result<(SnapshotMeta, usize), SnapshotError> {
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

/// The uncompressed payload of a verified chunk.
fn chunk_payload<'a>(
    codec: u8,
    raw_len: u32,
    stored: &'a [u8],
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], SnapshotError> {
    match codec {
        CODEC_RAW => {
            if raw_len as usize != stored.len() {
                return Err(SnapshotError::corrupt(format!(
                    "uncompressed chunk: length {} but {raw_len} declared",
                    stored.len()
                )));
            }
            Ok(stored)
        }
        CODEC_ZSTD => {
            let limit = (stored.len() as u64).saturating_mul(u64::from(MAX_ZSTD_RATIO));
            if u64::from(raw_len) > limit {
                return Err(SnapshotError::corrupt(format!(
                    "zstd chunk: {raw_len} bytes from {} stored is past the ratio limit",
                    stored.len()
                )));
            }
            scratch.clear();
            scratch.reserve(raw_len as usize);
            let decoder = zstd::stream::read::Decoder::with_buffer(stored)
                .map_err(|e| SnapshotError::corrupt(format!("zstd chunk: {e}")))?;
            decoder
                .take(u64::from(raw_len) + 1)
                .read_to_end(scratch)
                .map_err(|e| SnapshotError::corrupt(format!("zstd chunk: {e}")))?;
            if scratch.len() != raw_len as usize {
                return Err(SnapshotError::corrupt(format!(
                    "zstd chunk: decompressed to {} bytes, {raw_len} declared",
                    scratch.len()
                )));
            }
            Ok(scratch)
        }
        c => Err(SnapshotError::corrupt(format!("unknown chunk codec {c}"))),
    }
}

/// What the chunks decoded so far add up to.
#[derive(Default)]
struct Parts {
    state: MasterState,
    counters: bool,
    last_tenant: Option<mooncake_common::TenantId>,
}

impl Parts {
    fn chunk(&mut self, kind: u8, count: u32, payload: &[u8]) -> Result<(), SnapshotError> {
        let count = count as usize;
        let mut r;
        match kind {
            KIND_SEGMENTS => {
                r = Reader::new(payload, "segments chunk");
                self.state.segments.reserve(count.min(payload.len() / 40));
                for _ in 0..count {
                    self.state.segments.push(records::read_segment(&mut r)?);
                }
            }
            KIND_TENANT_POLICY => {
                r = Reader::new(payload, "tenant policy chunk");
                for _ in 0..count {
                    let (tenant, quota) = records::read_quota(&mut r)?;
                    let tenants = &mut self.state.tenant_policy.tenants;
                    if tenants
                        .last_key_value()
                        .is_some_and(|(last, _)| *last >= tenant)
                    {
                        return Err(r.err(format!("tenant {tenant} out of order or repeated")));
                    }
                    tenants.insert(tenant, quota);
                }
            }
            KIND_OBJECTS => {
                r = Reader::new(payload, "objects chunk");
                let ids = IdTable::read(&mut r)?;
                // An object record takes at least 9 bytes.
                self.state.objects.reserve(count.min(r.remaining() / 9));
                for _ in 0..count {
                    let o = records::read_object(&mut r, &ids, &mut self.last_tenant)?;
                    self.state.objects.push(o);
                }
            }
            KIND_DISCARDED => {
                r = Reader::new(payload, "discarded chunk");
                self.state.discarded.reserve(count.min(payload.len() / 2));
                for _ in 0..count {
                    self.state.discarded.push(records::read_discarded(&mut r)?);
                }
            }
            KIND_COUNTERS => {
                r = Reader::new(payload, "counters chunk");
                if count != 1 || self.counters {
                    return Err(r.err("the counters record must appear exactly once"));
                }
                self.state.next_replica_id = r.varint()?;
                self.counters = true;
            }
            k if k >= KIND_OPTIONAL_MIN => return Ok(()),
            k => return Err(SnapshotError::corrupt(format!("unknown chunk kind {k}"))),
        }
        r.finish()
    }
}

/// Decodes a snapshot file, verifying the header, every chunk's CRC and the trailer (chunk
/// count, object count, the CRC over the chunk CRCs); bytes after the trailer are refused.
/// Objects come back sorted by `(tenant, key)` like `MasterService::export_state`; a key that
/// appears twice (an object that moved between shards while a live take ran) keeps the record
/// written last.
pub fn decode(bytes: &[u8]) -> Result<(SnapshotMeta, MasterState), SnapshotError> {
    let (meta, mut pos) = decode_header(bytes)?;
    let mut parts = Parts::default();
    let mut chunks = 0u32;
    let mut objects = 0u64;
    let mut chunks_crc = 0u32;
    let mut scratch = Vec::new();
    loop {
        let left = bytes.len() - pos;
        if left == 0 {
            return Err(SnapshotError::truncated(format!(
                "ends at byte {pos} after {chunks} chunks, without a trailer"
            )));
        }
        if bytes[pos] == KIND_END {
            if left < TRAILER {
                return Err(SnapshotError::truncated(format!(
                    "trailer at byte {pos} cut after {left} bytes"
                )));
            }
            let t = &bytes[pos..pos + TRAILER];
            if crc32c::crc32c(&t[..20]) != le_u32(t, 20) {
                return Err(SnapshotError::corrupt("trailer CRC mismatch"));
            }
            if t[1..4] != [0, 0, 0] {
                return Err(SnapshotError::corrupt(
                    "trailer reserved bytes are not zero",
                ));
            }
            if le_u32(t, 4) != chunks || le_u64(t, 8) != objects || le_u32(t, 16) != chunks_crc {
                return Err(SnapshotError::corrupt(format!(
                    "trailer says {} chunks and {} objects (CRC {:08x}), the file has {chunks} \
                     and {objects} (CRC {chunks_crc:08x})",
                    le_u32(t, 4),
                    le_u64(t, 8),
                    le_u32(t, 16)
                )));
            }
            if left > TRAILER {
                return Err(SnapshotError::corrupt(format!(
                    "{} bytes after the trailer",
                    left - TRAILER
                )));
            }
            break;
        }
        if left < CHUNK_HEADER {
            return Err(SnapshotError::truncated(format!(
                "chunk header at byte {pos} cut after {left} bytes"
            )));
        }
        let h = &bytes[pos..pos + CHUNK_HEADER];
        let (kind, codec, count) = (h[0], h[1], le_u32(h, 4));
        let (raw_len, stored_len, crc) = (le_u32(h, 8), le_u32(h, 12) as usize, le_u32(h, 16));
        let body_at = pos + CHUNK_HEADER;
        if stored_len > bytes.len() - body_at {
            return Err(SnapshotError::truncated(format!(
                "chunk at byte {pos} declares {stored_len} bytes, {} left",
                bytes.len() - body_at
            )));
        }
        let stored = &bytes[body_at..body_at + stored_len];
        if crc32c::crc32c_append(crc32c::crc32c(&h[..16]), stored) != crc {
            return Err(SnapshotError::corrupt(format!(
                "chunk {chunks} at byte {pos}: CRC mismatch"
            )));
        }
        if h[2..4] != [0, 0] {
            return Err(SnapshotError::corrupt(format!(
                "chunk {chunks}: reserved bytes are not zero"
            )));
        }
        if raw_len > MAX_CHUNK_RAW_BYTES {
            return Err(SnapshotError::corrupt(format!(
                "chunk {chunks}: {raw_len} bytes uncompressed is past the limit"
            )));
        }
        let payload = chunk_payload(codec, raw_len, stored, &mut scratch)?;
        parts.chunk(kind, count, payload)?;
        if kind == KIND_OBJECTS {
            objects += u64::from(count);
        }
        chunks += 1;
        chunks_crc = crc32c::crc32c_append(chunks_crc, &crc.to_le_bytes());
        pos = body_at + stored_len;
    }
    if !parts.counters {
        return Err(SnapshotError::corrupt("no counters chunk"));
    }
    let mut state = parts.state;
    sort_objects(&mut state.objects);
    Ok((meta, state))
}

/// Sorts by `(tenant, key)` (stable), keeping the last record of a repeated key.
fn sort_objects(objects: &mut Vec<ObjectRecord>) {
    fn key(o: &ObjectRecord) -> (Option<&str>, &str) {
        (o.tenant.as_ref().map(|t| t.as_str()), o.key.as_str())
    }
    // `None` (the default tenant) sorts first, like `Option`'s order in export_state.
    if objects.windows(2).all(|w| key(&w[0]) < key(&w[1])) {
        return;
    }
    objects.sort_by(|a, b| key(a).cmp(&key(b)));
    objects.dedup_by(|later, kept| {
        if key(later) == key(kept) {
            std::mem::swap(later, kept);
            true
        } else {
            false
        }
    });
}
