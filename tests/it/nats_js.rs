//! nats.js (npm `nats` 2.29) against Canopy: core publish and subscribe, request/reply
//! and JetStream publishes, with and without options and headers
//! (tests/js/nats_js_clients.mjs), and its KV (tests/js/nats_js_kv.mjs). nats.js sends a JetStream publish without options as
//! an HPUB with an empty header block (`HPUB <subject> <reply> 0 <#total>`); as in
//! nats-server, that is a message without headers, delivered as a plain MSG.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{Raw, start_default};

fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

#[tokio::test]
async fn nats_js_publishes_subscribes_requests_and_jetstream_publishes() {
    run_node("nats_js_clients.mjs").await;
}

/// Runs one script of tests/js (nats.js, unmodified) against a fresh server; it
/// prints "all checks passed" when every check held.
async fn run_node(script: &str) {
    let js = js_dir();
    assert!(
        js.join("node_modules/nats").exists(),
        "tests/js/node_modules/nats is missing: run ./scripts/test-all.sh, which installs it"
    );
    let server = start_default().await;
    let run = tokio::process::Command::new("node")
        .arg(js.join(script))
        .arg(server.native_addr.to_string())
        .current_dir(&js)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("{script} finishes within two minutes"))
        .expect("node runs (apt-get install nodejs npm)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "{script} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    server.stop().await;
}

/// nats.js's KV, short of watching (tests/js/nats_js_kv.mjs): a bucket made and bound,
/// put, get over DIRECT.GET (latest and a revision), create, update at a revision,
/// delete, purge, status and destroy, with the refusals of a stale revision and an
/// existing key.
#[tokio::test]
async fn nats_js_kv_works_against_canopy() {
    run_node("nats_js_kv.mjs").await;
}

/// nats.js's KV watching (tests/js/nats_js_kv_watch.mjs): keys, history, watch with
/// its initial values then live updates (one key with history and headers only,
/// updates only on a wildcard) and an ordered consumer over a stream.
#[tokio::test]
async fn nats_js_kv_watches_against_canopy() {
    run_node("nats_js_kv_watch.mjs").await;
}

/// nats.js's Object Store (tests/js/nats_js_objects.mjs): an object of several chunks
/// put, read back, listed, replaced and deleted, and the bucket's status and deletion.
#[tokio::test]
async fn nats_js_object_store_works_against_canopy() {
    run_node("nats_js_objects.mjs").await;
}

/// nats.js's ordered consumers (tests/js/nats_js_ordered.mjs): `consumers.get(stream)`
/// consumed, fetched and read one by one, with a filter, from a sequence, an empty
/// fetch ending on the server's 408, and a reset when its consumer is deleted.
#[tokio::test]
async fn nats_js_ordered_consumers_work_against_canopy() {
    run_node("nats_js_ordered.mjs").await;
}

/// The bytes nats.js sends, and what a subscriber gets: a plain MSG (nats-server
/// writes HMSG only for a header block of at least one byte), on a subject that is
/// routed at once and on one the store sequences.
#[tokio::test]
async fn an_empty_header_block_is_a_message_without_headers() {
    let server = start_default().await;
    let mut sub = Raw::connect(server.native_addr).await;
    sub.send("CONNECT {\"headers\":true}\r\nSUB _INBOX.live.* 1\r\nSUB kept.> 2\r\n")
        .await;
    sub.ping_pong().await;
    let mut publisher = Raw::connect(server.native_addr).await;
    publisher
        .send(
            "CONNECT {\"headers\":true}\r\n\
             HPUB _INBOX.live.a r.1 0 1\r\nx\r\n\
             HPUB _INBOX.live.b 0 0\r\n\r\n\
             HPUB kept.a 0 2\r\nyz\r\n",
        )
        .await;
    publisher.ping_pong().await;
    sub.ping_pong_after_msgs(&[
        "MSG _INBOX.live.a 1 r.1 1",
        "x",
        "MSG _INBOX.live.b 1 0",
        "",
        "MSG kept.a 2 2",
        "yz",
    ])
    .await;

    // A header block too short to hold `NATS/1.0` is still refused.
    publisher.send("HPUB kept.b 3 4\r\nabcd\r\n").await;
    assert_eq!(publisher.line().await, "-ERR 'Parser Error'");
    publisher.expect_eof().await;
    server.stop().await;
}
