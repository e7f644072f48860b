//! One raw benchmark connection: a tokio `TcpStream`, Canopy's native codec, one read
//! buffer and one write buffer sent in large batches. The same code talks to Canopy and
//! to nats-server, so both are measured through the same client.
//!
//! Owns: the handshake (INFO, CONNECT, PING/PONG), batching writes into
//! [`WRITE_BATCH`]-byte `write_all`s (for both protocols' connections), what the shared
//! roles do on a NATS connection ([`Connection`]), answering server PINGs, and turning
//! `-ERR` (slow consumer above all) and closed sockets into errors.
//!
//! Must never: silently skip an `-ERR` or an end of stream, hold a `ServerOp` across reads
//! (callers decode everything a read brought before reading again), or buffer writes
//! without bound (callers send at least every [`WRITE_BATCH`] bytes).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ConnectOptions, Limits, ServerDecoder, ServerInfo, ServerOp, encode_connect, encode_ping,
    encode_pong, encode_pub,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::BenchError;
use super::roles::Connection;

/// Writes go out once this many bytes are buffered.
pub const WRITE_BATCH: usize = 64 * 1024;
/// Each socket read asks for at least this much room.
const READ_CHUNK: usize = 256 * 1024;

pub struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: ServerDecoder,
    role: &'static str,
    info: ServerInfo,
}

impl Conn {
    /// Connects, reads INFO, sends CONNECT (not verbose, not pedantic) and waits for the
    /// PONG that shows the server accepted it.
    pub async fn connect(
        addr: &str,
        role: &'static str,
        timeout: Duration,
    ) -> Result<Conn, BenchError> {
        Conn::connect_with(addr, role, timeout, false, false).await
    }

    /// [`Conn::connect`], announcing header support (HPUB needs it on nats-server) and
    /// no-responders statuses (a request nobody answers then fails at once).
    pub async fn connect_with(
        addr: &str,
        role: &'static str,
        timeout: Duration,
        headers: bool,
        no_responders: bool,
    ) -> Result<Conn, BenchError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| BenchError::Timeout { role, timeout })?
            .map_err(|source| BenchError::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        stream.set_nodelay(true)?;
        let mut conn = Conn {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(WRITE_BATCH * 2),
            decoder: ServerDecoder::new(Limits::default()),
            role,
            info: ServerInfo::default(),
        };
        let info = tokio::time::timeout(timeout, async {
            loop {
                if let Some(op) = conn.decoder.decode(&mut conn.rbuf)? {
                    return match op {
                        ServerOp::Info(info) => Ok(info),
                        _ => Err(BenchError::Unexpected {
                            role,
                            what: "the server did not start with INFO".into(),
                        }),
                    };
                }
                conn.read_more().await?;
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })??;
        conn.decoder.set_max_payload(info.max_payload.max(1));
        conn.info = *info;
        let options = ConnectOptions {
            name: Some(format!("canopy bench {role}")),
            lang: Some("canopy-bench".into()),
            version: Some(env!("CARGO_PKG_VERSION").into()),
            protocol: 1,
            echo: true,
            headers: headers || no_responders,
            no_responders,
            ..ConnectOptions::default()
        };
        encode_connect(&mut conn.wbuf, &options);
        conn.ping_pong(timeout).await?;
        Ok(conn)
    }

    pub fn info(&self) -> &ServerInfo {
        &self.info
    }

    /// The write buffer: encode into it, then [`Connection::send`] (at the latest once it holds
    /// [`WRITE_BATCH`] bytes).
    pub fn wbuf(&mut self) -> &mut BytesMut {
        &mut self.wbuf
    }

    /// The next message-like operation already read (`MSG`, `HMSG`, `PONG`), or `None` when
    /// the buffer holds no complete one. PINGs are answered (queued in the write buffer),
    /// `-ERR` becomes an error, INFO and `+OK` are skipped.
    pub fn next_op(&mut self) -> Result<Option<ServerOp>, BenchError> {
        loop {
            let Some(op) = self.decoder.decode(&mut self.rbuf)? else {
                return Ok(None);
            };
            match op {
                ServerOp::Ping => encode_pong(&mut self.wbuf),
                ServerOp::Err(text) => return Err(BenchError::from_server(self.role, text)),
                ServerOp::Info(_) | ServerOp::Ok => {}
                op => return Ok(Some(op)),
            }
        }
    }

    /// Sends everything buffered plus a PING and waits for its PONG: the server has
    /// processed all of it.
    pub async fn ping_pong(&mut self, timeout: Duration) -> Result<(), BenchError> {
        self.send_ping().await?;
        self.wait_pong(timeout).await
    }
}

/// The NATS side of the shared roles: PUB, PING/PONG, MSG and HMSG.
impl Connection for Conn {
    #[inline]
    fn queue(&mut self, subject: &[u8], payload: &[u8]) -> Result<(), BenchError> {
        encode_pub(&mut self.wbuf, subject, None, payload);
        Ok(())
    }

    #[inline]
    fn buffered(&self) -> usize {
        self.wbuf.len()
    }

    async fn send(&mut self) -> Result<(), BenchError> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// The server never closes a healthy benchmark connection.
    async fn read_more(&mut self) -> Result<(), BenchError> {
        self.rbuf.reserve(READ_CHUNK);
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            return Err(BenchError::Closed { role: self.role });
        }
        Ok(())
    }

    async fn send_ping(&mut self) -> Result<(), BenchError> {
        encode_ping(&mut self.wbuf);
        self.send().await
    }

    async fn wait_pong(&mut self, timeout: Duration) -> Result<(), BenchError> {
        let role = self.role;
        tokio::time::timeout(timeout, async {
            loop {
                match self.next_op()? {
                    Some(ServerOp::Pong) => return self.send().await,
                    Some(_) => {
                        return Err(BenchError::Unexpected {
                            role,
                            what: "a message while waiting for PONG".into(),
                        });
                    }
                    None => {}
                }
                self.send().await?;
                self.read_more().await?;
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })?
    }

    /// `MSG` and `HMSG` payloads; PONGs are passed over.
    #[inline]
    fn next_message(&mut self) -> Result<Option<Bytes>, BenchError> {
        loop {
            match self.next_op()? {
                Some(ServerOp::Msg { payload, .. } | ServerOp::HMsg { payload, .. }) => {
                    return Ok(Some(payload));
                }
                Some(_) => {}
                None => return Ok(None),
            }
        }
    }

    async fn finish(self) {}
}
