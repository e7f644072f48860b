//! One raw MQTT benchmark connection: a tokio `TcpStream`, Canopy's MQTT codec
//! (`canopy_protocols::mqtt`), one read buffer and one write buffer sent in large batches.
//! The same code talks to Canopy and to Mosquitto.
//!
//! Owns: the handshake (CONNECT with a clean session, CONNACK), optionally from a chosen
//! source address, encoding what the roles send (the shared roles through
//! [`Connection`]), and turning a refused CONNECT, a server DISCONNECT, an undecodable
//! packet, a closed socket or a blocked write into errors.
//!
//! Must never: pass a DISCONNECT or an end of stream as progress, let its read buffer
//! grow past one packet (bounded by the decoder's maximum packet size) plus one read, or
//! buffer writes without bound (callers send at least every [`WRITE_BATCH`] bytes).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::{
    Ack, Connect, Decoder, Disconnect, Level, Packet, Properties, QoS, Subscribe, SubscribeFilter,
    encode, encode_publish,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::super::BenchError;
use super::super::conn::WRITE_BATCH;
use super::super::roles::Connection;

/// Each socket read asks for at least this much room (traffic connections).
const READ_CHUNK: usize = 256 * 1024;
/// Read room of a connection that only handshakes (`mqtt-idle`).
const SMALL_CHUNK: usize = 64;
/// The largest packet accepted from the server, unless payloads are larger.
const MAX_PACKET: usize = 1024 * 1024;

/// How to open connections.
#[derive(Debug, Clone)]
pub struct Dial {
    pub addr: SocketAddr,
    pub level: Level,
    pub keep_alive: u16,
    /// TCP connect to CONNACK.
    pub timeout: Duration,
    /// A blocked write or a wait for an answer longer than this is a stall.
    pub stall: Duration,
    /// Largest payload the roles send or expect.
    pub size: usize,
    /// Unique per run, so client identifiers never collide with an earlier run's
    /// sessions (which would take them over).
    pub run_id: String,
    /// Numbers the client identifiers of this run.
    next_client: Arc<AtomicUsize>,
}

impl Dial {
    pub fn new(addr: SocketAddr, options: &super::super::Options) -> Dial {
        Dial {
            addr,
            level: options.mqtt.mqtt_version.level(),
            keep_alive: options.mqtt.keep_alive,
            timeout: options.timeout,
            stall: options.mqtt.stall(),
            size: options.size,
            run_id: format!("{:08x}", fastrand::u32(..)),
            next_client: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// `cb<run>-<n>`: at most 23 characters (what MQTT 3.1.1 servers must accept) up to
    /// 10^12 connections.
    fn client_id(&self) -> String {
        let n = self.next_client.fetch_add(1, Ordering::Relaxed);
        format!("cb{}-{n}", self.run_id)
    }
}

pub struct MqttConn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    chunk: usize,
    decoder: Decoder,
    level: Level,
    role: &'static str,
    stall: Duration,
    /// v5: the Receive Maximum the server announced in CONNACK.
    pub receive_maximum: Option<u16>,
    /// Empty properties for every PUBLISH.
    none: Properties,
}

fn encode_error(what: &str, error: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("cannot encode {what}: {error}"))
}

impl MqttConn {
    /// Connects (from `source` when given), sends CONNECT with a clean session and a
    /// client identifier unique to this run, and waits for a CONNACK that accepts it.
    pub async fn connect(
        dial: &Dial,
        role: &'static str,
        source: Option<IpAddr>,
    ) -> Result<MqttConn, BenchError> {
        Self::connect_with(dial, role, source, READ_CHUNK).await
    }

    /// [`MqttConn::connect`] with small buffers, for connections that only handshake.
    pub async fn connect_small(
        dial: &Dial,
        role: &'static str,
        source: Option<IpAddr>,
    ) -> Result<MqttConn, BenchError> {
        Self::connect_with(dial, role, source, SMALL_CHUNK).await
    }

