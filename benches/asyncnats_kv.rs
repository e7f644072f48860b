//! NATS KV through async-nats's `jetstream::kv` (a client from another project): puts,
//! gets, and a watch of many keys. Against any NATS server already running
//! (benches/kv.sh starts them):
//!
//!     SERVER=nats://127.0.0.1:4222 KEYS=2000 IN_FLIGHT=16 WATCH_KEYS=100000 \
//!       SERVER_PID=<pid> cargo bench --bench asyncnats_kv
//!
//! The bucket ASYNCKV (history 1; nats-py's BENCHKV is made otherwise) is made with `create_key_value`; KEYS keys of SIZE
//! (128) bytes are put with IN_FLIGHT puts awaiting their PubAck at a time, then got
//! back the same way (over DIRECT.GET, which async-nats buckets allow). Then, with
//! WATCH_KEYS > 0, the bucket WATCHKV gets that many keys (256 puts in flight) and a
//! `watch_with_history(">")` (the newest value of every key, then live) is timed until
//! it has given every key once; the server's resident memory (from /proc, when
//! SERVER_PID is given) is sampled every 20 ms meanwhile, and its growth over the
//! watch reported. Prints one JSON line. A refused put or a wrong get fails the run.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Runs `count` operations with `in_flight` at a time: the rate and latencies (µs).
async fn timed<F, Fut>(count: u64, in_flight: usize, one: F) -> (f64, Vec<u64>)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    let mut pending = FuturesUnordered::new();
    let mut latencies = Vec::with_capacity(count as usize);
    let mut next = 0;
    while next < count || !pending.is_empty() {
        while next < count && pending.len() < in_flight {
            let at = Instant::now();
            let op = one(next);
            pending.push(async move {
                op.await;
                at.elapsed().as_micros() as u64
            });
            next += 1;
        }
        if let Some(took) = pending.next().await {
            latencies.push(took);
        }
    }
    let rate = count as f64
        / started
            .elapsed()
            .max(Duration::from_micros(1))
            .as_secs_f64();
    latencies.sort_unstable();
    (rate, latencies)
}

fn summary(rate: f64, latencies: &[u64]) -> String {
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    format!(
        "{{\"per_sec\":{rate:.0},\"p50_us\":{},\"p99_us\":{}}}",
        at(0.5),
        at(0.99)
    )
}

/// The resident memory of `pid` in KiB, from /proc.
fn rss_kib(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

async fn bucket(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> async_nats::jetstream::kv::Store {
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: name.into(),
        history: 1,
        ..Default::default()
    })
    .await
    .expect("bucket")
}

/// Puts `keys` keys into a fresh bucket, then times a watch of all of them.
async fn watch(js: &async_nats::jetstream::Context, keys: u64, size: usize, pid: u64) -> String {
    let kv = bucket(js, "WATCHKV").await;
    let value = Bytes::from(vec![b'w'; size]);
    timed(keys, 256, |i| {
        let (kv, value) = (kv.clone(), value.clone());
        async move {
            kv.put(format!("k{i}"), value).await.expect("put");
        }
    })
    .await;
    let before = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let mut watch = kv.watch_with_history(">").await.expect("watch");
    let mut seen = 0u64;
    let mut first_ms = 0.0;
    while seen < keys {
        let entry = watch
            .next()
            .await
            .expect("the watch is open")
            .expect("an entry");
        if seen == 0 {
            first_ms = started.elapsed().as_secs_f64() * 1e3;
        }
        assert_eq!(entry.value.len(), size, "{}", entry.key);
        seen += 1;
    }
    let all_ms = started.elapsed().as_secs_f64() * 1e3;
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let grew = peak.load(Ordering::Relaxed).saturating_sub(before);
    format!(
        "{{\"keys\":{keys},\"first_ms\":{first_ms:.1},\"all_ms\":{all_ms:.1},\"rss_before_kib\":{before},\"rss_growth_kib\":{grew}}}"
    )
}

#[tokio::main]
async fn main() {
    let server = std::env::var("SERVER").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let keys = env("KEYS", 2_000);
    let in_flight = env("IN_FLIGHT", 16).max(1) as usize;
    let size = env("SIZE", 128) as usize;
    let watch_keys = env("WATCH_KEYS", 0);
    let pid = env("SERVER_PID", 0);
    let client = async_nats::connect(&server).await.expect("connects");
    let js = async_nats::jetstream::new(client);
    let kv = bucket(&js, "ASYNCKV").await;
    let value = Bytes::from(vec![b'x'; size]);
    let (put_rate, puts) = timed(keys, in_flight, |i| {
        let (kv, value) = (kv.clone(), value.clone());
        async move {
            kv.put(format!("k{i}"), value).await.expect("put");
        }
    })
    .await;
    let (get_rate, gets) = timed(keys, in_flight, |i| {
        let kv = kv.clone();
        async move {
            let got = kv
                .get(format!("k{i}"))
                .await
                .expect("get")
                .expect("the key is there");
            assert_eq!(got.len(), size, "k{i}");
        }
    })
    .await;
    let watched = if watch_keys > 0 {
        watch(&js, watch_keys, size, pid).await
    } else {
        "null".into()
    };
    println!(
        "{{\"shape\":\"asyncnats-kv\",\"keys\":{keys},\"put\":{},\"get\":{},\"watch\":{watched}}}",
        summary(put_rate, &puts),
        summary(get_rate, &gets)
    );
}
