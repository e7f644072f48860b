//! The result of one MQTT run: a struct for `--json` and a one-line summary for people.
//!
//! Owns: what an MQTT run reports beyond what every run measures ([`Measured`]), what
//! the measured fields count per shape, and how it is printed.
//!
//! Must never: compute anything from the network (shapes fill it in), or print a rate
//! without saying what was counted.

use std::fmt;

use serde::Serialize;

use super::super::Options;
use super::super::histogram::{Histogram, Summary};
use super::super::measured::{Measured, micros, percentiles, rate, secs_between};
use super::super::roles::Acked;

#[derive(Debug, Clone, Serialize)]
pub struct MqttReport {
    pub shape: &'static str,
    /// Always `mqtt`.
    pub protocol: &'static str,
    /// The URL given.
    pub server: String,
    /// `3.1.1` or `5.0`.
    pub mqtt_version: &'static str,
    /// Per shape: `delivered` counts messages received by all subscribers together
    /// (fanin/fanout; fan-out: 100 per publish), PUBACKs (qos1), retained messages
    /// received (retained) or connections opened (idle); `elapsed_secs` runs from the
    /// first send to the last receive or PUBACK, from SUBSCRIBE to the last retained
    /// message, or from the first connect to the last CONNACK; `latency` is send to
    /// receive, send to PUBACK (qos1 and the retained load) or TCP connect to CONNACK;
    /// `published_per_sec` is 0 for retained and idle.
    #[serde(flatten)]
    pub measured: Measured,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained: Option<RetainedStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleStats>,
}

/// `mqtt-retained`: the load and the subscription.
#[derive(Debug, Clone, Serialize)]
pub struct RetainedStats {
    /// Retained messages loaded (QoS 1, RETAIN, each acked) and then received.
    pub retained: usize,
    /// First publish to last PUBACK of the load.
    pub load_secs: f64,
    pub load_acks_per_sec: f64,
    /// SUBSCRIBE `ret/#` sent to SUBACK received.
    pub suback_ns: u64,
    /// SUBSCRIBE sent to the last retained message received.
    pub all_delivered_ns: u64,
}

/// `mqtt-idle`: opening and holding the connections.
#[derive(Debug, Clone, Serialize)]
pub struct IdleStats {
    pub conns: usize,
    /// Loopback source addresses used (0: the system chose).
    pub sources: usize,
    /// Handshakes in progress at once.
    pub parallel: usize,
    /// The keep-alive asked for, seconds (0: none).
    pub keep_alive: u16,
    /// First connect to last CONNACK.
    pub connect_secs: f64,
    pub connects_per_sec: f64,
    /// Seconds held with every connection open.
    pub hold_secs: u64,
    /// Connections that received bytes while idle (none are expected).
    pub got_data: usize,
}

impl MqttReport {
    /// What `options` asked for, and what was measured (fanin and fanout: what the
    /// subscribers received).
    pub fn new(options: &Options, measured: Measured) -> MqttReport {
        MqttReport {
            shape: options.shape.name(),
            protocol: "mqtt",
            server: options.server.clone(),
            mqtt_version: options.mqtt.mqtt_version.name(),
            measured,
            retained: None,
            idle: None,
        }
    }

    /// qos1: the PUBACKs of every publisher.
    pub fn acked(options: &Options, start: u64, acked: &[Acked], window: u64) -> MqttReport {
        let publishers = options.durable.publishers.max(1);
        let measured = Measured::new(options.msgs, options.size, publishers, 0)
            .received(start, acked.iter().map(|a| &a.acks))
            .windowed(window);
        MqttReport::new(options, measured)
    }

    /// retained: the load's ack latency and the subscription's timings.
    pub fn retained(
        options: &Options,
        load_latency: Summary,
        window: u64,
        stats: RetainedStats,
    ) -> MqttReport {
        let n = stats.retained as u64;
        let publishers = options.durable.publishers.max(1);
        let measured = Measured::new(n, options.size, publishers, 1)
            .delivered(n, secs_between(0, stats.all_delivered_ns), load_latency)
            .windowed(window);
        MqttReport {
            retained: Some(stats),
            ..MqttReport::new(options, measured)
        }
    }

    /// idle: the connections opened.
    pub fn idle(options: &Options, connect_latency: &Histogram, stats: IdleStats) -> MqttReport {
        let measured = Measured::new(0, options.size, 0, 0).delivered(
            stats.conns as u64,
            stats.connect_secs,
            connect_latency.summary(),
        );
        MqttReport {
            idle: Some(stats),
            ..MqttReport::new(options, measured)
        }
    }
}

impl fmt::Display for MqttReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.measured;
        let tail = format!("{} [MQTT {}]", percentiles(&m.latency), self.mqtt_version);
        if let Some(idle) = &self.idle {
            return write!(
                f,
                "{} {} connections ({} source addresses, keep-alive {} s) in {:.2} s: {} \
                 connects/s, held {} s; connect to CONNACK {tail}",
                self.shape,
                idle.conns,
                idle.sources,
                idle.keep_alive,
                idle.connect_secs,
                rate(idle.connects_per_sec),
                idle.hold_secs,
            );
        }
        if let Some(r) = &self.retained {
            return write!(
                f,
                "{} {} retained x {} B loaded by {} pub in {:.2} s ({} acks/s, window {}); \
                 SUBSCRIBE ret/# -> SUBACK {} -> all {} received {} ({} msgs/s); load ack \
                 latency {tail}",
                self.shape,
                r.retained,
                m.size,
                m.publishers,
                r.load_secs,
                rate(r.load_acks_per_sec),
                m.window.unwrap_or_default(),
                micros(r.suback_ns),
                r.retained,
                micros(r.all_delivered_ns),
                rate(m.msgs_per_sec),
            );
        }
        let what = match m.window {
            Some(window) => format!(
                "{} QoS 1 msgs x {} B, {} pub, window {window}: {} PUBACKs/s; ack latency",
                m.msgs,
                m.size,
                m.publishers,
                rate(m.msgs_per_sec)
            ),
            None => format!(
                "{} QoS 0 msgs x {} B, {} pub -> {} sub: {} msgs/s received ({} published/s); \
                 latency",
                m.msgs,
                m.size,
                m.publishers,
                m.subscribers,
                rate(m.msgs_per_sec),
                rate(m.published_per_sec)
            ),
        };
        write!(f, "{} {what} {tail} in {:.2} s", self.shape, m.elapsed_secs)
    }
}
