//! JetStream pull consumers through the unmodified async-nats client. The tenant is one
//! stream, `default`, over every subject (`>`); it is listed and shown but not made or
//! deleted. A durable pull consumer is a Canopy consumer group. These tests prove that
//! `fetch`, `batch` and the endless `messages` stream deliver each stored message once,
//! in version order for each subject, with its own subject, payload and headers and the
//! `$JS.ACK.` metadata `Message::info` parses. They prove that acks, naks (at once and
//! after a delay), progress, term and double acks work as in JetStream, and that a batch
//! waits until it expires and then just ends. They prove that the deliver policies All,
//! New and ByStartTime choose where a consumer starts. Consumers are made, found, listed
//! and deleted, and a push, ephemeral or ack-none consumer or another deliver policy is
//! refused with a JetStream API error. Two handles of one consumer share its messages,
//! with one message of a subject out at a time when the consumer asks for it. What was
//! acked stays acked after a restart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{
    AckPolicy, DeliverPolicy, FromConsumer, IntoConsumerConfig, PullConsumer, pull, push,
};
use async_nats::jetstream::context::{
    ConsumerInfoError, ConsumerInfoErrorKind, CreateStreamErrorKind, GetStreamErrorKind,
};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, AckKind};
use futures::{StreamExt, TryStreamExt};

use crate::common::{WAIT, file_config, header, header_of, start, start_default};

async fn connect(server: &canopy::server::RunningServer) -> async_nats::Client {
    async_nats::connect(server.native_url())
        .await
        .expect("connect")
}

/// Awaits `future` for at most [`WAIT`]; panics naming `what` if it takes longer.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within the wait"))
}

/// The tenant's stream, through `STREAM.INFO`.
async fn default_stream(js: &jetstream::Context) -> jetstream::stream::Stream {
    within("STREAM.INFO", js.get_stream("default"))
        .await
        .unwrap_or_else(|e| panic!("get_stream(\"default\"): {e}"))
}

/// A JetStream publish into the tenant's own stream and its PubAck. It names the
/// stream (`Nats-Expected-Stream`): a plain request to a subject no declared stream
/// holds is answered "no responders", as in NATS.
async fn js_publish(
    js: &jetstream::Context,
    subject: &str,
    payload: &str,
) -> jetstream::publish::PublishAck {
    js_publish_with(js, subject, async_nats::HeaderMap::new(), payload).await
}

/// A JetStream publish with headers and its PubAck.
async fn js_publish_with(
    js: &jetstream::Context,
    subject: &str,
    mut headers: async_nats::HeaderMap,
    payload: &str,
) -> jetstream::publish::PublishAck {
    headers.insert("Nats-Expected-Stream", "default");
    let pending = within(
        "publish",
        js.publish_with_headers(subject.to_owned(), headers, payload.to_owned().into()),
    )
    .await
    .unwrap_or_else(|e| panic!("publish to {subject}: {e}"));
    within("PubAck", std::future::IntoFuture::into_future(pending))
        .await
        .unwrap_or_else(|e| panic!("ack for {subject}: {e}"))
}

/// A durable pull consumer from the start of the stream, explicit acks.
fn pull_config(name: &str, filter: &str) -> pull::Config {
    pull::Config {
        durable_name: Some(name.to_owned()),
        filter_subject: filter.to_owned(),
        deliver_policy: DeliverPolicy::All,
        ack_wait: Duration::from_secs(30),
        max_deliver: 5,
        ..Default::default()
    }
}

/// `config` with strict order per subject: one message of a subject out at a time.
fn strict(mut config: pull::Config) -> pull::Config {
    config.metadata = HashMap::from([("canopy.per_subject".to_owned(), "1".to_owned())]);
    config
}

async fn create(stream: &jetstream::stream::Stream, config: pull::Config) -> PullConsumer {
    let name = config.durable_name.clone().unwrap_or_default();
    within("CONSUMER.CREATE", stream.create_consumer(config))
        .await
        .unwrap_or_else(|e| panic!("create consumer {name}: {e}"))
}

