//! Fuzzes the client-op decoder (what a server reads from untrusted clients): no panic,
//! bounded buffering, and split-independent results.
#![no_main]

use canopy_protocols::native::ClientDecoder;
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    split::check(&ClientDecoder::new(split::LIMITS), data);
});
