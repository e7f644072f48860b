//! The broker's side of the store: which subjects are stored (policies), live
//! delivery of sequenced messages, and acks sent as messages to reply subjects.
//!
//! Stored subjects are routed by the store's sequencer through [`StoreRouter`], so live
//! subscribers see each subject's messages in version order. Acks are ordinary
//! messages on the publisher's reply subject, in JetStream's PubAck shape extended
//! with Canopy's fields, so JetStream clients read them unmodified. Nothing here
//! touches the engine.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use canopy_protocols::native::HeaderMap;
use canopy_subjects::{Pattern, Trie};
use serde_json::json;

use super::{Broker, Message, RouteScratch, Wakes};
use crate::config::{AckMode, StorePolicy};
use crate::groups::awaiting::{Await, AwaitOutcome};
use crate::store::{
    AckCargo, AckTo, AppendOutcome, AppendRequest, Durability, Expectation, NewMessage, RouteTag,
    Sequenced, StoreEvents,
};

/// [`RouteTag::flags`](crate::store::RouteTag) bits.
pub const FLAG_NO_ECHO: u32 = 1;
pub const FLAG_NO_RESPONDERS: u32 = 2;
pub use super::{ACK_JETSTREAM, ACK_MQTT, ACK_REMOTE, ACK_ROLLUP};

/// The store policies, compiled: first match in configuration order wins.
pub struct Policies {
    trie: Trie<usize>,
    list: Vec<StorePolicy>,
}

impl Policies {
    pub fn new(list: &[StorePolicy]) -> Result<Self, canopy_subjects::SubjectError> {
        let mut trie = Trie::new();
        for (i, policy) in list.iter().enumerate() {
            trie.insert(&Pattern::parse_native(&policy.pattern)?, None, i);
        }
        Ok(Self {
            trie,
            list: list.to_vec(),
        })
    }

    /// The policy that stores `subject`, if any.
    pub fn for_subject(&self, subject: &str) -> Option<&StorePolicy> {
        self.first_match(subject).filter(|p| p.store)
    }

    /// The first policy whose pattern matches `subject`, storing or not.
    pub fn first_match(&self, subject: &str) -> Option<&StorePolicy> {
        let mut first = usize::MAX;
        self.trie.for_each_match(subject, &mut |plain, _| {
            for &i in plain {
                first = first.min(i);
            }
        });
        self.list.get(first)
    }
}

/// Retention as the policies, the tenants' declared streams (`max_age`) and the tenant
/// budget say: a message goes at the shorter of its policy's and its stream's ages.
pub struct RetentionByPolicy {
    policies: Policies,
    max_tenant_bytes: u64,
    /// Where the tenants' streams are found (a tenant not open here has none).
    broker: Weak<super::Broker>,
}

impl RetentionByPolicy {
    pub fn new(policies: Policies, max_tenant_bytes: u64) -> Self {
        Self {
            policies,
            max_tenant_bytes,
            broker: Weak::new(),
        }
    }

    /// Takes the streams' ages from `broker`'s open tenants.
    pub fn with_streams_of(mut self, broker: &Arc<super::Broker>) -> Self {
        self.broker = Arc::downgrade(broker);
        self
    }

    fn streams_of(&self, tenant: &str) -> Option<Arc<crate::streams::Streams>> {
        let broker = self.broker.upgrade()?;
        let streams = broker.open_tenant_named(tenant)?.streams.current();
        (!streams.is_empty()).then_some(streams)
    }
}

impl crate::store::RetentionRules for RetentionByPolicy {
    fn max_age_ms(&self, tenant: &str, subject: &str) -> u64 {
        let policy = self
            .policies
            .for_subject(subject)
            .map_or(0, |p| p.max_age_secs.saturating_mul(1000));
        let stream = self
            .streams_of(tenant)
            .and_then(|streams| streams.for_subject(subject).map(|s| s.max_age_ms))
            .unwrap_or(0);
        crate::store::shorter(policy, stream)
    }

    fn shortest_max_age_ms(&self, tenant: &str) -> u64 {
        let policies = self
            .policies
            .list
            .iter()
            .filter(|p| p.store && p.max_age_secs > 0)
            .map(|p| p.max_age_secs.saturating_mul(1000))
            .min()
            .unwrap_or(0);
        let streams = self
            .streams_of(tenant)
            .and_then(|streams| {
                streams
                    .list()
                    .iter()
                    .map(|s| s.max_age_ms)
                    .filter(|&ms| ms > 0)
                    .min()
            })
            .unwrap_or(0);
        crate::store::shorter(policies, streams)
    }

