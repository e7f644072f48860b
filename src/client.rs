//! A small native-protocol client for the `canopy` CLI: connect, publish,
//! subscribe, receive. It speaks the same wire protocol any NATS client does, with
//! Canopy's own codec from `canopy-protocols`.
//!
//! It is a tool for people at a terminal, not a general client library: one
//! connection, one task, no reconnects. It must never be used inside the server.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ConnectOptions, HeaderMap, Limits, ServerDecoder, ServerInfo, ServerOp, encode_connect,
    encode_hpub, encode_ping, encode_pong, encode_pub, encode_sub,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes are sent once this many bytes are buffered.
const WRITE_BATCH: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
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
    stream: TcpStream,
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

impl Client {
    /// Connects, reads INFO, sends CONNECT and waits for the server to accept it.
    pub async fn connect(url: &str, name: &str, timeout: Duration) -> Result<Client, ClientError> {
        let addr = address_of(url);
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(|source| ClientError::Connect {
                addr: addr.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let mut client = Client {
            stream,
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
        client.decoder.set_max_payload(info.max_payload.max(1));
        client.info = *info;
        let options = ConnectOptions {
            name: Some(name.to_owned()),
            lang: Some("canopy-cli".into()),
            version: Some(env!("CARGO_PKG_VERSION").into()),
            protocol: 1,
            echo: true,
            headers: true,
            no_responders: true,
            ..ConnectOptions::default()
        };
        encode_connect(&mut client.wbuf, &options);
        client.flush(timeout).await?;
        Ok(client)
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
        let inbox = format!(
            "_INBOX.{:016x}{:016x}",
            fastrand::u64(..),
            fastrand::u64(..)
        );
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
    use super::{address_of, host_port};

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
}
