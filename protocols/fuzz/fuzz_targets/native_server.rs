//! Fuzzes the server-op decoder (what Canopy's CLI reads from a server): no panic, bounded
//! buffering, and split-independent results.
#![no_main]

use canopy_protocols::native::ServerDecoder;
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    split::check(&ServerDecoder::new(split::LIMITS), data);
});
