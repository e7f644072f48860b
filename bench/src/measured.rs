//! What every run measures, whatever protocol it speaks: how many messages went between
//! how many connections, the measured span, the rates over it and the latency summary
//! ([`Measured`], flattened into the JSON of both reports), and how those numbers read
//! for people ([`rate`], [`micros`], [`percentiles`]).
//!
//! Owns: turning what the roles tallied ([`Received`]) into counts, spans and rates, and
//! the fields those take in `--json`.
//!
//! Must never: know a protocol or a shape (the reports around it do), read the network,
//! or divide by a zero span.

use serde::Serialize;

use super::histogram::{Histogram, Summary};
use super::roles::Received;

/// The counts, span, rates and latency every report carries, in this order.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Messages published (reqrep: requests sent; mqtt-retained: messages loaded;
    /// mqtt-idle: 0).
    pub msgs: u64,
    pub size: usize,
    pub publishers: usize,
    pub subscribers: usize,
    /// Publisher shapes: the end-to-end bound on messages in flight (0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// reqrep: requests outstanding at once; QoS 1 shapes: unacknowledged publishes per
    /// connection (after a v5 server's Receive Maximum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Messages received by all subscribers together (fan-out: one per subscriber and
    /// publish; reqrep: replies; acked shapes: acks; mqtt-idle: connections opened).
    pub delivered: u64,
    /// From the first send to the last receive (each report says where else it differs).
    pub elapsed_secs: f64,
    /// `delivered / elapsed_secs`.
    pub msgs_per_sec: f64,
    /// `msgs / elapsed_secs` (0 where nothing is published over the span).
    pub published_per_sec: f64,
    /// Send to receive (reqrep: round trip; acked shapes: send to ack; mqtt-idle: connect
    /// to CONNACK), in nanoseconds.
    pub latency: Summary,
    /// CPUs this process could use; the server under test shares them if it is local.
    pub cpus: usize,
}

impl Measured {
    /// `msgs` messages of `size` bytes between `publishers` and `subscribers`
    /// connections, nothing delivered yet.
    pub fn new(msgs: u64, size: usize, publishers: usize, subscribers: usize) -> Measured {
        Measured {
            msgs,
            size,
            publishers,
            subscribers,
            max_in_flight: None,
            window: None,
            delivered: 0,
            elapsed_secs: 0.0,
            msgs_per_sec: 0.0,
            published_per_sec: 0.0,
            latency: Summary::default(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// Publishers waited while more than `max_in_flight` messages were in flight.
    pub fn bounded(self, max_in_flight: u64) -> Measured {
        Measured {
            max_in_flight: Some(max_in_flight),
            ..self
        }
    }

    /// `window` requests outstanding, or unacknowledged publishes per connection.
    pub fn windowed(self, window: u64) -> Measured {
        Measured {
            window: Some(window),
            ..self
        }
    }

    /// `delivered` messages in `elapsed_secs`, their times summed up in `latency`.
    pub fn delivered(self, delivered: u64, elapsed_secs: f64, latency: Summary) -> Measured {
        Measured {
            delivered,
            elapsed_secs,
            msgs_per_sec: delivered as f64 / elapsed_secs,
            latency,
            ..self
        }
    }

    /// Everything the roles tallied, over the span from `start` to the last arrival;
    /// the published rate is over the same span.
    pub fn received<'a>(
        self,
        start: u64,
        tallies: impl IntoIterator<Item = &'a Received>,
    ) -> Measured {
        let mut latency = Histogram::new();
        let mut delivered = 0;
        let mut last = start;
        for tally in tallies {
            latency.merge(&tally.latency);
            delivered += tally.count;
            last = last.max(tally.last_ns);
        }
        let elapsed_secs = secs_between(start, last);
        Measured {
            published_per_sec: self.msgs as f64 / elapsed_secs,
            ..self.delivered(delivered, elapsed_secs, latency.summary())
        }
    }
}

/// Seconds from `start` to `end` (both `now_ns()`), never zero, so rates stay finite.
pub fn secs_between(start: u64, end: u64) -> f64 {
    (end.saturating_sub(start) as f64 / 1e9).max(1e-9)
}

/// `1.5 µs`, `2.50 ms`.
pub fn micros(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

/// `12.3k`, `1.50M` (per second).
pub fn rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2}M", per_sec / 1e6)
    } else {
        format!("{:.1}k", per_sec / 1e3)
    }
}

/// `p50 … p99 … p99.9 … max …`: the latency part of every one-line summary.
pub fn percentiles(latency: &Summary) -> String {
    format!(
        "p50 {} p99 {} p99.9 {} max {}",
        micros(latency.p50_ns),
        micros(latency.p99_ns),
        micros(latency.p999_ns),
        micros(latency.max_ns),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_times_read_well() {
        assert_eq!(rate(1_500_000.0), "1.50M");
        assert_eq!(rate(12_345.0), "12.3k");
        assert_eq!(micros(1_500), "1.5 µs");
        assert_eq!(micros(2_500_000), "2.50 ms");
    }

    #[test]
    fn tallies_add_up_over_the_span_to_the_last_arrival() {
        let mut a = Received::new();
        a.arrived(3_000_000_000, &1_000_000_000u64.to_le_bytes());
        let mut b = Received::new();
        b.arrived(2_000_000_000, &1_500_000_000u64.to_le_bytes());
        let m = Measured::new(4, 8, 1, 2).received(1_000_000_000, [&a, &b]);
        assert_eq!(m.delivered, 2);
        assert_eq!(m.elapsed_secs, 2.0);
        assert_eq!(m.msgs_per_sec, 1.0);
        assert_eq!(m.published_per_sec, 2.0);
        assert_eq!(m.latency.count, 2);
        let none = Measured::new(0, 8, 0, 0).received(5, []);
        assert_eq!((none.delivered, none.elapsed_secs), (0, 1e-9));
    }
}
