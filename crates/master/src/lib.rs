//! The Mooncake Store master as a pure, synchronous, thread-safe state machine.
//!
//! **Owns**: the metadata of every object (a 1024-shard index of tenant → key → object), the
//! mounted segments with one exact allocator each, replica placement, the put/get/remove/upsert
//! lifecycle with its leases, soft and hard pins and put timeouts, client liveness, eviction by
//! last access, group routing, tenant quotas, copy/move and the client task queue, and the one
//! seam through which every change of durable state is observed ([`mutation`]) and replayed
//! ([`MasterService::apply`]). Every deadline reads an injected [`mooncake_common::Clock`], every
//! random choice an injected seed ([`MasterService::with_seed`]); background work is exposed as
//! `run_*_once` methods that a server loop (or a test) calls.
//!
//! **Must never**: open sockets or files, spawn threads or sleep, or see object bytes. Reading
//! and writing the tenant policy file is the server's job; the master parses and prints the YAML
//! ([`TenantPolicy::parse_yaml`], [`TenantPolicy::to_yaml`]) and applies parsed policies.
//!
//! **Map.** Components (plain data, never naming [`MasterService`]): `config`, `rng`,
//! `allocator` (per-segment buffers), `strategy` (placement), `segments` (mounted segments),
//! `index` (shards, stripes, hashing), `routes` (group routing), `object` (metadata), `quota`
//! (accounts, policy), `tasks` (client task queue), `clients` (ping queue, deadlines), `deferred`
//! (discarded list, soft-pin heap), `mutation` (records, the observer trait), `unverified`
//! (restored replicas awaiting their node's check). The handle: `handle`
//! ([`MasterService`], construction, tenant resolution, routing). The seam: `seam` (emission and
//! the shared write-path helpers) and `apply` (apply, export). RPC families and background steps,
//! each an `impl MasterService` over the components: `put` (PutStart phases), `put_end`,
//! `put_timeouts` (discarded list, reaper), `upsert`, `read`, `remove`, `replication`
//! (copy/move), `tasks_rpc`, `drain` (a segment's objects planned as move tasks), `drain_jobs`, `segment_rpc`, `suspicion` (segments out of placement after a
//! reported transfer failure), `liveness` (ping, client monitor), `restore`
//! (bulk restore from a snapshot's state, verification, restore deadlines), `eviction`,
//! `pins` (soft-pin expiry), `tenants` (quota admin), `audit` (checks), `hot_keys` (read heat
//! and extra replicas of hot keys). Dependencies go RPC
//! family → handle → components. See docs/master.md.

pub mod allocator;
mod apply;
mod audit;
pub mod bench_support;
mod clients;
pub mod config;
mod counters;
mod deferred;
pub mod drain;
pub mod drain_jobs;
mod eviction;
mod export;
mod handle;
mod hot_keys;
mod index;
mod liveness;
pub mod mutation;
mod object;
mod offload;
mod pins;
mod promotion;
mod put;
mod put_end;
mod put_timeouts;
pub mod quota;
mod read;
mod read_pins;
mod remove;
mod replication;
mod restore;
pub mod rng;
mod routes;
mod seam;
mod segment_rpc;
mod segments;
mod stats;
pub mod strategy;
mod suspicion;
pub mod tasks;
mod tasks_rpc;
mod tenants;
mod unverified;
mod upsert;
mod writers;

pub use apply::ApplyError;
pub use audit::AccountingReport;
pub use clients::PING_QUEUE_CAPACITY;
pub use config::{ConfigError, MasterServiceConfig, DEFAULT_PUT_START_EVICT_BUDGET};
pub use counters::MasterCounters;
pub use drain::DrainPlan;
pub use eviction::EvictionReport;
pub use export::{ObjectView, PlaceView, ReplicaView, TaskView};
pub use handle::{MasterService, ObserverAlreadySet, MAX_KEY_LEN_BYTES, MAX_REGEX_LEN_BYTES};
pub use hot_keys::{DynamicReplicationMode, HotKeyStats};
pub use index::{SHARD_COUNT, STRIPE_COUNT};
pub use mutation::{MasterState, Mutation, MutationObserver, ObjectRecord};
pub use object::ObjectInfo;
pub use offload::{LocalDiskUsage, OffloadStats};
pub use put_timeouts::PutTimeoutReport;
pub use quota::{effective_quotas, PolicyError, TenantPolicy, TenantQuotaSnapshot};
pub use restore::{
    ConfirmOutcome, RestoreDeadlineReport, RestoreDrops, RestoreError, RestoreOptions,
    RestoreReport, UnverifiedReplica, DEFAULT_VERIFY_TIMEOUT_MS, MAX_CONFIRM_IDS,
    MAX_UNVERIFIED_PAGE, MAX_UNVERIFIED_PAGE_BYTES,
};
pub use segments::SegmentUsage;
pub use stats::ObjectCensus;
pub use strategy::AllocationStrategy;
pub use tasks::TaskLimits;
pub use unverified::VerificationStats;
