//! Batches: what callers submit, and how each entry's completion is reported.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::crc::{crc32c, crc32c_combine};
use crate::endpoint::Endpoint;
use crate::error::TransferError;
use crate::registry::InflightGuard;

/// Direction of an entry, seen from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Remote segment → local memory.
    Read,
    /// Local memory → remote segment.
    Write,
}

/// One entry of a batch. `local_addr..local_addr+len_bytes` must lie inside a region registered
/// with this engine; the remote range is checked by the side that owns it.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    pub op: Op,
    pub local_addr: usize,
    pub len_bytes: u64,
    pub remote: Arc<Endpoint>,
    pub segment_id: u64,
    pub remote_offset: u64,
    /// Compute the CRC32C of the entry's local bytes once they are final (after a read landed,
    /// after a write was sent), chunk by chunk on whichever thread moved the chunk while the
    /// bytes are still in its cache; [`Batch::checksum`] gives the combined value.
    pub checksum: bool,
}

impl TransferRequest {
    /// Read `len_bytes` at `remote_offset` of the remote segment into `local_addr`.
    pub fn read(
        local_addr: *mut u8,
        len_bytes: u64,
        remote: &Arc<Endpoint>,
        segment_id: u64,
        remote_offset: u64,
    ) -> Self {
        TransferRequest {
            op: Op::Read,
            local_addr: local_addr as usize,
            len_bytes,
            remote: Arc::clone(remote),
            segment_id,
            remote_offset,
            checksum: false,
        }
    }

    /// Write `len_bytes` from `local_addr` to `remote_offset` of the remote segment.
    pub fn write(
        local_addr: *const u8,
        len_bytes: u64,
        remote: &Arc<Endpoint>,
        segment_id: u64,
        remote_offset: u64,
    ) -> Self {
        TransferRequest {
            op: Op::Write,
            local_addr: local_addr as usize,
            len_bytes,
            remote: Arc::clone(remote),
            segment_id,
            remote_offset,
            checksum: false,
        }
    }

    /// Asks for the CRC32C of this entry's local bytes (see [`TransferRequest::checksum`]).
    pub fn with_checksum(mut self) -> Self {
        self.checksum = true;
        self
    }
}

/// Where one entry stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryStatus {
    Pending,
    Completed,
    Failed(TransferError),
}

#[derive(Debug)]
struct EntrySlot {
    chunks_left: AtomicUsize,
    /// First error of any chunk; `Some(Ok)` once every chunk succeeded.
    result: Mutex<Option<Result<(), TransferError>>>,
    first_error: Mutex<Option<TransferError>>,
    /// `(offset in the entry, length, CRC32C)` of each checksummed chunk that succeeded.
    pieces: Mutex<Vec<(usize, usize, u32)>>,
    /// Combined CRC32C of the entry, set when it completed with every piece present.
    checksum: Mutex<Option<u32>>,
}

/// Shared completion state of one batch.
#[derive(Debug)]
pub(crate) struct BatchState {
    entries: Vec<EntrySlot>,
    entries_left: AtomicUsize,
    lock: Mutex<()>,
    done: Condvar,
    notify: tokio::sync::Notify,
    deadline: Instant,
}

impl BatchState {
    pub(crate) fn new(entry_count: usize, deadline: Instant) -> Arc<BatchState> {
        Arc::new(BatchState {
            entries: (0..entry_count)
                .map(|_| EntrySlot {
                    chunks_left: AtomicUsize::new(0),
                    result: Mutex::new(None),
                    first_error: Mutex::new(None),
                    pieces: Mutex::new(Vec::new()),
                    checksum: Mutex::new(None),
                })
                .collect(),
            entries_left: AtomicUsize::new(entry_count),
            lock: Mutex::new(()),
            done: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            deadline,
        })
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Declares how many chunks entry `index` was split into (before any chunk runs).
    pub(crate) fn set_chunks(&self, index: usize, chunks: usize) {
        self.entries[index]
            .chunks_left
            .store(chunks, Ordering::Release);
    }

    /// Finishes an entry that never produced chunks (validation failure or zero length).
    pub(crate) fn finish_entry(&self, index: usize, result: Result<(), TransferError>) {
        let slot = &self.entries[index];
        *slot.result.lock() = Some(result);
        self.entry_done();
    }

    /// One chunk of entry `index` is over: its memory is no longer touched by anyone.
    /// `piece` is the chunk's `(offset in the entry, length, CRC32C)` when it was asked for.
    pub(crate) fn finish_chunk(
        &self,
        index: usize,
        result: Result<(), TransferError>,
        piece: Option<(usize, usize, u32)>,
    ) {
        let slot = &self.entries[index];
        match result {
            Err(err) => {
                let mut first = slot.first_error.lock();
                if first.is_none() {
                    *first = Some(err);
                }
            }
            Ok(()) => {
                if let Some(piece) = piece {
                    slot.pieces.lock().push(piece);
                }
            }
        }
        if slot.chunks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let outcome = match slot.first_error.lock().take() {
                Some(err) => Err(err),
                None => Ok(()),
            };
            if outcome.is_ok() {
                *slot.checksum.lock() = combine_pieces(&mut slot.pieces.lock());
            }
            *slot.result.lock() = Some(outcome);
            self.entry_done();
        }
    }

    fn entry_done(&self) {
        if self.entries_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _guard = self.lock.lock();
            self.done.notify_all();
            self.notify.notify_waiters();
        }
    }

    fn is_done(&self) -> bool {
        self.entries_left.load(Ordering::Acquire) == 0
    }
}

