//! The TCP data-plane header: 48 bytes, little-endian, identical layout for requests and
//! responses. Byte-by-byte description in `docs/transfer.md`.
//!
//! ```text
//! off size field
//!   0    4 magic       b"MCTX"
//!   4    1 version     1
//!   5    1 kind        1 read request, 2 write request, 3 grant request,
//!                      0x81 read response, 0x82 write response, 0x83 grant response
//!   6    2 flags       0 (reserved)
//!   8    4 status      i32: 0 in requests; 0 or an upstream ErrorCode in responses
//!  12    4 reserved    0
//!  16    8 request_id  chosen by the requester, echoed in the response
//!  24    8 segment_id  target segment (echoed)
//!  32    8 offset      byte offset inside the segment (echoed)
//!  40    8 length      payload bytes (echoed); at most MAX_PAYLOAD_BYTES
//! ```
//!
//! A payload of exactly `length` bytes follows a write request, a grant request (the 32-byte
//! capability of `segment_id`; `offset` 0, `length` 32) and an OK read response; nothing follows
//! any other header. The decoder never panics and rejects anything else.

use mooncake_common::ErrorCode;

use crate::auth::CAPABILITY_BYTES;

/// `b"MCTX"`: the first four bytes of every header.
pub const MAGIC: [u8; 4] = *b"MCTX";
/// The only version this build speaks.
pub const VERSION: u8 = 1;
/// Size of one encoded header.
pub const HEADER_BYTES: usize = 48;
/// The largest payload one request may carry (the engine splits larger entries into chunks).
pub const MAX_PAYLOAD_BYTES: u64 = 64 << 20;

/// What a header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    ReadRequest = 0x01,
    WriteRequest = 0x02,
    /// Presents the capability of `segment_id` for the rest of the connection (a server
    /// started with the cluster's token serves a segment to a connection only after this).
    GrantRequest = 0x03,
    ReadResponse = 0x81,
    WriteResponse = 0x82,
    GrantResponse = 0x83,
}

impl Kind {
    fn from_u8(value: u8) -> Option<Kind> {
        match value {
            0x01 => Some(Kind::ReadRequest),
            0x02 => Some(Kind::WriteRequest),
            0x03 => Some(Kind::GrantRequest),
            0x81 => Some(Kind::ReadResponse),
            0x82 => Some(Kind::WriteResponse),
            0x83 => Some(Kind::GrantResponse),
            _ => None,
        }
    }

    /// True for the three request kinds.
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Kind::ReadRequest | Kind::WriteRequest | Kind::GrantRequest
        )
    }

    /// True for a grant request or response.
    pub fn is_grant(self) -> bool {
        matches!(self, Kind::GrantRequest | Kind::GrantResponse)
    }

    /// The response kind answering this request kind (a response maps to itself).
    pub fn response(self) -> Kind {
        match self {
            Kind::ReadRequest | Kind::ReadResponse => Kind::ReadResponse,
            Kind::WriteRequest | Kind::WriteResponse => Kind::WriteResponse,
            Kind::GrantRequest | Kind::GrantResponse => Kind::GrantResponse,
        }
    }
}

/// A decoded header. `status` is `ErrorCode::OK` for requests and successful responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub kind: Kind,
    pub status: ErrorCode,
    pub request_id: u64,
    pub segment_id: u64,
    pub offset: u64,
    pub length: u64,
}

/// Why a header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("header truncated: {got} of {HEADER_BYTES} bytes")]
    Truncated { got: usize },
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported version {0}")]
    BadVersion(u8),
    #[error("unknown kind {0:#04x}")]
    BadKind(u8),
    #[error("reserved field {field} is {value:#x}, must be 0")]
    ReservedNotZero { field: &'static str, value: u32 },
    #[error("status {0} is not an upstream error code")]
    UnknownStatus(i32),
    #[error("request carries non-zero status {0}")]
    StatusInRequest(i32),
    #[error("payload of {length} bytes exceeds the limit of {MAX_PAYLOAD_BYTES}")]
    PayloadTooLarge { length: u64 },
    #[error("offset {offset} + length {length} overflows u64")]
    RangeOverflow { offset: u64, length: u64 },
    #[error("grant with offset {offset} and length {length} (must be 0 and {CAPABILITY_BYTES})")]
    BadGrant { offset: u64, length: u64 },
    #[error("unexpected header: expected {expected}, got {got:?} for request {request_id}")]
    Unexpected {
        expected: &'static str,
        got: Kind,
        request_id: u64,
    },
}

impl Header {
    /// A request header.
    pub fn request(kind: Kind, request_id: u64, segment_id: u64, offset: u64, length: u64) -> Self {
        debug_assert!(kind.is_request());
        Header {
            kind,
            status: ErrorCode::OK,
            request_id,
            segment_id,
            offset,
            length,
        }
    }

