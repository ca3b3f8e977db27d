//! The byte examples of docs/wire.md, decoded and re-encoded; the method-id table pinned; every
//! upstream enum checked to travel as upstream's number. A change to any of these is a change of
//! the wire format: it must come with a protocol version bump and a docs/wire.md update.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use bytes::BytesMut;
use mooncake_common::numbered::UpstreamNumber;
use mooncake_common::{
    ClientId, ClientStatus, ErrorCode, GetReplicaListResponse, MemoryDescriptor, ReplicaDescriptor,
    ReplicaId, ReplicaKind, ReplicaStatus, ReplicaType, ReplicateConfig, SegmentStatus,
    SoftPinAction, TaskStatus, TaskType,
};
use mooncake_proto::methods::{
    Authenticate, GetReplicaList, PutStart, ReportTransferFailure, TokenBytes,
};
use mooncake_proto::{
    decode, decode_error_body, encode, encode_error, encode_frame, FrameDecoder, FrameHeader,
    FrameKind, Method, Reply, METHODS,
};

/// Decodes one frame from `bytes` (all of it) and checks its header.
fn frame_body(bytes: &[u8], kind: FrameKind, method: u16, request_id: u64) -> BytesMut {
    let mut buf = BytesMut::from(bytes);
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty(), "one frame, nothing after it");
    assert_eq!(
        frame.header,
        FrameHeader {
            kind,
            method,
            request_id
        }
    );
    frame.body
}

fn reframe(kind: FrameKind, method: u16, request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let header = FrameHeader {
        kind,
        method,
        request_id,
    };
    encode_frame(&mut out, header, body);
    out.to_vec()
}

/// docs/wire.md, "Request": PutStart of key "k", 4096 bytes, one replica soft-pinned for 5 s.
#[test]
fn put_start_request_matches_the_documented_bytes() {
    #[rustfmt::skip]
    let bytes: [u8; 38] = [
        0x22, 0x00, 0x00, 0x00, // frame_len = 34 (12 header bytes + 22 body bytes)
        0x02,                   // version 2
        0x00,                   // kind: request
        0x06, 0x00,             // method 6 = PutStart
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        // body
        0x01, 0x02,             // client: Uuid { first: 1, second: 2 } (two varints)
        0x01, b'k',             // key: length 1, "k"
        0x80, 0x20,             // value_len 4096 (varint)
        // config: ReplicateConfig, fields in declaration order
        0x01,                   //   replica_num 1
        0x00,                   //   nof_replica_num 0
        0x00,                   //   dfs_replica_num 0
        0x01,                   //   soft_pin_action ENABLE = 1 (u8, one byte)
        0x01, 0x88, 0x27,       //   soft_pin_ttl_ms Some(5000)
        0x00,                   //   with_hard_pin false
        0x00,                   //   preferred_segments []
        0x00,                   //   preferred_segment ""
        0x00,                   //   preferred_nof_segments []
        0x00,                   //   prefer_alloc_in_same_node false
        0x00,                   //   data_type 0
        0x00,                   //   host_id ""
        0x00,                   //   group_ids None
        0x00,                   // tenant "" (default)
    ];
    let body = frame_body(&bytes, FrameKind::Request, PutStart::ID, 1);
    let request: PutStart = decode(&body).unwrap();
    assert_eq!(
        request,
        PutStart {
            client: ClientId::new(1, 2),
            key: "k".into(),
            value_len: 4096,
            config: ReplicateConfig {
                soft_pin_action: SoftPinAction::Enable,
                soft_pin_ttl_ms: Some(5000),
                ..ReplicateConfig::default()
            },
            tenant: String::new(),
        }
    );
    let again = encode(&request).unwrap();
    assert_eq!(&again[..], &body[..]);
    assert_eq!(
        reframe(FrameKind::Request, PutStart::ID, 1, &again),
        bytes.to_vec()
    );
}

fn one_memory_replica() -> GetReplicaListResponse {
    GetReplicaListResponse {
        replicas: vec![ReplicaDescriptor {
            id: ReplicaId(7),
            status: ReplicaStatus::COMPLETE,
            kind: ReplicaKind::Memory(MemoryDescriptor {
                size: 4096,
                buffer_address: 0x1_0000,
                protocol: Arc::from("tcp"),
                transport_endpoint: Arc::from("127.0.0.1:9"),
            }),
        }],
        lease_ttl_ms: 5000,
        object_checksum: None,
    }
}

