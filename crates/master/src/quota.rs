//! Tenants and quota (as upstream's master).
//!
//! With multi-tenancy on, a tenant may write only when a policy names it. The policy is YAML
//! (`version: 1`, `tenants: [{name, quota}]`, quota a positive integer with an optional unit
//! B/KB/MB/GB/TB, 1024-based), parsed and printed here as pure functions; reading and writing the
//! policy file is the server's business (the master does no file I/O). Effective quotas follow
//! the proportional formula with largest-remainder rounding over the mounted capacity.
//!
//! This file is the quota table as plain data; the tenant RPCs and admin methods over it are
//! `tenants.rs`.
//!
//! Each tenant has one [`TenantAccount`]: `charged_bytes` is the sum, over the tenant's objects, of
//! the bytes of the memory replicas they hold (PROCESSING ones are the in-flight pending charges).
//! A put charges `size × replica_num` before allocating and refunds the shortfall at once; every
//! replica dropped later (revoke, eviction, removal, client death, expiry) is refunded by the
//! object metadata itself (`ObjectMetadata::extract_replicas` and its `Drop`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use mooncake_common::{ErrorCode, TenantId};
use serde::{Deserialize, Serialize};

/// One tenant's quota state. Shared by the quota table and every object of the tenant.
#[derive(Debug)]
pub(crate) struct TenantAccount {
    pub name: TenantId,
    charged: AtomicU64,
    effective: AtomicU64,
    /// 0 = no explicit policy (orphan).
    requested: AtomicU64,
    open: AtomicBool,
}

impl TenantAccount {
    fn new(name: TenantId) -> Self {
        TenantAccount {
            name,
            charged: AtomicU64::new(0),
            effective: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            open: AtomicBool::new(false),
        }
    }

    /// Charges `bytes` if admission is open and `charged + bytes <= effective`. On refusal
    /// returns the deficit in bytes (`u64::MAX` when admission is closed).
    pub fn try_charge(&self, bytes: u64) -> Result<(), u64> {
        if !self.open.load(Ordering::Acquire) {
            return Err(u64::MAX);
        }
        let effective = self.effective.load(Ordering::Acquire);
        let mut cur = self.charged.load(Ordering::Acquire);
        loop {
            let want = cur.saturating_add(bytes);
            if want > effective {
                return Err(want - effective);
            }
            match self
                .charged
                .compare_exchange_weak(cur, want, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Charges `bytes` without an admission check (rebuilding charges from replayed objects).
    pub fn charge_unchecked(&self, bytes: u64) {
        self.charged.fetch_add(bytes, Ordering::AcqRel);
    }

    pub fn refund(&self, bytes: u64) {
        let _ = self
            .charged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(bytes))
            });
    }

    pub fn charged_bytes(&self) -> u64 {
        self.charged.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> TenantQuotaSnapshot {
        let requested = self.requested.load(Ordering::Acquire);
        let effective = self.effective.load(Ordering::Acquire);
        let charged = self.charged_bytes();
        TenantQuotaSnapshot {
            tenant_id: self.name.to_string(),
            requested_quota_bytes: requested,
            effective_quota_bytes: effective,
            charged_bytes: charged,
            admission_closed: !self.open.load(Ordering::Acquire),
            has_explicit_policy: requested > 0,
            over_quota: charged > effective,
        }
    }
}

/// What the admin API reports about one tenant (`GET /api/v1/tenant_quotas`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantQuotaSnapshot {
    pub tenant_id: String,
    /// 0 when the tenant has no explicit policy (an orphan).
    pub requested_quota_bytes: u64,
    pub effective_quota_bytes: u64,
    pub charged_bytes: u64,
    pub admission_closed: bool,
    pub has_explicit_policy: bool,
    pub over_quota: bool,
}

/// A tenant quota policy: requested bytes per tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPolicy {
    pub tenants: BTreeMap<TenantId, u64>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    version: u32,
    #[serde(default)]
    tenants: Vec<PolicyEntry>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PolicyEntry {
    name: String,
    quota: serde_yaml::Value,
}

