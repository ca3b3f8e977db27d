//! The master core's settings, with upstream's defaults (as upstream's master).
//!
//! The server crate parses flags and files; this struct is what the state machine needs.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hot_keys::DynamicReplicationMode;
use crate::strategy::AllocationStrategy;

/// Settings of [`crate::MasterService`]. `Default` gives upstream's code defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MasterServiceConfig {
    /// Read lease granted by Get/Exist (upstream `default_kv_lease_ttl`, 10 000 ms).
    pub default_kv_lease_ttl_ms: u64,
    /// Soft-pin TTL when ENABLE comes without one (1 800 000 ms = 30 min).
    pub default_kv_soft_pin_ttl_ms: u64,
    /// Largest soft-pin TTL a put may ask for (86 400 000 ms = 24 h).
    pub max_kv_soft_pin_ttl_ms: u64,
    /// Whether eviction may take soft-pinned objects in its second pass (true).
    pub allow_evict_soft_pinned_objects: bool,
    /// After this, a new PutStart may pre-empt an unfinished put of the same key (30 s).
    pub put_start_discard_timeout_sec: u64,
    /// After this, an unfinished put is reaped and its buffers may be reused (600 s).
    pub put_start_release_timeout_sec: u64,
    /// Replica placement (`random`).
    pub allocation_strategy: AllocationStrategy,
    /// Multi-tenancy (false: every key lives in `default`, whatever tenant the caller names).
    pub enable_multi_tenants: bool,
    /// Client liveness TTL (10 s). Used by the client monitor.
    pub client_live_ttl_sec: u64,
    /// Eviction step (0.05). Used by eviction.
    pub eviction_ratio: f64,
    /// Eviction trigger (0.90). Used by eviction.
    pub eviction_high_watermark_ratio: f64,
    /// Objects a PutStart that finds no space may examine for inline eviction
    /// ([`DEFAULT_PUT_START_EVICT_BUDGET`]); 0 refuses at once with NO_AVAILABLE_HANDLE, as
    /// upstream. Not an upstream setting.
    pub put_start_evict_budget: usize,
    /// Nodes may mount their disks and objects are offloaded to them (false).
    pub enable_offload: bool,
    /// Offload when memory eviction picks an object instead of at PutEnd (false).
    pub offload_on_evict: bool,
    /// Offload tasks a node's mailbox holds (queued and not answered) (50 000).
    pub offloading_queue_limit: u64,
    /// Disk-only objects read often get a memory replica again (false).
    pub promotion_on_hit: bool,
    /// Disk hits (count-min estimate) that admit a promotion (2).
    pub promotion_admission_threshold: u32,
    /// Promotions in flight at most, across nodes (50 000).
    pub promotion_queue_limit: u32,
    /// Hot-key replicas: off, observe (count only) or enforce (`hot_keys.rs`) (off).
    pub dynamic_replication_mode: DynamicReplicationMode,
    /// Length of the window read heat is counted over (10 s).
    pub dynamic_replication_heat_window_sec: u32,
    /// Reads per second within a window that make a key hot (0.8).
    pub dynamic_replication_admission_qps_threshold: f64,
    /// Memory replicas a hot key gets at most (2).
    pub dynamic_replication_max_memory_replicas: u64,
}

/// Default of [`MasterServiceConfig::put_start_evict_budget`]: a census of this many objects
/// costs tens of microseconds, and holds the oldest of them.
pub const DEFAULT_PUT_START_EVICT_BUDGET: usize = 4096;

impl Default for MasterServiceConfig {
    fn default() -> Self {
        MasterServiceConfig {
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 1_800_000,
            max_kv_soft_pin_ttl_ms: 86_400_000,
            allow_evict_soft_pinned_objects: true,
            put_start_discard_timeout_sec: 30,
            put_start_release_timeout_sec: 600,
            allocation_strategy: AllocationStrategy::Random,
            enable_multi_tenants: false,
            client_live_ttl_sec: 10,
            eviction_ratio: 0.05,
            eviction_high_watermark_ratio: 0.90,
            put_start_evict_budget: DEFAULT_PUT_START_EVICT_BUDGET,
            enable_offload: false,
            offload_on_evict: false,
            offloading_queue_limit: 50_000,
            promotion_on_hit: false,
            promotion_admission_threshold: 2,
            promotion_queue_limit: 50_000,
            dynamic_replication_mode: DynamicReplicationMode::Off,
            dynamic_replication_heat_window_sec: 10,
            dynamic_replication_admission_qps_threshold: 0.8,
            dynamic_replication_max_memory_replicas: 2,
        }
    }
}

