//! The `canopy-bench` executable on its own, as `canopy bench` runs it: its help, its
//! usage errors and its error line. Runs against real servers live in the workspace's
//! `tests/it/bench*.rs`, through `canopy bench`; this file also makes cargo build the
//! executable for `cargo test --workspace`, which those tests need (cargo builds a
//! package's binaries for its own integration tests only).

use std::process::{Command, Output};

fn canopy_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_canopy-bench"))
        .args(args)
        .output()
        .expect("canopy-bench runs")
}

#[test]
fn help_names_the_command_people_type_and_every_shape() {
    let output = canopy_bench(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("Usage: canopy bench [OPTIONS]"), "{help}");
    for shape in [
        "pubsub",
        "fanin",
        "fanout",
        "reqrep",
        "durable",
        "replay",
        "mqtt-fanin",
        "mqtt-qos1",
        "mqtt-fanout",
        "mqtt-idle",
        "mqtt-retained",
        "ws-fanout",
    ] {
        assert!(
            help.contains(&format!("  {shape} ")),
            "{shape} missing:\n{help}"
        );
    }
}

#[test]
fn a_bad_flag_is_a_usage_error() {
    let output = canopy_bench(&["--shape", "nope"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown shape `nope`"), "{stderr}");
}

#[test]
fn a_failed_run_is_one_line_on_stderr_and_status_1() {
    // Refused before connecting: no server needed.
    let output = canopy_bench(&["--server", "nats://127.0.0.1:1", "--size", "4"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "canopy: bench pubsub against nats://127.0.0.1:1: payload size 4 is too small: at \
         least 8 bytes carry the send timestamp\n"
    );
}
