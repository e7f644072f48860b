//! Snapshots, server-side compaction and purge, through the `$CANOPY.` API with
//! async-nats.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::common::{WAIT, start, test_config};

async fn call(client: &async_nats::Client, api: &str, body: Value) -> async_nats::Message {
    tokio::time::timeout(
        WAIT,
        client.request(api.to_owned(), body.to_string().into()),
    )
    .await
    .expect("answered in time")
    .expect("answered")
}

fn status(message: &async_nats::Message) -> Option<String> {
    Some(
        message
            .headers
            .as_ref()?
            .get("Canopy-Status")?
            .as_str()
            .to_owned(),
    )
}

fn header(message: &async_nats::Message, name: &str) -> Option<String> {
    Some(message.headers.as_ref()?.get(name)?.as_str().to_owned())
}

/// Publishes with a durable ack and returns the ack's version.
async fn publish(client: &async_nats::Client, subject: &str, payload: &str) -> u64 {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Canopy-Ack", "durable");
    let ack = tokio::time::timeout(
        WAIT,
        client.request_with_headers(subject.to_owned(), headers, Bytes::from(payload.to_owned())),
    )
    .await
    .expect("acked in time")
    .expect("acked");
    let value: Value = serde_json::from_slice(&ack.payload).expect("ack JSON");
    value["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("stored: {value}"))
}

/// The whole replay of one request (one page), as (version, snapshot?, payload).
async fn replay(client: &async_nats::Client, body: Value) -> Vec<(u64, bool, String)> {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.expect("sub");
    client
        .publish_with_reply("$CANOPY.replay", inbox, body.to_string().into())
        .await
        .expect("publish");
    let mut out = Vec::new();
    loop {
        let message = tokio::time::timeout(WAIT, answers.next())
            .await
            .expect("answer in time")
            .expect("open");
        assert_eq!(status(&message), None, "{:?}", message.payload);
        if header(&message, "Canopy-Done").is_some() {
            return out;
        }
        out.push((
            header(&message, "Canopy-Version")
                .and_then(|v| v.parse().ok())
                .expect("version"),
            header(&message, "Canopy-Snapshot").as_deref() == Some("true"),
            String::from_utf8_lossy(&message.payload).into_owned(),
        ));
    }
}

#[tokio::test]
async fn client_snapshots_and_replay_from_them() {
    let server = start(test_config()).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    for i in 1..=5 {
        publish(&client, "acct.1", &format!("e{i}")).await;
    }
    let put = call(
        &client,
        "$CANOPY.snapshot.put",
        json!({"subject": "acct.1", "version": 3, "data": "state-3"}),
    )
    .await;
    assert_eq!(status(&put), None);
    let refused = call(
        &client,
        "$CANOPY.snapshot.put",
        json!({"subject": "acct.1", "version": 9, "data": "x"}),
    )
    .await;
    assert_eq!(status(&refused).as_deref(), Some("409"));
    assert!(String::from_utf8_lossy(&refused.payload).contains("at version 5"));

    let got = call(
        &client,
        "$CANOPY.snapshot.get",
        json!({"subject": "acct.1"}),
    )
    .await;
    assert_eq!(&got.payload[..], b"state-3");
    assert_eq!(header(&got, "Canopy-Version").as_deref(), Some("3"));
    let missing = call(
        &client,
        "$CANOPY.snapshot.get",
        json!({"subject": "acct.2"}),
    )
    .await;
    assert_eq!(status(&missing).as_deref(), Some("404"));

    let from_snapshot = replay(&client, json!({"subject": "acct.1", "from": "snapshot"})).await;
    assert_eq!(
        from_snapshot,
        vec![
            (3, true, "state-3".to_owned()),
            (4, false, "e4".to_owned()),
            (5, false, "e5".to_owned())
        ]
    );
    // Without a snapshot, "from snapshot" is the whole history.
    publish(&client, "acct.2", "only").await;
    let whole = replay(&client, json!({"subject": "acct.2", "from": "snapshot"})).await;
    assert_eq!(whole, vec![(1, false, "only".to_owned())]);
    server.stop().await;
}

#[tokio::test]
async fn the_server_folds_json_merge_snapshots_and_can_drop_covered_history() {
    let mut config = test_config();
    let mut policy = config.store.policies[1].clone();
    policy.pattern = "cart.>".into();
    policy.snapshot_every = 3;
    policy.reducer = canopy::store::reduce::ReducerKind::JsonMerge;
    policy.keep_history = false;
    config.store.policies.insert(0, policy);
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    for patch in [
        r#"{"a":1}"#,
        r#"{"b":2}"#,
        r#"{"a":null,"c":3}"#,
        r#"{"d":4}"#,
    ] {
        publish(&client, "cart.9", patch).await;
    }
    // The fold runs in the background once version 3 is durable.
    let mut snapshot = None;
    for _ in 0..200 {
        let got = call(
            &client,
            "$CANOPY.snapshot.get",
            json!({"subject": "cart.9"}),
        )
        .await;
        if status(&got).is_none() {
            snapshot = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snapshot = snapshot.expect("the server wrote a snapshot");
    assert_eq!(header(&snapshot, "Canopy-Version").as_deref(), Some("3"));
    // A merged state is JSON and says so.
    assert_eq!(
        header(&snapshot, "Content-Type").as_deref(),
        Some("application/json")
    );
    let state: Value = serde_json::from_slice(&snapshot.payload).expect("JSON state");
    assert_eq!(state, json!({"b": 2, "c": 3}));
    // History below the snapshot is gone (the message at its version stays).
    let mut versions = Vec::new();
    for _ in 0..200 {
        versions = replay(&client, json!({"subject": "cart.9"}))
            .await
            .into_iter()
            .map(|(v, _, _)| v)
            .collect::<Vec<_>>();
        if versions == [3, 4] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(versions, [3, 4]);
    server.stop().await;
}

#[tokio::test]
async fn purge_deletes_history_but_never_reuses_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config();
    config.store.url = format!("file://{}", dir.path().display());
    let server = start(config.clone()).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    for i in 0..3 {
        publish(&client, "dev.1.temp", &i.to_string()).await;
        publish(&client, "dev.2.temp", &i.to_string()).await;
        publish(&client, "keep.me", &i.to_string()).await;
    }
    let purged = call(&client, "$CANOPY.purge", json!({"pattern": "dev.>"})).await;
    let value: Value = serde_json::from_slice(&purged.payload).expect("JSON");
    assert_eq!(value, json!({"subjects": 2, "messages": 6}));
    assert!(
        replay(&client, json!({"subject": "dev.1.temp"}))
            .await
            .is_empty()
    );
    assert_eq!(
        replay(&client, json!({"subject": "keep.me"})).await.len(),
        3
    );
    assert_eq!(publish(&client, "dev.1.temp", "after").await, 4);
    drop(client);
    server.stop().await;

    // After a restart the purged subject still continues from its old head.
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    assert_eq!(publish(&client, "dev.2.temp", "after restart").await, 4);
    assert_eq!(publish(&client, "dev.1.temp", "again").await, 5);
    server.stop().await;
}
