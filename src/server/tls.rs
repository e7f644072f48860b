//! TLS for the listeners (rustls, with the aws-lc-rs provider): the server's
//! certificate, and optionally client certificates from a CA, whose common name
//! names the user they log in (`name@tenant`, or `name` in the default tenant).
//!
//! Handshakes run in the connection's own task, under a deadline, so a slow or silent
//! client holds only itself. This module must never decide who may do what: it only
//! says which certificate a client proved to hold.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::TlsConfig;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {path}: {reason}")]
    Read {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The listeners' TLS settings, built once at start.
#[derive(Clone)]
pub struct Tls {
    config: Arc<rustls::ServerConfig>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// A finished handshake: the stream, and the user a client certificate names.
pub struct Accepted<S> {
    pub stream: TlsStream<S>,
    pub certified: Option<String>,
}

impl Tls {
    /// The TLS of `config`, or `None` when it has no certificate.
    pub fn from_config(config: &TlsConfig) -> Result<Option<Tls>, TlsError> {
        let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) else {
            return Ok(None);
        };
        let read = |what: &'static str, path: &Path, reason: String| TlsError::Read {
            what,
            path: path.display().to_string(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| read("certificates", cert_file, e.to_string()))?;
        if chain.is_empty() {
            return Err(read("certificates", cert_file, "no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_file(key_file)
            .map_err(|e| read("a private key", key_file, e.to_string()))?;
        // The provider is named: other crates in the process may bring another.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &config.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(ca_file) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca_file)
                    .map_err(|e| read("CA certificates", ca_file, e.to_string()))?
                {
                    let cert = cert.map_err(|e| read("CA certificates", ca_file, e.to_string()))?;
                    roots
                        .add(cert)
                        .map_err(|e| read("CA certificates", ca_file, e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if config.require_client_cert {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let server = Arc::new(
            builder
                .with_single_cert(chain, key)
                .map_err(|e| TlsError::Config(e.to_string()))?,
        );
        Ok(Some(Tls {
            acceptor: TlsAcceptor::from(Arc::clone(&server)),
            config: server,
        }))
    }

    /// The same TLS announcing HTTP/1.1 by ALPN, for the HTTP port. Only there: a
    /// client offering other protocols (MQTT's `mqtt`) would be refused a handshake
    /// whose server lists none of them.
    pub fn for_http(&self) -> Tls {
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        Tls {
            acceptor: TlsAcceptor::from(Arc::clone(&config)),
            config,
        }
    }

    /// Runs the server side of a handshake on `stream`.
    pub async fn accept<S>(&self, stream: S) -> io::Result<Accepted<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        let certified = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|cert| common_name(cert));
        Ok(Accepted { stream, certified })
    }
}

/// The common name of a (verified) certificate's subject.
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(name)
}

/// Writes some of `bytes`, or flushes when there are none: `None` once flushed.
/// A TLS stream may keep what a write accepted until it is flushed, so a connection
/// loop that stops writing must flush once before it waits.
pub async fn write_or_flush(
    writer: &mut (impl AsyncWrite + Unpin),
    bytes: &[u8],
) -> io::Result<Option<usize>> {
    use tokio::io::AsyncWriteExt;
    if bytes.is_empty() {
        writer.flush().await.map(|()| None)
    } else {
        writer.write(bytes).await.map(Some)
    }
}

/// Who is at the other end of an HTTP connection: its address, and the user a
/// verified client certificate names (always `None` without TLS).
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: std::net::SocketAddr,
    pub certified: Option<Arc<str>>,
}

/// A listener whose connections come out of their TLS handshake: for axum, whose
/// accept loop must not wait on one client's handshake. Handshakes run in tasks of
/// their own, at most [`HANDSHAKES_AT_ONCE`] at a time.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, Peer)>,
    local: std::net::SocketAddr,
}

/// Handshakes in progress on one listener; more connections wait to be accepted.
const HANDSHAKES_AT_ONCE: usize = 256;

impl TlsListener {
    pub fn new(
        listener: tokio::net::TcpListener,
        tls: Tls,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (done, ready) = tokio::sync::mpsc::channel(64);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_AT_ONCE));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let accepted = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::warn!(%error, protocol = "http", "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let tls = tls.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    match tls.accept(stream).await {
                        Ok(accepted) => {
                            let peer = Peer {
                                addr: peer,
                                certified: accepted.certified.map(Arc::from),
                            };
                            let _ = done.send((accepted.stream, peer)).await;
                        }
                        Err(error) => {
                            tracing::debug!(%peer, %error, "https TLS handshake failed");
                        }
                    }
                    drop(slot);
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task ended (shutdown): axum's own shutdown ends the serve.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.local,
            certified: None,
        })
    }
}
