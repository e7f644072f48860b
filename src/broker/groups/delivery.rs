//! Handing messages out and what comes back of it: a pull's deliveries (from memory,
//! else from the store in one scan), their headers and ack subjects, a pull's end and
//! refusals, the waiting pulls, moved cursors written back and dead letters stored.
//! Must never decide which message goes to whom (the dispatcher does).

use super::*;

impl GroupTask {
    /// Sends a pull at most `max` of what is ready; returns how many messages and
    /// payload bytes went.
    pub(super) async fn answer(&mut self, pull: &Pull, max: usize) -> (usize, usize) {
        let Some(broker) = self.broker.upgrade() else {
            return (0, 0);
        };
        let member = self.member(&pull.member);
        let now = self.clock.now_ms();
        let deliveries = self.dispatcher.take(member, max, now);
        self.read_ahead(&deliveries).await;
        let (mut sent, mut bytes, mut out_bytes) = (0, 0, 0);
        for delivery in deliveries {
            match self.message(&delivery).await {
                Ok(Some(message)) => {
                    match &pull.style {
                        PullStyle::Canopy => self.send_canopy(&broker, pull, &delivery, &message),
                        PullStyle::JetStream { stream, .. } => {
                            self.send_jetstream(&broker, pull, stream, &delivery, &message)
                        }
                    }
                    self.last_offset = self.last_offset.max(message.offset);
                    sent += 1;
                    bytes += message.payload.len();
                    out_bytes += message.payload.len() + message.headers.len();
                }
                Ok(None) => {
                    self.dispatcher.gone(&delivery, now);
                    if !self.awaits.is_empty() {
                        self.touched.push(Arc::clone(&delivery.subject));
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "a group could not read a message; it goes again after its ack wait");
                }
            }
        }
        // Every group delivery counts here once, whichever front end pulled it.
        if sent > 0 {
            broker.metrics().count_out(sent as u64, out_bytes as u64);
        }
        (sent, bytes)
    }

