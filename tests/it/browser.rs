//! Browser clients in a real headless Chromium: a page using `/canopy.js` (the JSON
//! WebSocket API at `/ws`) and a page using MQTT.js over `/mqtt`, each exchanging
//! messages with a native async-nats client. tests/js/browser_clients_check.mjs drives
//! the pages through tests/js/browser.mjs (playwright-core on Debian's /usr/bin/chromium)
//! and saves a screenshot of each in target/screenshots/ (or $CANOPY_SCREENSHOT_DIR).
//! scripts/test-all.sh installs Chromium and the npm packages; a missing one is a
//! failure with instructions, never a skip.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use tokio::task::JoinHandle;

use crate::common::{header, header_of, start_default};

/// One step of the browser script: starting Chromium and loading pages on a loaded
/// 2-core CI machine can take seconds; the script bounds itself at 90 s in all.
const STEP: Duration = Duration::from_secs(60);

fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

pub(crate) fn chromium() -> PathBuf {
    std::env::var_os("CANOPY_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// A Node script that speaks to the test one stdout line at a time; its stderr is
/// collected for failure messages.
pub(crate) struct Script {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read but not yet asked for.
    pending: Vec<String>,
    /// Every stdout line, for failure messages.
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Script {
    pub(crate) fn spawn(script: &str, args: &[String]) -> Script {
        let mut child = tokio::process::Command::new("node")
            .arg(js_dir().join(script))
            .args(args)
            .current_dir(js_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (scripts/test-all.sh installs nodejs)");
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes).await;
            text.push_str(&String::from_utf8_lossy(&bytes));
            text
        });
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Script {
            child,
            lines,
            pending: Vec::new(),
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The rest of the first line starting with `prefix`, waiting for it up to [`STEP`].
    pub(crate) async fn expect(&mut self, prefix: &str) -> String {
        loop {
            if let Some(i) = self.pending.iter().position(|l| l.starts_with(prefix)) {
                return self.pending.remove(i)[prefix.len()..].trim().to_owned();
            }
            match tokio::time::timeout(STEP, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    self.pending.push(line);
                }
                Ok(Ok(None)) => {
                    self.fail(&format!("the script ended before {prefix:?}"))
                        .await
                }
                Ok(Err(e)) => self.fail(&format!("stdout unreadable: {e}")).await,
                Err(_) => self.fail(&format!("no {prefix:?} within {STEP:?}")).await,
            }
        }
    }

    /// Kills the script and panics with `why`, its stdout and its stderr.
    async fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let stderr = match self.stderr.take() {
            Some(task) => tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .map(|r| r.unwrap_or_default())
                .unwrap_or_else(|_| "(stderr not closed)".into()),
            None => String::new(),
        };
        panic!(
            "{why}\n--- stdout:\n{}\n--- stderr:\n{stderr}",
            self.seen.join("\n")
        );
    }

    /// Waits for the script to exit successfully after `last`.
    pub(crate) async fn finish(mut self, last: &str) {
        self.expect(last).await;
        match tokio::time::timeout(STEP, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => self.fail(&format!("the script exited with {status}")).await,
            Ok(Err(e)) => self.fail(&format!("waiting for the script: {e}")).await,
            Err(_) => self.fail("the script did not exit").await,
        }
    }

    /// A line's JSON, or a failure showing it.
    async fn expect_json(&mut self, prefix: &str) -> serde_json::Value {
        let text = self.expect(prefix).await;
        match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(e) => self.fail(&format!("{prefix} {text}: not JSON ({e})")).await,
        }
    }
}

/// Asserts `path` is a PNG image of some size.
pub(crate) fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("screenshot {path:?}: {e}"));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000,
        "screenshot {path:?} is not a PNG of some size ({} bytes)",
        bytes.len()
    );
}

async fn next_message(sub: &mut async_nats::Subscriber, what: &str) -> async_nats::Message {
    tokio::time::timeout(STEP, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what} within {STEP:?}"))
        .unwrap_or_else(|| panic!("subscription for {what} closed"))
}

