//! Prometheus text for `/metrics`, with upstream's `master_*` family names where one exists.
//!
//! Per-RPC counters are named `master_<snake_case_method>_requests_total` and
//! `..._failures_total` as upstream (`master_put_start_requests_total`, …). A failure is a
//! reply carrying an error code or a request the server could not decode.

use mooncake_proto::METHODS;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Request and failure counters for every RPC method.
#[derive(Debug)]
pub struct RpcMetrics {
    requests: Vec<AtomicU64>,
    failures: Vec<AtomicU64>,
    unknown_method_requests: AtomicU64,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        RpcMetrics {
            requests: METHODS.iter().map(|_| AtomicU64::new(0)).collect(),
            failures: METHODS.iter().map(|_| AtomicU64::new(0)).collect(),
            unknown_method_requests: AtomicU64::new(0),
        }
    }
}

fn slot(method: u16) -> Option<usize> {
    METHODS.iter().position(|(id, _)| *id == method)
}

impl RpcMetrics {
    /// Counts one request of `method`, and a failure when `failed`.
    pub fn record(&self, method: u16, failed: bool) {
        match slot(method) {
            Some(i) => {
                self.requests[i].fetch_add(1, Ordering::Relaxed);
                if failed {
                    self.failures[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                self.unknown_method_requests.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Requests of `method` so far.
    pub fn requests(&self, method: u16) -> u64 {
        slot(method).map_or(0, |i| self.requests[i].load(Ordering::Relaxed))
    }

    /// Failed requests of `method` so far.
    pub fn failures(&self, method: u16) -> u64 {
        slot(method).map_or(0, |i| self.failures[i].load(Ordering::Relaxed))
    }

    /// Appends the counters in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        for (i, (_, name)) in METHODS.iter().enumerate() {
            let snake = snake_case(name);
            counter(
                out,
                &format!("master_{snake}_requests_total"),
                &format!("Total number of {name} requests received"),
                self.requests[i].load(Ordering::Relaxed),
            );
            counter(
                out,
                &format!("master_{snake}_failures_total"),
                &format!("Total number of failed {name} requests"),
                self.failures[i].load(Ordering::Relaxed),
            );
        }
        counter(
            out,
            "master_unknown_method_requests_total",
            "Requests naming a method this master does not know",
            self.unknown_method_requests.load(Ordering::Relaxed),
        );
    }
}

/// Counters of the background workers.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    pub eviction_cycles: AtomicU64,
    pub evicted_objects: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub expired_clients: AtomicU64,
}

impl WorkerMetrics {
    /// Appends the counters in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        counter(
            out,
            "master_eviction_cycles_total",
            "Eviction cycles that found work to do",
            get(&self.eviction_cycles),
        );
        counter(
            out,
            "master_evicted_keys_total",
            "Objects removed by eviction",
            get(&self.evicted_objects),
        );
        counter(
            out,
            "master_evicted_bytes_total",
            "Bytes freed by eviction",
            get(&self.evicted_bytes),
        );
        counter(
            out,
            "master_expired_clients_total",
            "Clients whose segments were unmounted after client_ttl without a ping",
            get(&self.expired_clients),
        );
    }
}

/// `PutStart` → `put_start`, `ReMountSegment` → `re_mount_segment`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Appends one counter family with its HELP and TYPE lines.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// Appends one gauge family with its HELP and TYPE lines.
pub fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_proto::methods::{Method, PutStart};

    #[test]
    fn names_follow_upstream_families() {
        assert_eq!(snake_case("PutStart"), "put_start");
        assert_eq!(snake_case("ExistKey"), "exist_key");
        let metrics = RpcMetrics::default();
        metrics.record(PutStart::ID, false);
        metrics.record(PutStart::ID, true);
        metrics.record(60_000, false);
        assert_eq!(metrics.requests(PutStart::ID), 2);
        assert_eq!(metrics.failures(PutStart::ID), 1);
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains(
            "# TYPE master_put_start_requests_total counter\nmaster_put_start_requests_total 2\n"
        ));
        assert!(text.contains("master_put_start_failures_total 1\n"));
        assert!(text.contains("master_unknown_method_requests_total 1\n"));
    }
}
