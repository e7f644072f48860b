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

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::MqttContext;
use super::session::{
    Claim, RECORD_VERSION, SavedInflight, SavedSubscription, SessionKey, SessionRecord, Stage,
};
use super::translate;
use super::transport::Inbound;
use crate::broker::durable::ACK_MQTT;
use crate::broker::envelope::{
    self, AckInbox, Envelope, MqttOptions, StoreAck, mqtt_flags, qos_cap,
};
use crate::broker::{Broker, Outbox, Subscription};
use crate::session::{self, Admission, AskAck, Publisher, Refusal, Session, SubscribeRefusal};
use crate::store::{AckTo, AppendOutcome, Expectation, ReplayFrom, Store, now_ms};
use crate::tenancy::{Action, Principal};

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Deliveries are encoded into the write buffer until it holds this much.
const WRITE_BATCH: usize = 64 * 1024;
/// How often a persistent session's moving cursor is saved while connected.
const SESSION_SAVE_EVERY: Duration = Duration::from_secs(5);
/// Requests with correlation data one connection may have open; the oldest is
/// forgotten beyond this.
const MAX_OPEN_REQUESTS: usize = 1024;
/// Retained messages and backlog read from the store per step.
const STORE_PAGE: usize = 4096;
const STORE_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Serves one MQTT connection on a TCP socket until it ends.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    shutdown: CancellationToken,
) {
    let Some(tls) = context.tls.clone() else {
        let (reader, writer) = stream.into_split();
        return serve_on(reader, writer, peer, context, None, shutdown).await;
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
            serve_on(reader, writer, peer, context, accepted.certified, shutdown).await;
        }
        Err(error) => tracing::debug!(%peer, %error, "mqtt TLS handshake failed"),
    }
}

/// Serves one MQTT connection on any transport until it ends.
/// `certified` is the user a TLS client certificate names.
pub async fn serve_on<R: Inbound, W: AsyncWrite + Unpin + Send>(
    mut reader: R,
    mut writer: W,
    peer: SocketAddr,
    context: Arc<MqttContext>,
    certified: Option<String>,
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
    let Some(mut connection) =
        // Boxed, like every rare step with store reads in it: a task's memory is the
        // size of its largest state, and an idle connection should not pay for them.
        Box::pin(Connection::accept(connect, peer, &context, certified, decoder, &mut writer)).await
    else {
        return;
    };
    let metrics = Arc::clone(context.broker.metrics());
    metrics.connection_opened(crate::broker::metrics::Protocol::Mqtt);
    let close = connection
        .run(&mut reader, &mut writer, rbuf, &shutdown)
        .await;
    Box::pin(connection.finish(close, &mut writer)).await;
    metrics.connection_closed(crate::broker::metrics::Protocol::Mqtt);
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
}

