//! The master's two deadline queues: buffers of pre-empted or timed-out puts waiting for their
//! release time (the discarded list), and soft-pin deadlines waiting to expire. Plain data: the
//! steps that drain them are `put_timeouts.rs` and `pins.rs`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use mooncake_common::TenantId;

use crate::allocator::BufferHandle;

/// Buffers kept allocated until `release_at_ms`, so that a late write from an old writer cannot
/// land in reused memory.
#[derive(Debug)]
pub(crate) struct DiscardedBuffers {
    pub release_at_ms: u64,
    pub buffers: Vec<BufferHandle>,
}

/// The discarded list, in push order.
#[derive(Debug, Default)]
pub(crate) struct DiscardedList {
    pub entries: Vec<DiscardedBuffers>,
}

impl DiscardedList {
    /// Takes out every entry whose release time has come (`release_at_ms <= now_ms`), keeping
    /// the order of the rest. The caller drops them (which frees the buffers).
    pub fn take_due(&mut self, now_ms: u64) -> Vec<DiscardedBuffers> {
        if !self.entries.iter().any(|d| d.release_at_ms <= now_ms) {
            return Vec::new();
        }
        let (due, keep) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|d| d.release_at_ms <= now_ms);
        self.entries = keep;
        due
    }

    /// Drops the buffers whose segment is gone (they hold nothing any more).
    pub fn drop_dead(&mut self) {
        for d in self.entries.iter_mut() {
            d.buffers.retain(BufferHandle::is_live);
        }
        self.entries.retain(|d| !d.buffers.is_empty());
    }

    /// Number of buffers waiting.
    pub fn buffer_count(&self) -> usize {
        self.entries.iter().map(|d| d.buffers.len()).sum()
    }
}

/// An entry of the soft-pin deadline heap.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SoftPinDeadline {
    pub deadline_ms: u64,
    pub tenant: Option<TenantId>,
    pub key: Box<str>,
}

/// Soft-pin deadlines, earliest first. An entry whose object changed meanwhile is harmless: the
/// expiry step clears a pin only if the object still carries that deadline.
#[derive(Debug, Default)]
pub(crate) struct SoftPinQueue {
    heap: BinaryHeap<Reverse<SoftPinDeadline>>,
}

impl SoftPinQueue {
    pub fn push(&mut self, deadline: SoftPinDeadline) {
        self.heap.push(Reverse(deadline));
    }

    /// Pops every deadline `<= now_ms`, earliest first.
    pub fn pop_due(&mut self, now_ms: u64) -> Vec<SoftPinDeadline> {
        let mut due = Vec::new();
        while self
            .heap
            .peek()
            .is_some_and(|Reverse(e)| e.deadline_ms <= now_ms)
        {
            if let Some(Reverse(e)) = self.heap.pop() {
                due.push(e);
            }
        }
        due
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }
}
