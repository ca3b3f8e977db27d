//! Engine configuration, with documented defaults and `validate()`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::TransferError;
use crate::wire::MAX_PAYLOAD_BYTES;

/// Which transport reaches a same-host peer. A segment of this very process always uses memcpy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TransportMode {
    /// Shared memory when the peer is on this host and the handshake works, TCP otherwise.
    #[default]
    Auto,
    /// Always TCP.
    Tcp,
    /// Shared memory only: entries to other hosts, or whose handshake fails, fail.
    Shm,
}

impl FromStr for TransportMode {
    type Err = TransferError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportMode::Auto),
            "tcp" => Ok(TransportMode::Tcp),
            "shm" => Ok(TransportMode::Shm),
            other => Err(TransferError::InvalidParams(format!(
                "transport {other:?}: expected auto, tcp or shm"
            ))),
        }
    }
}

/// Limits that bound configuration values.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
pub const MAX_PIPELINE_DEPTH: usize = 1024;
pub const MAX_COPY_THREADS: usize = 64;

/// Configuration of a [`crate::TransferEngine`].
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// Address of the TCP data server; port 0 picks a free port. Default `127.0.0.1:0`.
    pub tcp_bind_addr: SocketAddr,
    /// Host put in the endpoint string. Default: the bound IP, or the host name when bound to
    /// an unspecified address.
    pub advertise_host: Option<String>,
    /// Default [`TransportMode::Auto`].
    pub transport: TransportMode,
    /// Start the Unix-socket server that lets same-host peers map shareable segments. Default on.
    pub enable_shm_server: bool,
    /// Directory of the shm socket (a per-engine subdirectory is created in it). Default
    /// `$TMPDIR/mooncake-transfer`.
    pub shm_socket_dir: PathBuf,
    /// Mode of the shm socket file: who may connect, hence map shareable segments. Default 0600.
    pub shm_socket_mode: u32,
    /// Host identity for same-host detection. Default: `MOONCAKE_HOST_ID`, boot id, host name.
    pub host_id: Option<String>,
    /// Long-lived TCP connections per peer (chunks of large entries spread over them). Default:
    /// the number of cores, at most 4. Each connection has a sending and a receiving thread
    /// here and a serving thread on the peer, so more connections than cores only add context
    /// switches: on 2 cores, 1 MiB cross-process gets ran at 2,500-2,800/s with 1 or 2
    /// connections and 1,900/s with 4.
    pub connections_per_peer: usize,
    /// Requests in flight per connection (pipelining). Default 16.
    pub pipeline_depth: usize,
    /// Largest chunk of one request. Default 4 MiB; at most 64 MiB (the wire limit).
    pub max_chunk_bytes: usize,
    /// Entries smaller than twice this are not split. Default 256 KiB.
    pub min_chunk_bytes: usize,
    /// Per-entry deadline, from submission. Default 30 s.
    pub entry_timeout_ms: u64,
    /// TCP connect timeout. Default 3 s.
    pub connect_timeout_ms: u64,
    /// Serving side: how long one request may take to arrive/leave once started. Default 30 s.
    pub server_io_timeout_ms: u64,
    /// Serving side: concurrent connections accepted. Default 1024.
    pub max_server_connections: usize,
    /// Threads doing memcpy for local and shared-memory entries. Default 2.
    pub copy_threads: usize,
    /// Local and shared-memory entries are copied by the submitting thread itself (no hand-off
    /// to a copy thread: a 1 MiB memcpy costs less than two thread wake-ups) while the entries
    /// of one `submit` add up to at most this many bytes; the rest go to the copy threads,
    /// split over them when large. Default 1 MiB; 0 disables.
    pub inline_copy_max_bytes: usize,
    /// Local and shared-memory entries of at least this many bytes are split into
    /// `copy_threads` pieces (each `min_chunk_bytes..=max_chunk_bytes`) copied at once: the
    /// copy threads take all but one, the submitting thread copies the first itself when it fits
    /// the inline budget. Default 512 KiB (two cores copy a 1 MiB value 24-76% faster than
    /// one here, hand-off included; at 128-256 KiB no gain showed above the noise).
    pub parallel_copy_min_bytes: usize,
    /// Local and shared-memory writes (into a segment) of at least this many bytes per chunk use
    /// streaming (non-temporal) stores, which skip reading the destination into the cache first:
    /// `put_from` 256 KiB +33%, 1 MiB +17-18%, `batch_put_from` 32 × 64 KiB +33-41% here. Reads always use
    /// plain stores (the caller uses the bytes next). Default 64 KiB; `usize::MAX` disables.
    pub streaming_write_min_bytes: usize,
    /// How long `unregister` waits for in-flight transfers. Default 10 s.
    pub unregister_timeout_ms: u64,
    /// A pooled connection with nothing to do closes after this long. Default 60 s.
    pub idle_connection_ms: u64,
    /// Entries in one batch. Default 65 536.
    pub max_batch_entries: usize,

    // Limits of the TCP data server against idle and hostile peers (docs/security.md).
    /// Serving side: connections accepted from one IP address. Default 256 (a requester opens
    /// at most `connections_per_peer` ≤ 64 per engine). Over it, or over
    /// `max_server_connections`, a new connection closes an idle one that never sent a valid
    /// request, and is refused only when there is none.
    pub max_server_connections_per_peer: usize,
    /// Serving side: a connection with no request in progress for this long is closed. Default
    /// 120 s, above `idle_connection_ms` (60 s) so that a healthy requester closes its idle
    /// connections first. Idle connections hold no thread.
    pub server_idle_timeout_ms: u64,
    /// The cluster's shared token (docs/security.md). When set, this engine's segments are
    /// served only to requesters that present the segment's capability (derived from the
    /// token, see `auth.rs`): on TCP a grant per connection and segment, over shared memory in
    /// the handshake. [`crate::TransferEngine::segment_endpoint`] then carries the capability
    /// for the master to hand out. Default `None`: every registered segment is served to
    /// whoever reaches the data port (and, for shm, the socket).
    pub auth_token: Option<mooncake_common::AuthToken>,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            tcp_bind_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_host: None,
            transport: TransportMode::Auto,
            enable_shm_server: true,
            shm_socket_dir: std::env::temp_dir().join("mooncake-transfer"),
            shm_socket_mode: 0o600,
            host_id: None,
            connections_per_peer: std::thread::available_parallelism()
                .map_or(4, |cores| cores.get().clamp(1, 4)),
            pipeline_depth: 16,
            max_chunk_bytes: 4 << 20,
            min_chunk_bytes: 256 << 10,
            entry_timeout_ms: 30_000,
            connect_timeout_ms: 3_000,
            server_io_timeout_ms: 30_000,
            max_server_connections: 1024,
            copy_threads: 2,
            inline_copy_max_bytes: 1 << 20,
            parallel_copy_min_bytes: 512 << 10,
            streaming_write_min_bytes: 64 << 10,
            unregister_timeout_ms: 10_000,
            idle_connection_ms: 60_000,
            max_batch_entries: 65_536,
            max_server_connections_per_peer: 256,
            server_idle_timeout_ms: 120_000,
            auth_token: None,
        }
    }
}

