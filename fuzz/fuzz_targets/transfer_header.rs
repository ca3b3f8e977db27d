//! Fuzzes the TCP data-plane header decoder (`mooncake_transfer::wire::Header::decode`):
//! it must never panic, and whatever it accepts must re-encode to the same bytes and respect
//! the payload limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_transfer::wire::{Header, HEADER_BYTES, MAX_PAYLOAD_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::decode(data) {
        assert_eq!(&header.encode()[..], &data[..HEADER_BYTES]);
        assert!(header.length <= MAX_PAYLOAD_BYTES);
        assert!(header.offset.checked_add(header.length).is_some());
        assert!(header.payload_bytes() <= header.length);
    }
});
