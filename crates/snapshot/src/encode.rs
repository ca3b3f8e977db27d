//! The encoder (docs/snapshot.md, "Taking"): records are appended to one reusable buffer, sealed
//! into chunks of about 1 MiB, compressed on a small pool of threads and written in file order.
//!
//! A live take encodes each shard's objects straight from the index under that shard's read
//! lock ([`MasterService::visit_shard`]): no owned record per object, no sort. Sealing a chunk
//! inside the lock only moves bytes; compression, the CRC and the write happen after the lock is
//! released. With zstd, [`COMPRESS_THREADS`] threads compress while the taking thread goes on
//! reading shards; at most [`IN_FLIGHT`] chunks are between the two, so memory stays bounded.

use std::io::Write;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread;
use std::time::Duration;

use mooncake_master::mutation::{DiscardedRecord, SegmentRecord};
use mooncake_master::{MasterService, MasterState, ObjectView, TenantPolicy, SHARD_COUNT};

use crate::format::{
    header_bytes, CHUNK_HEADER, CODEC_RAW, CODEC_ZSTD, KIND_COUNTERS, KIND_DISCARDED, KIND_END,
    KIND_OBJECTS, KIND_SEGMENTS, KIND_TENANT_POLICY, MAX_ZSTD_RATIO, TRAILER,
};
use crate::records::{self, IdTable};
use crate::{EncodeOptions, SnapshotError, SnapshotMeta};

/// A writer seals a chunk once its payload reaches this size ...
const CHUNK_TARGET_BYTES: usize = 1 << 20;
/// ... or this many records.
const CHUNK_TARGET_RECORDS: u32 = 65_536;
/// Threads that compress chunks during a take with zstd.
pub const COMPRESS_THREADS: usize = 2;
/// Most chunks sealed but not yet written (each up to about 1 MiB, twice: raw and compressed).
pub const IN_FLIGHT: usize = 2 * COMPRESS_THREADS;
/// [`encode_state`] compresses on the calling thread below this many objects (threads would
/// cost more than they save).
const POOL_MIN_OBJECTS: usize = 20_000;

/// A chunk whose records are complete.
struct Sealed {
    kind: u8,
    count: u32,
    payload: Vec<u8>,
}

/// A chunk ready to write: its header (CRC included) and its stored bytes.
struct Framed {
    header: [u8; CHUNK_HEADER],
    crc: u32,
    kind: u8,
    count: u32,
    zstd: bool,
    payload: Vec<u8>,
    compressed: Vec<u8>,
}

impl Framed {
    fn stored(&self) -> &[u8] {
        if self.zstd {
            &self.compressed
        } else {
            &self.payload
        }
    }
}

/// Compresses `s` with `cctx` when that makes it smaller (within [`MAX_ZSTD_RATIO`]) into
/// `compressed` (a spare buffer), and frames it.
fn frame(s: Sealed, cctx: Option<&mut zstd::bulk::Compressor<'_>>, compressed: Vec<u8>) -> Framed {
    let mut compressed = compressed;
    let raw_len = s.payload.len();
    let mut zstd = false;
    if let Some(cctx) = cctx.filter(|_| raw_len > 0) {
        compressed.clear();
        compressed.reserve(zstd::zstd_safe::compress_bound(raw_len));
        if let Ok(n) = cctx.compress_to_buffer(&s.payload, &mut compressed) {
            zstd = n > 0 && n < raw_len && raw_len / n < MAX_ZSTD_RATIO as usize;
        }
    }
    let stored_len = if zstd { compressed.len() } else { raw_len };
    let mut header = [0u8; CHUNK_HEADER];
    header[0] = s.kind;
    header[1] = if zstd { CODEC_ZSTD } else { CODEC_RAW };
    header[4..8].copy_from_slice(&s.count.to_le_bytes());
    header[8..12].copy_from_slice(&(raw_len as u32).to_le_bytes());
    header[12..16].copy_from_slice(&(stored_len as u32).to_le_bytes());
    let stored = if zstd {
        &compressed[..]
    } else {
        &s.payload[..]
    };
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[..16]), stored);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    Framed {
        header,
        crc,
        kind: s.kind,
        count: s.count,
        zstd,
        payload: s.payload,
        compressed,
    }
}

/// One compression thread: frames every chunk it is sent, in order, until its channel closes.
fn compress_loop(level: i32, jobs: Receiver<(Sealed, Vec<u8>)>, done: mpsc::Sender<Framed>) {
    // Without a context (out of memory) chunks are stored uncompressed.
    let mut cctx = zstd::bulk::Compressor::new(level).ok();
    for (sealed, spare) in jobs {
        if done.send(frame(sealed, cctx.as_mut(), spare)).is_err() {
            return;
        }
    }
}

/// The compression threads: chunk `n` goes to thread `n % COMPRESS_THREADS`, and each thread
/// answers in the order it was sent, so reading the answers round-robin is file order.
struct Pool {
    jobs: Vec<SyncSender<(Sealed, Vec<u8>)>>,
    done: Vec<Receiver<Framed>>,
    sent: usize,
    written: usize,
}

