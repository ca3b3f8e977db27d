//! Inline eviction: a PutStart that finds a full store evicts what it needs, oldest first, and
//! succeeds; it never takes leased, pinned or in-progress objects, and every eviction is
//! observed through the mutation seam (docs/master.md "Inline eviction").
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use mooncake_common::{
    ErrorCode, ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, SoftPinAction,
};
use mooncake_master::{MasterService, MasterServiceConfig, Mutation, MutationObserver};

/// Records every observed mutation.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Mutation>>);

impl MutationObserver for Recorder {
    fn observe(&self, m: &Mutation) {
        self.0.lock().unwrap().push(m.clone());
    }
}

/// A master with one segment of `bytes`, the watermark off (1.0) so that only inline eviction
/// can make room, observed by a recorder.
fn store(
    bytes: u64,
    config: MasterServiceConfig,
) -> (Arc<ManualClock>, MasterService, Arc<Recorder>) {
    let (clock, m) = master_with(MasterServiceConfig {
        eviction_high_watermark_ratio: 1.0,
        ..config
    });
    let log = Arc::new(Recorder::default());
    m.set_observer(log.clone()).unwrap();
    m.mount_segment(&seg(1, "a", bytes), C1).unwrap();
    (clock, m, log)
}

/// Whether `key` is in the index (without granting a lease, as ExistKey would).
fn exists(m: &MasterService, key: &str) -> bool {
    m.object_info(key, "").unwrap().is_some()
}

fn put_with(m: &MasterService, key: &str, size: u64, rc: &ReplicateConfig) {
    m.put_start(C1, key, size, rc, "").unwrap();
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
}

/// Replays the recorded mutations onto a fresh master: it must hold exactly `m`'s state.
fn assert_replays(m: &MasterService, log: &Recorder) {
    let (_, b) = master();
    for mu in log.0.lock().unwrap().iter() {
        b.apply(mu).unwrap();
    }
    assert_eq!(m.export_state(), b.export_state());
}

#[test]
fn a_full_store_evicts_the_oldest_inline_and_the_put_succeeds() {
    let (clock, m, log) = store(2000, MasterServiceConfig::default());
    for i in 0..20 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    // Read k0 and k1 long ago: their leases are over, but they are now the newest.
    clock.advance(1);
    m.get_replica_list("k0", "").unwrap();
    m.get_replica_list("k1", "").unwrap();
    clock.advance(LEASE_MS + 1);
    assert_eq!(m.memory_usage_bytes(), (2000, 2000));

    // One object's worth: exactly the oldest (k2) goes.
    m.put_start(C1, "new", 100, &cfg(1), "").unwrap();
    assert!(!exists(&m, "k2"), "the least recently accessed goes");
    let kept = (0..20).filter(|i| exists(&m, &format!("k{i}"))).count();
    assert_eq!(kept, 19, "only as many bytes as the request needs");
    assert!(exists(&m, "k0") && exists(&m, "k1"), "recently read stay");
    assert!(!m.need_eviction(), "a put that made room leaves no flag");
    let c = m.counters();
    assert_eq!(
        (
            c.inline_evictions(),
            c.inline_evicted_objects(),
            c.inline_evicted_bytes()
        ),
        (1, 1, 100)
    );

    // 250 bytes: the next three oldest (k3, k4, k5) go, nothing else.
    m.put_start(C1, "bigger", 250, &cfg(1), "").unwrap();
    for i in 3..6 {
        assert!(!exists(&m, &format!("k{i}")), "k{i}");
    }
    let kept = (0..20).filter(|i| exists(&m, &format!("k{i}"))).count();
    assert_eq!(kept, 16);
    assert_eq!(c.inline_evicted_objects(), 4);
    assert_accounting(&m);
    // Every eviction went through the seam: a replay holds the same state.
    assert_replays(&m, &log);
}

