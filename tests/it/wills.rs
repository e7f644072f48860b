//! MQTT wills are published as their client: in the client's tenant, under its rules,
//! never to a subject reserved for the server, and counted for its tenant. On every
//! MQTT level (3.1, 3.1.1, 5) and over WebSocket (`/mqtt`).
//!
//! The client that sets a will is a raw-socket client (its CONNECT built here, byte by
//! byte), because what the test needs is what a library will not do: end the
//! connection without DISCONNECT, and read the exact CONNACK code. The watchers are
//! rumqttc v5 clients subscribed to `#` in each tenant.
//!
//! "Nothing arrives in `default`" is shown by order, not by waiting: once tenant
//! acme's watcher has the will, the default tenant publishes a probe, and the default
//! watcher's first message must be that probe.

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::{WAIT, header_of};
use crate::logins::{Logins, call, status, text};

// ---------------------------------------------------------------------------------
// A raw MQTT client that connects with a will and can vanish.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    V31,
    V311,
    V5,
    /// MQTT 5 over WebSocket at `/mqtt`.
    V5Ws,
}

impl Front {
    fn level(self) -> u8 {
        match self {
            Front::V31 => 3,
            Front::V311 => 4,
            Front::V5 | Front::V5Ws => 5,
        }
    }

    fn v5(self) -> bool {
        self.level() == 5
    }
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (n % 128) as u8;
        n /= 128;
        out.push(if n > 0 { byte | 0x80 } else { byte });
        if n == 0 {
            return;
        }
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&u16::try_from(s.len()).expect("short").to_be_bytes());
    out.extend_from_slice(s);
}

/// A CONNECT with clean session/start, user name, password and a QoS 1 will.
fn connect_packet(
    front: Front,
    client_id: &str,
    user: &str,
    password: &str,
    will: (&str, &str),
) -> Vec<u8> {
    let mut body = Vec::new();
    string(
        if front == Front::V31 {
            b"MQIsdp"
        } else {
            b"MQTT"
        },
        &mut body,
    );
    body.push(front.level());
    // user name, password, will QoS 1, will, clean session
    body.push(0x80 | 0x40 | 0x08 | 0x04 | 0x02);
    body.extend_from_slice(&30u16.to_be_bytes());
    if front.v5() {
        body.push(0); // no CONNECT properties
    }
    string(client_id.as_bytes(), &mut body);
    if front.v5() {
        body.push(0); // no will properties
    }
    string(will.0.as_bytes(), &mut body);
    string(will.1.as_bytes(), &mut body);
    string(user.as_bytes(), &mut body);
    string(password.as_bytes(), &mut body);
    let mut packet = vec![0x10];
    varint(body.len(), &mut packet);
    packet.extend_from_slice(&body);
    packet
}

/// The CONNACK's return code (3.x) or reason code (5), from the bytes so far; `None`
/// while incomplete.
fn connack_code(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [0x20, _len, _flags, code, ..] => Some(*code),
        [first, ..] if *first != 0x20 => panic!("expected CONNACK, got {bytes:?}"),
        _ => None,
    }
}

type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An open connection of the raw client, held until it vanishes.
enum Vanishing {
    Tcp(tokio::net::TcpStream),
    Ws(Box<WsStream>),
}

impl Vanishing {
    /// Closes the socket with no DISCONNECT (and no WebSocket close frame): an
    /// abnormal end of the connection, for which the will is published.
    fn vanish(self) {
        match self {
            Vanishing::Tcp(socket) => drop(socket),
            Vanishing::Ws(socket) => drop(socket),
        }
    }
}

