//! Large masters for benchmarks (`cargo bench -p mooncake-master --bench restore`,
//! `mooncake bench snapshot`): one setup, so that their figures describe the same state.

use std::sync::Arc;

use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId, SystemClock,
};

use crate::handle::MasterService;

/// Bytes of every object's value.
pub const VALUE_SIZE: u64 = 4096;
/// Segments the objects are spread over.
pub const SEGMENTS: u64 = 16;
/// Bytes of every key ([`key`]).
pub const KEY_BYTES: usize = 16;
/// The one client that mounts the segments and writes the objects.
pub const CLIENT: ClientId = ClientId::new(7, 7);

/// Benchmark segment `i` of `bytes` bytes.
pub fn segment(i: u64, bytes: u64) -> Segment {
    Segment {
        id: SegmentId::new(i + 1, 0),
        name: format!("seg-{i}"),
        base: (i + 1) << 40,
        size: bytes,
        te_endpoint: format!("127.0.0.1:{}", 20_000 + i),
        protocol: "tcp".into(),
        host_id: String::new(),
    }
}

/// Key `i` (16 bytes for `i` below 10¹²).
pub fn key(i: usize) -> String {
    format!("key-{i:012}")
}

/// A 64-bit mix (splitmix64's finalizer): realistic, incompressible checksums.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A master with [`SEGMENTS`] segments (twice the room the objects need) and `objects`
/// complete objects: key [`key`]`(i)`, [`VALUE_SIZE`] bytes, one memory replica, checksum
/// [`mix`]`(i)`. Also returns the segments.
pub fn filled_master(objects: usize) -> Result<(MasterService, Vec<Segment>), String> {
    let seg_bytes = (objects as u64 / SEGMENTS + 1) * VALUE_SIZE * 2;
    let master = MasterService::new(Default::default(), Arc::new(SystemClock::new()))
        .map_err(|e| format!("config: {e}"))?;
    let segments: Vec<Segment> = (0..SEGMENTS).map(|i| segment(i, seg_bytes)).collect();
    let failed = |what: &str, e: ErrorCode| format!("{what}: {e}");
    for s in &segments {
        master
            .mount_segment(s, CLIENT)
            .map_err(|e| failed("mount", e))?;
    }
    let config = ReplicateConfig::default();
    for i in 0..objects {
        let key = key(i);
        master
            .put_start(CLIENT, &key, VALUE_SIZE, &config, "")
            .map_err(|e| failed("put start", e))?;
        let meta = ObjectMeta {
            key,
            object_checksum: Some(mix(i as u64)),
        };
        master
            .put_end(CLIENT, &meta, ReplicaType::ALL, "")
            .map_err(|e| failed("put end", e))?;
    }
    Ok((master, segments))
}
