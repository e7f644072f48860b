//! Messages a group holds in memory until it hands them out, so a delivery needs no
//! read of the store: what the sequencer routed to the group (a group that keeps up
//! reads nothing), and the rest of a stored run that a read for one delivery brought
//! in (a group catching up reads a subject's run once, not once per version).
//!
//! Bounded twice: each group keeps at most [`GROUP_BYTES`], and all groups of the
//! server together at most [`SERVER_BYTES`]; past either the oldest go first, or
//! nothing more is kept, and a delivery of what is not kept reads the store as before.
//! Kept messages are copies, so they never hold a connection's read buffer or a whole
//! stored run in memory. This module never reads the store or decides a delivery.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};

use crate::store::StoredMessage;

/// Bytes one group keeps at most.
pub const GROUP_BYTES: usize = 16 << 20;
/// Bytes all groups of the server keep at most.
pub const SERVER_BYTES: usize = 256 << 20;
/// What a kept message costs beyond its headers and payload (its key, its place in
/// the order, the map's slot), counted so a million tiny messages are bounded too.
const OVERHEAD: usize = 96;

static SERVER_KEPT: AtomicUsize = AtomicUsize::new(0);

/// One message as a delivery needs it.
#[derive(Debug, Clone)]
pub struct KeptMessage {
    pub offset: u64,
    pub time_ms: u64,
    pub headers: Bytes,
    pub payload: Bytes,
}

impl KeptMessage {
    /// A copy of `headers` and `payload` in one allocation of their own.
    pub fn copied(offset: u64, time_ms: u64, headers: &[u8], payload: &[u8]) -> Self {
        let mut both = BytesMut::with_capacity(headers.len() + payload.len());
        both.extend_from_slice(headers);
        both.extend_from_slice(payload);
        let mut both = both.freeze();
        let headers = both.split_to(headers.len());
        Self {
            offset,
            time_ms,
            headers,
            payload: both,
        }
    }

    fn cost(&self, subject: &str) -> usize {
        self.headers.len() + self.payload.len() + subject.len() + OVERHEAD
    }
}

/// One group's kept messages, by subject and version, oldest first.
#[derive(Debug, Default)]
pub struct Kept {
    messages: HashMap<(Arc<str>, u64), KeptMessage>,
    /// Keys in the order they were kept; some may have been taken since.
    order: VecDeque<(Arc<str>, u64)>,
    bytes: usize,
}

impl Kept {
    /// Keeps `message` as `version` of `subject`, making room by letting the oldest
    /// go; keeps nothing when the server's bound is reached.
    pub fn keep(&mut self, subject: &Arc<str>, version: u64, message: KeptMessage) {
        let cost = message.cost(subject);
        if cost > GROUP_BYTES {
            return;
        }
        while self.bytes + cost > GROUP_BYTES && self.drop_oldest() {}
        let before = SERVER_KEPT.fetch_add(cost, Ordering::Relaxed);
        if before + cost > SERVER_BYTES {
            SERVER_KEPT.fetch_sub(cost, Ordering::Relaxed);
            return;
        }
        let key = (Arc::clone(subject), version);
        if let Some(old) = self.messages.insert(key.clone(), message) {
            self.release(old.cost(subject));
        } else {
            self.order.push_back(key);
        }
        self.bytes += cost;
        self.compact();
    }

    /// Keeps a copy of a message read from the store, unless it is kept already.
    pub fn keep_read(&mut self, subject: &Arc<str>, message: &StoredMessage) {
        if !self.holds(subject, message.version) {
            let copy = KeptMessage::copied(
                message.offset,
                message.time_ms,
                &message.headers,
                &message.payload,
            );
            self.keep(subject, message.version, copy);
        }
    }

    /// Takes the kept `version` of `subject`, if it is kept.
    pub fn take(&mut self, subject: &Arc<str>, version: u64) -> Option<KeptMessage> {
        let message = self.messages.remove(&(Arc::clone(subject), version))?;
        self.release(message.cost(subject));
        self.compact();
        Some(message)
    }

    /// Whether `version` of `subject` is kept.
    pub fn holds(&self, subject: &Arc<str>, version: u64) -> bool {
        self.messages.contains_key(&(Arc::clone(subject), version))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.messages.len()
    }

    fn drop_oldest(&mut self) -> bool {
        while let Some(key) = self.order.pop_front() {
            if let Some(old) = self.messages.remove(&key) {
                self.release(old.cost(&key.0));
                return true;
            }
        }
        false
    }

    fn release(&mut self, cost: usize) {
        self.bytes -= cost;
        SERVER_KEPT.fetch_sub(cost, Ordering::Relaxed);
    }

    /// Drops taken keys from the order once they outnumber the kept ones, so the
    /// order stays within a small multiple of what is kept.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.messages.len() + 1024 {
            let messages = &self.messages;
            self.order.retain(|key| messages.contains_key(key));
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        SERVER_KEPT.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(size: usize) -> KeptMessage {
        KeptMessage::copied(1, 2, b"NATS/1.0\r\n\r\n", &vec![7; size])
    }

    #[test]
    fn a_kept_message_is_taken_once_and_copies_its_bytes() {
        let mut kept = Kept::default();
        let subject: Arc<str> = Arc::from("a.1");
        let payload = Bytes::from(vec![1u8; 10]);
        kept.keep(&subject, 3, KeptMessage::copied(9, 8, b"", &payload));
        assert!(kept.holds(&subject, 3));
        let taken = kept.take(&subject, 3).expect("kept");
        assert_eq!(
            (taken.offset, taken.time_ms, &taken.payload[..]),
            (9, 8, &payload[..])
        );
        assert!(taken.headers.is_empty());
        assert_ne!(taken.payload.as_ptr(), payload.as_ptr(), "a copy");
        assert!(kept.take(&subject, 3).is_none(), "taken once");
        assert_eq!(kept.bytes, 0);
    }

    #[test]
    fn a_group_keeps_its_newest_within_its_bound() {
        let mut kept = Kept::default();
        let size = 64 << 10;
        let per = message(size).cost("s.x");
        let fits = GROUP_BYTES / per;
        for version in 1..=(fits as u64 + 10) {
            kept.keep(&Arc::from("s.x"), version, message(size));
        }
        assert!(kept.bytes <= GROUP_BYTES);
        assert_eq!(kept.len(), fits);
        assert!(!kept.holds(&Arc::from("s.x"), 10), "the oldest went first");
        assert!(kept.holds(&Arc::from("s.x"), fits as u64 + 10));
        // Taking and keeping many times leaves the order bounded.
        for version in 1..=100_000u64 {
            let subject: Arc<str> = Arc::from("t");
            kept.keep(&subject, version, message(1));
            kept.take(&subject, version);
        }
        assert!(kept.order.len() <= 2 * kept.len() + 1024);
    }
}
