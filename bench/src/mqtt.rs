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
//! The publisher and subscriber roles, the start of the timed run, flow control and the
//! measurements are the NATS shapes' own ([`super::roles`], [`super::timed`],
//! [`super::measured`]), played over [`conn::MqttConn`].
//!
//! Owns: the MQTT shapes, their flags ([`MqttArgs`]) and their report ([`MqttReport`]).
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

use super::{BenchError, Options, Shape, clock};

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
    /// mqtt-idle: handshakes in progress at once (a burst of devices arriving together
    /// is the case that leaves memory behind).
    #[arg(long, default_value_t = CONNECT_PARALLEL, value_name = "N")]
    pub connect_parallel: usize,
    /// mqtt shapes: the keep-alive asked for in CONNECT, in seconds (0: none).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub keep_alive: u16,
    /// mqtt-retained: retained messages `ret/<i>` loaded before subscribing to `ret/#`.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub retained: usize,
    /// mqtt shapes and ws-fanout: a run fails as stalled when nothing progresses for
    /// this long.
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
            connect_parallel: CONNECT_PARALLEL,
            keep_alive: 0,
            retained: 100_000,
            stall_secs: 10,
        }
    }
}

impl MqttArgs {
    /// How long without progress fails a run as stalled.
    pub(super) fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_secs.max(1))
    }
}

/// Port of `mqtt://host` URLs without one.
const MQTT_PORT: u16 = 1883;

/// Runs one MQTT shape against one server and reports it.
pub async fn run(options: &Options) -> Result<MqttReport, BenchError> {
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
    let text = canopy_protocols::address::host_port(&options.server, MQTT_PORT);
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
