//! Restore of a large state (`cargo bench -p mooncake-master --bench restore`).
//!
//! Builds `RESTORE_BENCH_OBJECTS` objects (default 1,000,000) with
//! [`mooncake_master::bench_support::filled_master`] (the setup of `mooncake bench snapshot`:
//! 16-byte keys, one 4 KiB memory replica each, with a checksum, 16 segments), exports the state,
//! and times `MasterService::restore` into an empty master (median of `RESTORE_BENCH_ROUNDS`,
//! default 3), then the verification of every replica (pages of 4096, all confirmed).

use std::sync::Arc;
use std::time::Instant;

use mooncake_common::{ReplicaId, SystemClock};
use mooncake_master::bench_support::{filled_master, CLIENT, SEGMENTS};
use mooncake_master::{MasterService, RestoreOptions, MAX_UNVERIFIED_PAGE};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let objects = env_usize("RESTORE_BENCH_OBJECTS", 1_000_000);
    let rounds = env_usize("RESTORE_BENCH_ROUNDS", 3).max(1);
    let (source, segments) = filled_master(objects).expect("fill");
    let started = Instant::now();
    let state = source.export_state();
    let export_s = started.elapsed().as_secs_f64();
    drop(source);

    let mut times = Vec::new();
    let mut verify_s = 0.0;
    for round in 0..rounds {
        let target = MasterService::new(Default::default(), Arc::new(SystemClock::new()))
            .expect("default config is valid");
        let input = state.clone();
        let started = Instant::now();
        let report = target
            .restore(input, RestoreOptions::default())
            .expect("restore");
        times.push(started.elapsed().as_secs_f64());
        assert_eq!(report.objects, objects);
        if round == 0 {
            let started = Instant::now();
            target.remount_segments(&segments, CLIENT).expect("remount");
            for s in &segments {
                let mut after = ReplicaId(0);
                loop {
                    let page = target
                        .get_unverified_replicas(CLIENT, s.id, after, MAX_UNVERIFIED_PAGE)
                        .expect("page");
                    let Some(last) = page.last() else { break };
                    after = last.id;
                    let ids: Vec<ReplicaId> = page.iter().map(|r| r.id).collect();
                    target
                        .confirm_replicas(CLIENT, s.id, &ids, &[])
                        .expect("confirm");
                }
            }
            verify_s = started.elapsed().as_secs_f64();
            assert_eq!(target.verification_stats().verified, objects as u64);
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!("objects: {objects} (16-byte keys, 1 replica, {SEGMENTS} segments)");
    println!("export_state: {export_s:.3} s");
    println!(
        "restore: median {median:.3} s of {rounds} ({:.0} objects/s)",
        objects as f64 / median
    );
    println!("verify every replica (master side: pages + confirms): {verify_s:.3} s");
}
