//! Issue 30: ordered *pull* consumers, the kind nats.js's `consumers.get(stream)` and
//! async-nats's `OrderedConfig` make (no acks, no deliver subject, pulled with
//! `CONSUMER.MSG.NEXT`): async-nats reading history then live, and on the wire each
//! way a pull ends as nats-server ends it (filled, `404` for `no_wait`, `408` with
//! what it still wanted, `100` heartbeats while it waits, `409 Consumer Deleted`),
//! the refusals of what only a push consumer may ask for, and rights and tenants.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use async_nats::{Message, StatusCode};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{
    WAIT, declare_stream, header_of, js_publish, js_publish_to_tenant, start_default,
};
use crate::group_rights::js;
use crate::stream_rights::dave_erin_and_olga;

#[tokio::test]
async fn async_nats_ordered_pull_consumers_read_history_then_live() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let jetstream = async_nats::jetstream::new(client);
    let stream = declare_stream(&jetstream, "EVENTS", "events.>").await;
    for i in 1..=30 {
        let subject = if i % 3 == 0 { "events.b" } else { "events.a" };
        js_publish(&jetstream, subject, format!("e{i}")).await;
    }

    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .expect("an ordered consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let mut seen = Vec::new();
    for i in 1..=35 {
        if i == 31 {
            for j in 31..=35 {
                js_publish(&jetstream, "events.a", format!("e{j}")).await;
            }
        }
        let message = tokio::time::timeout(WAIT, messages.next())
            .await
            .expect("a message in time")
            .expect("the stream goes on")
            .expect("a message");
        let info = message.info().expect("a JetStream message");
        assert_eq!(info.stream_sequence, i, "in stream order");
        seen.push(String::from_utf8_lossy(&message.payload).into_owned());
    }
    let wanted: Vec<String> = (1..=35).map(|i| format!("e{i}")).collect();
    assert_eq!(seen, wanted);

    let filtered = stream
        .create_consumer(OrderedConfig {
            filter_subject: "events.b".into(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: 10 },
            ..Default::default()
        })
        .await
        .expect("a filtered ordered consumer");
    let mut messages = filtered.messages().await.expect("messages");
    let mut seen = Vec::new();
    for _ in 0..7 {
        let message = tokio::time::timeout(WAIT, messages.next())
            .await
            .expect("a message in time")
            .expect("the stream goes on")
            .expect("a message");
        seen.push(String::from_utf8_lossy(&message.payload).into_owned());
    }
    assert_eq!(seen, ["e12", "e15", "e18", "e21", "e24", "e27", "e30"]);
}

/// A pull to an ordered consumer, and the inbox its messages and statuses come to.
async fn pull(client: &async_nats::Client, name: &str, body: Value) -> async_nats::Subscriber {
    let inbox = client.new_inbox();
    let sub = client.subscribe(inbox.clone()).await.expect("subscribes");
    client
        .publish_with_reply(
            format!("$JS.API.CONSUMER.MSG.NEXT.default.{name}"),
            inbox,
            body.to_string().into(),
        )
        .await
        .expect("pulls");
    client.flush().await.expect("flushes");
    sub
}

async fn next(sub: &mut async_nats::Subscriber) -> Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("something in time")
        .expect("the subscription is open")
}

/// The reply's `(consumer sequence, pending)`.
fn numbers(message: &Message) -> (u64, u64) {
    let reply = message.reply.as_ref().expect("a delivery has a reply");
    let tokens: Vec<&str> = reply.split('.').collect();
    let number = |i: usize| tokens[i].parse::<u64>().expect("a number");
    (number(6), number(8))
}

async fn publish(client: &async_nats::Client, subject: &str) {
    let js = async_nats::jetstream::new(client.clone());
    js_publish_to_tenant(&js, "default", subject, "x")
        .await
        .expect("acked");
}

