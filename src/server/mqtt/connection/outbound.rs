//! From the outbox to the socket: envelopes become PUBLISH packets within the
//! client's Receive Maximum window and Maximum Packet Size, with packet ids and
//! topic aliases. Never decides what is delivered; routing did.

use super::*;

impl Connection {
    /// Encodes what may be sent now into `out`: control packets first, then
    /// deliveries while the window and the batch size allow.
    pub(super) fn fill(&mut self, out: &mut BytesMut) {
        if !self.control.is_empty() {
            out.extend_from_slice(&self.control);
            self.control.clear();
        }
        let max_queued = self.context.config.mqtt.max_queued_bytes;
        while out.len() < WRITE_BATCH {
            if let Some(front) = self.queue.front() {
                if front.qos > 0 && self.flow_out.window_full() {
                    break;
                }
                let Some(delivery) = self.queue.pop_front() else {
                    break;
                };
                self.queued_bytes = self.queued_bytes.saturating_sub(delivery.size());
                self.session.outbox.sent(delivery.owed);
                self.send(delivery, out);
                continue;
            }
            // Live deliveries wait while the backlog is read, so order holds.
            let live = self.backlog.as_ref().is_none_or(|b| b.done);
            if !live || self.queued_bytes >= max_queued || self.session.outbox.is_empty() {
                break;
            }
            let mut taken = BytesMut::new();
            // Still unsent until each delivery leaves the queue (`Delivery::owed`).
            self.session.outbox.take_unsent(&mut taken);
            let mut taken = taken.freeze();
            loop {
                let before = taken.len();
                let Some(envelope) = envelope::decode(&mut taken) else {
                    // What did not decode is dropped with the rest.
                    self.session.outbox.sent(before);
                    break;
                };
                let owed = before - taken.len();
                if self.forward_reply(&envelope) {
                    self.session.outbox.sent(owed);
                    continue;
                }
                if envelope.offset != 0 && envelope.offset <= self.backlog_high {
                    // Already sent by the backlog. (Several envelopes may share an
                    // offset: one per matching subscription.)
                    self.session.outbox.sent(owed);
                    continue;
                }
                self.high_offset = self.high_offset.max(envelope.offset);
                self.enqueue(Delivery::from_envelope(envelope, owed));
            }
        }
        if !self.control.is_empty() {
            out.extend_from_slice(&self.control);
            self.control.clear();
        }
    }

    pub(super) fn enqueue(&mut self, delivery: Delivery) {
        self.queued_bytes += delivery.size();
        self.queue.push_back(delivery);
    }

    /// Writes one delivery, giving it a packet identifier when its QoS needs one.
    pub(super) fn send(&mut self, delivery: Delivery, out: &mut BytesMut) {
        if delivery.qos == 0 {
            self.encode_publish(&delivery, None, false, out);
            return;
        }
        let Some(packet_id) = self.flow_out.next_packet_id() else {
            // 65,535 in flight cannot happen with a window below that; drop rather
            // than reuse an identifier.
            return;
        };
        if self.encode_publish(&delivery, Some(packet_id), false, out) {
            self.flow_out.sent(packet_id, delivery.qos, delivery);
        }
    }

    /// Encodes a PUBLISH; false when it was not sent (too large for the client, or
    /// expired).
    pub(super) fn encode_publish(
        &mut self,
        delivery: &Delivery,
        packet_id: Option<u16>,
        dup: bool,
        out: &mut BytesMut,
    ) -> bool {
        let Ok(native) = std::str::from_utf8(&delivery.subject) else {
            return false;
        };
        let mut topic = std::mem::take(&mut self.topic);
        if !translate::mqtt_topic(native, &mut topic) {
            self.topic = topic;
            return false;
        }
        let age = if delivery.time_ms == 0 {
            0
        } else {
            self.broker
                .clock()
                .now_ms()
                .saturating_sub(delivery.time_ms)
                / 1000
        };
        let mut properties = self.properties.take().unwrap_or_default();
        if self.level == Level::V5 {
            if translate::outbound(&delivery.headers, &delivery.reply, 0, age, &mut properties)
                .is_none()
            {
                self.properties = Some(properties);
                return false;
            }
            properties.subscription_identifiers = delivery.subscription_ids.clone();
        } else {
            *properties = Properties::default();
            if translate::expired(&delivery.headers, age) {
                self.properties = Some(properties);
                return false;
            }
        }
        // A topic the client already knows by alias goes as the alias alone; a new
        // one gets the next alias while the client's maximum allows.
        let mut topic_bytes = topic.as_bytes();
        let mut new_alias = None;
        match self.flow_out.alias_for(&topic) {
            OutAlias::Known(alias) => {
                properties.topic_alias = Some(alias);
                topic_bytes = b"";
            }
            OutAlias::New(alias) => {
                properties.topic_alias = Some(alias);
                new_alias = Some(alias);
            }
            OutAlias::None => {}
        }
        let qos = QoS::from_bits(delivery.qos).unwrap_or(QoS::AtMostOnce);
        let start = out.len();
        let result = encode_publish(
            out,
            self.level,
            dup,
            qos,
            delivery.retain,
            topic_bytes,
            packet_id,
            &properties,
            &delivery.payload,
        );
        self.properties = Some(properties);
        let size = out.len() - start;
        if result.is_err() || size > self.client_max_packet {
            // MQTT 5: a packet over the client's maximum is dropped as if sent.
            out.truncate(start);
            self.topic = topic;
            self.broker.metrics().count_dropped(1);
            return false;
        }
        // The alias holds from the packet that carried it with its topic.
        if let Some(alias) = new_alias {
            self.flow_out.confirm_alias(&topic, alias);
        }
        self.topic = topic;
        self.broker
            .metrics()
            .count_out(1, (delivery.payload.len() + delivery.headers.len()) as u64);
        true
    }

    pub(super) fn write_publish(&mut self, delivery: &Delivery, packet_id: u16, dup: bool) {
        let mut out = std::mem::take(&mut self.control);
        self.encode_publish(delivery, Some(packet_id), dup, &mut out);
        self.control = out;
    }

    pub(super) fn put_control(&mut self, packet: &Packet) {
        if let Err(error) = encode(packet, self.level, &mut self.control) {
            tracing::warn!(%error, conn = self.id, "cannot encode an mqtt packet");
        }
    }

    pub(super) fn ack_properties(&self, why: Option<String>) -> Properties {
        Properties {
            reason_string: why.filter(|_| self.problem_info && self.level == Level::V5),
            ..Properties::default()
        }
    }
}
