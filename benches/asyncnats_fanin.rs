//! N publishers -> 1 subscriber through async-nats (a client from another project),
//! each publisher as fast as the server takes it, nothing bounding what is in flight:
//! the fan-in where a server must either slow its publishers or cut the subscriber.
//! Against any NATS server already running (benches/fanin.sh starts them):
//!
//!     SERVER=nats://127.0.0.1:4222 MSGS=1000000 cargo bench --bench asyncnats_fanin
//!
//! PUBLISHERS (10) connections publish MSGS payloads of SIZE (100) bytes in all,
//! round-robin over SUBJECTS (1,000) subjects `bench.f.<i>`; one connection subscribes
//! to `bench.f.>` with a client-side buffer large enough never to drop. Prints one JSON
//! line: messages received per second from the first publish to the last message
//! received, delivered, lost, and whether the subscriber was disconnected (`cut`). The
//! run ends when every message arrived or none came for 5 s after the publishers
//! finished.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let server = std::env::var("SERVER").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let msgs = env("MSGS", 1_000_000);
    let publishers = env("PUBLISHERS", 10).max(1);
    let size = env("SIZE", 100) as usize;
    let subjects = env("SUBJECTS", 1_000).max(1);

    let cut = Arc::new(AtomicBool::new(false));
    let seen_cut = Arc::clone(&cut);
    let subscriber = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 22)
        .event_callback(move |event| {
            let cut = Arc::clone(&seen_cut);
            async move {
                if matches!(
                    event,
                    async_nats::Event::Disconnected | async_nats::Event::ServerError(_)
                ) {
                    cut.store(true, Ordering::Relaxed);
                }
            }
        })
        .connect(&server)
        .await
        .expect("subscriber connects");
    let mut sub = subscriber.subscribe("bench.f.>").await.expect("subscribe");
    subscriber.flush().await.expect("flush");

    let got = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&got);
    let counter = tokio::spawn(async move {
        let mut last = Instant::now();
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
            last = Instant::now();
            if counted.fetch_add(1, Ordering::Relaxed) + 1 == msgs {
                break;
            }
        }
        last
    });

    let subject_names: Arc<[String]> = (0..subjects).map(|i| format!("bench.f.{i}")).collect();
    let payload = Bytes::from(vec![b'x'; size]);
    let mut clients = Vec::new();
    for _ in 0..publishers {
        clients.push(
            async_nats::connect(&server)
                .await
                .expect("publisher connects"),
        );
    }
    let start_publishing = Instant::now();
    let mut tasks = Vec::new();
    for (p, client) in clients.into_iter().enumerate() {
        let share = msgs / publishers + u64::from((p as u64) < msgs % publishers);
        let names = Arc::clone(&subject_names);
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..share {
                let name = &names[((p as u64 + i) % names.len() as u64) as usize];
                if client.publish(name.clone(), payload.clone()).await.is_err() {
                    return;
                }
            }
            let _ = client.flush().await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let last = counter.await.expect("counter");
    let delivered = got.load(Ordering::Relaxed);
    let took = last
        .saturating_duration_since(start_publishing)
        .as_secs_f64();
    println!(
        "{{\"shape\":\"asyncnats-fanin\",\"delivered\":{delivered},\"lost\":{},\"cut\":{},\"msgs_per_sec\":{:.0}}}",
        msgs - delivered.min(msgs),
        cut.load(Ordering::Relaxed),
        if took > 0.0 {
            delivered as f64 / took
        } else {
            0.0
        }
    );
}
