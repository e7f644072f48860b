//! A small native-protocol client for the `canopy` CLI: connect, publish,
//! subscribe, receive. It speaks the same wire protocol any NATS client does, with
//! Canopy's own codec from `canopy-protocols`.
//!
//! It logs in the way NATS clients do (user and password, or a token, in CONNECT)
//! and speaks TLS the way they do: INFO arrives in the clear, and when it says
//! `tls_required` (or the caller gave a CA) the client runs a TLS handshake (rustls,
//! the aws-lc-rs provider named explicitly) and sends CONNECT over it. A client
//! certificate may stand in for a password.
//!
//! It is a tool for people at a terminal, not a general client library: one
//! connection, one task, no reconnects. Its errors name the `canopy` flags that fix
//! them. It must never be used inside the server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ConnectOptions, HeaderMap, Limits, ServerDecoder, ServerInfo, ServerOp, encode_connect,
    encode_hpub, encode_ping, encode_pong, encode_pub, encode_sub,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Writes are sent once this many bytes are buffered.
const WRITE_BATCH: usize = 64 * 1024;

/// Room for the metadata headers of an API answer beyond `max_payload` (the subject,
/// at most the server's subject limit, plus a few numbers).
const REPLY_METADATA: usize = 64 * 1024;

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

/// How the client connects and logs in: what `canopy`'s connection flags give.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The client's name in CONNECT (shown in the server's logs).
    pub name: String,
    /// How long to wait for the server at each step.
    pub timeout: Duration,
    /// `name@tenant`, or `name` in the default tenant; `@tenant` alone asks for that
    /// tenant's anonymous access.
    pub user: Option<String>,
    pub password: Option<String>,
    /// A bearer token (`cnp.…`).
    pub token: Option<String>,
    pub tls: TlsFiles,
}

impl ClientOptions {
    /// No credentials and no TLS files.
    pub fn new(name: impl Into<String>, timeout: Duration) -> ClientOptions {
        ClientOptions {
            name: name.into(),
            timeout,
            user: None,
            password: None,
            token: None,
            tls: TlsFiles::default(),
        }
    }

    /// What to suggest when a login with these credentials is refused.
    fn refusal_hint(&self) -> &'static str {
        if self.token.is_some() {
            " (is the token revoked, or its user deleted? get a new one with `canopy user token`)"
        } else if self.password.is_some() {
            " (check --user, written name@tenant outside the default tenant, and --password)"
        } else if self.tls.cert.is_some() {
            " (the certificate's common name must name an existing user, name@tenant)"
        } else {
            " (this server requires a login: pass --user and --password, or --token; \
             without them only a tenant's anonymous rules apply)"
        }
    }
}

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

fn file_error(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> ClientError {
    ClientError::TlsFile {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM file; at least one.
fn read_certificates(
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
fn handshake_hint(error: &std::io::Error) -> &'static str {
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
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Plain(tcp) => tcp.write_all(bytes).await,
            Stream::Tls(tls) => {
                tls.write_all(bytes).await?;
                // Push the records out now: rustls may hold the tail of a write.
                tls.flush().await
            }
        }
    }

    async fn read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            Stream::Plain(tcp) => tcp.read_buf(buf).await,
            Stream::Tls(tls) => tls.read_buf(buf).await,
        }
    }

    /// Runs the client side of a TLS handshake on a plain stream.
    async fn upgrade(
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

/// One message received on a subscription.
#[derive(Debug, Clone)]
pub struct Received {
    pub subject: String,
    pub reply: Option<String>,
    pub headers: Option<HeaderMap>,
    pub payload: Bytes,
}

pub struct Client {
    stream: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: ServerDecoder,
    info: ServerInfo,
    next_sid: u64,
}

/// `nats://host:port`, `host:port` or `host` (port 4222) → `host:port`.
pub fn address_of(url: &str) -> String {
    host_port(url, 4222)
}

/// `scheme://host:port`, `host:port` or `host` (then `default_port`) → `host:port`. Any
/// scheme is dropped, so `mqtt://` URLs (`canopy bench --protocol mqtt`) read the same way.
pub fn host_port(url: &str, default_port: u16) -> String {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    if rest
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        rest.to_owned()
    } else {
        format!("{rest}:{default_port}")
    }
}

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

