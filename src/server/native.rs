//! The native (NATS-compatible) front end: the accept loop and one task per
//! connection.
//!
//! A connection task owns its socket, its read buffer and its decoder, and runs one
//! `select!` over shutdown, its outbox's wake-up, the socket and the ping timer. It
//! turns frames into broker calls and protocol answers; it never touches storage
//! internals and never blocks on another connection. Everything it writes goes
//! through its own outbox, so replies and deliveries leave in the order they were
//! queued.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::{
    ClientDecoder, ClientOp, ConnectOptions, Limits, ServerInfo, encode_err, encode_info,
    encode_ok, encode_ping, encode_pong, no_responders_block,
};
use canopy_subjects::{Limits as SubjectLimits, Pattern, validate_native_subject};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::broker::durable::{
    ACK_JETSTREAM, FLAG_NO_ECHO, FLAG_NO_RESPONDERS, StoreRequest, ack_body, append_one,
    bad_request_body,
};
use crate::broker::{Broker, Message, Outbox, RouteScratch, Subscription, TenantRoutes, Wakes};
use crate::config::{Config, StorePolicy};
use crate::store::{AckTo, AppendOutcome, AppendRequest, NewMessage, RouteTag};
use crate::tenancy::quota::{ConnectionSlot, Exceeded};
use crate::tenancy::{Action, DEFAULT_TENANT, Principal};

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
        Self {
            config,
            broker,
            limits,
            subject_limits,
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
        }
    }
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
        outbox.take(&mut self.buf);
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
    routes: Arc<TenantRoutes>,
    principal: Principal,
    stream: Option<TcpStream>,
    /// The user a TLS client certificate names, for logging in.
    certified: Option<String>,
    outbox: Arc<Outbox>,
    decoder: ClientDecoder,
    subs: HashMap<Bytes, Arc<Subscription>>,
    scratch: RouteScratch,
    wakes: Wakes,
    verbose: bool,
    no_responders: bool,
    pings_out: u32,
    active_since_ping: bool,
    /// Deliveries (messages, bytes) this inbound batch made, counted once per batch.
    delivered: (u64, u64),
    /// Publishes to stored subjects from this inbound batch, sent to the sequencer
    /// once the batch is decoded.
    appends: Vec<AppendRequest>,
    /// Appends were sent that no barrier has passed yet.
    unsequenced: bool,
    /// PINGs that wait for the sequencer before their PONG.
    pongs_owed: u32,
    /// A SUB or UNSUB that waits for earlier stored publishes to be routed.
    deferred: Option<ClientOp>,
    /// The connection's place in its tenant's connection quota.
    slot: Option<ConnectionSlot>,
    /// Over its tenant's publish rate: nothing more is read until then.
    paused_until: Option<tokio::time::Instant>,
    /// Publishes (messages, bytes) admitted in this inbound batch, counted once.
    admitted: (u64, u64),
}

impl Connection {
    fn new(stream: TcpStream, peer: SocketAddr, context: Arc<NativeContext>) -> Self {
        let broker = Arc::clone(&context.broker);
        let id = broker.next_id();
        let outbox = Arc::new(Outbox::new(
            id,
            context.config.native.max_pending_bytes,
            Arc::clone(broker.metrics()),
        ));
        let principal = Principal::anonymous(format!("native-{id}"));
        let routes = broker.tenant(DEFAULT_TENANT);
        Self {
            id,
            peer,
            decoder: ClientDecoder::new(context.limits),
            context,
            broker,
            routes,
            principal,
            stream: Some(stream),
            certified: None,
            outbox,
            subs: HashMap::new(),
            scratch: RouteScratch::default(),
            wakes: Wakes::default(),
            verbose: false,
            no_responders: false,
            pings_out: 0,
            active_since_ping: false,
            delivered: (0, 0),
            appends: Vec::new(),
            unsequenced: false,
            pongs_owed: 0,
            deferred: None,
            slot: None,
            paused_until: None,
            admitted: (0, 0),
        }
    }

