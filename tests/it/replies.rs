//! Replies reach only the connection that asked. `_INBOX.<token>.…` belongs to the
//! connection that first subscribed under `<token>`: no wildcard subscription
//! receives another connection's replies (not `>`, `*.>`, `_INBOX.>`, `_INBOX.*.*`,
//! MQTT `#` or `_INBOX/#`, nor `/ws` `>`), another connection may not subscribe under
//! that token while its owner holds it, and subscribing to one's own inbox needs no
//! allow rule, so a user whose rules do not mention `_INBOX` can still make requests
//! (async-nats, nats-py, `canopy get`).
//!
//! Tenant acme: `snoop` may subscribe to everything (`>` and `_INBOX.>`), `alice`
//! asks, `bob` answers, `plain` may publish and subscribe only under `svc.>`. In the
//! default tenant, `snoop` has the same rules and `admin` issues a token. Replies are
//! routed in the requester's tenant, so each snoop watches the tenant of the
//! requests it must not see.
//!
//! Where an order exists, "nothing arrived" is shown by a probe published after the
//! replies, which must be the first thing a watcher gets; subscriptions the probe
//! cannot reach are watched for a bounded quiet time.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;

use crate::common::{Raw, WAIT, header, publish_acked};
use crate::logins::{Logins, Mqtt5, QUIET, Ws, call, next_native, status, text};

const PROBE: &str = "probe.done.x";
const PROBE_PAYLOAD: &str = "the probe";

fn users() -> Vec<crate::logins::UserSpec<'static>> {
    let everything = json!({
        "publish": {"allow": ["snoop.>", "probe.>"]},
        "subscribe": {"allow": [">", "_INBOX.>"]}
    });
    vec![
        ("acme", "snoop", Some(everything.clone())),
        ("acme", "alice", None),
        ("acme", "bob", None),
        (
            "acme",
            "plain",
            Some(json!({
                "publish": {"allow": ["svc.>", "$CANOPY.get"]},
                "subscribe": {"allow": ["svc.>"]}
            })),
        ),
        ("default", "snoop", Some(everything)),
    ]
}

/// `bob@acme` answers every request on `svc.echo` with `echo: <payload>`.
async fn start_echo(f: &Logins) {
    let bob = f.native("bob@acme").await;
    let mut requests = bob.subscribe("svc.echo").await.expect("subscribe");
    bob.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let answer = format!("echo: {}", text(&request.payload));
                if bob.publish(reply, answer.into()).await.is_err() {
                    return;
                }
                let _ = bob.flush().await;
            }
        }
    });
}

