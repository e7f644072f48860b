//! Issue 30: async-nats's NATS KV (`jetstream::kv`), unmodified, against Canopy, short
//! of watching: a bucket made and bound, put, get (latest and a revision, over
//! DIRECT.GET, which async-nats buckets allow), create, update at a revision, delete,
//! purge (a rollup: the key's history goes), status and the bucket deleted; a stale
//! revision, an existing key and an unknown bucket are refused.

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
