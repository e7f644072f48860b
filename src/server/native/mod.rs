//! The native (NATS-compatible) front end: the accept loop and one task per
//! connection.
//!
//! A connection task owns its socket, its read buffer and its decoder, and runs one
//! `select!` over shutdown, its outbox's wake-up, the socket and the ping timer. It
//! turns frames into broker calls and protocol answers; it never touches storage
//! internals and never blocks on another connection. Everything it writes goes
//! through its own outbox, so replies and deliveries leave in the order they were
//! queued.

mod login;
mod ops;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ClientDecoder, ClientOp, ConnectOptions, Limits, ServerInfo, encode_err, encode_info,
    encode_ok, encode_ping, encode_pong,
};
use canopy_subjects::{Limits as SubjectLimits, Pattern};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::durable::{FLAG_NO_ECHO, FLAG_NO_RESPONDERS};
use crate::broker::{Broker, Message, Outbox, Subscription};
use crate::config::Config;
use crate::session::{AskAck, Publish, Refusal, Refused, Session, SessionLimits, SubscribeRefusal};
use crate::tenancy::{DEFAULT_TENANT, Principal};

/// The version announced in INFO. Clients gate features (headers, no responders) on
/// the NATS server version, so Canopy announces the NATS release whose client
/// protocol it implements.
pub const NATS_PROTOCOL_VERSION: &str = "2.10.0";

/// Read buffer growth step.
const READ_CHUNK: usize = 64 * 1024;
/// How long a client has to send CONNECT when it must log in.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A write buffer larger than this is released after a flush instead of kept.
const KEEP_WRITE_CAPACITY: usize = 1024 * 1024;

/// What every native connection shares.
pub struct NativeContext {
    config: Arc<Config>,
    broker: Arc<Broker>,
    limits: Limits,
    subject_limits: SubjectLimits,
    session_limits: Arc<SessionLimits>,
    server_id: String,
    listen: SocketAddr,
    tls: Option<super::tls::Tls>,
}

impl NativeContext {
    pub fn new(
        config: Arc<Config>,
        broker: Arc<Broker>,
        listen: SocketAddr,
        tls: Option<super::tls::Tls>,
    ) -> Self {
        let limits = Limits {
            max_control_line: config.native.max_control_line,
            max_payload: config.native.max_payload,
        };
        let subject_limits = SubjectLimits {
            max_len: config.limits.max_subject_len,
            max_tokens: config.limits.max_subject_tokens,
        };
        let session_limits = Arc::new(SessionLimits {
            subjects: subject_limits,
            max_payload: config.native.max_payload,
            max_subscriptions: config.native.max_subscriptions,
        });
        Self {
            config,
            broker,
            limits,
            subject_limits,
            session_limits,
            server_id: server_id(),
            listen,
            tls,
        }
    }

    fn info(&self, client_id: u64, peer: SocketAddr) -> ServerInfo {
        ServerInfo {
            server_id: self.server_id.clone(),
            server_name: self.config.server.name.clone(),
            version: NATS_PROTOCOL_VERSION.into(),
            proto: 1,
            go: concat!("canopy ", env!("CARGO_PKG_VERSION")).into(),
            host: self.listen.ip().to_string(),
            port: self.listen.port(),
            headers: true,
            max_payload: self.config.native.max_payload,
            client_id,
            client_ip: Some(peer.ip().to_string()),
            auth_required: self.config.authz.require_login,
            tls_required: self.tls.is_some(),
            nonce: None,
            connect_urls: self
                .broker
                .mesh()
                .map(|mesh| mesh.client_urls())
                .unwrap_or_default(),
        }
    }
}

/// Returns when the cluster's nodes changed; never without a cluster (or once the
/// view is gone).
async fn nodes_changed(nodes: &mut Option<tokio::sync::watch::Receiver<Vec<String>>>) {
    if let Some(receiver) = nodes
        && receiver.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// A NATS-style server id: 56 characters of upper-case base32-like text.
fn server_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut id = String::from("N");
    id.extend((0..55).map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char));
    id
}

/// Accepts connections until `shutdown` fires; each gets its own task in `tracker`.
pub async fn accept_loop(
    listener: TcpListener,
    context: Arc<NativeContext>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) {
    let max = context.config.native.max_connections;
    super::listener::accept_loop(
        listener,
        "native",
        max,
        tracker,
        shutdown.clone(),
        |stream, peer, admitted| {
            let context = Arc::clone(&context);
            let shutdown = shutdown.clone();
            async move {
                if admitted {
                    Connection::new(stream, peer, context).run(shutdown).await;
                } else {
                    let info = context.info(0, peer);
                    refuse(stream, &info, "maximum connections exceeded").await;
                }
            }
        },
    )
    .await;
}

