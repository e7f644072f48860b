//! MQTT's per-connection protocol state, without I/O: the QoS 1 and 2 flows both
//! ways, packet identifiers, the in-flight window (Receive Maximum), topic aliases
//! both ways, and the keep-alive deadline. Each call takes what arrived (a packet
//! identifier, a topic, the time) and answers what to do (a reason code, whether to
//! send PUBREC or PUBREL, a violation that closes the connection); the connection
//! task does the sending. Unit-tested without sockets.
//!
//! This module must never touch a socket, the broker or the store.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use canopy_protocols::mqtt::reason;
use tokio::time::Instant;

use super::session::Stage;

/// A breach of the protocol by the client: the connection closes with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("more unacknowledged QoS 1 and 2 publishes than the Receive Maximum")]
    ReceiveMaximumExceeded,
    #[error("PUBLISH without a topic or a topic alias")]
    NoTopic,
    #[error("topic alias {alias} is outside 1..={maximum}")]
    AliasOutOfRange { alias: u16, maximum: u16 },
    #[error("topic alias {0} was never defined")]
    AliasUnknown(u16),
    #[error("PUBREL before PUBREC")]
    ReleaseBeforeReceipt,
}

impl Violation {
    /// The MQTT 5 reason code that says it.
    pub fn code(&self) -> u8 {
        match self {
            Violation::ReceiveMaximumExceeded => reason::RECEIVE_MAXIMUM_EXCEEDED,
            Violation::AliasOutOfRange { .. } => reason::TOPIC_ALIAS_INVALID,
            Violation::NoTopic | Violation::AliasUnknown(_) | Violation::ReleaseBeforeReceipt => {
                reason::PROTOCOL_ERROR
            }
        }
    }
}

/// What an inbound QoS 1 or 2 publish waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundState {
    /// Handed to the store at this QoS; the store's answer is not back.
    Storing(u8),
    /// QoS 2 answered with PUBREC, waiting for PUBREL.
    Received,
}

/// What to do with an inbound publish, by its packet identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Not seen before: take it.
    New,
    /// A resend of one still held: not taken again; `pubrec` when its PUBREC should
    /// go out again.
    Resend { pubrec: bool },
}

/// The client-to-server half: QoS 1 and 2 publishes not yet finished, and the
/// client's topic aliases.
#[derive(Debug)]
pub struct InboundFlow {
    pending: HashMap<u16, InboundState>,
    /// Ours, announced in CONNACK.
    receive_maximum: u16,
    aliases: HashMap<u16, Bytes>,
    /// Ours, announced in CONNACK.
    alias_maximum: u16,
}

impl InboundFlow {
    pub fn new(receive_maximum: u16, alias_maximum: u16) -> Self {
        Self {
            pending: HashMap::new(),
            receive_maximum,
            aliases: HashMap::new(),
            alias_maximum,
        }
    }

    /// A publish at `qos` with `packet_id` arrived.
    pub fn arrive(&self, qos: u8, packet_id: u16) -> Result<Arrival, Violation> {
        if qos == 0 {
            return Ok(Arrival::New);
        }
        if let Some(state) = self.pending.get(&packet_id) {
            return Ok(Arrival::Resend {
                pubrec: *state == InboundState::Received && qos == 2,
            });
        }
        if self.pending.len() >= usize::from(self.receive_maximum) {
            return Err(Violation::ReceiveMaximumExceeded);
        }
        Ok(Arrival::New)
    }

    /// The publish went to the store; its answer will come by `store_answered`.
    pub fn storing(&mut self, packet_id: u16, qos: u8) {
        self.pending.insert(packet_id, InboundState::Storing(qos));
    }

    /// PUBREC went out for a QoS 2 publish: it waits for PUBREL.
    pub fn received(&mut self, packet_id: u16) {
        self.pending.insert(packet_id, InboundState::Received);
    }

    /// The QoS of `packet_id` when it waits for the store's answer.
    pub fn storing_qos(&self, packet_id: u16) -> Option<u8> {
        match self.pending.get(&packet_id) {
            Some(InboundState::Storing(qos)) => Some(*qos),
            _ => None,
        }
    }

    /// The store answered `packet_id`: its QoS when it was waiting for that answer,
    /// after which a QoS 1 publish (or a refused one, `taken == false`) is done and
    /// a taken QoS 2 one waits for PUBREL.
    pub fn store_answered(&mut self, packet_id: u16, taken: bool) -> Option<u8> {
        let Some(InboundState::Storing(qos)) = self.pending.get(&packet_id).copied() else {
            return None;
        };
        if qos == 2 && taken {
            self.pending.insert(packet_id, InboundState::Received);
        } else {
            self.pending.remove(&packet_id);
        }
        Some(qos)
    }

