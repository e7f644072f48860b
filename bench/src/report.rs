//! The result of one NATS run: a struct for `--json` and a one-line summary for people.
//!
//! Owns: what a NATS run reports beyond what every run measures ([`Measured`]): the
//! server's INFO, the durable and replay details, and how it is printed.
//!
//! Must never: compute anything from the network (shapes fill it in), or print a rate
//! without saying what was counted.

use std::fmt;

use canopy_protocols::native::ServerInfo;
use serde::Serialize;

use super::Options;
use super::measured::{Measured, micros, percentiles, rate};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub shape: &'static str,
    /// The URL given.
    pub server: String,
    /// `version` and `go` from the server's INFO (Canopy says `go: canopy <version>`).
    pub server_version: String,
    pub server_go: String,
    /// Counts, span, rates and latency (reqrep: round trip; durable/replay: send -> ack).
    #[serde(flatten)]
    pub measured: Measured,
    /// Publishes per second the publishers were paced at (0: unpaced).
    pub rate: u64,
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
    /// The longest any publisher waited between two acks in a row.
    pub max_ack_gap_ns: u64,
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

impl Report {
    /// What `options` asked of the server `info` describes, and what was measured.
    pub fn new(options: &Options, info: ServerInfo, measured: Measured) -> Report {
        Report {
            shape: options.shape.name(),
            server: options.server.clone(),
            server_version: info.version,
            server_go: info.go,
            measured,
            rate: options.ws.rate,
            durable: None,
            replay: None,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.measured;
        if let Some(d) = &self.durable {
            write!(
                f,
                "{:<7} {} acked of {} x {} B, {} pub over {} subjects, window {}{}: {} acks/s \
                 in {:.2} s; ack latency {}, longest gap between acks {} [{} {}; {}]",
                self.shape,
                m.delivered,
                m.msgs,
                m.size,
                m.publishers,
                d.subjects,
                d.ack_window,
                if d.expect { ", expected versions" } else { "" },
                rate(m.msgs_per_sec),
                m.elapsed_secs,
                percentiles(&m.latency),
                micros(d.max_ack_gap_ns),
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
        let what = match m.window {
            Some(window) => format!(
                "{} requests x {} B, window {window}: {} round trips/s",
                m.msgs,
                m.size,
                rate(m.msgs_per_sec)
            ),
            None => format!(
                "{} msgs x {} B, {} pub -> {} sub{}: {} msgs/s received ({} published/s)",
                m.msgs,
                m.size,
                m.publishers,
                m.subscribers,
                match self.rate {
                    0 => String::new(),
                    paced => format!(", paced at {paced}/s"),
                },
                rate(m.msgs_per_sec),
                rate(m.published_per_sec)
            ),
        };
        write!(
            f,
            "{:<7} {what} in {:.2} s; latency {} [{} {}]",
            self.shape,
            m.elapsed_secs,
            percentiles(&m.latency),
            self.server_version,
            self.server_go,
        )
    }
}