#[tokio::test]
async fn canopy_js_and_mqtt_js_in_chromium_exchange_messages_with_native_clients() {
    assert!(
        js_dir().join("node_modules/playwright-core").exists(),
        "tests/js/node_modules/playwright-core is missing: run ./scripts/test-all.sh \
         (npm ci in tests/js)"
    );
    assert!(
        chromium().exists(),
        "no Chromium at {:?}: run ./scripts/test-all.sh, which installs Debian's chromium \
         (or set CANOPY_CHROMIUM)",
        chromium()
    );
    // What the native side sends, and what the pages send (as in the script).
    let to_canopy_bytes: &[u8] = b"\x00\x01\xfe\xffto canopy.js";
    let to_canopy_json = r#"{"t": 21.5, "unit": "°C"}"#;
    let to_mqtt: &[u8] = b"\x00\xff\x80to mqtt.js";
    let from_canopy_bytes: &[u8] = b"\x00\x01\x7f\x80\xfe\xfffrom canopy.js";
    let from_canopy_json: &[u8] = br#"{"from":"canopy.js","n":1}"#;
    let from_mqtt = [&[0u8, 255][..], "from mqtt.js ✓".as_bytes()].concat();

    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let mut canopy_out = nats.subscribe("browser.canopy.out").await.expect("sub");
    let mut mqtt_out = nats.subscribe("browser.mqtt.out").await.expect("sub");
    nats.flush().await.expect("flush");
    // What the canopy.js page consumes as a member of group `browser`.
    let (status, created) = crate::common::api(
        &nats,
        "group.create",
        serde_json::json!({"name": "browser", "pattern": "browser.orders.>", "start": "all"}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    for (subject, body) in [
        ("browser.orders.1", r#"{"n":1}"#),
        ("browser.orders.2", r#"{"fail":true}"#),
    ] {
        let mut headers = header("Canopy-Ack", "durable");
        headers.insert("Content-Type", "application/json");
        let ack = crate::common::store_request(&nats, subject, headers, body).await;
        assert!(ack.get("error").is_none(), "{ack}");
    }

    let mut script = Script::spawn("browser_clients_check.mjs", &[format!("http://{http}")]);
    script.expect("ready").await;

    nats.publish("browser.canopy.in", to_canopy_bytes.to_vec().into())
        .await
        .expect("publish");
    nats.publish_with_headers(
        "browser.canopy.in",
        header("Content-Type", "application/json"),
        to_canopy_json.into(),
    )
    .await
    .expect("publish");
    nats.publish("browser.mqtt.in", to_mqtt.to_vec().into())
        .await
        .expect("publish");
    nats.flush().await.expect("flush");

    // Each page got what the native side published, byte for byte.
    let canopy_got = script.expect_json("canopy received").await;
    assert_eq!(
        canopy_got,
        serde_json::json!([
            {"subject": "browser.canopy.in", "bytes": to_canopy_bytes},
            {"subject": "browser.canopy.in", "json": {"t": 21.5, "unit": "°C"}},
        ]),
        "what the canopy.js page received"
    );
    let mqtt_got = script.expect_json("mqtt received").await;
    assert_eq!(
        mqtt_got,
        serde_json::json!([{"topic": "browser/mqtt/in", "bytes": to_mqtt}]),
        "what the MQTT.js page received"
    );

    // The native side got what each page published, byte for byte.
    let acks = script.expect_json("canopy published").await;
    assert!(
        acks.as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|ack| ack["op"] == "ok")),
        "canopy.js publish acks: {acks}"
    );
    let bytes = next_message(&mut canopy_out, "canopy.js's bytes").await;
    assert_eq!(&bytes.payload[..], from_canopy_bytes, "canopy.js's bytes");
    let json = next_message(&mut canopy_out, "canopy.js's JSON").await;
    assert_eq!(&json.payload[..], from_canopy_json, "canopy.js's JSON");
    assert_eq!(
        header_of(&json, "Content-Type"),
        Some("application/json"),
        "{:?}",
        json.headers
    );
    script.expect("mqtt published").await;
    let mqtt = next_message(&mut mqtt_out, "MQTT.js's publish").await;
    assert_eq!(&mqtt.payload[..], &from_mqtt[..], "MQTT.js's bytes");

    // canopy.js's consume(): each message handled in turn, the one whose handler threw
    // nacked and handed out again, every one acked in the end.
    let consumed = script.expect_json("canopy consumed").await;
    let mut handled: Vec<(String, u64, u64, String)> = consumed
        .as_array()
        .unwrap_or_else(|| panic!("a list: {consumed}"))
        .iter()
        .map(|m| {
            (
                m["subject"].as_str().unwrap_or_default().to_owned(),
                m["version"].as_u64().unwrap_or_default(),
                m["attempt"].as_u64().unwrap_or_default(),
                m["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    handled.sort();
    assert_eq!(
        handled,
        [
            ("browser.orders.1".into(), 1, 1, "acked".into()),
            ("browser.orders.2".into(), 1, 1, "threw".into()),
            ("browser.orders.2".into(), 1, 2, "acked".into()),
        ],
        "{consumed}"
    );
    let first = consumed
        .as_array()
        .and_then(|all| all.iter().find(|m| m["subject"] == "browser.orders.1"));
    assert_eq!(
        first.map(|m| &m["data"]),
        Some(&serde_json::json!({"n": 1})),
        "JSON comes as data: {consumed}"
    );
    let (_, info) =
        crate::common::api(&nats, "group.info", serde_json::json!({"name": "browser"})).await;
    assert_eq!(
        (&info["live"]["pending"], &info["live"]["in_flight"]),
        (&serde_json::json!(0), &serde_json::json!(0)),
        "the group holds nothing after the page's acks: {info}"
    );

    for page in ["canopy-js", "mqtt-js"] {
        let path = script.expect(&format!("screenshot {page} ")).await;
        assert_png(Path::new(&path));
    }
    script.finish("all checks passed").await;
    server.stop().await;
}

#[tokio::test]
async fn the_console_shows_cli_and_mqtt_traffic_streams_and_conflicts() {
    assert!(
        chromium().exists(),
        "no Chromium at {:?}: run ./scripts/test-all.sh, which installs Debian's chromium \
         (or set CANOPY_CHROMIUM)",
        chromium()
    );
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let mqtt = server.mqtt_addr.expect("mqtt on");
    let mut script = Script::spawn(
        "console_check.mjs",
        &[
            format!("http://{http}"),
            server.native_url(),
            format!("mqtt://{mqtt}"),
            env!("CARGO_BIN_EXE_canopy").to_owned(),
        ],
    );
    // Each step of the script (it says what it saw; the checks are in the script).
    script
        .expect("subscribe panel: CLI and MQTT messages shown")
        .await;
    let burst = script.expect("burst:").await;
    assert!(burst.starts_with("2003 counted"), "{burst}");
    script.expect("stream view opened from the tree").await;
    script
        .expect("stream view shows the schema and its refusals")
        .await;
    for view in [
        "console-subscribe",
        "console-burst",
        "console-conflict",
        "console-schema",
        "console-overview",
    ] {
        let path = script.expect(&format!("screenshot {view} ")).await;
        assert_png(Path::new(&path));
    }
    script.finish("all checks passed").await;
    server.stop().await;
}

#[tokio::test]
async fn the_console_asks_for_a_token_when_logins_are_required() {
    assert!(chromium().exists(), "no Chromium at {:?}", chromium());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = crate::common::test_config();
    config.store.url = format!("file://{}", dir.path().display());
    // The user and its token are made before logins are required.
    let server = crate::common::start(config.clone()).await;
    let admin = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let call = |api: &'static str, body: serde_json::Value| crate::common::api(&admin, api, body);
    call("tenant.create", serde_json::json!({"name": "acme"})).await;
    call(
        "user.create",
        serde_json::json!({"tenant": "acme", "name": "web", "password": "pw"}),
    )
    .await;
    let (_, issued) = call(
        "user.token.create",
        serde_json::json!({"tenant": "acme", "name": "web"}),
    )
    .await;
    let token = issued["token"].as_str().expect("token").to_owned();
    server.stop().await;

    config.authz.require_login = true;
    let server = crate::common::start(config).await;
    let http = server.http_addr.expect("http on");
    let mut script = Script::spawn(
        "console_login_check.mjs",
        &[format!("http://{http}"), token],
    );
    let path = script.expect("screenshot console-login ").await;
    assert_png(Path::new(&path));
    script.expect("subscribed").await;
    // The overview reads /metrics with the token: acme's lines only.
    assert_eq!(
        script.expect("metrics").await,
        "200 tenants=acme server-wide=0"
    );
    // Published in acme by a logged-in native client: the console, logged in as
    // acme's user, sees it.
    let acme = async_nats::ConnectOptions::with_user_and_password("web@acme".into(), "pw".into())
        .connect(server.native_url())
        .await
        .expect("log in");
    acme.publish("orders.7", "for acme".into())
        .await
        .expect("publish");
    acme.flush().await.expect("flush");
    let seen = script.expect("seen").await;
    assert_eq!(seen, "for acme");
    script.finish("all checks passed").await;
    server.stop().await;
}
