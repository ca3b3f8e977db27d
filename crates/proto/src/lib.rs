//! The wire format of mooncake-rs's master RPC: length-prefixed frames with a version byte, a
//! method id and a request id (so one connection carries many requests in flight), bodies encoded
//! with postcard, and explicit limits.
//!
//! Owns: framing, limits, the codec. Must never: do I/O, panic on any input, or allocate more than
//! the frame limit because a peer said so.
#![forbid(unsafe_code)]

pub mod codec;
pub mod frame;
pub mod limits;
pub mod methods;
pub mod sizes;

pub use codec::{decode, encode, encode_into, CodecError};
pub use frame::{
    decode_error_body, encode_error, encode_frame, encode_header, Frame, FrameDecoder, FrameError,
    FrameHeader, FrameKind, DEFAULT_MAX_FRAME_BYTES, HEADER_BYTES, PROTOCOL_VERSION,
};
pub use limits::Limits;
pub use methods::{method_name, Method, Reply, METHODS};
pub use sizes::max_request_frame_bytes;
