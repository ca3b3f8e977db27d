//! The op-log batch decoder on arbitrary bytes: never a panic; a batch it accepts re-encodes
//! to bytes that decode to the same batch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mooncake_oplog::batch;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = batch::decode(data) {
        let again = batch::encode(&b);
        let back = batch::decode(&again).expect("a re-encoded batch decodes");
        assert_eq!(back, b);
    }
});
