//! The JSON WebSocket API (`/ws` on the HTTP port): subscribe, publish with
//! optimistic locking and get, for browsers (docs/websocket.md has the messages).
//!
//! A connection is a task like the other front ends': its subscriptions sit in the
//! same trie and routing queues envelopes in its bounded outbox; a client that falls
//! more than `max_pending_bytes` behind is closed with a reason (WebSocket close code
//! 1008). Payloads are byte-exact: inline JSON when the message says it is JSON
//! (`Content-Type: application/json`) and its bytes parse, kept as the very same
//! bytes; base64 otherwise. This module must never block on another connection.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use canopy_protocols::native::HeaderMap;
use canopy_subjects::{Limits, Pattern, Subject};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::broker::durable::ACK_MQTT;
use crate::broker::envelope::{self, AckInbox, MqttOptions, StoreAck};
use crate::broker::metrics::Protocol;
use crate::broker::{Broker, Outbox, Subscription};
use crate::session::{self, AskAck, Publish, Session, SessionLimits, SubscribeRefusal};
use crate::store::{AckTo, AppendOutcome, ReplayFrom, Snapshot};
use crate::tenancy::{Action, Principal};

/// Sends every queued text in order, flushing once; false once the socket failed.
async fn send_all(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    out: &mut Vec<String>,
) -> bool {
    if out.is_empty() {
        return true;
    }
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
}

/// Messages per page of a subscription's history.
const CATCH_UP_PAGE: usize = 512;

/// Whose history a catching-up subscription reads.
enum History {
    Subject(String),
    Pattern(Pattern),
}

/// A subscription sending its history before its live messages.
struct CatchUp {
    sid: u32,
    target: History,
    from: ReplayFrom,
    /// The highest offset sent from history: live messages at or below it are repeats.
    high: u64,
}

fn envelope_size(envelope: &envelope::Envelope) -> usize {
    envelope.subject.len() + envelope.headers.len() + envelope.payload.len() + 64
}

/// Bytes one replay page may hold, about.
const REPLAY_BYTES: usize = 4 * 1024 * 1024;

/// What every `/ws` connection shares.
pub struct WsContext {
    pub broker: Arc<Broker>,
    pub limits: Limits,
    /// The limits every front end shares (`max_payload` among them).
    pub session_limits: Arc<SessionLimits>,
    pub max_pending_bytes: usize,
    pub max_message_bytes: usize,
    /// Delivery texts shared by every connection, each rendered once.
    pub rendered: super::rendered::RenderedDeliveries,
}

/// One request from the client. A flat struct rather than a tagged enum: serde
/// buffers tagged enums, and a buffered `RawValue` cannot be borrowed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request<'a> {
    op: String,
    id: Option<String>,
    pattern: Option<String>,
    sid: Option<u32>,
    subject: Option<String>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
    data_b64: Option<String>,
    #[serde(default)]
    headers: HashMap<String, String>,
    expect_version: Option<u64>,
    msg_id: Option<String>,
    version: Option<u64>,
    /// `replay`: where to start (an offset for a pattern, a version for a subject), or
    /// a time.
    from_offset: Option<u64>,
    from_version: Option<u64>,
    from_time_ms: Option<u64>,
    /// `replay`, `subjects`: how many at most.
    max: Option<usize>,
    /// `subjects`: continue after this subject.
    after: Option<String>,
    /// `sub` of one subject: its latest snapshot first, then the versions after it.
    #[serde(default)]
    from_snapshot: bool,
}

/// An error answered to a request: a code for programs and a sentence for people.
struct Refusal {
    code: &'static str,
    message: String,
}

