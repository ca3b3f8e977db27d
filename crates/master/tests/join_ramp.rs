//! A segment that joins empty is not flooded: with `free_ratio_first` placement, a new empty
//! segment (the freest by far) would take every write until it filled to the others' level.
//! Its share ramps up from its fair share over `JOIN_RAMP_MS` instead. Shares of bytes, measured on a manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use mooncake_common::{ObjectMeta, ReplicaType};
use mooncake_master::strategy::{AllocationStrategy, JOIN_RAMP_MS};
use mooncake_master::{MasterService, MasterServiceConfig};

const SEG: u64 = 8 << 20;
const OBJ: u64 = 4 << 10;

fn put(m: &MasterService, key: &str) -> String {
    let replicas = m.put_start(C1, key, OBJ, &cfg(1), "").unwrap();
    m.put_end(C1, &ObjectMeta::new(key), ReplicaType::ALL, "")
        .unwrap();
    replicas[0].memory().unwrap().transport_endpoint.to_string()
}

/// Puts `n` objects; returns how many landed on endpoint `ep`.
fn share(m: &MasterService, prefix: &str, n: usize, ep: &str) -> usize {
    (0..n)
        .filter(|i| put(m, &format!("{prefix}/{i}")) == ep)
        .count()
}

#[test]
fn a_segment_that_joins_empty_gets_a_ramped_share() {
    let (clock, m) = master_with(MasterServiceConfig {
        allocation_strategy: AllocationStrategy::FreeRatioFirst,
        ..MasterServiceConfig::default()
    });
    m.mount_segment(&seg(1, "a", SEG), C1).unwrap();
    m.mount_segment(&seg(2, "b", SEG), C1).unwrap();
    // Fill a and b to about 90% (their ramps are long over).
    clock.advance(JOIN_RAMP_MS);
    let fill = (SEG * 2 * 9 / 10 / OBJ) as usize;
    share(&m, "fill", fill, "");
    m.mount_segment(&seg(3, "c", SEG), C1).unwrap();
    // Right after the join c takes part in a free-ratio pass with probability 1/3 (its fair
    // share): about a third of the writes, not all of them.
    let n = 300;
    let on_c = share(&m, "early", n, "ep-c");
    assert!(
        on_c * 2 <= n,
        "the new segment took {on_c} of {n} writes right after it joined"
    );
    assert!(on_c > 0, "the new segment got nothing");
    // After the ramp it is scored by its free ratio alone: it is the freest, so it takes them.
    clock.advance(JOIN_RAMP_MS);
    let on_c = share(&m, "late", 100, "ep-c");
    assert_eq!(
        on_c, 100,
        "after the ramp the freest segment takes the writes"
    );
}
