//! The one typed configuration of a Canopy server: a TOML file, overridden by
//! `CANOPY_<SECTION>__<FIELD>` environment variables, overridden by flags.
//!
//! The defaults live in `config/default.toml` (embedded, printed by
//! `canopy config default`), so the documentation of every field and the values
//! the server runs with can never drift apart: a test checks that the file parses
//! to [`Config::default`]. Loading never panics; a bad file or variable is a
//! [`ConfigError`] that names the culprit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The commented default configuration, exactly as `canopy config default` prints it.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variables that override configuration fields.
pub const ENV_PREFIX: &str = "CANOPY_";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("environment variable {name} cannot be used: {reason}")]
    Env { name: String, reason: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub native: NativeConfig,
    pub mqtt: MqttConfig,
    pub http: HttpConfig,
    pub websocket: WebsocketConfig,
    pub store: StoreConfig,
    pub limits: LimitsConfig,
    pub authz: AuthzConfig,
    pub tls: TlsConfig,
}

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `file://PATH` or `memory://`.
    pub url: String,
    /// Write-ahead log flush interval: the floor of durable ack latency.
    pub flush_interval_ms: u64,
    /// How long msg ids are remembered for dedupe.
    pub dedupe_window_secs: u64,
    /// Most publishes per group commit.
    pub max_batch: usize,
    /// Publishes queued for the sequencer before publishers wait.
    pub queue_depth: usize,
    /// MiB of memory for cached data blocks of the store.
    pub block_cache_mb: u64,
    /// MiB of memory for cached indexes and filters of the store.
    pub meta_cache_mb: u64,
    /// First match decides whether and how a subject is stored.
    pub policies: Vec<StorePolicy>,
    pub retention: RetentionConfig,
    /// How to reach S3 for `s3://` URLs; unset fields come from the AWS environment.
    pub s3: crate::store::S3Settings,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorePolicy {
    /// NATS-syntax pattern.
    pub pattern: String,
    /// False: matching subjects are live only.
    pub store: bool,
    pub durability: crate::store::Durability,
    pub ack: AckMode,
    /// Seconds a message is kept (0 = forever).
    pub max_age_secs: u64,
    /// Versions kept per subject (0 = all).
    pub max_versions: u64,
    /// Fold each subject into a snapshot every this many versions (0 = never).
    pub snapshot_every: u64,
    /// How events fold into a snapshot.
    pub reducer: crate::store::reduce::ReducerKind,
    /// Keep the events a server snapshot covers (true) or drop them.
    pub keep_history: bool,
}

impl StorePolicy {
    /// The server-side snapshots this policy asks for.
    pub fn compaction(&self) -> Option<crate::store::Compaction> {
        (self.snapshot_every > 0).then_some(crate::store::Compaction {
            every: self.snapshot_every,
            reducer: self.reducer,
            keep_history: self.keep_history,
        })
    }
}

/// When the store acknowledges a publish that has a reply subject.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Only when the publish asks with a Canopy-* or Nats-* header.
    #[default]
    OnRequest,
    /// Every publish with a reply subject (JetStream's behaviour).
    Always,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Bytes kept per tenant, oldest dropped first (0 = no limit).
    pub max_bytes_per_tenant: u64,
    /// Seconds between retention passes.
    pub interval_secs: u64,
}

