//! `canopy bench --shape ws-fanout`: many WebSocket subscribers fed by one native
//! publisher, so Canopy's JSON API (`/ws`) and nats-server's `websocket` listener are
//! measured by the same client on the same machine.
//!
//! `--subscribers` (1,000) WebSocket connections (tokio-tungstenite) each subscribe to
//! `devices.>`; one NATS-protocol publisher (the shared [`super::roles::publish`] over the
//! native [`Conn`]) sends `--msgs` payloads of `--size` bytes (128), each stamped with
//! its send time, round robin over `--devices` (1,000) subjects `devices.<k>.temp`,
//! either as fast as the end-to-end bound `--max-in-flight` lets it or paced at
//! `--rate` publishes per second. Throughput is deliveries received by all subscribers
//! together per second, from the first send to the last receive; latency is send to
//! receive of every delivery.
//!
//! What the WebSocket speaks ([`WsApi`]), told from the publisher's INFO unless
//! `--ws-api` says:
//!
//! ```text
//! canopy  (ws://HOST:HTTP_PORT/ws)   -> {"op":"sub","id":"s","pattern":"devices.>"}
//!                                    <- {"op":"ok","id":"s","sid":1,...}
//!                                    <- {"op":"msg","sid":1,"subject":..,"data_b64":".."}  one text message each
//! nats    (ws://HOST:WS_PORT)        <- INFO {...}
//!                                    -> CONNECT {..} SUB devices.> 1 PING   (binary frames)
//!                                    <- PONG, then MSG devices.<k>.temp 1 128 ...
//!                                       (a frame may split or merge protocol lines)
//! ```
//!
//! Owns: the shape, its flags ([`WsArgs`]) and its report ([`WsReport`]); the
//! WebSocket connection is [`conn::WsConn`].
//!
//! Must never: start the clock before every subscription is confirmed, pass a closed
//! WebSocket (a slow-consumer close above all), a refused subscription or a stall as a
//! result, or panic on anything the network does.

mod conn;
mod report;

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
pub use report::WsReport;

use super::conn::Conn;
use super::flow::Flow;
use super::roles::PublishPlan;
use super::timed;
use super::{BenchError, Options, Shape, clock};
use conn::{Dial, WsConn};

/// Default `--max-in-flight` of `ws-fanout`, per subscriber: with 1,000 subscribers up
/// to 250,000 deliveries wait in the server (the bound plus one write of a quarter of
/// it), which keeps the unpaced run's queueing latency near 0.1-0.3 s on 2 cores. A
/// bound of 500 gave nats-server ~25% more, Canopy nothing, and both more latency.
pub const FANOUT_MAX_IN_FLIGHT: u64 = 200;
/// WebSocket handshakes in progress at once while the subscribers connect: below both
/// servers' listen backlogs.
const CONNECT_PARALLEL: usize = 64;
/// The pattern every subscriber subscribes to.
pub const PATTERN: &str = "devices.>";

/// What the subscribers' WebSocket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WsApi {
    /// Canopy when the publisher's INFO says `go: canopy …`, nats otherwise.
    Auto,
    /// Canopy's JSON API (`/ws`, docs/websocket.md).
    Canopy,
    /// The NATS protocol in binary frames (nats-server's `websocket` listener).
    Nats,
}

impl WsApi {
    pub fn name(self) -> &'static str {
        match self {
            WsApi::Auto => "auto",
            WsApi::Canopy => "canopy-json",
            WsApi::Nats => "nats",
        }
    }
}

/// Flags of the WebSocket shape (`canopy bench --shape ws-fanout`).
#[derive(Debug, Clone, clap::Args)]
pub struct WsArgs {
    /// ws-fanout: the subscribers' endpoint: Canopy's `ws://HOST:HTTP_PORT/ws`, or
    /// nats-server's `websocket` listener `ws://HOST:PORT` (no TLS). `--server` is the
    /// publisher's native listener on the same server.
    #[arg(long, default_value = "ws://127.0.0.1:8080/ws", value_name = "URL")]
    pub ws_url: String,
    /// ws-fanout: WebSocket subscriber connections, each on `devices.>` (each needs a
    /// file descriptor here and in the server: see `ulimit -n`).
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub subscribers: usize,
    /// ws-fanout: subjects `devices.<k>.temp` the publisher goes round.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub devices: usize,
    /// ws-fanout, pubsub, fanin, fanout: publishes per second on a fixed schedule, shared
    /// by the publishers (0: as fast as --max-in-flight lets them go). Latency at a
    /// steady rate below saturation measures the server, not its queues.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub rate: u64,
    /// ws-fanout: what the WebSocket speaks: canopy (the JSON API), nats (the NATS
    /// protocol in frames) or auto (canopy when the publisher's INFO says so).
    #[arg(long, value_enum, default_value = "auto", value_name = "API")]
    pub ws_api: WsApi,
}

impl Default for WsArgs {
    fn default() -> Self {
        Self {
            ws_url: "ws://127.0.0.1:8080/ws".into(),
            subscribers: 1000,
            devices: 1000,
            rate: 0,
            ws_api: WsApi::Auto,
        }
    }
}

/// Runs the WebSocket shape against one server and reports it.
pub async fn run(options: &Options) -> Result<WsReport, BenchError> {
    if options.shape != Shape::WsFanOut {
        return Err(BenchError::Config(format!(
            "shape {} has no WebSocket subscribers: leave out --protocol ws",
            options.shape
        )));
    }
    if options.size < clock::STAMP_LEN {
        return Err(BenchError::PayloadTooSmall(options.size));
    }
    if options.msgs == 0 {
        return Err(BenchError::NoMessages);
    }
    if options.ws.subscribers == 0 || options.ws.devices == 0 {
        return Err(BenchError::Config(
            "--subscribers and --devices must be at least 1".into(),
        ));
    }
    // Fix the epoch before any stamp.
    clock::now_ns();
    fanout(options).await
}

async fn fanout(options: &Options) -> Result<WsReport, BenchError> {
    let addr = canopy_protocols::address::address_of(&options.server);
    let publisher = Conn::connect(&addr, "publisher", options.timeout).await?;
    let info = publisher.info().clone();
    let api = match options.ws.ws_api {
        WsApi::Auto if info.go.starts_with("canopy") => WsApi::Canopy,
        WsApi::Auto => WsApi::Nats,
        chosen => chosen,
    };
    let dial = Dial::new(&options.ws.ws_url, api, options.timeout).await?;
    let subscribers: Vec<WsConn> = futures::stream::iter(0..options.ws.subscribers)
        .map(|_| WsConn::subscribe(&dial, PATTERN))
        .buffer_unordered(CONNECT_PARALLEL)
        .try_collect()
        .await?;
    let subjects: Arc<[Bytes]> = (0..options.ws.devices)
        .map(|k| Bytes::from(format!("devices.{k}.temp")))
        .collect();
    let stall = options.mqtt.stall();
    let flow = Arc::new(Flow::new(subscribers.len(), options.max_in_flight));
    let mut plan = PublishPlan::share_of(options, subjects, (0, 1), &flow, stall);
    // A 64 KiB batch is ~430 publishes, ~430,000 deliveries here: write at most a
    // quarter of the bound at once so it holds.
    if options.max_in_flight > 0 {
        plan.batch = (options.max_in_flight / 4).max(1);
    }
    let measured =
        timed::publish_run(options, subscribers, vec![(publisher, plan)], flow, stall).await?;
    Ok(WsReport::new(options, info, api, measured))
}
