//! [`MasterService`]: the state machine's handle. Its fields are the components (index, segments,
//! routes, quota table, queues); this file holds construction, the injected clock and random
//! source, the observer slot, tenant resolution and key routing. Every RPC family and background
//! step is an `impl MasterService` block in its own file (see the crate doc's map); they depend on
//! this handle and the components, never the other way round.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use mooncake_common::{Clock, ErrorCode, ReplicaId};
use parking_lot::{Mutex, RwLock};
use thiserror::Error;

use crate::clients::ClientMonitor;
use crate::config::{ConfigError, MasterServiceConfig};
use crate::deferred::{DiscardedList, SoftPinQueue};
use crate::index::{key_hash, routed, Index, Tenant};
use crate::mutation::{MutationObserver, ObserverSlot};
use crate::quota::QuotaTable;
use crate::rng::MasterRng;
use crate::routes::Routes;
use crate::segments::SegmentManager;
use crate::tasks::TaskManager;
use crate::unverified::Unverified;

/// Longest key accepted (bytes). Upstream has no limit; we bound it (every input is bounded).
pub const MAX_KEY_LEN_BYTES: usize = 4096;
/// Longest regex pattern accepted (bytes).
pub const MAX_REGEX_LEN_BYTES: usize = 4096;
/// Compiled-size limit for regexes (bytes), so a hostile pattern cannot exhaust memory.
pub const MAX_REGEX_COMPILED_BYTES: usize = 1 << 20;

/// [`MasterService::set_observer`] was called on a master that already has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("a mutation observer is already installed")]
pub struct ObserverAlreadySet;

/// The master state machine. Thread-safe; every method is synchronous.
pub struct MasterService {
    pub(crate) config: MasterServiceConfig,
    pub(crate) clock: Arc<dyn Clock>,
    /// Every random choice draws from here (placement, batch start shard, task ids).
    pub(crate) rng: MasterRng,
    /// Sees every mutation (see `mutation.rs`); unset = nothing is built.
    pub(crate) observer: ObserverSlot,
    pub(crate) index: Index,
    pub(crate) segments: SegmentManager,
    pub(crate) next_replica_id: AtomicU64,
    pub(crate) discarded: Mutex<DiscardedList>,
    pub(crate) soft_pins: Mutex<SoftPinQueue>,
    /// Set when a PutStart failed for lack of space while enough names exist (eviction reads it).
    pub(crate) need_eviction: AtomicBool,
    /// Group routing index (scoped key → group shard).
    pub(crate) routes: Routes,
    /// Tenant accounts and policy (used only with multi-tenancy on).
    pub(crate) quota: RwLock<QuotaTable>,
    /// Ping queue and client deadlines.
    pub(crate) clients: ClientMonitor,
    /// Client-executed copy/move tasks.
    pub(crate) tasks: Mutex<TaskManager>,
    /// Drain jobs (`drain_jobs.rs`); taken before the segment, shard and task locks.
    pub(crate) drain_jobs: Mutex<crate::drain_jobs::DrainJobs>,
    /// Serializes eviction cycles (the 10 ms loop and tenant-scoped eviction).
    pub(crate) eviction_lock: Mutex<()>,
    /// Candidate count of the last global census (capacity hint for the next one).
    pub(crate) census_hint: AtomicUsize,
    /// Restored replicas waiting for their node's check (`restore.rs`).
    pub(crate) unverified: Mutex<Unverified>,
    /// A restore left segments waiting or replicas unverified (the deadline step has work).
    pub(crate) restore_active: AtomicBool,
    /// Event counters for `/metrics` (`stats.rs`).
    pub(crate) counters: crate::counters::MasterCounters,
    /// Nodes' disks and their offload mailboxes (`offload.rs`).
    pub(crate) offload: Mutex<crate::offload::OffloadState>,
    pub(crate) offload_counters: crate::offload::OffloadCounters,
    /// Disk hits per key, for promotion on hit (`promotion.rs`).
    pub(crate) hit_sketch: Mutex<crate::promotion::HitSketch>,
    /// Read heat per key, for hot-key replicas (`hot_keys.rs`).
    pub(crate) heat: crate::hot_keys::HeatSketch,
    pub(crate) hot_keys: Mutex<crate::hot_keys::HotKeys>,
    pub(crate) hot_key_counters: crate::hot_keys::HotKeyCounters,
    /// Rotation of multi-replica read answers in enforce mode.
    pub(crate) spread_turn: AtomicU64,
}

