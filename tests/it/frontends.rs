//! Raw clients of every front end, for the tables that run one publish through all of
//! them (`refusals.rs`, `limits.rs`): the native protocol as text over TCP (so the
//! exact `-ERR` text and every reply's size are visible), MQTT 3.1.1 and 5 through the
//! project's own codec (exact reason codes, DISCONNECTs and closes), and `/ws` through
//! tokio-tungstenite (errors, close codes).
//!
//! Each client reads in a task of its own and hands over what arrived as events, so a
//! table can record "the server closed", "nothing came" or the wrong answer as a failed
//! cell and go on with the next, instead of panicking at the first drift. [`Want`] is
//! what SPEC.md's table says a front end answers; [`Answer`] is what it did.

use std::collections::VecDeque;
use std::net::SocketAddr;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::{
    Ack, ByteStr, ConnAck, Connect, Decoder, Level, Packet, Properties, Publish, QoS, Subscribe,
    SubscribeFilter, encode,
};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::common::WAIT;

/// The four ways a client publishes, in the tables' column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrontEnd {
    Native,
    Mqtt5,
    Mqtt311,
    Ws,
}

impl FrontEnd {
    pub const ALL: [FrontEnd; 4] = [
        FrontEnd::Native,
        FrontEnd::Mqtt5,
        FrontEnd::Mqtt311,
        FrontEnd::Ws,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Native => "native",
            FrontEnd::Mqtt5 => "MQTT 5",
            FrontEnd::Mqtt311 => "MQTT 3.1.1",
            FrontEnd::Ws => "/ws",
        }
    }

    /// A name usable in tenant names, subjects and client ids.
    pub fn key(self) -> &'static str {
        match self {
            FrontEnd::Native => "nat",
            FrontEnd::Mqtt5 => "m5",
            FrontEnd::Mqtt311 => "m3",
            FrontEnd::Ws => "ws",
        }
    }
}

/// Where a running server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    pub native: SocketAddr,
    pub mqtt: SocketAddr,
    pub http: SocketAddr,
}

impl Addrs {
    pub fn of(server: &canopy::server::RunningServer) -> Addrs {
        Addrs {
            native: server.native_addr,
            mqtt: crate::mqtt::mqtt_addr(server),
            http: server.http_addr.expect("the HTTP listener is on"),
        }
    }
}

/// A NATS header block: `NATS/1.0`, one line per header, a blank line.
pub fn header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut block = b"NATS/1.0\r\n".to_vec();
    for (name, value) in headers {
        block.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    block.extend_from_slice(b"\r\n");
    block
}

/// The value of header `name` in a NATS header block.
pub fn header_value(block: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(block);
    text.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim().to_owned())
    })
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn unb64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))
}

/// `len` bytes that are not UTF-8 (so every reader keeps them as bytes) and start with
/// `tag`, so a misrouted message names its cell.
pub fn payload(tag: &str, len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = tag.bytes().chain(std::iter::once(0xff)).take(len).collect();
    let mut i = bytes.len();
    while bytes.len() < len {
        bytes.push((i.wrapping_mul(31) % 251) as u8 | 0x80);
        i += 1;
    }
    bytes
}

/// Where two byte strings first differ, for failure messages that do not print 4 KiB.
pub fn bytes_diff(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    Some(format!(
        "{} bytes where {} were published, first difference at byte {at}",
        got.len(),
        want.len()
    ))
}

// ---------------------------------------------------------------------------------
// Native

