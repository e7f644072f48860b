//! JetStream's plain publish on the default config: `jetstream::Context::publish`
//! (a request without headers) to a stored subject that no service answers is stored
//! and answered with its PubAck, while a request to a subject a service answers (a
//! subscription to exactly that subject, or a queue group member) reaches the service,
//! gets only the service's answer, and is not stored. A wildcard watcher outside any
//! queue group does not make it a request (it sees the reply subject, as in NATS).
//! What is stored is what was acked.

use futures::StreamExt;
use serde_json::json;

use crate::common::{WAIT, replay_subject, replay_texts, request_then_marker, start_default};

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connect")
}

async fn js_publish(
    js: &async_nats::jetstream::Context,
    subject: &str,
    payload: &str,
) -> async_nats::jetstream::publish::PublishAck {
    let pending = tokio::time::timeout(
        WAIT,
        js.publish(subject.to_owned(), payload.to_owned().into()),
    )
    .await
    .expect("publish within the wait")
    .unwrap_or_else(|e| panic!("publish to {subject}: {e}"));
    tokio::time::timeout(WAIT, pending)
        .await
        .expect("ack within the wait")
        .unwrap_or_else(|e| panic!("ack for {subject}: {e}"))
}

/// A plain `js.publish` (a request without headers) is NATS's: with no stream holding
/// its subject and no service answering it, it is told there are no responders and is
/// not stored; once a stream holds the subject it is stored and acked, and the PubAck
/// names the stream.
#[tokio::test]
async fn a_plain_jetstream_publish_is_stored_and_acked_where_a_stream_holds_it() {
    let server = start_default().await;
    let client = connect(&server).await;
    let js = async_nats::jetstream::new(client.clone());
    let refused = tokio::time::timeout(WAIT, async {
        js.publish("orders.42", "nobody".into())
            .await
            .expect("sent")
            .await
    })
    .await
    .expect("answered within the wait");
    let error = refused.expect_err("no stream holds orders.42");
    assert_eq!(
        error.kind(),
        async_nats::jetstream::context::PublishErrorKind::StreamNotFound,
        "{error}"
    );
    // A service client's request to a service that is down: 503 at once, not stored.
    let down = tokio::time::timeout(WAIT, client.request("prices.quote", "q".into()))
        .await
        .expect("answered within the wait");
    assert_eq!(
        down.expect_err("nobody answers").kind(),
        async_nats::RequestErrorKind::NoResponders
    );
    for subject in ["orders.42", "prices.quote"] {
        assert!(
            replay_subject(&client, subject).await.is_empty(),
            "a request nobody answered is not stored: {subject}"
        );
    }

    tokio::time::timeout(
        WAIT,
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        }),
    )
    .await
    .expect("answered")
    .expect("a stream is declared");
    let first = js_publish(&js, "orders.42", "one").await;
    let second = js_publish(&js, "orders.42", "two").await;
    assert_eq!(first.stream, "ORDERS");
    assert!(second.sequence > first.sequence, "{first:?} {second:?}");
    assert!(!first.duplicate && !second.duplicate);

    // A watcher on a wildcard sees the message but does not answer it.
    let watcher = connect(&server).await;
    let mut watch = watcher.subscribe("orders.>").await.expect("sub");
    watcher.flush().await.expect("flush");
    let third = js_publish(&js, "orders.42", "three").await;
    assert!(third.sequence > second.sequence);
    let seen = tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("the watcher gets it")
        .expect("subscription open");
    assert_eq!(&seen.payload[..], b"three");
    assert!(
        seen.reply.is_some(),
        "watchers see the reply subject, as NATS shows it"
    );

    let texts = replay_texts(&client, "orders.42").await;
    assert_eq!(
        texts,
        ["one", "two", "three"],
        "what was acked is what is stored"
    );
    server.stop().await;
}

/// Answers every request on `subscriber` with `pong:<payload>`.
fn answer_all(
    client: async_nats::Client,
    mut subscriber: async_nats::Subscriber,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(request) = subscriber.next().await {
            if let Some(reply) = request.reply {
                let answer = format!("pong:{}", String::from_utf8_lossy(&request.payload));
                let _ = client.publish(reply, answer.into()).await;
                let _ = client.flush().await;
            }
        }
    })
}

