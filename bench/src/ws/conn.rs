//! One WebSocket subscriber of `ws-fanout` (tokio-tungstenite over a `TcpStream`), in
//! either API ([`WsApi`]): Canopy's JSON messages, or the NATS protocol carried in
//! binary frames and decoded with the crate's own [`ServerDecoder`] (a frame may end in
//! the middle of a protocol line, or hold many).
//!
//! Owns: the handshake and the subscription (confirmed by Canopy's `ok` or by a PONG
//! after the SUB), what the shared subscriber role does on a WebSocket
//! ([`Connection`]), and turning a close (code 1008 or a "slow consumer" reason above all), an `error`
//! answer or `-ERR` into errors.
//!
//! Must never: publish, panic on anything the server sends, or buffer without bound
//! (one read takes one WebSocket message, decoded before the next read).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ConnectOptions, Limits, ServerDecoder, ServerOp, encode_connect, encode_ping, encode_pong,
    encode_sub,
};
use futures::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message, Utf8Bytes};

use super::super::BenchError;
use super::super::roles::Connection;
use super::WsApi;

/// The id of the subscribe request.
const SUB_ID: &str = "s";
/// tungstenite's read buffer per connection. It zeroes this much before every socket
/// read, even one that finds nothing: with its default of 128 KiB that memset was more
/// than half of this tool's CPU at 1,000 connections. A frame larger than this still
/// arrives whole (the buffer grows).
const READ_BUFFER: usize = 16 * 1024;

/// Where and how the subscribers connect.
pub struct Dial {
    addr: SocketAddr,
    url: String,
    api: WsApi,
    timeout: Duration,
}

impl Dial {
    /// `ws://host[:port][/path]` (port 80 when left out); wss is not supported.
    pub async fn new(url: &str, api: WsApi, timeout: Duration) -> Result<Dial, BenchError> {
        let rest = url.strip_prefix("ws://").ok_or_else(|| {
            BenchError::Config(format!("--ws-url {url}: expected ws://HOST:PORT[/PATH]"))
        })?;
        let authority = rest.split('/').next().unwrap_or_default();
        let host_port = canopy_protocols::address::host_port(authority, 80);
        let addr = tokio::net::lookup_host(&host_port)
            .await
            .map_err(|source| BenchError::Connect {
                addr: host_port.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| BenchError::Config(format!("{host_port} resolves to no address")))?;
        Ok(Dial {
            addr,
            url: url.to_owned(),
            api,
            timeout,
        })
    }
}

/// A message of Canopy's JSON API, as far as a subscriber reads it. `op` and `data_b64`
/// are borrowed from the text (neither has escapes), so a delivery allocates only its
/// decoded payload.
#[derive(Deserialize)]
struct Incoming<'a> {
    op: &'a str,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    data_b64: Option<&'a str>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

pub struct WsConn {
    ws: WebSocketStream<TcpStream>,
    api: WsApi,
    role: &'static str,
    /// Canopy: text messages read and not yet decoded.
    texts: VecDeque<Utf8Bytes>,
    /// nats: protocol bytes read and not yet decoded.
    rbuf: BytesMut,
    decoder: ServerDecoder,
    /// nats: protocol bytes to send (PONGs to the server's PINGs).
    wbuf: BytesMut,
    /// WebSocket pongs received (Canopy's answer to [`Connection::send_ping`]).
    pongs: u64,
}

impl WsConn {
    /// Connects, subscribes to `pattern` and waits until the server confirms it.
    pub async fn subscribe(dial: &Dial, pattern: &str) -> Result<WsConn, BenchError> {
        let role = "WebSocket subscriber";
        let timeout = dial.timeout;
        tokio::time::timeout(timeout, async {
            let stream =
                TcpStream::connect(dial.addr)
                    .await
                    .map_err(|source| BenchError::Connect {
                        addr: dial.addr.to_string(),
                        source,
                    })?;
            stream.set_nodelay(true)?;
            let config = WebSocketConfig::default().read_buffer_size(READ_BUFFER);
            let (ws, _response) = tokio_tungstenite::client_async_with_config(
                dial.url.as_str(),
                stream,
                Some(config),
            )
            .await
            .map_err(|error| failed(role, error))?;
            let mut conn = WsConn {
                ws,
                api: dial.api,
                role,
                texts: VecDeque::new(),
                rbuf: BytesMut::new(),
                decoder: ServerDecoder::new(Limits::default()),
                wbuf: BytesMut::new(),
                pongs: 0,
            };
            match dial.api {
                WsApi::Nats => conn.subscribe_nats(pattern).await?,
                WsApi::Canopy | WsApi::Auto => conn.subscribe_canopy(pattern).await?,
            }
            Ok(conn)
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })?
    }

