//! A GCRA token bucket: the one rate a tenant's limits, its pattern rates and a
//! client's own share. Must never block: one atomic per bucket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// No limit, in a limit's atomic.
pub(super) const UNLIMITED: u64 = u64::MAX;
/// How much of a rate may arrive at once: one second of it.
const BURST: Duration = Duration::from_secs(1);
/// The longest a refused publisher is told to wait.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(1);

/// A GCRA bucket: the theoretical arrival time of the next unit, in nanoseconds
/// since the quota's epoch, and the cost of one unit.
#[derive(Debug)]
pub(super) struct Rate {
    /// Units per second; `UNLIMITED` when off.
    limit: AtomicU64,
    tat: AtomicU64,
}

impl Rate {
    pub(super) fn new() -> Self {
        Self {
            limit: AtomicU64::new(UNLIMITED),
            tat: AtomicU64::new(0),
        }
    }

    pub(super) fn set(&self, limit: Option<u64>) {
        let limit = limit.unwrap_or(UNLIMITED).max(1);
        if self.limit.swap(limit, Ordering::Relaxed) != limit {
            // A new rate starts with a full bucket and no debt from the old one.
            self.tat.store(0, Ordering::Relaxed);
        }
    }

    pub(super) fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|l| *l != UNLIMITED)
    }

    /// Whether the bucket is full at `now` (no debt, no unit taken within a whole
    /// burst): the same as a new one.
    pub(super) fn rested(&self, now: u64) -> bool {
        self.tat.load(Ordering::Relaxed) <= now
    }

    /// Gives back `units` taken by a publish that another bucket then refused.
    pub(super) fn refund(&self, units: u64) {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == UNLIMITED {
            return;
        }
        let cost = u64::try_from(u128::from(units) * 1_000_000_000 / u128::from(limit))
            .unwrap_or(u64::MAX);
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(tat.saturating_sub(cost))
            });
    }

    /// Takes `units` at `now`; on refusal, how long until they would fit (at most
    /// [`MAX_WAIT`]: the client tries again). `force` takes them even then, into
    /// debt, and says how long the whole debt takes to pay: the publisher must pause
    /// that long, so a throttled connection adds at most one message of debt.
    pub(super) fn take(&self, units: u64, now: u64, force: bool) -> Result<(), Duration> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == UNLIMITED {
            return Ok(());
        }
        let cost = u64::try_from(u128::from(units) * 1_000_000_000 / u128::from(limit))
            .unwrap_or(u64::MAX);
        let burst = BURST.as_nanos() as u64;
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            let next = start.saturating_add(cost);
            // A message bigger than a whole burst still passes when the bucket is
            // full, or a large message could never be sent at a low byte rate.
            let over = next > now.saturating_add(burst) && start > now;
            let wait = || Duration::from_nanos(next - now - burst);
            if over && !force {
                return Err(wait().min(MAX_WAIT));
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) if over => return Err(wait()),
                Ok(_) => return Ok(()),
                Err(seen) => tat = seen,
            }
        }
    }
}
