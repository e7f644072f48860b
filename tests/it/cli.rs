//! The `canopy` binary as people use it: serve, pub, sub, config, signals.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{WAIT, canopy_serve};

const BIN: &str = env!("CARGO_BIN_EXE_canopy");

/// A `canopy serve` child process, killed by PID when dropped.
pub(crate) struct ServeProcess {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) log: tokio::task::JoinHandle<Vec<String>>,
}

impl ServeProcess {
    async fn start(extra: &[&str]) -> ServeProcess {
        Self::start_with_env(extra, &[]).await
    }

    /// Starts `canopy serve` with extra flags and environment variables.
    pub(crate) async fn start_with_env(extra: &[&str], env: &[(String, String)]) -> ServeProcess {
        Self::start_on("127.0.0.1:0", extra, env).await
    }

    /// [`ServeProcess::start_with_env`] with the native listener on `listen`.
    pub(crate) async fn start_on(
        listen: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> ServeProcess {
        let data = tempfile::tempdir().expect("tempdir");
        let mut child = canopy_serve(listen)
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("canopy serve starts");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let url = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.expect("read log") {
                if line.contains("listening") && line.contains("native") {
                    let addr = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("addr="))
                        .expect("addr in the listening line");
                    return format!("nats://{addr}");
                }
            }
            panic!("canopy serve exited before listening");
        })
        .await
        .expect("canopy serve listens");
        let log = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push(line);
            }
            drop(data);
            rest
        });
        ServeProcess { child, url, log }
    }
}

pub(crate) async fn run(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(WAIT, Command::new(BIN).args(args).output())
        .await
        .expect("command finishes")
        .expect("command runs")
}