fn refusal(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// Serves one `/ws` connection until it ends.
pub async fn serve(
    socket: WebSocket,
    context: Arc<WsContext>,
    principal: Principal,
    shutdown: CancellationToken,
) {
    let broker = Arc::clone(&context.broker);
    let id = broker.next_id();
    let outbox = Arc::new(Outbox::new(
        id,
        context.max_pending_bytes,
        Arc::clone(broker.metrics()),
    ));
    let acks = Arc::new(AckInbox::new(Arc::clone(&outbox)));
    broker.mqtt_acks().register(id, Arc::clone(&acks));
    let routes = broker.tenant(&principal.tenant);
    let session = Session::new(
        Arc::clone(&broker),
        routes,
        principal,
        Arc::clone(&outbox),
        Arc::clone(&context.session_limits),
    );
    let mut connection = Connection {
        id,
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
    };
    let (mut sink, mut stream) = socket.split();
    if let Err(exceeded) = connection.session.take_slot() {
        // Said as a message first: a close reason is cut at 123 bytes.
        connection.reply_error(None, refusal("quota_exceeded", exceeded.to_string()));
        let _ = send_all(&mut sink, &mut connection.out).await;
        let frame = CloseFrame {
            code: 1013,
            reason: Utf8Bytes::from_static("quota exceeded: too many connections"),
        };
        let _ = sink.send(Message::Close(Some(frame))).await;
        let _ = sink.close().await;
        connection.broker.mqtt_acks().remove(id);
        connection.session.outbox.close();
        return;
    }
    connection
        .broker
        .metrics()
        .connection_opened(Protocol::WebSocket);
    let close = loop {
        let step = tokio::select! {
            _ = shutdown.cancelled() => Some((1001, "server shutting down")),
            _ = connection.session.routes().deleted.cancelled() => Some((1008, "the tenant was deleted")),
            _ = connection.session.outbox.woken() => {
                if connection.session.outbox.is_slow() {
                    Some((1008, "slow consumer: messages were not read fast enough"))
                } else {
                    connection.deliveries();
                    None
                }
            }
            _ = tokio::time::sleep_until(
                connection.session.paused_until.unwrap_or_else(tokio::time::Instant::now)
            ), if connection.session.paused_until.is_some() => {
                connection.session.paused_until = None;
                None
            }
            message = stream.next(), if connection.session.paused_until.is_none() => match message {
                Some(Ok(Message::Text(text))) => {
                    connection.request(text.as_str()).await;
                    None
                }
                Some(Ok(Message::Binary(_))) => {
                    connection.reply_error(None, refusal("bad_request", "requests are JSON text messages"));
                    None
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => None,
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
            },
        };
        connection.store_acks();
        if !send_all(&mut sink, &mut connection.out).await {
            break None;
        }
        if step.is_some() {
            break step;
        }
        // History pages go out one at a time, each sent before the next is read.
        while !connection.holds_too_much() && connection.catch_up().await {
            if !send_all(&mut sink, &mut connection.out).await {
                break;
            }
            connection.deliveries();
        }
        if connection.holds_too_much() {
            break Some((1008, "slow consumer: messages were not read fast enough"));
        }
        if !send_all(&mut sink, &mut connection.out).await {
            break None;
        }
    };
    let subs: Vec<Arc<Subscription>> = connection.subs.drain().map(|(_, s)| s).collect();
    connection.session.close(&subs);
    connection.broker.mqtt_acks().remove(id);
    connection.session.outbox.close();
    connection
        .broker
        .metrics()
        .connection_closed(Protocol::WebSocket);
    if let Some((code, reason)) = close {
        let frame = CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        };
        let _ = sink.send(Message::Close(Some(frame))).await;
    }
    let _ = sink.close().await;
}

struct Connection {
    id: u64,
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
}

impl Connection {
    fn reply(&mut self, id: Option<&str>, mut body: Value) {
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        self.out.push(body.to_string());
    }

    fn reply_error(&mut self, id: Option<&str>, refusal: Refusal) {
        self.reply(
            id,
            json!({"op": "error", "code": refusal.code, "message": refusal.message}),
        );
    }

    async fn request(&mut self, text: &str) {
        if text.len() > self.context.max_message_bytes {
            self.reply_error(
                None,
                refusal(
                    "too_large",
                    format!(
                        "a request may hold at most {} bytes",
                        self.context.max_message_bytes
                    ),
                ),
            );
            return;
        }
        let request: Request<'_> = match serde_json::from_str(text) {
            Ok(request) => request,
            Err(error) => {
                // The id, when the text has one, still goes back with the error.
                let id = serde_json::from_str::<Value>(text)
                    .ok()
                    .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned));
                self.reply_error(
                    id.as_deref(),
                    refusal("bad_request", format!("not a request: {error}")),
                );
                return;
            }
        };
        let id = request.id.clone();
        let id = id.as_deref();
        let needs = |field: Option<String>, name: &str| {
            field.ok_or_else(|| refusal("bad_request", format!("{} needs `{name}`", request.op)))
        };
        let result = match request.op.as_str() {
            "sub" => match needs(request.pattern.clone(), "pattern") {
                Ok(pattern) => {
                    let from = match (
                        request.from_time_ms,
                        request.from_offset,
                        request.from_version,
                    ) {
                        (Some(t), _, _) => Some(ReplayFrom::Time(t)),
                        (None, Some(o), _) => Some(ReplayFrom::Offset(o)),
                        (None, None, Some(v)) => Some(ReplayFrom::Version(v)),
                        (None, None, None) if request.from_snapshot => Some(ReplayFrom::Start),
                        (None, None, None) => None,
                    };
                    self.subscribe(id, &pattern, from, request.from_snapshot)
                        .await;
                    Ok(())
                }
                Err(refusal) => Err(refusal),
            },
            "unsub" => match request.sid {
                Some(sid) => {
                    match self.subs.remove(&sid) {
                        Some(sub) => {
                            self.session.unsubscribe(&sub);
                            self.reply(id, json!({"op": "ok"}));
                        }
                        None => self.reply_error(
                            id,
                            refusal("not_found", format!("no subscription {sid}")),
                        ),
                    }
                    Ok(())
                }
                None => Err(refusal("bad_request", "unsub needs `sid`")),
            },
            "pub" => match needs(request.subject.clone(), "subject") {
                Ok(subject) => {
                    self.publish(
                        request.id.clone(),
                        &subject,
                        request.data,
                        request.data_b64,
                        request.headers,
                        request.expect_version,
                        request.msg_id,
                    )
                    .await
                }
                Err(refusal) => Err(refusal),
            },
            "get" => match needs(request.subject.clone(), "subject") {
                Ok(subject) => self
                    .get(id, &subject, request.version)
                    .await
                    .map(|text| self.out.push(text)),
                Err(refusal) => Err(refusal),
            },
            "replay" => self.replay(&request).await.map(|text| self.out.push(text)),
            "subjects" => self
                .subjects(&request)
                .await
                .map(|text| self.out.push(text)),
            "snapshot.get" => match needs(request.subject.clone(), "subject") {
                Ok(subject) => self
                    .snapshot(id, &subject, request.version)
                    .await
                    .map(|text| self.out.push(text)),
                Err(refusal) => Err(refusal),
            },
            "snapshot.put" => self
                .put_snapshot(&request)
                .await
                .map(|text| self.out.push(text)),
            other => Err(refusal(
                "bad_request",
                format!(
                    "unknown op `{other}`: use sub, unsub, pub, get, replay, subjects, \
                     snapshot.get or snapshot.put"
                ),
            )),
        };
        if let Err(refusal) = result {
            self.reply_error(id, refusal);
        }
    }

    /// Subscribes live; with `from`, the stored history since then comes first and
    /// live messages follow without a gap or a repeat.
    async fn subscribe(
        &mut self,
        id: Option<&str>,
        text: &str,
        mut from: Option<ReplayFrom>,
        from_snapshot: bool,
    ) {
        // Native syntax, or MQTT's when the pattern has a `/`, `+` or `#`.
        let mqtt = text.contains(['/', '+', '#']);
        let parsed = if mqtt {
            Pattern::parse_mqtt_with(text, &self.context.limits)
        } else {
            Pattern::parse_native_with(text, &self.context.limits)
        };
        let pattern = match parsed {
            Ok(pattern) => pattern,
            Err(error) => {
                self.reply_error(id, refusal("invalid_pattern", error.to_string()));
                return;
            }
        };
        let native = pattern.to_string();
        if from_snapshot && !pattern.is_literal() {
            self.reply_error(
                id,
                refusal(
                    "bad_request",
                    "from_snapshot needs a single subject: snapshots are per subject",
                ),
            );
            return;
        }
        if let Err(refused) = self.session.admit_subscription(&native, &pattern, false) {
            let code = match refused {
                SubscribeRefusal::Denied(_) | SubscribeRefusal::InboxTaken(_) => "forbidden",
                SubscribeRefusal::OverQuota(_) | SubscribeRefusal::TooMany(_) => "quota_exceeded",
            };
            self.reply_error(id, refusal(code, refused.to_string()));
            return;
        }
        let sid = self.next_sid;
        self.next_sid = self.next_sid.wrapping_add(1).max(1);
        let sub = self.session.subscribe(
            Bytes::new(),
            pattern,
            None,
            Some(MqttOptions {
                qos: 0,
                subscription_id: sid,
                ..MqttOptions::default()
            }),
        );
        let literal = sub.pattern.is_literal();
        let pattern = sub.pattern.clone();
        self.subs.insert(sid, sub);
        self.reply(id, json!({"op": "ok", "sid": sid, "pattern": native}));
        if from.is_none() {
            return;
        }
        let Ok(store) = self.store() else {
            return;
        };
        // Everything routed before the subscription went live is durable after this,
        // so the history read next misses nothing; live messages wait meanwhile.
        let _ = store.durable_barrier().await;
        if from_snapshot {
            match store
                .snapshot(&self.session.routes().name, &native, None)
                .await
            {
                Ok(Some(snapshot)) => {
                    let out = SnapshotOut {
                        op: "snapshot",
                        sid: Some(sid),
                        ..SnapshotOut::of(&snapshot)
                    };
                    if let Ok(text) = serde_json::to_string(&out) {
                        self.out.push(text);
                    }
                    from = Some(ReplayFrom::Version(snapshot.version + 1));
                }
                Ok(None) => {}
                Err(error) => self.reply_error(
                    None,
                    refusal(
                        "unavailable",
                        format!("snapshot of subscription {sid}: {error}"),
                    ),
                ),
            }
        }
        let Some(from) = from else {
            return;
        };
        let target = if literal {
            History::Subject(native)
        } else {
            History::Pattern(pattern)
        };
        self.catchups.push_back(CatchUp {
            sid,
            target,
            from,
            high: 0,
        });
    }

    /// Reads the next page of the oldest catch-up and queues it as `msg` texts; when
    /// it is done, the live messages held for it follow (those it already sent are
    /// dropped by offset). False when there is nothing to catch up.
    async fn catch_up(&mut self) -> bool {
        let Some(catchup) = self.catchups.front() else {
            return false;
        };
        let Ok(store) = self.store() else {
            self.catchups.clear();
            return false;
        };
        let tenant = Arc::clone(&self.session.routes().name);
        let page = match &catchup.target {
            History::Subject(subject) => {
                store
                    .replay_subject(&tenant, subject, catchup.from, CATCH_UP_PAGE, REPLAY_BYTES)
                    .await
            }
            History::Pattern(pattern) => {
                store
                    .replay_pattern(&tenant, pattern, catchup.from, CATCH_UP_PAGE, REPLAY_BYTES)
                    .await
            }
        };
        let sid = catchup.sid;
        let subject_history = matches!(catchup.target, History::Subject(_));
        let (next, done) = match page {
            Ok(page) => {
                let mut high = 0;
                for message in &page.messages {
                    high = high.max(message.offset);
                    if !self.broker.authorizer().may_deliver(&message.subject) {
                        continue;
                    }
                    let out = Delivery {
                        op: "msg",
                        sid,
                        subject: &message.subject,
                        version: Some(message.version),
                        offset: Some(message.offset),
                        reply: None,
                        payload: Payload::of(&message.headers, &message.payload),
                    };
                    if let Ok(text) = serde_json::to_string(&out) {
                        self.out.push(text);
                    }
                }
                if let Some(catchup) = self.catchups.front_mut() {
                    catchup.high = catchup.high.max(high);
                }
                (page.next, page.caught_up)
            }
            Err(error) => {
                self.reply_error(
                    None,
                    refusal(
                        "unavailable",
                        format!("history of subscription {sid}: {error}"),
                    ),
                );
                (0, true)
            }
        };
        if let Some(catchup) = self.catchups.front_mut() {
            catchup.from = if subject_history {
                ReplayFrom::Version(next)
            } else {
                ReplayFrom::Offset(next)
            };
        }
        if done && let Some(finished) = self.catchups.pop_front() {
            for envelope in self.held.remove(&finished.sid).unwrap_or_default() {
                self.held_bytes = self.held_bytes.saturating_sub(envelope_size(&envelope));
                if envelope.offset == 0 || envelope.offset > finished.high {
                    self.emit(&envelope);
                }
            }
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &mut self,
        id: Option<String>,
        subject: &str,
        data: Option<&RawValue>,
        data_b64: Option<String>,
        headers: HashMap<String, String>,
        expect_version: Option<u64>,
        msg_id: Option<String>,
    ) -> Result<(), Refusal> {
        let subject = self.subject(subject)?;
        let subject = subject.as_str();
        let mut map = HeaderMap::new();
        let (payload, json_inline) = payload_of(data, data_b64.as_deref())?;
        self.broker.metrics().count_in(1, payload.len() as u64);
        for (name, value) in headers {
            map.append(name, value);
        }
        if json_inline && map.get("Content-Type").is_none() {
            map.append("Content-Type", "application/json");
        }
        if let Some(version) = expect_version {
            map.insert("Canopy-Expected-Version", version.to_string());
        }
        if let Some(msg_id) = &msg_id {
            map.insert("Canopy-Msg-Id", msg_id.as_str());
        }
        let block = if map.is_empty() {
            Bytes::new()
        } else {
            let mut block = BytesMut::new();
            map.encode(&mut block);
            block.freeze()
        };
        if self.pending_acks.len() >= usize::from(u16::MAX) - 1 {
            return Err(refusal("busy", "too many publishes waiting for the store"));
        }
        let ack = self.next_ack;
        let publish = Publish {
            headers: block,
            ack: AskAck::To(AckTo {
                address: envelope::ack_address(self.id, ack),
                flags: ACK_MQTT,
            }),
            ..Publish::new(subject, payload)
        };
        let published = self.session.publish(publish).map_err(|refused| {
            let code = match &refused {
                session::Refusal::InvalidSubject(_) => "invalid_subject",
                session::Refusal::Reserved(_) | session::Refusal::Denied(_) => "forbidden",
                session::Refusal::TooLarge { .. } => "too_large",
                session::Refusal::OverQuota(_) => "quota_exceeded",
                session::Refusal::BadHeader(_) => "bad_request",
            };
            refusal(code, refused.to_string())
        })?;
        self.session.end_batch();
        match published {
            session::Published::Stored { .. } => {
                self.next_ack = self.next_ack.wrapping_add(1).max(1);
                self.pending_acks.insert(ack, id);
                if self.session.send_appends().await {
                    Ok(())
                } else {
                    self.pending_acks.remove(&ack);
                    Err(refusal("unavailable", "the store is closing"))
                }
            }
            _ => {
                self.reply(id.as_deref(), json!({"op": "ok", "stored": false}));
                Ok(())
            }
        }
    }

    async fn get(
        &mut self,
        id: Option<&str>,
        subject: &str,
        version: Option<u64>,
    ) -> Result<String, Refusal> {
        let subject = self.subject(subject)?;
        self.may_read(subject.as_str())?;
        let store = self.store()?;
        let found = store
            .get(&self.session.routes().name, subject.as_str(), version)
            .await
            .map_err(|e| refusal("unavailable", e.to_string()))?;
        let Some(message) = found else {
            return Err(refusal(
                "not_found",
                format!("{subject} has no such message"),
            ));
        };
        let out = Stored {
            op: "ok",
            id,
            message: StoredOut::of(&message),
        };
        serde_json::to_string(&out).map_err(|e| refusal("internal", e.to_string()))
    }

    /// The latest snapshot of `subject`, or the latest at or below `version`.
    async fn snapshot(
        &mut self,
        id: Option<&str>,
        subject: &str,
        version: Option<u64>,
    ) -> Result<String, Refusal> {
        let subject = self.subject(subject)?;
        self.may_read(subject.as_str())?;
        let store = self.store()?;
        let Some(snapshot) = store
            .snapshot(&self.session.routes().name, subject.as_str(), version)
            .await
            .map_err(|e| refusal("unavailable", e.to_string()))?
        else {
            return Err(refusal("not_found", format!("{subject} has no snapshot")));
        };
        let out = SnapshotOut {
            id,
            ..SnapshotOut::of(&snapshot)
        };
        serde_json::to_string(&out).map_err(|e| refusal("internal", e.to_string()))
    }

    /// Stores the client's snapshot of `subject` at `version`.
    async fn put_snapshot(&mut self, request: &Request<'_>) -> Result<String, Refusal> {
        let (Some(subject), Some(version)) = (&request.subject, request.version) else {
            return Err(refusal(
                "bad_request",
                "snapshot.put needs `subject` and `version`",
            ));
        };
        let subject = self.subject(subject)?;
        self.broker
            .authorizer()
            .authorize(self.session.principal(), Action::Publish, subject.as_str())
            .map_err(|denied| refusal("forbidden", denied.to_string()))?;
        let (payload, json) = payload_of(request.data, request.data_b64.as_deref())?;
        let store = self.store()?;
        store
            .put_snapshot(
                &self.session.routes().name,
                subject.as_str(),
                version,
                &payload,
                json,
            )
            .await
            .map_err(|e| match e {
                crate::store::StoreError::Refused(reason) => refusal("conflict", reason),
                other => refusal("unavailable", other.to_string()),
            })?;
        Ok(
            json!({"op": "ok", "id": request.id, "subject": subject.as_str(), "version": version})
                .to_string(),
        )
    }

    /// A subject in native syntax, within the limits.
    fn subject(&self, text: &str) -> Result<Subject, Refusal> {
        Subject::parse_native_with(text, &self.context.limits)
            .map_err(|e| refusal("invalid_subject", e.to_string()))
    }

    /// A pattern in either syntax: MQTT's when it has a `/`, `+` or `#`.
    fn pattern(&self, text: &str) -> Result<Pattern, Refusal> {
        let parsed = if text.contains(['/', '+', '#']) {
            Pattern::parse_mqtt_with(text, &self.context.limits)
        } else {
            Pattern::parse_native_with(text, &self.context.limits)
        };
        parsed.map_err(|e| refusal("invalid_pattern", e.to_string()))
    }

    /// One page of history: of a subject (`subject`, from a version) or of a pattern
    /// (`pattern`, from a tenant offset), or from a time.
    async fn replay(&mut self, request: &Request<'_>) -> Result<String, Refusal> {
        let store = self.store()?;
        let max = request.max.unwrap_or(100).clamp(1, 1000);
        let from = match (
            request.from_time_ms,
            request.from_offset,
            request.from_version,
        ) {
            (Some(t), _, _) => ReplayFrom::Time(t),
            (None, Some(o), _) => ReplayFrom::Offset(o),
            (None, None, Some(v)) => ReplayFrom::Version(v),
            (None, None, None) => ReplayFrom::Start,
        };
        let tenant = Arc::clone(&self.session.routes().name);
        let page = match (&request.subject, &request.pattern) {
            (Some(subject), None) => {
                let subject = self.subject(subject)?;
                self.may_read(subject.as_str())?;
                store
                    .replay_subject(&tenant, subject.as_str(), from, max, REPLAY_BYTES)
                    .await
            }
            (None, Some(pattern)) => {
                let pattern = self.pattern(pattern)?;
                self.may_read(&pattern.to_string())?;
                store
                    .replay_pattern(&tenant, &pattern, from, max, REPLAY_BYTES)
                    .await
            }
            _ => {
                return Err(refusal(
                    "bad_request",
                    "replay needs `subject` or `pattern`",
                ));
            }
        }
        .map_err(|e| refusal("unavailable", e.to_string()))?;
        let authz = self.broker.authorizer();
        let messages: Vec<StoredOut<'_>> = page
            .messages
            .iter()
            .filter(|m| authz.may_deliver(&m.subject))
            .map(StoredOut::of)
            .collect();
        // Serialized straight to text: through a `Value` the raw payloads would be
        // parsed and lose their exact bytes.
        let out = ReplayOut {
            op: "ok",
            id: request.id.as_deref(),
            messages,
            next: page.next,
            caught_up: page.caught_up,
        };
        serde_json::to_string(&out).map_err(|e| refusal("internal", e.to_string()))
    }

    /// One page of stored subjects matching `pattern`, with their heads.
    async fn subjects(&mut self, request: &Request<'_>) -> Result<String, Refusal> {
        let store = self.store()?;
        let pattern = self.pattern(request.pattern.as_deref().unwrap_or(">"))?;
        self.may_read(&pattern.to_string())?;
        let max = request.max.unwrap_or(100).clamp(1, 1000);
        let page = store
            .subjects(
                &self.session.routes().name,
                &pattern,
                request.after.as_deref(),
                max,
            )
            .await
            .map_err(|e| refusal("unavailable", e.to_string()))?;
        let authz = self.broker.authorizer();
        let subjects: Vec<Value> = page
            .subjects
            .iter()
            .filter(|h| authz.may_deliver(&h.subject))
            .map(|h| {
                json!({"subject": h.subject, "version": h.version, "offset": h.offset, "time_ms": h.time_ms})
            })
            .collect();
        Ok(
            json!({"op": "ok", "id": request.id, "subjects": subjects, "next": page.next})
                .to_string(),
        )
    }

    fn store(&self) -> Result<Arc<crate::store::Store>, Refusal> {
        self.broker
            .store()
            .cloned()
            .ok_or_else(|| refusal("unavailable", "the store is not open"))
    }

    /// Reading stored history is subscribing to it, for the deny lists.
    fn may_read(&self, pattern: &str) -> Result<(), Refusal> {
        self.broker
            .authorizer()
            .authorize(self.session.principal(), Action::Subscribe, pattern)
            .map_err(|denied| refusal("forbidden", denied.to_string()))
    }

    /// Turns queued envelopes into `msg` texts.
    fn deliveries(&mut self) {
        // The outbox gets the spare buffer's capacity, so routing does not grow a
        // fresh buffer for every batch.
        let mut taken = std::mem::take(&mut self.spare);
        self.session.outbox.take(&mut taken);
        let whole = taken.freeze();
        let mut taken = whole.clone();
        while let Some(delivery) = envelope::decode(&mut taken) {
            if self
                .catchups
                .iter()
                .any(|c| c.sid == delivery.subscription_id)
            {
                self.held_bytes += envelope_size(&delivery);
                self.held
                    .entry(delivery.subscription_id)
                    .or_default()
                    .push(delivery);
                continue;
            }
            self.emit(&delivery);
        }
        drop(taken);
        // Back as the spare unless held deliveries still point into it.
        if let Ok(spare) = whole.try_into_mut() {
            self.spare = spare;
        }
    }

    /// Queues one delivery as a `msg` text: `{"op":"msg","sid":N` and the tail every
    /// subscriber of the message shares, rendered once.
    fn emit(&mut self, delivery: &envelope::Envelope) {
        const HEAD: &str = r#"{"op":"msg","sid":"#;
        let tail = self.context.rendered.tail(delivery, || {
            let stored = delivery.offset != 0;
            let out = Delivery {
                op: "msg",
                sid: 0,
                subject: std::str::from_utf8(&delivery.subject).unwrap_or_default(),
                version: stored.then_some(delivery.version),
                offset: stored.then_some(delivery.offset),
                reply: std::str::from_utf8(&delivery.reply)
                    .ok()
                    .filter(|r| !r.is_empty()),
                payload: Payload::of(&delivery.headers, &delivery.payload),
            };
            let text = serde_json::to_string(&out).ok()?;
            text.strip_prefix(HEAD)?
                .strip_prefix('0')
                .map(str::to_owned)
        });
        if let Some(tail) = tail {
            let mut sid = itoa::Buffer::new();
            let sid = sid.format(delivery.subscription_id);
            let mut text = String::with_capacity(HEAD.len() + sid.len() + tail.len());
            text.push_str(HEAD);
            text.push_str(sid);
            text.push_str(&tail);
            self.out.push(text);
        }
        self.broker
            .metrics()
            .count_out(1, (delivery.payload.len() + delivery.headers.len()) as u64);
    }

    /// Whether live messages held during catch-ups passed the outbox's bound.
    fn holds_too_much(&self) -> bool {
        self.held_bytes > self.context.max_pending_bytes
    }

    /// Answers publishes the store has decided.
    fn store_acks(&mut self) {
        let mut acks = Vec::new();
        self.acks.take(&mut acks);
        for StoreAck { packet_id, outcome } in acks {
            let Some(id) = self.pending_acks.remove(&packet_id) else {
                continue;
            };
            let body = match outcome {
                AppendOutcome::Stored {
                    subject,
                    version,
                    offset,
                    ..
                } => {
                    json!({"op": "ok", "stored": true, "subject": &*subject, "version": version, "offset": offset})
                }
                AppendOutcome::Duplicate {
                    subject,
                    version,
                    offset,
                } => {
                    json!({"op": "ok", "stored": true, "duplicate": true, "subject": &*subject, "version": version, "offset": offset})
                }
                AppendOutcome::Conflict {
                    subject,
                    current_version,
                    ..
                } => json!({
                    "op": "error",
                    "code": "conflict",
                    "message": format!("{subject} is at version {current_version}"),
                    "subject": &*subject,
                    "current_version": current_version,
                }),
                AppendOutcome::Failed { reason } => {
                    json!({"op": "error", "code": "unavailable", "message": reason})
                }
                AppendOutcome::QuotaExceeded { reason } => {
                    json!({"op": "error", "code": "quota_exceeded", "message": reason})
                }
            };
            self.reply(id.as_deref(), body);
        }
    }
}

