//! The leader's side of the op-log in memory: the [`MutationObserver`] that numbers every
//! mutation (gap-free, in the order the master observed them) and queues its entry, the
//! writer's take of the next run of entries, and the durable mark that acknowledgements wait on.
//!
//! Sequence numbers are given at observation, under the sink's queue lock, which the master
//! calls under the lock that serialized the change: the numbering is the master's observed
//! order, and every entry is queued, so the numbers written are 1, 2, 3, … without a gap.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use mooncake_master::{Mutation, MutationObserver};
use mooncake_snapshot::encode_mutation;
use parking_lot::{Condvar, Mutex};

use crate::batch::{put_entry_bytes, MAX_ENTRIES, MAX_ENTRY_BYTES};

/// The writer's health, as acknowledgements see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterHealth {
    /// Batches commit.
    Healthy,
    /// The last commit failed for a reason that may pass (etcd unreachable, a timeout); the
    /// writer retries the same batch.
    Retrying,
    /// A commit was refused because another writer moved the durable prefix (this master was
    /// fenced), or the log is unusable: nothing this sink queues will ever be durable.
    Fenced,
}

/// Why an acknowledgement cannot be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckError {
    /// Not durable yet, and the writer cannot reach etcd (or the wait timed out): retry later.
    Unavailable,
    /// This master no longer owns the log.
    Fenced,
}

/// The entries the writer takes for one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub first_seq: u64,
    pub count: u32,
    /// The entries, each as its length (varint) and its mutation.
    pub entries: Vec<u8>,
}

impl Taken {
    pub fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count) - 1
    }
}

/// How long the writer lets an entry that no reply waits for stay queued, so that it rides in
/// the batch of a later call that does wait (a PutStart's entry in its PutEnd's batch) instead
/// of costing a transaction of its own.
pub const LINGER: Duration = Duration::from_millis(5);

/// After a batch of more than [`BUSY_BATCH`] entries (many callers pipelining), a batch a reply
/// waits for is cut once it is as large as the previous one or its oldest entry is this old, so
/// that the callers answered by the previous commit join the next batch instead of one commit
/// taking the first of them alone and the rest waiting a commit more.
pub const COALESCE: Duration = Duration::from_millis(1);

/// See [`COALESCE`]: a batch this small (one caller's put) is cut as soon as a reply waits.
pub const BUSY_BATCH: usize = 32;

#[derive(Debug)]
struct Queue {
    next_seq: u64,
    entries: VecDeque<Vec<u8>>,
    /// Bytes of `entries`.
    bytes: usize,
    /// When the oldest queued entry was queued (`None` while empty).
    oldest: Option<Instant>,
    /// Entries in the writer's previous batch.
    last_batch: usize,
}

/// The op-log of one leader (see the module doc). Install it with
/// `MasterService::set_observer`.
#[derive(Debug)]
pub struct OpLogSink {
    queue: Mutex<Queue>,
    has_entries: Condvar,
    /// The last sequence number given.
    assigned: AtomicU64,
    /// The last sequence number known durable.
    durable: AtomicU64,
    /// The highest sequence number a reply waits for: the writer commits at once up to it.
    wanted: AtomicU64,
    /// The highest sequence number that was given when the master freed space: every removal
    /// whose space may have been handed out again is at or below it.
    freed: AtomicU64,
    health: AtomicU8,
    durable_lock: Mutex<()>,
    durable_changed: Condvar,
    /// Wakes the asynchronous waits ([`OpLogSink::durable`]) when `durable` or `health` change.
    durable_notify: tokio::sync::Notify,
}

impl OpLogSink {
    /// A sink whose first entry gets `last_durable_seq + 1`.
    pub fn new(last_durable_seq: u64) -> Self {
        OpLogSink {
            queue: Mutex::new(Queue {
                next_seq: last_durable_seq + 1,
                entries: VecDeque::new(),
                bytes: 0,
                oldest: None,
                last_batch: 0,
            }),
            has_entries: Condvar::new(),
            assigned: AtomicU64::new(last_durable_seq),
            durable: AtomicU64::new(last_durable_seq),
            wanted: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            health: AtomicU8::new(0),
            durable_lock: Mutex::new(()),
            durable_changed: Condvar::new(),
            durable_notify: tokio::sync::Notify::new(),
        }
    }

    /// The last sequence number given to a mutation.
    pub fn assigned_seq(&self) -> u64 {
        self.assigned.load(Ordering::Acquire)
    }

    /// The last sequence number known durable.
    pub fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Everything a removal whose space could be handed out now needs durable: the sequence
    /// number given when space was last freed (docs/oplog.md, "When a reply waits").
    pub fn freed_seq(&self) -> u64 {
        self.freed.load(Ordering::Acquire)
    }

    pub fn health(&self) -> WriterHealth {
        match self.health.load(Ordering::Acquire) {
            0 => WriterHealth::Healthy,
            1 => WriterHealth::Retrying,
            _ => WriterHealth::Fenced,
        }
    }

    /// Entries queued and not yet taken by the writer.
    pub fn queued(&self) -> usize {
        self.queue.lock().entries.len()
    }

    /// Set by the writer.
    pub fn set_health(&self, h: WriterHealth) {
        let v = match h {
            WriterHealth::Healthy => 0,
            WriterHealth::Retrying => 1,
            WriterHealth::Fenced => 2,
        };
        self.health.store(v, Ordering::Release);
        if h == WriterHealth::Fenced {
            let mut q = self.queue.lock();
            q.entries.clear();
            q.bytes = 0;
            q.oldest = None;
        }
        self.wake_waiters();
    }