#[tokio::test]
async fn pub_and_sub_talk_through_serve() {
    let server = ServeProcess::start(&[]).await;
    let mut sub = Command::new(BIN)
        .args([
            "sub",
            "devices.*.temp",
            "--count",
            "3",
            "--server",
            &server.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sub starts");
    let mut sub_err = BufReader::new(sub.stderr.take().expect("stderr")).lines();
    let ready = tokio::time::timeout(WAIT, sub_err.next_line())
        .await
        .expect("sub announces itself")
        .expect("read")
        .expect("a line");
    assert!(ready.contains("subscribed to 'devices.*.temp'"), "{ready}");

    let out = run(&["pub", "devices.42.temp", "21.5", "--server", &server.url]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["pub", "devices.42.hum", "ignored", "--server", &server.url]).await;
    assert!(out.status.success());
    // Standard input: one message per line.
    let mut stdin_pub = Command::new(BIN)
        .args(["pub", "devices.7.temp", "--server", &server.url])
        .stdin(Stdio::piped())
        .spawn()
        .expect("pub starts");
    let mut stdin = stdin_pub.stdin.take().expect("stdin");
    stdin.write_all(b"19\n20\n").await.expect("write");
    drop(stdin);
    assert!(stdin_pub.wait().await.expect("pub exits").success());

    let out = tokio::time::timeout(WAIT, sub.wait_with_output())
        .await
        .expect("sub exits after --count")
        .expect("sub output");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "devices.42.temp 21.5\ndevices.7.temp 19\ndevices.7.temp 20\n"
    );
    drop(server);
}

#[tokio::test]
async fn sub_json_prints_one_object_per_line() {
    let server = ServeProcess::start(&[]).await;
    let mut sub = Command::new(BIN)
        .args(["sub", "j.>", "--json", "-n", "1", "--server", &server.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sub starts");
    let mut sub_err = BufReader::new(sub.stderr.take().expect("stderr")).lines();
    tokio::time::timeout(WAIT, sub_err.next_line())
        .await
        .expect("ready")
        .expect("read");
    let out = run(&[
        "pub",
        "j.x",
        "{\"t\":1}",
        "-H",
        "Kind: reading",
        "--server",
        &server.url,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tokio::time::timeout(WAIT, sub.wait_with_output())
        .await
        .expect("exits")
        .expect("output");
    let line = String::from_utf8(out.stdout).expect("utf8");
    let value: serde_json::Value = serde_json::from_str(line.trim()).expect("JSON line");
    assert_eq!(value["subject"], "j.x");
    assert_eq!(value["payload"], "{\"t\":1}");
    assert_eq!(value["headers"]["Kind"][0], "reading");
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    let server = ServeProcess::start(&[]).await;
    let client = async_nats::connect(&server.url).await.expect("connect");
    client.flush().await.expect("flush");
    let pid = server.child.id().expect("pid");
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    let ServeProcess { mut child, log, .. } = server;
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("status");
    assert!(status.success(), "{status}");
    let log = log.await.expect("log");
    assert!(
        log.iter().any(|l| l.contains("SIGTERM")),
        "log mentions the signal: {log:?}"
    );
}

#[tokio::test]
async fn serve_refuses_anonymous_network_listeners_with_a_reason() {
    let out = tokio::time::timeout(WAIT, canopy_serve("0.0.0.0:0").output())
        .await
        .expect("exits")
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-anonymous"), "{stderr}");
}

#[tokio::test]
async fn config_default_is_documented_and_bad_config_is_a_clear_error() {
    let out = run(&["config", "default"]).await;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf8");
    assert!(text.contains("[native]") && text.contains("max_payload"));
    assert!(text.lines().filter(|l| l.starts_with('#')).count() > 20);

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[native]\nmax_payload = \"lots\"\n").expect("write");
    let out = tokio::time::timeout(
        WAIT,
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&bad)
            .output(),
    )
    .await
    .expect("exits")
    .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("max_payload"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn help_reads_like_a_cli() {
    let out = run(&["--help"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "pub", "sub", "config"] {
        assert!(text.contains(word), "{text}");
    }
    let out = run(&["sub", "--help"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--count") && text.contains("--json"),
        "{text}"
    );
}

#[tokio::test]
async fn key_streams_from_the_command_line() {
    let server = ServeProcess::start(&[]).await;
    let url = server.url.clone();
    let run_with = |args: Vec<&'static str>| {
        let url = url.clone();
        async move {
            let mut all: Vec<&str> = args;
            all.extend(["--server", url.as_str()]);
            run(&all).await
        }
    };
    let out = run_with(vec!["pub", "orders.1", "first", "--expect", "0"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "stored orders.1 version 1 at offset 1\n"
    );
    let out = run_with(vec!["pub", "orders.1", "again", "--expect", "0"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("orders.1 is at version 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_with(vec!["pub", "orders.1", "second", "--msg-id", "m-2"]).await;
    assert!(out.status.success());
    let out = run_with(vec!["pub", "orders.1", "second", "--msg-id", "m-2"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("duplicate"));
    let out = run_with(vec!["pub", "orders.2", "other"]).await;
    assert!(out.status.success());

    let out = run_with(vec!["get", "orders.1"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "orders.1 #2 second\n");
    let out = run_with(vec!["get", "orders.1", "--version", "1", "--json"]).await;
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(value["payload"], "first");
    assert_eq!(value["version"], 1);
    let out = run_with(vec!["get", "orders.9"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no messages"));

    // Replay sees durable data only: poll until the last publish is durable.
    let mut replayed = String::new();
    for _ in 0..100 {
        let out = run_with(vec!["replay", "orders.>"]).await;
        replayed = String::from_utf8_lossy(&out.stdout).into_owned();
        if replayed.lines().count() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        replayed,
        "orders.1 #1 first\norders.1 #2 second\norders.2 #1 other\n"
    );
    let out = run_with(vec!["subjects", "orders.>"]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "orders.1 version 2\norders.2 version 1\n"
    );
    let out = run_with(vec!["sub", "orders.1", "--from", "2", "-n", "1"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "orders.1 #2 second\n");

    // A JSON snapshot is marked as JSON, so readers can show it inline.
    let out = run_with(vec!["snapshot", "put", "orders.1", "2", r#"{"state":2}"#]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = async_nats::connect(&url).await.expect("connect");
    let answer = client
        .request("$CANOPY.snapshot.get", r#"{"subject":"orders.1"}"#.into())
        .await
        .expect("snapshot.get");
    assert_eq!(&answer.payload[..], br#"{"state":2}"#);
    assert_eq!(
        answer
            .headers
            .as_ref()
            .and_then(|h| h.get("Content-Type"))
            .map(|v| v.as_str()),
        Some("application/json")
    );
}

#[tokio::test]
async fn tenants_from_the_command_line() {
    let server = ServeProcess::start(&[]).await;
    let url = server.url.clone();
    let tenant = |args: &[&str]| {
        let mut all = vec!["tenant"];
        all.extend_from_slice(args);
        all.extend(["--server", url.as_str()]);
        let all: Vec<String> = all.into_iter().map(str::to_owned).collect();
        async move {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            run(&args).await
        }
    };
    let out = tenant(&["create", "acme", "--max-connections", "10"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "acme  max_connections=10\n"
    );
    let out = tenant(&["create", "acme"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exists already"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tenant(&["list"]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "acme  max_connections=10\ndefault  no limits\n"
    );
    let out = tenant(&["describe", "acme", "--json"]).await;
    let described: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(described["usage"]["subjects"], 0);
    // Rate limits per pattern, as the flags give them and as the line shows them.
    let out = tenant(&[
        "update",
        "acme",
        "--pattern-rate",
        "devices.*.temp=10msgs,4096bytes,per-client",
        "--pattern-rate",
        "logs.>=100msgs",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "acme  pattern_rate=devices.*.temp=10msgs,4096bytes,per-client \
         pattern_rate=logs.>=100msgs\n"
    );
    let out = tenant(&["describe", "acme", "--json"]).await;
    let described: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        described["limits"]["pattern_rates"][0],
        serde_json::json!({"pattern": "devices.*.temp", "msgs_per_sec": 10, "bytes_per_sec": 4096, "per_client": true}),
        "{described}"
    );
    for bad in ["devices.>", "devices.>=fast", "a b=1msgs"] {
        let out = tenant(&["update", "acme", "--pattern-rate", bad]).await;
        assert!(!out.status.success(), "--pattern-rate {bad} taken");
    }
    let out = tenant(&["delete", "acme"]).await;
    assert!(out.status.success());
    let out = tenant(&["describe", "acme"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tenant acme"));
}
