//! Hot-key replicas (upstream's `dynamic_replication_*` settings; docs/master.md "Hot-key
//! replicas").
//!
//! * **Heat.** With the mode `observe` or `enforce`, every read answered with a memory replica
//!   counts one hit of its key in a count-min sketch ([`HeatSketch`]: 4 rows of 4096 atomic
//!   counters, 64 KiB whatever the number of keys) that starts over every heat window. A key
//!   whose estimate reaches `ceil(admission_qps × window_s)` (at least 1) while it has fewer
//!   than `max_memory_replicas` memory replicas is **hot**. A key is judged hot at most once
//!   per [`COOLDOWN_MS`] (a bounded map of recent decisions).
//! * **Observe** only counts: reads, hot keys (`/metrics`).
//! * **Enforce** also queues a copy task (the same task path as `CreateCopyTask`) from a segment
//!   holding the key to one more segment: an OK segment without a replica of the key, under
//!   [`TARGET_MAX_USAGE`] full, the one with the highest FNV-1a score of (key, segment name), so
//!   the choice is stable and spreads keys over segments. The node holding the source runs the
//!   task. The key and its target are registered as an **extra** replica.
//! * **Reads spread.** In enforce mode a read answer with two or more memory replicas lists them
//!   in rotating order (one master-wide counter), and clients read the first replica among those
//!   equally close to them: readers of a replicated key alternate between its replicas. Each
//!   answer counts one read led by its first replica's endpoint (`/metrics`), under the
//!   [`HotKeys`] mutex.
//! * **Extras go first.** When eviction runs (the background cycle or a put that found no
//!   space), every registered extra replica whose object is idle (no lease, no read pin, no
//!   write or task in flight) and still holds another memory replica is dropped before any whole
//!   object is considered; only then, if memory is still short, are objects evicted.
//!
//! Mode `off` (the default) costs one branch per read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mooncake_common::{
    ErrorCode, GetReplicaListResponse, ReplicaKind, SegmentStatus, TaskId, TaskStatus, TaskType,
};
use serde::{Deserialize, Serialize};

use crate::handle::MasterService;
use crate::index::key_hash;
use crate::object::{Replica, ReplicaData};

/// Upstream's `dynamic_replication_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DynamicReplicationMode {
    /// No heat is counted.
    #[default]
    Off,
    /// Heat is counted and hot keys are reported; nothing is copied.
    Observe,
    /// Hot keys get extra memory replicas.
    Enforce,
}

impl std::str::FromStr for DynamicReplicationMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "off" => Ok(Self::Off),
            "observe" => Ok(Self::Observe),
            "enforce" => Ok(Self::Enforce),
            other => Err(format!("unknown mode {other:?} (off, observe, enforce)")),
        }
    }
}

/// A key is judged hot at most once in this long (upstream's cooldown between actions).
pub const COOLDOWN_MS: u64 = 30_000;
/// A segment fuller than this does not receive extra replicas (upstream's 85%).
pub const TARGET_MAX_USAGE: f64 = 0.85;
/// Keys remembered for the cooldown, and extra replicas registered, at most.
pub const MAX_TRACKED_KEYS: usize = 10_000;

const SKETCH_DEPTH: usize = 4;
const SKETCH_WIDTH_BITS: u32 = 12;
const SKETCH_SEEDS: [u64; SKETCH_DEPTH] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0xD6E8_FEB8_6659_FD93,
];

/// Per-key hits in the current heat window: a count-min sketch of atomic counters (never
/// under-counts; over-counts only on collisions), cleared when a window ends.
#[derive(Debug)]
pub(crate) struct HeatSketch {
    rows: Vec<Box<[AtomicU32]>>,
    window_start_ms: AtomicU64,
}