/// One message (`MSG` or `HMSG`) from a native connection, with its sizes as sent.
#[derive(Debug, Clone)]
pub struct NatsMsg {
    pub subject: String,
    pub sid: String,
    /// The header block, `NATS/1.0` line and blank line included.
    pub headers: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

impl NatsMsg {
    /// Header bytes plus payload bytes: what `max_payload` bounds.
    pub fn size(&self) -> usize {
        self.headers.as_ref().map_or(0, Vec::len) + self.payload.len()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        header_value(self.headers.as_deref()?, name)
    }
}

#[derive(Debug)]
pub enum NativeEvent {
    Info(Value),
    Msg(NatsMsg),
    Ok,
    /// The text between the quotes of `-ERR '…'`.
    Err(String),
    Ping,
    Pong,
    Other(String),
    /// The server closed (with the read error, if any).
    Closed(Option<String>),
}

pub struct Native {
    writer: OwnedWriteHalf,
    events: mpsc::UnboundedReceiver<NativeEvent>,
    pending: VecDeque<NativeEvent>,
    /// What the server's INFO announced.
    pub max_payload: usize,
    inbox: String,
    next_reply: u64,
}

async fn read_native(read: OwnedReadHalf, tx: mpsc::UnboundedSender<NativeEvent>) {
    let mut reader = BufReader::new(read);
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) => {
                let _ = tx.send(NativeEvent::Closed(None));
                return;
            }
            Err(e) => {
                let _ = tx.send(NativeEvent::Closed(Some(e.to_string())));
                return;
            }
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_owned();
        let (op, rest) = text.split_once(' ').unwrap_or((text.as_str(), ""));
        let event = match op.to_ascii_uppercase().as_str() {
            "INFO" => NativeEvent::Info(serde_json::from_str(rest).unwrap_or(Value::Null)),
            "+OK" => NativeEvent::Ok,
            "PING" => NativeEvent::Ping,
            "PONG" => NativeEvent::Pong,
            "-ERR" => NativeEvent::Err(rest.trim().trim_matches('\'').to_owned()),
            "MSG" | "HMSG" => {
                let args: Vec<&str> = rest.split_ascii_whitespace().collect();
                let with_headers = op.eq_ignore_ascii_case("HMSG");
                let sizes = if with_headers { 2 } else { 1 };
                if args.len() < 2 + sizes || args.len() > 3 + sizes {
                    let _ = tx.send(NativeEvent::Closed(Some(format!("bad line {text:?}"))));
                    return;
                }
                let numbers: Vec<usize> = args[args.len() - sizes..]
                    .iter()
                    .filter_map(|n| n.parse().ok())
                    .collect();
                let (header_len, total) = match (with_headers, numbers.as_slice()) {
                    (true, [h, t]) if h <= t => (*h, *t),
                    (false, [t]) => (0, *t),
                    _ => {
                        let _ = tx.send(NativeEvent::Closed(Some(format!("bad sizes {text:?}"))));
                        return;
                    }
                };
                let mut body = vec![0; total + 2];
                if let Err(e) = reader.read_exact(&mut body).await {
                    let _ = tx.send(NativeEvent::Closed(Some(format!("in a body: {e}"))));
                    return;
                }
                body.truncate(total);
                let payload = body.split_off(header_len);
                NativeEvent::Msg(NatsMsg {
                    subject: args[0].to_owned(),
                    sid: args[1].to_owned(),
                    headers: with_headers.then_some(body),
                    payload,
                })
            }
            _ => NativeEvent::Other(text.clone()),
        };
        if tx.send(event).is_err() {
            return;
        }
    }
}

/// A native publish frame: `PUB` or, with headers, `HPUB` (the header block counts
/// towards the size on the line, as NATS defines it).
pub fn pub_frame(
    subject: &str,
    reply: Option<&str>,
    headers: Option<&[u8]>,
    payload: &[u8],
) -> Vec<u8> {
    let reply = reply.map(|r| format!(" {r}")).unwrap_or_default();
    let mut frame = match headers {
        Some(block) => {
            let mut f = format!(
                "HPUB {subject}{reply} {} {}\r\n",
                block.len(),
                block.len() + payload.len()
            )
            .into_bytes();
            f.extend_from_slice(block);
            f
        }
        None => format!("PUB {subject}{reply} {}\r\n", payload.len()).into_bytes(),
    };
    frame.extend_from_slice(payload);
    frame.extend_from_slice(b"\r\n");
    frame
}

