//! Issue 30: JetStream push consumers (the ordered kind KV watches and ordered
//! subscriptions make), checked on the wire: the `$JS.ACK.` reply of each delivery
//! (consumer sequence, stream sequence, how many follow), the deliver policies, idle
//! heartbeats with the last sequences, headers only, delivery held until someone
//! listens, the consumer gone after its inactive threshold, and rights and tenants
//! sealed.

use std::time::Duration;

use async_nats::Message;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{WAIT, start_default};
use crate::group_rights::js;
use crate::stream_rights::dave_erin_and_olga;

fn create(inbox: &str, extra: Value) -> Value {
    let mut config = json!({"deliver_subject": inbox, "ack_policy": "none",
        "filter_subject": "t.>", "flow_control": true, "idle_heartbeat": 200_000_000u64});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    json!({"stream_name": "default", "config": config})
}

async fn next(sub: &mut async_nats::Subscriber) -> Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a delivery in time")
        .expect("the subscription is open")
}

/// The reply's `(consumer sequence, stream sequence, pending)`.
fn sequences(message: &Message) -> (u64, u64, u64) {
    let reply = message.reply.as_ref().expect("a delivery has a reply");
    let tokens: Vec<&str> = reply.split('.').collect();
    assert_eq!(tokens.len(), 9, "the v1 ack subject: {reply}");
    assert_eq!(&tokens[..3], ["$JS", "ACK", "default"], "{reply}");
    let number = |i: usize| tokens[i].parse::<u64>().expect("a number");
    (number(6), number(5), number(8))
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}

/// A publish into the tenant's own stream, which it names (a plain request to a
/// subject no declared stream holds gets no responders).
async fn publish(js: &async_nats::jetstream::Context, subject: &str, body: &str) -> u64 {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Stream", "default");
    js.publish_with_headers(subject.to_owned(), headers, body.to_owned().into())
        .await
        .expect("publish")
        .await
        .expect("acked")
        .sequence
}

#[tokio::test]
async fn a_push_consumer_delivers_its_plan_then_live_with_heartbeats() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let jetstream = async_nats::jetstream::new(client.clone());
    let a1 = publish(&jetstream, "t.a", "a1").await;
    let b1 = publish(&jetstream, "t.b", "b1").await;
    let a2 = publish(&jetstream, "t.a", "a2").await;

    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await.expect("subscribes");
    let created = js(
        &client,
        "CONSUMER.CREATE.default",
        create(&inbox, json!({})),
    )
    .await;
    assert_eq!(created["num_pending"], json!(3), "{created}");
    assert_eq!(
        created["config"]["deliver_subject"],
        json!(inbox),
        "{created}"
    );
    let name = created["name"]
        .as_str()
        .expect("a generated name")
        .to_owned();
    assert_eq!(name.len(), 8, "{created}");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let message = next(&mut sub).await;
        seen.push((message.subject.to_string(), sequences(&message)));
    }
    assert_eq!(
        seen,
        [
            ("t.a".to_owned(), (1, a1, 2)),
            ("t.b".to_owned(), (2, b1, 1)),
            ("t.a".to_owned(), (3, a2, 0)),
        ]
    );
    // Idle: a heartbeat that names what was delivered last.
    let beat = next(&mut sub).await;
    assert_eq!(
        beat.status,
        Some(async_nats::StatusCode::IDLE_HEARTBEAT),
        "{beat:?}"
    );
    assert_eq!(header(&beat, "Nats-Last-Consumer"), Some("3"), "{beat:?}");
    assert_eq!(
        header(&beat, "Nats-Last-Stream"),
        Some(a2.to_string().as_str())
    );
    assert!(beat.reply.is_none(), "a heartbeat asks for nothing");
    let c1 = publish(&jetstream, "t.c", "c1").await;
    let live = loop {
        let message = next(&mut sub).await;
        if message.status.is_none() {
            break message;
        }
    };
    assert_eq!(
        (
            live.subject.as_str(),
            sequences(&live).0,
            sequences(&live).1
        ),
        ("t.c", 4, c1)
    );
    let info = js(&client, &format!("CONSUMER.INFO.default.{name}"), json!({})).await;
    assert_eq!(info["delivered"]["consumer_seq"], json!(4), "{info}");
    assert_eq!(info["push_bound"], json!(true), "{info}");

    // The last of each subject, in the order they were written; headers only.
    let inbox = client.new_inbox();
    let mut last = client.subscribe(inbox.clone()).await.expect("subscribes");
    let extra = json!({"deliver_policy": "last_per_subject", "headers_only": true});
    let created = js(&client, "CONSUMER.CREATE.default", create(&inbox, extra)).await;
    assert_eq!(created["num_pending"], json!(3), "{created}");
    let mut heads = Vec::new();
    for _ in 0..3 {
        let message = next(&mut last).await;
        assert!(message.payload.is_empty(), "headers only: {message:?}");
        assert_eq!(header(&message, "Nats-Msg-Size"), Some("2"), "{message:?}");
        heads.push((message.subject.to_string(), sequences(&message).1));
    }
    assert_eq!(
        heads,
        [
            ("t.b".to_owned(), b1),
            ("t.a".to_owned(), a2),
            ("t.c".to_owned(), c1)
        ]
    );

    // From a sequence; deleting the consumer stops it.
    let inbox = client.new_inbox();
    let mut from = client.subscribe(inbox.clone()).await.expect("subscribes");
    let extra = json!({"deliver_policy": "by_start_sequence", "opt_start_seq": a2, "name": "from"});
    let created = js(
        &client,
        "CONSUMER.CREATE.default.from",
        create(&inbox, extra),
    )
    .await;
    assert_eq!(created["num_pending"], json!(2), "{created}");
    let first = next(&mut from).await;
    assert_eq!(sequences(&first), (1, a2, 1));
    let deleted = js(&client, "CONSUMER.DELETE.default.from", json!({})).await;
    assert_eq!(deleted["success"], json!(true), "{deleted}");
    let gone = js(&client, "CONSUMER.INFO.default.from", json!({})).await;
    assert_eq!(gone["error"]["err_code"], json!(10014), "{gone}");
    server.stop().await;
}

