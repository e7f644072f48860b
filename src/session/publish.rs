//! The one decision every publish goes through, whoever sends it: a client's frame,
//! an MQTT will, an answer forwarded to an MQTT 5 response topic.
//!
//! Order matters and is the same everywhere: the subject's syntax and limits, the
//! API prefix (native calls only), the server's namespaces, the user's rules, the
//! size limit (headers plus payload), the subject's schema, the store policy and its
//! headers, the stored bytes limit, then the rate quotas (last, so a refused publish
//! spends no token).
//! This module decides and hands over; it must never touch a socket.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_subjects::validate_native_subject;

use crate::api;
use crate::broker::durable::{
    FLAG_NO_RESPONDERS, StoreRequest, ack_body, append_one, bad_request_body,
};
use crate::broker::{Broker, Message, Outbox, RouteScratch, TenantRoutes, Wakes};
use crate::config::StorePolicy;
use crate::schemas::registry::RecentError;
use crate::schemas::{Binding, OnInvalid, Violation};
use crate::store::{AckTo, AppendOutcome, AppendRequest, NewMessage, RouteTag};
use crate::tenancy::quota::Exceeded;
use crate::tenancy::{Action, Denied, Principal};

use super::SessionLimits;
use crate::api::{is_api_call, is_reserved};

/// How a refusal can reach the publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The protocol can say no (an error, an error ack, a reason code).
    Refusable,
    /// It cannot refuse without losing the message or acking it falsely (MQTT 3.x,
    /// QoS 0, a will): a rate quota takes it into debt and holds the client back.
    Throttled,
}

/// Who hears from the store about a stored publish.
#[derive(Debug, Clone)]
pub enum AskAck {
    /// No one.
    Nobody,
    /// The reply subject, when the policy or the headers ask for an ack (NATS and
    /// JetStream); otherwise the reply stays a plain reply subscribers may answer.
    Reply,
    /// This address, always.
    To(AckTo),
    /// The publishing connection's ack inbox under this number, always (MQTT QoS 1
    /// and 2, `/ws`); the address is made only when the publish is stored.
    Inbox(u16),
}

/// One publish, in native terms.
#[derive(Debug, Clone)]
pub struct Publish<'a> {
    /// Native rendering; validated here.
    pub subject: &'a str,
    pub reply: Option<Bytes>,
    /// The NATS header block; empty for none.
    pub headers: Bytes,
    pub payload: Bytes,
    /// Envelope flags: the MQTT QoS and RETAIN the message keeps.
    pub flags: u8,
    /// Keep as the subject's retained message (MQTT).
    pub retain: bool,
    pub ack: AskAck,
    pub admission: Admission,
    /// A `$CANOPY.<op>` publish is an API call (the native protocol only).
    pub api_calls: bool,
    /// The front end already parsed `subject` within the same limits (MQTT topics,
    /// `/ws` subjects), so it is not validated again.
    pub subject_checked: bool,
    /// Routing flags of the store's route tag (no echo, no responders).
    pub route_flags: u32,
}

impl<'a> Publish<'a> {
    /// A message with nothing but a subject and a payload, refusable, no ack.
    pub fn new(subject: &'a str, payload: Bytes) -> Self {
        Self {
            subject,
            reply: None,
            headers: Bytes::new(),
            payload,
            flags: 0,
            retain: false,
            ack: AskAck::Nobody,
            admission: Admission::Refusable,
            api_calls: false,
            subject_checked: false,
            route_flags: 0,
        }
    }

    /// Header and payload bytes: what every limit and quota counts.
    pub fn size(&self) -> usize {
        self.headers.len() + self.payload.len()
    }
}

/// Why a publish was not taken. Nothing refused was routed or stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("invalid subject: {0}")]
    InvalidSubject(String),
    #[error("{0} is reserved for the server")]
    Reserved(String),
    #[error("{0}")]
    Denied(Denied),
    #[error("message too large: {size} bytes of headers and payload, the limit is {limit}")]
    TooLarge { size: usize, limit: usize },
    /// A rate quota, or the stored bytes limit.
    #[error("{0}")]
    OverQuota(Exceeded),
    #[error("invalid Canopy header: {0}")]
    BadHeader(String),
    /// The payload does not match the schema bound to its subject.
    #[error("the message does not match schema {} at {}", .0.schema, .0.violation)]
    Invalid(Box<Invalid>),
}