impl Native {
    /// Connects, reads INFO, logs in with `token` (none: anonymous) and waits for PONG.
    /// Subscribes to its own reply inbox (sid `inbox`).
    pub async fn connect(addr: SocketAddr, token: Option<&str>) -> Result<Native, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (read, writer) = stream.into_split();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(read_native(read, tx));
        let mut native = Native {
            writer,
            events,
            pending: VecDeque::new(),
            max_payload: 0,
            inbox: format!("_INBOX.t{:016x}", fastrand::u64(..)),
            next_reply: 0,
        };
        match native.next().await {
            Some(NativeEvent::Info(info)) => {
                native.max_payload = info["max_payload"]
                    .as_u64()
                    .ok_or_else(|| format!("INFO without max_payload: {info}"))?
                    as usize;
            }
            other => return Err(format!("expected INFO first, got {other:?}")),
        }
        let mut connect = json!({
            "verbose": false, "pedantic": false, "headers": true, "no_responders": true,
            "protocol": 1, "lang": "canopy-tests", "version": "0",
        });
        if let Some(token) = token {
            connect["auth_token"] = json!(token);
        }
        let inbox = native.inbox.clone();
        native
            .send(format!("CONNECT {connect}\r\nSUB {inbox}.> inbox\r\n").as_bytes())
            .await;
        native
            .flush()
            .await
            .map_err(|e| format!("logging in: {e}"))?;
        Ok(native)
    }

    /// Writes `bytes`; false when the connection is already gone.
    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        self.writer.write_all(bytes).await.is_ok()
    }

    /// The next event within the wait (`None`: nothing came).
    pub async fn next(&mut self) -> Option<NativeEvent> {
        if let Some(event) = self.pending.pop_front() {
            return Some(event);
        }
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// PING, then waits for PONG; what came before it is kept for [`Native::next`].
    /// Fails on an -ERR, a close or no PONG.
    pub async fn flush(&mut self) -> Result<(), String> {
        self.send(b"PING\r\n").await;
        let mut kept = VecDeque::new();
        let result = loop {
            match tokio::time::timeout(WAIT, self.events.recv()).await {
                Ok(Some(NativeEvent::Pong)) => break Ok(()),
                Ok(Some(NativeEvent::Err(text))) => break Err(format!("-ERR '{text}'")),
                Ok(Some(NativeEvent::Closed(why))) => break Err(format!("closed ({why:?})")),
                Ok(Some(other)) => kept.push_back(other),
                Ok(None) => break Err("the reader stopped".into()),
                Err(_) => break Err("no PONG within the wait".into()),
            }
        };
        self.pending.extend(kept);
        result
    }

    /// Subscribes and waits until the server has taken the subscription.
    pub async fn subscribe(&mut self, subject: &str, sid: &str) -> Result<(), String> {
        self.send(format!("SUB {subject} {sid}\r\n").as_bytes())
            .await;
        self.flush()
            .await
            .map_err(|e| format!("SUB {subject}: {e}"))
    }

    /// A fresh reply subject under this connection's inbox.
    pub fn reply_subject(&mut self) -> String {
        self.next_reply += 1;
        format!("{}.{}", self.inbox, self.next_reply)
    }

    /// Calls `$CANOPY.<op>` and returns every answer up to the one `last` accepts.
    pub async fn api(
        &mut self,
        op: &str,
        body: &Value,
        last: impl Fn(&NatsMsg) -> bool,
    ) -> Result<Vec<NatsMsg>, String> {
        let reply = self.reply_subject();
        let frame = pub_frame(
            &format!("$CANOPY.{op}"),
            Some(&reply),
            None,
            body.to_string().as_bytes(),
        );
        self.send(&frame).await;
        let mut answers = Vec::new();
        loop {
            match self.next().await {
                Some(NativeEvent::Msg(m)) if m.subject == reply => {
                    let done = last(&m);
                    answers.push(m);
                    if done {
                        return Ok(answers);
                    }
                }
                Some(NativeEvent::Err(text)) => return Err(format!("-ERR '{text}'")),
                Some(NativeEvent::Closed(why)) => return Err(format!("closed ({why:?})")),
                Some(NativeEvent::Other(line)) => return Err(format!("the server sent {line:?}")),
                None => return Err(format!("no answer from $CANOPY.{op} within the wait")),
                Some(_) => {}
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// MQTT

#[derive(Debug)]
pub enum MqttEvent {
    Packet(Box<Packet>),
    /// The server closed, or sent what the codec refuses (then the reason says so).
    Closed(Option<String>),
}

pub struct Mqtt {
    writer: OwnedWriteHalf,
    events: mpsc::UnboundedReceiver<MqttEvent>,
    pending: VecDeque<MqttEvent>,
    pub level: Level,
    next_id: u16,
    pub connack: ConnAck,
}

async fn read_mqtt(
    mut read: OwnedReadHalf,
    level: Level,
    max_packet_size: usize,
    tx: mpsc::UnboundedSender<MqttEvent>,
) {
    let mut decoder = Decoder::with_level(level, max_packet_size);
    let mut buf = BytesMut::with_capacity(8192);
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(packet)) => {
                    if tx.send(MqttEvent::Packet(Box::new(packet))).is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    let _ = tx.send(MqttEvent::Closed(Some(format!(
                        "the server sent a packet a client with Maximum Packet Size \
                         {max_packet_size} refuses: {error}"
                    ))));
                    return;
                }
            }
        }
        match read.read_buf(&mut buf).await {
            Ok(0) => {
                let _ = tx.send(MqttEvent::Closed(None));
                return;
            }
            Err(e) => {
                let _ = tx.send(MqttEvent::Closed(Some(e.to_string())));
                return;
            }
            Ok(_) => {}
        }
    }
}

impl MqttEvent {
    /// The packet, or why the connection ended.
    pub fn packet(self) -> Result<Packet, Option<String>> {
        match self {
            MqttEvent::Packet(packet) => Ok(*packet),
            MqttEvent::Closed(why) => Err(why),
        }
    }
}

