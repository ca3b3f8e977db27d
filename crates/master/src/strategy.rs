//! Replica placement: which segments a put's memory replicas go to (as upstream's master).
//!
//! Rules shared by every strategy: one object's replicas always go to **distinct segment names**;
//! only OK segments are candidates (the [`AllocatorSet`] holds nothing else); explicit preferred
//! names come first, in order; placement is best effort (the caller decides whether fewer than
//! `replica_num` replicas is enough). Within a name with several segments, segments are tried from
//! a random start. Every random choice draws from the caller's [`MasterRng`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use mooncake_common::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::allocator::{BufferHandle, SegmentAllocator};
use crate::rng::MasterRng;

/// Most names the random walk tries (upstream: `min(100, |names|)`).
pub const MAX_RANDOM_WALK_TRIES: usize = 100;
/// Most names the local-host extension adds to the preference list.
pub const MAX_LOCAL_PREFERRED_NAMES: usize = 100;
/// How long a newly mounted empty segment's score in the free-ratio step ramps up (see
/// [`AllocatorSet::start_ramp`]).
pub const JOIN_RAMP_MS: u64 = 10_000;

/// `--allocation_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocationStrategy {
    /// Preferred names, then a random walk over all names.
    #[default]
    Random,
    /// Preferred names, then the freest of `6 × remaining` sampled names, then the random walk.
    FreeRatioFirst,
    /// Random, plus the writer's host (then hosts in cyclic order) as extra preferences when
    /// `replica_num == 1`.
    LocalFirst,
}

impl std::str::FromStr for AllocationStrategy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "random" => Ok(AllocationStrategy::Random),
            "free_ratio_first" => Ok(AllocationStrategy::FreeRatioFirst),
            "local_first" => Ok(AllocationStrategy::LocalFirst),
            other => Err(format!(
                "unknown allocation strategy {other:?} (random, free_ratio_first, local_first)"
            )),
        }
    }
}

/// The allocators of OK segments, by name. `names` is the walk order; removing a name's last
/// allocator swap-removes the name (as upstream).
#[derive(Debug, Default)]
pub struct AllocatorSet {
    names: Vec<Arc<str>>,
    by_name: HashMap<Arc<str>, Vec<Arc<SegmentAllocator>>>,
    /// host id → name → number of allocatable segments with that name on that host.
    hosts: BTreeMap<Arc<str>, BTreeMap<Arc<str>, usize>>,
    /// Names that joined empty, with the time they did (`start_ramp`).
    joined_ms: HashMap<Arc<str>, u64>,
}

impl AllocatorSet {
    pub fn insert(&mut self, allocator: Arc<SegmentAllocator>, host_id: &Arc<str>) {
        let name = allocator.info().name.clone();
        let list = self.by_name.entry(name.clone()).or_default();
        if list.is_empty() {
            self.names.push(name.clone());
        }
        list.push(allocator);
        if !host_id.is_empty() {
            *self
                .hosts
                .entry(host_id.clone())
                .or_default()
                .entry(name)
                .or_default() += 1;
        }
    }

