//! The largest request frame each method may send, checked by the server from the frame header
//! alone (before the body is buffered), so only bulk methods can make the master hold a large
//! frame.
//!
//! Three classes:
//! - *small* (64 KiB): requests about one key, one segment, one task or nothing (a key is at
//!   most 4 KiB, `Limits::max_key_bytes`); the largest valid one is a few KiB.
//! - *placement* (1 MiB): one key plus a [`mooncake_common::ReplicateConfig`] or a target list,
//!   whose preferred-segment names are the only unbounded part.
//! - *bulk* (the frame limit, 16 MiB): batches, whose size is key count × key length
//!   (65,536 × 4 KiB would be 256 MiB, so the frame limit binds first), and re-mounts.
//!
//! A method id the table does not know gets the small limit: the server answers it with "unknown
//! method" anyway.

use crate::frame::DEFAULT_MAX_FRAME_BYTES;
use crate::methods::{self as m, Method};

/// Largest request frame of a small method (header included).
pub const SMALL_REQUEST_FRAME_BYTES: usize = 64 << 10;
/// Largest request frame of a method that carries a replica placement or a target list.
pub const PLACEMENT_REQUEST_FRAME_BYTES: usize = 1 << 20;
/// Largest request frame of a bulk method: the frame limit.
pub const BULK_REQUEST_FRAME_BYTES: usize = DEFAULT_MAX_FRAME_BYTES;

/// The largest request frame (header included) a client may send for `method`.
pub fn max_request_frame_bytes(method: u16) -> usize {
    match method {
        m::BatchExistKey::ID
        | m::BatchGetReplicaList::ID
        | m::GetReplicaListPinned::ID
        | m::BatchGetReplicaListPinned::ID
        | m::ReleaseReads::ID
        | m::ExistKeyPinned::ID
        | m::BatchExistKeyPinned::ID
        | m::BatchPutStart::ID
        | m::BatchPutEnd::ID
        | m::BatchPutRevoke::ID
        | m::BatchUpsertStart::ID
        | m::BatchUpsertEnd::ID
        | m::BatchUpsertRevoke::ID
        | m::BatchRemove::ID
        | m::BatchReplicaClear::ID
        | m::ReMountSegment::ID => BULK_REQUEST_FRAME_BYTES,
        m::PutStart::ID
        | m::UpsertStart::ID
        | m::CopyStart::ID
        | m::CreateCopyTask::ID
        | m::CreateDrainJob::ID => PLACEMENT_REQUEST_FRAME_BYTES,
        _ => SMALL_REQUEST_FRAME_BYTES,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::codec::encode;
    use crate::frame::HEADER_BYTES;
    use crate::limits::DEFAULT_MAX_KEY_BYTES;
    use crate::methods::METHODS;
    use mooncake_common::{ClientId, ObjectMeta, ReplicaType, ReplicateConfig, Segment, SegmentId};

    fn frame_len<M: Method>(request: &M) -> usize {
        encode(request).unwrap().len() + HEADER_BYTES
    }

    /// Every method is in one of the three classes, and a method id the table does not know is
    /// small.
    #[test]
    fn every_method_has_one_of_the_three_limits() {
        let classes = [
            SMALL_REQUEST_FRAME_BYTES,
            PLACEMENT_REQUEST_FRAME_BYTES,
            BULK_REQUEST_FRAME_BYTES,
        ];
        for (id, name) in METHODS {
            let limit = max_request_frame_bytes(*id);
            assert!(classes.contains(&limit), "{name} ({id}): {limit}");
            if name.starts_with("Batch") {
                assert_eq!(limit, BULK_REQUEST_FRAME_BYTES, "{name}");
            }
        }
        assert_eq!(max_request_frame_bytes(9999), SMALL_REQUEST_FRAME_BYTES);
    }

    /// The largest valid requests of small and placement methods (longest key, long tenant,
    /// a generous placement) fit their class with room to spare.
    #[test]
    fn the_largest_valid_single_key_requests_fit_their_class() {
        let key = "k".repeat(DEFAULT_MAX_KEY_BYTES);
        let tenant = "t".repeat(1024);
        let put_end = m::PutEnd {
            client: ClientId::random(),
            meta: ObjectMeta {
                key: key.clone(),
                object_checksum: Some(u64::MAX),
            },
            replica_type: ReplicaType::MEMORY,
            tenant: tenant.clone(),
        };
        assert!(frame_len(&put_end) * 4 < max_request_frame_bytes(m::PutEnd::ID));
        let mount = m::MountSegment {
            segment: Segment {
                id: SegmentId::random(),
                name: "n".repeat(1024),
                base: u64::MAX,
                size: u64::MAX,
                te_endpoint: "e".repeat(1024),
                protocol: "tcp".into(),
                host_id: "h".repeat(1024),
            },
            client: ClientId::random(),
        };
        assert!(frame_len(&mount) * 4 < max_request_frame_bytes(m::MountSegment::ID));
        let config = ReplicateConfig {
            preferred_segments: (0..256).map(|i| format!("10.0.{i}.1:17777")).collect(),
            ..ReplicateConfig::default()
        };
        let put_start = m::PutStart {
            client: ClientId::random(),
            key,
            value_len: u64::MAX,
            config,
            tenant,
        };
        assert!(frame_len(&put_start) * 4 < max_request_frame_bytes(m::PutStart::ID));
    }
}
