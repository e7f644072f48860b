//! MQTT sessions beyond one connection: the saved state of a persistent session, and
//! the registry that hands a client id from one connection to the next.
//!
//! A persistent session is saved in the store (one small record per client id) when
//! its connection ends and when its subscriptions change. It holds the filters, the
//! messages in flight with their packet identifiers, the QoS 2 publishes awaiting
//! PUBREL, and a *cursor*: the tenant offset from which the session has not yet
//! received messages. Messages published while the client is away are never copied
//! into the session; they are read from the stored streams from the cursor when it
//! returns. This module must never touch a socket or route a message.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine;
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Bumped when the record's meaning changes; older servers refuse newer records.
pub const RECORD_VERSION: u32 = 1;

/// A persistent session as saved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub version: u32,
    /// Seconds the session outlives its connection.
    pub expiry_secs: u32,
    /// When the connection ended (ms since the epoch); 0 while connected.
    pub disconnected_ms: u64,
    /// The next tenant offset the session has not received.
    pub cursor: u64,
    pub subscriptions: Vec<SavedSubscription>,
    pub inflight: Vec<SavedInflight>,
    /// QoS 2 publishes from the client answered with PUBREC, awaiting PUBREL.
    pub inbound_qos2: Vec<u16>,
}

impl SessionRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// `None` for a record this server cannot read (written by a newer one, or
    /// damaged): the session then starts afresh, which the log says.
    pub fn decode(bytes: &[u8]) -> Option<SessionRecord> {
        let record: SessionRecord = serde_json::from_slice(bytes).ok()?;
        (record.version <= RECORD_VERSION).then_some(record)
    }

    /// Whether the session ended before `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.disconnected_ms > 0
            && self
                .disconnected_ms
                .saturating_add(u64::from(self.expiry_secs) * 1000)
                < now_ms
    }
}

/// One subscription as the client made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSubscription {
    /// The filter exactly as sent, `$share/group/` prefix included.
    pub filter: String,
    pub qos: u8,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub subscription_id: u32,
}

/// Where a delivery in flight stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// PUBLISH sent, PUBACK or PUBREC not yet received.
    Published,
    /// PUBREC received and PUBREL sent, PUBCOMP not yet received.
    Released,
}

/// A delivery in flight, kept whole so it can be sent again with DUP after a
/// reconnect (its packet identifier must stay the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedInflight {
    pub packet_id: u16,
    pub stage: Stage,
    pub qos: u8,
    pub retain: bool,
    pub offset: u64,
    pub version: u64,
    pub time_ms: u64,
    pub subscription_ids: Vec<u32>,
    pub subject: String,
    #[serde(with = "base64_bytes")]
    pub reply: Bytes,
    #[serde(with = "base64_bytes")]
    pub headers: Bytes,
    #[serde(with = "base64_bytes")]
    pub payload: Bytes,
}

mod base64_bytes {
    use super::*;

    pub fn serialize<S: serde::Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

/// A client id within its tenant.
pub type SessionKey = (Arc<str>, String);

struct Slot {
    /// Bumped by every connection that claims the id: a delayed will fires only if
    /// nobody claimed it meanwhile.
    generation: u64,
    live: Option<Live>,
    /// A will waits for its delay; the slot must outlive the connection.
    will_pending: bool,
}

struct Live {
    conn: u64,
    handoff: Arc<Handoff>,
}

/// How one connection holding a client id learns that it must go, and how the next
/// one learns that it went. One small allocation per connection: devices stay
/// connected for days, so what an idle connection holds matters.
#[derive(Default)]
pub struct Handoff {
    taken_over: AtomicBool,
    /// Told to go because this node no longer serves its tenant, not for a new
    /// connection: it ends as at a shutdown (no will), and the client reconnects.
    moved: AtomicBool,
    released: AtomicBool,
    changed: Notify,
}

impl Handoff {
    fn take_over(&self) {
        self.taken_over.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Tells the holder to go because its tenant is served elsewhere from now on.
    fn move_away(&self) {
        self.moved.store(true, Ordering::Release);
        self.take_over();
    }

    /// Whether the holder was told to go by [`Sessions::move_away`].
    pub fn moved(&self) -> bool {
        self.moved.load(Ordering::Acquire)
    }

    /// Marks the session saved and the id let go.
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Resolves once a later connection has taken the id over. Cancel-safe.
    pub async fn taken_over(&self) {
        self.wait(&self.taken_over).await;
    }

    /// Resolves once the holder has released the id. Cancel-safe.
    pub async fn released(&self) {
        self.wait(&self.released).await;
    }

    async fn wait(&self, flag: &AtomicBool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the flag is read, so a change in between still wakes us.
            changed.as_mut().enable();
            if flag.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }
}

/// What a connection gets when it claims a client id.
pub struct Claim {
    pub generation: u64,
    /// This connection's handoff: told when a later connection takes the id, and
    /// released once this one has saved its session.
    pub handoff: Arc<Handoff>,
    /// The previous holder's handoff, if one held the id: it has been told to go.
    pub previous: Option<Arc<Handoff>>,
}

/// The client ids connected right now, per tenant.
#[derive(Default)]
pub struct Sessions {
    slots: Mutex<HashMap<SessionKey, Slot>>,
}

impl Sessions {
    /// Claims `key` for connection `conn`, telling any current holder to go.
    pub fn claim(&self, key: &SessionKey, conn: u64) -> Claim {
        let handoff = Arc::new(Handoff::default());
        let mut slots = self.slots.lock();
        let slot = slots.entry(key.clone()).or_insert(Slot {
            generation: 0,
            live: None,
            will_pending: false,
        });
        slot.generation += 1;
        let previous = slot.live.take().map(|old| {
            old.handoff.take_over();
            old.handoff
        });
        slot.live = Some(Live {
            conn,
            handoff: Arc::clone(&handoff),
        });
        Claim {
            generation: slot.generation,
            handoff,
            previous,
        }
    }

