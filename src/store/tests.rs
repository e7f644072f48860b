//! Store tests on the real engine over an in-memory or counted object store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use parking_lot::Mutex;

use super::observed::ObservedStore;
use super::*;

#[derive(Default)]
struct Recorder {
    acks: Mutex<Vec<(AckTo, AppendOutcome)>>,
    routed: Mutex<Vec<(String, u64, u64)>>,
}

impl StoreEvents for Recorder {
    fn sequenced(&self, batch: &[Sequenced<'_>]) {
        let mut routed = self.routed.lock();
        for m in batch {
            routed.push((m.subject.to_owned(), m.version, m.offset));
        }
    }

    fn acknowledged(&self, acks: Vec<(Arc<str>, AckTo, AppendOutcome)>) {
        self.acks
            .lock()
            .extend(acks.into_iter().map(|(_, ack, outcome)| (ack, outcome)));
    }
}

fn settings(object_store: Arc<dyn ObjectStore>) -> StoreSettings {
    StoreSettings {
        url: StoreUrl::Memory,
        flush_interval: Duration::from_millis(1),
        dedupe_window: Duration::from_secs(60),
        max_batch: 256,
        queue_depth: 1024,
        s3: S3Settings::default(),
        block_cache_bytes: 16 << 20,
        meta_cache_bytes: 16 << 20,
        object_store: Some(object_store),
        clock: crate::clock::Clock::default(),
    }
}

fn request(subject: &str, payload: &str, n: u32) -> AppendRequest {
    AppendRequest {
        tenant: Arc::from("t"),
        subject: Arc::from(subject),
        messages: vec![NewMessage {
            headers: Bytes::new(),
            payload: Bytes::from(payload.to_owned()),
            flags: 0,
        }],
        expect: None,
        msg_id: None,
        durability: Durability::Durable,
        ack: Some(AckTo {
            address: Bytes::new(),
            flags: n,
        }),
        route: RouteTag::default(),
        compaction: None,
        max_versions: 0,
        retain: false,
    }
}

/// Waits until `n` acks arrived.
async fn acks(recorder: &Recorder, n: usize) -> Vec<(AckTo, AppendOutcome)> {
    for _ in 0..2000 {
        if recorder.acks.lock().len() >= n {
            return recorder.acks.lock().clone();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("only {} of {n} acks", recorder.acks.lock().len());
}

async fn fill(inner: Arc<dyn ObjectStore>, messages: usize, subjects: usize) {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(inner), recorder.clone())
        .await
        .expect("opens");
    for i in 0..messages {
        let mut r = request(&format!("s.{}", i % subjects), "x", 0);
        r.ack = None;
        store.append(r).await.expect("queued");
    }
    store.barrier().await.expect("barrier");
    store.close().await.expect("closes");
}

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

#[tokio::test]
async fn a_newer_format_or_foreign_data_is_refused() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let db = slatedb::Db::open("db", Arc::clone(&inner))
            .await
            .expect("db");
        db.put(keys::FORMAT_KEY, 99u64.to_be_bytes())
            .await
            .expect("put");
        db.close().await.expect("close");
    }
    let error = Store::open(settings(inner), Arc::new(Recorder::default()))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(error, StoreError::NewerFormat { found: 99, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("newer canopy"), "{error}");

    let foreign: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let db = slatedb::Db::open("db", Arc::clone(&foreign))
            .await
            .expect("db");
        db.put(b"something", b"else").await.expect("put");
        db.close().await.expect("close");
    }
    let error = Store::open(settings(foreign), Arc::new(Recorder::default()))
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, StoreError::Foreign), "{error}");
}

struct Rules {
    max_age_ms: u64,
    max_tenant_bytes: u64,
}

impl RetentionRules for Rules {
    fn max_age_ms(&self, subject: &str) -> u64 {
        if subject.starts_with("keep") {
            0
        } else {
            self.max_age_ms
        }
    }

    fn shortest_max_age_ms(&self) -> u64 {
        self.max_age_ms
    }

    fn max_tenant_bytes(&self) -> u64 {
        self.max_tenant_bytes
    }
}

async fn versions(store: &Store, subject: &str) -> Vec<u64> {
    store
        .replay_subject("t", subject, ReplayFrom::Start, 1000, usize::MAX)
        .await
        .expect("replays")
        .messages
        .iter()
        .map(|m| m.version)
        .collect()
}

