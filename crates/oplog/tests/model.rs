//! The standby's state equals a from-scratch fold of the log: a seeded workload runs on a
//! master whose op-log sink numbers every mutation; the entries are cut into batches at random
//! boundaries, some batches delivered twice and some re-cut so they overlap what was applied,
//! and a replayer applies them to an empty master. At checkpoints and at the end the standby's
//! export equals the leader's. A gap or a damaged batch halts the replayer, which then refuses
//! everything after.
//!
//! Seeds: `MC_TEST_SEED` replays a failing run (its seed is printed on failure).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_master::Mutation;
use mooncake_oplog::{batch, Batch, OpLogError, Replayer};

/// Drains the sink into decoded mutations with their sequence numbers.
fn drain(w: &Workload, log: &mut Vec<Mutation>) {
    while let Some(t) = w.sink.take(std::time::Duration::ZERO) {
        assert_eq!(
            t.first_seq,
            log.len() as u64 + 1,
            "sequence numbers have a gap"
        );
        let bytes = batch::seal(0, 1, t.first_seq, t.count, &t.entries);
        log.extend(batch::decode(&bytes).unwrap().mutations);
    }
}

fn batch_of(log: &[Mutation], from_seq: u64, to_seq: u64) -> Batch {
    Batch {
        batch_id: 0,
        view: 1,
        first_seq: from_seq,
        mutations: log[(from_seq - 1) as usize..to_seq as usize].to_vec(),
    }
}

fn run(seed: u64) {
    let mut w = Workload::new(seed);
    let standby = empty_master();
    let mut replayer = Replayer::new(&standby, 0);
    let mut log = Vec::new();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    for round in 0..40 {
        for _ in 0..rng.usize(1..40) {
            w.step();
        }
        drain(&w, &mut log);
        // Deliver what is not applied yet in random batches, through the byte format.
        while replayer.applied_seq() < log.len() as u64 {
            let from = replayer.applied_seq() + 1;
            let to = (from + rng.u64(0..12)).min(log.len() as u64);
            // Sometimes start earlier: an overlap with what was applied.
            let start = if rng.u8(..4) == 0 {
                rng.u64(1..=from)
            } else {
                from
            };
            let bytes = batch::encode(&batch_of(&log, start, to));
            replayer.apply_bytes(&bytes).unwrap();
            if rng.u8(..3) == 0 {
                assert_eq!(
                    replayer.apply_bytes(&bytes).unwrap(),
                    0,
                    "a duplicate applied"
                );
            }
        }
        if round % 5 == 4 {
            assert_eq!(
                standby.export_state(),
                w.master.export_state(),
                "seed {seed}"
            );
        }
    }
    assert_eq!(w.sink.assigned_seq(), log.len() as u64);
    assert!(
        log.len() > 200,
        "the workload made only {} mutations",
        log.len()
    );
    assert_eq!(
        standby.export_state(),
        w.master.export_state(),
        "seed {seed}"
    );
    // The fold from scratch in one batch gives the same state.
    let fresh = empty_master();
    let mut r = Replayer::new(&fresh, 0);
    r.apply(&batch_of(&log, 1, log.len() as u64)).unwrap();
    assert_eq!(fresh.export_state(), w.master.export_state(), "seed {seed}");
}

#[test]
fn standby_equals_the_fold_with_random_boundaries_and_duplicates() {
    for _ in 0..8 {
        let seed = test_seed();
        let result = std::panic::catch_unwind(|| run(seed));
        if result.is_err() {
            panic!("failed with MC_TEST_SEED={seed}");
        }
    }
}

#[test]
fn a_gap_halts_replay_for_good() {
    let mut w = Workload::new(7);
    for _ in 0..200 {
        w.step();
    }
    let mut log = Vec::new();
    drain(&w, &mut log);
    assert!(log.len() > 20);
    let standby = empty_master();
    let mut r = Replayer::new(&standby, 0);
    r.apply(&batch_of(&log, 1, 10)).unwrap();
    let err = r.apply(&batch_of(&log, 12, 20)).unwrap_err();
    assert_eq!(
        err,
        OpLogError::Gap {
            expected: 11,
            found: 12
        }
    );
    assert_eq!(r.applied_seq(), 10);
    // The missing batch does not un-halt it.
    assert!(matches!(
        r.apply(&batch_of(&log, 11, 20)),
        Err(OpLogError::Halted(_))
    ));
    assert_eq!(r.applied_seq(), 10);
    assert!(r.halted().is_some());
}

#[test]
fn a_damaged_batch_halts_replay() {
    let mut w = Workload::new(11);
    for _ in 0..100 {
        w.step();
    }
    let mut log = Vec::new();
    drain(&w, &mut log);
    let standby = empty_master();
    let mut r = Replayer::new(&standby, 0);
    let mut bytes = batch::encode(&batch_of(&log, 1, log.len() as u64));
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    let err = r.apply_bytes(&bytes).unwrap_err();
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
    assert_eq!(r.applied_seq(), 0);
    let good = batch::encode(&batch_of(&log, 1, log.len() as u64));
    assert!(matches!(r.apply_bytes(&good), Err(OpLogError::Halted(_))));
    assert_eq!(standby.export_state(), empty_master().export_state());
}