/// Why a policy text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("bad tenant policy: {0}")]
    Invalid(String),
}

impl From<PolicyError> for ErrorCode {
    fn from(e: PolicyError) -> Self {
        match e {
            PolicyError::Invalid(_) => ErrorCode::INVALID_PARAMS,
        }
    }
}

/// Largest quota accepted (2^63 − 1 bytes, as upstream's HTTP API).
pub const MAX_QUOTA_BYTES: u64 = i64::MAX as u64;

impl TenantPolicy {
    /// Parses the YAML policy (`version: 1`). Names must be valid tenant names, unique; quotas
    /// positive integers (optionally with a unit) up to 2^63 − 1.
    pub fn parse_yaml(text: &str) -> Result<Self, PolicyError> {
        let file: PolicyFile =
            serde_yaml::from_str(text).map_err(|e| PolicyError::Invalid(e.to_string()))?;
        if file.version != 1 {
            return Err(PolicyError::Invalid(format!(
                "unsupported version {}",
                file.version
            )));
        }
        let mut tenants = BTreeMap::new();
        for e in file.tenants {
            let name = TenantId::new(&e.name)
                .map_err(|_| PolicyError::Invalid(format!("bad tenant name {:?}", e.name)))?;
            let bytes = match &e.quota {
                serde_yaml::Value::Number(n) => n.as_u64(),
                serde_yaml::Value::String(s) if !s.trim().contains('.') => {
                    mooncake_common::parse_size(s).ok()
                }
                _ => None,
            }
            .filter(|&b| (1..=MAX_QUOTA_BYTES).contains(&b))
            .ok_or_else(|| PolicyError::Invalid(format!("bad quota for tenant {:?}", e.name)))?;
            if tenants.insert(name, bytes).is_some() {
                return Err(PolicyError::Invalid(format!(
                    "tenant {:?} listed twice",
                    e.name
                )));
            }
        }
        Ok(TenantPolicy { tenants })
    }

    /// The policy as YAML (`version: 1`, quotas in bytes).
    pub fn to_yaml(&self) -> String {
        let file = PolicyFile {
            version: 1,
            tenants: self
                .tenants
                .iter()
                .map(|(name, bytes)| PolicyEntry {
                    name: name.to_string(),
                    quota: serde_yaml::Value::Number((*bytes).into()),
                })
                .collect(),
        };
        serde_yaml::to_string(&file).unwrap_or_default()
    }
}