    fn max_tenant_bytes(&self) -> u64 {
        self.max_tenant_bytes
    }
}

/// What a publish's headers ask of the store.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreRequest {
    pub expect: Option<Expectation>,
    pub msg_id: Option<Box<str>>,
    /// An explicit ack request, with the durability it asks for if it names one.
    pub ack: Option<Option<Durability>>,
    /// A `Nats-*` header asked: answer like JetStream.
    pub jetstream: bool,
    /// `Canopy-Await`: the ack waits for these groups to pass the message.
    pub awaiting: Option<Arc<Await>>,
    /// The client sent a `Canopy-Schema` header, which only the server may set.
    pub schema_header: bool,
    /// `Nats-Expected-Stream`: the stream the publisher expects the subject in.
    pub expected_stream: Option<Box<str>>,
    /// `Nats-Rollup: sub`: once stored, the message is the subject's only version.
    pub rollup: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadStoreHeader(pub String);

impl StoreRequest {
    /// Reads the Canopy-* and Nats-* headers that steer storing.
    pub fn from_headers(block: &[u8]) -> Result<StoreRequest, BadStoreHeader> {
        let headers = HeaderMap::parse(block)
            .map_err(|e| BadStoreHeader(format!("headers cannot be read: {e}")))?;
        let number = |name: &str, value: &str| {
            value.trim().parse::<u64>().map_err(|_| {
                BadStoreHeader(format!("{name} must be a whole number, got `{value}`"))
            })
        };
        let mut request = StoreRequest::default();
        let mut await_groups = None;
        let mut await_timeout = None;
        for (name, value) in &headers.entries {
            match name.as_str() {
                "Canopy-Expected-Version" => {
                    request.expect = Some(Expectation::Version(number(name, value)?));
                }
                "Canopy-Msg-Id" => request.msg_id = Some(value.trim().into()),
                "Canopy-Ack" => {
                    request.ack = Some(match value.trim() {
                        "durable" => Some(Durability::Durable),
                        "received" => Some(Durability::Received),
                        "" | "true" | "yes" => None,
                        other => {
                            return Err(BadStoreHeader(format!(
                                "Canopy-Ack must be `durable`, `received` or `true`, got `{other}`"
                            )));
                        }
                    });
                }
                "Nats-Msg-Id" => {
                    request.msg_id = Some(value.trim().into());
                    request.jetstream = true;
                }
                "Nats-Expected-Last-Subject-Sequence" | "Nats-Expected-Last-Sequence" => {
                    let n = number(name, value)?;
                    let expect = if name == "Nats-Expected-Last-Sequence" {
                        Expectation::StreamOffset(n)
                    } else {
                        Expectation::LastOffset(n)
                    };
                    if request.expect.replace(expect).is_some_and(|e| e != expect) {
                        return Err(BadStoreHeader(
                            "Nats-Expected-Last-Sequence and Nats-Expected-Last-Subject-Sequence \
                             cannot be asked together"
                                .into(),
                        ));
                    }
                    request.jetstream = true;
                }
                "Nats-Expected-Stream" => {
                    request.expected_stream = Some(value.trim().into());
                    request.jetstream = true;
                }
                "Nats-Expected-Last-Msg-Id" => {
                    // Refused rather than ignored: a precondition the store would not
                    // hold must not look held.
                    return Err(BadStoreHeader(
                        "Nats-Expected-Last-Msg-Id is not supported: use \
                         Nats-Expected-Last-Subject-Sequence or Nats-Expected-Last-Sequence"
                            .into(),
                    ));
                }
                "Canopy-Await" => await_groups = Some(value.as_str()),
                other if other.eq_ignore_ascii_case(crate::schemas::SCHEMA_HEADER) => {
                    request.schema_header = true;
                }
                "Canopy-Await-Timeout" => await_timeout = Some(value.as_str()),
                other if other.starts_with("Nats-Expected-") => {
                    return Err(BadStoreHeader(format!("{other} is not supported")));
                }
                "Nats-Rollup" => match value.trim() {
                    "sub" => {
                        request.rollup = true;
                        request.jetstream = true;
                    }
                    "all" => {
                        return Err(BadStoreHeader(
                            "Nats-Rollup: all is not offered: a stream's subjects are each \
                             their own key stream; roll up one subject (sub)"
                                .into(),
                        ));
                    }
                    other => {
                        return Err(BadStoreHeader(format!("rollup value invalid: {other:?}")));
                    }
                },
                // Refused rather than ignored: a TTL would keep the message past its
                // time.
                "Nats-TTL" => {
                    return Err(BadStoreHeader(format!("{name} is not offered yet")));
                }
                _ => {}
            }
        }
        match (await_groups, await_timeout) {
            (Some(groups), timeout) => {
                request.awaiting = Some(Arc::new(
                    Await::parse(groups, timeout).map_err(BadStoreHeader)?,
                ));
            }
            (None, Some(_)) => {
                return Err(BadStoreHeader(
                    "Canopy-Await-Timeout needs Canopy-Await naming the groups to wait for".into(),
                ));
            }
            (None, None) => {}
        }
        if request.msg_id.as_deref().is_some_and(str::is_empty) {
            return Err(BadStoreHeader("a msg id must not be empty".into()));
        }
        Ok(request)
    }

