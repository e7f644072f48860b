//! Store benchmarks on a real file store in a temporary folder (criterion, plus
//! printed figures for the one-off measurements):
//!
//! - replaying a subject with 10,000 events from its latest snapshot versus from
//!   the start;
//! - append throughput alone, and while a purge of 200,000 messages runs.
//!
//! Run: `cargo bench --bench store`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use canopy::store::{
    AckTo, AppendOutcome, AppendRequest, Durability, NewMessage, ReplayFrom, RouteTag, S3Settings,
    Sequenced, Store, StoreEvents, StoreSettings, StoreUrl,
};
use criterion::{Criterion, criterion_group, criterion_main};
use parking_lot::Mutex;

/// Counts acks; routing is not measured here.
#[derive(Default)]
struct Acks {
    count: Mutex<usize>,
}

impl StoreEvents for Acks {
    fn sequenced(&self, _batch: &[Sequenced<'_>]) {}

    fn acknowledged(&self, acks: Vec<(Arc<str>, AckTo, AppendOutcome)>) {
        *self.count.lock() += acks.len();
    }
}

fn settings(folder: &std::path::Path) -> StoreSettings {
    StoreSettings {
        url: StoreUrl::File(folder.to_owned()),
        flush_interval: Duration::from_millis(2),
        dedupe_window: Duration::from_secs(60),
        local_gc: Duration::from_secs(10),
        compress: true,
        max_batch: 1024,
        queue_depth: 8192,
        s3: S3Settings::default(),
        block_cache_bytes: 16 << 20,
        meta_cache_bytes: 16 << 20,
        object_store: None,
        clock: canopy::clock::Clock::default(),
        journal: true,
        journal_bytes: 64 << 20,
        keys: None,
    }
}

fn append(subject: &str, payload: Bytes, ack: bool) -> AppendRequest {
    AppendRequest {
        tenant: Arc::from("bench"),
        subject: Arc::from(subject),
        messages: vec![NewMessage {
            headers: Bytes::new(),
            payload,
            flags: 0,
        }],
        expect: None,
        msg_id: None,
        durability: Durability::Durable,
        ack: ack.then(|| AckTo {
            address: Bytes::new(),
            flags: 0,
            cargo: None,
        }),
        route: RouteTag::default(),
        compaction: None,
        max_versions: 0,
        retain: false,
    }
}

/// Appends `n` messages to `subjects` round-robin and waits until all are durable.
async fn load(store: &Store, acks: &Acks, subjects: &[String], n: usize) {
    let before = *acks.count.lock();
    let payload = Bytes::from(vec![b'x'; 128]);
    for i in 0..n {
        store
            .append(append(&subjects[i % subjects.len()], payload.clone(), true))
            .await
            .expect("append");
    }
    while *acks.count.lock() < before + n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn replay_from_snapshot(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let folder = tempfile::tempdir().expect("tempdir");
    let acks = Arc::new(Acks::default());
    let store = runtime.block_on(async {
        let store = Store::open(settings(folder.path()), acks.clone())
            .await
            .expect("open");
        load(&store, &acks, &["acct.1".to_owned()], 10_000).await;
        store
            .put_snapshot("bench", "acct.1", 9_990, b"state as of 9990", false)
            .await
            .expect("snapshot");
        store
    });
    let mut group = c.benchmark_group("replay 10,000 events");
    group.sample_size(20);
    group.bench_function("from the start", |b| {
        b.to_async(&runtime).iter(|| async {
            let mut from = ReplayFrom::Start;
            let mut total = 0;
            loop {
                let page = store
                    .replay_subject("bench", "acct.1", from, 1000, usize::MAX)
                    .await
                    .expect("replay");
                total += page.messages.len();
                if page.caught_up {
                    break;
                }
                from = ReplayFrom::Version(page.next);
            }
            assert_eq!(total, 10_000);
        });
    });
    group.bench_function("from the latest snapshot", |b| {
        b.to_async(&runtime).iter(|| async {
            let snapshot = store
                .snapshot("bench", "acct.1", None)
                .await
                .expect("snapshot")
                .expect("exists");
            let page = store
                .replay_subject(
                    "bench",
                    "acct.1",
                    ReplayFrom::Version(snapshot.version + 1),
                    1000,
                    usize::MAX,
                )
                .await
                .expect("replay");
            assert_eq!(page.messages.len(), 10);
        });
    });
    group.finish();
    runtime.block_on(store.close()).expect("close");
}

/// Appends per second over `window`, acked durably, from 64 in flight.
async fn append_rate(store: &Store, acks: &Acks, window: Duration) -> f64 {
    let start = Instant::now();
    let before = *acks.count.lock();
    let payload = Bytes::from(vec![b'y'; 128]);
    let mut sent = 0usize;
    while start.elapsed() < window {
        for _ in 0..256 {
            store
                .append(append(
                    &format!("live.{}", sent % 1000),
                    payload.clone(),
                    true,
                ))
                .await
                .expect("append");
            sent += 1;
        }
        while sent - (*acks.count.lock() - before) > 4096 {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    while *acks.count.lock() < before + sent {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sent as f64 / start.elapsed().as_secs_f64()
}

fn publishing_during_a_purge(_c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let folder = tempfile::tempdir().expect("tempdir");
        let acks = Arc::new(Acks::default());
        let store = Arc::new(
            Store::open(settings(folder.path()), acks.clone())
                .await
                .expect("open"),
        );
        let doomed: Vec<String> = (0..1000).map(|i| format!("old.{i}")).collect();
        load(&store, &acks, &doomed, 200_000).await;
        let alone = append_rate(&store, &acks, Duration::from_secs(3)).await;
        let purging = {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let started = Instant::now();
                let pattern = canopy_subjects::Pattern::parse_native("old.>").expect("pattern");
                let purged = store.purge_pattern("bench", &pattern).await.expect("purge");
                (purged, started.elapsed())
            })
        };
        let during = append_rate(&store, &acks, Duration::from_secs(3)).await;
        let (purged, took) = purging.await.expect("purge task");
        println!(
            "publishing alone: {alone:.0} msgs/s; while purging {} messages of {} subjects: \
             {during:.0} msgs/s ({:.0}%); the purge took {took:?}",
            purged.messages,
            purged.subjects,
            during / alone * 100.0
        );
        store.close().await.expect("close");
    });
}

criterion_group!(benches, replay_from_snapshot, publishing_during_a_purge);
criterion_main!(benches);
