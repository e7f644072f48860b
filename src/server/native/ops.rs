//! The ops of a connected native client: PUB/HPUB through the client core
//! (`session`) with refusals in NATS's words, SUB/UNSUB, PING/PONG, and the
//! ordering of routing changes and PONGs behind stored publishes. Never writes to
//! the socket itself: everything goes through the outbox.

use super::*;

impl Connection {
    pub(super) fn ping(&mut self) -> Result<(), Close> {
        if std::mem::take(&mut self.active_since_ping) {
            return Ok(());
        }
        if self.pings_out >= self.context.config.native.max_pings_outstanding {
            self.broker.metrics().count_stale_connection();
            self.session
                .outbox
                .push_control(|out| encode_err(out, "Stale Connection"));
            return Err(Close::Fatal("stale connection"));
        }
        self.pings_out += 1;
        self.session.outbox.push_control(encode_ping);
        Ok(())
    }

    /// Handles every complete frame in `rbuf`, then wakes each touched subscriber once.
    pub(super) fn process(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        self.active_since_ping = true;
        let mut msgs = 0u64;
        let mut bytes = 0u64;
        let result = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(op)) => {
                    if let ClientOp::Pub { payload, .. } | ClientOp::HPub { payload, .. } = &op {
                        msgs += 1;
                        bytes += payload.len() as u64;
                    }
                    if matches!(op, ClientOp::Sub { .. } | ClientOp::Unsub { .. })
                        && (!self.session.appends.is_empty() || self.unsequenced)
                    {
                        // Routing changes wait until earlier stored publishes were
                        // routed, so they apply in the order the client sent them.
                        self.deferred = Some(op);
                        break Ok(());
                    }
                    if let Err(close) = self.handle(op) {
                        break Err(close);
                    }
                    if self.session.paused_until.is_some() {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => {
                    tracing::debug!(conn = self.id, %error, "protocol error");
                    self.session
                        .outbox
                        .push_control(|out| encode_err(out, error.nats_text()));
                    break Err(Close::Fatal(error.nats_text()));
                }
            }
        };
        if msgs > 0 {
            self.broker.metrics().count_in(msgs, bytes);
        }
        self.session.end_batch();
        result
    }

    pub(super) fn handle(&mut self, op: ClientOp) -> Result<(), Close> {
        match op {
            ClientOp::Connect(options) => return self.connect(&options),
            ClientOp::Pub {
                subject,
                reply,
                payload,
            } => return self.publish(&subject, reply, None, payload),
            ClientOp::HPub {
                subject,
                reply,
                headers,
                payload,
            } => return self.publish(&subject, reply, Some(headers), payload),
            ClientOp::Sub {
                subject,
                queue,
                sid,
            } => self.subscribe(&subject, queue.as_deref(), sid),
            ClientOp::Unsub { sid, max_msgs } => self.unsubscribe(&sid, max_msgs),
            // A PONG must follow the deliveries of every earlier publish; stored ones
            // are routed by the sequencer, so then the PONG waits for it.
            ClientOp::Ping if !self.session.appends.is_empty() || self.unsequenced => {
                self.pongs_owed += 1
            }
            ClientOp::Ping => self.session.outbox.push_control(encode_pong),
            ClientOp::Pong => self.pings_out = 0,
        }
        Ok(())
    }

    pub(super) fn ok(&self) {
        if self.verbose {
            self.session.outbox.push_control(encode_ok);
        }
    }

    pub(super) fn error(&self, text: &str) {
        self.session
            .outbox
            .push_control(|out| encode_err(out, text));
    }

    pub(super) fn connect(&mut self, options: &ConnectOptions) -> Result<(), Close> {
        if options.no_responders && !options.headers {
            self.error("no responders requires headers support");
            return Err(Close::Fatal("no responders without headers"));
        }
        self.verbose = options.verbose;
        self.no_responders = options.no_responders;
        self.dynamic_info = options.protocol >= 1;
        self.session
            .outbox
            .set_options(options.headers, options.echo);
        if let Some(name) = options.name.as_deref().filter(|n| !n.is_empty()) {
            self.session.set_client_name(name);
        }
        self.ok();
        Ok(())
    }

    pub(super) fn publish(
        &mut self,
        subject: &[u8],
        reply: Option<Bytes>,
        headers: Option<Bytes>,
        payload: Bytes,
    ) -> Result<(), Close> {
        let Ok(subject) = std::str::from_utf8(subject) else {
            self.error("Invalid Publish Subject");
            return Ok(());
        };
        let mut route_flags = 0;
        if !self.session.outbox.echo() {
            route_flags |= FLAG_NO_ECHO;
        }
        if self.no_responders {
            route_flags |= FLAG_NO_RESPONDERS;
        }
        let publish = Publish {
            reply,
            headers: headers.unwrap_or_default(),
            ack: AskAck::Reply,
            api_calls: true,
            route_flags,
            ..Publish::new(subject, payload)
        };
        // As nats-server does: the +OK, then deliveries (also to our own
        // subscriptions); an -ERR instead when refused.
        let verbose = self.verbose;
        let taken = self.session.publish_then(publish, |outbox| {
            if verbose {
                outbox.push_control(encode_ok);
            }
        });
        match taken {
            Ok(_) => Ok(()),
            Err(refused) => self.refuse_publish(subject, refused),
        }
    }

    /// Tells the client its publish was refused (it was neither delivered nor
    /// stored): an error ack when it waits for the store's ack, as the store itself
    /// would answer, else the NATS error; too large a message closes the
    /// connection, as in NATS.
    pub(super) fn refuse_publish(&mut self, subject: &str, refused: Refused) -> Result<(), Close> {
        let text = nats_text(subject, &refused.refusal);
        if let Refusal::TooLarge { .. } = refused.refusal {
            self.error(&text);
            return Err(Close::Fatal("maximum payload violation"));
        }
        match refused
            .answer
            .as_ref()
            .and_then(|(reply, body)| Some((std::str::from_utf8(reply).ok()?, body)))
        {
            Some((reply, body)) => self.answer(reply, body),
            None => self.error(&text),
        }
        Ok(())
    }

    /// Publishes `body` to `subject` on behalf of the server (an error ack).
    pub(super) fn answer(&mut self, subject: &str, body: &[u8]) {
        let message = Message {
            subject,
            reply: None,
            headers: None,
            payload: body,
            ..Message::default()
        };
        let session = &mut self.session;
        self.broker.route(
            &session.publisher.routes,
            None,
            &message,
            &mut session.scratch,
            &mut session.wakes,
        );
    }

    /// Sends the publishes this batch made to stored subjects; waits only while the
    /// sequencer's queue is full, which holds this publisher back and no one else.
    pub(super) async fn send_appends(&mut self) {
        if self.session.appends.is_empty() && self.pongs_owed == 0 && self.deferred.is_none() {
            return;
        }
        if !self.session.appends.is_empty() {
            self.unsequenced = true;
        }
        // Shutting down when not taken: what was not taken is lost, and never acked.
        let _ = self.session.send_appends().await;
        if self.pongs_owed > 0 || self.deferred.is_some() {
            // Wherever the tenant's store is: here, or on its shard's owner.
            let tenant = Arc::clone(&self.session.routes().name);
            self.broker.barrier(&tenant).await;
            self.unsequenced = false;
            for _ in 0..std::mem::take(&mut self.pongs_owed) {
                self.session.outbox.push_control(encode_pong);
            }
        }
    }

    /// Sends stored publishes to the sequencer and, where an operation waits for
    /// them (PING, SUB, UNSUB), lets them be routed first; then goes on with the
    /// frames still buffered.
    pub(super) async fn catch_up(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        while !self.session.appends.is_empty() || self.pongs_owed > 0 || self.deferred.is_some() {
            self.send_appends().await;
            match self.deferred.take() {
                Some(op) => {
                    self.handle(op)?;
                    self.process(rbuf)?;
                }
                None => break,
            }
        }
        Ok(())
    }

    pub(super) fn subscribe(&mut self, subject: &[u8], queue: Option<&[u8]>, sid: Bytes) {
        // Owned: a slice would pin the whole read buffer for the subscription's life.
        let sid = Bytes::copy_from_slice(&sid);
        let Some((text, pattern)) = std::str::from_utf8(subject).ok().and_then(|s| {
            Pattern::parse_native_with(s, &self.context.subject_limits)
                .ok()
                .map(|p| (s, p))
        }) else {
            self.error("Invalid Subject");
            return;
        };
        let queue = match queue.map(std::str::from_utf8) {
            None => None,
            Some(Ok(q)) if !q.is_empty() => Some(q),
            Some(_) => {
                self.error("Invalid Queue Name");
                return;
            }
        };
        if self.subs.get(&sid).is_some_and(|s| !s.is_spent()) {
            // NATS keeps the first subscription of a repeated sid.
            self.ok();
            return;
        }
        let mut admitted = self.session.admit_subscription(text, &pattern, false);
        if let Err(SubscribeRefusal::TooMany(_)) = admitted {
            // Subscriptions that ended by reaching their maximum are only noticed here.
            let session = &mut self.session;
            self.subs.retain(|_, sub| {
                let spent = sub.is_spent();
                if spent {
                    session.forget(sub);
                }
                !spent
            });
            admitted = self.session.admit_subscription(text, &pattern, false);
        }
        if let Err(refused) = admitted {
            match (refused, queue) {
                (SubscribeRefusal::TooMany(_), _) => self.error("maximum subscriptions exceeded"),
                (refused, Some(q)) => self.error(&format!("{refused} using queue \"{q}\"")),
                (refused, None) => self.error(&refused.to_string()),
            }
            return;
        }
        let sub = self.session.subscribe(sid.clone(), pattern, queue, None);
        if let Some(old) = self.subs.insert(sid, sub) {
            // A spent subscription under the same sid.
            self.session.forget(&old);
        }
        self.ok();
    }

    pub(super) fn unsubscribe(&mut self, sid: &Bytes, max_msgs: Option<u64>) {
        if let Some(sub) = self.subs.get(sid) {
            let now = match max_msgs {
                Some(max) if max > 0 => sub.limit(max),
                _ => true,
            };
            if now && let Some(sub) = self.subs.remove(sid) {
                self.session.unsubscribe(&sub);
            }
        }
        self.ok();
    }
}

