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

/// A pinned existence check holds its hits until the caller's next lookup releases them (not
/// the 10 s lease): eviction cannot take them meanwhile, takes them in their turn after, and a
/// check that is never released lapses with the lease TTL as the backstop.
#[test]
fn a_pinned_existence_check_holds_its_hits_until_released() {
    let (clock, m) = full();
    assert_eq!(m.exist_key_pinned("k0", ""), Ok(true));
    let batch = m.batch_exist_key_pinned(&keys(&["k1", "missing", "k1"]), "");
    assert_eq!(batch, vec![Ok(true), Ok(false), Ok(true)]);
    assert_eq!(m.exist_key_pinned("missing", ""), Ok(false));
    churn(&clock, &m, "a", 12);
    assert!(
        exists(&m, "k0") && exists(&m, "k1"),
        "checked: held for the load"
    );
    assert_eq!(m.remove("k0", false, ""), Err(ErrorCode::OBJECT_HAS_LEASE));
    // The next lookup's release list frees them (k1 was found twice: two pins).
    assert_eq!(m.release_reads(&keys(&["k0", "k1", "k1"]), ""), 3);
    assert!(m.now_ms() < T0_MS + LEASE_MS);
    churn(&clock, &m, "b", 10);
    assert!(
        !exists(&m, "k0") && !exists(&m, "k1"),
        "released: evicted at once"
    );
    // Never released: held within the TTL, gone after the backstop.
    let (clock, m) = full();
    assert_eq!(m.batch_exist_key_pinned(&keys(&["k0"]), ""), vec![Ok(true)]);
    clock.advance(LEASE_MS - 100);
    churn(&clock, &m, "a", 12);
    assert!(exists(&m, "k0"), "within the TTL");
    clock.advance(LEASE_MS / 2 + 100);
    churn(&clock, &m, "b", 10);
    assert!(!exists(&m, "k0"), "the backstop ran out");
    assert_accounting(&m);
}

/// Upstream's ExistKey (what a foreign client sends) keeps the full read lease.
#[test]
fn a_plain_existence_check_keeps_the_lease() {
    let (clock, m) = full();
    assert_eq!(m.exist_key("k0", ""), Ok(true));
    assert_eq!(m.batch_exist_key(&keys(&["k1"]), ""), vec![Ok(true)]);
    assert_eq!(
        m.release_reads(&keys(&["k0", "k1"]), ""),
        2,
        "no pin to release"
    );
    churn(&clock, &m, "a", 12);
    assert!(exists(&m, "k0") && exists(&m, "k1"), "leased");
    assert_eq!(m.remove("k1", false, ""), Err(ErrorCode::OBJECT_HAS_LEASE));
    clock.advance(LEASE_MS);
    churn(&clock, &m, "b", 10);
    assert!(!exists(&m, "k0") && !exists(&m, "k1"));
}

/// Checks and reads of a missing object or with a bad tenant answer as upstream's ExistKey.
#[test]
fn pinned_existence_checks_answer_as_exist_key() {
    let (_, m) = full();
    let bad = "no such tenant \u{0}";
    assert_eq!(m.exist_key_pinned("k0", bad), m.exist_key("k0", bad));
    assert_eq!(
        m.batch_exist_key_pinned(&keys(&["k0", "x"]), bad),
        m.batch_exist_key(&keys(&["k0", "x"]), bad)
    );
    assert!(m.batch_exist_key_pinned(&[], "").is_empty());
}
