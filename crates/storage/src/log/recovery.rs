//! Opening the data file and rebuilding the index: checkpoint first, then a scan of the space
//! the checkpoint calls free for records written after it.
//!
//! Why scanning only the checkpoint's free space is enough: space freed after a checkpoint is
//! quarantined until the next checkpoint is durable (see `mod.rs`), so every record written after
//! checkpoint C lies in space that was free in C, is written once in that epoch, and carries
//! `seq >= C.next_seq`. Records of earlier epochs that were removed or replaced have had their
//! header block zeroed (and synced by the checkpoint's `fdatasync`), so they cannot come back.

use super::alloc::OffsetAllocator;
use super::format::{
    self, Checkpoint, FileHeader, RecordHeader, BLOCK_BYTES, CHECKPOINT_FILE, CHECKPOINT_TMP,
    DATA_FILE, DATA_FILE_TMP, LOCK_FILE,
};
use super::LogOptions;
use crate::backend::{BackendConfig, StorageError};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Reads of the recovery scan and the CRC check move this many bytes at a time.
const SCAN_CHUNK_BYTES: u64 = 4 << 20;
/// Most keys listed by name in [`RecoveryReport::dropped`].
const MAX_REPORTED_DROPS: usize = 64;

/// What recovery found. Available from [`super::LogBackend::recovery_report`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The data file did not exist and was created.
    pub created: bool,
    /// A valid checkpoint was loaded.
    pub checkpoint_loaded: bool,
    /// Why an existing checkpoint was ignored (the whole data region is then scanned).
    pub checkpoint_error: Option<String>,
    /// Records kept from the checkpoint (after verification).
    pub from_checkpoint: u64,
    /// Records written after the checkpoint, found by the scan and kept.
    pub from_scan: u64,
    /// Checkpoint entries or post-checkpoint headers whose record failed verification
    /// (torn, checksum mismatch, key mismatch, out of range): dropped, space freed.
    pub dropped_corrupt: u64,
    /// Checkpoint entries whose record lies past the end of a data file found truncated.
    pub truncated: u64,
    /// Checkpoint entries whose header block is zero: removed, evicted or replaced after the
    /// checkpoint (removal zeroes the header). Not corruption.
    pub retired: u64,
    /// Intact records of a key that a record with a higher sequence number replaced.
    pub superseded: u64,
    /// Bytes the scan read (excluding holes it skipped).
    pub scanned_bytes: u64,
    /// Bytes the data file was shorter than its header says (re-extended with zeros).
    pub missing_tail_bytes: u64,
    /// `(key, reason)` of the first dropped (corrupt or truncated) records whose key is known.
    pub dropped: Vec<(String, String)>,
}

/// A record recovery kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    pub offset: u64,
    pub blocks: u64,
    pub value_len: u64,
    pub seq: u64,
    pub data_crc: u32,
}

/// Everything `LogBackend::open` needs.
#[derive(Debug)]
pub struct Opened {
    /// Holds the exclusive `flock` on `log.lock` for as long as the backend is open.
    pub lock: File,
    pub file: File,
    pub header: FileHeader,
    pub records: Vec<(String, Recovered)>,
    pub allocator: OffsetAllocator,
    pub next_seq: u64,
    pub report: RecoveryReport,
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> StorageError {
    move |source| StorageError::Io { op, source }
}

/// Size of the data region for a configured capacity: the capacity plus headroom for record
/// heads and padding, in blocks.
pub fn data_blocks_for(capacity_bytes: u64, options: &LogOptions) -> u64 {
    let cap_blocks = capacity_bytes.div_ceil(BLOCK_BYTES);
    let ratio_blocks = (cap_blocks as f64 * options.headroom_ratio.max(0.0)) as u64;
    let min_blocks = options.min_headroom_bytes.div_ceil(BLOCK_BYTES);
    cap_blocks
        .saturating_add(ratio_blocks.max(min_blocks))
        .max(1)
}

fn file_bytes(data_blocks: u64) -> u64 {
    (1 + data_blocks) * BLOCK_BYTES
}

/// Reserves disk space for the whole file: `fallocate`, or `set_len` where unsupported.
fn preallocate(file: &File, len: u64) -> Result<(), StorageError> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::NOSPC => Err(StorageError::NoSpace {
            needed: len,
            available: 0,
        }),
        Err(_) => file.set_len(len).map_err(io_err("preallocate")),
    }
}

pub fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync dir"))
}

