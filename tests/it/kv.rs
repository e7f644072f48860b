//! Issue 30: async-nats's NATS KV (`jetstream::kv`), unmodified, against Canopy, short
//! of watching: a bucket made and bound, put, get (latest and a revision, over
//! DIRECT.GET, which async-nats buckets allow), create, update at a revision, delete,
//! purge (a rollup: the key's history goes), status and the bucket deleted; a stale
//! revision, an existing key, an unknown bucket and a value over the bucket's
//! `max_value_size` are refused.

use async_nats::jetstream::{self, kv};

use crate::common::{WAIT, start_default};

async fn within<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, step)
        .await
        .unwrap_or_else(|_| panic!("{what} answered in time"))
}

#[tokio::test]
async fn async_nats_kv_works_against_canopy() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let js = jetstream::new(client);

    assert!(
        within("get_key_value", js.get_key_value("cfg"))
            .await
            .is_err(),
        "an unknown bucket is not bound"
    );
    let config = kv::Config {
        bucket: "cfg".into(),
        history: 5,
        max_value_size: 64,
        ..Default::default()
    };
    let kv = within("create_key_value", js.create_key_value(config))
        .await
        .expect("a bucket is made");
    let bound = within("get_key_value", js.get_key_value("cfg"))
        .await
        .expect("the bucket is bound");

    let first = within("put", kv.put("color", "red".into()))
        .await
        .expect("put");
    let entry = within("entry", bound.entry("color"))
        .await
        .expect("entry")
        .expect("the key is there");
    assert_eq!((&entry.value[..], entry.revision), (&b"red"[..], first));
    // `max_value_size` (the stream's `max_msg_size`) bounds a value with its headers.
    let refused = within("put", kv.put("big", vec![b'x'; 65].into()))
        .await
        .expect_err("a value over the bucket's max_value_size is refused");
    assert!(refused.to_string().contains("maximum"), "{refused}");
    within("put", kv.put("fits", vec![b'x'; 60].into()))
        .await
        .expect("a value within it is taken");
    let second = within("update", kv.update("color", "blue".into(), first))
        .await
        .expect("an update at the last revision");
    assert!(second > first);
    assert!(
        within("stale update", kv.update("color", "green".into(), first))
            .await
            .is_err(),
        "an update at a stale revision is refused"
    );
    let old = within("entry_for_revision", kv.entry_for_revision("color", first))
        .await
        .expect("entry for a revision")
        .expect("the first revision is kept");
    assert_eq!(&old.value[..], b"red");

    within("create", kv.create("size", "m".into()))
        .await
        .expect("create of a new key");
    assert!(
        within("create again", kv.create("size", "l".into()))
            .await
            .is_err(),
        "create of an existing key is refused"
    );
    within("delete", kv.delete("size")).await.expect("delete");
    assert_eq!(within("get", kv.get("size")).await.expect("get"), None);

    within("purge", kv.purge("color")).await.expect("purge");
    assert_eq!(within("get", kv.get("color")).await.expect("get"), None);
    let gone = within("entry_for_revision", kv.entry_for_revision("color", first))
        .await
        .unwrap_or(None);
    assert!(
        gone.is_none(),
        "a revision from before the purge is gone: {gone:?}"
    );

    let status = within("status", kv.status()).await.expect("status");
    assert_eq!((status.bucket(), status.history()), ("cfg", 5));
    within("delete_key_value", js.delete_key_value("cfg"))
        .await
        .expect("the bucket is deleted");
    assert!(
        within("get_key_value", js.get_key_value("cfg"))
            .await
            .is_err()
    );
    server.stop().await;
}

