//! Memory eviction (as upstream's, with victims ordered by **last access**: docs/master.md "Eviction").
//!
//! One cycle ([`MasterService::run_eviction_once`], called every 10 ms by the server):
//! 1. Trigger: `usage = Σ used / Σ capacity` over mounted segments; run if `usage > high
//!    watermark`, or if the need-eviction flag (set by a PutStart that found no space) is set and
//!    `eviction_ratio > 0`. `target = max(ratio, usage − hw + ratio)`, `lowerbound =
//!    min(max(target / 2, usage − hw), target)`.
//!    Extra replicas of hot keys go first (`hot_keys.rs`): every idle one is dropped, and the
//!    cycle ends there when usage is back under the watermark.
//! 2. Census (each shard under its read lock, one at a time): `base` = objects that are not
//!    hard-pinned and have an evictable replica (COMPLETE, live, MEMORY, `refcnt == 0`); the
//!    candidates are those of them that are also unleased and without a read pin, not being
//!    written (no PROCESSING replica, no copy/move task), in two lists: not soft-pinned, and
//!    soft-pinned. Only `(last_access, bytes)` pairs are collected — no keys, no allocation per
//!    object.
//! 3. Pass 1: the `ceil(base × target)` oldest unpinned candidates. The cut-off access time is
//!    found by selection (O(n)), then each shard is walked once under its write lock, evicting
//!    the candidates older than the cut-off (ties up to the count), re-checked under the lock.
//! 4. Due discarded buffers are freed.
//! 5. Pass 2: `need = ceil(base × lowerbound) − evicted − released`; the oldest remaining
//!    unpinned candidates, and when they do not suffice all of them plus the oldest soft-pinned
//!    ones (only with `allow_evict_soft_pinned_objects`).
//! 6. The need-eviction flag is cleared when anything was evicted or released.
//!
//! Evicting an object drops its evictable replicas (quota refunded at once, buffers freed right
//! after the shard's lock) and erases it when nothing valid remains; each change is observed
//! under the shard's lock (`seam.rs`). A group is evicted all-or-none: only when every member
//! is a candidate of the pass (so no member is leased, pinned or busy) and one member is chosen.
//! No lock is held across shards, so a reader of one shard waits at most one shard's scan.
//!
//! A PutStart that finds no space runs [`MasterService::place_after_inline_eviction`]: the same
//! census and pass over a bounded run of shards, evicting oldest first in steps of the request's
//! bytes until its placement succeeds (docs/master.md "Inline eviction").

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;

use crate::allocator::{BufferHandle, SegmentAllocator};

use crate::handle::MasterService;
use crate::index::{Tenant, TenantState, SHARD_COUNT};
use crate::object::{ObjectMetadata, ReadEpoch, Replica, ReplicaData, FLAG_HARD_PIN};

/// What one eviction cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvictionReport {
    /// Whether the watermark or the need-eviction flag started a cycle.
    pub triggered: bool,
    pub usage_ratio_before: f64,
    pub usage_ratio_after: f64,
    /// Objects that are not hard-pinned and hold an evictable replica (leased or not).
    pub evictable_objects: usize,
    /// Unleased, idle candidates found by the census (unpinned + soft-pinned).
    pub candidates: usize,
    pub evicted_objects: usize,
    /// Of `evicted_objects`, those that were soft-pinned.
    pub evicted_soft_pinned: usize,
    pub freed_bytes: u64,
    /// Discarded replicas released during the cycle.
    pub released_discarded: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Plain,
    Soft,
}

/// Evicted buffers are freed in batches of this many (sorted, merged), so that memory returns
/// within the cycle without one free-list update per buffer.
const FREE_BATCH: usize = 4096;

/// `(last_access_ms, evictable bytes)` per candidate.
type Candidates = Vec<(u64, u64)>;

#[derive(Debug)]
struct Census {
    base: usize,
    plain: Candidates,
    soft: Candidates,
    /// The shards it examined.
    window: ShardWindow,
}

/// A run of consecutive shards (wrapping around the last), the unit a census examines and a
/// pass walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ShardWindow {
    start: usize,
    len: usize,
}

impl ShardWindow {
    const ALL: ShardWindow = ShardWindow {
        start: 0,
        len: SHARD_COUNT,
    };

    fn shards(self) -> impl Iterator<Item = usize> {
        (0..self.len).map(move |i| (self.start + i) % SHARD_COUNT)
    }
}

/// Bytes eviction would free from this object, or 0 if it holds no evictable replica.
fn evictable_bytes(meta: &ObjectMetadata) -> u64 {
    meta.replicas
        .iter()
        .filter(|r| r.is_evictable())
        .map(Replica::charged_bytes)
        .sum()
}

