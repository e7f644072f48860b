//! Retention by age, bytes and version count, and what it must keep: versions and
//! offsets never reused, usage released once.

use super::*;

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
