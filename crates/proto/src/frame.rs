//! Frames: the unit on the wire. See `docs/wire.md` for the byte-level layout.
//!
//! ```text
//! offset size field
//!   0     4   frame_len   u32 LE: bytes after this field (header rest + body), ≤ max_frame_bytes
//!   4     1   version     u8, currently 2
//!   5     1   kind        u8: 0 request, 1 response, 2 error response
//!   6     2   method      u16 LE: method id (see `methods.rs`)
//!   8     8   request_id  u64 LE: chosen by the client, echoed by the server
//!  16     …   body        postcard-encoded request/response; for kind 2: i32 LE code + UTF-8 message
//! ```
//!
//! A decoder never trusts `frame_len` before checking it against the limit, so a hostile length
//! prefix costs nothing; a malformed header is an error, never a panic.

use bytes::{Buf, BufMut, BytesMut};
use mooncake_common::ErrorCode;
use thiserror::Error;

/// Protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 2;
/// Bytes of the length prefix.
pub const LEN_PREFIX_BYTES: usize = 4;
/// Bytes of the fixed header, length prefix included.
pub const HEADER_BYTES: usize = 16;
/// Default limit on one frame (header + body).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    Request = 0,
    Response = 1,
    /// The server could not produce a typed response (unknown method, undecodable body, overload).
    Error = 2,
}

impl FrameKind {
    fn from_u8(value: u8) -> Option<FrameKind> {
        match value {
            0 => Some(FrameKind::Request),
            1 => Some(FrameKind::Response),
            2 => Some(FrameKind::Error),
            _ => None,
        }
    }
}

/// The fixed part of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub method: u16,
    pub request_id: u64,
}

/// A whole frame: header and body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: BytesMut,
}

/// Why bytes could not be read as a frame. After any of these the connection is out of sync and
/// must be closed (the server first answers with an error frame when it can).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame of {len} bytes is shorter than the {min}-byte header")]
    TooShort { len: usize, min: usize },
    #[error("unsupported protocol version {0} (this side speaks {PROTOCOL_VERSION})")]
    Version(u8),
    #[error("unknown frame kind {0}")]
    Kind(u8),
}

impl FrameError {
    /// The error code reported to the peer.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::TooLarge { .. } => ErrorCode::BUFFER_OVERFLOW,
            FrameError::Version(_) => ErrorCode::INVALID_VERSION,
            FrameError::TooShort { .. } | FrameError::Kind(_) => ErrorCode::INVALID_PARAMS,
        }
    }
}

/// Incremental frame decoder over a growing byte buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max_frame_bytes: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameDecoder {
    /// A decoder that refuses frames longer than `max_frame_bytes` (header included).
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder {
            max_frame_bytes: max_frame_bytes.max(HEADER_BYTES),
        }
    }

    /// The limit this decoder enforces.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Checks the header at the start of `src` (which must hold at least `HEADER_BYTES`) and
    /// returns it with the total frame length, without consuming anything.
    pub fn peek_header(&self, src: &[u8]) -> Result<Option<(FrameHeader, usize)>, FrameError> {
        if src.len() < LEN_PREFIX_BYTES {
            return Ok(None);
        }
        let frame_len = u32::from_le_bytes([src[0], src[1], src[2], src[3]]) as usize;
        let total = frame_len + LEN_PREFIX_BYTES;
        if total > self.max_frame_bytes {
            return Err(FrameError::TooLarge {
                len: total,
                max: self.max_frame_bytes,
            });
        }
        if total < HEADER_BYTES {
            return Err(FrameError::TooShort {
                len: total,
                min: HEADER_BYTES,
            });
        }
        if src.len() < HEADER_BYTES {
            return Ok(None);
        }
        let version = src[4];
        if version != PROTOCOL_VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = FrameKind::from_u8(src[5]).ok_or(FrameError::Kind(src[5]))?;
        let method = u16::from_le_bytes([src[6], src[7]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&src[8..16]);
        let header = FrameHeader {
            kind,
            method,
            request_id: u64::from_le_bytes(id),
        };
        Ok(Some((header, total)))
    }

    /// Takes one whole frame off the front of `src`, or returns `Ok(None)` when more bytes are
    /// needed. Reserves room for the rest of a frame whose header has arrived, never more than
    /// the limit.
    pub fn decode(&self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some((header, total)) = self.peek_header(src)? else {
            return Ok(None);
        };
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        let mut frame = src.split_to(total);
        frame.advance(HEADER_BYTES);
        Ok(Some(Frame {
            header,
            body: frame,
        }))
    }
}

/// Appends the header of a frame whose body is `body_len` bytes.
pub fn encode_header(dst: &mut BytesMut, header: FrameHeader, body_len: usize) {
    let frame_len = (HEADER_BYTES - LEN_PREFIX_BYTES + body_len) as u32;
    dst.reserve(HEADER_BYTES + body_len);
    dst.put_u32_le(frame_len);
    dst.put_u8(PROTOCOL_VERSION);
    dst.put_u8(header.kind as u8);
    dst.put_u16_le(header.method);
    dst.put_u64_le(header.request_id);
}