impl Default for StorePolicy {
    fn default() -> Self {
        Self {
            pattern: ">".into(),
            store: true,
            durability: crate::store::Durability::Durable,
            ack: AckMode::OnRequest,
            max_age_secs: 7 * 24 * 3600,
            max_versions: 0,
            snapshot_every: 0,
            reducer: crate::store::reduce::ReducerKind::Last,
            keep_history: true,
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            max_bytes_per_tenant: 10 * 1024 * 1024 * 1024,
            interval_secs: 60,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "file://./canopy-data".into(),
            flush_interval_ms: 2,
            dedupe_window_secs: 120,
            max_batch: 1024,
            queue_depth: 8192,
            block_cache_mb: 64,
            meta_cache_mb: 64,
            policies: vec![
                StorePolicy {
                    pattern: "_INBOX.>".into(),
                    store: false,
                    ..StorePolicy::default()
                },
                StorePolicy::default(),
            ],
            retention: RetentionConfig::default(),
            s3: crate::store::S3Settings::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_subject_len: usize,
    pub max_subject_tokens: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthzConfig {
    pub deny_publish: Vec<String>,
    pub deny_subscribe: Vec<String>,
    /// Every client logs in (a tenant's user and password, or a token); listeners may
    /// then bind beyond loopback.
    pub require_login: bool,
    /// When set and the default tenant has no user `admin`, one is created at start
    /// with this password and no rules: the first login of a new deployment.
    pub bootstrap_admin_password: Option<String>,
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

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_subject_len: 1024,
            max_subject_tokens: 64,
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

impl Config {
    /// Loads the configuration: the file if given (defaults otherwise), then every
    /// `CANOPY_<SECTION>__<FIELD>` variable of `env`. Flags are applied by the caller.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                parse_table(&text).map_err(|message| ConfigError::Syntax {
                    path: path.to_owned(),
                    message,
                })?
            }
            None => toml::Table::new(),
        };
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            // CANOPY_SERVER is the CLI's address of the server to talk to, not a section.
            if !rest.contains("__") {
                continue;
            }
            apply_env(&mut table, &name, rest, &value)?;
        }
        // Through text again, so that an error quotes the offending line and key.
        let text = toml::to_string(&table).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let config: Config =
            toml::from_str(&text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the relations between fields that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.tls;
        if t.cert_file.is_some() != t.key_file.is_some() {
            return Err(ConfigError::Invalid(
                "tls.cert_file and tls.key_file go together".into(),
            ));
        }
        if let Some(unknown) = t
            .listeners
            .iter()
            .find(|l| !matches!(l.as_str(), "native" | "mqtt" | "http"))
        {
            return Err(ConfigError::Invalid(format!(
                "tls.listeners: no listener {unknown:?} (use native, mqtt and http)"
            )));
        }
        if t.require_client_cert && t.client_ca_file.is_none() {
            return Err(ConfigError::Invalid(
                "tls.require_client_cert needs tls.client_ca_file".into(),
            ));
        }
        let n = &self.native;
        if n.max_payload == 0 {
            return Err(ConfigError::Invalid(
                "native.max_payload must be above 0".into(),
            ));
        }
        if n.max_control_line < 64 {
            return Err(ConfigError::Invalid(
                "native.max_control_line must be at least 64 bytes".into(),
            ));
        }
        if n.max_pending_bytes < n.max_payload {
            return Err(ConfigError::Invalid(format!(
                "native.max_pending_bytes ({}) must be at least native.max_payload ({}), or no \
                 subscriber could receive a full-size message",
                n.max_pending_bytes, n.max_payload
            )));
        }
        if n.ping_interval_secs == 0 || n.max_pings_outstanding == 0 {
            return Err(ConfigError::Invalid(
                "native.ping_interval_secs and native.max_pings_outstanding must be above 0".into(),
            ));
        }
        let w = &self.websocket;
        if w.max_payload > n.max_payload {
            return Err(ConfigError::Invalid(format!(
                "websocket.max_payload ({}) must be at most native.max_payload ({}) (0: the \
                 same), or native clients could not receive what browsers publish",
                w.max_payload, n.max_payload
            )));
        }
        if w.max_pending_bytes < w.payload_limit(n.max_payload) {
            return Err(ConfigError::Invalid(format!(
                "websocket.max_pending_bytes ({}) must be at least the /ws payload limit ({}), \
                 or no browser could receive a full-size message",
                w.max_pending_bytes,
                w.payload_limit(n.max_payload)
            )));
        }
        if w.write_deadline_secs == 0 {
            return Err(ConfigError::Invalid(
                "websocket.write_deadline_secs must be above 0".into(),
            ));
        }
        let m = &self.mqtt;
        if m.max_packet_size < 64 || m.max_packet_size > 268_435_460 {
            return Err(ConfigError::Invalid(
                "mqtt.max_packet_size must be between 64 bytes and 256 MiB".into(),
            ));
        }
        if m.receive_maximum == 0 || m.max_inflight == 0 {
            return Err(ConfigError::Invalid(
                "mqtt.receive_maximum and mqtt.max_inflight must be above 0".into(),
            ));
        }
        if m.max_pending_bytes < m.max_packet_size || m.max_queued_bytes < m.max_packet_size {
            return Err(ConfigError::Invalid(
                "mqtt.max_pending_bytes and mqtt.max_queued_bytes must be at least \
                 mqtt.max_packet_size, or no client could receive a full-size message"
                    .into(),
            ));
        }
        if self.store.url.parse::<crate::store::StoreUrl>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "store.url `{}` is not understood: use file://PATH, s3://BUCKET/PREFIX or memory://",
                self.store.url
            )));
        }
        for policy in &self.store.policies {
            if let Err(e) = canopy_subjects::Pattern::parse_native(&policy.pattern) {
                return Err(ConfigError::Invalid(format!(
                    "store policy pattern `{}`: {e}",
                    policy.pattern
                )));
            }
        }
        if self.store.max_batch == 0 || self.store.queue_depth == 0 {
            return Err(ConfigError::Invalid(
                "store.max_batch and store.queue_depth must be above 0".into(),
            ));
        }
        if self.limits.max_subject_len == 0 || self.limits.max_subject_tokens == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_subject_len and limits.max_subject_tokens must be above 0".into(),
            ));
        }
        Ok(())
    }

    /// The configuration as TOML (without comments), for `canopy config show`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