    /// Lets go of `key` if `conn` still holds it; `will_pending` keeps the slot for a
    /// delayed will.
    pub fn release(&self, key: &SessionKey, conn: u64, will_pending: bool) {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get_mut(key) {
            if slot.live.as_ref().is_some_and(|l| l.conn == conn) {
                slot.live = None;
            }
            slot.will_pending |= will_pending;
            if slot.live.is_none() && !slot.will_pending {
                slots.remove(key);
            }
        }
    }

    /// A delayed will is due: true when nobody claimed the id since `generation`
    /// (so the will is published). Forgets the slot when nothing else needs it.
    pub fn will_due(&self, key: &SessionKey, generation: u64) -> bool {
        let mut slots = self.slots.lock();
        let Some(slot) = slots.get_mut(key) else {
            return true;
        };
        let due = slot.generation == generation;
        if due || slot.live.is_none() {
            slot.will_pending = false;
        }
        if slot.live.is_none() && !slot.will_pending {
            slots.remove(key);
        }
        due
    }

    /// Tells every connection of the tenants `of` picks to go (this node no longer
    /// serves them); their handoffs, to wait for their sessions to be saved.
    pub fn move_away(&self, of: impl Fn(&str) -> bool) -> Vec<Arc<Handoff>> {
        let slots = self.slots.lock();
        slots
            .iter()
            .filter(|(key, _)| of(&key.0))
            .filter_map(|(_, slot)| slot.live.as_ref())
            .map(|live| {
                live.handoff.move_away();
                Arc::clone(&live.handoff)
            })
            .collect()
    }

    /// How many client ids are claimed or waiting for a will.
    pub fn len(&self) -> usize {
        self.slots.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(id: &str) -> SessionKey {
        (Arc::from("default"), id.to_owned())
    }

    #[tokio::test]
    async fn a_second_claim_takes_the_id_over() {
        let sessions = Sessions::default();
        let first = sessions.claim(&key("a"), 1);
        assert!(first.previous.is_none());
        let second = sessions.claim(&key("a"), 2);
        let told = tokio::time::timeout(Duration::from_secs(1), first.handoff.taken_over()).await;
        assert!(told.is_ok(), "the first holder is told to go");
        let previous = second.previous.expect("told about the first");
        let early = tokio::time::timeout(Duration::from_millis(20), previous.released()).await;
        assert!(early.is_err(), "not released before it let go");
        let waiting = tokio::spawn({
            let previous = Arc::clone(&previous);
            async move { previous.released().await }
        });
        first.handoff.release();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("released in time")
            .expect("the waiter ran");
        // The first connection's release does not free the id the second holds.
        sessions.release(&key("a"), 1, false);
        assert_eq!(sessions.len(), 1);
        sessions.release(&key("a"), 2, false);
        assert!(sessions.is_empty());
    }

    #[test]
    fn a_delayed_will_fires_only_if_nobody_came_back() {
        let sessions = Sessions::default();
        let gone = sessions.claim(&key("w"), 1);
        sessions.release(&key("w"), 1, true);
        assert!(sessions.will_due(&key("w"), gone.generation));
        assert!(sessions.is_empty());

        let gone = sessions.claim(&key("w"), 2);
        sessions.release(&key("w"), 2, true);
        let _back = sessions.claim(&key("w"), 3);
        assert!(!sessions.will_due(&key("w"), gone.generation));
    }

    #[test]
    fn records_round_trip_and_expire() {
        let record = SessionRecord {
            version: RECORD_VERSION,
            expiry_secs: 10,
            disconnected_ms: 1_000,
            cursor: 42,
            subscriptions: vec![SavedSubscription {
                filter: "$share/g/a/#".into(),
                qos: 1,
                no_local: false,
                retain_as_published: true,
                subscription_id: 3,
            }],
            inflight: vec![SavedInflight {
                packet_id: 7,
                stage: Stage::Published,
                qos: 2,
                retain: false,
                offset: 40,
                version: 2,
                time_ms: 900,
                subscription_ids: vec![3],
                subject: "a.b".into(),
                reply: Bytes::new(),
                headers: Bytes::from_static(b"NATS/1.0\r\n\r\n"),
                payload: Bytes::from_static(&[0, 255]),
            }],
            inbound_qos2: vec![9],
        };
        assert_eq!(
            SessionRecord::decode(&record.encode()),
            Some(record.clone())
        );
        assert!(!record.expired(11_000));
        assert!(record.expired(11_001));
        let newer = SessionRecord {
            version: RECORD_VERSION + 1,
            ..record
        };
        assert_eq!(SessionRecord::decode(&newer.encode()), None);
    }
}