/// docs/wire.md, "Success reply": GetReplicaList answering one complete memory replica.
#[test]
fn get_replica_list_reply_matches_the_documented_bytes() {
    #[rustfmt::skip]
    let bytes: [u8; 45] = [
        0x29, 0x00, 0x00, 0x00, // frame_len = 41 (12 + 29)
        0x02,                   // version 2
        0x01,                   // kind: response
        0x03, 0x00,             // method 3 = GetReplicaList
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        // body: Result<GetReplicaListResponse, ErrorCode>
        0x00,                   // Ok
        0x01,                   // replicas: 1 descriptor
        0x07,                   //   id 7
        0x06,                   //   status COMPLETE = 3 (i32, zigzag varint 6)
        0x00,                   //   kind: variant 0 = Memory
        0x80, 0x20,             //     size 4096
        0x80, 0x80, 0x04,       //     buffer_address 0x10000
        0x03, b't', b'c', b'p', //     protocol "tcp"
        0x0b, b'1', b'2', b'7', b'.', b'0', b'.', b'0', b'.', b'1', b':', b'9',
                                //     transport_endpoint "127.0.0.1:9"
        0x88, 0x27,             // lease_ttl_ms 5000
        0x00,                   // object_checksum None
    ];
    let body = frame_body(&bytes, FrameKind::Response, GetReplicaList::ID, 1);
    let reply: Reply<GetReplicaList> = decode(&body).unwrap();
    assert_eq!(reply, Ok(one_memory_replica()));
    let again = encode(&reply).unwrap();
    assert_eq!(&again[..], &body[..]);
    assert_eq!(
        reframe(FrameKind::Response, GetReplicaList::ID, 1, &again),
        bytes.to_vec()
    );
}

/// docs/wire.md, "Error reply": GetReplicaList refused with OBJECT_NOT_FOUND (-704). The
/// operation's failure travels in a normal response frame (kind 1), not an error frame.
#[test]
fn object_not_found_reply_matches_the_documented_bytes() {
    #[rustfmt::skip]
    let bytes: [u8; 19] = [
        0x0f, 0x00, 0x00, 0x00, // frame_len = 15 (12 + 3)
        0x02,                   // version 2
        0x01,                   // kind: response
        0x03, 0x00,             // method 3 = GetReplicaList
        0x02, 0, 0, 0, 0, 0, 0, 0, // request id 2
        0x01,                   // Err
        0xff, 0x0a,             // -704: zigzag 1407, varint ff 0a
    ];
    let body = frame_body(&bytes, FrameKind::Response, GetReplicaList::ID, 2);
    let reply: Reply<GetReplicaList> = decode(&body).unwrap();
    assert_eq!(reply, Err(ErrorCode::OBJECT_NOT_FOUND));
    let again = encode(&reply).unwrap();
    assert_eq!(&again[..], &body[..]);
    assert_eq!(
        reframe(FrameKind::Response, GetReplicaList::ID, 2, &again),
        bytes.to_vec()
    );
}

/// The postcard encoding of an `i32`: zigzag, then LEB128 varint. Written out here so the test
/// does not check postcard against itself.
fn zigzag_varint(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

fn check_i32_enum<T>(named: &[(T, i64)])
where
    T: UpstreamNumber
        + PartialEq
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    assert_eq!(
        named.len(),
        T::ALL_VALUES.len(),
        "{}: every value is listed",
        T::TYPE_NAME
    );
    for &(value, number) in named {
        let bytes = encode(&value).unwrap();
        assert_eq!(bytes.to_vec(), zigzag_varint(number), "{value:?}");
        assert_eq!(decode::<T>(&bytes).unwrap(), value);
    }
}

