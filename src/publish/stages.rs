//! The stages of the publish decision, one function each, in the order
//! [`Publisher::decide`] runs them (the module above lists them and why this order).
//! `$CANOPY.append` runs the same stages through [`Publisher::decide_append`]: the
//! subject's once, a message's for each message, the quota once for all of them.

use std::sync::Arc;

use bytes::Bytes;
use canopy_subjects::validate_native_subject;

use super::namespaces::{JS_API_PREFIX, is_api_call, is_reserved};
use super::{
    Admission, AskAck, Decision, Invalid, Publish, Publisher, Refusal, Route, StreamMismatch,
    StreamTooLarge,
};
use crate::broker::durable::StoreRequest;
use crate::config::StorePolicy;
use crate::plugins::Outcome;
use crate::schemas::registry::RecentError;
use crate::schemas::{Binding, OnInvalid, Violation};
use crate::store::NewMessage;
use crate::tenancy::{Action, Denied};

/// What the subject's schema made of a payload.
enum Checked {
    Unbound,
    Valid(Arc<Binding>),
    DeadLetter(Arc<Binding>, Violation),
}

/// Why an append was refused: nothing of it was stored or charged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendRefusal {
    #[error("{0} is not stored by any store policy")]
    NotStored(String),
    #[error("an append needs at least one message")]
    Empty,
    /// The subject's stages refused it, or the quota refused the whole append.
    #[error("{0}")]
    Refused(Refusal),
    /// One message's stages refused it.
    #[error("{}", message_refusal(*.index, .refusal))]
    Message { index: usize, refusal: Refusal },
}

fn message_refusal(index: usize, refusal: &Refusal) -> String {
    match refusal {
        Refusal::Invalid(invalid) => format!(
            "message {index} does not match schema {} at {}; nothing was appended",
            invalid.schema, invalid.violation
        ),
        other => format!("message {index}: {other}; nothing was appended"),
    }
}

impl Publisher {
    /// Stage 4½, before the decision proper: the tenant's publish plugins on a message
    /// the publisher may send (its subject, namespace, rights and size checked first,
    /// so no plugin sees what would be refused anyway). `None`: no plugin applies
    /// (an API call never has one). What they make of it is then decided message by
    /// message ([`Publisher::decide`]), so a new subject is held to the rights too.
    pub fn run_plugins(&self, publish: &Publish<'_>) -> Result<Option<Outcome>, Refusal> {
        if !self.routes.plugins.any() {
            return Ok(None);
        }
        self.stage_subject(publish)?;
        if publish.api_calls && is_api_call(publish.subject).is_some() {
            return Ok(None);
        }
        stage_namespace(publish.subject)?;
        self.stage_rights(publish.subject)?;
        self.stage_size(publish.size())?;
        // A dropped publish may still be answered there.
        self.stage_answer(publish, self.store_policy(publish.subject).is_some())?;
        // Over the tenant's rate: refused as the decision would, before any plugin
        // spends time on it. (One that can only be held back runs them, then waits.)
        if publish.admission == Admission::Refusable {
            self.routes
                .quota
                .would_admit(publish.size())
                .map_err(Refusal::OverQuota)?;
        }
        let outcome =
            self.routes
                .plugins
                .on_publish(publish.subject, &publish.headers, &publish.payload);
        match outcome {
            Outcome::Unchanged => Ok(None),
            Outcome::Rejected(why) => Err(Refusal::Plugin(why)),
            outcome => Ok(Some(outcome)),
        }
    }

