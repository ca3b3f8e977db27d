//! Process wiring of the master: configuration, the RPC dispatcher over the master core
//! (`rpc_dispatch`), the HTTP admin and metrics endpoints, and the background workers.
//!
//! Owns: sockets, timers, threads and configuration of the master process. Must never: hold
//! metadata of its own (the `mooncake-master` state machine is the single source of truth) or hold
//! a lock across an `.await`.

pub mod config;
mod drain_http;
mod flags;
pub mod ha;
pub mod http;
pub mod metrics;
pub mod oplog;
#[cfg(test)]
mod oplog_acks_tests;
pub mod process;
pub mod rpc_dispatch;
pub mod snapshot;
pub mod tenant_policy;

pub use config::{ConfigError, MasterConfig, ResolvedConfig, SnapshotSettings};
pub use process::{run_until_signal, RunningMaster, StartError};
