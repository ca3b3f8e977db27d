//! The data plane of mooncake-rs: moves bytes between registered memory regions of processes,
//! in batches of `{read|write, local range, remote endpoint, segment id, offset}`, over local
//! memcpy (a segment of this process), shared memory (a same-host peer: memfd passed over a
//! Unix socket) or TCP (a pool of long-lived, pipelined connections per peer).
//!
//! It owns the registry of registered memory, the TCP and shared-memory servers that expose
//! segments, the peer pools and the wire format of `docs/transfer.md`. It must never touch a
//! byte outside a registered range (the side that owns the memory checks every remote range),
//! never free memory a transfer still uses, never block forever (every entry has a deadline) and
//! never panic on anything a peer sends. It knows nothing about objects, keys or the master.

pub mod auth;
pub mod batch;
pub mod config;
mod copy;
pub mod crc;
pub mod endpoint;
pub mod engine;
pub mod error;
pub mod memory;
mod owner;
pub mod registry;
mod shm;
mod tcp;
pub mod wire;

pub use auth::{derive_capability, Capability, CAPABILITY_BYTES};
pub use batch::{Batch, EntryStatus, Op, TransferRequest};
pub use config::{TransferConfig, TransportMode};
pub use crc::{crc32c, crc32c_combine};
pub use endpoint::{local_host_id, Endpoint};
pub use engine::{MemoryHandle, SegmentOptions, TransferEngine};
pub use error::TransferError;
pub use registry::RegionKind;
pub use tcp::server::ServerStats;
