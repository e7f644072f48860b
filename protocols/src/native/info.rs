//! The JSON bodies of `CONNECT` (client to server) and `INFO` (server to client).
//!
//! Owns: field names and defaults as NATS clients and servers write them; unknown fields are
//! ignored so newer peers still connect.
//!
//! Must never: check credentials or decide what the options mean (the server does).

use serde::{Deserialize, Serialize};

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a client announces in `CONNECT {json}`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct ConnectOptions {
    /// Ask for `+OK` after every operation.
    pub verbose: bool,
    /// Ask for strict subject checks.
    pub pedantic: bool,
    /// The client requires TLS.
    pub tls_required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lang: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// 0: original protocol; 1: the client understands INFO updates.
    pub protocol: i64,
    /// Deliver this connection's own publications to its subscriptions (default true).
    pub echo: bool,
    /// The client understands HPUB/HMSG.
    pub headers: bool,
    /// The client wants a 503 status message when a request has no responders.
    #[serde(skip_serializing_if = "is_false")]
    pub no_responders: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nkey: Option<String>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            verbose: false,
            pedantic: false,
            tls_required: false,
            auth_token: None,
            user: None,
            pass: None,
            name: None,
            lang: None,
            version: None,
            protocol: 0,
            echo: true,
            headers: false,
            no_responders: false,
            sig: None,
            jwt: None,
            nkey: None,
        }
    }
}

/// What a server announces in `INFO {json}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ServerInfo {
    pub server_id: String,
    pub server_name: String,
    /// A NATS-like version: clients parse it.
    pub version: String,
    /// 1 for servers that send INFO updates.
    pub proto: i32,
    pub go: String,
    pub host: String,
    pub port: u16,
    /// The server accepts HPUB and sends HMSG.
    pub headers: bool,
    /// Clients refuse to publish more than this; 0 makes every publish fail.
    pub max_payload: usize,
    pub client_id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<String>,
    pub auth_required: bool,
    pub tls_required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The client addresses (`host:port`) of every node of the server's cluster,
    /// which clients add to the servers they reconnect to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connect_urls: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_defaults_and_unknown_fields() {
        let o: ConnectOptions = serde_json::from_str(r#"{"lang":"rust","zzz":{"a":1}}"#).unwrap();
        assert!(o.echo);
        assert_eq!(o.lang.as_deref(), Some("rust"));
        assert_eq!(
            o,
            ConnectOptions {
                lang: Some("rust".into()),
                ..ConnectOptions::default()
            }
        );
        let o: ConnectOptions = serde_json::from_str(r#"{"echo":false,"protocol":1}"#).unwrap();
        assert!(!o.echo);
        assert_eq!(o.protocol, 1);
    }

    #[test]
    fn connect_round_trips() {
        let o = ConnectOptions {
            verbose: true,
            user: Some("u".into()),
            pass: Some("p".into()),
            headers: true,
            no_responders: true,
            ..ConnectOptions::default()
        };
        let json = serde_json::to_string(&o).unwrap();
        assert!(!json.contains("auth_token"));
        assert_eq!(serde_json::from_str::<ConnectOptions>(&json).unwrap(), o);
    }

    #[test]
    fn info_skips_absent_options() {
        let info = ServerInfo {
            server_id: "id".into(),
            max_payload: 1024,
            ..ServerInfo::default()
        };
        let json = serde_json::to_string(&info).unwrap();
        assert!(!json.contains("nonce"));
        assert!(!json.contains("client_ip"));
        assert_eq!(serde_json::from_str::<ServerInfo>(&json).unwrap(), info);
    }
}