    async fn subscribe_canopy(&mut self, pattern: &str) -> Result<(), BenchError> {
        let request = serde_json::json!({"op": "sub", "id": SUB_ID, "pattern": pattern});
        self.ws
            .send(Message::text(request.to_string()))
            .await
            .map_err(|error| failed(self.role, error))?;
        // Nothing but the answer can come first: the connection has no other request.
        let text = loop {
            if let Some(text) = self.texts.pop_front() {
                break text;
            }
            self.read_more().await?;
        };
        let answer = parse(self.role, &text)?;
        match (answer.op, answer.id.as_deref()) {
            ("ok", Some(SUB_ID)) => Ok(()),
            ("error", _) => Err(refused(self.role, answer)),
            (op, _) => Err(BenchError::Unexpected {
                role: self.role,
                what: format!("`{op}` before the subscription was confirmed"),
            }),
        }
    }

    async fn subscribe_nats(&mut self, pattern: &str) -> Result<(), BenchError> {
        loop {
            if let Some(op) = self.decoder.decode(&mut self.rbuf)? {
                match op {
                    ServerOp::Info(info) => {
                        self.decoder.set_max_payload(info.max_payload.max(1));
                        break;
                    }
                    _ => {
                        return Err(BenchError::Unexpected {
                            role: self.role,
                            what: "no INFO first".into(),
                        });
                    }
                }
            }
            self.read_more().await?;
        }
        let options = ConnectOptions {
            name: Some("canopy bench WebSocket subscriber".into()),
            lang: Some("canopy-bench".into()),
            version: Some(env!("CARGO_PKG_VERSION").into()),
            protocol: 1,
            ..ConnectOptions::default()
        };
        encode_connect(&mut self.wbuf, &options);
        encode_sub(&mut self.wbuf, pattern.as_bytes(), None, b"1");
        encode_ping(&mut self.wbuf);
        self.send().await?;
        loop {
            match self.next_op()? {
                Some(ServerOp::Pong) => return Ok(()),
                Some(_) => {
                    return Err(BenchError::Unexpected {
                        role: self.role,
                        what: "a message before the subscription was confirmed".into(),
                    });
                }
                None => self.read_more().await?,
            }
        }
    }

    /// nats: the next operation that is not PING (answered), INFO or `+OK`; `-ERR` is an
    /// error.
    fn next_op(&mut self) -> Result<Option<ServerOp>, BenchError> {
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

    /// Files one message read from the socket; a close or the end of the stream is an
    /// error.
    fn accept(
        &mut self,
        read: Option<Result<Message, tungstenite::Error>>,
    ) -> Result<(), BenchError> {
        let role = self.role;
        match read {
            Some(Ok(Message::Text(text))) => match self.api {
                WsApi::Nats => self.rbuf.extend_from_slice(text.as_bytes()),
                WsApi::Canopy | WsApi::Auto => self.texts.push_back(text),
            },
            Some(Ok(Message::Binary(bytes))) => match self.api {
                WsApi::Nats => self.rbuf.extend_from_slice(&bytes),
                WsApi::Canopy | WsApi::Auto => {
                    return Err(BenchError::Unexpected {
                        role,
                        what: "a binary message from the JSON API".into(),
                    });
                }
            },
            Some(Ok(Message::Pong(_))) => self.pongs += 1,
            // tungstenite answers pings itself.
            Some(Ok(Message::Ping(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Close(frame))) => return Err(closed(role, frame)),
            Some(Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed))
            | None => return Err(BenchError::Closed { role }),
            Some(Err(error)) => return Err(failed(role, error)),
        }
        Ok(())
    }
}

/// A close frame as an error: code 1008 or a reason naming a slow consumer is one.
fn closed(role: &'static str, frame: Option<CloseFrame>) -> BenchError {
    match frame {
        Some(frame)
            if frame.code == CloseCode::Policy
                || frame.reason.to_ascii_lowercase().contains("slow consumer") =>
        {
            BenchError::SlowConsumer { role }
        }
        _ => BenchError::Closed { role },
    }
}

fn failed(role: &'static str, error: tungstenite::Error) -> BenchError {
    BenchError::WebSocket {
        role,
        source: Box::new(error),
    }
}

fn parse<'a>(role: &'static str, text: &'a str) -> Result<Incoming<'a>, BenchError> {
    serde_json::from_str(text).map_err(|error| BenchError::Unexpected {
        role,
        what: format!("a message that is not the JSON API's ({error})"),
    })
}

/// An `{"op":"error",...}` answer as an error.
fn refused(role: &'static str, answer: Incoming<'_>) -> BenchError {
    let code = answer.code.unwrap_or_default();
    let message = answer.message.unwrap_or_default();
    BenchError::Server {
        role,
        text: format!("{code}: {message}"),
    }
}

/// What the shared subscriber role does on a WebSocket. The subscribers never publish:
/// [`Connection::queue`] refuses.
impl Connection for WsConn {
    fn queue(&mut self, _subject: &[u8], _payload: &[u8]) -> Result<(), BenchError> {
        Err(BenchError::Config(
            "the WebSocket connections of ws-fanout only subscribe".into(),
        ))
    }