/// Every enum that mirrors an upstream number travels as that number, whatever its position in
/// the Rust declaration.
#[test]
fn upstream_enums_travel_as_upstream_numbers() {
    use ReplicaType as RT;
    check_i32_enum(&[
        (RT::MEMORY, 0),
        (RT::DISK, 1),
        (RT::LOCAL_DISK, 2),
        (RT::NOF_SSD, 3),
        (RT::ALL, 4),
        (RT::DFS, 100),
    ]);
    assert_eq!(&encode(&RT::DFS).unwrap()[..], &[0xc8, 0x01]);
    use ReplicaStatus as RS;
    check_i32_enum(&[
        (RS::UNDEFINED, 0),
        (RS::INITIALIZED, 1),
        (RS::PROCESSING, 2),
        (RS::COMPLETE, 3),
        (RS::REMOVED, 4),
        (RS::FAILED, 5),
    ]);
    use SegmentStatus as SS;
    check_i32_enum(&[
        (SS::UNDEFINED, 0),
        (SS::OK, 1),
        (SS::DRAINING, 2),
        (SS::DRAINED, 3),
        (SS::GRACEFULLY_UNMOUNTING, 4),
        (SS::UNMOUNTING, 5),
    ]);
    check_i32_enum(&[
        (ClientStatus::UNDEFINED, 0),
        (ClientStatus::OK, 1),
        (ClientStatus::NEED_REMOUNT, 2),
    ]);
    check_i32_enum(&[(TaskType::ReplicaCopy, 0), (TaskType::ReplicaMove, 1)]);
    check_i32_enum(&[
        (TaskStatus::Pending, 0),
        (TaskStatus::Processing, 1),
        (TaskStatus::Failed, 2),
        (TaskStatus::Success, 3),
    ]);
    // SoftPinAction is a u8 upstream: one raw byte.
    for (action, byte) in [
        (SoftPinAction::Preserve, 0u8),
        (SoftPinAction::Enable, 1),
        (SoftPinAction::Disable, 2),
    ] {
        assert_eq!(&encode(&action).unwrap()[..], &[byte]);
        assert_eq!(decode::<SoftPinAction>(&[byte]).unwrap(), action);
    }
    // Error codes: every one as its i32.
    for &code in ErrorCode::ALL {
        let bytes = encode(&code).unwrap();
        assert_eq!(
            bytes.to_vec(),
            zigzag_varint(code.as_i32().into()),
            "{code}"
        );
        assert_eq!(decode::<ErrorCode>(&bytes).unwrap(), code);
    }
    assert_eq!(
        &encode(&ErrorCode::OBJECT_NOT_FOUND).unwrap()[..],
        &[0xff, 0x0a]
    );
}

#[test]
fn undefined_numbers_are_malformed_bodies_naming_the_type() {
    // The success reply above with status 7 instead of COMPLETE.
    let mut body = encode(&Reply::<GetReplicaList>::Ok(one_memory_replica()))
        .unwrap()
        .to_vec();
    assert_eq!(body[3], 0x06, "status byte");
    body[3] = zigzag_varint(7)[0];
    let err = decode::<Reply<GetReplicaList>>(&body).unwrap_err();
    assert_eq!(err.code(), ErrorCode::DESERIALIZE_FAIL);
    assert!(
        err.to_string().contains("unknown ReplicaStatus number 7"),
        "{err}"
    );
    // A later, unrelated decode failure does not repeat the old cause.
    let err = decode::<Reply<GetReplicaList>>(&[0x07]).unwrap_err();
    assert!(!err.to_string().contains("ReplicaStatus"), "{err}");
    // Unknown ReplicaType / SoftPinAction / TaskStatus numbers are refused too.
    assert!(decode::<ReplicaType>(&zigzag_varint(5)).is_err());
    assert!(decode::<SoftPinAction>(&[3]).is_err());
    assert!(decode::<TaskStatus>(&zigzag_varint(4)).is_err());
    // An i32 that does not fit is refused, not truncated.
    assert!(decode::<ReplicaType>(&zigzag_varint(1 << 40)).is_err());
}

#[test]
fn an_error_code_this_build_does_not_know_stays_an_error() {
    // A newer peer's code -1800: decodes as INTERNAL_ERROR rather than failing the whole reply.
    let mut body = vec![0x01];
    body.extend(zigzag_varint(-1800));
    let reply: Reply<GetReplicaList> = decode(&body).unwrap();
    assert_eq!(reply, Err(ErrorCode::INTERNAL_ERROR));
}

