//! Read pins: a read our client completes holds the object only while it runs (released after),
//! with the lease TTL as the backstop; descriptor readers keep the full lease; Remove keeps
//! upstream's contract (docs/master.md "Read pins").
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use mooncake_common::{ErrorCode, ManualClock};
use mooncake_master::{MasterService, MasterServiceConfig};

/// Whether `key` is in the index (without granting a lease).
fn exists(m: &MasterService, key: &str) -> bool {
    m.object_info(key, "").unwrap().is_some()
}

/// A 1000-byte store holding k0..k9 (100 bytes each, k0 oldest), the watermark off so that only
/// the PutStarts' inline eviction makes room.
fn full() -> (Arc<ManualClock>, MasterService) {
    let (clock, m) = master_with(MasterServiceConfig {
        eviction_high_watermark_ratio: 1.0,
        ..Default::default()
    });
    m.mount_segment(&seg(1, "a", 1000), C1).unwrap();
    for i in 0..10 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    (clock, m)
}

fn release(m: &MasterService, key: &str) {
    assert_eq!(m.release_reads(&[key.to_string()], ""), 1);
}

/// Puts `n` new 100-byte objects (each evicting the oldest idle one).
fn churn(clock: &ManualClock, m: &MasterService, tag: &str, n: usize) {
    for i in 0..n {
        clock.advance(1);
        put(m, C1, &format!("{tag}{i}"), 100, 1);
    }
}

#[test]
fn a_block_being_read_is_never_evicted_mid_read() {
    let (clock, m) = full();
    // Two readers of k0 (the oldest) start; the store then turns over twice.
    m.get_replica_list_pinned("k0", "").unwrap();
    let batch = m.batch_get_replica_list_pinned(&keys(&["k0"]), "");
    assert!(batch[0].is_ok());
    churn(&clock, &m, "a", 20);
    assert!(exists(&m, "k0"), "k0 is read: never evicted");
    assert!((1..10).all(|i| !exists(&m, &format!("k{i}"))));
    // One reader done: still held by the other.
    release(&m, "k0");
    churn(&clock, &m, "b", 20);
    assert!(exists(&m, "k0"), "one read still runs");
    // Both done: k0 is an ordinary object again, evicted in its turn (well before any lease
    // would have run out).
    release(&m, "k0");
    assert!(m.now_ms() < T0_MS + LEASE_MS);
    churn(&clock, &m, "c", 10);
    assert!(!exists(&m, "k0"), "released: evictable at once");
    assert_accounting(&m);
}

#[test]
fn an_unreleased_pin_lapses_after_the_lease_ttl() {
    let (clock, m) = full();
    m.get_replica_list_pinned("k0", "").unwrap();
    // Within the TTL: held.
    clock.advance(LEASE_MS - 100);
    churn(&clock, &m, "a", 12);
    assert!(exists(&m, "k0"));
    // One and a half TTLs after the pin: the reader is presumed dead.
    clock.advance(LEASE_MS / 2 + 100);
    churn(&clock, &m, "b", 10);
    assert!(!exists(&m, "k0"), "the backstop ran out");
    // A release arriving after that is harmless.
    assert_eq!(m.release_reads(&keys(&["k0", "missing"]), ""), 0);
    assert_accounting(&m);
}

#[test]
fn descriptor_readers_keep_the_full_lease() {
    let (clock, m) = full();
    m.get_replica_list("k0", "").unwrap(); // a descriptor reader (get_replica_desc)
    m.get_replica_list_pinned("k0", "").unwrap();
    release(&m, "k0");
    churn(&clock, &m, "a", 12);
    assert!(exists(&m, "k0"), "the descriptor reader's lease still runs");
    clock.advance(LEASE_MS);
    churn(&clock, &m, "b", 10);
    assert!(!exists(&m, "k0"));
}

#[test]
fn remove_is_refused_while_a_read_runs_and_force_overrides() {
    let (_, m) = full();
    m.get_replica_list_pinned("k1", "").unwrap();
    assert_eq!(m.remove("k1", false, ""), Err(ErrorCode::OBJECT_HAS_LEASE));
    release(&m, "k1");
    assert_eq!(
        m.remove("k1", false, ""),
        Ok(()),
        "a finished read holds nothing"
    );
    m.get_replica_list_pinned("k2", "").unwrap();
    assert_eq!(m.remove("k2", true, ""), Ok(()), "force overrides");
    // A full lease (GetReplicaList) keeps refusing after the read, as upstream.
    m.get_replica_list("k3", "").unwrap();
    assert_eq!(m.remove("k3", false, ""), Err(ErrorCode::OBJECT_HAS_LEASE));
}
