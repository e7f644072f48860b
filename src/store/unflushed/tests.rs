//! The layer alone (joining runs, deletes, expiry, flush) and laid over a real
//! engine (`Engine`'s merged reads).

use std::sync::Arc;

use object_store::memory::InMemory;

use super::*;
use crate::store::Engine;
use crate::store::record::{RunBuilder, decode_run};

fn run(tenant: &str, subject: &str, first: u64, n: u64) -> (Bytes, Bytes) {
    let mut builder = RunBuilder::new(0);
    for v in first..first + n {
        builder.push(v * 10, 1, 0, b"", format!("p{v}").as_bytes());
    }
    (keys::message(tenant, subject, first), builder.finish())
}

fn round_of_runs(runs: &[(&str, u64, u64)]) -> Writes {
    let mut writes = Writes::default();
    for (subject, first, n) in runs {
        let (key, value) = run("t", subject, *first, *n);
        writes.put_run(key, value);
    }
    writes
}

fn payloads(value: Bytes) -> Vec<String> {
    decode_run(value)
        .expect("a run")
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect()
}

fn expect_put(look: Look) -> Bytes {
    match look {
        Look::Put(value) => value,
        other => panic!("expected a value, found {other:?}"),
    }
}

#[test]
fn runs_of_later_rounds_join_the_first_while_unflushed() {
    let layer = Unflushed::default();
    layer.apply(round_of_runs(&[("a", 1, 1), ("b", 1, 2)]), 1);
    layer.apply(round_of_runs(&[("a", 2, 3)]), 2);
    layer.apply(round_of_runs(&[("a", 5, 1), ("b", 3, 1)]), 3);
    let a = expect_put(layer.look(&keys::message("t", "a", 1)));
    assert_eq!(payloads(a), ["p1", "p2", "p3", "p4", "p5"]);
    let b = expect_put(layer.look(&keys::message("t", "b", 1)));
    assert_eq!(payloads(b), ["p1", "p2", "p3"]);
    // No version is readable under a second key.
    for key in [keys::message("t", "a", 2), keys::message("t", "a", 5)] {
        assert_eq!(layer.look(&key), Look::Absent);
    }
    let (found, _) = layer.range(
        (
            Bound::Included(&keys::message("t", "", 0)[..]),
            Bound::Unbounded,
        ),
        false,
    );
    assert_eq!(found.len(), 2, "one key per subject");
}

#[test]
fn a_run_that_does_not_follow_or_would_be_too_large_starts_its_own_key() {
    let layer = Unflushed::default();
    layer.apply(round_of_runs(&[("a", 1, 2)]), 1);
    // A gap (version 4 after 1..=2) is not joined.
    layer.apply(round_of_runs(&[("a", 4, 1)]), 2);
    assert!(matches!(
        layer.look(&keys::message("t", "a", 4)),
        Look::Put(_)
    ));
    // A run of the most messages a run holds is not joined to the one before.
    let most = u64::from(RUN_MAX_MESSAGES);
    layer.apply(round_of_runs(&[("a", 5, most)]), 3);
    let last = expect_put(layer.look(&keys::message("t", "a", 5)));
    assert_eq!(payloads(last).len(), RUN_MAX_MESSAGES as usize);
    let four = expect_put(layer.look(&keys::message("t", "a", 4)));
    assert_eq!(payloads(four), ["p4"]);
}

