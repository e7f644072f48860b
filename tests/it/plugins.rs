//! Issue 31: WebAssembly plugins bound to subject patterns, run on publish. Modules
//! from WAT (tests/plugins/): a filter, a transform, a reject with a reason seen by
//! native (`-ERR` and the error ack), MQTT 5 (PUBACK with a reason string), MQTT
//! 3.1.1 (acked and dropped) and `/ws` publishers, a fan-out; a plugin that loops,
//! traps or asks for memory without end, each bounded and answered per its
//! `on_error`, disabled after repeated faults, the server and other tenants going on;
//! the API's refusals, a restart, and tenant isolation.
//!
//! "Not delivered" is shown by order: a refused or dropped publish is followed by one
//! that passes, and a subscriber's first message must be the one that passed.

use serde_json::{Value, json};

use crate::common::{
    WAIT, api, file_config, js_publish_to_tenant, replay_texts, start, start_default,
};
use crate::frontends::{Native, NativeEvent, Ws, WsEvent, pub_frame};
use crate::logins::Logins;
use crate::mqtt::mqtt_addr;
use crate::schemas::{canopy_ok, next_message, v4, v5, watch};

fn module(name: &str) -> String {
    use base64::Engine as _;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/plugins")
        .join(name);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    base64::engine::general_purpose::STANDARD.encode(text)
}

async fn plugin(client: &async_nats::Client, op: &str, body: Value) -> (u16, Value) {
    api(client, &format!("plugin.{op}"), body).await
}

/// Binds `file` to `pattern` and panics unless it was taken.
async fn put(client: &async_nats::Client, pattern: &str, file: &str, extra: Value) -> Value {
    let mut body = json!({"pattern": pattern, "module": module(file)});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let (status, answer) = plugin(client, "put", body).await;
    assert_eq!(status, 200, "plugin.put {pattern}: {answer}");
    answer
}

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connects")
}