impl Mqtt {
    /// Connects at `level` (clean start) and waits for a successful CONNACK. The
    /// client accepts packets up to `max_packet_size` (announced to the server when v5).
    pub async fn connect(
        addr: SocketAddr,
        level: Level,
        client_id: &str,
        token: Option<&str>,
        max_packet_size: usize,
    ) -> Result<Mqtt, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (read, writer) = stream.into_split();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(read_mqtt(read, level, max_packet_size, tx));
        let mut properties = Properties::default();
        if level.is_v5() {
            properties.maximum_packet_size = u32::try_from(max_packet_size).ok();
        }
        let connect = Connect {
            level,
            client_id: client_id.to_owned(),
            clean_start: true,
            keep_alive: 60,
            username: token.map(|_| "tests".to_owned()),
            password: token.map(|t| Bytes::copy_from_slice(t.as_bytes())),
            will: None,
            properties,
        };
        let mut mqtt = Mqtt {
            writer,
            events,
            pending: VecDeque::new(),
            level,
            next_id: 0,
            connack: ConnAck {
                session_present: false,
                code: 0xff,
                properties: Properties::default(),
            },
        };
        mqtt.send(&Packet::Connect(Box::new(connect))).await;
        match mqtt.next().await.map(MqttEvent::packet) {
            Some(Ok(Packet::ConnAck(ack))) if ack.code == 0 => {
                mqtt.connack = ack;
                Ok(mqtt)
            }
            other => Err(format!("{client_id}: expected CONNACK 0, got {other:?}")),
        }
    }

    /// Encodes and writes `packet`; false when the connection is already gone.
    pub async fn send(&mut self, packet: &Packet) -> bool {
        let mut out = BytesMut::new();
        if let Err(error) = encode(packet, self.level, &mut out) {
            panic!("the test built a packet the codec cannot encode: {error:?} {packet:?}");
        }
        self.writer.write_all(&out).await.is_ok()
    }

    pub async fn next(&mut self) -> Option<MqttEvent> {
        if let Some(event) = self.pending.pop_front() {
            return Some(event);
        }
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    fn packet_id(&mut self) -> u16 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    /// Sends a PUBLISH (QoS 1 unless `qos` says otherwise); returns its packet id.
    pub async fn publish(
        &mut self,
        topic: &str,
        qos: QoS,
        payload: &[u8],
        properties: Properties,
    ) -> u16 {
        let packet_id = self.packet_id();
        let publish = Publish {
            dup: false,
            qos,
            retain: false,
            topic: ByteStr::from(topic),
            packet_id: (qos != QoS::AtMostOnce).then_some(packet_id),
            payload: Bytes::copy_from_slice(payload),
            properties,
        };
        self.send(&Packet::Publish(publish)).await;
        packet_id
    }

    /// Subscribes at QoS 0 and waits for the SUBACK's code.
    pub async fn subscribe(&mut self, filter: &str) -> Result<u8, String> {
        let packet_id = self.packet_id();
        let subscribe = Subscribe {
            packet_id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                qos: QoS::AtMostOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            properties: Properties::default(),
        };
        self.send(&Packet::Subscribe(subscribe)).await;
        let mut kept = VecDeque::new();
        let result = loop {
            match self.next().await.map(MqttEvent::packet) {
                Some(Ok(Packet::SubAck(ack))) if ack.packet_id == packet_id => {
                    break ack
                        .codes
                        .first()
                        .copied()
                        .ok_or_else(|| "an empty SUBACK".to_owned());
                }
                Some(Err(why)) => break Err(format!("closed ({why:?})")),
                None => break Err("no SUBACK within the wait".into()),
                Some(Ok(other)) => kept.push_back(MqttEvent::Packet(Box::new(other))),
            }
        };
        self.pending.extend(kept);
        result
    }
}

// ---------------------------------------------------------------------------------
// /ws

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

#[derive(Debug)]
pub enum WsEvent {
    Text(Value),
    /// A close frame: its code and reason, or none (an empty close frame).
    Close(Option<(u16, String)>),
    /// The socket ended (with the error, if any).
    Closed(Option<String>),
}

pub struct Ws {
    sink: futures::stream::SplitSink<Socket, WsMessage>,
    events: mpsc::UnboundedReceiver<WsEvent>,
    pending: VecDeque<WsEvent>,
    next_id: u64,
}

