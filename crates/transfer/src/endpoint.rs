//! The transfer endpoint string: how a peer reaches a process's segments. The master carries it
//! inside replica descriptors.
//!
//! ```text
//! tcp://HOST:PORT?inst=HEX16[&host=HOST_ID][&shm=SOCKET_PATH][&cap=HEX64]
//! tcp://127.0.0.1:41233?inst=9f3a0c55e2b14d07&host=2b6f1c1e-8f0e-4c2a-9d55-0a1b2c3d4e5f&shm=/tmp/mooncake-transfer-0/9f3a0c55e2b14d07.sock
//! ```
//!
//! `HOST` is an IPv4 address, a bracketed IPv6 address or a host name. `inst` is a random
//! 64-bit id chosen when the engine starts (it tells a process's own segments apart from a
//! restarted process on the same port). `host` is the host identity (`MOONCAKE_HOST_ID`, else
//! the kernel boot id, else the host name): a peer with the same value may try the shared-memory
//! transport through the Unix socket at `shm`. `cap` is the capability of one segment of an
//! engine started with the cluster's token (`auth.rs`): the endpoint a segment is mounted with
//! carries it, and a requester presents it to the owner. `Display` leaves it out, so error
//! messages and logs never carry it; [`Endpoint::to_string_with_capability`] keeps it. Values
//! are percent-encoded; unknown keys are ignored so that later versions can add fields.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use crate::auth::Capability;
use crate::error::TransferError;

/// Longest endpoint string accepted.
pub const MAX_ENDPOINT_BYTES: usize = 4096;

/// A parsed endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
    instance_id: u64,
    host_id: Option<String>,
    shm_path: Option<PathBuf>,
    capability: Option<Capability>,
}

impl Endpoint {
    /// Builds an endpoint; `host` must not contain `/`, `?`, `&` or whitespace.
    pub fn new(
        host: impl Into<String>,
        port: u16,
        instance_id: u64,
        host_id: Option<String>,
        shm_path: Option<PathBuf>,
    ) -> Result<Endpoint, TransferError> {
        let host = host.into();
        validate_host(&host)?;
        Ok(Endpoint {
            host,
            port,
            instance_id,
            host_id: host_id.filter(|h| !h.is_empty()),
            shm_path,
            capability: None,
        })
    }

    /// The same endpoint carrying `capability` (the endpoint of one segment).
    pub fn with_capability(mut self, capability: Option<Capability>) -> Endpoint {
        self.capability = capability;
        self
    }

    /// Parses the string form (see the module docs).
    pub fn parse(text: &str) -> Result<Endpoint, TransferError> {
        let bad = |why: &str| TransferError::InvalidParams(format!("endpoint {text:?}: {why}"));
        if text.len() > MAX_ENDPOINT_BYTES {
            return Err(bad("too long"));
        }
        let rest = text
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("must start with tcp://"))?;
        let (authority, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (addr, port) = v6.split_once("]:").ok_or_else(|| bad("bad [ipv6]:port"))?;
            (format!("[{addr}]"), port)
        } else {
            let (host, port) = authority
                .rsplit_once(':')
                .ok_or_else(|| bad("missing :port"))?;
            (host.to_string(), port)
        };
        let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
        validate_host(&host).map_err(|_| bad("bad host"))?;
        let mut instance_id = None;
        let mut host_id = None;
        let mut shm_path = None;
        let mut capability = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("query item without ="))?;
            let value = percent_decode(value).ok_or_else(|| bad("bad percent-encoding"))?;
            match key {
                "inst" => {
                    if value.len() != 16 {
                        return Err(bad("inst must be 16 hex digits"));
                    }
                    instance_id =
                        Some(u64::from_str_radix(&value, 16).map_err(|_| bad("inst is not hex"))?);
                }
                "host" => host_id = Some(value).filter(|v| !v.is_empty()),
                "shm" => shm_path = Some(PathBuf::from(value)).filter(|p| p.is_absolute()),
                "cap" => {
                    capability = Some(
                        Capability::from_hex(&value)
                            .ok_or_else(|| bad("cap must be 64 hex digits"))?,
                    )
                }
                _ => {}
            }
        }
        Ok(Endpoint {
            host,
            port,
            instance_id: instance_id.ok_or_else(|| bad("missing inst"))?,
            host_id,
            shm_path,
            capability,
        })
    }

    /// The string form including the capability (`&cap=HEX64` last), when there is one: what
    /// a segment is mounted with.
    pub fn to_string_with_capability(&self) -> String {
        match &self.capability {
            Some(capability) => format!("{self}&cap={}", capability.to_hex()),
            None => self.to_string(),
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }
    pub fn host_id(&self) -> Option<&str> {
        self.host_id.as_deref()
    }
    pub fn shm_path(&self) -> Option<&Path> {
        self.shm_path.as_deref()
    }
    /// The capability of the segment this endpoint was mounted with, if its owner requires one.
    pub fn capability(&self) -> Option<&Capability> {
        self.capability.as_ref()
    }

    /// `host:port`, resolvable by `ToSocketAddrs`.
    pub fn tcp_authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Resolves the TCP address (DNS for host names).
    pub fn resolve(&self) -> Result<Vec<SocketAddr>, TransferError> {
        let unreachable = |reason: String| TransferError::PeerUnreachable {
            endpoint: self.to_string(),
            reason,
        };
        let addrs: Vec<SocketAddr> = self
            .tcp_authority()
            .to_socket_addrs()
            .map_err(|e| unreachable(e.to_string()))?
            .collect();
        if addrs.is_empty() {
            return Err(unreachable("host resolves to no address".into()));
        }
        Ok(addrs)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tcp://{}:{}?inst={:016x}",
            self.host, self.port, self.instance_id
        )?;
        if let Some(host_id) = &self.host_id {
            write!(f, "&host={}", percent_encode(host_id))?;
        }
        if let Some(path) = &self.shm_path {
            write!(f, "&shm={}", percent_encode(&path.to_string_lossy()))?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Endpoint {
    type Err = TransferError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoint::parse(s)
    }
}

fn validate_host(host: &str) -> Result<(), TransferError> {
    let ok = !host.is_empty()
        && host.len() <= 255
        && !host
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b"/?&#%@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(TransferError::InvalidParams(format!("bad host {host:?}")))
    }
}

fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/:".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// This machine's identity for same-host detection: `MOONCAKE_HOST_ID` if set, else the kernel
/// boot id, else the host name.
pub fn local_host_id() -> String {
    if let Ok(id) = std::env::var("MOONCAKE_HOST_ID") {
        if !id.trim().is_empty() {
            return id.trim().to_string();
        }
    }
    if let Ok(id) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        if !id.trim().is_empty() {
            return id.trim().to_string();
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let text = "tcp://127.0.0.1:41233?inst=9f3a0c55e2b14d07&host=2b6f1c1e-8f0e-4c2a-9d55-0a1b2c3d4e5f&shm=/tmp/mooncake-transfer-0/9f3a0c55e2b14d07.sock";
        let ep = Endpoint::parse(text).unwrap();
        assert_eq!(ep.host(), "127.0.0.1");
        assert_eq!(ep.port(), 41233);
        assert_eq!(ep.instance_id(), 0x9f3a_0c55_e2b1_4d07);
        assert_eq!(ep.host_id(), Some("2b6f1c1e-8f0e-4c2a-9d55-0a1b2c3d4e5f"));
        assert_eq!(
            ep.shm_path(),
            Some(Path::new("/tmp/mooncake-transfer-0/9f3a0c55e2b14d07.sock"))
        );
        assert_eq!(ep.to_string(), text);
    }

    #[test]
    fn round_trips_odd_values_and_ipv6() {
        let ep = Endpoint::new(
            "[::1]",
            7,
            1,
            Some("pod a&b=c".into()),
            Some("/run/x y%z.sock".into()),
        )
        .unwrap();
        let text = ep.to_string();
        assert_eq!(Endpoint::parse(&text).unwrap(), ep, "{text}");
        assert_eq!(ep.tcp_authority(), "[::1]:7");
    }

    #[test]
    fn rejects_malformed_strings() {
        for bad in [
            "",
            "udp://1.2.3.4:5?inst=0000000000000001",
            "tcp://1.2.3.4?inst=0000000000000001",
            "tcp://1.2.3.4:99999?inst=0000000000000001",
            "tcp://1.2.3.4:5",
            "tcp://1.2.3.4:5?inst=xyz",
            "tcp://1.2.3.4:5?inst=0000000000000001&host=%zz",
            "tcp://:5?inst=0000000000000001",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let long = format!("tcp://a:1?inst=0000000000000001&x={}", "a".repeat(5000));
        assert!(Endpoint::parse(&long).is_err());
    }

    #[test]
    fn a_capability_travels_in_the_string_but_not_in_display() {
        let cap = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let text = format!("tcp://127.0.0.1:1?inst=0000000000000002&host=h&cap={cap}");
        let ep = Endpoint::parse(&text).unwrap();
        assert_eq!(ep.capability().map(|c| c.to_hex()), Some(cap.to_string()));
        assert_eq!(ep.to_string_with_capability(), text);
        assert!(!ep.to_string().contains("cap="), "{ep}");
        assert_eq!(
            Endpoint::parse(&ep.to_string_with_capability()).unwrap(),
            ep
        );
        for bad in ["00", "zz", &cap[1..]] {
            let text = format!("tcp://127.0.0.1:1?inst=0000000000000002&cap={bad}");
            assert!(Endpoint::parse(&text).is_err(), "{text}");
        }
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let ep = Endpoint::parse("tcp://h:1?inst=0000000000000002&future=1").unwrap();
        assert_eq!(ep.instance_id(), 2);
        assert_eq!(ep.host_id(), None);
    }
}