#[tokio::test]
async fn a_plugin_filters_transforms_fans_out_and_rejects_on_every_front_end() {
    let server = start_default().await;
    let client = connect(&server).await;
    let made = put(&client, "t.>", "edit.wat", json!({})).await;
    assert_eq!(made["hooks"], json!(["publish"]), "{made}");
    assert_eq!(made["version"], json!(1), "{made}");
    let mut sub = watch(&client, "t.>").await;

    // Native: a rejected publish is an -ERR with the plugin's reason; a dropped one
    // goes nowhere; the next is transformed.
    let mut native = Native::connect(server.native_addr, None)
        .await
        .expect("native connects");
    native.send(&pub_frame("t.a", None, None, b"!bang")).await;
    match native.next().await {
        Some(NativeEvent::Err(text)) => assert_eq!(
            text,
            "Permissions Violation for Publish to \"t.a\": no bangs here"
        ),
        other => panic!("expected -ERR for a rejected publish, got {other:?}"),
    }
    native.send(&pub_frame("t.a", None, None, b"xdrop")).await;
    native.send(&pub_frame("t.a", None, None, b"hello")).await;
    let first = next_message(&mut sub, "the transformed publish").await;
    assert_eq!(
        (first.subject.as_str(), &first.payload[..]),
        ("t.a", &b"HELLO"[..])
    );

    // A fan-out: the message and its copy.
    native.send(&pub_frame("t.b", None, None, b"*two")).await;
    let one = next_message(&mut sub, "the fanned-out message").await;
    let two = next_message(&mut sub, "its copy").await;
    assert_eq!(
        [
            (one.subject.as_str(), &one.payload[..]),
            (two.subject.as_str(), &two.payload[..])
        ],
        [("t.b", &b"*two"[..]), ("t.b.copy", &b"*two"[..])]
    );

    // A plugin's messages are never API calls, and one refused refuses them all.
    let js = async_nats::jetstream::new(client.clone());
    let refused = js_publish_to_tenant(&js, "default", "t.z", "$sneaky")
        .await
        .expect_err("a message to the server's namespace refuses the publish");
    assert!(refused.to_string().contains("reserved"), "{refused}");
    assert!(
        replay_texts(&client, "t.z").await.is_empty(),
        "nothing of it was stored"
    );

    // JetStream: the error ack; what is stored is what the plugin made.
    let refused = js_publish_to_tenant(&js, "default", "t.c", "!no")
        .await
        .expect_err("a rejected JetStream publish");
    assert!(refused.to_string().contains("no bangs here"), "{refused}");
    let dropped = js_publish_to_tenant(&js, "default", "t.c", "xgone")
        .await
        .expect("a dropped JetStream publish is answered");
    assert_eq!(dropped.sequence, 0, "nothing was stored");
    js_publish_to_tenant(&js, "default", "t.c", "kept")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "t.c").await, ["KEPT"]);
    let next = next_message(&mut sub, "the stored publish").await;
    assert_eq!(&next.payload[..], b"KEPT");

    // MQTT 5: PUBACK 0x83 with the reason string; MQTT 3.1.1: acked and dropped.
    let mut mqtt = v5::Client::connect(mqtt_addr(&server), "plugins-v5", None).await;
    let ack = mqtt.publish_qos1("t/d", "!mqtt").await;
    assert_eq!(
        ack.reason,
        rumqttc::v5::mqttbytes::v5::PubAckReason::ImplementationSpecificError,
        "{ack:?}"
    );
    let reason = ack
        .properties
        .as_ref()
        .and_then(|p| p.reason_string.clone())
        .unwrap_or_default();
    assert_eq!(reason, "no bangs here", "{ack:?}");
    mqtt.publish_qos1("t/d", "mqtt5").await;
    mqtt.vanish();
    let mut old = v4::Client::connect(mqtt_addr(&server), "plugins-v4", None).await;
    old.publish_qos1("t/e", "!old").await;
    old.publish_qos1("t/e", "mqtt3").await;
    old.vanish();
    for (subject, payload) in [("t.d", "MQTT5"), ("t.e", "MQTT3")] {
        let got = next_message(&mut sub, subject).await;
        assert_eq!(
            (got.subject.as_str(), &got.payload[..]),
            (subject, payload.as_bytes())
        );
    }

    // /ws: invalid_message with the reason.
    let mut ws = Ws::open(server.http_addr.expect("http"), None)
        .await
        .expect("/ws opens");
    let refused = json!({"op": "pub", "subject": "t.f", "data_b64": crate::frontends::b64(b"!ws")});
    match ws.call(refused).await {
        Some(WsEvent::Text(answer)) => {
            assert_eq!(answer["code"], "invalid_message", "{answer}");
            assert_eq!(answer["message"], "no bangs here", "{answer}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let (status, listed) = plugin(&client, "list", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    let calls = listed["plugins"][0]["calls"].as_u64().unwrap_or_default();
    assert!(calls >= 12, "every publish to t.> ran it: {listed}");
    server.stop().await;
}

#[tokio::test]
async fn a_plugin_that_loops_traps_or_hogs_memory_is_bounded_and_disabled() {
    let server = start_default().await;
    let client = connect(&server).await;
    put(
        &client,
        "bad.>",
        "faulty.wat",
        json!({"deadline_ms": 20, "memory_mib": 1}),
    )
    .await;
    put(
        &client,
        "lenient.>",
        "faulty.wat",
        json!({"on_error": "pass"}),
    )
    .await;
    put(&client, "ok.>", "edit.wat", json!({})).await;
    let js = async_nats::jetstream::new(client.clone());
    for (payload, why) in [
        ("loop", "deadline"),
        ("trap", "trapped"),
        ("more", "trapped"),
    ] {
        let refused = js_publish_to_tenant(&js, "default", "bad.x", payload)
            .await
            .expect_err("a faulting plugin rejects on error");
        assert!(refused.to_string().contains(why), "{payload}: {refused}");
    }
    // on_error pass: the message goes on unchanged.
    js_publish_to_tenant(&js, "default", "lenient.x", "loop")
        .await
        .expect("passed on");
    assert_eq!(replay_texts(&client, "lenient.x").await, ["loop"]);
    // Two more faults in a row disable it: then it is not run, and still refuses.
    for _ in 0..2 {
        js_publish_to_tenant(&js, "default", "bad.x", "trap")
            .await
            .expect_err("refused");
    }
    let refused = js_publish_to_tenant(&js, "default", "bad.x", "fine")
        .await
        .expect_err("a disabled plugin refuses on error");
    assert!(refused.to_string().contains("disabled"), "{refused}");
    let (_, got) = plugin(&client, "get", json!({"pattern": "bad.>"})).await;
    assert_eq!(got["disabled"], json!(true), "{got}");
    assert_eq!(got["faults"], json!(5), "{got}");
    // The server and the other plugins go on.
    js_publish_to_tenant(&js, "default", "ok.x", "fine")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "ok.x").await, ["FINE"]);
    // Put again: enabled, with a new version.
    let again = put(&client, "bad.>", "faulty.wat", json!({})).await;
    assert_eq!(
        (again["version"].clone(), again["disabled"].clone()),
        (json!(2), json!(false))
    );
    js_publish_to_tenant(&js, "default", "bad.x", "fine")
        .await
        .expect("passes");
    server.stop().await;
}

