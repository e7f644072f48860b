//! A publish the tenant's plugins changed (`crate::plugins`): dropped, or replaced by
//! the messages they made, each then decided and carried out as any publish is (so a
//! new subject is held to the publisher's rights, its stream's and schema's rules).
//! The first message keeps the publish's reply and ack; the others go without one.
//! All are decided before any is carried out: one refused refuses the publish.
//! Must never: run the plugins again on what they made, or ack a dropped publish as
//! stored.

use bytes::Bytes;

use super::{Outbox, Publish, Published, Refused, Session};
use crate::broker::Message;
use crate::broker::durable::StoreRequest;
use crate::plugins::{Emitted, Outcome};
use crate::publish::AskAck;

/// The `i`th message the plugins made of `publish`, as a publish of its own: the
/// first keeps the publish's reply and ack, the others go without one; none is a call
/// of the server's API (made with the publisher's rights: `$` subjects are refused).
pub(super) fn made_publish<'m>(publish: &Publish<'m>, i: usize, made: &'m Emitted) -> Publish<'m> {
    Publish {
        subject: &made.subject,
        headers: made.headers.clone(),
        payload: made.payload.clone(),
        reply: publish.reply.clone().filter(|_| i == 0),
        ack: if i == 0 {
            publish.ack.clone()
        } else {
            AskAck::Nobody
        },
        subject_checked: false,
        api_calls: false,
        ..publish.clone()
    }
}

impl Session {
    /// Carries out what the plugins made of `publish`.
    pub(super) fn publish_plugged(
        &mut self,
        publish: Publish<'_>,
        outcome: Outcome,
        taken: impl FnOnce(&Outbox),
    ) -> Result<Published, Refused> {
        let messages = match outcome {
            Outcome::Unchanged => vec![Emitted {
                subject: publish.subject.to_owned(),
                headers: publish.headers.clone(),
                payload: publish.payload.clone(),
            }],
            Outcome::Rejected(why) => {
                return Err(self.refused(&publish, crate::publish::Refusal::Plugin(why)));
            }
            Outcome::Dropped => {
                taken(&self.outbox);
                self.answer_dropped(&publish);
                return Ok(Published::Routed { delivered: 0 });
            }
            Outcome::Replaced(emitted) => emitted,
        };
        // Held apart, so each decision may borrow it while the session carries it out.
        let publisher = std::sync::Arc::clone(&self.publisher);
        let mut decided = Vec::with_capacity(messages.len());
        for (i, made) in messages.iter().enumerate() {
            let one = made_publish(&publish, i, made);
            // All or nothing: one refused message refuses the publish, so nothing
            // the publisher is told was taken goes missing.
            match publisher.decide(&one) {
                Ok(decision) => decided.push((one, decision)),
                Err(refusal) => {
                    let refusal = crate::publish::Refusal::Plugin(format!(
                        "a message a plugin made of it was refused: {refusal}"
                    ));
                    return Err(self.refused(&publish, refusal));
                }
            }
        }
        taken(&self.outbox);
        let mut first = None;
        for (one, decision) in decided {
            let published = self.carry_out_with(&publisher, decision, one);
            first.get_or_insert(published);
        }
        Ok(first.unwrap_or(Published::Routed { delivered: 0 }))
    }

    /// A dropped publish that waits for the store's ack gets one saying nothing was
    /// stored, so its publisher goes on (a JetStream client would wait otherwise).
    fn answer_dropped(&mut self, publish: &Publish<'_>) {
        let Some(reply) = &publish.reply else {
            return;
        };
        let Some(policy) = self.publisher.store_policy(publish.subject) else {
            return;
        };
        // As the store would answer: a JetStream publish, one asking for an ack, or
        // one to a declared stream's subject (not a plain request to a service).
        let asked = if publish.headers.is_empty() {
            StoreRequest::default().wants_ack(policy)
        } else {
            StoreRequest::from_headers(&publish.headers).is_ok_and(|r| r.wants_ack(policy))
        };
        let declared = self
            .publisher
            .routes
            .streams
            .for_subject(publish.subject)
            .is_some();
        if !matches!(publish.ack, AskAck::Reply) || !(asked || declared) {
            return;
        }
        let stream = self.publisher.routes.stream_of(publish.subject);
        let body = Bytes::from(
            serde_json::json!({"stream": &*stream, "seq": 0, "dropped": true}).to_string(),
        );
        let Ok(subject) = std::str::from_utf8(reply) else {
            return;
        };
        let message = Message {
            subject,
            payload: &body,
            ..Message::default()
        };
        // Woken with the rest of the batch's deliveries.
        let publisher = &self.publisher;
        let (scratch, wakes) = (&mut self.scratch, &mut self.wakes);
        publisher
            .broker
            .route(&publisher.routes, None, &message, scratch, wakes);
    }
}