/// Connects with a will; the CONNACK code, and the connection when it stayed open.
async fn connect_with_will(
    f: &Logins,
    front: Front,
    client_id: &str,
    who: &str,
    will: (&str, &str),
) -> (u8, Option<Vanishing>) {
    let packet = connect_packet(front, client_id, who, f.token(who), will);
    let mut got = Vec::new();
    match front {
        Front::V5Ws => {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut upgrade = format!("ws://{}/mqtt", f.http_addr())
                .into_client_request()
                .expect("request");
            upgrade
                .headers_mut()
                .insert("Sec-WebSocket-Protocol", "mqtt".parse().expect("header"));
            let (mut socket, _) = tokio_tungstenite::connect_async(upgrade)
                .await
                .expect("/mqtt upgrades");
            socket
                .send(WsMessage::binary(packet))
                .await
                .expect("CONNECT sent");
            let code = loop {
                if let Some(code) = connack_code(&got) {
                    break code;
                }
                match tokio::time::timeout(WAIT, socket.next()).await {
                    Ok(Some(Ok(WsMessage::Binary(bytes)))) => got.extend_from_slice(&bytes),
                    Ok(Some(Ok(_))) => {}
                    other => panic!("{front:?} {client_id}: no CONNACK: {other:?}"),
                }
            };
            (code, (code == 0).then(|| Vanishing::Ws(Box::new(socket))))
        }
        _ => {
            let mut socket = tokio::net::TcpStream::connect(f.mqtt_addr())
                .await
                .expect("connect");
            socket.write_all(&packet).await.expect("CONNECT sent");
            let code = loop {
                if let Some(code) = connack_code(&got) {
                    break code;
                }
                let mut chunk = [0u8; 256];
                match tokio::time::timeout(WAIT, socket.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                    other => panic!("{front:?} {client_id}: no CONNACK: {other:?}"),
                }
            };
            (code, (code == 0).then_some(Vanishing::Tcp(socket)))
        }
    }
}

// ---------------------------------------------------------------------------------
// 1. A will stays in its client's tenant.

const WILL_TOPIC: &str = "probe/will";

