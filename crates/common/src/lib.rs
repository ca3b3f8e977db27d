//! Types shared by every mooncake-rs crate: upstream's error codes, size units, and (added by the
//! master work) ids, tenants, replicate configs, replica descriptors and clocks.
//!
//! This crate owns vocabulary only. It must never do I/O, spawn threads or depend on another
//! mooncake crate.
#![forbid(unsafe_code)]

pub mod error;
pub mod units;

pub use error::ErrorCode;
pub use units::{format_size, parse_size, SizeParseError};
