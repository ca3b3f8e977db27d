//! Clients of a mooncake-rs cluster. Today: [`MasterClient`], the typed RPC client of the master.
//! The store client (put/get through the transfer engine) builds on it.
//!
//! Owns: request construction, error typing, connection reuse. Must never: interpret replica
//! bytes it did not verify, or retry an operation that is not idempotent without saying so.

pub mod blocking;
pub mod master_client;
pub mod store;

pub use blocking::BlockingStoreClient;
pub use master_client::{MasterClient, MasterError};
pub use store::{PutOutcome, StoreClient, StoreConfig, StoreError};
