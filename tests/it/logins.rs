//! A server that requires logins, with tenants and users made through the API by the
//! bootstrap administrator, and clients of every front end logged in as those users:
//! async-nats, rumqttc v5, `/ws` (tokio-tungstenite) and `/metrics`. Shared by the
//! tests of wills, response topics and replies (`wills.rs`, `response_topics.rs`,
//! `replies.rs`).
//!
//! Users log in with bearer tokens (no password hashing per connection: fast in
//! debug builds): async-nats with the token, rumqttc with the token as the password,
//! `/ws` with it as a subprotocol. `admin@default` is the bootstrap administrator.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use canopy::config::Config;
use canopy::server::RunningServer;
use futures::{SinkExt, StreamExt};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::{WAIT, api, issue_token, start, test_config};

/// How long a subscriber is watched to show that nothing (more) arrives, where no
/// later message can show it.
pub const QUIET: Duration = Duration::from_millis(500);

pub const ADMIN_PASSWORD: &str = "admin-pw";

/// One user to create: tenant, name, and its rules (`None`: no rules, everything).
pub type UserSpec<'a> = (&'a str, &'a str, Option<Value>);

pub struct Logins {
    pub server: RunningServer,
    /// Bearer tokens by `name@tenant`.
    tokens: HashMap<String, String>,
}

impl Logins {
    /// [`Logins::start_with`] on the test config.
    pub async fn start(tenants: &[&str], users: &[UserSpec<'_>]) -> Logins {
        Self::start_with(test_config(), tenants, users).await
    }

    /// Starts `config` with `authz.require_login` and a bootstrap administrator, who
    /// creates `tenants` and `users`; every user, the administrator included, gets a
    /// token.
    pub async fn start_with(
        mut config: Config,
        tenants: &[&str],
        users: &[UserSpec<'_>],
    ) -> Logins {
        config.authz.require_login = true;
        config.authz.bootstrap_admin_password = Some(ADMIN_PASSWORD.into());
        let server = start(config).await;
        let admin = async_nats::ConnectOptions::with_user_and_password(
            "admin".into(),
            ADMIN_PASSWORD.into(),
        )
        .max_reconnects(Some(0))
        .connect(server.native_url())
        .await
        .expect("the bootstrap administrator logs in");
        for tenant in tenants {
            let (status, body) = api(&admin, "tenant.create", json!({ "name": tenant })).await;
            assert_eq!(status, 200, "tenant.create {tenant}: {body}");
        }
        let mut tokens = HashMap::new();
        for (tenant, name, permissions) in users {
            let mut body = json!({"tenant": tenant, "name": name});
            if let Some(permissions) = permissions {
                body["permissions"] = permissions.clone();
            }
            let (status, created) = api(&admin, "user.create", body).await;
            assert_eq!(status, 200, "user.create {name}@{tenant}: {created}");
            tokens.insert(
                format!("{name}@{tenant}"),
                issue_token(&admin, tenant, name).await,
            );
        }
        tokens.insert(
            "admin@default".into(),
            issue_token(&admin, "default", "admin").await,
        );
        Logins { server, tokens }
    }

    pub fn token(&self, who: &str) -> &str {
        self.tokens
            .get(who)
            .unwrap_or_else(|| panic!("no user {who}"))
    }

    pub fn mqtt_addr(&self) -> SocketAddr {
        crate::mqtt::mqtt_addr(&self.server)
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.server.http_addr.expect("the HTTP listener is on")
    }

    /// A native client logged in as `who` (`name@tenant`).
    pub async fn native(&self, who: &str) -> async_nats::Client {
        self.native_with(who, async_nats::ConnectOptions::new())
            .await
    }

    /// A native client logged in as `who`, with `options` (an event callback, ...).
    pub async fn native_with(
        &self,
        who: &str,
        options: async_nats::ConnectOptions,
    ) -> async_nats::Client {
        options
            .token(self.token(who).to_owned())
            .max_reconnects(Some(0))
            .connection_timeout(Duration::from_secs(10))
            .connect(self.server.native_url())
            .await
            .unwrap_or_else(|e| panic!("{who} logs in over the native protocol: {e}"))
    }

    /// An MQTT 5 client (rumqttc) logged in as `who`, clean start.
    pub async fn mqtt5(&self, who: &str, client_id: &str) -> Mqtt5 {
        Mqtt5::connect(self.mqtt_addr(), client_id, who, self.token(who)).await
    }

    /// A `/ws` connection logged in as `who`.
    pub async fn ws(&self, who: &str) -> Ws {
        Ws::open(self.http_addr(), self.token(who)).await
    }

    /// The value of the metric line `series` (`name{labels}`) in `/metrics`, read as
    /// the administrator; 0 when the series is not there yet.
    pub async fn metric(&self, series: &str) -> u64 {
        let bearer = format!("Bearer {}", self.token("admin@default"));
        let (status, text) = crate::common::http_request(
            self.http_addr(),
            "GET",
            "/metrics",
            &[("Authorization", &bearer)],
            "",
        )
        .await;
        assert_eq!(status, 200, "/metrics: {text}");
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0, |value| {
                value
                    .trim()
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("{series} is not a number: {value:?}"))
                    as u64
            })
    }

