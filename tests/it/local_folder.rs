//! A store on a local folder cleans up after itself: restarts leave no growing pile
//! of engine manifests. SlateDB's garbage collector needs conditional overwrites for
//! its boundary files, which a local folder lacks; with them on it logged
//! `PutMode::Update not yet implemented` and removed nothing, and every restart left
//! three or four manifests behind. Nothing acknowledged is lost on the way.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{local_folder_config, publish_acked, replay_texts};

/// Manifests the engine keeps (the current one and at most a few in flight).
const KEPT: usize = 4;
const RESTARTS: usize = 6;

fn manifests(folder: &Path) -> usize {
    std::fs::read_dir(folder.join("db/manifest"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// Names the manifests left when a round fails, so a CI log says which were kept.
fn print_manifests(folder: &Path, round: usize) {
    let mut names: Vec<String> = std::fs::read_dir(folder.join("db/manifest"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    eprintln!("round {round}: manifests still there after the wait: {names:?}");
}

#[tokio::test]
async fn restarts_leave_no_pile_of_manifests() {
    let folder = tempfile::tempdir().expect("tempdir");
    let mut config = local_folder_config(folder.path());
    config.store.local_gc_secs = 1;
    let mut counts = Vec::new();
    for round in 0..RESTARTS {
        let server = canopy::server::Server::bind(config.clone())
            .await
            .unwrap_or_else(|e| panic!("restart {round} on the same folder: {e}"))
            .spawn();
        let client = async_nats::connect(server.native_url())
            .await
            .expect("connect");
        publish_acked(&client, "gc.round", format!("{round}")).await;
        // The collector runs every second and takes files a second old: wait for it
        // to bring the count down, as long as it takes up to a bound. The bound is wide
        // because a loaded CI machine once took longer than 20 s; a collector that never
        // runs still fails here.
        let deadline = Instant::now() + Duration::from_secs(60);
        while manifests(folder.path()) > KEPT && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let count = manifests(folder.path());
        if count > KEPT {
            print_manifests(folder.path(), round);
        }
        counts.push(count);
        if round + 1 == RESTARTS {
            let texts = replay_texts(&client, "gc.round").await;
            let expected: Vec<String> = (0..RESTARTS).map(|r| r.to_string()).collect();
            assert_eq!(texts, expected, "every acked message survives the restarts");
        }
        server.stop().await;
    }
    assert!(
        counts.iter().all(|&n| n <= KEPT),
        "manifests after each restart: {counts:?}"
    );
}
