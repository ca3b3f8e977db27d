//! The verifying decoder (docs/snapshot.md, "Decoding"): a scan checks the header, every
//! chunk's framing and CRC and the trailer; then the payloads are decompressed and parsed, the
//! object chunks split between this thread and one more ([`DECODE_THREADS`]) by stored size.
//! The first error in file order is the one reported, whichever thread met it.

use std::collections::{HashMap, HashSet};
use std::thread;

use mooncake_common::TenantId;
use mooncake_master::{MasterState, ObjectRecord};

use crate::format::{
    decode_header, le_u32, le_u64, CHUNK_HEADER, CODEC_RAW, CODEC_ZSTD, KIND_COUNTERS,
    KIND_DISCARDED, KIND_END, KIND_OBJECTS, KIND_OPTIONAL_MIN, KIND_SEGMENTS, KIND_TENANT_POLICY,
    MAX_CHUNK_RAW_BYTES, MAX_ZSTD_RATIO, TRAILER,
};
use crate::records::{self, IdTable};
use crate::wire::Reader;
use crate::{SnapshotError, SnapshotMeta};

/// Threads that parse object chunks (this one included).
pub const DECODE_THREADS: usize = 2;
/// Object chunks smaller than this in all (stored bytes) are parsed on this thread alone.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// A chunk whose framing and CRC verified.
struct Chunk<'a> {
    /// Its position among the chunks.
    index: u32,
    kind: u8,
    codec: u8,
    count: u32,
    raw_len: u32,
    stored: &'a [u8],
}

/// The chunks from `pos` on, and the first framing error (nothing after it was read) or the
/// trailer's verdict.
fn scan(bytes: &[u8], mut pos: usize) -> (Vec<Chunk<'_>>, Result<(), SnapshotError>) {
    let mut chunks = Vec::new();
    let mut objects = 0u64;
    let mut chunks_crc = 0u32;
    loop {
        let n = chunks.len() as u32;
        let left = bytes.len() - pos;
        if left == 0 {
            let e = format!("ends at byte {pos} after {n} chunks, without a trailer");
            return (chunks, Err(SnapshotError::truncated(e)));
        }
        if bytes[pos] == KIND_END {
            let verdict = trailer(&bytes[pos..], pos, n, objects, chunks_crc);
            return (chunks, verdict);
        }
        if left < CHUNK_HEADER {
            let e = format!("chunk header at byte {pos} cut after {left} bytes");
            return (chunks, Err(SnapshotError::truncated(e)));
        }
        let h = &bytes[pos..pos + CHUNK_HEADER];
        let (kind, codec, count) = (h[0], h[1], le_u32(h, 4));
        let (raw_len, stored_len, crc) = (le_u32(h, 8), le_u32(h, 12) as usize, le_u32(h, 16));
        let body_at = pos + CHUNK_HEADER;
        if stored_len > bytes.len() - body_at {
            let e = format!(
                "chunk at byte {pos} declares {stored_len} bytes, {} left",
                bytes.len() - body_at
            );
            return (chunks, Err(SnapshotError::truncated(e)));
        }
        let stored = &bytes[body_at..body_at + stored_len];
        let refused = if crc32c::crc32c_append(crc32c::crc32c(&h[..16]), stored) != crc {
            Some(format!("chunk {n} at byte {pos}: CRC mismatch"))
        } else if h[2..4] != [0, 0] {
            Some(format!("chunk {n}: reserved bytes are not zero"))
        } else if raw_len > MAX_CHUNK_RAW_BYTES {
            Some(format!(
                "chunk {n}: {raw_len} bytes uncompressed is past the limit"
            ))
        } else {
            None
        };
        if let Some(e) = refused {
            return (chunks, Err(SnapshotError::corrupt(e)));
        }
        if kind == KIND_OBJECTS {
            objects += u64::from(count);
        }
        chunks_crc = crc32c::crc32c_append(chunks_crc, &crc.to_le_bytes());
        chunks.push(Chunk {
            index: n,
            kind,
            codec,
            count,
            raw_len,
            stored,
        });
        pos = body_at + stored_len;
    }
}

/// Verifies the trailer at the start of `t` (at byte `pos`) against what the scan counted.
fn trailer(
    t: &[u8],
    pos: usize,
    chunks: u32,
    objects: u64,
    chunks_crc: u32,
) -> Result<(), SnapshotError> {
    let left = t.len();
    if left < TRAILER {
        return Err(SnapshotError::truncated(format!(
            "trailer at byte {pos} cut after {left} bytes"
        )));
    }
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
            "trailer says {} chunks and {} objects (CRC {:08x}), the file has {chunks} and \
             {objects} (CRC {chunks_crc:08x})",
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
    Ok(())
}