/// Takes the exclusive lock of the root directory, so that two backends (in this process or
/// another) never write one data file at the same time.
fn lock_root(root: &Path) -> Result<File, StorageError> {
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(root.join(LOCK_FILE))
        .map_err(io_err("open"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |e| StorageError::Io {
            op: "open",
            source: io::Error::new(
                ErrorKind::WouldBlock,
                format!(
                    "{} is in use by another open log backend ({e})",
                    root.display()
                ),
            ),
        },
    )?;
    Ok(lock)
}

fn random_file_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

fn remove_if_exists(path: &Path) -> Result<(), StorageError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(StorageError::Io {
            op: "remove",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Opens (or creates) the data file and rebuilds the index.
pub fn open(config: &BackendConfig, options: &LogOptions) -> Result<Opened, StorageError> {
    let root = &config.root;
    std::fs::create_dir_all(root).map_err(io_err("open"))?;
    let lock = lock_root(root)?;
    remove_if_exists(&root.join(DATA_FILE_TMP))?;
    remove_if_exists(&root.join(CHECKPOINT_TMP))?;
    let want_blocks = data_blocks_for(config.capacity_bytes, options);
    let data_path = root.join(DATA_FILE);
    let mut report = RecoveryReport::default();

    if !data_path.exists() {
        let (file, header) = create_data_file(root, &data_path, want_blocks)?;
        report.created = true;
        return Ok(Opened {
            lock,
            file,
            header,
            records: Vec::new(),
            allocator: OffsetAllocator::new(want_blocks),
            next_seq: 1,
            report,
        });
    }

    let (file, header, len) = open_data_file(&data_path, want_blocks, &mut report)?;
    let checkpoint = read_checkpoint(root, &header, &mut report)?;
    report.checkpoint_loaded = checkpoint.is_some();

    let mut recover = Recoverer {
        file: &file,
        file_id: header.file_id,
        data_blocks: header.data_blocks,
        verify_values: options.verify_on_open,
        buf: Vec::new(),
        report: &mut report,
        max_seq_seen: 0,
    };
    let mut winners: HashMap<String, Recovered> = HashMap::new();
    let min_scan_seq = checkpoint.as_ref().map_or(0, |c| c.next_seq);
    let ckpt_ranges = match &checkpoint {
        Some(ckpt) => recover.recover_checkpoint(ckpt, len, &mut winners),
        None => Vec::new(),
    };
    recover
        .scan_complement(&ckpt_ranges, min_scan_seq, &mut winners)
        .map_err(io_err("read"))?;
    let next_seq = min_scan_seq
        .max(recover.max_seq_seen.saturating_add(1))
        .max(1);

    let allocator = OffsetAllocator::from_live(
        header.data_blocks,
        winners
            .values()
            .map(|r| (r.offset / BLOCK_BYTES - 1, r.blocks)),
    )
    .map_err(|e| StorageError::Corrupt {
        key: String::new(),
        reason: format!("recovered records overlap: {e:?}"),
    })?;
    let mut records: Vec<(String, Recovered)> = winners.into_iter().collect();
    records.sort_by_key(|(_, r)| r.seq);
    Ok(Opened {
        lock,
        file,
        header,
        records,
        allocator,
        next_seq,
        report,
    })
}

/// Creates the data file of `want_blocks` blocks (under a temporary name, so that a crash never
/// leaves a headerless data file) and removes a checkpoint left from an older one.
fn create_data_file(
    root: &Path,
    data_path: &Path,
    want_blocks: u64,
) -> Result<(File, FileHeader), StorageError> {
    let tmp = root.join(DATA_FILE_TMP);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err("open"))?;
    let header = FileHeader {
        file_id: random_file_id(),
        data_blocks: want_blocks,
    };
    preallocate(&file, file_bytes(want_blocks))?;
    file.write_all_at(&header.encode_block(), 0)
        .map_err(io_err("write"))?;
    file.sync_all().map_err(io_err("fsync"))?;
    std::fs::rename(&tmp, data_path).map_err(io_err("rename"))?;
    // A checkpoint left from an older data file must not be read against this one.
    remove_if_exists(&root.join(CHECKPOINT_FILE))?;
    sync_dir(root)?;
    Ok((file, header))
}

/// Opens the existing data file: decodes its header (refusing a bad one), grows it to
/// `want_blocks` or back to its recorded size, and rewrites a header copy that is damaged or
/// stale. Returns the file, its header and its length before growing.
fn open_data_file(
    data_path: &Path,
    want_blocks: u64,
    report: &mut RecoveryReport,
) -> Result<(File, FileHeader, u64), StorageError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(data_path)
        .map_err(io_err("open"))?;
    let mut block0 = vec![0u8; BLOCK_BYTES as usize];
    let got = read_up_to(&file, &mut block0, 0).map_err(io_err("read"))?;
    let mut header =
        FileHeader::decode_block(&block0[..got]).map_err(|reason| StorageError::Corrupt {
            key: String::new(),
            reason: format!("data file header: {reason} (refusing to open; nothing was changed)"),
        })?;
    let both_copies_ok = FileHeader::decode(&block0).is_ok()
        && FileHeader::decode(&block0[format::FILE_HEADER_COPY_OFFSET..]).is_ok();
    let len = file.metadata().map_err(io_err("stat"))?.len();
    if len < file_bytes(header.data_blocks) {
        report.missing_tail_bytes = file_bytes(header.data_blocks) - len;
    }
    if header.data_blocks < want_blocks || len < file_bytes(header.data_blocks) {
        header.data_blocks = header.data_blocks.max(want_blocks);
        preallocate(&file, file_bytes(header.data_blocks))?;
    }
    if !both_copies_ok || FileHeader::decode(&block0).ok() != Some(header) {
        file.write_all_at(&header.encode_block(), 0)
            .map_err(io_err("write"))?;
        file.sync_data().map_err(io_err("fdatasync"))?;
    }
    Ok((file, header, len))
}

/// The checkpoint, if there is one that belongs to this data file and fits in it; why one was
/// ignored goes to `report.checkpoint_error`.
fn read_checkpoint(
    root: &Path,
    header: &FileHeader,
    report: &mut RecoveryReport,
) -> Result<Option<Checkpoint>, StorageError> {
    let mut checkpoint = None;
    match std::fs::read(root.join(CHECKPOINT_FILE)) {
        Ok(bytes) => match Checkpoint::decode(&bytes) {
            Ok(c) if c.file_id != header.file_id => {
                report.checkpoint_error = Some("checkpoint belongs to another data file".into());
            }
            Ok(c) if c.data_blocks > header.data_blocks => {
                report.checkpoint_error = Some("checkpoint is larger than the data file".into());
            }
            Ok(c) => checkpoint = Some(c),
            Err(reason) => report.checkpoint_error = Some(reason.to_string()),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => {
            return Err(StorageError::Io {
                op: "read",
                source: e,
            })
        }
    }
    Ok(checkpoint)
}

fn keep(
    winners: &mut HashMap<String, Recovered>,
    report: &mut RecoveryReport,
    key: String,
    rec: Recovered,
) {
    match winners.get(&key) {
        Some(old) if old.seq >= rec.seq => report.superseded += 1,
        Some(_) => {
            report.superseded += 1;
            winners.insert(key, rec);
        }
        None => {
            winners.insert(key, rec);
        }
    }
}

/// Reads as much of `buf` as the file holds at `offset`.
fn read_up_to(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

struct Recoverer<'a> {
    file: &'a File,
    file_id: u64,
    data_blocks: u64,
    verify_values: bool,
    buf: Vec<u8>,
    report: &'a mut RecoveryReport,
    max_seq_seen: u64,
}

impl Recoverer<'_> {
    /// Verifies the checkpoint's entries (in offset order) against the file `len` bytes long,
    /// keeping each that holds; returns the block ranges of those verified, sorted.
    fn recover_checkpoint(
        &mut self,
        ckpt: &Checkpoint,
        len: u64,
        winners: &mut HashMap<String, Recovered>,
    ) -> Vec<(u64, u64)> {
        let mut ckpt_ranges: Vec<(u64, u64)> = Vec::new();
        let mut entries: Vec<&format::CheckpointEntry> = ckpt.entries.iter().collect();
        entries.sort_by_key(|e| e.offset);
        for e in entries {
            let blocks = format::record_blocks(e.key.len() as u64, e.value_len);
            let placed = e.offset % BLOCK_BYTES == 0
                && e.offset >= BLOCK_BYTES
                && (e.offset / BLOCK_BYTES - 1)
                    .checked_add(blocks)
                    .is_some_and(|end| end <= self.data_blocks)
                && ckpt_ranges
                    .last()
                    .is_none_or(|&(s, l)| s + l < e.offset / BLOCK_BYTES);
            if !placed {
                self.drop_record(&e.key, "checkpoint entry out of range or overlapping");
                continue;
            }
            // Last byte recovery needs: the value's, or the key's for an empty value.
            let needed_end = if e.value_len == 0 {
                e.offset + format::RECORD_HEADER_BYTES as u64 + e.key.len() as u64
            } else {
                e.offset + format::head_blocks(e.key.len() as u64) * BLOCK_BYTES + e.value_len
            };
            if needed_end > len {
                // The file was cut short under this record. It may have been live or retired
                // (its header is gone either way): counted apart from detected corruption.
                self.report.truncated += 1;
                if self.report.dropped.len() < MAX_REPORTED_DROPS {
                    self.report.dropped.push((
                        e.key.clone(),
                        "record lies past the end of the truncated file".into(),
                    ));
                }
                continue;
            }
            if self.header_is_zero(e.offset) {
                self.report.retired += 1;
                continue;
            }
            match self.verify(e.offset, Some(e)) {
                Ok((_, h)) => {
                    ckpt_ranges.push((e.offset / BLOCK_BYTES - 1, blocks));
                    self.report.from_checkpoint += 1;
                    keep(
                        winners,
                        self.report,
                        e.key.clone(),
                        Recovered {
                            offset: e.offset,
                            blocks,
                            value_len: h.value_len,
                            seq: h.seq,
                            data_crc: h.data_crc,
                        },
                    );
                }
                Err(reason) => self.drop_record(&e.key, &reason),
            }
        }
        ckpt_ranges
    }

    /// Scans the complement of the verified checkpoint records (`ckpt_ranges`, sorted) for
    /// records from `min_scan_seq` on, and keeps those found.
    fn scan_complement(
        &mut self,
        ckpt_ranges: &[(u64, u64)],
        min_scan_seq: u64,
        winners: &mut HashMap<String, Recovered>,
    ) -> io::Result<()> {
        let mut cursor = 0u64;
        let mut regions = Vec::new();
        for &(s, l) in ckpt_ranges {
            if s > cursor {
                regions.push((cursor, s));
            }
            cursor = s + l;
        }
        if cursor < self.data_blocks {
            regions.push((cursor, self.data_blocks));
        }
        let mut found = Vec::new();
        for (start, end) in regions {
            self.scan_region(start, end, min_scan_seq, &mut found)?;
        }
        for (key, rec) in found {
            self.report.from_scan += 1;
            keep(winners, self.report, key, rec);
        }
        Ok(())
    }

    fn drop_record(&mut self, key: &str, reason: &str) {
        self.report.dropped_corrupt += 1;
        if self.report.dropped.len() < MAX_REPORTED_DROPS {
            self.report
                .dropped
                .push((key.to_owned(), reason.to_owned()));
        }
    }

    /// Whether the record header at `offset` was zeroed (the record was retired).
    fn header_is_zero(&self, offset: u64) -> bool {
        let mut head = [0u8; format::RECORD_HEADER_BYTES];
        matches!(read_up_to(self.file, &mut head, offset), Ok(n) if n == head.len())
            && head.iter().all(|&b| b == 0)
    }

    /// Reads and checks the record at byte `offset`: header, file id, key, and (unless disabled
    /// for checkpoint entries) the CRC of key ‖ value. `expect` is the checkpoint's view of it.
    fn verify(
        &mut self,
        offset: u64,
        expect: Option<&format::CheckpointEntry>,
    ) -> Result<(String, RecordHeader), String> {
        let mut head = [0u8; BLOCK_BYTES as usize];
        let got = read_up_to(self.file, &mut head, offset).map_err(|e| e.to_string())?;
        let h = RecordHeader::decode(&head[..got]).map_err(str::to_string)?;
        if h.file_id != self.file_id {
            return Err("record of another data file".into());
        }
        let blocks = format::record_blocks(u64::from(h.key_len), h.value_len);
        if (offset / BLOCK_BYTES - 1).saturating_add(blocks) > self.data_blocks {
            return Err("record runs past the data region".into());
        }
        // The key may spill into further head blocks.
        let key_end = format::RECORD_HEADER_BYTES + h.key_len as usize;
        let mut key_bytes = head[format::RECORD_HEADER_BYTES..key_end.min(head.len())].to_vec();
        if key_end > head.len() {
            let mut rest = vec![0u8; key_end - head.len()];
            let n = read_up_to(self.file, &mut rest, offset + BLOCK_BYTES)
                .map_err(|e| e.to_string())?;
            if n < rest.len() {
                return Err("key truncated".into());
            }
            key_bytes.extend_from_slice(&rest);
        }
        let key = String::from_utf8(key_bytes).map_err(|_| "key is not UTF-8".to_string())?;
        if let Some(e) = expect {
            if e.key != key
                || e.seq != h.seq
                || e.value_len != h.value_len
                || e.data_crc != h.data_crc
            {
                return Err("record does not match its checkpoint entry".into());
            }
            if !self.verify_values {
                return Ok((key, h));
            }
        }
        let mut crc = crc32c::crc32c(key.as_bytes());
        let value_offset = offset + format::head_blocks(u64::from(h.key_len)) * BLOCK_BYTES;
        let mut done = 0u64;
        while done < h.value_len {
            let n = (h.value_len - done).min(SCAN_CHUNK_BYTES) as usize;
            self.buf.resize(n, 0);
            let got = read_up_to(self.file, &mut self.buf[..n], value_offset + done)
                .map_err(|e| e.to_string())?;
            if got < n {
                return Err("value truncated".into());
            }
            crc = crc32c::crc32c_append(crc, &self.buf[..n]);
            done += n as u64;
        }
        if crc != h.data_crc {
            return Err("value checksum mismatch".into());
        }
        Ok((key, h))
    }

    /// Walks blocks `[start, end)` looking for records with `seq >= min_seq`; holes are skipped.
    fn scan_region(
        &mut self,
        start: u64,
        end: u64,
        min_seq: u64,
        found: &mut Vec<(String, Recovered)>,
    ) -> io::Result<()> {
        let mut chunk = vec![0u8; SCAN_CHUNK_BYTES as usize];
        let mut pos = start;
        while pos < end {
            let byte = (1 + pos) * BLOCK_BYTES;
            // Skip holes (never-written or unwritten preallocated space reads as zeros).
            let data_end_block = match rustix::fs::seek(self.file, rustix::fs::SeekFrom::Data(byte))
            {
                Ok(data) => {
                    let data_block = (data / BLOCK_BYTES).saturating_sub(1);
                    if data_block > pos {
                        pos = data_block;
                        continue;
                    }
                    match rustix::fs::seek(self.file, rustix::fs::SeekFrom::Hole(data)) {
                        Ok(hole) => hole.div_ceil(BLOCK_BYTES).saturating_sub(1).min(end),
                        Err(_) => end,
                    }
                }
                Err(e) if e == rustix::io::Errno::NXIO => break,
                Err(_) => end,
            };
            let chunk_end = data_end_block
                .max(pos + 1)
                .min(pos + SCAN_CHUNK_BYTES / BLOCK_BYTES)
                .min(end);
            let n = ((chunk_end - pos) * BLOCK_BYTES) as usize;
            let got = read_up_to(self.file, &mut chunk[..n], byte)?;
            self.report.scanned_bytes += got as u64;
            let mut next = chunk_end;
            for b in 0..(chunk_end - pos) {
                let at = (b * BLOCK_BYTES) as usize;
                let Some(block) = chunk.get(at..(at + format::RECORD_HEADER_BYTES).min(got)) else {
                    break;
                };
                if !RecordHeader::has_magic(block) {
                    continue;
                }
                let Ok(h) = RecordHeader::decode(block) else {
                    continue;
                };
                if h.file_id != self.file_id || h.seq < min_seq {
                    continue; // another file's bytes, or a record of an earlier epoch
                }
                self.max_seq_seen = self.max_seq_seen.max(h.seq);
                let block_no = pos + b;
                let blocks = format::record_blocks(u64::from(h.key_len), h.value_len);
                let offset = (1 + block_no) * BLOCK_BYTES;
                if block_no + blocks > end {
                    self.drop_record("", "record runs past its free region");
                    continue;
                }
                match self.verify(offset, None) {
                    Ok((key, h)) => {
                        found.push((
                            key,
                            Recovered {
                                offset,
                                blocks,
                                value_len: h.value_len,
                                seq: h.seq,
                                data_crc: h.data_crc,
                            },
                        ));
                        next = block_no + blocks;
                        break;
                    }
                    Err(reason) => {
                        let key = self.read_key_lossy(offset, h.key_len);
                        self.drop_record(&key, &reason);
                    }
                }
            }
            pos = next;
        }
        Ok(())
    }

    /// The key of a record that failed verification, for the report (best effort).
    fn read_key_lossy(&self, offset: u64, key_len: u32) -> String {
        let mut key = vec![0u8; key_len.min(4096) as usize];
        match read_up_to(
            self.file,
            &mut key,
            offset + format::RECORD_HEADER_BYTES as u64,
        ) {
            Ok(n) => String::from_utf8_lossy(&key[..n]).into_owned(),
            Err(_) => String::new(),
        }
    }
}
