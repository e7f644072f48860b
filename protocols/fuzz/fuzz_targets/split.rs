//! Shared by the fuzz targets: decodes one input whole and in chunks whose sizes come from
//! the input, and checks both give the same frames, error and leftover. The chunk driver,
//! its buffering bound (the native limits' `max_control_line + max_payload + 64`, or the MQTT
//! packet size limit) and the MQTT re-encoding check are the integration tests'
//! `tests/common/stream.rs`, included here by path.
//!
//! Must never: use randomness that is not derived from the input (a crash must replay).

#![allow(dead_code)]

#[path = "../../tests/common/stream.rs"]
pub mod stream;

use canopy_protocols::native::Limits;
use stream::{Decode, OutcomeOf, run, whole};

/// Small limits so the fuzzer reaches them quickly.
pub const LIMITS: Limits = Limits {
    max_control_line: 256,
    max_payload: 512,
};

/// Small, so the fuzzer reaches the MQTT packet size limit quickly.
pub const MAX_PACKET: usize = 512;

/// Chunk sizes derived from the input (xorshift seeded by its length and last byte).
pub fn sizes(data: &[u8]) -> Vec<usize> {
    let mut x = (data.len() as u64) << 8 | u64::from(data.last().copied().unwrap_or(0)) | 1;
    let max = [1usize, 3, 16, 64][usize::from(data.first().copied().unwrap_or(0) & 3)];
    (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % max as u64) as usize
        })
        .collect()
}

/// Decodes `data` with copies of `decoder`, whole and in chunks of [`sizes`] (cycled), checks
/// both give the same outcome, and returns it.
pub fn check<D: Decode>(decoder: &D, data: &[u8]) -> OutcomeOf<D> {
    let expected = whole(decoder, data);
    let got = run(decoder, data, &mut sizes(data).into_iter().cycle());
    assert_eq!(expected, got);
    expected
}