    pub fn remove(&mut self, allocator: &Arc<SegmentAllocator>, host_id: &str) {
        let name = &allocator.info().name;
        let Some(list) = self.by_name.get_mut(name) else {
            return;
        };
        let before = list.len();
        list.retain(|a| !Arc::ptr_eq(a, allocator));
        if list.len() == before {
            return;
        }
        if list.is_empty() {
            self.by_name.remove(name);
            self.joined_ms.remove(name);
            if let Some(pos) = self.names.iter().position(|n| n == name) {
                self.names.swap_remove(pos);
            }
        }
        if let Some(names) = self.hosts.get_mut(host_id) {
            if let Some(count) = names.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    names.remove(name);
                }
            }
            if names.is_empty() {
                self.hosts.remove(host_id);
            }
        }
    }

    /// Number of distinct allocatable names.
    pub fn name_count(&self) -> usize {
        self.names.len()
    }

    pub fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    pub fn allocators(&self, name: &str) -> &[Arc<SegmentAllocator>] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// Upstream's `AllocateFrom(name)` (Copy and Move targets): a name with no OK segment is
    /// SEGMENT_NOT_FOUND, a full one NO_AVAILABLE_HANDLE.
    pub fn allocate_from(
        &self,
        name: &str,
        size: u64,
        rng: &MasterRng,
    ) -> Result<BufferHandle, ErrorCode> {
        if self.allocators(name).is_empty() {
            return Err(ErrorCode::SEGMENT_NOT_FOUND);
        }
        self.allocate_from_name(name, size, rng)
            .ok_or(ErrorCode::NO_AVAILABLE_HANDLE)
    }

    /// A segment named `name` was just mounted empty at `now_ms`. Free-ratio placement would send
    /// it nearly every new write (it is the freest by far) until it fills to the others' level,
    /// overloading its transfer engine. For [`JOIN_RAMP_MS`] it therefore takes part in each
    /// free-ratio pass only with a probability that rises linearly from its fair share
    /// (1 / names) to 1 (`ramp_scores`).
    pub fn start_ramp(&mut self, name: &str, now_ms: u64) {
        if let Some((key, _)) = self.by_name.get_key_value(name) {
            self.joined_ms.insert(key.clone(), now_ms);
        }
    }

    /// How far `name` is through its join ramp (1.0 = done or never ramping).
    fn ramp_progress(&self, name: &str, now_ms: u64) -> f64 {
        match self.joined_ms.get(name) {
            Some(&joined) if now_ms < joined.saturating_add(JOIN_RAMP_MS) => {
                now_ms.saturating_sub(joined) as f64 / JOIN_RAMP_MS as f64
            }
            _ => 1.0,
        }
    }

    /// Free ratio Σ(capacity − used) / Σcapacity of a name's segments.
    fn free_ratio(&self, name: &str) -> f64 {
        let (mut cap, mut free) = (0u64, 0u64);
        for a in self.allocators(name) {
            cap += a.capacity();
            free += a.capacity().saturating_sub(a.used_bytes());
        }
        if cap == 0 {
            0.0
        } else {
            free as f64 / cap as f64
        }
    }

    /// Tries the segments of `name` from a random start; the first that fits wins.
    fn allocate_from_name(&self, name: &str, size: u64, rng: &MasterRng) -> Option<BufferHandle> {
        let list = self.allocators(name);
        if list.is_empty() {
            return None;
        }
        // One segment under the name (the common case): no draw needed.
        let start = if list.len() == 1 {
            0
        } else {
            rng.below(list.len())
        };
        (0..list.len()).find_map(|i| list[(start + i) % list.len()].allocate(size))
    }

    /// Names on hosts in cyclic lexicographic order starting at `host` (or the next greater host
    /// when `host` has no segments); within a host, names rotated by `key_hash`.
    fn local_names(&self, host: &str, key_hash: u64) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        let after = self
            .hosts
            .range::<str, _>((std::ops::Bound::Included(host), std::ops::Bound::Unbounded));
        let before = self
            .hosts
            .range::<str, _>((std::ops::Bound::Unbounded, std::ops::Bound::Excluded(host)));
        for (_, names) in after.chain(before) {
            let list: Vec<&Arc<str>> = names.keys().collect();
            let rot = (key_hash % list.len().max(1) as u64) as usize;
            for i in 0..list.len() {
                out.push(list[(rot + i) % list.len()].clone());
                if out.len() >= MAX_LOCAL_PREFERRED_NAMES {
                    return out;
                }
            }
        }
        out
    }
}

/// One placement request.
#[derive(Debug, Clone, Copy)]
pub struct PlacementRequest<'a> {
    pub size: u64,
    pub replica_num: usize,
    /// Explicit preferred names, in order.
    pub preferred: &'a [String],
    /// Writer's host, when the local-host extension applies (see [`AllocationStrategy::LocalFirst`]
    /// and `prefer_alloc_in_same_node`).
    pub local_host: Option<&'a str>,
    /// Hash of the key (rotates names within a host).
    pub key_hash: u64,
    /// The master's clock (join ramps of newly mounted segments).
    pub now_ms: u64,
}

