//! The result of one `ws-fanout` run: a struct for `--json` and a one-line summary for
//! people.
//!
//! Owns: what a WebSocket run reports beyond what every run measures ([`Measured`]):
//! the server's INFO, the WebSocket endpoint and API, the pace asked for.
//!
//! Must never: compute anything from the network (the shape fills it in), or print a
//! rate without saying what was counted.

use std::fmt;

use canopy_protocols::native::ServerInfo;
use serde::Serialize;

use super::super::Options;
use super::super::measured::{Measured, percentiles, rate};
use super::{PATTERN, WsApi};

#[derive(Debug, Clone, Serialize)]
pub struct WsReport {
    pub shape: &'static str,
    /// Always `ws`.
    pub protocol: &'static str,
    /// The publisher's URL (native protocol).
    pub server: String,
    /// The subscribers' WebSocket URL.
    pub ws_url: String,
    /// `canopy-json` or `nats`.
    pub ws_api: &'static str,
    /// `version` and `go` from the server's INFO to the publisher.
    pub server_version: String,
    pub server_go: String,
    /// Subjects `devices.<k>.temp` published round robin.
    pub devices: usize,
    /// Publishes per second asked for (0: unpaced, bounded by `max_in_flight`).
    pub rate: u64,
    /// `delivered` counts messages received by all subscribers together (one per
    /// subscriber and publish); `elapsed_secs` runs from the first send to the last
    /// receive; `latency` is send to receive of every delivery.
    #[serde(flatten)]
    pub measured: Measured,
}

impl WsReport {
    pub fn new(options: &Options, info: ServerInfo, api: WsApi, measured: Measured) -> WsReport {
        WsReport {
            shape: options.shape.name(),
            protocol: "ws",
            server: options.server.clone(),
            ws_url: options.ws.ws_url.clone(),
            ws_api: api.name(),
            server_version: info.version,
            server_go: info.go,
            devices: options.ws.devices,
            rate: options.ws.rate,
            measured,
        }
    }
}

impl fmt::Display for WsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.measured;
        let pace = if self.rate > 0 {
            format!("paced at {}/s", self.rate)
        } else {
            format!(
                "unpaced, max in flight {}",
                m.max_in_flight.unwrap_or_default()
            )
        };
        write!(
            f,
            "{} {} msgs x {} B, {} native pub -> {} WebSocket subs on {PATTERN} [{}]: {} \
             deliveries/s ({:.0} published/s, {pace}) in {:.2} s; latency {} [{} {}]",
            self.shape,
            m.msgs,
            m.size,
            m.publishers,
            m.subscribers,
            self.ws_api,
            rate(m.msgs_per_sec),
            m.published_per_sec,
            m.elapsed_secs,
            percentiles(&m.latency),
            self.server_version,
            self.server_go,
        )
    }
}
