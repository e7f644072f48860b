//! The sections for the server and its listeners: `[server]`, `[native]`, `[mqtt]`,
//! `[http]`, `[websocket]` and `[tls]`, each with its defaults.
//!
//! Must never: check one section against another (that is `Config::validate`), or
//! read files or the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// TLS for the listeners, on when `cert_file` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The server's certificate chain, PEM.
    pub cert_file: Option<PathBuf>,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// CA certificates (PEM) for client certificates. Set, clients may present one;
    /// a certificate whose common name is a user (`name@tenant`, or `name` in the
    /// default tenant) logs that user in when nothing else is presented.
    pub client_ca_file: Option<PathBuf>,
    /// Refuse clients without a certificate from `client_ca_file`.
    pub require_client_cert: bool,
    /// The listeners that speak TLS: any of `native`, `mqtt`, `http`.
    pub listeners: Vec<String>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            require_client_cert: false,
            listeners: vec!["native".into(), "mqtt".into(), "http".into()],
        }
    }
}

impl TlsConfig {
    /// Whether `listener` speaks TLS.
    pub fn on(&self, listener: &str) -> bool {
        self.cert_file.is_some() && self.listeners.iter().any(|l| l == listener)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Name announced to clients and written in logs.
    pub name: String,
    /// Accept non-loopback clients although no authentication is configured.
    pub allow_anonymous: bool,
    /// How long shutdown waits for connections to flush.
    pub drain_timeout_secs: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of the HTTP listener (health, readiness, metrics); `None` turns it off.
    pub listen: Option<SocketAddr>,
    /// WebSocket connections (`/ws` and `/mqtt`) open at once.
    pub max_websockets: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            max_websockets: 65_536,
        }
    }
}

/// The JSON WebSocket API (`/ws` on the HTTP port).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebsocketConfig {
    /// Largest message (payload plus the header block it is stored with) or snapshot a
    /// `/ws` client may publish. At most `native.max_payload`, so that what a browser
    /// publishes can be delivered to native clients within the limit their INFO
    /// announces. The WebSocket message limit follows from it (base64 is 4/3 of the
    /// payload, plus room for the JSON): larger messages close with 1009. 0 (the
    /// default) means `native.max_payload`, so one setting moves both.
    pub max_payload: usize,
    /// Bytes that may wait for one connection before it is a slow consumer (closed
    /// with 1008). More lets a browser ride out longer stalls; each connection may
    /// hold about twice this much memory.
    pub max_pending_bytes: usize,
    /// Subscriptions one connection may hold; 0 = no limit but the tenant's. Bounds
    /// what one browser tab can cost the trie.
    pub max_subscriptions: usize,
    /// Seconds one write to the socket may take before the connection is closed: a
    /// browser that stops reading holds its memory no longer than this. Too short
    /// drops clients on slow links.
    pub write_deadline_secs: u64,
}

impl Default for WebsocketConfig {
    fn default() -> Self {
        Self {
            max_payload: 0,
            max_pending_bytes: 64 * 1024 * 1024,
            max_subscriptions: 10_000,
            write_deadline_secs: 10,
        }
    }
}

impl WebsocketConfig {
    pub fn write_deadline(&self) -> Duration {
        Duration::from_secs(self.write_deadline_secs)
    }

    /// The payload limit in force: `max_payload`, or `native`'s when it is 0.
    pub fn payload_limit(&self, native: usize) -> usize {
        if self.max_payload == 0 {
            native
        } else {
            self.max_payload
        }
    }

    /// Bytes one WebSocket message may hold: a message at the payload limit in
    /// base64 (4/3 of it), plus its JSON and headers.
    pub fn max_message_bytes(&self, native: usize) -> usize {
        (self.payload_limit(native) / 3)
            .saturating_mul(4)
            .saturating_add(4)
            .saturating_add(64 * 1024)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Address of the MQTT listener; `None` turns it off.
    pub listen: Option<SocketAddr>,
    /// Largest MQTT packet accepted (announced to v5 clients as Maximum Packet Size).
    pub max_packet_size: usize,
    /// QoS 1 and 2 publishes a client may have unacknowledged (v5 Receive Maximum).
    pub receive_maximum: u16,
    /// QoS 1 and 2 deliveries in flight to a client that announced no Receive Maximum.
    pub max_inflight: u16,
    /// Topic aliases a v5 client may define.
    pub topic_alias_maximum: u16,
    /// Longest keep-alive a client may ask for, in seconds (0: any).
    pub max_keep_alive_secs: u16,
    /// Longest session expiry a client may ask for, in seconds.
    pub max_session_expiry_secs: u32,
    /// Session expiry of a 3.x client that asked for a persistent session.
    pub v3_session_expiry_secs: u32,
    /// Bytes that may wait in one connection's outbox before it is a slow consumer.
    pub max_pending_bytes: usize,
    /// Deliveries waiting for the in-flight window, per connection, in bytes.
    pub max_queued_bytes: usize,
    /// The backlog one offline session may catch up on when it returns.
    pub backlog_max_messages: usize,
    pub backlog_max_bytes: usize,
    pub backlog_max_age_secs: u64,
    /// Seconds one socket write may block before the client is a slow consumer.
    pub write_deadline_secs: u64,
    /// Seconds a client has to send CONNECT after the TCP connection opens.
    pub connect_timeout_secs: u64,
    /// Simultaneous connections on this listener.
    pub max_connections: usize,
    /// Subscriptions per connection; 0 = no limit.
    pub max_subscriptions: usize,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 1883))),
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 64,
            topic_alias_maximum: 64,
            max_keep_alive_secs: 0,
            max_session_expiry_secs: 7 * 24 * 3600,
            v3_session_expiry_secs: 7 * 24 * 3600,
            max_pending_bytes: 16 * 1024 * 1024,
            max_queued_bytes: 16 * 1024 * 1024,
            backlog_max_messages: 100_000,
            backlog_max_bytes: 64 * 1024 * 1024,
            backlog_max_age_secs: 7 * 24 * 3600,
            write_deadline_secs: 10,
            connect_timeout_secs: 10,
            max_connections: 65_536,
            max_subscriptions: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NativeConfig {
    /// Address of the NATS-compatible listener.
    pub listen: SocketAddr,
    /// Largest payload (headers included) a client may publish.
    pub max_payload: usize,
    /// Longest protocol line accepted.
    pub max_control_line: usize,
    /// Bytes that may wait in one connection's outbox before it is a slow consumer.
    pub max_pending_bytes: usize,
    /// Seconds one socket write may block before the client is a slow consumer.
    pub write_deadline_secs: u64,
    /// Seconds between server PINGs.
    pub ping_interval_secs: u64,
    /// Unanswered PINGs before the client is dropped.
    pub max_pings_outstanding: u32,
    /// Subscriptions per connection; 0 = no limit.
    pub max_subscriptions: usize,
    /// Simultaneous connections.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            name: "canopy".into(),
            allow_anonymous: false,
            drain_timeout_secs: 5,
        }
    }
}

impl Default for NativeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 4222)),
            max_payload: 1024 * 1024,
            max_control_line: 4096,
            max_pending_bytes: 64 * 1024 * 1024,
            write_deadline_secs: 10,
            ping_interval_secs: 120,
            max_pings_outstanding: 2,
            max_subscriptions: 100_000,
            max_connections: 65_536,
        }
    }
}

impl NativeConfig {
    pub fn write_deadline(&self) -> Duration {
        Duration::from_secs(self.write_deadline_secs)
    }

    pub fn ping_interval(&self) -> Duration {
        Duration::from_secs(self.ping_interval_secs)
    }
}