#[test]
fn inline_eviction_never_takes_leased_pinned_or_in_progress_objects() {
    let config = MasterServiceConfig {
        allow_evict_soft_pinned_objects: false,
        ..Default::default()
    };
    let (clock, m, log) = store(1000, config);
    let hard = ReplicateConfig {
        with_hard_pin: true,
        ..cfg(1)
    };
    let soft = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(3_600_000),
        ..cfg(1)
    };
    put_with(&m, "hard", 100, &hard);
    put_with(&m, "soft", 100, &soft);
    put(&m, C1, "leased", 100, 1);
    m.put_start(C1, "writing", 100, &cfg(1), "").unwrap();
    for i in 0..6 {
        clock.advance(1);
        put(&m, C1, &format!("p{i}"), 100, 1);
    }
    clock.advance(LEASE_MS + 1);
    m.get_replica_list("leased", "").unwrap();
    let protected = ["hard", "soft", "leased"];

    // The six plain objects go one by one, oldest first; then nothing is left to take.
    for i in 0..6 {
        clock.advance(1);
        m.put_start(C1, &format!("n{i}"), 100, &cfg(1), "").unwrap();
        assert!(!exists(&m, &format!("p{i}")), "p{i}");
    }
    // The new objects are in progress (PROCESSING): never taken either.
    assert_eq!(
        m.put_start(C1, "one-more", 100, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(
        m.need_eviction(),
        "a put that found nothing to take flags the cycle"
    );
    for k in protected {
        assert!(exists(&m, k), "{k} survives");
    }
    assert!(exists(&m, "writing"), "writing survives");
    for i in 0..6 {
        assert!(exists(&m, &format!("n{i}")));
    }
    assert_accounting(&m);
    assert_replays(&m, &log);
}

#[test]
fn a_value_no_segment_can_hold_evicts_nothing() {
    let (clock, m, _) = store(1000, MasterServiceConfig::default());
    for i in 0..10 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    assert_eq!(
        m.put_start(C1, "huge", 1001, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert_eq!(
        m.object_count(),
        10,
        "nothing evicted for a hopeless request"
    );
    assert_eq!(m.counters().inline_evictions(), 0);
    // Nor later by the background cycle: the request does not flag the store as needing
    // eviction (upstream's does, and its next cycle evicts cached objects for nothing).
    assert!(!m.need_eviction());
    m.run_eviction_once();
    assert_eq!(m.object_count(), 10);
    // Also with inline eviction off (the flag is all the background cycle has to go on).
    let config = MasterServiceConfig {
        put_start_evict_budget: 0,
        ..Default::default()
    };
    let (_, m, _) = store(1000, config);
    put(&m, C1, "cached", 100, 1);
    assert_eq!(
        m.put_start(C1, "huge", 1001, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(!m.need_eviction());
    m.run_eviction_once();
    assert!(exists(&m, "cached"));
}

#[test]
fn a_zero_budget_refuses_as_upstream() {
    let config = MasterServiceConfig {
        put_start_evict_budget: 0,
        ..Default::default()
    };
    let (clock, m, _) = store(1000, config);
    for i in 0..10 {
        clock.advance(1);
        put(&m, C1, &format!("k{i}"), 100, 1);
    }
    assert_eq!(
        m.put_start(C1, "new", 100, &cfg(1), ""),
        Err(ErrorCode::NO_AVAILABLE_HANDLE)
    );
    assert!(m.need_eviction());
    assert_eq!(m.object_count(), 10);
}

#[test]
fn a_churn_of_mixed_sizes_never_fails_while_idle_objects_remain() {
    // Many stores' worth of churn through a 4 MiB store, sizes 1 KiB..256 KiB, no background
    // cycle at all: every put must find room by evicting inline.
    let (clock, m, log) = store(4 << 20, MasterServiceConfig::default());
    let mut rng = fastrand::Rng::with_seed(test_seed());
    for i in 0..2000 {
        // A second per put: a read's lease (10 s) covers the next ten puts.
        clock.advance(1000);
        let size = 1024u64 << rng.u32(0..9);
        let key = format!("c{i}");
        put(&m, C1, &key, size + rng.u64(0..size), 1);
        if rng.u8(..) < 16 {
            m.get_replica_list(&format!("c{}", rng.usize(0..=i)), "")
                .ok();
        }
    }
    assert!(m.counters().inline_evicted_objects() > 0);
    assert_accounting(&m);
    assert_replays(&m, &log);
}
