//! The master's random source: every random choice the master makes (placement start points,
//! the random walk, the start shard of batch reads, the source of a copy task, task ids) draws
//! from one [`MasterRng`] that the constructor gets, so a seed replays the same decisions.
//!
//! **Algorithm.** SplitMix64 streams. Each thread draws from its own stream (a thread-local
//! state, so the hot paths take no lock and share no cache line); a thread's stream is forked
//! from the master's seed and a per-master fork counter the first time the thread draws from that
//! master (or after it drew from another master). One thread driving a master alone therefore gets
//! the same sequence for the same seed; with several threads the interleaving is not reproducible
//! anyway, and each stream is still a good generator.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Distinguishes master instances in the thread-local stream slot (never reused, unlike an
/// address).
static INSTANCES: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// `(instance, state)` of the stream this thread last drew from.
    static STREAM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seedable random source shared by one master's threads (see the module doc).
pub struct MasterRng {
    seed: u64,
    instance: u64,
    forks: AtomicU64,
}

impl fmt::Debug for MasterRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterRng")
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl MasterRng {
    /// A source whose decisions are fixed by `seed`.
    pub fn with_seed(seed: u64) -> Self {
        MasterRng {
            seed,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            forks: AtomicU64::new(0),
        }
    }

    /// A source seeded from the operating system's entropy (through `fastrand`'s seeding).
    pub fn from_entropy() -> Self {
        Self::with_seed(fastrand::u64(..))
    }

    /// The seed (log it to replay a run).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next 64 random bits of the calling thread's stream.
    #[inline]
    pub fn next_u64(&self) -> u64 {
        STREAM.with(|slot| {
            let (instance, mut state) = slot.get();
            if instance != self.instance {
                let fork = self.forks.fetch_add(1, Ordering::Relaxed);
                state = mix(self.seed ^ mix(fork.wrapping_add(GAMMA)));
            }
            state = state.wrapping_add(GAMMA);
            slot.set((self.instance, state));
            mix(state)
        })
    }

    /// A uniform index in `0..n` (0 when `n == 0`), by multiply-shift (no modulo bias worth
    /// naming for the small `n` the master uses).
    #[inline]
    pub fn below(&self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_sequence_and_seeds_differ() {
        let draw = |seed| {
            let rng = MasterRng::with_seed(seed);
            (0..32).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn alternating_masters_on_one_thread_stay_deterministic() {
        let run = || {
            let (a, b) = (MasterRng::with_seed(1), MasterRng::with_seed(2));
            (0..16)
                .map(|i| {
                    if i % 3 == 0 {
                        b.next_u64()
                    } else {
                        a.next_u64()
                    }
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn below_stays_in_range() {
        let rng = MasterRng::with_seed(3);
        assert_eq!(rng.below(0), 0);
        for n in 1..50 {
            assert!((0..200).all(|_| rng.below(n) < n));
        }
    }
}
