//! The HTTP port: health, readiness and Prometheus metrics, read with a plain HTTP/1.1
//! request over TCP.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use serde_json::json;

use crate::common::{metric_sample as sample, publish_acked, start_default};

/// GETs `path` and returns the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    call(addr, "GET", path, "").await
}

/// Sends one HTTP/1.1 request with a (JSON) body; returns the status code and the body.
async fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    crate::common::http_request(addr, method, path, &[], body).await
}

#[tokio::test]
async fn health_readiness_and_metrics_are_served() {
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    assert_eq!(get(http, "/healthz").await.0, 200);
    assert_eq!(get(http, "/readyz").await, (200, "ready\n".to_owned()));

    // One client of each protocol, and a stored publish.
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let _sub = nats.subscribe("metrics.>").await.expect("sub");
    publish_acked(&nats, "metrics.a", "x").await;
    let mqtt = tokio::net::TcpStream::connect(server.mqtt_addr.expect("mqtt"))
        .await
        .expect("mqtt connect");
    let mut mqtt = mqtt;
    // A bare MQTT 3.1.1 CONNECT (client id "m").
    mqtt.write_all(&[
        0x10, 0x0D, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 1, b'm',
    ])
    .await
    .expect("CONNECT");
    let mut connack = [0u8; 4];
    mqtt.read_exact(&mut connack).await.expect("CONNACK");
    assert_eq!(connack, [0x20, 2, 0, 0]);

    let (status, page) = get(http, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        sample(&page, "canopy_connections{protocol=\"native\"}"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(&page, "canopy_connections{protocol=\"mqtt\"}"),
        Some(1.0),
        "{page}"
    );
    assert!(
        sample(&page, "canopy_messages_in_total").is_some_and(|n| n >= 1.0),
        "{page}"
    );
    assert!(
        sample(&page, "canopy_subscriptions").is_some_and(|n| n >= 1.0),
        "{page}"
    );
    assert_eq!(sample(&page, "canopy_mqtt_sessions"), Some(1.0), "{page}");
    let writes = sample(&page, "canopy_store_write_seconds_count").expect("write histogram");
    assert!(writes >= 1.0, "{page}");
    assert_eq!(
        sample(&page, "canopy_store_write_seconds_bucket{le=\"+Inf\"}"),
        Some(writes),
        "the +Inf bucket holds every write"
    );
    assert!(sample(&page, "canopy_store_durable_seconds_count").is_some_and(|n| n >= 1.0));
    assert!(page.contains("# TYPE canopy_store_durable_seconds histogram"));
    server.stop().await;
}

#[tokio::test]
async fn mqtt_over_websocket_speaks_to_native_clients() {
    use canopy_protocols::mqtt::{Decoder, Level, Packet};
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let mut request = format!("ws://{http}/mqtt")
        .into_client_request()
        .expect("request");
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().expect("header"));
    let (mut socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("websocket upgrade");
    assert_eq!(
        response
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some("mqtt"),
        "browsers drop a connection whose subprotocol is not echoed"
    );
    let mut decoder = Decoder::with_level(Level::V311, 1 << 20);
    let mut buf = bytes::BytesMut::new();
    let mut next_packet = async |socket: &mut tokio_tungstenite::WebSocketStream<_>| loop {
        if let Some(packet) = decoder.decode(&mut buf).expect("valid packets") {
            return packet;
        }
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("a message");
        match message {
            Message::Binary(bytes) => buf.extend_from_slice(&bytes),
            other => panic!("MQTT over WebSocket is binary, got {other:?}"),
        }
    };
    // CONNECT (3.1.1, client id "ws"), split over two messages on purpose.
    let connect: &[u8] = &[
        0x10, 0x0E, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 2, b'w', b's',
    ];
    socket
        .send(Message::binary(connect[..5].to_vec()))
        .await
        .expect("send");
    socket
        .send(Message::binary(connect[5..].to_vec()))
        .await
        .expect("send");
    assert!(matches!(next_packet(&mut socket).await, Packet::ConnAck(ref a) if a.code == 0));
    // SUBSCRIBE devices/+/temp (14 bytes) at QoS 0, packet id 1: 2 + 2 + 14 + 1 = 19.
    let mut subscribe = vec![0x82, 19, 0, 1, 0, 14];
    subscribe.extend_from_slice(b"devices/+/temp");
    subscribe.push(0);
    socket.send(Message::binary(subscribe)).await.expect("send");
    assert!(matches!(next_packet(&mut socket).await, Packet::SubAck(_)));

    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    nats.publish("devices.42.temp", "21.5".into())
        .await
        .expect("publish");
    nats.flush().await.expect("flush");
    match next_packet(&mut socket).await {
        Packet::Publish(publish) => {
            assert_eq!(publish.topic.as_str(), "devices/42/temp");
            assert_eq!(&publish.payload[..], b"21.5");
        }
        other => panic!("expected the PUBLISH, got {other:?}"),
    }
    // And back: an MQTT publish over WebSocket reaches a native subscriber.
    let mut native = nats.subscribe("ws.out").await.expect("sub");
    nats.flush().await.expect("flush");
    socket
        .send(Message::binary(vec![
            0x30, 0x0A, 0, 6, b'w', b's', b'/', b'o', b'u', b't', b'h', b'i',
        ]))
        .await
        .expect("send");
    let got = tokio::time::timeout(Duration::from_secs(10), native.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(&got.payload[..], b"hi");
    server.stop().await;
}

/// A `/ws` JSON API client.
struct JsonSocket {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl JsonSocket {
    async fn connect(http: std::net::SocketAddr) -> JsonSocket {
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
            .await
            .expect("websocket upgrade");
        JsonSocket { socket }
    }

    async fn send(&mut self, text: &str) {
        use futures::SinkExt;
        self.socket
            .send(tokio_tungstenite::tungstenite::Message::text(text))
            .await
            .expect("send");
    }

    /// The next text the server sends.
    async fn text(&mut self) -> String {
        use futures::StreamExt;
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), self.socket.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("a message");
            if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
                return text.to_string();
            }
        }
    }

    async fn json(&mut self) -> serde_json::Value {
        serde_json::from_str(&self.text().await).expect("JSON")
    }
}