    /// PUBREL for `packet_id`: the PUBCOMP reason code to answer.
    pub fn release(&mut self, packet_id: u16) -> Result<u8, Violation> {
        match self.pending.get(&packet_id) {
            Some(InboundState::Received) => {
                self.pending.remove(&packet_id);
                Ok(reason::SUCCESS)
            }
            // The store's answer is not back: PUBREC was not sent.
            Some(InboundState::Storing(_)) => Err(Violation::ReleaseBeforeReceipt),
            None => Ok(reason::PACKET_IDENTIFIER_NOT_FOUND),
        }
    }

    /// The topic of a publish: `topic`, or what its alias stands for (a publish with
    /// both defines the alias).
    pub fn resolve_topic(&mut self, topic: &Bytes, alias: Option<u16>) -> Result<Bytes, Violation> {
        let Some(alias) = alias else {
            if topic.is_empty() {
                return Err(Violation::NoTopic);
            }
            return Ok(topic.clone());
        };
        if alias == 0 || alias > self.alias_maximum {
            return Err(Violation::AliasOutOfRange {
                alias,
                maximum: self.alias_maximum,
            });
        }
        if topic.is_empty() {
            return self
                .aliases
                .get(&alias)
                .cloned()
                .ok_or(Violation::AliasUnknown(alias));
        }
        let topic = Bytes::copy_from_slice(topic);
        self.aliases.insert(alias, topic.clone());
        Ok(topic)
    }

    /// QoS 2 publishes answered with PUBREC and waiting for PUBREL (kept in a saved
    /// session).
    pub fn awaiting_release(&self) -> impl Iterator<Item = u16> + '_ {
        self.pending
            .iter()
            .filter(|(_, s)| **s == InboundState::Received)
            .map(|(id, _)| *id)
    }
}

/// One delivery in flight to the client.
#[derive(Debug, Clone)]
pub struct Inflight<D> {
    pub packet_id: u16,
    pub stage: Stage,
    pub qos: u8,
    pub delivery: D,
}

/// What a PUBREC from the client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// Send PUBREL; the delivery now waits for PUBCOMP.
    Release,
    /// The client refused the delivery: its flow ends, a window slot is free.
    Refused,
    /// No QoS 2 delivery has that identifier (MQTT 5 answers PUBREL 0x92).
    Unknown,
}

/// How a topic goes out to a client that accepts aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutAlias {
    /// The client knows it by this alias: send the alias alone.
    Known(u16),
    /// Send the topic with this new alias (then `confirm_alias`).
    New(u16),
    /// Send the topic alone.
    None,
}

/// The server-to-client half: packet identifiers, deliveries in flight within the
/// client's Receive Maximum, and the aliases given to the client.
#[derive(Debug)]
pub struct OutboundFlow<D> {
    next_packet_id: u16,
    inflight: Vec<Inflight<D>>,
    /// The client's Receive Maximum (capped by ours).
    window: usize,
    /// The client's Topic Alias Maximum (capped by ours); 0: no aliases.
    alias_limit: u16,
    /// Made on first use: most clients take no aliases.
    aliases: Option<HashMap<String, u16>>,
}

impl<D> OutboundFlow<D> {
    pub fn new(window: usize, alias_limit: u16) -> Self {
        Self {
            next_packet_id: 1,
            inflight: Vec::new(),
            window: window.max(1),
            alias_limit,
            aliases: None,
        }
    }

    /// No QoS 1 or 2 delivery may go out until one in flight is acknowledged.
    pub fn window_full(&self) -> bool {
        self.inflight.len() >= self.window
    }