impl Ws {
    /// Opens `/ws`, presenting `token` as a `bearer.` subprotocol when given.
    pub async fn open(http: SocketAddr, token: Option<&str>) -> Result<Ws, String> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut upgrade = format!("ws://{http}/ws")
            .into_client_request()
            .map_err(|e| e.to_string())?;
        if let Some(token) = token {
            upgrade.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                format!("canopy, bearer.{token}")
                    .parse()
                    .map_err(|e| format!("{e}"))?,
            );
        }
        let (socket, _) = tokio_tungstenite::connect_async(upgrade)
            .await
            .map_err(|e| format!("open /ws: {e}"))?;
        let (sink, mut stream) = socket.split();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let event = match message {
                    Ok(WsMessage::Text(text)) => WsEvent::Text(
                        serde_json::from_str(text.as_str())
                            .unwrap_or_else(|_| Value::String(text.as_str().to_owned())),
                    ),
                    Ok(WsMessage::Close(frame)) => {
                        WsEvent::Close(frame.map(|f| (u16::from(f.code), f.reason.to_string())))
                    }
                    Ok(_) => continue,
                    Err(error) => {
                        let _ = tx.send(WsEvent::Closed(Some(error.to_string())));
                        return;
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
            let _ = tx.send(WsEvent::Closed(None));
        });
        Ok(Ws {
            sink,
            events,
            pending: VecDeque::new(),
            next_id: 0,
        })
    }

    pub async fn next(&mut self) -> Option<WsEvent> {
        if let Some(event) = self.pending.pop_front() {
            return Some(event);
        }
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// Sends `request` with a fresh id, which it returns; `None` when the send failed.
    async fn send_with_id(&mut self, mut request: Value) -> Option<String> {
        self.next_id += 1;
        let id = format!("r{}", self.next_id);
        request["id"] = json!(id);
        self.sink
            .send(WsMessage::text(request.to_string()))
            .await
            .ok()?;
        Some(id)
    }

    /// Sends `request` with a fresh id and returns the text answering it (or the close
    /// that came instead; `None`: nothing within the wait); other texts are kept for
    /// [`Ws::next`].
    pub async fn call(&mut self, request: Value) -> Option<WsEvent> {
        let Some(id) = self.send_with_id(request).await else {
            return Some(WsEvent::Closed(Some("the send failed".into())));
        };
        let mut kept = VecDeque::new();
        let answer = loop {
            match tokio::time::timeout(WAIT, self.events.recv()).await {
                Ok(Some(WsEvent::Text(value))) if value["id"] == json!(id) => {
                    break Some(WsEvent::Text(value));
                }
                Ok(Some(WsEvent::Text(value))) => kept.push_back(WsEvent::Text(value)),
                Ok(Some(closed)) => break Some(closed),
                Ok(None) => break Some(WsEvent::Closed(Some("the reader stopped".into()))),
                Err(_) => break None,
            }
        };
        self.pending.extend(kept);
        answer
    }

    /// Sends a `group.next` and returns its `group.msg` texts and the answer that
    /// ends it (`None`: not within the wait, or the socket closed).
    pub async fn pull(&mut self, request: Value) -> (Vec<Value>, Option<Value>) {
        let Some(id) = self.send_with_id(request).await else {
            return (Vec::new(), None);
        };
        let (mut messages, mut kept) = (Vec::new(), VecDeque::new());
        let answer = loop {
            match tokio::time::timeout(WAIT, self.events.recv()).await {
                Ok(Some(WsEvent::Text(value))) if value["id"] == json!(id) => {
                    if value["op"] == "group.msg" {
                        messages.push(value);
                    } else {
                        break Some(value);
                    }
                }
                Ok(Some(WsEvent::Text(value))) => kept.push_back(WsEvent::Text(value)),
                _ => break None,
            }
        };
        self.pending.extend(kept);
        (messages, answer)
    }
}

// ---------------------------------------------------------------------------------
// One publish through any front end, and what it answered

/// A message as a table row publishes it, in each front end's terms.
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// The native (and `/ws`) subject.
    pub subject: String,
    /// The MQTT topic.
    pub topic: String,
    /// Native HPUB headers, MQTT 5 user properties, `/ws` `headers`.
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
    /// Native: ask for the store's ack (`Canopy-Ack: durable`, with a reply subject).
    /// MQTT QoS 1 and `/ws` are always acknowledged.
    pub ack: bool,
    pub expect_version: Option<u64>,
    /// Native: publish with a reply subject (the store may ack it by policy).
    pub reply: bool,
}

impl Message {
    /// An ordinary small message to `subject` (native syntax, no escapes needed).
    pub fn plain(subject: &str, payload: &[u8]) -> Message {
        Message {
            subject: subject.to_owned(),
            topic: subject.replace('.', "/"),
            payload: payload.to_vec(),
            ..Message::default()
        }
    }
}

/// What a front end did with one publish.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Taken: +OK/PONG or a store ack, PUBACK 0x00/0x10, `/ws` `ok`.
    Taken { version: Option<u64> },
    /// `-ERR '<text>'`, and whether the server then closed.
    NatsErr { text: String, closed: bool },
    /// A store ack carrying an error.
    NatsErrorAck { err_code: Option<u64>, body: String },
    /// MQTT 5 PUBACK with a failure reason.
    PubAck {
        code: u8,
        reason_string: Option<String>,
        user_properties: Vec<(String, String)>,
    },
    /// MQTT 5 DISCONNECT.
    Disconnect { code: u8 },
    /// Closed without any answer.
    Closed { why: Option<String> },
    /// `/ws` error.
    WsError { code: String, message: String },
    /// `/ws` close frame (code `None`: an empty close frame).
    WsClose { code: Option<u16>, reason: String },
    /// Nothing within the wait.
    Nothing { awaited: String },
}