#[tokio::test]
async fn a_pull_to_an_ordered_consumer_ends_as_nats_server_ends_it() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    for subject in ["t.a", "t.b", "t.a"] {
        publish(&client, subject).await;
    }
    let config = |extra: Value| {
        let mut config = json!({"name": "op", "ack_policy": "none", "filter_subject": "t.>"});
        if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            config.extend(extra.clone());
        }
        json!({"stream_name": "default", "config": config})
    };
    for (extra, err_code) in [
        (json!({"idle_heartbeat": 1_000_000_000u64}), 10088),
        (json!({"flow_control": true}), 10089),
    ] {
        let refused = js(&client, "CONSUMER.CREATE.default.op", config(extra)).await;
        assert_eq!(refused["error"]["err_code"], json!(err_code), "{refused}");
    }
    let durable = js(
        &client,
        "CONSUMER.CREATE.default.op",
        config(json!({"durable_name": "op"})),
    )
    .await;
    assert_eq!(durable["error"]["code"], json!(400), "{durable}");
    let made = js(&client, "CONSUMER.CREATE.default.op", config(json!({}))).await;
    assert_eq!(made["num_pending"], json!(3), "{made}");
    assert!(made["config"].get("deliver_subject").is_none(), "{made}");

    // Filled: two messages, numbered from 1, and no status after them.
    let mut sub = pull(
        &client,
        "op",
        json!({"batch": 2, "expires": 2_000_000_000u64}),
    )
    .await;
    assert_eq!(numbers(&next(&mut sub).await), (1, 2));
    assert_eq!(numbers(&next(&mut sub).await), (2, 1));
    // `no_wait`: what is there, then 404.
    let mut sub = pull(&client, "op", json!({"batch": 5, "no_wait": true})).await;
    let last = next(&mut sub).await;
    assert_eq!((last.subject.as_str(), numbers(&last)), ("t.a", (3, 0)));
    let end = next(&mut sub).await;
    assert_eq!(end.status, Some(StatusCode::NOT_FOUND), "{end:?}");
    let mut sub = pull(&client, "op", json!({"batch": 5, "no_wait": true})).await;
    let end = next(&mut sub).await;
    assert_eq!(end.status, Some(StatusCode::NOT_FOUND), "nothing: {end:?}");
    // Its wait over: 408 with what it still wanted.
    let mut sub = pull(
        &client,
        "op",
        json!({"batch": 5, "expires": 300_000_000u64}),
    )
    .await;
    let end = next(&mut sub).await;
    assert_eq!(end.status, Some(StatusCode::TIMEOUT), "{end:?}");
    assert_eq!(
        header_of(&end, "Nats-Pending-Messages"),
        Some("5"),
        "{end:?}"
    );
    // Heartbeats while it waits, then what comes live.
    let body = json!({"batch": 1, "expires": 3_000_000_000u64, "idle_heartbeat": 200_000_000u64});
    let mut sub = pull(&client, "op", body).await;
    let beat = next(&mut sub).await;
    assert_eq!(beat.status, Some(StatusCode::IDLE_HEARTBEAT), "{beat:?}");
    let info = js(&client, "CONSUMER.INFO.default.op", json!({})).await;
    assert_eq!(info["num_waiting"], json!(1), "{info}");
    assert_eq!(info["delivered"]["consumer_seq"], json!(3), "{info}");
    publish(&client, "t.c").await;
    let live = loop {
        let message = next(&mut sub).await;
        if message.status.is_none() {
            break message;
        }
    };
    assert_eq!((live.subject.as_str(), numbers(&live)), ("t.c", (4, 0)));
    // Deleted under a waiting pull: 409 Consumer Deleted; then nobody answers.
    let mut sub = pull(
        &client,
        "op",
        json!({"batch": 1, "expires": 5_000_000_000u64}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted = js(&client, "CONSUMER.DELETE.default.op", json!({})).await;
    assert_eq!(deleted["success"], json!(true), "{deleted}");
    let end = next(&mut sub).await;
    assert_eq!(end.status.map(|s| s.as_u16()), Some(409), "{end:?}");
    assert_eq!(
        end.description.as_deref(),
        Some("Consumer Deleted"),
        "{end:?}"
    );
    let mut sub = pull(&client, "op", json!({"batch": 1})).await;
    let end = next(&mut sub).await;
    assert_eq!(end.status, Some(StatusCode::NO_RESPONDERS), "{end:?}");
}

#[tokio::test]
async fn ordered_pull_consumers_keep_rights_and_tenants_sealed() {
    let (_logins, [dave, erin, olga]) = dave_erin_and_olga().await;
    let create = json!({"stream_name": "default",
        "config": {"name": "dp", "ack_policy": "none", "filter_subject": "dave.>"}});
    let peek = js(&erin, "CONSUMER.CREATE.default.dp", create.clone()).await;
    assert_eq!(peek["error"]["code"], json!(403), "{peek}");
    let made = js(&dave, "CONSUMER.CREATE.default.dp", create).await;
    assert_eq!(made["name"], json!("dp"), "{made}");
    publish(&dave, "dave.x").await;

    let mut theirs = pull(&erin, "dp", json!({"batch": 1, "no_wait": true})).await;
    let refused = next(&mut theirs).await;
    assert_eq!(refused.status.map(|s| s.as_u16()), Some(409), "{refused:?}");
    assert!(refused.payload.is_empty(), "{refused:?}");
    let mut elsewhere = pull(&olga, "dp", json!({"batch": 1, "no_wait": true})).await;
    let nobody = next(&mut elsewhere).await;
    let answer: Value = serde_json::from_slice(&nobody.payload).expect("a JSON error");
    assert_eq!(
        answer["error"]["err_code"],
        json!(10059),
        "no such stream there: {answer}"
    );
    let mut his = pull(&dave, "dp", json!({"batch": 1, "no_wait": true})).await;
    let got = next(&mut his).await;
    assert_eq!(got.subject.as_str(), "dave.x", "{got:?}");
}
