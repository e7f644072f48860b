//! Logging in on the native listener (`authz.require_login`) with async-nats: users
//! and passwords, tokens, failures answered the NATS way, an unknown user costing the
//! same single password check, and a user's tenant deciding what it sees.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{WAIT, publish_acked, replay_subject, start, test_config};

/// A `$CANOPY.` call's answer body.
async fn api(client: &async_nats::Client, name: &str, body: Value) -> Value {
    crate::common::api(client, name, body).await.1
}

async fn log_in(
    url: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, String> {
    options
        .retry_on_initial_connect()
        .max_reconnects(Some(0))
        .connection_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| e.to_string())
}

async fn refused(url: &str, options: async_nats::ConnectOptions) -> String {
    // async-nats reports a refused login as an error event or a failed connect.
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let options = options.event_callback(move |event| {
        let events = events.clone();
        async move {
            let _ = events.send(event.to_string());
        }
    });
    match tokio::time::timeout(WAIT, options.connect(url)).await {
        Ok(Err(error)) => error.to_string(),
        Ok(Ok(_client)) => {
            let event = tokio::time::timeout(WAIT, seen.recv()).await;
            format!("{event:?}")
        }
        Err(_) => "no answer".into(),
    }
}

/// The next message of a `>` subscription that is not a reply to its own requests.
async fn next_outside_inboxes(sub: &mut async_nats::Subscriber) -> async_nats::Message {
    loop {
        let message = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("in time")
            .expect("a message");
        if !message.subject.as_str().starts_with("_INBOX.") {
            return message;
        }
    }
}

/// Connects an MQTT 3.1.1 client with a user name and password; the client once the
/// server accepted it, or the refusal.
async fn mqtt_log_in(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
) -> Result<rumqttc::AsyncClient, String> {
    let mut options = rumqttc::MqttOptions::new(
        format!("login-{}", fastrand::u32(..)),
        addr.ip().to_string(),
        addr.port(),
    );
    options.set_credentials(user, password);
    let (client, mut events) = rumqttc::AsyncClient::new(options, 16);
    let accepted = tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(error) => return Err(format!("{error:?}")),
            }
        }
    })
    .await
    .map_err(|_| "no CONNACK".to_owned())?;
    accepted?;
    // The event loop keeps the connection going while the test uses the client.
    tokio::spawn(async move { while events.poll().await.is_ok() {} });
    Ok(client)
}

/// A server that requires logins, its native URL, and its bootstrap administrator
/// (`admin` / `admin-pw`) logged in.
async fn server_with_admin() -> (canopy::server::RunningServer, String, async_nats::Client) {
    let mut config = test_config();
    config.authz.require_login = true;
    config.authz.bootstrap_admin_password = Some("admin-pw".into());
    let server = start(config).await;
    let url = server.native_url();
    let admin = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into()),
    )
    .await
    .expect("the bootstrap admin logs in");
    (server, url, admin)
}