/// Writes chunks to `out` in order (through the pool, or framing them on this thread), keeping
/// what the trailer needs; builds the records of the chunk being filled.
pub(crate) struct Encoder<'w> {
    out: &'w mut dyn Write,
    pool: Option<Pool>,
    /// Compresses on this thread when there is no pool.
    inline: Option<zstd::bulk::Compressor<'static>>,
    chunk_delay: Duration,
    bytes: u64,
    chunks: u32,
    objects: u64,
    chunks_crc: u32,
    /// The chunk being filled: its records, their count, the id table (objects).
    body: Vec<u8>,
    count: u32,
    table: IdTable,
    /// Chunks sealed but not yet handed on (sealing happens under a shard lock; handing on
    /// after it).
    sealed: Vec<Sealed>,
    /// Buffers to reuse.
    spare: Vec<Vec<u8>>,
}

impl<'w> Encoder<'w> {
    fn new(
        out: &'w mut dyn Write,
        meta: &SnapshotMeta,
        opts: &EncodeOptions,
        pool: Option<Pool>,
    ) -> Result<Self, SnapshotError> {
        let header = header_bytes(meta);
        out.write_all(&header)?;
        let inline = match (&pool, opts.zstd_level) {
            (None, Some(level)) => zstd::bulk::Compressor::new(level).ok(),
            _ => None,
        };
        Ok(Encoder {
            out,
            pool,
            inline,
            chunk_delay: opts.test_chunk_delay,
            bytes: header.len() as u64,
            chunks: 0,
            objects: 0,
            chunks_crc: 0,
            body: Vec::with_capacity(CHUNK_TARGET_BYTES + 4096),
            count: 0,
            table: IdTable::default(),
            sealed: Vec::new(),
            spare: Vec::new(),
        })
    }

    fn full(&self) -> bool {
        self.body.len() >= CHUNK_TARGET_BYTES || self.count >= CHUNK_TARGET_RECORDS
    }

    /// Seals the records built so far as one chunk of `kind` (even with none).
    fn seal(&mut self, kind: u8) {
        let mut payload = self.spare.pop().unwrap_or_default();
        payload.clear();
        if kind == KIND_OBJECTS {
            self.table.write(&mut payload);
            self.table.clear();
        }
        payload.extend_from_slice(&self.body);
        self.sealed.push(Sealed {
            kind,
            count: self.count,
            payload,
        });
        self.body.clear();
        self.count = 0;
    }

    /// Appends one object record, sealing the chunk when it is full. Never blocks or writes
    /// (it runs under a shard's read lock).
    pub(crate) fn object(&mut self, o: &ObjectView<'_>) {
        records::put_object(&mut self.body, &mut self.table, o);
        self.count += 1;
        if self.full() {
            self.seal(KIND_OBJECTS);
        }
    }

    /// Hands the sealed chunks on: to the pool, or framed and written here.
    pub(crate) fn flush(&mut self) -> Result<(), SnapshotError> {
        for s in std::mem::take(&mut self.sealed) {
            if self.pool.is_none() {
                let spare = self.spare.pop().unwrap_or_default();
                let framed = frame(s, self.inline.as_mut(), spare);
                self.write(framed)?;
                continue;
            }
            if self
                .pool
                .as_ref()
                .is_some_and(|p| p.sent - p.written >= IN_FLIGHT)
            {
                self.write_oldest()?;
            }
            let spare = self.spare.pop().unwrap_or_default();
            if let Some(pool) = self.pool.as_mut() {
                let n = pool.sent % pool.jobs.len();
                pool.jobs[n].send((s, spare)).map_err(|_| pool_gone())?;
                pool.sent += 1;
            }
        }
        Ok(())
    }

    /// Waits for the oldest chunk the pool holds and writes it.
    fn write_oldest(&mut self) -> Result<(), SnapshotError> {
        let Some(pool) = self.pool.as_mut() else {
            return Ok(());
        };
        let n = pool.written % pool.done.len();
        let framed = pool.done[n].recv().map_err(|_| pool_gone())?;
        pool.written += 1;
        self.write(framed)
    }

    fn write(&mut self, f: Framed) -> Result<(), SnapshotError> {
        self.out.write_all(&f.header)?;
        self.out.write_all(f.stored())?;
        self.bytes += (CHUNK_HEADER + f.stored().len()) as u64;
        self.chunks += 1;
        self.chunks_crc = crc32c::crc32c_append(self.chunks_crc, &f.crc.to_le_bytes());
        if f.kind == KIND_OBJECTS {
            self.objects += u64::from(f.count);
        }
        self.spare.push(f.payload);
        self.spare.push(f.compressed);
        if !self.chunk_delay.is_zero() {
            thread::sleep(self.chunk_delay);
        }
        Ok(())
    }

    /// Seals the objects not yet sealed and hands every chunk on.
    pub(crate) fn end_objects(&mut self) -> Result<(), SnapshotError> {
        if self.count > 0 {
            self.seal(KIND_OBJECTS);
        }
        self.flush()
    }

