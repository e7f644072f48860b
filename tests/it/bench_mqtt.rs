//! `canopy bench --protocol mqtt` against an in-process server's MQTT listener: every MQTT
//! shape finishes at a tiny size, exits 0 and reports exactly the messages, acks or
//! connections it should have (no timing assertions); broken setups fail with a message.

use crate::bench::canopy_bench;
use crate::common::{WAIT, start_default};

/// Runs `canopy bench` and returns its exit status, stdout and stderr.
async fn run(args: &[&str]) -> (bool, String, String) {
    let output = tokio::time::timeout(
        WAIT * 3,
        canopy_bench().args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("bench finishes")
    .expect("bench runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn bench(url: &str, shape: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--protocol", "mqtt", "--server", url, "--shape", shape];
    args.extend_from_slice(&["--json", "--size", "128", "--stall-secs", "10"]);
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = run(&args).await;
    assert!(ok, "bench {shape} {extra:?} failed: {stderr}");
    serde_json::from_str(&stdout).expect("one JSON object on stdout")
}

fn mqtt_url(server: &canopy::server::RunningServer) -> String {
    format!(
        "mqtt://{}",
        server.mqtt_addr.expect("the MQTT listener is on")
    )
}

#[tokio::test]
async fn every_mqtt_shape_reports_what_it_sent() {
    let server = start_default().await;
    let url = mqtt_url(&server);

    for version in ["3.1.1", "5"] {
        let report = bench(
            &url,
            "mqtt-fanin",
            &[
                "--msgs",
                "2000",
                "--flush-every",
                "500",
                "--mqtt-version",
                version,
            ],
        )
        .await;
        assert_eq!(report["protocol"], "mqtt");
        assert_eq!(
            report["mqtt_version"],
            if version == "5" { "5.0" } else { "3.1.1" }
        );
        assert_eq!(report["publishers"], 8);
        assert_eq!(report["subscribers"], 1);
        assert_eq!(report["delivered"], 2000, "fanin {version}");
        assert_eq!(report["latency"]["count"], 2000, "fanin {version}");

        let report = bench(
            &url,
            "mqtt-qos1",
            &[
                "--msgs",
                "1000",
                "--topics",
                "100",
                "--window",
                "16",
                "--mqtt-version",
                version,
            ],
        )
        .await;
        assert_eq!(report["publishers"], 4);
        assert_eq!(report["window"], 16);
        assert_eq!(report["delivered"], 1000, "qos1 {version}");
        assert_eq!(report["latency"]["count"], 1000, "qos1 {version}");
    }

    let report = bench(&url, "mqtt-fanout", &["--msgs", "200"]).await;
    assert_eq!(report["subscribers"], 100);
    assert_eq!(report["delivered"], 200 * 100);
    assert_eq!(report["latency"]["count"], 200 * 100);

    let report = bench(&url, "mqtt-retained", &["--retained", "300"]).await;
    assert_eq!(report["delivered"], 300);
    assert_eq!(report["retained"]["retained"], 300);
    assert_eq!(
        report["latency"]["count"], 300,
        "one PUBACK per retained message"
    );
    let all = report["retained"]["all_delivered_ns"].as_u64().unwrap_or(0);
    let suback = report["retained"]["suback_ns"].as_u64().unwrap_or(u64::MAX);
    assert!(
        all >= suback,
        "the last retained message came before the SUBACK?"
    );

    let report = bench(&url, "mqtt-idle", &["--conns", "50", "--hold-secs", "0"]).await;
    assert_eq!(report["delivered"], 50);
    assert_eq!(report["idle"]["conns"], 50);
    assert_eq!(report["idle"]["sources"], 1);
    assert_eq!(report["idle"]["got_data"], 0);
    assert_eq!(report["latency"]["count"], 50);

    server.stop().await;
}

#[tokio::test]
async fn a_server_that_is_not_mqtt_fails_the_run() {
    let server = start_default().await;
    // The NATS listener answers with INFO, which is no CONNACK.
    let url = format!("mqtt://{}", server.native_addr);
    let (ok, _, stderr) = run(&[
        "--protocol",
        "mqtt",
        "--server",
        &url,
        "--shape",
        "mqtt-qos1",
        "--msgs",
        "10",
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("mqtt-qos1"), "{stderr}");
    server.stop().await;
}

#[tokio::test]
async fn shapes_and_protocols_must_match() {
    let (ok, _, stderr) = run(&[
        "--protocol",
        "mqtt",
        "--server",
        "mqtt://127.0.0.1:1",
        "--shape",
        "fanin",
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("NATS protocol"), "{stderr}");
    let (ok, _, stderr) = run(&[
        "--protocol",
        "nats",
        "--server",
        "nats://127.0.0.1:1",
        "--shape",
        "mqtt-idle",
    ])
    .await;
    assert!(!ok);
    assert!(stderr.contains("speaks MQTT"), "{stderr}");
}