/// Method ids are wire values: this list is written out so that renumbering, reordering,
/// renaming or removing a method fails here. Append new methods at the end.
#[test]
fn method_id_table_is_pinned() {
    let expected: &[(u16, &str)] = &[
        (1, "ExistKey"),
        (2, "BatchExistKey"),
        (3, "GetReplicaList"),
        (4, "BatchGetReplicaList"),
        (5, "GetReplicaListByRegex"),
        (6, "PutStart"),
        (7, "BatchPutStart"),
        (8, "PutEnd"),
        (9, "BatchPutEnd"),
        (10, "PutRevoke"),
        (11, "BatchPutRevoke"),
        (12, "UpsertStart"),
        (13, "BatchUpsertStart"),
        (14, "UpsertEnd"),
        (15, "BatchUpsertEnd"),
        (16, "UpsertRevoke"),
        (17, "BatchUpsertRevoke"),
        (18, "Remove"),
        (19, "BatchRemove"),
        (20, "RemoveByRegex"),
        (21, "RemoveAll"),
        (22, "BatchReplicaClear"),
        (23, "MountSegment"),
        (24, "ReMountSegment"),
        (25, "UnmountSegment"),
        (26, "GracefulUnmountSegment"),
        (27, "Ping"),
        (28, "ServiceReady"),
        (29, "QuerySegmentStatus"),
        (30, "QuerySegmentStatusById"),
        (31, "GetAllKeys"),
        (32, "GetSegmentsDetail"),
        (33, "CopyStart"),
        (34, "CopyEnd"),
        (35, "CopyRevoke"),
        (36, "MoveStart"),
        (37, "MoveEnd"),
        (38, "MoveRevoke"),
        (39, "CreateCopyTask"),
        (40, "CreateMoveTask"),
        (41, "QueryTask"),
        (42, "FetchTasks"),
        (43, "MarkTaskToComplete"),
        (44, "GetUnverifiedReplicas"),
        (45, "ConfirmReplicas"),
        (46, "TakeSnapshot"),
        (47, "Authenticate"),
        (50, "GetReplicaListPinned"),
        (51, "BatchGetReplicaListPinned"),
        (52, "ReleaseReads"),
        (53, "ReportTransferFailure"),
        (54, "ExistKeyPinned"),
        (55, "BatchExistKeyPinned"),
        (60, "MountLocalDisk"),
        (61, "OffloadHeartbeat"),
        (62, "NotifyOffload"),
        (63, "AdvertiseDiskObjects"),
        (64, "EvictDiskObjects"),
        (65, "GetOffloadStats"),
        (66, "PromotionHeartbeat"),
        (67, "NotifyPromotion"),
        (68, "TakeDiskDrops"),
        (69, "NotifyDiskDrops"),
        (72, "ListLocalDisks"),
        (70, "LoadDiskObjects"),
        (71, "ReleaseDiskObjects"),
        (80, "DrainSegment"),
        (81, "CountSegmentObjects"),
        (82, "CreateDrainJob"),
        (83, "QueryDrainJob"),
        (84, "CancelDrainJob"),
        (85, "ListDrainJobs"),
    ];
    assert_eq!(METHODS, expected);
}