/// Effective quotas: every request if they fit in `capacity`, else `floor(C × req / Σreq)` with
/// the leftover bytes handed one at a time to the largest remainders (ties by tenant name).
pub fn effective_quotas(capacity: u64, requested: &BTreeMap<TenantId, u64>) -> Vec<u64> {
    let sum: u128 = requested.values().map(|&r| u128::from(r)).sum();
    if sum <= u128::from(capacity) {
        return requested.values().copied().collect();
    }
    let c = u128::from(capacity);
    let mut out = Vec::with_capacity(requested.len());
    let mut rema = Vec::with_capacity(requested.len());
    for (i, &r) in requested.values().enumerate() {
        let num = c * u128::from(r);
        out.push((num / sum) as u64);
        rema.push((num % sum, i));
    }
    let given: u128 = out.iter().map(|&q| u128::from(q)).sum();
    let mut left = (c - given) as usize;
    // Largest remainder first; BTreeMap order (tenant name) breaks ties.
    rema.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &rema {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// The quota table: accounts of every tenant with a policy or with objects.
#[derive(Debug, Default)]
pub(crate) struct QuotaTable {
    pub accounts: BTreeMap<TenantId, Arc<TenantAccount>>,
    pub policy: TenantPolicy,
    pub capacity_bytes: u64,
}

impl QuotaTable {
    /// The account of `tenant`, created (closed, quota 0) if absent.
    pub fn account(&mut self, tenant: &TenantId) -> Arc<TenantAccount> {
        self.accounts
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(TenantAccount::new(tenant.clone())))
            .clone()
    }

    /// Recomputes effective quotas and admission after a policy or capacity change.
    pub fn recompute(&mut self, capacity_bytes: u64) {
        self.capacity_bytes = capacity_bytes;
        let names: Vec<TenantId> = self.policy.tenants.keys().cloned().collect();
        for name in &names {
            self.account(name);
        }
        let eff = effective_quotas(capacity_bytes, &self.policy.tenants);
        for (name, acc) in &self.accounts {
            match self.policy.tenants.get(name) {
                Some(&req) => {
                    let i = names.iter().position(|n| n == name).unwrap_or(0);
                    acc.requested.store(req, Ordering::Release);
                    acc.effective
                        .store(eff.get(i).copied().unwrap_or(0), Ordering::Release);
                    acc.open.store(true, Ordering::Release);
                }
                None => {
                    acc.requested.store(0, Ordering::Release);
                    acc.effective.store(0, Ordering::Release);
                    acc.open.store(false, Ordering::Release);
                }
            }
        }
        // Forget accounts that hold nothing and have no policy.
        let policy = &self.policy.tenants;
        self.accounts
            .retain(|name, acc| policy.contains_key(name) || acc.charged_bytes() > 0);
    }

    pub fn snapshots(&self) -> Vec<TenantQuotaSnapshot> {
        self.accounts.values().map(|a| a.snapshot()).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(pairs: &[(&str, u64)]) -> BTreeMap<TenantId, u64> {
        pairs
            .iter()
            .map(|(n, q)| (TenantId::new(n).unwrap(), *q))
            .collect()
    }

    #[test]
    fn requests_that_fit_are_granted_as_is() {
        assert_eq!(
            effective_quotas(100, &req(&[("a", 30), ("b", 70)])),
            vec![30, 70]
        );
    }

    #[test]
    fn largest_remainder_rounding_sums_to_capacity() {
        // 10 × 1/3 each = 3.33: one leftover byte goes to the first name (ties by name).
        let q = effective_quotas(10, &req(&[("a", 10), ("b", 10), ("c", 10)]));
        assert_eq!(q, vec![4, 3, 3]);
        // 100 over requests 50/30/40 (Σ 120): 41.67, 25, 33.33 → 41+25+33 = 99, +1 to a.
        let q = effective_quotas(100, &req(&[("a", 50), ("b", 30), ("c", 40)]));
        assert_eq!(q, vec![42, 25, 33]);
        assert_eq!(q.iter().sum::<u64>(), 100);
    }

    #[test]
    fn policy_yaml_parses_units_and_refuses_bad_input() {
        let p = TenantPolicy::parse_yaml(
            "version: 1\ntenants:\n  - name: a\n    quota: 10MB\n  - name: b\n    quota: 4096\n",
        )
        .unwrap();
        assert_eq!(p.tenants[&TenantId::new("a").unwrap()], 10 << 20);
        assert_eq!(p.tenants[&TenantId::new("b").unwrap()], 4096);
        assert_eq!(TenantPolicy::parse_yaml(&p.to_yaml()).unwrap(), p);
        for bad in [
            "version: 2\ntenants: []\n",
            "version: 1\ntenants:\n  - name: a\n    quota: 0\n",
            "version: 1\ntenants:\n  - name: a\n    quota: -5\n",
            "version: 1\ntenants:\n  - name: a\n    quota: 1.5GB\n",
            "version: 1\ntenants:\n  - name: _x\n    quota: 1\n",
            "version: 1\ntenants:\n  - name: a\n    quota: 1\n  - name: a\n    quota: 2\n",
            "version: 1\ntenants:\n  - name: a\n",
            "not yaml: [",
        ] {
            assert!(TenantPolicy::parse_yaml(bad).is_err(), "{bad:?}");
        }
    }
}
