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
    /// durable/replay: what was asked of the store (`latency` is then send -> ack).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durable: Option<DurableInfo>,
    /// replay: the timed reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayStats>,
}

/// How a durable run asked for acks.
#[derive(Debug, Clone, Serialize)]
pub struct DurableInfo {
    /// `canopy` or `nats-server` (from INFO).
    pub server_kind: &'static str,
    /// How acks were requested, and what the ack means.
    pub acks: String,
    pub subjects: usize,
    /// Unacknowledged publishes per connection.
    pub ack_window: usize,
    /// Every publish carried an expected version / last subject sequence.
    pub expect: bool,
    /// Publishes answered with an error (a run with any fails).
    pub errors: u64,
}

/// Timed reads of one subject's first messages each.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayStats {
    /// How the subject was read.
    pub method: String,
    /// Subjects read, one after another on one connection.
    pub samples: usize,
    /// Messages asked for per subject.
    pub max: usize,
    /// Fewest messages one read returned.
    pub min_count: usize,
    /// From sending the request to receiving the last message (or the end marker).
    pub median_ns: u64,
    pub min_ns: u64,
    pub p90_ns: u64,
    pub max_ns: u64,
    pub times_ns: Vec<u64>,
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
        if let Some(d) = &self.durable {
            write!(
                f,
                "{:<7} {} acked of {} x {} B, {} pub over {} subjects, window {}{}: {} acks/s \
                 in {:.2} s; ack latency p50 {} p99 {} p99.9 {} max {} [{} {}; {}]",
                self.shape,
                self.delivered,
                self.msgs,
                self.size,
                self.publishers,
                d.subjects,
                d.ack_window,
                if d.expect { ", expected versions" } else { "" },
                rate(self.msgs_per_sec),
                self.elapsed_secs,
                micros(self.latency.p50_ns),
                micros(self.latency.p99_ns),
                micros(self.latency.p999_ns),
                micros(self.latency.max_ns),
                d.server_kind,
                self.server_version,
                d.acks,
            )?;
            if let Some(r) = &self.replay {
                write!(
                    f,
                    "\nreplay  first {} msgs of one subject (at least {} returned), {} subjects: \
                     median {} min {} p90 {} max {} [{}]",
                    r.max,
                    r.min_count,
                    r.samples,
                    micros(r.median_ns),
                    micros(r.min_ns),
                    micros(r.p90_ns),
                    micros(r.max_ns),
                    r.method,
                )?;
            }
            return Ok(());
        }
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
