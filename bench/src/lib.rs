//! `canopy bench` (the `canopy-bench` executable, which `canopy bench` runs): a live
//! load generator for any NATS-protocol server, so Canopy and nats-server can be
//! measured with the same client on the same machine. A crate of its own so that the
//! server binary carries no WebSocket client and no load generator.
//!
//! Four live shapes ([`Shape`]), 128-byte payloads by default, each message stamped with
//! its send time so subscribers in this process measure latency. Throughput is messages
//! *received* per second, from the first send to the last receive. Two durable shapes
//! (`durable`, `replay`, in [`durable`]) measure acked publishes and the replay of one
//! subject, on Canopy's store and on JetStream alike. The MQTT shapes (`mqtt-*`, in
//! [`mqtt`], with `--protocol mqtt`) measure Canopy's MQTT listener and Mosquitto alike.
//! The WebSocket shape (`ws-fanout`, in [`ws`]) measures many WebSocket subscribers fed
//! by one native publisher: Canopy's JSON API at `/ws` and nats-server's `websocket`
//! listener alike.
//!
//! Both protocols share the roles (publish, subscribe: [`roles`]), the start of a timed
//! run ([`timed`]), flow control ([`flow`]) and what a run measures ([`measured`]); only
//! the connections, the shapes and the report around the measurements are their own.
//!
//! Owns: the options of a run ([`Options`]), running one shape against one server and
//! reporting it ([`run`], [`Outcome`]).
//!
//! Must never: be used inside the server (it depends on the wire codecs of
//! `canopy-protocols`, never on the `canopy` crate), count a slow-consumer disconnect or
//! a stall as a finished run (they are errors), or panic on anything the network does.

mod clock;
mod conn;
mod durable;
mod flow;
mod histogram;
mod measured;
mod mqtt;
mod report;
mod roles;
mod shapes;
mod timed;
mod ws;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use mqtt::{MqttArgs, MqttReport};
pub use report::Report;
use serde::Serialize;
pub use ws::{WsArgs, WsReport};

/// Publisher connections of the fan-in shape.
pub const FANIN_PUBLISHERS: usize = 4;
/// Distinct subjects the fan-in publishers cycle through.
pub const FANIN_SUBJECTS: usize = 10_000;
/// Subscriber connections of the fan-out shape.
pub const FANOUT_SUBSCRIBERS: usize = 10;
/// Subjects `bench.x.<k>` the fan-out publisher cycles through.
pub const FANOUT_KEYS: usize = 4;

/// Publisher connections of the durable and replay shapes, unless `--publishers` says.
pub const DURABLE_PUBLISHERS: usize = 4;
/// Subjects `<prefix>.<i>` the durable publishers cycle through, unless `--subjects` says.
pub const DURABLE_SUBJECTS: usize = 10_000;

/// The traffic pattern of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 1 publisher to 1 subscriber on `bench.one`.
    PubSub,
    /// 4 publishers over 10,000 subjects `bench.s<i>` to 1 subscriber on `bench.>`.
    FanIn,
    /// 1 publisher on `bench.x.<k>` to 10 subscribers on `bench.*.<k>`.
    FanOut,
    /// Request/reply round trips to 1 responder on `bench.svc`.
    ReqRep,
    /// Acked (durable) publishes from 4 connections over 10,000 subjects `bench.d.<i>`,
    /// a window of unacknowledged publishes per connection.
    Durable,
    /// Loads `--msgs` acked messages like `durable`, then times reading one subject's
    /// first `--replay-max` messages, for `--replay-samples` subjects.
    Replay,
    /// MQTT: 8 QoS 0 publishers over 10,000 topics `bench/s<i>` to 1 subscriber on `bench/#`.
    MqttFanIn,
    /// MQTT: QoS 1 publishes from `--publishers` connections, `--window` unacked each.
    MqttQos1,
    /// MQTT: 1 QoS 0 publisher on `bench/x/<k>` to 100 subscribers on `bench/x/+`.
    MqttFanOut,
    /// MQTT: `--conns` idle connections, held `--hold-secs`.
    MqttIdle,
    /// MQTT: `--retained` retained messages loaded, then SUBSCRIBE `ret/#` timed.
    MqttRetained,
    /// WebSocket: 1 native publisher on `devices.<k>.temp` to `--subscribers` (1,000)
    /// WebSocket subscribers on `devices.>`.
    WsFanOut,
}

