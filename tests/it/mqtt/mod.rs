//! MQTT 3.1, 3.1.1 and 5.0 against Canopy's MQTT listener, driven by clients from
//! other projects, unmodified:
//!
//! - `paho`: paho-mqtt 2.x (Python) and a raw-socket client, running the scenarios of
//!   `tests/python/mqtt_scenarios.py` (retained, wills, QoS 2, sessions, limits, ...);
//! - `mosquitto_cli`: Mosquitto's `mosquitto_pub` and `mosquitto_sub`, as processes;
//! - `rumqttc_client`: rumqttc's v4 and v5 async clients, in this process;
//!
//! plus the bridge to the native protocol (async-nats) both ways. Every scenario was
//! checked against Mosquitto 2 where the MQTT specification defines the behaviour (see
//! the scenario file's header for where Mosquitto itself deviates).
//!
//! The tools come from scripts/test-all.sh (a venv under target/ with paho-mqtt, and
//! Debian's mosquitto-clients); a missing tool fails the test and says so, never a skip.

mod exchanges;
mod mosquitto_cli;
mod paho;
mod rumqttc_client;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use canopy::server::RunningServer;

/// A Python scenario's own waits are a few seconds each and its watchdog ends it at
/// 90 s; this is the last resort if the process itself hangs.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);

/// The address of a running test server's MQTT listener.
// `RunningServer::mqtt_addr` is an `Option` while the listener can be turned off;
// `.into()` accepts a plain address too.
#[allow(clippy::useless_conversion)]
pub fn mqtt_addr(server: &RunningServer) -> SocketAddr {
    let addr: Option<SocketAddr> = server.mqtt_addr.into();
    addr.expect("the MQTT listener is on (common::test_config sets mqtt.listen)")
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, which has paho-mqtt.
pub fn venv_python() -> PathBuf {
    let python = manifest_dir().join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test-all.sh, which creates it with paho-mqtt",
        python.display()
    );
    python
}

/// `name` on the PATH, or a failure that says how to install it.
pub fn tool(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: run ./scripts/test-all.sh, which installs the \
                 Debian package {package}"
            )
        })
}

/// Runs `python tests/python/mqtt_scenarios.py 127.0.0.1 PORT scenario args...` and
/// asserts it printed `ok SCENARIO` and exited 0; on failure the panic carries the
/// scenario's own message (what the server did differently).
pub async fn run_scenario(addr: SocketAddr, scenario: &str, args: &[&str]) {
    run_script("mqtt_scenarios.py", addr, scenario, args).await;
}

/// [`run_scenario`] for any scenario script in `tests/python/`.
pub async fn run_script(file: &str, addr: SocketAddr, scenario: &str, args: &[&str]) {
    let python = venv_python();
    let script = manifest_dir().join("tests/python").join(file);
    let output = tokio::time::timeout(
        SCENARIO_TIMEOUT,
        tokio::process::Command::new(&python)
            .arg(&script)
            .arg(addr.ip().to_string())
            .arg(addr.port().to_string())
            .arg(scenario)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("scenario {scenario} {args:?} still running after the timeout"))
    .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "MQTT scenario {scenario} {args:?} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        stdout.lines().any(|line| line == format!("ok {scenario}")),
        "scenario {scenario} exited 0 without `ok {scenario}`\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