impl Client {
    /// Connects, reads INFO, runs the TLS handshake when the server requires it (or
    /// `options` give a CA), sends CONNECT with the credentials and waits for the
    /// server to accept it.
    pub async fn connect(url: &str, options: &ClientOptions) -> Result<Client, ClientError> {
        let timeout = options.timeout;
        // Files first: a mistake in them is found before the network is touched.
        let tls = options.tls.client_config()?;
        let addr = address_of(url);
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|reason| ClientError::Connect {
                addr: addr.clone(),
                reason,
            })?;
        let _ = stream.set_nodelay(true);
        let mut client = Client {
            stream: Stream::Plain(stream),
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::new(),
            decoder: ServerDecoder::new(Limits::default()),
            info: ServerInfo::default(),
            next_sid: 1,
        };
        let info = match tokio::time::timeout(timeout, client.read_op()).await {
            Ok(Ok(ServerOp::Info(info))) => info,
            Ok(Ok(_)) => return Err(ClientError::Server("expected INFO first".into())),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ClientError::Timeout(timeout)),
        };
        // `max_payload` bounds what clients send and every message; an API answer
        // (get, replay) is a message at up to that size plus its metadata headers
        // (subject, version, offset, time), so it may be that much larger.
        client
            .decoder
            .set_max_payload(info.max_payload.max(1).saturating_add(REPLY_METADATA));
        client.info = *info;
        let secure = client.info.tls_required;
        match (tls, secure) {
            (None, false) => {}
            (None, true) => return Err(ClientError::TlsCaMissing { addr }),
            (Some(_), false) => return Err(ClientError::TlsUnavailable { addr }),
            (Some(config), true) => {
                if !client.rbuf.is_empty() {
                    return Err(ClientError::Server(
                        "the server sent more than INFO before the TLS handshake".into(),
                    ));
                }
                let name = server_name(url)?;
                client.stream = client.stream.upgrade(config, name, &addr, timeout).await?;
            }
        }
        let connect = ConnectOptions {
            name: Some(options.name.clone()),
            lang: Some("canopy-cli".into()),
            version: Some(env!("CARGO_PKG_VERSION").into()),
            protocol: 1,
            echo: true,
            headers: true,
            no_responders: true,
            tls_required: secure,
            user: options.user.clone(),
            pass: options.password.clone(),
            auth_token: options.token.clone(),
            ..ConnectOptions::default()
        };
        encode_connect(&mut client.wbuf, &connect);
        match client.flush(timeout).await {
            Ok(()) => Ok(client),
            // A refused login is answered with -ERR and the connection closed.
            Err(ClientError::Server(reason)) if reason.starts_with("Authorization") => {
                Err(ClientError::LoginRefused {
                    reason,
                    hint: options.refusal_hint(),
                })
            }
            Err(ClientError::Closed) if client.info.auth_required => {
                Err(ClientError::LoginRefused {
                    reason: "the server closed the connection".into(),
                    hint: options.refusal_hint(),
                })
            }
            Err(error) => Err(error),
        }
    }

    pub fn server_info(&self) -> &ServerInfo {
        &self.info
    }

    /// Queues a publish; it is sent with the next batch or [`Client::flush`].
    pub async fn publish(
        &mut self,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
    ) -> Result<(), ClientError> {
        self.publish_with_reply(subject, None, headers, payload)
            .await
    }

    /// Queues a publish that carries a reply subject.
    pub async fn publish_with_reply(
        &mut self,
        subject: &str,
        reply: Option<&str>,
        headers: Option<&HeaderMap>,
        payload: &[u8],
    ) -> Result<(), ClientError> {
        let reply = reply.map(str::as_bytes);
        match headers.filter(|h| !h.is_empty()) {
            Some(headers) => {
                let mut block = BytesMut::new();
                headers.encode(&mut block);
                encode_hpub(&mut self.wbuf, subject.as_bytes(), reply, &block, payload);
            }
            None => encode_pub(&mut self.wbuf, subject.as_bytes(), reply, payload),
        }
        if self.wbuf.len() >= WRITE_BATCH {
            self.send().await?;
        }
        Ok(())
    }

    /// Sends a request and collects the answers on a fresh inbox until `last` says
    /// one was the last (or after the first, when `last` is `None`).
    pub async fn request(
        &mut self,
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: &[u8],
        timeout: Duration,
        last: Option<&dyn Fn(&Received) -> bool>,
    ) -> Result<Vec<Received>, ClientError> {
        // The owner token is unguessable: an inbox belongs to its first subscriber.
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| ClientError::Io(std::io::Error::other(e)))?;
        let mut inbox = String::from("_INBOX.");
        for byte in token {
            inbox.push_str(&format!("{byte:02x}"));
        }
        let sid = self.subscribe(&inbox, None).await?;
        self.publish_with_reply(subject, Some(&inbox), headers, payload)
            .await?;
        self.send().await?;
        let collect = async {
            let mut answers = Vec::new();
            loop {
                let message = self.next_message().await?;
                if message.subject != inbox {
                    continue;
                }
                if message
                    .headers
                    .as_ref()
                    .is_some_and(|h| h.status == Some(503))
                {
                    return Err(ClientError::Server(format!(
                        "no service answers on {subject}"
                    )));
                }
                let done = last.is_none_or(|last| last(&message));
                answers.push(message);
                if done {
                    return Ok(answers);
                }
            }
        };
        let answers = tokio::time::timeout(timeout, collect)
            .await
            .map_err(|_| ClientError::Timeout(timeout))??;
        canopy_protocols::native::encode_unsub(&mut self.wbuf, sid.to_string().as_bytes(), None);
        Ok(answers)
    }

    /// Subscribes and returns the subscription id.
    pub async fn subscribe(
        &mut self,
        pattern: &str,
        queue: Option<&str>,
    ) -> Result<u64, ClientError> {
        let sid = self.next_sid;
        self.next_sid += 1;
        encode_sub(
            &mut self.wbuf,
            pattern.as_bytes(),
            queue.map(str::as_bytes),
            sid.to_string().as_bytes(),
        );
        Ok(sid)
    }

    /// Sends everything queued and waits until the server has processed it (PING,
    /// then PONG). An -ERR the server sent meanwhile is returned as an error.
    pub async fn flush(&mut self, timeout: Duration) -> Result<(), ClientError> {
        encode_ping(&mut self.wbuf);
        self.send().await?;
        let wait = async {
            loop {
                match self.read_op().await? {
                    ServerOp::Pong => return Ok(()),
                    ServerOp::Err(text) => return Err(ClientError::Server(text)),
                    ServerOp::Ping => {
                        encode_pong(&mut self.wbuf);
                        self.send().await?;
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// The next message on any subscription; answers server PINGs meanwhile.
    pub async fn next_message(&mut self) -> Result<Received, ClientError> {
        self.send().await?;
        loop {
            match self.read_op().await? {
                ServerOp::Msg {
                    subject,
                    reply,
                    payload,
                    ..
                } => {
                    return Ok(Received {
                        subject: lossy(&subject),
                        reply: reply.as_deref().map(lossy),
                        headers: None,
                        payload,
                    });
                }
                ServerOp::HMsg {
                    subject,
                    reply,
                    headers,
                    payload,
                    ..
                } => {
                    return Ok(Received {
                        subject: lossy(&subject),
                        reply: reply.as_deref().map(lossy),
                        headers: Some(HeaderMap::parse(&headers)?),
                        payload,
                    });
                }
                ServerOp::Ping => {
                    encode_pong(&mut self.wbuf);
                    self.send().await?;
                }
                ServerOp::Err(text) => return Err(ClientError::Server(text)),
                _ => {}
            }
        }
    }

    async fn send(&mut self) -> Result<(), ClientError> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    async fn read_op(&mut self) -> Result<ServerOp, ClientError> {
        loop {
            if let Some(op) = self.decoder.decode(&mut self.rbuf)? {
                return Ok(op);
            }
            self.rbuf.reserve(16 * 1024);
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Err(ClientError::Closed);
            }
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rustls_pki_types::ServerName;
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    use super::{Client, ClientError, ClientOptions, TlsFiles, address_of, host_port, server_name};

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn addresses_accept_the_usual_spellings() {
        assert_eq!(address_of("nats://127.0.0.1:4333"), "127.0.0.1:4333");
        assert_eq!(address_of("127.0.0.1:4333"), "127.0.0.1:4333");
        assert_eq!(address_of("localhost"), "localhost:4222");
        assert_eq!(address_of("nats://localhost/"), "localhost:4222");
        assert_eq!(host_port("mqtt://127.0.0.1:1884", 1883), "127.0.0.1:1884");
        assert_eq!(host_port("mqtt://localhost", 1883), "localhost:1883");
        assert_eq!(host_port("127.0.0.1", 1883), "127.0.0.1:1883");
        assert_eq!(host_port("tcp://[::1]:9/", 1883), "[::1]:9");
    }

    #[test]
    fn the_server_name_is_the_url_host() {
        let name = |url| server_name(url).map(|n| n.to_str().into_owned());
        assert_eq!(
            name("nats://localhost:4222").ok().as_deref(),
            Some("localhost")
        );
        assert!(matches!(
            server_name("nats://127.0.0.1:4222"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("tls://[::1]:4222"),
            Ok(ServerName::IpAddress(_))
        ));
        assert_eq!(
            name("canopy.example.com").ok().as_deref(),
            Some("canopy.example.com")
        );
        assert!(matches!(
            server_name("nats://not a host:1"),
            Err(ClientError::ServerName { .. })
        ));
    }

    #[test]
    fn tls_files_must_make_sense_together() {
        let files = |ca: Option<&str>, cert: Option<&str>, key: Option<&str>| TlsFiles {
            ca: ca.map(Into::into),
            cert: cert.map(Into::into),
            key: key.map(Into::into),
        };
        assert!(matches!(files(None, None, None).client_config(), Ok(None)));
        let alone = files(Some("ca.pem"), Some("c.pem"), None).client_config();
        assert!(matches!(alone, Err(ClientError::TlsSettings(_))));
        let no_ca = files(None, Some("c.pem"), Some("c.key")).client_config();
        assert!(matches!(no_ca, Err(ClientError::TlsSettings(ref m)) if m.contains("--tls-ca")));
        let missing = files(Some("/nonexistent/ca.pem"), None, None).client_config();
        let Err(error) = missing else {
            panic!("a missing CA file was accepted");
        };
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
    }

    /// A server that sends `info`, then hands the connection to `then`.
    async fn fake_server<F, Fut>(info: &str, then: F) -> String
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("nats://{}", listener.local_addr().expect("addr"));
        let info = format!("INFO {info}\r\n");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            socket.write_all(info.as_bytes()).await.expect("INFO");
            then(socket).await;
        });
        url
    }

    /// Reads CONNECT (and the PING after it); answers `answer`; returns CONNECT.
    async fn answer_connect<S>(stream: S, answer: &[u8]) -> String
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut lines = BufReader::new(stream);
        let mut connect = String::new();
        lines.read_line(&mut connect).await.expect("CONNECT");
        let mut ping = String::new();
        lines.read_line(&mut ping).await.expect("PING");
        assert_eq!(ping, "PING\r\n");
        lines.get_mut().write_all(answer).await.expect("answer");
        lines.get_mut().flush().await.expect("flush");
        connect
    }

    #[tokio::test]
    async fn credentials_go_in_connect_and_a_refusal_says_why() {
        let (seen, connect_line) = tokio::sync::oneshot::channel();
        let url = fake_server(
            r#"{"auth_required":true,"max_payload":1024}"#,
            |socket| async {
                let connect = answer_connect(socket, b"-ERR 'Authorization Violation'\r\n").await;
                let _ = seen.send(connect);
            },
        )
        .await;
        let mut options = ClientOptions::new("test", WAIT);
        options.user = Some("dev-1@acme".into());
        options.password = Some("pw-1".into());
        let refused = Client::connect(&url, &options).await;
        let Err(error) = refused else {
            panic!("a refused login connected");
        };
        assert!(matches!(error, ClientError::LoginRefused { .. }), "{error}");
        assert!(
            error.to_string().contains("Authorization Violation"),
            "{error}"
        );
        let connect = connect_line.await.expect("CONNECT seen");
        assert!(connect.starts_with("CONNECT {"), "{connect}");
        assert!(connect.contains(r#""user":"dev-1@acme""#), "{connect}");
        assert!(connect.contains(r#""pass":"pw-1""#), "{connect}");
        assert!(!connect.contains("auth_token"), "{connect}");
    }

    #[tokio::test]
    async fn tls_without_a_ca_is_refused_with_the_flag_to_pass() {
        let url = fake_server(
            r#"{"tls_required":true,"max_payload":1024}"#,
            |socket| async {
                // Hold the connection until the client gives up.
                let mut socket = socket;
                let _ = tokio::io::AsyncReadExt::read_u8(&mut socket).await;
            },
        )
        .await;
        let refused = Client::connect(&url, &ClientOptions::new("test", WAIT)).await;
        let Err(error) = refused else {
            panic!("connected in the clear to a TLS server");
        };
        assert!(matches!(error, ClientError::TlsCaMissing { .. }), "{error}");
        assert!(error.to_string().contains("--tls-ca"), "{error}");
    }

    /// A CA and a server certificate for 127.0.0.1, as PEM files.
    fn test_pki(dir: &std::path::Path) -> Arc<rustls::ServerConfig> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["127.0.0.1".into()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("certificate");
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write");
        let chain = vec![cert.der().clone()];
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .expect("key");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        Arc::new(config)
    }

    #[tokio::test]
    async fn info_in_the_clear_then_connect_over_tls() {
        let dir = tempfile::tempdir().expect("tempdir");
        let acceptor = tokio_rustls::TlsAcceptor::from(test_pki(dir.path()));
        let (seen, connect_line) = tokio::sync::oneshot::channel();
        let url = fake_server(
            r#"{"tls_required":true,"auth_required":true,"max_payload":1024}"#,
            move |socket| async move {
                let tls = acceptor.accept(socket).await.expect("handshake");
                let connect = answer_connect(tls, b"PONG\r\n").await;
                let _ = seen.send(connect);
            },
        )
        .await;
        let mut options = ClientOptions::new("test", WAIT);
        options.token = Some("cnp.acme.dev-1.id.secret".into());
        options.tls.ca = Some(dir.path().join("ca.pem"));
        let client = Client::connect(&url, &options).await.expect("connected");
        assert!(client.server_info().tls_required);
        let connect = connect_line.await.expect("CONNECT over TLS");
        assert!(
            connect.contains(r#""auth_token":"cnp.acme.dev-1.id.secret""#),
            "{connect}"
        );
        assert!(connect.contains(r#""tls_required":true"#), "{connect}");

        // The same CA against a server without TLS: refused, not sent in the clear.
        let clear = fake_server(r#"{"max_payload":1024}"#, |_| async {}).await;
        let refused = Client::connect(&clear, &options).await;
        assert!(matches!(refused, Err(ClientError::TlsUnavailable { .. })));
    }
}