#[tokio::test]
async fn retention_by_age_and_bytes_never_reuses_versions_or_offsets() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    for i in 0..4 {
        store
            .append(request("old", "12345", i))
            .await
            .expect("queued");
        store
            .append(request("keep", "12345", 10 + i))
            .await
            .expect("queued");
    }
    acks(&recorder, 8).await;
    // Older than the 5 ms age on the store's clock, without waiting.
    store.clock().advance(Duration::from_millis(20));
    let stop = tokio_util::sync::CancellationToken::new();
    let by_age = Rules {
        max_age_ms: 5,
        max_tenant_bytes: 0,
    };
    let pass = store.enforce_retention(&by_age, &stop).await.expect("pass");
    assert_eq!(pass.messages, 4);
    assert!(versions(&store, "old").await.is_empty());
    assert_eq!(versions(&store, "keep").await, [1, 2, 3, 4]);
    // A second pass finds nothing more to do.
    assert_eq!(
        store
            .enforce_retention(&by_age, &stop)
            .await
            .expect("pass")
            .messages,
        0
    );

    // Budget: 4 kept messages of 5 bytes against 10 bytes: the 2 oldest go.
    let by_bytes = Rules {
        max_age_ms: 0,
        max_tenant_bytes: 10,
    };
    let pass = store
        .enforce_retention(&by_bytes, &stop)
        .await
        .expect("pass");
    assert_eq!(pass.messages, 2);
    assert_eq!(versions(&store, "keep").await, [3, 4]);
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_fully_expired_tenant_keeps_its_offsets_and_versions_after_restart() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::clone(&inner)), recorder.clone())
        .await
        .expect("opens");
    for i in 0..3 {
        store.append(request("gone", "x", i)).await.expect("queued");
    }
    acks(&recorder, 3).await;
    store.clock().advance(Duration::from_millis(20));
    let rules = Rules {
        max_age_ms: 5,
        max_tenant_bytes: 0,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    assert_eq!(
        store
            .enforce_retention(&rules, &stop)
            .await
            .expect("pass")
            .messages,
        3
    );
    store.close().await.expect("closes");

    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(inner), recorder.clone())
        .await
        .expect("reopens");
    store.append(request("gone", "y", 9)).await.expect("queued");
    let got = acks(&recorder, 1).await;
    assert!(
        matches!(
            got[0].1,
            AppendOutcome::Stored {
                version: 4,
                offset: 4,
                ..
            }
        ),
        "{got:?}"
    );
    store.close().await.expect("closes");
}

#[tokio::test]
async fn max_versions_keeps_the_newest_versions() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    for i in 0..5 {
        let mut r = request("capped", "x", i);
        r.max_versions = 2;
        store.append(r).await.expect("queued");
    }
    acks(&recorder, 5).await;
    assert_eq!(versions(&store, "capped").await, [4, 5]);
    store.close().await.expect("closes");
}

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

#[tokio::test]
async fn purging_a_tenant_deletes_all_its_keys_and_nothing_of_another() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::clone(&inner)), recorder.clone())
        .await
        .expect("opens");
    // Tenant "t" and tenant "tt" (whose name starts with the other's).
    for i in 0..5 {
        store
            .append(request(&format!("s.{i}"), "x", i))
            .await
            .expect("queued");
        let mut other = request(&format!("s.{i}"), "y", 100 + i);
        other.tenant = Arc::from("tt");
        store.append(other).await.expect("queued");
    }
    acks(&recorder, 10).await;
    store
        .put_snapshot("t", "s.1", 1, b"state", false)
        .await
        .expect("snapshot");
    store
        .put_tenant(&super::new_tenant("t", super::TenantLimits::default()))
        .await
        .expect("record");
    store.forget_tenant("t").await.expect("forgotten");
    let deleted = store.purge_tenant("t").await.expect("purged");
    assert!(deleted > 5 * 2, "messages, markers, batches...: {deleted}");
    assert_eq!(store.tenant("t").await.expect("read"), None);
    assert_eq!(versions(&store, "s.1").await, Vec::<u64>::new());
    assert_eq!(store.subject_count("t").await.expect("count"), 0);
    assert_eq!(store.subject_count("tt").await.expect("count"), 5);
    assert_eq!(store.snapshot("t", "s.1", None).await.expect("read"), None);
    // The other tenant is whole, and the purged one starts afresh.
    let page = store
        .replay_subject("tt", "s.3", ReplayFrom::Start, 10, 1 << 20)
        .await
        .expect("replay");
    assert_eq!(page.messages.len(), 1);
    store.append(request("s.1", "z", 50)).await.expect("queued");
    let got = acks(&recorder, 1).await;
    assert!(
        matches!(got[0].1, AppendOutcome::Stored { version: 1, .. }),
        "{got:?}"
    );
    store.close().await.expect("closes");
}

