//! Packets from the client: publishes through the client core (`session`),
//! their acks from the store, QoS 2 state, request/response forwarding, and the
//! other control packets. Never writes to the socket itself.

use super::*;

impl Connection {
    /// Handles every complete packet in `rbuf`, then wakes each touched subscriber.
    pub(super) fn process(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        let mut msgs = 0u64;
        let mut bytes = 0u64;
        let result = loop {
            match self.decoder.decode(rbuf) {
                Ok(Some(packet)) => {
                    if let Packet::Publish(p) = &packet {
                        msgs += 1;
                        bytes += p.payload.len() as u64;
                    }
                    if let Err(close) = self.handle(packet) {
                        break Err(close);
                    }
                    if self.session.paused_until.is_some() {
                        break Ok(());
                    }
                }
                Ok(None) => break Ok(()),
                Err(error) => {
                    tracing::debug!(conn = self.id, %error, "mqtt protocol error");
                    break Err(Close::protocol(error.code, error.message));
                }
            }
        };
        if msgs > 0 {
            self.broker.metrics().count_in(msgs, bytes);
        }
        self.session.end_batch();
        result
    }

    pub(super) fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(publish) => self.publish(publish),
            Packet::PubAck(ack) => {
                if self.flow_out.puback(ack.packet_id) {
                    self.session.outbox.wake();
                }
                Ok(())
            }
            Packet::PubRec(ack) => {
                self.pubrec(&ack);
                Ok(())
            }
            Packet::PubRel(ack) => {
                let code = self.flow_in.release(ack.packet_id).map_err(violation)?;
                let code = if self.level == Level::V5 {
                    code
                } else {
                    reason::SUCCESS
                };
                self.put_control(&Packet::PubComp(Ack {
                    packet_id: ack.packet_id,
                    reason: code,
                    properties: Properties::default(),
                }));
                Ok(())
            }
            Packet::PubComp(ack) => {
                if self.flow_out.pubcomp(ack.packet_id) {
                    self.session.outbox.wake();
                }
                Ok(())
            }
            Packet::Subscribe(subscribe) => self.subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => {
                self.unsubscribe(unsubscribe);
                Ok(())
            }
            Packet::PingReq => {
                self.put_control(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(disconnect) => self.disconnect(&disconnect),
            Packet::Connect(_) => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "a second CONNECT on one connection",
            )),
            Packet::Auth(_) => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "AUTH without an authentication method",
            )),
            other => Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                format!("{} is not sent by clients", other.name()),
            )),
        }
    }

    pub(super) fn pubrec(&mut self, ack: &Ack) {
        match self.flow_out.pubrec(ack.packet_id, ack.reason) {
            Receipt::Release => self.put_control(&Packet::PubRel(Ack::new(ack.packet_id))),
            // The client refused it: the flow ends here and a window slot is free.
            Receipt::Refused => self.session.outbox.wake(),
            Receipt::Unknown if self.level == Level::V5 => {
                self.put_control(&Packet::PubRel(Ack {
                    packet_id: ack.packet_id,
                    reason: reason::PACKET_IDENTIFIER_NOT_FOUND,
                    properties: Properties::default(),
                }));
            }
            Receipt::Unknown => {}
        }
    }

    pub(super) fn disconnect(&mut self, disconnect: &Disconnect) -> Result<(), Close> {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            if self.session_expiry == 0 && expiry > 0 {
                return Err(Close::protocol(
                    reason::PROTOCOL_ERROR,
                    "session expiry cannot be set at DISCONNECT when it was 0 at CONNECT",
                ));
            }
            self.session_expiry = expiry.min(self.context.config.mqtt.max_session_expiry_secs);
        }
        Err(Close::Disconnected {
            with_will: disconnect.reason == reason::DISCONNECT_WITH_WILL,
        })
    }

    pub(super) fn publish(&mut self, publish: Publish) -> Result<(), Close> {
        let qos = publish.qos as u8;
        let packet_id = publish.packet_id.unwrap_or(0);
        if let Arrival::Resend { pubrec } =
            self.flow_in.arrive(qos, packet_id).map_err(violation)?
        {
            // A resend of a publish we still hold: answered once, stored once.
            if pubrec {
                self.put_control(&Packet::PubRec(Ack::new(packet_id)));
            }
            return Ok(());
        }
        if !publish.properties.subscription_identifiers.is_empty() {
            return Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "a client PUBLISH must not carry a subscription identifier",
            ));
        }
        let topic = self.resolve_topic(&publish)?;
        let Ok(topic_text) = std::str::from_utf8(&topic) else {
            return Err(Close::protocol(
                reason::MALFORMED_PACKET,
                "topic is not UTF-8",
            ));
        };
        let (subject, mut parts) = match self.translate_publish(topic_text, &publish) {
            Ok(translated) => translated,
            Err((code, why)) => return self.refuse_publish(qos, packet_id, code, why),
        };
        if let (Some(reply), Some(correlation)) =
            (&parts.reply, &publish.properties.correlation_data)
        {
            // A request: the responder answers the inbox, and the answer is passed on
            // to the response topic with the correlation data, so services that do
            // not copy headers still answer MQTT requesters correctly. MQTT
            // receivers get the response topic itself (`translate::outbound`).
            if let Some(inbox) = self.remember_request(reply.clone(), correlation.clone()) {
                parts.reply = Some(inbox);
            }
        }
        let ack = if qos > 0 {
            AskAck::Inbox(packet_id)
        } else {
            AskAck::Nobody
        };
        // MQTT 5 refuses an acknowledged publish over the rate with 0x97; anything
        // else cannot be refused without being lost or acked falsely, so it is taken
        // and the client is held back instead.
        let admission = if self.level == Level::V5 && qos > 0 {
            Admission::Refusable
        } else {
            Admission::Throttled
        };
        let message = session::Publish {
            reply: parts.reply,
            headers: parts.headers,
            flags: mqtt_flags(qos, publish.retain),
            retain: publish.retain,
            ack,
            admission,
            // Parsed from the topic within the same limits.
            subject_checked: true,
            ..session::Publish::new(subject.as_str(), publish.payload)
        };
        let published = self
            .session
            .publish(message)
            .map_err(|refused| refused.refusal);
        if let Some(until) = self.session.paused_until {
            // Keep-alive counts from the end of a pause the server chose.
            self.keep_alive.heard(until);
        }
        self.answer_publish(published, qos, packet_id)
    }

    /// A publish's subject, and the reply and headers its v5 properties become; or
    /// the reason code and why it is refused.
    fn translate_publish(
        &self,
        topic: &str,
        publish: &Publish,
    ) -> Result<(Subject, translate::NativeParts), (u8, String)> {
        let subject = Subject::parse_mqtt_with(topic, &self.context.subject_limits)
            .map_err(|error| (reason::TOPIC_NAME_INVALID, error.to_string()))?;
        let parts = if self.level == Level::V5 {
            translate::inbound(
                &publish.properties,
                &publish.payload,
                &self.context.subject_limits,
            )
            .map_err(|unmappable| match unmappable {
                translate::Unmappable::PayloadNotUtf8 => (
                    reason::PAYLOAD_FORMAT_INVALID,
                    "the payload format indicator says UTF-8 and the payload is not".into(),
                ),
                translate::Unmappable::ResponseTopic(why) => {
                    (reason::TOPIC_NAME_INVALID, format!("response topic: {why}"))
                }
            })?
        } else {
            translate::NativeParts::default()
        };
        if let Some(response) = parts
            .reply
            .as_deref()
            .and_then(|r| std::str::from_utf8(r).ok())
        {
            // Answers are published to the response topic on this client's behalf: it
            // must be a topic the client could publish to itself.
            if let Err(refused) = self.session.publisher.check_target(response) {
                return Err((mqtt_code(&refused), format!("response topic: {refused}")));
            }
        }
        Ok((subject, parts))
    }

    /// Answers a publish the session took or refused: at once, or once the store
    /// holds it.
    fn answer_publish(
        &mut self,
        published: Result<session::Published, Refusal>,
        qos: u8,
        packet_id: u16,
    ) -> Result<(), Close> {
        match published {
            // MQTT 3.x cannot refuse: a message its schema or a plugin refuses is
            // acknowledged and dropped (the console and `schema.errors` show a
            // schema's), since closing would only bring the same message back on the
            // next connection.
            Err(refused @ (Refusal::Invalid(_) | Refusal::Plugin(_)))
                if self.level != Level::V5 =>
            {
                tracing::debug!(conn = self.id, %refused, "an mqtt 3 publish its schema or a plugin refused was dropped");
                self.ack_now(qos, packet_id);
                Ok(())
            }
            Err(refused) => {
                let code = mqtt_code(&refused);
                self.refuse_publish(qos, packet_id, code, refused.to_string())
            }
            Ok(session::Published::Stored { .. }) => {
                if qos > 0 {
                    self.flow_in.storing(packet_id, qos);
                }
                Ok(())
            }
            // Not stored: routed now, acknowledged now.
            Ok(_) => {
                self.ack_now(qos, packet_id);
                Ok(())
            }
        }
    }

    /// Acknowledges a publish the store does not answer for.
    fn ack_now(&mut self, qos: u8, packet_id: u16) {
        match qos {
            1 => self.put_control(&Packet::PubAck(Ack::new(packet_id))),
            2 => {
                self.flow_in.received(packet_id);
                self.put_control(&Packet::PubRec(Ack::new(packet_id)));
            }
            _ => {}
        }
    }

    /// Records a request's response topic and correlation data under a fresh inbox
    /// subject of this connection, which it then subscribes to (once). `None` when
    /// the connection may not hold an inbox (its subscription limits).
    pub(super) fn remember_request(
        &mut self,
        response: Bytes,
        correlation: Bytes,
    ) -> Option<Bytes> {
        if self.reply_inbox.is_none() {
            let options = MqttOptions {
                qos: 2,
                ..MqttOptions::default()
            };
            let inbox = self
                .session
                .subscribe_private_inbox("mqtt", Bytes::from_static(b"$reply"), options)
                .ok()?;
            self.reply_inbox = Some(inbox);
        }
        let seq = self.next_request;
        self.next_request += 1;
        self.requests.push_back((seq, response, correlation));
        while self.requests.len() > MAX_OPEN_REQUESTS {
            self.requests.pop_front();
        }
        let prefix = self.reply_inbox.as_ref().map_or("", |(p, _)| p.as_str());
        Some(Bytes::from(format!("{prefix}{seq}")))
    }

    /// Passes an answer that arrived on this connection's request inbox on to the
    /// request's response topic, with its correlation data, published as this
    /// client (its rules, its tenant's quota); true when `envelope` was such an
    /// answer.
    pub(super) fn forward_reply(&mut self, envelope: &Envelope) -> bool {
        let Some((prefix, _)) = &self.reply_inbox else {
            return false;
        };
        let Some(seq) = envelope
            .subject
            .strip_prefix(prefix.as_bytes())
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return false;
        };
        let Some(at) = self.requests.iter().position(|(n, _, _)| *n == seq) else {
            // An answer to a forgotten request (or a second answer): dropped.
            return true;
        };
        let Some((_, response, correlation)) = self.requests.remove(at) else {
            return true;
        };
        let Ok(subject) = std::str::from_utf8(&response) else {
            return true;
        };
        let answer = session::Publish {
            headers: translate::with_correlation(&envelope.headers, &correlation),
            flags: mqtt_flags(envelope.qos, false),
            admission: Admission::Throttled,
            ..session::Publish::new(subject, envelope.payload.clone())
        };
        match self
            .session
            .publish(answer)
            .map_err(|refused| refused.refusal)
        {
            Ok(session::Published::Stored { .. }) => {
                // The append goes out in the next catch-up.
                self.session.outbox.wake();
            }
            Ok(_) => {}
            Err(refused) => {
                tracing::debug!(conn = self.id, %refused, "an answer to an mqtt request was dropped");
            }
        }
        self.session.end_batch();
        true
    }

    /// The topic of a publish, through its v5 topic alias when it has one.
    pub(super) fn resolve_topic(&mut self, publish: &Publish) -> Result<Bytes, Close> {
        self.flow_in
            .resolve_topic(publish.topic.as_bytes(), publish.properties.topic_alias)
            .map_err(violation)
    }

    /// Answers a publish that cannot be taken: a v5 error reason on its ack. MQTT
    /// 3.x has no way to refuse a QoS 1 or 2 publish, and acking one that was
    /// dropped would lose it, so the connection closes without an ack instead (the
    /// client learns nothing was taken). A refused QoS 0 publish is dropped.
    pub(super) fn refuse_publish(
        &mut self,
        qos: u8,
        packet_id: u16,
        code: u8,
        why: String,
    ) -> Result<(), Close> {
        tracing::debug!(conn = self.id, code, why, "mqtt publish refused");
        if self.level != Level::V5 {
            if qos > 0 {
                return Err(Close::Server {
                    code,
                    reason: format!("publish refused: {why}"),
                });
            }
            return Ok(());
        }
        let ack = Ack {
            packet_id,
            reason: code,
            properties: self.ack_properties(Some(why.clone())),
        };
        match qos {
            1 => self.put_control(&Packet::PubAck(ack)),
            2 => self.put_control(&Packet::PubRec(ack)),
            // QoS 0 has no ack: MQTT 5 says why on DISCONNECT for a bad topic.
            _ if code == reason::TOPIC_NAME_INVALID => {
                return Err(Close::protocol(code, why));
            }
            _ => {}
        }
        Ok(())
    }

    /// Turns the store's answers into PUBACK and PUBREC.
    pub(super) fn take_store_acks(&mut self) -> Result<(), Close> {
        self.acks.take(&mut self.store_acks);
        if self.store_acks.is_empty() {
            return Ok(());
        }
        let v5 = self.level == Level::V5;
        for StoreAck {
            packet_id,
            outcome,
            awaited,
        } in std::mem::take(&mut self.store_acks)
        {
            let Some(qos) = self.flow_in.storing_qos(packet_id) else {
                continue;
            };
            let (code, why, current) = match &outcome {
                AppendOutcome::Stored { .. } | AppendOutcome::Duplicate { .. } => {
                    (reason::SUCCESS, None, None)
                }
                AppendOutcome::Conflict {
                    subject,
                    expected,
                    current_version,
                    ..
                } => {
                    let expected = match expected {
                        Expectation::Version(v)
                        | Expectation::LastOffset(v)
                        | Expectation::StreamOffset(v) => *v,
                    };
                    (
                        reason::IMPLEMENTATION_SPECIFIC_ERROR,
                        Some(format!(
                            "wrong expected version {expected}: {subject} is at version {current_version}"
                        )),
                        Some(*current_version),
                    )
                }
                AppendOutcome::QuotaExceeded { reason: why } => {
                    if !v5 {
                        return Err(Close::Server {
                            code: reason::QUOTA_EXCEEDED,
                            reason: format!("quota exceeded: {why}"),
                        });
                    }
                    (reason::QUOTA_EXCEEDED, Some(why.clone()), None)
                }
                AppendOutcome::Failed { reason: why } => {
                    if !v5 {
                        // 3.x cannot be told: no ack, so the client sends it again.
                        return Err(Close::Server {
                            code: reason::UNSPECIFIED_ERROR,
                            reason: format!("the store refused a publish: {why}"),
                        });
                    }
                    (reason::UNSPECIFIED_ERROR, Some(why.clone()), None)
                }
            };
            let mut properties = self.ack_properties(why);
            if let Some(version) = current.filter(|_| v5) {
                properties
                    .user_properties
                    .push(("Canopy-Current-Version".into(), version.to_string()));
            }
            // A publish that waited for groups says which passed it and which not
            // (the message is stored either way, so the reason code stays success).
            if let Some(awaited) = awaited.filter(|_| v5) {
                let passed: Vec<&str> = awaited.passed.iter().map(|g| &**g).collect();
                properties
                    .user_properties
                    .push(("Canopy-Await-Passed".into(), passed.join(",")));
                if !awaited.complete() {
                    properties
                        .user_properties
                        .push(("Canopy-Await-Pending".into(), awaited.pending_text()));
                }
            }
            let ack = Ack {
                packet_id,
                reason: if v5 { code } else { reason::SUCCESS },
                properties,
            };
            self.flow_in.store_answered(packet_id, code < 0x80);
            if qos == 2 {
                self.put_control(&Packet::PubRec(ack));
            } else {
                self.put_control(&Packet::PubAck(ack));
            }
        }
        if !self.control.is_empty() {
            self.session.outbox.wake();
        }
        Ok(())
    }
}

/// The connection's end for a breach of the protocol.
fn violation(violation: crate::server::mqtt::state::Violation) -> Close {
    Close::protocol(violation.code(), violation.to_string())
}

/// The MQTT 5 reason code for a refused publish.
pub(super) fn mqtt_code(refused: &Refusal) -> u8 {
    match refused {
        Refusal::InvalidSubject(_) => reason::TOPIC_NAME_INVALID,
        Refusal::Reserved(_) | Refusal::Denied(_) => reason::NOT_AUTHORIZED,
        Refusal::OverQuota(_) => reason::QUOTA_EXCEEDED,
        Refusal::TooLarge { .. }
        | Refusal::TooLargeForStream(_)
        | Refusal::BadHeader(_)
        | Refusal::WrongStream(_) => reason::IMPLEMENTATION_SPECIFIC_ERROR,
        Refusal::Invalid(_) => reason::PAYLOAD_FORMAT_INVALID,
        Refusal::Plugin(_) => reason::IMPLEMENTATION_SPECIFIC_ERROR,
    }
}
