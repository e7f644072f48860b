//! The result of one MQTT run: a struct for `--json` and a one-line summary for people.
//!
//! Owns: what an MQTT run reports, what each field counts per shape, and how it is
//! printed.
//!
//! Must never: compute anything from the network (shapes fill it in), or print a rate
//! without saying what was counted.

use std::fmt;

use serde::Serialize;

use super::super::histogram::{Histogram, Summary};
use super::super::roles::Received;
use super::MqttOptions;

#[derive(Debug, Clone, Serialize)]
pub struct MqttReport {
    pub shape: &'static str,
    /// Always `mqtt`.
    pub protocol: &'static str,
    /// The URL given.
    pub server: String,
    /// `3.1.1` or `5.0`.
    pub mqtt_version: &'static str,
    /// Messages published (retained: messages loaded; idle: 0).
    pub msgs: u64,
    pub size: usize,
    pub publishers: usize,
    pub subscribers: usize,
    /// QoS 0 shapes: the end-to-end bound on messages in flight (0: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    /// QoS 1 shapes: unacknowledged publishes per connection (after a v5 server's
    /// Receive Maximum).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// fanin/fanout: messages received by all subscribers together (fan-out: 100 per
    /// publish); qos1: PUBACKs; retained: retained messages received; idle: connections
    /// opened.
    pub delivered: u64,
    /// fanin/fanout/qos1: first send to last receive (or PUBACK); retained: SUBSCRIBE sent
    /// to the last retained message; idle: first connect to last CONNACK.
    pub elapsed_secs: f64,
    /// `delivered / elapsed_secs`.
    pub msgs_per_sec: f64,
    /// `msgs / elapsed_secs` (fanin, fanout, qos1).
    pub published_per_sec: f64,
    /// fanin/fanout: one-way send-to-receive time; qos1 and the retained load: send to
    /// PUBACK; idle: TCP connect to CONNACK. Nanoseconds.
    pub latency: Summary,
    /// CPUs this process could use; the server under test shares them if it is local.
    pub cpus: usize,
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

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn secs_between(start: u64, end: u64) -> f64 {
    (end.saturating_sub(start) as f64 / 1e9).max(1e-9)
}

impl MqttReport {
    fn base(options: &MqttOptions, publishers: usize, subscribers: usize) -> MqttReport {
        MqttReport {
            shape: options.shape.name(),
            protocol: "mqtt",
            server: options.server.clone(),
            mqtt_version: options.mqtt.mqtt_version.name(),
            msgs: options.msgs,
            size: options.size,
            publishers,
            subscribers,
            max_in_flight: None,
            window: None,
            delivered: 0,
            elapsed_secs: 0.0,
            msgs_per_sec: 0.0,
            published_per_sec: 0.0,
            latency: Summary::default(),
            cpus: cpus(),
            retained: None,
            idle: None,
        }
    }

    /// fanin and fanout: what the subscribers received.
    pub fn received(
        options: &MqttOptions,
        publishers: usize,
        start: u64,
        received: &[Received],
    ) -> MqttReport {
        let mut latency = Histogram::new();
        let mut delivered = 0;
        let mut last = start;
        for r in received {
            latency.merge(&r.latency);
            delivered += r.count;
            last = last.max(r.last_ns);
        }
        let elapsed_secs = secs_between(start, last);
        MqttReport {
            max_in_flight: Some(options.max_in_flight),
            delivered,
            elapsed_secs,
            msgs_per_sec: delivered as f64 / elapsed_secs,
            published_per_sec: options.msgs as f64 / elapsed_secs,
            latency: latency.summary(),
            ..MqttReport::base(options, publishers, received.len())
        }
    }

    /// qos1: the PUBACKs of every publisher (count, time of the last, latencies).
    pub fn acked<'a>(
        options: &MqttOptions,
        start: u64,
        acked: impl Iterator<Item = (u64, u64, &'a Histogram)>,
        window: u64,
    ) -> MqttReport {
        let mut latency = Histogram::new();
        let mut delivered = 0;
        let mut last = start;
        for (count, last_ns, histogram) in acked {
            latency.merge(histogram);
            delivered += count;
            last = last.max(last_ns);
        }
        let elapsed_secs = secs_between(start, last);
        MqttReport {
            window: Some(window),
            delivered,
            elapsed_secs,
            msgs_per_sec: delivered as f64 / elapsed_secs,
            published_per_sec: options.msgs as f64 / elapsed_secs,
            latency: latency.summary(),
            ..MqttReport::base(options, options.publishers.max(1), 0)
        }
    }

    /// retained: the load's ack latency and the subscription's timings.
    pub fn retained(
        options: &MqttOptions,
        load_latency: &Histogram,
        window: u64,
        stats: RetainedStats,
    ) -> MqttReport {
        let elapsed_secs = (stats.all_delivered_ns as f64 / 1e9).max(1e-9);
        MqttReport {
            msgs: stats.retained as u64,
            window: Some(window),
            delivered: stats.retained as u64,
            elapsed_secs,
            msgs_per_sec: stats.retained as f64 / elapsed_secs,
            latency: load_latency.summary(),
            retained: Some(stats),
            ..MqttReport::base(options, options.publishers.max(1), 1)
        }
    }

    /// idle: the connections opened.
    pub fn idle(
        options: &MqttOptions,
        connect_latency: &Histogram,
        stats: IdleStats,
    ) -> MqttReport {
        MqttReport {
            msgs: 0,
            delivered: stats.conns as u64,
            elapsed_secs: stats.connect_secs,
            msgs_per_sec: stats.connects_per_sec,
            latency: connect_latency.summary(),
            idle: Some(stats),
            ..MqttReport::base(options, 0, 0)
        }
    }
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

impl fmt::Display for MqttReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lat = &self.latency;
        let tail = format!(
            "p50 {} p99 {} p99.9 {} max {} [MQTT {}]",
            micros(lat.p50_ns),
            micros(lat.p99_ns),
            micros(lat.p999_ns),
            micros(lat.max_ns),
            self.mqtt_version,
        );
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
                self.size,
                self.publishers,
                r.load_secs,
                rate(r.load_acks_per_sec),
                self.window.unwrap_or_default(),
                micros(r.suback_ns),
                r.retained,
                micros(r.all_delivered_ns),
                rate(self.msgs_per_sec),
            );
        }
        let what = match self.window {
            Some(window) => format!(
                "{} QoS 1 msgs x {} B, {} pub, window {window}: {} PUBACKs/s; ack latency",
                self.msgs,
                self.size,
                self.publishers,
                rate(self.msgs_per_sec)
            ),
            None => format!(
                "{} QoS 0 msgs x {} B, {} pub -> {} sub: {} msgs/s received ({} published/s); \
                 latency",
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
            "{} {what} {tail} in {:.2} s",
            self.shape, self.elapsed_secs
        )
    }
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
}