/// Appends a whole frame.
pub fn encode_frame(dst: &mut BytesMut, header: FrameHeader, body: &[u8]) {
    encode_header(dst, header, body.len());
    dst.put_slice(body);
}

/// Appends an error frame carrying `code` and a human-readable message (truncated to 1 KiB).
pub fn encode_error(dst: &mut BytesMut, method: u16, request_id: u64, code: ErrorCode, msg: &str) {
    let msg = truncate_utf8(msg, 1024);
    let header = FrameHeader {
        kind: FrameKind::Error,
        method,
        request_id,
    };
    encode_header(dst, header, 4 + msg.len());
    dst.put_i32_le(code.as_i32());
    dst.put_slice(msg.as_bytes());
}

/// Reads the body of an error frame. Unknown numbers become `INTERNAL_ERROR`.
pub fn decode_error_body(body: &[u8]) -> (ErrorCode, String) {
    if body.len() < 4 {
        return (ErrorCode::INTERNAL_ERROR, "short error frame".to_string());
    }
    let value = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    let code = ErrorCode::from_i32(value).unwrap_or(ErrorCode::INTERNAL_ERROR);
    (code, String::from_utf8_lossy(&body[4..]).into_owned())
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The example in docs/wire.md, byte by byte.
    #[test]
    fn decodes_the_documented_example() {
        let bytes: [u8; 19] = [
            0x0f, 0x00, 0x00, 0x00, // frame_len = 15 (12 header bytes + 3 body bytes)
            0x02, // version 2
            0x00, // kind: request
            0x03, 0x00, // method 3
            0x2a, 0, 0, 0, 0, 0, 0, 0, // request id 42
            0xaa, 0xbb, 0xcc, // body
        ];
        let mut buf = BytesMut::from(&bytes[..]);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(
            frame.header,
            FrameHeader {
                kind: FrameKind::Request,
                method: 3,
                request_id: 42
            }
        );
        assert_eq!(&frame.body[..], &[0xaa, 0xbb, 0xcc]);
        assert!(buf.is_empty());

        let mut out = BytesMut::new();
        encode_frame(&mut out, frame.header, &frame.body);
        assert_eq!(&out[..], &bytes[..]);
    }

    #[test]
    fn waits_for_partial_frames_byte_by_byte() {
        let mut whole = BytesMut::new();
        let header = FrameHeader {
            kind: FrameKind::Response,
            method: 7,
            request_id: u64::MAX,
        };
        encode_frame(&mut whole, header, b"hello");
        let decoder = FrameDecoder::default();
        let mut buf = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            buf.put_u8(*byte);
            let got = decoder.decode(&mut buf).unwrap();
            if i + 1 < whole.len() {
                assert!(got.is_none(), "frame complete too early at byte {i}");
            } else {
                assert_eq!(&got.unwrap().body[..], b"hello");
            }
        }
    }

    #[test]
    fn rejects_oversized_length_prefix_without_allocating() {
        let decoder = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        let err = decoder.decode(&mut buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }));
        assert_eq!(err.code(), ErrorCode::BUFFER_OVERFLOW);
        assert!(buf.capacity() < 1024);
    }

    #[test]
    fn rejects_short_bad_version_and_bad_kind() {
        let decoder = FrameDecoder::default();
        let mut short = BytesMut::from(&[3, 0, 0, 0, 1, 0, 0][..]);
        assert!(matches!(
            decoder.decode(&mut short),
            Err(FrameError::TooShort { .. })
        ));
        let mut version = BytesMut::from(&[12, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(decoder.decode(&mut version), Err(FrameError::Version(9)));
        let mut old = BytesMut::from(&[12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(decoder.decode(&mut old), Err(FrameError::Version(1)));
        let mut kind = BytesMut::from(&[12, 0, 0, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(decoder.decode(&mut kind), Err(FrameError::Kind(7)));
    }

    #[test]
    fn error_frames_round_trip_and_truncate_messages() {
        let mut buf = BytesMut::new();
        let long = "é".repeat(2000);
        encode_error(&mut buf, 9, 5, ErrorCode::OBJECT_NOT_FOUND, &long);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.header.kind, FrameKind::Error);
        let (code, msg) = decode_error_body(&frame.body);
        assert_eq!(code, ErrorCode::OBJECT_NOT_FOUND);
        assert!(msg.len() <= 1024 && msg.starts_with('é'));
        assert_eq!(decode_error_body(&[1]).0, ErrorCode::INTERNAL_ERROR);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let decoder = FrameDecoder::new(48);
            let mut buf = BytesMut::from(&data[..]);
            // Either a frame, "need more" or an error; never a panic, never more than the limit.
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                proptest::prop_assert!(frame.body.len() + HEADER_BYTES <= 48);
            }
        }
    }
}
