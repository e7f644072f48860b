//! `canopy bench` against an in-process server: every shape finishes, exits 0 and
//! reports the messages it should have received (no timing assertions). `canopy bench`
//! runs the `canopy-bench` executable: these tests go through that launcher, and check
//! that it passes arguments, output and exit status on and says what to build when the
//! executable is missing.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::common::{WAIT, start_default};

const BIN: &str = env!("CARGO_BIN_EXE_canopy");
const MSGS: u64 = 2000;

/// Where cargo puts `canopy-bench`: beside `canopy`, where the launcher looks first.
fn bench_executable() -> PathBuf {
    Path::new(BIN).with_file_name(format!("canopy-bench{}", std::env::consts::EXE_SUFFIX))
}

/// `canopy bench`, ready for its flags. `canopy-bench` is another package's binary, so
/// cargo builds it for `cargo test --workspace` (bench/tests makes it) but not for
/// `cargo test --test it` alone: then this fails saying what to build, rather than
/// letting the launcher find some other copy on PATH.
pub fn canopy_bench() -> Command {
    let executable = bench_executable();
    assert!(
        executable.is_file(),
        "{} is missing: `cargo build -p canopy-bench` builds it (`cargo test --workspace` \
         does too); `cargo test --test it` alone does not",
        executable.display()
    );
    let mut command = Command::new(BIN);
    command.arg("bench");
    command
}

async fn bench(url: &str, shape: &str, extra: &[&str]) -> serde_json::Value {
    let output = tokio::time::timeout(
        WAIT * 3,
        canopy_bench()
            .args(["--server", url, "--shape", shape, "--json"])
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
    let output = canopy_bench()
        .args(["--server", "nats://127.0.0.1:1", "--size", "4"])
        .output()
        .await
        .expect("bench runs");
    // canopy-bench's own status and message, passed on.
    assert_eq!(output.status.code(), Some(1));
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
        // The longest wait between acks is at least one ack's own latency, and no
        // more than the run.
        let gap = report["durable"]["max_ack_gap_ns"].as_u64().expect("a gap");
        let elapsed = report["elapsed_secs"].as_f64().expect("elapsed");
        assert!(
            gap >= report["latency"]["min_ns"].as_u64().expect("min"),
            "{gap}"
        );
        assert!(
            (gap as f64) <= elapsed * 1e9 + 1e6,
            "{gap} over {elapsed} s"
        );
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
    let output = canopy_bench()
        .args(["--server", "nats://127.0.0.1:1", "--shape", "durable"])
        .args(["--expect", "--subjects", "10", "--ack-window", "16"])
        .output()
        .await
        .expect("bench runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--expect needs"), "{stderr}");
}

#[tokio::test]
async fn help_and_usage_errors_come_from_canopy_bench() {
    let help = canopy_bench()
        .arg("--help")
        .output()
        .await
        .expect("bench runs");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for expected in [
        "Usage: canopy bench [OPTIONS]",
        "Shapes:",
        "--shape <SHAPE>",
        "ws-fanout",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
    let wrong = canopy_bench()
        .args(["--shape", "nope"])
        .output()
        .await
        .expect("bench runs");
    // clap's usage-error status, from canopy-bench.
    assert_eq!(wrong.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("unknown shape `nope`"), "{stderr}");
}

/// A link to the `canopy` binary in a folder of its own (under target/, so a hard link
/// works), where no `canopy-bench` lies beside it.
fn lonely_canopy() -> (tempfile::TempDir, PathBuf) {
    let target = Path::new(BIN).parent().expect("the binary is in a folder");
    let dir = tempfile::tempdir_in(target).expect("a folder under target/");
    let canopy = dir
        .path()
        .join(Path::new(BIN).file_name().expect("a file name"));
    if std::fs::hard_link(BIN, &canopy).is_err() {
        std::fs::copy(BIN, &canopy).expect("copy the canopy binary");
    }
    (dir, canopy)
}

#[tokio::test]
async fn without_canopy_bench_the_launcher_says_how_to_build_it() {
    let (dir, canopy) = lonely_canopy();
    let empty = tempfile::tempdir().expect("an empty folder");
    let output = Command::new(&canopy)
        .args(["bench", "--help"])
        .env("PATH", empty.path())
        .output()
        .await
        .expect("canopy runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("neither beside this one")
            && stderr.contains("cargo build --release -p canopy-bench"),
        "{stderr}"
    );
    drop(dir);
}

#[tokio::test]
async fn the_launcher_finds_canopy_bench_on_path() {
    let executable = bench_executable();
    assert!(executable.is_file(), "{} is missing", executable.display());
    let (dir, canopy) = lonely_canopy();
    let output = Command::new(&canopy)
        .args(["bench", "--server", "nats://127.0.0.1:1", "--size", "4"])
        .env("PATH", executable.parent().expect("a folder"))
        .output()
        .await
        .expect("canopy runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 8 bytes"), "{stderr}");
    drop(dir);
}