/// Decompresses chunks, reusing one zstd context and one buffer.
#[derive(Default)]
struct Payloads {
    dctx: Option<zstd::bulk::Decompressor<'static>>,
    scratch: Vec<u8>,
}

impl Payloads {
    /// The uncompressed payload of `c`. Decompression writes into a buffer of exactly the
    /// declared length (itself bounded by the stored length times [`MAX_ZSTD_RATIO`]).
    fn of<'a>(&'a mut self, c: &Chunk<'a>) -> Result<&'a [u8], SnapshotError> {
        let (raw_len, stored) = (c.raw_len, c.stored);
        match c.codec {
            CODEC_RAW if raw_len as usize == stored.len() => Ok(stored),
            CODEC_RAW => Err(SnapshotError::corrupt(format!(
                "uncompressed chunk: length {} but {raw_len} declared",
                stored.len()
            ))),
            CODEC_ZSTD => {
                let limit = (stored.len() as u64).saturating_mul(u64::from(MAX_ZSTD_RATIO));
                if u64::from(raw_len) > limit {
                    return Err(SnapshotError::corrupt(format!(
                        "zstd chunk: {raw_len} bytes from {} stored is past the ratio limit",
                        stored.len()
                    )));
                }
                let zstd_err =
                    |e: std::io::Error| SnapshotError::corrupt(format!("zstd chunk: {e}"));
                if self.dctx.is_none() {
                    self.dctx = Some(zstd::bulk::Decompressor::new().map_err(zstd_err)?);
                }
                let dctx = self
                    .dctx
                    .as_mut()
                    .ok_or_else(|| SnapshotError::corrupt("zstd"))?;
                self.scratch.clear();
                self.scratch.reserve_exact(raw_len as usize);
                let n = dctx
                    .decompress_to_buffer(stored, &mut self.scratch)
                    .map_err(zstd_err)?;
                if n != raw_len as usize {
                    return Err(SnapshotError::corrupt(format!(
                        "zstd chunk: decompressed to {n} bytes, {raw_len} declared"
                    )));
                }
                Ok(&self.scratch)
            }
            c => Err(SnapshotError::corrupt(format!("unknown chunk codec {c}"))),
        }
    }
}

/// Parses the object records of `c` onto `out`.
fn object_chunk(
    c: &Chunk<'_>,
    payloads: &mut Payloads,
    out: &mut Vec<ObjectRecord>,
) -> Result<(), SnapshotError> {
    let payload = payloads.of(c)?;
    let mut r = Reader::new(payload, "objects chunk");
    let ids = IdTable::read(&mut r)?;
    // An object record takes at least 9 bytes (usually reserved already, see `room_for`).
    out.reserve((c.count as usize).min(r.remaining() / 9));
    let mut last_tenant: Option<TenantId> = None;
    for _ in 0..c.count {
        out.push(records::read_object(&mut r, &ids, &mut last_tenant)?);
    }
    r.finish()
}