    async fn run(mut self, shutdown: CancellationToken) {
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
    async fn serve<R, W>(
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
            .connection_opened(crate::broker::metrics::Protocol::Native);
        tracing::debug!(conn = self.id, peer = %self.peer, "connected");
        let info = self.context.info(self.id, self.peer);
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        if info.auth_required {
            let login = tokio::select! {
                _ = shutdown.cancelled() => Err("Authorization Timeout"),
                login = self.log_in(&info, info_sent, &mut reader, &mut writer, &mut rbuf) => login,
            };
            if let Err(reason) = login {
                let mut refusal = BytesMut::new();
                encode_err(&mut refusal, reason);
                let _ = writer.write_all(&refusal).await;
                let _ = writer.shutdown().await;
                tracing::info!(conn = self.id, peer = %self.peer, reason, "login refused");
                self.outbox.close();
                self.broker
                    .metrics()
                    .connection_closed(crate::broker::metrics::Protocol::Native);
                return;
            }
        } else if !info_sent {
            self.outbox.push_control(|out| encode_info(out, &info));
        }
        match self.routes.quota.connect() {
            Ok(slot) => self.slot = Some(slot),
            Err(exceeded) => {
                let mut refusal = BytesMut::new();
                if !info.auth_required && !info_sent {
                    encode_info(&mut refusal, &info);
                }
                encode_err(&mut refusal, &exceeded.to_string());
                let _ = writer.write_all(&refusal).await;
                let _ = writer.shutdown().await;
                tracing::info!(conn = self.id, peer = %self.peer, %exceeded, "connection refused");
                self.outbox.close();
                self.broker
                    .metrics()
                    .connection_closed(crate::broker::metrics::Protocol::Native);
                return;
            }
        }

        let interval = self.context.config.native.ping_interval();
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut out = Unwritten::default();
        let deadline = self.context.config.native.write_deadline();
        // Written but maybe not yet on the wire (only a TLS stream buffers).
        let mut unflushed = false;

        // Frames that came with CONNECT, now that the connection is admitted.
        let buffered = if rbuf.is_empty() {
            Ok(())
        } else {
            match self.process(&mut rbuf) {
                Ok(()) => self.catch_up(&mut rbuf).await,
                Err(close) => Err(close),
            }
        };
        let close = if let Err(close) = buffered {
            close
        } else {
            loop {
                if out.is_done() {
                    if self.outbox.is_slow() {
                        break Close::SlowConsumer;
                    }
                    out.refill(&self.outbox);
                }
                let writing = !out.is_done();
                // Reading goes on while a write is pending, so a client that publishes to
                // its own subscriptions faster than it reads cannot deadlock with us. Every
                // arm is cancel-safe: `cancelled` and `woken` keep no state when dropped (a
                // wake that lands meanwhile stays as a permit), `write` and `read_buf` move
                // no bytes unless they complete, and `tick` does not lose ticks.
                let step = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => Err(Close::Shutdown),
                    written = super::tls::write_or_flush(&mut writer, out.remaining()), if writing || unflushed => match written {
                        Ok(Some(0)) | Err(_) => Err(Close::Gone),
                        Ok(Some(n)) => {
                            out.advance(n);
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
                        self.outbox.mark_slow();
                        Err(Close::WriteTimeout)
                    }
                    _ = self.outbox.woken(), if !writing => Ok(()),
                    _ = tokio::time::sleep_until(
                        self.paused_until.unwrap_or_else(tokio::time::Instant::now)
                    ), if self.paused_until.is_some() => {
                        self.paused_until = None;
                        self.process(&mut rbuf)
                    }
                    read = reader.read_buf(&mut rbuf), if self.paused_until.is_none() => match read {
                        Ok(0) | Err(_) => Err(Close::Gone),
                        Ok(_) => self.process(&mut rbuf),
                    },
                    _ = ping.tick() => self.ping(),
                    _ = self.routes.deleted.cancelled() => {
                        self.outbox.push_control(|out| encode_err(out, "Authorization Violation: tenant deleted"));
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
                    break close;
                }
            }
        };

        // Unsubscribe before closing the outbox, so routing stops choosing this
        // connection (a queue group's pick would otherwise land on a closed outbox).
        let subs: Vec<Arc<Subscription>> = self.subs.drain().map(|(_, sub)| sub).collect();
        self.broker.unsubscribe_all(&self.routes, &subs);
        match close {
            // The client is told what was queued for it (an -ERR included) first.
            Close::Fatal(_) | Close::Shutdown => {
                let _ = tokio::time::timeout(deadline, out.drain(&self.outbox, &mut writer)).await;
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
        self.outbox.close();
        self.broker
            .metrics()
            .connection_closed(crate::broker::metrics::Protocol::Native);
    }

    /// Sends INFO, waits for CONNECT and logs the client in: on success the
    /// connection acts as that user in that user's tenant, and what followed CONNECT
    /// in `rbuf` is handled; on failure the reason to send before closing.
    async fn log_in(
        &mut self,
        info: &ServerInfo,
        info_sent: bool,
        reader: &mut (impl AsyncRead + Unpin),
        writer: &mut (impl AsyncWrite + Unpin),
        rbuf: &mut BytesMut,
    ) -> Result<(), &'static str> {
        if !info_sent {
            let mut first = BytesMut::new();
            encode_info(&mut first, info);
            writer.write_all(&first).await.map_err(|_| "gone")?;
        }
        let deadline = tokio::time::Instant::now() + LOGIN_TIMEOUT;
        let op = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(op)) => break op,
                Ok(None) => {}
                Err(error) => return Err(error.nats_text()),
            }
            match tokio::time::timeout_at(deadline, reader.read_buf(rbuf)).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(_) => return Err("gone"),
                Err(_) => return Err("Authorization Timeout"),
            }
        };
        let ClientOp::Connect(options) = op else {
            return Err("Authorization Violation");
        };
        let presented = crate::tenancy::login::Presented {
            user: options.user.clone(),
            password: options.pass.clone(),
            token: options.auth_token.clone(),
            certified: self.certified.clone(),
            client: options
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("native-{}", self.id)),
        };
        let Some(store) = self.broker.store().cloned() else {
            return Err("Authorization Violation");
        };
        let login = crate::tenancy::login::login(
            &store,
            self.broker.tenant_records(),
            self.broker.metrics(),
            &presented,
        );
        match login.await {
            Ok(principal) => {
                self.routes = self.broker.tenant(&principal.tenant);
                self.principal = principal;
                self.connect(&options)
                    .map_err(|_| "Authorization Violation")?;
                // What followed CONNECT waits for the connection's slot (`serve`).
                Ok(())
            }
            Err(crate::tenancy::login::LoginRefused) => {
                tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
                Err("Authorization Violation")
            }
        }
    }

    fn ping(&mut self) -> Result<(), Close> {
        if std::mem::take(&mut self.active_since_ping) {
            return Ok(());
        }
        if self.pings_out >= self.context.config.native.max_pings_outstanding {
            self.broker.metrics().count_stale_connection();
            self.outbox
                .push_control(|out| encode_err(out, "Stale Connection"));
            return Err(Close::Fatal("stale connection"));
        }
        self.pings_out += 1;
        self.outbox.push_control(encode_ping);
        Ok(())
    }

    /// Handles every complete frame in `rbuf`, then wakes each touched subscriber once.
    fn process(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        self.active_since_ping = true;
        let mut msgs = 0u64;
        let mut bytes = 0u64;
        self.delivered = (0, 0);
        let result = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(op)) => {
                    if let ClientOp::Pub { payload, .. } | ClientOp::HPub { payload, .. } = &op {
                        msgs += 1;
                        bytes += payload.len() as u64;
                    }
                    if matches!(op, ClientOp::Sub { .. } | ClientOp::Unsub { .. })
                        && (!self.appends.is_empty() || self.unsequenced)
                    {
                        // Routing changes wait until earlier stored publishes were
                        // routed, so they apply in the order the client sent them.
                        self.deferred = Some(op);
                        break Ok(());
                    }
                    if let Err(close) = self.handle(op) {
                        break Err(close);
                    }
                    if self.paused_until.is_some() {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => {
                    tracing::debug!(conn = self.id, %error, "protocol error");
                    self.outbox
                        .push_control(|out| encode_err(out, error.nats_text()));
                    break Err(Close::Fatal(error.nats_text()));
                }
            }
        };
        if msgs > 0 {
            self.broker.metrics().count_in(msgs, bytes);
        }
        let (admitted, admitted_bytes) = std::mem::take(&mut self.admitted);
        self.routes.quota.count_admitted(admitted, admitted_bytes);
        if self.delivered.0 > 0 {
            self.broker
                .metrics()
                .count_out(self.delivered.0, self.delivered.1);
        }
        self.wakes.wake_all();
        result
    }

    fn handle(&mut self, op: ClientOp) -> Result<(), Close> {
        match op {
            ClientOp::Connect(options) => return self.connect(&options),
            ClientOp::Pub {
                subject,
                reply,
                payload,
            } => self.publish(&subject, reply, None, payload),
            ClientOp::HPub {
                subject,
                reply,
                headers,
                payload,
            } => self.publish(&subject, reply, Some(headers), payload),
            ClientOp::Sub {
                subject,
                queue,
                sid,
            } => self.subscribe(&subject, queue.as_deref(), sid),
            ClientOp::Unsub { sid, max_msgs } => self.unsubscribe(&sid, max_msgs),
            // A PONG must follow the deliveries of every earlier publish; stored ones
            // are routed by the sequencer, so then the PONG waits for it.
            ClientOp::Ping if !self.appends.is_empty() || self.unsequenced => self.pongs_owed += 1,
            ClientOp::Ping => self.outbox.push_control(encode_pong),
            ClientOp::Pong => self.pings_out = 0,
        }
        Ok(())
    }

    fn ok(&self) {
        if self.verbose {
            self.outbox.push_control(encode_ok);
        }
    }

    fn error(&self, text: &str) {
        self.outbox.push_control(|out| encode_err(out, text));
    }

    fn connect(&mut self, options: &ConnectOptions) -> Result<(), Close> {
        if options.no_responders && !options.headers {
            self.error("no responders requires headers support");
            return Err(Close::Fatal("no responders without headers"));
        }
        self.verbose = options.verbose;
        self.no_responders = options.no_responders;
        self.outbox.set_options(options.headers, options.echo);
        if let Some(name) = options.name.as_deref().filter(|n| !n.is_empty()) {
            self.principal.client = Arc::from(name);
        }
        // Connect is always allowed until authentication exists; the call is here so
        // that tenancy has one place to refuse it.
        if let Err(denied) =
            self.broker
                .authorizer()
                .authorize(&self.principal, Action::Connect, "")
        {
            self.error(&denied.to_string());
            return Ok(());
        }
        self.ok();
        Ok(())
    }

    fn publish(
        &mut self,
        subject: &[u8],
        reply: Option<Bytes>,
        headers: Option<Bytes>,
        payload: Bytes,
    ) {
        let Some(subject) = std::str::from_utf8(subject)
            .ok()
            .filter(|s| validate_native_subject(s, &self.context.subject_limits).is_ok())
        else {
            self.error("Invalid Publish Subject");
            return;
        };
        if let Err(denied) =
            self.broker
                .authorizer()
                .authorize(&self.principal, Action::Publish, subject)
        {
            self.error(&denied.to_string());
            return;
        }
        if !subject.starts_with(api::PREFIX) {
            let size = payload.len() + headers.as_ref().map_or(0, |h| h.len());
            let admitted =
                self.routes
                    .quota
                    .admit_publish(size)
                    .and_then(|()| match self.broker.store() {
                        Some(store)
                            if store.at_bytes_limit(&self.routes.name)
                                && self.broker.store_policy(subject).is_some() =>
                        {
                            Err(self.routes.quota.stored_bytes_exceeded())
                        }
                        _ => Ok(()),
                    });
            if let Err(exceeded) = admitted {
                self.refuse_publish(&exceeded, subject, reply.as_deref(), headers.as_deref());
                return;
            }
            self.admitted.0 += 1;
            self.admitted.1 += size as u64;
        }
        // As nats-server does: the +OK, then deliveries (also to our own subscriptions).
        self.ok();
        if let Some(operation) = subject.strip_prefix(api::PREFIX) {
            let call = api::ApiCall {
                principal: self.principal.clone(),
                routes: Arc::clone(&self.routes),
                operation: operation.to_owned(),
                reply: reply
                    .as_deref()
                    .and_then(|r| std::str::from_utf8(r).ok())
                    .map(str::to_owned),
                body: payload,
            };
            api::spawn(Arc::clone(&self.broker), call);
            return;
        }
        // The policy borrows the broker; an Arc clone, not a copy of the policy.
        let broker = Arc::clone(&self.broker);
        if let Some(policy) = broker.store_policy(subject) {
            self.store_publish(policy, subject, reply, headers, payload);
            return;
        }
        let reply = reply.as_deref();
        let headers = headers.as_deref();
        let message = Message {
            subject,
            reply,
            headers,
            payload: &payload,
            origin: self.id,
            ..Message::default()
        };
        let delivered = self.broker.publish(
            &self.routes,
            &self.outbox,
            &message,
            &mut self.scratch,
            &mut self.wakes,
        );
        if delivered == 0
            && self.no_responders
            && let Some(reply) = reply.and_then(|r| std::str::from_utf8(r).ok())
        {
            let status = Message {
                subject: reply,
                reply: None,
                headers: Some(no_responders_block()),
                payload: &[],
                ..Message::default()
            };
            self.broker.deliver_to_conn(
                &self.routes,
                self.id,
                &status,
                &mut self.scratch,
                &mut self.wakes,
            );
        }
        self.delivered.0 += delivered as u64;
        self.delivered.1 += (delivered * (payload.len() + headers.map_or(0, <[u8]>::len))) as u64;
    }

    /// Tells the client its publish went over a quota (it was neither delivered nor
    /// stored) and, for a rate, stops reading until the rate admits more.
    /// A publish that waits for the store's ack gets an error ack instead, as the
    /// store itself would answer.
    fn refuse_publish(
        &mut self,
        exceeded: &Exceeded,
        subject: &str,
        reply: Option<&[u8]>,
        headers: Option<&[u8]>,
    ) {
        let broker = Arc::clone(&self.broker);
        let ack = broker.store_policy(subject).and_then(|policy| {
            let request = match headers.map(StoreRequest::from_headers) {
                None => StoreRequest::default(),
                Some(Ok(request)) => request,
                Some(Err(_)) => return None,
            };
            let reply = reply.and_then(|r| std::str::from_utf8(r).ok())?;
            request
                .wants_ack(policy)
                .then(|| (reply.to_owned(), request.jetstream))
        });
        match ack {
            Some((reply, jetstream)) => {
                let outcome = AppendOutcome::QuotaExceeded {
                    reason: exceeded.to_string(),
                };
                let body = ack_body(&self.routes.name, &outcome, jetstream);
                self.answer(&reply, &body);
            }
            None => self.error(&format!("Quota Exceeded: {exceeded}")),
        }
        if let Some(wait) = exceeded.wait() {
            self.paused_until = Some(tokio::time::Instant::now() + wait);
        }
    }

    /// Hands a publish to a stored subject to the store's sequencer, which routes it
    /// live in version order and acks it when asked.
    fn store_publish(
        &mut self,
        policy: &StorePolicy,
        subject: &str,
        reply: Option<Bytes>,
        headers: Option<Bytes>,
        payload: Bytes,
    ) {
        let request = match headers.as_deref().map(StoreRequest::from_headers) {
            None => StoreRequest::default(),
            Some(Ok(request)) => request,
            Some(Err(bad)) => {
                match reply.as_deref().and_then(|r| std::str::from_utf8(r).ok()) {
                    Some(reply) => self.answer(reply, &bad_request_body(&self.routes.name, &bad.0)),
                    None => self.error(&format!("Invalid Canopy Header: {bad}")),
                }
                return;
            }
        };
        let ack = reply
            .as_ref()
            .filter(|_| request.wants_ack(policy))
            .map(|address| AckTo {
                address: address.clone(),
                flags: if request.jetstream { ACK_JETSTREAM } else { 0 },
            });
        let mut flags = 0;
        if !self.outbox.echo() {
            flags |= FLAG_NO_ECHO;
        }
        if self.no_responders {
            flags |= FLAG_NO_RESPONDERS;
        }
        // The reply belongs to the ack when the store answers; otherwise it is a
        // plain request that subscribers may answer.
        let route = RouteTag {
            origin: self.id,
            flags,
            reply: if ack.is_some() { None } else { reply },
        };
        let message = NewMessage {
            headers: headers.unwrap_or_default(),
            payload,
            flags: 0,
        };
        self.appends.push(append_one(
            policy,
            &self.routes.name,
            subject,
            message,
            request,
            ack,
            route,
        ));
    }

    /// Publishes `body` to `subject` on behalf of the server (an error ack).
    fn answer(&mut self, subject: &str, body: &[u8]) {
        let message = Message {
            subject,
            reply: None,
            headers: None,
            payload: body,
            ..Message::default()
        };
        self.broker.route(
            &self.routes,
            None,
            &message,
            &mut self.scratch,
            &mut self.wakes,
        );
    }

    /// Sends the publishes this batch made to stored subjects; waits only while the
    /// sequencer's queue is full, which holds this publisher back and no one else.
    async fn send_appends(&mut self) {
        let Some(store) = self.broker.store().cloned() else {
            self.appends.clear();
            return;
        };
        for request in self.appends.drain(..) {
            self.unsequenced = true;
            if store.append(request).await.is_err() {
                // Shutting down: what was not taken is lost, and was never acked.
                break;
            }
        }
        if self.pongs_owed > 0 || self.deferred.is_some() {
            let _ = store.barrier().await;
            self.unsequenced = false;
            for _ in 0..std::mem::take(&mut self.pongs_owed) {
                self.outbox.push_control(encode_pong);
            }
        }
    }

    /// Sends stored publishes to the sequencer and, where an operation waits for
    /// them (PING, SUB, UNSUB), lets them be routed first; then goes on with the
    /// frames still buffered.
    async fn catch_up(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        while !self.appends.is_empty() || self.pongs_owed > 0 || self.deferred.is_some() {
            self.send_appends().await;
            match self.deferred.take() {
                Some(op) => {
                    self.handle(op)?;
                    self.process(rbuf)?;
                }
                None => break,
            }
        }
        Ok(())
    }

    fn subscribe(&mut self, subject: &[u8], queue: Option<&[u8]>, sid: Bytes) {
        // Owned: a slice would pin the whole read buffer for the subscription's life.
        let sid = Bytes::copy_from_slice(&sid);
        let Some((text, pattern)) = std::str::from_utf8(subject).ok().and_then(|s| {
            Pattern::parse_native_with(s, &self.context.subject_limits)
                .ok()
                .map(|p| (s, p))
        }) else {
            self.error("Invalid Subject");
            return;
        };
        let queue = match queue.map(std::str::from_utf8) {
            None => None,
            Some(Ok(q)) if !q.is_empty() => Some(q),
            Some(_) => {
                self.error("Invalid Queue Name");
                return;
            }
        };
        if let Err(denied) =
            self.broker
                .authorizer()
                .authorize(&self.principal, Action::Subscribe, text)
        {
            match queue {
                Some(q) => self.error(&format!("{denied} using queue \"{q}\"")),
                None => self.error(&denied.to_string()),
            }
            return;
        }
        if self.subs.get(&sid).is_some_and(|s| !s.is_spent()) {
            // NATS keeps the first subscription of a repeated sid.
            self.ok();
            return;
        }
        let max = self.context.config.native.max_subscriptions;
        if max > 0 && self.subs.len() >= max {
            // Subscriptions that ended by reaching their maximum are only noticed here.
            self.subs.retain(|_, s| !s.is_spent());
            if self.subs.len() >= max {
                self.error("maximum subscriptions exceeded");
                return;
            }
        }
        if let Err(exceeded) = self
            .routes
            .quota
            .admit_subscription(self.routes.subscription_count())
        {
            self.error(&exceeded.to_string());
            return;
        }
        let sub = self
            .broker
            .subscribe(&self.routes, &self.outbox, sid.clone(), pattern, queue);
        self.subs.insert(sid, sub);
        self.ok();
    }

    fn unsubscribe(&mut self, sid: &Bytes, max_msgs: Option<u64>) {
        if let Some(sub) = self.subs.get(sid) {
            let now = match max_msgs {
                Some(max) if max > 0 => sub.limit(max),
                _ => true,
            };
            if now {
                self.broker.unsubscribe(&self.routes, sub);
                self.subs.remove(sid);
            }
        }
        self.ok();
    }
}
