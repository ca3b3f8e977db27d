//! The counters and the object census the server exports on `/metrics`: put discards and
//! releases, discarded bytes waiting for release, soft-pinned and in-memory objects.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ObjectMeta, ReplicaType, ReplicateConfig, SoftPinAction};

#[test]
fn census_counts_soft_pinned_and_in_memory_objects() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    put(&m, C1, "plain", 4096, 1);
    let pinned = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(60_000),
        ..cfg(1)
    };
    m.put_start(C1, "pinned", 4096, &pinned, "").unwrap();
    m.put_end(C1, &ObjectMeta::new("pinned"), ReplicaType::ALL, "")
        .unwrap();
    m.put_start(C1, "unfinished", 4096, &cfg(1), "").unwrap();
    let census = m.object_census();
    assert_eq!(census.objects, 3);
    assert_eq!(census.in_memory, 2, "the unfinished put is not readable");
    assert_eq!(census.soft_pinned, 1);
    clock.advance(60_001);
    assert_eq!(m.object_census().soft_pinned, 0, "the pin expired");
}

#[test]
fn a_preempted_put_is_counted_as_discarded_then_released() {
    let (clock, m) = master();
    m.mount_segment(&seg(1, "a", 1 << 20), C1).unwrap();
    let first = m.put_start(C1, "k", 8192, &cfg(1), "").unwrap();
    let staged = first[0].memory().unwrap().size;
    assert_eq!(m.counters().put_start_discards(), 0);
    // After put_start_discard_timeout_sec (30 s) a new PutStart pre-empts the unfinished one;
    // its buffer waits in the discarded list until put_start_release_timeout_sec (600 s).
    clock.advance(30_001);
    m.put_start(C2, "k", 8192, &cfg(1), "").unwrap();
    assert_eq!(m.counters().put_start_discards(), 1);
    assert_eq!(m.counters().put_start_releases(), 0);
    assert_eq!(m.object_census().discarded_staging_bytes, staged);
    m.run_put_timeouts_once();
    assert_eq!(m.counters().put_start_releases(), 0, "not due yet");
    clock.advance(600_000);
    m.put_end(C2, &ObjectMeta::new("k"), ReplicaType::ALL, "")
        .unwrap();
    m.run_put_timeouts_once();
    assert_eq!(m.counters().put_start_releases(), 1);
    assert_eq!(m.object_census().discarded_staging_bytes, 0);
    assert_accounting(&m);
}