/// A setting the master refuses to start with.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error(
        "max_kv_soft_pin_ttl ({max_ms} ms) must be >= default_kv_soft_pin_ttl ({default_ms} ms)"
    )]
    SoftPinTtl { default_ms: u64, max_ms: u64 },
    #[error(
        "put_start_release_timeout_sec ({release_sec}) must exceed put_start_discard_timeout_sec ({discard_sec})"
    )]
    PutTimeouts { discard_sec: u64, release_sec: u64 },
    #[error("{name} must be in [0, 1], got {value}")]
    Ratio { name: &'static str, value: f64 },
    #[error("default_kv_lease_ttl must be > 0")]
    ZeroLease,
    #[error("dynamic_replication_heat_window_seconds must be > 0")]
    ZeroHeatWindow,
    #[error("dynamic_replication_admission_qps_threshold must be a positive number, got {0}")]
    HeatThreshold(f64),
}

impl MasterServiceConfig {
    /// Checks the cross-field rules upstream enforces at start-up.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_kv_soft_pin_ttl_ms < self.default_kv_soft_pin_ttl_ms {
            return Err(ConfigError::SoftPinTtl {
                default_ms: self.default_kv_soft_pin_ttl_ms,
                max_ms: self.max_kv_soft_pin_ttl_ms,
            });
        }
        if self.put_start_release_timeout_sec <= self.put_start_discard_timeout_sec {
            return Err(ConfigError::PutTimeouts {
                discard_sec: self.put_start_discard_timeout_sec,
                release_sec: self.put_start_release_timeout_sec,
            });
        }
        for (name, value) in [
            ("eviction_ratio", self.eviction_ratio),
            (
                "eviction_high_watermark_ratio",
                self.eviction_high_watermark_ratio,
            ),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::Ratio { name, value });
            }
        }
        if self.default_kv_lease_ttl_ms == 0 {
            return Err(ConfigError::ZeroLease);
        }
        if self.dynamic_replication_heat_window_sec == 0 {
            return Err(ConfigError::ZeroHeatWindow);
        }
        let qps = self.dynamic_replication_admission_qps_threshold;
        if !(qps.is_finite() && qps > 0.0) {
            return Err(ConfigError::HeatThreshold(qps));
        }
        Ok(())
    }

    pub(crate) fn discard_timeout_ms(&self) -> u64 {
        self.put_start_discard_timeout_sec.saturating_mul(1000)
    }

    pub(crate) fn release_timeout_ms(&self) -> u64 {
        self.put_start_release_timeout_sec.saturating_mul(1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_upstreams_and_valid() {
        let c = MasterServiceConfig::default();
        assert_eq!(c.default_kv_lease_ttl_ms, 10_000);
        assert_eq!(c.default_kv_soft_pin_ttl_ms, 1_800_000);
        assert_eq!(c.max_kv_soft_pin_ttl_ms, 86_400_000);
        assert_eq!(
            (
                c.put_start_discard_timeout_sec,
                c.put_start_release_timeout_sec
            ),
            (30, 600)
        );
        assert_eq!(c.allocation_strategy, AllocationStrategy::Random);
        assert!(!c.enable_multi_tenants);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn inconsistent_settings_are_refused() {
        let c = MasterServiceConfig {
            max_kv_soft_pin_ttl_ms: 1,
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::SoftPinTtl { .. })));
        let c = MasterServiceConfig {
            put_start_release_timeout_sec: 30,
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::PutTimeouts { .. })));
        let c = MasterServiceConfig {
            eviction_ratio: 1.5,
            ..Default::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::Ratio { .. })));
        let c = MasterServiceConfig {
            default_kv_lease_ttl_ms: 0,
            ..Default::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::ZeroLease));
    }
}
