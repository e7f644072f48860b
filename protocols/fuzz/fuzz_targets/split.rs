//! Shared by the fuzz targets: decodes one input whole and in chunks whose sizes come from
//! the input's last byte, and checks both give the same frames, error and leftover, and that a
//! decoder never leaves more than `max_control_line + max_payload + 64` bytes buffered.
//!
//! Must never: use randomness that is not derived from the input (a crash must replay).

use bytes::BytesMut;
use canopy_protocols::native::{Limits, ProtocolError};

/// Small limits so the fuzzer reaches them quickly.
pub const LIMITS: Limits = Limits {
    max_control_line: 256,
    max_payload: 512,
};

#[derive(Debug, PartialEq)]
pub struct Outcome<Op> {
    frames: Vec<Op>,
    error: Option<ProtocolError>,
    left: usize,
}

/// Feeds `input` in chunks of `sizes` (cycled) to `decode`.
pub fn run<Op, F>(input: &[u8], sizes: &[usize], mut decode: F) -> Outcome<Op>
where
    F: FnMut(&mut BytesMut) -> Result<Option<Op>, ProtocolError>,
{
    let bound = LIMITS.max_control_line + LIMITS.max_payload + 64;
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = input;
    let mut sizes = sizes.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            match decode(&mut buf) {
                Ok(Some(op)) => frames.push(op),
                Ok(None) => break,
                Err(error) => {
                    return Outcome {
                        frames,
                        error: Some(error),
                        left: 0,
                    };
                }
            }
        }
        assert!(buf.len() <= bound, "{} bytes buffered", buf.len());
    }
    Outcome {
        frames,
        error: None,
        left: buf.len(),
    }
}

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