    /// Reads the runs of the deliveries the group does not hold in one scan of the
    /// keys between them, and keeps them: a catch-up hands subjects out in the order
    /// its walk listed them, which is key order, so their runs lie close together. What
    /// the scan misses is read on its own by [`GroupTask::message`].
    pub(super) async fn read_ahead(&mut self, deliveries: &[Delivery]) {
        let mut wanted: Vec<(&str, u64)> = deliveries
            .iter()
            .filter(|d| !self.kept.holds(&d.subject, d.version))
            .map(|d| (&*d.subject, d.version))
            .collect();
        if wanted.len() < READ_AHEAD_MIN {
            return;
        }
        wanted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()).then(a.1.cmp(&b.1)));
        wanted.dedup();
        let max_keys = wanted.len() * READ_AHEAD_KEYS_PER_MESSAGE + 64;
        if let Some(broker) = self.broker.upgrade() {
            broker.metrics().count_group_delivery_read();
        }
        let found = match self
            .store
            .get_runs_from(&self.tenant, &wanted, max_keys)
            .await
        {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(group = %self.spec.name, %error, "a read-ahead failed; each delivery reads on its own");
                return;
            }
        };
        let names: HashMap<&str, &Arc<str>> = deliveries
            .iter()
            .map(|d| (&*d.subject, &d.subject))
            .collect();
        for messages in found.into_iter().flatten() {
            for message in messages {
                if let Some(&subject) = names.get(message.subject.as_str()) {
                    self.kept.keep_read(subject, &message);
                }
            }
        }
    }

    /// The message a delivery hands out: kept in memory when the group has it, else
    /// read from the store with the rest of its run, which is kept for the
    /// deliveries to come.
    pub(super) async fn message(
        &mut self,
        delivery: &Delivery,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let (subject, version) = (&delivery.subject, delivery.version);
        let kept = match self.kept.take(subject, version) {
            Some(kept) => kept,
            None => {
                if let Some(broker) = self.broker.upgrade() {
                    broker.metrics().count_group_delivery_read();
                }
                let mut run = self
                    .store
                    .get_run_from(&self.tenant, subject, version)
                    .await?
                    .into_iter();
                let Some(first) = run.next() else {
                    return Ok(None);
                };
                for next in run {
                    self.kept.keep_read(subject, &next);
                }
                return Ok(Some(first));
            }
        };
        Ok(Some(StoredMessage {
            subject: subject.to_string(),
            version,
            offset: kept.offset,
            time_ms: kept.time_ms,
            flags: 0,
            headers: kept.headers,
            payload: kept.payload,
        }))
    }

    /// One delivery to a `$CANOPY.group.next` pull: Canopy's headers, and an ack
    /// subject that names the delivery.
    pub(super) fn send_canopy(
        &self,
        broker: &Broker,
        pull: &Pull,
        delivery: &Delivery,
        message: &crate::store::StoredMessage,
    ) {
        let added = [
            ("Canopy-Subject", message.subject.clone()),
            ("Canopy-Version", message.version.to_string()),
            ("Canopy-Offset", message.offset.to_string()),
            ("Canopy-Time", message.time_ms.to_string()),
            ("Canopy-Group", self.spec.name.clone()),
            ("Canopy-Attempt", delivery.attempt.to_string()),
        ];
        let block = delivery_headers(&message.headers, &added);
        let ack = format!(
            "{ACK_PREFIX}{}.{}.{}.{}",
            self.spec.name, delivery.version, delivery.attempt, delivery.subject
        );
        let routed = Message {
            subject: &pull.reply,
            source: Some(&message.subject),
            reply: Some(ack.as_bytes()),
            headers: Some(&block),
            payload: &message.payload,
            ..Message::default()
        };
        route_one(broker, &pull.routes, &routed);
    }

    /// One delivery to a JetStream pull: under its own subject with its own headers,
    /// and a `$JS.ACK.` reply numbered by a new consumer sequence.
    pub(super) fn send_jetstream(
        &mut self,
        broker: &Broker,
        pull: &Pull,
        stream: &str,
        delivery: &Delivery,
        message: &crate::store::StoredMessage,
    ) {
        let consumer_seq = self.sequences.issue(delivery, message.offset);
        let ack = jetstream::ack_subject(
            stream,
            &self.spec.name,
            delivery.attempt,
            message.offset,
            consumer_seq,
            message.time_ms,
            {
                // JetStream's pending: what is not yet delivered.
                let stats = self.dispatcher.stats();
                stats.pending.saturating_sub(stats.in_flight)
            },
        );
        let headers = (!message.headers.is_empty()).then_some(&message.headers[..]);
        let routed = Message {
            subject: &pull.reply,
            shown_as: Some(&message.subject),
            reply: Some(ack.as_bytes()),
            headers,
            payload: &message.payload,
            ..Message::default()
        };
        route_one(broker, &pull.routes, &routed);
    }

    /// Answers a pull with an error (409) instead of messages.
    pub(super) fn refuse(&self, pull: &Pull, description: &str) {
        self.refuse_with(pull, 409, description);
    }

    /// Answers a pull with an error instead of messages: `code` for a Canopy pull,
    /// 409 for a JetStream one (the status its clients know).
    pub(super) fn refuse_with(&self, pull: &Pull, code: u16, description: &str) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        match &pull.style {
            PullStyle::Canopy => broker.refuse(&pull.routes, &pull.reply, code, description),
            // A push consumer's subscriber asked for nothing: its pump sees the group.
            PullStyle::JetStream { terms, .. } if terms.push => {
                tracing::debug!(group = %self.spec.name, "a push consumer's pull refused: {description}");
            }
            PullStyle::JetStream { .. } => {
                let block = jetstream::status_block(409, description, None);
                send(&broker, &pull.routes, &pull.reply, None, Some(&block), b"");
            }
        }
    }

    /// Ends a pull that sent `sent` messages: Canopy's `Canopy-Done` with the count,
    /// or JetStream's status for how it ended (nothing when it was filled).
    pub(super) fn end(&self, pull: &Pull, sent: usize, end: EndOfPull) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let block = match (&pull.style, end) {
            (PullStyle::JetStream { terms, .. }, _) if terms.push => return,
            (PullStyle::Canopy, _) => {
                let mut headers = HeaderMap::new();
                headers.insert("Canopy-Done", "true");
                headers.insert("Canopy-Count", sent.to_string());
                let mut block = BytesMut::new();
                headers.encode(&mut block);
                block
            }
            (PullStyle::JetStream { .. }, EndOfPull::Filled) => return,
            (PullStyle::JetStream { .. }, EndOfPull::Heartbeat) => {
                jetstream::status_block(100, "Idle Heartbeat", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::NoMessages) => {
                jetstream::status_block(404, "No Messages", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::Done | EndOfPull::TimedOut) => {
                let unfilled = (pull.max.saturating_sub(sent), 0);
                jetstream::status_block(408, "Request Timeout", Some(unfilled))
            }
            (PullStyle::JetStream { .. }, EndOfPull::TooManyWaiting) => {
                jetstream::status_block(409, "Exceeded MaxWaiting", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::Deleted) => {
                jetstream::status_block(409, "Consumer Deleted", None)
            }
        };
        send(&broker, &pull.routes, &pull.reply, None, Some(&block), b"");
    }

    /// Sends waiting pulls what is now ready, and ends those that are filled or whose
    /// wait is over; a JetStream pull that still waits gets its heartbeat when due.
    pub(super) async fn serve_waiting(&mut self) {
        let now = tokio::time::Instant::now();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        let broker = self.broker.upgrade();
        while let Some(mut waiting) = self.waiting.pop_front() {
            // A client that stopped listening (a fetch it gave up on, a closed
            // connection) gets no more: what it would take goes to a pull that is read.
            if broker
                .as_ref()
                .is_some_and(|b| !b.has_interest(&waiting.pull.routes, &waiting.pull.reply))
            {
                continue;
            }
            let room = waiting.pull.max.saturating_sub(waiting.sent);
            let (sent, bytes) = self.answer(&waiting.pull, room).await;
            waiting.sent += sent;
            waiting.bytes += bytes;
            let terms = match &waiting.pull.style {
                PullStyle::JetStream { terms, .. } => Some(terms),
                PullStyle::Canopy => None,
            };
            let Some(terms) = terms else {
                if sent > 0 || waiting.until <= now {
                    self.end(&waiting.pull, waiting.sent, EndOfPull::Done);
                } else {
                    still.push_back(waiting);
                }
                continue;
            };
            let filled = waiting.sent >= waiting.pull.max
                || (terms.max_bytes > 0 && waiting.bytes >= terms.max_bytes);
            if filled {
                continue;
            }
            if terms.no_wait && waiting.sent > 0 {
                self.end(&waiting.pull, waiting.sent, EndOfPull::NoMessages);
                continue;
            }
            if waiting.until <= now {
                self.end(&waiting.pull, waiting.sent, EndOfPull::TimedOut);
                continue;
            }
            if sent > 0 {
                // A message counts as a sign of life: the heartbeat waits again.
                waiting.next_heartbeat = terms.heartbeat.map(|every| now + every);
            } else if let Some(beat) = waiting.next_heartbeat
                && beat <= now
            {
                self.end(&waiting.pull, waiting.sent, EndOfPull::Heartbeat);
                waiting.next_heartbeat = terms.heartbeat.map(|every| now + every);
            }
            still.push_back(waiting);
        }
        self.waiting = still;
    }

    /// Writes the cursors that moved.
    pub(super) async fn flush(&mut self) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let moved = self.dispatcher.take_cursors();
        if let Err(error) = self
            .store
            .put_cursors(&self.tenant, &self.spec.name, &moved)
            .await
        {
            tracing::warn!(group = %self.spec.name, %error, "a group could not write its cursors; acked messages may come again after a restart");
        }
    }

    /// Stores each dead letter under the group's dead-letter subject, with why.
    pub(super) async fn dead_letters(&mut self, letters: Vec<DeadLetter>) {
        for letter in letters {
            let message = self
                .store
                .get(&self.tenant, &letter.subject, Some(letter.version))
                .await
                .ok()
                .flatten();
            let mut headers = message
                .as_ref()
                .and_then(|m| HeaderMap::parse(&m.headers).ok())
                .unwrap_or_default();
            headers.insert("Canopy-Dead-Subject", letter.subject.to_string());
            headers.insert("Canopy-Dead-Version", letter.version.to_string());
            headers.insert("Canopy-Dead-Attempts", letter.attempts.to_string());
            headers.insert("Canopy-Dead-Reason", letter.reason.as_str());
            let mut block = BytesMut::new();
            headers.encode(&mut block);
            let request = AppendRequest {
                tenant: Arc::clone(&self.tenant),
                subject: Arc::from(self.spec.dead_letter_subject(&letter.subject)),
                messages: vec![NewMessage {
                    headers: block.freeze(),
                    payload: message.map_or_else(Bytes::new, |m| m.payload),
                    flags: 0,
                }],
                expect: None,
                msg_id: None,
                durability: Durability::Durable,
                ack: None,
                route: RouteTag::default(),
                compaction: None,
                max_versions: 0,
                retain: false,
            };
            if self.store.append(request).await.is_err() {
                tracing::warn!(group = %self.spec.name, "a dead letter was not stored: the store is closing");
            }
            if !self.awaits.is_empty() {
                self.touched.push(letter.subject);
            }
        }
        let _ = self.store.durable_barrier().await;
    }
}

