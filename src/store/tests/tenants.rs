//! A tenant's keys and quotas: purges delete all of one tenant and nothing of another,
//! stored limits refuse appends and usage follows every deletion.

use super::*;

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
        .put_tenant(&super::new_tenant("t", super::TenantLimits::default(), 0))
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
