//! The retained-subjects walk: exactly the matches, in order, skipping subtrees.

use super::*;

/// Every retained page of `pattern`, `max` at a time, as subjects.
async fn retained_subjects(store: &Store, pattern: &str, max: usize) -> (Vec<String>, u64) {
    let pattern = canopy_subjects::Pattern::parse_mqtt(pattern).expect("filter");
    let mut after: Option<String> = None;
    let mut subjects = Vec::new();
    let mut reads = 0;
    loop {
        let (page, n) = store
            .retained_walk("t", &pattern, after.as_deref(), max, usize::MAX)
            .await
            .expect("walks");
        reads += n;
        subjects.extend(page.messages.iter().map(|m| m.subject.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => return (subjects, reads),
        }
    }
}

#[tokio::test]
async fn the_retained_walk_finds_exactly_the_matches_in_order_and_skips_subtrees() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    // Tokens that are prefixes of others with bytes below `.` (`t1-x` sorts between
    // `t1` and `t1.…`), a `$` subject, deep and shallow subjects.
    let mut subjects: Vec<String> = [
        "t1",
        "t1-x.temp",
        "t1.temp",
        "t1.hum",
        "t1.a.temp",
        "t10.temp",
        "t2.temp",
        "t2.x.state",
        "$sys.temp",
        "a",
        "a.b",
        "a.b.c",
        "ab.c",
        "z.temp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Many subjects under one token: the skip scan must not read them one by one.
    for i in 0..200 {
        subjects.push(format!("busy.s{i}"));
    }
    subjects.push("busy.temp".into());
    for (i, subject) in subjects.iter().enumerate() {
        let mut r = request(subject, "v", i as u32);
        r.retain = true;
        store.append(r).await.expect("queued");
    }
    acks(&recorder, subjects.len()).await;

    for filter in [
        "+/temp",
        "#",
        "a/#",
        "+",
        "t1/#",
        "+/+/temp",
        "+/x/state",
        "busy/+",
        "$sys/+",
    ] {
        let pattern = canopy_subjects::Pattern::parse_mqtt(filter).expect("filter");
        let mut expected: Vec<String> = subjects
            .iter()
            .filter(|s| {
                canopy_subjects::Subject::parse_native(s).is_ok_and(|s| pattern.matches(&s))
            })
            .cloned()
            .collect();
        // Key order: the subject's bytes then its terminator.
        expected.sort_by(|a, b| format!("{a}\0").cmp(&format!("{b}\0")));
        for max in [1, 2, 1000] {
            let (got, _) = retained_subjects(&store, filter, max).await;
            assert_eq!(got, expected, "{filter} in pages of {max}");
        }
    }
    let (found, reads) = retained_subjects(&store, "+/temp", 1000).await;
    assert_eq!(found.len(), 6);
    assert!(
        reads < 40,
        "+/temp reads one key per token, not the 200 under busy: {reads} reads"
    );
    store.close().await.expect("closes");
}