#[tokio::test]
async fn stored_limits_refuse_appends_and_usage_follows_every_deletion() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::clone(&inner)), recorder.clone())
        .await
        .expect("opens");
    let limits = super::StoredLimits {
        max_subjects: Some(3),
        max_bytes: Some(100),
        max_age_ms: None,
    };
    store.set_limits("t", limits).await.expect("limits");
    // Three subjects of 10 bytes each, then a fourth subject is refused.
    for i in 0..3 {
        store
            .append(request(&format!("s.{i}"), "0123456789", i))
            .await
            .expect("queued");
    }
    store
        .append(request("s.3", "0123456789", 3))
        .await
        .expect("queued");
    let got = acks(&recorder, 4).await;
    assert!(
        matches!(outcome_of(&got, 3), AppendOutcome::QuotaExceeded { reason } if reason.contains("3 subjects")),
        "{got:?}"
    );
    let usage = store.usage("t").await.expect("usage");
    assert_eq!((usage.subjects, usage.bytes), (3, 30));
    // Old subjects still take messages, up to 100 bytes in all.
    for i in 0..7 {
        store
            .append(request("s.0", "0123456789", 10 + i))
            .await
            .expect("queued");
    }
    let got = acks(&recorder, 11).await;
    assert!(
        (10..17).all(|n| matches!(outcome_of(&got, n), AppendOutcome::Stored { .. })),
        "{got:?}"
    );
    assert!(!store.at_bytes_limit("other"));
    assert!(store.at_bytes_limit("t"), "100 of 100 bytes");
    store.append(request("s.1", "x", 20)).await.expect("queued");
    let got = acks(&recorder, 12).await;
    assert!(
        matches!(outcome_of(&got, 20), AppendOutcome::QuotaExceeded { reason } if reason.contains("100 stored bytes")),
        "{got:?}"
    );
    // A purge frees its bytes; a subject's version limit frees what it drops.
    store.purge_subject("t", "s.0").await.expect("purged");
    store.barrier().await.expect("released");
    for i in 0..4 {
        let mut r = request("s.2", "0123456789", 30 + i);
        r.max_versions = 1;
        store.append(r).await.expect("queued");
    }
    acks(&recorder, 16).await;
    let usage = store.usage("t").await.expect("usage");
    assert_eq!(
        (usage.subjects, usage.bytes),
        (3, 20),
        "s.1 and the last s.2"
    );
    assert!(!store.at_bytes_limit("t"));
    // The usage survives a restart; the limits come back from the tenant records.
    store.close().await.expect("closes");
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(inner), recorder.clone())
        .await
        .expect("reopens");
    let usage = store.usage("t").await.expect("usage");
    assert_eq!((usage.subjects, usage.bytes), (3, 20));
    store.close().await.expect("closes");
}

/// The outcome of the append whose ack flags were `n`.
fn outcome_of(got: &[(AckTo, AppendOutcome)], n: u32) -> &AppendOutcome {
    match got.iter().find(|(ack, _)| ack.flags == n) {
        Some((_, outcome)) => outcome,
        None => panic!("no ack {n} in {got:?}"),
    }
}

#[tokio::test]
async fn a_tenants_own_age_limit_removes_only_its_messages_and_frees_its_bytes() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    let short = super::StoredLimits {
        max_age_ms: Some(5),
        ..Default::default()
    };
    store.set_limits("t", short).await.expect("limits");
    for i in 0..3 {
        store
            .append(request("keep.a", "12345", i))
            .await
            .expect("queued");
        let mut other = request("keep.a", "12345", 10 + i);
        other.tenant = Arc::from("u");
        store.append(other).await.expect("queued");
    }
    acks(&recorder, 6).await;
    store.clock().advance(Duration::from_millis(20));
    // The subjects' own rules keep `keep.*` forever; tenant t's limit still applies.
    let forever = Rules {
        max_age_ms: 0,
        max_tenant_bytes: 0,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let pass = store
        .enforce_retention(&forever, &stop)
        .await
        .expect("pass");
    assert_eq!((pass.messages, pass.bytes), (3, 15));
    assert!(versions(&store, "keep.a").await.is_empty());
    let page = store
        .replay_subject("u", "keep.a", ReplayFrom::Start, 10, usize::MAX)
        .await
        .expect("replay");
    assert_eq!(page.messages.len(), 3, "tenant u keeps its messages");
    store.barrier().await.expect("released");
    store
        .append(request("keep.b", "x", 20))
        .await
        .expect("queued");
    acks(&recorder, 7).await;
    assert_eq!(
        store.usage("t").await.expect("usage").bytes,
        1,
        "15 bytes freed"
    );
    assert_eq!(store.usage("u").await.expect("usage").bytes, 15);
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_purged_version_is_not_released_again_when_a_version_limit_drops_it() {
    let recorder = Arc::new(Recorder::default());
    let store = Store::open(settings(Arc::new(InMemory::new())), recorder.clone())
        .await
        .expect("opens");
    let capped = |n: u32| {
        let mut r = request("s.a", "0123456789", n);
        r.max_versions = 1;
        r
    };
    store.append(capped(1)).await.expect("queued");
    store
        .append(request("s.b", "0123456789", 2))
        .await
        .expect("queued");
    acks(&recorder, 2).await;
    store.purge_subject("t", "s.a").await.expect("purged");
    store.barrier().await.expect("released");
    // v2 pushes out v1, which the purge already took (and released).
    store.append(capped(3)).await.expect("queued");
    acks(&recorder, 3).await;
    assert_eq!(
        store.usage("t").await.expect("usage").bytes,
        20,
        "s.b and s.a's v2"
    );
    store.close().await.expect("closes");
}
