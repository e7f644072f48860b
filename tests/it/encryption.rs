//! Issue 31: envelope encryption at rest. A pattern sealed with a data key (wrapped by
//! a key-encryption key from a key file) leaves no plaintext in the store's files on
//! disk (journal and engine) or in its objects on S3 (moto's server), while readers
//! with rights get the plaintext on every front end; rotating the key-encryption key
//! re-wraps data keys without touching messages; shredding a pattern's keys makes
//! its messages unreadable, also after a restart.
//!
//! Each scan for plaintext also looks for an unsealed message written beside the
//! sealed ones, so a scan that could not find plaintext at all fails.

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

use crate::common::{
    WAIT, api, local_folder_config, publish_acked, replay_subject, replay_texts, start,
    test_config, use_s3,
};
use crate::frontends::{Ws, WsEvent, unb64};
use crate::mqtt::mqtt_addr;

const KEY_A: &str = "a:6b3a55e0262cb3a7ae2c35b5d2c1a1b04a8d7e1f09c3f2e4d5b6a79881726354";
const KEY_B: &str = "b:0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0";

/// Writes a key file holding `entries` (the last one current) and returns its path.
fn key_file(folder: &Path, entries: &[&str]) -> PathBuf {
    let path = folder.join("keys");
    std::fs::write(&path, entries.join("\n")).expect("write the key file");
    path
}

fn with_keys(mut config: canopy::config::Config, keys: &Path) -> canopy::config::Config {
    config.store.keys = Some(format!("file:{}", keys.display()));
    // Uncompressed, so the scan's control message is found as written.
    config.store.compression = canopy::config::Compression::None;
    config
}

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connects")
}

async fn seal(client: &async_nats::Client, pattern: &str) -> Value {
    let (status, answer) = api(client, "encryption.seal", json!({"pattern": pattern})).await;
    assert_eq!(status, 200, "encryption.seal {pattern}: {answer}");
    answer
}

fn marker(what: &str) -> String {
    format!(
        "{what}-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// Whether any file under `folder` holds `needle`.
fn folder_holds(folder: &Path, needle: &[u8]) -> bool {
    let mut stack = vec![folder.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                return true;
            }
        }
    }
    false
}

/// An MQTT 3.1.1 client (rumqttc) that publishes `payload` retained at QoS 1 and
/// waits for its PUBACK.
async fn mqtt_retain(addr: std::net::SocketAddr, topic: &str, payload: &str) {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let options = MqttOptions::new(marker("pub"), addr.ip().to_string(), addr.port());
    let (client, mut events) = AsyncClient::new(options, 16);
    client
        .publish(topic, QoS::AtLeastOnce, true, payload.to_owned())
        .await
        .expect("queued");
    tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(Packet::PubAck(_)) = events.poll().await.expect("mqtt") {
                return;
            }
        }
    })
    .await
    .expect("PUBACK within the wait");
    let _ = client.disconnect().await;
}

/// What a fresh MQTT subscriber to `filter` gets first (a retained message).
async fn mqtt_first(addr: std::net::SocketAddr, filter: &str) -> Bytes {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let options = MqttOptions::new(marker("sub"), addr.ip().to_string(), addr.port());
    let (client, mut events) = AsyncClient::new(options, 16);
    client
        .subscribe(filter, QoS::AtLeastOnce)
        .await
        .expect("queued");
    let payload = tokio::time::timeout(WAIT, async {
        loop {
            if let Event::Incoming(Packet::Publish(publish)) = events.poll().await.expect("mqtt") {
                return publish.payload;
            }
        }
    })
    .await
    .expect("a retained message within the wait");
    let _ = client.disconnect().await;
    payload
}

