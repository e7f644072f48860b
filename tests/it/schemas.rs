//! JSON Schemas bound to subject patterns, per tenant (issue 16): the
//! `$CANOPY.schema.*` API (put, get, list, history, delete, errors), the most
//! specific binding winning, every front end refusing an invalid payload in its own
//! protocol (NATS `-ERR` and error acks, MQTT 5 PUBACK 0x99, MQTT 3.1.1 ack-and-drop,
//! `/ws` `invalid_message`, the append API, wills), dead letters, the `Canopy-Schema`
//! header (stamped by the server, never the client's), the CLI, HTTP, a restart and
//! tenant isolation.
//!
//! "Not delivered" is shown by order, never by waiting: an invalid publish is followed
//! by a valid one on the same connection, and a subscriber's first message must be
//! the valid one; "not stored" by replaying the subject.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::common::{
    Stored, WAIT, api, file_config, header, header_of, http_request, js_publish_to_tenant,
    publish_acked, replay_subject, replay_texts, start, start_default, store_request, test_config,
};
use crate::frontends::{Native, NativeEvent, Ws, WsEvent, pub_frame};
use crate::logins::Logins;
use crate::mqtt::mqtt_addr;

const BIN: &str = env!("CARGO_BIN_EXE_canopy");

/// The schema most tests bind to `devices.*.temp`.
fn temp_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"temp": {"type": "number"}},
        "required": ["temp"]
    })
}

const WARM: &str = r#"{"temp":21.5}"#;
const HOT: &str = r#"{"temp":"hot"}"#;
/// What `HOT` breaks in version 1 of `devices.*.temp`.
const HOT_WHY: &str = "the message does not match schema devices.*.temp@1 at /temp: \"hot\" is not of type \"number\"";

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connect")
}

/// Calls `$CANOPY.schema.<op>`: the status and the answer.
async fn schema(client: &async_nats::Client, op: &str, body: Value) -> (u16, Value) {
    api(client, &format!("schema.{op}"), body).await
}

/// Puts a binding and panics unless it was taken.
async fn put(client: &async_nats::Client, body: Value) -> Value {
    let (status, answer) = schema(client, "put", body.clone()).await;
    assert_eq!(status, 200, "schema.put {body}: {answer}");
    answer
}

pub(crate) async fn bind(client: &async_nats::Client, pattern: &str, schema: Value) -> Value {
    put(client, json!({"pattern": pattern, "schema": schema})).await
}

/// `$CANOPY.schema.errors` for `body`.
async fn errors(client: &async_nats::Client, body: Value) -> Value {
    let (status, answer) = schema(client, "errors", body).await;
    assert_eq!(status, 200, "schema.errors: {answer}");
    answer
}

