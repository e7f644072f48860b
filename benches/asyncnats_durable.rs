//! Durable publishes through async-nats's JetStream API (a client from another project):
//! each publish awaits its PubAck. Against any NATS server already running
//! (benches/durable_acks.sh starts them):
//!
//!     SERVER=nats://127.0.0.1:4222 MSGS=200000 cargo bench --bench asyncnats_durable
//!
//! CONNS (1) connections keep IN_FLIGHT (256) publishes each awaiting their ack, MSGS
//! payloads of SIZE (100) bytes in all over SUBJECTS (1,000) subjects `bench.d.<i>`
//! (one repeated byte; with RANDOM=1 fresh random bytes each, which do not compress),
//! each connection round-robin over its own share of them. With EXPECT=1 every publish
//! carries `Nats-Expected-Last-Subject-Sequence` (the subject's last acked sequence), so
//! a connection's share must be larger than IN_FLIGHT. The stream BENCH (`bench.d.>`,
//! file storage) is declared first, on either server. Prints one
//! JSON line: acks per second, ack latency p50 and p99 in µs. A refused publish fails
//! the run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One connection's publishes: returns the latency of each, in µs.
async fn publish(
    client: async_nats::Client,
    subjects: Vec<String>,
    msgs: u64,
    in_flight: usize,
    expect: bool,
    payload: Bytes,
    random: bool,
) -> Vec<u64> {
    let js = async_nats::jetstream::new(client);
    let mut last: HashMap<usize, u64> = HashMap::new();
    let mut pending = FuturesUnordered::new();
    let mut latencies = Vec::with_capacity(msgs as usize);
    let mut sent = 0u64;
    while sent < msgs || !pending.is_empty() {
        while sent < msgs && pending.len() < in_flight {
            let index = (sent % subjects.len() as u64) as usize;
            let mut publish =
                async_nats::jetstream::message::PublishMessage::build().payload(if random {
                    let mut fresh = vec![0u8; payload.len()];
                    fastrand::fill(&mut fresh);
                    Bytes::from(fresh)
                } else {
                    payload.clone()
                });
            if expect {
                publish =
                    publish.expected_last_subject_sequence(last.get(&index).copied().unwrap_or(0));
            }
            let started = Instant::now();
            let ack = js
                .send_publish(subjects[index].clone(), publish)
                .await
                .expect("publish sent");
            pending.push(async move { (index, started, ack.await) });
            sent += 1;
        }
        if let Some((index, started, ack)) = pending.next().await {
            let ack = ack.expect("publish acknowledged");
            latencies.push(started.elapsed().as_micros() as u64);
            last.insert(index, ack.sequence);
        }
    }
    latencies
}

#[tokio::main]
async fn main() {
    let server = std::env::var("SERVER").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let msgs = env("MSGS", 200_000);
    let conns = env("CONNS", 1).max(1);
    let in_flight = env("IN_FLIGHT", 256).max(1) as usize;
    let size = env("SIZE", 100) as usize;
    let subjects = env("SUBJECTS", 1_000).max(conns);
    let expect = env("EXPECT", 0) == 1;
    let random = env("RANDOM", 0) == 1;

    let mut clients = Vec::new();
    for _ in 0..conns {
        clients.push(async_nats::connect(&server).await.expect("connects"));
    }
    // On either server a plain JetStream publish is stored where a stream holds its
    // subject.
    let js = async_nats::jetstream::new(clients[0].clone());
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "BENCH".into(),
        subjects: vec!["bench.d.>".into()],
        ..Default::default()
    })
    .await
    .expect("stream");
    let payload = Bytes::from(vec![b'x'; size]);
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, client)| {
            let share: Vec<String> = (0..subjects)
                .filter(|s| s % conns == c as u64)
                .map(|s| format!("bench.d.{s}"))
                .collect();
            assert!(
                !expect || share.len() > in_flight,
                "EXPECT=1 needs more subjects per connection than IN_FLIGHT"
            );
            let count = msgs / conns + u64::from((c as u64) < msgs % conns);
            tokio::spawn(publish(
                client,
                share,
                count,
                in_flight,
                expect,
                payload.clone(),
                random,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("publisher"));
    }
    let elapsed = started.elapsed().max(Duration::from_micros(1));
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "{{\"acks_per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{},\"msgs\":{}}}",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.5),
        at(0.99),
        latencies.len()
    );
}
