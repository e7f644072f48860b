//! Fuzzes the client-op decoder (what a server reads from untrusted clients): no panic,
//! bounded buffering, and split-independent results.
#![no_main]

use canopy_protocols::native::ClientDecoder;
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    let mut whole = ClientDecoder::new(split::LIMITS);
    let expected = split::run(data, &[usize::MAX], |buf| whole.decode(buf));
    let mut pieces = ClientDecoder::new(split::LIMITS);
    let got = split::run(data, &split::sizes(data), |buf| pieces.decode(buf));
    assert_eq!(expected, got);
});
