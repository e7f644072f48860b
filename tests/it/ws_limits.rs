//! The `/ws` API's own limits (`[websocket]`): the message size a browser may publish
//! (payload plus header block), the WebSocket frame limit that follows from it (close
//! code 1009), subscriptions per connection, and the write deadline that closes a
//! socket whose client stopped reading.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use canopy::config::{Config, StorePolicy};
use canopy::metrics::Protocol;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::common::{WAIT, start, test_config};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(http: std::net::SocketAddr) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
        .await
        .expect("websocket upgrade");
    socket
}

async fn send<S>(socket: &mut tokio_tungstenite::WebSocketStream<S>, text: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    socket.send(Message::text(text)).await.expect("send");
}

/// The next text the server sends, as JSON.
async fn json<S>(socket: &mut tokio_tungstenite::WebSocketStream<S>) -> Value
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("a message");
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).expect("JSON");
        }
    }
}

/// A config whose `/ws` clients may publish 4 KiB messages.
fn small_payload_config() -> Config {
    let mut config = test_config();
    config.websocket.max_payload = 4096;
    config
}

/// `NATS/1.0\r\n` + `X-Test: v\r\n` + `\r\n`: the header block a publish with
/// `"headers":{"X-Test":"v"}` and `data_b64` is stored with.
const HEADER_BLOCK: usize = 10 + 11 + 2;

fn publish_text(id: &str, subject: &str, payload: &[u8]) -> String {
    format!(
        r#"{{"op":"pub","id":"{id}","subject":"{subject}","headers":{{"X-Test":"v"}},"data_b64":"{}"}}"#,
        STANDARD.encode(payload)
    )
}