#[tokio::test]
async fn a_request_a_queue_group_answers_gets_only_the_service_answer() {
    let server = start_default().await;
    let service = connect(&server).await;
    // A wildcard in a queue group answers: NATS services (and `nats reply`) subscribe so.
    let a = service
        .queue_subscribe("svc.*", "workers".into())
        .await
        .expect("sub");
    let b = service
        .queue_subscribe("svc.*", "workers".into())
        .await
        .expect("sub");
    service.flush().await.expect("flush");
    let answering = [
        answer_all(service.clone(), a),
        answer_all(service.clone(), b),
    ];

    let client = connect(&server).await;
    let (answers, acks) = request_then_marker(&client, "svc.price", "ask", "marker.x").await;
    assert_eq!(answers, ["pong:ask"]);
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert!(acks[0].contains("\"marker.x\""), "{}", acks[0]);
    assert!(
        replay_subject(&client, "svc.price").await.is_empty(),
        "a request a service answered is not stored"
    );

    // The same through async-nats's request: the service's answer.
    let answer = tokio::time::timeout(WAIT, client.request("svc.quote", "q".into()))
        .await
        .expect("answer within the wait")
        .expect("request");
    assert_eq!(&answer.payload[..], b"pong:q");
    for task in answering {
        task.abort();
    }
    server.stop().await;
}

/// JetStream's publish preconditions are held or refused, never ignored: the stream's
/// last sequence (`Nats-Expected-Last-Sequence`, the tenant's last offset), the stream's
/// name (`Nats-Expected-Stream`: the stream holding the subject, here the tenant's
/// own), and `Nats-Expected-Last-Msg-Id`, which Canopy does not keep, is refused with a
/// reason.
#[tokio::test]
async fn jetstream_expectations_are_held_or_refused() {
    use crate::common::{header, store_request};
    let server = start_default().await;
    let client = connect(&server).await;
    let first = store_request(
        &client,
        "orders.1",
        header("Nats-Expected-Stream", "default"),
        "a",
    )
    .await;
    let first_seq = first["seq"].as_u64().expect("acked");

    let last = first_seq.to_string();
    let ok = store_request(
        &client,
        "orders.2",
        header("Nats-Expected-Last-Sequence", &last),
        "b",
    )
    .await;
    assert_eq!(ok["seq"], first_seq + 1, "{ok}");
    // orders.2 moved the stream on: the same expectation is stale now.
    let stale = store_request(
        &client,
        "orders.3",
        header("Nats-Expected-Last-Sequence", &last),
        "c",
    )
    .await;
    assert_eq!(stale["error"]["err_code"], 10071, "{stale}");
    let text = stale["error"]["description"].as_str().unwrap_or_default();
    assert!(
        text.contains(&format!("wrong last sequence: {}", first_seq + 1)),
        "{stale}"
    );

    let ours = store_request(
        &client,
        "orders.4",
        header("Nats-Expected-Stream", "default"),
        "d",
    )
    .await;
    assert!(
        ours["error"].is_null() && ours["stream"] == "default",
        "{ours}"
    );
    let other = store_request(
        &client,
        "orders.5",
        header("Nats-Expected-Stream", "ORDERS"),
        "e",
    )
    .await;
    // nats-server's words and code for it.
    assert_eq!(
        (
            &other["error"]["code"],
            &other["error"]["err_code"],
            &other["error"]["description"]
        ),
        (
            &json!(400),
            &json!(10060),
            &json!("expected stream does not match")
        ),
        "{other}"
    );

    let msg_id = store_request(
        &client,
        "orders.6",
        header("Nats-Expected-Last-Msg-Id", "x"),
        "f",
    )
    .await;
    let text = msg_id["error"]["description"].as_str().unwrap_or_default();
    assert!(
        text.contains("Nats-Expected-Last-Msg-Id is not supported"),
        "{msg_id}"
    );

    // Nothing refused was stored.
    for subject in ["orders.3", "orders.5", "orders.6"] {
        assert!(replay_texts(&client, subject).await.is_empty(), "{subject}");
    }
    server.stop().await;
}