/// The candidate class of an object, `None` when eviction must not take it now.
fn classify(meta: &ObjectMetadata, now_ms: u64, at: ReadEpoch) -> Option<(Class, u64)> {
    if meta.has(FLAG_HARD_PIN) || meta.is_processing() || meta.has_task() {
        return None;
    }
    if meta.is_leased(now_ms) || meta.is_read_pinned(at) {
        return None;
    }
    let bytes = evictable_bytes(meta);
    if bytes == 0 {
        return None;
    }
    let class = if meta.soft_pinned(now_ms) {
        Class::Soft
    } else {
        Class::Plain
    };
    Some((class, bytes))
}

/// The access-time cut-off that selects the `k` oldest of `v`, and how many objects exactly at
/// the cut-off may be taken. `k == 0` selects nothing.
fn cut_off(v: &mut [(u64, u64)], k: usize) -> (u64, usize) {
    let k = k.min(v.len());
    if k == 0 {
        return (0, 0);
    }
    v.select_nth_unstable_by_key(k - 1, |e| e.0);
    let t = v[k - 1].0;
    let older = v[..k - 1].iter().filter(|e| e.0 < t).count();
    (t, k - older)
}

/// One pass's selection rule.
struct Selection {
    class: Class,
    cut_off_ms: u64,
    ties: usize,
}

impl Selection {
    fn admits(&self, class: Class) -> bool {
        class == self.class || (self.class == Class::Soft && class == Class::Plain)
    }