impl fmt::Debug for MasterService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterService")
            .field("config", &self.config)
            .field("now_ms", &self.clock.now_ms())
            .field("seed", &self.rng.seed())
            .field("observed", &self.observer.get().is_some())
            .finish_non_exhaustive()
    }
}

impl MasterService {
    /// A master with `config` (validated) reading time from `clock`, its random choices seeded
    /// from entropy.
    pub fn new(config: MasterServiceConfig, clock: Arc<dyn Clock>) -> Result<Self, ConfigError> {
        Self::with_rng(config, clock, MasterRng::from_entropy())
    }

    /// A master whose random choices are fixed by `seed`: one thread driving it with the same
    /// calls and clock gets the same placements, batch orders and task ids.
    pub fn with_seed(
        config: MasterServiceConfig,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        Self::with_rng(config, clock, MasterRng::with_seed(seed))
    }

    fn with_rng(
        config: MasterServiceConfig,
        clock: Arc<dyn Clock>,
        rng: MasterRng,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let observer = ObserverSlot::default();
        Ok(MasterService {
            config,
            clock,
            rng,
            segments: SegmentManager::observed_by(observer.clone()),
            observer,
            index: Index::default(),
            next_replica_id: AtomicU64::new(1),
            discarded: Mutex::new(DiscardedList::default()),
            soft_pins: Mutex::new(SoftPinQueue::default()),
            need_eviction: AtomicBool::new(false),
            routes: Routes::default(),
            quota: RwLock::new(QuotaTable::default()),
            clients: ClientMonitor::default(),
            tasks: Mutex::new(TaskManager::default()),
            drain_jobs: Mutex::new(crate::drain_jobs::DrainJobs::default()),
            eviction_lock: Mutex::new(()),
            census_hint: AtomicUsize::new(0),
            unverified: Mutex::new(Unverified::default()),
            restore_active: AtomicBool::new(false),
            counters: crate::counters::MasterCounters::default(),
            offload: Mutex::new(Default::default()),
            offload_counters: Default::default(),
            hit_sketch: Mutex::new(Default::default()),
            heat: Default::default(),
            hot_keys: Mutex::new(Default::default()),
            hot_key_counters: Default::default(),
            spread_turn: AtomicU64::new(0),
        })
    }

    /// Installs the observer of every mutation (see [`crate::mutation`]). Install it before the
    /// master serves: mutations made earlier are not replayed to it. Only one observer per master.
    pub fn set_observer(
        &self,
        observer: Arc<dyn MutationObserver>,
    ) -> Result<(), ObserverAlreadySet> {
        self.observer.set(observer).map_err(|()| ObserverAlreadySet)
    }

    /// The seed of the master's random source (log it to replay a run).
    pub fn seed(&self) -> u64 {
        self.rng.seed()
    }

    pub fn config(&self) -> &MasterServiceConfig {
        &self.config
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Resolves a caller's tenant: with multi-tenancy off every call lands in `default`; with it
    /// on, `""`/`"default"` are the default tenant and any other name must be valid.
    pub(crate) fn resolve_tenant<'a>(&self, tenant: &'a str) -> Result<Tenant<'a>, ErrorCode> {
        if !self.config.enable_multi_tenants
            || tenant.is_empty()
            || tenant == mooncake_common::DEFAULT_TENANT
        {
            return Ok(Tenant::Default);
        }
        if mooncake_common::tenant::is_valid_tenant_name(tenant) {
            Ok(Tenant::Named(tenant))
        } else {
            Err(ErrorCode::INVALID_PARAMS)
        }
    }

    /// The routing hash of `key`: its own, or with its group's shard bits when it is grouped.
    pub(crate) fn route(&self, tenant: Tenant<'_>, key: &str) -> u64 {
        self.route_from(tenant, key, key_hash(tenant, key))
    }

    /// [`MasterService::route`] given the key's own hash.
    pub(crate) fn route_from(&self, tenant: Tenant<'_>, key: &str, h: u64) -> u64 {
        match self.routes.lookup(tenant, key, h) {
            Some(g) => routed(h, g),
            None => h,
        }
    }

    pub(crate) fn next_replica_id(&self) -> ReplicaId {
        ReplicaId(self.next_replica_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Number of keys with a group route (introspection).
    pub fn grouped_key_count(&self) -> usize {
        self.routes.len()
    }

    /// The shard a key is routed to (introspection for tests and admin: a grouped key lives in
    /// its group's shard).
    pub fn shard_of_key(&self, key: &str, tenant: &str) -> Result<usize, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        Ok(crate::index::shard_of(self.route(tenant, key)))
    }

    /// True when a PutStart failed for lack of space (read and cleared by eviction).
    pub fn need_eviction(&self) -> bool {
        self.need_eviction.load(Ordering::Relaxed)
    }

    /// Drops the group routes of keys whose object is gone (removal drops the membership; the
    /// route itself is collected here, see [`Routes::collect_stale`]). Returns how many routes
    /// were dropped. The put-timeout reaper runs it.
    pub fn run_route_gc_once(&self) -> usize {
        self.routes.collect_stale(&self.index)
    }
}