    /// Whether the store answers a publish with a reply subject under `policy`.
    pub fn wants_ack(&self, policy: &StorePolicy) -> bool {
        policy.ack == AckMode::Always
            || self.ack.is_some()
            || self.expect.is_some()
            || self.msg_id.is_some()
            || self.jetstream
            || self.awaiting.is_some()
    }
}

/// One message to append under `policy`, with what its headers asked
/// (`request`): the request every front end builds the same way.
pub fn append_one(
    policy: &StorePolicy,
    tenant: &Arc<str>,
    subject: &str,
    message: NewMessage,
    request: StoreRequest,
    ack: Option<AckTo>,
    route: RouteTag,
) -> AppendRequest {
    let ack = ack.map(|ack| AckTo {
        cargo: request.awaiting.map(AckCargo::new),
        ..ack
    });
    AppendRequest {
        tenant: Arc::clone(tenant),
        subject: Arc::from(subject),
        messages: vec![message],
        expect: request.expect,
        msg_id: request.msg_id,
        durability: request.ack.flatten().unwrap_or(policy.durability),
        ack,
        route,
        compaction: policy.compaction(),
        max_versions: policy.max_versions,
        retain: false,
    }
}

/// Routes what the sequencer hands over, and publishes acks.
pub struct StoreRouter {
    broker: Weak<Broker>,
}

impl StoreRouter {
    pub fn new(broker: &Arc<Broker>) -> Self {
        Self {
            broker: Arc::downgrade(broker),
        }
    }
}

