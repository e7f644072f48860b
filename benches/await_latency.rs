//! What `Canopy-Await` costs a publisher, through async-nats (a client from another
//! project; `benches/natspy_await.py` is the same run through nats.py):
//!
//!     cargo bench --bench await_latency
//!     MSGS=5000 cargo bench --bench await_latency
//!
//! It starts the release `canopy` binary on a free loopback port with its default
//! config (every subject stored) on a fresh folder, makes a JetStream pull consumer
//! (a consumer group) over `bench.await.>`, runs one member on its own connection
//! (`messages()`, each message acked as it comes), and times MSGS stored publishes
//! sent one after another over 100 subjects: first plain (each until its PubAck), then
//! with `Canopy-Await: benchawait` (each until the ack that says the group acked it).
//! Prints p50, p99 and max of both and the ratios of their medians and p99s.

use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt;

const SUBJECTS: u64 = 100;
const GROUP: &str = "benchawait";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// p50, p99 and max in microseconds.
fn summary(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.50), at(0.99), at(1.0))
}

async fn timed(client: &async_nats::Client, msgs: u64, awaited: bool) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(msgs as usize);
    for i in 0..msgs {
        let mut headers = async_nats::HeaderMap::new();
        if awaited {
            headers.insert("Canopy-Await", GROUP);
        }
        let started = Instant::now();
        let answer = client
            .request_with_headers(
                format!("bench.await.{}", i % SUBJECTS),
                headers,
                "x".repeat(100).into(),
            )
            .await
            .expect("acked");
        samples.push(started.elapsed());
        let ack: serde_json::Value = serde_json::from_slice(&answer.payload).expect("JSON ack");
        assert!(ack.get("error").is_none(), "{ack}");
        if awaited {
            assert_eq!(
                ack["await"]["passed"][0], GROUP,
                "the group passed it: {ack}"
            );
        }
    }
    samples
}

#[tokio::main]
async fn main() {
    let msgs = std::env::var("MSGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000u64);
    let dir = tempfile::tempdir().expect("tempdir");
    let native = free_port();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
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
    let stream = jetstream::new(client.clone())
        .get_stream("default")
        .await
        .expect("the tenant's stream");
    let _created: jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            GROUP,
            pull::Config {
                durable_name: Some(GROUP.into()),
                filter_subject: "bench.await.>".into(),
                deliver_policy: jetstream::consumer::DeliverPolicy::New,
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    let member_client = async_nats::connect(&url).await.expect("member connects");
    let member_consumer: jetstream::consumer::PullConsumer = jetstream::new(member_client)
        .get_stream("default")
        .await
        .expect("stream")
        .get_consumer(GROUP)
        .await
        .expect("consumer");
    let member = tokio::spawn(async move {
        let mut messages = member_consumer.messages().await.expect("messages");
        while let Some(Ok(message)) = messages.next().await {
            let _ = message.ack().await;
        }
    });

    timed(&client, 100, false).await;
    let plain = summary(timed(&client, msgs, false).await);
    let awaited = summary(timed(&client, msgs, true).await);
    println!(
        "plain:   p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>8.1} µs",
        plain.0, plain.1, plain.2
    );
    println!(
        "awaited: p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>8.1} µs",
        awaited.0, awaited.1, awaited.2
    );
    println!(
        "awaited / plain: p50 {:.2}  p99 {:.2}",
        awaited.0 / plain.0,
        awaited.1 / plain.1
    );
    member.abort();
    let _ = server.kill().await;
}
