//! The client's connection: where a URL points, the TLS files and the rustls config
//! built from them, and the stream that starts as plain TCP and upgrades to TLS after
//! INFO.
//!
//! Must never: speak the protocol (that is `Client`'s), or fall back to plain TCP
//! once TLS was asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::error::ClientError;

/// PEM files for TLS: the CA that signed the server's certificate, and optionally a
/// client certificate and its key.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// The rustls configuration these files make; `None` without a CA.
    pub fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>, ClientError> {
        let certificate = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ClientError::TlsSettings(
                    "--tls-cert and --tls-key go together: give both or neither".into(),
                ));
            }
        };
        let Some(ca) = &self.ca else {
            return match certificate {
                Some(_) => Err(ClientError::TlsSettings(
                    "a client certificate needs --tls-ca too (the CA that signed the \
                     server's certificate)"
                        .into(),
                )),
                None => Ok(None),
            };
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certificates("CA certificates", ca)? {
            roots
                .add(cert)
                .map_err(|e| file_error("CA certificates", ca, e))?;
        }
        // The provider is named: the process may link more than one.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::TlsSettings(e.to_string()))?
            .with_root_certificates(roots);
        let config = match certificate {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certificates("a certificate", cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| file_error("a private key", key, e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| ClientError::TlsSettings(format!("the client certificate: {e}")))?
            }
        };
        Ok(Some(Arc::new(config)))
    }
}

pub(super) fn file_error(
    what: &'static str,
    path: &Path,
    reason: impl std::fmt::Display,
) -> ClientError {
    ClientError::TlsFile {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM file; at least one.
pub(super) fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no certificate in it"));
    }
    Ok(certs)
}

/// What to check when a handshake fails for the server's certificate.
pub(super) fn handshake_hint(error: &std::io::Error) -> &'static str {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (is --tls-ca the CA that signed the server's certificate, and the host in \
             --server one of the names it was issued for?)"
        }
        _ => "",
    }
}

/// The connection: plain TCP, or TLS over it. An enum rather than a boxed trait
/// object, so the plain path costs one branch and no virtual call.
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    pub(super) async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(tcp) => tcp.write_all(bytes).await,
            Stream::Tls(tls) => {
                tls.write_all(bytes).await?;
                // Push the records out now: rustls may hold the tail of a write.
                tls.flush().await
            }
        }
    }

    pub(super) async fn read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            Stream::Plain(tcp) => tcp.read_buf(buf).await,
            Stream::Tls(tls) => tls.read_buf(buf).await,
        }
    }

    /// Runs the client side of a TLS handshake on a plain stream.
    pub(super) async fn upgrade(
        self,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
        addr: &str,
        timeout: Duration,
    ) -> Result<Stream, ClientError> {
        let Stream::Plain(tcp) = self else {
            return Ok(self);
        };
        let connector = tokio_rustls::TlsConnector::from(config);
        let tls = tokio::time::timeout(timeout, connector.connect(name, tcp))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|reason| ClientError::Handshake {
                addr: addr.to_owned(),
                hint: handshake_hint(&reason),
                reason,
            })?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

pub use canopy_protocols::address::{address_of, host_port};

/// The name a server's certificate must carry: the host of `url` (a DNS name or an
/// IP address, `[…]` removed from IPv6 ones).
pub fn server_name(url: &str) -> Result<ServerName<'static>, ClientError> {
    let addr = address_of(url);
    let host = addr
        .rsplit_once(':')
        .map_or(addr.as_str(), |(host, _)| host);
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned()).map_err(|_| ClientError::ServerName {
        host: host.to_owned(),
    })
}