#[test]
fn a_round_that_deletes_a_subjects_key_does_not_extend_its_run() {
    let layer = Unflushed::default();
    layer.apply(round_of_runs(&[("a", 1, 1)]), 1);
    // The round deletes version 1 (a version limit of 1) and puts version 2: had
    // version 2 joined the key of version 1, the delete would take it too.
    let mut writes = round_of_runs(&[("a", 2, 1)]);
    writes.delete(keys::message("t", "a", 1));
    layer.apply(writes, 2);
    assert_eq!(layer.look(&keys::message("t", "a", 1)), Look::Deleted);
    let two = expect_put(layer.look(&keys::message("t", "a", 2)));
    assert_eq!(payloads(two), ["p2"]);
    // A plain put of a subject's message (a version-limited one) ends its run too.
    let mut writes = Writes::default();
    let (key, value) = run("t", "a", 3, 1);
    writes.put(key, value);
    layer.apply(writes, 3);
    layer.apply(round_of_runs(&[("a", 4, 1)]), 4);
    assert!(matches!(
        layer.look(&keys::message("t", "a", 4)),
        Look::Put(_)
    ));
}

#[test]
fn an_expiring_key_is_gone_once_its_time_is_up() {
    let layer = Unflushed::default();
    let mut writes = Writes::default();
    writes.put_expiring(Bytes::from_static(b"d\0t\0id"), Bytes::from_static(b"v"), 1);
    writes.put_expiring(
        Bytes::from_static(b"d\0t\0id2"),
        Bytes::from_static(b"v"),
        60_000,
    );
    layer.apply(writes, 1);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(layer.look(b"d\0t\0id"), Look::Deleted);
    assert_eq!(
        layer.look(b"d\0t\0id2"),
        Look::Put(Bytes::from_static(b"v"))
    );
}

#[test]
fn a_range_comes_in_either_order_with_deletions_as_none() {
    let layer = Unflushed::default();
    let mut writes = Writes::default();
    for key in ["k1", "k2", "k3"] {
        writes.put(Bytes::from(key), Bytes::from_static(b"v"));
    }
    writes.delete(Bytes::from_static(b"k2"));
    layer.apply(writes, 1);
    let all = (Bound::Included(&b"k"[..]), Bound::Excluded(&b"l"[..]));
    let keys_of = |found: Vec<(Bytes, Option<Bytes>)>| {
        found
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v.is_some()))
            .collect::<Vec<_>>()
    };
    let mut expected = vec![
        ("k1".to_owned(), true),
        ("k2".to_owned(), false),
        ("k3".to_owned(), true),
    ];
    assert_eq!(keys_of(layer.range(all, false).0), expected);
    expected.reverse();
    assert_eq!(keys_of(layer.range(all, true).0), expected);
    // A reversed or empty range is no panic, only nothing.
    let reversed = (Bound::Included(&b"l"[..]), Bound::Excluded(&b"k"[..]));
    assert!(layer.range(reversed, false).0.is_empty());
    let empty = (Bound::Excluded(&b"k"[..]), Bound::Excluded(&b"k"[..]));
    assert!(layer.range(empty, false).0.is_empty());
}

async fn engine() -> Engine {
    let db = Db::builder("db", Arc::new(InMemory::new()))
        .build()
        .await
        .expect("opens");
    Engine::new(db, true)
}

async fn scan_all(engine: &Engine, descending: bool) -> Vec<(String, String)> {
    let mut options = slatedb::config::ScanOptions::default();
    if descending {
        options = options.with_order(slatedb::IterationOrder::Descending);
    }
    let mut iter = engine
        .scan_with_options(b"k".to_vec()..b"l".to_vec(), &options)
        .await
        .expect("scans");
    let mut found = Vec::new();
    while let Some(kv) = iter.next().await.expect("next") {
        found.push((
            String::from_utf8_lossy(&kv.key).into_owned(),
            String::from_utf8_lossy(&kv.value).into_owned(),
        ));
    }
    found
}

