//! The `canopy-bench` executable, which `canopy bench` runs with its arguments: the flags
//! of a run, the run, and its report on stdout (one line, or one JSON object with
//! `--json`). Errors end here as one readable message and a non-zero exit status, the
//! same as every other `canopy` subcommand's.
//!
//! Must never: print anything but the report on stdout (scripts parse it).

use std::time::Duration;

use anyhow::{Context, Result};
use canopy_bench::{DurableArgs, MqttArgs, Options, Protocol, Shape, WsArgs, run};
use clap::{Args, Parser};

const BENCH_ABOUT: &str = "Measure live pub/sub throughput and latency of any \
NATS-protocol server (Canopy or nats-server), or with --protocol mqtt of any MQTT server \
(Canopy's MQTT listener or Mosquitto), with the same raw client for both.

Shapes:
  pubsub  1 publisher -> 1 subscriber on `bench.one`
  fanin   4 publishers round-robin over 10,000 subjects `bench.s<i>` -> 1 subscriber on `bench.>`
  fanout  1 publisher on `bench.x.<k>` -> 10 subscribers on `bench.*.<k>` (10 deliveries per message)
  reqrep  1 requester -> 1 responder on `bench.svc`, replies to `_INBOX.<id>.<n>`, --window outstanding
  durable 4 publishers round-robin over 10,000 subjects `bench.d.<i>`, every publish acked by the
          store (Canopy-Ack: durable; nats-server: a JetStream file stream), --ack-window unacked
          per connection, --expect adds an expected version; latency is send -> ack
  replay  loads --msgs like durable, then times reading one subject's first --replay-max messages

MQTT shapes (--protocol mqtt, --server mqtt://HOST:PORT; MQTT 3.1.1 unless --mqtt-version 5):
  mqtt-fanin     8 QoS 0 publishers over 10,000 topics `bench/s<i>` -> 1 subscriber on `bench/#`
  mqtt-qos1      QoS 1 publishes over --topics `bench/q/<i>`, --publishers (4) x --window (64)
                 unacked; PUBACKs/s, latency is send -> PUBACK
  mqtt-fanout    1 QoS 0 publisher on `bench/x/<k>` -> 100 subscribers on `bench/x/+`
  mqtt-idle      --conns idle connections (from 127.0.0.2.. against loopback), held --hold-secs;
                 prints `mqtt-idle: holding N connections` on stderr once all are open
  mqtt-retained  --retained QoS 1 RETAIN publishes to `ret/<i>`, then SUBSCRIBE `ret/#` timed to
                 its SUBACK and to the last retained message

WebSocket shape (--server is the native publisher's server, --ws-url the subscribers'):
  ws-fanout  1 native publisher round-robin over --devices `devices.<k>.temp` -> --subscribers
             (1,000) WebSocket subscribers on `devices.>`: Canopy's JSON API
             (ws://HOST:HTTP_PORT/ws) or nats-server's websocket listener (ws://HOST:PORT),
             told from the publisher's INFO; --rate paces the publisher

Every payload starts with its send time, so latency is measured in this process: one way \
for the publisher shapes, the round trip for reqrep. Throughput is messages received per \
second, from the first send to the last receive. Publishers send as fast as the socket takes \
it, in 64 KiB writes, with a PING after every --flush-every messages and at most one \
unanswered; they also wait while more than --max-in-flight messages are published but not \
yet received, so a server that queues without slowing publishers is not pushed into \
slow-consumer disconnects. A slow-consumer disconnect or a stall fails the run.

The server and this tool share the machine's CPUs when both run locally: say so with the \
results.

Example: canopy bench --server nats://127.0.0.1:4222 --shape fanout --msgs 200000 --json";

/// Measure live pub/sub throughput and latency of any NATS-protocol server.
#[derive(Parser)]
#[command(name = "canopy bench", bin_name = "canopy bench", long_about = BENCH_ABOUT)]
struct BenchArgs {
    /// The traffic pattern: pubsub, fanin, fanout, reqrep, durable or replay; MQTT:
    /// mqtt-fanin, mqtt-qos1, mqtt-fanout, mqtt-idle or mqtt-retained; WebSocket:
    /// ws-fanout.
    #[arg(long, default_value = "pubsub", value_name = "SHAPE")]
    shape: Shape,
    /// Messages to publish (fanin: in total over the 4 publishers; reqrep: requests).
    #[arg(short = 'n', long, default_value_t = 100_000, value_name = "N")]
    msgs: u64,
    /// Payload bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 128, value_name = "BYTES")]
    size: usize,
    /// Publishers wait for the server (PING/PONG) every this many messages.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    flush_every: u64,
    /// Publishers also wait while more than this many messages are published but not yet
    /// received by every subscriber (0: no bound). Default 20,000; mqtt-fanout 2,000 (its
    /// 100 subscribers can then have 200,000 deliveries queued in the server); ws-fanout
    /// 200 (per subscriber, with 1,000 of them).
    #[arg(long, value_name = "N")]
    max_in_flight: Option<u64>,
    /// reqrep: requests outstanding at once (1 measures latency, 64 throughput; default
    /// 1); mqtt-qos1 and mqtt-retained: unacknowledged QoS 1 publishes per connection
    /// (default 64).
    #[arg(long, value_name = "N")]
    window: Option<u64>,
    /// nats, mqtt or ws (default: mqtt for the mqtt-* shapes, ws for ws-fanout, nats
    /// otherwise).
    #[arg(long, value_enum, value_name = "PROTOCOL")]
    protocol: Option<Protocol>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    durable: DurableArgs,
    #[command(flatten)]
    mqtt: MqttArgs,
    #[command(flatten)]
    ws: WsArgs,
    #[command(flatten)]
    connect: ServerArgs,
}

/// Where `canopy bench` connects: only an address, since its own clients take no
/// credentials.
#[derive(Debug, Clone, Args)]
struct ServerArgs {
    /// Server to talk to.
    #[arg(
        short,
        long,
        env = "CANOPY_SERVER",
        default_value = "nats://127.0.0.1:4222",
        value_name = "URL"
    )]
    server: String,
    /// Seconds to wait for the server.
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    timeout: u64,
}

fn main() -> std::process::ExitCode {
    let args = BenchArgs::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| runtime.block_on(run_bench(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The prefix of every `canopy` subcommand's errors: this is `canopy bench`.
            eprintln!("canopy: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_bench(args: BenchArgs) -> Result<()> {
    let protocol = args.protocol.unwrap_or_else(|| Protocol::of(args.shape));
    let server = if args.connect.server == Protocol::Nats.default_server() {
        // The NATS default means the flag was left out.
        protocol.default_server().to_owned()
    } else {
        args.connect.server
    };
    let options = Options {
        protocol,
        server,
        shape: args.shape,
        msgs: args.msgs,
        size: args.size,
        flush_every: args.flush_every,
        max_in_flight: args
            .max_in_flight
            .unwrap_or_else(|| args.shape.default_max_in_flight()),
        window: args.window.unwrap_or_else(|| protocol.default_window()),
        timeout: Duration::from_secs(args.connect.timeout.max(1)),
        durable: args.durable,
        mqtt: args.mqtt,
        ws: args.ws,
    };
    let report = run(&options)
        .await
        .with_context(|| format!("bench {} against {}", options.shape, options.server))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}