/// Every wildcard subscription of one snoop, on every front end.
struct Snoop {
    /// Native subscriptions the probe reaches, then those it cannot reach.
    reached: Vec<(&'static str, async_nats::Subscriber)>,
    unreached: Vec<(&'static str, async_nats::Subscriber)>,
    /// One MQTT connection per filter (overlapping filters of one connection may be
    /// one delivery), with whether the probe reaches it; refused filters are left out.
    mqtt: Vec<(&'static str, Mqtt5, bool)>,
    ws: Ws,
    _native: async_nats::Client,
}

impl Snoop {
    async fn start(f: &Logins, who: &str) -> Snoop {
        let native = f.native(who).await;
        let mut reached = Vec::new();
        for pattern in [">", "*.>"] {
            reached.push((pattern, native.subscribe(pattern).await.expect("subscribe")));
        }
        let mut unreached = Vec::new();
        for pattern in ["_INBOX.>", "_INBOX.*.*", "_INBOX.*.x", "_INBOX.*"] {
            unreached.push((pattern, native.subscribe(pattern).await.expect("subscribe")));
        }
        native.flush().await.expect("flush");
        let mut mqtt = Vec::new();
        for (n, (filter, reached_by_probe)) in [("#", true), ("+/+/+", true), ("_INBOX/#", false)]
            .into_iter()
            .enumerate()
        {
            let mut client = f.mqtt5(who, &format!("snoop-{n}")).await;
            // Granted or not, nothing of another connection may come of it.
            if client.subscribe(filter, 1).await < 0x80 {
                mqtt.push((filter, client, reached_by_probe));
            }
        }
        let mut ws = f.ws(who).await;
        ws.ok(json!({"op": "sub", "pattern": ">"})).await;
        Snoop {
            reached,
            unreached,
            mqtt,
            ws,
            _native: native,
        }
    }

    /// After the probe was published: every subscription the probe reaches must get it
    /// first, the others nothing. Returns what leaked, described.
    async fn leaks(&mut self, secret: Option<&str>) -> Vec<String> {
        let mut leaks = Vec::new();
        // Requests on svc.echo are ordinary messages snoop may see; replies are not.
        let mut note = |what: String, subject: &str, body: &str| {
            if !subject.starts_with("_INBOX") {
                return;
            }
            let holds = secret.is_some_and(|s| body.contains(s));
            leaks.push(if holds {
                format!("{what} (it holds the secret)")
            } else {
                what
            });
        };
        for (pattern, sub) in &mut self.reached {
            loop {
                let got = next_native(sub, &format!("snoop's native {pattern}")).await;
                let body = text(&got.payload);
                if got.subject.as_str() == PROBE {
                    break;
                }
                note(
                    format!("native {pattern} got {} {body:?}", got.subject),
                    &got.subject,
                    &body,
                );
            }
        }
        for (pattern, sub) in &mut self.unreached {
            while let Ok(Some(got)) = tokio::time::timeout(QUIET, sub.next()).await {
                let body = text(&got.payload);
                note(
                    format!("native {pattern} got {} {body:?}", got.subject),
                    &got.subject,
                    &body,
                );
            }
        }
        let probe_topic = PROBE.replace('.', "/");
        for (filter, client, reached_by_probe) in &mut self.mqtt {
            if *reached_by_probe {
                loop {
                    let got = client.next_publish("the probe over MQTT").await;
                    if got.topic == probe_topic {
                        break;
                    }
                    let body = got.text();
                    note(
                        format!("MQTT {filter} got {} {body:?}", got.topic),
                        &got.topic,
                        &body,
                    );
                }
            } else {
                while let Some(got) = client.try_next_publish(QUIET).await {
                    let body = got.text();
                    note(
                        format!("MQTT {filter} got {} {body:?}", got.topic),
                        &got.topic,
                        &body,
                    );
                }
            }
        }
        loop {
            let got = self.ws.next_event().await;
            if got["subject"] == json!(PROBE) {
                break;
            }
            let body = got.to_string();
            let subject = got["subject"].as_str().unwrap_or_default();
            note(format!("/ws > got {body}"), subject, &body);
        }
        leaks
    }
}

/// Publishes the probe as `who` and waits until the server has routed it.
async fn probe(f: &Logins, who: &str) {
    let client = f.native(who).await;
    client
        .publish(PROBE, PROBE_PAYLOAD.into())
        .await
        .expect("publish the probe");
    client.flush().await.expect("flush");
}

#[tokio::test]
async fn no_wildcard_subscription_receives_another_connections_replies() {
    let f = Logins::start(&["acme"], &users()).await;
    start_echo(&f).await;
    let mut snoop = Snoop::start(&f, "snoop@acme").await;

    // async-nats requests (its inbox `_INBOX.<nuid>.<n>`), an API call, and a raw
    // connection whose reply subject ends in `x` (for `_INBOX.*.x`).
    let alice = f.native("alice@acme").await;
    for n in 0..3 {
        let answer = tokio::time::timeout(
            WAIT,
            alice.request("svc.echo", format!("secret {n}").into()),
        )
        .await
        .expect("answered in time")
        .expect("answered");
        assert_eq!(text(&answer.payload), format!("echo: secret {n}"));
    }
    let listed = call(&alice, "subjects", json!({})).await;
    assert_eq!(status(&listed), 200, "{}", text(&listed.payload));
    let mut raw = Raw::connect(f.server.native_addr).await;
    raw.send(&format!(
        "CONNECT {}\r\n",
        json!({"auth_token": f.token("alice@acme"), "verbose": false, "headers": true})
    ))
    .await;
    raw.send("SUB _INBOX.rawalice.* 1\r\nPUB svc.echo _INBOX.rawalice.x 10\r\nraw secret\r\n")
        .await;
    assert_eq!(raw.line().await, "MSG _INBOX.rawalice.x 1 16");
    assert_eq!(text(&raw.bytes(18).await), "echo: raw secret\r\n");

    probe(&f, "alice@acme").await;
    let leaks = snoop.leaks(Some("secret")).await;
    assert!(
        leaks.is_empty(),
        "snoop@acme, subscribed to everything, received other connections' replies:\n  {}",
        leaks.join("\n  ")
    );
    f.stop().await;
}

#[tokio::test]
async fn a_token_issued_to_an_administrator_is_not_seen_by_a_wildcard_subscriber() {
    let f = Logins::start(&["acme"], &users()).await;
    let mut snoop = Snoop::start(&f, "snoop@default").await;
    let admin = f.native("admin@default").await;
    let token = crate::common::issue_token(&admin, "acme", "alice").await;
    assert!(token.starts_with("cnp.acme.alice."), "{token}");
    let secret = token
        .split('.')
        .nth(4)
        .expect("the token's secret")
        .to_owned();
    probe(&f, "admin@default").await;
    let leaks = snoop.leaks(Some(&secret)).await;
    assert!(
        leaks.is_empty(),
        "snoop@default saw the reply to the administrator's user.token.create:\n  {}",
        leaks.join("\n  ")
    );
    f.stop().await;
}

/// A raw native connection logged in as `who`, caught up.
async fn raw_login(f: &Logins, who: &str) -> Raw {
    let mut raw = Raw::connect(f.server.native_addr).await;
    raw.send(&format!(
        "CONNECT {}\r\n",
        json!({"auth_token": f.token(who), "verbose": false, "headers": true})
    ))
    .await;
    raw.ping_pong().await;
    raw
}

#[tokio::test]
async fn only_the_first_connection_under_an_inbox_token_may_subscribe_to_it() {
    let f = Logins::start(&["acme"], &users()).await;
    let mut owner = raw_login(&f, "alice@acme").await;
    owner.send("SUB _INBOX.ownertok.* 1\r\n").await;
    owner.ping_pong().await;

    // Another connection, even one allowed `_INBOX.>`, may not subscribe under the
    // owner's token while the owner holds it: native, MQTT and /ws.
    let mut other = raw_login(&f, "snoop@acme").await;
    let mut wrong = Vec::new();
    for (sid, pattern) in [
        (7, "_INBOX.ownertok.*"),
        (8, "_INBOX.ownertok.>"),
        (9, "_INBOX.ownertok.1"),
    ] {
        other
            .send(&format!("SUB {pattern} {sid}\r\nPING\r\n"))
            .await;
        let answer = other.line().await;
        let expected = format!("-ERR 'Permissions Violation for Subscription to \"{pattern}\"'");
        if answer != expected {
            wrong.push(format!(
                "native SUB {pattern}: {answer}, expected {expected}"
            ));
        }
        if answer != "PONG" {
            assert_eq!(other.line().await, "PONG", "the connection stays open");
        }
    }
    let mut mqtt = f.mqtt5("snoop@acme", "other").await;
    for filter in ["_INBOX/ownertok/+", "_INBOX/ownertok/#"] {
        let code = mqtt.subscribe(filter, 1).await;
        if code != 0x87 {
            wrong.push(format!(
                "MQTT SUBSCRIBE {filter}: SUBACK {code:#04x}, expected 0x87"
            ));
        }
    }
    let mut ws = f.ws("snoop@acme").await;
    let reply = ws
        .call(json!({"op": "sub", "pattern": "_INBOX.ownertok.*"}))
        .await;
    if reply["code"] != json!("forbidden") {
        wrong.push(format!(
            "/ws sub _INBOX.ownertok.*: {reply}, expected code forbidden"
        ));
    }

    // The owner's replies reach the owner, and only the owner.
    let bob = f.native("bob@acme").await;
    bob.publish("_INBOX.ownertok.1", "for the owner".into())
        .await
        .expect("publish");
    bob.flush().await.expect("flush");
    assert_eq!(owner.line().await, "MSG _INBOX.ownertok.1 1 13");
    assert_eq!(text(&owner.bytes(15).await), "for the owner\r\n");
    other.send("PING\r\n").await;
    let next = other.line().await;
    if next != "PONG" {
        wrong.push(format!("the other native connection received {next}"));
    }
    if let Some(got) = mqtt.try_next_publish(QUIET).await {
        wrong.push(format!("the other MQTT connection received {got:?}"));
    }
    if let Ok(got) = tokio::time::timeout(QUIET, ws.next_event()).await {
        wrong.push(format!("the other /ws connection received {got}"));
    }
    assert!(
        wrong.is_empty(),
        "an inbox token belongs to the connection that subscribed under it first:\n  {}",
        wrong.join("\n  ")
    );

    // Once the owner lets go, the token is free.
    owner.send("UNSUB 1\r\n").await;
    owner.ping_pong().await;
    other.send("SUB _INBOX.ownertok.* 10\r\n").await;
    other.ping_pong().await;
    bob.publish("_INBOX.ownertok.2", "now yours".into())
        .await
        .expect("publish");
    bob.flush().await.expect("flush");
    assert_eq!(other.line().await, "MSG _INBOX.ownertok.2 10 9");
    f.stop().await;
}

fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test-all.sh, which creates it with nats-py",
        python.display()
    );
    python
}

#[tokio::test]
async fn a_user_without_inbox_rules_makes_requests_with_every_client() {
    let f = Logins::start(&["acme"], &users()).await;
    start_echo(&f).await;
    let bob = f.native("bob@acme").await;
    publish_acked(&bob, "svc.data", "stored for plain").await;

    let options = async_nats::ConnectOptions::new().request_timeout(Some(Duration::from_secs(5)));
    let plain = f.native_with("plain@acme", options).await;
    let mut wrong: Vec<String> = Vec::new();
    match plain.request("svc.echo", "hello".into()).await {
        Ok(answer) if text(&answer.payload) == "echo: hello" => {}
        other => wrong.push(format!("async-nats request to svc.echo: {other:?}")),
    }
    match plain
        .request(
            "$CANOPY.get",
            json!({"subject": "svc.data"}).to_string().into(),
        )
        .await
    {
        Ok(answer) if status(&answer) == 200 && text(&answer.payload) == "stored for plain" => {}
        Ok(answer) => wrong.push(format!(
            "async-nats $CANOPY.get svc.data: status {}, {:?}",
            status(&answer),
            text(&answer.payload)
        )),
        Err(e) => wrong.push(format!("async-nats $CANOPY.get svc.data: {e}")),
    }
    let acked = plain
        .request_with_headers("svc.more", header("Canopy-Ack", "durable"), "x".into())
        .await;
    match acked {
        Ok(ack) if text(&ack.payload).contains("\"version\":1") => {}
        Ok(ack) => wrong.push(format!(
            "an acknowledged publish to svc.more: {:?}",
            text(&ack.payload)
        )),
        Err(e) => wrong.push(format!("an acknowledged publish to svc.more: {e}")),
    }

    // The CLI.
    let cli = tokio::time::timeout(
        WAIT * 2,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
            .args(["get", "svc.data", "--server", &f.server.native_url()])
            .args(["--token", f.token("plain@acme")])
            .env_remove("CANOPY_SERVER")
            .env_remove("CANOPY_USER")
            .env_remove("CANOPY_PASSWORD")
            .env_remove("CANOPY_TOKEN")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("canopy get finishes")
    .expect("canopy get runs");
    if !cli.status.success() || !text(&cli.stdout).contains("stored for plain") {
        wrong.push(format!(
            "canopy get svc.data: {}, stdout {:?}, stderr {:?}",
            cli.status,
            text(&cli.stdout),
            text(&cli.stderr)
        ));
    }

    // nats-py: plain asks, bob answers (each a nats-py connection of its own).
    let script = r#"
import asyncio, sys
import nats
async def main(url, asker, answerer):
    server = await nats.connect(url, token=answerer)
    async def answer(m):
        await m.respond(b"py: " + m.data)
    await server.subscribe("svc.py", cb=answer)
    await server.flush()
    client = await nats.connect(url, token=asker)
    got = await client.request("svc.py", b"ping", timeout=5)
    assert got.data == b"py: ping", got
    await client.close()
    await server.close()
    print("nats-py request answered")
asyncio.run(main(*sys.argv[1:4]))
"#;
    let py = tokio::time::timeout(
        WAIT * 2,
        tokio::process::Command::new(python())
            .arg("-c")
            .arg(script)
            .arg(f.server.native_url())
            .arg(f.token("plain@acme"))
            .arg(f.token("bob@acme"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("nats-py finishes")
    .expect("python runs");
    if !py.status.success() || !text(&py.stdout).contains("nats-py request answered") {
        wrong.push(format!(
            "nats-py request from plain to bob: {}, stderr {}",
            py.status,
            text(&py.stderr)
        ));
    }
    // Bob, who has no rules at all, still asks as before.
    let answer = tokio::time::timeout(WAIT, bob.request("svc.echo", "from bob".into()))
        .await
        .expect("in time")
        .expect("answered");
    assert_eq!(text(&answer.payload), "echo: from bob");
    assert!(
        wrong.is_empty(),
        "plain@acme (rules: svc.> only, no _INBOX) must be able to make requests:\n  {}",
        wrong.join("\n  ")
    );
    f.stop().await;
}
