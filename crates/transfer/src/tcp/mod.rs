//! TCP transport: a server per engine and a pool of pipelined connections per peer.

pub(crate) mod client;
pub(crate) mod io;
pub mod server;