    /// A packet identifier no delivery in flight holds.
    pub fn next_packet_id(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            let id = self.next_packet_id;
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if !self.inflight.iter().any(|i| i.packet_id == id) {
                return Some(id);
            }
        }
        None
    }

    /// A PUBLISH went out with `packet_id` at `qos` (1 or 2).
    pub fn sent(&mut self, packet_id: u16, qos: u8, delivery: D) {
        self.inflight.push(Inflight {
            packet_id,
            stage: Stage::Published,
            qos,
            delivery,
        });
    }

    /// A delivery of a resumed session, in flight at `stage`; identifiers continue
    /// after its own.
    pub fn restore(&mut self, packet_id: u16, stage: Stage, qos: u8, delivery: D) {
        self.next_packet_id = self.next_packet_id.max(packet_id.wrapping_add(1)).max(1);
        self.inflight.push(Inflight {
            packet_id,
            stage,
            qos,
            delivery,
        });
    }

    /// PUBACK: true when it finished a QoS 1 delivery (a window slot is free).
    pub fn puback(&mut self, packet_id: u16) -> bool {
        self.finish(packet_id, Stage::Published, 1)
    }

    /// PUBCOMP: true when it finished a QoS 2 delivery (a window slot is free).
    pub fn pubcomp(&mut self, packet_id: u16) -> bool {
        self.finish(packet_id, Stage::Released, 2)
    }

    fn finish(&mut self, packet_id: u16, stage: Stage, qos: u8) -> bool {
        let found = self
            .inflight
            .iter()
            .position(|i| i.packet_id == packet_id && i.stage == stage && i.qos == qos);
        if let Some(at) = found {
            self.inflight.remove(at);
        }
        found.is_some()
    }

    /// PUBREC for `packet_id`, with the client's reason code.
    pub fn pubrec(&mut self, packet_id: u16, code: u8) -> Receipt {
        let Some(at) = self
            .inflight
            .iter()
            .position(|i| i.packet_id == packet_id && i.qos == 2)
        else {
            return Receipt::Unknown;
        };
        if code >= 0x80 {
            self.inflight.remove(at);
            return Receipt::Refused;
        }
        self.inflight[at].stage = Stage::Released;
        Receipt::Release
    }

    pub fn inflight(&self) -> &[Inflight<D>] {
        &self.inflight
    }

    /// How `topic` goes out.
    pub fn alias_for(&mut self, topic: &str) -> OutAlias {
        if self.alias_limit == 0 {
            return OutAlias::None;
        }
        let aliases = self.aliases.get_or_insert_with(HashMap::new);
        match aliases.get(topic) {
            Some(alias) => OutAlias::Known(*alias),
            None if aliases.len() < usize::from(self.alias_limit) => {
                OutAlias::New(u16::try_from(aliases.len() + 1).unwrap_or(u16::MAX))
            }
            None => OutAlias::None,
        }
    }

    /// The packet that carried `topic` with its new `alias` went out: the alias holds
    /// from now on.
    pub fn confirm_alias(&mut self, topic: &str, alias: u16) {
        if let Some(aliases) = self.aliases.as_mut() {
            aliases.insert(topic.to_owned(), alias);
        }
    }
}

/// The keep-alive: a client silent for one and a half periods is gone.
#[derive(Debug, Clone, Copy)]
pub struct KeepAlive {
    period: Option<Duration>,
    last_read: Instant,
}

impl KeepAlive {
    /// `period` 0: no keep-alive.
    pub fn new(period_secs: u16, now: Instant) -> Self {
        Self {
            period: (period_secs > 0).then(|| Duration::from_secs(u64::from(period_secs))),
            last_read: now,
        }
    }