impl Default for HeatSketch {
    fn default() -> Self {
        let row = || {
            (0..1usize << SKETCH_WIDTH_BITS)
                .map(|_| AtomicU32::new(0))
                .collect()
        };
        HeatSketch {
            rows: (0..SKETCH_DEPTH).map(|_| row()).collect(),
            window_start_ms: AtomicU64::new(0),
        }
    }
}

impl HeatSketch {
    /// Counts one hit of `hash` at `now_ms`; returns its estimated hits in the current window.
    pub fn bump(&self, hash: u64, now_ms: u64, window_ms: u64) -> u32 {
        self.roll(now_ms, window_ms);
        let mut estimate = u32::MAX;
        for (row, seed) in self.rows.iter().zip(SKETCH_SEEDS) {
            let i = ((hash ^ seed).wrapping_mul(0x2545_F491_4F6C_DD1D) >> (64 - SKETCH_WIDTH_BITS))
                as usize;
            let before = row[i].fetch_add(1, Ordering::Relaxed);
            estimate = estimate.min(before.saturating_add(1));
        }
        estimate
    }

    /// Starts a new window (all counts zero) once the current one is `window_ms` old. Hits
    /// counted while another thread clears are kept or lost: heat is an estimate.
    fn roll(&self, now_ms: u64, window_ms: u64) {
        let start = self.window_start_ms.load(Ordering::Acquire);
        if now_ms.saturating_sub(start) < window_ms {
            return;
        }
        let won = self
            .window_start_ms
            .compare_exchange(start, now_ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if won {
            for row in &self.rows {
                for counter in row.iter() {
                    counter.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

/// An extra replica queued or made for a hot key.
#[derive(Debug, Clone)]
struct Extra {
    segment: String,
    task: TaskId,
}

/// The hot-key bookkeeping behind one mutex (a leaf of the lock order: nothing else is locked
/// while it is held).
#[derive(Debug, Default)]
pub(crate) struct HotKeys {
    /// Key hash → when it was last judged hot.
    judged_ms: HashMap<u64, u64>,
    /// (tenant, key) → its extra replica.
    extras: HashMap<(String, String), Extra>,
    /// Transport endpoint → read answers it led (enforce mode, multi-replica answers).
    reads_led: HashMap<String, u64>,
}

impl HotKeys {
    /// Records that the key `hash` is judged hot now, unless it was within the cooldown (or
    /// too many keys are remembered). True when the caller should act.
    fn judge(&mut self, hash: u64, now_ms: u64) -> bool {
        if self
            .judged_ms
            .get(&hash)
            .is_some_and(|&at| now_ms.saturating_sub(at) < COOLDOWN_MS)
        {
            return false;
        }
        if self.judged_ms.len() >= MAX_TRACKED_KEYS {
            self.judged_ms
                .retain(|_, at| now_ms.saturating_sub(*at) < COOLDOWN_MS);
            if self.judged_ms.len() >= MAX_TRACKED_KEYS {
                return false;
            }
        }
        self.judged_ms.insert(hash, now_ms);
        true
    }
}

/// Event counts of hot-key replication (`/metrics`).
#[derive(Debug, Default)]
pub(crate) struct HotKeyCounters {
    reads: AtomicU64,
    hot: AtomicU64,
    tasks: AtomicU64,
    no_target: AtomicU64,
    dropped: AtomicU64,
    dropped_bytes: AtomicU64,
}

/// A snapshot of hot-key replication for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotKeyStats {
    pub mode: DynamicReplicationMode,
    /// Reads counted (answers with a memory replica, in observe or enforce mode).
    pub reads_counted: u64,
    /// Times a key was judged hot (in observe mode: would have been replicated).
    pub hot_keys: u64,
    /// Copy tasks queued for hot keys.
    pub tasks_queued: u64,
    /// Hot keys left alone because no segment could take another replica (or no task could be
    /// queued).
    pub no_target: u64,
    /// Extra replicas dropped by eviction, and their bytes.
    pub extras_dropped: u64,
    pub extras_dropped_bytes: u64,
    /// Extra replicas registered now (queued or made, not dropped).
    pub extras: u64,
    /// (transport endpoint, read answers it led), sorted by endpoint.
    pub reads_led: Vec<(String, u64)>,
}

/// How a key's memory replicas stand, read under its shard's lock.
struct Holders {
    /// Segment names of its readable memory replicas.
    names: Vec<String>,
    /// A write or task is in flight.
    busy: bool,
}

/// FNV-1a of `key` then `segment`: a stable score per (key, segment).
fn fnv_score(key: &str, segment: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain([0u8]).chain(segment.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn is_memory(r: &Replica) -> bool {
    matches!(r.data, ReplicaData::Memory(_))
}

impl MasterService {
    /// Counts a read of `key` that `reply` answered and acts on its heat (module doc). In
    /// enforce mode a multi-replica answer is rotated. No-op in mode `off`.
    pub fn note_heat(
        &self,
        key: &str,
        tenant: &str,
        reply: &mut Result<GetReplicaListResponse, ErrorCode>,
    ) {
        let mode = self.config.dynamic_replication_mode;
        if mode == DynamicReplicationMode::Off {
            return;
        }
        let Ok(response) = reply else { return };
        let memory = response
            .replicas
            .iter()
            .filter(|r| matches!(r.kind, ReplicaKind::Memory(_)))
            .count();
        if memory == 0 {
            return;
        }
        let counters = &self.hot_key_counters;
        counters.reads.fetch_add(1, Ordering::Relaxed);
        if mode == DynamicReplicationMode::Enforce && memory >= 2 {
            self.spread(response);
        }
        if memory as u64 >= self.config.dynamic_replication_max_memory_replicas {
            return;
        }
        let Ok(resolved) = self.resolve_tenant(tenant) else {
            return;
        };
        let hash = key_hash(resolved, key);
        let now = self.clock.now_ms();
        let window_ms = u64::from(self.config.dynamic_replication_heat_window_sec) * 1000;
        let hits = self.heat.bump(hash, now, window_ms);
        if u64::from(hits) < self.admission_hits() || !self.hot_keys.lock().judge(hash, now) {
            return;
        }
        counters.hot.fetch_add(1, Ordering::Relaxed);
        if mode == DynamicReplicationMode::Enforce {
            self.replicate_hot_key(key, tenant);
        }
    }

    /// Hits within one window that make a key hot: `ceil(qps × window_s)`, at least 1.
    fn admission_hits(&self) -> u64 {
        let c = &self.config;
        let hits = (c.dynamic_replication_admission_qps_threshold
            * f64::from(c.dynamic_replication_heat_window_sec))
        .ceil();
        if hits.is_finite() && hits >= 1.0 {
            hits as u64
        } else {
            1
        }
    }

    /// Rotates the memory replicas of `response` by one master-wide counter and counts the
    /// answer for the endpoint now first.
    fn spread(&self, response: &mut GetReplicaListResponse) {
        let at: Vec<usize> = (0..response.replicas.len())
            .filter(|&i| matches!(response.replicas[i].kind, ReplicaKind::Memory(_)))
            .collect();
        let turn = self.spread_turn.fetch_add(1, Ordering::Relaxed) as usize % at.len();
        let rotated: Vec<_> = (0..at.len())
            .map(|j| response.replicas[at[(j + turn) % at.len()]].clone())
            .collect();
        for (&i, replica) in at.iter().zip(rotated) {
            response.replicas[i] = replica;
        }
        if let ReplicaKind::Memory(lead) = &response.replicas[at[0]].kind {
            let mut hot = self.hot_keys.lock();
            let endpoint = lead.transport_endpoint.to_string();
            if hot.reads_led.len() < MAX_TRACKED_KEYS || hot.reads_led.contains_key(&endpoint) {
                *hot.reads_led.entry(endpoint).or_default() += 1;
            }
        }
    }

    /// Queues a copy of the hot `key` to one more segment and registers it as an extra, unless
    /// the copy queued for it before is still pending or running.
    fn replicate_hot_key(&self, key: &str, tenant: &str) {
        let earlier = self
            .hot_keys
            .lock()
            .extras
            .get(&(tenant.to_string(), key.to_string()))
            .map(|e| e.task);
        if earlier.is_some_and(|task| self.task_running(task)) {
            return;
        }
        let queued = self.holders(key, tenant).and_then(|holders| {
            if holders.busy {
                return None;
            }
            let source = holders.names.first()?.clone();
            let target = self.extra_target(key, &holders.names)?;
            let task = self
                .enqueue_task(
                    TaskType::ReplicaCopy,
                    key,
                    tenant,
                    &source,
                    std::slice::from_ref(&target),
                )
                .ok()?;
            Some(Extra {
                segment: target,
                task,
            })
        });
        let counters = &self.hot_key_counters;
        let Some(extra) = queued else {
            counters.no_target.fetch_add(1, Ordering::Relaxed);
            return;
        };
        counters.tasks.fetch_add(1, Ordering::Relaxed);
        let mut hot = self.hot_keys.lock();
        if hot.extras.len() < MAX_TRACKED_KEYS {
            hot.extras
                .insert((tenant.to_string(), key.to_string()), extra);
        }
    }

    /// Whether task `id` is still PENDING or PROCESSING.
    fn task_running(&self, id: TaskId) -> bool {
        self.query_task(id)
            .is_ok_and(|t| matches!(t.status, TaskStatus::Pending | TaskStatus::Processing))
    }

    /// The memory replicas of `key` (None when it is missing).
    fn holders(&self, key: &str, tenant: &str) -> Option<Holders> {
        self.read_entry(key, tenant, |_, entry| {
            let m = &entry.meta;
            Ok(Holders {
                names: m
                    .replicas
                    .iter()
                    .filter(|r| is_memory(r) && r.is_readable())
                    .filter_map(Replica::segment_name)
                    .map(|n| n.to_string())
                    .collect(),
                busy: m.is_processing() || m.has_task(),
            })
        })
        .ok()
    }

    /// The segment that gets `key`'s extra replica: OK, not in `holders`, under
    /// [`TARGET_MAX_USAGE`], highest FNV score.
    fn extra_target(&self, key: &str, holders: &[String]) -> Option<String> {
        self.segment_usage()
            .into_iter()
            .filter(|u| u.status == SegmentStatus::OK && !u.waiting_for_owner)
            .filter(|u| !holders.contains(&u.name))
            .filter(|u| {
                u.used_bytes.is_some_and(|used| {
                    u.capacity_bytes > 0
                        && (used as f64) < TARGET_MAX_USAGE * u.capacity_bytes as f64
                })
            })
            .max_by_key(|u| fnv_score(key, &u.name))
            .map(|u| u.name)
    }

    /// Drops every idle extra replica (module doc); returns the bytes freed. Extras whose task
    /// failed, or whose object or replica is gone, are forgotten.
    pub(crate) fn drop_extra_replicas(&self) -> u64 {
        let extras: Vec<((String, String), Extra)> = {
            let hot = self.hot_keys.lock();
            if hot.extras.is_empty() {
                return 0;
            }
            hot.extras
                .iter()
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect()
        };
        let mut freed = 0;
        let mut forget = Vec::new();
        for ((tenant, key), extra) in extras {
            if self.task_running(extra.task) {
                continue;
            }
            match self.drop_extra(&tenant, &key, &extra.segment) {
                Some(0) => {}
                Some(bytes) => {
                    freed += bytes;
                    forget.push((tenant, key));
                }
                None => forget.push((tenant, key)),
            }
        }
        let mut hot = self.hot_keys.lock();
        for k in &forget {
            hot.extras.remove(k);
        }
        freed
    }

    /// Drops `key`'s memory replica on `segment` if the object is idle and keeps another memory
    /// replica. Some(bytes freed) (0: busy now, try later); None when there is nothing to drop.
    fn drop_extra(&self, tenant: &str, key: &str, segment: &str) -> Option<u64> {
        let resolved = self.resolve_tenant(tenant).ok()?;
        let now = self.clock.now_ms();
        let at = self.read_epoch(now);
        let hash = self.route(resolved, key);
        let mut shard = self.index.shard(hash).write();
        let outcome = self.edit_entry(&mut shard, resolved, hash, key, |m, edit| {
            let on_segment = |r: &Replica| r.segment_name().as_deref() == Some(segment);
            let memory = m
                .replicas
                .iter()
                .filter(|r| is_memory(r) && r.is_readable());
            if memory.clone().count() < 2 || !memory.clone().any(on_segment) {
                return None;
            }
            if m.is_processing() || m.has_task() || m.is_leased(now) || m.is_read_pinned(at) {
                return Some(0);
            }
            let mut taken = false;
            let removed = m.extract_replicas(|r| {
                let take = !taken && is_memory(r) && r.is_evictable() && on_segment(r);
                taken |= take;
                take
            });
            let bytes: u64 = removed.iter().map(Replica::charged_bytes).sum();
            edit.free(removed);
            if bytes == 0 {
                return Some(0);
            }
            let counters = &self.hot_key_counters;
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            counters.dropped_bytes.fetch_add(bytes, Ordering::Relaxed);
            Some(bytes)
        });
        outcome.flatten()
    }

    /// Hot-key replication's counters and state (`/metrics`).
    pub fn hot_key_stats(&self) -> HotKeyStats {
        let c = &self.hot_key_counters;
        let hot = self.hot_keys.lock();
        let mut reads_led: Vec<(String, u64)> =
            hot.reads_led.iter().map(|(e, n)| (e.clone(), *n)).collect();
        reads_led.sort();
        HotKeyStats {
            mode: self.config.dynamic_replication_mode,
            reads_counted: c.reads.load(Ordering::Relaxed),
            hot_keys: c.hot.load(Ordering::Relaxed),
            tasks_queued: c.tasks.load(Ordering::Relaxed),
            no_target: c.no_target.load(Ordering::Relaxed),
            extras_dropped: c.dropped.load(Ordering::Relaxed),
            extras_dropped_bytes: c.dropped_bytes.load(Ordering::Relaxed),
            extras: hot.extras.len() as u64,
            reads_led,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sketch_counts_within_a_window_and_starts_over_after_it() {
        let s = HeatSketch::default();
        for i in 1..=8 {
            assert_eq!(s.bump(42, 1_000, 10_000), i);
        }
        assert_eq!(s.bump(7, 1_000, 10_000), 1);
        // 10 s after the window began: a new window.
        assert_eq!(s.bump(42, 11_000, 10_000), 1);
    }

    #[test]
    fn a_key_is_judged_hot_once_per_cooldown() {
        let mut h = HotKeys::default();
        assert!(h.judge(1, 0));
        assert!(!h.judge(1, COOLDOWN_MS - 1));
        assert!(h.judge(1, COOLDOWN_MS));
        assert!(h.judge(2, 5));
    }

    #[test]
    fn modes_parse_as_upstreams_names() {
        assert_eq!("off".parse(), Ok(DynamicReplicationMode::Off));
        assert_eq!("observe".parse(), Ok(DynamicReplicationMode::Observe));
        assert_eq!("enforce".parse(), Ok(DynamicReplicationMode::Enforce));
        assert!("on".parse::<DynamicReplicationMode>().is_err());
    }

    #[test]
    fn target_scores_are_stable_and_differ_per_key() {
        assert_eq!(fnv_score("k", "a"), fnv_score("k", "a"));
        assert_ne!(fnv_score("k", "a"), fnv_score("k", "b"));
        assert_ne!(fnv_score("k1", "a"), fnv_score("k2", "a"));
    }
}
