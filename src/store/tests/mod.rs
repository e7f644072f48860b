//! Store tests on the real engine over an in-memory or counted object store, by topic;
//! this module holds what they share: an events recorder, settings, requests and
//! retention rules.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use parking_lot::Mutex;

use super::observed::ObservedStore;
use super::*;

mod appends;
mod combining;
mod format;
mod journal;
mod retained;
mod retention;
mod runs;
mod tenants;
mod unflushed;

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

pub(crate) fn settings(object_store: Arc<dyn ObjectStore>) -> StoreSettings {
    StoreSettings {
        url: StoreUrl::Memory,
        flush_interval: Duration::from_millis(1),
        dedupe_window: Duration::from_secs(60),
        local_gc: Duration::from_secs(10),
        compress: true,
        max_batch: 256,
        queue_depth: 1024,
        s3: S3Settings::default(),
        block_cache_bytes: 16 << 20,
        meta_cache_bytes: 16 << 20,
        object_store: Some(object_store),
        clock: crate::clock::Clock::default(),
        journal: true,
        journal_bytes: 64 << 20,
        keys: None,
    }
}

pub(crate) fn request(subject: &str, payload: &str, n: u32) -> AppendRequest {
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
            cargo: None,
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

struct Rules {
    max_age_ms: u64,
    max_tenant_bytes: u64,
}

impl RetentionRules for Rules {
    fn max_age_ms(&self, _tenant: &str, subject: &str) -> u64 {
        if subject.starts_with("keep") {
            0
        } else {
            self.max_age_ms
        }
    }

    fn shortest_max_age_ms(&self, _tenant: &str) -> u64 {
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
