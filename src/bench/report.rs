//! The result of one run: a struct for `--json` and a one-line summary for people.
//!
//! Owns: what a run reports and how it is printed.
//!
//! Must never: compute anything from the network (shapes fill it in), or print a rate
//! without saying what was counted.

use std::fmt;

use serde::Serialize;

use super::histogram::Summary;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub shape: &'static str,
    /// The URL given.
    pub server: String,
    /// `version` and `go` from the server's INFO (Canopy says `go: canopy <version>`).
    pub server_version: String,
    pub server_go: String,
    /// Messages published (reqrep: requests sent).
    pub msgs: u64,
    pub size: usize,
    pub publishers: usize,
    pub subscribers: usize,
    /// Publisher shapes: the end-to-end bound on messages in flight (0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// reqrep: requests outstanding at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Messages received by all subscribers together (fan-out: 10 per publish; reqrep:
    /// replies).
    pub delivered: u64,
    /// From the first send to the last receive.
    pub elapsed_secs: f64,
    /// `delivered / elapsed_secs`.
    pub msgs_per_sec: f64,
    /// `msgs / elapsed_secs`.
    pub published_per_sec: f64,
    /// One-way send-to-receive time (reqrep: round trip), in nanoseconds.
    pub latency: Summary,
    /// CPUs this process could use; the server under test shares them if it is local.
    pub cpus: usize,
}

fn micros(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2}M", per_sec / 1e6)
    } else {
        format!("{:.1}k", per_sec / 1e3)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.window {
            Some(window) => format!(
                "{} requests x {} B, window {window}: {} round trips/s",
                self.msgs,
                self.size,
                rate(self.msgs_per_sec)
            ),
            None => format!(
                "{} msgs x {} B, {} pub -> {} sub: {} msgs/s received ({} published/s)",
                self.msgs,
                self.size,
                self.publishers,
                self.subscribers,
                rate(self.msgs_per_sec),
                rate(self.published_per_sec)
            ),
        };
        write!(
            f,
            "{:<7} {what} in {:.2} s; latency p50 {} p99 {} p99.9 {} max {} [{} {}]",
            self.shape,
            self.elapsed_secs,
            micros(self.latency.p50_ns),
            micros(self.latency.p99_ns),
            micros(self.latency.p999_ns),
            micros(self.latency.max_ns),
            self.server_version,
            self.server_go,
        )
    }
}