/// The subjects of the recent errors, oldest first.
fn error_subjects(answer: &Value) -> Vec<String> {
    answer["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("`errors` is a list: {answer}"))
        .iter()
        .map(|e| e["subject"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Waits until `schema.errors` names `subject` (a refusal the server made after the
/// test's last action, such as a will): bounded by the wait, never a fixed sleep.
async fn await_error_for(client: &async_nats::Client, subject: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = errors(client, json!({"subject": subject})).await;
        if !error_subjects(&answer).is_empty() {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no schema error for {subject} within the wait: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every value of header `name` a stored message carries.
fn header_values(stored: &Stored, name: &str) -> Vec<String> {
    stored
        .headers
        .as_ref()
        .map(|h| h.get_all(name).map(|v| v.as_str().to_owned()).collect())
        .unwrap_or_default()
}

fn message_header_values(message: &async_nats::Message, name: &str) -> Vec<String> {
    message
        .headers
        .as_ref()
        .map(|h| h.get_all(name).map(|v| v.as_str().to_owned()).collect())
        .unwrap_or_default()
}

pub(crate) async fn next_message(
    sub: &mut async_nats::Subscriber,
    what: &str,
) -> async_nats::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what} within the wait"))
        .expect("subscription open")
}

/// A native subscriber of `pattern`, in place when this returns.
pub(crate) async fn watch(client: &async_nats::Client, pattern: &str) -> async_nats::Subscriber {
    let sub = client
        .subscribe(pattern.to_owned())
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    sub
}

// ---------------------------------------------------------------------------------
// rumqttc clients whose event loops run in tasks (aborting one drops the socket
// without DISCONNECT, which is how a will is set off).

pub(crate) mod v5 {
    use super::*;
    use rumqttc::Outgoing;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, LastWill, Packet, PubAck};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    pub struct Client {
        client: AsyncClient,
        events: mpsc::UnboundedReceiver<Result<Event, String>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, id: &str, will: Option<(&str, &str)>) -> Client {
            let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
            options.set_keep_alive(Duration::from_secs(30));
            if let Some((topic, payload)) = will {
                options.set_last_will(LastWill::new(
                    topic,
                    payload.as_bytes().to_vec(),
                    QoS::AtLeastOnce,
                    false,
                    None,
                ));
            }
            let (client, mut eventloop) = AsyncClient::new(options, 64);
            let (tx, events) = mpsc::unbounded_channel();
            let task = tokio::spawn(async move {
                loop {
                    let event = eventloop.poll().await.map_err(|e| e.to_string());
                    let failed = event.is_err();
                    if tx.send(event).is_err() || failed {
                        return;
                    }
                }
            });
            let mut client = Client {
                client,
                events,
                task,
            };
            let event = client
                .wait_for("CONNACK", |e| {
                    matches!(e, Event::Incoming(Packet::ConnAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::ConnAck(ack)) = event {
                assert_eq!(ack.code, ConnectReturnCode::Success, "{ack:?}");
            }
            client
        }

        async fn wait_for(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
            loop {
                let event = tokio::time::timeout(WAIT, self.events.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {what} within the wait"))
                    .unwrap_or_else(|| panic!("event loop ended while waiting for {what}"))
                    .unwrap_or_else(|e| panic!("connection error while waiting for {what}: {e}"));
                if matches(&event) {
                    return event;
                }
            }
        }

        /// A QoS 1 publish and its PUBACK, whatever its reason.
        pub async fn publish_qos1(&mut self, topic: &str, payload: &str) -> PubAck {
            self.client
                .publish(topic, QoS::AtLeastOnce, false, payload.as_bytes().to_vec())
                .await
                .expect("publish");
            match self
                .wait_for("PUBACK", |e| {
                    matches!(e, Event::Incoming(Packet::PubAck(_)))
                })
                .await
            {
                Event::Incoming(Packet::PubAck(ack)) => ack,
                other => unreachable!("{other:?}"),
            }
        }

        /// A QoS 0 publish, once written out.
        pub async fn publish_qos0(&mut self, topic: &str, payload: &str) {
            self.client
                .publish(topic, QoS::AtMostOnce, false, payload.as_bytes().to_vec())
                .await
                .expect("publish");
            self.wait_for("the QoS 0 publish written", |e| {
                matches!(e, Event::Outgoing(Outgoing::Publish(_)))
            })
            .await;
        }

        /// Ends the connection without DISCONNECT (the socket is dropped).
        pub fn vanish(self) {
            self.task.abort();
        }
    }
}

pub(crate) mod v4 {
    use super::*;
    use rumqttc::{AsyncClient, ConnectReturnCode, Event, LastWill, MqttOptions, Packet, QoS};

    pub struct Client {
        client: AsyncClient,
        events: mpsc::UnboundedReceiver<Result<Event, String>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Client {
        pub async fn connect(addr: SocketAddr, id: &str, will: Option<(&str, &str)>) -> Client {
            let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
            options.set_keep_alive(Duration::from_secs(30));
            if let Some((topic, payload)) = will {
                options.set_last_will(LastWill::new(
                    topic,
                    payload.as_bytes().to_vec(),
                    QoS::AtLeastOnce,
                    false,
                ));
            }
            let (client, mut eventloop) = AsyncClient::new(options, 64);
            let (tx, events) = mpsc::unbounded_channel();
            let task = tokio::spawn(async move {
                loop {
                    let event = eventloop.poll().await.map_err(|e| e.to_string());
                    let failed = event.is_err();
                    if tx.send(event).is_err() || failed {
                        return;
                    }
                }
            });
            let mut client = Client {
                client,
                events,
                task,
            };
            let event = client
                .wait_for("CONNACK", |e| {
                    matches!(e, Event::Incoming(Packet::ConnAck(_)))
                })
                .await;
            if let Event::Incoming(Packet::ConnAck(ack)) = event {
                assert_eq!(ack.code, ConnectReturnCode::Success, "{ack:?}");
            }
            client
        }

        async fn wait_for(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
            loop {
                let event = tokio::time::timeout(WAIT, self.events.recv())
                    .await
                    .unwrap_or_else(|_| panic!("no {what} within the wait"))
                    .unwrap_or_else(|| panic!("event loop ended while waiting for {what}"))
                    .unwrap_or_else(|e| panic!("connection error while waiting for {what}: {e}"));
                if matches(&event) {
                    return event;
                }
            }
        }

        /// A QoS 1 publish; returns once its PUBACK came (3.1.1 has no reason code).
        pub async fn publish_qos1(&mut self, topic: &str, payload: &str) {
            self.client
                .publish(topic, QoS::AtLeastOnce, false, payload.as_bytes().to_vec())
                .await
                .expect("publish");
            self.wait_for("PUBACK", |e| {
                matches!(e, Event::Incoming(Packet::PubAck(_)))
            })
            .await;
        }

        pub fn vanish(self) {
            self.task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------
// The API

/// put → unchanged → a compatible version → a breaking one refused → get (current,
/// by version) → list → history → delete → history shows the deletion → a new
/// lineage starts after it, held only to itself.
#[tokio::test]
async fn a_binding_is_put_read_listed_versioned_and_deleted() {
    let server = start_default().await;
    let client = connect(&server).await;
    let pattern = "devices.*.temp";

    let first = bind(&client, pattern, temp_schema()).await;
    assert_eq!(first["pattern"], pattern, "{first}");
    assert_eq!(first["version"], 1, "{first}");
    assert_eq!(first["mode"], "backward", "the default mode: {first}");
    assert_eq!(first["on_invalid"], "reject", "{first}");
    assert_eq!(first["dead_letter"], "$DLQ.schema", "{first}");
    assert_eq!(first["schema"], temp_schema(), "{first}");
    assert!(first["time_ms"].as_u64().is_some_and(|t| t > 0), "{first}");
    assert!(first.get("unchanged").is_none(), "{first}");

    let again = bind(&client, pattern, temp_schema()).await;
    assert_eq!(again["version"], 1, "an identical put: {again}");
    assert_eq!(again["unchanged"], true, "{again}");

    // Widening `temp` takes everything version 1 took.
    let wider = json!({
        "type": "object",
        "properties": {"temp": {"type": ["number", "null"]}},
        "required": ["temp"]
    });
    let second = bind(&client, pattern, wider.clone()).await;
    assert_eq!(second["version"], 2, "{second}");
    assert!(second.get("unchanged").is_none(), "{second}");

    // A newly required property refuses what version 2 took.
    let stricter = json!({
        "type": "object",
        "properties": {"temp": {"type": ["number", "null"]}, "unit": {"type": "string"}},
        "required": ["temp", "unit"]
    });
    let (status, refused) = schema(
        &client,
        "put",
        json!({"pattern": pattern, "schema": stricter}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], 409, "{refused}");
    let description = refused["error"]["description"].as_str().unwrap_or_default();
    assert!(
        description.starts_with("version 3 of devices.*.temp breaks its backward compatibility: "),
        "{refused}"
    );

    // The refused version left nothing behind.
    let (status, current) = schema(&client, "get", json!({"pattern": pattern})).await;
    assert_eq!(status, 200, "{current}");
    assert_eq!(
        (current["version"].clone(), current["schema"].clone()),
        (json!(2), wider.clone())
    );
    let (status, old) = schema(&client, "get", json!({"pattern": pattern, "version": 1})).await;
    assert_eq!(status, 200, "{old}");
    assert_eq!(
        (old["version"].clone(), old["schema"].clone()),
        (json!(1), temp_schema())
    );
    let (status, missing) = schema(&client, "get", json!({"pattern": pattern, "version": 7})).await;
    assert_eq!(status, 404, "{missing}");
    let (status, by_subject) = schema(&client, "get", json!({"subject": "devices.d1.temp"})).await;
    assert_eq!(status, 200, "{by_subject}");
    assert_eq!(
        (by_subject["pattern"].clone(), by_subject["version"].clone()),
        (json!(pattern), json!(2))
    );

    bind(&client, "events.>", json!({"type": "object"})).await;
    let (status, list) = schema(&client, "list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    let listed = list["schemas"].as_array().expect("schemas");
    let patterns: Vec<&str> = listed
        .iter()
        .filter_map(|b| b["pattern"].as_str())
        .collect();
    assert_eq!(patterns.len(), 2, "{list}");
    assert!(
        patterns.contains(&pattern) && patterns.contains(&"events.>"),
        "{list}"
    );
    for binding in listed {
        assert!(
            binding.get("schema").is_none(),
            "no schema in a list: {list}"
        );
        assert!(binding["version"].is_u64() && binding["mode"].is_string());
    }

    let (status, history) = schema(&client, "history", json!({"pattern": pattern})).await;
    assert_eq!(status, 200, "{history}");
    assert_eq!(history["pattern"], pattern);
    let versions: Vec<u64> = history["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| v["version"].as_u64())
        .collect();
    assert_eq!(versions, [1, 2], "{history}");
    assert_eq!(history["versions"][0]["schema"], temp_schema());

    let (status, deleted) = schema(&client, "delete", json!({"pattern": pattern})).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        deleted,
        json!({"pattern": pattern, "deleted": true, "version": 3})
    );
    let (status, gone) = schema(&client, "get", json!({"pattern": pattern})).await;
    assert_eq!(status, 404, "{gone}");
    let (status, gone) = schema(&client, "get", json!({"subject": "devices.d1.temp"})).await;
    assert_eq!(status, 404, "{gone}");
    let (status, again) = schema(&client, "delete", json!({"pattern": pattern})).await;
    assert_eq!(status, 404, "a second delete: {again}");
    let (_, list) = schema(&client, "list", json!({})).await;
    assert_eq!(list["schemas"].as_array().map(Vec::len), Some(1), "{list}");
    let (_, history) = schema(&client, "history", json!({"pattern": pattern})).await;
    let last = &history["versions"][2];
    assert_eq!(last["version"], 3, "{history}");
    assert_eq!(last["deleted"], true, "{history}");
    assert!(last.get("schema").is_none(), "{history}");

    // Unbound, the subject takes anything again.
    publish_acked(&client, "devices.d1.temp", "not even JSON").await;

    // A new lineage: held to nothing before the deletion, numbered on.
    let fourth = bind(&client, pattern, stricter).await;
    assert_eq!(fourth["version"], 4, "{fourth}");
    let (status, refused) = schema(
        &client,
        "put",
        json!({"pattern": pattern, "schema": temp_schema()}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    let description = refused["error"]["description"].as_str().unwrap_or_default();
    assert!(
        description.starts_with("version 5 of devices.*.temp breaks its backward compatibility: "),
        "{refused}"
    );
    // Mode `none` lets any change through.
    let fifth = put(
        &client,
        json!({"pattern": pattern, "schema": temp_schema(), "mode": "none"}),
    )
    .await;
    assert_eq!(
        (fifth["version"].clone(), fifth["mode"].clone()),
        (json!(5), json!("none"))
    );
    // The breakage named the real versions, not their places in the lineage.
    assert!(
        description.contains("version 5 would refuse what version 4 accepts"),
        "the compatibility message names versions that do not exist: {refused}"
    );
    server.stop().await;
}

/// What cannot be bound: not a schema, an invalid one, an external `$ref` (anywhere
/// in the document), a bad pattern, mode or prefix; and the same for a second
/// version, whose compatibility check must not hide that the schema is invalid.
#[tokio::test]
async fn invalid_schemas_external_refs_and_bad_options_are_refused() {
    let server = start_default().await;
    let client = connect(&server).await;
    let refused = [
        json!({"pattern": "a.*", "schema": "a string"}),
        json!({"pattern": "a.*", "schema": {"type": 12}}),
        json!({"pattern": "a.*", "schema": {"minimum": "zero"}}),
        json!({"pattern": "a.*", "schema": {"$ref": "https://example.com/s.json"}}),
        json!({"pattern": "a.*", "schema": {"properties": {"x": {"$ref": "other.json#/x"}}}}),
        json!({"pattern": "a..b", "schema": {}}),
        json!({"pattern": "a.*", "schema": {}, "mode": "sideways"}),
        json!({"pattern": "a.*", "schema": {}, "on_invalid": "ignore"}),
        json!({"pattern": "a.*", "schema": {}, "dead_letter": "bad..prefix"}),
        json!({"pattern": "a.*", "schema": {}, "colour": "red"}),
    ];
    for body in refused {
        let (status, answer) = schema(&client, "put", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], 400, "{body}: {answer}");
        assert!(
            answer["error"]["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{answer}"
        );
    }
    let (status, answer) = schema(
        &client,
        "put",
        json!({"pattern": "a.*", "schema": {"$ref": "https://example.com/s.json"}}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        answer["error"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("https://example.com/s.json")),
        "the refusal names the reference: {answer}"
    );
    let (status, list) = schema(&client, "list", json!({})).await;
    assert_eq!(
        (status, list),
        (200, json!({"schemas": []})),
        "nothing was bound"
    );

    // References inside the document are fine.
    let local = json!({
        "$defs": {"celsius": {"type": "number"}},
        "type": "object",
        "properties": {"temp": {"$ref": "#/$defs/celsius"}}
    });
    let bound = bind(&client, "local.*", local).await;
    assert_eq!(bound["version"], 1);
    let (status, answer) = schema(&client, "errors", json!({})).await;
    assert_eq!(
        (status, answer["refused"].clone()),
        (200, json!(0)),
        "{answer}"
    );

    // A second version that is no schema at all is a bad request, not a conflict.
    bind(&client, "b.*", json!({"type": "object"})).await;
    let mut answers = Vec::new();
    for schema_json in [
        json!({"type": 12}),
        json!({"$ref": "https://example.com/s.json"}),
    ] {
        let (status, answer) = schema(
            &client,
            "put",
            json!({"pattern": "b.*", "schema": schema_json}),
        )
        .await;
        answers.push((status, schema_json, answer));
    }
    let (_, history) = schema(&client, "history", json!({"pattern": "b.*"})).await;
    assert_eq!(
        history["versions"].as_array().map(Vec::len),
        Some(1),
        "{history}"
    );
    assert!(
        answers.iter().all(|(status, ..)| *status == 400),
        "an invalid second version must be refused as invalid (400), not as a \
         compatibility conflict: {answers:#?}"
    );
    server.stop().await;
}

/// For one subject, the most specific matching binding decides, token by token from
/// the left (literal over `*` over `>`), both in `schema.get` and in what a publish is
/// held to and stamped with.
#[tokio::test]
async fn the_most_specific_binding_decides() {
    let server = start_default().await;
    let client = connect(&server).await;
    // Each schema takes only documents naming its own pattern.
    let own = |pattern: &str| json!({"type": "object", "properties": {"by": {"const": pattern}}, "required": ["by"]});
    let patterns = [
        "devices.>",
        "devices.*.temp",
        "devices.d1.>",
        "devices.d1.temp",
        "*.d1.temp",
        "x.*.z",
        "*.y.z",
        "x.y.>",
    ];
    for pattern in patterns {
        bind(&client, pattern, own(pattern)).await;
    }
    let cases = [
        ("devices.d1.temp", Some("devices.d1.temp")),
        ("devices.d1.hum", Some("devices.d1.>")),
        ("devices.d1.temp.raw", Some("devices.d1.>")),
        ("devices.d2.temp", Some("devices.*.temp")),
        ("devices.d2.hum", Some("devices.>")),
        ("rooms.d1.temp", Some("*.d1.temp")),
        // The first token decides: `x` over `*`.
        ("x.q.z", Some("x.*.z")),
        // The second: `y` over `*`, though `x.y.>` ends in a wildcard.
        ("x.y.z", Some("x.y.>")),
        ("w.y.z", Some("*.y.z")),
        ("elsewhere.d1", None),
    ];
    for (subject, want) in cases {
        let (status, answer) = schema(&client, "get", json!({"subject": subject})).await;
        match want {
            Some(pattern) => {
                assert_eq!(status, 200, "{subject}: {answer}");
                assert_eq!(answer["pattern"], pattern, "the binding for {subject}");
                assert_eq!(answer["schema"], own(pattern), "{subject}");
            }
            None => assert_eq!(status, 404, "{subject}: {answer}"),
        }
    }
    for (subject, want) in cases {
        let Some(pattern) = want else { continue };
        // A document for a less specific binding that also matches is refused.
        let wrong = json!({"by": "devices.>"}).to_string();
        let ack = store_request(
            &client,
            subject,
            header("Canopy-Ack", "durable"),
            wrong.clone(),
        )
        .await;
        if pattern != "devices.>" {
            assert_eq!(
                ack["error"]["code"], 400,
                "{subject} held to {pattern}: {ack}"
            );
            let why = ack["error"]["description"].as_str().unwrap_or_default();
            assert!(
                why.contains(&format!("schema {pattern}@1")),
                "{subject}: {ack}"
            );
        }
        let right = json!({"by": pattern}).to_string();
        publish_acked(&client, subject, right.clone()).await;
        let stored = replay_subject(&client, subject).await;
        let last = stored.last().expect("stored");
        assert_eq!(last.text(), right);
        assert_eq!(
            header_values(last, "Canopy-Schema"),
            [format!("{pattern}@1")],
            "{subject}"
        );
    }

    // Deleting the most specific hands its subjects to the next one.
    schema(&client, "delete", json!({"pattern": "devices.d1.temp"})).await;
    schema(&client, "delete", json!({"pattern": "devices.d1.>"})).await;
    let (_, answer) = schema(&client, "get", json!({"subject": "devices.d1.temp"})).await;
    assert_eq!(
        answer["pattern"], "devices.*.temp",
        "`devices` beats `*`: {answer}"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// Refusals, front end by front end

/// Native PUB: `-ERR 'Permissions Violation for Publish to "<subject>": …'` (the one
/// `-ERR` NATS clients survive) and the connection goes on; a publish
/// that waits for the store (JetStream, `Canopy-Ack`) gets an error ack instead.
/// Nothing invalid is stored or delivered, and `schema.errors` has each.
#[tokio::test]
async fn nats_publishes_are_refused_with_err_or_an_error_ack() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;

    let mut native = Native::connect(server.native_addr, None)
        .await
        .expect("native connects");
    native
        .subscribe("devices.>", "watch")
        .await
        .expect("subscribe");
    native
        .send(&pub_frame("devices.d1.temp", None, None, HOT.as_bytes()))
        .await;
    match native.next().await {
        Some(NativeEvent::Err(text)) => assert_eq!(
            text,
            format!("Permissions Violation for Publish to \"devices.d1.temp\": {HOT_WHY}")
        ),
        other => panic!("expected -ERR for an invalid payload, got {other:?}"),
    }
    native
        .flush()
        .await
        .expect("the connection stays open after the refusal");
    // Not JSON at all; and a quote in the value does not break the -ERR line.
    native
        .send(&pub_frame("devices.d1.temp", None, None, b"hot"))
        .await;
    match native.next().await {
        Some(NativeEvent::Err(text)) => assert!(
            text.starts_with(
                "Permissions Violation for Publish to \"devices.d1.temp\": the message does not \
                 match schema devices.*.temp@1 at /: the payload is not JSON"
            ),
            "{text}"
        ),
        other => panic!("expected -ERR for a payload that is not JSON, got {other:?}"),
    }
    native
        .send(&pub_frame(
            "devices.d1.temp",
            None,
            None,
            br#"{"temp":"it's"}"#,
        ))
        .await;
    match native.next().await {
        Some(NativeEvent::Err(text)) => {
            assert!(!text.contains('\''), "{text}");
            assert!(text.contains("at /temp: "), "{text}");
        }
        other => panic!("expected -ERR, got {other:?}"),
    }
    native.flush().await.expect("still open");
    native
        .send(&pub_frame("devices.d1.temp", None, None, WARM.as_bytes()))
        .await;
    match native.next().await {
        Some(NativeEvent::Msg(m)) => {
            assert_eq!(m.sid, "watch");
            assert_eq!(
                m.payload,
                WARM.as_bytes(),
                "the first delivery is the valid one"
            );
            assert_eq!(
                m.header("Canopy-Schema").as_deref(),
                Some("devices.*.temp@1")
            );
        }
        other => panic!("expected the valid message, got {other:?}"),
    }

    // JetStream's publish: an error ack, which async-nats returns as an error.
    let js = async_nats::jetstream::new(client.clone());
    let failed = js_publish_to_tenant(&js, "default", "devices.d2.temp", HOT).await;
    let error = failed.expect_err("an invalid JetStream publish is refused");
    assert!(
        error.to_string().contains(HOT_WHY),
        "the error ack says why: {error}"
    );
    let ack = js_publish_to_tenant(&js, "default", "devices.d2.temp", WARM)
        .await
        .expect("a valid JetStream publish is acked");
    assert_eq!(ack.stream, "default");

    // Canopy-Ack: the error ack's JSON.
    let answer = store_request(
        &client,
        "devices.d3.temp",
        header("Canopy-Ack", "durable"),
        HOT,
    )
    .await;
    assert_eq!(answer["error"]["code"], 400, "{answer}");
    assert_eq!(answer["error"]["description"], HOT_WHY, "{answer}");
    assert_eq!(answer["stream"], "default", "{answer}");

    for subject in ["devices.d1.temp", "devices.d2.temp"] {
        assert_eq!(replay_texts(&client, subject).await, [WARM], "{subject}");
    }
    assert!(replay_subject(&client, "devices.d3.temp").await.is_empty());

    let seen = errors(&client, json!({})).await;
    assert_eq!(
        error_subjects(&seen),
        [
            "devices.d1.temp",
            "devices.d1.temp",
            "devices.d1.temp",
            "devices.d2.temp",
            "devices.d3.temp"
        ],
        "{seen}"
    );
    assert_eq!(seen["refused"], 5, "{seen}");
    assert_eq!(seen["dead_lettered"], 0, "{seen}");
    let first = &seen["errors"][0];
    assert_eq!(first["schema"], "devices.*.temp@1", "{seen}");
    assert_eq!(first["path"], "/temp", "{seen}");
    assert_eq!(
        first["message"], "\"hot\" is not of type \"number\"",
        "{seen}"
    );
    assert_eq!(first["dead_lettered"], false, "{seen}");
    assert!(first["time_ms"].as_u64().is_some_and(|t| t > 0), "{seen}");
    let only = errors(&client, json!({"subject": "devices.d2.temp"})).await;
    assert_eq!(error_subjects(&only), ["devices.d2.temp"], "{only}");
    let by_pattern = errors(&client, json!({"pattern": "devices.d3.*"})).await;
    assert_eq!(
        error_subjects(&by_pattern),
        ["devices.d3.temp"],
        "{by_pattern}"
    );
    server.stop().await;
}

/// MQTT 5: QoS 1 gets PUBACK 0x99 (Payload format invalid) with a reason string,
/// QoS 0 is dropped, and the connection goes on.
#[tokio::test]
async fn mqtt5_refuses_with_payload_format_invalid() {
    use rumqttc::v5::mqttbytes::v5::PubAckReason;
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    let mut sub = watch(&client, "devices.>").await;

    let mut mqtt = v5::Client::connect(mqtt_addr(&server), "schemas-v5", None).await;
    let ack = mqtt.publish_qos1("devices/d1/temp", HOT).await;
    assert_eq!(ack.reason, PubAckReason::PayloadFormatInvalid, "{ack:?}");
    let reason = ack
        .properties
        .as_ref()
        .and_then(|p| p.reason_string.clone())
        .unwrap_or_default();
    assert!(
        reason.contains(HOT_WHY),
        "the reason string says why: {ack:?}"
    );
    mqtt.publish_qos0("devices/d1/temp", HOT).await;
    let ack = mqtt.publish_qos1("devices/d1/temp", WARM).await;
    assert_eq!(ack.reason, PubAckReason::Success, "{ack:?}");

    let first = next_message(&mut sub, "the valid publish").await;
    assert_eq!(first.subject.as_str(), "devices.d1.temp");
    assert_eq!(
        &first.payload[..],
        WARM.as_bytes(),
        "nothing invalid came first"
    );
    assert_eq!(header_of(&first, "Canopy-Schema"), Some("devices.*.temp@1"));
    assert_eq!(replay_texts(&client, "devices.d1.temp").await, [WARM]);
    let seen = errors(&client, json!({})).await;
    assert_eq!(seen["refused"], 2, "QoS 1 and QoS 0: {seen}");
    mqtt.vanish();
    server.stop().await;
}

/// MQTT 3.1.1 cannot refuse: the invalid QoS 1 publish is acknowledged and dropped
/// (not stored, not delivered, shown in `schema.errors`) and the connection stays up.
#[tokio::test]
async fn mqtt311_acknowledges_and_drops_an_invalid_publish() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    let mut sub = watch(&client, "devices.>").await;

    let mut mqtt = v4::Client::connect(mqtt_addr(&server), "schemas-v4", None).await;
    mqtt.publish_qos1("devices/d1/temp", HOT).await;
    mqtt.publish_qos1("devices/d1/temp", WARM).await;

    let first = next_message(&mut sub, "the valid publish").await;
    assert_eq!(
        &first.payload[..],
        WARM.as_bytes(),
        "the invalid one was dropped"
    );
    assert_eq!(replay_texts(&client, "devices.d1.temp").await, [WARM]);
    let seen = errors(&client, json!({"subject": "devices.d1.temp"})).await;
    assert_eq!(error_subjects(&seen), ["devices.d1.temp"], "{seen}");
    assert_eq!(seen["errors"][0]["dead_lettered"], false, "{seen}");
    assert_eq!(seen["refused"], 1, "{seen}");
    mqtt.vanish();
    server.stop().await;
}

/// `/ws`: an `invalid_message` error (with `data` and with `data_b64`), and the
/// socket goes on.
#[tokio::test]
async fn ws_refuses_with_invalid_message() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    let mut sub = watch(&client, "devices.>").await;

    let mut ws = Ws::open(server.http_addr.expect("http"), None)
        .await
        .expect("/ws opens");
    for request in [
        json!({"op": "pub", "subject": "devices.d1.temp", "data": {"temp": "hot"}}),
        json!({"op": "pub", "subject": "devices.d1.temp",
               "data_b64": crate::frontends::b64(HOT.as_bytes())}),
    ] {
        match ws.call(request.clone()).await {
            Some(WsEvent::Text(answer)) => {
                assert_eq!(answer["op"], "error", "{request}: {answer}");
                assert_eq!(answer["code"], "invalid_message", "{answer}");
                assert!(
                    answer["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(HOT_WHY)),
                    "{answer}"
                );
            }
            other => panic!("{request}: expected an error, got {other:?}"),
        }
    }
    match ws
        .call(json!({"op": "pub", "subject": "devices.d1.temp", "data": {"temp": 21.5}}))
        .await
    {
        Some(WsEvent::Text(answer)) => {
            assert_eq!(answer["op"], "ok", "{answer}");
            assert_eq!(answer["stored"], true, "{answer}");
        }
        other => panic!("expected ok, got {other:?}"),
    }
    let first = next_message(&mut sub, "the valid publish").await;
    assert_eq!(&first.payload[..], WARM.as_bytes());
    assert_eq!(replay_texts(&client, "devices.d1.temp").await, [WARM]);
    assert_eq!(errors(&client, json!({})).await["refused"], 2);
    server.stop().await;
}

/// A will whose payload its topic's schema refuses is not published (on MQTT 5 and
/// 3.1.1); a valid will on the same pattern is.
#[tokio::test]
async fn a_will_its_schema_refuses_is_not_published() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "wills.*", temp_schema()).await;
    let mut sub = watch(&client, "wills.>").await;
    let addr = mqtt_addr(&server);

    let bad5 = v5::Client::connect(addr, "will-bad-5", Some(("wills/bad5", HOT))).await;
    let bad4 = v4::Client::connect(addr, "will-bad-4", Some(("wills/bad4", HOT))).await;
    let good = v4::Client::connect(addr, "will-good", Some(("wills/good", WARM))).await;
    bad5.vanish();
    bad4.vanish();
    for subject in ["wills.bad5", "wills.bad4"] {
        let seen = await_error_for(&client, subject).await;
        assert_eq!(seen["errors"][0]["schema"], "wills.*@1", "{seen}");
    }
    good.vanish();
    let first = next_message(&mut sub, "the valid will").await;
    assert_eq!(
        first.subject.as_str(),
        "wills.good",
        "the refused wills came first"
    );
    assert_eq!(&first.payload[..], WARM.as_bytes());
    for subject in ["wills.bad5", "wills.bad4"] {
        assert!(
            replay_subject(&client, subject).await.is_empty(),
            "{subject} was stored"
        );
    }
    server.stop().await;
}

/// `$CANOPY.append` checks every message: one invalid message fails the whole append;
/// a valid append is stamped, a client's own `Canopy-Schema` replaced.
#[tokio::test]
async fn an_append_with_an_invalid_message_appends_nothing() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    let (status, answer) = api(
        &client,
        "append",
        json!({"subject": "devices.d1.temp", "messages": [{"data": WARM}, {"data": HOT}]}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["description"],
        format!(
            "message 1 does not match schema devices.*.temp@1 at /temp: \"hot\" is not of type \
             \"number\"; nothing was appended"
        ),
        "{answer}"
    );
    assert!(replay_subject(&client, "devices.d1.temp").await.is_empty());
    assert_eq!(
        error_subjects(&errors(&client, json!({})).await),
        ["devices.d1.temp"]
    );

    let (status, answer) = api(
        &client,
        "append",
        json!({"subject": "devices.d1.temp", "messages": [
            {"data": WARM, "headers": {"Canopy-Schema": "forged@9", "X-Kept": "yes"}},
            {"data": r#"{"temp":3}"#},
        ]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["count"], 2, "{answer}");
    let stored = replay_subject(&client, "devices.d1.temp").await;
    assert_eq!(stored.len(), 2);
    for message in &stored {
        assert_eq!(
            header_values(message, "Canopy-Schema"),
            ["devices.*.temp@1"],
            "{message:?}"
        );
    }
    assert_eq!(header_values(&stored[0], "X-Kept"), ["yes"]);
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// Dead letters and headers

/// `on_invalid: dead_letter`: the invalid message is stored under
/// `$DLQ.schema.<subject>` (or the binding's own prefix) with why, acknowledged as
/// its own subject would have been; nothing reaches the subject itself.
#[tokio::test]
async fn invalid_messages_become_dead_letters() {
    let server = start_default().await;
    let client = connect(&server).await;
    let bound = put(
        &client,
        json!({"pattern": "orders.*", "schema": temp_schema(), "on_invalid": "dead_letter"}),
    )
    .await;
    assert_eq!(
        (bound["on_invalid"].clone(), bound["dead_letter"].clone()),
        (json!("dead_letter"), json!("$DLQ.schema"))
    );
    let bound = put(
        &client,
        json!({"pattern": "events.*", "schema": temp_schema(),
               "on_invalid": "dead_letter", "dead_letter": "quarantine"}),
    )
    .await;
    assert_eq!(bound["dead_letter"], "quarantine", "{bound}");
    let mut sub = watch(&client, "orders.>").await;

    // Asked for an ack: acked, as a valid message would be.
    let mut headers = header("Canopy-Ack", "durable");
    headers.insert("X-Trace", "t-1");
    headers.insert("Canopy-Schema", "forged@9");
    let ack = store_request(&client, "orders.1", headers, HOT).await;
    assert!(ack.get("error").is_none(), "a dead letter is acked: {ack}");
    // No ack asked: no -ERR either (shown by the flush and the valid publish after).
    let mut native = Native::connect(server.native_addr, None)
        .await
        .expect("native connects");
    native
        .send(&pub_frame("events.1", None, None, b"not json"))
        .await;
    native
        .flush()
        .await
        .expect("a dead-lettered publish is not refused");
    // /ws: ok.
    let mut ws = Ws::open(server.http_addr.expect("http"), None)
        .await
        .expect("/ws opens");
    match ws
        .call(json!({"op": "pub", "subject": "orders.2", "data": {"temp": "hot"}}))
        .await
    {
        Some(WsEvent::Text(answer)) => assert_eq!(answer["op"], "ok", "{answer}"),
        other => panic!("expected ok, got {other:?}"),
    }
    publish_acked(&client, "orders.1", WARM).await;
    let first = next_message(&mut sub, "the valid publish").await;
    assert_eq!(
        (first.subject.as_str(), &first.payload[..]),
        ("orders.1", WARM.as_bytes()),
        "a dead letter reached the subject's subscribers"
    );

    assert_eq!(replay_texts(&client, "orders.1").await, [WARM]);
    assert!(replay_subject(&client, "orders.2").await.is_empty());
    assert!(replay_subject(&client, "events.1").await.is_empty());
    let dead = replay_subject(&client, "$DLQ.schema.orders.1").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let letter = &dead[0];
    assert_eq!(letter.text(), HOT);
    assert_eq!(header_values(letter, "Canopy-Schema"), ["orders.*@1"]);
    assert_eq!(header_values(letter, "Canopy-Dead-Subject"), ["orders.1"]);
    assert_eq!(
        header_values(letter, "Canopy-Dead-Reason"),
        ["schema: /temp: \"hot\" is not of type \"number\""]
    );
    assert_eq!(
        header_values(letter, "X-Trace"),
        ["t-1"],
        "its own headers stay"
    );
    let dead = replay_subject(&client, "$DLQ.schema.orders.2").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let dead = replay_subject(&client, "quarantine.events.1").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].text(), "not json");
    assert_eq!(header_values(&dead[0], "Canopy-Dead-Subject"), ["events.1"]);
    let reason = header_values(&dead[0], "Canopy-Dead-Reason");
    assert!(
        reason.len() == 1 && reason[0].starts_with("schema: /: the payload is not JSON"),
        "{reason:?}"
    );

    let seen = errors(&client, json!({})).await;
    assert_eq!(seen["dead_lettered"], 3, "{seen}");
    assert_eq!(seen["refused"], 0, "{seen}");
    assert!(
        seen["errors"]
            .as_array()
            .expect("errors")
            .iter()
            .all(|e| e["dead_lettered"] == true),
        "{seen}"
    );
    server.stop().await;
}

/// A valid stored message carries `Canopy-Schema: <pattern>@<version>` for
/// subscribers and replay; a client's own header of that name is replaced on a
/// bound subject and dropped on an unbound one (whatever its case).
#[tokio::test]
async fn the_schema_header_is_the_servers_own() {
    let server = start_default().await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    let mut sub = watch(&client, ">").await;

    let mut forged = async_nats::HeaderMap::new();
    forged.insert("Canopy-Schema", "forged@9");
    forged.insert("X-Kept", "yes");
    forged.insert("Canopy-Ack", "durable");
    let ack = store_request(&client, "devices.d1.temp", forged.clone(), WARM).await;
    assert!(ack.get("error").is_none(), "{ack}");
    let ack = store_request(&client, "plain.x", forged, "anything").await;
    assert!(ack.get("error").is_none(), "{ack}");
    let mut lower = async_nats::HeaderMap::new();
    lower.insert("canopy-schema", "forged@10");
    lower.insert("Canopy-Ack", "durable");
    let ack = store_request(&client, "plain.y", lower, "anything").await;
    assert!(ack.get("error").is_none(), "{ack}");

    // Version 2 stamps @2.
    let wider = json!({"type": "object", "properties": {"temp": {"type": ["number", "null"]}}});
    bind(&client, "devices.*.temp", wider).await;
    publish_acked(&client, "devices.d1.temp", r#"{"temp":null}"#).await;

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let message = next_message(&mut sub, "the stored messages").await;
        if message.subject.starts_with("_INBOX.") || message.subject.starts_with('$') {
            continue;
        }
        seen.push(message);
    }
    let lower_name = |m: &async_nats::Message| {
        m.headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .filter(|(name, _)| name.to_string().eq_ignore_ascii_case("Canopy-Schema"))
                    .flat_map(|(_, values)| values.iter().map(|v| v.as_str().to_owned()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    assert_eq!(seen[0].subject.as_str(), "devices.d1.temp");
    assert_eq!(lower_name(&seen[0]), ["devices.*.temp@1"], "replaced");
    assert_eq!(message_header_values(&seen[0], "X-Kept"), ["yes"]);
    assert_eq!(seen[1].subject.as_str(), "plain.x");
    assert_eq!(lower_name(&seen[1]), Vec::<String>::new(), "dropped");
    assert_eq!(message_header_values(&seen[1], "X-Kept"), ["yes"]);
    assert_eq!(seen[2].subject.as_str(), "plain.y");
    assert_eq!(
        lower_name(&seen[2]),
        Vec::<String>::new(),
        "dropped, any case"
    );
    assert_eq!(seen[3].subject.as_str(), "devices.d1.temp");
    assert_eq!(lower_name(&seen[3]), ["devices.*.temp@2"]);

    let stored = replay_subject(&client, "devices.d1.temp").await;
    let stamps: Vec<Vec<String>> = stored
        .iter()
        .map(|m| header_values(m, "Canopy-Schema"))
        .collect();
    assert_eq!(
        stamps,
        [
            vec!["devices.*.temp@1".to_owned()],
            vec!["devices.*.temp@2".to_owned()]
        ]
    );
    for subject in ["plain.x", "plain.y"] {
        let stored = replay_subject(&client, subject).await;
        assert_eq!(stored.len(), 1);
        let any_case: Vec<&str> = stored[0]
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .filter(|(name, _)| name.to_string().eq_ignore_ascii_case("Canopy-Schema"))
            .flat_map(|(_, values)| values.iter().map(|v| v.as_str()))
            .collect();
        assert!(any_case.is_empty(), "{subject} kept {any_case:?}");
    }
    server.stop().await;
}

/// On a bound subject the store does not keep, a valid message is checked and
/// delivered, and a client's forged `Canopy-Schema` does not reach subscribers as
/// if the server had set it.
#[tokio::test]
async fn a_forged_schema_header_does_not_reach_live_subscribers() {
    let server = start(live_unstored()).await;
    let client = connect(&server).await;
    bind(&client, "live.*", temp_schema()).await;
    let mut sub = watch(&client, "live.>").await;

    let mut native = Native::connect(server.native_addr, None)
        .await
        .expect("native connects");
    native
        .send(&pub_frame("live.a", None, None, HOT.as_bytes()))
        .await;
    match native.next().await {
        Some(NativeEvent::Err(text)) => assert!(
            text.starts_with(
                "Permissions Violation for Publish to \"live.a\": the message does not match \
                 schema live.*@1"
            ),
            "{text}"
        ),
        other => panic!("a live subject is checked too: expected -ERR, got {other:?}"),
    }
    let forged = crate::frontends::header_block(&[("Canopy-Schema".into(), "forged@9".into())]);
    native
        .send(&pub_frame("live.a", None, Some(&forged), WARM.as_bytes()))
        .await;
    native.flush().await.expect("taken");
    let first = next_message(&mut sub, "the valid live publish").await;
    assert_eq!(
        &first.payload[..],
        WARM.as_bytes(),
        "the invalid one was delivered"
    );
    let stamps = message_header_values(&first, "Canopy-Schema");
    assert!(
        stamps.is_empty() || stamps == ["live.*@1"],
        "a subscriber of a bound live subject got the client's Canopy-Schema: {stamps:?}"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// The CLI and HTTP

pub(crate) async fn canopy(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(BIN)
            .args(args)
            .env_remove("CANOPY_SERVER")
            .env_remove("CANOPY_USER")
            .env_remove("CANOPY_PASSWORD")
            .env_remove("CANOPY_TOKEN")
            .output(),
    )
    .await
    .expect("canopy finishes")
    .expect("canopy runs")
}

/// Runs `canopy` and returns its standard output; panics unless it succeeded.
pub(crate) async fn canopy_ok(args: &[&str]) -> String {
    let out = canopy(args).await;
    assert!(
        out.status.success(),
        "canopy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// `canopy schema put/get/list/history/errors/delete` and `canopy replay --json`
/// showing the schema of each message (and a dead letter's subject and reason).
#[tokio::test]
async fn the_cli_binds_shows_and_replays_schemas() {
    let server = start_default().await;
    let client = connect(&server).await;
    let addr = server.native_addr.to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("temp.json");
    std::fs::write(&file, serde_json::to_string_pretty(&temp_schema()).unwrap()).expect("write");
    let file = file.to_str().expect("UTF-8 path");

    let put = json_lines(
        &canopy_ok(&[
            "schema",
            "put",
            "devices.*.temp",
            file,
            "--json",
            "--server",
            &addr,
        ])
        .await,
    );
    assert_eq!(put.len(), 1, "{put:?}");
    assert_eq!(
        (put[0]["pattern"].clone(), put[0]["version"].clone()),
        (json!("devices.*.temp"), json!(1))
    );
    let again = canopy_ok(&["schema", "put", "devices.*.temp", file, "--server", &addr]).await;
    assert!(again.contains("unchanged"), "{again}");

    let printed = canopy_ok(&["schema", "get", "devices.*.temp", "--server", &addr]).await;
    let printed: Value = serde_json::from_str(&printed).expect("get prints the schema as JSON");
    assert_eq!(printed, temp_schema());
    let by_subject = json_lines(
        &canopy_ok(&[
            "schema",
            "get",
            "devices.d1.temp",
            "--subject",
            "--json",
            "--server",
            &addr,
        ])
        .await,
    );
    assert_eq!(by_subject[0]["pattern"], "devices.*.temp");
    let out = canopy(&["schema", "get", "nothing.here", "--server", &addr]).await;
    assert!(!out.status.success(), "an unbound pattern fails");

    publish_acked(&client, "devices.d1.temp", WARM).await;
    let answer = store_request(
        &client,
        "devices.d1.temp",
        header("Canopy-Ack", "durable"),
        HOT,
    )
    .await;
    assert!(answer.get("error").is_some(), "{answer}");

    // Version 2 keeps invalid messages under dlq.<subject>.
    let second = json_lines(
        &canopy_ok(&[
            "schema",
            "put",
            "devices.*.temp",
            file,
            "--on-invalid",
            "dead-letter",
            "--dead-letter",
            "dlq",
            "--mode",
            "full",
            "--json",
            "--server",
            &addr,
        ])
        .await,
    );
    assert_eq!(second[0]["version"], 2, "{second:?}");
    assert_eq!(second[0]["on_invalid"], "dead_letter");
    assert_eq!(second[0]["dead_letter"], "dlq");
    assert_eq!(second[0]["mode"], "full");
    publish_acked(&client, "devices.d1.temp", HOT).await;
    publish_acked(&client, "devices.d1.temp", r#"{"temp":3}"#).await;

    let replayed =
        json_lines(&canopy_ok(&["replay", "devices.d1.temp", "--json", "--server", &addr]).await);
    assert_eq!(replayed.len(), 2, "{replayed:?}");
    assert_eq!(
        replayed[0]["schema"],
        json!({"pattern": "devices.*.temp", "version": 1}),
        "{replayed:?}"
    );
    assert_eq!(
        replayed[1]["schema"],
        json!({"pattern": "devices.*.temp", "version": 2}),
        "{replayed:?}"
    );
    let dead = json_lines(
        &canopy_ok(&["replay", "dlq.devices.d1.temp", "--json", "--server", &addr]).await,
    );
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        dead[0]["schema"],
        json!({"pattern": "devices.*.temp", "version": 2})
    );
    assert_eq!(dead[0]["dead_subject"], "devices.d1.temp", "{dead:?}");
    assert_eq!(
        dead[0]["dead_reason"], "schema: /temp: \"hot\" is not of type \"number\"",
        "{dead:?}"
    );

    let listed = json_lines(&canopy_ok(&["schema", "list", "--json", "--server", &addr]).await);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["version"], 2);
    assert!(listed[0].get("schema").is_none());
    let history = json_lines(
        &canopy_ok(&[
            "schema",
            "history",
            "devices.*.temp",
            "--json",
            "--server",
            &addr,
        ])
        .await,
    );
    let versions: Vec<&Value> = history.iter().map(|v| &v["version"]).collect();
    assert_eq!(versions, [&json!(1), &json!(2)], "{history:?}");
    let old = canopy_ok(&[
        "schema",
        "get",
        "devices.*.temp",
        "--version",
        "1",
        "--server",
        &addr,
    ])
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&old).expect("JSON"),
        temp_schema()
    );
    let refused = json_lines(
        &canopy_ok(&[
            "schema",
            "errors",
            "--subject",
            "devices.d1.temp",
            "--json",
            "--server",
            &addr,
        ])
        .await,
    );
    let flags: Vec<&Value> = refused.iter().map(|e| &e["dead_lettered"]).collect();
    assert_eq!(flags, [&json!(false), &json!(true)], "{refused:?}");
    assert_eq!(refused[0]["schema"], "devices.*.temp@1");
    assert_eq!(refused[1]["schema"], "devices.*.temp@2");
    let human = canopy_ok(&["schema", "errors", "--server", &addr]).await;
    assert!(
        human.contains("devices.d1.temp") && human.contains("(dead-lettered)"),
        "{human}"
    );

    canopy_ok(&["schema", "delete", "devices.*.temp", "--server", &addr]).await;
    let listed = canopy_ok(&["schema", "list", "--json", "--server", &addr]).await;
    assert_eq!(listed, "", "nothing is bound");
    server.stop().await;
}

/// `/api/schemas` and `/api/schema-errors`: the same operations over HTTP, with the
/// API's statuses.
#[tokio::test]
async fn the_http_api_manages_bindings() {
    let server = start_default().await;
    let client = connect(&server).await;
    let http = server.http_addr.expect("http");
    let json_of = |body: &str| -> Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    };

    // The raw schema as the body.
    let path = "/api/schemas/devices.*.temp";
    let (status, body) = http_request(http, "PUT", path, &[], &temp_schema().to_string()).await;
    assert_eq!(status, 200, "{body}");
    let first = json_of(&body);
    assert_eq!(
        (first["version"].clone(), first["schema"].clone()),
        (json!(1), temp_schema())
    );
    // Wrapped, with options.
    let wider = json!({"type": "object", "properties": {"temp": {"type": ["number", "null"]}}});
    let (status, body) = http_request(
        http,
        "PUT",
        path,
        &[],
        &json!({"schema": wider, "on_invalid": "dead_letter", "dead_letter": "dlq"}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let second = json_of(&body);
    assert_eq!(second["version"], 2, "{second}");
    assert_eq!(second["on_invalid"], "dead_letter", "{second}");
    assert_eq!(second["dead_letter"], "dlq", "{second}");
    // Options as query parameters; `>` percent-encoded in the path.
    let (status, body) = http_request(
        http,
        "PUT",
        "/api/schemas/events.%3E?mode=none",
        &[],
        r#"{"type":"object"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = json_of(&body);
    assert_eq!(
        (events["pattern"].clone(), events["mode"].clone()),
        (json!("events.>"), json!("none"))
    );

    let (status, body) = http_request(http, "GET", path, &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["schema"], wider);
    let (status, body) = http_request(http, "GET", &format!("{path}?version=1"), &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["schema"], temp_schema());
    let (status, body) = http_request(http, "GET", "/api/schemas", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let list = json_of(&body);
    assert_eq!(list["schemas"].as_array().map(Vec::len), Some(2), "{list}");
    assert!(list["schemas"][0].get("schema").is_none(), "{list}");
    let (status, body) =
        http_request(http, "GET", "/api/schemas?subject=devices.d1.temp", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let covering = json_of(&body);
    assert_eq!(covering["schemas"].as_array().map(Vec::len), Some(1));
    assert_eq!(covering["schemas"][0]["pattern"], "devices.*.temp");
    assert_eq!(covering["schemas"][0]["schema"], wider);
    let (status, body) = http_request(http, "GET", "/api/schemas?subject=rooms.1", &[], "").await;
    assert_eq!((status, json_of(&body)), (200, json!({"schemas": []})));
    let (status, body) = http_request(http, "GET", &format!("{path}/history"), &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["versions"].as_array().map(Vec::len), Some(2));

    // Refusals in the API's error shape.
    let (status, body) =
        http_request(http, "PUT", "/api/schemas/bad.*", &[], r#"{"type":12}"#).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(json_of(&body)["error"]["code"], 400, "{body}");
    let (status, body) = http_request(http, "PUT", "/api/schemas/bad.*", &[], "not json").await;
    assert_eq!(status, 400, "{body}");
    let stricter = json!({
        "type": "object",
        "properties": {"temp": {"type": "number"}},
        "required": ["temp"]
    });
    let (status, body) = http_request(http, "PUT", path, &[], &stricter.to_string()).await;
    assert_eq!(status, 409, "{body}");
    let conflict = json_of(&body);
    assert_eq!(conflict["error"]["code"], 409, "{body}");
    assert!(
        conflict["error"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("version 3 of devices.*.temp breaks its backward")),
        "{body}"
    );
    let (status, body) = http_request(http, "GET", "/api/schemas/nothing.here", &[], "").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(json_of(&body)["error"]["code"], 404, "{body}");

    // What a publish was refused shows in /api/schema-errors.
    let refused_ack =
        store_request(&client, "events.1", header("Canopy-Ack", "durable"), "[").await;
    assert_eq!(refused_ack["error"]["code"], 400, "{refused_ack}");
    publish_acked(&client, "devices.d1.temp", r#"{"temp":"hot"}"#).await;
    let (status, body) = http_request(
        http,
        "GET",
        "/api/schema-errors?subject=devices.d1.temp",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seen = json_of(&body);
    assert_eq!(error_subjects(&seen), ["devices.d1.temp"], "{seen}");
    assert_eq!(seen["errors"][0]["dead_lettered"], true, "{seen}");
    assert_eq!(seen["errors"][0]["schema"], "devices.*.temp@2", "{seen}");
    let (status, body) = http_request(http, "GET", "/api/schema-errors", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let all = json_of(&body);
    assert_eq!(all["refused"], 1, "{all}");
    assert_eq!(all["dead_lettered"], 1, "{all}");

    let (status, body) = http_request(http, "DELETE", path, &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json_of(&body),
        json!({"pattern": "devices.*.temp", "deleted": true, "version": 3})
    );
    let (status, body) = http_request(http, "GET", path, &[], "").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = schema(&client, "get", json!({"pattern": "devices.*.temp"})).await;
    assert_eq!(status, 404, "HTTP and NATS see one registry");
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// Restarts and tenants

/// Bindings, their versions, options and deletions are in the store: a server on the
/// same store finds them all and checks publishes as before.
#[tokio::test]
async fn bindings_survive_a_restart() {
    let folder = tempfile::tempdir().expect("tempdir");
    let config = file_config(folder.path());
    {
        let server = start(config.clone()).await;
        let client = connect(&server).await;
        bind(&client, "devices.*.temp", temp_schema()).await;
        let wider = json!({
            "type": "object",
            "properties": {"temp": {"type": ["number", "null"]}},
            "required": ["temp"]
        });
        put(
            &client,
            json!({"pattern": "devices.*.temp", "schema": wider,
                   "on_invalid": "dead_letter", "dead_letter": "dlq"}),
        )
        .await;
        bind(&client, "gone.*", json!({"type": "object"})).await;
        schema(&client, "delete", json!({"pattern": "gone.*"})).await;
        bind(&client, "strict.*", temp_schema()).await;
        server.stop().await;
    }
    let server = start(config).await;
    let client = connect(&server).await;
    let (status, list) = schema(&client, "list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    let found: Vec<(String, u64, String)> = list["schemas"]
        .as_array()
        .expect("schemas")
        .iter()
        .map(|b| {
            (
                b["pattern"].as_str().unwrap_or("?").to_owned(),
                b["version"].as_u64().unwrap_or(0),
                b["on_invalid"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("devices.*.temp".to_owned(), 2, "dead_letter".to_owned()),
            ("strict.*".to_owned(), 1, "reject".to_owned()),
        ],
        "{list}"
    );
    let (_, current) = schema(&client, "get", json!({"pattern": "devices.*.temp"})).await;
    assert_eq!(current["dead_letter"], "dlq", "{current}");
    let (_, history) = schema(&client, "history", json!({"pattern": "gone.*"})).await;
    assert_eq!(history["versions"][1]["deleted"], true, "{history}");
    let (status, _) = schema(&client, "get", json!({"pattern": "gone.*"})).await;
    assert_eq!(status, 404, "a deletion survives too");

    // Publishes are checked as before the restart.
    let answer = store_request(&client, "strict.1", header("Canopy-Ack", "durable"), HOT).await;
    assert_eq!(answer["error"]["code"], 400, "{answer}");
    publish_acked(&client, "devices.d1.temp", HOT).await;
    publish_acked(&client, "devices.d1.temp", r#"{"temp":null}"#).await;
    let stored = replay_subject(&client, "devices.d1.temp").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(
        header_values(&stored[0], "Canopy-Schema"),
        ["devices.*.temp@2"]
    );
    assert_eq!(replay_texts(&client, "dlq.devices.d1.temp").await, [HOT]);
    publish_acked(&client, "gone.1", "anything").await;
    // Version numbers and compatibility go on from the stored lineage.
    let (status, refused) = schema(
        &client,
        "put",
        json!({"pattern": "devices.*.temp", "schema": {"type": "string"}}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    let third = bind(&client, "gone.*", json!({"type": "array"})).await;
    assert_eq!(third["version"], 3, "{third}");
    server.stop().await;
}

/// A binding belongs to its tenant: another tenant's same subjects are not checked,
/// its lists, gets and errors show none of it, and it may bind the same pattern its
/// own way.
#[tokio::test]
async fn bindings_are_per_tenant() {
    let logins = Logins::start(
        &["schema-a", "schema-b"],
        &[("schema-a", "ann", None), ("schema-b", "bob", None)],
    )
    .await;
    let a = logins.native("ann@schema-a").await;
    let b = logins.native("bob@schema-b").await;
    let admin = logins.native("admin@default").await;

    let bound = bind(&a, "devices.*.temp", temp_schema()).await;
    assert_eq!(bound["version"], 1);
    let refused = store_request(&a, "devices.d1.temp", header("Canopy-Ack", "durable"), HOT).await;
    assert_eq!(
        (refused["error"]["code"].clone(), refused["stream"].clone()),
        (json!(400), json!("schema-a")),
        "tenant schema-a is checked: {refused}"
    );

    // Tenant b and the default tenant: unbound.
    for (name, client) in [("schema-b", &b), ("default", &admin)] {
        let ack = store_request(
            client,
            "devices.d1.temp",
            header("Canopy-Ack", "durable"),
            HOT,
        )
        .await;
        assert!(
            ack.get("error").is_none() && ack["stream"] == name,
            "tenant {name} is held to tenant schema-a's binding: {ack}"
        );
        let stored = replay_subject(client, "devices.d1.temp").await;
        assert_eq!(stored.len(), 1, "{name}");
        assert!(
            header_values(&stored[0], "Canopy-Schema").is_empty(),
            "{name}: {stored:?}"
        );
        let (_, list) = schema(client, "list", json!({})).await;
        assert_eq!(list, json!({"schemas": []}), "{name}");
        let (status, _) = schema(client, "get", json!({"subject": "devices.d1.temp"})).await;
        assert_eq!(status, 404, "{name}");
        let (status, _) = schema(client, "history", json!({"pattern": "devices.*.temp"})).await;
        assert_eq!(status, 404, "{name}");
        let seen = errors(client, json!({})).await;
        assert_eq!(
            (seen["errors"].clone(), seen["refused"].clone()),
            (json!([]), json!(0)),
            "{name}: {seen}"
        );
    }
    assert!(replay_subject(&a, "devices.d1.temp").await.is_empty());

    // Tenant b binds the same pattern its own way: its own version 1.
    let own = bind(&b, "devices.*.temp", json!({"type": "string"})).await;
    assert_eq!(own["version"], 1, "{own}");
    publish_acked(&b, "devices.d2.temp", r#""warm""#).await;
    let refused = store_request(&b, "devices.d2.temp", header("Canopy-Ack", "durable"), WARM).await;
    assert_eq!(refused["error"]["code"], 400, "{refused}");
    publish_acked(&a, "devices.d2.temp", WARM).await;
    let (_, mine) = schema(&a, "get", json!({"pattern": "devices.*.temp"})).await;
    assert_eq!(
        mine["schema"],
        temp_schema(),
        "tenant a's binding is untouched"
    );
    // b deleting its binding leaves a's in force.
    let (status, _) = schema(&b, "delete", json!({"pattern": "devices.*.temp"})).await;
    assert_eq!(status, 200);
    let refused = store_request(&a, "devices.d3.temp", header("Canopy-Ack", "durable"), HOT).await;
    assert_eq!(refused["error"]["code"], 400, "{refused}");

    // Over HTTP, each token sees its own tenant's bindings.
    let http = logins.http_addr();
    let bearer = format!("Bearer {}", logins.token("bob@schema-b"));
    let (status, body) = http_request(
        http,
        "GET",
        "/api/schemas",
        &[("Authorization", bearer.as_str())],
        "",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, r#"{"schemas":[]}"#));
    let bearer = format!("Bearer {}", logins.token("ann@schema-a"));
    let (status, body) = http_request(
        http,
        "GET",
        "/api/schemas",
        &[("Authorization", bearer.as_str())],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(list["schemas"][0]["pattern"], "devices.*.temp", "{list}");
    let seen = errors(&a, json!({})).await;
    assert_eq!(seen["refused"], 2, "{seen}");
    logins.stop().await;
}

/// A binding decides what its subjects' publishers may send and where their refused
/// messages go, so binding or unbinding a pattern needs the rights to publish and
/// subscribe to all of it, a dead-letter prefix the right to publish there (never in
/// the server's namespaces), and reads show only what the caller may subscribe to:
/// bindings, and the refused messages errors quote.
#[tokio::test]
async fn a_binding_needs_the_rights_to_its_pattern() {
    let team_a = json!({
        "publish": {"allow": ["team-a.>", "$CANOPY.schema.>"]},
        "subscribe": {"allow": ["team-a.>", "_INBOX.>"]}
    });
    let logins = Logins::start(
        &["teams"],
        &[("teams", "ops", None), ("teams", "ann", Some(team_a))],
    )
    .await;
    let ops = logins.native("ops@teams").await;
    let ann = logins.native("ann@teams").await;

    bind(&ops, "team-b.*", temp_schema()).await;
    let refused = store_request(&ops, "team-b.1", header("Canopy-Ack", "durable"), HOT).await;
    assert_eq!(refused["error"]["code"], 400, "{refused}");

    // Another team's pattern: neither bound, read, unbound, nor covered by a wider one.
    for pattern in ["team-b.*", "team-b.>", ">", "*.1"] {
        let (status, answer) = schema(
            &ann,
            "put",
            json!({"pattern": pattern, "schema": false, "on_invalid": "dead_letter",
                   "dead_letter": "team-a.loot"}),
        )
        .await;
        assert_eq!(status, 403, "put {pattern}: {answer}");
    }
    for (op, body) in [
        ("get", json!({"pattern": "team-b.*"})),
        ("get", json!({"subject": "team-b.1"})),
        ("history", json!({"pattern": "team-b.*"})),
        ("delete", json!({"pattern": "team-b.*"})),
    ] {
        let (status, answer) = schema(&ann, op, body.clone()).await;
        assert_eq!(status, 403, "{op} {body}: {answer}");
    }
    let (_, list) = schema(&ann, "list", json!({})).await;
    assert_eq!(list["schemas"], json!([]), "{list}");
    let seen = errors(&ann, json!({})).await;
    assert_eq!(error_subjects(&seen), Vec::<String>::new(), "{seen}");
    // Still bound, and still quoted to whoever may read it.
    let (status, _) = schema(&ops, "get", json!({"pattern": "team-b.*"})).await;
    assert_eq!(status, 200);
    assert_eq!(error_subjects(&errors(&ops, json!({})).await), ["team-b.1"]);

    // Its own pattern, with dead letters only where it may publish.
    for (prefix, status) in [
        ("team-b.loot", 403),
        ("$SYS.loot", 400),
        ("$JS.API.loot", 400),
        ("_INBOX.someone", 400),
        ("team-a.dead", 200),
    ] {
        let (got, answer) = schema(
            &ann,
            "put",
            json!({"pattern": "team-a.*", "schema": temp_schema(), "on_invalid": "dead_letter",
                   "dead_letter": prefix}),
        )
        .await;
        assert_eq!(got, status, "dead letters under {prefix}: {answer}");
    }
    let (status, listed) = schema(&ann, "list", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(listed["schemas"][0]["pattern"], "team-a.*", "{listed}");
    let (status, answer) = schema(&ann, "delete", json!({"pattern": "team-a.*"})).await;
    assert_eq!(status, 200, "{answer}");
    logins.server.stop().await;
}

/// A dead-letter subject is held to the subject limits like any other: a message
/// whose prefixed subject would be too long is refused, not kept where no reader
/// could name it.
#[tokio::test]
async fn a_dead_letter_subject_too_long_is_refused_instead() {
    let server = start_default().await;
    let client = connect(&server).await;
    let prefix = format!("dead.{}", "p".repeat(500));
    put(
        &client,
        json!({"pattern": "long.>", "schema": temp_schema(), "on_invalid": "dead_letter",
               "dead_letter": prefix}),
    )
    .await;
    let (status, answer) = schema(
        &client,
        "put",
        json!({"pattern": "other.>", "schema": temp_schema(), "dead_letter": "p".repeat(600)}),
    )
    .await;
    assert_eq!(status, 400, "a prefix longer than 512 bytes: {answer}");

    let short = store_request(&client, "long.a", header("Canopy-Ack", "durable"), HOT).await;
    assert!(
        short.get("error").is_none(),
        "kept as a dead letter: {short}"
    );
    let subject = format!("long.{}", "s".repeat(600));
    let long = store_request(&client, &subject, header("Canopy-Ack", "durable"), HOT).await;
    assert_eq!(long["error"]["code"], 400, "refused: {long}");
    let seen = errors(&client, json!({"subject": subject})).await;
    assert_eq!(seen["errors"][0]["dead_lettered"], false, "{seen}");
    server.stop().await;
}

/// All of a tenant's bound schemas together are bounded (what the registry, a start
/// and an AsyncAPI document hold): past it a new binding is refused with 429, while
/// a binding may still be replaced by a smaller version.
#[tokio::test]
async fn a_tenants_schemas_together_are_bounded() {
    let server = start_default().await;
    let client = connect(&server).await;
    let big = |n: usize| json!({"description": "x".repeat(250_000), "title": format!("s{n}")});
    let size = serde_json::to_vec(&big(10)).expect("json").len();
    let fit = canopy::schemas::MAX_TENANT_SCHEMA_BYTES / size;
    for n in 10..10 + fit {
        put(
            &client,
            json!({"pattern": format!("big.{n}"), "schema": big(n)}),
        )
        .await;
    }
    let (status, answer) = schema(
        &client,
        "put",
        json!({"pattern": "big.over", "schema": big(99)}),
    )
    .await;
    assert_eq!(status, 429, "{answer}");
    let (status, answer) = schema(
        &client,
        "put",
        json!({"pattern": "big.10", "schema": {"type": "object"}, "mode": "none"}),
    )
    .await;
    assert_eq!(
        status, 200,
        "a smaller version of a bound pattern: {answer}"
    );
    put(&client, json!({"pattern": "big.over", "schema": big(99)})).await;
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// NATS clients from other projects, refused by a schema

/// The test config with `live.>` not stored.
fn live_unstored() -> canopy::config::Config {
    let mut config = test_config();
    config.store.policies.insert(
        0,
        canopy::config::StorePolicy {
            pattern: "live.>".into(),
            store: false,
            ..canopy::config::StorePolicy::default()
        },
    );
    config
}

/// A server with `temp_schema` bound to `devices.*.temp` (stored) and `live.*` (not
/// stored, so a request there hears the refusal as `-ERR`, not as an error ack).
async fn refusing_server() -> canopy::server::RunningServer {
    let server = start(live_unstored()).await;
    let client = connect(&server).await;
    bind(&client, "devices.*.temp", temp_schema()).await;
    bind(&client, "live.*", temp_schema()).await;
    server
}

/// Runs `command` (a client's script, given the server's address) to its end and
/// asserts it printed "all checks passed".
async fn run_client_script(name: &str, mut command: tokio::process::Command) {
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("{name} finishes within two minutes"))
        .unwrap_or_else(|e| panic!("{name} runs: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "{name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// nats-py closes its connection for good on any `-ERR` but a permissions violation
/// (or a stale connection): a schema's refusal of a core publish is worded as one,
/// so nats-py hears it through its error callback and goes on publishing,
/// subscribing and requesting on the same connection.
#[tokio::test]
async fn nats_py_hears_a_schema_refusal_and_keeps_its_connection() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test-all.sh, which creates it with nats-py",
        python.display()
    );
    let server = refusing_server().await;
    let mut command = tokio::process::Command::new(python);
    command
        .arg(root.join("tests/python/nats_py_schema_refusal.py"))
        .arg(server.native_url())
        .kill_on_drop(true);
    run_client_script("nats_py_schema_refusal.py", command).await;
    server.stop().await;
}

/// nats.js (npm `nats` 2.29) hears a schema's refusal as a permissions violation
/// naming the subject (and rejects a pending request to it at once, where it
/// would otherwise wait for its timeout), and keeps its connection.
#[tokio::test]
async fn nats_js_hears_a_schema_refusal_and_keeps_its_connection() {
    let js = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js");
    assert!(
        js.join("node_modules/nats").exists(),
        "tests/js/node_modules/nats is missing: run ./scripts/test-all.sh, which installs it"
    );
    let server = refusing_server().await;
    let mut command = tokio::process::Command::new("node");
    command
        .arg(js.join("nats_js_schema_refusal.mjs"))
        .arg(server.native_addr.to_string())
        .current_dir(&js)
        .kill_on_drop(true);
    run_client_script("nats_js_schema_refusal.mjs", command).await;
    server.stop().await;
}
