//! A small log-linear latency histogram (HDR-like): exact below 128 ns, then 64
//! sub-buckets per power of two, so any recorded value is reported within 1.6%.
//!
//! Owns: bucketing, merging and quantiles of nanosecond values.
//!
//! Must never: allocate while recording, or lose a recorded value (every `u64` has a bucket).

use serde::Serialize;

/// Values below this are their own bucket.
const LINEAR: u64 = 128;
/// log2 of the sub-buckets per power of two above `LINEAR`.
const SUB_BITS: u32 = 6;
const SUBS: usize = 1 << SUB_BITS;
/// The power of two of `LINEAR` (values 128..256 form the first log bucket).
const FIRST_EXP: u32 = 7;
const BUCKETS: usize = LINEAR as usize + (64 - FIRST_EXP as usize) * SUBS;

#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
    sum: u128,
}

/// What the reports show of a histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

fn index(value: u64) -> usize {
    if value < LINEAR {
        return value as usize;
    }
    let exp = 63 - value.leading_zeros(); // >= FIRST_EXP
    let sub = (value >> (exp - SUB_BITS)) as usize & (SUBS - 1);
    LINEAR as usize + (exp - FIRST_EXP) as usize * SUBS + sub
}

/// The middle of bucket `i`.
fn value_of(i: usize) -> u64 {
    if i < LINEAR as usize {
        return i as u64;
    }
    let j = i - LINEAR as usize;
    let exp = (j / SUBS) as u32 + FIRST_EXP;
    let sub = (j % SUBS) as u64;
    let width = 1u64 << (exp - SUB_BITS);
    ((SUBS as u64 + sub) << (exp - SUB_BITS)).saturating_add(width / 2)
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            count: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    pub fn record(&mut self, value: u64) {
        if let Some(slot) = self.counts.get_mut(index(value)) {
            *slot += 1;
        }
        self.count += 1;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.sum += u128::from(value);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// The value at quantile `q` (0.0..=1.0); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return value_of(i).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn summary(&self) -> Summary {
        if self.count == 0 {
            return Summary::default();
        }
        Summary {
            count: self.count,
            min_ns: self.min,
            p50_ns: self.quantile(0.50),
            p90_ns: self.quantile(0.90),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max,
            mean_ns: u64::try_from(self.sum / u128::from(self.count)).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_u64() {
        assert_eq!(index(127), 127);
        assert_eq!(index(128), 128);
        assert_eq!(index(255), 128 + 63);
        assert_eq!(index(256), 128 + 64);
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_two_percent() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let s = h.summary();
        assert_eq!(s.count, 100_000);
        assert_eq!(s.min_ns, 10);
        assert_eq!(s.max_ns, 1_000_000);
        for (got, want) in [(s.p50_ns, 500_000.0), (s.p99_ns, 990_000.0)] {
            assert!((got as f64 - want).abs() / want < 0.02, "{got} vs {want}");
        }
        let mut other = Histogram::new();
        other.record(5);
        h.merge(&other);
        assert_eq!(h.summary().min_ns, 5);
        assert_eq!(Histogram::new().summary(), Summary::default());
    }
}
