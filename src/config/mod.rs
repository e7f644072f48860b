//! The one typed configuration of a Canopy server: a TOML file, overridden by
//! `CANOPY_<SECTION>__<FIELD>` environment variables, overridden by flags.
//!
//! The defaults live in `config/default.toml` (embedded, printed by
//! `canopy config default`), so the documentation of every field and the values
//! the server runs with can never drift apart: a test checks that the file parses
//! to [`Config::default`]. Loading never panics; a bad file or variable is a
//! [`ConfigError`] that names the culprit.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The commented default configuration, exactly as `canopy config default` prints it.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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
    /// Key streams written out as Iceberg tables.
    pub tables: Vec<TableConfig>,
    /// Several nodes on one object store; absent, this server is one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

mod access;
mod cluster;
mod listeners;
mod store;
mod tables;

pub use access::{AuthzConfig, LimitsConfig};
pub use cluster::{ClusterConfig, MAX_SHARDS};
pub use listeners::{
    HttpConfig, MqttConfig, NativeConfig, ServerConfig, TlsConfig, WebsocketConfig,
};
pub use store::{AckMode, Compression, RetentionConfig, StoreConfig, StorePolicy};
pub use tables::TableConfig;

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
        self.validate_tables()?;
        self.validate_tls()?;
        if self.limits.tenant_api_calls == 0 {
            return Err(ConfigError::Invalid(
                "limits.tenant_api_calls must be at least 1".into(),
            ));
        }
        self.validate_native()?;
        self.validate_websocket()?;
        self.validate_mqtt()?;
        self.validate_store()?;
        self.validate_cluster()?;
        if self.limits.max_subject_len == 0 || self.limits.max_subject_tokens == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_subject_len and limits.max_subject_tokens must be above 0".into(),
            ));
        }
        Ok(())
    }

    /// Each table checks itself, and no table is configured twice.
    fn validate_tables(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        for table in &self.tables {
            table.check().map_err(ConfigError::Invalid)?;
            if !names.insert(table.table.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "tables: {} is configured twice",
                    table.table
                )));
            }
        }
        Ok(())
    }

    /// TLS settings that make a whole: a certificate with its key, listeners that
    /// exist, and the CA that required client certificates are checked against.
    fn validate_tls(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// Native limits that leave room for the protocol and a full-size message.
    fn validate_native(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// The /ws limits, within the native ones: both carry the same messages.
    fn validate_websocket(&self) -> Result<(), ConfigError> {
        let n = &self.native;
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
        Ok(())
    }

    /// MQTT limits within the protocol's, with room for a full-size message.
    fn validate_mqtt(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// A store URL and policy patterns the server understands, and a sequencer
    /// that can take appends.
    fn validate_store(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// A cluster's nodes share one object store that fences a stale writer: S3.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        cluster.check().map_err(ConfigError::Invalid)?;
        if !self.store.url.starts_with("s3://") {
            return Err(ConfigError::Invalid(format!(
                "[cluster] needs store.url on s3:// (the nodes share it, and S3's conditional \
                 writes fence a node that lost its shards); `{}` is not",
                self.store.url
            )));
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
mod tests;
