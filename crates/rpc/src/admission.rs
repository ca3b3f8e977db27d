//! Which connections the server keeps: the connection limit, the per-address cap, and eviction.
//!
//! Every open connection has a [`Slot`] in the [`Admission`] table. A connection is *identified*
//! once the handler accepted one of its requests; until then it is a stranger that has cost the
//! peer nothing but a `connect`. When a new connection would exceed the total limit or its
//! address's cap, the server makes room instead of refusing, in this order:
//! 1. the oldest unidentified connection (of that address, for the per-address cap);
//! 2. the identified connection idle longest, if it has been idle for at least
//!    [`ServerConfig::evict_idle_after`](crate::ServerConfig) and has no request in progress;
//!
//! and refuses the newcomer only when neither exists. An idle flood of strangers therefore never
//! locks out a client: each new client pushes out a stranger. The evicted connection is told why
//! (an error frame) and closed by its own task; its slot leaves the table at once.
//!
//! The table also picks which stalled large frame to shed for a frame waiting for budget
//! (`shed_stalled_holder`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

use crate::budget::BudgetShare;

/// `Slot::holding_since_ns` of a connection that holds no request-buffer budget.
pub(crate) const NOT_HOLDING: u64 = u64::MAX;

/// Why a connection was told to close by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kick {
    None = 0,
    /// Pushed out to make room for a new connection.
    Evicted = 1,
    /// Its partial frame was the oldest holder of request-buffer budget that another frame
    /// waited for.
    Shed = 2,
}

/// One open connection, shared by its task and the table.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) id: u64,
    pub(crate) ip: IpAddr,
    pub(crate) accepted_ns: u64,
    /// Set once the handler accepted a request from this connection.
    pub(crate) identified: AtomicBool,
    /// Last time bytes arrived (ns since the table's epoch).
    pub(crate) last_read_ns: AtomicU64,
    /// Whether part of a request is buffered (the connection is not idle).
    pub(crate) partial: AtomicBool,
    /// When the frame holding request-buffer budget started to arrive (`NOT_HOLDING` if none).
    pub(crate) holding_since_ns: AtomicU64,
    /// Set when another frame shed this one: where to hand its budget share.
    pub(crate) handoff: Mutex<Option<oneshot::Sender<BudgetShare>>>,
    kick_reason: AtomicU8,
    kick: Notify,
}

impl Slot {
    /// Waits until someone tells this connection to close; returns why.
    pub(crate) async fn kicked(&self) -> Kick {
        loop {
            match self.kick_reason.load(Ordering::Acquire) {
                1 => return Kick::Evicted,
                2 => return Kick::Shed,
                _ => {}
            }
            self.kick.notified().await;
        }
    }

    fn kick(&self, reason: Kick) {
        self.kick_reason.store(reason as u8, Ordering::Release);
        self.kick.notify_one();
    }
}

/// What `Admission::admit` decided.
#[derive(Debug)]
pub(crate) enum Admit {
    /// Serve it; `evicted` tells whether another connection was pushed out for it.
    Yes { slot: Arc<Slot>, evicted: bool },
    /// Refuse it, with the reason for the error frame.
    No(&'static str),
}

#[derive(Debug, Default)]
struct Table {
    slots: HashMap<u64, Arc<Slot>>,
    per_ip: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Arc<Slot>> {
        let slot = self.slots.remove(&id)?;
        if let Some(count) = self.per_ip.get_mut(&slot.ip) {
            *count -= 1;
            if *count == 0 {
                self.per_ip.remove(&slot.ip);
            }
        }
        Some(slot)
    }
}

/// The connection table.
#[derive(Debug)]
pub(crate) struct Admission {
    table: Mutex<Table>,
    epoch: Instant,
    max_connections: usize,
    max_per_address: usize,
    evict_idle_after_ns: u64,
}

impl Admission {
    pub(crate) fn new(
        max_connections: usize,
        max_per_address: usize,
        evict_idle_after: Duration,
    ) -> Admission {
        Admission {
            table: Mutex::new(Table::default()),
            epoch: Instant::now(),
            max_connections: max_connections.max(1),
            max_per_address: max_per_address.max(1),
            evict_idle_after_ns: evict_idle_after.as_nanos().min(u64::MAX as u128) as u64,
        }
    }