#[tokio::test]
async fn bad_modules_and_calls_are_refused_and_plugins_outlive_a_restart() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(file_config(folder.path())).await;
    let client = connect(&server).await;
    for (body, status, says) in [
        (
            json!({"pattern": "a.>", "module": "bm90IHdhc20="}),
            400,
            "cannot run",
        ),
        (json!({"pattern": "a.>", "module": "%%%"}), 400, "base64"),
        (
            json!({"pattern": "a.>", "module": module("edit.wat"), "deadline_ms": 5000}),
            400,
            "deadline_ms",
        ),
        (
            json!({"pattern": "a.>", "module": module("edit.wat"), "hooks": ["deliver"]}),
            400,
            "on_deliver",
        ),
        (
            json!({"pattern": "a.b c", "module": module("edit.wat")}),
            400,
            "pattern",
        ),
    ] {
        let (got, answer) = plugin(&client, "put", body).await;
        assert_eq!(got, status, "{answer}");
        assert!(answer.to_string().contains(says), "{says}: {answer}");
    }
    put(&client, "r.>", "edit.wat", json!({})).await;
    server.stop().await;

    let server = start(file_config(folder.path())).await;
    let client = connect(&server).await;
    let js = async_nats::jetstream::new(client.clone());
    js_publish_to_tenant(&js, "default", "r.x", "after")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "r.x").await, ["AFTER"]);
    let (status, deleted) = plugin(&client, "delete", json!({"pattern": "r.>"})).await;
    assert_eq!(status, 200, "{deleted}");
    js_publish_to_tenant(&js, "default", "r.x", "plain")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "r.x").await, ["AFTER", "plain"]);
    let (status, _) = plugin(&client, "get", json!({"pattern": "r.>"})).await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[tokio::test]
async fn plugins_are_their_tenants_alone_and_need_rights_to_their_pattern() {
    let (logins, [dave, erin, olga]) = crate::stream_rights::dave_erin_and_olga().await;
    let (status, answer) = plugin(
        &erin,
        "put",
        json!({"pattern": "dave.>", "module": module("edit.wat")}),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    put(&dave, "dave.>", "edit.wat", json!({})).await;
    let (_, listed) = plugin(&erin, "list", json!({})).await;
    assert_eq!(
        listed["plugins"],
        json!([]),
        "erin may not read dave.>: {listed}"
    );
    let (_, listed) = plugin(&olga, "list", json!({})).await;
    assert_eq!(listed["plugins"], json!([]), "another tenant: {listed}");

    // Olga's tenant has no plugin on dave.>: her messages are hers as sent.
    let mut theirs = watch(&olga, "dave.>").await;
    olga.publish("dave.x", "lower".into()).await.expect("sent");
    let got = next_message(&mut theirs, "olga's message").await;
    assert_eq!(&got.payload[..], b"lower");
    let mut his = watch(&dave, "dave.>").await;
    dave.publish("dave.x", "lower".into()).await.expect("sent");
    let got = tokio::time::timeout(WAIT, next_message(&mut his, "dave's message"))
        .await
        .expect("in time");
    assert_eq!(&got.payload[..], b"LOWER");
    drop(logins);
}

/// `canopy plugin put/list/get/delete`, the way the README shows them.
#[tokio::test]
async fn the_cli_binds_lists_and_deletes_plugins() {
    let server = start_default().await;
    let client = connect(&server).await;
    let addr = server.native_addr.to_string();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/edit.wat");
    let file = file.to_str().expect("UTF-8 path");
    let put = canopy_ok(&[
        "plugin",
        "put",
        "cli.>",
        file,
        "--on-publish",
        "--on-error",
        "pass",
        "--json",
        "--server",
        &addr,
    ])
    .await;
    let put: Value = serde_json::from_str(put.trim()).expect("JSON");
    assert_eq!(
        (put["pattern"].clone(), put["on_error"].clone()),
        (json!("cli.>"), json!("pass")),
        "{put}"
    );
    let listed = canopy_ok(&["plugin", "list", "--server", &addr]).await;
    assert!(
        listed.starts_with("cli.>  version 1  on publish  on error pass"),
        "{listed}"
    );
    let js = async_nats::jetstream::new(client.clone());
    js_publish_to_tenant(&js, "default", "cli.x", "loud")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "cli.x").await, ["LOUD"]);
    let shown = canopy_ok(&["plugin", "get", "cli.>", "--server", &addr]).await;
    assert!(shown.contains("\"calls\": 1"), "{shown}");
    canopy_ok(&["plugin", "delete", "cli.>", "--server", &addr]).await;
    let listed = canopy_ok(&["plugin", "list", "--server", &addr]).await;
    assert!(listed.is_empty(), "{listed}");
    server.stop().await;
}