/// Asserts making a consumer from `config` is refused with a JetStream API error (not a
/// timeout, not a consumer).
async fn assert_refused<C>(stream: &jetstream::stream::Stream, config: C, what: &str)
where
    C: IntoConsumerConfig + FromConsumer,
{
    match within(what, stream.create_consumer(config)).await {
        Ok(made) => panic!("{what} was made: {:?}", made.cached_info()),
        Err(e) => assert!(
            matches!(e.kind(), ConsumerErrorKind::JetStream(_)),
            "{what}: refused with a JetStream API error, not {e}"
        ),
    }
}

/// The names of the stream's consumers, sorted.
async fn consumer_names(stream: &jetstream::stream::Stream) -> Vec<String> {
    let mut names: Vec<String> = within("CONSUMER.NAMES", stream.consumer_names().try_collect())
        .await
        .unwrap_or_else(|e| panic!("consumer names: {e}"));
    names.sort();
    names
}

/// Every item of a pull to its end; panics on an error item.
async fn drain(mut batch: pull::Batch) -> Vec<jetstream::Message> {
    let mut got = Vec::new();
    while let Some(item) = batch.next().await {
        let message = item.unwrap_or_else(|e| {
            panic!("an error item in a pull after {} messages: {e}", got.len())
        });
        got.push(message);
    }
    got
}

/// One `fetch` (no wait): what is ready now.
async fn fetch(consumer: &PullConsumer, max: usize) -> Vec<jetstream::Message> {
    within("a fetch ends", async {
        let batch = consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .expect("fetch request");
        drain(batch).await
    })
    .await
}

/// One `batch`: up to `max` messages, waiting for them up to `expires`.
async fn batch(consumer: &PullConsumer, max: usize, expires: Duration) -> Vec<jetstream::Message> {
    tokio::time::timeout(expires + WAIT, async {
        let batch = consumer
            .batch()
            .max_messages(max)
            .expires(expires)
            .messages()
            .await
            .expect("batch request");
        drain(batch).await
    })
    .await
    .unwrap_or_else(|_| panic!("a batch expiring after {expires:?} did not end"))
}

/// The next item of an endless stream, which must be a message.
async fn next_message(messages: &mut pull::Stream) -> jetstream::Message {
    within("the next message of the stream", messages.next())
        .await
        .expect("the stream goes on")
        .unwrap_or_else(|e| panic!("an error item in the stream: {e}"))
}

fn text(message: &jetstream::Message) -> String {
    String::from_utf8_lossy(&message.payload).into_owned()
}

fn texts(messages: &[jetstream::Message]) -> Vec<String> {
    messages.iter().map(text).collect()
}

/// Subject, payload and delivery count of one delivery.
fn seen(message: &jetstream::Message) -> (String, String, i64) {
    let info = message
        .info()
        .unwrap_or_else(|e| panic!("no JetStream metadata in {:?}: {e}", message.reply));
    (message.subject.to_string(), text(message), info.delivered)
}

/// [`seen`] of each, sorted (by subject first).
fn sorted(messages: &[jetstream::Message]) -> Vec<(String, String, i64)> {
    let mut all: Vec<_> = messages.iter().map(seen).collect();
    all.sort();
    all
}

fn s(subject: &str, payload: &str, delivered: i64) -> (String, String, i64) {
    (subject.to_owned(), payload.to_owned(), delivered)
}

/// The delivery of `subject` among `messages`.
fn on<'a>(messages: &'a [jetstream::Message], subject: &str) -> &'a jetstream::Message {
    messages
        .iter()
        .find(|m| m.subject.as_str() == subject)
        .unwrap_or_else(|| panic!("nothing of {subject} in {:?}", sorted(messages)))
}

