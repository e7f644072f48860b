//! Consuming a group from `/ws`: `group.next` hands out `group.msg` texts and an `ok`
//! with the count, `group.ack` acks, nacks, extends and terms them, every bad request
//! gets an `/ws` error, and a member that closes holds nothing back.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{header, store_request, test_config};
use crate::frontends::{Ws, WsEvent};
use crate::groups::{await_waiting_pulls, delivered, next, with_group};

async fn stored(client: &async_nats::Client, subject: &str, payload: &'static str) {
    let mut headers = header("Canopy-Ack", "durable");
    headers.insert("Content-Type", "application/json");
    headers.insert("X-Trace", "t1");
    let ack = store_request(client, subject, headers, payload).await;
    assert!(ack.get("error").is_none(), "{ack}");
}

/// Sends `request` and returns the text answering it.
async fn answer(ws: &mut Ws, request: Value) -> Value {
    match ws.call(request).await {
        Some(WsEvent::Text(value)) => value,
        other => panic!("no answer: {other:?}"),
    }
}

async fn settle(ws: &mut Ws, message: &Value, kind: &str) -> Value {
    answer(
        ws,
        json!({"op": "group.ack", "ack": message["ack"], "kind": kind}),
    )
    .await
}

fn shown(messages: &[Value]) -> Vec<(String, u64, u64)> {
    let mut all: Vec<_> = messages
        .iter()
        .map(|m| {
            (
                m["subject"].as_str().unwrap_or_default().to_owned(),
                m["version"].as_u64().unwrap_or_default(),
                m["attempt"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    all.sort();
    all
}

#[tokio::test]
async fn a_ws_member_pulls_acks_nacks_extends_and_terms_group_messages() {
    let (server, client) = with_group(
        test_config(),
        json!({"name": "billing", "pattern": "orders.>", "start": "all"}),
    )
    .await;
    stored(&client, "orders.1", r#"{"n":1}"#).await;
    stored(&client, "orders.2", r#"{"n":2}"#).await;
    stored(&client, "orders.1", r#"{"n":3}"#).await;
    let http = server.http_addr.expect("the HTTP listener is on");
    let mut ws = Ws::open(http, None).await.unwrap();

    let pull = json!({"op": "group.next", "group": "billing", "max": 10, "wait_ms": 2000});
    let (messages, done) = ws.pull(pull.clone()).await;
    // One in flight per subject: orders.1's second version waits for the first's ack.
    assert_eq!(
        shown(&messages),
        [("orders.1".into(), 1, 1), ("orders.2".into(), 1, 1)]
    );
    let done = done.expect("the pull ends");
    assert_eq!(
        (&done["op"], &done["count"], &done["group"]),
        (&json!("ok"), &json!(2), &json!("billing")),
        "{done}"
    );
    let first = messages
        .iter()
        .find(|m| m["subject"] == "orders.1")
        .unwrap()
        .clone();
    assert_eq!(first["group"], "billing");
    assert_eq!(first["data"], json!({"n": 1}), "JSON comes inline: {first}");
    assert_eq!(first["headers"]["X-Trace"], "t1", "{first}");
    assert!(
        first["headers"].get("Canopy-Subject").is_none(),
        "the group's own headers are fields, not headers: {first}"
    );
    assert!(first["offset"].as_u64().unwrap() > 0 && first["time_ms"].as_u64().unwrap() > 0);
    let second = messages
        .iter()
        .find(|m| m["subject"] == "orders.2")
        .unwrap()
        .clone();

    let acked = settle(&mut ws, &first, "ack").await;
    assert_eq!(acked["op"], "ok", "{acked}");
    let nacked = settle(&mut ws, &second, "nack").await;
    assert_eq!(nacked["op"], "ok", "{nacked}");
    let (messages, done) = ws.pull(pull.clone()).await;
    assert_eq!(done.expect("ends")["count"], 2);
    assert_eq!(
        shown(&messages),
        [("orders.1".into(), 2, 1), ("orders.2".into(), 1, 2)],
        "the next version after the ack, the nacked one again"
    );
    let again = messages
        .iter()
        .find(|m| m["subject"] == "orders.2")
        .unwrap()
        .clone();
    let newer = messages
        .iter()
        .find(|m| m["subject"] == "orders.1")
        .unwrap()
        .clone();
    assert_eq!(settle(&mut ws, &again, "term").await["op"], "ok");
    let twice = settle(&mut ws, &again, "ack").await;
    assert_eq!(
        (&twice["op"], &twice["code"]),
        (&json!("error"), &json!("conflict")),
        "a delivery no longer outstanding: {twice}"
    );
    assert_eq!(settle(&mut ws, &newer, "in_progress").await["op"], "ok");
    assert_eq!(settle(&mut ws, &newer, "ack").await["op"], "ok");

    // Nothing left: a pull without a wait ends at once with none.
    let (messages, done) = ws
        .pull(json!({"op": "group.next", "group": "billing", "max": 5}))
        .await;
    assert!(messages.is_empty(), "{messages:?}");
    assert_eq!(done.expect("ends")["count"], 0);

    // A delayed nack comes back only after its delay.
    stored(&client, "orders.3", r#"{"n":4}"#).await;
    let (messages, _) = ws.pull(pull.clone()).await;
    assert_eq!(shown(&messages), [("orders.3".into(), 1, 1)]);
    let delayed = answer(
        &mut ws,
        json!({"op": "group.ack", "ack": messages[0]["ack"], "kind": "nack", "delay_ms": 1500}),
    )
    .await;
    assert_eq!(delayed["op"], "ok", "{delayed}");
    let (soon, _) = ws
        .pull(json!({"op": "group.next", "group": "billing", "max": 5}))
        .await;
    assert!(soon.is_empty(), "redelivered before its delay: {soon:?}");
    let (later, _) = ws
        .pull(json!({"op": "group.next", "group": "billing", "max": 5, "wait_ms": 5000}))
        .await;
    assert_eq!(shown(&later), [("orders.3".into(), 1, 2)]);
    server.stop().await;
}

#[tokio::test]
async fn ws_group_requests_are_refused_in_the_clients_own_protocol() {
    let (server, _client) = with_group(
        test_config(),
        json!({"name": "billing", "pattern": "orders.>"}),
    )
    .await;
    let http = server.http_addr.expect("the HTTP listener is on");
    let mut ws = Ws::open(http, None).await.unwrap();
    for (request, code) in [
        (json!({"op": "group.next", "group": "nosuch"}), "not_found"),
        (
            json!({"op": "group.next", "group": "billing", "max": 0}),
            "bad_request",
        ),
        (json!({"op": "group.next"}), "bad_request"),
        (json!({"op": "group.ack", "ack": "orders.1"}), "bad_request"),
        (
            json!({"op": "group.ack", "ack": "$CANOPY.group.ack.billing"}),
            "bad_request",
        ),
        (
            json!({"op": "group.ack", "ack": "$CANOPY.group.ack.nosuch.1.1.orders.1"}),
            "not_found",
        ),
        (
            json!({"op": "group.ack", "ack": "$CANOPY.group.ack.billing.1.1.orders.1",
                   "kind": "maybe"}),
            "bad_request",
        ),
        (
            json!({"op": "group.ack", "ack": "$CANOPY.group.ack.billing.1.1.orders.1",
                   "delay_ms": 5}),
            "bad_request",
        ),
        (
            json!({"op": "group.ack", "ack": "$CANOPY.group.ack.billing.1.1.orders.1"}),
            "conflict",
        ),
    ] {
        let got = answer(&mut ws, request.clone()).await;
        assert_eq!(
            (&got["op"], &got["code"]),
            (&json!("error"), &json!(code)),
            "{request} -> {got}"
        );
        assert!(
            !got["message"].as_str().unwrap_or_default().is_empty(),
            "{got}"
        );
    }
    // The connection is still there.
    let (_, done) = ws
        .pull(json!({"op": "group.next", "group": "billing"}))
        .await;
    assert_eq!(done.expect("ends")["op"], "ok");
    server.stop().await;
}

#[tokio::test]
async fn a_ws_member_that_closes_holds_nothing_back() {
    let (server, client) = with_group(
        test_config(),
        json!({"name": "billing", "pattern": "orders.>", "start": "all", "ack_wait_ms": 3000}),
    )
    .await;
    stored(&client, "orders.1", r#"{"n":1}"#).await;
    let http = server.http_addr.expect("the HTTP listener is on");

    // A member takes a message and goes without acking it.
    let mut taker = Ws::open(http, None).await.unwrap();
    let (taken, _) = taker
        .pull(json!({"op": "group.next", "group": "billing", "max": 1}))
        .await;
    assert_eq!(shown(&taken), [("orders.1".into(), 1, 1)]);
    drop(taker);

    // Another asks to wait for messages and goes before any come (well within the
    // first's ack wait, so it is not handed the first's message either).
    {
        use futures::SinkExt;
        let (mut waiter, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
            .await
            .expect("websocket upgrade");
        let pull = json!({"op": "group.next", "id": "w", "group": "billing", "max": 10,
                          "wait_ms": 20000});
        waiter
            .send(tokio_tungstenite::tungstenite::Message::text(
                pull.to_string(),
            ))
            .await
            .expect("send");
        // Its pull waits in the group…
        await_waiting_pulls(&client, "billing", 1).await;
        waiter.close(None).await.expect("close");
    }
    // …until the group sees its connection gone.
    await_waiting_pulls(&client, "billing", 0).await;
    stored(&client, "orders.2", r#"{"n":2}"#).await;

    // What both would have had goes to a member that is there.
    let mut got = next(
        &client,
        json!({"group": "billing", "member": "native", "max": 10, "wait_ms": 5000}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && tokio::time::Instant::now() < deadline {
        got.extend(
            next(
                &client,
                json!({"group": "billing", "member": "native", "max": 10, "wait_ms": 1000}),
            )
            .await,
        );
    }
    assert_eq!(
        delivered(&got),
        [("orders.1".into(), 1, 2), ("orders.2".into(), 1, 1)]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_message_carrying_a_pulls_own_header_names_is_delivered_as_a_message() {
    let (server, client) = with_group(
        test_config(),
        json!({"name": "billing", "pattern": "orders.>", "start": "all"}),
    )
    .await;
    stored(&client, "orders.1", r#"{"n":1}"#).await;
    let mut headers = header("Canopy-Ack", "durable");
    headers.insert("Canopy-Done", "true");
    headers.insert("Canopy-Status", "500");
    headers.insert("X-Kept", "yes");
    let ack = store_request(&client, "orders.2", headers, "tricky").await;
    assert!(ack.get("error").is_none(), "{ack}");
    stored(&client, "orders.3", r#"{"n":3}"#).await;
    let http = server.http_addr.expect("the HTTP listener is on");
    let mut ws = Ws::open(http, None).await.unwrap();
    let (messages, done) = ws
        .pull(json!({"op": "group.next", "group": "billing", "max": 10}))
        .await;
    assert_eq!(
        shown(&messages),
        [
            ("orders.1".into(), 1, 1),
            ("orders.2".into(), 1, 1),
            ("orders.3".into(), 1, 1)
        ]
    );
    assert_eq!(done.expect("ends")["count"], 3);
    let tricky = messages
        .iter()
        .find(|m| m["subject"] == "orders.2")
        .unwrap();
    assert_eq!(tricky["headers"]["X-Kept"], "yes", "{tricky}");
    assert!(
        tricky["headers"].get("Canopy-Done").is_none()
            && tricky["headers"].get("Canopy-Status").is_none(),
        "{tricky}"
    );
    server.stop().await;
}
