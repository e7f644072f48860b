//! Stores written by earlier binaries stay readable: a committed fixture of format 1.

use std::path::{Path, PathBuf};

use crate::common::{local_folder_config, publish_acked, replay_subject, start};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read fixture") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[tokio::test]
async fn a_format_1_store_opens_and_reads_back() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-1");
    let folder = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture, folder.path());
    let server = start(local_folder_config(folder.path())).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");

    let a = replay_subject(&client, "fixture.a").await;
    let payloads: Vec<&[u8]> = a.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(payloads, [b"one".as_slice(), b"two".as_slice()]);
    assert_eq!(a.iter().map(|m| m.version).collect::<Vec<_>>(), [1, 2]);
    let b = replay_subject(&client, "fixture.b").await;
    assert_eq!(&b[0].payload[..], br#"{"k":1}"#);
    assert_eq!(
        b[0].headers
            .as_ref()
            .and_then(|h| h.get("Kind"))
            .map(|v| v.as_str()),
        Some("test")
    );
    let snapshot = client
        .request("$CANOPY.snapshot.get", r#"{"subject":"fixture.a"}"#.into())
        .await
        .expect("answered");
    assert_eq!(&snapshot.payload[..], b"state-1");
    // It goes on where it stopped: version 3, offset 4.
    let ack = publish_acked(&client, "fixture.a", "three").await;
    assert_eq!(
        (ack["version"].as_u64(), ack["seq"].as_u64()),
        (Some(3), Some(4))
    );
    server.stop().await;
}
