//! What an MQTT connection reads from and writes to: a TCP socket, a TLS stream, or
//! a WebSocket carrying MQTT in binary messages (`/mqtt` on the HTTP port).
//!
//! Reading is "wait until readable, then take what is there", so an idle connection
//! holds no read buffer whatever its transport. This module must never parse MQTT.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::ws::{Message, WebSocket};
use bytes::{Bytes, BytesMut};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// The read side of a connection.
pub trait Inbound: Send {
    /// Resolves once bytes (or the end) can be taken. Cancel-safe.
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Appends what is available without waiting: `Ok(0)` at the end,
    /// `WouldBlock` when nothing is there after all.
    fn try_read(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
}

impl Inbound for OwnedReadHalf {
    async fn ready(&mut self) -> io::Result<()> {
        self.readable().await
    }

    fn try_read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

/// The read side of any byte stream (TLS): a read into a small buffer of its own
/// when the stream has bytes, handed over by `try_read`. Idle, it holds none.
pub struct StreamInbound<R> {
    reader: R,
    pending: BytesMut,
    ended: bool,
}

impl<R> StreamInbound<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            pending: BytesMut::new(),
            ended: false,
        }
    }
}

impl<R: AsyncRead + Unpin + Send> Inbound for StreamInbound<R> {
    async fn ready(&mut self) -> io::Result<()> {
        if self.pending.is_empty() && !self.ended {
            // `read_buf` is cancel-safe: nothing is taken unless it completes.
            self.pending.reserve(READ_SIZE);
            if self.reader.read_buf(&mut self.pending).await? == 0 {
                self.ended = true;
            }
        }
        Ok(())
    }

    fn try_read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if self.pending.is_empty() {
            return if self.ended {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = self.pending.len();
        buf.extend_from_slice(&self.pending);
        // Dropped, not kept: an idle connection holds no buffer.
        self.pending = BytesMut::new();
        Ok(n)
    }
}

/// Bytes one read of a [`StreamInbound`] may take.
const READ_SIZE: usize = 16 * 1024;

/// The read side of MQTT over WebSocket: binary messages are the byte stream (an
/// MQTT packet may span messages, and a message may hold several).
pub struct WsInbound {
    stream: SplitStream<WebSocket>,
    pending: Option<Bytes>,
    closed: bool,
}

impl Inbound for WsInbound {
    async fn ready(&mut self) -> io::Result<()> {
        while self.pending.is_none() && !self.closed {
            // `next` is cancel-safe: a message is either returned or still queued.
            match self.stream.next().await {
                Some(Ok(Message::Binary(bytes))) => self.pending = Some(bytes),
                Some(Ok(Message::Text(_))) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "MQTT over WebSocket uses binary messages",
                    ));
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | None => self.closed = true,
                Some(Err(error)) => return Err(io::Error::other(error)),
            }
        }
        Ok(())
    }

    fn try_read(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self.pending.take() {
            Some(bytes) => {
                buf.extend_from_slice(&bytes);
                Ok(bytes.len())
            }
            None if self.closed => Ok(0),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

/// The write side of MQTT over WebSocket: each write becomes one binary message,
/// handed to a task that sends them in order. The channel is small, so a client that
/// does not read makes writes wait, and the connection's write deadline applies.
pub struct WsOutbound {
    messages: PollSender<Bytes>,
}

impl AsyncWrite for WsOutbound {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.messages.poll_reserve(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Poll::Ready(Ok(())) => match self.messages.send_item(Bytes::copy_from_slice(buf)) {
                Ok(()) => Poll::Ready(Ok(buf.len())),
                Err(_) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            },
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.messages.close();
        Poll::Ready(Ok(()))
    }
}

/// Splits a WebSocket into MQTT's two sides; the sending task ends when the write
/// side is dropped or shut down, closing the socket.
pub fn websocket(socket: WebSocket) -> (WsInbound, WsOutbound) {
    let (sink, stream) = socket.split();
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(send_messages(sink, rx));
    (
        WsInbound {
            stream,
            pending: None,
            closed: false,
        },
        WsOutbound {
            messages: PollSender::new(tx),
        },
    )
}

async fn send_messages(mut sink: SplitSink<WebSocket, Message>, mut rx: mpsc::Receiver<Bytes>) {
    while let Some(bytes) = rx.recv().await {
        if sink.send(Message::Binary(bytes)).await.is_err() {
            return;
        }
    }
    let _ = sink.close().await;
}