impl Delivery {
    fn from_envelope(envelope: Envelope) -> Delivery {
        Delivery {
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

struct Inflight {
    packet_id: u16,
    stage: Stage,
    delivery: Delivery,
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
    next: u64,
    /// Read up to here; live deliveries at or below it were already sent.
    done: bool,
}

/// What an inbound QoS 1 or 2 publish waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InboundState {
    /// Handed to the store at this QoS; the ack is not back.
    Storing(u8),
    /// QoS 2 answered with PUBREC, waiting for PUBREL.
    Received,
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
    keep_alive: Option<Duration>,
    last_read: Instant,
    /// The client asked for no reason strings on acks (v5 Request Problem Information 0).
    problem_info: bool,
    /// Session expiry in seconds; 0 ends the session with the connection.
    session_expiry: u32,
    will: Option<Box<Will>>,

    // From the client.
    aliases: HashMap<u16, Bytes>,
    inbound: HashMap<u16, InboundState>,

    // To the client.
    window: usize,
    client_max_packet: usize,
    next_packet_id: u16,
    inflight: Vec<Inflight>,
    queue: VecDeque<Delivery>,
    queued_bytes: usize,
    retained_jobs: VecDeque<RetainedJob>,
    backlog: Option<Backlog>,
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
    /// Topic aliases this server may give the client (v5: the client's Topic Alias
    /// Maximum, capped by ours), and those given so far, by topic.
    alias_limit: u16,
    out_aliases: Option<HashMap<String, u16>>,
    /// The inbox prefix (`_INBOX.mqtt-<conn>.`) and its subscription, once this
    /// connection made a request with correlation data.
    reply_inbox: Option<(String, Arc<Subscription>)>,
    /// Open requests: inbox number, response subject, correlation data.
    requests: VecDeque<(u64, Bytes, Bytes)>,
    next_request: u64,
}

/// Logs an MQTT client in with its CONNECT's user name (`name@tenant`, or `name`) and
/// password; a password that is a token (`cnp.…`) logs in with the token, whatever the
/// user name. `None` when refused.
async fn log_in(
    broker: &Broker,
    connect: &Connect,
    client_id: &str,
    certified: Option<String>,
) -> Option<Principal> {
    let password = connect
        .password
        .as_ref()
        .and_then(|p| std::str::from_utf8(p).ok())
        .map(str::to_owned);
    let token = password.clone().filter(|p| p.starts_with("cnp."));
    let presented = crate::tenancy::login::Presented {
        user: connect.username.clone(),
        password: if token.is_some() { None } else { password },
        token,
        certified,
        client: client_id.to_owned(),
    };
    let store = broker.store()?;
    crate::tenancy::login::login(store, broker.tenant_records(), broker.metrics(), &presented)
        .await
        .ok()
}

impl Connection {
    /// Checks the CONNECT, takes the client id over, restores or clears the session
    /// and answers CONNACK. `None` when the connection was refused (and told).
    async fn accept(
        connect: Box<Connect>,
        peer: SocketAddr,
        context: &Arc<MqttContext>,
        certified: Option<String>,
        mut decoder: Decoder,
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> Option<Connection> {
        let config = &context.config.mqtt;
        let level = connect.level;
        decoder.set_level(level);
        let refuse = |code_v5: u8, code_v3: u8, why: &str| {
            let mut out = BytesMut::new();
            let mut properties = Properties::default();
            if level == Level::V5 {
                properties.reason_string = Some(why.to_owned());
            }
            let code = if level == Level::V5 { code_v5 } else { code_v3 };
            let _ = encode(
                &Packet::ConnAck(ConnAck {
                    session_present: false,
                    code,
                    properties,
                }),
                level,
                &mut out,
            );
            out
        };
        let broker = Arc::clone(&context.broker);
        let id = broker.next_id();
        let props = &connect.properties;
        if props.authentication_method.is_some() {
            let out = refuse(
                reason::BAD_AUTHENTICATION_METHOD,
                reason::V3_NOT_AUTHORIZED,
                "enhanced authentication is not supported",
            );
            let _ = writer.write_all(&out).await;
            return None;
        }
        let (client_id, assigned) = if connect.client_id.is_empty() {
            // MQTT 3.1 requires a client id; 3.1.1 allows none with a clean session.
            if level == Level::V31 || (!connect.clean_start && level != Level::V5) {
                let out = refuse(
                    reason::CLIENT_IDENTIFIER_NOT_VALID,
                    reason::V3_IDENTIFIER_REJECTED,
                    "an empty client id needs a clean session",
                );
                let _ = writer.write_all(&out).await;
                return None;
            }
            (format!("canopy-{id}-{:08x}", fastrand::u32(..)), true)
        } else {
            (connect.client_id.clone(), false)
        };
        let principal = if context.config.authz.require_login {
            match log_in(&broker, &connect, &client_id, certified).await {
                Some(principal) => principal,
                None => {
                    tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
                    let out = refuse(
                        reason::BAD_USER_NAME_OR_PASSWORD,
                        reason::V3_BAD_USER_NAME_OR_PASSWORD,
                        "bad user name or password",
                    );
                    let _ = writer.write_all(&out).await;
                    return None;
                }
            }
        } else {
            Principal::anonymous(client_id.as_str())
        };
        if let Some(will) = &connect.will {
            let publisher = Publisher::new(
                Arc::clone(&broker),
                broker.tenant(&principal.tenant),
                principal.clone(),
                Arc::clone(&context.session_limits),
                id,
            );
            let checked = Subject::parse_mqtt_with(&will.topic, &context.subject_limits)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))
                .and_then(|s| publisher.check_target(s.as_str()));
            if let Err(refused) = checked {
                let out = refuse(
                    mqtt_code(&refused),
                    reason::V3_NOT_AUTHORIZED,
                    &format!("the will topic cannot be used: {refused}"),
                );
                let _ = writer.write_all(&out).await;
                return None;
            }
        }

        let mut keep_alive = connect.keep_alive;
        let mut server_keep_alive = None;
        if config.max_keep_alive_secs > 0
            && (keep_alive == 0 || keep_alive > config.max_keep_alive_secs)
            && level == Level::V5
        {
            keep_alive = config.max_keep_alive_secs;
            server_keep_alive = Some(keep_alive);
        }
        let session_expiry = match level {
            Level::V5 => props
                .session_expiry_interval
                .unwrap_or(0)
                .min(config.max_session_expiry_secs),
            _ if connect.clean_start => 0,
            _ => config.v3_session_expiry_secs,
        };

        let key: SessionKey = (Arc::clone(&principal.tenant), client_id.clone());
        let claim = context.sessions.claim(&key, id);
        let taking_over = claim.previous.is_some();
        if let Some(previous) = claim.previous.clone() {
            // The previous holder saves its session before letting go.
            let _ = tokio::time::timeout(Duration::from_secs(10), previous.released()).await;
        }
        // The slot comes after a takeover, so a device reconnecting over its own dead
        // connection is not refused for the place that connection still holds.
        let quota = Arc::clone(&broker.tenant(&principal.tenant).quota);
        let mut slot = quota.connect();
        for _ in 0..100 {
            if slot.is_ok() || !taking_over {
                break;
            }
            // The previous holder gives its place back as its task ends.
            tokio::time::sleep(Duration::from_millis(10)).await;
            slot = quota.connect();
        }
        let slot = match slot {
            Ok(slot) => slot,
            Err(exceeded) => {
                tracing::info!(%peer, %exceeded, "mqtt connection refused");
                let out = refuse(
                    reason::QUOTA_EXCEEDED,
                    reason::V3_SERVER_UNAVAILABLE,
                    &exceeded.to_string(),
                );
                let _ = writer.write_all(&out).await;
                context.sessions.release(&key, id, false);
                claim.handoff.release();
                return None;
            }
        };
        let store = broker.store().cloned();
        let saved = match (&store, connect.clean_start) {
            (Some(store), true) => {
                // A lookup first (bloom filters answer it for the many clients that
                // never had a session): a delete is a durable write.
                let exists = store
                    .session(&key.0, &key.1)
                    .await
                    .map_or(true, |s| s.is_some());
                if exists && let Err(error) = store.save_session(&key.0, &key.1, None).await {
                    tracing::warn!(%error, client = %client_id, "cannot clear the saved mqtt session");
                }
                None
            }
            (Some(store), false) => match store.session(&key.0, &key.1).await {
                Ok(Some(bytes)) => match SessionRecord::decode(&bytes) {
                    Some(record) if !record.expired(now_ms()) => Some(record),
                    Some(_) => None,
                    None => {
                        tracing::warn!(client = %client_id, "a saved mqtt session cannot be read; starting afresh");
                        None
                    }
                },
                Ok(None) => None,
                Err(error) => {
                    tracing::warn!(%error, client = %client_id, "cannot read the saved mqtt session");
                    let out = refuse(
                        reason::SERVER_UNAVAILABLE,
                        reason::V3_SERVER_UNAVAILABLE,
                        "the session store cannot be read",
                    );
                    let _ = writer.write_all(&out).await;
                    context.sessions.release(&key, id, false);
                    claim.handoff.release();
                    return None;
                }
            },
            (None, _) => None,
        };

        let outbox = Arc::new(Outbox::new(
            id,
            config.max_pending_bytes,
            Arc::clone(broker.metrics()),
        ));
        let acks = Arc::new(AckInbox::new(Arc::clone(&outbox)));
        broker.mqtt_acks().register(id, Arc::clone(&acks));
        let window = usize::from(
            props
                .receive_maximum
                .unwrap_or(config.max_inflight)
                .min(config.max_inflight.max(1)),
        );
        let routes = broker.tenant(&principal.tenant);
        let mut session = Session::new(
            Arc::clone(&broker),
            routes,
            principal,
            outbox,
            Arc::clone(&context.session_limits),
        );
        session.hold_slot(slot);
        let mut connection = Connection {
            id,
            peer,
            context: Arc::clone(context),
            broker,
            store,
            session,
            level,
            key,
            claim,
            decoder,
            acks,
            keep_alive: (keep_alive > 0).then(|| Duration::from_secs(u64::from(keep_alive))),
            last_read: Instant::now(),
            problem_info: props.request_problem_information != Some(0),
            session_expiry,
            will: connect.will.clone().map(Box::new),
            aliases: HashMap::new(),
            inbound: HashMap::new(),
            window: window.max(1),
            client_max_packet: props
                .maximum_packet_size
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(usize::MAX),
            next_packet_id: 1,
            inflight: Vec::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            retained_jobs: VecDeque::new(),
            backlog: None,
            high_offset: 0,
            backlog_high: 0,
            subs: HashMap::new(),
            session_dirty: false,
            saved_at: Instant::now(),
            saved_high: 0,
            saved_record: false,
            control: BytesMut::new(),
            store_acks: Vec::new(),
            properties: None,
            topic: String::new(),
            alias_limit: props
                .topic_alias_maximum
                .unwrap_or(0)
                .min(config.topic_alias_maximum),
            out_aliases: None,
            reply_inbox: None,
            requests: VecDeque::new(),
            next_request: 1,
        };

        let session_present = saved.is_some();
        let mut connack = ConnAck {
            session_present,
            code: reason::SUCCESS,
            properties: Properties::default(),
        };
        if level == Level::V5 {
            let p = &mut connack.properties;
            p.receive_maximum = Some(config.receive_maximum);
            p.maximum_packet_size = u32::try_from(config.max_packet_size).ok();
            p.topic_alias_maximum = Some(config.topic_alias_maximum);
            p.retain_available = Some(1);
            p.wildcard_subscription_available = Some(1);
            p.subscription_identifiers_available = Some(1);
            p.shared_subscription_available = Some(1);
            if assigned {
                p.assigned_client_identifier = Some(client_id.clone());
            }
            if props.session_expiry_interval.unwrap_or(0) != session_expiry {
                p.session_expiry_interval = Some(session_expiry);
            }
            p.server_keep_alive = server_keep_alive;
        }
        connection.put_control(&Packet::ConnAck(connack));
        tracing::debug!(conn = id, %peer, client = %client_id, ?level, session_present, "mqtt connected");

        match saved {
            Some(record) => {
                connection.saved_record = true;
                connection.resume(record).await;
            }
            None if connection.persistent() => {
                connection.high_offset = connection.next_offset().await.saturating_sub(1);
            }
            None => {}
        }
        Some(connection)
    }

    /// The tenant's next offset: where a new session's cursor starts.
    async fn next_offset(&self) -> u64 {
        match &self.store {
            Some(store) => store
                .next_offset(&self.session.routes().name)
                .await
                .unwrap_or(1),
            None => 1,
        }
    }

    /// Restores a saved session: its subscriptions go live, its deliveries in flight
    /// are sent again with DUP, and its backlog is read from the cursor.
    async fn resume(&mut self, record: SessionRecord) {
        for saved in record.subscriptions {
            // Checked again as new: the rules or limits may have changed, and the
            // client id may now be another user's. One that fails is dropped.
            let _ = self.add_subscription(saved, true);
        }
        for pid in record.inbound_qos2 {
            self.inbound.insert(pid, InboundState::Received);
        }
        for saved in record.inflight {
            if self
                .broker
                .authorizer()
                .authorize(self.session.principal(), Action::Subscribe, &saved.subject)
                .is_err()
            {
                // Not this user's to receive: the delivery is forgotten.
                continue;
            }
            let delivery = Delivery {
                qos: saved.qos,
                retain: saved.retain,
                subscription_ids: saved.subscription_ids,
                version: saved.version,
                offset: saved.offset,
                time_ms: saved.time_ms,
                subject: Bytes::from(saved.subject),
                reply: saved.reply,
                headers: saved.headers,
                payload: saved.payload,
            };
            match saved.stage {
                Stage::Published => self.write_publish(&delivery, saved.packet_id, true),
                Stage::Released => self.put_control(&Packet::PubRel(Ack::new(saved.packet_id))),
            }
            self.next_packet_id = self
                .next_packet_id
                .max(saved.packet_id.wrapping_add(1))
                .max(1);
            self.inflight.push(Inflight {
                packet_id: saved.packet_id,
                stage: saved.stage,
                delivery,
            });
        }
        self.high_offset = record.cursor.saturating_sub(1);
        let has_filters = self.subs.values().any(|s| !s.shared);
        if let Some(store) = self.store.clone()
            && has_filters
        {
            // Every message routed before the subscriptions went live is durable
            // after this, so the backlog read below misses none of them.
            let _ = store.durable_barrier().await;
            let config = &self.context.config.mqtt;
            let min_time =
                now_ms().saturating_sub(config.backlog_max_age_secs.saturating_mul(1000));
            let matcher = self.matcher();
            let matches = |subject: &str| matcher.matches(subject);
            match store
                .backlog_start(
                    &self.session.routes().name,
                    &matches,
                    record.cursor.max(1),
                    min_time,
                    config.backlog_max_messages,
                    config.backlog_max_bytes,
                )
                .await
            {
                Ok((start, skipped)) => {
                    if skipped > 0 {
                        tracing::info!(
                            client = %self.key.1,
                            skipped,
                            "mqtt session backlog over its bounds: the oldest messages are skipped"
                        );
                    }
                    self.backlog = Some(Backlog {
                        next: start,
                        done: false,
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, client = %self.key.1, "cannot read the session backlog");
                }
            }
        }
    }

    /// The session's non-shared filters, for reading its backlog.
    fn matcher(&self) -> SessionMatcher {
        let mut trie = Trie::new();
        for entry in self.subs.values().filter(|e| !e.shared) {
            trie.insert(&entry.pattern, None, entry.saved.clone());
        }
        SessionMatcher { trie }
    }

    async fn run(
        &mut self,
        reader: &mut impl Inbound,
        writer: &mut (impl AsyncWrite + Unpin),
        mut rbuf: BytesMut,
        shutdown: &CancellationToken,
    ) -> Close {
        let deadline = Duration::from_secs(self.context.config.mqtt.write_deadline_secs.max(1));
        // Buffers are taken only while there is traffic: an idle connection holds
        // neither, which is most of what a connected device costs.
        let mut out = BytesMut::new();
        let mut written = 0usize;
        let mut progress = Instant::now();
        let mut unflushed = false;
        let handoff = Arc::clone(&self.claim.handoff);
        let timer = tokio::time::sleep_until(self.deadline(None));
        tokio::pin!(timer);
        // Packets that arrived with CONNECT.
        if !rbuf.is_empty()
            && let Err(close) = self.process(&mut rbuf)
        {
            return close;
        }
        if rbuf.is_empty() {
            rbuf = BytesMut::new();
        }
        loop {
            if written >= out.len() {
                if out.capacity() > WRITE_BATCH * 2
                    || (written > 0 && self.session.outbox.is_empty())
                {
                    out = BytesMut::new();
                } else {
                    out.clear();
                }
                written = 0;
                if self.session.outbox.is_slow() {
                    return Close::protocol(
                        reason::QUOTA_EXCEEDED,
                        "slow consumer: the client does not read its messages fast enough",
                    );
                }
                self.fill(&mut out);
                progress = Instant::now();
            }
            let writing = written < out.len();
            // One timer for the keep-alive and the write deadline, moved earlier only
            // when it must be: registering a timer per loop turn would cost more than
            // the turn itself under load.
            let due = self.deadline(writing.then_some(progress + deadline));
            if due < timer.deadline() {
                timer.as_mut().reset(due);
            }
            // Every arm is cancel-safe: `write` and `read_buf` move no bytes unless
            // they complete, and the others keep no state when dropped.
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Err(Close::Shutdown),
                () = handoff.taken_over() => Err(Close::TakenOver),
                () = self.session.routes().deleted.cancelled() => {
                    Err(Close::protocol(reason::ADMINISTRATIVE_ACTION, "the tenant was deleted"))
                }
                result = crate::server::tls::write_or_flush(writer, out.get(written..).unwrap_or_default()), if writing || unflushed => match result {
                    Ok(Some(0)) | Err(_) => Err(Close::Gone),
                    Ok(Some(n)) => {
                        written += n;
                        progress = Instant::now();
                        // A TLS stream may hold what it took until flushed.
                        unflushed = true;
                        Ok(())
                    }
                    Ok(None) => {
                        unflushed = false;
                        Ok(())
                    }
                },
                _ = self.session.outbox.woken(), if !writing => Ok(()),
                _ = tokio::time::sleep_until(
                    self.session.paused_until.unwrap_or_else(Instant::now)
                ), if self.session.paused_until.is_some() => {
                    self.session.paused_until = None;
                    // The client was not silent; we were not reading.
                    self.last_read = Instant::now();
                    self.process(&mut rbuf)
                }
                ready = reader.ready(), if self.session.paused_until.is_none() => match ready {
                    Err(_) => Err(Close::Gone),
                    Ok(()) => {
                        if rbuf.capacity() - rbuf.len() < 1024 {
                            rbuf.reserve(READ_CHUNK);
                        }
                        match reader.try_read(&mut rbuf) {
                            Ok(0) => Err(Close::Gone),
                            Ok(_) => {
                                self.last_read = Instant::now();
                                let result = self.process(&mut rbuf);
                                if rbuf.is_empty() {
                                    // Decoded packets hold their own slices of it.
                                    rbuf = BytesMut::new();
                                }
                                result
                            }
                            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
                            Err(_) => Err(Close::Gone),
                        }
                    }
                },
                () = &mut timer => {
                    let now = Instant::now();
                    if writing && progress + deadline <= now {
                        self.session.outbox.mark_slow();
                        Err(Close::protocol(reason::QUOTA_EXCEEDED, "slow consumer: writes are blocked"))
                    } else if self.keep_alive_due().is_some_and(|due| due <= now) {
                        Err(Close::protocol(reason::KEEP_ALIVE_TIMEOUT, "keep alive timeout"))
                    } else {
                        timer.as_mut().reset(self.deadline(writing.then_some(progress + deadline)));
                        Ok(())
                    }
                }
            };
            if let Err(close) = step {
                return close;
            }
            if let Err(close) = self.take_store_acks() {
                return close;
            }
            if self.has_store_work()
                && let Err(close) = Box::pin(self.catch_up()).await
            {
                return close;
            }
        }
    }

    /// Whether [`Connection::catch_up`] has anything to do.
    fn has_store_work(&self) -> bool {
        !self.session.appends.is_empty()
            || self.session_dirty
            || self.session_stale()
            || (self.queued_bytes < self.context.config.mqtt.max_queued_bytes
                && (!self.retained_jobs.is_empty()
                    || self.backlog.as_ref().is_some_and(|b| !b.done)))
    }

    /// A persistent session's cursor or acks moved since it was last saved, long
    /// enough ago: saving it now and then bounds what a crash re-delivers, without a
    /// durable write per message.
    fn session_stale(&self) -> bool {
        self.persistent()
            && self.saved_at.elapsed() >= SESSION_SAVE_EVERY
            && self.high_offset != self.saved_high
    }

    /// When the client must have sent something (1.5 × its keep-alive), if ever.
    fn keep_alive_due(&self) -> Option<Instant> {
        self.keep_alive.map(|k| self.last_read + k + k / 2)
    }

    /// The earliest of the keep-alive and `write` deadlines (far away when neither).
    fn deadline(&self, write: Option<Instant>) -> Instant {
        let far = Instant::now() + Duration::from_secs(86_400);
        self.keep_alive_due()
            .into_iter()
            .chain(write)
            .min()
            .unwrap_or(far)
    }

    /// Asynchronous work the last step left: appends for the store, store acks,
    /// retained messages and backlog pages, a session save.
    async fn catch_up(&mut self) -> Result<(), Close> {
        if !self.session.appends.is_empty() && !self.session.send_appends().await {
            return Err(Close::protocol(
                reason::SERVER_SHUTTING_DOWN,
                "the store is closing",
            ));
        }
        self.take_store_acks()?;
        let room = self.queued_bytes < self.context.config.mqtt.max_queued_bytes;
        if room && let Some(store) = self.store.clone() {
            if let Some(job) = self.retained_jobs.front_mut() {
                let page = store
                    .retained(
                        &self.session.routes().name,
                        &job.pattern,
                        job.after.as_deref(),
                        STORE_PAGE,
                        STORE_PAGE_BYTES,
                    )
                    .await;
                let options = job.options;
                match page {
                    Ok(page) => {
                        match page.next {
                            Some(next) => job.after = Some(next),
                            None => {
                                self.retained_jobs.pop_front();
                            }
                        }
                        let now = now_ms();
                        for message in page.messages {
                            let age = now.saturating_sub(message.time_ms) / 1000;
                            if translate::expired(&message.headers, age)
                                || !self.broker.authorizer().may_deliver(&message.subject)
                            {
                                continue;
                            }
                            self.enqueue(Delivery {
                                qos: options.qos.min(qos_cap(message.flags)),
                                retain: true,
                                subscription_ids: ids(options.subscription_id),
                                version: message.version,
                                // Retained messages are outside the cursor's order.
                                offset: 0,
                                time_ms: message.time_ms,
                                subject: Bytes::from(message.subject),
                                reply: Bytes::new(),
                                headers: message.headers,
                                payload: message.payload,
                            });
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot read retained messages");
                        self.retained_jobs.pop_front();
                    }
                }
                self.session.outbox.wake();
            } else if let Some(backlog) = self.backlog.as_ref().filter(|b| !b.done) {
                let from = backlog.next;
                let matcher = self.matcher();
                let authz = Arc::clone(self.broker.authorizer());
                let matches =
                    |subject: &str| matcher.matches(subject) && authz.may_deliver(subject);
                let page = store
                    .replay_matching(
                        &self.session.routes().name,
                        &matches,
                        ReplayFrom::Offset(from),
                        STORE_PAGE,
                        STORE_PAGE_BYTES,
                    )
                    .await;
                match page {
                    Ok(page) => {
                        let now = now_ms();
                        for message in page.messages {
                            let age = now.saturating_sub(message.time_ms) / 1000;
                            self.high_offset = self.high_offset.max(message.offset);
                            // Deliveries in flight were sent again with DUP already.
                            let resent = self
                                .inflight
                                .iter()
                                .any(|i| i.delivery.offset == message.offset);
                            if resent || translate::expired(&message.headers, age) {
                                continue;
                            }
                            let (qos, subscription_ids) =
                                matcher.delivery(&message.subject, message.flags);
                            let retain = message.flags & envelope::FLAG_RETAIN != 0
                                && matcher.keeps_retain(&message.subject);
                            self.enqueue(Delivery {
                                qos,
                                retain,
                                subscription_ids,
                                version: message.version,
                                offset: message.offset,
                                time_ms: message.time_ms,
                                subject: Bytes::from(message.subject),
                                reply: Bytes::new(),
                                headers: message.headers,
                                payload: message.payload,
                            });
                        }
                        self.high_offset = self.high_offset.max(page.next.saturating_sub(1));
                        self.backlog_high = self.backlog_high.max(page.next.saturating_sub(1));
                        if let Some(backlog) = &mut self.backlog {
                            backlog.next = page.next;
                            backlog.done = page.caught_up;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the session backlog; going live");
                        if let Some(backlog) = &mut self.backlog {
                            backlog.done = true;
                        }
                    }
                }
                self.session.outbox.wake();
            }
        }
        if self.session_dirty || self.session_stale() {
            self.session_dirty = false;
            self.save_session(false).await;
        }
        Ok(())
    }

    /// Encodes what may be sent now into `out`: control packets first, then
    /// deliveries while the window and the batch size allow.
    fn fill(&mut self, out: &mut BytesMut) {
        if !self.control.is_empty() {
            out.extend_from_slice(&self.control);
            self.control.clear();
        }
        let max_queued = self.context.config.mqtt.max_queued_bytes;
        while out.len() < WRITE_BATCH {
            if let Some(front) = self.queue.front() {
                if front.qos > 0 && self.inflight.len() >= self.window {
                    break;
                }
                let Some(delivery) = self.queue.pop_front() else {
                    break;
                };
                self.queued_bytes = self.queued_bytes.saturating_sub(delivery.size());
                self.send(delivery, out);
                continue;
            }
            // Live deliveries wait while the backlog is read, so order holds.
            let live = self.backlog.as_ref().is_none_or(|b| b.done);
            if !live || self.queued_bytes >= max_queued || self.session.outbox.is_empty() {
                break;
            }
            let mut taken = BytesMut::new();
            self.session.outbox.take(&mut taken);
            let mut taken = taken.freeze();
            while let Some(envelope) = envelope::decode(&mut taken) {
                if self.forward_reply(&envelope) {
                    continue;
                }
                if envelope.offset != 0 && envelope.offset <= self.backlog_high {
                    // Already sent by the backlog. (Several envelopes may share an
                    // offset: one per matching subscription.)
                    continue;
                }
                self.high_offset = self.high_offset.max(envelope.offset);
                self.enqueue(Delivery::from_envelope(envelope));
            }
        }
        if !self.control.is_empty() {
            out.extend_from_slice(&self.control);
            self.control.clear();
        }
    }

    fn enqueue(&mut self, delivery: Delivery) {
        self.queued_bytes += delivery.size();
        self.queue.push_back(delivery);
    }

    /// Writes one delivery, giving it a packet identifier when its QoS needs one.
    fn send(&mut self, delivery: Delivery, out: &mut BytesMut) {
        if delivery.qos == 0 {
            self.encode_publish(&delivery, None, false, out);
            return;
        }
        let Some(packet_id) = self.free_packet_id() else {
            // 65,535 in flight cannot happen with a window below that; drop rather
            // than reuse an identifier.
            return;
        };
        if self.encode_publish(&delivery, Some(packet_id), false, out) {
            self.inflight.push(Inflight {
                packet_id,
                stage: Stage::Published,
                delivery,
            });
        }
    }

    fn free_packet_id(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            let id = self.next_packet_id;
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if !self.inflight.iter().any(|i| i.packet_id == id) {
                return Some(id);
            }
        }
        None
    }

    /// Encodes a PUBLISH; false when it was not sent (too large for the client, or
    /// expired).
    fn encode_publish(
        &mut self,
        delivery: &Delivery,
        packet_id: Option<u16>,
        dup: bool,
        out: &mut BytesMut,
    ) -> bool {
        let Ok(native) = std::str::from_utf8(&delivery.subject) else {
            return false;
        };
        let mut topic = std::mem::take(&mut self.topic);
        if !translate::mqtt_topic(native, &mut topic) {
            self.topic = topic;
            return false;
        }
        let age = if delivery.time_ms == 0 {
            0
        } else {
            now_ms().saturating_sub(delivery.time_ms) / 1000
        };
        let mut properties = self.properties.take().unwrap_or_default();
        if self.level == Level::V5 {
            if translate::outbound(&delivery.headers, &delivery.reply, 0, age, &mut properties)
                .is_none()
            {
                self.properties = Some(properties);
                return false;
            }
            properties.subscription_identifiers = delivery.subscription_ids.clone();
        } else {
            *properties = Properties::default();
            if translate::expired(&delivery.headers, age) {
                self.properties = Some(properties);
                return false;
            }
        }
        // A topic the client already knows by alias goes as the alias alone; a new
        // one gets the next alias while the client's maximum allows.
        let mut topic_bytes = topic.as_bytes();
        let mut new_alias = None;
        if self.alias_limit > 0 {
            let aliases = self.out_aliases.get_or_insert_with(Default::default);
            match aliases.get(topic.as_str()) {
                Some(alias) => {
                    properties.topic_alias = Some(*alias);
                    topic_bytes = b"";
                }
                None if aliases.len() < usize::from(self.alias_limit) => {
                    let alias = u16::try_from(aliases.len() + 1).unwrap_or(u16::MAX);
                    properties.topic_alias = Some(alias);
                    new_alias = Some(alias);
                }
                None => {}
            }
        }
        let qos = QoS::from_bits(delivery.qos).unwrap_or(QoS::AtMostOnce);
        let start = out.len();
        let result = encode_publish(
            out,
            self.level,
            dup,
            qos,
            delivery.retain,
            topic_bytes,
            packet_id,
            &properties,
            &delivery.payload,
        );
        self.properties = Some(properties);
        let size = out.len() - start;
        if result.is_err() || size > self.client_max_packet {
            // MQTT 5: a packet over the client's maximum is dropped as if sent.
            out.truncate(start);
            self.topic = topic;
            self.broker.metrics().count_dropped(1);
            return false;
        }
        // The alias holds from the packet that carried it with its topic.
        if let (Some(alias), Some(aliases)) = (new_alias, self.out_aliases.as_mut()) {
            aliases.insert(topic.clone(), alias);
        }
        self.topic = topic;
        self.broker
            .metrics()
            .count_out(1, (delivery.payload.len() + delivery.headers.len()) as u64);
        true
    }

    fn write_publish(&mut self, delivery: &Delivery, packet_id: u16, dup: bool) {
        let mut out = std::mem::take(&mut self.control);
        self.encode_publish(delivery, Some(packet_id), dup, &mut out);
        self.control = out;
    }

    fn put_control(&mut self, packet: &Packet) {
        if let Err(error) = encode(packet, self.level, &mut self.control) {
            tracing::warn!(%error, conn = self.id, "cannot encode an mqtt packet");
        }
    }

    fn ack_properties(&self, why: Option<String>) -> Properties {
        Properties {
            reason_string: why.filter(|_| self.problem_info && self.level == Level::V5),
            ..Properties::default()
        }
    }

    /// Handles every complete packet in `rbuf`, then wakes each touched subscriber.
    fn process(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        let mut msgs = 0u64;
        let mut bytes = 0u64;
        let result = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(packet)) => {
                    if let Packet::Publish(p) = &packet {
                        msgs += 1;
                        bytes += p.payload.len() as u64;
                    }
                    if let Err(close) = self.handle(packet) {
                        break Err(close);
                    }
                    if self.session.paused_until.is_some() {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => {
                    tracing::debug!(conn = self.id, %error, "mqtt protocol error");
                    break Err(Close::protocol(error.code, error.message));
                }
            }
        };
        if msgs > 0 {
            self.broker.metrics().count_in(msgs, bytes);
        }
        self.session.end_batch();
        result
    }

    fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(publish) => self.publish(publish),
            Packet::PubAck(ack) => {
                self.complete(ack.packet_id, Stage::Published, 1);
                Ok(())
            }
            Packet::PubRec(ack) => {
                self.pubrec(&ack);
                Ok(())
            }
            Packet::PubRel(ack) => {
                let code = match self.inbound.get(&ack.packet_id) {
                    Some(InboundState::Received) => {
                        self.inbound.remove(&ack.packet_id);
                        reason::SUCCESS
                    }
                    // The ack from the store is not back yet: PUBREC was not sent, so
                    // a PUBREL is out of order.
                    Some(InboundState::Storing(_)) => {
                        return Err(Close::protocol(
                            reason::PROTOCOL_ERROR,
                            "PUBREL before PUBREC",
                        ));
                    }
                    None => reason::PACKET_IDENTIFIER_NOT_FOUND,
                };
                let code = if self.level == Level::V5 {
                    code
                } else {
                    reason::SUCCESS
                };
                self.put_control(&Packet::PubComp(Ack {
                    packet_id: ack.packet_id,
                    reason: code,
                    properties: Properties::default(),
                }));
                Ok(())
            }
            Packet::PubComp(ack) => {
                self.complete(ack.packet_id, Stage::Released, 2);
                Ok(())
            }
            Packet::Subscribe(subscribe) => self.subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => {
                self.unsubscribe(unsubscribe);
                Ok(())
            }
            Packet::PingReq => {
                self.put_control(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(disconnect) => self.disconnect(&disconnect),
            Packet::Connect(_) => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "a second CONNECT on one connection",
            )),
            Packet::Auth(_) => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "AUTH without an authentication method",
            )),
            other => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                format!("{} is not sent by clients", other.name()),
            )),
        }
    }

    fn persistent(&self) -> bool {
        self.session_expiry > 0
    }

    /// A PUBACK (QoS 1) or PUBCOMP (QoS 2) from the client frees a window slot.
    fn complete(&mut self, packet_id: u16, stage: Stage, qos: u8) {
        if let Some(at) = self
            .inflight
            .iter()
            .position(|i| i.packet_id == packet_id && i.stage == stage && i.delivery.qos == qos)
        {
            self.inflight.remove(at);
            self.session.outbox.wake();
        }
    }

    fn pubrec(&mut self, ack: &Ack) {
        let Some(entry) = self
            .inflight
            .iter_mut()
            .find(|i| i.packet_id == ack.packet_id && i.delivery.qos == 2)
        else {
            if self.level == Level::V5 {
                self.put_control(&Packet::PubRel(Ack {
                    packet_id: ack.packet_id,
                    reason: reason::PACKET_IDENTIFIER_NOT_FOUND,
                    properties: Properties::default(),
                }));
            }
            return;
        };
        if ack.reason >= 0x80 {
            // The client refused it: the flow ends here.
            let id = ack.packet_id;
            self.inflight.retain(|i| i.packet_id != id);
            self.session.outbox.wake();
            return;
        }
        entry.stage = Stage::Released;
        self.put_control(&Packet::PubRel(Ack::new(ack.packet_id)));
    }

    fn disconnect(&mut self, disconnect: &Disconnect) -> Result<(), Close> {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            if self.session_expiry == 0 && expiry > 0 {
                return Err(Close::protocol(
                    reason::PROTOCOL_ERROR,
                    "session expiry cannot be set at DISCONNECT when it was 0 at CONNECT",
                ));
            }
            self.session_expiry = expiry.min(self.context.config.mqtt.max_session_expiry_secs);
        }
        Err(Close::Disconnected {
            with_will: disconnect.reason == reason::DISCONNECT_WITH_WILL,
        })
    }

    fn publish(&mut self, publish: Publish) -> Result<(), Close> {
        let qos = publish.qos as u8;
        let packet_id = publish.packet_id.unwrap_or(0);
        if qos > 0 {
            if let Some(state) = self.inbound.get(&packet_id) {
                // A resend of a publish we still hold: answered once, stored once.
                if *state == InboundState::Received && qos == 2 {
                    self.put_control(&Packet::PubRec(Ack::new(packet_id)));
                }
                return Ok(());
            }
            if self.inbound.len() >= usize::from(self.context.config.mqtt.receive_maximum) {
                return Err(Close::protocol(
                    reason::RECEIVE_MAXIMUM_EXCEEDED,
                    "more unacknowledged QoS 1 and 2 publishes than the Receive Maximum",
                ));
            }
        }
        if !publish.properties.subscription_identifiers.is_empty() {
            return Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "a client PUBLISH must not carry a subscription identifier",
            ));
        }
        let topic = self.resolve_topic(&publish)?;
        let Ok(topic_text) = std::str::from_utf8(&topic) else {
            return Err(Close::protocol(
                reason::MALFORMED_PACKET,
                "topic is not UTF-8",
            ));
        };
        let subject = match Subject::parse_mqtt_with(topic_text, &self.context.subject_limits) {
            Ok(subject) => subject,
            Err(error) => {
                return self.refuse_publish(
                    qos,
                    packet_id,
                    reason::TOPIC_NAME_INVALID,
                    error.to_string(),
                );
            }
        };
        let parts = if self.level == Level::V5 {
            match translate::inbound(
                &publish.properties,
                &publish.payload,
                &self.context.subject_limits,
            ) {
                Ok(parts) => parts,
                Err(translate::Unmappable::PayloadNotUtf8) => {
                    return self.refuse_publish(
                        qos,
                        packet_id,
                        reason::PAYLOAD_FORMAT_INVALID,
                        "the payload format indicator says UTF-8 and the payload is not".into(),
                    );
                }
                Err(translate::Unmappable::ResponseTopic(why)) => {
                    return self.refuse_publish(
                        qos,
                        packet_id,
                        reason::TOPIC_NAME_INVALID,
                        format!("response topic: {why}"),
                    );
                }
            }
        } else {
            translate::NativeParts::default()
        };
        let mut parts = parts;
        if let Some(response) = parts
            .reply
            .as_deref()
            .and_then(|r| std::str::from_utf8(r).ok())
        {
            // Answers are published to the response topic on this client's behalf: it
            // must be a topic the client could publish to itself.
            if let Err(refused) = self.session.publisher.check_target(response) {
                let code = mqtt_code(&refused);
                return self.refuse_publish(
                    qos,
                    packet_id,
                    code,
                    format!("response topic: {refused}"),
                );
            }
        }
        if let (Some(reply), Some(correlation)) =
            (&parts.reply, &publish.properties.correlation_data)
        {
            // A request: the responder answers the inbox, and the answer is passed on
            // to the response topic with the correlation data, so services that do
            // not copy headers still answer MQTT requesters correctly. MQTT
            // receivers get the response topic itself (`translate::outbound`).
            if let Some(inbox) = self.remember_request(reply.clone(), correlation.clone()) {
                parts.reply = Some(inbox);
            }
        }
        let ack = if qos > 0 {
            AskAck::To(AckTo {
                address: envelope::ack_address(self.id, packet_id),
                flags: ACK_MQTT,
            })
        } else {
            AskAck::Nobody
        };
        // MQTT 5 refuses an acknowledged publish over the rate with 0x97; anything
        // else cannot be refused without being lost or acked falsely, so it is taken
        // and the client is held back instead.
        let admission = if self.level == Level::V5 && qos > 0 {
            Admission::Refusable
        } else {
            Admission::Throttled
        };
        let message = session::Publish {
            reply: parts.reply,
            headers: parts.headers,
            flags: mqtt_flags(qos, publish.retain),
            retain: publish.retain,
            ack,
            admission,
            ..session::Publish::new(subject.as_str(), publish.payload)
        };
        let published = self.session.publish(message);
        if let Some(until) = self.session.paused_until {
            // Keep-alive counts from the end of a pause the server chose.
            self.last_read = self.last_read.max(until);
        }
        match published {
            Err(refused) => {
                let code = mqtt_code(&refused);
                self.refuse_publish(qos, packet_id, code, refused.to_string())
            }
            Ok(session::Published::Stored { .. }) => {
                if qos > 0 {
                    self.inbound.insert(packet_id, InboundState::Storing(qos));
                }
                Ok(())
            }
            // Not stored: routed now, acknowledged now.
            Ok(_) => {
                match qos {
                    1 => self.put_control(&Packet::PubAck(Ack::new(packet_id))),
                    2 => {
                        self.inbound.insert(packet_id, InboundState::Received);
                        self.put_control(&Packet::PubRec(Ack::new(packet_id)));
                    }
                    _ => {}
                }
                Ok(())
            }
        }
    }

    /// Records a request's response topic and correlation data under a fresh inbox
    /// subject of this connection, which it then subscribes to (once). `None` when
    /// the connection may not hold an inbox (its subscription limits).
    fn remember_request(&mut self, response: Bytes, correlation: Bytes) -> Option<Bytes> {
        if self.reply_inbox.is_none() {
            // The owner token is random: inboxes are claimed by their first
            // subscriber, so a predictable one could be taken first.
            let mut token = [0u8; 16];
            getrandom::fill(&mut token).ok()?;
            let mut prefix = String::from("_INBOX.mqtt");
            for byte in token {
                prefix.push_str(&format!("{byte:02x}"));
            }
            let text = format!("{prefix}.*");
            let pattern = Pattern::parse_native(&text).ok()?;
            self.session
                .admit_subscription(&text, &pattern, false)
                .ok()?;
            let sub = self.session.subscribe(
                Bytes::from_static(b"$reply"),
                pattern,
                None,
                Some(MqttOptions {
                    qos: 2,
                    ..MqttOptions::default()
                }),
            );
            prefix.push('.');
            self.reply_inbox = Some((prefix, sub));
        }
        let seq = self.next_request;
        self.next_request += 1;
        self.requests.push_back((seq, response, correlation));
        while self.requests.len() > MAX_OPEN_REQUESTS {
            self.requests.pop_front();
        }
        let prefix = self.reply_inbox.as_ref().map_or("", |(p, _)| p.as_str());
        Some(Bytes::from(format!("{prefix}{seq}")))
    }

    /// Passes an answer that arrived on this connection's request inbox on to the
    /// request's response topic, with its correlation data, published as this
    /// client (its rules, its tenant's quota); true when `envelope` was such an
    /// answer.
    fn forward_reply(&mut self, envelope: &Envelope) -> bool {
        let Some((prefix, _)) = &self.reply_inbox else {
            return false;
        };
        let Some(seq) = envelope
            .subject
            .strip_prefix(prefix.as_bytes())
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return false;
        };
        let Some(at) = self.requests.iter().position(|(n, _, _)| *n == seq) else {
            // An answer to a forgotten request (or a second answer): dropped.
            return true;
        };
        let Some((_, response, correlation)) = self.requests.remove(at) else {
            return true;
        };
        let Ok(subject) = std::str::from_utf8(&response) else {
            return true;
        };
        let answer = session::Publish {
            headers: translate::with_correlation(&envelope.headers, &correlation),
            flags: mqtt_flags(envelope.qos, false),
            admission: Admission::Throttled,
            ..session::Publish::new(subject, envelope.payload.clone())
        };
        match self.session.publish(answer) {
            Ok(session::Published::Stored { .. }) => {
                // The append goes out in the next catch-up.
                self.session.outbox.wake();
            }
            Ok(_) => {}
            Err(refused) => {
                tracing::debug!(conn = self.id, %refused, "an answer to an mqtt request was dropped");
            }
        }
        self.session.end_batch();
        true
    }

    /// The topic of a publish, through its v5 topic alias when it has one.
    fn resolve_topic(&mut self, publish: &Publish) -> Result<Bytes, Close> {
        let Some(alias) = publish.properties.topic_alias else {
            if publish.topic.is_empty() {
                return Err(Close::protocol(
                    reason::PROTOCOL_ERROR,
                    "PUBLISH without a topic or a topic alias",
                ));
            }
            return Ok(publish.topic.as_bytes().clone());
        };
        if alias == 0 || alias > self.context.config.mqtt.topic_alias_maximum {
            return Err(Close::protocol(
                reason::TOPIC_ALIAS_INVALID,
                format!(
                    "topic alias {alias} is outside 1..={}",
                    self.context.config.mqtt.topic_alias_maximum
                ),
            ));
        }
        if publish.topic.is_empty() {
            return self.aliases.get(&alias).cloned().ok_or_else(|| {
                Close::protocol(
                    reason::PROTOCOL_ERROR,
                    format!("topic alias {alias} was never defined"),
                )
            });
        }
        let topic = Bytes::copy_from_slice(publish.topic.as_bytes());
        self.aliases.insert(alias, topic.clone());
        Ok(topic)
    }

    /// Answers a publish that cannot be taken: a v5 error reason on its ack. MQTT
    /// 3.x has no way to refuse a QoS 1 or 2 publish, and acking one that was
    /// dropped would lose it, so the connection closes without an ack instead (the
    /// client learns nothing was taken). A refused QoS 0 publish is dropped.
    fn refuse_publish(
        &mut self,
        qos: u8,
        packet_id: u16,
        code: u8,
        why: String,
    ) -> Result<(), Close> {
        tracing::debug!(conn = self.id, code, why, "mqtt publish refused");
        if self.level != Level::V5 {
            if qos > 0 {
                return Err(Close::Server {
                    code,
                    reason: format!("publish refused: {why}"),
                });
            }
            return Ok(());
        }
        let ack = Ack {
            packet_id,
            reason: code,
            properties: self.ack_properties(Some(why.clone())),
        };
        match qos {
            1 => self.put_control(&Packet::PubAck(ack)),
            2 => self.put_control(&Packet::PubRec(ack)),
            // QoS 0 has no ack: MQTT 5 says why on DISCONNECT for a bad topic.
            _ if code == reason::TOPIC_NAME_INVALID => {
                return Err(Close::protocol(code, why));
            }
            _ => {}
        }
        Ok(())
    }

    /// Turns the store's answers into PUBACK and PUBREC.
    fn take_store_acks(&mut self) -> Result<(), Close> {
        self.acks.take(&mut self.store_acks);
        if self.store_acks.is_empty() {
            return Ok(());
        }
        let v5 = self.level == Level::V5;
        for StoreAck { packet_id, outcome } in std::mem::take(&mut self.store_acks) {
            let Some(InboundState::Storing(qos)) = self.inbound.get(&packet_id).copied() else {
                continue;
            };
            let (code, why, current) = match &outcome {
                AppendOutcome::Stored { .. } | AppendOutcome::Duplicate { .. } => {
                    (reason::SUCCESS, None, None)
                }
                AppendOutcome::Conflict {
                    subject,
                    expected,
                    current_version,
                    ..
                } => {
                    let expected = match expected {
                        Expectation::Version(v) | Expectation::LastOffset(v) => *v,
                    };
                    (
                        reason::IMPLEMENTATION_SPECIFIC_ERROR,
                        Some(format!(
                            "wrong expected version {expected}: {subject} is at version {current_version}"
                        )),
                        Some(*current_version),
                    )
                }
                AppendOutcome::QuotaExceeded { reason: why } => {
                    if !v5 {
                        return Err(Close::Server {
                            code: reason::QUOTA_EXCEEDED,
                            reason: format!("quota exceeded: {why}"),
                        });
                    }
                    (reason::QUOTA_EXCEEDED, Some(why.clone()), None)
                }
                AppendOutcome::Failed { reason: why } => {
                    if !v5 {
                        // 3.x cannot be told: no ack, so the client sends it again.
                        return Err(Close::Server {
                            code: reason::UNSPECIFIED_ERROR,
                            reason: format!("the store refused a publish: {why}"),
                        });
                    }
                    (reason::UNSPECIFIED_ERROR, Some(why.clone()), None)
                }
            };
            let mut properties = self.ack_properties(why);
            if let Some(version) = current.filter(|_| v5) {
                properties
                    .user_properties
                    .push(("Canopy-Current-Version".into(), version.to_string()));
            }
            let ack = Ack {
                packet_id,
                reason: if v5 { code } else { reason::SUCCESS },
                properties,
            };
            if qos == 2 {
                if code >= 0x80 {
                    self.inbound.remove(&packet_id);
                } else {
                    self.inbound.insert(packet_id, InboundState::Received);
                }
                self.put_control(&Packet::PubRec(ack));
            } else {
                self.inbound.remove(&packet_id);
                self.put_control(&Packet::PubAck(ack));
            }
        }
        if !self.control.is_empty() {
            self.session.outbox.wake();
        }
        Ok(())
    }

    fn subscribe(&mut self, subscribe: Subscribe) -> Result<(), Close> {
        if subscribe
            .filters
            .iter()
            .any(|f| f.no_local && f.filter.starts_with("$share/"))
        {
            return Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "no-local cannot be set on a shared subscription",
            ));
        }
        let subscription_id = subscribe
            .properties
            .subscription_identifiers
            .first()
            .copied()
            .unwrap_or(0);
        let mut codes = Vec::with_capacity(subscribe.filters.len());
        let mut refused = Vec::new();
        for filter in subscribe.filters {
            let saved = SavedSubscription {
                filter: filter.filter.clone(),
                qos: filter.qos as u8,
                no_local: filter.no_local,
                retain_as_published: filter.retain_as_published,
                subscription_id,
            };
            let code = match self.add_subscription(saved, true) {
                Ok((pattern, options, is_new, shared)) => {
                    let wants_retained = match filter.retain_handling {
                        0 => true,
                        1 => is_new,
                        _ => false,
                    };
                    if wants_retained && !shared {
                        self.retained_jobs.push_back(RetainedJob {
                            pattern,
                            options,
                            after: None,
                        });
                    }
                    filter.qos as u8
                }
                Err(code) => {
                    refused.push(format!("{}: {}", filter.filter, refusal(code)));
                    if self.level == Level::V5 {
                        code
                    } else {
                        reason::UNSPECIFIED_ERROR
                    }
                }
            };
            codes.push(code);
        }
        self.session_dirty |= self.persistent();
        let why = (!refused.is_empty()).then(|| refused.join("; "));
        let properties = self.ack_properties(why);
        self.put_control(&Packet::SubAck(SubAck {
            packet_id: subscribe.packet_id,
            codes,
            properties,
        }));
        Ok(())
    }

    /// Adds (or replaces) one subscription. Returns its pattern, its options,
    /// whether it is new and whether it is shared; or the v5 reason code refusing it.
    fn add_subscription(
        &mut self,
        saved: SavedSubscription,
        check: bool,
    ) -> Result<(Pattern, MqttOptions, bool, bool), u8> {
        let (group, filter) = match saved.filter.strip_prefix("$share/") {
            Some(rest) => match rest.split_once('/') {
                Some((group, filter))
                    if !group.is_empty() && !group.contains(['+', '#']) && !filter.is_empty() =>
                {
                    (Some(group), filter)
                }
                _ => return Err(reason::TOPIC_FILTER_INVALID),
            },
            None => (None, saved.filter.as_str()),
        };
        if group.is_some() && saved.no_local {
            return Err(reason::PROTOCOL_ERROR);
        }
        let pattern = Pattern::parse_mqtt_with(filter, &self.context.subject_limits)
            .map_err(|_| reason::TOPIC_FILTER_INVALID)?;
        let native = pattern.to_string();
        let replacing = self.subs.contains_key(&saved.filter);
        if check
            && let Err(refused) = self
                .session
                .admit_subscription(&native, &pattern, replacing)
        {
            tracing::debug!(conn = self.id, %refused, "mqtt subscription refused");
            return Err(match refused {
                SubscribeRefusal::Denied(_) | SubscribeRefusal::InboxTaken(_) => {
                    reason::NOT_AUTHORIZED
                }
                SubscribeRefusal::OverQuota(_) | SubscribeRefusal::TooMany(_) => {
                    reason::QUOTA_EXCEEDED
                }
            });
        }
        let options = MqttOptions {
            qos: saved.qos.min(2),
            no_local: saved.no_local,
            retain_as_published: saved.retain_as_published,
            subscription_id: saved.subscription_id,
        };
        let previous = self.subs.remove(&saved.filter);
        if let Some(old) = &previous {
            self.session.unsubscribe(&old.sub);
        }
        let sub = self.session.subscribe(
            Bytes::copy_from_slice(saved.filter.as_bytes()),
            pattern.clone(),
            group,
            Some(options),
        );
        let shared = group.is_some();
        if !shared {
            // One copy per message for overlapping filters: routing merges the
            // deliveries of subscriptions marked as overlapping.
            for other in self.subs.values().filter(|o| !o.shared) {
                if crate::tenancy::acl::patterns_overlap(&other.pattern, &pattern) {
                    other.sub.overlapping.store(true, Ordering::Relaxed);
                    sub.overlapping.store(true, Ordering::Relaxed);
                }
            }
        }
        self.subs.insert(
            saved.filter.clone(),
            SubEntry {
                saved,
                sub,
                pattern: pattern.clone(),
                shared,
            },
        );
        Ok((pattern, options, previous.is_none(), shared))
    }

    fn unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let mut codes = Vec::with_capacity(unsubscribe.filters.len());
        for filter in &unsubscribe.filters {
            let code = match self.subs.remove(filter) {
                Some(entry) => {
                    self.session.unsubscribe(&entry.sub);
                    reason::SUCCESS
                }
                None => reason::NO_SUBSCRIPTION_EXISTED,
            };
            codes.push(code);
        }
        self.session_dirty |= self.persistent();
        if self.level != Level::V5 {
            codes.clear();
        }
        self.put_control(&Packet::UnsubAck(UnsubAck {
            packet_id: unsubscribe.packet_id,
            codes,
            properties: Properties::default(),
        }));
    }

    /// The session as it should be saved now.
    fn record(&self, disconnected: bool) -> SessionRecord {
        // The cursor is the oldest stored message the client has not acknowledged.
        let unacked = self
            .inflight
            .iter()
            .map(|i| i.delivery.offset)
            .chain(self.queue.iter().map(|d| d.offset))
            .filter(|o| *o > 0)
            .min();
        let mut cursor = self.high_offset + 1;
        if let Some(oldest) = unacked {
            cursor = cursor.min(oldest);
        }
        if let Some(backlog) = self.backlog.as_ref().filter(|b| !b.done) {
            cursor = cursor.min(backlog.next);
        }
        SessionRecord {
            version: RECORD_VERSION,
            expiry_secs: self.session_expiry,
            disconnected_ms: if disconnected { now_ms() } else { 0 },
            cursor,
            subscriptions: self.subs.values().map(|s| s.saved.clone()).collect(),
            inflight: self
                .inflight
                .iter()
                .map(|i| SavedInflight {
                    packet_id: i.packet_id,
                    stage: i.stage,
                    qos: i.delivery.qos,
                    retain: i.delivery.retain,
                    offset: i.delivery.offset,
                    version: i.delivery.version,
                    time_ms: i.delivery.time_ms,
                    subscription_ids: i.delivery.subscription_ids.clone(),
                    subject: String::from_utf8_lossy(&i.delivery.subject).into_owned(),
                    reply: i.delivery.reply.clone(),
                    headers: i.delivery.headers.clone(),
                    payload: i.delivery.payload.clone(),
                })
                .collect(),
            inbound_qos2: self
                .inbound
                .iter()
                .filter(|(_, s)| **s == InboundState::Received)
                .map(|(id, _)| *id)
                .collect(),
        }
    }

    async fn save_session(&mut self, disconnected: bool) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let state = if self.persistent() {
            Some(self.record(disconnected).encode())
        } else {
            None
        };
        self.saved_record = state.is_some();
        self.saved_at = Instant::now();
        self.saved_high = self.high_offset;
        if let Err(error) = store
            .save_session(&self.key.0, &self.key.1, state.as_deref())
            .await
        {
            tracing::warn!(%error, client = %self.key.1, "cannot save the mqtt session");
        }
    }

    /// Ends the connection: tells the client why where it can, saves the session,
    /// publishes the will when due and lets the client id go.
    async fn finish(mut self, close: Close, writer: &mut (impl AsyncWrite + Unpin)) {
        let subs: Vec<Arc<Subscription>> = self
            .subs
            .values()
            .map(|s| Arc::clone(&s.sub))
            .chain(self.reply_inbox.as_ref().map(|(_, sub)| Arc::clone(sub)))
            .collect();
        self.session.close(&subs);
        let deadline = Duration::from_secs(self.context.config.mqtt.write_deadline_secs.max(1));
        // Publishes already decoded still go to the store; their acks may not
        // reach this client any more, and it will send them again. Retained
        // messages nobody will read are not fetched.
        self.retained_jobs.clear();
        let _ = Box::pin(self.catch_up()).await;
        let told = match &close {
            Close::Server { code, reason } => Some((*code, Some(reason.clone()))),
            Close::TakenOver => Some((reason::SESSION_TAKEN_OVER, None)),
            Close::Shutdown => Some((reason::SERVER_SHUTTING_DOWN, None)),
            Close::Gone | Close::Disconnected { .. } => None,
        };
        if let Some((code, why)) = told {
            if self.level == Level::V5 {
                let packet = Packet::Disconnect(Disconnect {
                    reason: code,
                    properties: self.ack_properties(why.clone()),
                });
                self.put_control(&packet);
            }
            let mut out = std::mem::take(&mut self.control);
            let _ = tokio::time::timeout(deadline, writer.write_all(&out)).await;
            out.clear();
        }
        let _ = writer.shutdown().await;
        match &close {
            Close::Server { code, reason } => {
                tracing::debug!(conn = self.id, peer = %self.peer, code, reason, "mqtt connection closed by the server");
            }
            other => {
                tracing::debug!(conn = self.id, peer = %self.peer, ?other, "mqtt disconnected")
            }
        }
        self.broker.mqtt_acks().remove(self.id);
        self.session.outbox.close();
        if self.persistent() || self.saved_record {
            self.save_session(true).await;
        }
        let will = match close {
            Close::Disconnected { with_will: false } => None,
            // A restart is not the client's failure; its session resumes after it.
            Close::Shutdown => None,
            _ => self.will.take(),
        };
        let delay = will.as_ref().map_or(0, |w| {
            w.properties
                .will_delay_interval
                .unwrap_or(0)
                .min(self.session_expiry)
        });
        let will_pending = will.is_some() && delay > 0;
        self.context
            .sessions
            .release(&self.key, self.id, will_pending);
        self.claim.handoff.release();
        if let Some(will) = will {
            let context = Arc::clone(&self.context);
            let key = self.key.clone();
            let generation = self.claim.generation;
            let level = self.level;
            let publisher = (*self.session.publisher).clone();
            let limits = context.subject_limits;
            if delay == 0 {
                publish_will(&publisher, &will, level, &limits).await;
            } else {
                let tracker = context.tracker.clone();
                tracker.spawn(async move {
                    tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
                    if context.sessions.will_due(&key, generation) {
                        publish_will(&publisher, &will, level, &limits).await;
                    }
                });
            }
        }
    }
}