impl Shape {
    pub const ALL: [Shape; 12] = [
        Shape::PubSub,
        Shape::FanIn,
        Shape::FanOut,
        Shape::ReqRep,
        Shape::Durable,
        Shape::Replay,
        Shape::MqttFanIn,
        Shape::MqttQos1,
        Shape::MqttFanOut,
        Shape::MqttIdle,
        Shape::MqttRetained,
        Shape::WsFanOut,
    ];

    /// The shapes that speak MQTT (`--protocol mqtt`).
    pub fn is_mqtt(self) -> bool {
        matches!(
            self,
            Shape::MqttFanIn
                | Shape::MqttQos1
                | Shape::MqttFanOut
                | Shape::MqttIdle
                | Shape::MqttRetained
        )
    }

    /// The shapes whose publishers `--rate` paces.
    pub fn is_paced(self) -> bool {
        matches!(
            self,
            Shape::PubSub
                | Shape::FanIn
                | Shape::FanOut
                | Shape::MqttFanIn
                | Shape::MqttFanOut
                | Shape::WsFanOut
        )
    }

    /// `--max-in-flight` when left out: 20,000, but mqtt-fanout
    /// [`mqtt::FANOUT_MAX_IN_FLIGHT`] (per subscriber, with 100 of them) and ws-fanout
    /// [`ws::FANOUT_MAX_IN_FLIGHT`] (per subscriber, with 1,000 of them).
    pub fn default_max_in_flight(self) -> u64 {
        match self {
            Shape::MqttFanOut => mqtt::FANOUT_MAX_IN_FLIGHT,
            Shape::WsFanOut => ws::FANOUT_MAX_IN_FLIGHT,
            _ => 20_000,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Shape::PubSub => "pubsub",
            Shape::FanIn => "fanin",
            Shape::FanOut => "fanout",
            Shape::ReqRep => "reqrep",
            Shape::Durable => "durable",
            Shape::Replay => "replay",
            Shape::MqttFanIn => "mqtt-fanin",
            Shape::MqttQos1 => "mqtt-qos1",
            Shape::MqttFanOut => "mqtt-fanout",
            Shape::MqttIdle => "mqtt-idle",
            Shape::MqttRetained => "mqtt-retained",
            Shape::WsFanOut => "ws-fanout",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "unknown shape `{0}`: expected pubsub, fanin, fanout, reqrep, durable or replay, with \
     --protocol mqtt: mqtt-fanin, mqtt-qos1, mqtt-fanout, mqtt-idle or mqtt-retained, or \
     ws-fanout"
)]
pub struct UnknownShape(String);

impl FromStr for Shape {
    type Err = UnknownShape;

    fn from_str(s: &str) -> Result<Shape, UnknownShape> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownShape(s.to_owned()))
    }
}

/// Which protocol `canopy bench` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// The NATS protocol (Canopy's native listener, nats-server).
    Nats,
    /// MQTT 3.1.1 or 5.0 (Canopy's MQTT listener, Mosquitto).
    Mqtt,
    /// WebSocket subscribers (Canopy's JSON API at `/ws`, nats-server's `websocket`
    /// listener) fed by a NATS-protocol publisher (`--server`).
    Ws,
}

impl Protocol {
    /// The protocol of `shape` when `--protocol` is left out.
    pub fn of(shape: Shape) -> Protocol {
        if shape.is_mqtt() {
            Protocol::Mqtt
        } else if shape == Shape::WsFanOut {
            Protocol::Ws
        } else {
            Protocol::Nats
        }
    }