#[tokio::test]
async fn logins_decide_the_user_and_the_tenant() {
    let mut config = test_config();
    let dir = tempfile::tempdir().expect("tempdir");
    config.store.url = format!("file://{}", dir.path().display());
    // Users are made by an administrator first (an admin login arrives with ACLs).
    let server = start(config.clone()).await;
    let admin = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    api(&admin, "tenant.create", json!({"name": "acme"})).await;
    api(
        &admin,
        "user.create",
        json!({"tenant": "acme", "name": "dev-1", "password": "pw-acme"}),
    )
    .await;
    api(
        &admin,
        "user.create",
        json!({"tenant": "default", "name": "ops", "password": "pw-ops"}),
    )
    .await;
    let token = crate::common::issue_token(&admin, "acme", "dev-1").await;
    api(
        &admin,
        "user.create",
        json!({"tenant": "acme", "name": "dev-2", "password": "pw-2",
               "permissions": {
                   "publish": {"allow": ["devices.{user}.>", "$CANOPY.get"], "deny": ["devices.{user}.secret"]},
                   "subscribe": {"allow": ["devices.{user}.>", "_INBOX.>"]}}}),
    )
    .await;
    let ops_token = crate::common::issue_token(&admin, "default", "ops").await;
    server.stop().await;

    config.authz.require_login = true;
    let server = start(config).await;
    let url = server.native_url();

    let acme = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("dev-1@acme".into(), "pw-acme".into()),
    )
    .await
    .expect("dev-1 logs in");
    let ops = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("ops".into(), "pw-ops".into()),
    )
    .await
    .expect("ops logs in to the default tenant");
    let by_token = log_in(&url, async_nats::ConnectOptions::with_token(token.clone()))
        .await
        .expect("the token logs in");

    // Tenants are apart: the same subject is two streams, and `>` sees only its own.
    let mut ops_all = ops.subscribe(">").await.expect("sub");
    let mut acme_orders = by_token.subscribe("orders.>").await.expect("sub");
    ops.flush().await.expect("flush");
    by_token.flush().await.expect("flush");
    publish_acked(&acme, "orders.1", "acme's").await;
    publish_acked(&ops, "orders.1", "default's").await;
    let got = tokio::time::timeout(WAIT, acme_orders.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(&got.payload[..], b"acme's");
    let got = next_outside_inboxes(&mut ops_all).await;
    assert_eq!(&got.payload[..], b"default's", "default sees only its own");
    let acme_history: Vec<String> = replay_subject(&acme, "orders.1")
        .await
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    assert_eq!(acme_history, ["acme's"]);

    // ACLs: dev-2 may publish only under devices.dev-2 (not its secret) and subscribe
    // only there; a refusal keeps the connection usable.
    let mut watcher = acme.subscribe("devices.>").await.expect("sub");
    acme.flush().await.expect("flush");
    let (errors, mut seen_errors) = tokio::sync::mpsc::unbounded_channel();
    let dev2 = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("dev-2@acme".into(), "pw-2".into())
            .event_callback(move |event| {
                let errors = errors.clone();
                async move {
                    let _ = errors.send(event.to_string());
                }
            }),
    )
    .await
    .expect("dev-2 logs in");
    dev2.publish("devices.dev-1.temp", "not mine".into())
        .await
        .expect("sent");
    dev2.publish("devices.dev-2.secret", "denied".into())
        .await
        .expect("sent");
    dev2.publish("devices.dev-2.temp", "mine".into())
        .await
        .expect("sent");
    dev2.flush().await.expect("the connection stays usable");
    let got = tokio::time::timeout(WAIT, watcher.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(
        (got.subject.as_str(), &got.payload[..]),
        ("devices.dev-2.temp", &b"mine"[..]),
        "the denied publishes went nowhere"
    );
    let mut violations = Vec::new();
    while violations.len() < 2 {
        let event = tokio::time::timeout(WAIT, seen_errors.recv())
            .await
            .expect("the violations are reported")
            .expect("open");
        if event.to_lowercase().contains("permissions violation") {
            violations.push(event);
        }
    }
    assert!(
        violations[0].contains("devices.dev-1.temp"),
        "{violations:?}"
    );
    let _wide = dev2.subscribe("devices.>").await.expect("sent");
    dev2.flush().await.expect("flush");
    let event = tokio::time::timeout(WAIT, seen_errors.recv())
        .await
        .expect("reported")
        .expect("open");
    assert!(
        event
            .to_lowercase()
            .contains("permissions violation for subscription"),
        "{event}"
    );
    // Replay is reading: dev-2 may not read dev-1's stream through the API.
    let (status, _) =
        crate::common::api(&dev2, "get", json!({"subject": "devices.dev-1.temp"})).await;
    assert_eq!(status, 403, "get is denied outside the rules");

    // A tenant's user cannot manage tenants or users.
    let (status, denied) =
        crate::common::api(&acme, "tenant.create", json!({"name": "evil"})).await;
    assert_eq!(status, 403, "{denied}");
    let (status, _) = crate::common::api(
        &acme,
        "user.create",
        json!({"tenant": "acme", "name": "x", "password": "y"}),
    )
    .await;
    assert_eq!(status, 403);

    // HTTP: a bearer token, of the default tenant for administration.
    let http = server.http_addr.expect("http on");
    let request = |headers: Vec<(&'static str, String)>| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        crate::common::http_request(http, "GET", "/api/tenants", &headers, "").await
    };
    assert_eq!(request(vec![]).await.0, 401);
    let bearer = |token: &str| vec![("Authorization", format!("Bearer {token}"))];
    assert_eq!(request(bearer(&token)).await.0, 403, "acme's user");
    let (status, listed) = request(bearer(&ops_token)).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(request(bearer(&format!("{ops_token}x"))).await.0, 401);

    // The JSON WebSocket API: the token as a subprotocol, and the tenant's subjects.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut upgrade = format!("ws://{http}/ws")
        .into_client_request()
        .expect("request");
    upgrade.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        format!("canopy, bearer.{token}").parse().expect("header"),
    );
    let (mut socket, answer) = tokio_tungstenite::connect_async(upgrade)
        .await
        .expect("a token opens /ws");
    assert_eq!(
        answer
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok()),
        Some("canopy")
    );
    {
        use futures::SinkExt;
        socket
            .send(tokio_tungstenite::tungstenite::Message::text(
                r#"{"op":"get","id":"g","subject":"orders.1"}"#,
            ))
            .await
            .expect("send");
    }
    let text = loop {
        let message = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("a message");
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
            break text.to_string();
        }
    };
    let got: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(got["data_b64"], "YWNtZSdz", "acme's orders.1: {got}");
    let anonymous_ws = tokio_tungstenite::connect_async(format!("ws://{http}/ws")).await;
    assert!(anonymous_ws.is_err(), "no token, no /ws");

    // MQTT logs in with the same credentials, into the same tenant.
    let mqtt = server.mqtt_addr.expect("mqtt on");
    let mut acme_devices = acme.subscribe("devices.>").await.expect("sub");
    acme.flush().await.expect("flush");
    let device = mqtt_log_in(mqtt, "dev-1@acme", "pw-acme")
        .await
        .expect("MQTT login");
    device
        .publish("devices/9/temp", rumqttc::QoS::AtLeastOnce, false, "21.5")
        .await
        .expect("publish");
    let got = tokio::time::timeout(WAIT, acme_devices.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(
        (got.subject.as_str(), &got.payload[..]),
        ("devices.9.temp", &b"21.5"[..])
    );
    // The default tenant saw none of it: its next message is its own probe.
    publish_acked(&ops, "probe", "mine").await;
    let got = next_outside_inboxes(&mut ops_all).await;
    assert_eq!(got.subject.as_str(), "probe");
    let via_token = mqtt_log_in(mqtt, "anyone", &token).await;
    assert!(
        via_token.is_ok(),
        "a token as the password: {:?}",
        via_token.err()
    );
    let refused_mqtt = mqtt_log_in(mqtt, "dev-1@acme", "nope").await;
    assert!(
        refused_mqtt
            .as_ref()
            .err()
            .is_some_and(|e| e.contains("BadUserNamePassword")),
        "{:?}",
        refused_mqtt.err()
    );

    // Refusals: the NATS error, the same for a wrong password, an unknown user, an
    // unknown tenant, a bad token and no credentials; each costs one password check
    // at most (none for tokens), known user or not.
    let checks = || server.metrics.snapshot().password_checks;
    let before = checks();
    let wrong = refused(
        &url,
        async_nats::ConnectOptions::with_user_and_password("dev-1@acme".into(), "nope".into()),
    )
    .await;
    assert!(
        wrong.to_lowercase().contains("authorization violation"),
        "{wrong}"
    );
    assert_eq!(checks() - before, 1, "a known user: one check");
    let before = checks();
    let unknown = refused(
        &url,
        async_nats::ConnectOptions::with_user_and_password("ghost@acme".into(), "nope".into()),
    )
    .await;
    assert!(
        unknown.to_lowercase().contains("authorization violation"),
        "{unknown}"
    );
    assert_eq!(
        checks() - before,
        1,
        "an unknown user costs the same one check"
    );
    let before = checks();
    let no_tenant = refused(
        &url,
        async_nats::ConnectOptions::with_user_and_password(
            "dev-1@nowhere".into(),
            "pw-acme".into(),
        ),
    )
    .await;
    assert!(
        no_tenant.to_lowercase().contains("authorization violation"),
        "{no_tenant}"
    );
    assert_eq!(
        checks() - before,
        1,
        "an unknown tenant costs the same one check"
    );
    let forged = format!("{}x", token);
    let bad_token = refused(&url, async_nats::ConnectOptions::with_token(forged)).await;
    assert!(
        bad_token.to_lowercase().contains("authorization violation"),
        "{bad_token}"
    );
    let anonymous = refused(&url, async_nats::ConnectOptions::new()).await;
    assert!(
        anonymous.to_lowercase().contains("authorization violation"),
        "{anonymous}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_bootstrap_admin_sets_up_a_server_that_requires_logins() {
    let mut config = test_config();
    config.authz.require_login = true;
    config.authz.bootstrap_admin_password = Some("first-login".into());
    let server = start(config).await;
    let url = server.native_url();
    let admin = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "first-login".into()),
    )
    .await
    .expect("the bootstrap admin logs in");
    api(&admin, "tenant.create", json!({"name": "acme"})).await;
    let (status, created) = crate::common::api(
        &admin,
        "user.create",
        json!({"tenant": "acme", "name": "dev", "password": "pw"}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("dev@acme".into(), "pw".into()),
    )
    .await
    .expect("the new user logs in");
    let wrong = refused(
        &url,
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "guess".into()),
    )
    .await;
    assert!(
        wrong.to_lowercase().contains("authorization violation"),
        "{wrong}"
    );
    server.stop().await;
}