    /// Set by the writer once every entry up to `seq` is durable.
    pub fn mark_durable(&self, seq: u64) {
        self.durable.fetch_max(seq, Ordering::AcqRel);
        self.wake_waiters();
    }

    fn wake_waiters(&self) {
        {
            let _g = self.durable_lock.lock();
            self.durable_changed.notify_all();
        }
        self.durable_notify.notify_waiters();
    }

    /// Someone waits for `seq`: the writer commits what is queued up to it without lingering.
    fn want(&self, seq: u64) {
        if self.wanted.fetch_max(seq, Ordering::AcqRel) < seq {
            // Under the queue lock, so that a writer deciding to linger sees it or is woken.
            let _q = self.queue.lock();
            self.has_entries.notify_one();
        }
    }

    /// Whether the wait for `seq` is over: `Some(Ok)` durable, `Some(Err)` never will be.
    fn wait_over(&self, seq: u64) -> Option<Result<(), AckError>> {
        if self.durable_seq() >= seq {
            Some(Ok(()))
        } else if self.health() == WriterHealth::Fenced {
            Some(Err(AckError::Fenced))
        } else {
            None
        }
    }

    /// [`OpLogSink::wait_durable`] without blocking a thread, for replies the RPC server holds
    /// back (needs a tokio runtime with time).
    pub async fn durable(&self, seq: u64, timeout: Duration) -> Result<(), AckError> {
        let deadline = tokio::time::Instant::now() + timeout;
        if self.wait_over(seq).is_none() {
            self.want(seq);
        }
        loop {
            let changed = self.durable_notify.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if let Some(done) = self.wait_over(seq) {
                return done;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.wait_over(seq).unwrap_or(Err(AckError::Unavailable));
            }
        }
    }

    /// Waits until `seq` is durable, at most `timeout`. While the writer is retrying, an
    /// acknowledgement waits the whole timeout (etcd may return), then answers `Unavailable`.
    pub fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<(), AckError> {
        let deadline = Instant::now() + timeout;
        if self.wait_over(seq).is_none() {
            self.want(seq);
        }
        let mut g = self.durable_lock.lock();
        loop {
            if let Some(done) = self.wait_over(seq) {
                return done;
            }
            if self
                .durable_changed
                .wait_until(&mut g, deadline)
                .timed_out()
            {
                return if self.durable_seq() >= seq {
                    Ok(())
                } else {
                    Err(AckError::Unavailable)
                };
            }
        }
    }

    /// Takes the queued entries for the next batch (at most [`MAX_ENTRY_BYTES`] of entries
    /// and [`MAX_ENTRIES`] entries, never fewer than one), waiting at most `wait` for one. The
    /// batch is cut as soon as a reply waits for a queued entry (after a busy batch: see
    /// [`COALESCE`]), a batch is full, or the oldest entry has been queued for [`LINGER`]; until
    /// then more entries may join it.
    pub fn take(&self, wait: Duration) -> Option<Taken> {
        let deadline = Instant::now() + wait;
        let mut q = self.queue.lock();
        loop {
            let Some(oldest) = q.oldest else {
                if self.has_entries.wait_until(&mut q, deadline).timed_out() && q.entries.is_empty()
                {
                    return None;
                }
                continue;
            };
            let first = q.next_seq - q.entries.len() as u64;
            let full = q.bytes >= MAX_ENTRY_BYTES || q.entries.len() >= MAX_ENTRIES as usize;
            let waited_for = self.wanted.load(Ordering::Acquire) >= first;
            let busy = q.last_batch > BUSY_BATCH && q.entries.len() < q.last_batch;
            let due = if waited_for && busy {
                oldest + COALESCE
            } else if waited_for {
                break;
            } else {
                oldest + LINGER
            };
            if full || Instant::now() >= due {
                break;
            }
            let _ = self.has_entries.wait_until(&mut q, due);
        }
        let n = q.entries.len() as u64;
        let first_seq = q.next_seq - n;
        let mut entries = Vec::new();
        let mut count = 0u32;
        while let Some(e) = q.entries.front() {
            if count > 0 && (entries.len() + e.len() > MAX_ENTRY_BYTES || count == MAX_ENTRIES) {
                break;
            }
            entries.extend_from_slice(e);
            q.entries.pop_front();
            count += 1;
        }
        q.bytes -= entries.len();
        q.last_batch = count as usize;
        if q.entries.is_empty() {
            q.oldest = None;
        }
        Some(Taken {
            first_seq,
            count,
            entries,
        })
    }
}

impl MutationObserver for OpLogSink {
    /// Space was freed: the removal that freed it was observed before (the master emits before
    /// it frees), so it is at or below the last sequence number given.
    fn space_freed(&self) {
        self.freed.fetch_max(self.assigned_seq(), Ordering::AcqRel);
    }

    fn observe(&self, mutation: &Mutation) {
        let mut body = Vec::with_capacity(96);
        encode_mutation(&mut body, mutation);
        let mut entry = Vec::with_capacity(body.len() + 3);
        put_entry_bytes(&mut entry, &body);
        let mut q = self.queue.lock();
        let seq = q.next_seq;
        q.next_seq += 1;
        // The writer needs waking for a first entry (to time its linger) and a full batch.
        let mut wake = false;
        if self.health() != WriterHealth::Fenced {
            if q.oldest.is_none() {
                q.oldest = Some(Instant::now());
                wake = true;
            }
            q.bytes += entry.len();
            wake |= q.bytes >= MAX_ENTRY_BYTES || q.entries.len() + 1 >= MAX_ENTRIES as usize;
            q.entries.push_back(entry);
        }
        self.assigned.store(seq, Ordering::Release);
        drop(q);
        if wake {
            self.has_entries.notify_one();
        }
    }
}
