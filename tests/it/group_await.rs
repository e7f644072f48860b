//! Publishes that wait for consumer groups (`Canopy-Await`, from NATS, MQTT 5 and the
//! CLI) and `$CANOPY.group.wait`: answered only once the group has acked the message,
//! at once when the group cannot, and on timeout with the group still pending.

use std::time::Duration;

use serde_json::json;

use crate::common::{WAIT, api, store_request, test_config};
use crate::groups::{delivered, next, reply, with_group};

fn await_headers(groups: &str, timeout: Option<&str>) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Canopy-Await", groups);
    if let Some(timeout) = timeout {
        headers.insert("Canopy-Await-Timeout", timeout);
    }
    headers
}

/// A server with a group per (name, pattern), and a client of it.
async fn with_groups(
    groups: &[(&str, &str)],
) -> (canopy::server::RunningServer, async_nats::Client) {
    let (first, rest) = groups.split_first().expect("a group");
    let (server, client) =
        with_group(test_config(), json!({"name": first.0, "pattern": first.1})).await;
    for (name, pattern) in rest {
        let (status, created) = api(
            &client,
            "group.create",
            json!({"name": name, "pattern": pattern}),
        )
        .await;
        assert_eq!(status, 200, "{created}");
    }
    (server, client)
}

/// What the group's one member gets from a pull that waits for a first message.
async fn pull(client: &async_nats::Client, group: &str) -> Vec<async_nats::Message> {
    next(
        client,
        json!({"group": group, "member": "worker", "wait_ms": 5000}),
    )
    .await
}

/// A member joins the group by pulling (nothing is there yet), so the group has one.
async fn join(client: &async_nats::Client, group: &str) {
    assert!(
        next(client, json!({"group": group, "member": "worker"}))
            .await
            .is_empty()
    );
}

/// Starts a publish that awaits `groups` and returns its pending answer.
fn publish_awaiting(
    client: &async_nats::Client,
    subject: &'static str,
    headers: async_nats::HeaderMap,
) -> tokio::task::JoinHandle<serde_json::Value> {
    let client = client.clone();
    tokio::spawn(async move { store_request(&client, subject, headers, "order").await })
}

#[tokio::test]
async fn a_publish_awaiting_a_group_is_acked_only_after_the_group_acks_it() {
    let (server, client) = with_groups(&[("billing", "orders.>")]).await;
    join(&client, "billing").await;

    let mut answer = publish_awaiting(&client, "orders.7", await_headers("billing", None));
    let got = pull(&client, "billing").await;
    assert_eq!(delivered(&got), [("orders.7".into(), 1, 1)]);
    // The message is stored and handed out, but its publisher waits for the ack.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut answer)
            .await
            .is_err(),
        "the publish is answered before the group acked it"
    );
    reply(&client, &got[0], "+ACK").await;
    let ack = tokio::time::timeout(WAIT, answer)
        .await
        .expect("answered after the group's ack")
        .unwrap();
    assert_eq!(ack["version"], 1, "{ack}");
    assert_eq!(ack["await"]["passed"], json!(["billing"]), "{ack}");
    assert_eq!(ack["await"]["pending"], json!([]), "{ack}");
    server.stop().await;
}

#[tokio::test]
async fn a_publish_whose_group_does_not_ack_in_time_says_it_is_still_pending() {
    let (server, client) = with_groups(&[("billing", "orders.>"), ("search", "orders.>")]).await;
    join(&client, "billing").await;
    join(&client, "search").await;

    let answer = publish_awaiting(
        &client,
        "orders.8",
        await_headers("billing,search", Some("400ms")),
    );
    // billing acks; search takes the message but never acks.
    let billing = pull(&client, "billing").await;
    let search = pull(&client, "search").await;
    assert_eq!(search.len(), 1);
    reply(&client, &billing[0], "+ACK").await;
    let ack = tokio::time::timeout(WAIT, answer).await.unwrap().unwrap();
    assert!(
        ack.get("error").is_none(),
        "the write stays committed: {ack}"
    );
    assert_eq!(ack["await"]["passed"], json!(["billing"]), "{ack}");
    assert_eq!(
        ack["await"]["pending"],
        json!([{"group": "search", "reason": "timed out"}]),
        "{ack}"
    );
    let stored = crate::common::replay_subject(&client, "orders.8").await;
    assert_eq!(stored.len(), 1, "the message is stored");
    server.stop().await;
}

#[tokio::test]
async fn a_group_that_cannot_pass_the_message_is_answered_at_once() {
    let (server, client) = with_groups(&[("billing", "orders.>"), ("devices", "devices.>")]).await;
    // Nobody consumes billing, devices does not take orders, nosuch does not exist: a
    // minute's wait would never end otherwise, and the answer comes well before it.
    let started = std::time::Instant::now();
    let ack = store_request(
        &client,
        "orders.9",
        await_headers("billing,devices,nosuch", Some("60s")),
        "x",
    )
    .await;
    assert!(started.elapsed() < WAIT, "not waited on");
    assert_eq!(ack["version"], 1, "{ack}");
    assert_eq!(
        ack["await"],
        json!({"passed": [], "pending": [
            {"group": "billing", "reason": "the group has no live members"},
            {"group": "devices", "reason": "the group's pattern does not match the subject"},
            {"group": "nosuch", "reason": "no such group"},
        ]}),
    );
    // A bad await header is refused, and nothing is stored.
    let refused = store_request(&client, "orders.10", await_headers("a b", None), "x").await;
    assert_eq!(refused["error"]["code"], 400, "{refused}");
    assert!(
        crate::common::replay_subject(&client, "orders.10")
            .await
            .is_empty(),
        "nothing refused is stored"
    );
    server.stop().await;
}

