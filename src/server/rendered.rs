//! The JSON of a `/ws` delivery, rendered once per message however many connections
//! deliver it: with a thousand browsers on `devices.>`, escaping, base64 and
//! allocation per subscriber were most of the server's work.
//!
//! A delivery's text is `{"op":"msg","sid":N` and then a tail that is the same for
//! every subscriber; tails of recent messages are kept here, found by a 64-bit hash of
//! the whole message (seeded at random per process) and checked against its subject,
//! offset, version and the lengths of its parts. Comparing the payloads byte for byte
//! as well cost a fifth of the server's time in the 1,000-subscriber benchmark (the
//! kept copy is another core's memory), for a collision chance of about 2^-52 across
//! the kept window. Bounded in entries and bytes; large payloads are not kept. Must
//! never hold its lock while rendering.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::broker::envelope::Envelope;

/// Tails kept at most.
const MAX_ENTRIES: usize = 4096;
/// Bytes of kept messages and tails at most.
const MAX_BYTES: usize = 16 << 20;
/// Payloads larger than this are rendered per connection rather than kept.
const MAX_PAYLOAD: usize = 64 * 1024;

/// Recently rendered delivery tails, shared by every `/ws` connection.
#[derive(Default)]
pub struct RenderedDeliveries {
    ring: Mutex<Ring>,
    hasher: foldhash::fast::RandomState,
}

#[derive(Default)]
struct Ring {
    by_hash: HashMap<u64, Entry>,
    /// Hashes in insertion order, for eviction.
    order: VecDeque<u64>,
    bytes: usize,
}

/// What a kept tail is checked against (beyond its hash), and the tail.
struct Entry {
    subject: Bytes,
    /// Lengths of the reply, headers and payload.
    lengths: [usize; 3],
    version: u64,
    offset: u64,
    tail: Arc<str>,
}

fn lengths(envelope: &Envelope) -> [usize; 3] {
    [
        envelope.reply.len(),
        envelope.headers.len(),
        envelope.payload.len(),
    ]
}

impl Entry {
    fn size(&self) -> usize {
        self.subject.len() + self.tail.len() + 96
    }

    fn is(&self, envelope: &Envelope) -> bool {
        self.version == envelope.version
            && self.offset == envelope.offset
            && self.lengths == lengths(envelope)
            && self.subject == envelope.subject
    }
}

impl RenderedDeliveries {
    /// The tail of `envelope`'s text: kept, or made by `render` (called without the
    /// lock) and kept. `None` when `render` fails.
    pub fn tail(
        &self,
        envelope: &Envelope,
        render: impl FnOnce() -> Option<String>,
    ) -> Option<Arc<str>> {
        if envelope.payload.len() > MAX_PAYLOAD {
            return render().map(Arc::from);
        }
        let hash = self.hasher.hash_one((
            &envelope.subject[..],
            &envelope.reply[..],
            &envelope.headers[..],
            &envelope.payload[..],
            envelope.version,
            envelope.offset,
        ));
        if let Some(entry) = self.ring.lock().by_hash.get(&hash)
            && entry.is(envelope)
        {
            return Some(Arc::clone(&entry.tail));
        }
        let tail: Arc<str> = Arc::from(render()?);
        // Copied: the envelope's bytes are a slice of a connection's outbox buffer,
        // which a kept reference would hold on to whole.
        let entry = Entry {
            subject: Bytes::copy_from_slice(&envelope.subject),
            lengths: lengths(envelope),
            version: envelope.version,
            offset: envelope.offset,
            tail: Arc::clone(&tail),
        };
        self.ring.lock().insert(hash, entry);
        Some(tail)
    }
}

impl Ring {
    fn insert(&mut self, hash: u64, entry: Entry) {
        self.bytes += entry.size();
        match self.by_hash.insert(hash, entry) {
            Some(replaced) => self.bytes -= replaced.size(),
            None => self.order.push_back(hash),
        }
        while self.by_hash.len() > MAX_ENTRIES || self.bytes > MAX_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.by_hash.remove(&oldest) {
                self.bytes -= evicted.size();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(subject: &'static str, payload: &'static str, offset: u64) -> Envelope {
        Envelope {
            qos: 0,
            retain: false,
            subscription_id: 7,
            extra_ids: Vec::new(),
            version: offset,
            offset,
            subject: Bytes::from_static(subject.as_bytes()),
            reply: Bytes::new(),
            headers: Bytes::new(),
            payload: Bytes::from_static(payload.as_bytes()),
        }
    }

    #[test]
    fn a_message_is_rendered_once_and_a_different_one_again() {
        let rendered = RenderedDeliveries::default();
        let mut renders = 0;
        let mut tail = |e: &Envelope| {
            rendered
                .tail(e, || {
                    renders += 1;
                    Some(format!(",{}", String::from_utf8_lossy(&e.payload)))
                })
                .map(|t| t.to_string())
        };
        assert_eq!(tail(&envelope("a.b", "x", 1)).as_deref(), Some(",x"));
        assert_eq!(tail(&envelope("a.b", "x", 1)).as_deref(), Some(",x"));
        assert_eq!(tail(&envelope("a.b", "y", 2)).as_deref(), Some(",y"));
        // Same payload, another subject or offset: another message.
        assert_eq!(tail(&envelope("a.c", "x", 1)).as_deref(), Some(",x"));
        assert_eq!(tail(&envelope("a.b", "x", 3)).as_deref(), Some(",x"));
        assert_eq!(renders, 4);
    }

    #[test]
    fn the_ring_stays_within_its_bounds() {
        let rendered = RenderedDeliveries::default();
        for offset in 0..(MAX_ENTRIES as u64 + 100) {
            rendered.tail(&envelope("a.b", "x", offset), || Some("tail".into()));
        }
        let ring = rendered.ring.lock();
        assert_eq!(ring.by_hash.len(), MAX_ENTRIES);
        assert!(ring.bytes <= MAX_BYTES);
        assert_eq!(
            ring.bytes,
            ring.by_hash.values().map(Entry::size).sum::<usize>()
        );
    }
}
