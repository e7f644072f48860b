//! `canopy bench --protocol mqtt`: the MQTT side of the load tool, so Canopy's MQTT
//! listener and Mosquitto are measured by the same raw client on the same machine.
//!
//! Five shapes ([`Shape`]`::Mqtt*`), MQTT 3.1.1 unless `--mqtt-version 5`, 128-byte
//! payloads by default, each stamped with its send time so subscribers in this process
//! measure latency:
//!
//! - `mqtt-fanin`: 8 QoS 0 publishers over 10,000 topics `bench/s<i>` to one subscriber on
//!   `bench/#`; received msgs/s and send-to-receive latency.
//! - `mqtt-qos1`: `--publishers` connections (4) each keeping `--window` (64) QoS 1
//!   publishes unacknowledged over `--topics` (10,000) topics `bench/q/<i>`; PUBACKs/s and
//!   send-to-PUBACK latency. No subscriber.
//! - `mqtt-fanout`: 1 QoS 0 publisher on `bench/x/<k>` to 100 subscribers on `bench/x/+`;
//!   deliveries/s (all subscribers together) and latency.
//! - `mqtt-idle`: `--conns` idle connections (CONNECT, CONNACK, then nothing) from source
//!   addresses 127.0.0.2, 127.0.0.3, … (`--conns-per-source` each) when the server is on
//!   loopback; connects/s, then held `--hold-secs` while a script reads the server's RSS.
//! - `mqtt-retained`: `--retained` QoS 1 RETAIN publishes to `ret/<i>` (acked), then the
//!   time from SUBSCRIBE `ret/#` to its SUBACK and to the last retained message.
//!
//! Publishers of the QoS 0 shapes send a PINGREQ every `--flush-every` messages with at
//! most one unanswered, and wait while more than `--max-in-flight` messages are published
//! but not yet received by every subscriber (the same end-to-end bound as the NATS
//! shapes, [`super::flow`]), so neither server is pushed into dropping a slow consumer.
//!
//! Owns: the MQTT shapes, their options ([`MqttArgs`], [`MqttOptions`]) and their report
//! ([`MqttReport`]).
//!
//! Must never: be used inside the server, pass a connection the server closed, a refused
//! CONNECT/SUBSCRIBE/PUBLISH, a dropped message or a stall (no progress for
//! `--stall-secs`) as a result, buffer without bound, or panic on anything the network
//! does.

mod conn;
mod idle;
mod report;
mod shapes;

use std::net::SocketAddr;
use std::time::Duration;

pub use report::MqttReport;

use super::{BenchError, Shape, clock};

/// Publisher connections of `mqtt-fanin`.
pub const FANIN_PUBLISHERS: usize = 8;
/// Topics `bench/s<i>` the fan-in publishers cycle through.
pub const FANIN_TOPICS: usize = 10_000;
/// Subscriber connections of `mqtt-fanout`.
pub const FANOUT_SUBSCRIBERS: usize = 100;
/// Topics `bench/x/<k>` the fan-out publisher cycles through.
pub const FANOUT_KEYS: usize = 4;
/// Default `--max-in-flight` of `mqtt-fanout`: per subscriber, so with 100 subscribers up
/// to 200,000 deliveries wait in the server (20,000 each let Mosquitto starve one
/// subscriber for more than 10 s here).
pub const FANOUT_MAX_IN_FLIGHT: u64 = 2_000;
/// Default unacknowledged QoS 1 publishes per connection (`--window`).
pub const QOS1_WINDOW: u64 = 64;
/// Connections `mqtt-idle` has in the middle of their handshake at once: below the listen
/// backlogs of both servers (Mosquitto 100, Canopy 128), whose overflow drops SYNs and
/// shows up as 1 s connect times (the SYN retransmission), not as the server's speed.
pub const CONNECT_PARALLEL: usize = 64;

/// Which protocol `canopy bench` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// The NATS protocol (Canopy's native listener, nats-server).
    Nats,
    /// MQTT 3.1.1 or 5.0 (Canopy's MQTT listener, Mosquitto).
    Mqtt,
}

/// The MQTT level the benchmark connections speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MqttVersion {
    /// MQTT 3.1.1 (protocol level 4).
    #[value(name = "3.1.1", alias = "311", alias = "4")]
    V311,
    /// MQTT 5.0 (protocol level 5).
    #[value(name = "5", alias = "5.0")]
    V5,
}

impl MqttVersion {
    fn level(self) -> canopy_protocols::mqtt::Level {
        match self {
            MqttVersion::V311 => canopy_protocols::mqtt::Level::V311,
            MqttVersion::V5 => canopy_protocols::mqtt::Level::V5,
        }
    }

    fn name(self) -> &'static str {
        match self {
            MqttVersion::V311 => "3.1.1",
            MqttVersion::V5 => "5.0",
        }
    }
}