    async fn connect_with(
        dial: &Dial,
        role: &'static str,
        source: Option<IpAddr>,
        chunk: usize,
    ) -> Result<MqttConn, BenchError> {
        let timeout = dial.timeout;
        let connect_error = |source: std::io::Error| BenchError::Connect {
            addr: dial.addr.to_string(),
            source,
        };
        let stream = tokio::time::timeout(timeout, async {
            match source {
                None => TcpStream::connect(dial.addr).await,
                Some(ip) => {
                    let socket = if ip.is_ipv4() {
                        TcpSocket::new_v4()?
                    } else {
                        TcpSocket::new_v6()?
                    };
                    socket.bind(SocketAddr::new(ip, 0))?;
                    socket.connect(dial.addr).await
                }
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })?
        .map_err(connect_error)?;
        stream.set_nodelay(true)?;
        let max_packet = MAX_PACKET.max(dial.size.saturating_add(64 * 1024));
        let mut conn = MqttConn {
            stream,
            rbuf: BytesMut::with_capacity(chunk),
            wbuf: BytesMut::with_capacity(if chunk == SMALL_CHUNK {
                chunk
            } else {
                WRITE_BATCH * 2
            }),
            chunk,
            decoder: Decoder::with_level(dial.level, max_packet),
            level: dial.level,
            role,
            stall: dial.stall,
            receive_maximum: None,
            none: Properties::default(),
        };
        let connect = Packet::Connect(Box::new(Connect {
            level: dial.level,
            client_id: dial.client_id(),
            clean_start: true,
            keep_alive: dial.keep_alive,
            username: None,
            password: None,
            will: None,
            properties: Properties::default(),
        }));
        encode(&connect, dial.level, &mut conn.wbuf).map_err(|e| encode_error("CONNECT", e))?;
        let connack = tokio::time::timeout(timeout, async {
            conn.send().await?;
            loop {
                if let Some(packet) = conn.next_packet()? {
                    return match packet {
                        Packet::ConnAck(connack) => Ok(connack),
                        other => Err(BenchError::Unexpected {
                            role,
                            what: format!("{} before CONNACK", other.name()),
                        }),
                    };
                }
                conn.read_more().await?;
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })??;
        if connack.code != 0 {
            return Err(BenchError::Server {
                role,
                text: format!(
                    "CONNACK with return code 0x{:02x}{}",
                    connack.code,
                    reason_text(&connack.properties)
                ),
            });
        }
        conn.receive_maximum = connack.properties.receive_maximum;
        Ok(conn)
    }

    /// [`Connection::read_more`], failing as a stall when nothing arrives within the
    /// stall time; `done` of `expected` say how far the role got.
    pub async fn read_or_stall(&mut self, done: u64, expected: u64) -> Result<(), BenchError> {
        self.stalled_read(self.stall, done, expected).await
    }

    /// The next complete packet already read, if any. A DISCONNECT from the server is an
    /// error carrying its reason.
    pub fn next_packet(&mut self) -> Result<Option<Packet>, BenchError> {
        let role = self.role;
        match self.decoder.decode(&mut self.rbuf) {
            Ok(Some(Packet::Disconnect(disconnect))) => Err(BenchError::Server {
                role,
                text: format!(
                    "DISCONNECT with reason 0x{:02x}{}",
                    disconnect.reason,
                    reason_text(&disconnect.properties)
                ),
            }),
            Ok(packet) => Ok(packet),
            Err(error) => Err(BenchError::Unexpected {
                role,
                what: format!("a packet it cannot decode: {error}"),
            }),
        }
    }

    /// Buffers a PUBLISH.
    pub fn publish(
        &mut self,
        qos: QoS,
        retain: bool,
        topic: &[u8],
        packet_id: Option<u16>,
        payload: &[u8],
    ) -> Result<(), BenchError> {
        encode_publish(
            &mut self.wbuf,
            self.level,
            false,
            qos,
            retain,
            topic,
            packet_id,
            &self.none,
            payload,
        )
        .map_err(|e| encode_error("PUBLISH", e))
    }

    /// Buffers any other packet.
    pub fn packet(&mut self, packet: &Packet) -> Result<(), BenchError> {
        encode(packet, self.level, &mut self.wbuf).map_err(|e| encode_error(packet.name(), e))
    }

    /// Subscribes to `filter` at QoS 0 and waits for a SUBACK that grants it. Nothing
    /// else may arrive first.
    pub async fn subscribe(&mut self, filter: &str, timeout: Duration) -> Result<(), BenchError> {
        self.send_subscribe(filter, 1)?;
        let role = self.role;
        self.answer(timeout, "SUBACK", |packet| match packet {
            Packet::SubAck(suback) => Some(check_suback(role, filter, suback)),
            _ => None,
        })
        .await?
    }

    /// Sends everything buffered, then waits up to `timeout` for the next packet, which
    /// must be the answer `pick` reads (`None` for any other: an error while waiting for
    /// `what`).
    async fn answer<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        pick: impl FnOnce(&Packet) -> Option<T>,
    ) -> Result<T, BenchError> {
        let role = self.role;
        tokio::time::timeout(timeout, async {
            self.send().await?;
            loop {
                if let Some(packet) = self.next_packet()? {
                    return pick(&packet).ok_or_else(|| BenchError::Unexpected {
                        role,
                        what: format!("{} while waiting for {what}", packet.name()),
                    });
                }
                self.read_more().await?;
            }
        })
        .await
        .map_err(|_| BenchError::Timeout { role, timeout })?
    }

    /// Buffers a SUBSCRIBE of `filter` at QoS 0.
    pub fn send_subscribe(&mut self, filter: &str, packet_id: u16) -> Result<(), BenchError> {
        self.packet(&Packet::Subscribe(Subscribe {
            packet_id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                qos: QoS::AtMostOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            properties: Properties::default(),
        }))
    }

    /// Sends DISCONNECT and closes, ignoring failures: the run is over.
    pub async fn close(mut self) {
        if self
            .packet(&Packet::Disconnect(Disconnect::default()))
            .is_ok()
        {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.send()).await;
        }
        let _ = self.stream.shutdown().await;
    }