    pub async fn stop(self) {
        self.server.stop().await;
    }
}

// ---------------------------------------------------------------------------------
// Native helpers.

/// The next message of `sub` within the wait.
pub async fn next_native(sub: &mut async_nats::Subscriber, what: &str) -> async_nats::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within the wait"))
        .unwrap_or_else(|| panic!("{what}: the subscription ended"))
}

/// Asserts that `sub` receives nothing for [`QUIET`].
pub async fn native_quiet(sub: &mut async_nats::Subscriber, what: &str) {
    if let Ok(got) = tokio::time::timeout(QUIET, sub.next()).await {
        panic!(
            "{what}: expected nothing, got {:?}",
            got.map(|m| (m.subject.to_string(), text(&m.payload)))
        );
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Calls `$CANOPY.<op>` and returns the answer whatever it is.
pub async fn call(client: &async_nats::Client, op: &str, body: Value) -> async_nats::Message {
    tokio::time::timeout(
        WAIT,
        client.request(format!("$CANOPY.{op}"), body.to_string().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("$CANOPY.{op} answers within the wait"))
    .unwrap_or_else(|e| panic!("$CANOPY.{op}: {e}"))
}

/// The `Canopy-Status` of an API answer (200 when it has none).
pub fn status(message: &async_nats::Message) -> u16 {
    match crate::common::header_of(message, "Canopy-Status") {
        None => 200,
        Some(status) => status
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Canopy-Status is not a number: {status:?}")),
    }
}

// ---------------------------------------------------------------------------------
// rumqttc v5.

/// A PUBLISH received by an [`Mqtt5`] client.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub payload: Bytes,
    pub properties: PublishProperties,
}

impl Received {
    pub fn text(&self) -> String {
        text(&self.payload)
    }
}

#[derive(Debug)]
enum Event {
    /// Accepted, or the refusal's name.
    ConnAck(Result<(), String>),
    SubAck(Vec<u8>),
    PubAck(u8),
    Publish(Received),
    Other,
}

fn event_of(event: rumqttc::v5::Event) -> Event {
    use rumqttc::v5::Event as E;
    use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason as P, SubscribeReasonCode as S};
    match event {
        E::Incoming(Packet::ConnAck(ack)) => Event::ConnAck(match ack.code {
            rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success => Ok(()),
            refused => Err(format!("{refused:?}")),
        }),
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
            P::Success => 0x00,
            P::NoMatchingSubscribers => 0x10,
            P::UnspecifiedError => 0x80,
            P::ImplementationSpecificError => 0x83,
            P::NotAuthorized => 0x87,
            P::TopicNameInvalid => 0x90,
            P::PacketIdentifierInUse => 0x91,
            P::QuotaExceeded => 0x97,
            P::PayloadFormatInvalid => 0x99,
        }),
        E::Incoming(Packet::Publish(publish)) => Event::Publish(Received {
            topic: text(&publish.topic),
            payload: publish.payload.clone(),
            properties: publish.properties.clone().unwrap_or_default(),
        }),
        _ => Event::Other,
    }
}

/// One rumqttc v5 connection. Its event loop runs in a task that forwards events and
/// stops at the first connection error (which every wait then reports).
pub struct Mqtt5 {
    client: rumqttc::v5::AsyncClient,
    events: mpsc::UnboundedReceiver<Result<Event, String>>,
    publishes: VecDeque<Received>,
    pub name: String,
}