/// A payload its subject's schema refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// `<pattern>@<version>`.
    pub schema: String,
    pub violation: Violation,
}

impl Refusal {
    /// How long the publisher should be held back, for a rate quota.
    pub fn wait(&self) -> Option<Duration> {
        match self {
            Refusal::OverQuota(exceeded) => exceeded.wait(),
            _ => None,
        }
    }
}

/// A publish that was not taken: why, and, for a NATS publish that asked the store
/// for an ack, the error ack its reply subject gets instead of a protocol error.
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    /// (reply subject, ack body) in the store's vocabulary (JetStream's when asked).
    pub answer: Option<(Bytes, Bytes)>,
}

/// What [`Publisher::decide`] found: where the publish goes, and what it costs.
pub struct Decision<'p> {
    route: Route<'p>,
    /// Counted against the tenant's rates (API calls are not).
    pub charged: bool,
    /// Throttled: the client waits this long before the next read.
    pub throttled: Option<Duration>,
}

enum Route<'p> {
    Call,
    /// Routed now; with the schema the payload was checked against, when one is bound.
    Live(Option<Arc<Binding>>),
    Store {
        policy: &'p StorePolicy,
        request: StoreRequest,
        /// The schema the payload was checked against, stamped on the message.
        schema: Option<Arc<Binding>>,
    },
    /// Its schema refused it and says to keep it under a dead-letter subject.
    DeadLetter {
        policy: Option<&'p StorePolicy>,
        request: StoreRequest,
        binding: Arc<Binding>,
        violation: Violation,
    },
}

/// What the subject's schema made of a payload.
enum Checked {
    Unbound,
    Valid(Arc<Binding>),
    DeadLetter(Arc<Binding>, Violation),
}

/// What became of a publish that was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// An API call, answered on its reply subject.
    Call,
    /// Not stored: delivered now to this many subscriptions.
    Routed { delivered: usize },
    /// Queued for the sequencer, which routes it; `acked` when the store will
    /// answer the ack address.
    Stored { acked: bool },
}

/// Who publishes and under what rules: what a connection's publishes share with the
/// messages published on its behalf after it is gone (a delayed will).
#[derive(Clone)]
pub struct Publisher {
    pub broker: Arc<Broker>,
    pub routes: Arc<TenantRoutes>,
    pub principal: Principal,
    pub limits: Arc<SessionLimits>,
    /// The publishing connection (for no-local and no-echo).
    pub origin: u64,
}

impl Publisher {
    pub fn new(
        broker: Arc<Broker>,
        routes: Arc<TenantRoutes>,
        principal: Principal,
        limits: Arc<SessionLimits>,
        origin: u64,
    ) -> Self {
        Self {
            broker,
            routes,
            principal,
            limits,
            origin,
        }
    }

    /// Whether this principal may publish to `subject` at all (its syntax, the
    /// server's namespaces, the rules): what a will topic or a response topic is
    /// held to before anything is published there on the client's behalf.
    pub fn check_target(&self, subject: &str) -> Result<(), Refusal> {
        validate_native_subject(subject, &self.limits.subjects)
            .map_err(|e| Refusal::InvalidSubject(e.to_string()))?;
        if is_reserved(subject) {
            return Err(Refusal::Reserved(subject.to_owned()));
        }
        self.broker
            .authorizer()
            .authorize(&self.principal, Action::Publish, subject)
            .map_err(Refusal::Denied)
    }

