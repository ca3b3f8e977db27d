//! Fuzzes the master protocol's decoders: frames (`FrameDecoder`), request bodies (request
//! frames) and reply bodies (response frames: replica descriptors, upstream enums, error codes).
//! Nothing may panic; an accepted frame never exceeds the limit and re-encodes to the same
//! bytes; an accepted body re-encodes and decodes to the same value.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mooncake_proto::methods as m;
use mooncake_proto::{decode, encode, encode_frame, FrameDecoder, FrameKind, Method, Reply};

fn body_round_trips<M: Method + PartialEq + std::fmt::Debug>(body: &[u8]) {
    if let Ok(request) = decode::<M>(body) {
        let bytes = encode(&request).expect("an accepted request re-encodes");
        let again: M = decode(&bytes).expect("a re-encoded request decodes");
        assert_eq!(again, request);
        let _ = request.check_limits(&mooncake_proto::Limits::default());
    }
}

fn reply_round_trips<M: Method>(body: &[u8])
where
    M::Output: PartialEq + std::fmt::Debug,
{
    if let Ok(reply) = decode::<Reply<M>>(body) {
        let bytes = encode(&reply).expect("an accepted reply re-encodes");
        let again: Reply<M> = decode(&bytes).expect("a re-encoded reply decodes");
        assert_eq!(again, reply);
    }
}

fuzz_target!(|data: &[u8]| {
    let decoder = FrameDecoder::new(4096);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        assert!(frame.body.len() + mooncake_proto::HEADER_BYTES <= 4096);
        let mut out = BytesMut::new();
        encode_frame(&mut out, frame.header, &frame.body);
        assert_eq!(out.len(), frame.body.len() + mooncake_proto::HEADER_BYTES);
        let body = &frame.body[..];
        if frame.header.kind == FrameKind::Response {
            match frame.header.method % 6 {
                0 => reply_round_trips::<m::GetReplicaList>(body),
                1 => reply_round_trips::<m::BatchGetReplicaList>(body),
                2 => reply_round_trips::<m::BatchPutStart>(body),
                3 => reply_round_trips::<m::Ping>(body),
                4 => reply_round_trips::<m::QueryTask>(body),
                _ => reply_round_trips::<m::FetchTasks>(body),
            }
            continue;
        }
        match frame.header.method % 8 {
            0 => body_round_trips::<m::PutStart>(body),
            1 => body_round_trips::<m::BatchExistKey>(body),
            2 => body_round_trips::<m::BatchPutEnd>(body),
            3 => body_round_trips::<m::MountSegment>(body),
            4 => body_round_trips::<m::ReMountSegment>(body),
            5 => body_round_trips::<m::BatchGetReplicaList>(body),
            6 => body_round_trips::<m::RemoveByRegex>(body),
            _ => body_round_trips::<m::BatchPutStart>(body),
        }
    }
});