#[tokio::test]
async fn group_wait_answers_once_the_group_has_passed_a_version() {
    let (server, client) = with_group(
        test_config(),
        json!({"name": "view", "pattern": "items.*", "start": "all"}),
    )
    .await;
    join(&client, "view").await;
    crate::common::publish_acked(&client, "items.1", "one").await;
    crate::common::publish_acked(&client, "items.1", "two").await;

    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            api(
                &client,
                "group.wait",
                json!({"group": "view", "subject": "items.1", "version": 2}),
            )
            .await
        }
    });
    let first = next(&client, json!({"group": "view", "member": "worker"})).await;
    reply(&client, &first[0], "+ACK").await;
    let second = next(&client, json!({"group": "view", "member": "worker"})).await;
    assert_eq!(delivered(&second), [("items.1".into(), 2, 1)]);
    assert!(!waiting.is_finished(), "version 2 is not acked yet");
    reply(&client, &second[0], "+ACK").await;
    let (status, passed) = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_eq!(status, 200, "{passed}");
    assert_eq!(passed["passed"], true);

    // Passed already: answered at once. Not passed in time: 408.
    let (status, _) = api(
        &client,
        "group.wait",
        json!({"group": "view", "subject": "items.1", "version": 1}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, late) = api(
        &client,
        "group.wait",
        json!({"group": "view", "subject": "items.1", "version": 3, "timeout_ms": 200}),
    )
    .await;
    assert_eq!(status, 408, "{late}");
    let (status, _) = api(
        &client,
        "group.wait",
        json!({"group": "nosuch", "subject": "items.1", "version": 1}),
    )
    .await;
    assert_eq!(status, 404);
    server.stop().await;
}

#[tokio::test]
async fn canopy_pub_await_returns_once_the_group_acks() {
    let (server, client) = with_groups(&[("billing", "orders.>")]).await;
    join(&client, "billing").await;
    let url = server.native_url();
    let publish = tokio::spawn(async move {
        crate::cli::run(&[
            "pub", "orders.1", "paid", "--await", "billing", "--server", &url,
        ])
        .await
    });
    let got = pull(&client, "billing").await;
    assert_eq!(got.len(), 1);
    reply(&client, &got[0], "+ACK").await;
    let output = publish.await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("acked by billing"), "{stdout}");

    // On timeout the command fails and says the message is stored.
    let url = server.native_url();
    let output = crate::cli::run(&[
        "pub",
        "orders.2",
        "paid",
        "--await",
        "billing",
        "--await-timeout",
        "200ms",
        "--server",
        &url,
    ])
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("stored") && stderr.contains("billing (timed out)"),
        "{stderr}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_mqtt5_publish_awaiting_a_group_gets_its_puback_after_the_groups_ack() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};

    let (server, client) = with_groups(&[("billing", "orders.>")]).await;
    join(&client, "billing").await;
    let (mqtt, mut events) = crate::mqtt_native::connected_v5("payer", &server).await;
    let properties = PublishProperties {
        user_properties: vec![("Canopy-Await".into(), "billing".into())],
        ..PublishProperties::default()
    };
    mqtt.publish_with_properties("orders/3", QoS::AtLeastOnce, false, "paid", properties)
        .await
        .unwrap();
    // The event loop sends the publish and waits for its PUBACK meanwhile.
    let puback = tokio::spawn(async move {
        crate::mqtt_native::next_v5(&mut events, |p| match p {
            Packet::PubAck(ack) => Some(ack.clone()),
            _ => None,
        })
        .await
    });
    let got = pull(&client, "billing").await;
    assert_eq!(delivered(&got), [("orders.3".into(), 1, 1)]);
    // A quiet window: a PUBACK that must not come has nothing to wait for. The group
    // got the message after it was stored, so an early PUBACK would be on its way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!puback.is_finished(), "PUBACK before the group's ack");
    reply(&client, &got[0], "+ACK").await;
    let ack = tokio::time::timeout(WAIT, puback).await.unwrap().unwrap();
    assert_eq!(ack.reason, PubAckReason::Success);
    let properties = ack.properties.expect("properties");
    assert!(
        properties
            .user_properties
            .contains(&("Canopy-Await-Passed".to_owned(), "billing".to_owned())),
        "{:?}",
        properties.user_properties
    );
    server.stop().await;
}

#[tokio::test]
async fn a_ws_publish_awaiting_a_group_is_answered_with_what_the_group_did() {
    let (server, client) = with_groups(&[("billing", "orders.>")]).await;
    join(&client, "billing").await;
    let http = server.http_addr.expect("the HTTP listener is on");
    let mut ws = crate::frontends::Ws::open(http, None).await.unwrap();
    let answer = tokio::spawn(async move {
        ws.call(json!({"op": "pub", "subject": "orders.4", "data": "paid",
                       "headers": {"Canopy-Await": "billing"}}))
            .await
    });
    let got = pull(&client, "billing").await;
    assert_eq!(delivered(&got), [("orders.4".into(), 1, 1)]);
    // A quiet window, as above: an answer that must not come has nothing to wait for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!answer.is_finished(), "answered before the group's ack");
    reply(&client, &got[0], "+ACK").await;
    let Some(crate::frontends::WsEvent::Text(answer)) = answer.await.unwrap() else {
        panic!("no answer to the publish");
    };
    assert_eq!(answer["stored"], true, "{answer}");
    assert_eq!(answer["await"]["passed"], json!(["billing"]), "{answer}");
    server.stop().await;
}