/// Which of a session's filters match a subject, for reading its backlog.
struct SessionMatcher {
    trie: Trie<SavedSubscription>,
}

impl SessionMatcher {
    fn matches(&self, subject: &str) -> bool {
        let mut any = false;
        self.trie
            .for_each_match(subject, &mut |plain, _| any |= !plain.is_empty());
        any
    }

    /// One delivery for all matching subscriptions: the highest QoS any grants
    /// (capped by the publish's) and every subscription identifier.
    fn delivery(&self, subject: &str, flags: u8) -> (u8, Vec<u32>) {
        let (mut qos, mut ids) = (0u8, Vec::new());
        self.trie.for_each_match(subject, &mut |plain, _| {
            for saved in plain {
                qos = qos.max(saved.qos);
                if saved.subscription_id != 0 && !ids.contains(&saved.subscription_id) {
                    ids.push(saved.subscription_id);
                }
            }
        });
        (qos.min(qos_cap(flags)), ids)
    }

    fn keeps_retain(&self, subject: &str) -> bool {
        let mut keep = false;
        self.trie.for_each_match(subject, &mut |plain, _| {
            keep |= plain.iter().any(|s| s.retain_as_published);
        });
        keep
    }
}

/// What a SUBACK failure code means, for its reason string.
fn refusal(code: u8) -> &'static str {
    match code {
        reason::NOT_AUTHORIZED => "not authorized",
        reason::TOPIC_FILTER_INVALID => "not a valid topic filter",
        reason::QUOTA_EXCEEDED => "too many subscriptions on this connection",
        _ => "refused",
    }
}

