//! The follower on the real store engine (in memory), fed by a router that offers
//! what the sequencer routes to the taps, as the broker's does.

use std::sync::Arc;
use std::time::Duration;

use canopy_subjects::Pattern;
use object_store::memory::InMemory;

use super::*;
use crate::store::tests::{request, settings};
use crate::store::{AckTo, AppendOutcome, ReplayFrom, Sequenced, Store, StoreEvents};

struct Router {
    taps: Arc<Taps>,
}

impl StoreEvents for Router {
    fn sequenced(&self, batch: &[Sequenced<'_>]) {
        for message in batch {
            self.taps.offer(message);
        }
    }

    fn acknowledged(&self, _: Vec<(Arc<str>, AckTo, AppendOutcome)>) {}

    fn lost(&self) {
        self.taps.lost();
    }
}

async fn open() -> (Arc<Store>, Arc<Taps>) {
    let taps = Arc::new(Taps::default());
    let router = Arc::new(Router {
        taps: Arc::clone(&taps),
    });
    let store = Store::open(settings(Arc::new(InMemory::new())), router)
        .await
        .expect("opens");
    (Arc::new(store), taps)
}

async fn publish(store: &Store, subjects: &[&str]) {
    for subject in subjects {
        let mut r = request(subject, "x", 0);
        r.ack = None;
        store.append(r).await.expect("queued");
    }
    store.durable_barrier().await.expect("barrier");
}

/// Follows until `n` messages came, each step within a second.
async fn take(follower: &mut Follower, n: usize) -> Vec<(String, u64, u64)> {
    let mut got = Vec::new();
    while got.len() < n {
        let page = tokio::time::timeout(Duration::from_secs(5), follower.next())
            .await
            .expect("a step within the time")
            .expect("a page");
        got.extend(
            page.messages
                .into_iter()
                .map(|m| (m.subject, m.version, m.offset)),
        );
    }
    got
}

fn pattern(text: &str) -> Pattern {
    Pattern::parse_native(text).expect("pattern")
}

#[tokio::test]
async fn history_then_live_with_nothing_missed_or_repeated() {
    let (store, taps) = open().await;
    publish(&store, &["a.1", "b.1", "a.2", "a.1"]).await;
    let mut follower = Follower::new(
        Arc::clone(&store),
        Arc::from("t"),
        Target::Pattern(pattern("a.*")),
        ReplayFrom::Offset(2),
    )
    .pages_of(1, 1 << 20)
    .tapped(&taps, 1 << 20, true);
    let history = take(&mut follower, 2).await;
    assert_eq!(
        history,
        [("a.2".to_owned(), 1, 3), ("a.1".to_owned(), 2, 4)],
        "from offset 2, one a page, b.1 left out"
    );
    publish(&store, &["a.3", "b.2", "a.2"]).await;
    let live = take(&mut follower, 2).await;
    assert_eq!(live, [("a.3".to_owned(), 1, 5), ("a.2".to_owned(), 2, 7)]);
    assert!(follower.is_live(), "caught up, it takes what is routed");
    assert_eq!(follower.position(), 8);
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_queue_too_small_for_anything_reads_it_all_from_the_store() {
    let (store, taps) = open().await;
    let mut follower = Follower::new(
        Arc::clone(&store),
        Arc::from("t"),
        Target::Pattern(pattern(">")),
        ReplayFrom::Start,
    )
    .tapped(&taps, 0, true);
    // Caught up at once; then every message offered is missed.
    let first = tokio::spawn(async move {
        let got = take(&mut follower, 6).await;
        (follower, got)
    });
    publish(&store, &["x", "y", "x"]).await;
    publish(&store, &["z", "x", "y"]).await;
    let (_follower, got) = first.await.expect("the follower's task");
    let offsets: Vec<u64> = got.iter().map(|(_, _, offset)| *offset).collect();
    assert_eq!(offsets, [1, 2, 3, 4, 5, 6], "in order, once each");
    store.close().await.expect("closes");
}

#[tokio::test]
async fn a_subject_is_followed_by_its_versions() {
    let (store, taps) = open().await;
    publish(&store, &["s", "t", "s", "s"]).await;
    let mut follower = Follower::new(
        Arc::clone(&store),
        Arc::from("t"),
        Target::Subject("s".into()),
        ReplayFrom::Version(2),
    )
    .tapped(&taps, 1 << 20, false);
    let got = take(&mut follower, 2).await;
    assert_eq!(got, [("s".to_owned(), 2, 3), ("s".to_owned(), 3, 4)]);
    publish(&store, &["t", "s"]).await;
    let got = take(&mut follower, 1).await;
    assert_eq!(got, [("s".to_owned(), 4, 6)]);
    assert_eq!(follower.position(), 5, "the next version");
    store.close().await.expect("closes");
}

#[tokio::test]
async fn without_a_tap_each_call_reads_one_page_and_says_when_caught_up() {
    let (store, _taps) = open().await;
    publish(&store, &["a", "b", "c"]).await;
    let mut follower = Follower::new(
        Arc::clone(&store),
        Arc::from("t"),
        Target::Filters,
        ReplayFrom::Offset(1),
    )
    .pages_of(1, 1 << 20);
    let only_a_and_c = |subject: &str| subject != "b";
    let page = follower.next_matching(&only_a_and_c).await.expect("page");
    assert_eq!(page.messages[0].subject, "a");
    assert!(!page.caught_up);
    let page = follower.next_matching(&only_a_and_c).await.expect("page");
    assert_eq!(page.messages[0].subject, "c", "b left out");
    assert!(page.caught_up);
    let page = follower.next_matching(&only_a_and_c).await.expect("page");
    assert!(page.messages.is_empty() && page.caught_up);
    assert_eq!(follower.position(), 4);
    store.close().await.expect("closes");
}