/// A request's payload: `data` (inline JSON, kept as the very same bytes; true) or
/// `data_b64` (bytes; false), or nothing.
fn payload_of(data: Option<&RawValue>, data_b64: Option<&str>) -> Result<(Bytes, bool), Refusal> {
    match (data, data_b64) {
        (Some(raw), None) => Ok((Bytes::copy_from_slice(raw.get().as_bytes()), true)),
        (None, Some(text)) => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map(|bytes| (Bytes::from(bytes), false))
            .map_err(|e| refusal("bad_request", format!("data_b64 is not base64: {e}"))),
        (None, None) => Ok((Bytes::new(), false)),
        (Some(_), Some(_)) => Err(refusal("bad_request", "give data or data_b64, not both")),
    }
}

/// A delivery as the client sees it.
#[derive(Serialize)]
struct Delivery<'a> {
    op: &'static str,
    sid: u32,
    subject: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply: Option<&'a str>,
    #[serde(flatten)]
    payload: Payload,
}

/// A page of history answering `replay`.
#[derive(Serialize)]
struct ReplayOut<'a> {
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    messages: Vec<StoredOut<'a>>,
    next: u64,
    caught_up: bool,
}

/// A message in a replay page.
#[derive(Serialize)]
struct StoredOut<'a> {
    subject: &'a str,
    version: u64,
    offset: u64,
    time_ms: u64,
    #[serde(flatten)]
    payload: Payload,
}