    /// Decides `publish` without carrying it out: every stage in order.
    #[inline]
    pub fn decide(&self, publish: &Publish<'_>) -> Result<Decision<'_>, Refusal> {
        self.stage_subject(publish)?;
        if let Some(call) = self.stage_call(publish)? {
            return Ok(call);
        }
        let subject = publish.subject;
        stage_namespace(subject)?;
        self.stage_rights(subject)?;
        let size = publish.size();
        self.stage_size(size)?;
        let policy = self.store_policy(subject);
        self.stage_answer(publish, policy.is_some())?;
        let checked = self.stage_validators(publish)?;
        let request = self.stage_store_policy(publish, policy.is_some())?;
        let stored = policy.is_some() || matches!(checked, Checked::DeadLetter(..));
        if stored {
            self.stage_stored_bytes()?;
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
        let throttled = self.stage_quota(publish.admission, subject, 1, size)?;
        Ok(Decision {
            route,
            charged: true,
            throttled,
        })
    }

    /// Decides an append of `messages` to the stored `subject`, all or none, through
    /// the same stages as a publish: the subject's (syntax, namespace, rights, a store
    /// policy, the stored-bytes limit) once, the size and the validators for each
    /// message (which a valid schema stamps, and whose client-set schema header is
    /// dropped), then the quota once for all of them, so a refused append spends no
    /// token. The caller counts what was admitted.
    pub fn decide_append(
        &self,
        subject: &str,
        messages: &mut [NewMessage],
    ) -> Result<&StorePolicy, AppendRefusal> {
        let refused = AppendRefusal::Refused;
        validate_native_subject(subject, &self.limits.subjects)
            .map_err(|e| refused(Refusal::InvalidSubject(e.to_string())))?;
        stage_namespace(subject).map_err(refused)?;
        self.stage_rights(subject).map_err(refused)?;
        let Some(policy) = self.store_policy(subject) else {
            return Err(AppendRefusal::NotStored(subject.to_owned()));
        };
        if messages.is_empty() {
            return Err(AppendRefusal::Empty);
        }
        let binding = self.routes.schemas.for_subject(subject);
        let mut total = 0;
        for (index, message) in messages.iter_mut().enumerate() {
            let at = |refusal| AppendRefusal::Message { index, refusal };
            self.plug_appended(subject, message).map_err(at)?;
            let size = message.headers.len() + message.payload.len();
            self.stage_size(size).map_err(at)?;
            message.headers = match &binding {
                // An append is all or nothing: an invalid message refuses it whole,
                // whatever the binding does with a single invalid publish.
                Some(binding) => {
                    if let Err(violation) = binding.check(&message.payload) {
                        self.remember_invalid(subject, binding, &violation, false);
                        return Err(at(Refusal::Invalid(Box::new(Invalid {
                            schema: binding.reference(),
                            violation,
                        }))));
                    }
                    binding.stamp(&message.headers)
                }
                None if message.headers.is_empty() => Bytes::new(),
                None => crate::schemas::strip_schema_header(&message.headers),
            };
            total += message.headers.len() + message.payload.len();
        }
        self.stage_stored_bytes().map_err(refused)?;
        self.stage_quota(Admission::Refusable, subject, messages.len(), total)
            .map_err(refused)?;
        Ok(policy)
    }

    /// An appended message through the tenant's publish plugins, as any publish: a
    /// rejection refuses the append, a transform on the same subject stands in for the
    /// message; a drop or a fan-out cannot be carried by an append (all or nothing,
    /// one subject, expected versions), so it refuses it too.
    fn plug_appended(&self, subject: &str, message: &mut NewMessage) -> Result<(), Refusal> {
        if !self.routes.plugins.any() {
            return Ok(());
        }
        match self
            .routes
            .plugins
            .on_publish(subject, &message.headers, &message.payload)
        {
            Outcome::Unchanged => Ok(()),
            Outcome::Rejected(why) => Err(Refusal::Plugin(why)),
            Outcome::Replaced(mut made) if made.len() == 1 && made[0].subject == subject => {
                let one = made.swap_remove(0);
                (message.headers, message.payload) = (one.headers, one.payload);
                Ok(())
            }
            Outcome::Dropped | Outcome::Replaced(_) => Err(Refusal::Plugin(format!(
                "a publish plugin drops this message or makes others of it, which an append \
                 to {subject} (all or nothing, one subject) cannot carry: publish it instead"
            ))),
        }
    }

    /// Stage 1: the subject's syntax and limits, unless the front end parsed it within the
    /// same limits. A JetStream call may end in a filter with wildcards
    /// (`$JS.API.CONSUMER.CREATE.<stream>.<name>.orders.>`): it is checked as a pattern.
    /// An ack (`$JS.ACK.…`, one per delivered message) is a plain subject.
    fn stage_subject(&self, publish: &Publish<'_>) -> Result<(), Refusal> {
        let subject = publish.subject;
        if publish.api_calls && subject.starts_with(JS_API_PREFIX) {
            canopy_subjects::Pattern::parse_native(subject)
                .map(drop)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))
        } else if publish.subject_checked {
            Ok(())
        } else {
            validate_native_subject(subject, &self.limits.subjects)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))
        }
    }

    /// Stage 2: an API call (native calls only): the caller's rights, and where its answers
    /// may go; it is then decided, neither routed nor stored nor charged.
    fn stage_call(&self, publish: &Publish<'_>) -> Result<Option<Decision<'_>>, Refusal> {
        if !publish.api_calls || is_api_call(publish.subject).is_none() {
            return Ok(None);
        }
        self.stage_rights(publish.subject)?;
        if let Some(reply) = &publish.reply {
            self.check_answer_to(reply, true)?;
        }
        Ok(Some(Decision {
            route: Route::Call,
            charged: false,
            throttled: None,
        }))
    }

    /// Stage 4: the user's publish rules.
    fn stage_rights(&self, subject: &str) -> Result<(), Refusal> {
        self.broker
            .authorizer()
            .authorize(&self.principal, Action::Publish, subject)
            .map_err(Refusal::Denied)
    }

    /// Stage 5: headers plus payload against `max_payload`.
    fn stage_size(&self, size: usize) -> Result<(), Refusal> {
        check_size(size, self.limits.max_payload)
    }

    /// Stage 6: the store may answer a publish to a stored subject on its reply subject (a
    /// PubAck, an error ack, an await's outcome, a refusal): that answer is the
    /// caller's to send, so it is checked before anything can be refused.
    fn stage_answer(&self, publish: &Publish<'_>, stored: bool) -> Result<(), Refusal> {
        match &publish.reply {
            Some(reply) if stored && matches!(publish.ack, AskAck::Reply) => {
                self.check_answer_to(reply, false)
            }
            _ => Ok(()),
        }
    }

    /// Stage 7: the validators: the payload against the schema bound to its subject, if
    /// any: refused (and remembered for the console) when invalid, unless the binding
    /// keeps invalid messages as dead letters and a store is open.
    #[inline]
    fn stage_validators(&self, publish: &Publish<'_>) -> Result<Checked, Refusal> {
        let Some(binding) = self.routes.schemas.for_subject(publish.subject) else {
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
            && self.broker.stores_messages()
            && validate_native_subject(
                &binding.dead_letter_subject(publish.subject),
                &self.limits.subjects,
            )
            .is_ok();
        self.remember_invalid(publish.subject, &binding, &violation, keep);
        if keep {
            return Ok(Checked::DeadLetter(binding, violation));
        }
        Err(Refusal::Invalid(Box::new(Invalid {
            schema: binding.reference(),
            violation,
        })))
    }

    /// Stage 8: what a stored publish's headers ask of the store (`Canopy-*`, `Nats-*`);
    /// a `Canopy-Await` tells only of groups the publisher may read.
    fn stage_store_policy(
        &self,
        publish: &Publish<'_>,
        stored: bool,
    ) -> Result<StoreRequest, Refusal> {
        let mut request = if stored && !publish.headers.is_empty() {
            StoreRequest::from_headers(&publish.headers).map_err(|bad| Refusal::BadHeader(bad.0))?
        } else {
            StoreRequest::default()
        };
        if let Some(expected) = &request.expected_stream {
            let actual = self.routes.stream_of(publish.subject);
            if **expected != *actual {
                return Err(Refusal::WrongStream(Box::new(StreamMismatch {
                    subject: publish.subject.to_owned(),
                    expected: expected.to_string(),
                    actual: actual.to_string(),
                })));
            }
        }
        let stream = self.routes.streams.for_subject(publish.subject);
        let size = publish.headers.len() + publish.payload.len();
        if let Some(stream) = &stream
            && stream.too_large(size)
        {
            return Err(Refusal::TooLargeForStream(Box::new(StreamTooLarge {
                stream: stream.name.to_string(),
                size,
                limit: stream.max_msg_size,
            })));
        }
        if request.rollup && !stream.is_some_and(|stream| stream.allow_rollup) {
            return Err(Refusal::BadHeader(
                "rollup not permitted: the subject's stream does not allow Nats-Rollup \
                 (allow_rollup_hdrs)"
                    .into(),
            ));
        }
        if request.rollup && publish.reply.is_none() {
            // The older versions are purged between storing and acknowledging it.
            return Err(Refusal::BadHeader(
                "Nats-Rollup needs a reply subject: the rollup is acknowledged once the \
                 versions before it are purged"
                    .into(),
            ));
        }
        if let Some(awaiting) = &mut request.awaiting {
            use crate::groups::awaiting::{Await, Caller};
            let authz = Arc::clone(self.broker.authorizer());
            let caller = Caller::new(self.principal.clone(), authz, self.origin);
            Await::waited_by(awaiting, caller);
        }
        Ok(request)
    }

    /// Stage 9: the tenant's stored-bytes limit, for what would be stored.
    fn stage_stored_bytes(&self) -> Result<(), Refusal> {
        let full = self
            .broker
            .store()
            .is_some_and(|store| store.at_bytes_limit(&self.routes.name));
        if full {
            return Err(Refusal::OverQuota(
                self.routes.quota.stored_bytes_exceeded(),
            ));
        }
        Ok(())
    }

    /// Stage 10: the rate quotas for `count` messages of `bytes` in all: refused, or, for a
    /// publish that cannot be refused, taken into debt with how long to hold back.
    fn stage_quota(
        &self,
        admission: Admission,
        subject: &str,
        count: usize,
        bytes: usize,
    ) -> Result<Option<std::time::Duration>, Refusal> {
        let quota = &self.routes.quota;
        match admission {
            Admission::Refusable => quota
                .admit_publishes_to(subject, &self.client_rates, count, bytes)
                .map(|()| None)
                .map_err(Refusal::OverQuota),
            Admission::Throttled => {
                Ok(quota.throttle_publish_to(subject, &self.client_rates, bytes))
            }
        }
    }

    /// Remembers a schema's refusal for the console.
    fn remember_invalid(
        &self,
        subject: &str,
        binding: &Binding,
        violation: &Violation,
        dead_lettered: bool,
    ) {
        self.routes.schemas.record_error(RecentError {
            subject: subject.to_owned(),
            schema: binding.reference(),
            violation: violation.clone(),
            time_ms: self.broker.clock().now_ms(),
            dead_lettered,
        });
    }

    /// Whether this principal may publish to `subject` at all (its syntax, the
    /// server's namespaces, the rules): what a will topic or a response topic is
    /// held to before anything is published there on the client's behalf.
    pub fn check_target(&self, subject: &str) -> Result<(), Refusal> {
        validate_native_subject(subject, &self.limits.subjects)
            .map_err(|e| Refusal::InvalidSubject(e.to_string()))?;
        stage_namespace(subject)?;
        self.stage_rights(subject)
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
                    || (self.store_policy(reply).is_none()
                        && self.routes.schemas.for_subject(reply).is_none()) =>
            {
                return Ok(());
            }
            Ok(()) => Refusal::Denied(Denied::Publish(reply.to_owned())),
            Err(refused) => refused,
        };
        // Checked second: the claims are the tenant's, behind a lock.
        let own = crate::broker::inbox_owner(reply)
            .is_some_and(|owner| self.routes.inboxes.holds(owner, self.origin));
        if own { Ok(()) } else { Err(refused) }
    }
}