#[tokio::test]
async fn a_push_consumer_waits_for_a_listener_and_goes_when_none_comes() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let jetstream = async_nats::jetstream::new(client.clone());
    publish(&jetstream, "t.a", "a1").await;

    // Made before anyone listens: it delivers once someone does.
    let inbox = client.new_inbox();
    let extra = json!({"name": "late", "inactive_threshold": 2_000_000_000u64});
    let created = js(
        &client,
        "CONSUMER.CREATE.default.late",
        create(&inbox, extra),
    )
    .await;
    assert_eq!(created["name"], json!("late"), "{created}");
    assert!(created.get("push_bound").is_none(), "{created}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sub = client.subscribe(inbox.clone()).await.expect("subscribes");
    let message = next(&mut sub).await;
    assert_eq!(sequences(&message), (1, 1, 0), "nothing was lost waiting");

    // Nobody listens for longer than the threshold: the consumer is gone.
    let inbox = client.new_inbox();
    let extra = json!({"name": "lonely", "inactive_threshold": 300_000_000u64});
    js(
        &client,
        "CONSUMER.CREATE.default.lonely",
        create(&inbox, extra),
    )
    .await;
    let gone = tokio::time::timeout(WAIT, async {
        loop {
            let info = js(&client, "CONSUMER.INFO.default.lonely", json!({})).await;
            if info["error"]["err_code"] == json!(10014) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "an unheard consumer outlived its threshold");
    let kept = js(&client, "CONSUMER.INFO.default.late", json!({})).await;
    assert_eq!(kept["name"], json!("late"), "a heard one stays: {kept}");

    // A create under a running consumer's name with another config is refused.
    let again = js(
        &client,
        "CONSUMER.CREATE.default.late",
        create(&inbox, json!({"name": "late", "deliver_policy": "new"})),
    )
    .await;
    assert_eq!(again["error"]["err_code"], json!(10148), "{again}");
    server.stop().await;
}

#[tokio::test]
async fn push_consumers_keep_rights_and_tenants_sealed() {
    let (logins, [dave, erin, olga]) = dave_erin_and_olga().await;
    let push = |deliver: &str, filter: &str| {
        json!({"stream_name": "default", "config": {"name": "w", "deliver_subject": deliver,
            "ack_policy": "none", "filter_subject": filter}})
    };

    let inbox = erin.new_inbox();
    let _erins = erin.subscribe(inbox.clone()).await.expect("subscribes");
    let peek = js(&erin, "CONSUMER.CREATE.default.w", push(&inbox, "dave.>")).await;
    assert_eq!(peek["error"]["code"], json!(403), "{peek}");
    // Dave may read dave.> but not pour it onto erin.x, which he may not publish to.
    let pour = js(&dave, "CONSUMER.CREATE.default.w", push("erin.x", "dave.>")).await;
    assert_eq!(pour["error"]["code"], json!(403), "{pour}");
    let wild = js(&dave, "CONSUMER.CREATE.default.w", push("dave.*", "dave.>")).await;
    assert_eq!(wild["error"]["err_code"], json!(10112), "{wild}");

    let inbox = dave.new_inbox();
    let _daves = dave.subscribe(inbox.clone()).await.expect("subscribes");
    let made = js(&dave, "CONSUMER.CREATE.default.w", push(&inbox, "dave.>")).await;
    assert_eq!(made["name"], json!("w"), "{made}");
    let seen = js(&erin, "CONSUMER.INFO.default.w", json!({})).await;
    assert_eq!(seen["error"]["code"], json!(403), "{seen}");
    let names = js(&erin, "CONSUMER.NAMES.default", json!({})).await;
    assert_eq!(names["total"], json!(0), "{names}");
    let deleted = js(&erin, "CONSUMER.DELETE.default.w", json!({})).await;
    assert_eq!(deleted["error"]["code"], json!(403), "{deleted}");
    let elsewhere = js(&olga, "CONSUMER.INFO.other.w", json!({})).await;
    assert_eq!(elsewhere["error"]["err_code"], json!(10014), "{elsewhere}");
    let names = js(&dave, "CONSUMER.NAMES.default", json!({})).await;
    assert_eq!(names["consumers"], json!(["w"]), "{names}");

    // A name becomes a token of every delivery's reply subject: nothing else gets in.
    let mut bad = push(&inbox, "dave.>");
    bad["config"]["name"] = json!("w x\r\nPING");
    let refused = js(&dave, "CONSUMER.CREATE.default", bad).await;
    assert_eq!(refused["error"]["code"], json!(400), "{refused}");

    // Dave may not publish to his inbox: his connection's hold on it let the consumer
    // deliver there, so it goes when the connection does (and another may take it).
    let other = logins.native("dave@default").await;
    drop(_daves);
    drop(dave);
    let gone = tokio::time::timeout(WAIT, async {
        loop {
            let info = js(&other, "CONSUMER.INFO.default.w", json!({})).await;
            if info["error"]["err_code"] == json!(10014) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "a consumer outlived its maker's inbox");
}

/// A push consumer with acks is a group delivered to its subject as messages come:
/// async-nats's push consumer gets what is stored and then what comes, acks it, gets
/// an unacked one again; a durable one outlives a restart (its deliveries go on), an
/// ephemeral one nobody listens to goes after its inactive threshold.
#[tokio::test]
async fn a_push_consumer_with_acks_delivers_as_messages_come_and_outlives_a_restart() {
    use async_nats::jetstream::consumer::{AckPolicy, push};
    let folder = tempfile::tempdir().expect("tempdir");
    let server = crate::common::start(crate::common::file_config(folder.path())).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let jetstream = async_nats::jetstream::new(client.clone());
    let stream = crate::common::declare_stream(&jetstream, "EV", "ev.>").await;
    jetstream
        .publish("ev.a", "a1".into())
        .await
        .expect("sent")
        .await
        .expect("acked");
    let config = push::Config {
        durable_name: Some("pusher".into()),
        deliver_subject: "ev-deliver.pusher".into(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(1),
        filter_subject: "ev.>".into(),
        ..Default::default()
    };
    let consumer: async_nats::jetstream::consumer::PushConsumer = stream
        .create_consumer(config)
        .await
        .expect("a push consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let first = next_pushed(&mut messages).await;
    assert_eq!(&first.payload[..], b"a1");
    first.ack().await.expect("ack");
    jetstream
        .publish("ev.b", "b1".into())
        .await
        .expect("sent")
        .await
        .expect("acked");
    let unacked = next_pushed(&mut messages).await;
    assert_eq!(&unacked.payload[..], b"b1");
    let again = next_pushed(&mut messages).await;
    assert_eq!(&again.payload[..], b"b1", "an unacked message comes again");
    assert_eq!(again.info().expect("info").delivered, 2);
    again.ack().await.expect("ack");
    crate::groups::await_cursors_stored(&client, "pusher", 1).await;
    drop((messages, consumer, stream, jetstream, client));
    server.stop().await;

    let server = crate::common::start(crate::common::file_config(folder.path())).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connects");
    let mut sub = client
        .subscribe("ev-deliver.pusher")
        .await
        .expect("subscribes");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Stream", "EV");
    let jetstream = async_nats::jetstream::new(client.clone());
    jetstream
        .publish_with_headers("ev.c", headers, "c1".into())
        .await
        .expect("sent")
        .await
        .expect("acked");
    let after = next_data(&mut sub).await;
    assert_eq!(
        &after.payload[..],
        b"c1",
        "what was acked does not come again"
    );

    // Ephemeral, nobody listening: gone after its threshold.
    let lonely = js(
        &client,
        "CONSUMER.CREATE.EV",
        json!({"stream_name": "EV", "config": {"deliver_subject": "ev-deliver.nobody",
            "ack_policy": "explicit", "inactive_threshold": 300_000_000u64}}),
    )
    .await;
    let name = lonely["name"]
        .as_str()
        .expect("a generated name")
        .to_owned();
    assert_eq!(
        lonely["config"]["deliver_subject"],
        json!("ev-deliver.nobody")
    );
    let gone = tokio::time::timeout(WAIT, async {
        loop {
            let info = js(&client, &format!("CONSUMER.INFO.EV.{name}"), json!({})).await;
            if info["error"]["err_code"] == json!(10014) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "an unheard ephemeral consumer outlived its threshold"
    );
    server.stop().await;
}

/// The next message that is not a status (a heartbeat).
async fn next_data(sub: &mut async_nats::Subscriber) -> Message {
    loop {
        let message = next(sub).await;
        if message.status.is_none() {
            return message;
        }
    }
}

async fn next_pushed(
    messages: &mut async_nats::jetstream::consumer::push::Messages,
) -> async_nats::jetstream::Message {
    tokio::time::timeout(WAIT, messages.next())
        .await
        .expect("a message in time")
        .expect("the stream is open")
        .expect("a message")
}
