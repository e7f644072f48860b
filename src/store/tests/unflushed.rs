//! The rounds the journal holds and the engine does not yet, through the whole
//! store on a real folder: a subject's runs of many rounds reach the engine as
//! few keys, and what deletes history (version limits, purges) neither loses a
//! message it must keep nor sees what it deleted come back with a flush.

use super::journal::{append_acked, count_versions, crash, folder_settings, open};
use super::*;

/// The subject's message keys the engine itself holds.
async fn engine_keys(store: &Store, subject: &str) -> usize {
    let range = keys::message_range("t", subject, 1);
    let options = slatedb::config::ScanOptions::default();
    let mut iter = store
        .db()
        .scan_flushed(range, &options)
        .await
        .expect("scans");
    let mut n = 0;
    while iter.next().await.expect("next").is_some() {
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subjects_runs_of_many_rounds_reach_the_engine_as_few_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    let (store, recorder) = open(folder_settings(&live, 8 << 20)).await;
    let flushes = store.db().unflushed().flushes();
    // Forty rounds at least (each waits for its acks), every one touching all ten
    // subjects: one key per subject per round without joining.
    for _ in 0..40 {
        append_acked(&store, &recorder, 20, 10).await;
    }
    store.db().flush_unflushed().await.expect("flushes");
    let flushes = store.db().unflushed().flushes() - flushes;
    let mut keys = 0;
    for s in 0..10 {
        keys += engine_keys(&store, &format!("j.{s}")).await;
    }
    // A flush can cut a subject's run once; runs hold at most 64 KiB (80 messages
    // of ~230 bytes a subject fit in one).
    assert!(
        keys as u64 <= 10 * flushes,
        "{keys} keys for 10 subjects over {flushes} flushes"
    );
    assert!(keys < 400, "{keys} keys: runs joined across rounds");
    assert_eq!(count_versions(&store, 10).await, 800);
    let crashed = crash(store, &live).await;
    let (store, _) = open(folder_settings(&crashed, 8 << 20)).await;
    assert_eq!(count_versions(&store, 10).await, 800);
    store.close().await.expect("closes");
}

/// `n` messages from version `from` in one request, acknowledged.
fn several(subject: &str, from: u64, n: u64, max_versions: u64) -> AppendRequest {
    let mut request = super::runs::many(subject, from, n, max_versions);
    request.ack = super::request(subject, "", 0).ack;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_limit_set_while_runs_are_unflushed_keeps_its_whole_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, recorder) = open(folder_settings(&dir.path().join("live"), 8 << 20)).await;
    let mut sent = 0;
    // Each trial: versions 1-3 in the layer; versions 4-6 on their way there, where
    // they join the run of 1-3; version 7 under a limit of 4 decided meanwhile. It
    // drops version 3, the last of the run 1-3 as it was: deleting that run's key
    // after 4-6 joined it would lose three versions of the window.
    for trial in 0..20 {
        let subject = format!("v.{trial}");
        store
            .append(several(&subject, 1, 3, 0))
            .await
            .expect("queued");
        sent += 1;
        acks(&recorder, sent).await;
        store
            .append(several(&subject, 4, 3, 0))
            .await
            .expect("queued");
        tokio::task::yield_now().await;
        store
            .append(several(&subject, 7, 1, 4))
            .await
            .expect("queued");
        sent += 2;
    }
    let acked = acks(&recorder, sent).await;
    assert!(
        acked
            .iter()
            .all(|(_, outcome)| matches!(outcome, AppendOutcome::Stored { .. })),
        "every append stored"
    );
    for trial in 0..20 {
        let kept = versions(&store, &format!("v.{trial}")).await;
        // Versions below the window may stay (a run outlives its versions until its
        // last leaves the window); the window itself never loses one.
        assert!(
            kept.ends_with(&[4, 5, 6, 7]),
            "v.{trial}: the newest four kept: {kept:?}"
        );
    }
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_unflushed_messages_is_not_undone_by_their_flush_or_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    let (store, recorder) = open(folder_settings(&live, 8 << 20)).await;
    append_acked(&store, &recorder, 300, 1).await;
    let purged = store.purge_subject("t", "j.0").await.expect("purges");
    assert_eq!(purged.messages, 300);
    append_acked(&store, &recorder, 5, 1).await;
    assert_eq!(
        versions(&store, "j.0").await,
        (301..=305).collect::<Vec<_>>()
    );
    store.db().flush_unflushed().await.expect("flushes");
    assert_eq!(
        versions(&store, "j.0").await,
        (301..=305).collect::<Vec<_>>()
    );
    let crashed = crash(store, &live).await;
    let (store, _) = open(folder_settings(&crashed, 8 << 20)).await;
    assert_eq!(
        versions(&store, "j.0").await,
        (301..=305).collect::<Vec<_>>()
    );
    store.close().await.expect("closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_drops_a_joined_run_drops_it_after_a_restart_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let live = dir.path().join("live");
    let (store, recorder) = open(folder_settings(&live, 8 << 20)).await;
    // Three rounds join into one run while unflushed; the journal holds three.
    let mut sent = 0;
    for v in 1..=3 {
        store.append(several("k", v, 1, 0)).await.expect("queued");
        sent += 1;
        acks(&recorder, sent).await;
    }
    // A limit of 2: version 4 drops 2 (inside the run: kept), version 5 drops 3, the
    // run's last, so the run goes. A restart that replays the journal must not bring
    // back the rounds' own keys of versions 2 and 3.
    for v in 4..=5 {
        store.append(several("k", v, 1, 2)).await.expect("queued");
        sent += 1;
        acks(&recorder, sent).await;
    }
    assert_eq!(versions(&store, "k").await, [4, 5]);
    let crashed = crash(store, &live).await;
    let (store, _) = open(folder_settings(&crashed, 8 << 20)).await;
    assert_eq!(versions(&store, "k").await, [4, 5]);
    store.close().await.expect("closes");
}