impl Mqtt5 {
    pub async fn connect(addr: SocketAddr, client_id: &str, user: &str, token: &str) -> Mqtt5 {
        let mut options =
            rumqttc::v5::MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
        options.set_keep_alive(Duration::from_secs(30));
        options.set_credentials(user, token);
        options.set_clean_start(true);
        let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(options, 64);
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let event = eventloop.poll().await.map(event_of);
                let failed = event.is_err();
                if tx.send(event.map_err(|e| e.to_string())).is_err() || failed {
                    return;
                }
            }
        });
        let mut mqtt = Mqtt5 {
            client,
            events,
            publishes: VecDeque::new(),
            name: format!("{client_id} ({user})"),
        };
        match mqtt
            .wait_for("CONNACK", |e| matches!(e, Event::ConnAck(_)))
            .await
        {
            Event::ConnAck(Ok(())) => {}
            other => panic!("{}: the login is refused: {other:?}", mqtt.name),
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
    pub async fn subscribe(&mut self, filter: &str, qos: u8) -> u8 {
        self.client
            .subscribe(filter, rumqttc::v5::mqttbytes::qos(qos).expect("a QoS"))
            .await
            .expect("subscribe queued");
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

    /// Publishes at QoS 1 with `properties` and returns the PUBACK's reason code.
    pub async fn publish1(
        &mut self,
        topic: &str,
        payload: &str,
        properties: PublishProperties,
    ) -> u8 {
        self.client
            .publish_with_properties(
                topic,
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                false,
                payload.as_bytes().to_vec(),
                properties,
            )
            .await
            .expect("publish queued");
        match self
            .wait_for(&format!("PUBACK for {topic}"), |e| {
                matches!(e, Event::PubAck(_))
            })
            .await
        {
            Event::PubAck(code) => code,
            other => unreachable!("{other:?}"),
        }
    }

    pub async fn next_publish(&mut self, what: &str) -> Received {
        if let Some(publish) = self.publishes.pop_front() {
            return publish;
        }
        match self
            .wait_for(what, |e| matches!(e, Event::Publish(_)))
            .await
        {
            Event::Publish(publish) => publish,
            other => unreachable!("{other:?}"),
        }
    }

    /// The next PUBLISH within `wait`, if one comes (and the connection stays up).
    pub async fn try_next_publish(&mut self, wait: Duration) -> Option<Received> {
        if let Some(publish) = self.publishes.pop_front() {
            return Some(publish);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => return None,
                Ok(None) => panic!("{}: the event loop ended", self.name),
                Ok(Some(Err(e))) => panic!("{}: connection error: {e}", self.name),
                Ok(Some(Ok(Event::Publish(publish)))) => return Some(publish),
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// Asserts that no PUBLISH arrives for [`QUIET`] (and that the connection stays up).
    pub async fn quiet(&mut self, what: &str) {
        if let Some(publish) = self.try_next_publish(QUIET).await {
            panic!("{}: {what}: expected nothing, got {publish:?}", self.name);
        }
    }
}

/// Publish properties with a response topic and correlation data.
pub fn request_properties(response_topic: &str, correlation: &[u8]) -> PublishProperties {
    PublishProperties {
        response_topic: Some(response_topic.to_owned()),
        correlation_data: Some(Bytes::copy_from_slice(correlation)),
        ..PublishProperties::default()
    }
}

// ---------------------------------------------------------------------------------
// The JSON WebSocket API.

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct Ws {
    socket: Socket,
    /// Texts that arrived while waiting for a reply.
    queued: VecDeque<Value>,
    next_id: u64,
}

impl Ws {
    pub async fn open(http: SocketAddr, token: &str) -> Ws {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut upgrade = format!("ws://{http}/ws")
            .into_client_request()
            .expect("request");
        upgrade.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            format!("canopy, bearer.{token}").parse().expect("header"),
        );
        let (socket, _) = tokio_tungstenite::connect_async(upgrade)
            .await
            .expect("a token opens /ws");
        Ws {
            socket,
            queued: VecDeque::new(),
            next_id: 0,
        }
    }

    /// The next JSON text from the server.
    async fn read(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("a /ws message within the wait")
                .expect("the socket stays open")
                .expect("a /ws message");
            match message {
                WsMessage::Text(text) => {
                    return serde_json::from_str(text.as_str())
                        .unwrap_or_else(|e| panic!("/ws sent non-JSON ({e}): {text}"));
                }
                WsMessage::Close(frame) => panic!("/ws closed the socket: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Sends `request` with a fresh id and returns the reply carrying that id.
    pub async fn call(&mut self, mut request: Value) -> Value {
        self.next_id += 1;
        let id = format!("r{}", self.next_id);
        request["id"] = json!(id);
        self.socket
            .send(WsMessage::text(request.to_string()))
            .await
            .expect("send on /ws");
        loop {
            let got = self.read().await;
            if got["id"] == json!(id) {
                return got;
            }
            self.queued.push_back(got);
        }
    }

    /// A call that must succeed.
    pub async fn ok(&mut self, request: Value) -> Value {
        let reply = self.call(request.clone()).await;
        assert_eq!(reply["op"], "ok", "{request} -> {reply}");
        reply
    }

    /// A call that must be refused with `code`.
    pub async fn refused(&mut self, request: Value, code: &str) -> Value {
        let reply = self.call(request.clone()).await;
        assert_eq!(
            (reply["op"].as_str(), reply["code"].as_str()),
            (Some("error"), Some(code)),
            "{request} -> {reply}"
        );
        reply
    }

    /// The next text that is not a reply (a `msg`, a `snapshot`, an error of a
    /// subscription's history).
    pub async fn next_event(&mut self) -> Value {
        match self.queued.pop_front() {
            Some(event) => event,
            None => self.read().await,
        }
    }

    /// Asserts that nothing arrives for [`QUIET`].
    pub async fn quiet(&mut self, what: &str) {
        if let Some(event) = self.queued.pop_front() {
            panic!("{what}: expected nothing, got {event}");
        }
        if let Ok(got) = tokio::time::timeout(QUIET, self.socket.next()).await {
            panic!("{what}: expected nothing, got {got:?}");
        }
    }
}
