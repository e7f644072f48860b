//! One MQTT connection: CONNECT, then one `select!` over shutdown, takeover, the
//! socket (both ways), the outbox wake-up and the keep-alive deadline.
//!
//! Deliveries reach the task as envelopes in its outbox. The task turns them into
//! PUBLISH packets itself, because only it knows the client's level, its in-flight
//! window (Receive Maximum), its packet identifiers and its Maximum Packet Size. QoS
//! 1 and 2 deliveries beyond the window wait in a bounded queue; past that bound the
//! outbox fills and the client is dropped as a slow consumer, to resume from its
//! session cursor. Publishes to stored subjects are acknowledged (PUBACK, PUBREC)
//! only once the store says they hold, through the connection's ack inbox.

mod admission;
mod backlog;
mod closing;
mod inbound;
mod outbound;
pub(super) mod relay;
pub use relay::Entry;
mod subscriptions;

#[cfg(test)]
use backlog::SessionMatcher;
use inbound::mqtt_code;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::{
    Ack, ConnAck, Connect, Decoder, Disconnect, Level, Packet, Properties, Publish, QoS, SubAck,
    Subscribe, UnsubAck, Unsubscribe, Will, encode, encode_publish, reason,
};
use canopy_subjects::{Pattern, Subject, Trie};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::MqttContext;
use super::session::{
    Claim, RECORD_VERSION, SavedInflight, SavedSubscription, SessionKey, SessionRecord, Stage,
};
use super::state::{Arrival, InboundFlow, KeepAlive, OutAlias, OutboundFlow, Receipt};
use super::translate;
use super::transport::Inbound;
use crate::broker::envelope::{
    self, AckInbox, Envelope, MqttOptions, StoreAck, mqtt_flags, qos_cap,
};
use crate::broker::{Broker, Outbox, Subscription};
use crate::session::{self, Admission, AskAck, Publisher, Refusal, Session, SubscribeRefusal};
use crate::store::{AppendOutcome, Expectation, ReplayFrom, Store};
use crate::tenancy::{Action, Principal};

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Deliveries are encoded into the write buffer until it holds this much.
const WRITE_BATCH: usize = 64 * 1024;
/// How long a turn of traffic stays with nothing to do before the connection parks.
const PARK_AFTER: Duration = Duration::from_secs(1);
/// How often a persistent session's moving cursor is saved while connected.
const SESSION_SAVE_EVERY: Duration = Duration::from_secs(5);
/// Requests with correlation data one connection may have open; the oldest is
/// forgotten beyond this.
const MAX_OPEN_REQUESTS: usize = 1024;
/// Retained messages and backlog read from the store per step.
const STORE_PAGE: usize = crate::store::PAGE_MESSAGES;
const STORE_PAGE_BYTES: usize = crate::store::PAGE_BYTES;

/// Serves one MQTT connection on a TCP socket until it ends.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    shutdown: CancellationToken,
) {
    let Some(tls) = context.tls.clone() else {
        let (reader, writer) = stream.into_split();
        let entry = Entry::Client { certified: None };
        return serve_on(reader, writer, peer, context, entry, shutdown).await;
    };
    // Boxed: a TLS stream is large, and plain connections should not pay for it.
    Box::pin(serve_tls(stream, tls, peer, context, shutdown)).await;
}

/// Serves one MQTT connection after its TLS handshake.
async fn serve_tls(
    stream: TcpStream,
    tls: crate::server::tls::Tls,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    shutdown: CancellationToken,
) {
    let accepted = tokio::select! {
        _ = shutdown.cancelled() => return,
        accepted = tls.accept(stream) => accepted,
    };
    match accepted {
        Ok(accepted) => {
            let (reader, writer) = tokio::io::split(accepted.stream);
            let reader = super::transport::StreamInbound::new(reader);
            let entry = Entry::Client {
                certified: accepted.certified,
            };
            serve_on(reader, writer, peer, context, entry, shutdown).await;
        }
        Err(error) => tracing::debug!(%peer, %error, "mqtt TLS handshake failed"),
    }
}