    /// The response to `self` (a request) with the given status.
    pub fn response(&self, status: ErrorCode) -> Self {
        Header {
            kind: self.kind.response(),
            status,
            ..*self
        }
    }

    /// A grant request presenting the capability of `segment_id` (the 32 bytes follow).
    pub fn grant(request_id: u64, segment_id: u64) -> Self {
        Header {
            kind: Kind::GrantRequest,
            status: ErrorCode::OK,
            request_id,
            segment_id,
            offset: 0,
            length: CAPABILITY_BYTES as u64,
        }
    }

    /// Number of payload bytes that follow this header on the stream.
    pub fn payload_bytes(&self) -> u64 {
        match self.kind {
            Kind::WriteRequest | Kind::GrantRequest => self.length,
            Kind::ReadResponse if self.status.is_ok() => self.length,
            _ => 0,
        }
    }

    /// The 48 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind as u8;
        // 6..8 flags and 12..16 reserved stay zero.
        out[8..12].copy_from_slice(&self.status.as_i32().to_le_bytes());
        out[16..24].copy_from_slice(&self.request_id.to_le_bytes());
        out[24..32].copy_from_slice(&self.segment_id.to_le_bytes());
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..48].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// Decodes the first [`HEADER_BYTES`] of `bytes`. Never panics; every field is validated.
    pub fn decode(bytes: &[u8]) -> Result<Header, WireError> {
        let Some(bytes) = bytes.get(..HEADER_BYTES) else {
            return Err(WireError::Truncated { got: bytes.len() });
        };
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(WireError::BadVersion(bytes[4]));
        }
        let kind = Kind::from_u8(bytes[5]).ok_or(WireError::BadKind(bytes[5]))?;
        let flags = u16_at(6);
        if flags != 0 {
            return Err(WireError::ReservedNotZero {
                field: "flags",
                value: u32::from(flags),
            });
        }
        let reserved = u32_at(12);
        if reserved != 0 {
            return Err(WireError::ReservedNotZero {
                field: "reserved",
                value: reserved,
            });
        }
        let raw_status = u32_at(8) as i32;
        if kind.is_request() && raw_status != 0 {
            return Err(WireError::StatusInRequest(raw_status));
        }
        let status = ErrorCode::from_i32(raw_status).ok_or(WireError::UnknownStatus(raw_status))?;
        let header = Header {
            kind,
            status,
            request_id: u64_at(16),
            segment_id: u64_at(24),
            offset: u64_at(32),
            length: u64_at(40),
        };
        if header.length > MAX_PAYLOAD_BYTES {
            return Err(WireError::PayloadTooLarge {
                length: header.length,
            });
        }
        if header.offset.checked_add(header.length).is_none() {
            return Err(WireError::RangeOverflow {
                offset: header.offset,
                length: header.length,
            });
        }
        if kind.is_grant() && (header.offset != 0 || header.length != CAPABILITY_BYTES as u64) {
            return Err(WireError::BadGrant {
                offset: header.offset,
                length: header.length,
            });
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The example of docs/transfer.md, byte for byte.
    const DOC_EXAMPLE: [u8; HEADER_BYTES] = [
        0x4d, 0x43, 0x54, 0x58, // magic "MCTX"
        0x01, // version 1
        0x02, // kind: write request
        0x00, 0x00, // flags
        0x00, 0x00, 0x00, 0x00, // status 0
        0x00, 0x00, 0x00, 0x00, // reserved
        0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // request id 7
        0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // segment id 3
        0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset 4096
        0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, // length 1 MiB
    ];

    #[test]
    fn decodes_the_documented_example() {
        let header = Header::decode(&DOC_EXAMPLE).unwrap();
        assert_eq!(
            header,
            Header {
                kind: Kind::WriteRequest,
                status: ErrorCode::OK,
                request_id: 7,
                segment_id: 3,
                offset: 4096,
                length: 1 << 20,
            }
        );
        assert_eq!(header.encode(), DOC_EXAMPLE);
        assert_eq!(header.payload_bytes(), 1 << 20);
    }

    #[test]
    fn documented_error_response_example_round_trips() {
        // Read response rejecting segment 3 offset 4096 with INVALID_PARAMS (-600 = 0xfffffda8).
        let bytes: [u8; HEADER_BYTES] = [
            0x4d, 0x43, 0x54, 0x58, 0x01, 0x81, 0x00, 0x00, 0xa8, 0xfd, 0xff, 0xff, 0x00, 0x00,
            0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x10, 0, 0, 0,
            0, 0, 0, 0x00, 0x00, 0x10, 0, 0, 0, 0, 0,
        ];
        let header = Header::decode(&bytes).unwrap();
        assert_eq!(header.kind, Kind::ReadResponse);
        assert_eq!(header.status, ErrorCode::INVALID_PARAMS);
        assert_eq!(header.payload_bytes(), 0, "no payload follows an error");
        assert_eq!(header.encode(), bytes);
    }

    #[test]
    fn rejects_each_malformed_field() {
        let good = DOC_EXAMPLE;
        let mutate = |at: usize, value: u8| {
            let mut bytes = good;
            bytes[at] = value;
            Header::decode(&bytes)
        };
        assert!(matches!(mutate(0, b'X'), Err(WireError::BadMagic(_))));
        assert_eq!(mutate(4, 2), Err(WireError::BadVersion(2)));
        assert_eq!(mutate(5, 0x04), Err(WireError::BadKind(4)));
        assert!(matches!(
            mutate(6, 1),
            Err(WireError::ReservedNotZero { .. })
        ));
        assert!(matches!(
            mutate(13, 1),
            Err(WireError::ReservedNotZero { .. })
        ));
        assert_eq!(mutate(8, 1), Err(WireError::StatusInRequest(1)));
        // length 0x10_0000_0000_0000 > 64 MiB
        assert!(matches!(
            mutate(46, 0x10),
            Err(WireError::PayloadTooLarge { .. })
        ));
        let mut overflow = good;
        overflow[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            Header::decode(&overflow),
            Err(WireError::RangeOverflow { .. })
        ));
        assert_eq!(
            Header::decode(&good[..47]),
            Err(WireError::Truncated { got: 47 })
        );
        let mut response = good;
        response[5] = 0x82;
        response[8] = 0x05; // status 5 is not an upstream code
        assert_eq!(Header::decode(&response), Err(WireError::UnknownStatus(5)));
    }

    /// The grant example of docs/transfer.md: request id 9 presents the capability of segment 3
    /// (32 bytes follow); the answer refusing it with ILLEGAL_CLIENT (-601 = 0xfffffda7).
    #[test]
    fn grant_matches_the_documented_bytes() {
        #[rustfmt::skip]
        let request: [u8; HEADER_BYTES] = [
            0x4d, 0x43, 0x54, 0x58, 0x01, // "MCTX", version 1
            0x03,                         // kind: grant request
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags, status, reserved
            0x09, 0, 0, 0, 0, 0, 0, 0,    // request id 9
            0x03, 0, 0, 0, 0, 0, 0, 0,    // segment id 3
            0x00, 0, 0, 0, 0, 0, 0, 0,    // offset 0
            0x20, 0, 0, 0, 0, 0, 0, 0,    // length 32: the capability follows
        ];
        let header = Header::decode(&request).unwrap();
        assert_eq!(header, Header::grant(9, 3));
        assert_eq!(header.encode(), request);
        assert_eq!(header.payload_bytes(), 32);

        let mut refused = request;
        refused[5] = 0x83;
        refused[8..12].copy_from_slice(&[0xa7, 0xfd, 0xff, 0xff]);
        let answer = Header::decode(&refused).unwrap();
        assert_eq!(answer, header.response(ErrorCode::ILLEGAL_CLIENT));
        assert_eq!(answer.payload_bytes(), 0);

        for (at, value) in [(32, 1), (40, 31), (41, 1)] {
            let mut bad = request;
            bad[at] = value;
            assert!(
                matches!(Header::decode(&bad), Err(WireError::BadGrant { .. })),
                "byte {at} = {value}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics_and_round_trips(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..96)) {
            if let Ok(header) = Header::decode(&bytes) {
                proptest::prop_assert_eq!(&header.encode()[..], &bytes[..HEADER_BYTES]);
                proptest::prop_assert!(header.length <= MAX_PAYLOAD_BYTES);
            }
        }

        #[test]
        fn decode_never_panics_past_a_valid_prefix(kind in proptest::sample::select(vec![1u8, 2, 3, 0x81, 0x82, 0x83, 4, 0]), rest in proptest::collection::vec(proptest::num::u8::ANY, 42..60)) {
            // Valid magic/version so the decoder reaches the later fields.
            let mut bytes = b"MCTX\x01".to_vec();
            bytes.push(kind);
            bytes.extend_from_slice(&rest);
            if let Ok(header) = Header::decode(&bytes) {
                proptest::prop_assert_eq!(&header.encode()[..], &bytes[..HEADER_BYTES]);
                proptest::prop_assert!(header.offset.checked_add(header.length).is_some());
            }
        }

        #[test]
        fn valid_headers_round_trip(kind in 0usize..4, id: u64, seg: u64, offset in 0u64..u64::MAX / 2, length in 0..=MAX_PAYLOAD_BYTES) {
            let kind = [Kind::ReadRequest, Kind::WriteRequest, Kind::ReadResponse, Kind::WriteResponse][kind];
            let header = Header { kind, status: ErrorCode::OK, request_id: id, segment_id: seg, offset, length };
            proptest::prop_assert_eq!(Header::decode(&header.encode()), Ok(header));
        }
    }
}