    /// Whether an object last accessed at `access` is chosen (consumes a tie).
    fn choose(&mut self, access: u64) -> bool {
        if access < self.cut_off_ms {
            return true;
        }
        if access == self.cut_off_ms && self.ties > 0 {
            self.ties -= 1;
            return true;
        }
        false
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct PassResult {
    objects: usize,
    soft: usize,
    bytes: u64,
}

impl MasterService {
    /// `(used, capacity)` bytes over the mounted segments that still have an allocator, restored
    /// segments waiting for their owner left out (nothing is placed there, so evicting cannot
    /// make room).
    pub fn memory_usage_bytes(&self) -> (u64, u64) {
        let segs = self.segments.inner.read();
        segs.mounted
            .values()
            .filter(|s| s.waiting_until_ms.is_none())
            .filter_map(|s| s.allocator.as_ref())
            .fold((0, 0), |(u, c), a| (u + a.used_bytes(), c + a.capacity()))
    }

    fn usage_ratio(&self) -> f64 {
        let (used, cap) = self.memory_usage_bytes();
        if cap == 0 {
            0.0
        } else {
            used as f64 / cap as f64
        }
    }

    /// The candidates of the shards of `window`, in order, stopping after the shard where the
    /// objects examined reach `budget`; `window` of the result is the shards examined.
    fn census(
        &self,
        only: Option<Tenant<'_>>,
        now_ms: u64,
        window: ShardWindow,
        budget: usize,
    ) -> Census {
        let hint = self.census_hint.load(Ordering::Relaxed).min(budget);
        let mut c = Census {
            base: 0,
            plain: Vec::with_capacity(hint),
            soft: Vec::new(),
            window: ShardWindow {
                start: window.start,
                len: 0,
            },
        };
        let mut examined = 0usize;
        let at = self.read_epoch(now_ms);
        for i in window.shards() {
            if examined >= budget {
                break;
            }
            c.window.len += 1;
            let shard = self.index.shard_at(i).read();
            for (tenant, state) in shard.tenants() {
                if only.is_some_and(|t| t != tenant) {
                    continue;
                }
                let mut ahead = state.ahead();
                for entry in state.objects.iter() {
                    ahead.step();
                    examined += 1;
                    let m = &entry.meta;
                    if m.has(FLAG_HARD_PIN) || !m.replicas.iter().any(Replica::is_evictable) {
                        continue;
                    }
                    c.base += 1;
                    if let Some((class, bytes)) = classify(m, now_ms, at) {
                        let access = m.last_access_ms();
                        match class {
                            Class::Plain => c.plain.push((access, bytes)),
                            Class::Soft => c.soft.push((access, bytes)),
                        }
                    }
                }
            }
        }
        c
    }

    /// Groups of one tenant state that may be evicted in this pass: every member admitted and at
    /// least one chosen. Built only when the state holds grouped objects.
    fn group_verdicts(
        &self,
        state: &TenantState,
        sel: &mut Selection,
        now_ms: u64,
    ) -> Option<HashMap<Box<str>, bool>> {
        // Every grouped object has a route, so no route means no group anywhere (no scan).
        if self.routes.len() == 0 || !state.objects.iter().any(|e| e.meta.group().is_some()) {
            return None;
        }
        let at = self.read_epoch(now_ms);
        // group → (all admitted, oldest access)
        let mut groups: HashMap<Box<str>, (bool, u64)> = HashMap::new();
        for e in state.objects.iter() {
            let Some(g) = e.meta.group() else { continue };
            let admitted = classify(&e.meta, now_ms, at).is_some_and(|(c, _)| sel.admits(c));
            let access = e.meta.last_access_ms();
            let slot = groups.entry(Box::from(g)).or_insert((true, u64::MAX));
            slot.0 &= admitted;
            slot.1 = slot.1.min(access);
        }
        Some(
            groups
                .into_iter()
                .map(|(g, (all, oldest))| {
                    let evict = all && sel.choose(oldest);
                    (g, evict)
                })
                .collect(),
        )
    }

    /// Walks the shards of `window` (of `only`, if given) once under their write locks, evicting
    /// what `sel` chooses. Stops walking once `max_objects` have been evicted.
    fn evict_pass(
        &self,
        only: Option<Tenant<'_>>,
        mut sel: Selection,
        now_ms: u64,
        max_objects: usize,
        window: ShardWindow,
    ) -> PassResult {
        let mut res = PassResult::default();
        let at = self.read_epoch(now_ms);
        // Evicted buffers, freed in batches per segment (sorted and merged) after each shard.
        let mut freed: Vec<(Weak<SegmentAllocator>, u64, u64)> = Vec::new();
        for i in window.shards() {
            if res.objects >= max_objects {
                break;
            }
            let mut shard = self.index.shard_at(i).write();
            for (tenant, state) in shard.tenants_mut() {
                if only.is_some_and(|t| t != tenant) {
                    continue;
                }
                let verdicts = self.group_verdicts(state, &mut sel, now_ms);
                let mut ahead = state.ahead();
                state.objects.retain(|entry| {
                    ahead.step();
                    let m = &mut entry.meta;
                    let chosen = match m.group() {
                        Some(g) => verdicts
                            .as_ref()
                            .and_then(|v| v.get(g))
                            .copied()
                            .unwrap_or(false),
                        None => {
                            // The access time first: most objects are newer than the cut-off
                            // and need no further look.
                            let access = m.last_access_ms();
                            res.objects < max_objects
                                && access <= sel.cut_off_ms
                                && classify(m, now_ms, at).is_some_and(|(c, _)| sel.admits(c))
                                && sel.choose(access)
                        }
                    };
                    if !chosen {
                        return true;
                    }
                    if self.config.offload_on_evict
                        && self.try_queue_offload(tenant, &entry.key, &mut entry.meta)
                    {
                        // Offloaded first: the memory replica stays (pinned) until its disk
                        // copy exists, and a later cycle takes it.
                        self.emit_entry(tenant, entry);
                        return true;
                    }
                    let m = &mut entry.meta;
                    let soft = m.soft_pinned(now_ms);
                    let bytes = evictable_bytes(m);
                    // The buffers are given up here and freed after the shard's lock (below),
                    // so the change is observed before any of them can be reused.
                    for r in m.extract_replicas(Replica::is_evictable) {
                        if let ReplicaData::Memory(h) = r.data {
                            freed.push(h.into_range());
                        }
                    }
                    res.objects += 1;
                    res.soft += usize::from(soft);
                    res.bytes += bytes;
                    let keep = m.is_valid();
                    self.emit_swept(tenant, entry, keep);
                    keep
                });
            }
            shard.others.retain(|_, s| s.len() > 0);
            drop(shard);
            if freed.len() >= FREE_BATCH {
                Self::free_batch(&mut freed);
            }
        }
        Self::free_batch(&mut freed);
        res
    }

    /// Frees evicted ranges grouped by segment; ranges of a segment unmounted meanwhile are
    /// dropped (they hold nothing any more).
    fn free_batch(freed: &mut Vec<(Weak<SegmentAllocator>, u64, u64)>) {
        freed.sort_unstable_by_key(|(a, o, _)| (a.as_ptr() as usize, *o));
        let mut i = 0;
        let mut ranges = Vec::new();
        while i < freed.len() {
            let ptr = freed[i].0.as_ptr();
            ranges.clear();
            let mut j = i;
            while j < freed.len() && freed[j].0.as_ptr() == ptr {
                ranges.push((freed[j].1, freed[j].2));
                j += 1;
            }
            if let Some(a) = freed[i].0.upgrade() {
                a.release_many(&mut ranges);
            }
            i = j;
        }
        freed.clear();
    }

    /// One eviction cycle (see the module doc). Cheap when nothing triggers it: one read of the
    /// segment table.
    pub fn run_eviction_once(&self) -> EvictionReport {
        let _cycle = self.eviction_lock.lock();
        let now = self.clock.now_ms();
        let usage = self.usage_ratio();
        let hw = self.config.eviction_high_watermark_ratio;
        let ratio = self.config.eviction_ratio;
        let mut report = EvictionReport {
            usage_ratio_before: usage,
            usage_ratio_after: usage,
            ..Default::default()
        };
        let flagged = self.need_eviction.load(Ordering::Relaxed);
        if !(usage > hw || (flagged && ratio > 0.0)) {
            return report;
        }
        report.triggered = true;
        // Extra replicas of hot keys go before any whole object.
        if self.drop_extra_replicas() > 0 {
            let after = self.usage_ratio();
            if after <= hw {
                self.need_eviction.store(false, Ordering::Relaxed);
                report.usage_ratio_after = after;
                return report;
            }
        }
        let target = ratio.max(usage - hw + ratio);
        let lowerbound = (target * 0.5).max(usage - hw).min(target);
        let mut census = self.census(None, now, ShardWindow::ALL, usize::MAX);
        self.census_hint.store(
            census.plain.len() + census.plain.len() / 8,
            Ordering::Relaxed,
        );
        report.evictable_objects = census.base;
        report.candidates = census.plain.len() + census.soft.len();
        if census.base == 0 {
            self.need_eviction.store(false, Ordering::Relaxed);
            return report;
        }
        let base = census.base as f64;
        let k1 = ((base * target).ceil() as usize).min(census.plain.len());
        let (cut, ties) = cut_off(&mut census.plain, k1);
        let mut done = PassResult::default();
        if k1 > 0 {
            let r = self.evict_pass(
                None,
                Selection {
                    class: Class::Plain,
                    cut_off_ms: cut,
                    ties,
                },
                now,
                usize::MAX,
                ShardWindow::ALL,
            );
            done.objects += r.objects;
            done.bytes += r.bytes;
        }
        let released = self.release_discarded_once();
        let need = ((base * lowerbound).ceil() as usize)
            .saturating_sub(done.objects)
            .saturating_sub(released);
        if need > 0 {
            let rest = &mut census.plain[k1..];
            if need <= rest.len() {
                let (cut, ties) = cut_off(rest, need);
                let r = self.evict_pass(
                    None,
                    Selection {
                        class: Class::Plain,
                        cut_off_ms: cut,
                        ties,
                    },
                    now,
                    usize::MAX,
                    ShardWindow::ALL,
                );
                done.objects += r.objects;
                done.bytes += r.bytes;
            } else {
                let short = need - rest.len();
                if !rest.is_empty() {
                    let r = self.evict_pass(
                        None,
                        Selection {
                            class: Class::Plain,
                            cut_off_ms: u64::MAX,
                            ties: usize::MAX,
                        },
                        now,
                        usize::MAX,
                        ShardWindow::ALL,
                    );
                    done.objects += r.objects;
                    done.bytes += r.bytes;
                }
                if self.config.allow_evict_soft_pinned_objects && !census.soft.is_empty() {
                    let (cut, ties) = cut_off(&mut census.soft, short);
                    let r = self.evict_pass(
                        None,
                        Selection {
                            class: Class::Soft,
                            cut_off_ms: cut,
                            ties,
                        },
                        now,
                        usize::MAX,
                        ShardWindow::ALL,
                    );
                    done.objects += r.objects;
                    done.soft += r.soft;
                    done.bytes += r.bytes;
                }
            }
        }
        if done.objects > 0 || released > 0 {
            self.need_eviction.store(false, Ordering::Relaxed);
        }
        report.evicted_objects = done.objects;
        report.evicted_soft_pinned = done.soft;
        report.freed_bytes = done.bytes;
        report.released_discarded = released;
        report.usage_ratio_after = self.usage_ratio();
        report
    }

    /// Inline eviction for a PutStart that found no space for `need` bytes of replicas, each
    /// `replica_size` long (docs/master.md "Inline eviction"). Unless no mounted segment could
    /// ever hold one replica, it examines up to `put_start_evict_budget` objects of a run of
    /// shards starting at a random one and evicts their idle candidates oldest first (the
    /// background cycle's order: unpinned, then soft-pinned when allowed) in steps of `need`
    /// bytes, calling `try_place` after each step; it stops at the first placement, which it
    /// returns (empty when none succeeded).
    pub(crate) fn place_after_inline_eviction(
        &self,
        replica_size: u64,
        need: u64,
        mut try_place: impl FnMut() -> Vec<BufferHandle>,
    ) -> Vec<BufferHandle> {
        let budget = self.config.put_start_evict_budget;
        if budget == 0 || !self.some_segment_holds(replica_size) {
            return Vec::new();
        }
        let _cycle = self.eviction_lock.lock();
        // Whoever held the lock (the background cycle, another put) may have made room.
        let handles = try_place();
        if !handles.is_empty() {
            return handles;
        }
        if self.release_discarded_once() > 0 {
            let handles = try_place();
            if !handles.is_empty() {
                return handles;
            }
        }
        // Extra replicas of hot keys go before any whole object.
        if self.drop_extra_replicas() > 0 {
            let handles = try_place();
            if !handles.is_empty() {
                return handles;
            }
        }
        let now = self.clock.now_ms();
        let start = self.rng.below(SHARD_COUNT);
        let window = ShardWindow {
            start,
            len: SHARD_COUNT,
        };
        let mut census = self.census(None, now, window, budget);
        let window = census.window;
        let allow_soft = self.config.allow_evict_soft_pinned_objects;
        let mut done = PassResult::default();
        let mut handles = Vec::new();
        'classes: for (class, list) in [
            (Class::Plain, &mut census.plain),
            (Class::Soft, &mut census.soft),
        ] {
            if class == Class::Soft && !allow_soft {
                break;
            }
            list.sort_unstable_by_key(|e| e.0);
            let mut taken = 0;
            while taken < list.len() {
                let from = taken;
                let mut bytes = 0u64;
                while taken < list.len() && bytes < need {
                    bytes += list[taken].1;
                    taken += 1;
                }
                let cut_off_ms = list[taken - 1].0;
                // The earlier steps took the older ones: this step's ties are its own.
                let ties = list[from..taken]
                    .iter()
                    .filter(|e| e.0 == cut_off_ms)
                    .count();
                let sel = Selection {
                    class,
                    cut_off_ms,
                    ties,
                };
                let r = self.evict_pass(None, sel, now, usize::MAX, window);
                done.objects += r.objects;
                done.bytes += r.bytes;
                handles = try_place();
                if !handles.is_empty() {
                    break 'classes;
                }
            }
        }
        self.counters
            .count_inline_eviction(done.objects, done.bytes);
        handles
    }

    /// Whether some mounted segment is at least `bytes` long (else no eviction can make room).
    fn some_segment_holds(&self, bytes: u64) -> bool {
        self.segments.inner.read().some_segment_holds(bytes)
    }

    /// Tenant-scoped eviction for a quota deficit: evicts the tenant's oldest unpinned candidates
    /// (then soft-pinned ones, when allowed) until `deficit_bytes` are freed. Returns the bytes
    /// freed.
    pub(crate) fn evict_for_tenant(&self, tenant: Tenant<'_>, deficit_bytes: u64) -> u64 {
        let _cycle = self.eviction_lock.lock();
        let now = self.clock.now_ms();
        let mut census = self.census(Some(tenant), now, ShardWindow::ALL, usize::MAX);
        let mut freed = 0u64;
        let allow_soft = self.config.allow_evict_soft_pinned_objects;
        for (class, list) in [
            (Class::Plain, &mut census.plain),
            (Class::Soft, &mut census.soft),
        ] {
            if freed >= deficit_bytes || (class == Class::Soft && !allow_soft) || list.is_empty() {
                continue;
            }
            list.sort_unstable_by_key(|e| e.0);
            let mut k = 0;
            let mut sum = 0u64;
            while k < list.len() && freed + sum < deficit_bytes {
                sum += list[k].1;
                k += 1;
            }
            let (cut, ties) = cut_off(list, k);
            let r = self.evict_pass(
                Some(tenant),
                Selection {
                    class,
                    cut_off_ms: cut,
                    ties,
                },
                now,
                usize::MAX,
                ShardWindow::ALL,
            );
            freed += r.bytes;
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_selects_the_k_oldest_with_ties() {
        let mut v = vec![(5, 1), (1, 1), (3, 1), (3, 1), (3, 1), (9, 1)];
        // 3 oldest: 1, 3, 3 → cut-off 3, one older (1), so two of the three 3s may go.
        assert_eq!(cut_off(&mut v, 3), (3, 2));
        assert_eq!(cut_off(&mut v, 0), (0, 0));
        assert_eq!(cut_off(&mut v, 100), (9, 1));
    }
}