impl StoreEvents for StoreRouter {
    fn sequenced(&self, batch: &[Sequenced<'_>]) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let mut scratch = RouteScratch::default();
        let mut wakes = Wakes::default();
        let mut pressing = Vec::new();
        let mut routes: Option<Arc<super::Tenant>> = None;
        let (mut msgs, mut bytes) = (0u64, 0u64);
        for message in batch {
            if routes.as_ref().is_none_or(|r| *r.name != *message.tenant) {
                routes = Some(broker.tenant(message.tenant));
            }
            let Some(tenant) = routes.as_deref() else {
                continue;
            };
            let headers = (!message.headers.is_empty()).then_some(&message.headers[..]);
            let routed = Message {
                subject: message.subject,
                shown_as: None,
                source: None,
                reply: message.route.reply.as_deref(),
                headers,
                payload: message.payload,
                origin: message.route.origin,
                flags: message.flags,
                version: message.version,
                offset: message.offset,
                from_link: None,
            };
            tenant.taps.offer(message);
            let skip = (message.route.flags & FLAG_NO_ECHO != 0).then_some(message.route.origin);
            let delivered = broker.route(tenant, skip, &routed, &mut scratch, &mut wakes);
            if wakes.fed_pressing() {
                // The sequencer must not wait: the publisher does, after its batch.
                pressing.clear();
                wakes.take_pressing(&mut pressing);
                if let Some(outbox) = message
                    .route
                    .publisher
                    .as_ref()
                    .and_then(|p| p.peek::<super::Outbox>())
                {
                    outbox.note_fed_pressing(&pressing);
                }
            }
            msgs += delivered as u64;
            bytes += (delivered * (message.payload.len() + message.headers.len())) as u64;
            if delivered == 0
                && message.route.flags & FLAG_NO_RESPONDERS != 0
                && let Some(reply) = message.route.reply.as_deref()
            {
                broker.tell_no_responders(
                    tenant,
                    message.route.origin,
                    reply,
                    &mut scratch,
                    &mut wakes,
                );
            }
        }
        if msgs > 0 {
            broker.metrics().count_out(msgs, bytes);
        }
    }

    fn lost(&self) {
        if let Some(broker) = self.broker.upgrade() {
            broker.log_lost();
        }
    }

    fn acknowledged(&self, acks: Vec<(Arc<str>, AckTo, AppendOutcome)>) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let mut scratch = RouteScratch::default();
        let mut wakes = Wakes::default();
        for (tenant, mut ack, outcome) in acks {
            if ack.flags & ACK_ROLLUP != 0
                && let Some((subject, version)) = stored_at(&outcome)
                && let Some(store) = broker.store().cloned()
            {
                // The rolled-up subject keeps this version alone: what came before is
                // purged, then the publisher hears (a read after the ack sees no
                // older version).
                let answer_to = Arc::clone(&broker);
                tokio::spawn(async move {
                    let before = version.saturating_sub(1);
                    if before > 0
                        && let Err(error) =
                            store.purge_subject_through(&tenant, &subject, before).await
                    {
                        tracing::warn!(%error, %subject, "a rollup's purge of older versions failed");
                    }
                    let mut scratch = RouteScratch::default();
                    let mut wakes = Wakes::default();
                    deliver_ack(
                        &answer_to,
                        &tenant,
                        &ack,
                        outcome,
                        None,
                        (&mut scratch, &mut wakes),
                    );
                    wakes.wake_all();
                });
                continue;
            }
            // A publish that waits for groups is answered once they pass its version
            // (or its wait ends); it is stored either way.
            if let Some(awaiting) = ack.cargo.take().and_then(AckCargo::get::<Await>)
                && let Some((subject, version)) = stored_at(&outcome)
            {
                let answer_to = Arc::clone(&broker);
                let tenant_name = Arc::clone(&tenant);
                broker.groups().await_passing(
                    &broker.tenant(&tenant),
                    subject,
                    version,
                    &awaiting,
                    move |awaited| {
                        let mut scratch = RouteScratch::default();
                        let mut wakes = Wakes::default();
                        let delivery = (&mut scratch, &mut wakes);
                        deliver_ack(
                            &answer_to,
                            &tenant_name,
                            &ack,
                            outcome,
                            Some(awaited),
                            delivery,
                        );
                    },
                );
                continue;
            }
            deliver_ack(
                &broker,
                &tenant,
                &ack,
                outcome,
                None,
                (&mut scratch, &mut wakes),
            );
        }
    }
}

/// The subject and version a stored (or already stored) message has.
fn stored_at(outcome: &AppendOutcome) -> Option<(Arc<str>, u64)> {
    match outcome {
        AppendOutcome::Stored {
            subject, version, ..
        }
        | AppendOutcome::Duplicate {
            subject, version, ..
        } => Some((Arc::clone(subject), *version)),
        _ => None,
    }
}

/// The subject an outcome is about, when it names one.
fn subject_of(outcome: &AppendOutcome) -> Option<&str> {
    match outcome {
        AppendOutcome::Stored { subject, .. }
        | AppendOutcome::Duplicate { subject, .. }
        | AppendOutcome::Conflict { subject, .. } => Some(subject),
        _ => None,
    }
}

impl Broker {
    /// Answers publishes whose appends another node stored (or could not), as if
    /// they had been stored here.
    pub fn answer(&self, answers: impl IntoIterator<Item = super::mesh::Answer>) {
        let mut scratch = RouteScratch::default();
        let mut wakes = Wakes::default();
        for answer in answers {
            deliver_ack(
                self,
                &answer.tenant,
                &answer.ack,
                answer.outcome,
                answer.awaited,
                (&mut scratch, &mut wakes),
            );
        }
        wakes.wake_all();
    }
}