async fn will_stays_in_its_tenant(front: Front) {
    let f = Logins::start(&["acme"], &[("acme", "dev", None), ("acme", "watch", None)]).await;
    let mut default_watch = f.mqtt5("admin@default", "watch-default").await;
    assert_eq!(
        default_watch.subscribe("#", 1).await,
        1,
        "# granted in default"
    );
    let mut acme_watch = f.mqtt5("watch@acme", "watch-acme").await;
    assert_eq!(acme_watch.subscribe("#", 1).await, 1, "# granted in acme");
    let acme_published = "canopy_tenant_published_messages_total{tenant=\"acme\"}";
    let before = f.metric(acme_published).await;

    let payload = format!("the will of a {front:?} client of acme");
    let (code, connection) =
        connect_with_will(&f, front, "dev-1", "dev@acme", (WILL_TOPIC, &payload)).await;
    assert_eq!(
        code, 0,
        "{front:?}: CONNECT with a will on {WILL_TOPIC} is accepted"
    );
    // The socket closes without DISCONNECT: the will is due.
    if let Some(connection) = connection {
        connection.vanish();
    }

    let in_acme = acme_watch.try_next_publish(WAIT).await;
    let admin = f.native("admin@default").await;
    admin
        .publish("probe.default", "default's probe".into())
        .await
        .expect("publish");
    admin.flush().await.expect("flush");
    let first_in_default = default_watch.next_publish("default's probe").await;
    assert!(
        in_acme
            .as_ref()
            .is_some_and(|m| m.topic == WILL_TOPIC && m.text() == payload)
            && first_in_default.topic == "probe/default",
        "{front:?}: acme's watcher on # must get the will of acme's client and default's \
         watcher on # must not; acme's got {in_acme:?}, default's first message was {:?} {:?}",
        first_in_default.topic,
        first_in_default.text()
    );

    // Stored in acme, not in default (probe.> is stored by the default policies).
    let in_default = call(&admin, "get", json!({"subject": "probe.will"})).await;
    assert_eq!(
        status(&in_default),
        404,
        "{front:?}: the will was stored in default: {}",
        text(&in_default.payload)
    );
    let acme = f.native("watch@acme").await;
    let stored = call(&acme, "get", json!({"subject": "probe.will"})).await;
    assert_eq!(status(&stored), 200, "{front:?}: stored in acme");
    assert_eq!(text(&stored.payload), payload);
    assert_eq!(header_of(&stored, "Canopy-Version"), Some("1"));

    // Charged to acme: the will is the one publish acme made.
    assert_eq!(
        f.metric(acme_published).await,
        before + 1,
        "{front:?}: the will counts as one publish of tenant acme"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_will_stays_in_its_clients_tenant_mqtt31() {
    will_stays_in_its_tenant(Front::V31).await;
}

#[tokio::test]
async fn a_will_stays_in_its_clients_tenant_mqtt311() {
    will_stays_in_its_tenant(Front::V311).await;
}

#[tokio::test]
async fn a_will_stays_in_its_clients_tenant_mqtt5() {
    will_stays_in_its_tenant(Front::V5).await;
}

#[tokio::test]
async fn a_will_stays_in_its_clients_tenant_mqtt5_over_websocket() {
    will_stays_in_its_tenant(Front::V5Ws).await;
}

// ---------------------------------------------------------------------------------
// 2. A will the client could not publish is refused at CONNECT.

#[tokio::test]
async fn a_will_topic_denied_or_reserved_is_refused_at_connect() {
    let f = Logins::start(
        &["acme"],
        &[
            (
                "acme",
                "dev",
                Some(json!({"publish": {"allow": ["devices.{user}.>"]}})),
            ),
            ("acme", "free", None),
            ("acme", "watch", None),
        ],
    )
    .await;
    let mut watch = f.mqtt5("watch@acme", "watch").await;
    assert_eq!(watch.subscribe("#", 1).await, 1);
    // Granted or not, no refused will may come of it.
    watch.subscribe("$SYS/#", 1).await;

    // (user, will topic, v5 reason): 0x87 Not authorized for what the rules deny and
    // for subjects reserved for the server, 0x90 Topic Name invalid for a bad topic;
    // 3.x has only 0x05 Not authorized (and closes on a malformed will topic, which
    // is why that case is v5 only).
    let cases = [
        ("dev@acme", "orders/secret", 0x87),
        ("dev@acme", "devices/other/x", 0x87),
        ("free@acme", "$SYS/x", 0x87),
        ("free@acme", "$SYS", 0x87),
        ("free@acme", "$CANOPY/tenant/create", 0x87),
        ("free@acme", "$JS/API/x", 0x87),
        ("free@acme", "a/+/b", 0x90),
    ];
    let mut wrong = Vec::new();
    let mut n = 0;
    for front in [Front::V31, Front::V311, Front::V5, Front::V5Ws] {
        for (who, topic, v5_code) in cases {
            if !front.v5() && v5_code == 0x90 {
                continue;
            }
            n += 1;
            let expected = if front.v5() { v5_code } else { 0x05 };
            let (code, connection) =
                connect_with_will(&f, front, &format!("will-{n}"), who, (topic, "must not")).await;
            if code != expected {
                wrong.push(format!(
                    "{front:?} {who} will on {topic}: CONNACK {code:#04x}, expected {expected:#04x}"
                ));
            }
            if let Some(connection) = connection {
                connection.vanish();
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "wills the client may not publish must be refused at CONNECT:\n  {}",
        wrong.join("\n  ")
    );

    // An allowed will of the same user is accepted and published, and it is the first
    // thing acme's watcher gets: no refused will went out.
    for front in [Front::V31, Front::V311, Front::V5, Front::V5Ws] {
        let payload = format!("allowed, {front:?}");
        let (code, connection) = connect_with_will(
            &f,
            front,
            &format!("will-ok-{front:?}"),
            "dev@acme",
            ("devices/dev/will", &payload),
        )
        .await;
        assert_eq!(code, 0, "{front:?}: an allowed will topic is accepted");
        if let Some(connection) = connection {
            connection.vanish();
        }
        let got = watch.next_publish("the allowed will").await;
        assert_eq!(
            (got.topic.as_str(), got.text()),
            ("devices/dev/will", payload),
            "{front:?}: the allowed will arrives, and nothing before it"
        );
    }
    watch.quiet("no refused will is published").await;
    let acme = f.native("watch@acme").await;
    for subject in ["orders.secret", "devices.other.x"] {
        let got = call(&acme, "get", json!({"subject": subject})).await;
        assert_eq!(status(&got), 404, "{subject}: {}", text(&got.payload));
    }
    f.stop().await;
}
