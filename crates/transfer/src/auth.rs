//! Data-port capabilities: what an engine started with the cluster's token asks of a requester
//! before it serves any byte of one of its segments (docs/security.md, docs/transfer.md).
//!
//! The capability of a segment is
//!
//! ```text
//! HMAC-SHA256(key = token, "mooncake-rs data-port capability v1\0" || inst (u64 LE) || segment id (u64 LE))
//! ```
//!
//! `inst` is the engine's random 64-bit instance id (new at every start) and segment ids are
//! never reused by an engine, so the pair names one registration: a capability dies with the
//! process, and one segment's capability opens no other segment. The owning engine puts it in
//! the endpoint string it mounts the segment with ([`crate::TransferEngine::segment_endpoint`],
//! `&cap=HEX`); the master hands that string only to clients that authenticated with the same
//! token (inside replica descriptors), and the owner checks it, in constant time, on the TCP
//! grant and in the shared-memory handshake. A requester without it gets `ILLEGAL_CLIENT` and
//! the segment's memory is not touched.

use std::fmt;

use hmac::{Hmac, Mac};
use mooncake_common::AuthToken;
use sha2::Sha256;

/// Bytes of a capability (the whole HMAC-SHA256 output).
pub const CAPABILITY_BYTES: usize = 32;

/// Domain separation: this HMAC is used for nothing else.
const LABEL: &[u8] = b"mooncake-rs data-port capability v1\0";

/// The right to read and write one segment of one engine.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capability([u8; CAPABILITY_BYTES]);

impl Capability {
    pub fn from_bytes(bytes: [u8; CAPABILITY_BYTES]) -> Capability {
        Capability(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; CAPABILITY_BYTES] {
        &self.0
    }

    /// 64 lowercase hex digits (the endpoint's `cap` value).
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(2 * CAPABILITY_BYTES);
        for byte in self.0 {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    /// Parses 64 hex digits (either case); `None` for anything else.
    pub fn from_hex(text: &str) -> Option<Capability> {
        let digits = text.as_bytes();
        if digits.len() != 2 * CAPABILITY_BYTES {
            return None;
        }
        let mut bytes = [0u8; CAPABILITY_BYTES];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let pair = std::str::from_utf8(pair).ok()?;
            bytes[i] = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Capability(bytes))
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Capability(<redacted>)")
    }
}

fn keyed(token: &AuthToken, instance_id: u64, segment_id: u64) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token.expose())
        .expect("HMAC accepts a key of any length");
    mac.update(LABEL);
    mac.update(&instance_id.to_le_bytes());
    mac.update(&segment_id.to_le_bytes());
    mac
}

/// The capability of segment `segment_id` of the engine `instance_id` under `token`.
pub fn derive_capability(token: &AuthToken, instance_id: u64, segment_id: u64) -> Capability {
    let mut bytes = [0u8; CAPABILITY_BYTES];
    bytes.copy_from_slice(
        &keyed(token, instance_id, segment_id)
            .finalize()
            .into_bytes(),
    );
    Capability(bytes)
}

/// What a serving engine checks presented capabilities with.
#[derive(Debug, Clone)]
pub(crate) struct DataPortAuth {
    token: AuthToken,
    instance_id: u64,
}

impl DataPortAuth {
    pub(crate) fn new(token: AuthToken, instance_id: u64) -> DataPortAuth {
        DataPortAuth { token, instance_id }
    }

    pub(crate) fn capability(&self, segment_id: u64) -> Capability {
        derive_capability(&self.token, self.instance_id, segment_id)
    }

    /// Whether `presented` is the capability of `segment_id` (constant-time comparison).
    pub(crate) fn verify(&self, segment_id: u64, presented: &[u8]) -> bool {
        keyed(&self.token, self.instance_id, segment_id)
            .verify_slice(presented)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn token(text: &str) -> AuthToken {
        AuthToken::from_bytes(text.as_bytes()).unwrap()
    }

    /// The documented construction, recomputed with the RFC 2104 definition of HMAC on top of
    /// plain SHA-256, for a fixed token, instance and segment.
    #[test]
    fn capability_is_the_documented_hmac() {
        use sha2::Digest;
        let key = b"0123456789abcdef";
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
        let mut message = LABEL.to_vec();
        message.extend_from_slice(&0x9f3a_0c55_e2b1_4d07u64.to_le_bytes());
        message.extend_from_slice(&3u64.to_le_bytes());
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(&message)
            .finalize();
        let outer = Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize();
        let cap = derive_capability(&token("0123456789abcdef"), 0x9f3a_0c55_e2b1_4d07, 3);
        assert_eq!(&cap.as_bytes()[..], &outer[..]);
    }

    #[test]
    fn a_capability_opens_one_segment_of_one_engine_under_one_token() {
        let auth = DataPortAuth::new(token("0123456789abcdef"), 7);
        let cap = auth.capability(3);
        assert!(auth.verify(3, cap.as_bytes()));
        assert!(!auth.verify(4, cap.as_bytes()), "another segment");
        let restarted = DataPortAuth::new(token("0123456789abcdef"), 8);
        assert!(!restarted.verify(3, cap.as_bytes()), "another engine");
        let other = DataPortAuth::new(token("fedcba9876543210"), 7);
        assert!(!other.verify(3, cap.as_bytes()), "another token");
        let mut flipped = *cap.as_bytes();
        flipped[31] ^= 1;
        assert!(!auth.verify(3, &flipped));
        assert!(!auth.verify(3, &cap.as_bytes()[..16]), "truncated");
        assert!(!auth.verify(3, &[]));
    }

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let cap = derive_capability(&token("0123456789abcdef"), 1, 2);
        let hex = cap.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(Capability::from_hex(&hex), Some(cap));
        assert_eq!(Capability::from_hex(&hex.to_uppercase()), Some(cap));
        assert_eq!(Capability::from_hex(&hex[..62]), None);
        assert_eq!(Capability::from_hex(&format!("{}zz", &hex[..62])), None);
        assert_eq!(Capability::from_hex(&format!("{}é", &hex[..62])), None);
        assert!(!format!("{cap:?}").contains(&hex[..8]));
    }
}
