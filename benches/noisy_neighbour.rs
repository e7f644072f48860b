//! The noisy-neighbour load run (issue 7): does a tenant publishing far over its rate
//! quota take throughput from another tenant?
//!
//!     cargo bench --bench noisy_neighbour
//!     ROUNDS=5 MSGS=400000 NOISY=4 cargo bench --bench noisy_neighbour
//!
//! It starts the release `canopy` binary on free loopback ports (logins required,
//! store on a fresh folder, live subjects not stored so the broker, not the disk, is
//! what is shared), creates tenants `quiet` (no limits) and `noisy`
//! (`max_publish_msgs_per_sec` = 1,000), and measures the quiet tenant's delivered rate
//! (one async-nats publisher, one subscriber, MSGS messages of 128 bytes) in rounds:
//! alone; while NOISY noisy connections publish as fast as they can; and, for scale,
//! while the noisy tenant floods with no limit. Load and server share the machine's
//! two cores. Prints one line per round and the medians.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use support::{api, env_u64, free_port};

const NOISY_RATE: u64 = 1_000;
const PAYLOAD: usize = 128;
/// Quiet messages published and not yet received, at most.
const MAX_IN_FLIGHT: u64 = 20_000;

async fn log_in(url: &str, user: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into())
        .connect(url)
        .await
        .expect("logs in")
}

/// The quiet tenant's delivered rate: MSGS messages from one publisher to one
/// subscriber, timed from the first publish to the last delivery.
async fn quiet_rate(url: &str, msgs: u64) -> f64 {
    let publisher = log_in(url, "app@quiet").await;
    let subscriber = log_in(url, "app@quiet").await;
    let mut sub = subscriber.subscribe("live.quiet").await.expect("sub");
    // async-nats' flush only writes; a request on the same connection is answered
    // after the server took the SUB before it.
    subscriber
        .request("$CANOPY.subjects", "{\"max\": 1}".into())
        .await
        .expect("the subscription is in place");
    let payload = bytes::Bytes::from(vec![b'q'; PAYLOAD]);
    let started = Instant::now();
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = std::sync::Arc::clone(&received);
    let receiving = tokio::spawn(async move {
        let mut got = 0;
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        let mut expect = 0u64;
        while got < msgs {
            match tokio::time::timeout(Duration::from_secs(30), sub.next()).await {
                Ok(Some(m)) => {
                    let n = m
                        .payload
                        .get(..8)
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map_or(0, u64::from_be_bytes);
                    if n != expect && gaps.len() < 10 {
                        gaps.push((expect, n));
                    }
                    expect = n + 1;
                    got += 1;
                    counted.store(got, std::sync::atomic::Ordering::Relaxed);
                }
                _ => break,
            }
        }
        if got != msgs {
            eprintln!("gaps (expected, got): {gaps:?}; last {expect}");
        }
        (got, started.elapsed())
    });
    for i in 0..msgs {
        let mut numbered = payload.to_vec();
        numbered[..8].copy_from_slice(&i.to_be_bytes());
        publisher
            .publish("live.quiet", numbered.into())
            .await
            .expect("pub");
        if i % 1_000 == 999 {
            // Bounded in flight, so no buffer on the way overflows.
            let waiting = Instant::now();
            while (i + 1).saturating_sub(received.load(std::sync::atomic::Ordering::Relaxed))
                > MAX_IN_FLIGHT
            {
                assert!(
                    waiting.elapsed() < Duration::from_secs(30),
                    "deliveries stalled: {} of {i} published",
                    received.load(std::sync::atomic::Ordering::Relaxed)
                );
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
    }
    publisher.flush().await.expect("flush");
    let (got, took) = receiving.await.expect("receiver");
    assert_eq!(got, msgs, "every quiet message arrives (got {got})");
    msgs as f64 / took.as_secs_f64()
}

/// NOISY connections of the noisy tenant publishing as fast as they can until
/// stopped; returns how many publishes each got through its client.
fn flood(
    url: &str,
    connections: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..connections)
        .map(|_| {
            let url = url.to_owned();
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = log_in(&url, "app@noisy").await;
                let payload = bytes::Bytes::from(vec![b'n'; PAYLOAD]);
                let mut sent = 0;
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return sent,
                        done = client.publish("live.noisy", payload.clone()) => {
                            if done.is_err() {
                                return sent;
                            }
                            sent += 1;
                        }
                    }
                }
            })
        })
        .collect()
}

