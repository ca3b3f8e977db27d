//! Introspection and audits for tests and admin endpoints: object counts, the exact space
//! accounting check and the quota accounting check. Meant for a quiescent master: they take every
//! shard's read lock in turn.

use std::collections::{BTreeMap, HashMap};

use mooncake_common::{SegmentId, TenantId};

use crate::allocator::BufferHandle;
use crate::handle::MasterService;
use crate::index::{Tenant, SHARD_COUNT};
use crate::object::Replica;

/// Result of [`MasterService::check_accounting`]: what was found wrong (empty = consistent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountingReport {
    pub segments_checked: usize,
    pub live_buffers: usize,
    pub problems: Vec<String>,
}

impl MasterService {
    /// Number of objects in the index (all tenants, valid or not yet cleaned).
    pub fn object_count(&self) -> usize {
        (0..SHARD_COUNT)
            .map(|i| {
                self.index
                    .shard_at(i)
                    .read()
                    .tenants()
                    .map(|(_, s)| s.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Number of named-tenant states held by the shards (a state is dropped once empty, so this
    /// counts `(shard, tenant)` pairs with at least one object).
    pub fn tenant_state_count(&self) -> usize {
        (0..SHARD_COUNT)
            .map(|i| self.index.shard_at(i).read().others.len())
            .sum()
    }

    /// Objects of one tenant (all shards).
    pub fn tenant_object_count(&self, tenant: &TenantId) -> usize {
        let t = Tenant::of(Some(tenant));
        (0..SHARD_COUNT)
            .map(|i| {
                self.index
                    .shard_at(i)
                    .read()
                    .tenant(t)
                    .map_or(0, |s| s.len())
            })
            .sum()
    }

    /// Checks exact space accounting: for every segment with a live allocator, `used` equals the
    /// sum of the live buffers found in the index and the discarded list, the buffer count
    /// matches, every buffer lies inside the segment and no two overlap (nor overlap a free
    /// range). Meant for tests on a quiescent master; takes every shard's read lock in turn.
    pub fn check_accounting(&self) -> AccountingReport {
        let mut buffers: HashMap<SegmentId, Vec<(u64, u64)>> = HashMap::new();
        let mut collect = |h: &BufferHandle| {
            if let Some(a) = h.allocator() {
                buffers
                    .entry(a.info().segment_id)
                    .or_default()
                    .push((h.offset(), h.len()));
            }
        };
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            for (_, state) in shard.tenants() {
                for entry in state.objects.iter() {
                    entry
                        .meta
                        .replicas
                        .iter()
                        .filter_map(Replica::handle)
                        .for_each(&mut collect);
                }
            }
        }
        for d in self.discarded.lock().entries.iter() {
            d.buffers.iter().for_each(&mut collect);
        }
        let mut report = AccountingReport::default();
        let segs = self.segments.inner.read();
        for seg in segs.mounted.values() {
            let Some(alloc) = &seg.allocator else {
                continue;
            };
            report.segments_checked += 1;
            let mut list = buffers.remove(&seg.segment.id).unwrap_or_default();
            report.live_buffers += list.len();
            let sum: u64 = list.iter().map(|&(_, l)| l).sum();
            let id = seg.segment.id;
            if sum != alloc.used_bytes() {
                report.problems.push(format!(
                    "segment {id}: used_bytes {} != sum of live buffers {sum}",
                    alloc.used_bytes()
                ));
            }
            if list.len() as u64 != alloc.live_buffers() {
                report.problems.push(format!(
                    "segment {id}: live_buffers {} != buffers found {}",
                    alloc.live_buffers(),
                    list.len()
                ));
            }
            let free = alloc.free_ranges();
            let free_sum: u64 = free.iter().map(|&(_, l)| l).sum();
            if free_sum + sum != alloc.capacity() {
                report.problems.push(format!(
                    "segment {id}: free {free_sum} + used {sum} != capacity {}",
                    alloc.capacity()
                ));
            }
            list.extend(free.iter().map(|&(o, l)| (o, l)));
            list.sort_unstable();
            let mut end = 0u64;
            for &(offset, len) in &list {
                if offset < end {
                    report
                        .problems
                        .push(format!("segment {id}: overlap at offset {offset}"));
                }
                end = end.max(offset + len);
            }
            if end > alloc.capacity() {
                report
                    .problems
                    .push(format!("segment {id}: range past the end ({end})"));
            }
        }
        for (id, list) in buffers {
            report
                .problems
                .push(format!("{} buffers on unknown segment {id}", list.len()));
        }
        report
    }

    /// Per tenant: bytes charged, and the sum over its objects of the bytes of the memory
    /// replicas they hold (must be equal; for tests and audits on a quiescent master).
    pub fn check_quota_accounting(&self) -> Vec<(String, u64, u64)> {
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        for i in 0..SHARD_COUNT {
            let shard = self.index.shard_at(i).read();
            for (t, state) in shard.tenants() {
                let name = t.name();
                let s: u64 = state.objects.iter().map(|e| e.meta.charged_bytes()).sum();
                if s > 0 || state.len() > 0 {
                    *sums.entry(name.to_string()).or_default() += s;
                }
            }
        }
        let q = self.quota.read();
        for name in q.accounts.keys() {
            sums.entry(name.to_string()).or_default();
        }
        sums.into_iter()
            .map(|(name, held)| {
                let charged = q
                    .accounts
                    .get(name.as_str())
                    .map_or(0, |a| a.charged_bytes());
                (name, charged, held)
            })
            .collect()
    }
}
