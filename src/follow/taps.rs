//! Taps: what a follower of the log registers with its tenant, so the sequencer's
//! routing offers it every stored message its pattern matches. Must never wait in
//! an offer: the sequencer calls it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use canopy_subjects::{Pattern, Trie};
use parking_lot::RwLock;
use tokio::sync::mpsc;

use crate::store::{Sequenced, StoredMessage};

/// One follower's side of its tenant's log, as the sequencer's routing sees it.
pub trait Tap: Send + Sync {
    /// A stored message the tap's pattern matches, in offset order. Takes it or marks
    /// it missed; never waits.
    fn offer(&self, message: &Sequenced<'_>);
    /// A store write failed or did not become durable: what was offered before may
    /// not be stored.
    fn lost(&self);
}

/// A tenant's taps, matched by pattern.
#[derive(Default)]
pub struct Taps {
    /// Whether any tap is registered: every stored message asks.
    any: AtomicBool,
    registered: RwLock<Registered>,
}

#[derive(Default)]
struct Registered {
    trie: Trie<u64>,
    taps: HashMap<u64, Arc<dyn Tap>>,
    next_id: u64,
}

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taps")
            .field("taps", &self.registered.read().taps.len())
            .finish()
    }
}

/// A tap's place in its tenant's taps; dropping it takes the tap out.
pub struct Registration {
    taps: Arc<Taps>,
    pattern: Pattern,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registered = self.taps.registered.write();
        registered.trie.remove(&self.pattern, None, &self.id);
        registered.taps.remove(&self.id);
        self.taps
            .any
            .store(!registered.taps.is_empty(), Ordering::Release);
    }
}

impl Taps {
    /// Registers `tap` for the stored messages `pattern` matches, from now on.
    pub fn register(self: &Arc<Self>, pattern: &Pattern, tap: Arc<dyn Tap>) -> Registration {
        let mut registered = self.registered.write();
        let id = registered.next_id;
        registered.next_id += 1;
        registered.trie.insert(pattern, None, id);
        registered.taps.insert(id, tap);
        self.any.store(true, Ordering::Release);
        Registration {
            taps: Arc::clone(self),
            pattern: pattern.clone(),
            id,
        }
    }

    /// Whether any tap is registered.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Acquire)
    }

    /// Offers a stored message to every tap whose pattern matches it. Called from the
    /// sequencer's routing.
    pub fn offer(&self, message: &Sequenced<'_>) {
        if self.is_empty() {
            return;
        }
        let registered = self.registered.read();
        registered
            .trie
            .for_each_match(message.subject, &mut |plain, _| {
                for id in plain {
                    if let Some(tap) = registered.taps.get(id) {
                        tap.offer(message);
                    }
                }
            });
    }

    /// A store write failed: every tap is told.
    pub fn lost(&self) {
        if self.is_empty() {
            return;
        }
        for tap in self.registered.read().taps.values() {
            tap.lost();
        }
    }
}

/// No gap: the queue has missed nothing since its gap was last taken.
const NO_GAP: u64 = u64::MAX;

/// A message as a [`Queue`] hands it over.
#[derive(Debug)]
pub struct Queued {
    pub message: StoredMessage,
    /// The queue's epoch when it was offered: a follower that starts reading the
    /// store again bumps the epoch, and what was queued before is not taken.
    pub epoch: u64,
}

/// A tap that queues copies of the offered messages for one follower, at most
/// `max_bytes` of headers and payload. What does not fit, or is offered once the
/// follower is gone, is its *gap*: the lowest offset it must read from the store.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::Sender<Queued>,
    gap: AtomicU64,
    epoch: AtomicU64,
    queued_bytes: AtomicUsize,
    max_bytes: usize,
    /// Wakes a follower waiting for the queue when it misses something instead.
    missed: tokio::sync::Notify,
}

impl Queue {
    /// A queue of at most `max_messages` and `max_bytes`, and its receiving end.
    pub fn new(max_messages: usize, max_bytes: usize) -> (Arc<Queue>, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(max_messages.max(1));
        let queue = Arc::new(Queue {
            tx,
            gap: AtomicU64::new(NO_GAP),
            epoch: AtomicU64::new(0),
            queued_bytes: AtomicUsize::new(0),
            max_bytes,
            missed: tokio::sync::Notify::new(),
        });
        (queue, rx)
    }

    /// The lowest offset missed since the last call, if any (0: anything offered may
    /// not be stored), and from now on nothing.
    pub fn take_gap(&self) -> Option<u64> {
        match self.gap.swap(NO_GAP, Ordering::AcqRel) {
            NO_GAP => None,
            gap => Some(gap),
        }
    }

    /// Has the queue missed anything since the gap was last taken?
    pub fn has_gap(&self) -> bool {
        self.gap.load(Ordering::Acquire) != NO_GAP
    }

