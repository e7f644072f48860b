//! The JSON WebSocket API (`/ws` on the HTTP port): subscribe, publish with
//! optimistic locking and get, for browsers (docs/websocket.md has the messages).
//!
//! A connection is a task like the other front ends': its subscriptions sit in the
//! same trie and routing queues envelopes in its bounded outbox; a client that falls
//! more than `max_pending_bytes` behind is closed with a reason (WebSocket close code
//! 1008); a write to the socket that takes longer than `websocket.write_deadline_secs`
//! closes it, and a WebSocket message over the frame limit closes it with 1009.
//! Requests are decoded and every answer encoded by `canopy_protocols::ws` (payloads
//! byte-exact: inline JSON when the message says it is JSON and its bytes parse,
//! kept as the very same bytes; base64 otherwise). This module must never block on
//! another connection, nor write JSON by hand.

mod groups;
mod live;
mod reads;
pub mod relay;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::{Bytes, BytesMut};
use canopy_protocols::ws::{self, ClientOp, ErrorCode, Start, Target, WsDecodeError, WsLimits};
use canopy_subjects::{Limits, Pattern, Subject};
use futures::{SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::broker::envelope::{self, AckInbox, MqttOptions, StoreAck};
use crate::broker::{Broker, Outbox, Subscription};
use crate::metrics::Protocol;
use crate::session::{self, AskAck, Publish, Session, SessionLimits, SubscribeRefusal};
use crate::store::{AppendOutcome, ReplayFrom, Snapshot};
use crate::tenancy::Principal;

/// Where a connection's messages go: its WebSocket, or a relay's connection to
/// the node that relayed it here.
type Sink = std::pin::Pin<Box<dyn futures::Sink<Message, Error = axum::Error> + Send>>;
/// Where its messages come from.
type Stream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<Message, axum::Error>> + Send>>;

/// Sends every queued text in order, flushing once, within `deadline`; false once
/// the socket failed or the deadline passed (the client stopped reading: nothing
/// more may be written, the stream may end mid-frame).
async fn send_all(sink: &mut Sink, out: &mut Vec<String>, deadline: Duration) -> bool {
    if out.is_empty() {
        return true;
    }
    let send = async {
        for text in out.drain(..) {
            if sink
                .feed(Message::Text(Utf8Bytes::from(text)))
                .await
                .is_err()
            {
                return false;
            }
        }
        sink.flush().await.is_ok()
    };
    tokio::time::timeout(deadline, send).await.unwrap_or(false)
}

/// Sends a close frame (when `frame`) and closes, within `deadline`.
async fn close_socket(sink: &mut Sink, frame: Option<CloseFrame>, deadline: Duration) {
    let close = async {
        if let Some(frame) = frame {
            let _ = sink.send(Message::Close(Some(frame))).await;
        }
        let _ = sink.close().await;
    };
    let _ = tokio::time::timeout(deadline, close).await;
}

/// Whether a read failed because the client's message was over the frame limit.
fn is_too_big(error: &axum::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<tungstenite::Error>())
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

/// Messages per page of a subscription's history.
const CATCH_UP_PAGE: usize = crate::store::PAGE_MESSAGES;
// The `/ws` codec tells clients this page size; every read path pages the same way.
const _: () = assert!(canopy_protocols::ws::MAX_PAGE == CATCH_UP_PAGE);

/// Whose history a catching-up subscription reads.
/// A subscription sending its history before its live messages.
struct CatchUp {
    sid: u32,
    /// Its history, read behind the live subscription.
    follower: crate::follow::Follower,
    /// The highest offset sent from history: live messages at or below it are repeats.
    high: u64,
}

fn envelope_size(envelope: &envelope::Envelope) -> usize {
    envelope.subject.len() + envelope.headers.len() + envelope.payload.len() + 64
}

/// Bytes one replay page may hold, about.
const REPLAY_BYTES: usize = crate::store::PAGE_BYTES;

/// What every `/ws` connection shares.
pub struct WsContext {
    pub broker: Arc<Broker>,
    pub limits: Limits,
    /// The limits every front end shares, `/ws`'s own `max_payload` and
    /// `max_subscriptions` among them.
    pub session_limits: Arc<SessionLimits>,
    pub max_pending_bytes: usize,
    /// Bytes of one WebSocket message: the frame limit set on the upgrade.
    pub max_message_bytes: usize,
    /// What the codec accepts: the frame limit and `max_payload`.
    pub ws_limits: WsLimits,
    pub write_deadline: Duration,
    /// Delivery texts shared by every connection, each rendered once.
    pub rendered: super::rendered::RenderedDeliveries,
    /// In a cluster, its name: what a relay to another node says it is of.
    pub cluster: Option<String>,
}

impl WsContext {
    pub fn new(config: &crate::config::Config, broker: Arc<Broker>) -> Self {
        let limits = Limits {
            max_len: config.limits.max_subject_len,
            max_tokens: config.limits.max_subject_tokens,
        };
        let ws = &config.websocket;
        let max_payload = ws.payload_limit(config.native.max_payload);
        let max_message_bytes = ws.max_message_bytes(config.native.max_payload);
        WsContext {
            broker,
            limits,
            session_limits: Arc::new(SessionLimits {
                subjects: limits,
                max_payload,
                max_subscriptions: ws.max_subscriptions,
            }),
            max_pending_bytes: ws.max_pending_bytes,
            max_message_bytes,
            ws_limits: WsLimits {
                max_text: max_message_bytes,
                max_payload,
            },
            write_deadline: ws.write_deadline(),
            rendered: super::rendered::RenderedDeliveries::default(),
            cluster: config.cluster.as_ref().map(|c| c.name.clone()),
        }
    }
}

/// An error answered to a request: a code for programs and a sentence for people.
struct Refusal {
    code: ErrorCode,
    message: String,
}

fn refusal(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// A publish the client core refused, in `/ws` terms.
fn publish_refusal(refused: &session::Refusal) -> Refusal {
    let code = match refused {
        session::Refusal::InvalidSubject(_) => ErrorCode::InvalidSubject,
        session::Refusal::Reserved(_) | session::Refusal::Denied(_) => ErrorCode::Forbidden,
        session::Refusal::TooLarge { .. } | session::Refusal::TooLargeForStream(_) => {
            ErrorCode::TooLarge
        }
        session::Refusal::OverQuota(_) => ErrorCode::QuotaExceeded,
        session::Refusal::BadHeader(_) | session::Refusal::WrongStream(_) => ErrorCode::BadRequest,
        session::Refusal::Invalid(_) | session::Refusal::Plugin(_) => ErrorCode::InvalidMessage,
    };
    refusal(code, refused.to_string())
}

/// The `/ws` code of a subscription the client core refused.
fn subscribe_code(refused: &SubscribeRefusal) -> ErrorCode {
    match refused {
        SubscribeRefusal::Denied(_) | SubscribeRefusal::InboxTaken(_) => ErrorCode::Forbidden,
        SubscribeRefusal::OverQuota(_) | SubscribeRefusal::TooMany(_) => ErrorCode::QuotaExceeded,
    }
}

/// Serves one `/ws` connection until it ends.
pub async fn serve(
    socket: WebSocket,
    context: Arc<WsContext>,
    principal: Principal,
    shutdown: CancellationToken,
) {
    let (sink, stream) = socket.split();
    serve_on(
        Box::pin(sink),
        Box::pin(stream),
        context,
        principal,
        shutdown,
    )
    .await;
}

/// Serves one connection's messages, from its WebSocket or relayed, until it ends
/// or (in a cluster) this node no longer serves its tenant.
async fn serve_on(
    sink: Sink,
    stream: Stream,
    context: Arc<WsContext>,
    principal: Principal,
    shutdown: CancellationToken,
) {
    let shutdown = relay::while_served(&context, &principal.tenant, &shutdown);
    let _ended = shutdown.clone().drop_guard();
    serve_messages(sink, stream, context, principal, shutdown).await;
}

async fn serve_messages(
    mut sink: Sink,
    mut stream: Stream,
    context: Arc<WsContext>,
    principal: Principal,
    shutdown: CancellationToken,
) {
    let mut connection = Connection::open(context, principal);
    let deadline = connection.context.write_deadline;
    if !connection.admitted(&mut sink).await {
        return;
    }
    connection
        .broker
        .metrics()
        .connection_opened(Protocol::WebSocket);
    let close = connection.turns(&mut sink, &mut stream, &shutdown).await;
    let mut subs: Vec<Arc<Subscription>> = connection.subs.drain().map(|(_, s)| s).collect();
    subs.extend(connection.groups.subscription());
    connection.session.close(&subs);
    connection.broker.mqtt_acks().remove(connection.id());
    connection.session.outbox.close();
    connection
        .broker
        .metrics()
        .connection_closed(Protocol::WebSocket);
    if let Some(frame) = close {
        let frame = frame.map(|(code, reason)| CloseFrame { code, reason });
        close_socket(&mut sink, frame, deadline).await;
    }
}

/// What a connection ends with: a close frame to send, `Some(None)` for a clean close
/// without a code, `None` when nothing more may be written.
type Ending = Option<Option<(u16, Utf8Bytes)>>;

impl Connection {
    /// A connection of `principal`'s, with its session and ack inbox registered.
    fn open(context: Arc<WsContext>, principal: Principal) -> Connection {
        let broker = Arc::clone(&context.broker);
        let id = broker.next_id();
        let outbox = Arc::new(
            Outbox::new(id, context.max_pending_bytes, Arc::clone(broker.metrics()))
                .with_behind_limit(context.write_deadline),
        );
        let acks = Arc::new(AckInbox::new(Arc::clone(&outbox)));
        broker.mqtt_acks().register(id, Arc::clone(&acks));
        let tenant = broker.tenant_for(&principal);
        let session = Session::new(
            Arc::clone(&broker),
            tenant,
            principal,
            outbox,
            Arc::clone(&context.session_limits),
        );
        Connection {
            broker,
            session,
            context,
            acks,
            subs: HashMap::new(),
            next_sid: 1,
            pending_acks: HashMap::new(),
            next_ack: 1,
            out: Vec::new(),
            catchups: std::collections::VecDeque::new(),
            held: HashMap::new(),
            held_bytes: 0,
            spare: BytesMut::new(),
            groups: groups::GroupCalls::default(),
        }
    }

    /// The connection's id: its outbox's.
    fn id(&self) -> u64 {
        self.session.outbox.conn_id
    }

    /// Takes the tenant's connection slot; a tenant at its limit is told why and the
    /// socket closed (false).
    async fn admitted(&mut self, sink: &mut Sink) -> bool {
        let Err(exceeded) = self.session.take_slot() else {
            return true;
        };
        // Said as a message first: a close reason is cut at 123 bytes.
        self.reply_error(
            None,
            refusal(ErrorCode::QuotaExceeded, exceeded.to_string()),
        );
        let deadline = self.context.write_deadline;
        if send_all(sink, &mut self.out, deadline).await {
            let frame = CloseFrame {
                code: 1013,
                reason: Utf8Bytes::from_static("quota exceeded: too many connections"),
            };
            close_socket(sink, Some(frame), deadline).await;
        }
        self.broker.mqtt_acks().remove(self.id());
        self.session.outbox.close();
        false
    }

    /// Serves the connection until it ends, turn by turn: one input, then what it
    /// left to send, then history pages while there is room for them.
    async fn turns(
        &mut self,
        sink: &mut Sink,
        stream: &mut Stream,
        shutdown: &CancellationToken,
    ) -> Ending {
        let deadline = self.context.write_deadline;
        loop {
            // Subscribers this connection fed are falling behind: it reads no more
            // for a moment.
            let stalled = self.session.stalled();
            let step = tokio::select! {
                _ = shutdown.cancelled() => Some((1001, Utf8Bytes::from_static("server shutting down"))),
                _ = self.session.routes().deleted.cancelled() => Some((1008, Utf8Bytes::from_static("the tenant was deleted"))),
                _ = self.session.outbox.woken() => {
                    if self.session.outbox.is_slow() {
                        Some((1008, Utf8Bytes::from_static(SLOW)))
                    } else {
                        self.deliveries();
                        None
                    }
                }
                _ = tokio::time::sleep_until(
                    self.session.paused_until.unwrap_or_else(tokio::time::Instant::now)
                ), if self.session.paused_until.is_some() => {
                    self.session.paused_until = None;
                    None
                }
                () = self.session.relieved(), if stalled => None,
                message = stream.next(), if self.session.paused_until.is_none() && !stalled => match message {
                    Some(message) => match self.received(message).await {
                        Ok(step) => step,
                        Err(()) => return Some(None),
                    },
                    None => return Some(None),
                },
            };
            self.store_acks();
            if !send_all(sink, &mut self.out, deadline).await {
                return None;
            }
            if step.is_some() {
                return Some(step);
            }
            if let Some(ending) = self.send_history(sink).await {
                return ending;
            }
        }
    }

    /// Takes one WebSocket message: what closes the connection, if anything;
    /// `Err` when the client closed it.
    async fn received(
        &mut self,
        message: Result<Message, axum::Error>,
    ) -> Result<Option<(u16, Utf8Bytes)>, ()> {
        match message {
            Ok(Message::Text(text)) => {
                self.request(text.as_str()).await;
                Ok(None)
            }
            Ok(Message::Binary(_)) => {
                self.decode_error(WsDecodeError::not_text());
                Ok(None)
            }
            Ok(Message::Ping(_) | Message::Pong(_)) => Ok(None),
            Err(error) if is_too_big(&error) => {
                // The rest of the message is not read, so the stream cannot go on.
                let max = self.context.max_message_bytes;
                self.reply_error(
                    None,
                    refusal(
                        ErrorCode::TooLarge,
                        format!("a WebSocket message may hold at most {max} bytes"),
                    ),
                );
                Ok(Some((
                    1009,
                    Utf8Bytes::from(format!("message too big: at most {max} bytes")),
                )))
            }
            Ok(Message::Close(_)) | Err(_) => Err(()),
        }
    }

    /// Sends history pages one at a time, each before the next is read, while live
    /// messages held meanwhile fit; how the connection ends if it must.
    async fn send_history(&mut self, sink: &mut Sink) -> Option<Ending> {
        let deadline = self.context.write_deadline;
        while !self.holds_too_much() && self.catch_up().await {
            if !send_all(sink, &mut self.out, deadline).await {
                return Some(None);
            }
            self.deliveries();
        }
        if self.holds_too_much() {
            return Some(Some(Some((1008, Utf8Bytes::from_static(SLOW)))));
        }
        if !send_all(sink, &mut self.out, deadline).await {
            return Some(None);
        }
        None
    }
}

const SLOW: &str = "slow consumer: messages were not read fast enough";

struct Connection {
    context: Arc<WsContext>,
    broker: Arc<Broker>,
    /// Principal, tenant, outbox, quotas and publishes: what every front end shares.
    session: Session,
    acks: Arc<AckInbox>,
    subs: HashMap<u32, Arc<Subscription>>,
    next_sid: u32,
    /// Publishes waiting for the store, by ack number: the request id.
    pending_acks: HashMap<u16, Option<String>>,
    next_ack: u16,
    /// JSON texts to send, in order.
    out: Vec<String>,
    /// Subscriptions still sending their history, oldest first.
    catchups: std::collections::VecDeque<CatchUp>,
    /// Live deliveries of those subscriptions, held until their history is sent.
    held: HashMap<u32, Vec<envelope::Envelope>>,
    held_bytes: usize,
    /// The buffer the outbox's bytes are swapped into, kept between batches.
    spare: BytesMut,
    /// `group.next` and `group.ack` calls waiting for their group.
    groups: groups::GroupCalls,
}

impl Connection {
    /// Queues one text that `encode` writes.
    pub(super) fn push(&mut self, encode: impl FnOnce(&mut String)) {
        let mut text = String::new();
        encode(&mut text);
        self.out.push(text);
    }

    /// Adds an admitted subscription whose deliveries come as envelopes under `sid`.
    pub(super) fn subscribe_as(&mut self, sid: u32, pattern: Pattern) -> Arc<Subscription> {
        let options = MqttOptions {
            qos: 0,
            subscription_id: sid,
            ..MqttOptions::default()
        };
        self.session
            .subscribe(Bytes::new(), pattern, None, Some(options))
    }

    pub(super) fn reply_error(&mut self, id: Option<&str>, refusal: Refusal) {
        self.push(|out| ws::encode_error(out, id, refusal.code, &refusal.message));
    }

    pub(super) fn decode_error(&mut self, error: WsDecodeError) {
        let code = error.code();
        self.push(|out| ws::encode_error(out, error.id.as_deref(), code, &error.message));
    }

    pub(super) async fn request(&mut self, text: &str) {
        let op = match ws::decode_client(text, &self.context.ws_limits) {
            Ok(op) => op,
            Err(error) => {
                self.decode_error(error);
                return;
            }
        };
        let id = op.id().map(str::to_owned);
        let result = match op {
            ClientOp::Subscribe(sub) => {
                let from = match sub.from {
                    Some(start) => Some(replay_from(start)),
                    None if sub.from_snapshot => Some(ReplayFrom::Start),
                    None => None,
                };
                self.subscribe(id.as_deref(), &sub.pattern, from, sub.from_snapshot)
                    .await;
                Ok(())
            }
            ClientOp::Unsubscribe(unsub) => match self.subs.remove(&unsub.sid) {
                Some(sub) => {
                    self.session.unsubscribe(&sub);
                    self.push(|out| ws::encode_ok(out, id.as_deref()));
                    Ok(())
                }
                None => Err(refusal(
                    ErrorCode::NotFound,
                    format!("no subscription {}", unsub.sid),
                )),
            },
            ClientOp::Publish(publish) => self.publish(id.clone(), publish).await,
            ClientOp::Get(get) => self.get(id.as_deref(), &get.subject, get.version).await,
            ClientOp::Replay(replay) => self.replay(id.as_deref(), &replay).await,
            ClientOp::Subjects(subjects) => self.subjects(id.as_deref(), &subjects).await,
            ClientOp::SnapshotGet(get) => {
                self.snapshot(id.as_deref(), &get.subject, get.version)
                    .await
            }
            ClientOp::SnapshotPut(put) => self.put_snapshot(id.as_deref(), put).await,
            ClientOp::GroupNext(next) => self.group_next(id.clone(), &next),
            ClientOp::GroupAck(ack) => self.group_ack(id.clone(), &ack),
        };
        if let Err(refusal) = result {
            self.reply_error(id.as_deref(), refusal);
        }
    }

    /// Publishes what the codec decoded: its header block and payload as they are.
    pub(super) async fn publish(
        &mut self,
        id: Option<String>,
        publish: ws::Publish<'_>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(&publish.subject)?;
        let subject = subject.as_str();
        let headers = publish.header_block().clone();
        let payload = publish.data.into_bytes();
        self.broker.metrics().count_in(1, payload.len() as u64);
        if self.pending_acks.len() >= usize::from(u16::MAX) - 1 {
            return Err(refusal(
                ErrorCode::Busy,
                "too many publishes waiting for the store",
            ));
        }
        let ack = self.next_ack;
        let publish = Publish {
            headers,
            ack: AskAck::Inbox(ack),
            subject_checked: true,
            ..Publish::new(subject, payload)
        };
        let published = self
            .session
            .publish(publish)
            .map_err(|refused| publish_refusal(&refused.refusal))?;
        self.session.end_batch();
        match published {
            session::Published::Stored { .. } => {
                self.next_ack = self.next_ack.wrapping_add(1).max(1);
                self.pending_acks.insert(ack, id);
                if self.session.send_appends().await {
                    Ok(())
                } else {
                    self.pending_acks.remove(&ack);
                    Err(refusal(ErrorCode::Unavailable, "the store is closing"))
                }
            }
            _ => {
                self.push(|out| ws::encode_published(out, id.as_deref()));
                Ok(())
            }
        }
    }

    /// A subject in native syntax, within the limits.
    pub(super) fn subject(&self, text: &str) -> Result<Subject, Refusal> {
        Subject::parse_native_with(text, &self.context.limits)
            .map_err(|e| refusal(ErrorCode::InvalidSubject, e.to_string()))
    }

    /// A pattern in either syntax: MQTT's when it has a `/`, `+` or `#`.
    pub(super) fn pattern(&self, text: &str) -> Result<Pattern, Refusal> {
        let parsed = if text.contains(['/', '+', '#']) {
            Pattern::parse_mqtt_with(text, &self.context.limits)
        } else {
            Pattern::parse_native_with(text, &self.context.limits)
        };
        parsed.map_err(|e| refusal(ErrorCode::InvalidPattern, e.to_string()))
    }

    /// Answers publishes the store has decided.
    pub(super) fn store_acks(&mut self) {
        let mut acks = Vec::new();
        self.acks.take(&mut acks);
        for StoreAck {
            packet_id,
            outcome,
            awaited,
        } in acks
        {
            let Some(id) = self.pending_acks.remove(&packet_id) else {
                continue;
            };
            let id = id.as_deref();
            let mut out = String::new();
            match outcome {
                AppendOutcome::Stored {
                    subject,
                    version,
                    offset,
                    ..
                } => ws::encode_stored(&mut out, id, &subject, version, offset, false),
                AppendOutcome::Duplicate {
                    subject,
                    version,
                    offset,
                } => ws::encode_stored(&mut out, id, &subject, version, offset, true),
                AppendOutcome::Conflict {
                    subject,
                    current_version,
                    ..
                } => ws::encode_conflict(&mut out, id, &subject, current_version),
                AppendOutcome::Failed { reason } => {
                    ws::encode_error(&mut out, id, ErrorCode::Unavailable, &reason)
                }
                AppendOutcome::QuotaExceeded { reason } => {
                    ws::encode_error(&mut out, id, ErrorCode::QuotaExceeded, &reason)
                }
            }
            // A publish that waited for groups: its answer says what they did.
            if let Some(awaited) = awaited
                && out.ends_with('}')
            {
                out.pop();
                out.push_str(",\"await\":");
                out.push_str(&awaited.to_json().to_string());
                out.push('}');
            }
            self.out.push(out);
        }
    }
}

/// Where stored history starts, in the store's terms.
fn replay_from(start: Start) -> ReplayFrom {
    match start {
        Start::Offset(offset) => ReplayFrom::Offset(offset),
        Start::Version(version) => ReplayFrom::Version(version),
        Start::TimeMs(time) => ReplayFrom::Time(time),
    }
}

fn stored_message(message: &crate::store::StoredMessage) -> ws::StoredMessage<'_> {
    ws::StoredMessage {
        subject: &message.subject,
        version: message.version,
        offset: message.offset,
        time_ms: message.time_ms,
        headers: &message.headers,
        payload: &message.payload,
    }
}

fn snapshot_body(snapshot: &Snapshot) -> ws::SnapshotBody<'_> {
    ws::SnapshotBody {
        subject: &snapshot.subject,
        version: snapshot.version,
        time_ms: snapshot.time_ms,
        json: snapshot.json,
        payload: &snapshot.payload,
    }
}