pub(super) fn send(
    broker: &Broker,
    routes: &Tenant,
    subject: &str,
    reply: Option<&[u8]>,
    headers: Option<&[u8]>,
    payload: &[u8],
) {
    let message = Message {
        subject,
        reply,
        headers,
        payload,
        ..Message::default()
    };
    route_one(broker, routes, &message);
}

/// Routes one message the group sends (its subscribers are woken when `Wakes` drops).
pub(super) fn route_one(broker: &Broker, routes: &Tenant, message: &Message<'_>) {
    let mut scratch = RouteScratch::default();
    let mut wakes = Wakes::default();
    broker.route(routes, None, message, &mut scratch, &mut wakes);
}

/// A Canopy pull's delivery header block: the message's own headers with `added`. A
/// block with no `Canopy-` header at all (most) is extended as it is, without parsing
/// and encoding it again; one with any is parsed, so a stored `Canopy-*` value of the
/// same name is replaced rather than doubled (the server's `Canopy-Schema` stays), and
/// the pull's own answers (`Canopy-Done`, `Canopy-Count`, `Canopy-Status`) are dropped:
/// a message carrying them must not end or fail the pull it is in.
pub(in crate::broker) fn delivery_headers(own: &[u8], added: &[(&str, String)]) -> BytesMut {
    let mut block = BytesMut::with_capacity(own.len() + 160);
    let canopy = own.windows(7).any(|w| w.eq_ignore_ascii_case(b"canopy-"));
    if own.is_empty() || (!canopy && own.starts_with(b"NATS/1.0") && own.ends_with(b"\r\n\r\n")) {
        if own.is_empty() {
            block.extend_from_slice(b"NATS/1.0\r\n");
        } else {
            block.extend_from_slice(&own[..own.len() - 2]);
        }
        for (name, value) in added {
            block.extend_from_slice(name.as_bytes());
            block.extend_from_slice(b": ");
            block.extend_from_slice(value.as_bytes());
            block.extend_from_slice(b"\r\n");
        }
        block.extend_from_slice(b"\r\n");
        return block;
    }
    let mut headers = HeaderMap::parse(own).unwrap_or_default();
    for control in ["Canopy-Done", "Canopy-Count", "Canopy-Status"] {
        headers.remove(control);
    }
    for (name, value) in added {
        headers.insert(*name, value.clone());
    }
    headers.encode(&mut block);
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(block: &[u8]) -> HeaderMap {
        HeaderMap::parse(block).expect("a header block")
    }

    #[test]
    fn a_delivery_block_adds_canopys_headers_and_keeps_the_messages() {
        let added = [
            ("Canopy-Subject", "a.1".to_string()),
            ("Canopy-Version", "7".to_string()),
        ];
        let none = parsed(&delivery_headers(b"", &added));
        assert_eq!(none.get("Canopy-Subject"), Some("a.1"));
        assert_eq!(none.get("Canopy-Version"), Some("7"));

        let own = b"NATS/1.0\r\nX-Trace: t1\r\n\r\n";
        let block = delivery_headers(own, &added);
        assert!(
            block.starts_with(b"NATS/1.0\r\nX-Trace: t1\r\n"),
            "extended as it was"
        );
        let extended = parsed(&block);
        assert_eq!(extended.get("X-Trace"), Some("t1"));
        assert_eq!(extended.get("Canopy-Subject"), Some("a.1"));
    }

    #[test]
    fn a_client_set_canopy_header_is_replaced_and_control_headers_dropped() {
        let added = [("Canopy-Subject", "a.1".to_string())];
        let own = b"NATS/1.0\r\nCanopy-Subject: forged\r\nCanopy-Done: 1\r\nCanopy-Schema: s@1\r\nX-A: b\r\n\r\n";
        let headers = parsed(&delivery_headers(own, &added));
        let subjects: Vec<_> = headers
            .entries
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("canopy-subject"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(subjects, ["a.1"]);
        assert_eq!(headers.get("Canopy-Done"), None);
        assert_eq!(
            headers.get("Canopy-Schema"),
            Some("s@1"),
            "the server's stamp stays"
        );
        assert_eq!(headers.get("X-A"), Some("b"));
    }
}
