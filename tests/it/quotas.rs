//! Tenant quotas with real clients: connections, subscriptions, publish rates, stored
//! bytes and subjects, each refused the protocol's way (NATS -ERR or an error ack,
//! MQTT 5 reason 0x97, a WebSocket error), the connection staying usable, and a
//! tenant over its rate not taking anything from another tenant.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::{WAIT, api, header, publish_acked, start, store_request, test_config};

/// Sets the default tenant's limits (anonymous clients belong to it).
pub(crate) async fn limit_default(admin: &async_nats::Client, limits: Value) {
    let (status, body) = api(
        admin,
        "tenant.update",
        json!({"name": "default", "limits": limits}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

async fn usage(admin: &async_nats::Client, tenant: &str) -> Value {
    let (status, body) = api(admin, "tenant.describe", json!({"name": tenant})).await;
    assert_eq!(status, 200, "{body}");
    body["usage"].clone()
}

/// A client whose server errors (-ERR) arrive on the returned channel.
async fn connect_watching(
    url: &str,
    options: async_nats::ConnectOptions,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (errors, seen) = tokio::sync::mpsc::unbounded_channel();
    let client = options
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors.send(error.to_string());
                }
            }
        })
        .connect(url)
        .await
        .expect("connects");
    (client, seen)
}

async fn next_error(seen: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(WAIT, seen.recv())
        .await
        .expect("an error in time")
        .expect("an error")
}

/// Messages that arrive on `sub` until none came for `quiet`.
async fn drain(sub: &mut async_nats::Subscriber, quiet: Duration) -> usize {
    let mut n = 0;
    while let Ok(Some(_)) = tokio::time::timeout(quiet, sub.next()).await {
        n += 1;
    }
    n
}

