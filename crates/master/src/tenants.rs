//! Tenant RPCs and quota administration (as upstream's master) over the quota table (`quota.rs`).
//!
//! Everything here is pure: a policy change is applied in memory and observed as `TenantPolicy`
//! under the quota table's write lock. Persisting the policy is the caller's business: the server
//! asks for the policy a change would produce ([`MasterService::propose_tenant_quota`],
//! [`MasterService::propose_tenant_quota_removal`]), writes it to its file outside every master
//! lock, and applies it with [`MasterService::apply_tenant_policy`] once it is durable.

use std::sync::Arc;

use mooncake_common::{ErrorCode, TenantId};

use crate::handle::MasterService;
use crate::index::Tenant;
use crate::mutation::Mutation;
use crate::quota::{TenantAccount, TenantPolicy, TenantQuotaSnapshot, MAX_QUOTA_BYTES};

impl MasterService {
    /// The tenant's account when quotas are on (`None` with multi-tenancy off). A tenant without
    /// a policy (unknown or orphan) may not write: TENANT_NOT_REGISTERED.
    pub(crate) fn tenant_account(
        &self,
        tenant: Tenant<'_>,
    ) -> Result<Option<Arc<TenantAccount>>, ErrorCode> {
        if !self.config.enable_multi_tenants {
            return Ok(None);
        }
        let name = tenant.name();
        let q = self.quota.read();
        match q.accounts.get(name) {
            Some(a) if q.policy.tenants.contains_key(name) => Ok(Some(a.clone())),
            _ => Err(ErrorCode::TENANT_NOT_REGISTERED),
        }
    }

    /// Recomputes effective quotas (after mount, unmount, client expiry or a policy change).
    pub(crate) fn recompute_quotas(&self) {
        if !self.config.enable_multi_tenants {
            return;
        }
        let capacity = self.total_capacity_bytes();
        self.quota.write().recompute(capacity);
    }

    fn require_multi_tenant(&self) -> Result<(), ErrorCode> {
        if self.config.enable_multi_tenants {
            Ok(())
        } else {
            Err(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
        }
    }

    /// Replaces the whole policy (loaded by the server from its connector, or a change it has
    /// persisted) and recomputes quotas. Tenants that lose their policy become orphans: admission
    /// closed, data kept. UNAVAILABLE_IN_CURRENT_MODE with multi-tenancy off.
    pub fn apply_tenant_policy(&self, policy: TenantPolicy) -> Result<(), ErrorCode> {
        self.require_multi_tenant()?;
        self.set_policy(policy, true);
        Ok(())
    }

    /// Installs `policy`, observed when `notify` (a replay does not re-observe what it applies).
    pub(crate) fn set_policy(&self, policy: TenantPolicy, notify: bool) {
        let capacity = self.total_capacity_bytes();
        let mut q = self.quota.write();
        q.policy = policy;
        q.recompute(capacity);
        if notify {
            self.emit(|| Mutation::TenantPolicy(q.policy.clone()));
        }
    }

    /// The current tenant policy.
    pub fn tenant_policy(&self) -> TenantPolicy {
        self.quota.read().policy.clone()
    }

    /// The policy that `PUT /api/v1/tenant_quotas?tenant_id=` would produce, without applying it:
    /// UNAVAILABLE_IN_CURRENT_MODE with multi-tenancy off, INVALID_PARAMS for a bad name or a
    /// quota outside [1, 2^63 − 1].
    pub fn propose_tenant_quota(
        &self,
        tenant: &str,
        requested_quota_bytes: u64,
    ) -> Result<TenantPolicy, ErrorCode> {
        self.require_multi_tenant()?;
        if !(1..=MAX_QUOTA_BYTES).contains(&requested_quota_bytes) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let id = TenantId::new(tenant)?;
        let mut policy = self.tenant_policy();
        policy.tenants.insert(id, requested_quota_bytes);
        Ok(policy)
    }

    /// The policy that `DELETE /api/v1/tenant_quotas?tenant_id=` would produce, without applying
    /// it: no policy → OBJECT_NOT_FOUND; the tenant still holds objects or charges →
    /// TENANT_NOT_EMPTY.
    pub fn propose_tenant_quota_removal(&self, tenant: &str) -> Result<TenantPolicy, ErrorCode> {
        self.require_multi_tenant()?;
        let id = TenantId::new(tenant)?;
        let mut policy = self.tenant_policy();
        if policy.tenants.remove(&id).is_none() {
            return Err(ErrorCode::OBJECT_NOT_FOUND);
        }
        if self.tenant_object_count(&id) > 0
            || self
                .quota
                .read()
                .accounts
                .get(&id)
                .is_some_and(|a| a.charged_bytes() > 0)
        {
            return Err(ErrorCode::TENANT_NOT_EMPTY);
        }
        Ok(policy)
    }

    /// Sets one tenant's requested quota in memory ([`MasterService::propose_tenant_quota`]'s
    /// errors) and returns its new snapshot. Nothing is persisted.
    pub fn set_tenant_quota(
        &self,
        tenant: &str,
        requested_quota_bytes: u64,
    ) -> Result<TenantQuotaSnapshot, ErrorCode> {
        let policy = self.propose_tenant_quota(tenant, requested_quota_bytes)?;
        self.apply_tenant_policy(policy)?;
        self.tenant_quota(tenant)
    }

    /// Deletes one tenant's policy in memory
    /// ([`MasterService::propose_tenant_quota_removal`]'s errors); admission closes. Nothing is
    /// persisted.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<(), ErrorCode> {
        let policy = self.propose_tenant_quota_removal(tenant)?;
        self.apply_tenant_policy(policy)
    }

    /// One tenant's snapshot (TENANT_NOT_REGISTERED when it has no account).
    pub fn tenant_quota(&self, tenant: &str) -> Result<TenantQuotaSnapshot, ErrorCode> {
        self.require_multi_tenant()?;
        let id = TenantId::new(tenant)?;
        self.quota
            .read()
            .accounts
            .get(&id)
            .map(|a| a.snapshot())
            .ok_or(ErrorCode::TENANT_NOT_REGISTERED)
    }

    /// `GET /api/v1/tenant_quotas[?tenant_id=]`: snapshots of every known tenant (or one, sorted
    /// by name). UNAVAILABLE_IN_CURRENT_MODE with multi-tenancy off; an unknown tenant →
    /// TENANT_NOT_REGISTERED.
    pub fn list_tenant_quotas(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<TenantQuotaSnapshot>, ErrorCode> {
        self.require_multi_tenant()?;
        match tenant {
            None => Ok(self.quota.read().snapshots()),
            Some(t) => self.tenant_quota(t).map(|s| vec![s]),
        }
    }
}