impl<'a> StoredOut<'a> {
    fn of(message: &'a crate::store::StoredMessage) -> StoredOut<'a> {
        StoredOut {
            subject: &message.subject,
            version: message.version,
            offset: message.offset,
            time_ms: message.time_ms,
            payload: Payload::of(&message.headers, &message.payload),
        }
    }
}

/// A stored message answering `get`.
#[derive(Serialize)]
struct Stored<'a> {
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(flatten)]
    message: StoredOut<'a>,
}

/// A message's headers (when any) and payload: inline `data` when the headers say the
/// content is JSON and the bytes parse (serialized as the very same bytes), `data_b64`
/// otherwise.
#[derive(Serialize)]
struct Payload {
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<serde_json::Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_b64: Option<String>,
}

impl Payload {
    fn of(headers: &[u8], payload: &[u8]) -> Payload {
        let mut json_content = false;
        let mut object = None;
        if !headers.is_empty()
            && let Ok(map) = HeaderMap::parse(headers)
        {
            json_content = map.says_json();
            let mut fields = serde_json::Map::new();
            for (name, value) in map.entries {
                match fields.get_mut(&name) {
                    Some(Value::Array(values)) => values.push(json!(value)),
                    Some(first) => *first = json!([first.take(), value]),
                    None => {
                        fields.insert(name, json!(value));
                    }
                }
            }
            object = Some(fields);
        }
        Payload {
            headers: object,
            ..Payload::bytes(json_content, payload)
        }
    }

    /// Bare bytes, inline when `json` and they parse.
    fn bytes(json: bool, payload: &[u8]) -> Payload {
        let data = json
            .then(|| std::str::from_utf8(payload).ok())
            .flatten()
            .and_then(|text| RawValue::from_string(text.to_owned()).ok());
        let data_b64 = data
            .is_none()
            .then(|| base64::engine::general_purpose::STANDARD.encode(payload));
        Payload {
            headers: None,
            data,
            data_b64,
        }
    }
}

/// A snapshot: answering `snapshot.get`, or first on a subscription from a snapshot.
#[derive(Serialize)]
struct SnapshotOut<'a> {
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sid: Option<u32>,
    subject: &'a str,
    version: u64,
    time_ms: u64,
    #[serde(flatten)]
    payload: Payload,
}

impl<'a> SnapshotOut<'a> {
    fn of(snapshot: &'a Snapshot) -> SnapshotOut<'a> {
        SnapshotOut {
            op: "ok",
            id: None,
            sid: None,
            subject: &snapshot.subject,
            version: snapshot.version,
            time_ms: snapshot.time_ms,
            payload: Payload::bytes(snapshot.json, &snapshot.payload),
        }
    }
}