    /// Nanoseconds since this table was made (the clock of every `*_ns` field).
    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u64::MAX as u128 - 1) as u64
    }

    /// The instant of a `*_ns` value.
    pub(crate) fn instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }

    /// Decides on a new connection from `ip`, pushing out another one if that makes room.
    pub(crate) fn admit(&self, ip: IpAddr) -> Admit {
        let now = self.now_ns();
        let mut table = self.table.lock();
        let mut evicted = false;
        if table.per_ip.get(&ip).copied().unwrap_or(0) >= self.max_per_address {
            match self.victim(&table, now, Some(ip)) {
                Some(id) => {
                    self.evict(&mut table, id);
                    evicted = true;
                }
                None => return Admit::No("too many connections from this address"),
            }
        }
        if table.slots.len() >= self.max_connections {
            match self.victim(&table, now, None) {
                Some(id) => {
                    self.evict(&mut table, id);
                    evicted = true;
                }
                None => return Admit::No("connection limit reached"),
            }
        }
        table.next_id += 1;
        let slot = Arc::new(Slot {
            id: table.next_id,
            ip,
            accepted_ns: now,
            identified: AtomicBool::new(false),
            last_read_ns: AtomicU64::new(now),
            partial: AtomicBool::new(false),
            holding_since_ns: AtomicU64::new(NOT_HOLDING),
            handoff: Mutex::new(None),
            kick_reason: AtomicU8::new(Kick::None as u8),
            kick: Notify::new(),
        });
        table.slots.insert(slot.id, Arc::clone(&slot));
        *table.per_ip.entry(ip).or_insert(0) += 1;
        Admit::Yes { slot, evicted }
    }

    /// The connection to push out (of `ip` only, when given), if any may go.
    fn victim(&self, table: &Table, now: u64, ip: Option<IpAddr>) -> Option<u64> {
        let candidates = table.slots.values().filter(|slot| match ip {
            Some(ip) => slot.ip == ip,
            None => true,
        });
        let mut stranger: Option<&Arc<Slot>> = None;
        let mut idle: Option<&Arc<Slot>> = None;
        for slot in candidates {
            if !slot.identified.load(Ordering::Acquire) {
                let older = match stranger {
                    Some(best) => slot.accepted_ns < best.accepted_ns,
                    None => true,
                };
                if older {
                    stranger = Some(slot);
                }
                continue;
            }
            let last = slot.last_read_ns.load(Ordering::Relaxed);
            let quiet = now.saturating_sub(last) >= self.evict_idle_after_ns
                && !slot.partial.load(Ordering::Relaxed);
            let quieter = match idle {
                Some(best) => last < best.last_read_ns.load(Ordering::Relaxed),
                None => true,
            };
            if quiet && quieter {
                idle = Some(slot);
            }
        }
        stranger.or(idle).map(|slot| slot.id)
    }

    fn evict(&self, table: &mut Table, id: u64) {
        if let Some(slot) = table.remove(id) {
            slot.kick(Kick::Evicted);
        }
    }

    /// Removes a closed connection (a no-op if it was evicted).
    pub(crate) fn release(&self, id: u64) {
        self.table.lock().remove(id);
    }

    /// Sheds, for `waiter`'s frame (which started at `started_ns`), the budget-holding frame
    /// that has been stalled longest, provided it started earlier, has received nothing for at
    /// least `stalled_ns`, and comes from another address (frames of one address never shed
    /// each other, so a flood from one address cannot churn through the budget). The shed
    /// connection is told to close and hands its share to the returned receiver.
    pub(crate) fn shed_stalled_holder(
        &self,
        waiter: &Slot,
        started_ns: u64,
        stalled_ns: u64,
    ) -> Option<oneshot::Receiver<BudgetShare>> {
        let now = self.now_ns();
        let table = self.table.lock();
        let victim = table
            .slots
            .values()
            .filter(|slot| slot.id != waiter.id && slot.ip != waiter.ip)
            .filter(|slot| slot.holding_since_ns.load(Ordering::Acquire) < started_ns)
            .map(|slot| (slot.last_read_ns.load(Ordering::Relaxed), slot))
            .filter(|(last, _)| now.saturating_sub(*last) >= stalled_ns)
            .min_by_key(|(last, _)| *last)
            .map(|(_, slot)| slot)?;
        let (tx, rx) = oneshot::channel();
        *victim.handoff.lock() = Some(tx);
        // Not picked again while it lets go of its budget.
        victim
            .holding_since_ns
            .store(NOT_HOLDING, Ordering::Release);
        victim.kick(Kick::Shed);
        Some(rx)
    }

    /// Open connections.
    pub(crate) fn len(&self) -> usize {
        self.table.lock().slots.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn admitted(admit: Admit) -> (Arc<Slot>, bool) {
        match admit {
            Admit::Yes { slot, evicted } => (slot, evicted),
            Admit::No(why) => panic!("refused: {why}"),
        }
    }

    #[test]
    fn strangers_make_room_oldest_first_and_identified_connections_stay() {
        let table = Admission::new(3, 10, Duration::from_secs(3600));
        let (a, _) = admitted(table.admit(ip(1)));
        let (b, _) = admitted(table.admit(ip(1)));
        let (c, _) = admitted(table.admit(ip(1)));
        a.identified.store(true, Ordering::Release);
        // Full: the oldest stranger (b) goes.
        let (_d, evicted) = admitted(table.admit(ip(2)));
        assert!(evicted);
        assert_eq!(b.kick_reason.load(Ordering::Acquire), Kick::Evicted as u8);
        assert_eq!(c.kick_reason.load(Ordering::Acquire), Kick::None as u8);
        assert_eq!(table.len(), 3);
        c.identified.store(true, Ordering::Release);
        let (_e, _) = admitted(table.admit(ip(2)));
        // a and c are identified and not idle for an hour; e is identified now too.
        for slot in table.table.lock().slots.values() {
            slot.identified.store(true, Ordering::Release);
        }
        assert!(matches!(table.admit(ip(3)), Admit::No(_)));
        assert_eq!(a.kick_reason.load(Ordering::Acquire), Kick::None as u8);
    }

    #[test]
    fn the_per_address_cap_evicts_only_that_addresss_strangers() {
        let table = Admission::new(100, 2, Duration::from_secs(3600));
        let (other, _) = admitted(table.admit(ip(9)));
        let (a, _) = admitted(table.admit(ip(1)));
        let (b, _) = admitted(table.admit(ip(1)));
        a.identified.store(true, Ordering::Release);
        let (_, evicted) = admitted(table.admit(ip(1)));
        assert!(evicted);
        assert_eq!(b.kick_reason.load(Ordering::Acquire), Kick::Evicted as u8);
        assert_eq!(other.kick_reason.load(Ordering::Acquire), Kick::None as u8);
        // Releasing a slot frees its address's count.
        table.release(a.id);
        let (_, evicted) = admitted(table.admit(ip(1)));
        assert!(!evicted);
    }

    #[test]
    fn idle_identified_connections_go_when_no_stranger_is_left() {
        let table = Admission::new(2, 10, Duration::ZERO);
        let (a, _) = admitted(table.admit(ip(1)));
        let (b, _) = admitted(table.admit(ip(1)));
        a.identified.store(true, Ordering::Release);
        b.identified.store(true, Ordering::Release);
        b.partial.store(true, Ordering::Relaxed);
        a.last_read_ns.store(0, Ordering::Relaxed);
        // b has a request in progress: only a may go.
        let (_, evicted) = admitted(table.admit(ip(2)));
        assert!(evicted);
        assert_eq!(a.kick_reason.load(Ordering::Acquire), Kick::Evicted as u8);
        assert_eq!(b.kick_reason.load(Ordering::Acquire), Kick::None as u8);
    }

    #[test]
    fn shedding_picks_the_longest_stalled_earlier_holder_of_another_address() {
        let table = Admission::new(10, 10, Duration::from_secs(1));
        let (a, _) = admitted(table.admit(ip(2)));
        let (b, _) = admitted(table.admit(ip(2)));
        let (same, _) = admitted(table.admit(ip(1)));
        let (waiter, _) = admitted(table.admit(ip(1)));
        for (slot, since, last) in [(&a, 50, 60), (&b, 20, 70), (&same, 10, 0)] {
            slot.holding_since_ns.store(since, Ordering::Release);
            slot.last_read_ns.store(last, Ordering::Relaxed);
        }
        // Nothing started before 10; nothing has been stalled for an hour.
        assert!(table.shed_stalled_holder(&waiter, 10, 0).is_none());
        assert!(table
            .shed_stalled_holder(&waiter, 100, 3_600_000_000_000)
            .is_none());
        // `same` is stalled longest but shares the waiter's address: a (stalled since 60) goes.
        let handoff = table.shed_stalled_holder(&waiter, 100, 0);
        assert!(handoff.is_some());
        assert_eq!(a.kick_reason.load(Ordering::Acquire), Kick::Shed as u8);
        assert!(a.handoff.lock().is_some());
        assert_eq!(b.kick_reason.load(Ordering::Acquire), Kick::None as u8);
        assert_eq!(same.kick_reason.load(Ordering::Acquire), Kick::None as u8);
        // a is no longer a candidate; b is next.
        assert!(table.shed_stalled_holder(&waiter, 100, 0).is_some());
        assert_eq!(b.kick_reason.load(Ordering::Acquire), Kick::Shed as u8);
        assert!(table.shed_stalled_holder(&waiter, 100, 0).is_none());
    }
}