/// Answers a connection that cannot be served: INFO first, as clients expect, then
/// the reason.
async fn refuse(mut stream: TcpStream, info: &ServerInfo, reason: &str) {
    let mut out = BytesMut::new();
    encode_info(&mut out, info);
    encode_err(&mut out, reason);
    let _ = stream.write_all(&out).await;
}

/// Why a connection ends.
#[derive(Debug)]
enum Close {
    /// The client closed or the socket failed.
    Gone,
    /// A fatal protocol error, already reported to the client.
    Fatal(&'static str),
    /// The server is shutting down.
    Shutdown,
    /// A write passed its deadline part-way through a frame: nothing more can be
    /// written that the client could parse.
    WriteTimeout,
    /// A slow consumer, already sent its -ERR.
    SlowConsumer,
}

/// The bytes taken from the outbox and not yet written to the socket.
struct Unwritten {
    buf: BytesMut,
    written: usize,
    /// When the last byte was written (or the buffer was taken): the write deadline
    /// counts from here.
    progress: tokio::time::Instant,
}

impl Default for Unwritten {
    fn default() -> Self {
        Self {
            buf: BytesMut::new(),
            written: 0,
            progress: tokio::time::Instant::now(),
        }
    }
}

impl Unwritten {
    fn is_done(&self) -> bool {
        self.written >= self.buf.len()
    }

    fn remaining(&self) -> &[u8] {
        self.buf.get(self.written..).unwrap_or_default()
    }

    fn advance(&mut self, n: usize) {
        self.written += n;
        self.progress = tokio::time::Instant::now();
    }

    /// Takes the outbox's bytes, handing it back a buffer to fill (a large one is
    /// swapped for a small one, so one burst does not pin its memory).
    fn refill(&mut self, outbox: &Outbox) {
        self.buf.clear();
        if self.buf.capacity() > KEEP_WRITE_CAPACITY {
            self.buf = BytesMut::with_capacity(READ_CHUNK);
        }
        // Counted as unsent until written, so publishers feeding this connection
        // feel how far behind its socket is (`Outbox::sent` as it goes).
        outbox.take_unsent(&mut self.buf);
        self.written = 0;
        self.progress = tokio::time::Instant::now();
    }

    /// Writes everything pending, then everything still queued.
    async fn drain(
        &mut self,
        outbox: &Outbox,
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> std::io::Result<()> {
        loop {
            if self.is_done() {
                self.refill(outbox);
                if self.is_done() {
                    return Ok(());
                }
            }
            writer.write_all(self.remaining()).await?;
            self.written = self.buf.len();
        }
    }
}

struct Connection {
    id: u64,
    peer: SocketAddr,
    context: Arc<NativeContext>,
    broker: Arc<Broker>,
    /// Principal, tenant, outbox, quotas and publishes: what every front end shares.
    session: Session,
    stream: Option<TcpStream>,
    /// The user a TLS client certificate names, for logging in.
    certified: Option<String>,
    decoder: ClientDecoder,
    subs: HashMap<Bytes, Arc<Subscription>>,
    verbose: bool,
    no_responders: bool,
    /// The client takes INFO at any time (CONNECT's `protocol` 1, as NATS asks).
    dynamic_info: bool,
    pings_out: u32,
    active_since_ping: bool,
    /// Appends were sent that no barrier has passed yet.
    unsequenced: bool,
    /// PINGs that wait for the sequencer before their PONG.
    pongs_owed: u32,
    /// A SUB or UNSUB that waits for earlier stored publishes to be routed.
    deferred: Option<ClientOp>,
}

impl Connection {
    pub(super) fn new(stream: TcpStream, peer: SocketAddr, context: Arc<NativeContext>) -> Self {
        let broker = Arc::clone(&context.broker);
        let id = broker.next_id();
        let outbox = Arc::new(
            Outbox::new(
                id,
                context.config.native.max_pending_bytes,
                Arc::clone(broker.metrics()),
            )
            .with_behind_limit(context.config.native.write_deadline()),
        );
        let principal = Principal::anonymous(format!("native-{id}"));
        let routes = broker.tenant(DEFAULT_TENANT);
        let session = Session::new(
            Arc::clone(&broker),
            routes,
            principal,
            outbox,
            Arc::clone(&context.session_limits),
        );
        Self {
            id,
            peer,
            decoder: ClientDecoder::new(context.limits),
            context,
            broker,
            session,
            stream: Some(stream),
            certified: None,
            subs: HashMap::new(),
            verbose: false,
            no_responders: false,
            dynamic_info: false,
            pings_out: 0,
            active_since_ping: false,
            unsequenced: false,
            pongs_owed: 0,
            deferred: None,
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        let Some(tls) = self.context.tls.clone() else {
            let (reader, writer) = stream.into_split();
            return self.serve(reader, writer, false, shutdown).await;
        };
        // NATS clients read INFO in the clear, see `tls_required` and upgrade.
        let mut first = BytesMut::new();
        encode_info(&mut first, &self.context.info(self.id, self.peer));
        if stream.write_all(&first).await.is_err() {
            return;
        }
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = tls.accept(stream) => accepted,
        };
        match accepted {
            Ok(accepted) => {
                self.certified = accepted.certified;
                let (reader, writer) = tokio::io::split(accepted.stream);
                self.serve(reader, writer, true, shutdown).await;
            }
            Err(error) => {
                tracing::debug!(conn = self.id, peer = %self.peer, %error, "TLS handshake failed");
            }
        }
    }

