//! Tenants are apart on every front end, and a user's ACL holds over MQTT and `/ws`.
//!
//! Every test starts a server that requires logins, with tenants `a` and `b` and their
//! users made by the default tenant's administrator (as `auth.rs` does). Users log in
//! with bearer tokens (no password hashing: fast in debug builds): async-nats with the
//! token, rumqttc with the token as the password, `/ws` with it as a subprotocol.
//!
//! "Nothing of tenant a arrives in tenant b" is checked without sleeping where an
//! order exists: everything of tenant a is published (and acked, or flushed, which
//! for stored subjects waits for the sequencer) before tenant b publishes a probe, and
//! every subscriber in b must see that probe as its very first message. Where no order
//! exists (retained messages read on subscribe, subscriptions nothing can publish to)
//! a short bounded wait asserts that nothing arrives.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common::{
    WAIT, api, header, header_of, list_subjects, local_folder_config, publish_acked, replay_start,
    replay_subject, start, store_request,
};
use crate::logins::Ws;
use canopy::server::RunningServer;

/// How long a subscriber is watched to show that nothing (more) arrives.
const QUIET: Duration = Duration::from_millis(300);

/// The payload every probe of tenant b carries.
const BOB_PROBE: &str = "bob probe";
/// The payload of tenant a's last messages.
const ALICE_FINAL: &str = "alice final";

// ---------------------------------------------------------------------------------
// A server that requires logins, with tenants `a` and `b`.

struct Fixture {
    server: RunningServer,
    /// Bearer tokens by `name@tenant`.
    tokens: HashMap<String, String>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Creates tenants `a` and `b`, `ops` in the default tenant and `users`
    /// (`(tenant, name, permissions)`), each with a token, then restarts the server
    /// with `authz.require_login`.
    async fn start(users: &[(&str, &str, Option<Value>)]) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = local_folder_config(dir.path());
        let server = start(config.clone()).await;
        let admin = async_nats::connect(server.native_url())
            .await
            .expect("connect before logins are required");
        for tenant in ["a", "b"] {
            let (status, body) = api(&admin, "tenant.create", json!({ "name": tenant })).await;
            assert_eq!(status, 200, "tenant.create {tenant}: {body}");
        }
        let mut tokens = HashMap::new();
        let everyone = users
            .iter()
            .map(|(t, n, p)| (*t, *n, p.clone()))
            .chain([("default", "ops", None)]);
        for (tenant, name, permissions) in everyone {
            let mut body = json!({"tenant": tenant, "name": name});
            if let Some(permissions) = permissions {
                body["permissions"] = permissions;
            }
            let (status, created) = api(&admin, "user.create", body).await;
            assert_eq!(status, 200, "user.create {name}@{tenant}: {created}");
            let (status, issued) = api(
                &admin,
                "user.token.create",
                json!({"tenant": tenant, "name": name}),
            )
            .await;
            assert_eq!(status, 200, "token for {name}@{tenant}: {issued}");
            let token = issued["token"]
                .as_str()
                .unwrap_or_else(|| panic!("a token for {name}@{tenant}: {issued}"))
                .to_owned();
            tokens.insert(format!("{name}@{tenant}"), token);
        }
        drop(admin);
        server.stop().await;
        config.authz.require_login = true;
        let server = start(config).await;
        Fixture {
            server,
            tokens,
            _dir: dir,
        }
    }

    fn token(&self, who: &str) -> &str {
        self.tokens
            .get(who)
            .unwrap_or_else(|| panic!("no user {who}"))
    }

    /// A native client logged in as `who` (`name@tenant`).
    async fn native(&self, who: &str) -> async_nats::Client {
        async_nats::ConnectOptions::with_token(self.token(who).to_owned())
            .retry_on_initial_connect()
            .max_reconnects(Some(0))
            .connection_timeout(Duration::from_secs(10))
            .connect(self.server.native_url())
            .await
            .unwrap_or_else(|e| panic!("{who} logs in over the native protocol: {e}"))
    }

    async fn mqtt(&self, who: &str, version: Version, client_id: &str, clean: bool) -> Mqtt {
        let addr = self.server.mqtt_addr.expect("the MQTT listener is on");
        Mqtt::connect(addr, version, client_id, who, self.token(who), clean).await
    }

    async fn ws(&self, who: &str) -> Ws {
        let http = self.server.http_addr.expect("the HTTP listener is on");
        Ws::open(http, self.token(who)).await
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

// ---------------------------------------------------------------------------------
// Native helpers.

/// The next message of `sub` within the wait.
async fn next_native(sub: &mut async_nats::Subscriber, what: &str) -> async_nats::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within the wait"))
        .unwrap_or_else(|| panic!("{what}: the subscription ended"))
}

