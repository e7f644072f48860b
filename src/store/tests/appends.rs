//! Appends and reading them back: expectations, msg ids, atomic appends, and reads
//! after a restart that do not grow with the history.

use super::*;

#[tokio::test]
async fn restart_reads_do_not_grow_with_the_history() {
    let mut reads = Vec::new();
    for messages in [2_000, 40_000] {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        fill(Arc::clone(&inner), messages, 100).await;
        let observed = Arc::new(ObservedStore::new(inner));
        let counters = Arc::clone(&observed.counters);
        let recorder = Arc::new(Recorder::default());
        let store = Store::open(settings(observed), recorder.clone())
            .await
            .expect("reopens");
        // The first append after a restart recovers the tenant's offset and the
        // subject's head.
        store
            .append(request("s.7", "after", 1))
            .await
            .expect("queued");
        let got = acks(&recorder, 1).await;
        let AppendOutcome::Stored {
            version, offset, ..
        } = &got[0].1
        else {
            panic!("stored: {got:?}");
        };
        assert_eq!(*version, (messages / 100) as u64 + 1);
        assert_eq!(*offset, messages as u64 + 1);
        reads.push(counters.reads());
        store.close().await.expect("closes");
    }
    eprintln!("object reads on restart at 2,000 and 40,000 messages: {reads:?}");
    // 20 times the history must not cost 20 times the reads: allow a small constant.
    assert!(
        reads[1] <= reads[0] + 8,
        "reads on restart grew with history: {reads:?}"
    );
}

#[tokio::test]
async fn expectations_msg_ids_and_atomic_appends() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    let mut first = request("a", "1", 1);
    first.expect = Some(Expectation::Version(0));
    store.append(first).await.expect("queued");
    let mut again = request("a", "2", 2);
    again.expect = Some(Expectation::Version(0));
    store.append(again).await.expect("queued");
    let mut both = request("a", "3", 3);
    both.messages.push(NewMessage {
        headers: Bytes::new(),
        payload: Bytes::from_static(b"4"),
        flags: 0,
    });
    both.expect = Some(Expectation::Version(1));
    both.msg_id = Some("m".into());
    store.append(both).await.expect("queued");
    let mut duplicate = request("a", "5", 4);
    duplicate.msg_id = Some("m".into());
    store.append(duplicate).await.expect("queued");
    let mut wrong_offset = request("a", "6", 5);
    wrong_offset.expect = Some(Expectation::LastOffset(99));
    store.append(wrong_offset).await.expect("queued");

    let mut got = acks(&recorder, 5).await;
    got.sort_by_key(|(ack, _)| ack.flags);
    let outcomes: Vec<_> = got.into_iter().map(|(_, o)| o).collect();
    assert!(matches!(
        outcomes[0],
        AppendOutcome::Stored {
            version: 1,
            offset: 1,
            ..
        }
    ));
    assert!(matches!(
        outcomes[1],
        AppendOutcome::Conflict {
            current_version: 1,
            ..
        }
    ));
    assert!(matches!(
        outcomes[2],
        AppendOutcome::Stored {
            version: 3,
            offset: 3,
            count: 2,
            ..
        }
    ));
    assert!(matches!(
        outcomes[3],
        AppendOutcome::Duplicate {
            version: 3,
            offset: 3,
            ..
        }
    ));
    assert!(matches!(
        outcomes[4],
        AppendOutcome::Conflict {
            current_version: 3,
            current_offset: 3,
            ..
        }
    ));
    let page = store
        .replay_subject("t", "a", ReplayFrom::Start, 100, usize::MAX)
        .await
        .expect("replays");
    let payloads: Vec<_> = page.messages.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(payloads, ["1", "3", "4"]);
    assert_eq!(
        recorder.routed.lock().clone(),
        vec![
            ("a".to_owned(), 1, 1),
            ("a".to_owned(), 2, 2),
            ("a".to_owned(), 3, 3)
        ]
    );
    store.close().await.expect("closes");
}