    /// Whether the server may answer this publisher on `reply` (an API answer, a
    /// PubAck, an await's outcome): an answer is a publish by the caller, so it goes
    /// only to the connection's own inbox or to a subject the caller may publish to.
    /// Otherwise anyone could make the server publish, in their name, what a stored
    /// message or an error says to a subject they may not publish to.
    ///
    /// An API call's answers are routed live, neither stored nor checked against a
    /// schema, and can carry a stream's messages (get, replay, group pulls), so with
    /// `calls` a reply subject that is stored or bound to a schema is refused too
    /// (unless it is the caller's own inbox): they must not reach a stream's
    /// subscribers as messages the stream never kept or its schema never saw. A
    /// publish's reply is held only to the caller's rights: a service may answer it
    /// there, and what the store itself sends is the publish's own ack.
    fn check_answer_to(&self, reply: &[u8], calls: bool) -> Result<(), Refusal> {
        let reply = std::str::from_utf8(reply)
            .map_err(|_| Refusal::InvalidSubject("the reply subject is not UTF-8".into()))?;
        let refused = match self.check_target(reply) {
            Ok(())
                if !calls
                    || (self.broker.store_policy(reply).is_none()
                        && self.routes.schemas.for_subject(reply).is_none()) =>
            {
                return Ok(());
            }
            Ok(()) => Refusal::Denied(Denied::Publish(reply.to_owned())),
            Err(refused) => refused,
        };
        // Checked second: the claims are the tenant's, behind a lock.
        let own = super::inbox::inbox_owner(reply)
            .is_some_and(|owner| self.routes.inboxes.holds(owner, self.origin));
        if own { Ok(()) } else { Err(refused) }
    }