/// Consumer info once `num_ack_pending` is `ack_pending` (plain acks get no answer, so
/// the server may take them a moment after they were sent).
async fn settled(consumer: &PullConsumer, ack_pending: usize) -> jetstream::consumer::Info {
    let deadline = Instant::now() + WAIT;
    loop {
        let info = within("CONSUMER.INFO", consumer.get_info())
            .await
            .unwrap_or_else(|e| panic!("consumer info: {e}"));
        if info.num_ack_pending == ack_pending {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "num_ack_pending stayed {} instead of {ack_pending}: {info:?}",
            info.num_ack_pending
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Now, moved by `seconds`, as async-nats's datetime.
fn seconds_from_now(seconds: i64) -> async_nats::datetime::DateTime {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i128;
    async_nats::datetime::from_nanos(now + i128::from(seconds) * 1_000_000_000)
        .expect("a representable time")
}

#[tokio::test]
async fn a_fetch_hands_out_every_stored_message_once_in_order_per_subject_with_its_metadata() {
    let server = start_default().await;
    let client = connect(&server).await;
    let js = jetstream::new(client.clone());
    let before = seconds_from_now(-5);
    let subjects = ["orders.1", "orders.2", "orders.3"];
    let mut sequences = HashMap::new();
    for round in 1..=3 {
        for subject in subjects {
            let payload = format!("{subject} #{round}");
            let headers = header("Round", &round.to_string());
            let ack = js_publish_with(&js, subject, headers, &payload).await;
            assert_eq!(ack.stream, "default");
            sequences.insert(payload, ack.sequence);
        }
    }
    js_publish(&js, "other.1", "not for billing").await;

    let stream = default_stream(&js).await;
    let consumer: PullConsumer = within(
        "get_or_create_consumer",
        stream.get_or_create_consumer("billing", pull_config("billing", "orders.>")),
    )
    .await
    .unwrap_or_else(|e| panic!("get_or_create_consumer: {e}"));
    assert_eq!(consumer.cached_info().name, "billing");
    assert_eq!(consumer.cached_info().stream_name, "default");

    let got = fetch(&consumer, 20).await;
    let after = seconds_from_now(5);
    assert_eq!(
        got.len(),
        9,
        "every message of orders.> at once, nothing of other.>: {:?}",
        sorted(&got)
    );
    let mut per_subject: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, message) in got.iter().enumerate() {
        let payload = text(message);
        let info = message
            .info()
            .unwrap_or_else(|e| panic!("{payload}: no JetStream metadata: {e}"));
        assert_eq!(
            (info.stream, info.consumer, info.delivered),
            ("default", "billing", 1),
            "{payload}"
        );
        assert_eq!(
            info.stream_sequence, sequences[&payload],
            "{payload}: the stream sequence is the one its PubAck gave"
        );
        assert_eq!(
            info.consumer_sequence,
            n as u64 + 1,
            "{payload}: consumer sequences count the deliveries"
        );
        assert!(
            before <= info.published && info.published <= after,
            "{payload}: published at {:?}",
            info.published
        );
        let round = payload.rsplit('#').next().expect("a round");
        assert_eq!(
            header_of(message, "Round"),
            Some(round),
            "{payload}: its headers come with it"
        );
        assert!(
            payload.starts_with(message.subject.as_str()),
            "{payload} arrived on {}, not its own subject",
            message.subject
        );
        per_subject
            .entry(message.subject.to_string())
            .or_default()
            .push(payload);
    }
    let last = got.last().expect("nine").info().expect("metadata");
    assert_eq!(
        last.pending, 0,
        "nothing is left for the consumer after the last"
    );
    for subject in subjects {
        let want: Vec<String> = (1..=3).map(|r| format!("{subject} #{r}")).collect();
        assert_eq!(
            per_subject.get(subject),
            Some(&want),
            "{subject} in publish order"
        );
    }

    let info = within("CONSUMER.INFO", consumer.get_info())
        .await
        .unwrap_or_else(|e| panic!("consumer info: {e}"));
    assert_eq!(
        info.num_ack_pending, 9,
        "all nine out, none acked: {info:?}"
    );

    for message in &got {
        message.ack().await.expect("ack sent");
    }
    let info = settled(&consumer, 0).await;
    assert_eq!(info.num_pending, 0, "nothing left to deliver: {info:?}");
    assert!(
        fetch(&consumer, 20).await.is_empty(),
        "what was acked does not come again"
    );

    // Another connection's handle of the same durable consumer finds nothing either.
    let other = jetstream::new(connect(&server).await);
    let other_stream = default_stream(&other).await;
    let again: PullConsumer = within("get_consumer", other_stream.get_consumer("billing"))
        .await
        .unwrap_or_else(|e| panic!("get_consumer: {e}"));
    assert!(fetch(&again, 20).await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_nak_comes_again_a_term_never_progress_holds_and_a_double_ack_is_answered() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    for (subject, first, second) in [
        ("jobs.nak", "n1", "n2"),
        ("jobs.term", "t1", "t2"),
        ("jobs.wip", "w1", "w2"),
        ("jobs.done", "d1", "d2"),
    ] {
        js_publish(&js, subject, first).await;
        js_publish(&js, subject, second).await;
    }
    let stream = default_stream(&js).await;
    // Strict order per subject: a subject's second message waits for its first to be
    // settled, which shows what each kind of ack did.
    let consumer = create(&stream, strict(pull_config("worker", "jobs.>"))).await;

    let first = fetch(&consumer, 20).await;
    assert_eq!(
        sorted(&first),
        [
            s("jobs.done", "d1", 1),
            s("jobs.nak", "n1", 1),
            s("jobs.term", "t1", 1),
            s("jobs.wip", "w1", 1)
        ],
        "one message of each subject at a time"
    );
    on(&first, "jobs.nak")
        .ack_with(AckKind::Nak(None))
        .await
        .expect("nak sent");
    on(&first, "jobs.term")
        .ack_with(AckKind::Term)
        .await
        .expect("term sent");
    on(&first, "jobs.wip")
        .ack_with(AckKind::Progress)
        .await
        .expect("progress sent");
    within(
        "a double ack's answer",
        on(&first, "jobs.done").double_ack(),
    )
    .await
    .unwrap_or_else(|e| panic!("the server answers a double ack: {e}"));

    let second = batch(&consumer, 3, Duration::from_secs(5)).await;
    assert_eq!(
        sorted(&second),
        [
            s("jobs.done", "d2", 1),
            s("jobs.nak", "n1", 2),
            s("jobs.term", "t2", 1)
        ],
        "the nacked n1 again (delivered twice), t2 after the termed t1, d2 after the acked d1"
    );
    assert!(
        fetch(&consumer, 20).await.is_empty(),
        "w1 is still held after its progress, so w2 waits"
    );
    let info = within("CONSUMER.INFO", consumer.get_info())
        .await
        .unwrap_or_else(|e| panic!("consumer info: {e}"));
    assert_eq!(
        info.num_ack_pending, 4,
        "n1, t2, d2 and the w1 that progress kept: {info:?}"
    );

    // A nak with a delay: it comes again once the delay is over.
    on(&second, "jobs.done")
        .ack_with(AckKind::Nak(Some(Duration::from_millis(200))))
        .await
        .expect("nak sent");
    let delayed = batch(&consumer, 1, Duration::from_secs(5)).await;
    assert_eq!(sorted(&delayed), [s("jobs.done", "d2", 2)]);

    // Acking the held w1 lets w2 out.
    within("a double ack's answer", on(&first, "jobs.wip").double_ack())
        .await
        .unwrap_or_else(|e| panic!("double ack of w1 after its progress: {e}"));
    let third = batch(&consumer, 1, Duration::from_secs(5)).await;
    assert_eq!(sorted(&third), [s("jobs.wip", "w2", 1)]);

    for message in [
        on(&second, "jobs.nak"),
        on(&second, "jobs.term"),
        &delayed[0],
        &third[0],
    ] {
        within("a double ack's answer", message.double_ack())
            .await
            .unwrap_or_else(|e| panic!("double ack of {}: {e}", text(message)));
    }
    // n2 waited behind n1, and is the only message left.
    let last = fetch(&consumer, 20).await;
    assert_eq!(sorted(&last), [s("jobs.nak", "n2", 1)]);
    within("a double ack's answer", last[0].double_ack())
        .await
        .unwrap_or_else(|e| panic!("double ack of n2: {e}"));
    let info = settled(&consumer, 0).await;
    assert_eq!(info.num_pending, 0, "{info:?}");
    assert!(
        fetch(&consumer, 20).await.is_empty(),
        "the termed t1 never comes again, nor anything acked"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_messages_stream_delivers_what_is_published_after_it_started_in_order_per_subject() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    js_publish(&js, "feed.a", "before").await;
    let stream = default_stream(&js).await;
    let consumer = create(
        &stream,
        pull::Config {
            deliver_policy: DeliverPolicy::New,
            ..pull_config("tail", "feed.>")
        },
    )
    .await;
    let mut messages = within("the messages stream starts", consumer.messages())
        .await
        .unwrap_or_else(|e| panic!("messages(): {e}"));

    let publisher = jetstream::new(connect(&server).await);
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in 1..=4 {
        for subject in ["feed.a", "feed.b"] {
            let payload = format!("{subject} {n}");
            js_publish(&publisher, subject, &payload).await;
            want.entry(subject.to_owned()).or_default().push(payload);
        }
    }
    let mut per_subject: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for _ in 0..8 {
        let message = next_message(&mut messages).await;
        let info = message.info().expect("JetStream metadata");
        assert_eq!(
            (info.stream, info.consumer, info.delivered),
            ("default", "tail", 1),
            "{}",
            text(&message)
        );
        per_subject
            .entry(message.subject.to_string())
            .or_default()
            .push(text(&message));
        message.ack().await.expect("ack sent");
    }
    assert_eq!(
        per_subject, want,
        "what came after the consumer was made (New), in publish order per subject"
    );
    settled(&consumer, 0).await;
    server.stop().await;
}

#[tokio::test]
async fn the_messages_stream_outlives_the_expiry_of_its_pulls_on_idle_heartbeats() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    let stream = default_stream(&js).await;
    let consumer = create(&stream, pull_config("idle", "beats.>")).await;
    // Each pull expires after 1.5 s; async-nats reports a missed heartbeat after 1 s of
    // silence, so the server must send `100 Idle Heartbeat` while a pull waits, and end
    // an expired pull with a `408` so the client pulls again.
    let mut messages = within(
        "the messages stream starts",
        consumer
            .stream()
            .expires(Duration::from_millis(1500))
            .heartbeat(Duration::from_millis(500))
            .messages(),
    )
    .await
    .unwrap_or_else(|e| panic!("stream().messages(): {e}"));

    js_publish(&js, "beats.x", "first").await;
    let first = next_message(&mut messages).await;
    assert_eq!(text(&first), "first");
    first.ack().await.expect("ack sent");

    // Idle across two pull expiries: no message, and no error item.
    let idle = tokio::time::timeout(Duration::from_millis(3500), messages.next()).await;
    assert!(
        idle.is_err(),
        "nothing, and no missed-heartbeat error, while idle: {idle:?}"
    );

    js_publish(&js, "beats.x", "second").await;
    let second = next_message(&mut messages).await;
    assert_eq!(
        text(&second),
        "second",
        "the renewed pull gets what comes next"
    );
    assert_eq!(second.info().expect("metadata").delivered, 1);
    second.ack().await.expect("ack sent");
    server.stop().await;
}

#[tokio::test]
async fn a_batch_waits_for_its_messages_until_it_expires_and_then_just_ends() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    let stream = default_stream(&js).await;
    let consumer = create(&stream, pull_config("waiter", "quiet.>")).await;

    let expires = Duration::from_secs(1);
    let started = Instant::now();
    let got = batch(&consumer, 5, expires).await;
    let took = started.elapsed();
    assert!(got.is_empty(), "nothing to deliver: {:?}", sorted(&got));
    assert!(
        took >= expires / 2,
        "the batch waited for messages instead of ending at once: {took:?}"
    );
    assert!(
        took < expires + Duration::from_secs(4),
        "the server's 408 at the expiry ended it, not async-nats's own timer at expiry + 5 s: \
         {took:?}"
    );

    // A message published while a batch waits reaches it.
    let publisher = jetstream::new(connect(&server).await);
    let waiting = within(
        "batch request",
        consumer
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(5))
            .messages(),
    )
    .await
    .unwrap_or_else(|e| panic!("batch request: {e}"));
    js_publish(&publisher, "quiet.now", "arrived").await;
    let got = within("the waiting batch gets its message", drain(waiting)).await;
    assert_eq!(sorted(&got), [s("quiet.now", "arrived", 1)]);
    within("a double ack's answer", got[0].double_ack())
        .await
        .unwrap_or_else(|e| panic!("double ack: {e}"));
    server.stop().await;
}

#[tokio::test]
async fn consumers_are_made_found_listed_and_deleted_and_what_canopy_lacks_is_refused() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);

    // The tenant's own stream holds every subject no declared stream holds; it is not
    // made or deleted, and a stream Canopy cannot honour (in memory) is refused.
    let mut stream = default_stream(&js).await;
    assert_eq!(stream.cached_info().config.name, "default");
    assert_eq!(stream.cached_info().config.subjects, [">"]);
    let names: Vec<String> = within("STREAM.NAMES", js.stream_names().try_collect())
        .await
        .unwrap_or_else(|e| panic!("stream names: {e}"));
    assert_eq!(names, ["default"]);
    let made = within(
        "STREAM.CREATE",
        js.create_stream(jetstream::stream::Config {
            name: "orders".into(),
            subjects: vec!["orders.>".into()],
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        }),
    )
    .await;
    match made {
        Ok(_) => panic!("a stream in memory was made"),
        Err(e) => assert!(
            matches!(e.kind(), CreateStreamErrorKind::JetStream(_)),
            "a stream in memory is refused with a JetStream API error, not {e}"
        ),
    }
    match within("STREAM.DELETE", js.delete_stream("default")).await {
        Ok(status) => panic!(
            "the tenant's stream was deleted (success {})",
            status.success
        ),
        Err(e) => assert!(
            matches!(e.kind(), GetStreamErrorKind::JetStream(_)),
            "deleting the stream is refused with a JetStream API error, not {e}"
        ),
    }
    within("STREAM.INFO", stream.info())
        .await
        .unwrap_or_else(|e| panic!("the stream is still there: {e}"));

    for n in 1..=3 {
        js_publish(&js, &format!("ledger.{n}"), "entry").await;
    }
    let consumer = create(&stream, pull_config("audit", "ledger.>")).await;
    let made = consumer.cached_info();
    assert_eq!(
        (made.stream_name.as_str(), made.name.as_str()),
        ("default", "audit")
    );
    assert_eq!(made.config.durable_name.as_deref(), Some("audit"));
    assert_eq!(made.config.filter_subject, "ledger.>");
    assert_eq!(made.config.deliver_policy, DeliverPolicy::All);
    assert_eq!(made.config.ack_policy, AckPolicy::Explicit);
    assert_eq!(made.config.ack_wait, Duration::from_secs(30));
    assert_eq!(made.config.max_deliver, 5);
    let info = within("CONSUMER.INFO", consumer.get_info())
        .await
        .unwrap_or_else(|e| panic!("consumer info: {e}"));
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (3, 0),
        "the three stored ledger messages wait for it: {info:?}"
    );

    let found: PullConsumer = within("get_consumer", stream.get_consumer("audit"))
        .await
        .unwrap_or_else(|e| panic!("get_consumer: {e}"));
    assert_eq!(found.cached_info().name, "audit");
    assert_eq!(found.cached_info().config.filter_subject, "ledger.>");
    assert_eq!(
        found.cached_info().config.durable_name.as_deref(),
        Some("audit")
    );
    let again: PullConsumer = within(
        "get_or_create_consumer",
        stream.get_or_create_consumer("audit", pull_config("audit", "ledger.>")),
    )
    .await
    .unwrap_or_else(|e| panic!("get_or_create_consumer of an existing one: {e}"));
    assert_eq!(again.cached_info().name, "audit");
    assert_eq!(consumer_names(&stream).await, ["audit"]);

    assert_refused(
        &stream,
        push::Config {
            deliver_subject: "push.here".into(),
            durable_name: Some("pushy".into()),
            filter_subject: "ledger.>".into(),
            ack_policy: AckPolicy::All,
            ..Default::default()
        },
        "a push consumer acking all",
    )
    .await;
    assert_refused(
        &stream,
        pull::Config {
            filter_subject: "ledger.>".into(),
            ..Default::default()
        },
        "an ephemeral consumer",
    )
    .await;
    assert_refused(
        &stream,
        pull::Config {
            ack_policy: AckPolicy::None,
            ..pull_config("careless", "ledger.>")
        },
        "a durable consumer without acks",
    )
    .await;
    for (name, policy) in [
        ("last", DeliverPolicy::Last),
        ("last_per_subject", DeliverPolicy::LastPerSubject),
        (
            "by_sequence",
            DeliverPolicy::ByStartSequence { start_sequence: 2 },
        ),
    ] {
        assert_refused(
            &stream,
            pull::Config {
                deliver_policy: policy,
                ..pull_config(name, "ledger.>")
            },
            &format!("deliver policy {policy:?}"),
        )
        .await;
    }
    assert_eq!(
        consumer_names(&stream).await,
        ["audit"],
        "nothing refused was made"
    );

    let status = within("CONSUMER.DELETE", stream.delete_consumer("audit"))
        .await
        .unwrap_or_else(|e| panic!("delete_consumer: {e}"));
    assert!(status.success);
    match within("get_consumer", stream.get_consumer::<pull::Config>("audit")).await {
        Ok(_) => panic!("a deleted consumer was found"),
        Err(e) => assert_eq!(
            e.downcast_ref::<ConsumerInfoError>().map(|e| e.kind()),
            Some(ConsumerInfoErrorKind::NotFound),
            "a deleted consumer is not found: {e}"
        ),
    }
    match within("CONSUMER.INFO", consumer.get_info()).await {
        Ok(info) => panic!("a deleted consumer has info: {info:?}"),
        Err(e) => assert_eq!(e.kind(), ConsumerInfoErrorKind::NotFound, "{e}"),
    }
    match within("CONSUMER.DELETE", stream.delete_consumer("audit")).await {
        Ok(status) => panic!("deleted twice (success {})", status.success),
        Err(e) => assert!(
            matches!(e.kind(), ConsumerErrorKind::JetStream(api) if api.code() == 404),
            "deleting a missing consumer is a 404: {e}"
        ),
    }
    assert!(consumer_names(&stream).await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn deliver_policies_all_new_and_by_start_time_choose_where_a_consumer_starts() {
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    js_publish(&js, "since.a", "1").await;
    js_publish(&js, "since.a", "2").await;
    let stream = default_stream(&js).await;
    let by_time = |name: &str, start_time| pull::Config {
        deliver_policy: DeliverPolicy::ByStartTime { start_time },
        ..pull_config(name, "since.>")
    };
    let all = create(&stream, pull_config("all", "since.>")).await;
    let past = create(&stream, by_time("past", seconds_from_now(-3600))).await;
    let future = create(&stream, by_time("future", seconds_from_now(3600))).await;
    let new = create(
        &stream,
        pull::Config {
            deliver_policy: DeliverPolicy::New,
            ..pull_config("new", "since.>")
        },
    )
    .await;
    assert!(matches!(
        past.cached_info().config.deliver_policy,
        DeliverPolicy::ByStartTime { .. }
    ));
    assert_eq!(new.cached_info().config.deliver_policy, DeliverPolicy::New);
    js_publish(&js, "since.a", "3").await;

    let wait = Duration::from_secs(5);
    assert_eq!(texts(&batch(&all, 3, wait).await), ["1", "2", "3"]);
    assert_eq!(
        texts(&batch(&past, 3, wait).await),
        ["1", "2", "3"],
        "from an hour ago: everything stored since"
    );
    assert_eq!(
        texts(&batch(&new, 1, wait).await),
        ["3"],
        "only what came after it was made"
    );
    assert!(
        fetch(&future, 10).await.is_empty(),
        "from an hour ahead: nothing yet"
    );
    assert!(fetch(&all, 10).await.is_empty(), "all three are out");
    assert!(fetch(&new, 10).await.is_empty(), "the first two never come");
    assert_eq!(
        consumer_names(&stream).await,
        ["all", "future", "new", "past"]
    );
    server.stop().await;
}

/// What the two members of the shared-consumer test saw: the subjects they hold
/// unacked, and every delivery in the order received.
#[derive(Default)]
struct Shared {
    out: HashSet<String>,
    got: Vec<(String, String, i64)>,
}

/// Records a delivery; false if another message of its subject is out.
fn take_out(shared: &Mutex<Shared>, delivery: &(String, String, i64)) -> bool {
    let mut state = shared.lock().unwrap();
    state.got.push(delivery.clone());
    state.out.insert(delivery.0.clone())
}

fn put_back(shared: &Mutex<Shared>, subject: &str) {
    shared.lock().unwrap().out.remove(subject);
}

fn delivered(shared: &Mutex<Shared>) -> usize {
    shared.lock().unwrap().got.len()
}

#[tokio::test]
async fn two_handles_of_one_consumer_share_its_messages_once_each_and_in_order_per_subject() {
    const SUBJECTS: usize = 6;
    const PER_SUBJECT: usize = 5;
    const TOTAL: usize = SUBJECTS * PER_SUBJECT;
    let server = start_default().await;
    let js = jetstream::new(connect(&server).await);
    for n in 1..=PER_SUBJECT {
        for subject in 0..SUBJECTS {
            js_publish(&js, &format!("pool.{subject}"), &n.to_string()).await;
        }
    }
    let stream = default_stream(&js).await;
    create(&stream, strict(pull_config("pool", "pool.>"))).await;

    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut members = Vec::new();
    for member in 0..2 {
        let js = jetstream::new(connect(&server).await);
        let stream = default_stream(&js).await;
        let consumer: PullConsumer = within("get_consumer", stream.get_consumer("pool"))
            .await
            .unwrap_or_else(|e| panic!("get_consumer: {e}"));
        let shared = Arc::clone(&shared);
        members.push(tokio::spawn(async move {
            let deadline = Instant::now() + WAIT;
            while delivered(&shared) < TOTAL {
                assert!(
                    Instant::now() < deadline,
                    "member {member}: not everything was delivered in time"
                );
                let mut pull = consumer
                    .batch()
                    .max_messages(3)
                    .expires(Duration::from_millis(500))
                    .messages()
                    .await
                    .expect("batch request");
                while let Some(item) = pull.next().await {
                    let message = item.unwrap_or_else(|e| panic!("member {member}: {e}"));
                    let delivery = seen(&message);
                    assert!(
                        take_out(&shared, &delivery),
                        "member {member} got {delivery:?} while another message of its \
                         subject was out"
                    );
                    // Held a moment, as work would hold it: a second message of the
                    // subject handed to the other member now would show above. A
                    // fixed hold: it is the work, not a wait for the server.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    put_back(&shared, &delivery.0);
                    within("a double ack's answer", message.double_ack())
                        .await
                        .unwrap_or_else(|e| panic!("member {member}: double ack: {e}"));
                }
            }
        }));
    }
    for member in members {
        tokio::time::timeout(WAIT * 2, member)
            .await
            .expect("the members finish")
            .expect("a member's checks held");
    }

    let got = shared.lock().unwrap().got.clone();
    assert_eq!(got.len(), TOTAL, "every message once: {got:?}");
    let mut per_subject: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (subject, payload, count) in &got {
        assert_eq!(*count, 1, "{subject} {payload} was delivered again");
        per_subject
            .entry(subject.clone())
            .or_default()
            .push(payload.clone());
    }
    let want: Vec<String> = (1..=PER_SUBJECT).map(|n| n.to_string()).collect();
    for subject in 0..SUBJECTS {
        let subject = format!("pool.{subject}");
        assert_eq!(
            per_subject.get(&subject),
            Some(&want),
            "{subject} in publish order"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_consumer_resumes_after_a_restart_without_what_it_acked() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(file_config(folder.path())).await;
    let client = connect(&server).await;
    let js = jetstream::new(client.clone());
    for n in 1..=4 {
        js_publish(&js, "orders.r", &format!("r{n}")).await;
    }
    let stream = default_stream(&js).await;
    let consumer = create(&stream, pull_config("billing", "orders.>")).await;
    let first = fetch(&consumer, 2).await;
    assert_eq!(texts(&first), ["r1", "r2"]);
    for message in &first {
        within("a double ack's answer", message.double_ack())
            .await
            .unwrap_or_else(|e| panic!("double ack: {e}"));
    }
    let held = fetch(&consumer, 1).await;
    assert_eq!(
        texts(&held),
        ["r3"],
        "r3 is out, unacked, when the server stops"
    );
    // The group writes cursors in batches of its own: the acked two are stored.
    crate::groups::await_cursors_stored(&client, "billing", 1).await;
    drop((first, held, consumer, stream, js, client));
    server.stop().await;

    let server = start(file_config(folder.path())).await;
    let js = jetstream::new(connect(&server).await);
    let stream = default_stream(&js).await;
    let consumer: PullConsumer = within("get_consumer", stream.get_consumer("billing"))
        .await
        .unwrap_or_else(|e| panic!("the consumer outlives the restart: {e}"));
    assert_eq!(consumer.cached_info().config.filter_subject, "orders.>");
    // Everything the consumer has now, waiting long enough for all of it.
    let after = batch(&consumer, 10, Duration::from_secs(2)).await;
    assert_eq!(
        texts(&after),
        ["r3", "r4"],
        "the acked two do not come again; the unacked third does, then the fourth"
    );
    server.stop().await;
}
