//! `ReplicateConfig`: how many replicas a put asks for, where, and how they are pinned.

use serde::{Deserialize, Serialize};

use crate::numbered::numbered_enum;

numbered_enum!(
    /// What a put does to the object's soft pin (upstream numbers).
    #[derive(Default)]
    SoftPinAction: u8 (U8) {
        /// Keep whatever deadline the object has (none for a new object). A TTL with PRESERVE is
        /// `INVALID_PARAMS`.
        #[default]
        Preserve = 0 => "PRESERVE",
        /// Pin for `soft_pin_ttl_ms`, or the master's `default_kv_soft_pin_ttl` when absent.
        Enable = 1 => "ENABLE",
        /// Clear the pin. A TTL with DISABLE is `INVALID_PARAMS`.
        Disable = 2 => "DISABLE",
    }
);

impl SoftPinAction {
    pub const fn as_u8(self) -> u8 {
        self.as_number()
    }

    pub const fn from_u8(value: u8) -> Option<Self> {
        Self::from_number(value)
    }
}

/// Upstream's informational data-type tag (`UNKNOWN = 0` … `GENERAL = 9`). The master stores it
/// and never interprets it.
pub type DataType = u8;

/// `DataType` value for "unknown" (the default).
pub const DATA_TYPE_UNKNOWN: DataType = 0;

/// How a put wants its object replicated and pinned. Every field and default is upstream's
/// (as upstream's master).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplicateConfig {
    /// Number of MEMORY replicas (default 1). Best effort: a put succeeds with at least one.
    pub replica_num: usize,
    /// Number of NoF-SSD replicas (default 0).
    pub nof_replica_num: usize,
    /// Number of DFS replicas (default 0, at most 1, only with `replica_num > 0`).
    pub dfs_replica_num: usize,
    /// Soft-pin request (default PRESERVE).
    pub soft_pin_action: SoftPinAction,
    /// Soft-pin TTL; only allowed with ENABLE, at most the master's `max_kv_soft_pin_ttl`.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evict this object (default false). Fixed at creation.
    pub with_hard_pin: bool,
    /// Segment names to place replicas on first, in order.
    pub preferred_segments: Vec<String>,
    /// Deprecated single preferred name; when non-empty it is used *instead of* the list.
    pub preferred_segment: String,
    /// Preferred NoF segment names.
    pub preferred_nof_segments: Vec<String>,
    /// Prefer segments on the writer's host (default false).
    pub prefer_alloc_in_same_node: bool,
    /// Informational data-type tag (default 0 = UNKNOWN).
    pub data_type: DataType,
    /// The writer's host id, used by `local_first` placement (default empty = use the client's).
    pub host_id: String,
    /// Group per key (one entry per key in batches; `""` = ungrouped). `None` = no groups.
    pub group_ids: Option<Vec<String>>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            preferred_nof_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
            data_type: DATA_TYPE_UNKNOWN,
            host_id: String::new(),
            group_ids: None,
        }
    }
}

impl ReplicateConfig {
    /// A config asking for `replica_num` memory replicas, everything else default.
    pub fn with_replicas(replica_num: usize) -> Self {
        ReplicateConfig {
            replica_num,
            ..ReplicateConfig::default()
        }
    }

    /// The preferred memory-segment names in effect: the deprecated single name when it is
    /// non-empty, else the list.
    pub fn effective_preferred_segments(&self) -> &[String] {
        if self.preferred_segment.is_empty() {
            &self.preferred_segments
        } else {
            std::slice::from_ref(&self.preferred_segment)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_upstreams() {
        let c = ReplicateConfig::default();
        assert_eq!(c.replica_num, 1);
        assert_eq!(c.nof_replica_num, 0);
        assert_eq!(c.dfs_replica_num, 0);
        assert_eq!(c.soft_pin_action, SoftPinAction::Preserve);
        assert_eq!(c.soft_pin_ttl_ms, None);
        assert!(!c.with_hard_pin && !c.prefer_alloc_in_same_node);
        assert!(c.preferred_segments.is_empty() && c.preferred_segment.is_empty());
        assert_eq!(c.data_type, 0);
        assert_eq!(c.group_ids, None);
    }

    #[test]
    fn single_preferred_segment_overrides_the_list() {
        let mut c = ReplicateConfig {
            preferred_segments: vec!["a".into(), "b".into()],
            ..ReplicateConfig::default()
        };
        assert_eq!(c.effective_preferred_segments(), ["a", "b"]);
        c.preferred_segment = "z".into();
        assert_eq!(c.effective_preferred_segments(), ["z"]);
    }

    #[test]
    fn soft_pin_action_numbers() {
        for a in [
            SoftPinAction::Preserve,
            SoftPinAction::Enable,
            SoftPinAction::Disable,
        ] {
            assert_eq!(SoftPinAction::from_u8(a.as_u8()), Some(a));
        }
        assert_eq!(SoftPinAction::Enable.as_u8(), 1);
        assert_eq!(SoftPinAction::from_u8(3), None);
    }

    #[test]
    fn config_round_trips_and_missing_fields_take_defaults() {
        let c = ReplicateConfig {
            replica_num: 3,
            soft_pin_action: SoftPinAction::Enable,
            soft_pin_ttl_ms: Some(5),
            group_ids: Some(vec!["g".into()]),
            ..ReplicateConfig::default()
        };
        let text = serde_json::to_string(&c).unwrap_or_default();
        assert_eq!(serde_json::from_str::<ReplicateConfig>(&text).ok(), Some(c));
        let partial: Option<ReplicateConfig> =
            serde_json::from_str(r#"{"with_hard_pin": true}"#).ok();
        assert_eq!(
            partial,
            Some(ReplicateConfig {
                with_hard_pin: true,
                ..ReplicateConfig::default()
            })
        );
    }
}
