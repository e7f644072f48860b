//! Issue 26: every answer is a publish by the caller, and the limits that keep
//! tenants from each other are per tenant.
//!
//! Each test is an attack a hostile user of one tenant made from outside, with what
//! another user or tenant sees meanwhile checked as an answer (answered, not 503),
//! never as a time.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{WAIT, api, local_folder_config, publish_acked, start, status_of, test_config};
use crate::logins::{Logins, UserSpec};

/// How long a subscriber is watched to show that nothing arrives.
const QUIET: Duration = Duration::from_millis(300);

/// `dave@acme` may publish only under `dave.>` (and call the API), subscribe only
/// there; `admin@acme` may do anything.
fn dave_and_admin() -> Vec<UserSpec<'static>> {
    vec![
        (
            "acme",
            "dave",
            Some(json!({
                "publish": {"allow": ["dave.>", "$CANOPY.>", "$JS.API.>"]},
                "subscribe": {"allow": ["dave.>"]}
            })),
        ),
        ("acme", "admin", None),
    ]
}

#[tokio::test]
async fn an_answer_goes_only_where_its_caller_may_publish() {
    let f = Logins::start(&["acme"], &dave_and_admin()).await;
    let admin = f.native("admin@acme").await;
    let mut sensor = admin
        .subscribe("commands.>")
        .await
        .expect("the sensor subscribes");
    admin.flush().await.expect("flush");
    let dave = f.native("dave@acme").await;
    publish_acked(&dave, "dave.evil", "FORGED-OPEN-DOOR").await;

    // Refused where he publishes himself.
    dave.publish("commands.sensor.open", "OPEN".into())
        .await
        .expect("sent");
    // An API answer, a JetStream answer and a PubAck sent to the sensor's subject.
    let forged = [
        (
            "$CANOPY.get",
            "commands.sensor.open",
            json!({"subject": "dave.evil"}),
        ),
        ("$CANOPY.subjects", "commands.sensor.list", json!({})),
        ("$JS.API.INFO", "commands.sensor.info", json!({})),
        ("dave.stored", "commands.sensor.ack", json!("payload")),
        (
            "$CANOPY.replay",
            "commands.sensor.replay",
            json!({"subject": "dave.evil"}),
        ),
    ];
    for (subject, reply, body) in &forged {
        dave.publish_with_reply(*subject, *reply, body.to_string().into())
            .await
            .expect("sent");
    }
    dave.flush().await.expect("flush");
    // What the store answers comes after what it stored: dave's own acked publish
    // orders everything he sent before it.
    publish_acked(&dave, "dave.marker", "after").await;
    admin
        .publish("commands.marker", "marker".into())
        .await
        .expect("marker");
    let first = tokio::time::timeout(WAIT, sensor.next())
        .await
        .expect("the marker arrives")
        .expect("subscribed");
    assert_eq!(
        (first.subject.as_str(), &first.payload[..]),
        ("commands.marker", &b"marker"[..]),
        "the sensor got a message dave may not publish: {:?}",
        String::from_utf8_lossy(&first.payload)
    );
    assert!(
        tokio::time::timeout(QUIET, sensor.next()).await.is_err(),
        "nothing else reaches the sensor"
    );

    // His own inbox, and subjects he may publish to, still get answers.
    let own = tokio::time::timeout(
        WAIT,
        dave.request(
            "$CANOPY.get",
            json!({"subject": "dave.evil"}).to_string().into(),
        ),
    )
    .await
    .expect("answered in time")
    .expect("answered on dave's own inbox");
    assert_eq!(&own.payload[..], b"FORGED-OPEN-DOOR");
    // A subject he may publish to, but stored: an answer there would reach the
    // stream's subscribers as a message the stream never kept. Refused too.
    let mut stream = admin.subscribe("dave.answers").await.expect("subscribe");
    admin.flush().await.expect("flush");
    let mine = json!({"pattern": "dave.>"}).to_string();
    dave.publish_with_reply("$CANOPY.subjects", "dave.answers", mine.into())
        .await
        .expect("sent");
    publish_acked(&dave, "dave.marker2", "after").await;
    assert!(
        tokio::time::timeout(QUIET, stream.next()).await.is_err(),
        "no answer lands on a stored subject"
    );
    // The store stored nothing for the refused PubAck's publish.
    let missing = tokio::time::timeout(
        WAIT,
        dave.request(
            "$CANOPY.get",
            json!({"subject": "dave.stored"}).to_string().into(),
        ),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    assert_eq!(
        status_of(&missing),
        404,
        "a publish whose answer was refused is not stored: {:?}",
        missing.payload
    );
    f.server.stop().await;
}

#[tokio::test]
async fn api_calls_one_tenant_parks_leave_the_others_answered() {
    let users = vec![("acme", "mallory", None), ("beta", "carol", None)];
    let f = Logins::start(&["acme", "beta"], &users).await;
    let mallory = f.native("mallory@acme").await;
    let carol = f.native("carol@beta").await;
    publish_acked(&carol, "beta.x", "1").await;

    // The probe's attack: 256 follows that wait a minute for a subject nobody writes.
    let inbox = mallory.new_inbox();
    let mut answers = mallory.subscribe(format!("{inbox}.*")).await.expect("sub");
    let parked = 256;
    for i in 0..parked {
        let body = json!({"subject": "quiet.x", "follow": true, "wait_ms": 60_000});
        mallory
            .publish_with_reply(
                "$CANOPY.replay",
                format!("{inbox}.{i}"),
                body.to_string().into(),
            )
            .await
            .expect("sent");
    }
    mallory.flush().await.expect("flush");
    // The tenant's own limit (64 by default) answers the rest 429 at once.
    let limit = 64;
    let mut refused = 0;
    while refused < parked - limit {
        let answer = tokio::time::timeout(WAIT, answers.next())
            .await
            .unwrap_or_else(|_| panic!("{refused} of {} refused in time", parked - limit))
            .expect("subscribed");
        assert_eq!(status_of(&answer), 429, "{:?}", answer.payload);
        refused += 1;
    }
    let (status, body) = api(&mallory, "subjects", json!({})).await;
    assert_eq!(status, 429, "mallory is at his tenant's limit: {body}");

    // The other tenant notices nothing: every kind of call is answered.
    for (op, body, want) in [
        ("get", json!({"subject": "beta.x"}), 200),
        ("subjects", json!({}), 200),
        ("schema.list", json!({}), 200),
        ("group.list", json!({}), 200),
    ] {
        let (status, answer) = api(&carol, op, body).await;
        assert_eq!(status, want, "{op} for beta: {answer}");
    }
    let info = tokio::time::timeout(WAIT, carol.request("$JS.API.INFO", "".into()))
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(status_of(&info), 200, "{:?}", info.payload);
    f.server.stop().await;
}

#[tokio::test]
async fn a_tenant_record_sets_its_own_api_call_limit() {
    let f = Logins::start(&["small"], &[("small", "sam", None)]).await;
    let admin = f.native("admin@default").await;
    let limits = json!({"name": "small", "limits": {"max_api_calls": 2}});
    let (status, body) = api(&admin, "tenant.update", limits).await;
    assert_eq!(status, 200, "{body}");
    let sam = f.native("sam@small").await;
    let inbox = sam.new_inbox();
    let mut answers = sam.subscribe(format!("{inbox}.*")).await.expect("sub");
    for i in 0..2 {
        let body = json!({"subject": "quiet.x", "follow": true, "wait_ms": 60_000});
        sam.publish_with_reply(
            "$CANOPY.replay",
            format!("{inbox}.{i}"),
            body.to_string().into(),
        )
        .await
        .expect("sent");
    }
    sam.flush().await.expect("flush");
    let (status, body) = api(&sam, "subjects", json!({})).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("allows 2")),
        "{body}"
    );
    // A JetStream client is told in JetStream's terms: a pull gets a status, never a
    // JSON body it would take for a message; another call JetStream's error JSON.
    let mut js = sam.subscribe("_INBOX.sam-js.*").await.expect("sub");
    sam.publish_with_reply(
        "$JS.API.CONSUMER.MSG.NEXT.small.c",
        "_INBOX.sam-js.1",
        json!({"batch": 1}).to_string().into(),
    )
    .await
    .expect("sent");
    let pulled = tokio::time::timeout(WAIT, js.next())
        .await
        .expect("answered in time")
        .expect("subscribed");
    assert_eq!(pulled.status.map(|s| s.as_u16()), Some(409), "{pulled:?}");
    assert!(pulled.payload.is_empty(), "{pulled:?}");
    sam.publish_with_reply("$JS.API.INFO", "_INBOX.sam-js.2", "".into())
        .await
        .expect("sent");
    let info = tokio::time::timeout(WAIT, js.next())
        .await
        .expect("answered in time")
        .expect("subscribed");
    let info: Value = serde_json::from_slice(&info.payload).expect("JetStream JSON");
    assert_eq!(info["error"]["code"], 429, "{info}");
    // The two parked calls still wait: the refusals did not end them.
    assert!(tokio::time::timeout(QUIET, answers.next()).await.is_err());
    f.server.stop().await;
}

