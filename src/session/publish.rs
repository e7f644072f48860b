//! Carrying out a publish decision (`crate::publish`): spawning an API call, routing
//! now, or queuing an append for the sequencer, and the error ack a refused NATS
//! publish gets where it asked the store for one.
//!
//! This module carries out and hands over; it must never decide (that is
//! `crate::publish`'s) or touch a socket.

use std::sync::Arc;

use bytes::Bytes;

use crate::api;
use crate::broker::durable::{
    FLAG_NO_RESPONDERS, StoreRequest, ack_body, append_one, bad_request_body,
};
use crate::broker::{Message, Outbox, RouteScratch, Wakes};
use crate::config::StorePolicy;
use crate::publish::{
    AskAck, Decision, Publish, Published, Publisher, Refusal, Route, is_api_call,
};
use crate::schemas::{Binding, Violation};
use crate::store::{AckTo, AppendOutcome, AppendRequest, NewMessage, RouteTag};

impl Publisher {
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
        let dead_policy = self.store_policy(&subject);
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
                publisher: self.feedback.clone(),
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
            Route::Call => self.call(publish),
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
                // service answers); a JetStream publish the store answers with its
                // PubAck (and that only watchers see) when a declared stream holds the
                // subject, as in NATS; otherwise a request nobody answers, told so
                // (503) and not stored. Stored means acked.
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
                    if self.routes.streams.for_subject(publish.subject).is_none()
                        || self
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
                    publisher: self.feedback.clone(),
                };
                let message = NewMessage {
                    headers: publish.headers,
                    payload: publish.payload,
                    flags: publish.flags,
                };
                let ack = ack.map(|mut ack| {
                    if request.rollup {
                        ack.flags |= crate::broker::durable::ACK_ROLLUP;
                    }
                    ack
                });
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
                append.max_versions = self.version_limit(policy, publish.subject);
                appends.push(append);
                Published::Stored { acked }
            }
        }
    }

    /// Hands an API call to its own task.
    fn call(&self, publish: Publish<'_>) -> Published {
        let operation = is_api_call(publish.subject).unwrap_or_default();
        let call = api::ApiCall {
            principal: self.principal.clone(),
            routes: Arc::clone(&self.routes),
            limits: Arc::clone(&self.limits),
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

    /// The error ack a refused NATS publish gets on its reply subject when it asked
    /// the store for one (its headers or the subject's policy say so), as the store
    /// itself would answer: a bad Canopy header, or a quota. `None`: the refusal is
    /// the protocol's own error.
    pub fn error_answer(&self, publish: &Publish<'_>, refusal: &Refusal) -> Option<(Bytes, Bytes)> {
        let reply = publish
            .reply
            .clone()
            .filter(|_| matches!(publish.ack, AskAck::Reply))?;
        // Errors name the stream the subject is in, as its PubAck would.
        let tenant = &self.routes.stream_of(publish.subject);
        match refusal {
            Refusal::BadHeader(why) => Some((reply, bad_request_body(tenant, why))),
            Refusal::WrongStream(mismatch) => Some((
                reply,
                crate::broker::durable::wrong_stream_body(&mismatch.actual),
            )),
            Refusal::TooLargeForStream(too_large) => Some((
                reply,
                crate::broker::durable::too_large_body(&too_large.stream),
            )),
            // A publish that waits for the store (an ack asked for, or a JetStream
            // publish: a reply to a stored subject) hears its schema's or a plugin's
            // refusal there.
            Refusal::Invalid(_) | Refusal::Plugin(_) => {
                self.store_policy(publish.subject)?;
                Some((reply, bad_request_body(tenant, &refusal.to_string())))
            }
            Refusal::OverQuota(exceeded) => {
                let policy = self.store_policy(publish.subject)?;
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
    /// Like a connection's publishes it goes through the tenant's publish plugins
    /// first: each message they make is decided (all before any is carried out).
    pub async fn publish_detached(&self, publish: Publish<'_>) -> Result<Published, Refusal> {
        let made = match self.run_plugins(&publish)? {
            None | Some(crate::plugins::Outcome::Unchanged) => Vec::new(),
            Some(crate::plugins::Outcome::Dropped) => {
                return Ok(Published::Routed { delivered: 0 });
            }
            Some(crate::plugins::Outcome::Rejected(why)) => return Err(Refusal::Plugin(why)),
            Some(crate::plugins::Outcome::Replaced(made)) => made,
        };
        let mut decided = Vec::with_capacity(made.len().max(1));
        if made.is_empty() {
            decided.push((self.decide(&publish)?, publish));
        } else {
            for (i, message) in made.iter().enumerate() {
                let one = super::plugged::made_publish(&publish, i, message);
                decided.push((self.decide(&one)?, one));
            }
        }
        let mut scratch = RouteScratch::default();
        let mut wakes = Wakes::default();
        let mut appends = Vec::new();
        let mut first = None;
        for (decision, publish) in decided {
            if decision.charged {
                self.routes.quota.count_admitted(1, publish.size() as u64);
            }
            let published = self.carry_out(
                decision,
                publish,
                None,
                &mut scratch,
                &mut wakes,
                &mut appends,
            );
            first.get_or_insert(published);
        }
        let published = first.unwrap_or(Published::Routed { delivered: 0 });
        wakes.wake_all();
        for append in appends {
            if self.broker.append(append).await.is_err() {
                tracing::warn!(
                    "a message published for a closed connection was not stored: the store is closing"
                );
            }
        }
        Ok(published)
    }
}