#[tokio::test]
async fn anonymous_clients_get_only_what_a_tenant_allows_them() {
    let (server, url, admin) = server_with_admin().await;
    // Off by default.
    let anonymous = refused(&url, async_nats::ConnectOptions::new()).await;
    assert!(
        anonymous.to_lowercase().contains("authorization violation"),
        "{anonymous}"
    );

    // The default tenant lets anonymous clients read telemetry, and nothing else.
    let rules = json!({"publish": {"deny": [">"]}, "subscribe": {"allow": ["telemetry.>"]}});
    let (status, body) = crate::common::api(
        &admin,
        "tenant.update",
        json!({"name": "default", "anonymous": rules}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["anonymous"], rules, "{body}");
    let (errors, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let reader = log_in(
        &url,
        async_nats::ConnectOptions::new().event_callback(move |event| {
            let errors = errors.clone();
            async move {
                let _ = errors.send(event.to_string());
            }
        }),
    )
    .await
    .expect("an anonymous client is let in");
    let mut telemetry = reader.subscribe("telemetry.>").await.expect("sub");
    reader.flush().await.expect("flush");
    admin
        .publish("telemetry.pump", "7 bar".into())
        .await
        .expect("pub");
    admin.flush().await.expect("flush");
    let got = tokio::time::timeout(WAIT, telemetry.next())
        .await
        .expect("in time")
        .expect("message");
    assert_eq!(&got.payload[..], b"7 bar");
    reader
        .publish("telemetry.pump", "forged".into())
        .await
        .expect("sent");
    let _denied = reader.subscribe("orders.>").await.expect("sent");
    reader.flush().await.expect("still usable");
    let mut refusals = Vec::new();
    while refusals.len() < 2 {
        let event = tokio::time::timeout(WAIT, seen.recv())
            .await
            .expect("refusals in time")
            .expect("event");
        if event.contains("Permissions Violation") {
            refusals.push(event);
        }
    }

    // Another tenant's anonymous rules, reached over MQTT with the user name `@tenant`.
    let (status, body) = crate::common::api(
        &admin,
        "tenant.create",
        json!({"name": "public", "anonymous": {"publish": {"allow": ["board.>"]},
                                               "subscribe": {"allow": ["board.>"]}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mqtt = crate::mqtt::mqtt_addr(&server);
    let wrong = mqtt_log_in(mqtt, "@public", "a password").await;
    assert!(
        wrong.is_err(),
        "a password is checked, and @public has none"
    );
    let no_password = {
        // A user name and no password at all: MQTT 3.1.1 allows it.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(mqtt).await.expect("tcp");
        // CONNECT, 3.1.1, flags: user name only, clean session; client id "b1",
        // user name "@public".
        let mut packet = vec![0x10, 0];
        packet.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x82, 0, 30]);
        packet.extend_from_slice(&[0, 2, b'b', b'1']);
        packet.extend_from_slice(&[0, 7]);
        packet.extend_from_slice(b"@public");
        packet[1] = (packet.len() - 2) as u8;
        tcp.write_all(&packet).await.expect("send");
        let mut connack = [0u8; 4];
        tokio::time::timeout(WAIT, tcp.read_exact(&mut connack))
            .await
            .expect("in time")
            .expect("CONNACK");
        connack
    };
    assert_eq!(no_password, [0x20, 2, 0, 0], "accepted into public");

    // Rules that allow everything still never make a guest an administrator.
    let (status, body) = crate::common::api(
        &admin,
        "tenant.update",
        json!({"name": "default", "anonymous": {}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let guest = log_in(&url, async_nats::ConnectOptions::new())
        .await
        .expect("a guest");
    let (status, body) =
        crate::common::api(&guest, "tenant.create", json!({"name": "guest-made"})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = crate::common::api(
        &guest,
        "user.create",
        json!({"tenant": "default", "name": "mine", "password": "pw"}),
    )
    .await;
    assert_eq!(status, 403, "{body}");

    // Ending anonymous access refuses the next anonymous client.
    let (status, body) = crate::common::api(
        &admin,
        "tenant.update",
        json!({"name": "default", "anonymous": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("anonymous").is_none(), "{body}");
    let anonymous = refused(&url, async_nats::ConnectOptions::new()).await;
    assert!(
        anonymous.to_lowercase().contains("authorization violation"),
        "{anonymous}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_configured_deny_list_hides_subjects_from_history_and_retained_reads() {
    let mut config = test_config();
    config.authz.deny_subscribe = vec!["secret.>".into()];
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    publish_acked(&client, "secret.plans", "hidden").await;
    publish_acked(&client, "open.plans", "shown").await;
    let history: Vec<String> = crate::common::replay_all(&client, json!({"pattern": ">"}))
        .await
        .into_iter()
        .map(|m| m.subject)
        .collect();
    assert_eq!(history, ["open.plans"]);
    let listed: Vec<Value> = crate::common::list_subjects(&client, ">")
        .await
        .into_iter()
        .map(|s| s["subject"].clone())
        .collect();
    assert_eq!(listed, [json!("open.plans")]);

    // A retained message under the deny list is not handed to a `#` subscriber.
    let mqtt = crate::mqtt::mqtt_addr(&server);
    let options = rumqttc::MqttOptions::new("retainer", mqtt.ip().to_string(), mqtt.port());
    let (publisher, mut events) = rumqttc::AsyncClient::new(options, 16);
    for topic in ["secret/door", "open/door"] {
        publisher
            .publish(
                topic,
                rumqttc::QoS::AtLeastOnce,
                true,
                topic.as_bytes().to_vec(),
            )
            .await
            .expect("queued");
    }
    let mut acked = 0;
    while acked < 2 {
        if let rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_)) =
            tokio::time::timeout(WAIT, events.poll())
                .await
                .expect("in time")
                .expect("connected")
        {
            acked += 1;
        }
    }
    let options = rumqttc::MqttOptions::new("reader", mqtt.ip().to_string(), mqtt.port());
    let (reader, mut events) = rumqttc::AsyncClient::new(options, 16);
    reader
        .subscribe("#", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("queued");
    let mut retained = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_millis(800), async {
        loop {
            if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) = events.poll().await {
                retained.push(p.topic);
            }
        }
    })
    .await;
    assert_eq!(retained, ["open/door"]);
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_names_its_client_id_for_client_id_rules() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let (server, _, admin) = server_with_admin().await;
    let (status, body) = crate::common::api(
        &admin,
        "user.create",
        json!({"tenant": "default", "name": "panel", "password": "pw",
               "permissions": {"subscribe": {"allow": ["commands.{client_id}.>"]}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let token = crate::common::issue_token(&admin, "default", "panel").await;
    let http = server.http_addr.expect("http");
    let sub_answers = async |query: &str, patterns: &[&str]| -> Vec<String> {
        let mut upgrade = format!("ws://{http}/ws{query}")
            .into_client_request()
            .expect("request");
        upgrade.headers_mut().insert(
            "Authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        let (mut socket, _) = tokio_tungstenite::connect_async(upgrade)
            .await
            .expect("upgraded");
        let mut answers = Vec::new();
        for (i, pattern) in patterns.iter().enumerate() {
            let request = json!({"op": "sub", "id": i.to_string(), "pattern": pattern});
            socket
                .send(WsMessage::text(request.to_string()))
                .await
                .expect("send");
            let reply = tokio::time::timeout(WAIT, socket.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("frame");
            let reply: Value =
                serde_json::from_str(&reply.into_text().expect("text")).expect("JSON");
            answers.push(reply["code"].as_str().unwrap_or("ok").to_owned());
        }
        answers
    };
    assert_eq!(
        sub_answers(
            "?client_id=pump-1",
            &["commands.pump-1.>", "commands.pump-2.>"]
        )
        .await,
        ["ok", "forbidden"]
    );
    // Without a name, a `{client_id}` rule allows nothing; "http" is no shared name.
    assert_eq!(
        sub_answers("", &["commands.http.>", "commands.pump-1.>"]).await,
        ["forbidden", "forbidden"]
    );
    server.stop().await;
}

#[tokio::test]
async fn deleting_a_tenant_closes_its_connections() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let (server, url, admin) = server_with_admin().await;
    api(&admin, "tenant.create", json!({"name": "gone"})).await;
    api(
        &admin,
        "user.create",
        json!({"tenant": "gone", "name": "app", "password": "pw"}),
    )
    .await;
    let token = crate::common::issue_token(&admin, "gone", "app").await;

    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let native = log_in(
        &url,
        async_nats::ConnectOptions::with_user_and_password("app@gone".into(), "pw".into())
            .event_callback(move |event| {
                let events = events.clone();
                async move {
                    let _ = events.send(event.to_string());
                }
            }),
    )
    .await
    .expect("native");
    native.flush().await.expect("flush");
    let mqtt = crate::mqtt::mqtt_addr(&server);
    let mut options =
        rumqttc::v5::MqttOptions::new("gone-device", mqtt.ip().to_string(), mqtt.port());
    options.set_credentials("app@gone", "pw");
    let (_device, mut device_events) = rumqttc::v5::AsyncClient::new(options, 8);
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::ConnAck(
                _,
            ))) = device_events.poll().await
            {
                return;
            }
        }
    })
    .await
    .expect("the device connects");
    let http = server.http_addr.expect("http");
    let mut upgrade = format!("ws://{http}/ws")
        .into_client_request()
        .expect("request");
    upgrade.headers_mut().insert(
        "Authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(upgrade).await.expect("ws");
    socket
        .send(tokio_tungstenite::tungstenite::Message::text(
            r#"{"op":"subjects","id":"1"}"#,
        ))
        .await
        .expect("send");
    let _ = tokio::time::timeout(WAIT, socket.next()).await;

    api(&admin, "tenant.delete", json!({"name": "gone"})).await;

    // Native: the reason, then the close.
    let reason = tokio::time::timeout(WAIT, async {
        loop {
            match seen.recv().await {
                Some(event) if event.contains("tenant deleted") => return event,
                Some(_) => {}
                None => return "no event".to_owned(),
            }
        }
    })
    .await
    .expect("the native client is told");
    assert!(reason.contains("Authorization Violation"), "{reason}");
    // MQTT 5: DISCONNECT with reason 0x98, administrative action.
    let disconnect = tokio::time::timeout(WAIT, async {
        loop {
            match device_events.poll().await {
                Ok(rumqttc::v5::Event::Incoming(
                    rumqttc::v5::mqttbytes::v5::Packet::Disconnect(d),
                )) => return format!("{:?}", d.reason_code),
                Ok(_) => {}
                Err(error) => return format!("{error:?}"),
            }
        }
    })
    .await
    .expect("the device is told");
    assert!(disconnect.contains("AdministrativeAction"), "{disconnect}");
    // /ws: close 1008.
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match socket.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(frame))) => {
                    return frame.map(|f| u16::from(f.code));
                }
                Some(Ok(_)) => {}
                _ => return None,
            }
        }
    })
    .await
    .expect("the socket closes");
    assert_eq!(closed, Some(1008));
    server.stop().await;
}

#[tokio::test]
async fn metrics_need_a_login_and_show_a_tenant_only_its_own_lines() {
    let (server, url, admin) = server_with_admin().await;
    for tenant in ["acme", "globex"] {
        api(&admin, "tenant.create", json!({"name": tenant})).await;
        api(
            &admin,
            "user.create",
            json!({"tenant": tenant, "name": "dev", "password": "pw"}),
        )
        .await;
    }
    let admin_token = crate::common::issue_token(&admin, "default", "admin").await;
    let acme_token = crate::common::issue_token(&admin, "acme", "dev").await;
    // A connection in each tenant, so each has lines (a flush: `log_in` may return
    // before the connection is made).
    let mut clients = Vec::new();
    for user in ["dev@acme", "dev@globex"] {
        let options = async_nats::ConnectOptions::with_user_and_password(user.into(), "pw".into());
        let client = log_in(&url, options).await.expect("logs in");
        tokio::time::timeout(WAIT, client.flush())
            .await
            .expect("connected in time")
            .expect("flush");
        clients.push(client);
    }

    let http = server.http_addr.expect("http on");
    let get = |path: &'static str, token: Option<String>| async move {
        let header = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = header
            .iter()
            .map(|h| ("Authorization", h.as_str()))
            .collect();
        crate::common::http_request(http, "GET", path, &headers, "").await
    };
    assert_eq!(get("/healthz", None).await.0, 200, "health stays open");
    assert_eq!(get("/readyz", None).await.0, 200, "readiness stays open");
    assert_eq!(get("/metrics", None).await.0, 401);
    assert_eq!(
        get("/metrics", Some(format!("{acme_token}x"))).await.0,
        401,
        "a bad token"
    );

    // The default tenant's admin: everything, every tenant.
    let (status, page) = get("/metrics", Some(admin_token)).await;
    assert_eq!(status, 200, "{page}");
    for line in [
        "canopy_connections{protocol=\"native\"}",
        "canopy_messages_in_total ",
        "canopy_tenant_connections{tenant=\"acme\"} 1",
        "canopy_tenant_connections{tenant=\"globex\"} 1",
        "canopy_subjects{tenant=\"default\"}",
        "canopy_store_write_seconds_count",
    ] {
        assert!(page.contains(line), "{line} missing:\n{page}");
    }

    // acme's user: acme's lines, nothing server-wide, no other tenant's name.
    let (status, page) = get("/metrics", Some(acme_token)).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("canopy_tenant_connections{tenant=\"acme\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("canopy_subjects{tenant=\"acme\"} 0"),
        "{page}"
    );
    let samples: Vec<&str> = page.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(samples.len() >= 7, "{page}");
    for line in samples {
        assert!(line.contains("{tenant=\"acme\"}"), "not acme's: {line}");
    }
    for name in ["globex", "default"] {
        assert!(!page.contains(name), "{name} shown to acme:\n{page}");
    }

    // A guest (no credentials, let in under the default tenant's anonymous rules)
    // is no user: refused as without a token.
    let (status, body) = crate::common::api(
        &admin,
        "tenant.update",
        json!({"name": "default", "anonymous": {"subscribe": {"allow": ["telemetry.>"]}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get("/metrics", None).await.0, 401, "a guest");
    server.stop().await;
}