    /// Starts a new epoch, returned: what is queued from before is stale.
    pub fn next_epoch(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Counts a message as taken off the queue.
    pub fn taken(&self, queued: &Queued) {
        self.queued_bytes
            .fetch_sub(size(&queued.message), Ordering::AcqRel);
    }

    fn missed(&self, offset: u64) {
        self.gap.fetch_min(offset, Ordering::AcqRel);
        self.missed.notify_one();
    }

    /// Until the queue misses something (at once if it did since the last wait).
    pub async fn missed_something(&self) {
        self.missed.notified().await;
    }
}

impl Tap for Queue {
    fn offer(&self, message: &Sequenced<'_>) {
        // A follower that is gone takes nothing: no copy.
        if self.tx.is_closed() {
            self.missed(message.offset);
            return;
        }
        let bytes = message.payload.len() + message.headers.len();
        if self.queued_bytes.load(Ordering::Acquire) + bytes > self.max_bytes {
            self.missed(message.offset);
            return;
        }
        // Copies: a shared handle could hold a whole connection's read buffer.
        let queued = Queued {
            message: StoredMessage {
                subject: message.subject.to_owned(),
                version: message.version,
                offset: message.offset,
                time_ms: message.time_ms,
                flags: message.flags,
                headers: Bytes::copy_from_slice(message.headers),
                payload: Bytes::copy_from_slice(message.payload),
            },
            epoch: self.epoch.load(Ordering::Acquire),
        };
        self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        if self.tx.try_send(queued).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.missed(message.offset);
        }
    }

    fn lost(&self) {
        self.missed(0);
    }
}

pub(super) fn size(message: &StoredMessage) -> usize {
    message.payload.len() + message.headers.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RouteTag;

    static EMPTY: Bytes = Bytes::new();
    static OBJECT: Bytes = Bytes::from_static(b"{}");

    fn sequenced<'a>(subject: &'a str, offset: u64, route: &'a RouteTag) -> Sequenced<'a> {
        Sequenced {
            tenant: "t",
            subject,
            version: 1,
            offset,
            time_ms: 5,
            flags: 0,
            headers: &EMPTY,
            payload: &OBJECT,
            route,
        }
    }

    fn pattern(text: &str) -> Pattern {
        Pattern::parse_native(text).expect("pattern")
    }

    #[test]
    fn offers_matching_messages_and_marks_what_it_drops() {
        let taps = Arc::new(Taps::default());
        let (queue, mut rx) = Queue::new(4, 1 << 20);
        let _registration = taps.register(&pattern("a.*"), Arc::clone(&queue) as Arc<dyn Tap>);
        let route = RouteTag::default();
        for message in [
            sequenced("a.1", 1, &route),
            sequenced("b.1", 2, &route),
            sequenced("a.2", 3, &route),
        ] {
            taps.offer(&message);
        }
        let first = rx.try_recv().expect("a.1");
        assert_eq!(
            (first.message.subject.as_str(), first.message.offset),
            ("a.1", 1)
        );
        queue.taken(&first);
        assert_eq!(rx.try_recv().expect("a.2").message.offset, 3);
        assert!(rx.try_recv().is_err(), "b.1 does not match");
        assert_eq!(queue.take_gap(), None);

        // A full queue: the lowest dropped offset is the gap.
        for offset in 10..20 {
            taps.offer(&sequenced("a.1", offset, &route));
        }
        assert_eq!(queue.take_gap(), Some(14));
        assert_eq!(queue.take_gap(), None);
        taps.lost();
        assert!(queue.has_gap());
        assert_eq!(queue.take_gap(), Some(0));
    }

    #[test]
    fn a_dropped_registration_is_offered_nothing() {
        let taps = Arc::new(Taps::default());
        let (queue, mut rx) = Queue::new(4, 1 << 20);
        let registration = taps.register(&pattern(">"), Arc::clone(&queue) as Arc<dyn Tap>);
        assert!(!taps.is_empty());
        drop(registration);
        assert!(taps.is_empty());
        let route = RouteTag::default();
        taps.offer(&sequenced("x", 1, &route));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn messages_carry_the_epoch_they_were_offered_in_and_bytes_are_bounded() {
        let taps = Arc::new(Taps::default());
        let (queue, mut rx) = Queue::new(100, 4);
        let _registration = taps.register(&pattern(">"), Arc::clone(&queue) as Arc<dyn Tap>);
        let route = RouteTag::default();
        taps.offer(&sequenced("x", 1, &route));
        assert_eq!(queue.next_epoch(), 1);
        taps.offer(&sequenced("x", 2, &route));
        // 2 bytes each, 4 at most: the third waits for room and is missed.
        taps.offer(&sequenced("x", 3, &route));
        assert_eq!(rx.try_recv().expect("x 1").epoch, 0);
        assert_eq!(rx.try_recv().expect("x 2").epoch, 1);
        assert_eq!(queue.take_gap(), Some(3));
    }
}