    /// The socket alone, for connections that are only held (`mqtt-idle`).
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

/// The MQTT side of the shared roles: QoS 0 PUBLISH, PINGREQ/PINGRESP, deliveries on a
/// QoS 0 subscription (a QoS 1 one is acknowledged), DISCONNECT at the end.
impl Connection for MqttConn {
    #[inline]
    fn queue(&mut self, topic: &[u8], payload: &[u8]) -> Result<(), BenchError> {
        self.publish(QoS::AtMostOnce, false, topic, None, payload)
    }

    #[inline]
    fn buffered(&self) -> usize {
        self.wbuf.len()
    }

    /// A write blocked longer than the stall time fails.
    async fn send(&mut self) -> Result<(), BenchError> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let (role, timeout) = (self.role, self.stall);
        tokio::time::timeout(timeout, self.stream.write_all(&self.wbuf))
            .await
            .map_err(|_| BenchError::Timeout {
                role: "publisher (the server stopped reading)",
                timeout,
            })?
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                    BenchError::Closed { role }
                }
                _ => BenchError::Io(error),
            })?;
        self.wbuf.clear();
        Ok(())
    }

    async fn read_more(&mut self) -> Result<(), BenchError> {
        if self.rbuf.capacity() - self.rbuf.len() < self.chunk / 2 {
            self.rbuf.reserve(self.chunk);
        }
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            return Err(BenchError::Closed { role: self.role });
        }
        Ok(())
    }

    async fn send_ping(&mut self) -> Result<(), BenchError> {
        self.packet(&Packet::PingReq)?;
        self.send().await
    }

    async fn wait_pong(&mut self, timeout: Duration) -> Result<(), BenchError> {
        self.answer(timeout, "PINGRESP", |packet| {
            matches!(packet, Packet::PingResp).then_some(())
        })
        .await
    }

    /// PUBLISH payloads (a QoS 1 delivery gets its PUBACK); PINGRESPs are passed over;
    /// any other packet, or a QoS 2 delivery, is an error.
    #[inline]
    fn next_message(&mut self) -> Result<Option<Bytes>, BenchError> {
        loop {
            match self.next_packet()? {
                Some(Packet::Publish(publish)) => {
                    match (publish.qos, publish.packet_id) {
                        (QoS::AtMostOnce, _) => {}
                        (QoS::AtLeastOnce, Some(id)) => {
                            self.packet(&Packet::PubAck(Ack::new(id)))?;
                        }
                        (qos, _) => {
                            return Err(BenchError::Unexpected {
                                role: self.role,
                                what: format!("a {qos:?} delivery on a QoS 0 subscription"),
                            });
                        }
                    }
                    return Ok(Some(publish.payload));
                }
                Some(Packet::PingResp) => {}
                Some(other) => {
                    return Err(BenchError::Unexpected {
                        role: self.role,
                        what: other.name().into(),
                    });
                }
                None => return Ok(None),
            }
        }
    }

    fn finish(self) -> impl Future<Output = ()> + Send {
        self.close()
    }
}

/// The bytes of a DISCONNECT at `level` (both levels: `e0 00`).
pub fn disconnect_bytes(level: Level) -> Bytes {
    let mut out = BytesMut::new();
    if encode(&Packet::Disconnect(Disconnect::default()), level, &mut out).is_err() {
        return Bytes::from_static(&[0xe0, 0x00]);
    }
    out.freeze()
}

/// A SUBACK must grant the one filter asked for.
pub fn check_suback(
    role: &'static str,
    filter: &str,
    suback: &canopy_protocols::mqtt::SubAck,
) -> Result<(), BenchError> {
    match suback.codes.as_slice() {
        [code] if *code < 0x80 => Ok(()),
        codes => Err(BenchError::Server {
            role,
            text: format!(
                "SUBACK for `{filter}` with codes {codes:02x?}{}",
                reason_text(&suback.properties)
            ),
        }),
    }
}

/// `: <reason string>` when a v5 packet carries one.
fn reason_text(properties: &Properties) -> String {
    properties
        .reason_string
        .as_deref()
        .map(|text| format!(": {text}"))
        .unwrap_or_default()
}
