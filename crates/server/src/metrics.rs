//! Prometheus text for `/metrics`, under upstream's family names, types and labels wherever the
//! feature behind a family is built (docs/master-server.md lists every upstream family and what
//! we do with it).
//!
//! Per-RPC counters are `master_<snake_case_method>_requests_total` and `..._failures_total` as
//! upstream (`master_put_start_requests_total`, …; `ReMountSegment` is `remount_segment` and
//! `MarkTaskToComplete` is also exported as upstream's `update_task`). A single call fails when
//! its reply carries an error code or the server cannot decode it. Batch calls count as upstream
//! does: `_failures_total` when the call or every item failed, `_partial_successes_total` when
//! some items failed, and `_items_total` / `_failed_items_total` per item.

use mooncake_common::{ErrorCode, GetReplicaListResponse, ReplicaDescriptor, ReplicaKind};
use mooncake_master::MasterCounters;
use mooncake_proto::METHODS;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upstream's bucket bounds of `master_value_size_bytes` (4 KiB … 64 MiB).
pub const VALUE_SIZE_BUCKETS: [u64; 7] = [
    4 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

/// Upstream's bucket bounds of `master_snapshot_duration_ms` (0 … 300 s, in ms).
pub const SNAPSHOT_DURATION_BUCKETS_MS: [u64; 11] = [
    0, 500, 1000, 5000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
];

/// The bucket bounds of one histogram family.
pub trait Buckets {
    const BOUNDS: &'static [u64];
}

/// `master_value_size_bytes`'s buckets.
#[derive(Debug)]
pub struct ValueSizeBuckets;

impl Buckets for ValueSizeBuckets {
    const BOUNDS: &'static [u64] = &VALUE_SIZE_BUCKETS;
}

/// `master_snapshot_duration_ms`'s buckets.
#[derive(Debug)]
pub struct SnapshotDurationBuckets;

impl Buckets for SnapshotDurationBuckets {
    const BOUNDS: &'static [u64] = &SNAPSHOT_DURATION_BUCKETS_MS;
}

/// A histogram with fixed bounds; rendered cumulatively as Prometheus wants.
#[derive(Debug)]
pub struct Histogram<B: Buckets> {
    /// One slot per bound, then the overflow slot (`+Inf` only).
    slots: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
    bounds: std::marker::PhantomData<B>,
}

/// Sizes of allocated puts (bytes).
pub type SizeHistogram = Histogram<ValueSizeBuckets>;

impl<B: Buckets> Default for Histogram<B> {
    fn default() -> Self {
        Histogram {
            slots: (0..=B::BOUNDS.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
            bounds: std::marker::PhantomData,
        }
    }
}

impl<B: Buckets> Histogram<B> {
    pub fn observe(&self, value: u64) {
        let slot = B::BOUNDS
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(B::BOUNDS.len());
        self.slots[slot].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the family; `le` labels are written as upstream writes them (`4096.000000`).
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, slot) in B::BOUNDS.iter().zip(&self.slots) {
            cumulative += slot.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}.000000\"}} {cumulative}");
        }
        cumulative += self.slots[B::BOUNDS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

/// Request, failure and batch-item counters for every RPC method, and what the dispatcher learns
/// from the replies (gets served from memory, allocation failures, value sizes).
#[derive(Debug)]
pub struct RpcMetrics {
    requests: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    partial_successes: Vec<AtomicU64>,
    items: Vec<AtomicU64>,
    failed_items: Vec<AtomicU64>,
    unknown_method_requests: AtomicU64,
    put_start_alloc_failures: AtomicU64,
    put_start_partial_allocations: AtomicU64,
    put_start_object_already_exists: AtomicU64,
    batch_put_start_object_already_exists: AtomicU64,
    total_gets: AtomicU64,
    valid_gets: AtomicU64,
    mem_cache_hits: AtomicU64,
    /// Lookups whose object is on local disks only, and lookups that found nothing.
    disk_hits: AtomicU64,
    get_misses: AtomicU64,
    mem_cache_hit_bytes: AtomicU64,
    value_sizes: SizeHistogram,
    /// PutStarts (single or batch item) refused with TENANT_QUOTA_EXCEEDED, per tenant.
    tenant_quota_rejects: parking_lot::Mutex<BTreeMap<String, u64>>,
}

fn counters() -> Vec<AtomicU64> {
    METHODS.iter().map(|_| AtomicU64::new(0)).collect()
}

impl Default for RpcMetrics {
    fn default() -> Self {
        RpcMetrics {
            requests: counters(),
            failures: counters(),
            partial_successes: counters(),
            items: counters(),
            failed_items: counters(),
            unknown_method_requests: AtomicU64::new(0),
            put_start_alloc_failures: AtomicU64::new(0),
            put_start_partial_allocations: AtomicU64::new(0),
            put_start_object_already_exists: AtomicU64::new(0),
            batch_put_start_object_already_exists: AtomicU64::new(0),
            total_gets: AtomicU64::new(0),
            valid_gets: AtomicU64::new(0),
            mem_cache_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            get_misses: AtomicU64::new(0),
            mem_cache_hit_bytes: AtomicU64::new(0),
            value_sizes: SizeHistogram::default(),
            tenant_quota_rejects: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }
}

fn slot(method: u16) -> Option<usize> {
    METHODS.iter().position(|(id, _)| *id == method)
}

/// The upstream method whose families also count our pinned form `method` (a read or an
/// existence check that takes a read pin instead of the lease is the same call to upstream's
/// dashboards, which know only upstream's families); the pinned form's own families break its
/// share out.
fn upstream_form(method: u16) -> Option<u16> {
    use mooncake_proto::methods::{self as m, Method};
    match method {
        m::GetReplicaListPinned::ID => Some(m::GetReplicaList::ID),
        m::BatchGetReplicaListPinned::ID => Some(m::BatchGetReplicaList::ID),
        m::ExistKeyPinned::ID => Some(m::ExistKey::ID),
        m::BatchExistKeyPinned::ID => Some(m::BatchExistKey::ID),
        _ => None,
    }
}

/// The counter slots of `method`: its own, then its upstream form's (see [`upstream_form`]).
fn slots(method: u16) -> impl Iterator<Item = Option<usize>> {
    std::iter::once(slot(method)).chain(upstream_form(method).map(slot))
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Upstream's family stem of a method where it is not the plain snake case.
fn family(name: &str) -> String {
    match name {
        "ReMountSegment" => "remount_segment".to_string(),
        other => snake_case(other),
    }
}

/// Upstream families that count one of our methods under another name.
const ALSO_EXPORTED_AS: &[(&str, &str)] = &[("MarkTaskToComplete", "update_task")];

impl RpcMetrics {
    /// Counts one request of `method`, and a failure when `failed`.
    pub fn record(&self, method: u16, failed: bool) {
        for slot in slots(method) {
            match slot {
                Some(i) => {
                    add(&self.requests[i], 1);
                    if failed {
                        add(&self.failures[i], 1);
                    }
                }
                None => add(&self.unknown_method_requests, 1),
            }
        }
    }

    /// Counts one batch call of `method` over `items` items of which `failed_items` failed
    /// (`call_failed`: the whole call was refused, every item counts as failed).
    pub fn record_batch(&self, method: u16, items: usize, failed_items: usize, call_failed: bool) {
        for slot in slots(method) {
            match slot {
                Some(i) => self.record_batch_in(i, items, failed_items, call_failed),
                None => add(&self.unknown_method_requests, 1),
            }
        }
    }

    fn record_batch_in(&self, i: usize, items: usize, failed_items: usize, call_failed: bool) {
        let failed_items = if call_failed {
            items
        } else {
            failed_items.min(items)
        };
        add(&self.requests[i], 1);
        if call_failed || (items > 0 && failed_items == items) {
            add(&self.failures[i], 1);
        } else if failed_items > 0 {
            add(&self.partial_successes[i], 1);
        }
        add(&self.items[i], items as u64);
        add(&self.failed_items[i], failed_items as u64);
    }

    /// Counts one GetReplicaList result (a single call or a batch item): upstream's
    /// `total_get_nums_`, `valid_get_nums_` and the memory cache hit counters.
    pub fn record_get(&self, result: &Result<GetReplicaListResponse, ErrorCode>) {
        add(&self.total_gets, 1);
        if let Ok(response) = result {
            add(&self.valid_gets, 1);
            if let Some(ReplicaKind::Memory(m)) = response.replicas.first().map(|r| &r.kind) {
                add(&self.mem_cache_hits, 1);
                add(&self.mem_cache_hit_bytes, m.size);
            } else if response
                .replicas
                .iter()
                .any(|r| matches!(r.kind, ReplicaKind::LocalDisk(_)))
            {
                add(&self.disk_hits, 1);
            }
        } else {
            add(&self.get_misses, 1);
        }
    }

    /// Counts one PutStart result (a single call or a batch item): value sizes of allocated puts,
    /// allocation failures, partial allocations (fewer memory replicas than asked), and puts
    /// refused because the key exists.
    pub fn record_put_start(
        &self,
        value_len: u64,
        replicas_wanted: usize,
        result: &Result<Vec<ReplicaDescriptor>, ErrorCode>,
        in_batch: bool,
    ) {
        match result {
            Ok(replicas) => {
                self.value_sizes.observe(value_len);
                let memory = replicas
                    .iter()
                    .filter(|r| matches!(r.kind, ReplicaKind::Memory(_)))
                    .count();
                if memory < replicas_wanted {
                    add(&self.put_start_partial_allocations, 1);
                }
            }
            Err(ErrorCode::NO_AVAILABLE_HANDLE) => add(&self.put_start_alloc_failures, 1),
            Err(ErrorCode::OBJECT_ALREADY_EXISTS) if in_batch => {
                add(&self.batch_put_start_object_already_exists, 1)
            }
            Err(ErrorCode::OBJECT_ALREADY_EXISTS) => add(&self.put_start_object_already_exists, 1),
            Err(_) => {}
        }
    }

    /// Counts a PutStart result (single or batch item) of `tenant` refused by its quota:
    /// upstream's `mooncake_tenant_quota_reject_total{tenant_id, reason="quota_exceeded"}`.
    pub fn record_tenant_quota<T>(&self, tenant: &str, result: &Result<T, ErrorCode>) {
        if matches!(result, Err(ErrorCode::TENANT_QUOTA_EXCEEDED)) {
            *self
                .tenant_quota_rejects
                .lock()
                .entry(if tenant.is_empty() {
                    mooncake_common::DEFAULT_TENANT.to_string()
                } else {
                    tenant.to_string()
                })
                .or_default() += 1;
        }
    }

    /// Appends upstream's `mooncake_tenant_quota_reject_total`, one sample per tenant refused.
    fn render_tenant_quota_rejects(&self, out: &mut String) {
        let name = "mooncake_tenant_quota_reject_total";
        let _ = writeln!(
            out,
            "# HELP {name} Total number of tenant quota admission rejects\n# TYPE {name} counter"
        );
        for (tenant, n) in self.tenant_quota_rejects.lock().iter() {
            let tenant = crate::http::escape_label(tenant);
            let _ = writeln!(
                out,
                "{name}{{tenant_id=\"{tenant}\",reason=\"quota_exceeded\"}} {n}"
            );
        }
    }

    /// Requests of `method` so far.
    pub fn requests(&self, method: u16) -> u64 {
        slot(method).map_or(0, |i| get(&self.requests[i]))
    }

    /// Failed requests of `method` so far.
    pub fn failures(&self, method: u16) -> u64 {
        slot(method).map_or(0, |i| get(&self.failures[i]))
    }

    /// Appends the counters in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        for (i, (_, name)) in METHODS.iter().enumerate() {
            let mut stems = vec![family(name)];
            stems.extend(
                ALSO_EXPORTED_AS
                    .iter()
                    .filter(|(ours, _)| ours == name)
                    .map(|(_, theirs)| theirs.to_string()),
            );
            for stem in stems {
                counter(
                    out,
                    &format!("master_{stem}_requests_total"),
                    &format!("Total number of {name} requests received"),
                    get(&self.requests[i]),
                );
                counter(
                    out,
                    &format!("master_{stem}_failures_total"),
                    &format!("Total number of failed {name} requests"),
                    get(&self.failures[i]),
                );
                if name.starts_with("Batch") {
                    counter(
                        out,
                        &format!("master_{stem}_partial_successes_total"),
                        &format!("Total number of partially successful {name} requests"),
                        get(&self.partial_successes[i]),
                    );
                    counter(
                        out,
                        &format!("master_{stem}_items_total"),
                        &format!("Total number of items processed in {name} requests"),
                        get(&self.items[i]),
                    );
                    counter(
                        out,
                        &format!("master_{stem}_failed_items_total"),
                        &format!("Total number of failed items in {name} requests"),
                        get(&self.failed_items[i]),
                    );
                }
            }
        }
        counter(
            out,
            "master_unknown_method_requests_total",
            "Requests naming a method this master does not know",
            get(&self.unknown_method_requests),
        );
        counter(
            out,
            "master_put_start_alloc_failures_total",
            "Total number of PutStart failures caused by replica allocation failure",
            get(&self.put_start_alloc_failures),
        );
        counter(
            out,
            "master_put_start_partial_allocations_total",
            "Total number of PutStart operations that allocated fewer replicas than requested",
            get(&self.put_start_partial_allocations),
        );
        counter(
            out,
            "master_put_start_object_already_exists_total",
            "Total number of PutStart requests refused because the object already exists",
            get(&self.put_start_object_already_exists),
        );
        counter(
            out,
            "master_batch_put_start_object_already_exists_total",
            "Total number of BatchPutStart items refused because the object already exists",
            get(&self.batch_put_start_object_already_exists),
        );
        counter(
            out,
            "mem_cache_hit_nums_",
            "Total number of GetReplicaList results served from the memory pool",
            get(&self.mem_cache_hits),
        );
        counter(
            out,
            "master_get_disk_hits_total",
            "GetReplicaList results whose object is on local disks only (read through its node)",
            get(&self.disk_hits),
        );
        counter(
            out,
            "master_get_misses_total",
            "GetReplicaList results that found no readable object",
            get(&self.get_misses),
        );
        counter(
            out,
            "mem_cache_hit_bytes_total",
            "Total bytes of GetReplicaList results served from the memory pool",
            get(&self.mem_cache_hit_bytes),
        );
        counter(
            out,
            "valid_get_nums_",
            "Total number of GetReplicaList operations that returned at least one completed replica",
            get(&self.valid_gets),
        );
        counter(
            out,
            "total_get_nums_",
            "Total number of GetReplicaList operations",
            get(&self.total_gets),
        );
        self.value_sizes.render(
            out,
            "master_value_size_bytes",
            "Distribution of object value sizes",
        );
        self.render_tenant_quota_rejects(out);
    }
}

/// Counters of the background workers.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Eviction cycles that ran (over the watermark or after an allocation failure).
    pub eviction_attempts: AtomicU64,
    /// Eviction cycles that removed at least one object.
    pub eviction_cycles: AtomicU64,
    pub evicted_objects: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub expired_clients: AtomicU64,
}

impl WorkerMetrics {
    /// Appends the counters in Prometheus text format. Eviction is memory eviction only, so the
    /// `_mem` families (upstream splits memory from NoF) carry the same values as the totals.
    /// The eviction families count the background cycles and the PutStarts' inline evictions
    /// (`core`) together; `master_put_start_inline_evictions_total` counts the latter alone.
    pub fn render(&self, core: &MasterCounters, out: &mut String) {
        let eviction = [
            (
                "master_attempted_evictions",
                "Total number of attempted eviction operations",
                get(&self.eviction_attempts) + core.inline_evictions(),
            ),
            (
                "master_successful_evictions",
                "Total number of successful eviction operations",
                get(&self.eviction_cycles) + core.inline_evictions_done(),
            ),
        ];
        for (stem, help, value) in eviction {
            counter(out, &format!("{stem}_total"), help, value);
            counter(
                out,
                &format!("{stem}_mem"),
                &format!("{help} in memory"),
                value,
            );
        }
        for (name, help, value) in [
            (
                "master_evicted_key_count",
                "Total number of keys evicted",
                get(&self.evicted_objects) + core.inline_evicted_objects(),
            ),
            (
                "master_evicted_size_bytes",
                "Total bytes of evicted objects",
                get(&self.evicted_bytes) + core.inline_evicted_bytes(),
            ),
        ] {
            counter(out, name, help, value);
            counter(
                out,
                &format!("{name}_mem"),
                &format!("{help} from memory"),
                value,
            );
        }
        let name = "mooncake_tenant_evict_bytes_total";
        let _ = writeln!(
            out,
            "# HELP {name} Total bytes evicted by tenant-scoped quota eviction\n# TYPE {name} counter"
        );
        for (tenant, bytes) in core.tenant_evicted_bytes() {
            let tenant = crate::http::escape_label(&tenant);
            let _ = writeln!(out, "{name}{{tenant_id=\"{tenant}\"}} {bytes}");
        }
        counter(
            out,
            "master_put_start_inline_evictions_total",
            "PutStarts that found no space and ran inline eviction",
            core.inline_evictions(),
        );
        counter(
            out,
            "master_expired_clients_total",
            "Clients whose segments were unmounted after client_ttl without a ping",
            get(&self.expired_clients),
        );
    }
}

/// `PutStart` → `put_start`, `ReMountSegment` → `re_mount_segment`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Appends one counter family with its HELP and TYPE lines.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Appends one gauge family with its HELP and TYPE lines.
pub fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

/// What `/metrics` does with one of upstream's families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFamily {
    /// Exported under upstream's name, type and labels; the feature that feeds it.
    Exported(&'static str),
    /// Absent: the feature behind it is not built (the reason).
    NotBuilt(&'static str),
}

use UpstreamFamily::{Exported, NotBuilt};

const NOF: &str = "NVMe-oF segments are not built";
const DFS: &str = "the DFS/3FS storage backend is not built";
const OFFLOAD: &str =
    "upstream's disk-replica families are not exported (the disk tier counts in GetOffloadStats)";
const PROMOTION: &str =
    "upstream's promotion families are not exported (ours: master_promotions_*, docs/disk-tier.md)";
const HA: &str = "HA (op-log replication to a standby master) is not built";
const QUERY_IP: &str = "BatchQueryIp is not served";

/// Every family of upstream's `/metrics` (release 0.3.13, in its order): (name, TYPE, status).
/// The real-process tests check the binary against it; docs/master-server.md explains it.
pub const UPSTREAM_FAMILIES: &[(&str, &str, UpstreamFamily)] = &[
    (
        "master_allocated_bytes",
        "gauge",
        Exported("memory segments"),
    ),
    (
        "master_total_capacity_bytes",
        "gauge",
        Exported("memory segments"),
    ),
    (
        "segment_allocated_bytes",
        "gauge",
        Exported("memory segments"),
    ),
    (
        "segment_total_capacity_bytes",
        "gauge",
        Exported("memory segments"),
    ),
    ("master_nof_allocated_bytes", "gauge", NotBuilt(NOF)),
    ("master_total_nof_capacity_bytes", "gauge", NotBuilt(NOF)),
    ("master_allocated_file_size_bytes", "gauge", NotBuilt(DFS)),
    ("master_total_file_capacity_bytes", "gauge", NotBuilt(DFS)),
    ("master_key_count", "gauge", Exported("object census")),
    (
        "master_soft_pin_key_count",
        "gauge",
        Exported("object census"),
    ),
    (
        "master_active_clients",
        "gauge",
        Exported("client liveness"),
    ),
    ("master_value_size_bytes", "histogram", Exported("puts")),
    (
        "master_exist_key_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_exist_key_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_start_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_start_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_start_alloc_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_start_partial_allocations_total",
        "counter",
        Exported("puts"),
    ),
    (
        "master_put_end_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_end_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_revoke_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_put_revoke_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_get_replica_list_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_get_replica_list_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_get_replica_list_by_regex_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_get_replica_list_by_regex_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_by_regex_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_by_regex_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_all_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remove_all_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_mount_segment_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_mount_segment_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_unmount_segment_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_unmount_segment_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remount_segment_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_remount_segment_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_ping_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_ping_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_start_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_start_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_end_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_end_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_revoke_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_copy_revoke_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_start_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_start_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_end_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_end_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_revoke_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_move_revoke_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_evict_disk_replica_requests_total",
        "counter",
        NotBuilt(OFFLOAD),
    ),
    (
        "master_evict_disk_replica_failures_total",
        "counter",
        NotBuilt(OFFLOAD),
    ),
    (
        "master_create_copy_task_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_create_copy_task_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_create_move_task_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_create_move_task_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_update_task_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_update_task_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_query_task_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_query_task_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_fetch_tasks_requests_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_fetch_tasks_failures_total",
        "counter",
        Exported("RPC counters"),
    ),
    (
        "master_batch_exist_key_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_exist_key_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_exist_key_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_exist_key_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_exist_key_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_query_ip_requests_total",
        "counter",
        NotBuilt(QUERY_IP),
    ),
    (
        "master_batch_query_ip_failures_total",
        "counter",
        NotBuilt(QUERY_IP),
    ),
    (
        "master_batch_query_ip_partial_successes_total",
        "counter",
        NotBuilt(QUERY_IP),
    ),
    (
        "master_batch_query_ip_items_total",
        "counter",
        NotBuilt(QUERY_IP),
    ),
    (
        "master_batch_query_ip_failed_items_total",
        "counter",
        NotBuilt(QUERY_IP),
    ),
    (
        "master_batch_replica_clear_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_replica_clear_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_replica_clear_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_replica_clear_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_replica_clear_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_get_replica_list_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_get_replica_list_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_get_replica_list_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_get_replica_list_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_get_replica_list_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_start_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_start_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_start_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_start_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_start_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_end_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_end_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_end_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_end_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_end_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_revoke_requests_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_revoke_failures_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_revoke_partial_successes_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_revoke_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    (
        "master_batch_put_revoke_failed_items_total",
        "counter",
        Exported("batch RPC counters"),
    ),
    ("mem_cache_hit_nums_", "counter", Exported("gets")),
    ("file_cache_hit_nums_", "counter", NotBuilt(OFFLOAD)),
    ("mem_cache_hit_bytes_total", "counter", Exported("gets")),
    ("file_cache_hit_bytes_total", "counter", NotBuilt(OFFLOAD)),
    ("mem_cache_nums_", "gauge", Exported("object census")),
    ("file_cache_nums_", "gauge", NotBuilt(OFFLOAD)),
    ("valid_get_nums_", "counter", Exported("gets")),
    ("total_get_nums_", "counter", Exported("gets")),
    (
        "master_successful_evictions_total",
        "counter",
        Exported("eviction"),
    ),
    (
        "master_attempted_evictions_total",
        "counter",
        Exported("eviction"),
    ),
    ("master_evicted_key_count", "counter", Exported("eviction")),
    ("master_evicted_size_bytes", "counter", Exported("eviction")),
    ("master_put_start_discard_cnt", "counter", Exported("puts")),
    ("master_put_start_release_cnt", "counter", Exported("puts")),
    (
        "master_put_start_discarded_staging_size",
        "gauge",
        Exported("puts"),
    ),
    ("master_promotion_in_flight", "gauge", NotBuilt(PROMOTION)),
    (
        "master_promotion_admitted_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_completed_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_completed_bytes_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_expired_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_failed_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_cancelled_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_rejected_frequency_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_rejected_watermark_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_rejected_cap_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_recorded_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_admitted_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_admission_rejected_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_expired_evaluated_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_expired_unevaluated_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    (
        "master_promotion_candidate_dropped_limit_total",
        "counter",
        NotBuilt(PROMOTION),
    ),
    ("ha_oplog_last_sequence_id", "gauge", NotBuilt(HA)),
    ("ha_oplog_applied_sequence_id", "gauge", NotBuilt(HA)),
    ("ha_oplog_standby_lag", "gauge", NotBuilt(HA)),
    ("ha_oplog_pending_entries", "gauge", NotBuilt(HA)),
    ("ha_pending_mutation_queue_size", "gauge", NotBuilt(HA)),
    ("ha_standby_state", "gauge", NotBuilt(HA)),
];

/// Families of upstream's newer master (its Grafana dashboard queries them) whose feature we
/// build; its NoF families (`*_nof`, `master_nof_heartbeat_*`, `master_*_nof_segment_*`) stay absent.
pub const UPSTREAM_DASHBOARD_FAMILIES: &[(&str, &str, UpstreamFamily)] = &[
    (
        "master_put_start_object_already_exists_total",
        "counter",
        Exported("puts"),
    ),
    (
        "master_batch_put_start_object_already_exists_total",
        "counter",
        Exported("puts"),
    ),
    (
        "master_attempted_evictions_mem",
        "counter",
        Exported("eviction"),
    ),
    (
        "master_successful_evictions_mem",
        "counter",
        Exported("eviction"),
    ),
    (
        "master_evicted_key_count_mem",
        "counter",
        Exported("eviction"),
    ),
    (
        "master_evicted_size_bytes_mem",
        "counter",
        Exported("eviction"),
    ),
];

/// The local disk tier's counters and gauges (docs/disk-tier.md).
pub fn render_offload(s: &mooncake_master::OffloadStats, out: &mut String) {
    for (name, help, value) in [
        (
            "master_offload_tasks_queued_total",
            "Offload tasks queued (each pins one memory replica until answered)",
            s.queued,
        ),
        (
            "master_offload_tasks_stored_total",
            "Offload tasks answered stored (a LOCAL_DISK replica was added)",
            s.stored,
        ),
        (
            "master_offload_tasks_refused_total",
            "Offload tasks answered not stored (only unpinned)",
            s.refused,
        ),
        (
            "master_offload_tasks_dropped_total",
            "Offload tasks whose node expired before answering",
            s.dropped,
        ),
        (
            "master_disk_evicted_replicas_total",
            "LOCAL_DISK replicas dropped because their node evicted them from its disk",
            s.disk_evicted,
        ),
        (
            "master_disk_advertised_replicas_total",
            "LOCAL_DISK replicas registered from a node's scan of its disk",
            s.advertised,
        ),
        (
            "master_disk_dropped_records_total",
            "Disk records nodes deleted because their object was removed",
            s.disk_dropped,
        ),
        (
            "master_promotions_started_total",
            "Promotions on hit started (a memory replica allocated for a disk-only object)",
            s.promotions,
        ),
        (
            "master_promotions_total",
            "Promotions on hit completed (the object is in memory again)",
            s.promoted,
        ),
        (
            "master_promotion_failures_total",
            "Promotions on hit that failed (the memory replica was erased)",
            s.promotion_failures,
        ),
    ] {
        counter(out, name, help, value);
    }
    for (name, help, value) in [
        (
            "master_offload_tasks_in_flight",
            "Offload tasks queued or handed out and not answered",
            s.in_flight,
        ),
        (
            "master_local_disks",
            "Nodes with a mounted local disk",
            s.disks,
        ),
        (
            "master_local_disk_capacity_bytes",
            "Capacity of the mounted local disks",
            s.disk_capacity_bytes,
        ),
        (
            "master_local_disk_used_bytes",
            "Bytes of values on the mounted local disks, as their nodes last reported",
            s.disk_used_bytes,
        ),
    ] {
        gauge(out, name, help, value as f64);
    }
}

/// Hot-key replication's counters and gauges (docs/master.md "Hot-key replicas").
pub fn render_hot_keys(s: &mooncake_master::HotKeyStats, out: &mut String) {
    use mooncake_master::DynamicReplicationMode as Mode;
    gauge(
        out,
        "master_hot_key_mode",
        "dynamic_replication_mode: 0 off, 1 observe, 2 enforce",
        match s.mode {
            Mode::Off => 0.0,
            Mode::Observe => 1.0,
            Mode::Enforce => 2.0,
        },
    );
    for (name, help, value) in [
        (
            "master_hot_key_reads_counted_total",
            "Reads whose heat was counted (answers with a memory replica)",
            s.reads_counted,
        ),
        (
            "master_hot_keys_total",
            "Times a key was judged hot (observe mode: would have been replicated)",
            s.hot_keys,
        ),
        (
            "master_hot_key_copy_tasks_total",
            "Copy tasks queued to give a hot key one more memory replica",
            s.tasks_queued,
        ),
        (
            "master_hot_key_no_target_total",
            "Hot keys left alone: no segment could take another replica",
            s.no_target,
        ),
        (
            "master_hot_key_extras_dropped_total",
            "Extra replicas of hot keys dropped by eviction (before any whole object)",
            s.extras_dropped,
        ),
        (
            "master_hot_key_extras_dropped_bytes_total",
            "Bytes of extra replicas of hot keys dropped by eviction",
            s.extras_dropped_bytes,
        ),
    ] {
        counter(out, name, help, value);
    }
    gauge(
        out,
        "master_hot_key_extras",
        "Extra replicas of hot keys registered (queued or made, not dropped)",
        s.extras as f64,
    );
    let _ = writeln!(
        out,
        "# HELP master_hot_key_reads_led_total Multi-replica read answers (enforce mode) whose \
         first replica, the one readers take, is on this endpoint\n\
         # TYPE master_hot_key_reads_led_total counter"
    );
    for (endpoint, n) in &s.reads_led {
        let _ = writeln!(
            out,
            "master_hot_key_reads_led_total{{endpoint=\"{}\"}} {n}",
            crate::http::escape_label(endpoint)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::{MemoryDescriptor, ReplicaId, ReplicaStatus};
    use mooncake_proto::methods::{
        BatchExistKeyPinned, BatchGetReplicaListPinned, BatchPutStart, ExistKey, ExistKeyPinned,
        GetReplicaList, GetReplicaListPinned, MarkTaskToComplete, Method, PutStart, ReMountSegment,
    };
    use std::collections::HashSet;

    fn value(text: &str, name: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
    }

    fn memory(size: u64) -> ReplicaDescriptor {
        ReplicaDescriptor {
            id: ReplicaId(1),
            status: ReplicaStatus::COMPLETE,
            kind: ReplicaKind::Memory(MemoryDescriptor {
                size,
                buffer_address: 0x1000,
                protocol: "tcp".into(),
                transport_endpoint: "127.0.0.1:1".into(),
            }),
        }
    }

    #[test]
    fn upstream_table_lists_each_family_once() {
        let all: Vec<_> = UPSTREAM_FAMILIES
            .iter()
            .chain(UPSTREAM_DASHBOARD_FAMILIES)
            .collect();
        let names: HashSet<_> = all.iter().map(|(name, _, _)| *name).collect();
        assert_eq!(names.len(), all.len());
        assert_eq!(UPSTREAM_FAMILIES.len(), 136);
        assert!(all
            .iter()
            .all(|(_, kind, _)| ["counter", "gauge", "histogram"].contains(kind)));
    }

    #[test]
    fn pinned_lookups_also_count_in_upstreams_families() {
        let metrics = RpcMetrics::default();
        metrics.record(ExistKey::ID, false);
        metrics.record(ExistKeyPinned::ID, false);
        metrics.record(ExistKeyPinned::ID, true);
        metrics.record(GetReplicaListPinned::ID, false);
        metrics.record_batch(BatchExistKeyPinned::ID, 4, 1, false);
        metrics.record_batch(BatchGetReplicaListPinned::ID, 3, 0, true);
        assert_eq!(metrics.requests(ExistKey::ID), 3);
        assert_eq!(metrics.failures(ExistKey::ID), 1);
        assert_eq!(metrics.requests(ExistKeyPinned::ID), 2);
        assert_eq!(metrics.requests(GetReplicaList::ID), 1);
        let mut text = String::new();
        metrics.render(&mut text);
        assert_eq!(value(&text, "master_exist_key_requests_total"), Some(3));
        assert_eq!(
            value(&text, "master_exist_key_pinned_requests_total"),
            Some(2)
        );
        assert_eq!(value(&text, "master_batch_exist_key_items_total"), Some(4));
        assert_eq!(
            value(&text, "master_batch_exist_key_partial_successes_total"),
            Some(1)
        );
        assert_eq!(
            value(&text, "master_batch_get_replica_list_failed_items_total"),
            Some(3)
        );
        assert_eq!(
            value(&text, "master_unknown_method_requests_total"),
            Some(0)
        );
    }

    #[test]
    fn names_follow_upstream_families() {
        assert_eq!(snake_case("PutStart"), "put_start");
        assert_eq!(snake_case("ExistKey"), "exist_key");
        let metrics = RpcMetrics::default();
        metrics.record(PutStart::ID, false);
        metrics.record(PutStart::ID, true);
        metrics.record(ReMountSegment::ID, false);
        metrics.record(MarkTaskToComplete::ID, true);
        metrics.record(60_000, false);
        assert_eq!(metrics.requests(PutStart::ID), 2);
        assert_eq!(metrics.failures(PutStart::ID), 1);
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains(
            "# TYPE master_put_start_requests_total counter\nmaster_put_start_requests_total 2\n"
        ));
        assert_eq!(value(&text, "master_put_start_failures_total"), Some(1));
        assert_eq!(
            value(&text, "master_remount_segment_requests_total"),
            Some(1)
        );
        assert_eq!(value(&text, "master_update_task_failures_total"), Some(1));
        assert_eq!(
            value(&text, "master_mark_task_to_complete_failures_total"),
            Some(1)
        );
        assert_eq!(
            value(&text, "master_unknown_method_requests_total"),
            Some(1)
        );
    }

    #[test]
    fn batches_count_as_upstream() {
        let metrics = RpcMetrics::default();
        let id = BatchPutStart::ID;
        metrics.record_batch(id, 4, 0, false);
        metrics.record_batch(id, 4, 1, false);
        metrics.record_batch(id, 4, 4, false);
        metrics.record_batch(id, 3, 0, true);
        metrics.record_batch(id, 0, 0, false);
        let mut text = String::new();
        metrics.render(&mut text);
        assert_eq!(
            value(&text, "master_batch_put_start_requests_total"),
            Some(5)
        );
        assert_eq!(
            value(&text, "master_batch_put_start_failures_total"),
            Some(2)
        );
        assert_eq!(
            value(&text, "master_batch_put_start_partial_successes_total"),
            Some(1)
        );
        assert_eq!(value(&text, "master_batch_put_start_items_total"), Some(15));
        assert_eq!(
            value(&text, "master_batch_put_start_failed_items_total"),
            Some(8)
        );
        assert!(
            !text.contains("master_put_start_items_total"),
            "single calls have no items"
        );
    }

    #[test]
    fn gets_put_starts_and_value_sizes_are_counted() {
        let metrics = RpcMetrics::default();
        let hit = GetReplicaListResponse {
            replicas: vec![memory(4096)],
            lease_ttl_ms: 10_000,
            object_checksum: None,
        };
        metrics.record_get(&Ok(hit));
        metrics.record_get(&Err(ErrorCode::OBJECT_NOT_FOUND));
        metrics.record_put_start(4096, 1, &Ok(vec![memory(4096)]), false);
        metrics.record_put_start(1 << 20, 2, &Ok(vec![memory(1 << 20)]), true);
        metrics.record_put_start(100 << 20, 1, &Ok(vec![memory(100 << 20)]), false);
        metrics.record_put_start(10, 1, &Err(ErrorCode::NO_AVAILABLE_HANDLE), false);
        metrics.record_put_start(10, 1, &Err(ErrorCode::OBJECT_ALREADY_EXISTS), true);
        let mut text = String::new();
        metrics.render(&mut text);
        assert_eq!(value(&text, "total_get_nums_"), Some(2));
        assert_eq!(value(&text, "valid_get_nums_"), Some(1));
        assert_eq!(value(&text, "mem_cache_hit_nums_"), Some(1));
        assert_eq!(value(&text, "mem_cache_hit_bytes_total"), Some(4096));
        assert_eq!(
            value(&text, "master_put_start_alloc_failures_total"),
            Some(1)
        );
        assert_eq!(
            value(&text, "master_put_start_partial_allocations_total"),
            Some(1)
        );
        assert_eq!(
            value(&text, "master_batch_put_start_object_already_exists_total"),
            Some(1)
        );
        assert!(text.contains("# TYPE master_value_size_bytes histogram\n"));
        assert_eq!(
            value(&text, "master_value_size_bytes_bucket{le=\"4096.000000\"}"),
            Some(1)
        );
        assert_eq!(
            value(
                &text,
                "master_value_size_bytes_bucket{le=\"1048576.000000\"}"
            ),
            Some(2)
        );
        assert_eq!(
            value(
                &text,
                "master_value_size_bytes_bucket{le=\"67108864.000000\"}"
            ),
            Some(2)
        );
        assert_eq!(
            value(&text, "master_value_size_bytes_bucket{le=\"+Inf\"}"),
            Some(3)
        );
        assert_eq!(value(&text, "master_value_size_bytes_count"), Some(3));
        assert_eq!(
            value(&text, "master_value_size_bytes_sum"),
            Some(4096 + (1 << 20) + (100 << 20))
        );
    }
}
