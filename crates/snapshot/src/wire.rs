//! The primitive encodings: little-endian integers, LEB128 varints, length-prefixed strings and
//! 16-byte ids, and a bounds-checked reader over a verified payload.
//!
//! The reader is used only on bytes whose CRC already matched, so running out of bytes or an
//! out-of-range value inside a payload is corruption ([`SnapshotError::Corrupt`]), not
//! truncation. Every length is checked against the bytes left before anything is allocated.

use mooncake_common::ids::Uuid;

use crate::SnapshotError;

/// Longest string (key, name, path, endpoint) a record may carry.
pub(crate) const MAX_STRING_BYTES: usize = 1 << 20;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn put_uuid(out: &mut Vec<u8>, id: Uuid) {
    out.extend_from_slice(&id.first.to_le_bytes());
    out.extend_from_slice(&id.second.to_le_bytes());
}

/// Reads a verified payload; `what` names it in errors.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn err(&self, reason: impl std::fmt::Display) -> SnapshotError {
        SnapshotError::corrupt(format!("{} at byte {}: {reason}", self.what, self.pos))
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if n > self.remaining() {
            return Err(self.err(format!("needs {n} more bytes, {} left", self.remaining())));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u64_le(&mut self) -> Result<u64, SnapshotError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(b))
    }

    pub(crate) fn uuid(&mut self) -> Result<Uuid, SnapshotError> {
        let first = self.u64_le()?;
        let second = self.u64_le()?;
        Ok(Uuid::new(first, second))
    }

    pub(crate) fn varint(&mut self) -> Result<u64, SnapshotError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    pub(crate) fn varint_u32(&mut self) -> Result<u32, SnapshotError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.err(format!("{v} does not fit 32 bits")))
    }

    /// A count or length: at most `limit` and at most the bytes left divided by `min_each`
    /// (the fewest bytes one element takes), so what it sizes is justified by the input.
    pub(crate) fn count(&mut self, limit: usize, min_each: usize) -> Result<usize, SnapshotError> {
        let v = self.varint()?;
        let cap = (self.remaining() / min_each.max(1)).min(limit);
        match usize::try_from(v) {
            Ok(n) if n <= cap => Ok(n),
            _ => Err(self.err(format!("count {v} exceeds what is left (at most {cap})"))),
        }
    }

    pub(crate) fn bool(&mut self) -> Result<bool, SnapshotError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("boolean byte {b}"))),
        }
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, SnapshotError> {
        let n = self.count(MAX_STRING_BYTES, 1)?;
        let bytes = self.bytes(n)?;
        std::str::from_utf8(bytes).map_err(|_| self.err("string is not UTF-8"))
    }

    pub(crate) fn string(&mut self) -> Result<String, SnapshotError> {
        self.str().map(str::to_string)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<(), SnapshotError> {
        if self.remaining() != 0 {
            return Err(self.err(format!("{} bytes left over", self.remaining())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_overflow_is_refused() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out, "test");
            assert_eq!(r.varint().ok(), Some(v));
            assert!(r.finish().is_ok());
        }
        let mut max = Vec::new();
        put_varint(&mut max, u64::MAX);
        assert_eq!(max.len(), 10);
        max[9] = 2;
        assert!(Reader::new(&max, "test").varint().is_err());
        assert!(Reader::new(&[0x80; 11], "test").varint().is_err());
        assert!(Reader::new(&[0x80], "test").varint().is_err());
    }

    #[test]
    fn counts_are_capped_by_the_bytes_left() {
        let mut out = Vec::new();
        put_varint(&mut out, 5);
        out.extend_from_slice(&[0; 4]);
        assert!(Reader::new(&out, "t").count(100, 1).is_err());
        out.push(0);
        assert_eq!(Reader::new(&out, "t").count(100, 1).ok(), Some(5));
        assert!(Reader::new(&out, "t").count(4, 1).is_err());
        assert!(Reader::new(&out, "t").count(100, 2).is_err());
    }
}