/// Asserts that `sub` receives nothing for [`QUIET`].
async fn native_quiet(sub: &mut async_nats::Subscriber, what: &str) {
    if let Ok(got) = tokio::time::timeout(QUIET, sub.next()).await {
        panic!(
            "{what}: expected nothing, got {:?}",
            got.map(|m| (m.subject.to_string(), text(&m.payload)))
        );
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Calls `$CANOPY.<op>` and returns the answer whatever it is (`common::api` wants a
/// JSON body, which `get` answers only with the stored payload).
async fn call(client: &async_nats::Client, op: &str, body: Value) -> async_nats::Message {
    tokio::time::timeout(
        WAIT,
        client.request(format!("$CANOPY.{op}"), body.to_string().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("$CANOPY.{op} answers within the wait"))
    .unwrap_or_else(|e| panic!("$CANOPY.{op}: {e}"))
}

/// The `Canopy-Status` of an API answer (200 when it has none).
fn status(message: &async_nats::Message) -> u16 {
    match header_of(message, "Canopy-Status") {
        None => 200,
        Some(status) => status
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Canopy-Status is not a number: {status:?}")),
    }
}

/// One `$CANOPY.replay` answer read by hand: (payloads, whether a snapshot came).
async fn replay_texts(client: &async_nats::Client, body: Value) -> (Vec<String>, bool) {
    let mut sub = replay_start(client, &body).await;
    let mut texts = Vec::new();
    let mut snapshot = false;
    loop {
        let message = next_native(&mut sub, "a replay answer").await;
        assert_eq!(
            status(&message),
            200,
            "replay {body}: {}",
            text(&message.payload)
        );
        if header_of(&message, "Canopy-Done") == Some("true") {
            return (texts, snapshot);
        }
        if header_of(&message, "Canopy-Snapshot") == Some("true") {
            snapshot = true;
        }
        texts.push(text(&message.payload));
    }
}

// ---------------------------------------------------------------------------------
// MQTT (rumqttc v4 = 3.1.1 and v5) with the events the tests look at, as raw codes.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V311,
    V5,
}

#[derive(Debug, Clone)]
struct Received {
    topic: String,
    payload: Vec<u8>,
    retain: bool,
}

impl Received {
    fn text(&self) -> String {
        text(&self.payload)
    }
}

#[derive(Debug)]
enum Event {
    ConnAck {
        accepted: bool,
        session_present: bool,
    },
    SubAck(Vec<u8>),
    /// The PUBACK's reason code (3.1.1 has none: 0).
    PubAck(u8),
    Publish(Received),
    /// A PUBLISH was written out.
    Sent,
    Other,
}

fn v4_event(event: rumqttc::Event) -> Event {
    use rumqttc::{Event as E, Outgoing, Packet, SubscribeReasonCode};
    match event {
        E::Incoming(Packet::ConnAck(ack)) => Event::ConnAck {
            accepted: ack.code == rumqttc::ConnectReturnCode::Success,
            session_present: ack.session_present,
        },
        E::Incoming(Packet::SubAck(ack)) => Event::SubAck(
            ack.return_codes
                .iter()
                .map(|code| match code {
                    SubscribeReasonCode::Success(qos) => *qos as u8,
                    SubscribeReasonCode::Failure => 0x80,
                })
                .collect(),
        ),
        E::Incoming(Packet::PubAck(_)) => Event::PubAck(0),
        E::Incoming(Packet::Publish(publish)) => Event::Publish(Received {
            topic: publish.topic,
            payload: publish.payload.to_vec(),
            retain: publish.retain,
        }),
        E::Outgoing(Outgoing::Publish(_)) => Event::Sent,
        _ => Event::Other,
    }
}

fn v5_event(event: rumqttc::v5::Event) -> Event {
    use rumqttc::Outgoing;
    use rumqttc::v5::Event as E;
    use rumqttc::v5::mqttbytes::v5::{
        ConnectReturnCode, Packet, PubAckReason, SubscribeReasonCode as S,
    };
    match event {
        E::Incoming(Packet::ConnAck(ack)) => Event::ConnAck {
            accepted: ack.code == ConnectReturnCode::Success,
            session_present: ack.session_present,
        },
        E::Incoming(Packet::SubAck(ack)) => Event::SubAck(
            ack.return_codes
                .iter()
                .map(|code| match code {
                    S::Success(qos) => *qos as u8,
                    S::Failure | S::Unspecified => 0x80,
                    S::ImplementationSpecific => 0x83,
                    S::NotAuthorized => 0x87,
                    S::TopicFilterInvalid => 0x8f,
                    S::PkidInUse => 0x91,
                    S::QuotaExceeded => 0x97,
                    S::SharedSubscriptionsNotSupported => 0x9e,
                    S::SubscriptionIdNotSupported => 0xa1,
                    S::WildcardSubscriptionsNotSupported => 0xa2,
                })
                .collect(),
        ),
        E::Incoming(Packet::PubAck(ack)) => Event::PubAck(match ack.reason {
            PubAckReason::Success => 0x00,
            PubAckReason::NoMatchingSubscribers => 0x10,
            PubAckReason::UnspecifiedError => 0x80,
            PubAckReason::ImplementationSpecificError => 0x83,
            PubAckReason::NotAuthorized => 0x87,
            PubAckReason::TopicNameInvalid => 0x90,
            PubAckReason::PacketIdentifierInUse => 0x91,
            PubAckReason::QuotaExceeded => 0x97,
            PubAckReason::PayloadFormatInvalid => 0x99,
        }),
        E::Incoming(Packet::Publish(publish)) => Event::Publish(Received {
            topic: text(&publish.topic),
            payload: publish.payload.to_vec(),
            retain: publish.retain,
        }),
        E::Outgoing(Outgoing::Publish(_)) => Event::Sent,
        _ => Event::Other,
    }
}

enum Handle {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

/// One MQTT connection. Its event loop runs in a task that forwards events and stops
/// at the first connection error (which every wait then reports).
struct Mqtt {
    handle: Handle,
    events: mpsc::UnboundedReceiver<Result<Event, String>>,
    publishes: VecDeque<Received>,
    session_present: bool,
    name: String,
}

impl Mqtt {
    async fn connect(
        addr: SocketAddr,
        version: Version,
        client_id: &str,
        user: &str,
        token: &str,
        clean: bool,
    ) -> Mqtt {
        let (tx, events) = mpsc::unbounded_channel();
        let host = addr.ip().to_string();
        let handle = match version {
            Version::V311 => {
                let mut options = rumqttc::MqttOptions::new(client_id, host, addr.port());
                options.set_keep_alive(Duration::from_secs(30));
                options.set_credentials(user, token);
                options.set_clean_session(clean);
                let (client, mut eventloop) = rumqttc::AsyncClient::new(options, 64);
                tokio::spawn(async move {
                    loop {
                        let event = eventloop.poll().await.map(v4_event);
                        let failed = event.is_err();
                        if tx.send(event.map_err(|e| e.to_string())).is_err() || failed {
                            return;
                        }
                    }
                });
                Handle::V4(client)
            }
            Version::V5 => {
                let mut options = rumqttc::v5::MqttOptions::new(client_id, host, addr.port());
                options.set_keep_alive(Duration::from_secs(30));
                options.set_credentials(user, token);
                options.set_clean_start(clean);
                if !clean {
                    options.set_session_expiry_interval(Some(600));
                }
                let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 64);
                tokio::spawn(async move {
                    loop {
                        let event = eventloop.poll().await.map(v5_event);
                        let failed = event.is_err();
                        if tx.send(event.map_err(|e| e.to_string())).is_err() || failed {
                            return;
                        }
                    }
                });
                Handle::V5(client)
            }
        };
        let mut mqtt = Mqtt {
            handle,
            events,
            publishes: VecDeque::new(),
            session_present: false,
            name: format!("{client_id} ({user}, {version:?})"),
        };
        match mqtt
            .wait_for("CONNACK", |e| matches!(e, Event::ConnAck { .. }))
            .await
        {
            Event::ConnAck {
                accepted,
                session_present,
            } => {
                assert!(accepted, "{}: the login is accepted", mqtt.name);
                mqtt.session_present = session_present;
            }
            other => unreachable!("{other:?}"),
        }
        mqtt
    }

    /// The first event `matches` accepts; PUBLISHes seen before it are kept.
    async fn wait_for(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
        loop {
            let event = tokio::time::timeout(WAIT, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("{}: no {what} within the wait", self.name))
                .unwrap_or_else(|| panic!("{}: event loop ended before {what}", self.name))
                .unwrap_or_else(|e| panic!("{}: connection error before {what}: {e}", self.name));
            if matches(&event) {
                return event;
            }
            if let Event::Publish(publish) = event {
                self.publishes.push_back(publish);
            }
        }
    }

    /// Subscribes to one filter; the SUBACK's code (the granted QoS, or the refusal).
    async fn subscribe(&mut self, filter: &str, qos: u8) -> u8 {
        match &self.handle {
            Handle::V4(client) => client
                .subscribe(filter, rumqttc::qos(qos).expect("a QoS"))
                .await
                .expect("subscribe queued"),
            Handle::V5(client) => client
                .subscribe(filter, rumqttc::v5::mqttbytes::qos(qos).expect("a QoS"))
                .await
                .expect("subscribe queued"),
        }
        match self
            .wait_for(&format!("SUBACK for {filter}"), |e| {
                matches!(e, Event::SubAck(_))
            })
            .await
        {
            Event::SubAck(codes) => {
                assert_eq!(codes.len(), 1, "{}: one code per filter", self.name);
                codes[0]
            }
            other => unreachable!("{other:?}"),
        }
    }

    /// Publishes and waits for the end of the flow: the PUBACK's code for QoS 1,
    /// `None` for QoS 0 (written out).
    async fn publish(&mut self, topic: &str, qos: u8, retain: bool, payload: &str) -> Option<u8> {
        let payload = payload.as_bytes().to_vec();
        match &self.handle {
            Handle::V4(client) => client
                .publish(topic, rumqttc::qos(qos).expect("a QoS"), retain, payload)
                .await
                .expect("publish queued"),
            Handle::V5(client) => client
                .publish(
                    topic,
                    rumqttc::v5::mqttbytes::qos(qos).expect("a QoS"),
                    retain,
                    payload,
                )
                .await
                .expect("publish queued"),
        }
        match qos {
            0 => {
                self.wait_for(&format!("QoS 0 publish to {topic}"), |e| {
                    matches!(e, Event::Sent)
                })
                .await;
                None
            }
            1 => match self
                .wait_for(&format!("PUBACK for {topic}"), |e| {
                    matches!(e, Event::PubAck(_))
                })
                .await
            {
                Event::PubAck(code) => Some(code),
                other => unreachable!("{other:?}"),
            },
            _ => panic!("the tests publish at QoS 0 or 1"),
        }
    }

    async fn next_publish(&mut self) -> Received {
        if let Some(publish) = self.publishes.pop_front() {
            return publish;
        }
        match self
            .wait_for("PUBLISH", |e| matches!(e, Event::Publish(_)))
            .await
        {
            Event::Publish(publish) => publish,
            other => unreachable!("{other:?}"),
        }
    }

    /// Asserts that no PUBLISH arrives for [`QUIET`] (and that the connection stays up).
    async fn quiet(&mut self, what: &str) {
        if let Some(publish) = self.publishes.pop_front() {
            panic!("{}: {what}: expected nothing, got {publish:?}", self.name);
        }
        let deadline = tokio::time::Instant::now() + QUIET;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => return,
                Ok(None) => panic!("{}: {what}: the event loop ended", self.name),
                Ok(Some(Err(e))) => panic!("{}: {what}: connection error: {e}", self.name),
                Ok(Some(Ok(Event::Publish(publish)))) => {
                    panic!("{}: {what}: expected nothing, got {publish:?}", self.name)
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// Sends DISCONNECT and waits until the connection has ended.
    async fn disconnect(mut self) {
        match &self.handle {
            Handle::V4(client) => client.disconnect().await.expect("disconnect queued"),
            Handle::V5(client) => client.disconnect().await.expect("disconnect queued"),
        }
        loop {
            match tokio::time::timeout(WAIT, self.events.recv()).await {
                Err(_) => panic!("{}: the connection did not end", self.name),
                Ok(None | Some(Err(_))) => return,
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}

/// A `/ws` message's payload as text.
fn ws_text(message: &Value) -> String {
    match (&message["data_b64"], &message["data"]) {
        (Value::String(b64), _) => text(
            &base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_else(|e| panic!("data_b64 is not base64 ({e}): {message}")),
        ),
        (_, Value::Null) => String::new(),
        (_, data) => data.to_string(),
    }
}

// ---------------------------------------------------------------------------------
// 1. Tenant isolation.

fn alice_and_bob() -> [(&'static str, &'static str, Option<Value>); 2] {
    [("a", "alice", None), ("b", "bob", None)]
}

#[tokio::test]
async fn live_messages_never_cross_tenants_on_any_front_end() {
    let f = Fixture::start(&alice_and_bob()).await;

    // Tenant b watches everything it can name, on every front end. The MQTT watchers
    // use the same client ids as tenant a's: a client id is only unique per tenant.
    let bob_watch = f.native("bob@b").await;
    let mut bob_subs = Vec::new();
    for pattern in [
        ">",
        "*.>",
        "a.>",
        "b.>",
        "orders.*",
        "_INBOX.probe",
        "$app.>",
    ] {
        let sub = bob_watch.subscribe(pattern).await.expect("subscribe");
        bob_subs.push((pattern, sub));
    }
    let mut bob_api_watch = bob_watch.subscribe("$CANOPY.>").await.expect("subscribe");
    bob_watch.flush().await.expect("flush");
    let mut bob_mqtt3 = f.mqtt("bob@b", Version::V311, "watcher-3", true).await;
    for filter in ["#", "$app/#", "a/#"] {
        assert_eq!(bob_mqtt3.subscribe(filter, 1).await, 1, "{filter} granted");
    }
    let mut bob_mqtt5 = f.mqtt("bob@b", Version::V5, "watcher-5", true).await;
    for filter in ["+/#", "$app/+", "_INBOX/other/#"] {
        assert_eq!(bob_mqtt5.subscribe(filter, 1).await, 1, "{filter} granted");
    }
    let mut bob_mqtt_api = f.mqtt("bob@b", Version::V5, "watcher-api", true).await;
    // Whether `$CANOPY/#` may be subscribed to or not, nothing may come of it.
    bob_mqtt_api.subscribe("$CANOPY/#", 1).await;
    let mut bob_ws = f.ws("bob@b").await;
    for pattern in [">", "#", "$app.>", "a/#"] {
        bob_ws.ok(json!({"op": "sub", "pattern": pattern})).await;
    }

    // Tenant a watches itself the same way, so its traffic is known to be routed.
    let alice_watch = f.native("alice@a").await;
    let mut alice_all = alice_watch.subscribe(">").await.expect("subscribe");
    let mut alice_sys = alice_watch.subscribe("$app.>").await.expect("subscribe");
    alice_watch.flush().await.expect("flush");
    let mut alice_mqtt = f.mqtt("alice@a", Version::V311, "watcher-3", true).await;
    for filter in ["#", "$app/#"] {
        assert_eq!(alice_mqtt.subscribe(filter, 1).await, 1, "{filter} granted");
    }
    let mut alice_ws = f.ws("alice@a").await;
    alice_ws.ok(json!({"op": "sub", "pattern": ">"})).await;

    // Tenant a's traffic on every front end: stored and live subjects, inboxes, `$`
    // subjects, a subject that starts with the other tenant's name, and API answers.
    let alice = f.native("alice@a").await;
    for (subject, payload) in [
        ("orders.1", "alice: native stored"),
        ("b.orders.1", "alice: b-prefixed"),
        ("a.orders.1", "alice: a-prefixed"),
        ("_INBOX.leak", "alice: inbox"),
        ("$app.leak", "alice: sys"),
    ] {
        alice
            .publish(subject, payload.into())
            .await
            .expect("publish");
    }
    // A flush after stored publishes is answered once the sequencer routed them.
    alice.flush().await.expect("flush");
    let answer = call(&alice, "subjects", json!({})).await;
    assert_eq!(status(&answer), 200, "{}", text(&answer.payload));
    let mut alice_mqtt5 = f.mqtt("alice@a", Version::V5, "watcher-5", true).await;
    assert_eq!(
        alice_mqtt5
            .publish("sensors/1/temp", 1, false, "alice: mqtt")
            .await,
        Some(0)
    );
    let stored = alice_ws
        .ok(json!({"op": "pub", "subject": "orders.2", "data": "alice: ws"}))
        .await;
    assert_eq!(stored["stored"], true, "{stored}");

    // Tenant b's probes: every watcher of tenant b must see one first.
    let bob = f.native("bob@b").await;
    for subject in [
        "_INBOX.probe",
        "$app.probe",
        "a.probe",
        "b.probe",
        "orders.probe",
    ] {
        bob.publish(subject, BOB_PROBE.into())
            .await
            .expect("publish");
    }
    bob.flush().await.expect("flush");
    for (pattern, sub) in &mut bob_subs {
        let first = next_native(sub, &format!("bob's native {pattern}")).await;
        assert_eq!(
            text(&first.payload),
            BOB_PROBE,
            "bob's native {pattern} got {} first",
            first.subject
        );
    }
    for watcher in [&mut bob_mqtt3, &mut bob_mqtt5] {
        let first = watcher.next_publish().await;
        assert_eq!(first.text(), BOB_PROBE, "{}: {first:?}", watcher.name);
    }
    let first = bob_ws.next_event().await;
    assert_eq!(
        (first["op"].as_str(), ws_text(&first)),
        (Some("msg"), BOB_PROBE.to_owned()),
        "bob's /ws: {first}"
    );
    native_quiet(&mut bob_api_watch, "bob's native $CANOPY.>").await;
    bob_mqtt_api.quiet("bob's MQTT $CANOPY/#").await;

    // Tenant a got all of its own traffic and none of b's probes.
    alice
        .publish("final", ALICE_FINAL.into())
        .await
        .expect("publish");
    alice
        .publish("$app.final", ALICE_FINAL.into())
        .await
        .expect("publish");
    alice.flush().await.expect("flush");
    let mut seen = Vec::new();
    loop {
        let got = next_native(&mut alice_all, "alice's >").await;
        assert_ne!(text(&got.payload), BOB_PROBE, "{}", got.subject);
        if text(&got.payload) == ALICE_FINAL {
            break;
        }
        seen.push(got.subject.to_string());
    }
    for subject in [
        "orders.1",
        "b.orders.1",
        "a.orders.1",
        "sensors.1.temp",
        "orders.2",
    ] {
        assert!(seen.iter().any(|s| s == subject), "{subject} in {seen:?}");
    }
    // An inbox is its owner's: no wildcard receives it, whatever the tenant.
    assert!(
        !seen.iter().any(|s| s.starts_with("_INBOX.")),
        "an inbox reached `>`: {seen:?}"
    );
    let sys: Vec<String> = [
        next_native(&mut alice_sys, "alice's $app.>").await,
        next_native(&mut alice_sys, "alice's $app.>").await,
    ]
    .iter()
    .map(|m| format!("{} {}", m.subject, text(&m.payload)))
    .collect();
    assert_eq!(
        sys,
        [
            "$app.leak alice: sys".to_owned(),
            format!("$app.final {ALICE_FINAL}")
        ]
    );
    let mut topics = Vec::new();
    let mut finals = 0;
    while finals < 2 {
        let got = alice_mqtt.next_publish().await;
        assert_ne!(got.text(), BOB_PROBE, "{got:?}");
        if got.text() == ALICE_FINAL {
            finals += 1;
        } else {
            topics.push(got.topic);
        }
    }
    for topic in ["orders/1", "$app/leak", "sensors/1/temp", "orders/2"] {
        assert!(topics.iter().any(|t| t == topic), "{topic} in {topics:?}");
    }
    let mut subjects = Vec::new();
    loop {
        let got = alice_ws.next_event().await;
        assert_eq!(got["op"], "msg", "{got}");
        assert!(!ws_text(&got).contains(BOB_PROBE), "{got}");
        if ws_text(&got).contains(ALICE_FINAL) {
            break;
        }
        subjects.push(got["subject"].as_str().unwrap_or_default().to_owned());
    }
    for subject in ["orders.1", "sensors.1.temp", "orders.2"] {
        assert!(
            subjects.iter().any(|s| s == subject),
            "{subject} in {subjects:?}"
        );
    }
    f.stop().await;
}

#[tokio::test]
async fn stored_history_and_snapshots_never_cross_tenants() {
    let f = Fixture::start(&alice_and_bob()).await;
    let alice = f.native("alice@a").await;
    let bob = f.native("bob@b").await;

    // Tenant a's history: two versions of orders.1, a subject b never writes, a msg
    // id, and a snapshot.
    publish_acked(&alice, "orders.1", "alice v1").await;
    publish_acked(&alice, "orders.1", "alice v2").await;
    publish_acked(&alice, "alice.only", "alice only").await;
    let mut with_id = header("Canopy-Ack", "durable");
    with_id.insert("Canopy-Msg-Id", "m-1");
    let ack = store_request(&alice, "orders.9", with_id.clone(), "alice m-1").await;
    assert_eq!(ack["version"], 1, "{ack}");
    let mut alice_ws = f.ws("alice@a").await;
    alice_ws
        .ok(
            json!({"op": "snapshot.put", "subject": "orders.1", "version": 2,
                   "data": {"by": "alice"}}),
        )
        .await;

    // Tenant b's streams of the same names start afresh: versions, msg ids and
    // expected versions are b's own.
    let ack = publish_acked(&bob, "orders.1", "bob v1").await;
    assert_eq!((&ack["version"], &ack["stream"]), (&json!(1), &json!("b")));
    let ack = store_request(&bob, "orders.9", with_id.clone(), "bob m-1").await;
    assert_eq!(ack["version"], 1, "not a duplicate of a's m-1: {ack}");
    assert!(ack.get("duplicate").is_none(), "{ack}");
    let mut expecting = header("Canopy-Ack", "durable");
    expecting.insert("Canopy-Expected-Version", "1");
    let ack = store_request(&bob, "orders.1", expecting, "bob v2").await;
    assert_eq!(
        ack["version"], 2,
        "b's orders.1 was at 1, not at a's 2: {ack}"
    );

    // The native API in tenant b: get, replay (subject, pattern, from a snapshot),
    // subjects and snapshots show b's alone.
    let got = call(&bob, "get", json!({"subject": "orders.1"})).await;
    assert_eq!(status(&got), 200);
    assert_eq!(text(&got.payload), "bob v2");
    assert_eq!(header_of(&got, "Canopy-Version"), Some("2"));
    for (subject, version) in [("alice.only", None), ("orders.9", Some(2))] {
        let mut body = json!({ "subject": subject });
        if let Some(version) = version {
            body["version"] = json!(version);
        }
        let got = call(&bob, "get", body).await;
        assert_eq!(status(&got), 404, "{subject}: {}", text(&got.payload));
        assert!(
            !text(&got.payload).contains("alice only"),
            "{}",
            text(&got.payload)
        );
    }
    let history: Vec<String> = replay_subject(&bob, "orders.1")
        .await
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(history, ["bob v1", "bob v2"]);
    assert!(replay_subject(&bob, "alice.only").await.is_empty());
    for pattern in [">", "orders.>", "alice.>"] {
        let (texts, _) = replay_texts(&bob, json!({"pattern": pattern, "max": 1000})).await;
        assert!(
            texts.iter().all(|t| t.starts_with("bob")),
            "replay {pattern}: {texts:?}"
        );
    }
    let (texts, _) = replay_texts(&bob, json!({"pattern": ">", "from": {"offset": 0}})).await;
    assert_eq!(texts, ["bob v1", "bob m-1", "bob v2"]);
    let (texts, snapshot) =
        replay_texts(&bob, json!({"subject": "orders.1", "from": "snapshot"})).await;
    assert!(!snapshot, "a's snapshot of orders.1 is not b's");
    assert_eq!(texts, ["bob v1", "bob v2"]);
    let listed: Vec<(String, u64)> = list_subjects(&bob, ">")
        .await
        .iter()
        .map(|s| {
            (
                s["subject"].as_str().unwrap_or_default().to_owned(),
                s["version"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(listed, [("orders.1".into(), 2), ("orders.9".into(), 1)]);
    let got = call(&bob, "snapshot.get", json!({"subject": "orders.1"})).await;
    assert_eq!(status(&got), 404, "{}", text(&got.payload));

    // The same over /ws in tenant b.
    let mut bob_ws = f.ws("bob@b").await;
    let got = bob_ws.ok(json!({"op": "get", "subject": "orders.1"})).await;
    assert_eq!(
        (ws_text(&got), &got["version"]),
        ("bob v2".into(), &json!(2))
    );
    bob_ws
        .refused(json!({"op": "get", "subject": "alice.only"}), "not_found")
        .await;
    bob_ws
        .refused(
            json!({"op": "get", "subject": "orders.1", "version": 3}),
            "not_found",
        )
        .await;
    for request in [
        json!({"op": "replay", "subject": "orders.1"}),
        json!({"op": "replay", "pattern": ">"}),
        json!({"op": "replay", "pattern": "#"}),
        json!({"op": "replay", "pattern": ">", "from_offset": 0}),
        json!({"op": "replay", "subject": "alice.only"}),
    ] {
        let page = bob_ws.ok(request.clone()).await;
        let texts: Vec<String> = page["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{request}: messages: {page}"))
            .iter()
            .map(ws_text)
            .collect();
        assert!(
            texts.iter().all(|t| t.starts_with("bob")),
            "{request}: {texts:?}"
        );
        if request["subject"] == "alice.only" {
            assert!(texts.is_empty(), "{texts:?}");
        }
    }
    let listed = bob_ws.ok(json!({"op": "subjects"})).await;
    let names: Vec<&str> = listed["subjects"]
        .as_array()
        .unwrap_or_else(|| panic!("subjects: {listed}"))
        .iter()
        .filter_map(|s| s["subject"].as_str())
        .collect();
    assert_eq!(names, ["orders.1", "orders.9"]);
    bob_ws
        .refused(
            json!({"op": "snapshot.get", "subject": "orders.1"}),
            "not_found",
        )
        .await;
    // A subscription from the snapshot: none in b, so b's history then live.
    bob_ws
        .ok(json!({"op": "sub", "pattern": "orders.1", "from_snapshot": true}))
        .await;
    publish_acked(&bob, "orders.1", "bob v3").await;
    let mut events = Vec::new();
    for _ in 0..3 {
        let event = bob_ws.next_event().await;
        events.push(format!(
            "{} {}",
            event["op"].as_str().unwrap_or("?"),
            ws_text(&event)
        ));
    }
    assert_eq!(events, ["msg bob v1", "msg bob v2", "msg bob v3"]);
    // A subscription from offset 0 of everything: b's history only.
    let mut bob_ws2 = f.ws("bob@b").await;
    bob_ws2
        .ok(json!({"op": "sub", "pattern": ">", "from_offset": 0}))
        .await;
    let mut texts = Vec::new();
    for _ in 0..4 {
        texts.push(ws_text(&bob_ws2.next_event().await));
    }
    assert_eq!(texts, ["bob v1", "bob m-1", "bob v2", "bob v3"]);
    bob_ws2.quiet("b's history is four messages").await;

    // Purging everything in b leaves a untouched.
    let purged = call(&bob, "purge", json!({"pattern": ">"})).await;
    assert_eq!(status(&purged), 200, "{}", text(&purged.payload));
    let purged: Value = serde_json::from_slice(&purged.payload).expect("JSON");
    assert_eq!(purged["subjects"], 2, "{purged}");
    let got = call(&alice, "get", json!({"subject": "orders.1"})).await;
    assert_eq!((status(&got), text(&got.payload)), (200, "alice v2".into()));
    let listed: Vec<String> = list_subjects(&alice, ">")
        .await
        .iter()
        .filter_map(|s| s["subject"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(listed, ["alice.only", "orders.1", "orders.9"]);
    let snapshot = alice_ws
        .ok(json!({"op": "snapshot.get", "subject": "orders.1"}))
        .await;
    assert_eq!(
        (&snapshot["version"], &snapshot["data"]),
        (&json!(2), &json!({"by": "alice"})),
        "{snapshot}"
    );
    let history: Vec<String> = replay_subject(&alice, "orders.1")
        .await
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(history, ["alice v1", "alice v2"]);
    f.stop().await;
}

#[tokio::test]
async fn retained_messages_stay_in_their_tenant() {
    let f = Fixture::start(&alice_and_bob()).await;
    let mut alice = f.mqtt("alice@a", Version::V5, "door", true).await;
    assert_eq!(
        alice.publish("status/door", 1, true, "alice open").await,
        Some(0)
    );
    let mut bob = f.mqtt("bob@b", Version::V311, "door", true).await;
    assert_eq!(
        bob.publish("status/window", 1, true, "bob closed").await,
        Some(0)
    );

    // b's `#` gets b's retained message alone (a's would sort first: status/door).
    for version in [Version::V311, Version::V5] {
        let mut watcher = f.mqtt("bob@b", version, "retained-watch", true).await;
        assert_eq!(watcher.subscribe("#", 1).await, 1);
        let first = watcher.next_publish().await;
        assert_eq!(
            (first.topic.as_str(), first.text().as_str(), first.retain),
            ("status/window", "bob closed", true),
            "{version:?}"
        );
        watcher.quiet("b's only retained message").await;
        for filter in ["status/door", "+/door", "status/+"] {
            assert_eq!(watcher.subscribe(filter, 1).await, 1);
        }
        // status/+ sends window again; a's door never.
        let again = watcher.next_publish().await;
        assert_eq!(again.topic, "status/window", "{again:?}");
        watcher.quiet("no retained door in b").await;
        watcher.disconnect().await;
    }

    // a's other session gets a's retained message alone.
    let mut other = f.mqtt("alice@a", Version::V311, "another", true).await;
    assert_eq!(other.subscribe("#", 1).await, 1);
    let first = other.next_publish().await;
    assert_eq!(
        (first.topic.as_str(), first.text().as_str(), first.retain),
        ("status/door", "alice open", true)
    );
    other.quiet("a's only retained message").await;
    f.stop().await;
}

async fn persistent_sessions_are_per_tenant(version: Version) {
    let f = Fixture::start(&alice_and_bob()).await;
    let id = "shared-device";

    // The same client id in both tenants: two sessions, neither takes the other over.
    let mut in_a = f.mqtt("alice@a", version, id, false).await;
    assert!(!in_a.session_present, "a fresh session in a");
    assert_eq!(in_a.subscribe("jobs/#", 1).await, 1);
    let mut in_b = f.mqtt("bob@b", version, id, false).await;
    assert!(
        !in_b.session_present,
        "a's session of {id} is not b's: session present in b"
    );
    assert_eq!(in_b.subscribe("jobs/#", 1).await, 1);
    assert_eq!(
        in_a.publish("jobs/live-a", 1, false, "live a").await,
        Some(0)
    );
    assert_eq!(
        in_b.publish("jobs/live-b", 1, false, "live b").await,
        Some(0)
    );
    assert_eq!(in_a.next_publish().await.text(), "live a");
    assert_eq!(in_b.next_publish().await.text(), "live b");
    in_a.disconnect().await;
    in_b.disconnect().await;

    // QoS 1 messages queue for each session while it is offline.
    let alice = f.native("alice@a").await;
    let bob = f.native("bob@b").await;
    for n in 1..=3 {
        publish_acked(&alice, &format!("jobs.a{n}"), format!("for a {n}")).await;
    }
    for n in 1..=2 {
        publish_acked(&bob, &format!("jobs.b{n}"), format!("for b {n}")).await;
    }

    // Each resumes its own session and gets its own queue, then live messages.
    let mut in_a = f.mqtt("alice@a", version, id, false).await;
    assert!(in_a.session_present, "a's session resumes");
    let mut in_b = f.mqtt("bob@b", version, id, false).await;
    assert!(in_b.session_present, "b's session resumes");
    publish_acked(&alice, "jobs.probe", "a probe").await;
    publish_acked(&bob, "jobs.probe", "b probe").await;
    let mut got_a = Vec::new();
    for _ in 0..4 {
        got_a.push(in_a.next_publish().await.text());
    }
    assert_eq!(got_a, ["for a 1", "for a 2", "for a 3", "a probe"]);
    let mut got_b = Vec::new();
    for _ in 0..3 {
        got_b.push(in_b.next_publish().await.text());
    }
    assert_eq!(got_b, ["for b 1", "for b 2", "b probe"]);
    in_a.quiet("a's queue is three messages").await;
    in_b.quiet("b's queue is two messages").await;
    f.stop().await;
}

#[tokio::test]
async fn persistent_mqtt_sessions_are_per_tenant_v311() {
    persistent_sessions_are_per_tenant(Version::V311).await;
}

#[tokio::test]
async fn persistent_mqtt_sessions_are_per_tenant_v5() {
    persistent_sessions_are_per_tenant(Version::V5).await;
}

#[tokio::test]
async fn only_the_default_tenant_administers_tenants_and_users() {
    let f = Fixture::start(&alice_and_bob()).await;
    let bob = f.native("bob@b").await;
    let alice = f.native("alice@a").await;
    let ops = f.native("ops@default").await;
    let alice_token = f.token("alice@a").to_owned();

    let calls = [
        ("tenant.list", json!({})),
        ("tenant.create", json!({"name": "evil"})),
        ("tenant.describe", json!({"name": "a"})),
        (
            "tenant.update",
            json!({"name": "a", "limits": {"max_connections": 1}}),
        ),
        ("tenant.delete", json!({"name": "a"})),
        ("tenant.delete", json!({"name": "b"})),
        ("user.list", json!({"tenant": "a"})),
        ("user.list", json!({"tenant": "b"})),
        (
            "user.create",
            json!({"tenant": "a", "name": "mallory", "password": "x"}),
        ),
        ("user.create", json!({"tenant": "b", "name": "mallory"})),
        (
            "user.create",
            json!({"tenant": "default", "name": "mallory"}),
        ),
        ("user.delete", json!({"tenant": "a", "name": "alice"})),
        ("user.token.create", json!({"tenant": "a", "name": "alice"})),
        ("user.token.create", json!({"tenant": "b", "name": "bob"})),
        (
            "user.token.revoke",
            json!({"tenant": "a", "name": "alice", "id": "x"}),
        ),
        ("tenant.nope", json!({})),
        ("user.nope", json!({})),
    ];
    for (who, client) in [("bob@b", &bob), ("alice@a", &alice)] {
        for (op, body) in &calls {
            let answer = call(client, op, body.clone()).await;
            let said = text(&answer.payload);
            assert_eq!(status(&answer), 403, "{who} {op} {body}: {said}");
            assert!(!said.contains("cnp."), "{who} {op}: a token leaked: {said}");
            assert!(!said.contains("\"users\""), "{who} {op}: {said}");
        }
    }
    // Over HTTP with their tokens.
    let http = f.server.http_addr.expect("http on");
    for who in ["bob@b", "alice@a"] {
        let bearer = format!("Bearer {}", f.token(who));
        let auth = [("Authorization", bearer.as_str())];
        for (method, path, body) in [
            ("GET", "/api/tenants", ""),
            ("POST", "/api/tenants", r#"{"name":"evil"}"#),
            ("GET", "/api/tenants/a", ""),
            ("PUT", "/api/tenants/a", r#"{"limits":{}}"#),
            ("DELETE", "/api/tenants/a", ""),
            ("DELETE", "/api/tenants/b", ""),
        ] {
            let (status, said) = crate::common::http_request(http, method, path, &auth, body).await;
            assert_eq!(status, 403, "{who} {method} {path}: {said}");
        }
    }
    // Over /ws and MQTT, `$CANOPY.` is not even a subject they may publish to.
    let mut bob_ws = f.ws("bob@b").await;
    for subject in ["$CANOPY.tenant.list", "$CANOPY.user.create"] {
        bob_ws
            .refused(
                json!({"op": "pub", "subject": subject, "data": {}}),
                "forbidden",
            )
            .await;
    }
    let mut bob_mqtt = f.mqtt("bob@b", Version::V5, "admin-try", true).await;
    for topic in ["$CANOPY/tenant/create", "$CANOPY/user/create"] {
        assert_eq!(
            bob_mqtt
                .publish(topic, 1, false, r#"{"name":"evil"}"#)
                .await,
            Some(0x87),
            "{topic}"
        );
    }

    // Nothing changed: the default tenant's administrator sees both tenants and their
    // users as they were, and alice's token still works.
    let (status_code, listed) = api(&ops, "tenant.list", json!({})).await;
    assert_eq!(status_code, 200, "{listed}");
    let names: Vec<&str> = listed["tenants"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b", "default"]);
    let (_, described) = api(&ops, "tenant.describe", json!({"name": "a"})).await;
    assert_eq!(described["limits"], json!({}), "{described}");
    for (tenant, expected) in [
        ("a", vec!["alice"]),
        ("b", vec!["bob"]),
        ("default", vec!["ops"]),
    ] {
        let (status_code, users) = api(&ops, "user.list", json!({ "tenant": tenant })).await;
        assert_eq!(status_code, 200, "{users}");
        let names: Vec<&str> = users["users"]
            .as_array()
            .unwrap_or_else(|| panic!("{users}"))
            .iter()
            .filter_map(|u| u["name"].as_str())
            .collect();
        assert_eq!(names, expected, "{tenant}");
        let tokens = users["users"][0]["tokens"].as_array().map(Vec::len);
        assert_eq!(tokens, Some(1), "no token was added in {tenant}: {users}");
    }
    let again = async_nats::ConnectOptions::with_token(alice_token)
        .max_reconnects(Some(0))
        .connect(f.server.native_url())
        .await;
    assert!(again.is_ok(), "alice still logs in: {:?}", again.err());
    f.stop().await;
}

// ---------------------------------------------------------------------------------
// 2. ACLs over MQTT and /ws.

/// `dev@a` may publish only under `devices.dev.>` and subscribe only there and under
/// `commands.<its client id>.>`; `alice@a` may do anything.
fn dev_and_alice() -> [(&'static str, &'static str, Option<Value>); 2] {
    [
        (
            "a",
            "dev",
            Some(json!({
                "publish": {"allow": ["devices.{user}.>"]},
                "subscribe": {"allow": ["devices.{user}.>", "commands.{client_id}.>"]}
            })),
        ),
        ("a", "alice", None),
    ]
}

async fn mqtt_acls(version: Version) {
    let f = Fixture::start(&dev_and_alice()).await;
    let refused_sub = match version {
        // 3.1.1 has one failure code in SUBACK.
        Version::V311 => 0x80,
        Version::V5 => 0x87,
    };
    let alice = f.native("alice@a").await;
    let mut observer = alice.subscribe(">").await.expect("subscribe");
    alice.flush().await.expect("flush");

    let mut dev = f.mqtt("dev@a", version, "sensor-7", true).await;
    for (filter, code) in [
        ("devices/dev/+", 1),
        ("devices/dev/+/+", 1),
        ("commands/sensor-7/+", 1),
        ("devices/other/+", refused_sub),
        ("devices/+/temp", refused_sub),
        ("commands/sensor-8/+", refused_sub),
        ("commands/+/reboot", refused_sub),
        ("#", refused_sub),
        ("+/dev/temp", refused_sub),
    ] {
        assert_eq!(dev.subscribe(filter, 1).await, code, "SUBACK for {filter}");
    }

    // Publishing: allowed arrives, denied is refused and goes nowhere, at QoS 0 and 1.
    assert_eq!(
        dev.publish("devices/dev/temp", 1, false, "21.5").await,
        Some(0)
    );
    for topic in ["devices/other/temp", "commands/sensor-7/x", "devices/dev"] {
        // 3.1.1 has no code in PUBACK: a denied QoS 1 publish closes the connection
        // instead (checked at the end), since an ack would say it was taken.
        if version == Version::V5 {
            assert_eq!(
                dev.publish(topic, 1, false, "denied").await,
                Some(0x87),
                "PUBACK for {topic}"
            );
        }
        assert_eq!(dev.publish(topic, 0, false, "denied").await, None);
    }
    assert_eq!(
        dev.publish("devices/dev/hum", 1, false, "40").await,
        Some(0)
    );
    let mut arrived = Vec::new();
    while arrived.len() < 2 {
        let got = next_native(&mut observer, "alice's >").await;
        if !got.subject.starts_with("_INBOX.") {
            arrived.push(format!("{} {}", got.subject, text(&got.payload)));
        }
    }
    assert_eq!(arrived, ["devices.dev.temp 21.5", "devices.dev.hum 40"]);
    // dev's own allowed publishes come back on its allowed subscription.
    assert_eq!(dev.next_publish().await.topic, "devices/dev/temp");
    assert_eq!(dev.next_publish().await.topic, "devices/dev/hum");

    // Deliveries: only what dev's granted filters cover.
    for subject in [
        "commands.sensor-8.reboot",
        "devices.other.temp",
        "commands.sensor-7.reboot",
        "devices.dev.cmd",
    ] {
        publish_acked(&alice, subject, subject).await;
    }
    let first = dev.next_publish().await;
    let second = dev.next_publish().await;
    assert_eq!(
        [first.topic.as_str(), second.topic.as_str()],
        ["commands/sensor-7/reboot", "devices/dev/cmd"]
    );

    // `{client_id}` is the MQTT client id: another client id of the same user has
    // other commands.
    let mut other = f.mqtt("dev@a", version, "sensor-8", true).await;
    assert_eq!(other.subscribe("commands/sensor-8/+", 1).await, 1);
    assert_eq!(other.subscribe("commands/sensor-7/+", 1).await, refused_sub);
    publish_acked(&alice, "commands.sensor-7.stop", "7").await;
    publish_acked(&alice, "commands.sensor-8.stop", "8").await;
    let got = other.next_publish().await;
    assert_eq!(
        (got.topic.as_str(), got.text().as_str()),
        ("commands/sensor-8/stop", "8")
    );
    assert_eq!(dev.next_publish().await.topic, "commands/sensor-7/stop");

    // Both connections are still usable after their refusals.
    assert_eq!(
        dev.publish("devices/dev/last", 1, false, "ok").await,
        Some(0)
    );
    assert_eq!(dev.next_publish().await.topic, "devices/dev/last");
    dev.quiet("nothing denied arrives").await;
    other.quiet("nothing denied arrives").await;
    if version == Version::V311 {
        let Handle::V4(client) = &dev.handle else {
            unreachable!("a 3.1.1 client")
        };
        client
            .publish(
                "devices/other/temp",
                rumqttc::QoS::AtLeastOnce,
                false,
                "denied",
            )
            .await
            .expect("publish queued");
        loop {
            let event = tokio::time::timeout(WAIT, dev.events.recv())
                .await
                .expect("the server closes the connection within the wait");
            match event {
                None | Some(Err(_)) => break,
                Some(Ok(Event::PubAck(code))) => panic!("a denied QoS 1 publish was acked: {code}"),
                Some(Ok(_)) => {}
            }
        }
    }
    f.stop().await;
}

#[tokio::test]
async fn mqtt_acls_refuse_and_keep_the_connection_v311() {
    mqtt_acls(Version::V311).await;
}

#[tokio::test]
async fn mqtt_acls_refuse_and_keep_the_connection_v5() {
    mqtt_acls(Version::V5).await;
}

#[tokio::test]
async fn ws_acls_refuse_with_forbidden_and_keep_the_socket() {
    let f = Fixture::start(&dev_and_alice()).await;
    let alice = f.native("alice@a").await;
    publish_acked(&alice, "devices.other.temp", "other's secret").await;
    publish_acked(&alice, "devices.dev.temp", "dev's").await;
    let (status_code, put) = api(
        &alice,
        "snapshot.put",
        json!({"subject": "devices.other.temp", "version": 1, "data": "other's snapshot"}),
    )
    .await;
    assert_eq!(status_code, 200, "{put}");

    let mut dev = f.ws("dev@a").await;
    let sub = dev
        .ok(json!({"op": "sub", "pattern": "devices.dev.>"}))
        .await;
    let sid = sub["sid"].clone();
    // Each refusal is followed by an allowed call on the same socket.
    let denied = [
        json!({"op": "pub", "subject": "devices.other.temp", "data": 1}),
        json!({"op": "pub", "subject": "commands.http.x", "data": 1}),
        json!({"op": "pub", "subject": "devices.dev", "data": 1}),
        json!({"op": "sub", "pattern": "devices.other.>"}),
        json!({"op": "sub", "pattern": ">"}),
        json!({"op": "sub", "pattern": "#"}),
        json!({"op": "sub", "pattern": "devices/+/temp"}),
        json!({"op": "sub", "pattern": "commands.sensor-7.>"}),
        json!({"op": "sub", "pattern": "devices.other.temp", "from_version": 1}),
        json!({"op": "sub", "pattern": "devices.other.temp", "from_snapshot": true}),
        json!({"op": "get", "subject": "devices.other.temp"}),
        json!({"op": "replay", "subject": "devices.other.temp"}),
        json!({"op": "replay", "pattern": "devices.>"}),
        json!({"op": "replay", "pattern": ">", "from_offset": 0}),
        json!({"op": "subjects"}),
        json!({"op": "subjects", "pattern": "devices.>"}),
        json!({"op": "snapshot.get", "subject": "devices.other.temp"}),
        json!({"op": "snapshot.put", "subject": "devices.other.temp", "version": 1, "data": 1}),
    ];
    for (n, request) in denied.into_iter().enumerate() {
        let refusal = dev.refused(request.clone(), "forbidden").await;
        let said = refusal.to_string();
        assert!(said.contains("Permissions Violation"), "{request}: {said}");
        for secret in ["other's secret", "b3RoZXIncyBzZWNyZXQ", "other's snapshot"] {
            assert!(!said.contains(secret), "{request}: {said}");
        }
        let stored = dev
            .ok(json!({"op": "pub", "subject": format!("devices.dev.n{n}"), "data": n}))
            .await;
        assert_eq!(stored["stored"], true, "{stored}");
        let msg = dev.next_event().await;
        assert_eq!(
            (&msg["op"], &msg["sid"], &msg["subject"]),
            (&json!("msg"), &sid, &json!(format!("devices.dev.n{n}"))),
            "after {request}"
        );
    }

    // Allowed reads and snapshots work.
    let got = dev
        .ok(json!({"op": "get", "subject": "devices.dev.temp"}))
        .await;
    assert_eq!(ws_text(&got), "dev's");
    let page = dev
        .ok(json!({"op": "replay", "subject": "devices.dev.temp"}))
        .await;
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(1), "{page}");
    let page = dev
        .ok(json!({"op": "replay", "pattern": "devices.dev.>"}))
        .await;
    assert!(
        page["messages"]
            .as_array()
            .is_some_and(|m| m.iter().all(|m| m["subject"]
                .as_str()
                .is_some_and(|s| s.starts_with("devices.dev.")))),
        "{page}"
    );
    let listed = dev
        .ok(json!({"op": "subjects", "pattern": "devices.dev.>"}))
        .await;
    assert!(
        listed["subjects"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["subject"] == "devices.dev.temp")),
        "{listed}"
    );
    dev.ok(
        json!({"op": "snapshot.put", "subject": "devices.dev.temp", "version": 1,
                  "data": {"t": 1}}),
    )
    .await;
    let snapshot = dev
        .ok(json!({"op": "snapshot.get", "subject": "devices.dev.temp"}))
        .await;
    assert_eq!(snapshot["data"], json!({"t": 1}), "{snapshot}");
    dev.ok(json!({"op": "sub", "pattern": "devices.dev.temp", "from_version": 1}))
        .await;
    let history = dev.next_event().await;
    assert_eq!(ws_text(&history), "dev's", "{history}");

    // Nothing denied was published: alice's `devices.other.temp` still has one version,
    // and devices.dev has no messages.
    let got = call(&alice, "get", json!({"subject": "devices.other.temp"})).await;
    assert_eq!(header_of(&got, "Canopy-Version"), Some("1"));
    let got = call(&alice, "get", json!({"subject": "devices.dev"})).await;
    assert_eq!(status(&got), 404);
    let got = call(&alice, "get", json!({"subject": "commands.http.x"})).await;
    assert_eq!(status(&got), 404);
    dev.quiet("nothing more").await;
    f.stop().await;
}
// An MQTT `#` filter also matches its parent level (`devices/dev/#` matches
// `devices/dev`) and overlaps every deny rule below its prefix: the ACL must judge it
// so, over MQTT and over /ws (which takes MQTT syntax too).
#[tokio::test]
async fn hash_filters_never_widen_an_acl() {
    let f = Fixture::start(&[
        (
            "a",
            "dev",
            Some(json!({"subscribe": {"allow": ["devices.{user}.>"]}})),
        ),
        (
            "a",
            "spy",
            Some(json!({"subscribe": {"allow": ["devices.>"], "deny": ["devices.*.secret"]}})),
        ),
        ("a", "alice", None),
    ])
    .await;
    let alice = f.native("alice@a").await;
    for version in [Version::V311, Version::V5] {
        let refused = if version == Version::V5 { 0x87 } else { 0x80 };
        let mut dev = f.mqtt("dev@a", version, "dev-1", true).await;
        let dev_code = dev.subscribe("devices/dev/#", 1).await;
        let mut spy = f.mqtt("spy@a", version, "spy-1", true).await;
        assert_eq!(spy.subscribe("devices/+/secret", 1).await, refused);
        assert_eq!(
            spy.subscribe("devices/#", 1).await,
            refused,
            "{version:?}: devices/# overlaps the deny rule devices.*.secret"
        );
        publish_acked(&alice, "devices.dev", "not dev's to read").await;
        publish_acked(&alice, "devices.x.secret", "the secret").await;
        publish_acked(&alice, "devices.dev.probe", "probe").await;
        if dev_code == refused {
            dev.quiet("refused").await;
        } else {
            let first = dev.next_publish().await;
            assert_eq!(
                first.topic, "devices/dev/probe",
                "{version:?}: devices/dev/# was granted (code {dev_code:#x}) and delivered {first:?}, \
                 outside the allow rule devices.dev.>"
            );
        }
        spy.quiet("nothing was granted").await;
    }
    let mut spy = f.ws("spy@a").await;
    for request in [
        json!({"op": "sub", "pattern": "devices/#"}),
        json!({"op": "sub", "pattern": "devices/#", "from_offset": 0}),
        json!({"op": "replay", "pattern": "devices/#"}),
        json!({"op": "subjects", "pattern": "devices/#"}),
    ] {
        spy.refused(request, "forbidden").await;
    }
    let mut dev = f.ws("dev@a").await;
    dev.refused(json!({"op": "get", "subject": "devices.dev"}), "forbidden")
        .await;
    let page = dev
        .call(json!({"op": "replay", "pattern": "devices/dev/#"}))
        .await;
    assert!(
        page["op"] == "error"
            || page["messages"]
                .as_array()
                .is_some_and(|m| m.iter().all(|m| m["subject"] != "devices.dev")),
        "replay of devices/dev/# shows devices.dev, which get refuses: {page}"
    );
    f.stop().await;
}
