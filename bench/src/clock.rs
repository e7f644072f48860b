//! The benchmark's clock: nanoseconds since one process-wide `Instant`, and the 8-byte
//! send timestamp at the start of every payload.
//!
//! Owns: the epoch all timestamps are measured from, and the payload layout of the stamp
//! (little-endian `u64` in bytes 0..8).
//!
//! Must never: use wall-clock time (it can jump), or be compared across processes: a stamp
//! only means something to a reader in the process that wrote it.

use std::sync::OnceLock;
use std::time::Instant;

/// Bytes of the send timestamp at the front of every payload.
pub const STAMP_LEN: usize = 8;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the process-wide epoch (fixed at the first call).
pub fn now_ns() -> u64 {
    let elapsed = EPOCH.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// Writes `now_ns()` into the first [`STAMP_LEN`] bytes of `payload` (if it has room).
pub fn stamp(payload: &mut [u8]) {
    if let Some(head) = payload.get_mut(..STAMP_LEN) {
        head.copy_from_slice(&now_ns().to_le_bytes());
    }
}

/// The send time stamped into `payload`, if it is long enough to carry one.
pub fn read_stamp(payload: &[u8]) -> Option<u64> {
    let head: [u8; STAMP_LEN] = payload.get(..STAMP_LEN)?.try_into().ok()?;
    Some(u64::from_le_bytes(head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_move_forward() {
        let mut payload = [0u8; 16];
        let before = now_ns();
        stamp(&mut payload);
        let stamped = read_stamp(&payload).unwrap_or_default();
        assert!(stamped >= before);
        assert!(now_ns() >= stamped);
        assert_eq!(read_stamp(&payload[..7]), None);
    }
}