#[tokio::test]
async fn an_api_list_pages_within_max_payload() {
    let mut config = test_config();
    config.native.max_payload = 4096;
    let f = Logins::start_with(config, &["acme"], &[("acme", "admin", None)]).await;
    let admin = f.native("admin@acme").await;
    let long = "x".repeat(200);
    for i in 0..60 {
        publish_acked(&admin, &format!("list.{i:03}.{long}"), "1").await;
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..60 {
        let mut body = json!({"pattern": "list.>", "max": 1000});
        if let Some(after) = &after {
            body["after"] = json!(after);
        }
        let answer = tokio::time::timeout(
            WAIT,
            admin.request("$CANOPY.subjects", body.to_string().into()),
        )
        .await
        .expect("answered in time")
        .expect("answered");
        assert!(
            answer.payload.len() <= 4096,
            "an answer of {} bytes passed max_payload",
            answer.payload.len()
        );
        let page: Value = serde_json::from_slice(&answer.payload).expect("JSON");
        for s in page["subjects"].as_array().expect("subjects") {
            seen.push(s["subject"].as_str().expect("subject").to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let want: Vec<String> = (0..60).map(|i| format!("list.{i:03}.{long}")).collect();
    assert_eq!(seen, want, "every subject once, in order, across pages");
    f.server.stop().await;
}

#[tokio::test]
async fn idle_groups_read_nothing_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = local_folder_config(dir.path());
    let server = start(config.clone()).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let subjects = 500;
    for i in 0..subjects {
        client
            .publish(format!("orders.{i}"), "x".into())
            .await
            .expect("publish");
    }
    // Stored after everything before it.
    publish_acked(&client, "orders.last", "x").await;
    let groups = 100;
    for g in 0..groups {
        let (status, body) = api(
            &client,
            "group.create",
            json!({"name": format!("g{g}"), "pattern": "orders.>"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    drop(client);
    server.stop().await;

    let server = start(config).await;
    let reads = || server.metrics.snapshot().group_catch_up_reads;
    // Nobody asks anything of the groups: a while later they have read nothing. A
    // quiet window (reads that must not happen have nothing to wait for), long enough
    // for a hundred groups to start and load their cursors, when a walk would begin.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        reads(),
        0,
        "{groups} idle groups walked their subjects after a restart"
    );

    // Asking one group walks that group's subjects: one page, and no subject read for
    // where it starts, since all of them are older than the group.
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let (status, info) = api(&client, "group.info", json!({"name": "g7"})).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(reads(), 1, "one page of subjects, nothing else: {info}");
    // What it owes is still right: a new message is its to deliver, the old ones not.
    publish_acked(&client, "orders.3", "new").await;
    let pulled = tokio::time::timeout(
        WAIT,
        client.request(
            "$CANOPY.group.next",
            json!({"group": "g7", "max": 1, "wait_ms": 5000})
                .to_string()
                .into(),
        ),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    assert_eq!(&pulled.payload[..], b"new", "{:?}", pulled.headers);
    server.stop().await;
}
