//! The Mooncake Store master as a pure, synchronous, thread-safe state machine.
//!
//! It owns the metadata of every object (a 1024-shard index of tenant → key → object), the
//! mounted segments with one exact allocator each, replica placement, the put/get/remove/upsert
//! lifecycle with its leases, soft and hard pins and put timeouts, client liveness, eviction by
//! last access, group routing, tenant quotas, copy/move and the client task queue. Every deadline reads an
//! injected [`mooncake_common::Clock`]; background work is exposed as `run_*_once` methods that a
//! server loop (or a test) calls.
//!
//! It must never open sockets, spawn threads or sleep, and it never sees object bytes; its only
//! I/O is reading and writing the tenant policy file when the caller asks for it
//! (`load_tenant_policy_file`, and the quota admin methods once a file was loaded).
//! Map of the crate: `allocator` (per-segment buffers), `strategy` (placement), `segments`
//! (mount/unmount), `index` (shards, stripes, routing), `object` (metadata), `put`, `upsert`,
//! `read`, `remove`, `replication`, `tasks` (the RPCs), `clients` (ping and the monitor),
//! `eviction`, `quota` (tenants), `service` (the handle, segment RPCs, background steps, checks).
//! See docs/master.md.

pub mod allocator;
mod clients;
pub mod config;
mod eviction;
mod index;
mod object;
mod put;
pub mod quota;
mod read;
mod remove;
mod replication;
mod segments;
mod service;
mod stats;
pub mod strategy;
pub mod tasks;
mod upsert;

pub use clients::PING_QUEUE_CAPACITY;
pub use config::{ConfigError, MasterServiceConfig};
pub use eviction::EvictionReport;
pub use index::{SHARD_COUNT, STRIPE_COUNT};
pub use object::ObjectInfo;
pub use quota::{effective_quotas, PolicyError, TenantPolicy, TenantQuotaSnapshot};
pub use segments::SegmentUsage;
pub use service::{
    AccountingReport, MasterService, PutTimeoutReport, MAX_KEY_LEN_BYTES, MAX_REGEX_LEN_BYTES,
};
pub use stats::{MasterCounters, ObjectCensus};
pub use strategy::AllocationStrategy;
pub use tasks::TaskLimits;
