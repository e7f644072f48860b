//! Durable key streams through real clients: JetStream publishing with async-nats,
//! Canopy's expected versions and msg ids, live order, the `$CANOPY.` API (get,
//! replay, subjects, append), and the store across a restart.

use std::collections::{BTreeMap, HashMap, HashSet};

use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{
    Stored, WAIT, file_config, header, header_of, list_subjects, local_folder_config,
    publish_acked, replay_all, replay_collect, replay_page, replay_start, replay_subject,
    replay_texts, request_then_marker, start, start_default, store_request, subjects_page,
    test_config,
};

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connect")
}

fn seq(ack: &Value) -> u64 {
    ack["seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("ack without seq: {ack}"))
}

fn version(ack: &Value) -> u64 {
    ack["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("ack without version: {ack}"))
}

/// The JetStream API error inside a failed JetStream publish.
fn jetstream_error(
    error: &async_nats::jetstream::context::PublishError,
) -> &async_nats::jetstream::Error {
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
        .unwrap_or_else(|| panic!("publish error carries the JetStream error: {error:?}"))
}

// ---------------------------------------------------------------------------------
// a. JetStream clients publish unmodified

#[tokio::test]
async fn jetstream_publish_is_acked_when_the_policy_says_always() {
    let mut config = test_config();
    let everything = config
        .store
        .policies
        .iter_mut()
        .find(|p| p.pattern == ">")
        .expect("the default config has a `>` policy");
    everything.ack = canopy::config::AckMode::Always;
    let server = start(config).await;
    let js = async_nats::jetstream::new(connect(&server).await);

    let mut last = 0;
    for (i, subject) in ["js.a", "js.b", "js.a", "js.c"].into_iter().enumerate() {
        let ack = js
            .publish(subject, Bytes::from(format!("m{i}")))
            .await
            .expect("publish")
            .await
            .expect("PubAck");
        assert_eq!(ack.stream, "default");
        assert!(
            ack.sequence > last,
            "seq increases: {} after {last}",
            ack.sequence
        );
        assert!(!ack.duplicate);
        last = ack.sequence;
    }

    // Nats-Expected-Last-Subject-Sequence: the offset of the subject's last message.
    let first = js
        .send_publish(
            "js.seq",
            PublishMessage::build()
                .payload("one".into())
                .expected_last_subject_sequence(0),
        )
        .await
        .expect("publish")
        .await
        .expect("expected 0 on a new subject holds");
    let second = js
        .send_publish(
            "js.seq",
            PublishMessage::build()
                .payload("two".into())
                .expected_last_subject_sequence(first.sequence),
        )
        .await
        .expect("publish")
        .await
        .expect("the right last sequence holds");
    assert!(second.sequence > first.sequence);
    let error = js
        .send_publish(
            "js.seq",
            PublishMessage::build()
                .payload("three".into())
                .expected_last_subject_sequence(first.sequence),
        )
        .await
        .expect("publish")
        .await
        .expect_err("a stale last sequence is refused");
    assert_eq!(
        error.kind(),
        async_nats::jetstream::context::PublishErrorKind::WrongLastSequence,
        "{error}"
    );
    let api = jetstream_error(&error);
    assert_eq!(api.code(), 400);
    assert_eq!(api.error_code().0, 10071);
    assert!(
        api.to_string()
            .contains(&format!("wrong last sequence: {}", second.sequence)),
        "names the subject's last sequence: {api}"
    );

    // Nothing was stored by the refused publish.
    let client = connect(&server).await;
    let stored = replay_subject(&client, "js.seq").await;
    let texts: Vec<String> = stored.iter().map(Stored::text).collect();
    assert_eq!(texts, ["one", "two"]);
    assert_eq!(stored[1].offset, second.sequence);
    server.stop().await;
}

#[tokio::test]
async fn jetstream_msg_ids_dedupe_under_the_default_policy() {
    let server = start_default().await;
    let js = async_nats::jetstream::new(connect(&server).await);

    let first = js
        .publish_with_headers("jsid.a", header("Nats-Msg-Id", "order-1"), "x".into())
        .await
        .expect("publish")
        .await
        .expect("PubAck");
    assert_eq!(first.stream, "default");
    assert!(!first.duplicate);
    let again = js
        .publish_with_headers("jsid.a", header("Nats-Msg-Id", "order-1"), "x".into())
        .await
        .expect("publish")
        .await
        .expect("PubAck");
    assert!(again.duplicate, "the same Nats-Msg-Id is a duplicate");
    assert_eq!(again.sequence, first.sequence);
    assert_eq!(again.stream, "default");

    let other = js
        .send_publish(
            "jsid.a",
            PublishMessage::build()
                .payload("y".into())
                .message_id("order-2"),
        )
        .await
        .expect("publish")
        .await
        .expect("PubAck");
    assert!(!other.duplicate);
    assert!(other.sequence > first.sequence);

    // The Nats-Expected-* header alone asks for the ack.
    let right = js
        .send_publish(
            "jsid.a",
            PublishMessage::build()
                .payload("z".into())
                .expected_last_subject_sequence(other.sequence),
        )
        .await
        .expect("publish")
        .await
        .expect("right last sequence");
    assert!(right.sequence > other.sequence);
    let wrong = js
        .send_publish(
            "jsid.a",
            PublishMessage::build()
                .payload("w".into())
                .expected_last_subject_sequence(other.sequence),
        )
        .await
        .expect("publish")
        .await
        .expect_err("wrong last sequence");
    assert_eq!(
        wrong.kind(),
        async_nats::jetstream::context::PublishErrorKind::WrongLastSequence
    );
    let api = jetstream_error(&wrong);
    assert_eq!((api.code(), api.error_code().0), (400, 10071));
    assert!(api.to_string().contains("wrong last sequence"), "{api}");

    let client = connect(&server).await;
    let texts = replay_texts(&client, "jsid.a").await;
    assert_eq!(
        texts,
        ["x", "y", "z"],
        "the duplicate and the refused publish are not stored"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// b. Expected versions

#[tokio::test]
async fn expected_version_zero_means_the_subject_must_not_exist() {
    let server = start_default().await;
    let client = connect(&server).await;
    let ack = store_request(
        &client,
        "ev.new",
        header("Canopy-Expected-Version", "0"),
        "a",
    )
    .await;
    assert!(ack.get("error").is_none(), "{ack}");
    assert_eq!(ack["stream"], "default");
    assert_eq!(ack["subject"], "ev.new");
    assert_eq!(version(&ack), 1);
    let conflict = store_request(
        &client,
        "ev.new",
        header("Canopy-Expected-Version", "0"),
        "b",
    )
    .await;
    assert_eq!(conflict["error"]["code"], 409, "{conflict}");
    assert_eq!(conflict["error"]["err_code"], 10071, "{conflict}");
    assert_eq!(conflict["current_version"], 1, "{conflict}");
    let description = conflict["error"]["description"]
        .as_str()
        .expect("description");
    assert!(description.contains("is at version 1"), "{description}");
    let next = store_request(
        &client,
        "ev.new",
        header("Canopy-Expected-Version", "1"),
        "c",
    )
    .await;
    assert_eq!(version(&next), 2, "{next}");
    let texts = replay_texts(&client, "ev.new").await;
    assert_eq!(texts, ["a", "c"]);
    server.stop().await;
}

#[tokio::test]
async fn racing_writers_win_each_version_exactly_once() {
    const TASKS: usize = 8;
    const VERSIONS: u64 = 50;
    const SUBJECTS: [&str; 3] = ["race.a", "race.b", "race.c"];
    let server = start_default().await;

    struct Outcome {
        wins: Vec<(usize, u64, u64, String)>,
        losses: usize,
    }
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = connect(&server).await;
        tasks.push(tokio::spawn(async move {
            let mut belief = [0u64; 3];
            let mut outcome = Outcome {
                wins: Vec::new(),
                losses: 0,
            };
            let mut turn = task;
            loop {
                let open: Vec<usize> = (0..3).filter(|&s| belief[s] < VERSIONS).collect();
                let Some(&s) = open.get(turn % open.len().max(1)) else {
                    return outcome;
                };
                turn += 1;
                let payload = format!("t{task}-{}-v{}", SUBJECTS[s], belief[s] + 1);
                let reply = store_request(
                    &client,
                    SUBJECTS[s],
                    header("Canopy-Expected-Version", &belief[s].to_string()),
                    payload.clone(),
                )
                .await;
                if reply.get("error").is_some() {
                    assert_eq!(reply["error"]["code"], 409, "{reply}");
                    let current = reply["current_version"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("conflict names the current version: {reply}"));
                    assert!(
                        current > belief[s] && current <= VERSIONS,
                        "expected {} lost to version {current}: {reply}",
                        belief[s]
                    );
                    let description = reply["error"]["description"].as_str().unwrap_or("");
                    assert!(
                        description.contains(&format!("is at version {current}")),
                        "{description}"
                    );
                    outcome.losses += 1;
                    belief[s] = current;
                } else {
                    assert_eq!(reply["subject"], SUBJECTS[s], "{reply}");
                    assert_eq!(version(&reply), belief[s] + 1, "{reply}");
                    outcome
                        .wins
                        .push((s, version(&reply), seq(&reply), payload));
                    belief[s] += 1;
                }
            }
        }));
    }
    let mut winners: BTreeMap<(usize, u64), Vec<(u64, String)>> = BTreeMap::new();
    let mut losses = 0;
    for task in tasks {
        let outcome = tokio::time::timeout(WAIT * 3, task)
            .await
            .expect("writers finish")
            .expect("writer task");
        losses += outcome.losses;
        for (s, v, offset, payload) in outcome.wins {
            winners.entry((s, v)).or_default().push((offset, payload));
        }
    }
    assert!(losses >= TASKS - 1, "the writers raced: {losses} losses");
    let client = connect(&server).await;
    for (s, subject) in SUBJECTS.iter().enumerate() {
        let mut last_offset = 0;
        for v in 1..=VERSIONS {
            let won = winners.get(&(s, v)).map(Vec::as_slice).unwrap_or(&[]);
            assert_eq!(won.len(), 1, "{subject} version {v} won by: {won:?}");
            assert!(won[0].0 > last_offset, "offsets increase with versions");
            last_offset = won[0].0;
        }
        let stored = replay_subject(&client, subject).await;
        let versions: Vec<u64> = stored.iter().map(|m| m.version).collect();
        assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>(), "{subject}");
        for m in &stored {
            assert_eq!(m.subject, *subject);
            let (offset, payload) = &winners[&(s, m.version)][0];
            assert_eq!(m.offset, *offset, "{subject} v{}", m.version);
            assert_eq!(m.text(), *payload, "{subject} v{}", m.version);
        }
        assert!(stored.windows(2).all(|w| w[0].offset < w[1].offset));
    }
    assert_eq!(winners.len(), SUBJECTS.len() * VERSIONS as usize);
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// c. Live order

#[tokio::test]
async fn live_subscribers_see_a_stored_subject_in_version_order() {
    const PUBLISHERS: usize = 4;
    const EACH: usize = 100;
    let server = start_default().await;
    let watcher = connect(&server).await;
    let mut sub = watcher.subscribe("live.order").await.expect("sub");
    watcher.flush().await.expect("flush");

    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let client = connect(&server).await;
        publishers.push(tokio::spawn(async move {
            futures::future::join_all((0..EACH).map(|i| {
                let client = client.clone();
                async move {
                    let payload = format!("p{p}-{i}");
                    let ack = publish_acked(&client, "live.order", payload.clone()).await;
                    (payload, version(&ack))
                }
            }))
            .await
        }));
    }
    let mut version_of: HashMap<String, u64> = HashMap::new();
    for publisher in publishers {
        for (payload, v) in publisher.await.expect("publisher") {
            assert!(version_of.insert(payload, v).is_none());
        }
    }
    let total = PUBLISHERS * EACH;
    let mut received = Vec::with_capacity(total);
    for _ in 0..total {
        let message = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("a live message within the wait")
            .expect("subscription open");
        received.push(String::from_utf8_lossy(&message.payload).into_owned());
    }
    let live_versions: Vec<u64> = received.iter().map(|p| version_of[p]).collect();
    assert_eq!(
        live_versions,
        (1..=total as u64).collect::<Vec<_>>(),
        "live delivery follows version order"
    );
    let replayed = replay_texts(&watcher, "live.order").await;
    assert_eq!(replayed, received, "replay order is the live order");
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// d. A reply subject alone is plain request/reply

#[tokio::test]
async fn requests_without_ack_headers_reach_the_responder_not_the_store() {
    let server = start_default().await;
    let responder = connect(&server).await;
    let mut service = responder.subscribe("svc.echo").await.expect("sub");
    responder.flush().await.expect("flush");
    let answering = tokio::spawn(async move {
        while let Some(request) = service.next().await {
            if let Some(reply) = request.reply {
                let answer = format!("pong:{}", String::from_utf8_lossy(&request.payload));
                responder
                    .publish(reply, answer.into())
                    .await
                    .expect("answer");
                responder.flush().await.expect("flush");
            }
        }
    });

    let client = connect(&server).await;
    let answer = tokio::time::timeout(WAIT, client.request("svc.echo", "hi".into()))
        .await
        .expect("answer within the wait")
        .expect("request");
    assert_eq!(&answer.payload[..], b"pong:hi");

    let (answers, acks) = request_then_marker(&client, "svc.echo", "again", "svc.marker").await;
    assert_eq!(answers, ["pong:again"]);
    assert_eq!(acks.len(), 1, "only the marker is acked: {acks:?}");
    let ack: Value = serde_json::from_str(&acks[0]).expect("ack json");
    assert_eq!(ack["subject"], "svc.marker", "{ack}");

    // A request a service answers is the service's: not stored (svc.echo matches the
    // `>` policy), since a stored request would be answered by the store too.
    let stored = replay_subject(&client, "svc.echo").await;
    assert!(
        stored.is_empty(),
        "requests to a service are not stored: {stored:?}"
    );
    answering.abort();
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// e. The $CANOPY. API: get, subjects, replay

async fn get(client: &async_nats::Client, body: Value) -> async_nats::Message {
    let message =
        tokio::time::timeout(WAIT, client.request("$CANOPY.get", body.to_string().into()))
            .await
            .expect("$CANOPY.get answers within the wait")
            .unwrap_or_else(|e| panic!("$CANOPY.get {body}: {e}"));
    assert_ne!(
        message.status,
        Some(async_nats::StatusCode::NO_RESPONDERS),
        "no responders for $CANOPY.get"
    );
    message
}

fn assert_api_error(message: &async_nats::Message, code: u64) {
    assert_eq!(
        header_of(message, "Canopy-Status"),
        Some(code.to_string().as_str()),
        "status header; body {:?}",
        String::from_utf8_lossy(&message.payload)
    );
    let body: Value = serde_json::from_slice(&message.payload).expect("error body is JSON");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn get_returns_the_latest_or_a_version_with_its_headers() {
    let before = canopy::clock::system_ms();
    let server = start_default().await;
    let client = connect(&server).await;
    let mut offsets = Vec::new();
    for v in 1..=3 {
        let mut headers = header("Canopy-Ack", "durable");
        headers.insert("X-Trace", format!("t{v}").as_str());
        let ack = store_request(&client, "orders.42", headers, format!("order v{v}")).await;
        assert_eq!(version(&ack), v, "{ack}");
        offsets.push(seq(&ack));
    }
    publish_acked(&client, "orders.43", "other").await;

    let latest = get(&client, json!({"subject": "orders.42"})).await;
    assert_eq!(header_of(&latest, "Canopy-Status"), None);
    let m = Stored::from_message(&latest);
    assert_eq!(
        (m.subject.as_str(), m.version, m.offset),
        ("orders.42", 3, offsets[2])
    );
    assert_eq!(m.text(), "order v3");
    assert_eq!(
        header_of(&latest, "X-Trace"),
        Some("t3"),
        "original headers are kept"
    );
    let after = canopy::clock::system_ms();
    assert!(
        m.time_ms + 60_000 >= before && m.time_ms <= after + 60_000,
        "Canopy-Time {} is milliseconds since the epoch ({before}..{after})",
        m.time_ms
    );

    let second = get(&client, json!({"subject": "orders.42", "version": 2})).await;
    let m = Stored::from_message(&second);
    assert_eq!((m.version, m.offset), (2, offsets[1]));
    assert_eq!(m.text(), "order v2");
    assert_eq!(header_of(&second, "X-Trace"), Some("t2"));

    assert_api_error(
        &get(&client, json!({"subject": "orders.42", "version": 9})).await,
        404,
    );
    assert_api_error(&get(&client, json!({"subject": "orders.nope"})).await, 404);
    assert_api_error(&get(&client, json!({"version": 1})).await, 400);
    server.stop().await;
}

#[tokio::test]
async fn subjects_are_listed_in_pages() {
    let server = start_default().await;
    let client = connect(&server).await;
    let mut expected = BTreeMap::new();
    for i in 0..25 {
        let subject = format!("list.{i:02}");
        let ack = publish_acked(&client, &subject, "x").await;
        expected.insert(subject, (1, seq(&ack)));
    }
    publish_acked(&client, "list.07", "again").await;
    let ack = publish_acked(&client, "list.07", "third").await;
    expected.insert("list.07".into(), (3, seq(&ack)));
    publish_acked(&client, "other.x", "not listed").await;

    let mut body = json!({"pattern": "list.>", "max": 10});
    let mut sizes = Vec::new();
    let mut listed = Vec::new();
    loop {
        let page = subjects_page(&client, &body).await;
        let entries = page["subjects"].as_array().expect("subjects list").clone();
        sizes.push(entries.len());
        for entry in entries {
            let subject = entry["subject"].as_str().expect("subject").to_owned();
            assert!(entry["time_ms"].as_u64().is_some(), "{entry}");
            listed.push((
                subject,
                (
                    entry["version"].as_u64().expect("version"),
                    entry["offset"].as_u64().expect("offset"),
                ),
            ));
        }
        match &page["next"] {
            Value::Null => break,
            next => body["after"] = next.clone(),
        }
        assert!(sizes.len() < 10, "paging ends");
    }
    assert_eq!(sizes, [10, 10, 5]);
    let want: Vec<(String, (u64, u64))> = expected.into_iter().collect();
    assert_eq!(listed, want, "every subject once, in order, with its head");
    server.stop().await;
}

#[tokio::test]
async fn a_pattern_replays_across_subjects_in_offset_order() {
    let server = start_default().await;
    let client = connect(&server).await;
    let mut acked = Vec::new();
    for i in 0..12 {
        let subject = ["rp.a", "rp.b.x", "rp.c"][i % 3];
        let ack = publish_acked(&client, subject, format!("m{i}")).await;
        acked.push((
            subject.to_owned(),
            version(&ack),
            seq(&ack),
            format!("m{i}"),
        ));
    }
    publish_acked(&client, "rq.a", "other pattern").await;

    let all = replay_page(&client, &json!({"pattern": "rp.>"})).await;
    assert!(all.caught_up);
    let got: Vec<(String, u64, u64, String)> = all
        .messages
        .iter()
        .map(|m| (m.subject.clone(), m.version, m.offset, m.text()))
        .collect();
    assert_eq!(got, acked);

    // Paged by offset cursor: every message once, in the same order.
    let paged = replay_all(&client, json!({"pattern": "rp.>", "max": 5})).await;
    let offsets: Vec<u64> = paged.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, acked.iter().map(|a| a.2).collect::<Vec<_>>());
    let only_b = replay_all(&client, json!({"pattern": "rp.*.x"})).await;
    assert!(only_b.iter().all(|m| m.subject == "rp.b.x") && only_b.len() == 4);
    server.stop().await;
}

#[tokio::test]
async fn replay_pages_and_starting_points() {
    let server = start_default().await;
    let client = connect(&server).await;
    let mut acks = Vec::new();
    for i in 1..=10 {
        acks.push(publish_acked(&client, "pg.x", format!("n{i}")).await);
        publish_acked(&client, "pg.y", format!("other{i}")).await;
    }
    let offset_of = |v: usize| seq(&acks[v - 1]);

    // Pages of 3 with the cursor: all 10 exactly once, in version order.
    let mut body = json!({"subject": "pg.x", "max": 3});
    let mut pages = Vec::new();
    loop {
        let page = replay_page(&client, &body).await;
        let done = page.caught_up;
        body = json!({"subject": "pg.x", "max": 3, "cursor": page.cursor});
        pages.push(page);
        if done {
            break;
        }
        assert!(pages.len() < 10, "paging ends");
    }
    let sizes: Vec<usize> = pages.iter().map(|p| p.messages.len()).collect();
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert!(pages[..3].iter().all(|p| !p.caught_up));
    let versions: Vec<u64> = pages
        .iter()
        .flat_map(|p| &p.messages)
        .map(|m| m.version)
        .collect();
    assert_eq!(versions, (1..=10).collect::<Vec<_>>());
    let texts: Vec<String> = pages
        .iter()
        .flat_map(|p| &p.messages)
        .map(Stored::text)
        .collect();
    assert_eq!(texts, (1..=10).map(|i| format!("n{i}")).collect::<Vec<_>>());

    let versions_of = |messages: &[Stored]| messages.iter().map(|m| m.version).collect::<Vec<_>>();
    let from_start = replay_all(&client, json!({"subject": "pg.x", "from": "start"})).await;
    assert_eq!(versions_of(&from_start), (1..=10).collect::<Vec<_>>());
    let from_version =
        replay_all(&client, json!({"subject": "pg.x", "from": {"version": 4}})).await;
    assert_eq!(versions_of(&from_version), (4..=10).collect::<Vec<_>>());
    let from_offset = replay_all(
        &client,
        json!({"subject": "pg.x", "from": {"offset": offset_of(6)}}),
    )
    .await;
    assert_eq!(versions_of(&from_offset), (6..=10).collect::<Vec<_>>());
    // Between two messages' offsets: starts at the next one.
    let from_between = replay_all(
        &client,
        json!({"subject": "pg.x", "from": {"offset": offset_of(6) + 1}}),
    )
    .await;
    assert_eq!(versions_of(&from_between), (7..=10).collect::<Vec<_>>());

    // From a time: exactly the messages stamped at or after it.
    let t = from_start[6].time_ms;
    let from_time = replay_all(&client, json!({"subject": "pg.x", "from": {"time_ms": t}})).await;
    let want: Vec<u64> = from_start
        .iter()
        .filter(|m| m.time_ms >= t)
        .map(|m| m.version)
        .collect();
    assert_eq!(versions_of(&from_time), want);
    assert!(want.contains(&7) && want.ends_with(&[10]));
    let future = replay_page(
        &client,
        &json!({"subject": "pg.x", "from": {"time_ms": from_start[9].time_ms + 3_600_000}}),
    )
    .await;
    assert!(future.messages.is_empty() && future.caught_up);
    server.stop().await;
}

#[tokio::test]
async fn a_caught_up_follow_replay_waits_for_the_next_message() {
    let server = start_default().await;
    let client = connect(&server).await;
    for i in 1..=3 {
        publish_acked(&client, "fl.x", format!("old{i}")).await;
    }
    let mut waiting = replay_start(
        &client,
        &json!({"subject": "fl.x", "from": {"version": 4}, "follow": true, "wait_ms": 5000}),
    )
    .await;
    let writer = connect(&server).await;
    let ack = publish_acked(&writer, "fl.x", "new").await;
    assert_eq!(version(&ack), 4);
    let page = replay_collect(&mut waiting).await;
    let got: Vec<(u64, u64, String)> = page
        .messages
        .iter()
        .map(|m| (m.version, m.offset, m.text()))
        .collect();
    assert_eq!(got, [(4, seq(&ack), "new".to_owned())]);

    // Following from the cursor again picks up where it ended.
    let mut next = replay_start(
        &client,
        &json!({"subject": "fl.x", "cursor": page.cursor, "follow": true, "wait_ms": 5000}),
    )
    .await;
    let ack = publish_acked(&writer, "fl.x", "newer").await;
    let page = replay_collect(&mut next).await;
    let got: Vec<(u64, String)> = page
        .messages
        .iter()
        .map(|m| (m.version, m.text()))
        .collect();
    assert_eq!(got, [(version(&ack), "newer".to_owned())]);
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// f. Atomic append

async fn append(client: &async_nats::Client, body: Value) -> Value {
    let reply = tokio::time::timeout(
        WAIT,
        client.request("$CANOPY.append", body.to_string().into()),
    )
    .await
    .expect("$CANOPY.append answers within the wait")
    .unwrap_or_else(|e| panic!("$CANOPY.append: {e}"));
    assert_ne!(
        reply.status,
        Some(async_nats::StatusCode::NO_RESPONDERS),
        "no responders for $CANOPY.append"
    );
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| {
        panic!(
            "append reply is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

#[tokio::test]
async fn append_stores_all_messages_or_none() {
    let server = start_default().await;
    let client = connect(&server).await;
    let ack = append(
        &client,
        json!({"subject": "agg.1", "expect_version": 0, "messages": [
            {"data": "created"},
            {"data_base64": "AAE=", "headers": {"K": "V"}},
        ]}),
    )
    .await;
    assert!(ack.get("error").is_none(), "{ack}");
    assert_eq!(ack["count"], 2, "{ack}");
    assert_eq!(ack["subject"], "agg.1");
    assert_eq!(version(&ack), 2, "version of the last message");
    let stored = replay_subject(&client, "agg.1").await;
    assert_eq!(stored.len(), 2);
    assert_eq!((stored[0].version, stored[1].version), (1, 2));
    assert_eq!(stored[1].offset, seq(&ack));
    assert!(stored[0].offset < stored[1].offset);
    assert_eq!(&stored[0].payload[..], b"created");
    assert_eq!(&stored[1].payload[..], [0u8, 1]);
    assert_eq!(
        stored[1]
            .headers
            .as_ref()
            .and_then(|h| h.get("K"))
            .map(|v| v.as_str()),
        Some("V")
    );

    let conflict = append(
        &client,
        json!({"subject": "agg.1", "expect_version": 5, "messages": [{"data": "a"}, {"data": "b"}]}),
    )
    .await;
    assert_eq!(conflict["error"]["code"], 409, "{conflict}");
    assert_eq!(conflict["current_version"], 2, "{conflict}");
    let after = replay_subject(&client, "agg.1").await;
    assert_eq!(after.len(), 2, "a refused append stores nothing");

    // With the right version and a msg id: stored once, then a duplicate.
    let body = json!({"subject": "agg.1", "expect_version": 2, "msg_id": "batch-1",
        "messages": [{"data": "c"}, {"data": "d"}, {"data": "e"}]});
    let ok = append(&client, body.clone()).await;
    assert_eq!((ok["count"].as_u64(), version(&ok)), (Some(3), 5), "{ok}");
    let again = append(&client, body).await;
    assert_eq!(again["duplicate"], true, "{again}");
    let texts = replay_texts(&client, "agg.1").await;
    assert_eq!(texts.len(), 5);
    assert_eq!(texts[2..], ["c", "d", "e"]);
    server.stop().await;
}

// ---------------------------------------------------------------------------------
// g, h. The store on disk: restart, and one process per folder

#[tokio::test]
async fn msg_ids_versions_and_offsets_survive_a_restart() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(file_config(folder.path())).await;
    let client = connect(&server).await;
    let first = store_request(&client, "rs.a", header("Canopy-Msg-Id", "m1"), "one").await;
    assert!(
        first.get("error").is_none() && first.get("duplicate").is_none(),
        "{first}"
    );
    assert_eq!(version(&first), 1);
    let other = publish_acked(&client, "rs.b", "b").await;
    drop(client);
    server.stop().await;

    let server = start(file_config(folder.path())).await;
    let client = connect(&server).await;
    let again = store_request(&client, "rs.a", header("Canopy-Msg-Id", "m1"), "one").await;
    assert_eq!(
        again["duplicate"], true,
        "the msg id is remembered across the restart: {again}"
    );
    assert_eq!((version(&again), seq(&again)), (1, seq(&first)));
    let next = publish_acked(&client, "rs.a", "two").await;
    assert_eq!(version(&next), 2, "versions continue: {next}");
    assert!(seq(&next) > seq(&other), "offsets keep increasing: {next}");
    let stored = replay_subject(&client, "rs.a").await;
    let got: Vec<(u64, u64, String)> = stored
        .iter()
        .map(|m| (m.version, m.offset, m.text()))
        .collect();
    assert_eq!(
        got,
        [
            (1, seq(&first), "one".into()),
            (2, seq(&next), "two".into())
        ]
    );
    let subjects: HashSet<String> = list_subjects(&client, "rs.>")
        .await
        .iter()
        .map(|e| e["subject"].as_str().expect("subject").to_owned())
        .collect();
    assert_eq!(
        subjects,
        HashSet::from(["rs.a".to_owned(), "rs.b".to_owned()])
    );
    server.stop().await;
}

#[tokio::test]
async fn a_second_server_on_the_same_folder_refuses_to_start() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(local_folder_config(folder.path())).await;
    let client = connect(&server).await;
    let before = publish_acked(&client, "lock.a", "before").await;

    match canopy::server::Server::bind(local_folder_config(folder.path())).await {
        Ok(_) => panic!("a second server opened a folder that is in use"),
        Err(error) => {
            // As `canopy serve` prints it: the error and its causes.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            assert!(text.contains("another canopy process"), "{text}");
        }
    }

    let after = publish_acked(&client, "lock.a", "after").await;
    assert_eq!(
        version(&after),
        version(&before) + 1,
        "the first server keeps working"
    );
    drop(client);
    server.stop().await;
    // Once the first has stopped, the folder is free again.
    let server = start(local_folder_config(folder.path())).await;
    let client = connect(&server).await;
    assert_eq!(replay_subject(&client, "lock.a").await.len(), 2);
    server.stop().await;
}
