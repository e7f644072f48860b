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

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ConnectOptions, HeaderMap, Limits, ServerDecoder, ServerInfo, ServerOp, encode_connect,
    encode_hpub, encode_ping, encode_pong, encode_pub, encode_sub,
};
use tokio::net::TcpStream;

/// Writes are sent once this many bytes are buffered.
const WRITE_BATCH: usize = 64 * 1024;

/// Room for the metadata headers of an API answer beyond `max_payload` (the subject,
/// at most the server's subject limit, plus a few numbers).
const REPLY_METADATA: usize = 64 * 1024;

mod connection;
mod error;

pub use connection::{TlsFiles, address_of, host_port, server_name};
pub use error::ClientError;

use connection::Stream;

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
mod tests;