/// The payloads `/ws` replays of `subject`.
async fn ws_replay(server: &canopy::server::RunningServer, subject: &str) -> Vec<String> {
    let http = server.http_addr.expect("http on");
    let mut ws = Ws::open(http, None).await.expect("ws opens");
    let Some(WsEvent::Text(page)) = ws
        .call(json!({"op": "replay", "subject": subject, "from_version": 1}))
        .await
    else {
        panic!("no replay page");
    };
    page["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("{page}"))
        .iter()
        .map(|m| match (m["data"].as_str(), m["data_b64"].as_str()) {
            (_, Some(b64)) => String::from_utf8(unb64(b64).expect("base64")).expect("text"),
            (Some(text), None) => text.to_owned(),
            _ => m["data"].to_string(),
        })
        .collect()
}

/// Publishes sealed and unsealed messages on every door, checks every reader gets
/// the plaintext, and returns the (sealed, unsealed) markers.
async fn write_and_read(server: &canopy::server::RunningServer) -> (String, String) {
    let client = connect(server).await;
    let sealed = seal(&client, "vault.>").await;
    assert_eq!(sealed["key"]["pattern"], "vault.>", "{sealed}");
    assert_eq!(sealed["key"]["kek"], "a", "{sealed}");
    assert!(
        sealed["key"].get("wrapped").is_none(),
        "a key shown: {sealed}"
    );
    let (secret, open) = (marker("SECRET"), marker("OPEN"));
    let mut live = client.subscribe("vault.a").await.expect("subscribe");
    client.flush().await.expect("flush");
    for i in 0..3 {
        publish_acked(&client, "vault.a", format!("{secret}-{i}")).await;
    }
    publish_acked(&client, "plain.a", open.clone()).await;
    let mqtt = mqtt_addr(server);
    mqtt_retain(mqtt, "vault/r", &format!("{secret}-retained")).await;

    // Live, replayed, got, retained, over /ws: every reader gets the plaintext.
    let first = tokio::time::timeout(WAIT, live.next())
        .await
        .expect("live within the wait")
        .expect("a message");
    assert_eq!(first.payload, format!("{secret}-0").as_bytes());
    let want: Vec<String> = (0..3).map(|i| format!("{secret}-{i}")).collect();
    assert_eq!(replay_texts(&client, "vault.a").await, want);
    let body = json!({"subject": "vault.a", "version": 2}).to_string();
    let got = tokio::time::timeout(WAIT, client.request("$CANOPY.get", body.into()))
        .await
        .expect("$CANOPY.get answers within the wait")
        .expect("$CANOPY.get answers");
    assert_eq!(got.payload, format!("{secret}-1").as_bytes());
    assert_eq!(
        mqtt_first(mqtt, "vault/r").await,
        format!("{secret}-retained").as_bytes()
    );
    assert_eq!(ws_replay(server, "vault.a").await, want);
    (secret, open)
}

#[tokio::test]
async fn a_sealed_pattern_leaves_no_plaintext_on_disk_and_readers_get_it_everywhere() {
    let folder = tempfile::tempdir().expect("tempdir");
    let keys = key_file(folder.path(), &[KEY_A]);
    let store = folder.path().join("store");
    let config = || with_keys(local_folder_config(&store), &keys);
    let server = start(config()).await;
    let (secret, open) = write_and_read(&server).await;
    // While running: the journal and whatever the engine wrote.
    assert!(
        folder_holds(&store, open.as_bytes()),
        "the scan finds no plaintext at all"
    );
    assert!(
        !folder_holds(&store, secret.as_bytes()),
        "sealed plaintext on disk (running)"
    );
    server.stop().await;
    // Stopped: everything flushed into the engine's files.
    assert!(
        !folder_holds(&store, secret.as_bytes()),
        "sealed plaintext on disk (stopped)"
    );

    // Another start reads the data key back (unwrapped by the key file) and opens them.
    let server = start(config()).await;
    let client = connect(&server).await;
    let want: Vec<String> = (0..3).map(|i| format!("{secret}-{i}")).collect();
    assert_eq!(replay_texts(&client, "vault.a").await, want);
    assert_eq!(
        mqtt_first(mqtt_addr(&server), "vault/r").await,
        format!("{secret}-retained").as_bytes()
    );
    server.stop().await;

    // Without the key file the store does not open: nothing reads as shredded by mistake.
    let mut keyless = local_folder_config(&store);
    keyless.store.compression = canopy::config::Compression::None;
    let refused = canopy::server::Server::bind(keyless).await;
    assert!(
        refused.is_err(),
        "a store with data keys opened without its keys"
    );
}

#[tokio::test]
async fn a_sealed_pattern_leaves_no_plaintext_in_s3() {
    use object_store::{ObjectStore as _, ObjectStoreExt as _};
    let folder = tempfile::tempdir().expect("tempdir");
    let keys = key_file(folder.path(), &[KEY_A]);
    let prefix = format!("sealed-{:016x}", fastrand::u64(..));
    let mut config = with_keys(test_config(), &keys);
    use_s3(&mut config, &prefix);
    let s3 = config.store.s3.clone();
    let server = start(config).await;
    let (secret, open) = write_and_read(&server).await;
    server.stop().await;

    let bucket = canopy::store::s3_client("canopy-tests", &s3).expect("an S3 client");
    let listed: Vec<_> = bucket
        .list(Some(&object_store::path::Path::from(prefix.as_str())))
        .collect()
        .await;
    let (mut objects, mut found_open) = (0, false);
    for meta in listed {
        let meta = meta.expect("listed");
        let bytes = bucket
            .get(&meta.location)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        objects += 1;
        let holds = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
        found_open |= holds(&open);
        assert!(!holds(&secret), "sealed plaintext in {}", meta.location);
    }
    assert!(objects > 0, "nothing under {prefix}");
    assert!(
        found_open,
        "the scan finds no plaintext at all in {objects} objects"
    );
}

#[tokio::test]
async fn rotating_keys_rewraps_them_and_shredding_makes_messages_unreadable_for_good() {
    let folder = tempfile::tempdir().expect("tempdir");
    let store = folder.path().join("store");
    let start_with = |entries: &'static [&'static str]| {
        let keys = key_file(folder.path(), entries);
        start(with_keys(local_folder_config(&store), &keys))
    };
    let server = start_with(&[KEY_A]).await;
    let client = connect(&server).await;
    let first = seal(&client, "k.>").await;
    publish_acked(&client, "k.1", "one").await;
    // A data key rotated: new messages take the new key, old ones keep theirs.
    let second = seal(&client, "k.>").await;
    assert_eq!(second["rotated"], json!([first["key"]["id"]]), "{second}");
    publish_acked(&client, "k.1", "two").await;
    publish_acked(&client, "other.1", "kept").await;
    assert_eq!(replay_texts(&client, "k.1").await, ["one", "two"]);
    server.stop().await;

    // The key-encryption key rotated: `b` added after `a`, the data keys re-wrapped...
    let server = start_with(&[KEY_A, KEY_B]).await;
    let client = connect(&server).await;
    let (status, listed) = api(&client, "encryption.list", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    let keys = listed["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "{listed}");
    assert!(keys.iter().all(|k| k["kek"] == "b"), "{listed}");
    assert_eq!(
        keys.iter().filter(|k| k["sealing"] == true).count(),
        1,
        "{listed}"
    );
    server.stop().await;
    // ...so `a` can go, and every message still reads.
    let server = start_with(&[KEY_B]).await;
    let client = connect(&server).await;
    assert_eq!(replay_texts(&client, "k.1").await, ["one", "two"]);

    let (status, shredded) = api(&client, "encryption.shred", json!({"pattern": "k.>"})).await;
    assert_eq!(status, 200, "{shredded}");
    assert_eq!(
        shredded["shredded"].as_array().map(Vec::len),
        Some(2),
        "{shredded}"
    );
    // The two shredded versions stay, unreadable; what follows them reads.
    let unreadable = |client: async_nats::Client, after: &'static [&'static str]| async move {
        let mut stored = replay_subject(&client, "k.1").await;
        assert_eq!(stored.len(), 2 + after.len(), "versions stay, unreadable");
        let rest = stored.split_off(2);
        assert_eq!(rest.iter().map(|m| m.text()).collect::<Vec<_>>(), after);
        for message in stored {
            assert!(
                message.payload.is_empty(),
                "shredded but read: {:?}",
                message.payload
            );
            let why = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Canopy-Unreadable"))
                .map(|v| v.to_string());
            assert!(
                why.is_some_and(|w| w.contains("shredded")),
                "{:?}",
                message.headers
            );
        }
        assert_eq!(replay_texts(&client, "other.1").await, ["kept"]);
    };
    unreadable(client.clone(), &[]).await;
    // Not sealed any more: a new message is stored as it is, and reads.
    publish_acked(&client, "k.1", "three").await;
    assert_eq!(
        replay_texts(&client, "k.1")
            .await
            .last()
            .map(String::as_str),
        Some("three")
    );
    server.stop().await;

    let server = start_with(&[KEY_B]).await;
    unreadable(connect(&server).await, &["three"]).await;
    let (status, listed) = api(&connect(&server).await, "encryption.list", json!({})).await;
    assert_eq!(
        (status, listed["keys"].clone()),
        (200, json!([])),
        "{listed}"
    );
    server.stop().await;
}

#[tokio::test]
async fn sealing_calls_are_refused_with_why() {
    // No key-encryption keys configured.
    let server = start(test_config()).await;
    let client = connect(&server).await;
    let (status, answer) = api(&client, "encryption.seal", json!({"pattern": "x.>"})).await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer.to_string().contains("store.keys"), "{answer}");
    server.stop().await;

    let folder = tempfile::tempdir().expect("tempdir");
    let keys = key_file(folder.path(), &[KEY_A]);
    let server = start(with_keys(test_config(), &keys)).await;
    let client = connect(&server).await;
    for (op, body, want, says) in [
        ("encryption.seal", json!({"pattern": "a b"}), 400, "pattern"),
        (
            "encryption.seal",
            json!({"pattern": "$CANOPY.>"}),
            400,
            "server's own",
        ),
        ("encryption.seal", json!({}), 400, "pattern"),
        (
            "encryption.stop",
            json!({"pattern": "x.>"}),
            404,
            "not sealed",
        ),
        (
            "encryption.shred",
            json!({"pattern": "x.>"}),
            404,
            "no data keys",
        ),
        (
            "encryption.rotate",
            json!({"pattern": "x.>"}),
            404,
            "encryption.seal",
        ),
    ] {
        let (status, answer) = api(&client, op, body).await;
        assert_eq!(status, want, "{op}: {answer}");
        assert!(
            answer.to_string().contains(says),
            "{op} says {says}: {answer}"
        );
    }
    // Stopped: new messages go in clear, old ones still open.
    seal(&client, "s.>").await;
    publish_acked(&client, "s.1", "sealed").await;
    let (status, answer) = api(&client, "encryption.stop", json!({"pattern": "s.>"})).await;
    assert_eq!(
        (status, answer["stopped"].clone()),
        (200, json!(1)),
        "{answer}"
    );
    publish_acked(&client, "s.1", "clear").await;
    assert_eq!(replay_texts(&client, "s.1").await, ["sealed", "clear"]);
    server.stop().await;
}