    /// Decides `publish` without carrying it out.
    #[inline]
    pub fn decide(&self, publish: &Publish<'_>) -> Result<Decision<'_>, Refusal> {
        let subject = publish.subject;
        // A JetStream call may end in a filter with wildcards
        // (`$JS.API.CONSUMER.CREATE.<stream>.<name>.orders.>`): it is checked as a pattern.
        if publish.api_calls && crate::api::jetstream::is_call(subject) {
            canopy_subjects::Pattern::parse_native(subject)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))?;
        } else if !publish.subject_checked {
            validate_native_subject(subject, &self.limits.subjects)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))?;
        }
        let authz = self.broker.authorizer();
        if publish.api_calls && is_api_call(subject).is_some() {
            authz
                .authorize(&self.principal, Action::Publish, subject)
                .map_err(Refusal::Denied)?;
            if let Some(reply) = &publish.reply {
                self.check_answer_to(reply, true)?;
            }
            return Ok(Decision {
                route: Route::Call,
                charged: false,
                throttled: None,
            });
        }
        if is_reserved(subject) {
            return Err(Refusal::Reserved(subject.to_owned()));
        }
        authz
            .authorize(&self.principal, Action::Publish, subject)
            .map_err(Refusal::Denied)?;
        let size = publish.size();
        if size > self.limits.max_payload {
            return Err(Refusal::TooLarge {
                size,
                limit: self.limits.max_payload,
            });
        }
        let policy = self.broker.store_policy(subject);
        // The store may answer a publish to a stored subject on its reply subject (a
        // PubAck, an error ack, an await's outcome, a refusal): that answer is the
        // caller's to send, so it is checked before anything can be refused.
        if policy.is_some()
            && matches!(publish.ack, AskAck::Reply)
            && let Some(reply) = &publish.reply
        {
            self.check_answer_to(reply, false)?;
        }
        let checked = self.check_schema(publish)?;
        let mut request = match policy {
            Some(_) if !publish.headers.is_empty() => StoreRequest::from_headers(&publish.headers)
                .map_err(|bad| Refusal::BadHeader(bad.0))?,
            _ => StoreRequest::default(),
        };
        // `Canopy-Await` tells only of groups the publisher may read (issue 26).
        if let Some(awaiting) = &mut request.awaiting {
            use crate::groups::awaiting::{Await, Caller};
            let caller = Caller::new(self.principal.clone(), Arc::clone(authz), self.origin);
            Await::waited_by(awaiting, caller);
        }
        let stored = policy.is_some() || matches!(checked, Checked::DeadLetter(..));
        if stored
            && self
                .broker
                .store()
                .is_some_and(|store| store.at_bytes_limit(&self.routes.name))
        {
            return Err(Refusal::OverQuota(
                self.routes.quota.stored_bytes_exceeded(),
            ));
        }
        let route = match (checked, policy) {
            (Checked::DeadLetter(binding, violation), policy) => Route::DeadLetter {
                policy,
                request,
                binding,
                violation,
            },
            (checked, Some(policy)) => Route::Store {
                policy,
                request,
                schema: match checked {
                    Checked::Valid(binding) => Some(binding),
                    _ => None,
                },
            },
            (Checked::Valid(binding), None) => Route::Live(Some(binding)),
            (_, None) => Route::Live(None),
        };
        let throttled = match publish.admission {
            Admission::Refusable => {
                self.routes
                    .quota
                    .admit_publish(size)
                    .map_err(Refusal::OverQuota)?;
                None
            }
            Admission::Throttled => self.routes.quota.throttle_publish(size),
        };
        Ok(Decision {
            route,
            charged: true,
            throttled,
        })
    }

    /// Checks the payload against the schema bound to its subject, if any: refused
    /// (and remembered for the console) when invalid, unless the binding keeps
    /// invalid messages as dead letters and a store is open.
    #[inline]
    fn check_schema(&self, publish: &Publish<'_>) -> Result<Checked, Refusal> {
        let schemas = &self.routes.schemas;
        let Some(binding) = schemas.for_subject(publish.subject) else {
            return Ok(Checked::Unbound);
        };
        // MQTT clears a retained message with an empty retained publish: a deletion,
        // not a document.
        if publish.retain && publish.payload.is_empty() {
            return Ok(Checked::Unbound);
        }
        let Err(violation) = binding.check(&publish.payload) else {
            return Ok(Checked::Valid(binding));
        };
        // A dead-letter subject longer than subjects may be is refused, not kept.
        let keep = binding.stored.on_invalid == OnInvalid::DeadLetter
            && self.broker.store().is_some()
            && validate_native_subject(
                &binding.dead_letter_subject(publish.subject),
                &self.limits.subjects,
            )
            .is_ok();
        schemas.record_error(RecentError {
            subject: publish.subject.to_owned(),
            schema: binding.reference(),
            violation: violation.clone(),
            time_ms: self.broker.clock().now_ms(),
            dead_lettered: keep,
        });
        if keep {
            return Ok(Checked::DeadLetter(binding, violation));
        }
        Err(Refusal::Invalid(Box::new(Invalid {
            schema: binding.reference(),
            violation,
        })))
    }

    /// Who hears from the store about a publish stored under `policy`: its ack
    /// address, if it asked for one.
    fn ack_address(&self, publish: &Publish<'_>, jetstream: bool) -> Option<AckTo> {
        match &publish.ack {
            AskAck::Nobody => None,
            AskAck::To(to) => Some(to.clone()),
            AskAck::Inbox(number) => Some(AckTo {
                address: crate::broker::envelope::ack_address(self.origin, *number),
                flags: crate::broker::durable::ACK_MQTT,
                cargo: None,
            }),
            AskAck::Reply => publish.reply.as_ref().map(|address| AckTo {
                address: address.clone(),
                flags: if jetstream {
                    crate::broker::durable::ACK_JETSTREAM
                } else {
                    0
                },
                cargo: None,
            }),
        }
    }

    /// Keeps a message its schema refused under the binding's dead-letter subject,
    /// with its own headers and why, acknowledged as its own subject would have
    /// been (a live subject's publish asked the store nothing, so it hears nothing).
    fn dead_letter(
        &self,
        publish: Publish<'_>,
        policy: Option<&StorePolicy>,
        request: StoreRequest,
        binding: &Binding,
        violation: &Violation,
        appends: &mut Vec<AppendRequest>,
    ) -> Published {
        let subject = binding.dead_letter_subject(publish.subject);
        let mut headers =
            canopy_protocols::native::HeaderMap::parse(&publish.headers).unwrap_or_default();
        headers
            .entries
            .retain(|(name, _)| !name.eq_ignore_ascii_case(crate::schemas::SCHEMA_HEADER));
        headers.insert(crate::schemas::SCHEMA_HEADER, binding.reference());
        headers.insert("Canopy-Dead-Subject", publish.subject.to_owned());
        headers.insert("Canopy-Dead-Reason", format!("schema: {violation}"));
        let mut block = bytes::BytesMut::new();
        headers.encode(&mut block);
        let ack = match (&publish.ack, policy) {
            (AskAck::Reply, None) => None,
            (AskAck::Reply, Some(policy)) => {
                self.ack_address(&publish, request.jetstream || !request.wants_ack(policy))
            }
            _ => self.ack_address(&publish, false),
        };
        let acked = ack.is_some();
        let dead_policy = self.broker.store_policy(&subject);
        appends.push(AppendRequest {
            tenant: Arc::clone(&self.routes.name),
            subject: Arc::from(subject),
            messages: vec![NewMessage {
                headers: block.freeze(),
                payload: publish.payload,
                flags: publish.flags,
            }],
            expect: None,
            msg_id: None,
            durability: crate::store::Durability::Durable,
            ack,
            route: RouteTag {
                origin: self.origin,
                flags: 0,
                reply: None,
            },
            compaction: dead_policy.and_then(StorePolicy::compaction),
            max_versions: dead_policy.map_or(0, |p| p.max_versions),
            retain: false,
        });
        Published::Stored { acked }
    }

    /// Routes a publish to the live subscribers now, with NATS's no-responders
    /// status for a request nobody received.
    fn route_live(
        &self,
        publish: Publish<'_>,
        outbox: Option<&Outbox>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> Published {
        let message = Message {
            subject: publish.subject,
            reply: publish.reply.as_deref(),
            headers: (!publish.headers.is_empty()).then_some(&publish.headers[..]),
            payload: &publish.payload,
            origin: self.origin,
            flags: publish.flags,
            ..Message::default()
        };
        let skip = outbox.filter(|o| !o.echo()).map(|o| o.conn_id);
        let delivered = self
            .broker
            .route(&self.routes, skip, &message, scratch, wakes);
        if delivered == 0
            && publish.route_flags & FLAG_NO_RESPONDERS != 0
            && let Some(reply) = publish.reply.as_deref()
        {
            self.broker
                .tell_no_responders(&self.routes, self.origin, reply, scratch, wakes);
        }
        Published::Routed { delivered }
    }

    /// Carries out a decision: spawns the call, routes now, or queues the append in
    /// `appends`. `outbox` is the publisher's (for no-echo), `None` when it is gone.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn carry_out(
        &self,
        decision: Decision<'_>,
        publish: Publish<'_>,
        outbox: Option<&Outbox>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
        appends: &mut Vec<AppendRequest>,
    ) -> Published {
        match decision.route {
            Route::Call => {
                let operation = is_api_call(publish.subject).unwrap_or_default();
                let call = api::ApiCall {
                    principal: self.principal.clone(),
                    routes: Arc::clone(&self.routes),
                    origin: self.origin,
                    operation: operation.to_owned(),
                    reply: publish
                        .reply
                        .as_deref()
                        .and_then(|r| std::str::from_utf8(r).ok())
                        .map(str::to_owned),
                    body: publish.payload,
                };
                api::spawn(Arc::clone(&self.broker), call);
                Published::Call
            }
            Route::Live(schema) => {
                // The header says the server checked it: a client's own never passes.
                let publish = match &schema {
                    Some(binding) => Publish {
                        headers: binding.stamp(&publish.headers),
                        ..publish
                    },
                    None if !publish.headers.is_empty() => Publish {
                        headers: crate::schemas::strip_schema_header(&publish.headers),
                        ..publish
                    },
                    None => publish,
                };
                self.route_live(publish, outbox, scratch, wakes)
            }
            Route::DeadLetter {
                policy,
                request,
                binding,
                violation,
            } => self.dead_letter(publish, policy, request, &binding, &violation, appends),
            Route::Store {
                policy,
                request,
                schema,
            } => {
                let to_reply = matches!(publish.ack, AskAck::Reply);
                // A request with no store headers to a stored subject: a service's
                // when one answers the subject (it is then not stored, and only the
                // service answers), otherwise a JetStream publish the store answers
                // with its PubAck (and that only watchers see). Stored means acked.
                let plain_request =
                    to_reply && publish.reply.is_some() && !request.wants_ack(policy);
                // The header says the server checked it: a client's own never passes.
                let headers = match &schema {
                    Some(binding) => binding.stamp(&publish.headers),
                    None if request.schema_header => {
                        crate::schemas::strip_schema_header(&publish.headers)
                    }
                    None => publish.headers.clone(),
                };
                let publish = Publish { headers, ..publish };
                if plain_request {
                    let skip = outbox.filter(|o| !o.echo()).map(|o| o.conn_id);
                    if self
                        .broker
                        .has_responder(&self.routes, publish.subject, skip)
                    {
                        return self.route_live(publish, outbox, scratch, wakes);
                    }
                }
                let ack = self.ack_address(&publish, request.jetstream || plain_request);
                let acked = ack.is_some();
                // The reply belongs to the ack when the store answers a publish that
                // asked for one; otherwise it is a request that subscribers may answer.
                // A JetStream publish keeps it for watchers, as NATS shows it, and
                // gets no no-responders status: the store answers it.
                let reply = if to_reply && acked && !plain_request {
                    None
                } else {
                    publish.reply
                };
                let flags = if plain_request {
                    publish.route_flags & !FLAG_NO_RESPONDERS
                } else {
                    publish.route_flags
                };
                let route = RouteTag {
                    origin: self.origin,
                    flags,
                    reply,
                };
                let message = NewMessage {
                    headers: publish.headers,
                    payload: publish.payload,
                    flags: publish.flags,
                };
                let mut append = append_one(
                    policy,
                    &self.routes.name,
                    publish.subject,
                    message,
                    request,
                    ack,
                    route,
                );
                append.retain = publish.retain;
                appends.push(append);
                Published::Stored { acked }
            }
        }
    }

    /// The error ack a refused NATS publish gets on its reply subject when it asked
    /// the store for one (its headers or the subject's policy say so), as the store
    /// itself would answer: a bad Canopy header, or a quota. `None`: the refusal is
    /// the protocol's own error.
    pub fn error_answer(&self, publish: &Publish<'_>, refusal: &Refusal) -> Option<(Bytes, Bytes)> {
        let reply = publish
            .reply
            .clone()
            .filter(|_| matches!(publish.ack, AskAck::Reply))?;
        let tenant = &self.routes.name;
        match refusal {
            Refusal::BadHeader(why) => Some((reply, bad_request_body(tenant, why))),
            // A publish that waits for the store (an ack asked for, or a JetStream
            // publish: a reply to a stored subject) hears its schema's refusal there.
            Refusal::Invalid(_) => {
                self.broker.store_policy(publish.subject)?;
                Some((reply, bad_request_body(tenant, &refusal.to_string())))
            }
            Refusal::OverQuota(exceeded) => {
                let policy = self.broker.store_policy(publish.subject)?;
                let request = if publish.headers.is_empty() {
                    StoreRequest::default()
                } else {
                    StoreRequest::from_headers(&publish.headers).ok()?
                };
                let outcome = AppendOutcome::QuotaExceeded {
                    reason: exceeded.to_string(),
                };
                request
                    .wants_ack(policy)
                    .then(|| (reply, ack_body(tenant, &outcome, request.jetstream)))
            }
            _ => None,
        }
    }

    /// Decides and carries out a publish made on the client's behalf once its
    /// connection is gone (a will): routed, or handed to the sequencer now.
    pub async fn publish_detached(&self, publish: Publish<'_>) -> Result<Published, Refusal> {
        let size = publish.size() as u64;
        let decision = self.decide(&publish)?;
        if decision.charged {
            self.routes.quota.count_admitted(1, size);
        }
        let mut scratch = RouteScratch::default();
        let mut wakes = Wakes::default();
        let mut appends = Vec::new();
        let published = self.carry_out(
            decision,
            publish,
            None,
            &mut scratch,
            &mut wakes,
            &mut appends,
        );
        wakes.wake_all();
        if let Some(store) = self.broker.store() {
            for append in appends {
                if store.append(append).await.is_err() {
                    tracing::warn!(
                        "a message published for a closed connection was not stored: the store is closing"
                    );
                }
            }
        }
        Ok(published)
    }
}
