//! Client liveness bookkeeping (as upstream's master): the bounded ping queue and the per-client
//! deadlines. Plain data with its own locks (leaves of the lock order); what an expiry does to the
//! segments and objects is `liveness.rs`.
//!
//! A client becomes known by Ping, MountSegment or ReMountSegment, each of which pushes its id onto
//! the queue, or by starting a put or upsert ([`ClientMonitor::track`]): a writer that dies
//! before its first Ping is expired like any other, and its puts in flight are reaped with it.
//! [`ClientMonitor::expire`] drains the queue into `deadline = now + ttl` and returns (and
//! forgets) the clients whose deadline has passed.

use std::collections::{HashMap, VecDeque};

use mooncake_common::ClientId;
use parking_lot::Mutex;

/// Capacity of the ping queue (upstream: 128 Ki entries). A full queue answers INTERNAL_ERROR.
pub const PING_QUEUE_CAPACITY: usize = 128 * 1024;

#[derive(Debug, Default)]
pub(crate) struct ClientMonitor {
    queue: Mutex<VecDeque<ClientId>>,
    deadlines: Mutex<HashMap<ClientId, u64>>,
}

impl ClientMonitor {
    /// Pushes a heartbeat; false when the queue is full.
    pub fn push(&self, client: ClientId) -> bool {
        let mut q = self.queue.lock();
        if q.len() >= PING_QUEUE_CAPACITY {
            return false;
        }
        q.push_back(client);
        true
    }

    /// Refreshes the deadlines of every queued heartbeat to `now + ttl`, then removes and returns
    /// the clients whose deadline is before `now`.
    pub fn expire(&self, now_ms: u64, ttl_ms: u64) -> Vec<ClientId> {
        let pinged: Vec<ClientId> = self.queue.lock().drain(..).collect();
        let mut deadlines = self.deadlines.lock();
        for c in pinged {
            deadlines.insert(c, now_ms.saturating_add(ttl_ms));
        }
        let expired: Vec<ClientId> = deadlines
            .iter()
            .filter(|&(_, &d)| d < now_ms)
            .map(|(&c, _)| c)
            .collect();
        for c in &expired {
            deadlines.remove(c);
        }
        expired
    }

    /// Starts tracking `client` with the deadline a heartbeat now would give it, unless it has a
    /// deadline already (which stays: only heartbeats extend it).
    pub fn track(&self, client: ClientId, now_ms: u64, ttl_ms: u64) {
        self.deadlines
            .lock()
            .entry(client)
            .or_insert(now_ms.saturating_add(ttl_ms));
    }

    /// Number of clients with a deadline.
    pub fn tracked(&self) -> usize {
        self.deadlines.lock().len()
    }
}
