//! The journal on a real folder: acked rounds that only the journal holds are in the
//! engine after a restart, a full journal file starts over, and a store opened
//! without a journal takes in what one left.
//!
//! A "crash" here is a copy of the folder taken while the store runs, after the acks:
//! what a copy reads is at least what the disk durably holds, and with the engine's
//! log flushed every ten minutes, the engine's files in it hold none of the rounds.

use std::path::Path;

use super::*;

pub(super) fn folder_settings(folder: &Path, journal_bytes: u64) -> StoreSettings {
    StoreSettings {
        url: StoreUrl::File(folder.to_owned()),
        object_store: None,
        flush_interval: Duration::from_secs(600),
        journal_bytes,
        ..settings(Arc::new(InMemory::new()))
    }
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("make copy");
    for entry in std::fs::read_dir(from).expect("read folder") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_folder(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Opens a store in `settings`, with a recorder of its acks.
pub(super) async fn open(settings: StoreSettings) -> (Store, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings, recorder.clone())
        .await
        .expect("opens");
    (store, recorder)
}

/// What a crash of the running `store` in `live` would leave: a copy of its folder
/// (the store itself is then closed, its folder left aside).
pub(super) async fn crash(store: Store, live: &Path) -> std::path::PathBuf {
    let crashed = live.with_file_name("crashed");
    copy_folder(live, &crashed);
    store.close().await.expect("closes");
    crashed
}

/// Appends `count` durable messages over `subjects` subjects and waits for their acks.
pub(super) async fn append_acked(
    store: &Store,
    recorder: &Recorder,
    count: usize,
    subjects: usize,
) {
    let before = recorder.acks.lock().len();
    for i in 0..count {
        let payload = format!("message {i} {}", "x".repeat(200));
        store
            .append(request(&format!("j.{}", i % subjects), &payload, 0))
            .await
            .expect("queued");
    }
    let acks = acks(recorder, before + count).await;
    assert!(
        acks.iter()
            .all(|(_, outcome)| matches!(outcome, AppendOutcome::Stored { .. })),
        "every append stored: {:?}",
        acks.iter()
            .find(|(_, o)| !matches!(o, AppendOutcome::Stored { .. }))
    );
}

pub(super) async fn count_versions(store: &Store, subjects: usize) -> usize {
    let mut total = 0;
    for s in 0..subjects {
        let versions = versions(store, &format!("j.{s}")).await;
        assert_eq!(
            versions,
            (1..=versions.len() as u64).collect::<Vec<_>>(),
            "j.{s}: versions contiguous from 1"
        );
        total += versions.len();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_rounds_only_the_journal_holds_are_in_the_engine_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    let (store, recorder) = open(folder_settings(&live, 8 << 20)).await;
    append_acked(&store, &recorder, 2_000, 10).await;
    // Acked and readable at once, though the engine's log holds none of it.
    assert_eq!(count_versions(&store, 10).await, 2_000);
    let crashed = crash(store, &live).await;

    let (store, recorder) = open(folder_settings(&crashed, 8 << 20)).await;
    assert_eq!(count_versions(&store, 10).await, 2_000);
    // Versions and offsets go on from there.
    append_acked(&store, &recorder, 10, 10).await;
    assert_eq!(count_versions(&store, 10).await, 2_010);
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_journal_file_starts_over_once_the_engine_holds_its_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    // 64 KiB files: 3,000 messages of ~220 bytes fill them ten times over.
    let (store, recorder) = open(folder_settings(&live, 64 << 10)).await;
    for _ in 0..30 {
        append_acked(&store, &recorder, 100, 7).await;
    }
    let crashed = crash(store, &live).await;
    let (store, _) = open(folder_settings(&crashed, 64 << 10)).await;
    assert_eq!(count_versions(&store, 7).await, 3_000);
    store.close().await.expect("closes");
    // Opened again with larger files: nothing lost, and the files take the new size.
    let (store, recorder) = open(folder_settings(&crashed, 128 << 10)).await;
    assert_eq!(count_versions(&store, 7).await, 3_000);
    let size = std::fs::metadata(crashed.join("journal").join("a.journal"))
        .expect("journal file")
        .len();
    assert_eq!(size, 128 << 10);
    append_acked(&store, &recorder, 100, 7).await;
    assert_eq!(count_versions(&store, 7).await, 3_100);
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_opened_without_a_journal_takes_in_what_one_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    let (store, recorder) = open(folder_settings(&live, 8 << 20)).await;
    append_acked(&store, &recorder, 500, 5).await;
    let crashed = crash(store, &live).await;

    let without = StoreSettings {
        journal: false,
        flush_interval: Duration::from_millis(2),
        ..folder_settings(&crashed, 8 << 20)
    };
    let (store, recorder) = open(without).await;
    assert_eq!(count_versions(&store, 5).await, 500);
    assert!(
        !crashed.join("journal").exists(),
        "the journal is gone once the engine holds it"
    );
    append_acked(&store, &recorder, 5, 5).await;
    assert_eq!(count_versions(&store, 5).await, 505);
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_too_large_for_the_journal_is_refused_and_no_version_is_given_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    // 64 KiB files: a 40 KiB message is more than half of one, refused alone, while
    // the small rounds before it may still wait for their sync.
    let (store, recorder) = open(folder_settings(&live, 64 << 10)).await;
    let mut sent = 0u32;
    for round in 0..4 {
        for _ in 0..100 {
            let payload = format!("small {sent}");
            store
                .append(request("j.0", &payload, sent))
                .await
                .expect("queued");
            sent += 1;
        }
        if round < 3 {
            store
                .append(request("j.0", &"x".repeat(40_000), u32::MAX))
                .await
                .expect("queued");
        }
    }
    let acks = acks(&recorder, sent as usize + 3).await;
    let stored = store
        .replay_subject("t", "j.0", ReplayFrom::Start, 1000, usize::MAX)
        .await
        .expect("replays")
        .messages;
    assert_eq!(
        stored.iter().map(|m| m.version).collect::<Vec<_>>(),
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "versions contiguous"
    );
    let mut acked = 0;
    for (ack, outcome) in &acks {
        match outcome {
            AppendOutcome::Stored { version, .. } => {
                assert_ne!(ack.flags, u32::MAX, "the large message is refused");
                let message = &stored[*version as usize - 1];
                assert_eq!(
                    message.payload,
                    Bytes::from(format!("small {}", ack.flags)),
                    "version {version} holds what its ack said"
                );
                acked += 1;
            }
            AppendOutcome::Failed { .. } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(acked, stored.len(), "every stored message was acked once");
    store.close().await.expect("closes");
}
