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

#[tokio::test]
async fn the_browser_client_module_is_served_and_works() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    // Served as JavaScript, byte for byte the module in web/.
    let mut stream = tokio::net::TcpStream::connect(http).await.expect("connect");
    stream
        .write_all(b"GET /canopy.js HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_lowercase()
            .contains("content-type: text/javascript"),
        "{text}"
    );
    let module =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("web/canopy.js"))
            .expect("web/canopy.js");
    assert!(
        text.ends_with(&module),
        "the served module is web/canopy.js"
    );

    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("node")
            .arg(js_dir().join("canopy_js_check.mjs"))
            .arg(format!("ws://{http}/ws"))
            .output(),
    )
    .await
    .expect("node finishes")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "canopy.js check failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.stop().await;
}
