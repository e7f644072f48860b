//! The deployment files stay true: docker-compose.yml's settings are ones canopy
//! accepts, and they work against a real S3-compatible server (moto, started by
//! scripts/test-all.sh) in place of MinIO.

use std::path::PathBuf;

use crate::cli::ServeProcess;
use crate::common::publish_acked;

const BIN: &str = env!("CARGO_BIN_EXE_canopy");

/// The `CANOPY_*` variables of the canopy service, read line by line.
fn compose_env() -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml");
    let text = std::fs::read_to_string(path).expect("docker-compose.yml");
    assert!(
        text.contains("services:") && text.contains("  canopy:"),
        "{text}"
    );
    assert!(
        text.contains("build: ."),
        "canopy is built from the Dockerfile"
    );
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.trim().split_once(": ")?;
            key.starts_with("CANOPY_")
                .then(|| (key.to_owned(), value.trim_matches('"').to_owned()))
        })
        .collect()
}

#[test]
fn the_compose_settings_are_valid_canopy_configuration() {
    let env = compose_env();
    assert!(env.len() >= 7, "{env:?}");
    let out = std::process::Command::new(BIN)
        .args(["config", "check"])
        .envs(env)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("s3://canopy/streams"), "{stdout}");
    assert!(stdout.contains("path_style = true"), "{stdout}");
}

#[tokio::test]
async fn the_compose_settings_serve_on_an_s3_compatible_store() {
    let endpoint = std::env::var("CANOPY_TEST_S3_ENDPOINT")
        .expect("CANOPY_TEST_S3_ENDPOINT: run ./scripts/test-all.sh, which starts moto");
    let prefix = format!("compose-{:016x}", fastrand::u64(..));
    let env: Vec<(String, String)> = compose_env()
        .into_iter()
        .map(|(key, value)| match key.as_str() {
            // moto in place of MinIO, and the test bucket in place of `canopy`.
            "CANOPY_STORE__S3__ENDPOINT" => (key, endpoint.clone()),
            "CANOPY_STORE__S3__ACCESS_KEY_ID" | "CANOPY_STORE__S3__SECRET_ACCESS_KEY" => {
                (key, "test".to_owned())
            }
            "CANOPY_STORE__URL" => (key, format!("s3://canopy-tests/{prefix}")),
            _ => (key, value),
        })
        .collect();
    let server = ServeProcess::start_with_env(&[], &env).await;
    let client = async_nats::connect(&server.url).await.expect("connect");
    let ack = publish_acked(&client, "compose.check", "ok").await;
    assert_eq!(ack["version"].as_u64(), Some(1));
}
