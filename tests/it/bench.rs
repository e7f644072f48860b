//! `canopy bench` against an in-process server: every shape finishes, exits 0 and
//! reports the messages it should have received (no timing assertions).

use tokio::process::Command;

use crate::common::{WAIT, start_default};

const BIN: &str = env!("CARGO_BIN_EXE_canopy");
const MSGS: u64 = 2000;

async fn bench(url: &str, shape: &str, extra: &[&str]) -> serde_json::Value {
    let output = tokio::time::timeout(
        WAIT * 3,
        Command::new(BIN)
            .args(["bench", "--server", url, "--shape", shape, "--json"])
            .args([
                "--msgs",
                &MSGS.to_string(),
                "--size",
                "128",
                "--flush-every",
                "500",
            ])
            .args(extra)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("bench finishes")
    .expect("bench runs");
    assert!(
        output.status.success(),
        "bench {shape} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object on stdout")
}

#[tokio::test]
async fn every_shape_reports_every_message() {
    let server = start_default().await;
    let url = server.native_url();
    for (shape, extra, publishers, subscribers, delivered) in [
        ("pubsub", &[][..], 1, 1, MSGS),
        ("fanin", &[][..], 4, 1, MSGS),
        ("fanout", &[][..], 1, 10, MSGS * 10),
        ("reqrep", &["--window", "1"][..], 1, 1, MSGS),
        ("reqrep", &["--window", "64"][..], 1, 1, MSGS),
    ] {
        let report = bench(&url, shape, extra).await;
        assert_eq!(report["shape"], shape);
        assert_eq!(report["msgs"], MSGS, "{shape}");
        assert_eq!(report["size"], 128, "{shape}");
        assert_eq!(report["publishers"], publishers, "{shape}");
        assert_eq!(report["subscribers"], subscribers, "{shape}");
        assert_eq!(report["delivered"], delivered, "{shape}");
        assert_eq!(report["latency"]["count"], delivered, "{shape}");
        assert_eq!(
            report["server_go"],
            format!("canopy {}", env!("CARGO_PKG_VERSION"))
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_payload_too_small_for_the_timestamp_is_refused() {
    let output = Command::new(BIN)
        .args(["bench", "--server", "nats://127.0.0.1:1", "--size", "4"])
        .output()
        .await
        .expect("bench runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 8 bytes"), "{stderr}");
}

#[tokio::test]
async fn durable_and_replay_shapes_count_every_ack() {
    let server = start_default().await;
    let url = server.native_url();
    let small = ["--subjects", "100", "--ack-window", "16"];
    for expect in [false, true] {
        let extra: Vec<&str> = small
            .iter()
            .copied()
            .chain(expect.then_some("--expect"))
            .collect();
        let report = bench(&url, "durable", &extra).await;
        assert_eq!(report["shape"], "durable");
        assert_eq!(report["publishers"], 4);
        assert_eq!(report["delivered"], MSGS, "expect: {expect}");
        assert_eq!(report["latency"]["count"], MSGS, "expect: {expect}");
        assert_eq!(report["durable"]["server_kind"], "canopy");
        assert_eq!(report["durable"]["expect"], expect);
        assert_eq!(report["durable"]["errors"], 0);
    }
    // 2000 messages over 100 fresh subjects: 20 each; read the first 10 of 5 subjects.
    let replay = [
        "--subjects",
        "100",
        "--prefix",
        "bench.d.r",
        "--replay-samples",
        "5",
        "--replay-max",
        "10",
    ];
    let report = bench(&url, "replay", &replay).await;
    assert_eq!(report["delivered"], MSGS);
    assert_eq!(report["replay"]["samples"], 5);
    assert_eq!(report["replay"]["min_count"], 10);
    assert_eq!(
        report["replay"]["times_ns"].as_array().map(Vec::len),
        Some(5)
    );
    server.stop().await;
}

#[tokio::test]
async fn expect_refuses_a_window_wider_than_the_subjects() {
    let output = Command::new(BIN)
        .args([
            "bench",
            "--server",
            "nats://127.0.0.1:1",
            "--shape",
            "durable",
        ])
        .args(["--expect", "--subjects", "10", "--ack-window", "16"])
        .output()
        .await
        .expect("bench runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--expect needs"), "{stderr}");
}