fn parse_table(text: &str) -> Result<toml::Table, String> {
    text.parse::<toml::Table>().map_err(|e| e.to_string())
}

/// Sets `section.field` from `CANOPY_SECTION__FIELD=value`. The value is read as a
/// TOML value when it is one (numbers, booleans, arrays) and as a string otherwise,
/// so `CANOPY_NATIVE__LISTEN=127.0.0.1:5222` needs no quotes.
fn apply_env(
    table: &mut toml::Table,
    name: &str,
    path: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let keys: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
    if keys.iter().any(String::is_empty) {
        return Err(ConfigError::Env {
            name: name.to_owned(),
            reason: "expected CANOPY_<SECTION>__<FIELD>".into(),
        });
    }
    let parsed = parse_table(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let (last, sections) = keys.split_last().ok_or_else(|| ConfigError::Env {
        name: name.to_owned(),
        reason: "empty path".into(),
    })?;
    let mut node = table;
    for key in sections {
        let entry = node
            .entry(key.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry.as_table_mut().ok_or_else(|| ConfigError::Env {
            name: name.to_owned(),
            reason: format!("`{key}` is not a section"),
        })?;
    }
    node.insert(last.clone(), parsed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_defaults_are_the_defaults() {
        let table = parse_table(DEFAULT_TOML).expect("default.toml parses");
        let parsed = Config::deserialize(toml::Value::Table(table)).expect("default.toml fits");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn env_overrides_file_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("canopy.toml");
        std::fs::write(
            &path,
            "[native]\nlisten = \"127.0.0.1:1000\"\nmax_payload = 2048\n\
             [websocket]\nmax_payload = 2048\n",
        )
        .expect("write");
        let env = vec![
            (
                "CANOPY_NATIVE__LISTEN".to_owned(),
                "127.0.0.1:2000".to_owned(),
            ),
            (
                "CANOPY_AUTHZ__DENY_PUBLISH".to_owned(),
                "[\"a.>\"]".to_owned(),
            ),
            (
                "CANOPY_SERVER".to_owned(),
                "nats://elsewhere:4222".to_owned(),
            ),
            ("HOME".to_owned(), "/root".to_owned()),
        ];
        let config = Config::load(Some(&path), env).expect("loads");
        assert_eq!(
            config.native.listen,
            "127.0.0.1:2000".parse().expect("addr")
        );
        assert_eq!(config.native.max_payload, 2048);
        assert_eq!(config.authz.deny_publish, vec!["a.>".to_owned()]);
    }

    #[test]
    fn bad_input_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[native]\nlisten = 12\n").expect("write");
        let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
        assert!(err.to_string().contains("invalid"), "{err}");

        std::fs::write(&path, "[native\n").expect("write");
        let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
        assert!(err.to_string().contains("not valid TOML"), "{err}");

        std::fs::write(&path, "[native]\nlistn = \"x\"\n").expect("write");
        let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
        assert!(err.to_string().contains("listn"), "{err}");

        let env = vec![("CANOPY_NATIVE__MAX_PAYLOAD".to_owned(), "0".to_owned())];
        let err = Config::load(None, env).expect_err("must fail");
        assert!(err.to_string().contains("max_payload"), "{err}");
    }

    #[test]
    fn websocket_payloads_fit_what_native_clients_accept() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let err = Config::load(
            None,
            env(&[
                ("CANOPY_NATIVE__MAX_PAYLOAD", "65536"),
                ("CANOPY_WEBSOCKET__MAX_PAYLOAD", "65537"),
            ]),
        )
        .expect_err("over native.max_payload");
        assert!(err.to_string().contains("websocket.max_payload"), "{err}");
        let config = Config::load(
            None,
            env(&[
                ("CANOPY_NATIVE__MAX_PAYLOAD", "65536"),
                ("CANOPY_WEBSOCKET__MAX_PAYLOAD", "65536"),
                ("CANOPY_WEBSOCKET__MAX_SUBSCRIPTIONS", "5"),
            ]),
        )
        .expect("at native.max_payload");
        assert_eq!(config.websocket.max_subscriptions, 5);
        // Room for the payload in base64 and the JSON around it.
        assert!(config.websocket.max_message_bytes(65536) >= 65536 * 4 / 3 + 64 * 1024);
        // 0, the default, follows native.max_payload.
        let config = Config::load(None, env(&[("CANOPY_NATIVE__MAX_PAYLOAD", "4096")]))
            .expect("the default follows native");
        assert_eq!(
            config.websocket.payload_limit(config.native.max_payload),
            4096
        );
        let err = Config::load(None, env(&[("CANOPY_WEBSOCKET__WRITE_DEADLINE_SECS", "0")]))
            .expect_err("no deadline");
        assert!(err.to_string().contains("write_deadline_secs"), "{err}");
    }
}