async fn with_flood(url: &str, msgs: u64, noisy: u64) -> (f64, u64) {
    let stop = tokio_util::sync::CancellationToken::new();
    let flooders = flood(url, noisy, stop.clone());
    // Let the flood reach its stride before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rate = quiet_rate(url, msgs).await;
    stop.cancel();
    let mut sent = 0;
    for flooder in flooders {
        sent += flooder.await.unwrap_or(0);
    }
    (rate, sent)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() {
    let rounds = env_u64("ROUNDS", 3);
    let msgs = env_u64("MSGS", 300_000);
    let noisy = env_u64("NOISY", 4);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("canopy.toml");
    // Live traffic only: what the tenants share here is the broker and the cores.
    std::fs::write(
        &config,
        "[[store.policies]]\npattern = \">\"\nstore = false\n",
    )
    .expect("config");
    let native = free_port();
    let http = free_port();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{native}"),
            "--log",
            "info",
            "--http-listen",
            &format!("127.0.0.1:{http}"),
        ])
        .arg("--config")
        .arg(&config)
        .env(
            "CANOPY_STORE__URL",
            format!("file://{}", dir.path().join("store").display()),
        )
        .env("CANOPY_AUTHZ__REQUIRE_LOGIN", "true")
        .env("CANOPY_AUTHZ__BOOTSTRAP_ADMIN_PASSWORD", "admin-pw")
        .env_remove("CANOPY_CONFIG")
        .stdout(Stdio::null())
        .stderr(
            // Slow consumers and refusals are logged at info.
            std::fs::File::create(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/target/bench-noisy.log"
            ))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null()),
        )
        .kill_on_drop(true)
        .spawn()
        .expect("canopy starts");
    let url = format!("127.0.0.1:{native}");
    let admin = {
        let mut tries = 0;
        loop {
            let connected = async_nats::ConnectOptions::with_user_and_password(
                "admin".into(),
                "admin-pw".into(),
            )
            .connect(&url)
            .await;
            match connected {
                Ok(client) => break client,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("canopy did not start: {error}"),
            }
        }
    };
    let limits = [
        ("quiet", json!({})),
        ("noisy", json!({"max_publish_msgs_per_sec": NOISY_RATE})),
    ];
    for (tenant, limits) in limits {
        api(
            &admin,
            "tenant.create",
            json!({"name": tenant, "limits": limits}),
        )
        .await;
        api(
            &admin,
            "user.create",
            json!({"tenant": tenant, "name": "app", "password": "pw"}),
        )
        .await;
    }
    println!(
        "noisy neighbour: quiet tenant delivers {msgs} x {PAYLOAD} B; noisy tenant: {noisy} \
         connections flooding, quota {NOISY_RATE} msgs/s"
    );
    let (mut alone, mut contended, mut unlimited) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let base = quiet_rate(&url, msgs).await;
        eprintln!("  alone: {base:.0}");
        let (over_quota, noisy_sent) = with_flood(&url, msgs, noisy).await;
        eprintln!("  over quota: {over_quota:.0}");
        // The same flood from a tenant without a quota, for scale.
        api(
            &admin,
            "tenant.update",
            json!({"name": "noisy", "limits": {}}),
        )
        .await;
        let (no_quota, _) = with_flood(&url, msgs, noisy).await;
        api(
            &admin,
            "tenant.update",
            json!({"name": "noisy", "limits": {"max_publish_msgs_per_sec": NOISY_RATE}}),
        )
        .await;
        println!(
            "round {round}: alone {base:.0} msgs/s; noisy over quota {over_quota:.0} msgs/s \
             ({:.2}x, noisy client sent {noisy_sent}); noisy without quota {no_quota:.0} msgs/s \
             ({:.2}x)",
            over_quota / base,
            no_quota / base
        );
        alone.push(base);
        contended.push(over_quota);
        unlimited.push(no_quota);
    }
    let (alone, contended, unlimited) = (median(alone), median(contended), median(unlimited));
    println!(
        "median: alone {alone:.0} msgs/s; with the noisy tenant over its quota {contended:.0} \
         msgs/s ({:.2}x); without a quota {unlimited:.0} msgs/s ({:.2}x)",
        contended / alone,
        unlimited / alone
    );
    let _ = server.kill().await;
}
