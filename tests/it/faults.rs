//! A misbehaving object store: injected errors and delays give publishers late acks,
//! never a lost acked message; live pub/sub keeps flowing; the server recovers by
//! itself when the store does.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::memory::InMemory;

use canopy::store::observed::ObservedStore;

use crate::common::{WAIT, header, replay_subject, test_config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_delays_acks_but_loses_nothing_and_live_traffic_flows() {
    let observed = Arc::new(ObservedStore::new(Arc::new(InMemory::new())));
    let faults = Arc::clone(&observed.faults);
    let mut config = test_config();
    config.store.url = "memory://".into();
    let server = canopy::server::Server::bind_on(config, Some(observed))
        .await
        .expect("binds")
        .spawn();
    // Acks may wait for the store's retries: the client waits as long as the test does
    // below, not async-nats' default 10 s (a loaded CI machine needed more).
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(Duration::from_secs(30)))
        .connect(server.native_url())
        .await
        .expect("connect");
    let watcher = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut live = watcher.subscribe("_INBOX.live.>").await.expect("sub");
    let mut stored_live = watcher.subscribe("faulty.>").await.expect("sub");
    watcher.flush().await.expect("flush");
    // async-nats' flush only writes the buffer out: it does not wait for the server to
    // have applied the SUBs, so a publish on another connection could overtake them.
    // Probe the stored subscription until one probe comes back: every probe before it
    // was routed before the SUB and is gone, none after it was sent.
    let mut probes = 0;
    loop {
        probes += 1;
        assert!(
            probes <= 100,
            "the watcher's subscriptions never took effect"
        );
        client
            .publish(
                format!("faulty.probe.{probes}"),
                Bytes::from_static(b"probe"),
            )
            .await
            .expect("publish");
        // A probe that came late (the machine was slow) proves it as well; one sent
        // after it may still come, and the count below leaves probes out.
        if let Ok(Some(probe)) =
            tokio::time::timeout(Duration::from_millis(100), stored_live.next()).await
        {
            assert!(
                probe.subject.starts_with("faulty.probe."),
                "{}",
                probe.subject
            );
            break;
        }
    }

    // An ack task never panics: what it got is reported with the test's failure.
    let ack = |i: usize| {
        let client = client.clone();
        async move {
            let answer = client
                .request_with_headers(
                    "faulty.a",
                    header("Canopy-Ack", "durable"),
                    Bytes::from(format!("m{i}")),
                )
                .await
                .map_err(|e| format!("m{i}: no answer: {e}"))?;
            let value: serde_json::Value = serde_json::from_slice(&answer.payload)
                .map_err(|e| format!("m{i}: not JSON ({e})"))?;
            match value.get("error") {
                Some(_) => Err(format!("m{i}: {value}")),
                None => Ok(value),
            }
        }
    };
    for i in 0..10 {
        ack(i).await.expect("acked while the store works");
    }

    // The store goes away: acks wait, they are never sent early.
    faults.fail_writes(true);
    let mut pending: Vec<_> = (10..30).map(|i| tokio::spawn(ack(i))).collect();
    // Live traffic flows meanwhile, stored subjects included.
    for i in 0..100 {
        client
            .publish(format!("_INBOX.live.{i}"), Bytes::from_static(b"x"))
            .await
            .expect("publish");
    }
    for n in 0..100 {
        if tokio::time::timeout(WAIT, live.next()).await.is_err() {
            panic!("live messages flow while the store fails: {n} of 100 came");
        }
    }
    // Generous: a loaded CI machine runs this beside the whole suite.
    let mut n = 0;
    while n < 30 {
        let next = tokio::time::timeout(3 * WAIT, stored_live.next()).await;
        if let Ok(Some(message)) = &next {
            if !message.subject.starts_with("faulty.probe.") {
                n += 1;
            }
            continue;
        }
        // What the acks that ended said, to tell a stuck sequencer from a refusal.
        let mut outcomes = Vec::new();
        for task in pending {
            if task.is_finished() {
                outcomes.push(format!("{:?}", task.await));
            } else {
                outcomes.push("waiting".to_owned());
            }
        }
        panic!(
            "stored subjects are delivered live while the store fails: {n} of 30 came \
             (acks: {outcomes:?})"
        );
    }
    // A quiet window: an ack that must not be sent has nothing to wait for. All thirty
    // were routed live already, so an ack that went early would be out by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(early) = pending.iter_mut().find(|p| p.is_finished()) {
        let got = early.await;
        panic!("an ack was sent while nothing could be written: {got:?}");
    }

    // Slow but working again: every ack arrives, nothing is lost.
    faults.delay(Duration::from_millis(50));
    faults.fail_writes(false);
    let mut refused = Vec::new();
    for (n, task) in pending.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(30), task).await {
            Err(_) => panic!("ack {n} of the 20 did not arrive once the store was back"),
            Ok(Err(e)) => panic!("ack task {n}: {e}"),
            Ok(Ok(Err(why))) => refused.push(why),
            Ok(Ok(Ok(_))) => {}
        }
    }
    assert!(
        refused.is_empty(),
        "acks refused instead of waiting for the store: {refused:?}"
    );
    faults.delay(Duration::ZERO);
    let history = replay_subject(&client, "faulty.a").await;
    let versions: Vec<u64> = history.iter().map(|m| m.version).collect();
    assert_eq!(versions, (1..=30).collect::<Vec<u64>>());
    server.stop().await;
}
