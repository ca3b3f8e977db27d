//! Fuzzes the master snapshot decoder: nothing may panic or allocate past what the input
//! justifies; an accepted snapshot re-encodes (uncompressed and compressed) and decodes to the
//! same header and state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_snapshot::{decode, encode_state, EncodeOptions};

fuzz_target!(|data: &[u8]| {
    if let Ok((meta, state)) = decode(data) {
        for zstd_level in [None, Some(1)] {
            let bytes = encode_state(
                &state,
                &meta,
                &EncodeOptions {
                    zstd_level,
                    ..Default::default()
                },
            );
            let (meta2, state2) = decode(&bytes).expect("a re-encoded snapshot decodes");
            assert_eq!(meta2, meta);
            assert_eq!(state2, state);
        }
    }
});
