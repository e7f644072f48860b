//! The one publish decision: ordered stages that every publish goes through,
//! whoever sends it (a client's frame on any front end, an MQTT will, an answer
//! forwarded to an MQTT 5 response topic) and each message of a `$CANOPY.append`.
//!
//! The stages, in this order (`stages.rs`, each a small function with its own tests):
//!
//! 1. **subject**: syntax and the subject limits (a JetStream call's as a pattern);
//! 2. **call**: on the native protocol a `$CANOPY.` or `$JS.` publish is an API call,
//!    held to the caller's rights and to where its answers may go, and nothing more;
//! 3. **namespace**: the server's namespaces are no client's (`namespaces.rs`);
//! 4. **rights**: the user's publish rules;
//! 5. **size**: headers plus payload against `max_payload`;
//! 6. **answer**: where the store may answer a stored publish (its reply subject);
//! 7. **validators**: the subject's schema (plugins will be the next validators);
//! 8. **store policy**: the subject's policy and what its headers ask of the store;
//! 9. **stored bytes**: the tenant's stored-bytes limit;
//! 10. **quota**: the rate quotas, last, so a refused publish spends no token.
//!
//! A decision says where the publish goes; the session carries it out. This module
//! must never touch a socket, route a message or write to the store.

mod namespaces;
mod stages;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_subjects::Limits;

use crate::broker::durable::StoreRequest;
use crate::broker::{Broker, Tenant};
use crate::config::StorePolicy;
use crate::schemas::{Binding, Violation};
use crate::store::AckTo;
use crate::tenancy::quota::Exceeded;
use crate::tenancy::{Denied, Principal};

pub use namespaces::{API_PREFIX, JS_API_PREFIX, is_api_call, is_jetstream_call, is_reserved};
pub use stages::AppendRefusal;

/// The limits every front end applies the same way.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub subjects: Limits,
    /// A message's header bytes plus payload bytes, on every front end.
    pub max_payload: usize,
    /// Subscriptions one connection may hold (0: no limit besides the tenant's).
    pub max_subscriptions: usize,
}

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
    /// `Nats-Expected-Stream` names another stream than the one holding the subject.
    #[error(
        "expected stream does not match: {} is in stream {}, not {}",
        .0.subject, .0.actual, .0.expected
    )]
    WrongStream(Box<StreamMismatch>),
    /// A plugin bound to its subject refused it (or failed, and refuses on error).
    #[error("{0}")]
    Plugin(String),
    /// Larger than the `max_msg_size` of the stream holding its subject.
    #[error(
        "message size exceeds maximum allowed: {} bytes of headers and payload, stream {} \
         takes at most {}",
        .0.size, .0.stream, .0.limit
    )]
    TooLargeForStream(Box<StreamTooLarge>),
    /// The payload does not match the schema bound to its subject.
    #[error("the message does not match schema {} at {}", .0.schema, .0.violation)]
    Invalid(Box<Invalid>),
}

/// A publish's subject and the stream holding it, against the one it expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMismatch {
    pub subject: String,
    pub expected: String,
    pub actual: String,
}

/// A publish larger than its subject's stream takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTooLarge {
    pub stream: String,
    pub size: usize,
    pub limit: u64,
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
    pub(crate) route: Route<'p>,
    /// Counted against the tenant's rates (API calls are not).
    pub charged: bool,
    /// Throttled: the client waits this long before the next read.
    pub throttled: Option<Duration>,
}

pub(crate) enum Route<'p> {
    /// An API call: spawned, answered on its reply subject.
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
    pub routes: Arc<Tenant>,
    pub principal: Principal,
    pub limits: Arc<SessionLimits>,
    /// The publishing connection (for no-local and no-echo).
    pub origin: u64,
    /// The publishing connection's outbox, which the routing of its stored messages
    /// tells when a subscriber they reach falls behind (none for publishes made on a
    /// connection's behalf after it is gone).
    pub feedback: Option<crate::store::AckCargo>,
    /// The client's own buckets of its tenant's per-client pattern rates (its wills
    /// share them).
    pub client_rates: Arc<crate::tenancy::pattern_rates::ClientRates>,
}

impl Publisher {
    pub fn new(
        broker: Arc<Broker>,
        routes: Arc<Tenant>,
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
            feedback: None,
            client_rates: Arc::default(),
        }
    }

    /// The versions of `subject` an append keeps under `policy`: the policy's limit,
    /// or the declared stream's `max_msgs_per_subject` when that is stricter.
    pub fn version_limit(&self, policy: &crate::config::StorePolicy, subject: &str) -> u64 {
        match self.routes.streams.for_subject(subject) {
            Some(stream) => crate::streams::stricter(policy.max_versions, stream.max_versions),
            None => policy.max_versions,
        }
    }

    /// How `subject` is stored, if it is: as the first store policy matching it says,
    /// or, for a subject a declared stream holds that no policy matches (`$KV.`
    /// subjects, which `>` does not reach), the stream's own: stored, durable, acked
    /// whenever a reply is given, as a JetStream stream acks. A policy that keeps a
    /// subject live only is the operator's, and a stream does not override it.
    pub fn store_policy(&self, subject: &str) -> Option<&crate::config::StorePolicy> {
        static STREAM_POLICY: std::sync::LazyLock<crate::config::StorePolicy> =
            std::sync::LazyLock::new(|| crate::config::StorePolicy {
                ack: crate::config::AckMode::Always,
                max_age_secs: 0,
                ..crate::config::StorePolicy::default()
            });
        if self.broker.has_policy_for(subject) {
            return self.broker.store_policy(subject);
        }
        (self.broker.stores_messages() && self.routes.streams.for_subject(subject).is_some())
            .then(|| &*STREAM_POLICY)
    }
}
