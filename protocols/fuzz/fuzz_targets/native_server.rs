//! Fuzzes the server-op decoder (what Canopy's CLI reads from a server): no panic, bounded
//! buffering, and split-independent results.
#![no_main]

use canopy_protocols::native::ServerDecoder;
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    let mut whole = ServerDecoder::new(split::LIMITS);
    let expected = split::run(data, &[usize::MAX], |buf| whole.decode(buf));
    let mut pieces = ServerDecoder::new(split::LIMITS);
    let got = split::run(data, &split::sizes(data), |buf| pieces.decode(buf));
    assert_eq!(expected, got);
});