/// Places up to `replica_num` buffers of `size` bytes on distinct names. Returns what it got
/// (possibly nothing).
pub fn place(
    set: &AllocatorSet,
    strategy: AllocationStrategy,
    req: &PlacementRequest<'_>,
    rng: &MasterRng,
) -> Vec<BufferHandle> {
    let mut out: Vec<BufferHandle> = Vec::with_capacity(req.replica_num.min(8));
    if req.replica_num == 0 || req.size == 0 || set.names.is_empty() {
        return out;
    }
    if set.names.len() == 1 {
        out.extend(set.allocate_from_name(&set.names[0], req.size, rng));
        return out;
    }
    let mut used: Vec<Arc<str>> = Vec::with_capacity(req.replica_num.min(8));
    let try_name = |name: &Arc<str>, out: &mut Vec<BufferHandle>, used: &mut Vec<Arc<str>>| {
        if out.len() >= req.replica_num || used.iter().any(|u| u == name) {
            return;
        }
        if let Some(handle) = set.allocate_from_name(name, req.size, rng) {
            out.push(handle);
            used.push(name.clone());
        }
    };

    for name in req.preferred {
        if out.len() >= req.replica_num {
            break;
        }
        if let Some((key, _)) = set.by_name.get_key_value(name.as_str()) {
            let key = key.clone();
            try_name(&key, &mut out, &mut used);
        }
    }
    if let Some(host) = req.local_host {
        if out.len() < req.replica_num {
            for name in set.local_names(host, req.key_hash) {
                if out.len() >= req.replica_num {
                    break;
                }
                try_name(&name, &mut out, &mut used);
            }
        }
    }
    if out.len() < req.replica_num && strategy == AllocationStrategy::FreeRatioFirst {
        let remaining = req.replica_num - out.len();
        let n = set.names.len();
        let sample = remaining.saturating_mul(6).min(n);
        let start = rng.below(n);
        let mut scored: Vec<(f64, &Arc<str>)> = (0..sample)
            .map(|i| {
                let name = &set.names[(start + i) % n];
                (set.free_ratio(name), name)
            })
            .collect();
        ramp_scores(set, &mut scored, req.now_ms, rng);
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (_, name) in scored {
            if out.len() >= req.replica_num {
                break;
            }
            try_name(name, &mut out, &mut used);
        }
    }
    if out.len() < req.replica_num {
        let n = set.names.len();
        let start = rng.below(n);
        for i in 0..n.min(MAX_RANDOM_WALK_TRIES) {
            if out.len() >= req.replica_num {
                break;
            }
            try_name(&set.names[(start + i) % n], &mut out, &mut used);
        }
    }
    out
}