/// Sends one ack: to an MQTT or `/ws` connection's inbox, or as a message to the
/// publisher's reply subject, or, for an append another node forwarded, back to it.
fn deliver_ack(
    broker: &Broker,
    tenant: &str,
    ack: &AckTo,
    outcome: AppendOutcome,
    awaited: Option<AwaitOutcome>,
    (scratch, wakes): (&mut RouteScratch, &mut Wakes),
) {
    if ack.flags & ACK_REMOTE != 0 {
        if let Some(mesh) = broker.mesh() {
            mesh.send_ack(ack, &outcome, awaited.as_ref());
        }
        return;
    }
    if ack.flags & ACK_MQTT != 0 {
        if let Some((conn, packet_id)) = super::envelope::parse_ack_address(&ack.address)
            && let Some(inbox) = broker.mqtt_acks().get(conn)
        {
            inbox.push(super::envelope::StoreAck {
                packet_id,
                outcome,
                awaited,
            });
        }
        return;
    }
    let Ok(address) = std::str::from_utf8(&ack.address) else {
        return;
    };
    let stream = match subject_of(&outcome) {
        Some(subject) => broker.tenant(tenant).stream_of(subject),
        None => Arc::from(tenant),
    };
    let body = ack_body(&stream, &outcome, ack.flags & ACK_JETSTREAM != 0);
    let body = match &awaited {
        Some(awaited) => with_await(&body, awaited),
        None => body,
    };
    let routes = broker.tenant(tenant);
    let message = Message {
        subject: address,
        reply: None,
        headers: None,
        payload: &body,
        ..Message::default()
    };
    broker.route(&routes, None, &message, scratch, wakes);
}

/// An ack's JSON with what its groups did, as `await`.
fn with_await(body: &[u8], awaited: &AwaitOutcome) -> Bytes {
    let Ok(serde_json::Value::Object(mut ack)) = serde_json::from_slice(body) else {
        return Bytes::copy_from_slice(body);
    };
    ack.insert("await".into(), awaited.to_json());
    Bytes::from(serde_json::Value::Object(ack).to_string())
}

/// The error ack of a publish whose `Nats-Expected-Stream` is not its subject's
/// stream, as nats-server words it.
pub fn wrong_stream_body(stream: &str) -> Bytes {
    Bytes::from(
        json!({"error": {"code": 400, "err_code": 10060, "description": "expected stream does not match"}, "stream": stream})
            .to_string(),
    )
}

/// The error ack of a publish larger than its stream's `max_msg_size` (a KV bucket's
/// `max_value_size`), as nats-server words it.
pub fn too_large_body(stream: &str) -> Bytes {
    Bytes::from(
        json!({"error": {"code": 400, "err_code": 10054, "description": "message size exceeds maximum allowed"}, "stream": stream})
            .to_string(),
    )
}

/// The error ack of a publish whose Canopy-* or Nats-* headers cannot be used, or
/// whose schema refuses it: JetStream's bad request (`err_code` 10003), from the
/// subject's stream.
pub fn bad_request_body(stream: &str, reason: &str) -> Bytes {
    Bytes::from(
        json!({"error": {"code": 400, "err_code": 10003, "description": reason}, "stream": stream})
            .to_string(),
    )
}

