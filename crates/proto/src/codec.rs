//! Body codec: postcard (compact varints, serde) with explicit limits. `docs/wire.md` describes
//! the byte layout of the bodies.

use bytes::{BufMut, BytesMut};
use mooncake_common::{numbered, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

/// A body that could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    #[error("cannot encode body: {0}")]
    Encode(String),
    #[error("cannot decode body: {0}")]
    Decode(String),
}

impl CodecError {
    pub fn code(&self) -> ErrorCode {
        match self {
            CodecError::Encode(_) => ErrorCode::SERIALIZE_FAIL,
            CodecError::Decode(_) => ErrorCode::DESERIALIZE_FAIL,
        }
    }
}

/// Appends the encoding of `value` to `out`.
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut BytesMut) -> Result<(), CodecError> {
    let writer = out.writer();
    postcard::to_io(value, writer).map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(())
}

/// Encodes `value` into a new buffer.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<BytesMut, CodecError> {
    let mut out = BytesMut::new();
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Decodes a whole body; trailing bytes are an error (a body is exactly one value). A number
/// that an upstream enum does not define is named in the error (`unknown ReplicaType number 7`).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    // postcard drops serde's error messages; the enums leave what they refused here instead.
    let _stale = numbered::take_refused();
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| match numbered::take_refused() {
            Some(refused) => CodecError::Decode(refused.to_string()),
            None => CodecError::Decode(e.to_string()),
        })?;
    if !rest.is_empty() {
        return Err(CodecError::Decode(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}
