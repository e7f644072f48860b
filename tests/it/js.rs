//! JavaScript clients from other projects against Canopy: MQTT.js over WebSocket. The
//! test command (scripts/test-all.sh) installs Node's packages from
//! tests/js/package-lock.json; a missing one is a failure with instructions.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::start_default;

fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

#[tokio::test]
async fn mqtt_js_over_websocket_exchanges_messages_with_native_clients() {
    assert!(
        js_dir().join("node_modules/mqtt").exists(),
        "tests/js/node_modules is missing: run ./scripts/test-all.sh, which installs MQTT.js"
    );
    for version in ["4", "5"] {
        let server = start_default().await;
        let http = server.http_addr.expect("http on");
        let nats = async_nats::connect(server.native_url())
            .await
            .expect("nats");
        let mut from_browser = nats.subscribe("browser.out").await.expect("sub");
        nats.flush().await.expect("flush");
        let mut node = tokio::process::Command::new("node")
            .arg(js_dir().join("mqtt_ws_check.mjs"))
            .arg(format!("ws://{http}/mqtt"))
            .arg(version)
            .current_dir(js_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (apt-get install nodejs npm)");
        let mut lines = BufReader::new(node.stdout.take().expect("stdout")).lines();
        let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("MQTT.js subscribes in time")
            .expect("stdout readable");
        assert_eq!(ready.as_deref(), Some("ready"), "MQTT.js {version}");
        nats.publish("devices.42.temp", "21.5".into())
            .await
            .expect("publish");
        nats.flush().await.expect("flush");
        let got = tokio::time::timeout(Duration::from_secs(20), from_browser.next())
            .await
            .expect("MQTT.js answers in time")
            .expect("a message");
        assert_eq!(&got.payload[..], b"from mqtt.js");
        let output = tokio::time::timeout(Duration::from_secs(20), node.wait_with_output())
            .await
            .expect("node exits")
            .expect("node ran");
        let rest = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        assert!(
            output.status.success(),
            "MQTT.js {version} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(rest.as_deref(), Some("all checks passed"));
        server.stop().await;
    }
}
