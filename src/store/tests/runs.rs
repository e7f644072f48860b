//! Runs: a subject's messages of one round under one key, read back version by
//! version, cut by deletions of a prefix, and under a version limit set afterwards.

use super::*;

/// One append of `n` messages to `subject` (payloads `p1`..`pn`, counting from `from`).
pub(super) fn many(subject: &str, from: u64, n: u64, max_versions: u64) -> AppendRequest {
    let mut r = request(subject, "", 0);
    r.ack = None;
    r.max_versions = max_versions;
    r.messages = (from..from + n)
        .map(|i| NewMessage {
            headers: Bytes::new(),
            payload: Bytes::from(format!("p{i}")),
            flags: 0,
        })
        .collect();
    r
}

/// Keys under the subject's message range, as the engine holds them.
async fn message_keys(store: &Store, subject: &str) -> usize {
    let mut iter = store
        .db()
        .scan(keys::message_range("t", subject, 1))
        .await
        .expect("scan");
    let mut n = 0;
    while iter.next().await.expect("next").is_some() {
        n += 1;
    }
    n
}

/// Waits until everything appended so far is durable: an acked append after it
/// (to `sync`, its own subject) is acknowledged only then, and acks go in order.
async fn settle(store: &Store, recorder: &Recorder) {
    let before = recorder.acks.lock().len();
    store.append(request("sync", "", 0)).await.expect("queued");
    acks(recorder, before + 1).await;
}

async fn payloads_from(store: &Store, subject: &str, from: u64) -> Vec<String> {
    store
        .replay_subject("t", subject, ReplayFrom::Version(from), 1000, usize::MAX)
        .await
        .expect("replays")
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

#[tokio::test]
async fn a_round_of_one_subject_is_one_key_and_reads_back_by_version() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::clone(&inner)), recorder.clone())
        .await
        .expect("opens");
    store.append(many("a", 1, 20, 0)).await.expect("queued");
    store.append(many("b", 1, 1, 0)).await.expect("queued");
    store.append(many("a", 21, 5, 0)).await.expect("queued");
    settle(&store, &recorder).await;

    assert!(message_keys(&store, "a").await <= 2, "one run per round");
    assert_eq!(versions(&store, "a").await, (1..=25).collect::<Vec<_>>());
    for version in [1, 2, 13, 20, 21, 25] {
        let got = store.get("t", "a", Some(version)).await.expect("get");
        assert_eq!(
            got.map(|m| m.payload),
            Some(Bytes::from(format!("p{version}"))),
            "version {version}"
        );
    }
    assert_eq!(store.get("t", "a", Some(26)).await.expect("get"), None);
    let newest = store.get("t", "a", None).await.expect("get").expect("one");
    assert_eq!((newest.version, newest.offset), (25, 26));
    // From the middle of a run: the run is read from its start, its head skipped.
    assert_eq!(
        payloads_from(&store, "a", 18).await[..3],
        ["p18", "p19", "p20"]
    );
    // A pattern replay goes in offset order across runs and subjects.
    let all = store
        .replay_pattern(
            "t",
            &canopy_subjects::Pattern::parse_native(">").expect("pattern"),
            ReplayFrom::Start,
            1000,
            usize::MAX,
        )
        .await
        .expect("replays");
    let order: Vec<(String, u64, u64)> = all
        .messages
        .iter()
        .filter(|m| m.subject != "sync")
        .map(|m| (m.subject.clone(), m.version, m.offset))
        .collect();
    assert_eq!(order.len(), 26);
    assert_eq!(order[20], ("b".to_owned(), 1, 21));
    assert!(order.windows(2).all(|w| w[0].2 + 1 == w[1].2), "{order:?}");
    store.close().await.expect("closes");

    // After a restart the head is the last version of the last run.
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(inner), recorder.clone())
        .await
        .expect("reopens");
    store
        .append(request("a", "after", 1))
        .await
        .expect("queued");
    let got = acks(&recorder, 1).await;
    assert!(
        matches!(
            got[0].1,
            AppendOutcome::Stored {
                version: 26,
                offset: 28,
                ..
            }
        ),
        "{got:?}"
    );
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_deletion_through_the_middle_of_a_run_keeps_the_rest() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    store.append(many("a", 1, 20, 0)).await.expect("queued");
    settle(&store, &recorder).await;

    let mut batch = slatedb::WriteBatch::new();
    let deleted = crate::store::runs::delete_through(store.db(), "t", "a", 7, 100, &mut batch)
        .await
        .expect("deletes");
    write_durably(store.db(), batch).await.expect("writes");
    assert_eq!(
        (deleted.messages, deleted.bytes, deleted.done),
        (7, 7 * 2, true)
    );
    assert_eq!(versions(&store, "a").await, (8..=20).collect::<Vec<_>>());
    assert_eq!(store.get("t", "a", Some(7)).await.expect("get"), None);
    assert_eq!(
        store
            .get("t", "a", Some(8))
            .await
            .expect("get")
            .map(|m| m.offset),
        Some(8)
    );
    // A purge takes the rest and counts messages, not keys.
    let purged = store.purge_subject("t", "a").await.expect("purges");
    assert_eq!(purged.messages, 13);
    assert!(versions(&store, "a").await.is_empty());
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_version_limit_set_after_runs_drops_a_run_once_all_of_it_is_out() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    store.append(many("a", 1, 10, 0)).await.expect("queued");
    settle(&store, &recorder).await;
    // Keep 3: version 11 pushes out 8, which sits inside the run 1..=10, so the
    // run stays (nothing in the window is lost) until its last version is out.
    store.append(many("a", 11, 1, 3)).await.expect("queued");
    settle(&store, &recorder).await;
    let kept = versions(&store, "a").await;
    assert_eq!(kept, (1..=11).collect::<Vec<_>>());
    store.append(many("a", 12, 1, 3)).await.expect("queued");
    store.append(many("a", 13, 1, 3)).await.expect("queued");
    settle(&store, &recorder).await;
    assert_eq!(versions(&store, "a").await, [11, 12, 13]);
    store.append(many("a", 14, 1, 3)).await.expect("queued");
    settle(&store, &recorder).await;
    assert_eq!(versions(&store, "a").await, [12, 13, 14]);
    store.close().await.expect("closes");
}

