//! The RPC runtime under the master's protocol: a tokio server that reads frames, hands each
//! request to a synchronous [`Handler`] and writes the answers back (pipelined: many requests in
//! flight per connection, answers batched into few writes), and a client connection that
//! multiplexes concurrent calls by request id, with per-call timeouts and reconnection.
//!
//! Owns: sockets, connection limits (total, per address, eviction of unidentified connections),
//! timeouts (handshake, frame, idle), the budget of buffered request bytes, authentication
//! (`Authenticate`, the one request body it reads, and the client's handshake on every new
//! connection), shutdown, busy-polling. Must never: interpret other request bodies (that is the
//! handler's job), serve a request of a connection that has not authenticated when a token is
//! configured, panic on what a peer sends, or buffer more than its budget because peers asked
//! it to.

mod admission;
mod budget;
pub mod client;
pub mod poll;
pub mod server;

pub use budget::{MAPPED_FRAME_BYTES, SMALL_FRAME_BYTES};
pub use client::{ClientConfig, PollStats, RpcClient, RpcError};
pub use poll::{HostLoad, PollPolicy};
pub use server::{Deferred, Handler, HandlerError, RpcServer, ServerConfig, ServerStats};

use std::time::Duration;

/// Spins for up to `budget` calling `attempt` until it yields a value; `None` when the budget ran
/// out or when spinning would not pay now ([`poll::PollPolicy::Adaptive`]: the host has no core
/// to spare, or spinning went badly on this thread lately). Each failed attempt yields to the
/// runtime, so other tasks of the same thread keep running while we poll. The server's opt-in
/// low-latency mode polls with this.
pub(crate) async fn spin_for<T>(budget: Duration, attempt: impl FnMut() -> Option<T>) -> Option<T> {
    poll::spin_governed(poll::PollPolicy::Adaptive, budget, attempt).await
}