/// Serves one MQTT connection on any transport until it ends (or, in a cluster,
/// relays it to the node that serves its tenant). `entry` says how it came in: from
/// a client (with the user a TLS client certificate names), or relayed here.
pub async fn serve_on<R: Inbound, W: AsyncWrite + Unpin + Send>(
    mut reader: R,
    mut writer: W,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    entry: Entry,
    shutdown: CancellationToken,
) {
    let mut rbuf = BytesMut::with_capacity(1024);
    let mut decoder = Decoder::new(context.config.mqtt.max_packet_size);
    let wait = Duration::from_secs(context.config.mqtt.connect_timeout_secs.max(1));
    let first = tokio::select! {
        _ = shutdown.cancelled() => return,
        first = tokio::time::timeout(wait, read_connect(&mut reader, &mut rbuf, &mut decoder)) => first,
    };
    let connect = match first {
        Err(_) => {
            tracing::debug!(%peer, "mqtt client sent no CONNECT in time");
            return;
        }
        Ok(Err(refusal)) => {
            if let Some(answer) = refusal {
                let _ = writer.write_all(&answer).await;
                let _ = writer.shutdown().await;
            }
            return;
        }
        Ok(Ok(connect)) => connect,
    };
    // Boxed: a login in it is rare and large.
    let login = match Box::pin(relay::route(&context, &connect, entry)).await {
        relay::Route::Here(login) => login,
        relay::Route::Owner { node, caller } => {
            let relaying = relay::Relaying {
                connect: &connect,
                caller,
                node: &node,
                peer,
                context: &context,
            };
            Box::pin(relaying.run(reader, writer, rbuf, &shutdown)).await;
            return;
        }
        relay::Route::Unavailable(refused) => {
            Box::pin(refused.tell(connect.level, &mut writer)).await;
            return;
        }
    };
    let Some(connection) =
        // Boxed, like every rare step with store reads in it: a task's memory is the
        // size of its largest state, and an idle connection should not pay for them.
        Box::pin(Connection::accept(connect, peer, &context, login, decoder, &mut writer)).await
    else {
        return;
    };
    let mut connection = Box::new(connection);
    let metrics = Arc::clone(context.broker.metrics());
    metrics.connection_opened(crate::metrics::Protocol::Mqtt);
    let close = connection
        .live(&mut reader, &mut writer, rbuf, &shutdown)
        .await;
    Box::pin(connection.finish(close, &mut writer)).await;
    metrics.connection_closed(crate::metrics::Protocol::Mqtt);
}

/// Reads until the first packet, which must be CONNECT. An error carries the bytes to
/// send before closing, when the client can be told.
async fn read_connect<R: Inbound>(
    reader: &mut R,
    rbuf: &mut BytesMut,
    decoder: &mut Decoder,
) -> Result<Box<Connect>, Option<BytesMut>> {
    loop {
        match decoder.decode(rbuf) {
            Ok(Some(Packet::Connect(connect))) => return Ok(connect),
            Ok(Some(other)) => {
                tracing::debug!(
                    packet = other.name(),
                    "mqtt client did not start with CONNECT"
                );
                return Err(None);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "mqtt CONNECT refused");
                let mut out = BytesMut::new();
                let (level, code) = match (error.level, error.code) {
                    (Some(Level::V5), code) => (Level::V5, code),
                    (_, reason::UNSUPPORTED_PROTOCOL_VERSION) => {
                        (Level::V311, reason::V3_UNACCEPTABLE_PROTOCOL_VERSION)
                    }
                    // A malformed 3.x CONNECT is answered by closing.
                    _ => return Err(None),
                };
                let mut properties = Properties::default();
                if level == Level::V5 {
                    properties.reason_string = Some(error.message.clone());
                }
                let connack = Packet::ConnAck(ConnAck {
                    session_present: false,
                    code,
                    properties,
                });
                let _ = encode(&connack, level, &mut out);
                return Err(Some(out));
            }
        }
        if reader.ready().await.is_err() {
            return Err(None);
        }
        rbuf.reserve(1024);
        match reader.try_read(rbuf) {
            Ok(0) => return Err(None),
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(None),
        }
    }
}

/// Why a turn of [`Connection::run`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Right after CONNECT: packets may have come with it.
    Connected,
    /// The socket has bytes (or the end) to read.
    Readable,
    /// The outbox was woken: deliveries or store acks are waiting.
    Woken,
}

/// How a turn of [`Connection::run`] ended.
enum Turn {
    Closed(Close),
    /// Nothing to read, write or store: the connection can wait parked.
    Idle,
}

