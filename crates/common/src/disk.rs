//! What the master and a store node exchange about the node's local disk tier (LOCAL_DISK
//! replicas): offload tasks, their outcomes, and objects a node advertises from its disk.

use serde::{Deserialize, Serialize};

/// One object the master asks a node to copy from its memory segment to its disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadTask {
    /// Tenant name (`""` = default).
    pub tenant: String,
    pub key: String,
    pub size: u64,
    /// The source memory replica: an address in one of the node's own segments.
    pub buffer_address: u64,
}

/// The node's answer to one [`OffloadTask`]: `stored` true adds the LOCAL_DISK replica, false
/// only releases the task (and the pin on the source replica).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadOutcome {
    pub tenant: String,
    pub key: String,
    pub stored: bool,
}

/// An object a node holds on its disk, advertised after a restart or re-mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskObject {
    pub tenant: String,
    pub key: String,
    pub size: u64,
}

/// The key under which a node stores `key` of `tenant` on its disk: `tenant + NUL + key`, with
/// `default` for the empty tenant (upstream's scoped storage key).
pub fn storage_key(tenant: &str, key: &str) -> String {
    let tenant = if tenant.is_empty() {
        crate::DEFAULT_TENANT
    } else {
        tenant
    };
    let mut out = String::with_capacity(tenant.len() + 1 + key.len());
    out.push_str(tenant);
    out.push('\0');
    out.push_str(key);
    out
}

/// Splits a storage key back into `(tenant, key)`; `None` for a key without the separator.
pub fn split_storage_key(stored: &str) -> Option<(&str, &str)> {
    stored.split_once('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_keys_round_trip() {
        assert_eq!(storage_key("", "k"), "default\0k");
        assert_eq!(storage_key("t1", "a\0b"), "t1\0a\0b");
        assert_eq!(split_storage_key("t1\0a\0b"), Some(("t1", "a\0b")));
        assert_eq!(split_storage_key("plain"), None);
    }
}
