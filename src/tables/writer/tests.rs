//! The table writer's unit tests.

use super::*;

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
fn held_messages_are_counted_and_taken_whole() {
    let mut held = Held::default();
    assert!(held.since.is_none(), "nothing waits yet");
    held.push(message(3));
    held.push(message(4));
    assert_eq!(held.bytes, 4);
    let since = held.since.expect("the oldest waits since its push");
    held.push(message(5));
    assert_eq!(held.since, Some(since), "the oldest's time stays");
    let taken: Vec<u64> = held.take().iter().map(|m| m.offset).collect();
    assert_eq!(taken, [3, 4, 5]);
    assert_eq!((held.bytes, held.since.is_none()), (0, true));
}
