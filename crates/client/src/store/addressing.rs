//! How a store node's segments appear in the master's address space.
//!
//! The master hands out `buffer_address = segment.base + offset`. The transfer engine addresses
//! memory as `(segment id, offset)` at an endpoint. We mount each segment with the synthetic base
//! `segment_id << 40`, so any buffer address splits back into both without another lookup, no
//! process reveals its real memory layout, and segments up to 1 TiB (upstream's limit) fit.

/// Bits of offset inside one segment.
pub const SEGMENT_OFFSET_BITS: u32 = 40;
/// Largest segment this addressing can express (1 TiB).
pub const MAX_SEGMENT_BYTES: u64 = 1 << SEGMENT_OFFSET_BITS;

/// The base address a segment is mounted at.
pub fn segment_base(segment_id: u64) -> Option<u64> {
    if segment_id == 0 || segment_id >= (1 << (64 - SEGMENT_OFFSET_BITS)) {
        return None;
    }
    Some(segment_id << SEGMENT_OFFSET_BITS)
}

/// Splits a buffer address into `(segment id, offset)`.
pub fn split_address(address: u64) -> (u64, u64) {
    (
        address >> SEGMENT_OFFSET_BITS,
        address & (MAX_SEGMENT_BYTES - 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let base = segment_base(7).unwrap_or(0);
        assert_eq!(split_address(base), (7, 0));
        assert_eq!(split_address(base + 12345), (7, 12345));
        assert_eq!(
            split_address(base + MAX_SEGMENT_BYTES - 1),
            (7, MAX_SEGMENT_BYTES - 1)
        );
        // The fixed example of docs/client.md: segment 7, offset 12345.
        assert_eq!(base + 12345, 0x0000_0700_0000_3039);
        assert_eq!(split_address(0x0000_0700_0000_3039), (7, 12345));
        assert_eq!(segment_base(0), None);
        assert_eq!(segment_base(1 << 24), None);
    }
}