    /// The client sent something at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.last_read = self.last_read.max(now);
    }

    /// When the client is gone unless it sends something first.
    pub fn due(&self) -> Option<Instant> {
        self.period.map(|k| self.last_read + k + k / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qos2_inbound_is_taken_once_and_released_once() {
        let mut flow = InboundFlow::new(2, 0);
        assert_eq!(flow.arrive(2, 7), Ok(Arrival::New));
        flow.storing(7, 2);
        // Resent before the store answered: not taken again, no PUBREC yet.
        assert_eq!(flow.arrive(2, 7), Ok(Arrival::Resend { pubrec: false }));
        assert_eq!(flow.release(7), Err(Violation::ReleaseBeforeReceipt));
        assert_eq!(flow.store_answered(7, true), Some(2));
        assert_eq!(flow.store_answered(7, true), None, "answered once");
        assert_eq!(flow.arrive(2, 7), Ok(Arrival::Resend { pubrec: true }));
        assert_eq!(flow.awaiting_release().collect::<Vec<_>>(), [7]);
        assert_eq!(flow.release(7), Ok(reason::SUCCESS));
        assert_eq!(flow.release(7), Ok(reason::PACKET_IDENTIFIER_NOT_FOUND));
        assert_eq!(
            flow.arrive(2, 7),
            Ok(Arrival::New),
            "a new flow may reuse the id"
        );
    }

    #[test]
    fn a_refused_qos2_publish_ends_its_flow_and_qos1_ends_at_the_answer() {
        let mut flow = InboundFlow::new(4, 0);
        flow.storing(1, 2);
        assert_eq!(flow.store_answered(1, false), Some(2));
        assert_eq!(flow.release(1), Ok(reason::PACKET_IDENTIFIER_NOT_FOUND));
        flow.storing(2, 1);
        assert_eq!(flow.store_answered(2, true), Some(1));
        assert_eq!(flow.arrive(1, 2), Ok(Arrival::New));
    }

    #[test]
    fn the_receive_maximum_bounds_unfinished_publishes() {
        let mut flow = InboundFlow::new(2, 0);
        flow.storing(1, 1);
        flow.received(2);
        assert_eq!(flow.arrive(1, 3), Err(Violation::ReceiveMaximumExceeded));
        assert_eq!(
            Violation::ReceiveMaximumExceeded.code(),
            reason::RECEIVE_MAXIMUM_EXCEEDED
        );
        assert_eq!(flow.arrive(0, 0), Ok(Arrival::New), "QoS 0 is not counted");
        assert_eq!(flow.release(2), Ok(reason::SUCCESS));
        assert_eq!(flow.arrive(1, 3), Ok(Arrival::New));
    }

    #[test]
    fn inbound_topic_aliases_are_defined_then_used() {
        let mut flow = InboundFlow::new(1, 2);
        let none = Bytes::new();
        assert_eq!(flow.resolve_topic(&none, None), Err(Violation::NoTopic));
        assert_eq!(
            flow.resolve_topic(&none, Some(1)),
            Err(Violation::AliasUnknown(1))
        );
        assert_eq!(
            flow.resolve_topic(&none, Some(3)),
            Err(Violation::AliasOutOfRange {
                alias: 3,
                maximum: 2
            })
        );
        let topic = Bytes::from_static(b"a/b");
        assert_eq!(flow.resolve_topic(&topic, Some(1)), Ok(topic.clone()));
        assert_eq!(flow.resolve_topic(&none, Some(1)), Ok(topic.clone()));
        let other = Bytes::from_static(b"c");
        assert_eq!(flow.resolve_topic(&other, Some(1)), Ok(other.clone()));
        assert_eq!(flow.resolve_topic(&none, Some(1)), Ok(other));
    }

    #[test]
    fn the_window_and_packet_ids_follow_acks() {
        let mut flow = OutboundFlow::new(2, 0);
        let a = flow.next_packet_id().expect("id");
        flow.sent(a, 1, "a");
        let b = flow.next_packet_id().expect("id");
        flow.sent(b, 2, "b");
        assert_ne!(a, b);
        assert!(flow.window_full());
        assert!(!flow.puback(b), "b is QoS 2: a PUBACK does not finish it");
        assert_eq!(flow.pubrec(b, reason::SUCCESS), Receipt::Release);
        assert!(!flow.pubcomp(a), "a is QoS 1");
        assert!(flow.pubcomp(b));
        assert!(flow.puback(a));
        assert!(!flow.window_full());
        assert_eq!(flow.pubrec(9, reason::SUCCESS), Receipt::Unknown);
        let c = flow.next_packet_id().expect("id");
        flow.sent(c, 2, "c");
        assert_eq!(flow.pubrec(c, 0x80), Receipt::Refused);
        assert!(flow.inflight().is_empty());
    }

    #[test]
    fn packet_ids_skip_those_in_flight_and_wrap_past_zero() {
        let mut flow = OutboundFlow::new(10, 0);
        flow.restore(u16::MAX, Stage::Released, 2, ());
        flow.restore(1, Stage::Published, 1, ());
        // After a restore the next id follows the highest restored one, wraps to 1,
        // and skips ids still in flight.
        let next = flow.next_packet_id().expect("id");
        assert_ne!(next, 0);
        assert_ne!(next, 1);
        assert_ne!(next, u16::MAX);
    }

    #[test]
    fn outbound_aliases_are_given_up_to_the_clients_maximum() {
        let mut flow = OutboundFlow::<()>::new(1, 1);
        assert_eq!(flow.alias_for("a/b"), OutAlias::New(1));
        // Not confirmed (the packet was not sent): offered again.
        assert_eq!(flow.alias_for("a/b"), OutAlias::New(1));
        flow.confirm_alias("a/b", 1);
        assert_eq!(flow.alias_for("a/b"), OutAlias::Known(1));
        assert_eq!(flow.alias_for("c"), OutAlias::None, "the maximum is 1");
        let mut none = OutboundFlow::<()>::new(1, 0);
        assert_eq!(none.alias_for("a/b"), OutAlias::None);
    }

    #[test]
    fn keep_alive_is_one_and_a_half_periods_after_the_last_read() {
        let start = Instant::now();
        let mut keep = KeepAlive::new(10, start);
        assert_eq!(keep.due(), Some(start + Duration::from_secs(15)));
        keep.heard(start + Duration::from_secs(4));
        assert_eq!(keep.due(), Some(start + Duration::from_secs(19)));
        keep.heard(start);
        assert_eq!(
            keep.due(),
            Some(start + Duration::from_secs(19)),
            "never moves back"
        );
        assert_eq!(KeepAlive::new(0, start).due(), None);
    }
}
