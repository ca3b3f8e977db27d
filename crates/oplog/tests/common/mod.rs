//! A seeded random workload on a master whose mutations an [`OpLogSink`] numbers.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use mooncake_common::{
    ClientId, ManualClock, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId,
};
use mooncake_master::{MasterService, MasterServiceConfig};
use mooncake_oplog::OpLogSink;

pub const T0_MS: u64 = 1_000_000;
pub const C1: ClientId = ClientId::new(1, 1);
pub const C2: ClientId = ClientId::new(2, 2);
const SEG_BYTES: u64 = 64 * 1024;

pub fn test_seed() -> u64 {
    std::env::var("MC_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

pub fn empty_master() -> MasterService {
    MasterService::with_seed(
        MasterServiceConfig::default(),
        Arc::new(ManualClock::new(T0_MS)),
        0,
    )
    .unwrap()
}

fn segment(s: u64, generation: u64) -> Segment {
    Segment {
        id: SegmentId::new(s, generation),
        name: format!("s{s}"),
        base: 0x1_0000_0000 * s,
        size: SEG_BYTES,
        te_endpoint: format!("ep-s{s}"),
        protocol: "tcp".to_string(),
        host_id: String::new(),
    }
}

fn owner(s: u64) -> ClientId {
    if s <= 2 {
        C1
    } else {
        C2
    }
}

/// A master with a sink observing it, driven by a seeded workload: puts, unfinished puts,
/// revokes, removes, upserts, replica clears, eviction with the clock advanced, put timeouts,
/// unmounts and re-mounts.
pub struct Workload {
    pub rng: fastrand::Rng,
    pub clock: Arc<ManualClock>,
    pub master: MasterService,
    pub sink: Arc<OpLogSink>,
    generation: [u64; 4],
}

impl Workload {
    pub fn new(seed: u64) -> Workload {
        let clock = Arc::new(ManualClock::new(T0_MS));
        let config = MasterServiceConfig {
            eviction_high_watermark_ratio: 0.7,
            eviction_ratio: 0.2,
            ..Default::default()
        };
        let master = MasterService::with_seed(config, clock.clone(), seed).unwrap();
        let sink = Arc::new(OpLogSink::new(0));
        master.set_observer(sink.clone()).unwrap();
        let mut w = Workload {
            rng: fastrand::Rng::with_seed(seed),
            clock,
            master,
            sink,
            generation: [0; 4],
        };
        for s in 1..=3 {
            w.mount(s);
        }
        w
    }

    fn mount(&mut self, s: u64) {
        let _ = self
            .master
            .mount_segment(&segment(s, self.generation[s as usize]), owner(s));
    }

    fn key(&mut self) -> String {
        format!("k{}", self.rng.u64(..24))
    }

    /// One random operation.
    pub fn step(&mut self) {
        let m = &self.master;
        let client = if self.rng.bool() { C1 } else { C2 };
        let key = format!("k{}", self.rng.u64(..24));
        let size = 512 * self.rng.u64(1..16);
        let cfg = ReplicateConfig::with_replicas(self.rng.usize(1..3));
        match self.rng.u32(..100) {
            0..=34 => {
                if m.put_start(client, &key, size, &cfg, "").is_ok() {
                    let _ = m.put_end(client, &ObjectMeta::new(&key), ReplicaType::ALL, "");
                }
            }
            35..=44 => {
                let _ = m.put_start(client, &key, size, &cfg, "");
            }
            45..=49 => {
                let _ = m.put_revoke(client, &key, ReplicaType::ALL, "");
            }
            50..=64 => {
                let _ = m.remove(&key, self.rng.bool(), "");
            }
            65..=72 => {
                if m.upsert_start(client, &key, size, &cfg, "").is_ok() {
                    let _ = m.upsert_end(client, &ObjectMeta::new(&key), ReplicaType::ALL, "");
                }
            }
            73..=77 => {
                let keys = vec![self.key(), self.key()];
                let _ = self.master.batch_replica_clear(&keys, client, "", "");
            }
            78..=87 => {
                self.clock.advance(self.rng.u64(1..20_000));
                let _ = self.master.run_eviction_once();
                let _ = self.master.run_put_timeouts_once();
            }
            88..=93 => {
                let s = self.rng.u64(1..=3);
                let id = SegmentId::new(s, self.generation[s as usize]);
                if self.master.unmount_segment(id, owner(s)).is_ok() {
                    self.generation[s as usize] += 1;
                }
            }
            _ => {
                let s = self.rng.u64(1..=3);
                self.mount(s);
            }
        }
    }
}
