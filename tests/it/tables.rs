//! `[[tables]]`: a pattern's stored messages as an Iceberg table, read back by
//! pyiceberg (an independent reader, in the venv scripts/test-all.sh makes) through
//! the table's SQL catalog, or from the bucket on S3: every stored message exactly
//! once, across a restart and a `kill -9`, with the columns the pattern and its
//! schema give.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{api, js_publish_to_tenant, local_folder_config, start};

fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/test-all.sh, which creates it with pyiceberg",
        python.display()
    );
    python
}

/// What pyiceberg reads of the table (`None` while the table does not exist yet).
async fn read(folder: &Path, day: Option<&str>) -> Option<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/iceberg_read.py");
    let mut command = tokio::process::Command::new(python());
    command.arg(script).arg(folder).arg("iot.devices_temp");
    if let Some(day) = day {
        command.arg(day);
    }
    let output = command.output().await.expect("python runs");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("NoSuchTable") || stderr.contains("does not exist"),
            "pyiceberg failed: {stderr}"
        );
        return None;
    }
    Some(serde_json::from_slice(&output.stdout).expect("JSON from the reader"))
}

/// Reads until the table holds `rows` rows (committed every second).
pub(crate) async fn read_rows(folder: &Path, rows: usize, day: Option<&str>) -> Value {
    let mut last = None;
    for _ in 0..60 {
        if let Some(found) = read(folder, day).await {
            if found["rows"].as_array().map(Vec::len) == Some(rows) {
                return found;
            }
            last = Some(found);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the table never held {rows} rows; last read: {last:?}");
}

/// Puts a schema binding, and panics unless it was taken.
async fn bind_schema(client: &async_nats::Client, put: Value) {
    let (status, body) = api(client, "schema.put", put).await;
    assert_eq!(status, 200, "{body}");
}

/// The offsets of the rows the reader found, each once.
pub(crate) fn distinct_offsets(found: &Value) -> Vec<u64> {
    let mut offsets: Vec<u64> = found["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["offset"].as_u64().expect("offset"))
        .collect();
    offsets.sort_unstable();
    offsets.dedup();
    offsets
}

fn config(folder: &Path) -> canopy::config::Config {
    let mut config = local_folder_config(&folder.join("store"));
    config.tables.push(canopy::config::TableConfig {
        pattern: "devices.*.temp".into(),
        table: "iot.devices_temp".into(),
        tenant: "default".into(),
        columns: vec!["device".into()],
        commit_secs: 1,
        commit_mib: 64,
        folder: Some(folder.join("tables")),
    });
    config
}

async fn publish(client: &async_nats::Client, from: u64, to: u64) {
    let js = async_nats::jetstream::new(client.clone());
    for i in from..to {
        let payload = json!({"temp": i as f64 + 0.5, "unit": "C", "where": {"room": i % 3}});
        let subject = format!("devices.d{}.temp", i % 4);
        js_publish_to_tenant(&js, "default", subject, payload.to_string())
            .await
            .expect("stored");
    }
    // Not in the table's pattern: never a row.
    js_publish_to_tenant(&js, "default", "devices.d1.humidity", "40")
        .await
        .expect("stored");
}

#[tokio::test]
async fn stored_messages_are_rows_of_an_iceberg_table_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path();
    let tables = folder.join("tables");
    rows_exactly_once_across_a_restart(|| config(folder), &tables).await;
}

/// On a store on S3 the table goes into the same bucket, under the store's prefix,
/// with its catalog there too: pyiceberg opens it from the bucket by its version hint.
#[tokio::test]
async fn on_a_store_on_s3_the_table_is_in_the_bucket() {
    let prefix = format!("tables-{:016x}", fastrand::u64(..));
    let s3_config = || {
        let mut config = canopy::config::Config {
            tables: config(Path::new("/unused")).tables,
            ..crate::common::test_config()
        };
        crate::common::use_s3(&mut config, &prefix);
        // No folder: the default place on S3 is the store's bucket.
        config.tables[0].folder = None;
        config
    };
    let tables = PathBuf::from(format!("s3://canopy-tests/{prefix}/tables"));
    let found = rows_exactly_once_across_a_restart(s3_config, &tables).await;
    let files = found["files"].as_array().expect("data files");
    assert!(!files.is_empty());
    for file in files {
        let file = file.as_str().expect("a location");
        assert!(
            file.starts_with(&format!(
                "s3://canopy-tests/{prefix}/tables/iot/devices_temp/data/"
            )),
            "{file}"
        );
    }
}

/// Publishes 40 messages under a schema, checks their rows, restarts the server with
/// a new config from `config`, publishes 20 more and checks each of the 60 is there
/// once. What the reader found last is returned.
async fn rows_exactly_once_across_a_restart(
    config: impl Fn() -> canopy::config::Config,
    tables: &Path,
) -> Value {
    let server = start(config()).await;
    let client = async_nats::connect(server.native_addr.to_string())
        .await
        .expect("connect");
    let schema = json!({"type": "object", "properties": {
        "temp": {"type": "number"}, "unit": {"enum": ["C", "F"]}, "where": {"type": "object"}
    }, "required": ["temp"]});
    bind_schema(
        &client,
        json!({"pattern": "devices.*.temp", "schema": schema}),
    )
    .await;
    publish(&client, 0, 40).await;
    let found = read_rows(tables, 40, None).await;
    assert_eq!(
        found["columns"],
        json!([
            "subject",
            "device",
            "version",
            "offset",
            "time",
            "schema_version",
            "temp",
            "unit",
            "where"
        ])
    );
    assert_eq!(found["partition"], json!(["day"]));
    let rows = found["rows"].as_array().expect("rows");
    let first = rows
        .iter()
        .find(|r| r["temp"] == json!(0.5))
        .expect("the first message's row");
    assert_eq!(first["subject"], "devices.d0.temp");
    assert_eq!(first["device"], "d0");
    assert_eq!(first["version"], 1);
    assert_eq!(first["schema_version"], 1);
    assert_eq!(first["unit"], "C");
    assert_eq!(first["where"], r#"{"room":0}"#);
    client.flush().await.expect("flush");
    drop(client);
    server.stop().await;

    // A restart goes on after the committed offset: nothing twice, nothing missed.
    let server = start(config()).await;
    let client = async_nats::connect(server.native_addr.to_string())
        .await
        .expect("connect");
    publish(&client, 40, 60).await;
    let today = chrono_day(&read_rows(tables, 60, None).await);
    let found = read_rows(tables, 60, Some(&today)).await;
    let offsets = distinct_offsets(&found);
    assert_eq!(offsets.len(), 60, "each message once");
    assert_eq!(found["day_rows"], 60, "a filter on the day finds them");
    let committed: u64 = found["committed_offset"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the committed offset in the snapshot summary");
    assert_eq!(committed, *offsets.last().expect("rows"));
    server.stop().await;
    found
}

/// The UTC day (YYYY-MM-DD) of the first row's time.
fn chrono_day(found: &Value) -> String {
    found["rows"][0]["time"]
        .as_str()
        .and_then(|t| t.get(..10))
        .expect("an ISO time")
        .to_owned()
}

/// The same through the `canopy` binary killed with SIGKILL between commits: what was
/// committed stays once, what was not is committed after the restart.
#[tokio::test]
async fn a_kill_9_between_commits_loses_and_repeats_no_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path();
    let tables = folder.join("tables");
    let config = folder.join("canopy.toml");
    std::fs::write(
        &config,
        format!(
            "[[tables]]\npattern = \"devices.*.temp\"\ntable = \"iot.devices_temp\"\n\
             columns = [\"device\"]\ncommit_secs = 1\nfolder = \"{}\"\n",
            tables.display()
        ),
    )
    .expect("config written");
    let server = crate::crash::Serve::start_with(&folder.join("store"), Some(&config)).await;
    let client = async_nats::connect(&server.url).await.expect("connect");
    publish(&client, 0, 30).await;
    read_rows(&tables, 30, None).await;
    // Stored and acked, then killed before the next commit can have happened.
    publish(&client, 30, 45).await;
    drop(client);
    server.kill_9().await;
    let server = crate::crash::Serve::start_with(&folder.join("store"), Some(&config)).await;
    let found = read_rows(&tables, 45, None).await;
    let offsets = distinct_offsets(&found);
    assert_eq!(offsets.len(), 45, "each stored message once");
    // No schema was bound when the table was made: the payload is a column.
    assert!(
        found["columns"]
            .as_array()
            .expect("columns")
            .contains(&json!("payload"))
    );
    server.kill_9().await;
}

/// A commit on S3 is the conditional creation of the next metadata version: the S3
/// server must refuse a second creation of the same object, or two writers could
/// both commit on one version and one's rows would be lost.
#[tokio::test]
async fn on_s3_a_metadata_version_is_created_once() {
    let mut config = crate::common::test_config();
    crate::common::use_s3(&mut config, "unused");
    let client = canopy::store::s3_client("canopy-tests", &config.store.s3).expect("a client");
    let io = canopy::tables::object_io::ObjectIo::new("s3://canopy-tests", client);
    let location = format!(
        "s3://canopy-tests/create-once-{:016x}/metadata/v1.metadata.json",
        fastrand::u64(..)
    );
    assert!(io.create(&location, "first".into()).await.expect("created"));
    assert!(
        !io.create(&location, "second".into())
            .await
            .expect("refused")
    );
    let kept = io.read_if_any(&location).await.expect("read");
    assert_eq!(kept.as_deref(), Some(&b"first"[..]));
}

/// The writer takes new messages as they are routed, before they are durable; a
/// commit waits until the store holds them. While the store cannot write, the table
/// gains no row (a crash then would lose those messages, and the rows would name
/// messages that were never stored); once it can, every message is a row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_store_cannot_write_the_table_gains_no_row() {
    use canopy::store::observed::ObservedStore;
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = dir.path().join("tables");
    let observed = Arc::new(ObservedStore::new(Arc::new(
        object_store::memory::InMemory::new(),
    )));
    let faults = Arc::clone(&observed.faults);
    let mut config = config(dir.path());
    config.store.url = "memory://".into();
    let server = canopy::server::Server::bind_on(config, Some(observed))
        .await
        .expect("binds")
        .spawn();
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    publish(&client, 0, 10).await;
    read_rows(&tables, 10, None).await;

    faults.fail_writes(true);
    for i in 10..30 {
        client
            .publish(
                format!("devices.d{}.temp", i % 4),
                json!({"temp": i}).to_string().into(),
            )
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    // Two commit intervals: the writer has the messages, the store does not. A quiet
    // window (rows that must not appear have nothing to wait for): at least one
    // commit comes after the writer took the messages.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let found = read(&tables, None).await.expect("the table");
    assert_eq!(
        found["rows"].as_array().map(Vec::len),
        Some(10),
        "rows of messages the store does not hold yet: {found}"
    );

    faults.fail_writes(false);
    let found = read_rows(&tables, 30, None).await;
    let offsets = distinct_offsets(&found);
    assert_eq!(offsets.len(), 30, "each message once: {offsets:?}");
    server.stop().await;
}

/// A field the binding gains in a later schema version becomes a column of the table
/// at the next commit: older rows hold none, newer rows their value, and no row is
/// repeated or lost by the change.
#[tokio::test]
async fn a_field_the_schema_gains_becomes_a_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = dir.path().join("tables");
    let server = start(config(dir.path())).await;
    let client = async_nats::connect(server.native_addr.to_string())
        .await
        .expect("connect");
    let mut schema = json!({"type": "object", "properties": {"temp": {"type": "number"}},
                            "required": ["temp"]});
    bind_schema(
        &client,
        json!({"pattern": "devices.*.temp", "schema": schema}),
    )
    .await;
    publish(&client, 0, 8).await;
    let found = read_rows(&tables, 8, None).await;
    assert!(
        !found["columns"]
            .as_array()
            .expect("columns")
            .contains(&json!("battery")),
        "{found}"
    );

    schema["properties"]["battery"] = json!({"type": "integer"});
    bind_schema(
        &client,
        json!({"pattern": "devices.*.temp", "schema": schema, "mode": "none"}),
    )
    .await;
    let js = async_nats::jetstream::new(client.clone());
    for i in 0..4 {
        let payload = json!({"temp": 30.5, "battery": 90 + i});
        js_publish_to_tenant(
            &js,
            "default",
            format!("devices.d{i}.temp"),
            payload.to_string(),
        )
        .await
        .expect("stored");
    }
    let found = read_rows(&tables, 12, None).await;
    let columns = found["columns"].as_array().expect("columns");
    assert_eq!(columns.last(), Some(&json!("battery")), "{found}");
    assert_eq!(distinct_offsets(&found).len(), 12, "each message once");
    let mut batteries: Vec<Value> = found["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["battery"].clone())
        .collect();
    batteries.sort_by_key(|b| b.as_i64().unwrap_or(-1));
    let mut expected = vec![Value::Null; 8];
    expected.extend((90..94).map(|b| json!(b)));
    assert_eq!(batteries, expected, "{found}");
    server.stop().await;
}

/// A table is read around deliver plugins and encryption at rest, so it is not
/// written while either covers its pattern: the rows wait, and come (each once) when
/// the plugin is unbound and the pattern no longer sealed.
#[tokio::test]
async fn no_row_is_written_under_a_deliver_plugin_or_a_sealed_pattern() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = dir.path().join("tables");
    let keys = dir.path().join("keys");
    std::fs::write(
        &keys,
        "k:6b3a55e0262cb3a7ae2c35b5d2c1a1b04a8d7e1f09c3f2e4d5b6a79881726354",
    )
    .expect("key file");
    let mut config = config(dir.path());
    config.store.keys = Some(format!("file:{}", keys.display()));
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    publish(&client, 0, 10).await;
    read_rows(&tables, 10, None).await;

    let module = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/redact_for.wat"),
    )
    .expect("redact_for.wat");
    let module = base64::engine::general_purpose::STANDARD.encode(module);
    let (status, body) = api(
        &client,
        "plugin.put",
        json!({"pattern": "devices.>", "module": module}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    publish(&client, 10, 20).await;
    // Two commit intervals: rows that must not appear have nothing to wait for.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let found = read(&tables, None).await.expect("the table");
    assert_eq!(found["rows"].as_array().map(Vec::len), Some(10), "{found}");
    let (status, body) = api(&client, "plugin.delete", json!({"pattern": "devices.>"})).await;
    assert_eq!(status, 200, "{body}");
    read_rows(&tables, 20, None).await;

    let (status, body) = api(&client, "encryption.seal", json!({"pattern": "devices.>"})).await;
    assert_eq!(status, 200, "{body}");
    publish(&client, 20, 30).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let found = read(&tables, None).await.expect("the table");
    assert_eq!(found["rows"].as_array().map(Vec::len), Some(20), "{found}");
    let (status, body) = api(&client, "encryption.stop", json!({"pattern": "devices.>"})).await;
    assert_eq!(status, 200, "{body}");
    let found = read_rows(&tables, 30, None).await;
    assert_eq!(distinct_offsets(&found).len(), 30, "each message once");
    server.stop().await;
}
