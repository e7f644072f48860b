//! Mosquitto's command-line clients (`mosquitto_pub`, `mosquitto_sub`) against Canopy,
//! at MQTT 3.1, 3.1.1 and 5.0, and the bridge to the native protocol.
//!
//! `mosquitto_sub -d` prints `Subscribed (mid: 1): QOS...` when its SUBACK arrives:
//! that line, read through `stdbuf -oL` (mosquitto_sub does not flush a pipe), is how
//! a test knows the subscription is in place before it publishes.

use std::net::SocketAddr;
use std::process::Stdio;

use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::{mqtt_addr, tool};
use crate::common::{WAIT, start_default};

fn connection_args(addr: SocketAddr, version: &str) -> Vec<String> {
    vec![
        "-h".into(),
        addr.ip().to_string(),
        "-p".into(),
        addr.port().to_string(),
        "-V".into(),
        version.into(),
    ]
}

/// A running `mosquitto_sub`.
struct MosquittoSub {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    output: Vec<String>,
}

impl MosquittoSub {
    /// Starts `mosquitto_sub -d` with `args` and returns once its subscription is
    /// acknowledged, with the granted QoS (or failure codes) it printed.
    async fn start(addr: SocketAddr, version: &str, args: &[&str]) -> (MosquittoSub, String) {
        let stdbuf = tool("stdbuf", "coreutils");
        let sub = tool("mosquitto_sub", "mosquitto-clients");
        let mut child = Command::new(stdbuf)
            .arg("-oL")
            .arg(sub)
            .args(connection_args(addr, version))
            .arg("-d")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut sub = MosquittoSub {
            child,
            lines: BufReader::new(stdout).lines(),
            output: Vec::new(),
        };
        loop {
            let Some(line) = sub.next_line().await else {
                let stderr = sub.stderr().await;
                panic!(
                    "mosquitto_sub {args:?} ended before its SUBACK; output: {:?}, stderr: \
                     {stderr}",
                    sub.output
                );
            };
            if let Some(granted) = line.strip_prefix("Subscribed (mid: 1): ") {
                return (sub, granted.to_owned());
            }
        }
    }

    /// The next line of output, or `None` at EOF; panics after the wait.
    async fn next_line(&mut self) -> Option<String> {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "mosquitto_sub printed nothing within the wait; so far: {:?}",
                    self.output
                )
            })
            .expect("read mosquitto_sub's output");
        if let Some(line) = &line {
            self.output.push(line.clone());
        }
        line
    }

    async fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = tokio::time::timeout(WAIT, stderr.read_to_string(&mut text)).await;
        }
        text
    }

    /// Waits until mosquitto_sub exits by itself (after its `-C` count), checks that it
    /// succeeded, and returns what it printed for the messages (its debug lines, which
    /// start with `Client ` or `Subscribed `, left out).
    async fn finish(mut self) -> Vec<String> {
        while self.next_line().await.is_some() {}
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("mosquitto_sub exits after its -C count")
            .expect("wait for mosquitto_sub");
        let stderr = self.stderr().await;
        assert!(
            status.success(),
            "mosquitto_sub failed ({status}); output: {:?}, stderr: {stderr}",
            self.output
        );
        self.output
            .into_iter()
            .filter(|line| !line.starts_with("Client ") && !line.starts_with("Subscribed "))
            .collect()
    }
}