impl Answer {
    /// The connection can still be used after this answer.
    pub fn left_open(&self) -> bool {
        match self {
            Answer::Taken { .. }
            | Answer::NatsErrorAck { .. }
            | Answer::PubAck { .. }
            | Answer::WsError { .. } => true,
            Answer::NatsErr { closed, .. } => !closed,
            Answer::Disconnect { .. }
            | Answer::Closed { .. }
            | Answer::WsClose { .. }
            | Answer::Nothing { .. } => false,
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Taken { version } => match version {
                Some(v) => write!(f, "taken (version {v})"),
                None => write!(f, "taken"),
            },
            Answer::NatsErr { text, closed } => write!(
                f,
                "-ERR '{text}'{}",
                if *closed { " then closed" } else { ", open" }
            ),
            Answer::NatsErrorAck { err_code, body } => {
                write!(f, "error ack err_code {err_code:?}: {body}")
            }
            Answer::PubAck {
                code,
                reason_string,
                user_properties,
            } => write!(
                f,
                "PUBACK 0x{code:02X} (reason string {reason_string:?}, user properties \
                 {user_properties:?})"
            ),
            Answer::Disconnect { code } => write!(f, "DISCONNECT 0x{code:02X}"),
            Answer::Closed { why } => write!(f, "closed without an answer ({why:?})"),
            Answer::WsError { code, message } => write!(f, "/ws error {code}: {message}"),
            Answer::WsClose { code, reason } => match code {
                Some(code) => write!(f, "/ws close {code} {reason:?}"),
                None => write!(f, "/ws empty close frame"),
            },
            Answer::Nothing { awaited } => write!(f, "nothing within the wait ({awaited})"),
        }
    }
}

/// What SPEC.md's table says a front end answers.
#[derive(Debug, Clone)]
pub enum Want {
    /// Taken, delivered, and the connection goes on.
    Taken,
    /// `-ERR` with this text (or beginning with it when `prefix`); `closes` says whether
    /// the connection then closes.
    NatsErr {
        text: String,
        prefix: bool,
        closes: bool,
    },
    /// A store ack with this JetStream `err_code`.
    NatsErrorAck(u64),
    /// MQTT 5 PUBACK with this reason; `why`: with a reason string; `property`: with
    /// this user property.
    PubAck {
        code: u8,
        why: bool,
        property: Option<(&'static str, &'static str)>,
    },
    /// MQTT 5 DISCONNECT with this reason, then the close.
    Disconnect(u8),
    /// The connection closes without any answer (MQTT 3.1.1 has no way to refuse).
    Closed,
    /// Acknowledged like a taken publish, but neither delivered nor stored (what
    /// MQTT 3.1.1 does with a message its schema refuses).
    Dropped,
    /// `/ws` error with this code; the socket goes on.
    WsError(&'static str),
    /// `/ws`: close code 1009, or an error `too_large` (the socket then goes on).
    WsTooLarge,
    /// Not a cell of the table (the protocol cannot express the case).
    Skip(&'static str),
}

impl Want {
    pub fn err(text: impl Into<String>) -> Want {
        Want::NatsErr {
            text: text.into(),
            prefix: false,
            closes: false,
        }
    }

    pub fn err_prefix(text: impl Into<String>) -> Want {
        Want::NatsErr {
            text: text.into(),
            prefix: true,
            closes: false,
        }
    }

    pub fn err_closes(text: impl Into<String>) -> Want {
        Want::NatsErr {
            text: text.into(),
            prefix: false,
            closes: true,
        }
    }

    pub fn denied(subject: &str) -> Want {
        Want::err(format!(
            "Permissions Violation for Publish to \"{subject}\""
        ))
    }

    pub fn puback(code: u8) -> Want {
        Want::PubAck {
            code,
            why: false,
            property: None,
        }
    }

    pub fn is_refusal(&self) -> bool {
        !matches!(self, Want::Taken | Want::Skip(_))
    }

    /// Whether `answer` is this answer; `None` when it is, else what differs.
    pub fn check(&self, answer: &Answer) -> Option<String> {
        let ok = match (self, answer) {
            (Want::Taken | Want::Dropped, Answer::Taken { .. }) => true,
            (
                Want::NatsErr {
                    text,
                    prefix,
                    closes,
                },
                Answer::NatsErr { text: got, closed },
            ) => {
                let same = if *prefix {
                    got.starts_with(text.as_str())
                } else {
                    got == text
                };
                same && closes == closed
            }
            (Want::NatsErrorAck(code), Answer::NatsErrorAck { err_code, .. }) => {
                *err_code == Some(*code)
            }
            (
                Want::PubAck {
                    code,
                    why,
                    property,
                },
                Answer::PubAck {
                    code: got,
                    reason_string,
                    user_properties,
                },
            ) => {
                code == got
                    && (!why || reason_string.as_ref().is_some_and(|r| !r.is_empty()))
                    && property.is_none_or(|(name, value)| {
                        user_properties.iter().any(|(n, v)| n == name && v == value)
                    })
            }
            (Want::Disconnect(code), Answer::Disconnect { code: got }) => code == got,
            (Want::Closed, Answer::Closed { .. }) => true,
            (Want::WsError(code), Answer::WsError { code: got, .. }) => code == got,
            (Want::WsTooLarge, Answer::WsError { code, .. }) => code == "too_large",
            (Want::WsTooLarge, Answer::WsClose { code, .. }) => *code == Some(1009),
            (Want::Skip(_), _) => true,
            _ => false,
        };
        (!ok).then(|| format!("expected {self}, got {answer}"))
    }
}

impl std::fmt::Display for Want {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Want::Taken => write!(f, "taken and delivered"),
            Want::Dropped => write!(f, "acknowledged, not delivered"),
            Want::NatsErr {
                text,
                prefix,
                closes,
            } => write!(
                f,
                "-ERR '{text}{}'{}",
                if *prefix { "…" } else { "" },
                if *closes { " then closed" } else { ", open" }
            ),
            Want::NatsErrorAck(code) => write!(f, "an error ack with err_code {code}"),
            Want::PubAck {
                code,
                why,
                property,
            } => {
                write!(f, "PUBACK 0x{code:02X}")?;
                if *why {
                    write!(f, " with a reason string")?;
                }
                if let Some((name, value)) = property {
                    write!(f, " with user property {name}: {value}")?;
                }
                Ok(())
            }
            Want::Disconnect(code) => write!(f, "DISCONNECT 0x{code:02X}"),
            Want::Closed => write!(f, "the connection closed without a PUBACK"),
            Want::WsError(code) => write!(f, "/ws error {code}"),
            Want::WsTooLarge => write!(f, "/ws close 1009 or error too_large"),
            Want::Skip(why) => write!(f, "nothing ({why})"),
        }
    }
}

