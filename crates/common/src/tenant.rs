//! Tenants: the namespace every key lives in.
//!
//! Upstream rules: an empty tenant name means `"default"`; a name is invalid if it starts with `_`
//! or contains a byte below 0x20 or the byte 0x7f. The scoped key is `tenant + '\0' + key`.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ErrorCode;

/// The name of the default tenant.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name accepted (bytes). Upstream has no explicit limit; we bound it.
pub const MAX_TENANT_LEN_BYTES: usize = 256;

/// A validated tenant name. Cheap to clone (shared string).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// Validates and normalizes a tenant name: `""` becomes `"default"`; a leading `_`, a control
    /// byte (< 0x20 or 0x7f) or a name longer than [`MAX_TENANT_LEN_BYTES`] is `INVALID_PARAMS`.
    pub fn new(name: &str) -> Result<TenantId, ErrorCode> {
        if name.is_empty() || name == DEFAULT_TENANT {
            return Ok(TenantId::default());
        }
        if !is_valid_tenant_name(name) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        Ok(TenantId(Arc::from(name)))
    }

    /// The tenant name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for `"default"`.
    pub fn is_default(&self) -> bool {
        &*self.0 == DEFAULT_TENANT
    }

    /// Upstream's scoped key: `tenant + '\0' + key`.
    pub fn scoped_key(&self, key: &str) -> String {
        let mut out = String::with_capacity(self.0.len() + 1 + key.len());
        out.push_str(&self.0);
        out.push('\0');
        out.push_str(key);
        out
    }
}

/// Upstream's syntactic check, applied to a non-empty name.
pub fn is_valid_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_LEN_BYTES
        && !name.starts_with('_')
        && !name.bytes().any(|b| b < 0x20 || b == 0x7f)
}

impl Default for TenantId {
    fn default() -> Self {
        thread_local! {
            static DEFAULT: Arc<str> = Arc::from(DEFAULT_TENANT);
        }
        TenantId(DEFAULT.with(Arc::clone))
    }
}

/// Lets maps keyed by `TenantId` be queried with a `&str` (hash and equality are the string's).
impl std::borrow::Borrow<str> for TenantId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({:?})", &*self.0)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TenantId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        TenantId::new(&name)
            .map_err(|_| serde::de::Error::custom(format!("invalid tenant name {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn empty_tenant_is_default() {
        let t = TenantId::new("").unwrap();
        assert!(t.is_default());
        assert_eq!(t, TenantId::default());
        assert_eq!(t.as_str(), "default");
    }

    #[test]
    fn invalid_tenant_names_are_invalid_params() {
        for bad in ["_hidden", "a\u{1}b", "tab\there", "del\u{7f}", "\n"] {
            assert_eq!(
                TenantId::new(bad),
                Err(ErrorCode::INVALID_PARAMS),
                "{bad:?}"
            );
        }
        let long = "x".repeat(MAX_TENANT_LEN_BYTES + 1);
        assert_eq!(TenantId::new(&long), Err(ErrorCode::INVALID_PARAMS));
    }

    #[test]
    fn valid_tenant_names_are_kept() {
        for good in [
            "team-a",
            "a_b",
            "ü",
            "with space",
            "x".repeat(MAX_TENANT_LEN_BYTES).as_str(),
        ] {
            assert_eq!(TenantId::new(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn scoped_key_joins_with_nul() {
        let t = TenantId::new("t1").unwrap();
        assert_eq!(t.scoped_key("k"), "t1\0k");
    }

    #[test]
    fn deserialize_validates() {
        let ok: TenantId = serde_json::from_str("\"\"").unwrap();
        assert!(ok.is_default());
        assert!(serde_json::from_str::<TenantId>("\"_x\"").is_err());
    }
}