    /// Records of one kind in as many chunks as their size needs (at least one).
    fn records<T>(
        &mut self,
        kind: u8,
        items: impl IntoIterator<Item = T>,
        mut put: impl FnMut(&mut Vec<u8>, T),
    ) -> Result<(), SnapshotError> {
        for item in items {
            if self.full() {
                self.seal(kind);
            }
            put(&mut self.body, item);
            self.count += 1;
        }
        self.seal(kind);
        self.flush()
    }

    pub(crate) fn segments(&mut self, segments: &[SegmentRecord]) -> Result<(), SnapshotError> {
        self.records(KIND_SEGMENTS, segments, records::put_segment)
    }

    pub(crate) fn policy(&mut self, policy: &TenantPolicy) -> Result<(), SnapshotError> {
        self.records(KIND_TENANT_POLICY, &policy.tenants, |out, (t, q)| {
            records::put_quota(out, t, *q)
        })
    }

    pub(crate) fn discarded(&mut self, discarded: &[DiscardedRecord]) -> Result<(), SnapshotError> {
        self.records(KIND_DISCARDED, discarded, records::put_discarded)
    }

    pub(crate) fn counters(&mut self, next_replica_id: u64) -> Result<(), SnapshotError> {
        self.records(KIND_COUNTERS, [next_replica_id], crate::wire::put_varint)
    }

    /// Writes every chunk still in the pool, then the trailer; returns (bytes written in all,
    /// objects).
    pub(crate) fn finish(mut self) -> Result<(u64, u64), SnapshotError> {
        self.flush()?;
        while self.pool.as_ref().is_some_and(|p| p.written < p.sent) {
            self.write_oldest()?;
        }
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

fn pool_gone() -> SnapshotError {
    SnapshotError::Io(std::io::Error::other("a snapshot compression thread ended"))
}

/// Runs `f` with an encoder on `out` (the header written), with a compression pool when zstd
/// is on and `pooled`. A pool that cannot be started leaves the compression to this thread.
fn with_encoder<R>(
    out: &mut dyn Write,
    meta: &SnapshotMeta,
    opts: &EncodeOptions,
    pooled: bool,
    f: impl FnOnce(Encoder<'_>) -> Result<R, SnapshotError>,
) -> Result<R, SnapshotError> {
    let level = match opts.zstd_level {
        Some(level) if pooled => level,
        _ => return f(Encoder::new(out, meta, opts, None)?),
    };
    thread::scope(|scope| {
        let mut pool = Pool {
            jobs: Vec::new(),
            done: Vec::new(),
            sent: 0,
            written: 0,
        };
        for _ in 0..COMPRESS_THREADS {
            let (job_tx, job_rx) = mpsc::sync_channel(IN_FLIGHT);
            let (done_tx, done_rx) = mpsc::channel();
            let started = thread::Builder::new()
                .name("mc-snapshot-zstd".into())
                .spawn_scoped(scope, move || compress_loop(level, job_rx, done_tx));
            if started.is_err() {
                break;
            }
            pool.jobs.push(job_tx);
            pool.done.push(done_rx);
        }
        let pool = (!pool.jobs.is_empty()).then_some(pool);
        // The encoder (and with it the pool's channels) is dropped before the scope joins.
        f(Encoder::new(out, meta, opts, pool)?)
    })
}

/// Streams a snapshot of a live `master` to `out`: the segments, the tenant policy, the
/// objects shard by shard (each shard's records encoded under its read lock only, compressed
/// and written with no lock held), the discarded list, the next replica id. Returns the bytes
/// written.
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
    with_encoder(out, meta, opts, true, |mut enc| {
        enc.segments(&master.segment_records())?;
        enc.policy(&master.tenant_policy())?;
        for shard in 0..SHARD_COUNT {
            master.visit_shard(shard, |o| enc.object(o));
            enc.flush()?;
        }
        enc.end_objects()?;
        enc.discarded(&master.discarded_records())?;
        enc.counters(master.peek_next_replica_id())?;
        enc.finish()
    })
}

/// The snapshot of `state` as bytes (objects in the order given, in chunks of at most 65,536
/// records or about 1 MiB).
pub fn encode_state(state: &MasterState, meta: &SnapshotMeta, opts: &EncodeOptions) -> Vec<u8> {
    let mut out = Vec::new();
    let pooled = state.objects.len() >= POOL_MIN_OBJECTS;
    // Writing to a Vec cannot fail.
    let _ = with_encoder(&mut out, meta, opts, pooled, |mut enc| {
        enc.segments(&state.segments)?;
        enc.policy(&state.tenant_policy)?;
        for o in &state.objects {
            enc.object(&o.view());
            if !enc.sealed.is_empty() {
                enc.flush()?;
            }
        }
        enc.end_objects()?;
        enc.discarded(&state.discarded)?;
        enc.counters(state.next_replica_id)?;
        enc.finish()
    });
    out
}
