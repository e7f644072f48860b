//! The table writer's unit tests.

use super::*;
use crate::store::{RouteTag, Sequenced};

static EMPTY: bytes::Bytes = bytes::Bytes::new();
static OBJECT: bytes::Bytes = bytes::Bytes::from_static(b"{}");

fn message(offset: u64) -> StoredMessage {
    StoredMessage {
        subject: "a.1".into(),
        version: offset,
        offset,
        time_ms: 0,
        flags: 0,
        headers: bytes::Bytes::new(),
        payload: bytes::Bytes::from_static(b"{}"),
    }
}

#[test]
fn held_messages_follow_the_feed_and_forget_what_follows_a_gap() {
    let feeds = Feeds::default();
    let (feed, mut rx) = feeds.register("t", &Pattern::parse_native("a.*").expect("pattern"));
    let route = RouteTag::default();
    let offer = |offset| {
        feeds.offer(&[Sequenced {
            tenant: "t",
            subject: "a.1",
            version: offset,
            offset,
            time_ms: 0,
            flags: 0,
            headers: &EMPTY,
            payload: &OBJECT,
            route: &route,
        }]);
    };
    let mut held = Held::after(2);
    held.push(message(3));
    held.next = 4;
    offer(2); // queued before the writer's epoch: stale
    let epoch = feed.next_epoch();
    offer(3); // held already
    offer(4);
    offer(6);
    while let Ok(fed) = rx.try_recv() {
        held.take(&feed, fed, epoch);
    }
    let offsets: Vec<u64> = held.waiting.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, [3, 4, 6]);
    assert_eq!((held.next, held.bytes), (7, 6));

    // A message at 5 was missed: 6 goes, and reading resumes at 5.
    held.forget_from(5);
    let offsets: Vec<u64> = held.waiting.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, [3, 4]);
    assert_eq!(held.next, 5);
    // A lost write: all of it, from after the commit.
    held.forget_from(0);
    assert!(held.waiting.is_empty());
    assert_eq!((held.next, held.bytes), (3, 0));
}