fn ids(subscription_id: u32) -> Vec<u32> {
    if subscription_id == 0 {
        Vec::new()
    } else {
        vec![subscription_id]
    }
}

/// Publishes a will as its client would have: under its principal, in its tenant,
/// through the same decision as its own publishes.
async fn publish_will(
    publisher: &Publisher,
    will: &Will,
    level: Level,
    limits: &canopy_subjects::Limits,
) {
    let Ok(subject) = Subject::parse_mqtt_with(&will.topic, limits) else {
        return;
    };
    let parts = if level == Level::V5 {
        translate::inbound(&will.properties, &will.payload, limits).unwrap_or_default()
    } else {
        translate::NativeParts::default()
    };
    let message = session::Publish {
        reply: parts.reply,
        headers: parts.headers,
        flags: mqtt_flags(will.qos as u8, will.retain),
        retain: will.retain,
        admission: Admission::Throttled,
        ..session::Publish::new(subject.as_str(), will.payload.clone())
    };
    if let Err(refused) = publisher.publish_detached(message).await {
        tracing::debug!(topic = %will.topic, %refused, "a will was not published");
    }
}

/// The MQTT 5 reason code for a refused publish.
fn mqtt_code(refused: &Refusal) -> u8 {
    match refused {
        Refusal::InvalidSubject(_) => reason::TOPIC_NAME_INVALID,
        Refusal::Reserved(_) | Refusal::Denied(_) => reason::NOT_AUTHORIZED,
        Refusal::OverQuota(_) => reason::QUOTA_EXCEEDED,
        Refusal::TooLarge { .. } | Refusal::BadHeader(_) => reason::IMPLEMENTATION_SPECIFIC_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_matcher_merges_overlapping_filters() {
        let mut trie = Trie::new();
        for (filter, qos, id) in [("a/#", 0, 1), ("a/+/c", 2, 2), ("b/#", 1, 0)] {
            trie.insert(
                &Pattern::parse_mqtt(filter).expect("filter"),
                None,
                SavedSubscription {
                    filter: filter.into(),
                    qos,
                    no_local: false,
                    retain_as_published: false,
                    subscription_id: id,
                },
            );
        }
        let matcher = SessionMatcher { trie };
        assert!(matcher.matches("a.b.c"));
        assert!(!matcher.matches("c"));
        let (qos, mut ids) = matcher.delivery("a.b.c", 0);
        ids.sort_unstable();
        assert_eq!((qos, ids), (2, vec![1, 2]));
        assert_eq!(matcher.delivery("a.b.c", mqtt_flags(1, false)).0, 1);
        assert_eq!(matcher.delivery("b.x", 0), (1, vec![]));
    }
}

#[cfg(test)]
mod task_size {
    use super::*;

    /// Every connected device costs at least its task, whose size is the largest
    /// state of `serve`: rare steps with store reads must stay boxed so that an idle
    /// connection does not pay for them (the MQTT idle benchmark measures the rest).
    #[tokio::test]
    async fn an_idle_connection_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let broker = Arc::new(Broker::new(
            Arc::new(crate::tenancy::Authorizer::default()),
            Arc::new(crate::broker::Metrics::default()),
            crate::broker::durable::Policies::new(&[]).expect("policies"),
        ));
        let config = Arc::new(crate::config::Config::default());
        let context = Arc::new(MqttContext::new(config, broker, None));
        let task = serve(client, addr, context, CancellationToken::new());
        let size = std::mem::size_of_val(&task);
        assert!(size <= 2_500, "the connection task grew to {size} bytes");
        assert!(std::mem::size_of::<Connection>() <= 1_000);
    }
}