/// Runs `mosquitto_pub` to completion (for QoS 1 and 2, until the server acknowledged)
/// and asserts it succeeded.
async fn mosquitto_pub(addr: SocketAddr, version: &str, args: &[&str]) {
    let output = tokio::time::timeout(
        WAIT,
        Command::new(tool("mosquitto_pub", "mosquitto-clients"))
            .args(connection_args(addr, version))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("mosquitto_pub {args:?} still running after the wait"))
    .expect("mosquitto_pub runs");
    assert!(
        output.status.success(),
        "mosquitto_pub {args:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `-F` format of the message lines: QoS, retain flag, topic, payload.
const FORMAT: &str = "MSG %q %r %t %p";

async fn round_trip(version: &str) {
    let server = start_default().await;
    let addr = mqtt_addr(&server);
    let (sub, granted) = MosquittoSub::start(
        addr,
        version,
        &["-q", "2", "-t", "rt/#", "-C", "3", "-F", FORMAT],
    )
    .await;
    assert_eq!(granted, "2", "granted QoS for rt/#");
    for (qos, payload) in [("0", "zero"), ("1", "one"), ("2", "two")] {
        let topic = format!("rt/q{qos}");
        mosquitto_pub(addr, version, &["-q", qos, "-t", &topic, "-m", payload]).await;
    }
    let mut lines = sub.finish().await;
    lines.sort();
    assert_eq!(
        lines,
        [
            "MSG 0 0 rt/q0 zero",
            "MSG 1 0 rt/q1 one",
            "MSG 2 0 rt/q2 two"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn mosquitto_round_trip_qos_0_1_2_mqtt31() {
    round_trip("mqttv31").await;
}

#[tokio::test]
async fn mosquitto_round_trip_qos_0_1_2_mqtt311() {
    round_trip("mqttv311").await;
}

#[tokio::test]
async fn mosquitto_round_trip_qos_0_1_2_mqtt5() {
    round_trip("mqttv5").await;
}

/// `-r` keeps a message for later subscribers (retain flag 1); a later publish without
/// `-r` does not replace it; `-r -n` (empty) clears it.
async fn retained(version: &str) {
    let server = start_default().await;
    let addr = mqtt_addr(&server);
    mosquitto_pub(
        addr,
        version,
        &["-q", "1", "-r", "-t", "ret/x", "-m", "kept"],
    )
    .await;
    mosquitto_pub(
        addr,
        version,
        &["-q", "1", "-t", "ret/x", "-m", "not retained"],
    )
    .await;
    let (sub, _) = MosquittoSub::start(
        addr,
        version,
        &["-q", "1", "-t", "ret/#", "-C", "1", "-F", FORMAT],
    )
    .await;
    assert_eq!(sub.finish().await, ["MSG 1 1 ret/x kept"]);

    mosquitto_pub(addr, version, &["-q", "1", "-r", "-t", "ret/x", "-n"]).await;
    mosquitto_pub(
        addr,
        version,
        &["-q", "1", "-r", "-t", "ret/y", "-m", "other"],
    )
    .await;
    // Two messages: the retained ret/y, then a live one. Had ret/x not been cleared,
    // the two would be ret/x and ret/y.
    let (sub, _) = MosquittoSub::start(
        addr,
        version,
        &["-q", "1", "-t", "ret/#", "-C", "2", "-F", FORMAT],
    )
    .await;
    mosquitto_pub(addr, version, &["-q", "1", "-t", "ret/z", "-m", "live"]).await;
    let mut lines = sub.finish().await;
    lines.sort();
    assert_eq!(lines, ["MSG 1 0 ret/z live", "MSG 1 1 ret/y other"]);
    server.stop().await;
}

#[tokio::test]
async fn mosquitto_retained_mqtt311() {
    retained("mqttv311").await;
}

#[tokio::test]
async fn mosquitto_retained_mqtt5() {
    retained("mqttv5").await;
}

/// v5 user properties reach a v5 subscriber, in order, duplicate keys included.
#[tokio::test]
async fn mosquitto_user_properties_mqtt5() {
    let server = start_default().await;
    let addr = mqtt_addr(&server);
    let (sub, _) = MosquittoSub::start(
        addr,
        "mqttv5",
        &["-q", "1", "-t", "up/#", "-C", "1", "-F", "MSG %t %P|%p"],
    )
    .await;
    mosquitto_pub(
        addr,
        "mqttv5",
        &[
            "-q",
            "1",
            "-t",
            "up/x",
            "-m",
            "hello world",
            "-D",
            "publish",
            "user-property",
            "site",
            "north",
            "-D",
            "publish",
            "user-property",
            "unit",
            "C",
            "-D",
            "publish",
            "user-property",
            "site",
            "south",
        ],
    )
    .await;
    assert_eq!(
        sub.finish().await,
        ["MSG up/x site:north unit:C site:south|hello world"]
    );
    server.stop().await;
}

/// A native (NATS protocol) publish to `devices.42.temp` is `devices/42/temp` to an
/// MQTT `#` subscriber.
async fn native_publish_to_mosquitto_sub(version: &str) {
    let server = start_default().await;
    let (sub, _) = MosquittoSub::start(
        mqtt_addr(&server),
        version,
        &["-q", "1", "-t", "#", "-v", "-C", "1"],
    )
    .await;
    let native = async_nats::connect(server.native_url())
        .await
        .expect("native client connects");
    native
        .publish("devices.42.temp", "21.5".into())
        .await
        .expect("publish");
    native.flush().await.expect("flush");
    assert_eq!(sub.finish().await, ["devices/42/temp 21.5"]);
    server.stop().await;
}

#[tokio::test]
async fn mosquitto_sub_sees_native_publish_mqtt311() {
    native_publish_to_mosquitto_sub("mqttv311").await;
}

#[tokio::test]
async fn mosquitto_sub_sees_native_publish_mqtt5() {
    native_publish_to_mosquitto_sub("mqttv5").await;
}

/// And the other way: `mosquitto_pub -t devices/9/temp` reaches a native subscriber
/// of `devices.*.temp` as `devices.9.temp`.
#[tokio::test]
async fn native_subscriber_sees_mosquitto_pub() {
    let server = start_default().await;
    let native = async_nats::connect(server.native_url())
        .await
        .expect("native client connects");
    let mut sub = native.subscribe("devices.*.temp").await.expect("subscribe");
    native.flush().await.expect("flush");
    mosquitto_pub(
        mqtt_addr(&server),
        "mqttv311",
        &["-q", "1", "-t", "devices/9/temp", "-m", "19.5"],
    )
    .await;
    let message = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("the MQTT publish within the wait")
        .expect("subscription open");
    assert_eq!(message.subject.as_str(), "devices.9.temp");
    assert_eq!(&message.payload[..], b"19.5");
    server.stop().await;
}
