//! The tenant policy file (the `file` connector, `tenant_quota_connector_uri`): read at start-up,
//! rewritten by the quota admin endpoints. The master core does no file I/O; it proposes the policy
//! a change would produce, this module makes it durable, then the master applies it.
//!
//! A change is *propose → persist → apply* under one writer lock (so two admin calls cannot lose
//! each other's change), and no master lock is held while the file is written: PutStart and the
//! other RPCs never wait for the disk. Persisting is: write a temporary file beside the policy,
//! fsync it, rename it over the policy, fsync the directory. If persisting fails the change is
//! not applied and the caller gets PERSISTENT_FAIL.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use mooncake_common::ErrorCode;
use mooncake_master::{MasterService, TenantPolicy, TenantQuotaSnapshot};
use parking_lot::Mutex;

/// Why the policy file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("cannot read the tenant policy file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: mooncake_master::PolicyError,
    },
}

/// Reads and parses the policy at `path`.
pub fn load(path: &Path) -> Result<TenantPolicy, PolicyFileError> {
    let text = fs::read_to_string(path).map_err(|source| PolicyFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    TenantPolicy::parse_yaml(&text).map_err(|source| PolicyFileError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `policy` to `path` durably: temporary file, fsync, rename, fsync of the directory.
pub fn store(path: &Path, policy: &TenantPolicy) -> std::io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut file = File::create(&tmp)?;
        file.write_all(policy.to_yaml().as_bytes())?;
        file.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Where admin changes of the tenant policy are persisted (if anywhere), and the lock that
/// serializes them.
#[derive(Debug, Default)]
pub struct TenantPolicyStore {
    path: Option<PathBuf>,
    writer: Mutex<()>,
}

impl TenantPolicyStore {
    /// Changes are persisted to `path` (`None`: kept in memory only).
    pub fn new(path: Option<PathBuf>) -> Self {
        TenantPolicyStore {
            path,
            writer: Mutex::new(()),
        }
    }

    /// The policy file, if one is configured.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Propose → persist → apply, under the writer lock (blocking: call it off the async
    /// workers).
    fn change(
        &self,
        master: &MasterService,
        propose: impl FnOnce() -> Result<TenantPolicy, ErrorCode>,
    ) -> Result<(), ErrorCode> {
        let _writer = self.writer.lock();
        let policy = propose()?;
        if let Some(path) = &self.path {
            store(path, &policy).map_err(|error| {
                tracing::warn!(path = %path.display(), %error, "cannot persist the tenant policy");
                ErrorCode::PERSISTENT_FAIL
            })?;
        }
        master.apply_tenant_policy(policy)
    }

    /// `PUT /api/v1/tenant_quotas`: the tenant's new snapshot, or the master's error, or
    /// PERSISTENT_FAIL (nothing applied).
    pub fn set_quota(
        &self,
        master: &MasterService,
        tenant: &str,
        bytes: u64,
    ) -> Result<TenantQuotaSnapshot, ErrorCode> {
        self.change(master, || master.propose_tenant_quota(tenant, bytes))?;
        master.tenant_quota(tenant)
    }

    /// `DELETE /api/v1/tenant_quotas`: the master's error, or PERSISTENT_FAIL (nothing applied).
    pub fn delete_quota(&self, master: &MasterService, tenant: &str) -> Result<(), ErrorCode> {
        self.change(master, || master.propose_tenant_quota_removal(tenant))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use mooncake_common::{ManualClock, TenantId};
    use mooncake_master::MasterServiceConfig;

    use super::*;

    fn master() -> MasterService {
        MasterService::new(
            MasterServiceConfig {
                enable_multi_tenants: true,
                ..Default::default()
            },
            Arc::new(ManualClock::new(1_000)),
        )
        .unwrap()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mc-policy-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn changes_are_persisted_before_they_are_applied() {
        let dir = scratch("persist");
        let path = dir.join("tenants.yaml");
        fs::write(
            &path,
            "version: 1\ntenants:\n  - name: t1\n    quota: 1KB\n",
        )
        .unwrap();
        let m = master();
        m.apply_tenant_policy(load(&path).unwrap()).unwrap();
        let store = TenantPolicyStore::new(Some(path.clone()));
        let s = store.set_quota(&m, "t2", 4096).unwrap();
        assert_eq!(s.requested_quota_bytes, 4096);
        let on_disk = load(&path).unwrap();
        assert_eq!(on_disk, m.tenant_policy());
        assert_eq!(on_disk.tenants[&TenantId::new("t2").unwrap()], 4096);
        assert!(
            !dir.join("tenants.yaml.tmp").exists(),
            "temporary file left"
        );
        store.delete_quota(&m, "t1").unwrap();
        assert!(!load(&path).unwrap().tenants.contains_key("t1"));
        assert_eq!(
            store.delete_quota(&m, "t1"),
            Err(ErrorCode::OBJECT_NOT_FOUND)
        );

        // A policy file that cannot be written → PERSISTENT_FAIL, nothing applied.
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            store.set_quota(&m, "t2", 20),
            Err(ErrorCode::PERSISTENT_FAIL)
        );
        assert_eq!(m.tenant_quota("t2").unwrap().requested_quota_bytes, 4096);
        assert_eq!(
            store.delete_quota(&m, "t2"),
            Err(ErrorCode::PERSISTENT_FAIL)
        );
        assert!(m.tenant_policy().tenants.contains_key("t2"));
    }

    #[test]
    fn without_a_file_changes_stay_in_memory_and_bad_files_are_refused() {
        let m = master();
        let store = TenantPolicyStore::new(None);
        assert_eq!(
            store.set_quota(&m, "t", 10).unwrap().effective_quota_bytes,
            0
        );
        assert_eq!(store.set_quota(&m, "t", 0), Err(ErrorCode::INVALID_PARAMS));
        let dir = scratch("bad");
        let path = dir.join("p.yaml");
        fs::write(&path, "version: 2\n").unwrap();
        assert!(matches!(load(&path), Err(PolicyFileError::Parse { .. })));
        assert!(matches!(
            load(&dir.join("missing.yaml")),
            Err(PolicyFileError::Read { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