/// The CRC32C of a whole entry from its chunks' pieces, `None` unless they tile it from 0.
fn combine_pieces(pieces: &mut [(usize, usize, u32)]) -> Option<u32> {
    pieces.sort_unstable_by_key(|p| p.0);
    let (&(first_offset, first_len, first_crc), rest) = pieces.split_first()?;
    if first_offset != 0 {
        return None;
    }
    let mut end = first_len;
    let mut crc = first_crc;
    for &(offset, len, piece) in rest {
        if offset != end {
            return None;
        }
        crc = crc32c_combine(crc, piece, len as u64);
        end += len;
    }
    Some(crc)
}

/// A submitted batch. Dropping it does not cancel anything: entries still run to completion
/// (their memory stays pinned by the engine until then).
#[derive(Debug, Clone)]
pub struct Batch {
    state: Arc<BatchState>,
}

impl Batch {
    pub(crate) fn new(state: Arc<BatchState>) -> Batch {
        Batch { state }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.state.entries.len()
    }

    /// True for an empty batch.
    pub fn is_empty(&self) -> bool {
        self.state.entries.is_empty()
    }

    /// True once every entry has completed or failed.
    pub fn is_done(&self) -> bool {
        self.state.is_done()
    }

    /// Status of entry `index` (`None` past the end).
    pub fn status(&self, index: usize) -> Option<EntryStatus> {
        let slot = self.state.entries.get(index)?;
        Some(match &*slot.result.lock() {
            None => EntryStatus::Pending,
            Some(Ok(())) => EntryStatus::Completed,
            Some(Err(err)) => EntryStatus::Failed(err.clone()),
        })
    }

    /// CRC32C of entry `index`'s local bytes, once it completed successfully, if it was
    /// submitted with [`TransferRequest::with_checksum`] and has a non-zero length.
    pub fn checksum(&self, index: usize) -> Option<u32> {
        *self.state.entries.get(index)?.checksum.lock()
    }

    /// Blocks until every entry is over; returns one result per entry, in order. Entries end by
    /// their deadline (engine `entry_timeout_ms`), so this returns in bounded time.
    pub fn wait(&self) -> Vec<Result<(), TransferError>> {
        let mut guard = self.state.lock.lock();
        while !self.state.is_done() {
            // Periodic re-check guards against a missed wakeup; completion normally notifies.
            self.state
                .done
                .wait_for(&mut guard, Duration::from_millis(100));
        }
        drop(guard);
        self.results()
    }

    /// Blocks at most `timeout`; `None` if some entry is still pending then.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Vec<Result<(), TransferError>>> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.state.lock.lock();
        while !self.state.is_done() {
            if self.state.done.wait_until(&mut guard, deadline).timed_out() && !self.state.is_done()
            {
                return None;
            }
        }
        drop(guard);
        Some(self.results())
    }

    /// Async wait: resolves when every entry is over. Never blocks the executor.
    pub async fn wait_async(&self) -> Vec<Result<(), TransferError>> {
        loop {
            let notified = self.state.notify.notified();
            if self.state.is_done() {
                return self.results();
            }
            notified.await;
        }
    }

    fn results(&self) -> Vec<Result<(), TransferError>> {
        self.state
            .entries
            .iter()
            .map(|slot| {
                slot.result
                    .lock()
                    .clone()
                    .unwrap_or(Err(TransferError::ShuttingDown))
            })
            .collect()
    }
}

/// One piece of an entry, moved by exactly one transport. It is finished (or dropped) only
/// after its transport stopped touching the memory; it then reports to the batch and releases
/// the local pin, so `unregister` returning implies the entry is reported.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) batch: Arc<BatchState>,
    pub(crate) index: usize,
    pub(crate) op: Op,
    /// First local byte of this chunk (inside the pinned region).
    pub(crate) local_ptr: usize,
    pub(crate) len_bytes: usize,
    pub(crate) segment_id: u64,
    pub(crate) remote_offset: u64,
    pub(crate) remote: Arc<Endpoint>,
    /// Pin of the local region, shared by the chunks of one entry; `None` once reported.
    pub(crate) pin: Option<Arc<InflightGuard>>,
    /// Offset of this chunk's first byte inside its entry.
    pub(crate) entry_offset: usize,
    /// Whether to checksum the chunk's local bytes when it succeeds.
    pub(crate) checksum: bool,
    /// The checksum, when the transport computed it while moving the bytes.
    pub(crate) crc: Option<u32>,
}

impl Chunk {
    pub(crate) fn local_ptr(&self) -> *mut u8 {
        self.local_ptr as *mut u8
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.batch.deadline()
    }

    /// Bytes this chunk puts on the wire after its request header.
    pub(crate) fn payload_len(&self) -> usize {
        match self.op {
            Op::Read => 0,
            Op::Write => self.len_bytes,
        }
    }

    /// Reports the result, then releases the local pin.
    pub(crate) fn finish(mut self, result: Result<(), TransferError>) {
        self.report(result);
    }

    fn report(&mut self, result: Result<(), TransferError>) {
        if let Some(pin) = self.pin.take() {
            // The memory is no longer touched. Report first, then unpin: an `unregister` that
            // sees the pin count reach zero then also sees the entry completed.
            let piece = (self.checksum && result.is_ok()).then(|| {
                let crc = self.crc.unwrap_or_else(|| {
                    // SAFETY: the chunk's local range lies inside the region `pin` keeps
                    // registered, and its transport is done with it: nothing writes it until
                    // the entry reports.
                    crc32c(unsafe {
                        std::slice::from_raw_parts(self.local_ptr as *const u8, self.len_bytes)
                    })
                });
                (self.entry_offset, self.len_bytes, crc)
            });
            self.batch.finish_chunk(self.index, result, piece);
            drop(pin);
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // A chunk dropped without a result (a queue torn down at shutdown) still completes.
        self.report(Err(TransferError::ShuttingDown));
    }
}
