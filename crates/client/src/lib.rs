//! Clients of a mooncake-rs cluster.
//!
//! - [`MasterClient`] (`master_client.rs`): the typed RPC client of the master; every request is
//!   built there, the two-phase writes once per [`WriteMode`].
//! - [`StoreClient`] (`store/`): puts and gets through the transfer engine, on top of it; see the
//!   `store` module for its files by concern (write and read legs, buffers, endpoints,
//!   heartbeat).
//! - [`BlockingStoreClient`] (`blocking.rs`): the same for code without an async runtime.
//! - [`standalone`]: the real client process (`mooncake_client`) that dummy clients attach to.
//!
//! Owns: request construction, error typing, connection reuse. Must never: interpret replica
//! bytes it did not verify, or retry an operation that is not idempotent without saying so.

pub mod auth;
pub mod blocking;
pub mod leader;
pub mod master_client;
pub mod standalone;
pub mod store;

pub use blocking::BlockingStoreClient;
pub use master_client::{MasterClient, MasterError, WriteMode};
/// The `StoreConfig::transport` choice, so users of the config need not name the transfer crate.
pub use mooncake_storage::BackendKind;
/// Page-aligned shared memory (a memfd mapping) the binding hands out as host memory.
pub use mooncake_transfer::memory::Mapping as HostMemory;
pub use mooncake_transfer::TransportMode;
pub use store::{
    Access, DiskConfig, DiskStats, DiskTier, DrainReport, PutOutcome, RangeRead, RangeWrite,
    StoreClient, StoreConfig, StoreError, VerifyReport, NODE_TASK_POLL,
};