/// How many records to make room for at once before parsing `chunks` (growing a vector of a
/// million records step by step would copy it and fault in fresh pages several times): their
/// declared counts, each capped by what its bytes can hold, and by its stored length, so that
/// what hostile input makes us reserve stays proportional to its size.
fn room_for(chunks: &[&Chunk<'_>]) -> usize {
    chunks
        .iter()
        .map(|c| {
            (c.count as usize)
                .min(c.raw_len as usize / 9)
                .min(c.stored.len())
        })
        .sum()
}

/// Parses the object chunks `chunks` onto `out`, in order; the first error comes back with its
/// chunk's index (nothing after it is parsed).
fn object_chunks(
    chunks: &[&Chunk<'_>],
    out: &mut Vec<ObjectRecord>,
) -> Result<(), (u32, SnapshotError)> {
    out.reserve(room_for(chunks));
    let mut payloads = Payloads::default();
    for c in chunks {
        object_chunk(c, &mut payloads, out).map_err(|e| (c.index, e))?;
    }
    Ok(())
}

/// What the chunks other than objects add up to.
#[derive(Default)]
struct Parts {
    state: MasterState,
    counters: bool,
}

impl Parts {
    fn chunk(&mut self, c: &Chunk<'_>, payloads: &mut Payloads) -> Result<(), SnapshotError> {
        let count = c.count as usize;
        let payload = payloads.of(c)?;
        let mut r;
        match c.kind {
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

/// The object chunks split in two by stored size: those this thread parses, and those a second
/// thread parses (none when the chunks are small in all).
fn split_objects<'c, 'a>(chunks: &'c [Chunk<'a>]) -> (Vec<&'c Chunk<'a>>, Vec<&'c Chunk<'a>>) {
    let objects: Vec<&Chunk<'a>> = chunks.iter().filter(|c| c.kind == KIND_OBJECTS).collect();
    let total: usize = objects.iter().map(|c| c.stored.len()).sum();
    if DECODE_THREADS < 2 || objects.len() < 2 || total < PARALLEL_MIN_BYTES {
        return (objects, Vec::new());
    }
    let mut here = 0usize;
    let split = objects
        .iter()
        .position(|c| {
            here += c.stored.len();
            here * 2 >= total
        })
        .map_or(objects.len(), |i| i + 1);
    let mut first = objects;
    let second = first.split_off(split.min(first.len()));
    (first, second)
}

/// Decodes a snapshot file, verifying the header, every chunk's CRC and the trailer (chunk
/// count, object count, the CRC over the chunk CRCs); bytes after the trailer are refused.
/// Objects come back in file order (a live take writes them shard by shard, not sorted). A key
/// that appears twice (an object that moved between shards while a live take ran: the two
/// copies are in different shards, so at least one has a group) keeps the record written last.
pub fn decode(bytes: &[u8]) -> Result<(SnapshotMeta, MasterState), SnapshotError> {
    let (meta, pos) = decode_header(bytes)?;
    let (chunks, framing) = scan(bytes, pos);
    let (first, second) = split_objects(&chunks);
    let mut objects = Vec::with_capacity(room_for(&first) + room_for(&second));
    let mut parts = Parts::default();
    let mut payloads = Payloads::default();
    let (mine, theirs) = thread::scope(|scope| {
        let helper = (!second.is_empty()).then(|| {
            thread::Builder::new()
                .name("mc-snapshot-decode".into())
                .spawn_scoped(scope, || {
                    let mut out = Vec::new();
                    let result = object_chunks(&second, &mut out);
                    (out, result)
                })
        });
        let mut mine: Result<(), (u32, SnapshotError)> = Ok(());
        let mut first = first.iter().peekable();
        for c in &chunks {
            let result = if c.kind == KIND_OBJECTS {
                match first.peek() {
                    Some(f) if f.index == c.index => {
                        first.next();
                        object_chunk(c, &mut payloads, &mut objects)
                    }
                    _ => continue,
                }
            } else {
                parts.chunk(c, &mut payloads)
            };
            if let Err(e) = result {
                mine = Err((c.index, e));
                break;
            }
        }
        let theirs = match helper {
            None => None,
            Some(Ok(handle)) => Some(handle.join().unwrap_or_else(|_| {
                (
                    Vec::new(),
                    Err((0, SnapshotError::corrupt("decoding thread panicked"))),
                )
            })),
            // Could not start a thread: parse them here.
            Some(Err(_)) => {
                let mut out = Vec::new();
                let result = object_chunks(&second, &mut out);
                Some((out, result))
            }
        };
        (mine, theirs)
    });
    let (mut more, theirs) = theirs.unwrap_or((Vec::new(), Ok(())));
    match (mine, theirs) {
        (Err((i, e)), Err((j, _))) if i <= j => return Err(e),
        (_, Err((_, e))) | (Err((_, e)), _) => return Err(e),
        (Ok(()), Ok(())) => {}
    }
    framing?;
    if !parts.counters {
        return Err(SnapshotError::corrupt("no counters chunk"));
    }
    objects.append(&mut more);
    drop_superseded(&mut objects);
    let mut state = parts.state;
    state.objects = objects;
    Ok((meta, state))
}

/// Keeps only the last record of a key that appears more than once. Only an object that
/// changed shards during a live take appears twice, and one of its copies then has a group:
/// without grouped objects there is nothing to look for.
fn drop_superseded(objects: &mut Vec<ObjectRecord>) {
    fn key(o: &ObjectRecord) -> (Option<&str>, &str) {
        (o.tenant.as_ref().map(TenantId::as_str), o.key.as_str())
    }
    if !objects.iter().any(|o| o.group.is_some()) {
        return;
    }
    let keep: Vec<bool> = {
        let grouped: HashSet<(Option<&str>, &str)> = objects
            .iter()
            .filter(|o| o.group.is_some())
            .map(key)
            .collect();
        let mut last: HashMap<(Option<&str>, &str), usize> = HashMap::new();
        for (i, o) in objects.iter().enumerate() {
            let k = key(o);
            if grouped.contains(&k) {
                last.insert(k, i);
            }
        }
        objects
            .iter()
            .enumerate()
            .map(|(i, o)| last.get(&key(o)).is_none_or(|&l| l == i))
            .collect()
    };
    let mut i = 0;
    objects.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}
