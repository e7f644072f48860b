//! What can go wrong for the CLI's client, each said with the `canopy` flag or step
//! that fixes it.
//!
//! Must never: carry a secret (a password or token) into a message.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    // `reason`, not `source`: the message shows it, so it is not a cause to repeat.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        addr: String,
        reason: std::io::Error,
    },
    #[error("connection to the server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server sent something this client cannot read: {0}")]
    Protocol(#[from] canopy_protocols::native::ProtocolError),
    #[error("the server refused: {0}")]
    Server(String),
    #[error("the server closed the connection")]
    Closed,
    #[error("no answer from the server within {0:?}")]
    Timeout(Duration),
    #[error("the server's headers cannot be read: {0}")]
    Headers(#[from] canopy_protocols::native::HeaderError),
    #[error("the server refused the login: {reason}{hint}")]
    LoginRefused {
        /// The server's words, e.g. "Authorization Violation".
        reason: String,
        /// What to try, for the credentials that were presented.
        hint: &'static str,
    },
    #[error(
        "the server at {addr} requires TLS: pass --tls-ca FILE (or set CANOPY_TLS_CA) with \
         the CA certificate that signed its certificate"
    )]
    TlsCaMissing { addr: String },
    #[error(
        "TLS was asked for (--tls-ca) but the server at {addr} does not offer it: leave \
         out --tls-ca, --tls-cert and --tls-key, or check the address"
    )]
    TlsUnavailable { addr: String },
    #[error("cannot read {what} from {path}: {reason}")]
    TlsFile {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS settings: {0}")]
    TlsSettings(String),
    #[error(
        "{host:?} cannot be checked against a certificate: give the server as a DNS name or an IP address"
    )]
    ServerName { host: String },
    #[error("TLS handshake with {addr} failed: {reason}{hint}")]
    Handshake {
        addr: String,
        reason: std::io::Error,
        hint: &'static str,
    },
}