#[tokio::test]
async fn native_connections_and_subscriptions_are_refused_over_the_quota() {
    let server = start(test_config()).await;
    let url = server.native_url();
    let admin = async_nats::connect(&url).await.expect("connect");
    // The admin's request inbox is one subscription already.
    let _ = usage(&admin, "default").await;
    limit_default(
        &admin,
        json!({"max_connections": 2, "max_subscriptions": 2}),
    )
    .await;

    let (second, mut errors) = connect_watching(&url, async_nats::ConnectOptions::new()).await;
    // A third connection: INFO, then the -ERR, then the close.
    let third = async_nats::ConnectOptions::new()
        .max_reconnects(Some(0))
        .connect(&url)
        .await;
    match third {
        Err(error) => assert!(
            error.to_string().contains("maximum connections exceeded"),
            "{error}"
        ),
        Ok(client) => {
            let flushed = tokio::time::timeout(WAIT, client.flush()).await;
            assert!(
                !matches!(flushed, Ok(Ok(()))),
                "a third connection was served"
            );
        }
    }
    assert_eq!(usage(&admin, "default").await["connections"], 2);

    // One subscription fits beside the admin's inbox; the next is refused and the
    // connection goes on.
    let mut first = second.subscribe("q.a").await.expect("sub");
    second.flush().await.expect("flush");
    let _refused = second.subscribe("q.b").await.expect("sent");
    second.flush().await.expect("flush");
    let error = next_error(&mut errors).await;
    assert!(error.contains("maximum subscriptions exceeded"), "{error}");
    assert!(error.contains("tenant default allows 2"), "{error}");
    admin
        .publish("q.a", "still served".into())
        .await
        .expect("pub");
    admin.flush().await.expect("flush");
    let got = tokio::time::timeout(WAIT, first.next())
        .await
        .expect("in time")
        .expect("message");
    assert_eq!(&got.payload[..], b"still served");

    // A closed connection gives its place back.
    drop(first);
    second.drain().await.expect("closes");
    let mut freed = false;
    let mut seen = json!(null);
    for _ in 0..100 {
        seen = usage(&admin, "default").await;
        if seen["connections"] == 1 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the connection count came back to 1: {seen}");
    let again = async_nats::connect(&url).await.expect("a place again");
    again.flush().await.expect("served");
    server.stop().await;
}

#[tokio::test]
async fn a_native_publisher_over_the_rate_is_told_and_held_back() {
    let server = start(test_config()).await;
    let url = server.native_url();
    let admin = async_nats::connect(&url).await.expect("connect");
    limit_default(&admin, json!({"max_publish_msgs_per_sec": 100})).await;
    let mut sub = admin.subscribe("rate.>").await.expect("sub");
    // A round trip on the same connection: the server took the SUB before it.
    let _ = usage(&admin, "default").await;
    let (publisher, mut errors) = connect_watching(&url, async_nats::ConnectOptions::new()).await;
    for i in 0..300 {
        publisher
            .publish(format!("rate.{}", i % 3), "x".into())
            .await
            .expect("pub");
    }
    // The PONG comes once the server read everything: the throttle has passed.
    tokio::time::timeout(Duration::from_secs(30), publisher.flush())
        .await
        .expect("flushed in time")
        .expect("flush");
    let error = next_error(&mut errors).await;
    assert!(
        error.contains("publish rate exceeded: tenant default allows 100 messages/s"),
        "{error}"
    );
    let received = drain(&mut sub, Duration::from_millis(500)).await;
    let used = usage(&admin, "default").await;
    let refused = used["refused_by_quota"].as_u64().expect("count");
    assert!(refused > 0, "{used}");
    assert_eq!(received as u64 + refused, 300, "{used}");
    assert!(received >= 100, "a second's burst passes: {received}");
    let http = server.http_addr.expect("http");
    let (status, metrics) = crate::common::http_request(http, "GET", "/metrics", &[], "").await;
    assert_eq!(status, 200);
    let line = format!("canopy_tenant_quota_refusals_total{{tenant=\"default\"}} {refused}");
    assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    // Still usable, and the limit can be lifted at once.
    limit_default(&admin, json!({})).await;
    for _ in 0..200 {
        publisher.publish("rate.0", "y".into()).await.expect("pub");
    }
    publisher.flush().await.expect("flush");
    assert_eq!(drain(&mut sub, Duration::from_millis(500)).await, 200);
    server.stop().await;
}

#[tokio::test]
async fn stored_bytes_and_subjects_are_refused_with_errors_and_freed_by_purges() {
    let server = start(test_config()).await;
    let url = server.native_url();
    let (admin, mut errors) = connect_watching(&url, async_nats::ConnectOptions::new()).await;
    limit_default(&admin, json!({"max_subjects": 2, "max_stored_bytes": 1000})).await;
    publish_acked(&admin, "orders.1", "0123456789").await;
    publish_acked(&admin, "orders.2", "0123456789").await;
    let ack = store_request(
        &admin,
        "orders.3",
        header("Canopy-Ack", "durable"),
        "0123456789",
    )
    .await;
    assert_eq!(ack["error"]["err_code"], 10047, "{ack}");
    let text = ack["error"]["description"].as_str().expect("text");
    assert!(text.contains("limit of 2 subjects"), "{ack}");
    // Stored bytes are headers and payloads: here the Canopy-Ack header block too.
    let block = "NATS/1.0\r\nCanopy-Ack: durable\r\n\r\n".len();
    let used = usage(&admin, "default").await;
    let small = block + 10;
    assert_eq!(
        (used["subjects"].clone(), used["stored_bytes"].clone()),
        (json!(2), json!(2 * small))
    );

    // Up to 1000 bytes fit; then an acked publish gets an error ack, and a plain one
    // an -ERR.
    let rest = 1000 - 2 * small - block;
    publish_acked(&admin, "orders.1", vec![b'a'; rest]).await;
    let ack = store_request(&admin, "orders.1", header("Canopy-Ack", "durable"), "x").await;
    assert!(
        ack["error"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("stored bytes")),
        "{ack}"
    );
    admin.publish("orders.1", "y".into()).await.expect("pub");
    admin.flush().await.expect("flush");
    let error = next_error(&mut errors).await;
    assert!(error.contains("stored bytes exceeded"), "{error}");
    assert_eq!(usage(&admin, "default").await["stored_bytes"], 1000);

    // A purge frees what it deleted.
    let (status, body) = api(&admin, "purge", json!({"subject": "orders.1"})).await;
    assert_eq!(status, 200, "{body}");
    let mut freed = json!(null);
    for _ in 0..100 {
        freed = usage(&admin, "default").await["stored_bytes"].clone();
        if freed == small {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(freed, small, "orders.2's message is left");
    publish_acked(&admin, "orders.1", "room again").await;
    server.stop().await;
}

#[tokio::test]
async fn mqtt_5_gets_0x97_and_mqtt_3_is_throttled_without_losing_a_message() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet, PubAckReason};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let server = start(test_config()).await;
    let url = server.native_url();
    let addr = crate::mqtt::mqtt_addr(&server);
    let admin = async_nats::connect(&url).await.expect("connect");
    limit_default(&admin, json!({"max_publish_msgs_per_sec": 5})).await;

    // MQTT 5, QoS 1: over the rate is PUBACK 0x97.
    let options = MqttOptions::new("quota-v5", addr.ip().to_string(), addr.port());
    let (client, mut events) = AsyncClient::new(options, 64);
    for i in 0..20 {
        client
            .publish(format!("q5/{i}"), QoS::AtLeastOnce, false, "x")
            .await
            .expect("queued");
    }
    let mut reasons = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while reasons.len() < 20 {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(ack))) => reasons.push(ack.reason),
                Ok(_) => {}
                Err(error) => panic!("mqtt 5 connection failed: {error:?}"),
            }
        }
    })
    .await
    .expect("20 PUBACKs");
    let refused = reasons
        .iter()
        .filter(|r| **r == PubAckReason::QuotaExceeded)
        .count();
    assert!(refused > 0, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| matches!(r, PubAckReason::QuotaExceeded | PubAckReason::Success)),
        "{reasons:?}"
    );

    // MQTT 3.1.1 cannot be told: every message is taken, the client held back.
    let mut sub = admin.subscribe("q3.>").await.expect("sub");
    let _ = usage(&admin, "default").await;
    let options = rumqttc::MqttOptions::new("quota-v3", addr.ip().to_string(), addr.port());
    let (v3, mut v3_events) = rumqttc::AsyncClient::new(options, 64);
    for i in 0..20 {
        v3.publish(format!("q3/{i}"), rumqttc::QoS::AtLeastOnce, false, "x")
            .await
            .expect("queued");
    }
    let mut acked = 0;
    tokio::time::timeout(Duration::from_secs(30), async {
        while acked < 20 {
            match v3_events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(error) => panic!("mqtt 3 connection failed: {error:?}"),
            }
        }
    })
    .await
    .expect("20 PUBACKs");
    let mut received = 0;
    while received < 20 {
        tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("every message arrives")
            .expect("message");
        received += 1;
    }
    let used = usage(&admin, "default").await;
    assert!(used["throttled_by_quota"].as_u64() > Some(0), "{used}");

    // A connection over the quota: CONNACK 0x97 on MQTT 5.
    limit_default(&admin, json!({"max_connections": 1})).await;
    let options = MqttOptions::new("quota-v5-2", addr.ip().to_string(), addr.port());
    let (_late, mut late_events) = AsyncClient::new(options, 8);
    let code = tokio::time::timeout(WAIT, async {
        loop {
            match late_events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => return Ok(ack.code),
                Ok(_) => {}
                Err(error) => return Err(format!("{error:?}")),
            }
        }
    })
    .await
    .expect("an answer");
    match code {
        Ok(code) => assert_eq!(code, ConnectReturnCode::QuotaExceeded),
        Err(error) => assert!(error.contains("QuotaExceeded"), "{error}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn websocket_refusals_are_error_replies_and_the_socket_goes_on() {
    let server = start(test_config()).await;
    let url = server.native_url();
    let http = server.http_addr.expect("http listener");
    let admin = async_nats::connect(&url).await.expect("connect");
    let subscriptions = usage(&admin, "default").await["subscriptions"]
        .as_u64()
        .expect("count");
    limit_default(
        &admin,
        json!({"max_subscriptions": subscriptions + 1, "max_publish_msgs_per_sec": 2, "max_connections": 2}),
    )
    .await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
        .await
        .expect("ws");
    let mut answer = async |request: Value| -> Value {
        socket
            .send(WsMessage::text(request.to_string()))
            .await
            .expect("send");
        loop {
            let message = tokio::time::timeout(WAIT, socket.next())
                .await
                .expect("an answer")
                .expect("open")
                .expect("frame");
            if let WsMessage::Text(text) = message {
                let value: Value = serde_json::from_str(&text).expect("JSON");
                if value["id"] == request["id"] {
                    return value;
                }
            }
        }
    };
    let ok = answer(json!({"op": "sub", "id": "s1", "pattern": "w.>"})).await;
    assert_eq!(ok["op"], "ok", "{ok}");
    let refused = answer(json!({"op": "sub", "id": "s2", "pattern": "v.>"})).await;
    assert_eq!(
        (refused["op"].clone(), refused["code"].clone()),
        (json!("error"), json!("quota_exceeded")),
        "{refused}"
    );
    let mut codes = Vec::new();
    for i in 0..6 {
        let reply =
            answer(json!({"op": "pub", "id": format!("p{i}"), "subject": "w.x", "data": i})).await;
        codes.push(reply["code"].as_str().unwrap_or("ok").to_owned());
    }
    assert!(codes.iter().any(|c| c == "quota_exceeded"), "{codes:?}");
    assert!(
        codes.iter().all(|c| c == "ok" || c == "quota_exceeded"),
        "{codes:?}"
    );

    // A connection over the quota hears why, then the close.
    let (mut late, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
        .await
        .expect("upgraded");
    let first = tokio::time::timeout(WAIT, late.next())
        .await
        .expect("in time")
        .expect("a frame")
        .expect("frame");
    let text = first.into_text().expect("text");
    assert!(text.contains("maximum connections exceeded"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn a_tenant_over_its_rate_takes_nothing_from_another() {
    let mut config = test_config();
    config.authz.bootstrap_admin_password = Some("admin-pw".into());
    config.authz.require_login = true;
    let server = start(config).await;
    let url = server.native_url();
    let admin =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into())
            .connect(&url)
            .await
            .expect("admin");
    for (tenant, limits) in [
        ("noisy", json!({"max_publish_msgs_per_sec": 20})),
        ("quiet", json!({})),
    ] {
        let (status, body) = api(
            &admin,
            "tenant.create",
            json!({"name": tenant, "limits": limits}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = api(
            &admin,
            "user.create",
            json!({"tenant": tenant, "name": "app", "password": "pw"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let login = |tenant: &str| {
        async_nats::ConnectOptions::with_user_and_password(format!("app@{tenant}"), "pw".into())
            .connect(url.clone())
    };
    let (noisy, quiet) = (
        login("noisy").await.expect("noisy"),
        login("quiet").await.expect("quiet"),
    );
    let mut noisy_sub = noisy.subscribe("t.>").await.expect("sub");
    let mut quiet_sub = quiet.subscribe("t.>").await.expect("sub");
    noisy.flush().await.expect("flush");
    quiet.flush().await.expect("flush");
    let flood = tokio::spawn({
        let noisy = noisy.clone();
        async move {
            for _ in 0..2000 {
                if noisy.publish("t.x", "n".into()).await.is_err() {
                    break;
                }
            }
        }
    });
    for _ in 0..2000 {
        quiet.publish("t.x", "q".into()).await.expect("pub");
    }
    quiet.flush().await.expect("flush");
    let mut got = 0;
    while got < 2000 {
        let message = tokio::time::timeout(WAIT, quiet_sub.next())
            .await
            .expect("every quiet message arrives")
            .expect("message");
        assert_eq!(&message.payload[..], b"q", "only quiet's own");
        got += 1;
    }
    flood.abort();
    let noisy_got = drain(&mut noisy_sub, Duration::from_millis(300)).await;
    assert!(noisy_got < 2000, "the noisy tenant was held to its rate");
    let (_, quiet_usage) = api(&admin, "tenant.describe", json!({"name": "quiet"})).await;
    assert_eq!(quiet_usage["usage"]["refused_by_quota"], 0, "{quiet_usage}");
    server.stop().await;
}

/// Rates per pattern (a tenant's `pattern_rates`), beside the tenant's own: a shared
/// one on `hot.>` refuses past its rate what any client sends there, a per-client one
/// on `own.>` counts each connection apart, other subjects go free; bad rules are
/// refused.
#[tokio::test]
async fn pattern_rates_limit_their_subjects_shared_or_per_client() {
    let server = start(test_config()).await;
    let url = server.native_url();
    let admin = async_nats::connect(&url).await.expect("connect");
    for bad in [
        json!([{"pattern": "hot.>", "msgs_per_sec": 0}]),
        json!([{"pattern": "hot.>"}]),
        json!([{"pattern": "a b", "msgs_per_sec": 5}]),
    ] {
        let (status, body) = api(
            &admin,
            "tenant.update",
            json!({"name": "default", "limits": {"pattern_rates": bad}}),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    limit_default(
        &admin,
        json!({"pattern_rates": [
            {"pattern": "hot.>", "msgs_per_sec": 5},
            {"pattern": "own.>", "msgs_per_sec": 5, "per_client": true},
        ]}),
    )
    .await;
    let first = async_nats::jetstream::new(admin.clone());
    let other = async_nats::connect(&url).await.expect("connect");
    let second = async_nats::jetstream::new(other);
    let mut refusals = Vec::new();
    let mut taken = 0;
    for _ in 0..20 {
        match crate::common::js_publish_to_tenant(&first, "default", "hot.x", "x").await {
            Ok(_) => taken += 1,
            Err(e) => refusals.push(e.to_string()),
        }
    }
    assert!(
        taken >= 5 && !refusals.is_empty(),
        "{taken} taken, {refusals:?}"
    );
    assert!(
        refusals[0].contains("allows 5 messages/s on hot.>"),
        "{}",
        refusals[0]
    );
    for _ in 0..20 {
        crate::common::js_publish_to_tenant(&first, "default", "cold.x", "x")
            .await
            .expect("another subject goes free");
    }
    let mut own_refused = 0;
    for _ in 0..20 {
        if crate::common::js_publish_to_tenant(&first, "default", "own.x", "x")
            .await
            .is_err()
        {
            own_refused += 1;
        }
    }
    assert!(own_refused > 0, "the first client went over its own rate");
    let theirs = crate::common::js_publish_to_tenant(&second, "default", "own.x", "x").await;
    assert!(
        theirs.is_ok(),
        "another client has its own bucket: {theirs:?}"
    );
    server.stop().await;
}

/// A per-client pattern rate belongs to an MQTT client id, not to one connection of
/// it: a device that went over its rate and reconnects finds its bucket as it left
/// it, while another client id has its own.
#[tokio::test]
async fn an_mqtt_client_id_keeps_its_per_client_rate_across_reconnects() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let server = start(test_config()).await;
    let admin = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    // 10 bytes a second, each client its own: a 100-byte message passes on a full
    // bucket and leaves ten seconds of debt.
    limit_default(
        &admin,
        json!({"pattern_rates": [{"pattern": "dev.>", "bytes_per_sec": 10, "per_client": true}]}),
    )
    .await;
    let addr = crate::mqtt::mqtt_addr(&server);
    let publish_once = |id: &'static str| async move {
        let options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        let (client, mut events) = AsyncClient::new(options, 16);
        client
            .publish("dev/x", QoS::AtLeastOnce, false, vec![b'x'; 100])
            .await
            .expect("queued");
        let reason = tokio::time::timeout(WAIT, async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(ack))) => return ack.reason,
                    Ok(_) => {}
                    Err(error) => panic!("mqtt 5 connection failed: {error:?}"),
                }
            }
        })
        .await
        .expect("a PUBACK");
        let _ = client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(1), events.poll()).await;
        reason
    };
    assert_eq!(publish_once("device-1").await, PubAckReason::Success);
    // The same client id again, on a new connection: still in debt.
    assert_eq!(publish_once("device-1").await, PubAckReason::QuotaExceeded);
    // Another client id: a bucket of its own.
    assert_eq!(publish_once("device-2").await, PubAckReason::Success);
    server.stop().await;
}