/// The NATS `-ERR` text for a refused publish to `subject`.
fn nats_text(subject: &str, refusal: &Refusal) -> String {
    match refusal {
        Refusal::InvalidSubject(_) => "Invalid Publish Subject".to_owned(),
        Refusal::Reserved(subject) => crate::tenancy::Denied::Publish(subject.clone()).to_string(),
        Refusal::Denied(denied) => denied.to_string(),
        Refusal::TooLarge { .. } => "Maximum Payload Violation".to_owned(),
        Refusal::OverQuota(exceeded) => format!("Quota Exceeded: {exceeded}"),
        Refusal::BadHeader(why) => format!("Invalid Canopy Header: {why}"),
        Refusal::WrongStream(_) => format!("Invalid Canopy Header: {refusal}"),
        Refusal::TooLargeForStream(_) => format!("Stream Limit: {refusal}"),
        Refusal::Invalid(_) | Refusal::Plugin(_) => schema_refusal(subject, refusal),
    }
}

/// The most bytes of a schema refusal's `-ERR` text: NATS clients read control lines
/// of up to 4 KiB.
const MAX_SCHEMA_REFUSAL: usize = 1024;

/// A schema's or a plugin's refusal worded as a publish permissions violation: the one `-ERR` that
/// nats-py and nats.go take without closing the connection for good (nats.js keeps
/// it open on any), so the client hears why and goes on. One line between the
/// quotes whatever the schema's message quotes, bounded, and without the phrases
/// for which nats-py closes whatever the line starts with.
fn schema_refusal(subject: &str, refusal: &Refusal) -> String {
    let mut text = String::new();
    let full = format!("Permissions Violation for Publish to \"{subject}\": {refusal}");
    for c in full.chars() {
        let c = match c {
            '\'' => '"',
            c if c.is_control() => ' ',
            c => c,
        };
        if text.len() + c.len_utf8() > MAX_SCHEMA_REFUSAL {
            break;
        }
        text.push(c);
    }
    for phrase in ["stale connection", "authorization violation"] {
        // Lowercasing ASCII keeps every byte where it was.
        while let Some(at) = text.to_ascii_lowercase().find(phrase) {
            let space = at + phrase.find(' ').unwrap_or_default();
            text.replace_range(space..=space, "_");
        }
    }
    text
}