#[tokio::test]
async fn a_publish_at_max_payload_is_stored_and_one_byte_more_is_too_large() {
    let server = start(small_payload_config()).await;
    let mut ws = connect(server.http_addr.expect("http on")).await;
    let payload: Vec<u8> = (0..4096 - HEADER_BLOCK)
        .map(|i| (i * 7 % 256) as u8)
        .collect();

    send(&mut ws, &publish_text("p1", "limits.exact", &payload)).await;
    let ack = json(&mut ws).await;
    assert_eq!(
        (
            ack["op"].as_str(),
            ack["stored"].as_bool(),
            ack["version"].as_u64()
        ),
        (Some("ok"), Some(true), Some(1)),
        "a message of exactly max_payload bytes with its headers: {ack}"
    );
    send(
        &mut ws,
        r#"{"op":"get","id":"g1","subject":"limits.exact"}"#,
    )
    .await;
    let got = json(&mut ws).await;
    assert_eq!(got["headers"]["X-Test"], "v", "{got}");
    let read = STANDARD
        .decode(got["data_b64"].as_str().expect("data_b64"))
        .expect("base64");
    assert_eq!(read, payload, "read back byte for byte");

    let over: Vec<u8> = (0..4096 - HEADER_BLOCK + 1).map(|i| i as u8).collect();
    send(&mut ws, &publish_text("p2", "limits.over", &over)).await;
    let refused = json(&mut ws).await;
    assert_eq!(
        (
            refused["op"].as_str(),
            refused["code"].as_str(),
            refused["id"].as_str()
        ),
        (Some("error"), Some("too_large"), Some("p2")),
        "one byte over, headers counted: {refused}"
    );
    // A snapshot is held to the same limit.
    send(
        &mut ws,
        &format!(
            r#"{{"op":"snapshot.put","id":"s1","subject":"limits.exact","version":1,"data_b64":"{}"}}"#,
            STANDARD.encode(vec![0u8; 4097])
        ),
    )
    .await;
    assert_eq!(json(&mut ws).await["code"], "too_large");

    // The socket goes on: nothing was stored, and requests are still answered.
    send(&mut ws, r#"{"op":"get","id":"g2","subject":"limits.over"}"#).await;
    let missing = json(&mut ws).await;
    assert_eq!(
        (missing["code"].as_str(), missing["id"].as_str()),
        (Some("not_found"), Some("g2")),
        "{missing}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_message_over_the_frame_limit_closes_with_1009() {
    let config = small_payload_config();
    let limit = config
        .websocket
        .max_message_bytes(config.native.max_payload);
    let server = start(config).await;
    let mut ws = connect(server.http_addr.expect("http on")).await;
    let text = publish_text("big", "limits.big", &vec![1u8; limit]);
    assert!(text.len() > limit);
    send(&mut ws, &text).await;
    let close = loop {
        let message = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("in time")
            .expect("a close frame before the end")
            .expect("a message");
        match message {
            Message::Close(frame) => break frame.expect("a close code"),
            Message::Text(text) => {
                let error: Value = serde_json::from_str(&text).expect("JSON");
                assert_eq!(error["code"], "too_large", "{error}");
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(close.code, CloseCode::Size, "{close:?}");
    assert!(close.reason.contains("too big"), "{close:?}");
    server.stop().await;
}

#[tokio::test]
async fn subscriptions_over_the_connection_cap_are_quota_exceeded() {
    let mut config = test_config();
    config.websocket.max_subscriptions = 3;
    let server = start(config).await;
    let mut ws = connect(server.http_addr.expect("http on")).await;
    let mut sids = Vec::new();
    for n in 0..3 {
        send(
            &mut ws,
            &format!(r#"{{"op":"sub","id":"s{n}","pattern":"cap.{n}"}}"#),
        )
        .await;
        let ok = json(&mut ws).await;
        assert_eq!(ok["op"], "ok", "{ok}");
        sids.push(ok["sid"].as_u64().expect("sid"));
    }
    send(&mut ws, r#"{"op":"sub","id":"s3","pattern":"cap.3"}"#).await;
    let refused = json(&mut ws).await;
    assert_eq!(
        (refused["code"].as_str(), refused["id"].as_str()),
        (Some("quota_exceeded"), Some("s3")),
        "{refused}"
    );
    // Giving one back makes room for another.
    send(
        &mut ws,
        &format!(r#"{{"op":"unsub","id":"u","sid":{}}}"#, sids[0]),
    )
    .await;
    assert_eq!(json(&mut ws).await["op"], "ok");
    send(&mut ws, r#"{"op":"sub","id":"s4","pattern":"cap.4"}"#).await;
    assert_eq!(json(&mut ws).await["op"], "ok");
    server.stop().await;
}

#[tokio::test]
async fn a_socket_that_stops_reading_is_closed_after_the_write_deadline() {
    let mut config = test_config();
    config.websocket.write_deadline_secs = 1;
    // Above what the socket buffers hold (a few MiB) and above everything published
    // below, so the outbox never overflows: only the deadline can end the connection.
    config.websocket.max_pending_bytes = 16 << 20;
    config.store.policies.insert(
        0,
        StorePolicy {
            pattern: "flood.>".into(),
            store: false,
            ..StorePolicy::default()
        },
    );
    let server = start(config).await;
    let http = server.http_addr.expect("http on");

    // A client with a small receive buffer that reads its subscription's answer and
    // then nothing more.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let stream = socket.connect(http).await.expect("connect");
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{http}/ws"), stream)
        .await
        .expect("websocket upgrade");
    send(&mut ws, r#"{"op":"sub","id":"s","pattern":"flood.>"}"#).await;
    assert_eq!(json(&mut ws).await["op"], "ok");
    assert_eq!(server.metrics.open_connections(Protocol::WebSocket), 1);

    // 12 MiB, about 16 MiB of JSON: more than the socket can take.
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let payload = bytes::Bytes::from(vec![7u8; 64 * 1024]);
    for _ in 0..192 {
        nats.publish("flood.x", payload.clone())
            .await
            .expect("publish");
    }
    nats.flush().await.expect("flush");

    // Nothing to await on the client's side without reading: watch the server's count.
    tokio::time::timeout(Duration::from_secs(60), async {
        while server.metrics.open_connections(Protocol::WebSocket) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server closes a socket that is not read");
    drop(ws);
    server.stop().await;
}