/// What a turn of [`Connection::run`] keeps between its steps. Its buffers are taken
/// only while there is traffic: an idle connection holds neither, which is most of
/// what a connected device costs.
struct Traffic {
    /// Bytes read and not yet processed.
    rbuf: BytesMut,
    /// Bytes to write to the client, of which `written` are.
    out: BytesMut,
    written: usize,
    /// When `out` was last filled or written to: the write deadline counts from it.
    progress: Instant,
    /// A TLS stream may hold what it took until flushed.
    unflushed: bool,
    wake: Wake,
    /// Bytes to read are read by the loop's first step: park only after it.
    stepped: bool,
    /// Since when the turn has had nothing to do, if it has not.
    idle_since: Option<Instant>,
    /// The turn read or wrote bytes.
    moved: bool,
}

impl Traffic {
    fn new(rbuf: BytesMut, wake: Wake) -> Traffic {
        Traffic {
            rbuf,
            out: BytesMut::new(),
            written: 0,
            progress: Instant::now(),
            unflushed: false,
            wake,
            stepped: wake != Wake::Readable,
            idle_since: None,
            moved: false,
        }
    }

    /// Counts what a write or flush of `out` did.
    fn wrote(&mut self, result: std::io::Result<Option<usize>>) -> Result<(), Close> {
        match result {
            Ok(Some(0)) | Err(_) => Err(Close::Gone),
            Ok(Some(n)) => {
                self.written += n;
                self.moved = true;
                self.progress = Instant::now();
                self.unflushed = true;
                Ok(())
            }
            Ok(None) => {
                self.unflushed = false;
                Ok(())
            }
        }
    }
}

/// What the timer of a turn of [`Connection::run`] found when it fired.
enum Fired {
    /// A deadline passed: the connection ends.
    Passed(Close),
    /// The turn was quiet long enough: it parks.
    Park,
    /// Nothing yet: the timer was set for a deadline that has since moved.
    NothingDue,
}

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Close {
    /// The client sent DISCONNECT; `with_will` for v5 reason 0x04.
    Disconnected { with_will: bool },
    /// The socket closed or failed without DISCONNECT.
    Gone,
    /// The server ends it: the v5 reason code and a sentence.
    Server { code: u8, reason: String },
    /// Another connection took the client id.
    TakenOver,
    /// The server is shutting down.
    Shutdown,
}

impl Close {
    /// Why a connection told to go ends: taken over by a new connection, or (its
    /// tenant now served by another node) as at a shutdown.
    fn taken_over(handoff: &super::session::Handoff) -> Close {
        if handoff.moved() {
            Close::Shutdown
        } else {
            Close::TakenOver
        }
    }

    fn protocol(code: u8, reason: impl Into<String>) -> Close {
        Close::Server {
            code,
            reason: reason.into(),
        }
    }
}

/// One message on its way to the client.
#[derive(Debug, Clone)]
struct Delivery {
    qos: u8,
    retain: bool,
    subscription_ids: Vec<u32>,
    version: u64,
    offset: u64,
    /// When it was stored (ms), for counting message expiry down; 0 when live.
    time_ms: u64,
    subject: Bytes,
    reply: Bytes,
    headers: Bytes,
    payload: Bytes,
    /// Bytes of the outbox's unsent count this delivery stands for (its envelope),
    /// given back once it is sent, so publishers wait while the queue is full too.
    owed: usize,
}

impl Delivery {
    fn from_envelope(envelope: Envelope, owed: usize) -> Delivery {
        Delivery {
            owed,
            qos: envelope.qos,
            retain: envelope.retain,
            subscription_ids: {
                let mut ids = envelope.extra_ids;
                if envelope.subscription_id != 0 {
                    ids.insert(0, envelope.subscription_id);
                }
                ids
            },
            version: envelope.version,
            offset: envelope.offset,
            time_ms: 0,
            subject: envelope.subject,
            reply: envelope.reply,
            headers: envelope.headers,
            payload: envelope.payload,
        }
    }

    fn size(&self) -> usize {
        self.subject.len() + self.headers.len() + self.payload.len() + 64
    }
}

/// A subscription of this connection.
struct SubEntry {
    saved: SavedSubscription,
    sub: Arc<Subscription>,
    pattern: Pattern,
    shared: bool,
}

/// Retained messages still to send for one new subscription.
struct RetainedJob {
    pattern: Pattern,
    options: MqttOptions,
    after: Option<String>,
}

/// The offline backlog being read from the store.
struct Backlog {
    /// The session's log from its cursor on, read through its filters.
    follower: crate::follow::Follower,
    done: bool,
}

