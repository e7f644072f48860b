//! Fuzzes the MQTT decoder as a server runs it (level learnt from the first CONNECT, bytes
//! from untrusted clients): no panic, bounded buffering, split-independent results, and
//! decoded packets that encode back to themselves.
#![no_main]

use canopy_protocols::mqtt::Decoder;
use libfuzzer_sys::fuzz_target;

mod mqtt_split;

fuzz_target!(|data: &[u8]| {
    mqtt_split::check(&Decoder::new(mqtt_split::MAX_PACKET), data);
});
