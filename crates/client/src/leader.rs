//! Finding the leading master in etcd (`etcd://h1:2379,h2:2379` as the master address;
//! docs/ha.md, "Clients"): the leader key `mooncake-store/<cluster_id>/master_view` holds the
//! leader's RPC address and its create revision is the view version. It is read through etcd's
//! JSON gateway (`POST /v3/kv/range`, served by etcd 3.4 on the client port), so the client
//! needs no gRPC stack. The cluster id is `MC_STORE_CLUSTER_ID` (upstream's variable), default
//! `mooncake_cluster`.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest answer read from etcd.
const MAX_ANSWER: usize = 64 << 10;

/// The leader as etcd names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderView {
    pub address: String,
    pub version: u64,
}

/// Where to read the leader key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdLeader {
    /// `host:port` of each etcd member.
    endpoints: Vec<String>,
    key: String,
    timeout: Duration,
}

impl EtcdLeader {
    /// `Some` for a master address `etcd://h1:p1,h2:p2` (`,` or `;` between members, an
    /// optional `http://` on each), with the cluster id from `MC_STORE_CLUSTER_ID`.
    pub fn from_address(addr: &str, timeout: Duration) -> Option<Result<EtcdLeader, String>> {
        let members = addr.trim().strip_prefix("etcd://")?;
        let cluster =
            std::env::var("MC_STORE_CLUSTER_ID").unwrap_or_else(|_| "mooncake_cluster".into());
        Some(Self::new(members, &cluster, timeout))
    }

    /// The leader key of `cluster` in the etcd members `members`.
    pub fn new(members: &str, cluster: &str, timeout: Duration) -> Result<EtcdLeader, String> {
        let endpoints: Vec<String> = members
            .split([',', ';'])
            .map(|m| m.trim().trim_start_matches("http://").trim_end_matches('/'))
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        if endpoints.is_empty() {
            return Err(format!("no etcd member in {members:?}"));
        }
        Ok(EtcdLeader {
            endpoints,
            key: format!("mooncake-store/{cluster}/master_view"),
            timeout,
        })
    }

    /// The current leader (`Ok(None)`: no leader now), from the first member that answers.
    pub async fn read(&self) -> Result<Option<LeaderView>, String> {
        let mut errors = Vec::new();
        for member in &self.endpoints {
            match tokio::time::timeout(self.timeout, self.read_from(member)).await {
                Ok(Ok(view)) => return Ok(view),
                Ok(Err(e)) => errors.push(format!("{member}: {e}")),
                Err(_) => errors.push(format!("{member}: no answer within {:?}", self.timeout)),
            }
        }
        Err(format!(
            "cannot read the leader from etcd ({})",
            errors.join("; ")
        ))
    }

    async fn read_from(&self, member: &str) -> Result<Option<LeaderView>, String> {
        let body = format!("{{\"key\":\"{}\"}}", base64_encode(self.key.as_bytes()));
        let request = format!(
            "POST /v3/kv/range HTTP/1.0\r\nHost: {member}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut s = TcpStream::connect(member)
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        s.take(MAX_ANSWER as u64 + 1)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| e.to_string())?;
        if answer.len() > MAX_ANSWER {
            return Err("answer too long".into());
        }
        let text = String::from_utf8_lossy(&answer);
        let (head, json) = text.split_once("\r\n\r\n").ok_or("answer without a body")?;
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            let status = head.lines().next().unwrap_or_default();
            return Err(format!("etcd answered {status:?}"));
        }
        parse_range(json)
    }
}

/// The leader view in a range answer: `kvs[0].value` (base64) and `kvs[0].create_revision`.
fn parse_range(json: &str) -> Result<Option<LeaderView>, String> {
    let Some(kvs) = json.find("\"kvs\"").map(|i| &json[i..]) else {
        return Ok(None);
    };
    let value = string_field(kvs, "value").ok_or("no value in the leader key")?;
    let address = base64_decode(value)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or("the leader key's value is not base64 UTF-8")?;
    let version = string_field(kvs, "create_revision")
        .and_then(|v| v.parse().ok())
        .ok_or("no create_revision in the leader key")?;
    Ok(Some(LeaderView { address, version }))
}

/// The string value of the first `"name":"…"` in `json` (etcd's gateway writes 64-bit
/// integers as strings too).
fn string_field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let tag = format!("\"{name}\":\"");
    let start = json.find(&tag)? + tag.len();
    let len = json[start..].find('"')?;
    Some(&json[start..start + len])
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_other_characters() {
        for s in [
            "",
            "a",
            "ab",
            "abc",
            "mooncake-store/c/master_view",
            "127.0.0.1:50051",
        ] {
            let e = base64_encode(s.as_bytes());
            assert_eq!(base64_decode(&e).unwrap(), s.as_bytes(), "{s} -> {e}");
        }
        assert_eq!(base64_encode(b"ab"), "YWI=");
        assert_eq!(base64_decode("YW*="), None);
    }

    #[test]
    fn a_range_answer_gives_the_leader_or_none() {
        let answer = r#"{"header":{"revision":"9"},"kvs":[{"key":"bW9vbg==","create_revision":"7","mod_revision":"7","version":"1","value":"MTI3LjAuMC4xOjUwMDUx","lease":"1"}],"count":"1"}"#;
        assert_eq!(
            parse_range(answer).unwrap(),
            Some(LeaderView {
                address: "127.0.0.1:50051".into(),
                version: 7
            })
        );
        assert_eq!(parse_range(r#"{"header":{"revision":"9"}}"#).unwrap(), None);
        assert!(parse_range(r#"{"kvs":[{"value":"!!"}]}"#).is_err());
        assert!(parse_range(r#"{"kvs":[{"value":"YQ=="}]}"#).is_err());
    }

    #[test]
    fn etcd_addresses_name_their_members() {
        let t = Duration::from_secs(1);
        assert!(EtcdLeader::from_address("127.0.0.1:50051", t).is_none());
        let l = EtcdLeader::new("http://h1:2379;h2:2379/, ", "c1", t).unwrap();
        assert_eq!(l.endpoints, ["h1:2379", "h2:2379"]);
        assert_eq!(l.key, "mooncake-store/c1/master_view");
        assert!(EtcdLeader::new(" , ", "c1", t).is_err());
    }
}