/// A publishing connection of one front end.
pub enum Publisher {
    Native(Native),
    Mqtt(Box<Mqtt>),
    Ws(Ws),
}

impl Publisher {
    /// Opens a connection of `front_end`, logged in with `token` (none: anonymous).
    /// MQTT clients accept packets up to `max_packet_size`.
    pub async fn open(
        front_end: FrontEnd,
        addrs: Addrs,
        token: Option<&str>,
        client_id: &str,
        max_packet_size: usize,
    ) -> Result<Publisher, String> {
        Ok(match front_end {
            FrontEnd::Native => Publisher::Native(Native::connect(addrs.native, token).await?),
            FrontEnd::Mqtt5 => Publisher::Mqtt(Box::new(
                Mqtt::connect(addrs.mqtt, Level::V5, client_id, token, max_packet_size).await?,
            )),
            FrontEnd::Mqtt311 => Publisher::Mqtt(Box::new(
                Mqtt::connect(addrs.mqtt, Level::V311, client_id, token, max_packet_size).await?,
            )),
            FrontEnd::Ws => Publisher::Ws(Ws::open(addrs.http, token).await?),
        })
    }

    /// Publishes `message` and waits for the front end's answer.
    pub async fn publish(&mut self, message: &Message) -> Answer {
        match self {
            Publisher::Native(native) => native_publish(native, message).await,
            Publisher::Mqtt(mqtt) => mqtt_publish(mqtt, message).await,
            Publisher::Ws(ws) => ws_publish(ws, message).await,
        }
    }
}

async fn native_publish(native: &mut Native, message: &Message) -> Answer {
    let mut headers = message.headers.clone();
    if message.ack {
        headers.push(("Canopy-Ack".into(), "durable".into()));
    }
    if let Some(version) = message.expect_version {
        headers.push(("Canopy-Expected-Version".into(), version.to_string()));
    }
    let awaits_reply = message.ack || message.expect_version.is_some() || message.reply;
    let reply = awaits_reply.then(|| native.reply_subject());
    let block = (!headers.is_empty()).then(|| header_block(&headers));
    let frame = pub_frame(
        &message.subject,
        reply.as_deref(),
        block.as_deref(),
        &message.payload,
    );
    // A server that closes at once may reset the rest of the write: what it said
    // before is still read.
    native.send(&frame).await;
    native.send(b"PING\r\n").await;
    let mut error = None;
    let mut pong = false;
    let mut ack: Option<NatsMsg> = None;
    let mut closed = false;
    loop {
        match native.next().await {
            Some(NativeEvent::Err(text)) => {
                error = Some(text);
                if pong {
                    break;
                }
            }
            Some(NativeEvent::Pong) => {
                pong = true;
                if !awaits_reply || ack.is_some() || error.is_some() {
                    break;
                }
            }
            Some(NativeEvent::Msg(m)) if Some(&m.subject) == reply.as_ref() => {
                ack = Some(m);
                if pong {
                    break;
                }
            }
            Some(NativeEvent::Closed(_)) => {
                closed = true;
                break;
            }
            Some(_) => {}
            None => {
                return Answer::Nothing {
                    awaited: match (&error, pong) {
                        (Some(text), _) => format!("PONG or a close after -ERR '{text}'"),
                        (None, true) => "the store's ack".into(),
                        (None, false) => "PONG".into(),
                    },
                };
            }
        }
    }
    if let Some(ack) = ack {
        let body: Value = serde_json::from_slice(&ack.payload).unwrap_or(Value::Null);
        if body.get("error").is_some() {
            return Answer::NatsErrorAck {
                err_code: body["error"]["err_code"].as_u64(),
                body: body.to_string(),
            };
        }
        if let Some(text) = error {
            return Answer::NatsErr { text, closed };
        }
        return Answer::Taken {
            version: body["version"].as_u64(),
        };
    }
    if let Some(text) = error {
        return Answer::NatsErr { text, closed };
    }
    if closed {
        return Answer::Closed { why: None };
    }
    Answer::Taken { version: None }
}