impl TransferConfig {
    /// Checks every field; the message names the field and its allowed range.
    pub fn validate(&self) -> Result<(), TransferError> {
        let bad = |msg: String| Err(TransferError::InvalidParams(msg));
        if !(1..=MAX_CONNECTIONS_PER_PEER).contains(&self.connections_per_peer) {
            return bad(format!(
                "connections_per_peer {} not in 1..={MAX_CONNECTIONS_PER_PEER}",
                self.connections_per_peer
            ));
        }
        if !(1..=MAX_PIPELINE_DEPTH).contains(&self.pipeline_depth) {
            return bad(format!(
                "pipeline_depth {} not in 1..={MAX_PIPELINE_DEPTH}",
                self.pipeline_depth
            ));
        }
        if self.max_chunk_bytes == 0 || self.max_chunk_bytes as u64 > MAX_PAYLOAD_BYTES {
            return bad(format!(
                "max_chunk_bytes {} not in 1..={MAX_PAYLOAD_BYTES}",
                self.max_chunk_bytes
            ));
        }
        if self.min_chunk_bytes == 0 || self.min_chunk_bytes > self.max_chunk_bytes {
            return bad(format!(
                "min_chunk_bytes {} not in 1..=max_chunk_bytes",
                self.min_chunk_bytes
            ));
        }
        if !(1..=MAX_COPY_THREADS).contains(&self.copy_threads) {
            return bad(format!(
                "copy_threads {} not in 1..={MAX_COPY_THREADS}",
                self.copy_threads
            ));
        }
        for (name, value) in [
            ("entry_timeout_ms", self.entry_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("server_io_timeout_ms", self.server_io_timeout_ms),
            ("idle_connection_ms", self.idle_connection_ms),
            ("server_idle_timeout_ms", self.server_idle_timeout_ms),
        ] {
            if value == 0 || value > 24 * 3600 * 1000 {
                return bad(format!("{name} {value} not in 1..=86400000"));
            }
        }
        if self.max_server_connections == 0 || self.max_batch_entries == 0 {
            return bad("max_server_connections and max_batch_entries must be > 0".into());
        }
        if self.max_server_connections_per_peer == 0 {
            return bad("max_server_connections_per_peer must be > 0".into());
        }
        if self.shm_socket_mode & !0o777 != 0 {
            return bad(format!(
                "shm_socket_mode {:o} has bits beyond 0777",
                self.shm_socket_mode
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        assert!(TransferConfig::default().validate().is_ok());
        let config = TransferConfig {
            connections_per_peer: 0,
            ..TransferConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("connections_per_peer"), "{err}");
        let config = TransferConfig {
            max_chunk_bytes: 128 << 20,
            ..TransferConfig::default()
        };
        assert!(config.validate().is_err());
        assert_eq!(
            "SHM".parse::<TransportMode>().ok(),
            Some(TransportMode::Shm)
        );
        assert!("rdma".parse::<TransportMode>().is_err());
    }
}