#[tokio::test]
async fn the_json_websocket_api_subscribes_publishes_and_locks() {
    use futures::StreamExt;
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let mut ws = JsonSocket::connect(http).await;

    ws.send(r#"{"op":"sub","id":"s","pattern":"devices/+/temp"}"#)
        .await;
    let ok = ws.json().await;
    assert_eq!(ok["op"], "ok", "{ok}");
    assert_eq!(ok["id"], "s");
    assert_eq!(ok["pattern"], "devices.*.temp", "MQTT syntax is accepted");
    let sid = ok["sid"].as_u64().expect("a sid");

    // A native publish arrives with its payload in base64 (it does not say it is JSON).
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    nats.publish("devices.42.temp", vec![0u8, 255, 1].into())
        .await
        .expect("publish");
    nats.flush().await.expect("flush");
    let msg = ws.json().await;
    assert_eq!(msg["op"], "msg");
    assert_eq!(msg["sid"], sid);
    assert_eq!(msg["subject"], "devices.42.temp");
    assert_eq!(msg["data_b64"], "AP8B");
    assert_eq!(msg["version"], 1, "stored subjects carry their version");

    // Odd JSON from the browser: its exact bytes reach a native subscriber and come
    // back inline, byte for byte (key order, spacing, a big number, an escape).
    let odd = r#"{"z": 1,   "a":[12345678901234567890123456789, 1.50], "u":"\u00e9"}"#;
    let mut native = nats.subscribe("devices.7.temp").await.expect("sub");
    nats.flush().await.expect("flush");
    ws.send(&format!(
        r#"{{"op":"pub","id":"p1","subject":"devices.7.temp","data":{odd},"expect_version":0}}"#
    ))
    .await;
    let mut texts = [ws.text().await, ws.text().await];
    texts.sort_by_key(|t| !t.contains("\"op\":\"msg\""));
    assert!(
        texts[0].contains(odd),
        "inline data keeps its bytes: {}",
        texts[0]
    );
    let ack: serde_json::Value = serde_json::from_str(&texts[1]).expect("JSON");
    assert_eq!(ack["op"], "ok", "{ack}");
    assert_eq!(ack["id"], "p1");
    assert_eq!(ack["version"], 1);
    let got = tokio::time::timeout(Duration::from_secs(10), native.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(&got.payload[..], odd.as_bytes());

    // A stale expected version is a conflict that names the current version.
    ws.send(
        r#"{"op":"pub","id":"p2","subject":"devices.7.temp","data_b64":"eA==","expect_version":0}"#,
    )
    .await;
    let conflict = ws.json().await;
    assert_eq!(conflict["op"], "error", "{conflict}");
    assert_eq!(conflict["id"], "p2");
    assert_eq!(conflict["code"], "conflict");
    assert_eq!(conflict["current_version"], 1);

    // get, and errors that keep the connection usable.
    ws.send(r#"{"op":"get","id":"g","subject":"devices.7.temp"}"#)
        .await;
    let text = ws.text().await;
    assert!(text.contains(odd), "{text}");
    let stored: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(stored["version"], 1);
    ws.send(r#"{"op":"fly","id":"x"}"#).await;
    let bad = ws.json().await;
    assert_eq!(
        (bad["op"].as_str(), bad["code"].as_str(), bad["id"].as_str()),
        (Some("error"), Some("bad_request"), Some("x"))
    );
    ws.send(r#"{"op":"sub","id":"y","pattern":"a.>.b"}"#).await;
    assert_eq!(ws.json().await["code"], "invalid_pattern");
    ws.send(&format!(r#"{{"op":"unsub","id":"u","sid":{sid}}}"#))
        .await;
    assert_eq!(ws.json().await["op"], "ok");
    server.stop().await;
}

#[tokio::test]
async fn the_json_websocket_api_replays_and_lists_subjects() {
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for (subject, body) in [("orders.1", "a"), ("orders.2", "b"), ("orders.1", "c")] {
        publish_acked(&nats, subject, body).await;
    }
    let mut ws = JsonSocket::connect(http).await;
    // Exact JSON bytes survive a replay page too.
    let odd = r#"{"n": 123456789012345678901234567890,"k" :1}"#;
    ws.send(&format!(
        r#"{{"op":"pub","id":"p","subject":"orders.3","data":{odd}}}"#
    ))
    .await;
    assert_eq!(ws.json().await["op"], "ok");

    ws.send(r#"{"op":"replay","id":"r","subject":"orders.1","from_version":2}"#)
        .await;
    let page = ws.json().await;
    assert_eq!(page["id"], "r");
    let messages = page["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1, "{page}");
    assert_eq!(messages[0]["version"], 2);
    assert_eq!(messages[0]["data_b64"], "Yw==");

    ws.send(r#"{"op":"replay","id":"r2","pattern":"orders/#","max":2}"#)
        .await;
    let first = ws.json().await;
    assert_eq!(
        first["messages"].as_array().map(Vec::len),
        Some(2),
        "{first}"
    );
    assert_eq!(first["caught_up"], false);
    let next = first["next"].as_u64().expect("next");
    ws.send(&format!(
        r#"{{"op":"replay","id":"r3","pattern":"orders.>","from_offset":{next}}}"#
    ))
    .await;
    let text = ws.text().await;
    assert!(text.contains(odd), "{text}");
    let rest: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let subjects: Vec<&str> = rest["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["subject"].as_str())
        .collect();
    assert_eq!(subjects, ["orders.1", "orders.3"]);
    assert_eq!(rest["caught_up"], true);

    ws.send(r#"{"op":"subjects","id":"l","pattern":"orders.*"}"#)
        .await;
    let listed = ws.json().await;
    let names: Vec<(&str, u64)> = listed["subjects"]
        .as_array()
        .expect("subjects")
        .iter()
        .map(|s| {
            (
                s["subject"].as_str().unwrap_or(""),
                s["version"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(names, [("orders.1", 2), ("orders.2", 1), ("orders.3", 1)]);
    server.stop().await;
}

#[tokio::test]
async fn a_json_subscription_from_the_past_continues_live_without_a_gap() {
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for i in 1..=5 {
        publish_acked(&nats, &format!("feed.{}", i % 2), format!("m{i}")).await;
    }
    let mut ws = JsonSocket::connect(http).await;
    ws.send(r#"{"op":"sub","id":"s","pattern":"feed.*","from_offset":2}"#)
        .await;
    assert_eq!(ws.json().await["op"], "ok");
    // Live publishes race the history being sent.
    let publisher = nats.clone();
    let live = tokio::spawn(async move {
        for i in 6..=8 {
            publish_acked(&publisher, &format!("feed.{}", i % 2), format!("m{i}")).await;
        }
    });
    let mut payloads = Vec::new();
    let mut offsets = Vec::new();
    while payloads.len() < 7 {
        let msg = ws.json().await;
        assert_eq!(msg["op"], "msg", "{msg}");
        offsets.push(msg["offset"].as_u64().expect("stored"));
        let data = msg["data_b64"].as_str().expect("bytes");
        let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data)
            .expect("base64");
        payloads.push(String::from_utf8(bytes).expect("text"));
    }
    live.await.expect("publisher ran");
    assert_eq!(
        payloads,
        ["m2", "m3", "m4", "m5", "m6", "m7", "m8"],
        "{offsets:?}"
    );
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "in order, once: {offsets:?}"
    );

    // A subject from a version.
    ws.send(r#"{"op":"sub","id":"v","pattern":"feed.1","from_version":3}"#)
        .await;
    assert_eq!(ws.json().await["op"], "ok");
    let msg = ws.json().await;
    assert_eq!(
        (msg["subject"].as_str(), msg["version"].as_u64()),
        (Some("feed.1"), Some(3))
    );
    let msg = ws.json().await;
    assert_eq!(msg["version"], 4);
    server.stop().await;
}

#[tokio::test]
async fn websocket_connections_are_capped() {
    let mut config = crate::common::test_config();
    config.http.max_websockets = 1;
    let server = crate::common::start(config).await;
    let http = server.http_addr.expect("http on");
    let mut first = JsonSocket::connect(http).await;
    let refused = tokio_tungstenite::connect_async(format!("ws://{http}/ws")).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
        }
        other => panic!("expected 503, got {:?}", other.map(|(_, r)| r.status())),
    }
    let mqtt = tokio_tungstenite::connect_async(format!("ws://{http}/mqtt")).await;
    assert!(mqtt.is_err(), "/mqtt counts against the same cap");
    // The first still works; once it closes, a new one is admitted.
    first.send(r#"{"op":"subjects","id":"l"}"#).await;
    assert_eq!(first.json().await["op"], "ok");
    drop(first);
    let again = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(socket) = tokio_tungstenite::connect_async(format!("ws://{http}/ws")).await {
                return socket;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(again.is_ok(), "a closed connection frees its place");
    server.stop().await;
}

#[tokio::test]
async fn json_snapshots_are_stored_read_and_subscribed_from() {
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for i in 1..=4 {
        publish_acked(&nats, "carts.9", format!(r#"{{"n":{i}}}"#)).await;
    }
    let mut ws = JsonSocket::connect(http).await;
    ws.send(r#"{"op":"snapshot.get","id":"g0","subject":"carts.9"}"#)
        .await;
    let none = ws.json().await;
    assert_eq!(
        (&none["op"], &none["code"]),
        (&json!("error"), &json!("not_found")),
        "{none}"
    );

    // A snapshot past the head is refused and names the head.
    ws.send(r#"{"op":"snapshot.put","id":"p0","subject":"carts.9","version":9,"data":{}}"#)
        .await;
    let refused = ws.json().await;
    assert_eq!(refused["code"], "conflict", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("version 4")),
        "{refused}"
    );

    // Inline JSON comes back as the very same bytes; bytes stay bytes.
    let state = r#"{ "items" : [1,2],"total":1e2 }"#;
    ws.send(&format!(
        r#"{{"op":"snapshot.put","id":"p1","subject":"carts.9","version":2,"data":{state}}}"#
    ))
    .await;
    let put = ws.json().await;
    assert_eq!(
        (&put["op"], &put["version"]),
        (&json!("ok"), &json!(2)),
        "{put}"
    );
    ws.send(r#"{"op":"snapshot.put","id":"p2","subject":"carts.9","version":1,"data_b64":"AAE="}"#)
        .await;
    assert_eq!(ws.json().await["op"], "ok");
    ws.send(r#"{"op":"snapshot.get","id":"g1","subject":"carts.9"}"#)
        .await;
    let text = ws.text().await;
    assert!(text.contains(&format!(r#""data":{state}"#)), "{text}");
    ws.send(r#"{"op":"snapshot.get","id":"g2","subject":"carts.9","version":1}"#)
        .await;
    let older = ws.json().await;
    assert_eq!(
        (&older["version"], &older["data_b64"]),
        (&json!(1), &json!("AAE=")),
        "{older}"
    );

    // The native API reads the JSON mark as a Content-Type.
    let answer = nats
        .request("$CANOPY.snapshot.get", r#"{"subject":"carts.9"}"#.into())
        .await
        .expect("native snapshot");
    let headers = answer.headers.expect("headers");
    assert_eq!(
        headers.get("Content-Type").map(|v| v.as_str()),
        Some("application/json")
    );
    assert_eq!(&answer.payload[..], state.as_bytes());

    // From the snapshot: the snapshot, then versions 3 and 4, then live.
    ws.send(r#"{"op":"sub","id":"s","pattern":"carts.9","from_snapshot":true}"#)
        .await;
    assert_eq!(ws.json().await["op"], "ok");
    let first = ws.json().await;
    assert_eq!(
        (&first["op"], &first["version"], &first["sid"]),
        (&json!("snapshot"), &json!(2), &json!(1)),
        "{first}"
    );
    let versions = [ws.json().await, ws.json().await];
    assert_eq!(
        versions
            .iter()
            .map(|m| m["version"].clone())
            .collect::<Vec<_>>(),
        [json!(3), json!(4)]
    );
    publish_acked(&nats, "carts.9", r#"{"n":5}"#).await;
    let live = ws.json().await;
    assert_eq!(
        (&live["op"], &live["version"]),
        (&json!("msg"), &json!(5)),
        "{live}"
    );

    // Snapshots are per subject.
    ws.send(r#"{"op":"sub","id":"w","pattern":"carts.*","from_snapshot":true}"#)
        .await;
    let wild = ws.json().await;
    assert_eq!(
        (&wild["id"], &wild["code"]),
        (&json!("w"), &json!("bad_request")),
        "{wild}"
    );
    server.stop().await;
}

#[tokio::test]
async fn tenants_over_http() {
    let server = start_default().await;
    let http = server.http_addr.expect("http on");
    let (status, body) = call(
        http,
        "POST",
        "/api/tenants",
        r#"{"name":"acme","limits":{"max_connections":5}}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(http, "POST", "/api/tenants", r#"{"name":"acme"}"#).await;
    assert_eq!(status, 409, "{body}");
    let refused: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(refused["error"]["code"], 409);
    let (status, body) = call(http, "POST", "/api/tenants", "not json").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = call(
        http,
        "PUT",
        "/api/tenants/acme",
        r#"{"limits":{"max_subjects":9}}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(http, "/api/tenants/acme").await;
    assert_eq!(status, 200, "{body}");
    let described: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(described["limits"], json!({"max_subjects": 9}));
    assert_eq!(described["usage"]["subjects"], 0);
    let (_, body) = get(http, "/api/tenants").await;
    let listed: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let names: Vec<&str> = listed["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["acme", "default"]);
    let (status, _) = call(http, "DELETE", "/api/tenants/acme", "").await;
    assert_eq!(status, 200);
    let (status, _) = get(http, "/api/tenants/acme").await;
    assert_eq!(status, 404);
    let (status, _) = call(http, "DELETE", "/api/tenants/default", "").await;
    assert_eq!(status, 400);
    server.stop().await;
}