/// A sampled name still in its join ramp (see [`AllocatorSet::start_ramp`]) keeps its score
/// with probability `max(progress, 1 / names)`, else it drops out of this free-ratio pass (the
/// random walk may still pick it): right after joining it gets about its fair share of the
/// writes, at the end of the ramp every write that free ratio gives it.
fn ramp_scores(set: &AllocatorSet, scored: &mut [(f64, &Arc<str>)], now_ms: u64, rng: &MasterRng) {
    if set.joined_ms.is_empty() {
        return;
    }
    let fair = 1.0 / set.names.len().max(1) as f64;
    for (score, name) in scored.iter_mut() {
        let progress = set.ramp_progress(name, now_ms);
        if progress < 1.0 {
            let draw = rng.next_u64() as f64 / u64::MAX as f64;
            if draw >= progress.max(fair) {
                *score = -1.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::allocator::SegmentInfo;
    use mooncake_common::SegmentId;

    fn alloc(id: u64, name: &str, capacity: u64) -> Arc<SegmentAllocator> {
        SegmentAllocator::new(SegmentInfo {
            segment_id: SegmentId::new(id, id),
            name: Arc::from(name),
            endpoint: Arc::from(name),
            protocol: Arc::from("tcp"),
            base: 4096,
            capacity,
        })
    }

    fn rng() -> MasterRng {
        MasterRng::with_seed(11)
    }

    fn name_of(h: &BufferHandle) -> String {
        h.allocator().unwrap().info().name.to_string()
    }

    fn req(size: u64, replica_num: usize, preferred: &[String]) -> PlacementRequest<'_> {
        PlacementRequest {
            size,
            replica_num,
            preferred,
            local_host: None,
            key_hash: 0,
            now_ms: 0,
        }
    }

    #[test]
    fn replicas_land_on_distinct_names_best_effort() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        let host: Arc<str> = Arc::from("");
        // Two segments share name "a": still only one replica may go to "a".
        for (i, n) in [(1, "a"), (2, "a"), (3, "b"), (4, "c")] {
            set.insert(alloc(i, n, 1000), &host);
        }
        for strategy in [
            AllocationStrategy::Random,
            AllocationStrategy::FreeRatioFirst,
            AllocationStrategy::LocalFirst,
        ] {
            for _ in 0..50 {
                let got = place(&set, strategy, &req(10, 5, &[]), &rng);
                let mut names: Vec<_> = got.iter().map(name_of).collect();
                assert_eq!(names.len(), 3, "{strategy:?}: only 3 distinct names exist");
                names.sort();
                names.dedup();
                assert_eq!(names.len(), 3, "{strategy:?}: names must be distinct");
            }
        }
    }

    #[test]
    fn preferred_names_come_first_in_order() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        let host: Arc<str> = Arc::from("");
        for (i, n) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            set.insert(alloc(i, n, 1000), &host);
        }
        let prefs = vec!["c".to_string(), "zzz".to_string(), "a".to_string()];
        for _ in 0..20 {
            let got = place(&set, AllocationStrategy::Random, &req(10, 2, &prefs), &rng);
            assert_eq!(got.iter().map(name_of).collect::<Vec<_>>(), ["c", "a"]);
        }
        // A full preferred segment is skipped.
        let _fill = set.allocators("c")[0].allocate(995).unwrap();
        let got = place(&set, AllocationStrategy::Random, &req(10, 1, &prefs), &rng);
        assert_eq!(name_of(&got[0]), "a");
    }

    #[test]
    fn free_ratio_first_picks_the_freest() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        let host: Arc<str> = Arc::from("");
        for (i, n) in [(1, "a"), (2, "b"), (3, "c")] {
            set.insert(alloc(i, n, 1000), &host);
        }
        let _a = set.allocators("a")[0].allocate(900).unwrap();
        let _b = set.allocators("b")[0].allocate(500).unwrap();
        for _ in 0..20 {
            let got = place(
                &set,
                AllocationStrategy::FreeRatioFirst,
                &req(10, 1, &[]),
                &rng,
            );
            assert_eq!(name_of(&got[0]), "c");
        }
    }

    #[test]
    fn local_first_prefers_the_writers_host_then_the_next_host() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        set.insert(alloc(1, "h1-a", 1000), &Arc::from("host1"));
        set.insert(alloc(2, "h2-a", 1000), &Arc::from("host2"));
        set.insert(alloc(3, "h3-a", 1000), &Arc::from("host3"));
        let r = PlacementRequest {
            local_host: Some("host2"),
            ..req(10, 1, &[])
        };
        for _ in 0..20 {
            let got = place(&set, AllocationStrategy::LocalFirst, &r, &rng);
            assert_eq!(name_of(&got[0]), "h2-a");
        }
        // Unknown host "host2x": the next greater host is host3.
        let r = PlacementRequest {
            local_host: Some("host2x"),
            ..req(10, 1, &[])
        };
        assert_eq!(
            name_of(&place(&set, AllocationStrategy::LocalFirst, &r, &rng)[0]),
            "h3-a"
        );
        // Past the last host it wraps around to the first.
        let r = PlacementRequest {
            local_host: Some("host9"),
            ..req(10, 1, &[])
        };
        assert_eq!(
            name_of(&place(&set, AllocationStrategy::LocalFirst, &r, &rng)[0]),
            "h1-a"
        );
    }

    #[test]
    fn a_sole_name_is_tried_even_if_not_preferred_and_removal_drops_names() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        let host: Arc<str> = Arc::from("h");
        let a = alloc(1, "only", 100);
        set.insert(a.clone(), &host);
        let prefs = vec!["other".to_string()];
        assert_eq!(
            place(&set, AllocationStrategy::Random, &req(10, 3, &prefs), &rng).len(),
            1
        );
        set.remove(&a, "h");
        assert_eq!(set.name_count(), 0);
        assert!(place(&set, AllocationStrategy::Random, &req(10, 1, &[]), &rng).is_empty());
        assert!(set.hosts.is_empty());
    }

    #[test]
    fn allocate_from_names_its_errors() {
        let rng = rng();
        let mut set = AllocatorSet::default();
        set.insert(alloc(1, "a", 100), &Arc::from(""));
        assert_eq!(
            set.allocate_from("nope", 1, &rng).unwrap_err(),
            ErrorCode::SEGMENT_NOT_FOUND
        );
        let h = set.allocate_from("a", 100, &rng).unwrap();
        assert_eq!(h.len(), 100);
        assert_eq!(
            set.allocate_from("a", 1, &rng).unwrap_err(),
            ErrorCode::NO_AVAILABLE_HANDLE
        );
    }

    #[test]
    fn strategy_names_parse() {
        assert_eq!("random".parse(), Ok(AllocationStrategy::Random));
        assert_eq!(
            "free_ratio_first".parse(),
            Ok(AllocationStrategy::FreeRatioFirst)
        );
        assert_eq!("local_first".parse(), Ok(AllocationStrategy::LocalFirst));
        assert!("cxl".parse::<AllocationStrategy>().is_err());
    }
}