/// docs/wire.md, "Authenticate": the handshake of a master started with a token, its success
/// reply, and the error frame that answers a wrong token before the connection is closed.
#[test]
fn authenticate_matches_the_documented_bytes() {
    #[rustfmt::skip]
    let request: [u8; 33] = [
        0x1d, 0x00, 0x00, 0x00, // frame_len = 29 (12 header bytes + 17 body bytes)
        0x02, 0x00,             // version 2, request
        0x2f, 0x00,             // method 47 = Authenticate
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        0x10,                   // token: 16 bytes
        b'0', b'1', b'2', b'3', b'4', b'5', b'6', b'7',
        b'8', b'9', b'a', b'b', b'c', b'd', b'e', b'f',
    ];
    let body = frame_body(&request, FrameKind::Request, Authenticate::ID, 1);
    let decoded: Authenticate = decode(&body).unwrap();
    assert_eq!(
        decoded,
        Authenticate {
            token: TokenBytes(b"0123456789abcdef".to_vec())
        }
    );
    assert!(
        !format!("{decoded:?}").contains("0123"),
        "Debug hides the token"
    );
    let again = encode(&decoded).unwrap();
    assert_eq!(
        reframe(FrameKind::Request, Authenticate::ID, 1, &again),
        request.to_vec()
    );

    #[rustfmt::skip]
    let accepted: [u8; 17] = [
        0x0d, 0x00, 0x00, 0x00, // frame_len = 13
        0x02, 0x01, 0x2f, 0x00, // version 2, response, method 47
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        0x00,                   // Ok(())
    ];
    let body = frame_body(&accepted, FrameKind::Response, Authenticate::ID, 1);
    let reply: Reply<Authenticate> = decode(&body).unwrap();
    assert_eq!(reply, Ok(()));
    assert_eq!(
        reframe(
            FrameKind::Response,
            Authenticate::ID,
            1,
            &encode(&reply).unwrap()
        ),
        accepted.to_vec()
    );

    // A wrong token: an error frame (kind 2) with ILLEGAL_CLIENT (-601 = a7 fd ff ff, i32 LE)
    // and the message "wrong token".
    #[rustfmt::skip]
    let refused: [u8; 31] = [
        0x1b, 0x00, 0x00, 0x00, // frame_len = 27 (12 + 4 + 11)
        0x02, 0x02, 0x2f, 0x00, // version 2, error, method 47
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        0xa7, 0xfd, 0xff, 0xff, // ILLEGAL_CLIENT
        b'w', b'r', b'o', b'n', b'g', b' ', b't', b'o', b'k', b'e', b'n',
    ];
    let body = frame_body(&refused, FrameKind::Error, Authenticate::ID, 1);
    assert_eq!(
        decode_error_body(&body),
        (ErrorCode::ILLEGAL_CLIENT, "wrong token".to_string())
    );
    let mut out = BytesMut::new();
    encode_error(
        &mut out,
        Authenticate::ID,
        1,
        ErrorCode::ILLEGAL_CLIENT,
        "wrong token",
    );
    assert_eq!(&out[..], &refused[..]);

    // Longer than the token limit: refused by the method's limits.
    let long = Authenticate {
        token: TokenBytes(vec![b'x'; mooncake_common::auth::MAX_TOKEN_BYTES + 1]),
    };
    assert_eq!(
        long.check_limits(&mooncake_proto::Limits::default()),
        Err(ErrorCode::INVALID_PARAMS)
    );
}

/// Decodes the one frame `bytes` (request id 1) as a `T` and checks that re-encoding gives
/// the same bytes.
fn round_trip<T>(bytes: &[u8], kind: FrameKind, method: u16) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let body = frame_body(bytes, kind, method, 1);
    let decoded: T = decode(&body).unwrap();
    let again = encode(&decoded).unwrap();
    assert_eq!(reframe(kind, method, 1, &again), bytes.to_vec());
    decoded
}

/// docs/wire.md, "ReportTransferFailure": a client reports endpoint "n:1"; one segment became
/// suspected.
#[test]
fn report_transfer_failure_matches_the_documented_bytes() {
    #[rustfmt::skip]
    let request: [u8; 22] = [
        0x12, 0x00, 0x00, 0x00, // frame_len = 18 (12 header bytes + 6 body bytes)
        0x02, 0x00,             // version 2, request
        0x35, 0x00,             // method 53 = ReportTransferFailure
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        0x01, 0x02,             // client: Uuid { first: 1, second: 2 }
        0x03, b'n', b':', b'1', // endpoint: length 3, "n:1"
    ];
    let id = ReportTransferFailure::ID;
    let decoded: ReportTransferFailure = round_trip(&request, FrameKind::Request, id);
    let expected = ReportTransferFailure {
        client: ClientId::new(1, 2),
        endpoint: "n:1".into(),
    };
    assert_eq!(decoded, expected);

    #[rustfmt::skip]
    let reply: [u8; 18] = [
        0x0e, 0x00, 0x00, 0x00, // frame_len = 14
        0x02, 0x01, 0x35, 0x00, // version 2, response, method 53
        0x01, 0, 0, 0, 0, 0, 0, 0, // request id 1
        0x00, 0x01,             // Ok(1): one segment suspected now
    ];
    let decoded: Reply<ReportTransferFailure> = round_trip(&reply, FrameKind::Response, id);
    assert_eq!(decoded, Ok(1));
}
