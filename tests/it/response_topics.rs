//! MQTT 5 Response Topics are the requester's to publish to: a request whose Response
//! Topic the requester may not publish to (its rules, or a subject reserved for the
//! server) is refused with PUBACK 0x87, and an answer a native service sends back is
//! published as the requester (its rules, its reserved subjects, its tenant's count).
//!
//! Tenant acme: `req` may publish only under `req.>` and `replies.req.>` and
//! subscribe only under `replies.req.>`; `svc` is a native (async-nats) service that
//! answers every request under `req.>`; `ops` watches and reads the store.

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;

use crate::common::WAIT;
use crate::logins::{Logins, QUIET, call, native_quiet, request_properties, status, text};

fn acme_users() -> Vec<crate::logins::UserSpec<'static>> {
    vec![
        (
            "acme",
            "req",
            Some(json!({
                "publish": {"allow": ["req.>", "replies.{user}.>"]},
                "subscribe": {"allow": ["replies.{user}.>"]}
            })),
        ),
        ("acme", "svc", None),
        ("acme", "ops", None),
    ]
}

/// What the service saw: (subject, reply subject, payload).
type Seen = (String, Option<String>, String);

/// Starts the service: it answers every message under `req.>` that has a reply
/// subject with `answer to <payload>`, flushed, and reports each message it saw.
async fn start_service(f: &Logins) -> mpsc::UnboundedReceiver<Seen> {
    let svc = f.native("svc@acme").await;
    let mut requests = svc.subscribe("req.>").await.expect("subscribe");
    svc.flush().await.expect("flush");
    let (seen_tx, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let payload = text(&request.payload);
            if let Some(reply) = &request.reply {
                svc.publish(reply.clone(), format!("answer to {payload}").into())
                    .await
                    .expect("answer");
                svc.flush().await.expect("flush");
            }
            let seen = (
                request.subject.to_string(),
                request.reply.as_ref().map(|r| r.to_string()),
                payload,
            );
            if seen_tx.send(seen).is_err() {
                return;
            }
        }
    });
    seen
}

async fn next_seen(seen: &mut mpsc::UnboundedReceiver<Seen>, what: &str) -> Seen {
    tokio::time::timeout(WAIT, seen.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: the service saw nothing within the wait"))
        .unwrap_or_else(|| panic!("{what}: the service stopped"))
}

#[tokio::test]
async fn a_response_topic_the_requester_may_not_publish_to_is_refused() {
    let f = Logins::start(&["acme"], &acme_users()).await;
    let ops = f.native("ops@acme").await;
    let mut secret = ops.subscribe("orders.secret").await.expect("subscribe");
    let mut system = ops.subscribe("$SYS.>").await.expect("subscribe");
    ops.flush().await.expect("flush");
    let mut seen = start_service(&f).await;
    let mut req = f.mqtt5("req@acme", "requester").await;

    let mut wrong = Vec::new();
    for (n, response_topic) in ["orders/secret", "$SYS/answers"].into_iter().enumerate() {
        let payload = format!("request {n}");
        let code = req
            .publish1(
                "req/x",
                &payload,
                request_properties(response_topic, format!("corr-{n}").as_bytes()),
            )
            .await;
        if code != 0x87 {
            wrong.push(format!(
                "a QoS 1 request to req/x with Response Topic {response_topic} got PUBACK \
                 {code:#04x}, expected 0x87 (req may not publish to {response_topic})"
            ));
        }
        if code < 0x80 {
            // Taken: the service answers; its answer must still go nowhere.
            let (subject, reply, _) = next_seen(&mut seen, "the accepted request").await;
            assert_eq!(subject, "req.x");
            assert!(reply.is_some(), "the request carries a reply subject");
        }
    }
    // An ordinary request with a permitted response topic: once its answer is back,
    // the earlier answers (if any were taken) have been forwarded too.
    let code = req
        .publish1(
            "req/x",
            "allowed",
            request_properties("replies/req/1", b"corr-ok"),
        )
        .await;
    assert_eq!(code, 0, "a permitted response topic is accepted");
    let (_, _, payload) = next_seen(&mut seen, "the permitted request").await;
    assert_eq!(
        payload, "allowed",
        "the service's first request is the permitted one"
    );

    match tokio::time::timeout(QUIET, secret.next()).await {
        Ok(Some(leak)) => wrong.push(format!(
            "orders.secret received {:?}: the service's answer was published there for req",
            text(&leak.payload)
        )),
        Ok(None) => panic!("the orders.secret subscription ended"),
        Err(_) => {}
    }
    match tokio::time::timeout(Duration::ZERO, system.next()).await {
        Ok(Some(leak)) => wrong.push(format!(
            "{} received {:?}: an answer was published to a reserved subject",
            leak.subject,
            text(&leak.payload)
        )),
        Ok(None) => panic!("the $SYS.> subscription ended"),
        Err(_) => {}
    }
    let stored = call(&ops, "get", json!({"subject": "orders.secret"})).await;
    if status(&stored) != 404 {
        wrong.push(format!(
            "orders.secret is stored (status {}): {:?}",
            status(&stored),
            text(&stored.payload)
        ));
    }
    assert!(
        wrong.is_empty(),
        "a response topic is the requester's to publish to:\n  {}",
        wrong.join("\n  ")
    );
    native_quiet(&mut secret, "orders.secret").await;
    f.stop().await;
}

#[tokio::test]
async fn a_permitted_response_topic_gets_the_answer_charged_to_the_requesters_tenant() {
    let f = Logins::start(&["acme"], &acme_users()).await;
    let mut seen = start_service(&f).await;
    let mut req = f.mqtt5("req@acme", "requester").await;
    assert_eq!(req.subscribe("replies/req/+", 1).await, 1);
    let published = "canopy_tenant_published_messages_total{tenant=\"acme\"}";
    let before = f.metric(published).await;

    let code = req
        .publish1(
            "req/y",
            "question",
            request_properties("replies/req/7", b"\x00corr\xff"),
        )
        .await;
    assert_eq!(code, 0, "the request is accepted");
    let (subject, reply, _) = next_seen(&mut seen, "the request").await;
    assert_eq!(subject, "req.y");
    assert!(reply.is_some(), "the service sees a reply subject");
    let answer = req.next_publish("the service's answer").await;
    assert_eq!(
        (answer.topic.as_str(), answer.text().as_str()),
        ("replies/req/7", "answer to question"),
        "the answer arrives on the response topic"
    );
    assert_eq!(
        answer.properties.correlation_data.as_deref(),
        Some(&b"\x00corr\xff"[..]),
        "with the request's correlation data"
    );
    // A last publish of req's: once acknowledged, req's connection has handled
    // everything before it, the forwarded answer included; the service flushed its
    // answer before reporting the request.
    assert_eq!(
        req.publish1("replies/req/done", "done", Default::default())
            .await,
        0
    );
    let after = f.metric(published).await;
    assert_eq!(
        after - before,
        4,
        "tenant acme's publishes: the request, the service's answer, the answer \
         forwarded to the response topic as req, and req's last publish"
    );
    f.stop().await;
}