#[cfg(test)]
mod lock_isolation_tests {
    //! Invariant 10's last clause: one shard or stripe lock must not block unrelated shards.
    #![allow(clippy::unwrap_used)]
    use std::sync::mpsc;
    use std::time::Duration;

    use mooncake_common::{ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment};

    use super::*;
    use crate::index::{shard_of, stripe_of};
    use mooncake_common::{ClientId, SegmentId};

    fn master() -> MasterService {
        let m = MasterService::new(Default::default(), Arc::new(ManualClock::new(1_000))).unwrap();
        let seg = Segment {
            id: SegmentId::new(1, 1),
            name: "a".into(),
            base: 1 << 30,
            size: 1 << 20,
            te_endpoint: "a".into(),
            protocol: "tcp".into(),
            host_id: String::new(),
        };
        m.mount_segment(&seg, ClientId::new(1, 1)).unwrap();
        m
    }

    /// Two keys whose shards and stripes differ.
    fn unrelated_keys() -> (String, String) {
        let a = "key-0".to_string();
        let ha = key_hash(Tenant::Default, &a);
        let b = (1..)
            .map(|i| format!("key-{i}"))
            .find(|k| {
                let h = key_hash(Tenant::Default, k);
                shard_of(h) != shard_of(ha) && stripe_of(h) != stripe_of(ha)
            })
            .unwrap();
        (a, b)
    }

    #[test]
    fn inv10_a_held_shard_lock_blocks_only_its_own_shard() {
        let m = master();
        let client = ClientId::new(1, 1);
        let (a, b) = unrelated_keys();
        for k in [&a, &b] {
            m.put_start(client, k, 10, &ReplicateConfig::default(), "")
                .unwrap();
            m.put_end(client, &ObjectMeta::new(k.as_str()), ReplicaType::ALL, "")
                .unwrap();
        }
        let guard = m.index.shard(key_hash(Tenant::Default, &a)).write();
        let (m, a, b) = (&m, &a, &b);
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let tx2 = tx.clone();
            s.spawn(move || {
                tx.send(("other", m.get_replica_list(b, "").is_ok()))
                    .unwrap()
            });
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)).unwrap(),
                ("other", true)
            );
            // The same shard really is blocked (so the check above is not vacuous)...
            s.spawn(move || tx2.send(("same", m.exist_key(a, "").unwrap())).unwrap());
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            // ...until the lock is released.
            drop(guard);
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)).unwrap(),
                ("same", true)
            );
        });
    }

    #[test]
    fn inv10_a_held_stripe_blocks_only_its_own_puts() {
        let m = master();
        let client = ClientId::new(1, 1);
        let (a, b) = unrelated_keys();
        let cfg = ReplicateConfig::default();
        let guard = m.index.stripe(key_hash(Tenant::Default, &a)).lock();
        let (m, a, b, cfg) = (&m, &a, &b, &cfg);
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let tx2 = tx.clone();
            s.spawn(move || {
                tx.send(("other", m.put_start(client, b, 10, cfg, "").is_ok()))
                    .unwrap()
            });
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)).unwrap(),
                ("other", true)
            );
            s.spawn(move || {
                tx2.send(("same", m.put_start(client, a, 10, cfg, "").is_ok()))
                    .unwrap()
            });
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            drop(guard);
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(10)).unwrap(),
                ("same", true)
            );
        });
    }
}