    fn buffered(&self) -> usize {
        self.wbuf.len()
    }

    async fn send(&mut self) -> Result<(), BenchError> {
        if !self.wbuf.is_empty() {
            let bytes = self.wbuf.split().freeze();
            self.ws
                .send(Message::Binary(bytes))
                .await
                .map_err(|error| failed(self.role, error))?;
        }
        Ok(())
    }

    /// Reads one WebSocket message. Messages tungstenite already holds come without a
    /// system call; taking more without waiting (`now_or_never`) cost a failed read
    /// per wake and gained nothing here.
    async fn read_more(&mut self) -> Result<(), BenchError> {
        let read = self.ws.next().await;
        self.accept(read)
    }

    async fn send_ping(&mut self) -> Result<(), BenchError> {
        match self.api {
            WsApi::Nats => {
                encode_ping(&mut self.wbuf);
                self.send().await
            }
            WsApi::Canopy | WsApi::Auto => self
                .ws
                .send(Message::Ping(Bytes::new()))
                .await
                .map_err(|error| failed(self.role, error)),
        }
    }

    async fn wait_pong(&mut self, timeout: Duration) -> Result<(), BenchError> {
        let role = self.role;
        tokio::time::timeout(timeout, async {
            match self.api {
                WsApi::Nats => loop {
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
                },
                WsApi::Canopy | WsApi::Auto => {
                    let seen = self.pongs;
                    while self.pongs == seen {
                        self.read_more().await?;
                    }
                    Ok(())
                }
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })?
    }

    /// Canopy: the decoded `data_b64` of the next `msg`; nats: the payload of the next
    /// MSG or HMSG.
    fn next_message(&mut self) -> Result<Option<Bytes>, BenchError> {
        match self.api {
            WsApi::Nats => loop {
                match self.next_op()? {
                    Some(ServerOp::Msg { payload, .. } | ServerOp::HMsg { payload, .. }) => {
                        return Ok(Some(payload));
                    }
                    Some(_) => {}
                    None => return Ok(None),
                }
            },
            WsApi::Canopy | WsApi::Auto => {
                while let Some(text) = self.texts.pop_front() {
                    let message = parse(self.role, &text)?;
                    match message.op {
                        "msg" => return decode_payload(self.role, message).map(Some),
                        "error" => return Err(refused(self.role, message)),
                        _ => {}
                    }
                }
                Ok(None)
            }
        }
    }

    async fn finish(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// The bytes of a `msg` (payloads without a JSON content type come as `data_b64`).
fn decode_payload(role: &'static str, message: Incoming<'_>) -> Result<Bytes, BenchError> {
    let Some(text) = message.data_b64 else {
        return Err(BenchError::Unexpected {
            role,
            what: "a msg without data_b64 (the benchmark publishes no JSON)".into(),
        });
    };
    base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map(Bytes::from)
        .map_err(|error| BenchError::Unexpected {
            role,
            what: format!("a msg whose data_b64 is not base64 ({error})"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_delivery_of_the_json_api() -> Result<(), BenchError> {
        let text = r#"{"op":"msg","sid":1,"subject":"devices.7.temp","version":3,"offset":9,"headers":{"A":"b"},"data_b64":"AQIDBAUGBwg="}"#;
        let message = parse("t", text)?;
        assert_eq!(message.op, "msg");
        let payload = decode_payload("t", message)?;
        assert_eq!(&payload[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        Ok(())
    }

    #[test]
    fn refusals_and_bad_payloads_are_errors() -> Result<(), BenchError> {
        let error = parse(
            "t",
            r#"{"op":"error","id":"s","code":"forbidden","message":"no"}"#,
        )?;
        assert!(
            matches!(refused("t", error), BenchError::Server { text, .. } if text == "forbidden: no")
        );
        let inline = parse("t", r#"{"op":"msg","sid":1,"subject":"a","data":{"t":1}}"#)?;
        assert!(decode_payload("t", inline).is_err());
        let bad = parse("t", r#"{"op":"msg","sid":1,"subject":"a","data_b64":"!!"}"#)?;
        assert!(decode_payload("t", bad).is_err());
        assert!(parse("t", "not json").is_err());
        Ok(())
    }

    #[test]
    fn a_policy_close_is_a_slow_consumer() {
        let slow = CloseFrame {
            code: CloseCode::Policy,
            reason: Utf8Bytes::from_static("slow consumer: messages were not read fast enough"),
        };
        assert!(matches!(
            closed("t", Some(slow)),
            BenchError::SlowConsumer { .. }
        ));
        let away = CloseFrame {
            code: CloseCode::Away,
            reason: Utf8Bytes::from_static("server shutting down"),
        };
        assert!(matches!(closed("t", Some(away)), BenchError::Closed { .. }));
        assert!(matches!(closed("t", None), BenchError::Closed { .. }));
    }

    #[tokio::test]
    async fn endpoints_are_ws_urls() -> Result<(), BenchError> {
        let t = Duration::from_secs(1);
        let dial = Dial::new("ws://127.0.0.1:8080/ws", WsApi::Canopy, t).await?;
        assert_eq!(dial.addr, SocketAddr::from(([127, 0, 0, 1], 8080)));
        let dial = Dial::new("ws://127.0.0.1", WsApi::Nats, t).await?;
        assert_eq!(dial.addr.port(), 80);
        assert!(
            Dial::new("wss://127.0.0.1:443", WsApi::Nats, t)
                .await
                .is_err()
        );
        Ok(())
    }

    /// A one-connection WebSocket server on 127.0.0.1:0 that reads one message and then
    /// sends `frames`; its URL.
    async fn server(frames: Vec<Message>) -> Result<String, BenchError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            let mut frames = frames.into_iter();
            // nats: INFO before the client says anything.
            if let Some(first) = frames.next() {
                if matches!(first, Message::Binary(_)) {
                    let _ = ws.send(first).await;
                    let _ = ws.next().await;
                } else {
                    let _ = ws.next().await;
                    let _ = ws.send(first).await;
                }
            }
            for frame in frames {
                let _ = ws.send(frame).await;
            }
            // Hold the connection until the client closes it.
            while let Some(Ok(_)) = ws.next().await {}
        });
        Ok(format!("ws://{addr}/ws"))
    }

    #[tokio::test]
    async fn subscribes_and_reads_the_json_api() -> Result<(), BenchError> {
        let url = server(vec![
            Message::text(r#"{"op":"ok","id":"s","sid":1,"pattern":"devices.>"}"#),
            Message::text(
                r#"{"op":"msg","sid":1,"subject":"devices.1.temp","data_b64":"AQIDBAUGBwg="}"#,
            ),
            Message::Close(Some(CloseFrame {
                code: CloseCode::Policy,
                reason: Utf8Bytes::from_static("slow consumer"),
            })),
        ])
        .await?;
        let dial = Dial::new(&url, WsApi::Canopy, Duration::from_secs(5)).await?;
        let mut conn = WsConn::subscribe(&dial, "devices.>").await?;
        conn.read_more().await?;
        let payload = conn.next_message()?;
        assert_eq!(payload.as_deref(), Some(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]));
        assert_eq!(conn.next_message()?, None);
        let closed = conn.read_more().await;
        assert!(matches!(closed, Err(BenchError::SlowConsumer { .. })));
        Ok(())
    }

    #[tokio::test]
    async fn reads_nats_messages_split_and_merged_across_frames() -> Result<(), BenchError> {
        let frame = |text: &'static str| Message::Binary(Bytes::from_static(text.as_bytes()));
        let url = server(vec![
            frame("INFO {\"max_payload\":1048576}\r\n"),
            frame("PONG\r\nMSG devices.1.temp 1 3\r\nab"),
            frame("c\r\nMSG devices.2.temp 1 2\r\nde\r\nPING\r\nMSG devi"),
            frame("ces.3.temp 1 1\r\nf\r\n"),
        ])
        .await?;
        let dial = Dial::new(&url, WsApi::Nats, Duration::from_secs(5)).await?;
        let mut conn = WsConn::subscribe(&dial, "devices.>").await?;
        let mut got = Vec::new();
        while got.len() < 3 {
            while let Some(payload) = conn.next_message()? {
                got.push(payload);
            }
            if got.len() < 3 {
                conn.read_more().await?;
            }
        }
        assert_eq!(got, [&b"abc"[..], b"de", b"f"]);
        // The PING was answered.
        assert_eq!(&conn.wbuf[..], b"PONG\r\n");
        conn.send().await?;
        conn.finish().await;
        Ok(())
    }
}