/// The next entry of a watch, history or keys stream, within [`WAIT`].
async fn next<S, T, E>(what: &str, stream: &mut S) -> T
where
    S: futures::Stream<Item = Result<T, E>> + Unpin,
    E: std::fmt::Debug,
{
    use futures::StreamExt;
    within(what, stream.next())
        .await
        .unwrap_or_else(|| panic!("{what} ended"))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// async-nats's KV watching (`keys`, `history`, `watch_all`, `watch_with_history`,
/// `watch_all_from_revision`), each an ordered push consumer: initial values in the
/// order they were written, then live updates. (Its heartbeats are checked on the
/// wire in `push_consumers`: async-nats recovers from missing ones unseen.)
#[tokio::test]
async fn async_nats_kv_watches_against_canopy() {
    use futures::StreamExt;
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let js = jetstream::new(client);
    let config = kv::Config {
        bucket: "watched".into(),
        history: 10,
        ..Default::default()
    };
    let kv = within("create_key_value", js.create_key_value(config))
        .await
        .expect("a bucket is made");
    let mut revisions = Vec::new();
    for (key, value) in [("a", "1"), ("b", "2"), ("c.dot", "3"), ("a", "4")] {
        let revision = within("put", kv.put(key, value.into())).await.expect("put");
        if key == "a" {
            revisions.push(revision);
        }
    }
    within("delete", kv.delete("b")).await.expect("delete");

    let keys = within("keys", kv.keys()).await.expect("keys");
    let mut keys: Vec<String> = within("keys", keys.map(|k| k.expect("a key")).collect()).await;
    keys.sort();
    assert_eq!(keys, ["a", "c.dot"]);
    let history = within("history", kv.history("a")).await.expect("history");
    let history: Vec<kv::Entry> =
        within("history", history.map(|e| e.expect("an entry")).collect()).await;
    let seen: Vec<u64> = history.iter().map(|e| e.revision).collect();
    assert_eq!(seen, revisions);

    let mut all = within("watch_with_history", kv.watch_with_history(">"))
        .await
        .expect("watch");
    let mut initial = Vec::new();
    for _ in 0..3 {
        let entry = next("watch_with_history", &mut all).await;
        initial.push((entry.key, entry.operation));
    }
    assert_eq!(
        initial,
        [
            ("c.dot".to_owned(), kv::Operation::Put),
            ("a".to_owned(), kv::Operation::Put),
            ("b".to_owned(), kv::Operation::Delete),
        ]
    );
    let mut updates = within("watch_all", kv.watch_all())
        .await
        .expect("watch_all");
    let mut from = within(
        "watch_all_from_revision",
        kv.watch_all_from_revision(revisions[1]),
    )
    .await
    .expect("watch_all_from_revision");
    let from_first = next("watch_all_from_revision", &mut from).await;
    assert_eq!(
        (from_first.key.as_str(), from_first.revision),
        ("a", revisions[1])
    );

    let revision = within("put", kv.put("a", "5".into())).await.expect("put");
    for (what, watch) in [
        ("watch_with_history", &mut all),
        ("watch_all", &mut updates),
    ] {
        let entry = next(what, watch).await;
        assert_eq!(
            (entry.key.as_str(), &entry.value[..], entry.revision),
            ("a", &b"5"[..], revision),
            "{what}"
        );
    }
    server.stop().await;
}

/// A bucket's TTL (its stream's `max_age`): a key older than it is not found at once,
/// and the next retention pass removes it from the store.
#[tokio::test]
async fn a_buckets_ttl_expires_its_keys() {
    let mut config = crate::common::test_config();
    config.store.retention.interval_secs = 1;
    let server = crate::common::start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let js = jetstream::new(client.clone());
    let kv = within(
        "create_key_value",
        js.create_key_value(kv::Config {
            bucket: "short".into(),
            max_age: std::time::Duration::from_millis(800),
            ..Default::default()
        }),
    )
    .await
    .expect("a bucket with a TTL is made");
    let status = within("status", kv.status()).await.expect("status");
    assert_eq!(status.max_age(), std::time::Duration::from_millis(800));
    within("put", kv.put("k", "v".into())).await.expect("put");
    assert_eq!(
        within("get", kv.get("k")).await.expect("get").as_deref(),
        Some(&b"v"[..])
    );
    assert_eq!(
        crate::common::replay_subject(&client, "$KV.short.k")
            .await
            .len(),
        1,
        "the key is stored"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    assert_eq!(
        within("get", kv.get("k")).await.expect("get"),
        None,
        "an expired key is not found"
    );
    let removed = tokio::time::timeout(WAIT, async {
        while !crate::common::replay_subject(&client, "$KV.short.k")
            .await
            .is_empty()
        {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(removed.is_ok(), "retention removes an expired key");
    server.stop().await;
}
