//! Fuzzes the MQTT decoder as a client runs it (level known, bytes from a server), at each
//! of the three levels: no panic, bounded buffering, split-independent results, and decoded
//! packets that encode back to themselves.
#![no_main]

use canopy_protocols::mqtt::{Decoder, Level};
use libfuzzer_sys::fuzz_target;

mod split;

fuzz_target!(|data: &[u8]| {
    for level in [Level::V31, Level::V311, Level::V5] {
        let decoder = Decoder::with_level(level, split::MAX_PACKET);
        let outcome = split::check(&decoder, data);
        split::stream::assert_reencodes(&decoder, &outcome);
    }
});
