//! The table writers' live feed: each stored message the sequencer routes, offered to
//! every table whose tenant and pattern match, so a writer that keeps up never reads
//! the store back.
//!
//! The feed is only ever a shortcut for a read the writer could make. What it cannot
//! vouch for, it says with the feed's *gap*, the lowest offset the writer must read
//! from the store again: a message dropped because the writer's queue was full sets
//! it to that message's offset, and a store write that failed or never became durable
//! sets it to 0 (what was routed before it may not be stored). The writer takes the
//! gap after a durability barrier, and the barrier resolves only after any failure
//! before it has set the gap, so a row it commits from the feed is of a stored
//! message. Must never block the sequencer (offers use `try_send`) or hold more than
//! [`QUEUE_BYTES`] of payload per table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use canopy_subjects::{Pattern, Trie};
use parking_lot::RwLock;
use tokio::sync::mpsc;

use crate::store::{Sequenced, StoredMessage};

/// Messages queued for one table at most, and their payload and header bytes.
const QUEUE: usize = 65_536;
pub const QUEUE_BYTES: usize = 64 << 20;

/// No gap: the feed has missed nothing since its gap was last taken.
const NO_GAP: u64 = u64::MAX;

/// One table's side of the feed.
#[derive(Debug)]
pub struct Feed {
    tx: mpsc::Sender<Fed>,
    gap: AtomicU64,
    /// Bumped by the writer when it starts reading the store again: messages offered
    /// before carry the older epoch and are not taken from the queue.
    epoch: AtomicU64,
    queued_bytes: AtomicUsize,
}

/// A message as the feed hands it over.
#[derive(Debug)]
pub struct Fed {
    pub message: StoredMessage,
    pub epoch: u64,
}

impl Feed {
    /// The lowest offset missed since the last call, if any (0: anything routed may
    /// not be stored), and from now on nothing.
    pub fn take_gap(&self) -> Option<u64> {
        match self.gap.swap(NO_GAP, Ordering::AcqRel) {
            NO_GAP => None,
            gap => Some(gap),
        }
    }

    /// Has the feed missed anything since the gap was last taken?
    pub fn has_gap(&self) -> bool {
        self.gap.load(Ordering::Acquire) != NO_GAP
    }

    /// Starts a new epoch, returned: what is queued from before is stale.
    pub fn next_epoch(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Counts a message as taken off the queue.
    pub fn taken(&self, fed: &Fed) {
        self.queued_bytes
            .fetch_sub(size(&fed.message), Ordering::AcqRel);
    }

    fn offer(&self, message: &Sequenced<'_>) {
        // A writer that stopped takes nothing: no copy, and it reads the store anyway.
        if self.tx.is_closed() {
            self.missed(message.offset);
            return;
        }
        let bytes = message.payload.len() + message.headers.len();
        if self.queued_bytes.load(Ordering::Acquire) + bytes > QUEUE_BYTES {
            self.missed(message.offset);
            return;
        }
        let fed = Fed {
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
        if self.tx.try_send(fed).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.missed(message.offset);
        }
    }

    fn missed(&self, offset: u64) {
        self.gap.fetch_min(offset, Ordering::AcqRel);
    }
}

fn size(message: &StoredMessage) -> usize {
    message.payload.len() + message.headers.len()
}

/// Every table's feed, matched by tenant and pattern.
#[derive(Debug, Default)]
pub struct Feeds {
    any: AtomicBool,
    tables: RwLock<Vec<TableFeed>>,
}

/// A table's tenant, its pattern (as a trie of one) and its feed.
type TableFeed = (Arc<str>, Trie<usize>, Arc<Feed>);

impl Feeds {
    /// A feed of `tenant`'s stored messages on subjects `pattern` matches.
    pub fn register(&self, tenant: &str, pattern: &Pattern) -> (Arc<Feed>, mpsc::Receiver<Fed>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let feed = Arc::new(Feed {
            tx,
            gap: AtomicU64::new(NO_GAP),
            epoch: AtomicU64::new(0),
            queued_bytes: AtomicUsize::new(0),
        });
        let mut trie = Trie::new();
        trie.insert(pattern, None, 0);
        self.tables
            .write()
            .push((Arc::from(tenant), trie, Arc::clone(&feed)));
        self.any.store(true, Ordering::Release);
        (feed, rx)
    }

    /// Offers a routed batch to the matching feeds. Called from the sequencer.
    pub fn offer(&self, batch: &[Sequenced<'_>]) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let tables = self.tables.read();
        for message in batch {
            for (tenant, trie, feed) in tables.iter() {
                if **tenant != *message.tenant {
                    continue;
                }
                let mut matched = false;
                trie.for_each_match(message.subject, &mut |plain, _| {
                    matched |= !plain.is_empty();
                });
                if matched {
                    feed.offer(message);
                }
            }
        }
    }

    /// A store write failed or did not become durable: every feed must read the
    /// store again from its last commit.
    pub fn lost(&self) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        for (_, _, feed) in self.tables.read().iter() {
            feed.missed(0);
        }
    }
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

    #[test]
    fn offers_matching_messages_and_marks_what_it_drops() {
        let feeds = Feeds::default();
        let pattern = Pattern::parse_native("a.*").expect("pattern");
        let (feed, mut rx) = feeds.register("t", &pattern);
        let route = RouteTag::default();
        feeds.offer(&[
            sequenced("a.1", 1, &route),
            sequenced("b.1", 2, &route),
            sequenced("a.2", 3, &route),
        ]);
        let first = rx.try_recv().expect("a.1");
        assert_eq!(
            (first.message.subject.as_str(), first.message.offset),
            ("a.1", 1)
        );
        feed.taken(&first);
        assert_eq!(rx.try_recv().expect("a.2").message.offset, 3);
        assert!(rx.try_recv().is_err(), "b.1 does not match");
        assert_eq!(feed.take_gap(), None);

        // Another tenant's message is never offered.
        let other = Sequenced {
            tenant: "u",
            ..sequenced("a.3", 4, &route)
        };
        feeds.offer(&[other]);
        assert!(rx.try_recv().is_err());

        // A full queue: the lowest dropped offset is the gap.
        for offset in 10..(10 + QUEUE as u64 + 5) {
            feeds.offer(&[sequenced("a.1", offset, &route)]);
        }
        assert_eq!(feed.take_gap(), Some(10 + QUEUE as u64));
        assert_eq!(feed.take_gap(), None);
        feeds.lost();
        assert!(feed.has_gap());
        assert_eq!(feed.take_gap(), Some(0));
    }

    #[test]
    fn messages_carry_the_epoch_they_were_offered_in() {
        let feeds = Feeds::default();
        let pattern = Pattern::parse_native(">").expect("pattern");
        let (feed, mut rx) = feeds.register("t", &pattern);
        let route = RouteTag::default();
        feeds.offer(&[sequenced("x", 1, &route)]);
        assert_eq!(feed.next_epoch(), 1);
        feeds.offer(&[sequenced("x", 2, &route)]);
        assert_eq!(rx.try_recv().expect("x 1").epoch, 0);
        assert_eq!(rx.try_recv().expect("x 2").epoch, 1);
    }
}
