//! The SSD tier of a store node: backends that keep objects on local disk and survive crashes.
//!
//! Owns: on-disk layouts (file-per-key, bucket, offset-allocator log), their indexes, eviction
//! under watermarks, crash recovery. Must never: return bytes whose checksum or key does not match,
//! panic on anything read from disk, or talk to the network.

pub mod backend;
pub mod log;

pub use backend::{
    BackendConfig, Durability, EvictionConfig, EvictionListener, EvictionPolicy, Limits,
    ObjectInfo, StorageBackend, StorageError, Usage,
};