    /// The server when `--server` is left out (ws: the publisher's).
    pub fn default_server(self) -> &'static str {
        match self {
            Protocol::Nats | Protocol::Ws => "nats://127.0.0.1:4222",
            Protocol::Mqtt => "mqtt://127.0.0.1:1883",
        }
    }

    /// `--window` when left out: reqrep 1 (latency); MQTT QoS 1 shapes
    /// [`mqtt::QOS1_WINDOW`].
    pub fn default_window(self) -> u64 {
        match self {
            Protocol::Nats | Protocol::Ws => 1,
            Protocol::Mqtt => mqtt::QOS1_WINDOW,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub protocol: Protocol,
    /// `nats://host:port` (MQTT: `mqtt://host:port`), `host:port` or `host` (port 4222,
    /// MQTT 1883). ws-fanout: the native publisher's server.
    pub server: String,
    pub shape: Shape,
    /// Messages published (fan-in: in total over all publishers; reqrep: requests).
    /// Unused by mqtt-idle and mqtt-retained.
    pub msgs: u64,
    /// Payload bytes, at least 8 (the send timestamp).
    pub size: usize,
    /// Publishers send a ping (PING, PINGREQ) after this many messages, with at most one
    /// unanswered.
    pub flush_every: u64,
    /// Publishers wait while more than this many messages are published but not yet
    /// received by every subscriber (0: no bound).
    pub max_in_flight: u64,
    /// reqrep: requests outstanding at once; MQTT QoS 1 shapes: unacknowledged publishes
    /// per connection (lowered to a v5 server's Receive Maximum).
    pub window: u64,
    /// Connect and PONG deadline, and how long NATS receivers wait without any message
    /// before the run fails as stalled (MQTT: TCP connect to CONNACK; stalls are
    /// `--stall-secs`).
    pub timeout: Duration,
    /// The durable and replay shapes (`publishers` also for mqtt-qos1 and mqtt-retained).
    pub durable: DurableArgs,
    /// The MQTT shapes (`--stall-secs` also for ws-fanout).
    pub mqtt: MqttArgs,
    /// The WebSocket shape.
    pub ws: WsArgs,
}

/// Flags of the durable and replay shapes (`canopy bench --shape durable|replay`).
///
/// Canopy is asked for a durable ack with `Canopy-Ack: durable`; nats-server gets a
/// JetStream stream (file storage) over `<prefix>.>` created first, so every publish with
/// a reply subject is answered with a PubAck.
#[derive(Debug, Clone, clap::Args)]
pub struct DurableArgs {
    /// durable/replay (and mqtt-qos1, mqtt-retained): publisher connections.
    #[arg(long, default_value_t = DURABLE_PUBLISHERS, value_name = "N")]
    pub publishers: usize,
    /// durable/replay: subjects `<prefix>.<i>` published round robin; each belongs to one
    /// publisher.
    #[arg(long, default_value_t = DURABLE_SUBJECTS, value_name = "N")]
    pub subjects: usize,
    /// durable/replay: subject prefix; the JetStream stream captures `<prefix>.>`.
    #[arg(long, default_value = "bench.d", value_name = "PREFIX")]
    pub prefix: String,
    /// durable/replay: unacknowledged publishes per connection.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub ack_window: usize,
    /// durable: every publish carries the subject's expected version
    /// (`Canopy-Expected-Version`; nats-server: `Nats-Expected-Last-Subject-Sequence`),
    /// tracked from the acks after one unmeasured priming publish per subject. Needs
    /// --subjects >= --publishers x --ack-window.
    #[arg(long)]
    pub expect: bool,
    /// durable/replay: payloads of fresh pseudo-random bytes after the timestamp, which
    /// do not compress (the default repeats one byte, which compresses to nothing).
    #[arg(long)]
    pub random_payload: bool,
    /// replay: subjects whose replay is timed (spread over the subjects).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub replay_samples: usize,
    /// replay: messages read per subject, from its first.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub replay_max: usize,
    /// nats-server: the JetStream stream created (or reused) for the durable shapes.
    #[arg(long, default_value = "BENCH", value_name = "NAME")]
    pub stream: String,
}

impl Default for DurableArgs {
    fn default() -> Self {
        Self {
            publishers: DURABLE_PUBLISHERS,
            subjects: DURABLE_SUBJECTS,
            prefix: "bench.d".into(),
            ack_window: 256,
            expect: false,
            random_payload: false,
            replay_samples: 20,
            replay_max: 100,
            stream: "BENCH".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("payload size {0} is too small: at least 8 bytes carry the send timestamp")]
    PayloadTooSmall(usize),
    #[error("--msgs must be at least 1")]
    NoMessages,
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server sent something the benchmark cannot read: {0}")]
    Protocol(#[from] canopy_protocols::native::ProtocolError),
    #[error(
        "the server disconnected the {role} as a slow consumer: the run is invalid \
         (lower --flush-every or the load)"
    )]
    SlowConsumer { role: &'static str },
    #[error("the server refused the {role}: -ERR '{text}'")]
    Server { role: &'static str, text: String },
    #[error(
        "the server closed the {role} connection (a slow-consumer disconnect if the \
         server logged one): the run is invalid"
    )]
    Closed { role: &'static str },
    #[error("the {role} got no answer within {timeout:?}")]
    Timeout {
        role: &'static str,
        timeout: Duration,
    },
    #[error("stalled: received {received} of {expected} messages, then nothing for {idle:?}")]
    Stalled {
        received: u64,
        expected: u64,
        idle: Duration,
    },
    #[error("the {role} WebSocket failed: {source}")]
    WebSocket {
        role: &'static str,
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    #[error("the {role} got {what}")]
    Unexpected { role: &'static str, what: String },
    #[error("a subscriber failed")]
    ReceiverFailed,
    #[error("the responder stopped before the requests were answered")]
    ResponderStopped,
    #[error("{0}")]
    Config(String),
    #[error("{errors} of {answered} publishes were refused (first: {first})")]
    AckErrors {
        errors: u64,
        answered: u64,
        first: String,
    },
    #[error("the {role} request was refused: {text}")]
    Api { role: &'static str, text: String },
    #[error("a benchmark task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl BenchError {
    fn from_server(role: &'static str, text: String) -> BenchError {
        if text.to_ascii_lowercase().contains("slow consumer") {
            BenchError::SlowConsumer { role }
        } else {
            BenchError::Server { role, text }
        }
    }
}

/// The report of either protocol: the same JSON and one-line summary as the report itself.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Outcome {
    Nats(Report),
    Mqtt(MqttReport),
    Ws(WsReport),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Nats(report) => report.fmt(f),
            Outcome::Mqtt(report) => report.fmt(f),
            Outcome::Ws(report) => report.fmt(f),
        }
    }
}

/// Runs one shape against one server in `options.protocol` and reports it.
pub async fn run(options: &Options) -> Result<Outcome, BenchError> {
    if options.ws.rate > 0 && !options.shape.is_paced() {
        return Err(BenchError::Config(format!(
            "--rate paces pubsub, fanin, fanout, mqtt-fanin, mqtt-fanout and ws-fanout, not {}",
            options.shape.name()
        )));
    }
    match options.protocol {
        Protocol::Nats => run_nats(options).await.map(Outcome::Nats),
        Protocol::Mqtt => mqtt::run(options).await.map(Outcome::Mqtt),
        Protocol::Ws => ws::run(options).await.map(Outcome::Ws),
    }
}

/// Runs one NATS shape.
async fn run_nats(options: &Options) -> Result<Report, BenchError> {
    if options.size < clock::STAMP_LEN {
        return Err(BenchError::PayloadTooSmall(options.size));
    }
    if options.msgs == 0 && options.shape != Shape::Replay {
        return Err(BenchError::NoMessages);
    }
    // Fix the epoch before any stamp.
    clock::now_ns();
    let addr = canopy_protocols::address::address_of(&options.server);
    match options.shape {
        Shape::PubSub => shapes::pubsub(&addr, options).await,
        Shape::FanIn => shapes::fanin(&addr, options).await,
        Shape::FanOut => shapes::fanout(&addr, options).await,
        Shape::ReqRep => shapes::reqrep(&addr, options).await,
        Shape::Durable => durable::durable(&addr, options).await,
        Shape::Replay => durable::replay(&addr, options).await,
        Shape::WsFanOut => Err(BenchError::Config(
            "shape ws-fanout has WebSocket subscribers: use --protocol ws (or leave it out)".into(),
        )),
        shape => Err(BenchError::Config(format!(
            "shape {shape} speaks MQTT: use --protocol mqtt"
        ))),
    }
}