struct Connection {
    id: u64,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    broker: Arc<Broker>,
    store: Option<Arc<Store>>,
    /// Principal, tenant, outbox, quotas and publishes: what every front end shares.
    session: Session,
    level: Level,
    key: SessionKey,
    claim: Claim,
    decoder: Decoder,
    acks: Arc<AckInbox>,
    keep_alive: KeepAlive,
    /// The client asked for no reason strings on acks (v5 Request Problem Information 0).
    problem_info: bool,
    /// Session expiry in seconds; 0 ends the session with the connection.
    session_expiry: u32,
    will: Option<Box<Will>>,

    /// QoS 1 and 2 publishes from the client, and its topic aliases.
    flow_in: InboundFlow,
    /// Deliveries in flight to the client, packet ids, the aliases it was given.
    flow_out: OutboundFlow<Delivery>,

    // To the client.
    client_max_packet: usize,
    queue: VecDeque<Delivery>,
    queued_bytes: usize,
    retained_jobs: VecDeque<RetainedJob>,
    /// Boxed: a connection without a backlog (most) keeps its task small.
    backlog: Option<Box<Backlog>>,
    /// The highest offset handed to the client (or skipped by the backlog bounds).
    high_offset: u64,
    /// The last offset the backlog read covered: live envelopes up to it are
    /// duplicates.
    backlog_high: u64,
    subs: HashMap<String, SubEntry>,
    session_dirty: bool,
    /// When the session was last saved, and its cursor then.
    saved_at: Instant,
    saved_high: u64,
    /// A saved record may exist (resumed, or saved since): ending a session that is
    /// not persistent must delete it.
    saved_record: bool,

    control: BytesMut,
    store_acks: Vec<StoreAck>,
    /// Scratch for a delivery's properties, made on first use.
    properties: Option<Box<Properties>>,
    /// Scratch for the MQTT rendering of a delivery's subject.
    topic: String,
    /// The inbox prefix (`_INBOX.mqtt-<conn>.`) and its subscription, once this
    /// connection made a request with correlation data.
    reply_inbox: Option<(String, Arc<Subscription>)>,
    /// Open requests: inbox number, response subject, correlation data.
    requests: VecDeque<(u64, Bytes, Bytes)>,
    next_request: u64,
}

impl Connection {
    /// Serves the connection until it ends, alternating between [`Connection::run`]
    /// while there is traffic and [`Connection::park`] while there is none.
    ///
    /// Most connected devices say nothing for minutes. Parked, a connection's task
    /// holds only what waiting needs (the socket's readiness, the outbox's wake, the
    /// keep-alive timer); the state of serving traffic, its futures and buffers, is
    /// boxed and exists only during a turn of `run`. One timer serves both, so going
    /// back and forth registers none.
    async fn live(
        &mut self,
        reader: &mut impl Inbound,
        writer: &mut (impl AsyncWrite + Unpin),
        mut rbuf: BytesMut,
        shutdown: &CancellationToken,
    ) -> Close {
        let timer = tokio::time::sleep_until(self.deadline(None));
        tokio::pin!(timer);
        let mut wake = Wake::Connected;
        loop {
            let turn = self.run(reader, writer, rbuf, shutdown, timer.as_mut(), wake);
            match Box::pin(turn).await {
                Turn::Closed(close) => return close,
                Turn::Idle => rbuf = BytesMut::new(),
            }
            wake = match self.park(reader, shutdown, timer.as_mut()).await {
                Ok(wake) => wake,
                Err(close) => return close,
            };
        }
    }