#[tokio::test]
async fn the_cli_seals_rotates_lists_and_shreds() {
    use crate::schemas::{canopy, canopy_ok};
    let folder = tempfile::tempdir().expect("tempdir");
    let keys = key_file(folder.path(), &[KEY_A]);
    let server = start(with_keys(test_config(), &keys)).await;
    let client = connect(&server).await;
    let addr = server.native_addr.to_string();
    let sealed = canopy_ok(&["encryption", "seal", "cli.>", "--server", &addr]).await;
    assert!(sealed.starts_with("cli.>  key "), "{sealed}");
    assert!(sealed.contains("sealing  wrapped by a"), "{sealed}");
    publish_acked(&client, "cli.x", "one").await;
    let rotated = canopy_ok(&["encryption", "seal", "cli.>", "--server", &addr]).await;
    assert!(
        rotated.contains("now only opens what it sealed"),
        "{rotated}"
    );
    let listed = canopy_ok(&["encryption", "list", "--json", "--server", &addr]).await;
    let listed: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(replay_texts(&client, "cli.x").await, ["one"]);

    let unsure = canopy(&["encryption", "shred", "cli.>", "--server", &addr]).await;
    assert!(!unsure.status.success(), "shredded without --yes");
    assert!(String::from_utf8_lossy(&unsure.stderr).contains("--yes"));
    let shredded = canopy_ok(&["encryption", "shred", "cli.>", "--yes", "--server", &addr]).await;
    assert!(shredded.contains("unreadable"), "{shredded}");
    let stored = replay_subject(&client, "cli.x").await;
    assert_eq!(stored.len(), 1);
    assert!(stored[0].payload.is_empty());
    let listed = canopy_ok(&["encryption", "list", "--server", &addr]).await;
    assert!(listed.is_empty(), "{listed}");
    server.stop().await;
}

/// `/api/encryption`: the same operations over HTTP.
#[tokio::test]
async fn data_keys_are_managed_over_http() {
    use crate::common::http_request;
    let folder = tempfile::tempdir().expect("tempdir");
    let keys = key_file(folder.path(), &[KEY_A]);
    let server = start(with_keys(test_config(), &keys)).await;
    let http = server.http_addr.expect("http on");
    let (status, body) = http_request(http, "PUT", "/api/encryption/w.%3E", &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""pattern":"w.>""#), "{body}");
    let (status, body) = http_request(http, "GET", "/api/encryption", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(listed["keys"].as_array().map(Vec::len), Some(1), "{listed}");
    let (status, body) = http_request(http, "POST", "/api/encryption/w.%3E/stop", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_request(http, "DELETE", "/api/encryption/w.%3E", &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("shredded"), "{body}");
    let (status, body) = http_request(http, "DELETE", "/api/encryption/w.%3E", &[], "").await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}
