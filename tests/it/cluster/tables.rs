//! `[[tables]]` in a cluster: the owner of the table's tenant's shard writes it,
//! and after that owner is killed the next one goes on from the committed offset:
//! every stored message is a row once, read back by pyiceberg from the bucket.

use super::data::until_acked;
use super::processes::{Cluster3, owner_of_default};

const TABLES: &str = r#"
[[tables]]
pattern = "devices.*.temp"
table = "iot.devices_temp"
columns = ["device"]
commit_secs = 1
"#;

#[tokio::test]
async fn a_table_is_written_by_its_tenants_owner_once_across_the_owners_death() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tables.toml");
    std::fs::write(&file, TABLES).expect("config written");
    let file = file.to_str().expect("a path").to_owned();
    let mut cluster = Cluster3::start_with(&[("CANOPY_CONFIG", &file)]).await;
    let tables = std::path::PathBuf::from(format!("s3://canopy-tests/{}/tables", cluster.name));
    let owner = owner_of_default(&cluster.status().await);
    let others = super::processes::others_than(&owner);
    let client = async_nats::connect(&cluster.node(others[0]).url)
        .await
        .expect("connect");
    for i in 0..30 {
        let text = format!(r#"{{"temp": {i}.5, "n": {i}}}"#);
        until_acked(&client, &format!("devices.d{}.temp", i % 3), &text).await;
    }
    crate::tables::read_rows(&tables, 30, None).await;

    cluster.kill(&owner).await;
    for i in 30..50 {
        let text = format!(r#"{{"temp": {i}.5, "n": {i}}}"#);
        until_acked(&client, &format!("devices.d{}.temp", i % 3), &text).await;
    }
    // Exactly 50: none lost with the dead owner, none written twice by the next.
    let found = crate::tables::read_rows(&tables, 50, None).await;
    let offsets = crate::tables::distinct_offsets(&found);
    assert_eq!(offsets.len(), 50, "each message once: {found}");
}