/// The JSON an ack carries: JetStream's PubAck (`stream`: the declared stream holding
/// the subject, or the tenant's own; `seq`, `duplicate`) with Canopy's `subject` and
/// `version`; errors in JetStream's `{"error": {...}}` shape.
pub fn ack_body(tenant: &str, outcome: &AppendOutcome, jetstream: bool) -> Bytes {
    let value = match outcome {
        AppendOutcome::Stored {
            subject,
            version,
            offset,
            count,
        } => {
            let mut ack =
                json!({"stream": tenant, "seq": offset, "subject": &**subject, "version": version});
            if *count > 1 {
                ack["count"] = json!(count);
            }
            ack
        }
        AppendOutcome::Duplicate {
            subject,
            version,
            offset,
        } => {
            json!({"stream": tenant, "seq": offset, "subject": &**subject, "version": version, "duplicate": true})
        }
        AppendOutcome::Conflict {
            subject,
            expected,
            current_version,
            current_offset,
        } => match (expected, jetstream) {
            (Expectation::LastOffset(_) | Expectation::StreamOffset(_), _) | (_, true) => json!({
                "error": {"code": 400, "err_code": 10071, "description": format!("wrong last sequence: {current_offset}")},
                "stream": tenant,
                "subject": &**subject,
                "current_version": current_version,
            }),
            (Expectation::Version(expected), false) => json!({
                "error": {
                    "code": 409,
                    "err_code": 10071,
                    "description": format!(
                        "wrong expected version {expected}: {subject} is at version {current_version}"
                    ),
                },
                "stream": tenant,
                "subject": &**subject,
                "current_version": current_version,
            }),
        },
        AppendOutcome::Failed { reason } => json!({
            "error": {"code": 503, "description": reason},
            "stream": tenant,
        }),
        // JetStream's own "resource limits exceeded for account" code.
        AppendOutcome::QuotaExceeded { reason } => json!({
            "error": {"code": 400, "err_code": 10047, "description": format!("quota exceeded: {reason}")},
            "stream": tenant,
        }),
    };
    Bytes::from(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_policy_decides() {
        let policies = Policies::new(&crate::config::StoreConfig::default().policies)
            .expect("default policies parse");
        assert!(policies.for_subject("orders.1").is_some());
        assert!(policies.for_subject("_INBOX.abc.1").is_none());
        assert!(policies.for_subject("$CANOPY.x").is_none());
    }

    #[test]
    fn store_headers_are_read_and_bad_ones_refused() {
        let block = b"NATS/1.0\r\nCanopy-Expected-Version: 3\r\nCanopy-Msg-Id: a1\r\n\r\n";
        let request = StoreRequest::from_headers(block).expect("valid");
        assert_eq!(request.expect, Some(Expectation::Version(3)));
        assert_eq!(request.msg_id.as_deref(), Some("a1"));
        assert!(!request.jetstream);
        let js = StoreRequest::from_headers(
            b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 9\r\n\r\n",
        )
        .expect("valid");
        assert_eq!(js.expect, Some(Expectation::LastOffset(9)));
        assert!(js.jetstream);
        // An empty block (HPUB with `<#hdr>` 0, as nats.js sends) asks nothing of the store.
        assert_eq!(StoreRequest::from_headers(b""), Ok(StoreRequest::default()));
        let bad = StoreRequest::from_headers(b"NATS/1.0\r\nCanopy-Expected-Version: x\r\n\r\n");
        assert!(bad.expect_err("refused").0.contains("whole number"));

        let waits = StoreRequest::from_headers(
            b"NATS/1.0\r\nCanopy-Await: billing,search\r\nCanopy-Await-Timeout: 2s\r\n\r\n",
        )
        .expect("valid");
        let awaiting = waits.awaiting.as_deref().expect("awaits");
        assert_eq!(awaiting.groups, vec!["billing".into(), "search".into()]);
        assert_eq!(awaiting.timeout, std::time::Duration::from_secs(2));
        let policy = StorePolicy::default();
        assert!(waits.wants_ack(&policy), "a wait is answered");
        let lone = StoreRequest::from_headers(b"NATS/1.0\r\nCanopy-Await-Timeout: 2s\r\n\r\n");
        assert!(lone.expect_err("refused").0.contains("needs Canopy-Await"));
    }

    #[test]
    fn rollups_of_a_subject_are_read_and_the_rest_refused_not_ignored() {
        let sub = StoreRequest::from_headers(b"NATS/1.0\r\nNats-Rollup: sub\r\n\r\n");
        assert!(sub.is_ok_and(|r| r.rollup && r.jetstream));
        for header in ["Nats-Rollup: all", "Nats-Rollup: nope", "Nats-TTL: 5s"] {
            let block = format!("NATS/1.0\r\n{header}\r\n\r\n");
            let refused = StoreRequest::from_headers(block.as_bytes()).expect_err(header);
            assert!(
                refused.0.contains("not offered") || refused.0.contains("invalid"),
                "{header}: {refused}"
            );
        }
    }

    #[test]
    fn acks_have_jetstreams_shape() {
        let stored = AppendOutcome::Stored {
            subject: Arc::from("a.b"),
            version: 2,
            offset: 10,
            count: 1,
        };
        let body: serde_json::Value =
            serde_json::from_slice(&ack_body("default", &stored, false)).expect("json");
        assert_eq!(body["stream"], "default");
        assert_eq!(body["seq"], 10);
        assert_eq!(body["version"], 2);
        let conflict = AppendOutcome::Conflict {
            subject: Arc::from("a.b"),
            expected: Expectation::LastOffset(3),
            current_version: 2,
            current_offset: 10,
        };
        let body: serde_json::Value =
            serde_json::from_slice(&ack_body("default", &conflict, true)).expect("json");
        assert_eq!(body["error"]["err_code"], 10071);
        assert_eq!(body["error"]["description"], "wrong last sequence: 10");
    }
}
