//! Rounds run by the publishers' own tasks (`sequencer/combining.rs`): publishers
//! whose tasks are aborted while they publish cost the others nothing (every append
//! queued is acked, whoever runs its round), and no version is given twice or
//! skipped.

use super::journal::{folder_settings, open};
use super::*;

/// The flags of the acks that arrived, for appends marked `first..first + count`.
fn acked_marks(recorder: &Recorder, first: u32, count: u32) -> Vec<u32> {
    let mut marks: Vec<u32> = recorder
        .acks
        .lock()
        .iter()
        .map(|(ack, _)| ack.flags)
        .filter(|flags| (first..first + count).contains(flags))
        .collect();
    marks.sort_unstable();
    marks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_aborted_mid_round_cost_the_others_nothing() {
    // Each pass aborts a few publishers while they run rounds; several passes give
    // a lost input or wake-up more chances to show. (An abort rarely lands inside
    // a round's own waits here: that `Finishing` completes such a round is shown
    // by its unit test in `sequencer/combining.rs`.)
    for _ in 0..4 {
        aborted_publishers_pass().await;
    }
}

async fn aborted_publishers_pass() {
    let folder = std::env::temp_dir().join(format!("canopy-combining-{:016x}", fastrand::u64(..)));
    // A small journal fills every few dozen rounds: the round that finds it full
    // waits for the engine to take what it holds, and a publisher's task aborted
    // then is mid-round, with whatever other appends that round gathered.
    let (store, recorder) = open(folder_settings(&folder, 48 * 1024)).await;
    let store = Arc::new(store);
    let payload = Bytes::from("p".repeat(1500));
    const PUBLISHERS: u32 = 10;
    const EACH: u32 = 30;
    const KEPT: u32 = PUBLISHERS * EACH;
    let publisher = |prefix: &'static str, id: u32, count: u32| {
        let store = Arc::clone(&store);
        let payload = payload.clone();
        tokio::spawn(async move {
            for n in 0..count {
                let mut append = request(&format!("{prefix}.{}", n % 20), "", id * EACH + n);
                append.messages[0].payload = payload.clone();
                if store.append(append).await.is_err() {
                    return false;
                }
                // Spaced out, so the sequencer is mostly idle and each publisher
                // runs its own rounds.
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            true
        })
    };
    let kept: Vec<_> = (0..PUBLISHERS).map(|id| publisher("k", id, EACH)).collect();
    // Victims publish until aborted, one every couple of milliseconds, while the
    // kept publishers' appends go through the same rounds.
    let victims: Vec<_> = (0..4 * PUBLISHERS)
        .map(|id| publisher("v", 1000 + id, u32::MAX / EACH - 1000))
        .collect();
    for victim in &victims {
        tokio::time::sleep(Duration::from_millis(1)).await;
        victim.abort();
    }
    for task in kept {
        assert!(task.await.expect("kept publisher ran"), "queued");
    }
    // An abort lands at the victim's next await: until then it may queue more.
    for victim in victims {
        let _ = victim.await;
    }
    // Every ack of what was queued is sent before this passes.
    store.durable_barrier().await.expect("barrier");
    let mut marks = Vec::new();
    for _ in 0..1000 {
        marks = acked_marks(&recorder, 0, KEPT);
        if marks.len() == KEPT as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let missing: Vec<u32> = (0..KEPT).filter(|m| !marks.contains(m)).collect();
    assert!(missing.is_empty(), "appends never acked: {missing:?}");
    let stored = recorder
        .acks
        .lock()
        .iter()
        .filter(|(_, outcome)| matches!(outcome, AppendOutcome::Stored { .. }))
        .count();
    // Every acked version is stored once, in order, with no gap: a round left
    // half-decided would skip the versions it gave.
    let mut total = 0;
    for s in 0..20 {
        for prefix in ["k", "v"] {
            let versions = versions(&store, &format!("{prefix}.{s}")).await;
            assert_eq!(
                versions,
                (1..=versions.len() as u64).collect::<Vec<_>>(),
                "{prefix}.{s}: versions contiguous from 1"
            );
            total += versions.len();
        }
    }
    assert_eq!(
        total, stored,
        "every stored ack is one message in the store"
    );
    let store = Arc::into_inner(store).expect("the last holder");
    store.close().await.expect("closes");
    std::fs::remove_dir_all(folder).ok();
}
