//! nats-py, the Python NATS client, unmodified, against Canopy. The test command
//! (scripts/test-all.sh) installs it in a venv under target/; a missing venv is a
//! failure with instructions, never a skip.

use std::path::PathBuf;

use crate::common::start_default;

fn venv_python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test-all.sh, which creates it with nats-py",
        python.display()
    );
    python
}

#[tokio::test]
async fn nats_py_does_core_nats_against_canopy() {
    run_script("nats_py_check.py").await;
}

/// nats-py's JetStream pull consumers: `pull_subscribe`, `add_consumer`, `fetch`,
/// every kind of ack, consumer and stream info, and deleting a consumer.
#[tokio::test]
async fn nats_py_pull_consumers_work_against_canopy() {
    run_script("nats_py_pull.py").await;
}

/// nats-py's stream calls: a stream declared at start (twice), PubAcks and
/// `Nats-Expected-Stream` held to it, consumers bound to it, its versions per subject,
/// its deletion, and the configs refused as nats-server refuses them.
#[tokio::test]
async fn nats_py_declares_and_uses_streams_against_canopy() {
    run_script("nats_py_streams.py").await;
}

/// nats-py's push consumers with acks (`js.subscribe`): ephemeral and durable, with
/// a callback, nak and redelivery after `ack_wait`.
#[tokio::test]
async fn nats_py_push_consumers_work_against_canopy() {
    run_script("nats_py_push.py").await;
}

/// nats-py's Object Store: an object of several chunks put, read back, listed,
/// replaced and deleted, and the bucket's status and deletion.
#[tokio::test]
async fn nats_py_object_store_works_against_canopy() {
    run_script("nats_py_objects.py").await;
}

/// nats-py's KV watching: keys, history, watch and watchall (initial values, then
/// live; with history, headers only, ignoring deletes) and an ordered `js.subscribe`,
/// each an ordered push consumer.
#[tokio::test]
async fn nats_py_kv_watches_against_canopy() {
    run_script("nats_py_kv_watch.py").await;
}

/// nats-py's KV, short of watching: a bucket made and bound, put, get (latest and a
/// revision), create, update at a revision, delete, purge (a rollup), status, the
/// bucket deleted, and the errors for a wrong revision, an existing key and an
/// unknown bucket.
#[tokio::test]
async fn nats_py_kv_works_against_canopy() {
    run_script("nats_py_kv.py").await;
}

/// Runs one script of tests/python against a fresh server; it prints
/// "all checks passed" when every check held.
async fn run_script(name: &str) {
    let python = venv_python();
    let server = start_default().await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name);
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(150),
        tokio::process::Command::new(python)
            .arg(script)
            .arg(server.native_url())
            .output(),
    )
    .await
    .expect("nats-py finishes")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    server.stop().await;
}
