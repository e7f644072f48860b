//! Fuzzes the MQTT decoder as a server runs it (level learnt from the first CONNECT, bytes
//! from untrusted clients): no panic, bounded buffering, split-independent results, and
//! decoded packets that encode back to themselves.
#![no_main]

use canopy_protocols::mqtt::Decoder;
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    let decoder = Decoder::new(split::MAX_PACKET);
    let outcome = split::check(&decoder, data);
    split::stream::assert_reencodes(&decoder, &outcome);
});
