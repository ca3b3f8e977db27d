//! Time, injected. Every deadline in the master (leases, soft pins, put timeouts, client TTL)
//! reads a [`Clock`], so tests advance a [`ManualClock`] instead of sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of milliseconds. Values never go backwards for one clock instance.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds on this clock's time line.
    fn now_ms(&self) -> u64;
}

/// Wall-clock milliseconds since the UNIX epoch, clamped so that it never goes backwards (a
/// stepped-back system clock holds the last value instead of shortening leases).
#[derive(Debug, Default)]
pub struct SystemClock {
    last_ms: AtomicU64,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock::default()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        // Write only when time moved (once per ms), so concurrent readers don't bounce the line.
        let last = self.last_ms.load(Ordering::Relaxed);
        if wall_ms <= last {
            return last;
        }
        let prev = self.last_ms.fetch_max(wall_ms, Ordering::Relaxed);
        prev.max(wall_ms)
    }
}

/// A clock that moves only when told to. For tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now_ms: AtomicU64::new(start_ms),
        }
    }

    /// Moves time forward by `delta_ms` (saturating) and returns the new time.
    pub fn advance(&self, delta_ms: u64) -> u64 {
        let mut current = self.now_ms.load(Ordering::Relaxed);
        loop {
            let next = current.saturating_add(delta_ms);
            match self.now_ms.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => current = seen,
            }
        }
    }

    /// Sets the time; a value in the past is ignored (the clock never goes backwards).
    pub fn set(&self, now_ms: u64) {
        self.now_ms.fetch_max(now_ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        assert_eq!(c.advance(250), 1_250);
        assert_eq!(c.now_ms(), 1_250);
        c.set(100);
        assert_eq!(c.now_ms(), 1_250, "set must not go backwards");
        c.set(5_000);
        assert_eq!(c.now_ms(), 5_000);
        c.advance(u64::MAX);
        assert_eq!(c.now_ms(), u64::MAX);
    }

    #[test]
    fn system_clock_is_monotonic_and_near_wall_time() {
        let c = SystemClock::new();
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a);
        assert!(a > 1_600_000_000_000, "ms since epoch expected, got {a}");
    }
}
