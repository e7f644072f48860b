//! How long the store's writes take, as cumulative histograms for `/metrics`.
//!
//! Plain relaxed atomics, updated by the writer and acker tasks once per group
//! commit; never read to decide anything, never behind a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds (Prometheus `le`), the last being +Inf.
pub const BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram: counts per bucket (not cumulative; summed when read), the
/// count and the sum in microseconds.
#[derive(Debug, Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Latency {
    pub fn record(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let at = BUCKETS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(BUCKETS.len());
        if let Some(bucket) = self.buckets.get(at) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket bound (the last for +Inf), the count and the sum
    /// in seconds.
    pub fn read(&self) -> (Vec<u64>, u64, f64) {
        let mut running = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                running += b.load(Ordering::Relaxed);
                running
            })
            .collect();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (cumulative, self.count.load(Ordering::Relaxed), sum)
    }
}

/// The store's latencies.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// One group commit's write into the engine (the memtable and the WAL buffer).
    pub write: Latency,
    /// Making it durable: the journal's sync, or (without a journal) from the engine
    /// write to its WAL flushed to the object store.
    pub durable: Latency,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_when_read() {
        let latency = Latency::default();
        latency.record(Duration::from_micros(300));
        latency.record(Duration::from_millis(3));
        latency.record(Duration::from_secs(9));
        let (buckets, count, sum) = latency.read();
        assert_eq!(count, 3);
        assert_eq!(buckets.first(), Some(&1), "<= 0.5 ms");
        assert_eq!(buckets.get(3), Some(&2), "<= 5 ms");
        assert_eq!(buckets.last(), Some(&3), "+Inf holds all");
        assert!((sum - 9.0033).abs() < 1e-6, "{sum}");
    }
}