async fn mqtt_publish(mqtt: &mut Mqtt, message: &Message) -> Answer {
    let mut properties = Properties::default();
    if mqtt.level.is_v5() {
        properties.user_properties = message.headers.clone();
        if let Some(version) = message.expect_version {
            properties
                .user_properties
                .push(("Canopy-Expected-Version".into(), version.to_string()));
        }
    }
    let packet_id = mqtt
        .publish(
            &message.topic,
            QoS::AtLeastOnce,
            &message.payload,
            properties,
        )
        .await;
    loop {
        match mqtt.next().await.map(MqttEvent::packet) {
            Some(Ok(Packet::PubAck(Ack {
                packet_id: id,
                reason,
                properties,
            }))) if id == packet_id => {
                return if reason == 0x00 || reason == 0x10 {
                    Answer::Taken { version: None }
                } else {
                    Answer::PubAck {
                        code: reason,
                        reason_string: properties.reason_string,
                        user_properties: properties.user_properties,
                    }
                };
            }
            Some(Ok(Packet::Disconnect(d))) => {
                return Answer::Disconnect { code: d.reason };
            }
            Some(Err(why)) => return Answer::Closed { why },
            Some(Ok(_)) => {}
            None => {
                return Answer::Nothing {
                    awaited: format!("PUBACK {packet_id}"),
                };
            }
        }
    }
}

async fn ws_publish(ws: &mut Ws, message: &Message) -> Answer {
    let mut request =
        json!({"op": "pub", "subject": message.subject, "data_b64": b64(&message.payload)});
    if !message.headers.is_empty() {
        let headers: serde_json::Map<String, Value> = message
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        request["headers"] = Value::Object(headers);
    }
    if let Some(version) = message.expect_version {
        request["expect_version"] = json!(version);
    }
    ws_answer(ws.call(request).await)
}

fn ws_answer(event: Option<WsEvent>) -> Answer {
    match event {
        Some(WsEvent::Text(value)) if value["op"] == "ok" => Answer::Taken {
            version: value["version"].as_u64(),
        },
        Some(WsEvent::Text(value)) => Answer::WsError {
            code: value["code"].as_str().unwrap_or("?").to_owned(),
            message: value["message"].as_str().unwrap_or_default().to_owned(),
        },
        Some(WsEvent::Close(frame)) => Answer::WsClose {
            code: frame.as_ref().map(|(c, _)| *c),
            reason: frame.map(|(_, r)| r).unwrap_or_default(),
        },
        Some(WsEvent::Closed(why)) => Answer::Closed { why },
        None => Answer::Nothing {
            awaited: "the /ws answer".into(),
        },
    }
}

// ---------------------------------------------------------------------------------
// Setting up tenants for a table

/// Creates `tenant` with `limits` and users `(name, permissions)`; returns their
/// tokens in the same order.
pub async fn tenant_with_users(
    admin: &async_nats::Client,
    tenant: &str,
    limits: Value,
    users: &[(&str, Option<Value>)],
) -> Vec<String> {
    let (status, body) = crate::common::api(
        admin,
        "tenant.create",
        json!({"name": tenant, "limits": limits}),
    )
    .await;
    assert_eq!(status, 200, "tenant.create {tenant}: {body}");
    let mut tokens = Vec::new();
    for (name, permissions) in users {
        let mut request = json!({"tenant": tenant, "name": name});
        if let Some(permissions) = permissions {
            request["permissions"] = permissions.clone();
        }
        let (status, body) = crate::common::api(admin, "user.create", request).await;
        assert_eq!(status, 200, "user.create {name}@{tenant}: {body}");
        tokens.push(crate::common::issue_token(admin, tenant, name).await);
    }
    tokens
}
