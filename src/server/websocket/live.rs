//! A `/ws` connection's subscriptions: admitted by the client core, optionally
//! from stored history (a durable barrier, then pages of history while live
//! envelopes wait, bounded), and deliveries rendered once per message for every
//! subscriber (`server/rendered.rs`). Never reads the socket.

use super::*;

impl Connection {
    /// Subscribes live; with `from`, the stored history since then comes first and
    /// live messages follow without a gap or a repeat.
    pub(super) async fn subscribe(
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
                self.reply_error(id, refusal(ErrorCode::InvalidPattern, error.to_string()));
                return;
            }
        };
        let native = pattern.to_string();
        if from_snapshot && !pattern.is_literal() {
            self.reply_error(
                id,
                refusal(
                    ErrorCode::BadRequest,
                    "from_snapshot needs a single subject: snapshots are per subject",
                ),
            );
            return;
        }
        if let Err(refused) = self.session.admit_subscription(&native, &pattern, false) {
            let code = subscribe_code(&refused);
            self.reply_error(id, refusal(code, refused.to_string()));
            return;
        }
        let sid = self.next_sid;
        self.next_sid = self.next_sid.wrapping_add(1).max(1);
        let sub = self.subscribe_as(sid, pattern);
        let literal = sub.pattern.is_literal();
        let pattern = sub.pattern.clone();
        self.subs.insert(sid, sub);
        self.push(|out| ws::encode_subscribed(out, id, sid, &native));
        if from.is_none() {
            return;
        }
        // History under a deliver plugin is not read around it.
        if let Err(refused) = crate::api::plugins::unfiltered(self.session.routes(), &native) {
            self.reply_error(
                None,
                refusal(
                    ErrorCode::Forbidden,
                    format!("history of subscription {sid}: {}", refused.description),
                ),
            );
            return;
        }
        let Ok(store) = self.store() else {
            return;
        };
        let tenant = Arc::clone(&self.session.routes().name);
        if from_snapshot {
            match store.snapshot(&tenant, &native, None).await {
                Ok(Some(snapshot)) => {
                    self.push(|out| ws::encode_snapshot_first(out, sid, &snapshot_body(&snapshot)));
                    from = Some(ReplayFrom::Version(snapshot.version + 1));
                }
                Ok(None) => {}
                Err(error) => self.reply_error(
                    None,
                    refusal(
                        ErrorCode::Unavailable,
                        format!("snapshot of subscription {sid}: {error}"),
                    ),
                ),
            }
        }
        let Some(from) = from else {
            return;
        };
        let target = if literal {
            crate::follow::Target::Subject(native)
        } else {
            crate::follow::Target::Pattern(pattern)
        };
        // Live messages wait while the history is read; the follower's first read
        // passes a durability barrier, so it misses nothing routed before the
        // subscription went live.
        let follower = crate::follow::Follower::new(store, tenant, target, from)
            .pages_of(CATCH_UP_PAGE, REPLAY_BYTES)
            .behind_live_subscription();
        self.catchups.push_back(CatchUp {
            sid,
            follower,
            high: 0,
        });
    }

    /// Reads the next page of the oldest catch-up and queues it as `msg` texts; when
    /// it is done, the live messages held for it follow (those it already sent are
    /// dropped by offset). False when there is nothing to catch up.
    pub(super) async fn catch_up(&mut self) -> bool {
        let Some(catchup) = self.catchups.front_mut() else {
            return false;
        };
        let sid = catchup.sid;
        let page = catchup.follower.next().await;
        let done = match page {
            Ok(page) => {
                let mut high = 0;
                for message in &page.messages {
                    high = high.max(message.offset);
                    if !self.broker.authorizer().may_deliver(&message.subject) {
                        continue;
                    }
                    let delivery = ws::Delivery {
                        subject: &message.subject,
                        version: Some(message.version),
                        offset: Some(message.offset),
                        reply: None,
                        headers: &message.headers,
                        payload: &message.payload,
                    };
                    self.push(|out| ws::encode_msg(out, sid, &delivery));
                }
                if let Some(catchup) = self.catchups.front_mut() {
                    catchup.high = catchup.high.max(high);
                }
                page.caught_up
            }
            Err(error) => {
                self.reply_error(
                    None,
                    refusal(
                        ErrorCode::Unavailable,
                        format!("history of subscription {sid}: {error}"),
                    ),
                );
                true
            }
        };
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

    /// Turns queued envelopes into `msg` texts.
    pub(super) fn deliveries(&mut self) {
        // The outbox gets the spare buffer's capacity, so routing does not grow a
        // fresh buffer for every batch.
        let mut taken = std::mem::take(&mut self.spare);
        self.session.outbox.take(&mut taken);
        let whole = taken.freeze();
        let mut taken = whole.clone();
        while let Some(delivery) = envelope::decode(&mut taken) {
            if delivery.subscription_id == super::groups::GROUP_SID {
                self.group_answer(&delivery);
                continue;
            }
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

    /// Queues one delivery as a `msg` text: its head with the subscription id, and
    /// the tail every subscriber of the message shares, rendered once.
    pub(super) fn emit(&mut self, delivery: &envelope::Envelope) {
        let tail = self.context.rendered.tail(delivery, || {
            let stored = delivery.offset != 0;
            let out = ws::Delivery {
                subject: std::str::from_utf8(&delivery.subject).unwrap_or_default(),
                version: stored.then_some(delivery.version),
                offset: stored.then_some(delivery.offset),
                reply: std::str::from_utf8(&delivery.reply)
                    .ok()
                    .filter(|r| !r.is_empty()),
                headers: &delivery.headers,
                payload: &delivery.payload,
            };
            let mut tail = String::new();
            ws::encode_msg_tail(&mut tail, &out);
            Some(tail)
        });
        if let Some(tail) = tail {
            let sid = delivery.subscription_id;
            self.push(|out| ws::encode_msg_with_tail(out, sid, &tail));
        }
        self.broker
            .metrics()
            .count_out(1, (delivery.payload.len() + delivery.headers.len()) as u64);
    }

    /// Whether live messages held during catch-ups passed the outbox's bound.
    pub(super) fn holds_too_much(&self) -> bool {
        self.held_bytes > self.context.max_pending_bytes
    }
}
