//! What a schema costs a durable publisher, through async-nats (a client from another
//! project):
//!
//!     cargo bench --bench schema_publish
//!     MSGS=200000 PUBLISHERS=4 ROUNDS=3 cargo bench --bench schema_publish
//!
//! It starts the release `canopy` binary on a free loopback port with its default
//! config (every subject stored, every ack after the write is durable) on a fresh
//! folder, binds a 10-field JSON Schema to `bench.typed.*`, and runs rounds of
//! `bench.plain.<n>` (no schema) and `bench.typed.<n>` (checked), which goes first
//! alternating,
//! over 1,000 subjects each: PUBLISHERS connections each keep 256 JetStream publishes
//! in flight until MSGS are acked. Every payload is the same shape of 10-field JSON
//! document (about 250 bytes) with counters in it. For each round it prints acks/s and
//! the server's CPU per message (user + system time of the server process, from
//! /proc), then the medians and the ratio typed / plain.

use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::json;

const SUBJECTS: u64 = 1_000;
const IN_FLIGHT: usize = 256;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The server's user + system CPU time so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc stat");
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64)
}

/// Clock ticks per second of /proc's times (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100)
}

fn schema() -> serde_json::Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "device": {"type": "string", "maxLength": 64},
            "seq": {"type": "integer", "minimum": 0},
            "temp": {"type": "number", "minimum": -100, "maximum": 200},
            "humidity": {"type": "number", "minimum": 0, "maximum": 100},
            "unit": {"enum": ["C", "F"]},
            "ok": {"type": "boolean"},
            "battery": {"type": "integer", "minimum": 0, "maximum": 100},
            "firmware": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
            "site": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}
        },
        "required": ["device", "seq", "temp", "unit"],
        "additionalProperties": false
    })
}

fn payload(seq: u64) -> bytes::Bytes {
    json!({
        "device": format!("sensor-{}", seq % SUBJECTS),
        "seq": seq,
        "temp": 20.0 + (seq % 100) as f64 / 10.0,
        "humidity": 40.5,
        "unit": "C",
        "ok": true,
        "battery": seq % 100,
        "firmware": "1.12.3",
        "site": "north-hall-2",
        "tags": ["roof", "east"]
    })
    .to_string()
    .into()
}

async fn publisher(url: String, prefix: &'static str, first: u64, msgs: u64) {
    let client = async_nats::connect(&url).await.expect("connects");
    let js = jetstream::new(client);
    let mut pending = FuturesUnordered::new();
    for seq in first..first + msgs {
        if pending.len() >= IN_FLIGHT
            && let Some(ack) = pending.next().await
        {
            let ack: Result<_, _> = ack;
            ack.expect("acked");
        }
        let subject = format!("{prefix}.{}", seq % SUBJECTS);
        let future = js.publish(subject, payload(seq)).await.expect("published");
        pending.push(future.into_future());
    }
    while let Some(ack) = pending.next().await {
        ack.expect("acked");
    }
}

async fn round(
    url: &str,
    pid: u32,
    prefix: &'static str,
    publishers: u64,
    msgs: u64,
) -> (f64, f64) {
    let per = msgs / publishers;
    let cpu = cpu_time(pid);
    let started = Instant::now();
    let tasks: Vec<_> = (0..publishers)
        .map(|p| tokio::spawn(publisher(url.to_owned(), prefix, p * per, per)))
        .collect();
    for task in tasks {
        task.await.expect("publisher ran");
    }
    let elapsed = started.elapsed();
    let cpu = cpu_time(pid) - cpu;
    let total = (per * publishers) as f64;
    (
        total / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / total,
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    let msgs = env("MSGS", 100_000);
    let publishers = env("PUBLISHERS", 4);
    let rounds = env("ROUNDS", 3);
    let dir = tempfile::tempdir().expect("tempdir");
    let native = free_port();
    let server = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args(["serve", "--listen", &format!("127.0.0.1:{native}")])
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
        ])
        .env(
            "CANOPY_STORE__URL",
            format!("file://{}", dir.path().join("store").display()),
        )
        .env_remove("CANOPY_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("canopy starts");
    let pid = server.id().expect("a pid");
    let url = format!("127.0.0.1:{native}");
    let client = {
        let mut tries = 0;
        loop {
            match async_nats::connect(&url).await {
                Ok(client) => break client,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("canopy does not listen: {e}"),
            }
        }
    };
    let put = json!({"pattern": "bench.typed.*", "schema": schema()});
    let answer = client
        .request("$CANOPY.schema.put", put.to_string().into())
        .await
        .expect("schema put answered");
    let answer: serde_json::Value = serde_json::from_slice(&answer.payload).expect("JSON");
    assert_eq!(answer["version"], 1, "{answer}");
    // The schema really is checked: a document it refuses is refused.
    let refused = jetstream::new(client.clone())
        .publish("bench.typed.0", r#"{"device":"x"}"#.into())
        .await
        .expect("sent")
        .await;
    assert!(refused.is_err(), "an invalid document was stored");

    // Warm-up: every subject of both prefixes exists before the timed rounds.
    round(&url, pid, "bench.plain", publishers, SUBJECTS * 4).await;
    round(&url, pid, "bench.typed", publishers, SUBJECTS * 4).await;
    let (mut plain, mut typed) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        // Which goes first alternates, so neither always pays the compactions the
        // other's writes started.
        let (p, t) = if i % 2 == 0 {
            let p = round(&url, pid, "bench.plain", publishers, msgs).await;
            (p, round(&url, pid, "bench.typed", publishers, msgs).await)
        } else {
            let t = round(&url, pid, "bench.typed", publishers, msgs).await;
            (round(&url, pid, "bench.plain", publishers, msgs).await, t)
        };
        println!(
            "round {i}: plain {:>9.0} acks/s {:>6.2} µs CPU/msg   typed {:>9.0} acks/s {:>6.2} µs CPU/msg",
            p.0, p.1, t.0, t.1
        );
        plain.push(p);
        typed.push(t);
    }
    let rate = |v: &[(f64, f64)]| median(v.iter().map(|x| x.0).collect());
    let cpu = |v: &[(f64, f64)]| median(v.iter().map(|x| x.1).collect());
    println!(
        "median: plain {:.0} acks/s, {:.2} µs CPU/msg; typed {:.0} acks/s, {:.2} µs CPU/msg",
        rate(&plain),
        cpu(&plain),
        rate(&typed),
        cpu(&typed)
    );
    println!(
        "typed / plain: rate {:.2}, CPU per message {:.2}",
        rate(&typed) / rate(&plain),
        cpu(&typed) / cpu(&plain)
    );
    drop(server);
}
