//! Bad input gets upstream's error code and changes nothing: empty key, zero size, zero
//! replicas, bad soft pins, unknown segments, the wrong writer, batch length mismatches, invalid
//! regexes and invalid tenants.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{
    ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, SegmentId, SoftPinAction,
};
use mooncake_master::{MasterService, MAX_KEY_LEN_BYTES};

/// Snapshot of everything a bad call must not change.
fn state(m: &MasterService) -> (usize, Vec<Option<u64>>, Vec<String>) {
    (
        m.object_count(),
        m.segment_usage().iter().map(|u| u.used_bytes).collect(),
        m.get_all_keys("").unwrap(),
    )
}

fn setup() -> MasterService {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    put(&m, C1, "existing", 100, 1);
    m.put_start(C1, "inflight", 100, &cfg(1), "").unwrap();
    m
}

#[test]
fn bad_put_start_arguments_are_refused_without_change() {
    let m = setup();
    let before = state(&m);
    let long_key = "k".repeat(MAX_KEY_LEN_BYTES + 1);
    let cases: Vec<(&str, &str, u64, ReplicateConfig, ErrorCode)> = vec![
        ("empty key", "", 10, cfg(1), ErrorCode::INVALID_PARAMS),
        (
            "oversized key",
            &long_key,
            10,
            cfg(1),
            ErrorCode::INVALID_PARAMS,
        ),
        ("zero size", "k", 0, cfg(1), ErrorCode::INVALID_PARAMS),
        ("replica_num 0", "k", 10, cfg(0), ErrorCode::INVALID_PARAMS),
        (
            "soft-pin TTL over the max",
            "k",
            10,
            ReplicateConfig {
                soft_pin_action: SoftPinAction::Enable,
                soft_pin_ttl_ms: Some(86_400_001),
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "TTL with PRESERVE",
            "k",
            10,
            ReplicateConfig {
                soft_pin_ttl_ms: Some(1),
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "TTL with DISABLE",
            "k",
            10,
            ReplicateConfig {
                soft_pin_action: SoftPinAction::Disable,
                soft_pin_ttl_ms: Some(1),
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "NoF without support",
            "k",
            10,
            ReplicateConfig {
                nof_replica_num: 1,
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "two DFS replicas",
            "k",
            10,
            ReplicateConfig {
                dfs_replica_num: 2,
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "DFS without memory",
            "k",
            10,
            ReplicateConfig {
                dfs_replica_num: 1,
                ..cfg(0)
            },
            ErrorCode::INVALID_PARAMS,
        ),
        (
            "DFS not initialized",
            "k",
            10,
            ReplicateConfig {
                dfs_replica_num: 1,
                ..cfg(1)
            },
            ErrorCode::DFS_SERVICE_UNAVAILABLE,
        ),
        (
            "two group ids for one key",
            "k",
            10,
            ReplicateConfig {
                group_ids: Some(vec!["a".into(), "b".into()]),
                ..cfg(1)
            },
            ErrorCode::INVALID_PARAMS,
        ),
    ];
    for (what, key, size, config, code) in cases {
        assert_eq!(m.put_start(C1, key, size, &config, ""), Err(code), "{what}");
        assert_eq!(state(&m), before, "{what} changed state");
    }
    // The empty key is not readable either, and reads of it change nothing.
    assert_eq!(m.get_replica_list("", ""), Err(ErrorCode::OBJECT_NOT_FOUND));
    assert_eq!(m.exist_key("", ""), Ok(false));
    assert_eq!(m.remove("", false, ""), Err(ErrorCode::OBJECT_NOT_FOUND));
    assert_accounting(&m);
}

#[test]
fn wrong_writer_changes_nothing() {
    let m = setup();
    let before = state(&m);
    assert_eq!(
        m.put_end(C2, &ObjectMeta::new("inflight"), ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_eq!(
        m.put_revoke(C2, "inflight", ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_eq!(
        m.put_revoke(C2, "existing", ReplicaType::ALL, ""),
        Err(ErrorCode::ILLEGAL_CLIENT)
    );
    assert_eq!(state(&m), before);
    assert!(m.object_info("inflight", "").unwrap().unwrap().processing);
}

#[test]
fn unknown_segments_are_segment_not_found_or_ignored() {
    let m = setup();
    let before = state(&m);
    assert_eq!(
        m.query_segment_status("nope"),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(
        m.query_segment_status_by_id(SegmentId::new(7, 7)),
        Err(ErrorCode::SEGMENT_NOT_FOUND)
    );
    assert_eq!(
        m.graceful_unmount_segment(SegmentId::new(7, 7), C1, 1),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(m.unmount_segment(SegmentId::new(7, 7), C1), Ok(()));
    // An unknown preferred name is skipped, not an error.
    let prefs = ReplicateConfig {
        preferred_segment: "nope".into(),
        ..cfg(1)
    };
    assert!(m.put_start(C1, "p", 1, &prefs, "").is_ok());
    m.put_revoke(C1, "p", ReplicaType::ALL, "").unwrap();
    // A replica clear naming an unknown segment clears nothing.
    assert!(m
        .batch_replica_clear(&keys(&["existing"]), C1, "nope", "")
        .is_empty());
    assert_eq!(state(&m), before);
}

#[test]
fn batch_length_mismatch_and_invalid_regex_change_nothing() {
    let m = setup();
    let before = state(&m);
    let r = m.batch_put_start(C1, &keys(&["x", "y"]), &[1], &cfg(1), "");
    assert_eq!(r, vec![Err(ErrorCode::INVALID_PARAMS); 2]);
    assert_eq!(
        m.get_replica_list_by_regex("(", ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(
        m.remove_by_regex("*", true, ""),
        Err(ErrorCode::INVALID_PARAMS)
    );
    assert_eq!(state(&m), before);
}

#[test]
fn invalid_tenant_is_invalid_params_when_multi_tenancy_is_on() {
    let (_, m) = mt_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    put(&m, C1, "k", 10, 1);
    let before = state(&m);
    for bad in ["_system", "ctl\u{1}", "del\u{7f}"] {
        assert_eq!(
            m.put_start(C1, "k", 10, &cfg(1), bad),
            Err(ErrorCode::INVALID_PARAMS),
            "{bad:?}"
        );
        assert_eq!(m.get_replica_list("k", bad), Err(ErrorCode::INVALID_PARAMS));
        assert_eq!(m.exist_key("k", bad), Err(ErrorCode::INVALID_PARAMS));
        assert_eq!(
            m.batch_get_replica_list(&keys(&["k", "j"]), bad),
            vec![Err(ErrorCode::INVALID_PARAMS); 2]
        );
        assert_eq!(
            m.batch_exist_key(&keys(&["k"]), bad),
            vec![Err(ErrorCode::INVALID_PARAMS)]
        );
        assert_eq!(m.remove("k", true, bad), Err(ErrorCode::INVALID_PARAMS));
        assert_eq!(
            m.batch_put_start(C1, &keys(&["z"]), &[1], &cfg(1), bad),
            vec![Err(ErrorCode::INVALID_PARAMS)]
        );
        assert_eq!(m.remove_all(true, bad), 0);
        assert_eq!(m.get_all_keys(bad), Err(ErrorCode::INVALID_PARAMS));
    }
    assert_eq!(state(&m), before);
}

#[test]
fn tenants_are_separate_namespaces_when_multi_tenancy_is_on() {
    let (_, m) = mt_master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    for t in ["", "t1", "t2"] {
        m.put_start(C1, "k", 10, &cfg(1), t).unwrap();
        m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, t)
            .unwrap();
    }
    assert_eq!(
        m.object_count(),
        3,
        "same key in three tenants = three objects"
    );
    assert_eq!(
        m.put_start(C1, "k", 10, &cfg(1), "t1"),
        Err(ErrorCode::OBJECT_ALREADY_EXISTS)
    );
    assert!(
        m.get_replica_list("k", "default").is_ok(),
        "\"\" and \"default\" are one tenant"
    );
    m.remove("k", false, "t1").unwrap();
    assert_eq!(
        m.get_replica_list("k", "t1"),
        Err(ErrorCode::OBJECT_NOT_FOUND)
    );
    assert!(m.get_replica_list("k", "t2").is_ok());
    assert_eq!(m.get_all_keys("t2").unwrap(), vec!["k".to_string()]);
    assert!(m.get_all_keys("t1").unwrap().is_empty());
    assert_eq!(m.remove_all(true, "t2"), 1, "one tenant");
    put(&m, C1, "other", 10, 1);
    assert_eq!(
        m.put_start(C1, "x", 10, &cfg(1), "t3"),
        Err(ErrorCode::TENANT_NOT_REGISTERED),
        "writes need a registered tenant"
    );
    m.put_start(C1, "x", 10, &cfg(1), "b").unwrap();
    m.put_end(C1, &ObjectMeta::new("x"), ReplicaType::ALL, "b")
        .unwrap();
    assert_eq!(m.remove_all(true, ""), 3, "empty tenant clears all tenants");
    assert_eq!(m.object_count(), 0);
    assert_eq!(used(&m, 1), Some(0));
}

#[test]
fn with_multi_tenancy_off_every_tenant_is_default() {
    let (_, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    m.put_start(C1, "k", 10, &cfg(1), "_anything").unwrap();
    m.put_end(C1, &ObjectMeta::new("k"), ReplicaType::ALL, "t9")
        .unwrap();
    assert!(m.get_replica_list("k", "").is_ok());
    assert_eq!(m.object_count(), 1);
}
