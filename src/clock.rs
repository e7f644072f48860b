//! The wall clock the server stamps and judges messages by (message times, MQTT
//! message and session expiry, retention ages, dedupe windows), injected so that
//! tests move it instead of sleeping for an expiry.
//!
//! A `Clock` is the system clock plus a skew that only [`Clock::advance`] changes;
//! every part of one server shares one `Clock`, so they agree on "now". It must never
//! go backwards: only advancing is offered. Timers (keep-alive, write deadlines,
//! will delays) are tokio's and are not this clock's business.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Milliseconds since the Unix epoch, as this server sees them.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    skew_ms: Arc<AtomicU64>,
}

impl Clock {
    pub fn now_ms(&self) -> u64 {
        system_ms().saturating_add(self.skew_ms.load(Ordering::Relaxed))
    }

    /// Moves this clock (and every part of the server sharing it) `by` forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.skew_ms.fetch_add(by, Ordering::Relaxed);
    }
}

/// Milliseconds since the Unix epoch by the system clock: for the command line, which
/// has no server clock; the server's parts use their [`Clock`].
pub fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_skew_and_only_move_forward() {
        let clock = Clock::default();
        let shared = clock.clone();
        let before = shared.now_ms();
        clock.advance(Duration::from_secs(3600));
        assert!(shared.now_ms() >= before + 3_600_000);
    }
}