#[tokio::test]
async fn reads_show_the_unflushed_rounds_over_the_engine_and_a_flush_changes_nothing_seen() {
    let engine = engine().await;
    let mut batch = WriteBatch::new();
    for key in ["k1", "k2", "k4"] {
        batch.put(key, "engine");
    }
    engine.write(batch).await.expect("writes");
    let mut writes = Writes::default();
    writes.put(Bytes::from_static(b"k2"), Bytes::from_static(b"layer"));
    writes.put(Bytes::from_static(b"k3"), Bytes::from_static(b"layer"));
    writes.delete(Bytes::from_static(b"k4"));
    writes.put(Bytes::from_static(b"k5"), Bytes::from_static(b"layer"));
    engine.unflushed().apply(writes, 7);

    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let expected = vec![
        pair("k1", "engine"),
        pair("k2", "layer"),
        pair("k3", "layer"),
        pair("k5", "layer"),
    ];
    assert_eq!(scan_all(&engine, false).await, expected);
    let mut reversed = expected.clone();
    reversed.reverse();
    assert_eq!(scan_all(&engine, true).await, reversed);
    assert_eq!(
        engine.get("k2").await.expect("gets"),
        Some(Bytes::from_static(b"layer"))
    );
    assert_eq!(engine.get("k4").await.expect("gets"), None);

    let flushes = engine.unflushed().flushes();
    let flush = || async { engine.unflushed().flush(engine.slatedb()).await };
    assert_eq!(flush().await.expect("flushes"), Some(7));
    assert_eq!(engine.unflushed().flushes(), flushes + 1);
    assert_eq!(engine.unflushed().bytes(), 0, "nothing held after a flush");
    assert_eq!(scan_all(&engine, false).await, expected);
    assert_eq!(
        engine.get(ROUND_KEY).await.expect("gets"),
        Some(Bytes::copy_from_slice(&7u64.to_be_bytes())),
        "the flush says which journal round the engine holds"
    );
    assert_eq!(flush().await.expect("flushes"), None, "nothing to flush");
}

#[tokio::test]
async fn a_joined_run_reaches_the_engine_as_one_key() {
    let engine = engine().await;
    for round in 0..10 {
        engine
            .unflushed()
            .apply(round_of_runs(&[("a", round * 3 + 1, 3)]), round + 1);
    }
    engine
        .unflushed()
        .flush(engine.slatedb())
        .await
        .expect("flushes");
    let range = keys::message_range("t", "a", 1);
    let mut iter = engine
        .scan_flushed(range, &slatedb::config::ScanOptions::default())
        .await
        .expect("scans");
    let kv = iter.next().await.expect("next").expect("one key");
    assert_eq!(kv.key, keys::message("t", "a", 1));
    let expected: Vec<String> = (1..=30).map(|v| format!("p{v}")).collect();
    assert_eq!(payloads(kv.value), expected);
    assert!(iter.next().await.expect("next").is_none(), "only one key");
}

#[tokio::test]
async fn a_flushed_read_shows_the_engine_without_what_the_unflushed_rounds_delete() {
    let engine = engine().await;
    let mut batch = WriteBatch::new();
    for key in ["k1", "k2"] {
        batch.put(key, "engine");
    }
    engine.write(batch).await.expect("writes");
    let mut writes = Writes::default();
    writes.delete(Bytes::from_static(b"k2"));
    writes.put(Bytes::from_static(b"k3"), Bytes::from_static(b"layer"));
    engine.unflushed().apply(writes, 1);
    let options = slatedb::config::ScanOptions::default();
    let mut iter = engine
        .scan_flushed(b"k".to_vec()..b"l".to_vec(), &options)
        .await
        .expect("scans");
    let mut found = Vec::new();
    while let Some(kv) = iter.next().await.expect("next") {
        found.push(String::from_utf8_lossy(&kv.key).into_owned());
    }
    // What the engine holds (k1), without what a round deleted (k2), and without
    // what only the rounds hold (k3).
    assert_eq!(found, ["k1"]);
    let read = slatedb::config::ReadOptions::default();
    assert_eq!(engine.get_flushed("k2", &read).await.expect("gets"), None);
    assert_eq!(engine.get_flushed("k3", &read).await.expect("gets"), None);
    assert!(
        engine
            .get_flushed("k1", &read)
            .await
            .expect("gets")
            .is_some()
    );
}