/// The README's example plugin, as printed there: it runs as the README says.
#[tokio::test]
async fn the_readmes_example_plugin_works_as_documented() {
    use base64::Engine as _;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = readme
        .find("```wat\n")
        .expect("a WAT example in the README")
        + 7;
    let end = start + readme[start..].find("```").expect("its end");
    let module = base64::engine::general_purpose::STANDARD.encode(&readme[start..end]);
    let server = start_default().await;
    let client = connect(&server).await;
    let (status, answer) =
        plugin(&client, "put", json!({"pattern": "ex.>", "module": module})).await;
    assert_eq!(status, 200, "{answer}");
    let js = async_nats::jetstream::new(client.clone());
    let refused = js_publish_to_tenant(&js, "default", "ex.a", "!no")
        .await
        .expect_err("rejected");
    assert!(refused.to_string().contains("no bangs here"), "{refused}");
    js_publish_to_tenant(&js, "default", "ex.a", "quiet please")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "ex.a").await, ["QUIET PLEASE"]);
    server.stop().await;
}

/// A plugin written in AssemblyScript (tests/plugins/redact.ts, built here with the
/// npm `assemblyscript` compiler the test command installs): a JSON field transform
/// that masks a `secret`, and rejects one that is not a string.
#[tokio::test]
async fn an_assemblyscript_plugin_masks_a_field() {
    use base64::Engine as _;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let asc = root.join("tests/js/node_modules/.bin/asc");
    assert!(
        asc.exists(),
        "tests/js/node_modules/.bin/asc is missing: run ./scripts/test-all.sh, which installs it"
    );
    let out = tempfile::tempdir().expect("tempdir");
    let wasm = out.path().join("redact.wasm");
    let built = tokio::process::Command::new(&asc)
        .arg(root.join("tests/plugins/redact.ts"))
        .args(["--runtime", "incremental", "-O3", "-o"])
        .arg(&wasm)
        .output()
        .await
        .expect("asc runs");
    assert!(
        built.status.success(),
        "asc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let module =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&wasm).expect("built"));

    let server = start_default().await;
    let client = connect(&server).await;
    let (status, answer) = plugin(
        &client,
        "put",
        json!({"pattern": "users.>", "module": module}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let js = async_nats::jetstream::new(client.clone());
    let refused = js_publish_to_tenant(&js, "default", "users.a", r#"{"secret":5}"#)
        .await
        .expect_err("rejected");
    assert!(
        refused.to_string().contains("the secret must be a string"),
        "{refused}"
    );
    for payload in [
        r#"{"user":"a","secret":"hunter2","n":1}"#,
        r#"{"user":"b"}"#,
    ] {
        js_publish_to_tenant(&js, "default", "users.a", payload)
            .await
            .expect("stored");
    }
    // More than the instance's 16 MiB in all: its memory is reused, not leaked.
    let padding = "p".repeat(64 * 1024);
    for i in 0..320 {
        let payload = format!(r#"{{"user":"u{i}","secret":"s{i}","pad":"{padding}"}}"#);
        js_publish_to_tenant(&js, "default", "users.many", payload)
            .await
            .expect("stored");
    }
    assert_eq!(
        replay_texts(&client, "users.a").await,
        [r#"{"user":"a","secret":"***","n":1}"#, r#"{"user":"b"}"#]
    );
    let (_, got) = plugin(&client, "get", json!({"pattern": "users.>"})).await;
    assert_eq!(got["faults"], json!(0), "{got}");
    server.stop().await;
}

/// An on-deliver plugin (tests/plugins/redact_for.wat): the reader `admin` gets each
/// message as published, another reader "redacted" or nothing, on a live subscription
/// and through a consumer; stored history under it cannot be read around it; what is
/// stored is what was published.
#[tokio::test]
async fn a_deliver_plugin_changes_what_one_reader_gets_and_not_another() {
    let dave_rules = json!({
        "publish": {"allow": ["sec.>", "$JS.API.>", "$CANOPY.get"]},
        "subscribe": {"allow": ["sec.>"]}
    });
    let logins = Logins::start(&[], &[("default", "dave", Some(dave_rules))]).await;
    let admin = logins.native("admin@default").await;
    let dave = logins.native("dave@default").await;
    let made = put(&admin, "sec.>", "redact_for.wat", json!({})).await;
    assert_eq!(
        made["hooks"],
        json!(["deliver"]),
        "what the module exports: {made}"
    );
    let mut theirs = watch(&admin, "sec.>").await;
    let mut his = watch(&dave, "sec.>").await;
    let inbox = dave.new_inbox();
    let mut pushed = dave.subscribe(inbox.clone()).await.expect("subscribes");
    let created = crate::group_rights::js(
        &dave,
        "CONSUMER.CREATE.default",
        json!({"stream_name": "default", "config": {"deliver_subject": inbox,
            "ack_policy": "none", "filter_subject": "sec.>"}}),
    )
    .await;
    assert!(created.get("error").is_none(), "{created}");

    let js = async_nats::jetstream::new(admin.clone());
    for payload in ["greetings", "hidden", "bye"] {
        js_publish_to_tenant(&js, "default", "sec.a", payload)
            .await
            .expect("stored");
    }
    for expected in ["greetings", "hidden", "bye"] {
        let got = next_message(&mut theirs, "the admin's").await;
        assert_eq!(&got.payload[..], expected.as_bytes());
    }
    for (sub, consumer) in [(&mut his, false), (&mut pushed, true)] {
        for n in 1..=2 {
            let got = next_message(sub, "dave's").await;
            assert_eq!(&got.payload[..], b"redacted", "dave never sees the text");
            if consumer {
                // The withheld message spent no consumer sequence: no gap for the
                // client's ordered consumer to reset on.
                let reply = got.reply.as_deref().unwrap_or_default();
                let seq = reply.split('.').nth(6).and_then(|t| t.parse::<u64>().ok());
                assert_eq!(seq, Some(n), "{reply}");
            }
        }
    }
    // History cannot be read around the plugin.
    let (status, refused) = api(&dave, "get", json!({"subject": "sec.a"})).await;
    assert_eq!(status, 409, "{refused}");
    // What is stored is what was published.
    let (status, _) = plugin(&admin, "delete", json!({"pattern": "sec.>"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        replay_texts(&admin, "sec.a").await,
        ["greetings", "hidden", "bye"]
    );
}

/// Plugins put and deleted on a pattern again and again while a JetStream publisher
/// keeps 64 publishes in flight to it: every acked message is stored once and
/// delivered once, each as the plugin set of its moment made it (capitals with the
/// transform bound, as sent without).
#[tokio::test]
async fn replacing_a_plugin_under_load_loses_and_duplicates_nothing() {
    use futures::StreamExt;
    const MESSAGES: usize = 2000;
    let server = start_default().await;
    let client = connect(&server).await;
    let mut live = watch(&client, "load.>").await;
    let changer = {
        let client = connect(&server).await;
        tokio::spawn(async move {
            let mut changes = 0u32;
            loop {
                put(&client, "load.>", "edit.wat", json!({})).await;
                let (status, answer) =
                    plugin(&client, "delete", json!({"pattern": "load.>"})).await;
                assert_eq!(status, 200, "{answer}");
                changes += 2;
                if changes >= 400 {
                    return changes;
                }
            }
        })
    };
    let js = async_nats::jetstream::new(client.clone());
    let mut acks = futures::stream::FuturesUnordered::new();
    let mut acked = 0;
    for i in 0..MESSAGES {
        let subject = format!("load.{}", i % 7);
        acks.push(js_publish_to_tenant(
            &js,
            "default",
            subject,
            format!("m{i}"),
        ));
        if acks.len() >= 64 {
            acks.next().await.expect("an ack").expect("stored");
            acked += 1;
        }
    }
    while let Some(ack) = acks.next().await {
        ack.expect("stored");
        acked += 1;
    }
    assert_eq!(acked, MESSAGES);
    changer.abort();

    // Live: each index once, as sent or in capitals.
    let mut seen = vec![0u32; MESSAGES];
    let (mut transformed, mut plain) = (0, 0);
    for _ in 0..MESSAGES {
        let message = next_message(&mut live, "a live message").await;
        let text = String::from_utf8(message.payload.to_vec()).expect("text");
        match text.strip_prefix('M') {
            Some(_) => transformed += 1,
            None => plain += 1,
        }
        let index: usize = text[1..].parse().expect("an index");
        seen[index] += 1;
    }
    let extra = tokio::time::timeout(std::time::Duration::from_millis(300), live.next()).await;
    assert!(
        extra.is_err(),
        "a message more than was published: {extra:?}"
    );
    assert!(seen.iter().all(|&n| n == 1), "lost or duplicated live");
    // Stored: the same, subject by subject.
    let mut stored = vec![0u32; MESSAGES];
    for s in 0..7 {
        for text in replay_texts(&client, &format!("load.{s}")).await {
            stored[text[1..].parse::<usize>().expect("an index")] += 1;
        }
    }
    assert!(
        stored.iter().all(|&n| n == 1),
        "lost or duplicated in the store"
    );
    // Both sets of plugins were met (the changes really ran under the load).
    assert!(
        transformed > 0 && plain > 0,
        "{transformed} transformed, {plain} plain"
    );
    server.stop().await;
}

/// A fan-out that a native publisher's plugin makes, seen by an MQTT subscriber.
#[tokio::test]
async fn an_mqtt_subscriber_gets_a_plugins_fan_out() {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let server = start_default().await;
    let client = connect(&server).await;
    put(&client, "fan.>", "edit.wat", json!({})).await;
    let addr = mqtt_addr(&server);
    let options = MqttOptions::new("fan-watcher", addr.ip().to_string(), addr.port());
    let (mqtt, mut events) = AsyncClient::new(options, 16);
    mqtt.subscribe("fan/#", QoS::AtLeastOnce)
        .await
        .expect("queued");
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(Packet::SubAck(_)) = events.poll().await.expect("mqtt") {
                return;
            }
        }
    })
    .await
    .expect("SUBACK within the wait");
    client
        .publish("fan.a", "*spread".into())
        .await
        .expect("published");
    client.flush().await.expect("flush");
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        while got.len() < 2 {
            if let Event::Incoming(Packet::Publish(p)) = events.poll().await.expect("mqtt") {
                got.push((
                    p.topic.clone(),
                    String::from_utf8_lossy(&p.payload).into_owned(),
                ));
            }
        }
    })
    .await
    .expect("both messages within the wait");
    got.sort();
    assert_eq!(
        got,
        [
            ("fan/a".to_owned(), "*spread".to_owned()),
            ("fan/a/copy".to_owned(), "*spread".to_owned()),
        ]
    );
    let _ = mqtt.disconnect().await;
    server.stop().await;
}

/// `/api/plugins`: the same operations over HTTP, the module as the request body.
#[tokio::test]
async fn plugins_are_bound_listed_and_deleted_over_http() {
    use crate::common::http_request;
    let server = start_default().await;
    let client = connect(&server).await;
    let http = server.http_addr.expect("http on");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/edit.wat");
    let module = std::fs::read_to_string(path).expect("edit.wat");
    let (status, body) = http_request(
        http,
        "PUT",
        "/api/plugins/h.%3E?hooks=publish&on_error=pass",
        &[],
        &module,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let put: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        (put["pattern"].clone(), put["on_error"].clone()),
        (json!("h.>"), json!("pass")),
        "{put}"
    );
    let (status, body) = http_request(http, "GET", "/api/plugins", &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""pattern":"h.>""#), "{body}");
    let js = async_nats::jetstream::new(client.clone());
    js_publish_to_tenant(&js, "default", "h.x", "loud")
        .await
        .expect("stored");
    assert_eq!(replay_texts(&client, "h.x").await, ["LOUD"]);
    let (status, body) = http_request(http, "PUT", "/api/plugins/h2.%3E", &[], "(module)").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cannot run"), "{body}");
    let (status, body) = http_request(http, "DELETE", "/api/plugins/h.%3E", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_request(http, "GET", "/api/plugins/h.%3E", &[], "").await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}

/// The `schema` host function: a plugin reads the JSON Schema bound to its subject
/// (here it publishes it in place of the message), and gets 0 where none is bound.
#[tokio::test]
async fn a_plugin_reads_the_schema_bound_to_its_subject() {
    let server = start_default().await;
    let client = connect(&server).await;
    let (status, answer) = api(
        &client,
        "schema.put",
        json!({"pattern": "sch.>", "schema": {"type": "object"}}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    put(&client, "sch.>", "schema.wat", json!({})).await;
    put(&client, "nos.>", "schema.wat", json!({})).await;
    let js = async_nats::jetstream::new(client.clone());
    js_publish_to_tenant(&js, "default", "sch.a", r#"{"a":1}"#)
        .await
        .expect("stored");
    js_publish_to_tenant(&js, "default", "nos.a", "as sent")
        .await
        .expect("stored");
    let stored: Vec<Value> = replay_texts(&client, "sch.a")
        .await
        .iter()
        .map(|t| serde_json::from_str(t).expect("JSON"))
        .collect();
    assert_eq!(stored, [json!({"type": "object"})]);
    assert_eq!(replay_texts(&client, "nos.a").await, ["as sent"]);
    server.stop().await;
}

/// `$CANOPY.append` goes through the publish plugins too: a transform stands in for
/// the message, a rejection refuses the append, and a drop, which an append cannot
/// carry, refuses it with why.
#[tokio::test]
async fn appends_go_through_publish_plugins() {
    let server = start_default().await;
    let client = connect(&server).await;
    put(&client, "ap.>", "edit.wat", json!({})).await;
    let append = |data: &'static str| {
        let client = client.clone();
        async move {
            api(
                &client,
                "append",
                json!({"subject": "ap.x", "messages": [{"data": data}]}),
            )
            .await
        }
    };
    let (status, answer) = append("quiet").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(replay_texts(&client, "ap.x").await, ["QUIET"]);
    let (status, answer) = append("!loud").await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("no bangs here"), "{answer}");
    let (status, answer) = append("xdropped").await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.to_string().contains("publish it instead"),
        "{answer}"
    );
    assert_eq!(replay_texts(&client, "ap.x").await, ["QUIET"]);
    server.stop().await;
}

/// A will goes through the publish plugins as its client's publishes do.
#[tokio::test]
async fn a_will_goes_through_publish_plugins() {
    use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
    let server = start_default().await;
    let client = connect(&server).await;
    put(&client, "wl.>", "edit.wat", json!({})).await;
    let mut sub = watch(&client, "wl.>").await;
    let addr = mqtt_addr(&server);
    let mut options = MqttOptions::new("will-holder", addr.ip().to_string(), addr.port());
    options.set_last_will(LastWill::new("wl/x", "gone", QoS::AtMostOnce, false));
    let (mqtt, mut events) = AsyncClient::new(options, 16);
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(_)) = events.poll().await.expect("mqtt") {
                return;
            }
        }
    })
    .await
    .expect("CONNACK within the wait");
    // Gone without a DISCONNECT: the socket closes, the will is published.
    drop(events);
    drop(mqtt);
    let will = next_message(&mut sub, "the will").await;
    assert_eq!(
        (will.subject.as_str(), &will.payload[..]),
        ("wl.x", &b"GONE"[..])
    );
    server.stop().await;
}

/// A publish over the tenant's rate is refused before its plugins run: a client
/// flooding past its rate costs no plugin time.
#[tokio::test]
async fn publishes_over_the_tenants_rate_do_not_run_plugins() {
    let server = start_default().await;
    let client = connect(&server).await;
    crate::quotas::limit_default(&client, json!({"max_publish_msgs_per_sec": 5})).await;
    put(&client, "rl.>", "edit.wat", json!({})).await;
    let js = async_nats::jetstream::new(client.clone());
    let (mut taken, mut refused) = (0u64, 0u64);
    for _ in 0..30 {
        match js_publish_to_tenant(&js, "default", "rl.x", "m").await {
            Ok(_) => taken += 1,
            Err(error) => {
                assert!(error.to_string().contains("publish rate"), "{error}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "{taken} taken");
    let (status, shown) = plugin(&client, "get", json!({"pattern": "rl.>"})).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        shown["calls"],
        json!(taken),
        "one call per admitted publish: {shown}"
    );
    server.stop().await;
}