/// Stage 3: the server's namespaces are no client's.
fn stage_namespace(subject: &str) -> Result<(), Refusal> {
    if is_reserved(subject) {
        return Err(Refusal::Reserved(subject.to_owned()));
    }
    Ok(())
}

fn check_size(size: usize, limit: usize) -> Result<(), Refusal> {
    if size > limit {
        return Err(Refusal::TooLarge { size, limit });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_stage_refuses_the_servers_subjects_only() {
        for subject in ["$CANOPY.get", "$JS.API.INFO", "$SYS.x", "$DLQ.g.s"] {
            assert_eq!(
                stage_namespace(subject),
                Err(Refusal::Reserved(subject.to_owned()))
            );
        }
        for subject in ["orders.1", "$foo", "_INBOX.a.b"] {
            assert_eq!(stage_namespace(subject), Ok(()));
        }
    }

    #[test]
    fn the_size_stage_counts_headers_and_payload_against_the_limit() {
        assert_eq!(check_size(10, 10), Ok(()));
        assert_eq!(
            check_size(11, 10),
            Err(Refusal::TooLarge {
                size: 11,
                limit: 10
            })
        );
    }

    #[test]
    fn an_append_refusal_names_the_message() {
        let refusal = AppendRefusal::Message {
            index: 2,
            refusal: Refusal::TooLarge { size: 9, limit: 8 },
        };
        assert_eq!(
            refusal.to_string(),
            "message 2: message too large: 9 bytes of headers and payload, the limit is 8; \
             nothing was appended"
        );
    }
}