    /// Waits, holding nothing but the waits, until the client sends something, a
    /// delivery or store ack arrives, or the connection must end.
    async fn park(
        &self,
        reader: &mut impl Inbound,
        shutdown: &CancellationToken,
        mut timer: Pin<&mut Sleep>,
    ) -> Result<Wake, Close> {
        loop {
            let due = self.deadline(None);
            if due != timer.deadline() {
                timer.as_mut().reset(due);
            }
            // Each arm is cancel-safe and none takes anything: `run` finds the
            // readiness, the outbox's bytes and the acks where they were.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Err(Close::Shutdown),
                () = self.claim.handoff.taken_over() => return Err(Close::taken_over(&self.claim.handoff)),
                () = self.session.routes().deleted.cancelled() => {
                    return Err(Close::protocol(reason::ADMINISTRATIVE_ACTION, "the tenant was deleted"));
                }
                _ = self.session.outbox.woken() => return Ok(Wake::Woken),
                ready = reader.ready() => return ready.map(|()| Wake::Readable).map_err(|_| Close::Gone),
                () = timer.as_mut() => {
                    if self.keep_alive_due().is_some_and(|due| due <= Instant::now()) {
                        return Err(Close::protocol(reason::KEEP_ALIVE_TIMEOUT, "keep alive timeout"));
                    }
                }
            }
        }
    }

    /// One turn of traffic: reads, writes and store work until the connection ends
    /// ([`Turn::Closed`]) or has nothing left to do ([`Turn::Idle`]).
    async fn run(
        &mut self,
        reader: &mut impl Inbound,
        writer: &mut (impl AsyncWrite + Unpin),
        rbuf: BytesMut,
        shutdown: &CancellationToken,
        mut timer: Pin<&mut Sleep>,
        wake: Wake,
    ) -> Turn {
        let deadline = Duration::from_secs(self.context.config.mqtt.write_deadline_secs.max(1));
        let mut traffic = Traffic::new(rbuf, wake);
        let handoff = Arc::clone(&self.claim.handoff);
        if let Err(close) = self.start_turn(&mut traffic.rbuf).await {
            return Turn::Closed(close);
        }
        loop {
            if traffic.written >= traffic.out.len()
                && let Some(turn) = self.refill(&mut traffic)
            {
                return turn;
            }
            let writing = traffic.written < traffic.out.len();
            let write_due = writing.then_some(traffic.progress + deadline);
            // One timer for the keep-alive, the write deadline and the park, moved
            // earlier only when it must be: registering a timer per loop turn would
            // cost more than the turn itself under load.
            let due = self.turn_deadline(write_due, traffic.idle_since);
            if due < timer.deadline() {
                timer.as_mut().reset(due);
            }
            let mut timed_out = false;
            // Subscribers this connection fed are falling behind: it reads no more
            // for a moment (writing goes on).
            let stalled = self.session.stalled();
            // Every arm is cancel-safe: `write` and `read_buf` move no bytes unless
            // they complete, and the others keep no state when dropped.
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Err(Close::Shutdown),
                () = handoff.taken_over() => Err(Close::taken_over(&handoff)),
                () = self.session.routes().deleted.cancelled() => {
                    Err(Close::protocol(reason::ADMINISTRATIVE_ACTION, "the tenant was deleted"))
                }
                result = crate::server::tls::write_or_flush(writer, traffic.out.get(traffic.written..).unwrap_or_default()), if writing || traffic.unflushed => traffic.wrote(result),
                _ = self.session.outbox.woken(), if !writing => Ok(()),
                _ = tokio::time::sleep_until(
                    self.session.paused_until.unwrap_or_else(Instant::now)
                ), if self.session.paused_until.is_some() => {
                    self.session.paused_until = None;
                    // The client was not silent; we were not reading.
                    self.keep_alive.heard(Instant::now());
                    self.process(&mut traffic.rbuf)
                }
                () = self.session.relieved(), if stalled => Ok(()),
                ready = reader.ready(), if self.session.paused_until.is_none() && !stalled => match ready {
                    Err(_) => Err(Close::Gone),
                    Ok(()) => self.read(reader, &mut traffic),
                },
                () = timer.as_mut() => match self.timer_fired(write_due, traffic.idle_since) {
                    Fired::Passed(close) => Err(close),
                    Fired::Park => return Turn::Idle,
                    Fired::NothingDue => {
                        timed_out = true;
                        timer.as_mut().reset(self.turn_deadline(write_due, traffic.idle_since));
                        Ok(())
                    }
                }
            };
            traffic.stepped = true;
            if !timed_out {
                traffic.idle_since = None;
            }
            if let Err(close) = step {
                return Turn::Closed(close);
            }
            if let Err(close) = self.store_work().await {
                return Turn::Closed(close);
            }
        }
    }

    /// Starts a turn: processes the packets that arrived with CONNECT, then the store
    /// work waiting.
    async fn start_turn(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        if !rbuf.is_empty() {
            self.process(rbuf)?;
        }
        if rbuf.is_empty() {
            *rbuf = BytesMut::new();
        }
        // The wake that ended the park may have been a store ack: the outbox's wake
        // was taken by `park`, so the acks are looked at here, not after a step.
        self.store_work().await
    }

    /// Answers the store acks that arrived, and reads the retained messages and
    /// backlog still to send.
    async fn store_work(&mut self) -> Result<(), Close> {
        self.take_store_acks()?;
        if self.has_store_work() {
            Box::pin(self.catch_up()).await?;
        }
        Ok(())
    }

    /// Fills the write buffer again once all of it is written. Ends the turn when the
    /// client is too slow, or when there is nothing left to do at all.
    fn refill(&mut self, traffic: &mut Traffic) -> Option<Turn> {
        if traffic.out.capacity() > WRITE_BATCH * 2
            || (traffic.written > 0 && self.session.outbox.is_empty())
        {
            traffic.out = BytesMut::new();
        } else {
            traffic.out.clear();
        }
        traffic.written = 0;
        if self.session.outbox.is_slow() {
            return Some(Turn::Closed(Close::protocol(
                reason::QUOTA_EXCEEDED,
                "slow consumer: the client does not read its messages fast enough",
            )));
        }
        self.fill(&mut traffic.out);
        traffic.progress = Instant::now();
        if traffic.stepped
            && traffic.out.is_empty()
            && !traffic.unflushed
            && traffic.rbuf.is_empty()
            && self.session.paused_until.is_none()
            && !self.session.is_stalled()
            && !self.has_store_work()
        {
            // A device that just connected usually goes quiet, and a wake may have
            // found nothing: park at once, so a burst of handshakes leaves no turns
            // behind. A turn that moved bytes parks after a quiet spell, so that a
            // busy connection does not pay a park and a new turn between every two
            // packets.
            if traffic.wake == Wake::Connected || !traffic.moved {
                return Some(Turn::Idle);
            }
            traffic.idle_since.get_or_insert(traffic.progress);
        }
        None
    }

    /// Reads what the socket holds once it is ready, and processes the packets read.
    fn read(&mut self, reader: &mut impl Inbound, traffic: &mut Traffic) -> Result<(), Close> {
        let rbuf = &mut traffic.rbuf;
        if rbuf.capacity() - rbuf.len() < 1024 {
            rbuf.reserve(READ_CHUNK);
        }
        match reader.try_read(rbuf) {
            Ok(0) => Err(Close::Gone),
            Ok(_) => {
                traffic.moved = true;
                self.keep_alive.heard(Instant::now());
                let result = self.process(rbuf);
                if rbuf.is_empty() {
                    // Decoded packets hold their own slices of it.
                    *rbuf = BytesMut::new();
                }
                result
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                // Readiness outlives the read that drained the socket, so the next
                // wake finds nothing: the chunk reserved for it must not stay with an
                // idle connection.
                if rbuf.is_empty() {
                    *rbuf = BytesMut::new();
                }
                Ok(())
            }
            Err(_) => Err(Close::Gone),
        }
    }

    /// What is due when the turn's timer fires: a passed write deadline marks the
    /// client a slow consumer.
    fn timer_fired(&self, write_due: Option<Instant>, idle_since: Option<Instant>) -> Fired {
        let now = Instant::now();
        if write_due.is_some_and(|due| due <= now) {
            self.session.outbox.mark_slow();
            Fired::Passed(Close::protocol(
                reason::QUOTA_EXCEEDED,
                "slow consumer: writes are blocked",
            ))
        } else if self.keep_alive_due().is_some_and(|due| due <= now) {
            Fired::Passed(Close::protocol(
                reason::KEEP_ALIVE_TIMEOUT,
                "keep alive timeout",
            ))
        } else if idle_since.is_some_and(|since| since + PARK_AFTER <= now) {
            Fired::Park
        } else {
            Fired::NothingDue
        }
    }

    /// When the client must have sent something (1.5 × its keep-alive), if ever.
    pub(super) fn keep_alive_due(&self) -> Option<Instant> {
        self.keep_alive.due()
    }

    /// The earliest of the keep-alive and `write` deadlines (far away when neither).
    pub(super) fn deadline(&self, write: Option<Instant>) -> Instant {
        let far = Instant::now() + Duration::from_secs(86_400);
        self.keep_alive_due()
            .into_iter()
            .chain(write)
            .min()
            .unwrap_or(far)
    }

    /// [`Connection::deadline`], or the end of a quiet spell when the turn is idle.
    fn turn_deadline(&self, write: Option<Instant>, idle_since: Option<Instant>) -> Instant {
        let due = self.deadline(write);
        idle_since.map_or(due, |since| due.min(since + PARK_AFTER))
    }

    pub(super) fn persistent(&self) -> bool {
        self.session_expiry > 0
    }
}

fn ids(subscription_id: u32) -> Vec<u32> {
    if subscription_id == 0 {
        Vec::new()
    } else {
        vec![subscription_id]
    }
}

#[cfg(test)]
mod tests;