#[tokio::test]
async fn one_scan_finds_the_runs_of_many_subjects() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::clone(&inner)), recorder.clone())
        .await
        .expect("opens");
    store.append(many("a", 1, 20, 0)).await.expect("queued");
    settle(&store, &recorder).await;
    store.append(many("a", 21, 5, 0)).await.expect("queued");
    store.append(many("a.b", 1, 1, 0)).await.expect("queued");
    store.append(many("b", 1, 3, 0)).await.expect("queued");
    store.append(many("c", 1, 1, 0)).await.expect("queued");
    settle(&store, &recorder).await;

    let payloads = |found: &Option<Vec<StoredMessage>>| {
        found.as_ref().map(|messages| {
            messages
                .iter()
                .map(|m| (m.version, String::from_utf8_lossy(&m.payload).into_owned()))
                .collect::<Vec<_>>()
        })
    };
    let wanted = [
        ("a", 2),
        ("a", 22),
        ("a.b", 1),
        ("b", 2),
        ("c", 5),
        ("d", 1),
    ];
    let found = store.get_runs_from("t", &wanted, 100).await.expect("scans");
    let got: Vec<_> = found.iter().map(payloads).collect();
    let range = |from: u64, to: u64| Some((from..=to).map(|v| (v, format!("p{v}"))).collect());
    assert_eq!(
        got[0], None,
        "the scan starts at (a, 2), past the run holding it"
    );
    assert_eq!(got[1], range(22, 25), "the rest of the second run of a");
    assert_eq!(got[2], range(1, 1));
    assert_eq!(got[3], range(2, 3), "b's run from 2");
    assert_eq!(got[4], None, "c has no version 5");
    assert_eq!(got[5], None, "d is not stored");

    let from_runs = store
        .get_runs_from("t", &[("a", 1), ("a", 21), ("b", 1)], 100)
        .await
        .expect("scans");
    let got: Vec<_> = from_runs.iter().map(payloads).collect();
    assert_eq!(got, [range(1, 20), range(21, 25), range(1, 3)]);

    let short = store
        .get_runs_from("t", &[("a", 1), ("a.b", 1), ("b", 1)], 2)
        .await
        .expect("scans");
    let got: Vec<_> = short.iter().map(payloads).collect();
    assert_eq!(
        got,
        [range(1, 20), None, None],
        "two keys read: a's two runs"
    );

    // The newest of each subject, in one backward scan.
    use crate::store::runs::Seen;
    let subjects = ["a", "a.b", "b", "c", "d"];
    let newest = |max_keys| {
        let store = &store;
        async move {
            crate::store::runs::newest_of(store.db(), "t", &subjects, max_keys, Seen::Durable)
                .await
                .expect("scans")
                .into_iter()
                .map(|found| {
                    found.map(|(v, r)| (v, String::from_utf8_lossy(&r.payload).into_owned()))
                })
                .collect::<Vec<_>>()
        }
    };
    let head = |v: u64| Some((v, format!("p{v}")));
    assert_eq!(
        newest(100).await,
        [head(25), head(1), head(3), head(1), None]
    );
    assert_eq!(
        newest(2).await,
        [None, None, head(3), head(1), None],
        "two keys read backward: c's run and b's"
    );
}