/// Flags of the MQTT shapes (`canopy bench --protocol mqtt`).
#[derive(Debug, Clone, clap::Args)]
pub struct MqttArgs {
    /// mqtt shapes: the MQTT level spoken by every connection.
    #[arg(long, value_enum, default_value = "3.1.1", value_name = "VERSION")]
    pub mqtt_version: MqttVersion,
    /// mqtt-qos1: topics `bench/q/<i>` published round robin; each belongs to one publisher.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub topics: usize,
    /// mqtt-idle: connections opened and held (each needs a file descriptor here and in
    /// the server: see `ulimit -n`).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub conns: usize,
    /// mqtt-idle: seconds the connections are held once all are open.
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub hold_secs: u64,
    /// mqtt-idle: connections per loopback source address (127.0.0.2, 127.0.0.3, …), so
    /// one address's ephemeral ports do not run out.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub conns_per_source: usize,
    /// mqtt shapes: the keep-alive asked for in CONNECT, in seconds (0: none).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub keep_alive: u16,
    /// mqtt-retained: retained messages `ret/<i>` loaded before subscribing to `ret/#`.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub retained: usize,
    /// mqtt shapes: a run fails as stalled when nothing progresses for this long.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub stall_secs: u64,
}

impl Default for MqttArgs {
    fn default() -> Self {
        Self {
            mqtt_version: MqttVersion::V311,
            topics: 10_000,
            conns: 20_000,
            hold_secs: 5,
            conns_per_source: 1000,
            keep_alive: 0,
            retained: 100_000,
            stall_secs: 10,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MqttOptions {
    /// `mqtt://host:port`, `host:port` or `host` (port 1883).
    pub server: String,
    pub shape: Shape,
    /// Messages published (fan-in: in total over all publishers). Unused by `mqtt-idle`
    /// and `mqtt-retained`.
    pub msgs: u64,
    /// Payload bytes, at least 8 (the send timestamp).
    pub size: usize,
    /// QoS 0 publishers send a PINGREQ after this many messages, at most one unanswered.
    pub flush_every: u64,
    /// QoS 0 publishers wait while more than this many messages are published but not yet
    /// received by every subscriber (0: no bound).
    pub max_in_flight: u64,
    /// Unacknowledged QoS 1 publishes per connection (lowered to a v5 server's Receive
    /// Maximum).
    pub window: u64,
    /// Publisher connections of `mqtt-qos1` and of the `mqtt-retained` load.
    pub publishers: usize,
    /// Connect deadline (TCP connect to CONNACK).
    pub timeout: Duration,
    pub mqtt: MqttArgs,
}

impl MqttOptions {
    fn stall(&self) -> Duration {
        Duration::from_secs(self.mqtt.stall_secs.max(1))
    }
}

/// `mqtt://host:port`, `tcp://host:port`, `host:port` or `host` as `host:port`.
pub fn address_of(url: &str) -> String {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    if rest
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        rest.to_owned()
    } else {
        format!("{rest}:1883")
    }
}

/// Runs one MQTT shape against one server and reports it.
pub async fn run(options: &MqttOptions) -> Result<MqttReport, BenchError> {
    if options.size < clock::STAMP_LEN {
        return Err(BenchError::PayloadTooSmall(options.size));
    }
    let needs_msgs = matches!(
        options.shape,
        Shape::MqttFanIn | Shape::MqttQos1 | Shape::MqttFanOut
    );
    if needs_msgs && options.msgs == 0 {
        return Err(BenchError::NoMessages);
    }
    // Fix the epoch before any stamp.
    clock::now_ns();
    let text = address_of(&options.server);
    let addr: SocketAddr = tokio::net::lookup_host(&text)
        .await
        .map_err(|source| BenchError::Connect {
            addr: text.clone(),
            source,
        })?
        .next()
        .ok_or_else(|| BenchError::Config(format!("{text} resolves to no address")))?;
    match options.shape {
        Shape::MqttFanIn => shapes::fanin(addr, options).await,
        Shape::MqttQos1 => shapes::qos1(addr, options).await,
        Shape::MqttFanOut => shapes::fanout(addr, options).await,
        Shape::MqttIdle => idle::idle(addr, options).await,
        Shape::MqttRetained => shapes::retained(addr, options).await,
        other => Err(BenchError::Config(format!(
            "shape {other} speaks the NATS protocol: leave out --protocol mqtt \
             (MQTT shapes: mqtt-fanin, mqtt-qos1, mqtt-fanout, mqtt-idle, mqtt-retained)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_port_1883() {
        assert_eq!(address_of("mqtt://127.0.0.1:1884"), "127.0.0.1:1884");
        assert_eq!(address_of("mqtt://localhost"), "localhost:1883");
        assert_eq!(address_of("127.0.0.1"), "127.0.0.1:1883");
        assert_eq!(address_of("tcp://[::1]:9/"), "[::1]:9");
    }
}