    /// Serves the connection on its (clear or TLS) stream; `info_sent` when INFO
    /// went out before the TLS handshake.
    pub(super) async fn serve<R, W>(
        mut self,
        mut reader: R,
        mut writer: W,
        info_sent: bool,
        shutdown: CancellationToken,
    ) where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        self.broker
            .metrics()
            .connection_opened(crate::metrics::Protocol::Native);
        tracing::debug!(conn = self.id, peer = %self.peer, "connected");
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        let admitted = self
            .admit(info_sent, &mut reader, &mut writer, &mut rbuf, &shutdown)
            .await;
        if !admitted {
            self.session.outbox.close();
            self.broker
                .metrics()
                .connection_closed(crate::metrics::Protocol::Native);
            return;
        }
        let mut out = Unwritten::default();
        let close = self
            .traffic(
                &mut reader,
                &mut writer,
                rbuf,
                &mut out,
                info_sent,
                &shutdown,
            )
            .await;
        self.close(close, out, &mut writer).await;
    }

    /// Logs the client in, or greets it with INFO when logins are not required, and
    /// takes its place in the tenant's connection quota. False when it was refused,
    /// once it was told why.
    async fn admit(
        &mut self,
        info_sent: bool,
        reader: &mut (impl AsyncRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
        rbuf: &mut BytesMut,
        shutdown: &CancellationToken,
    ) -> bool {
        let info = self.context.info(self.id, self.peer);
        if info.auth_required {
            let login = tokio::select! {
                _ = shutdown.cancelled() => Err("Authorization Timeout"),
                login = self.log_in(&info, info_sent, reader, writer, rbuf) => login,
            };
            if let Err(reason) = login {
                let mut refusal = BytesMut::new();
                encode_err(&mut refusal, reason);
                let _ = writer.write_all(&refusal).await;
                let _ = writer.shutdown().await;
                tracing::info!(conn = self.id, peer = %self.peer, reason, "login refused");
                return false;
            }
        } else if !info_sent {
            self.session
                .outbox
                .push_control(|out| encode_info(out, &info));
        }
        match self.session.take_slot() {
            Ok(()) => true,
            Err(exceeded) => {
                let mut refusal = BytesMut::new();
                if !info.auth_required && !info_sent {
                    encode_info(&mut refusal, &info);
                }
                encode_err(&mut refusal, &exceeded.to_string());
                let _ = writer.write_all(&refusal).await;
                let _ = writer.shutdown().await;
                tracing::info!(conn = self.id, peer = %self.peer, %exceeded, "connection refused");
                false
            }
        }
    }

    /// Serves the admitted connection's traffic, the frames that came with CONNECT
    /// first, until it must close; says why.
    async fn traffic(
        &mut self,
        reader: &mut (impl AsyncRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
        mut rbuf: BytesMut,
        out: &mut Unwritten,
        info_sent: bool,
        shutdown: &CancellationToken,
    ) -> Close {
        let interval = self.context.config.native.ping_interval();
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline = self.context.config.native.write_deadline();
        // In a cluster: the nodes' addresses, sent again in an INFO when they change
        // to a client whose CONNECT (maybe still to come) says it takes one.
        let mut nodes = self.broker.mesh().map(|mesh| mesh.watch_client_urls());
        if let Some(nodes) = &mut nodes {
            nodes.mark_unchanged();
        }
        // Written but maybe not yet on the wire (only a TLS stream buffers).
        let mut unflushed = false;

        if !rbuf.is_empty() {
            let buffered = match self.process(&mut rbuf) {
                Ok(()) => self.catch_up(&mut rbuf).await,
                Err(close) => Err(close),
            };
            if let Err(close) = buffered {
                return close;
            }
        }
        loop {
            if out.is_done() {
                if self.session.outbox.is_slow() {
                    return Close::SlowConsumer;
                }
                out.refill(&self.session.outbox);
            }
            let writing = !out.is_done();
            // Subscribers this connection fed are falling behind: it reads no more
            // for a moment (writing goes on), as nats-server stalls a fast producer.
            let stalled = self.session.stalled();
            // Reading goes on while a write is pending, so a client that publishes to
            // its own subscriptions faster than it reads cannot deadlock with us. Every
            // arm is cancel-safe: `cancelled` and `woken` keep no state when dropped (a
            // wake that lands meanwhile stays as a permit), `write` and `read_buf` move
            // no bytes unless they complete, and `tick` does not lose ticks.
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Err(Close::Shutdown),
                written = super::tls::write_or_flush(writer, out.remaining()), if writing || unflushed => match written {
                    Ok(Some(0)) | Err(_) => Err(Close::Gone),
                    Ok(Some(n)) => {
                        out.advance(n);
                        self.session.outbox.sent(n);
                        // TLS may hold what it accepted until flushed.
                        unflushed = info_sent;
                        Ok(())
                    }
                    Ok(None) => {
                        unflushed = false;
                        Ok(())
                    }
                },
                _ = tokio::time::sleep_until(out.progress + deadline), if writing => {
                    self.session.outbox.mark_slow();
                    Err(Close::WriteTimeout)
                }
                _ = self.session.outbox.woken(), if !writing => Ok(()),
                _ = tokio::time::sleep_until(
                    self.session.paused_until.unwrap_or_else(tokio::time::Instant::now)
                ), if self.session.paused_until.is_some() => {
                    self.session.paused_until = None;
                    self.process(&mut rbuf)
                }
                () = self.session.relieved(), if stalled => Ok(()),
                read = reader.read_buf(&mut rbuf), if self.session.paused_until.is_none() && !stalled => match read {
                    Ok(0) | Err(_) => Err(Close::Gone),
                    Ok(_) => self.process(&mut rbuf),
                },
                _ = ping.tick() => self.ping(),
                () = nodes_changed(&mut nodes) => {
                    if self.dynamic_info {
                        let info = self.context.info(self.id, self.peer);
                        self.session.outbox.push_control(|out| encode_info(out, &info));
                    }
                    Ok(())
                }
                _ = self.session.routes().deleted.cancelled() => {
                    self.session.outbox.push_control(|out| encode_err(out, "Authorization Violation: tenant deleted"));
                    Err(Close::Fatal("tenant deleted"))
                }
            };
            if rbuf.capacity() - rbuf.len() < 1024 {
                rbuf.reserve(READ_CHUNK);
            }
            let step = match step {
                Ok(()) => self.catch_up(&mut rbuf).await,
                Err(close) => Err(close),
            };
            if let Err(close) = step {
                return close;
            }
        }
    }

    /// Ends the connection: its subscriptions, what it may still be told, and its
    /// outbox.
    async fn close(
        &mut self,
        close: Close,
        mut out: Unwritten,
        writer: &mut (impl AsyncWrite + Unpin),
    ) {
        let deadline = self.context.config.native.write_deadline();
        // Unsubscribe before closing the outbox, so routing stops choosing this
        // connection (a queue group's pick would otherwise land on a closed outbox).
        let subs: Vec<Arc<Subscription>> = self.subs.drain().map(|(_, sub)| sub).collect();
        self.session.close(&subs);
        match close {
            // The client is told what was queued for it (an -ERR included) first.
            Close::Fatal(_) | Close::Shutdown => {
                let _ =
                    tokio::time::timeout(deadline, out.drain(&self.session.outbox, writer)).await;
                let _ = writer.shutdown().await;
            }
            Close::SlowConsumer => {
                // The backlog is dropped: a client that could not keep up with it would
                // only fall further behind, and it would delay the reason for the close.
                let mut reason = BytesMut::new();
                encode_err(&mut reason, "Slow Consumer");
                let _ = tokio::time::timeout(deadline, async {
                    writer.write_all(&reason).await?;
                    writer.flush().await
                })
                .await;
            }
            Close::Gone | Close::WriteTimeout => {}
        }
        match close {
            Close::Fatal(reason) => {
                tracing::debug!(conn = self.id, peer = %self.peer, reason, "closed by server");
            }
            Close::WriteTimeout | Close::SlowConsumer => {
                tracing::info!(conn = self.id, peer = %self.peer, "slow consumer disconnected");
            }
            Close::Gone | Close::Shutdown => {
                tracing::debug!(conn = self.id, peer = %self.peer, "disconnected");
            }
        }
        self.session.outbox.close();
        self.broker
            .metrics()
            .connection_closed(crate::metrics::Protocol::Native);
    }
}
