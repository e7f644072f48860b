//! Flow control: ten publishers feeding one subscriber, each as fast as it can (the
//! fan-in of the issue's figures), on two cores that all of them and the server share,
//! so the subscriber falls behind. So that it surely does, it reads nothing until its
//! outbox presses (past half its limit, which the server's stall counter shows), then
//! reads as fast as it can. Ten publishers send several times the outbox's limit:
//! without flow control the subscriber is cut as a slow consumer (messages lost);
//! with it, the publishers wait while it catches up and every message arrives, in
//! each publisher's order. Run
//! with storing on (the sequencer routes) and off (the publishers' tasks route), over
//! the native protocol (async-nats publishers), MQTT (rumqttc publishers at QoS 0
//! and 1, the subscriber at the same QoS) and `/ws` (tokio-tungstenite publishers
//! sending JSON `pub` requests, the subscriber native).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy::config::Config;
use canopy::server::RunningServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{WAIT, start, test_config};
use crate::mqtt::mqtt_addr;

const PUBLISHERS: usize = 10;
const PER_PUBLISHER: usize = 10_000;
const PAYLOAD: usize = 100;
const READ_CHUNK: usize = 64 * 1024;
/// Outbox limits: ten publishers send about 13 MB, several times these.
const NATIVE_PENDING: usize = 4 * 1024 * 1024;
const MQTT_PENDING: usize = 4 * 1024 * 1024;
/// Long enough for the slow reader to take every message on a loaded machine.
const DELIVERED_WITHIN: Duration = Duration::from_secs(60);

fn config(storing: bool) -> Config {
    let mut config = test_config();
    config.native.max_pending_bytes = NATIVE_PENDING;
    config.mqtt.max_pending_bytes = MQTT_PENDING;
    config.mqtt.max_queued_bytes = 256 * 1024;
    if !storing {
        for policy in &mut config.store.policies {
            policy.store = false;
        }
    }
    config
}

/// Payload of publisher `p`'s message `n`: `p n`, padded to `PAYLOAD` bytes.
fn payload(p: usize, n: usize) -> Bytes {
    let mut text = format!("{p} {n} ").into_bytes();
    text.resize(PAYLOAD, b'.');
    Bytes::from(text)
}

/// Counts each publisher's messages, checking they come in the order sent.
struct Tally {
    next: Vec<usize>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            next: vec![0; PUBLISHERS],
        }
    }

    fn take(&mut self, payload: &[u8]) {
        let text = String::from_utf8_lossy(payload);
        let mut words = text.split(' ');
        let p: usize = words
            .next()
            .and_then(|w| w.parse().ok())
            .expect("publisher");
        let n: usize = words.next().and_then(|w| w.parse().ok()).expect("number");
        assert_eq!(n, self.next[p], "publisher {p}'s messages out of order");
        self.next[p] += 1;
    }

    fn total(&self) -> usize {
        self.next.iter().sum()
    }
}

/// Waits for the publishers to finish and the subscriber to have every message,
/// and checks that no one was cut as a slow consumer.
async fn assert_all_delivered(
    server: &RunningServer,
    publishers: Vec<tokio::task::JoinHandle<()>>,
    subscriber: tokio::task::JoinHandle<Tally>,
    what: &str,
) {
    for publisher in publishers {
        tokio::time::timeout(DELIVERED_WITHIN, publisher)
            .await
            .expect("publishers finish")
            .expect("publisher task");
    }
    let tally = tokio::time::timeout(DELIVERED_WITHIN, subscriber)
        .await
        .expect("every message delivered")
        .expect("subscriber task");
    assert_eq!(tally.total(), PUBLISHERS * PER_PUBLISHER, "{what}");
    let metrics = server.metrics.snapshot();
    assert_eq!(metrics.slow_consumers, 0, "{what}: {metrics:?}");
}

/// Messages the server may still take from the publishers after the first stall while
/// the subscriber reads nothing, storing off: what each publisher's task had already
/// read when it learned of the pressure (a read buffer or so). Without the pause the
/// publishers go on at full speed: 2,200-12,700 in the trial that set this bound,
/// against at most 1,105 with it.
const TAKEN_WHILE_HELD: u64 = 2_000;
/// How long the subscriber still reads nothing after the first stall: well inside the
/// 250 ms after which the server stops waiting for a subscriber that takes nothing.
const HELD: Duration = Duration::from_millis(100);

/// Waits until a publisher stalled (the subscriber, reading nothing, made its outbox
/// press; without flow control this never comes, it is cut instead), then reads
/// nothing for `HELD` more and checks that the publishers were held back meanwhile:
/// without the pause, their messages fill the outbox past its limit (the subscriber is
/// cut) or, storing off, the server takes more than `TAKEN_WHILE_HELD`. Storing on, a
/// publisher learns of the pressure only once the sequencer routes one of its
/// messages, so a queue's worth may pass first and only the first check applies.
async fn first_stall(metrics: &canopy::metrics::Metrics, storing: bool) {
    let until = tokio::time::Instant::now() + WAIT;
    while metrics.snapshot().stalls == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "no publisher stalled while the subscriber read nothing: {:?}",
            metrics.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before = metrics.snapshot().msgs_in;
    tokio::time::sleep(HELD).await;
    let taken = metrics.snapshot().msgs_in - before;
    assert!(
        storing || taken <= TAKEN_WHILE_HELD,
        "the publishers were not held back: the server took {taken} messages in the \
         {HELD:?} after the first stall"
    );
}

// ---------------------------------------------------------------------------------
// Native

/// A subscriber on `fan.>` that reads its socket slowly and tallies the MSGs.
async fn slow_native_subscriber(
    addr: SocketAddr,
    metrics: std::sync::Arc<canopy::metrics::Metrics>,
    storing: bool,
) -> tokio::task::JoinHandle<Tally> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    // A small receive buffer, so the kernel does not absorb the flood for it.
    socket.set_recv_buffer_size(64 * 1024).expect("rcvbuf");
    let mut stream = socket.connect(addr).await.expect("connect");
    stream
        .write_all(b"CONNECT {\"verbose\":false}\r\nSUB fan.> 1\r\nPING\r\n")
        .await
        .expect("subscribe");
    let mut buf = BytesMut::new();
    let pong = loop {
        if let Some(at) = buf.windows(6).position(|w| w == b"PONG\r\n") {
            break at;
        }
        tokio::time::timeout(WAIT, stream.read_buf(&mut buf))
            .await
            .expect("PONG")
            .expect("read");
    };
    // INFO and PONG, and nothing else yet.
    let _ = buf.split_to(pong + 6);
    tokio::spawn(async move {
        first_stall(&metrics, storing).await;
        let mut tally = Tally::new();
        let total = PUBLISHERS * PER_PUBLISHER;
        while tally.total() < total {
            let mut chunk = [0u8; READ_CHUNK];
            let n = tokio::time::timeout(DELIVERED_WITHIN, stream.read(&mut chunk))
                .await
                .expect("the messages keep coming")
                .expect("read");
            assert!(
                n > 0,
                "cut off after {} messages: {:?}",
                tally.total(),
                String::from_utf8_lossy(&buf[buf.len().saturating_sub(200)..])
            );
            buf.extend_from_slice(&chunk[..n]);
            while let Some(payload) = next_msg(&mut buf, &metrics) {
                tally.take(&payload);
            }
        }
        tally
    })
}

/// Takes one whole `MSG subject sid len` frame off `buf`, skipping PINGs (answered
/// by no one: the test ends before the server's ping interval).
fn next_msg(buf: &mut BytesMut, metrics: &canopy::metrics::Metrics) -> Option<Bytes> {
    loop {
        let end = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(&buf[..end]).into_owned();
        if !line.starts_with("MSG ") {
            assert!(
                line == "PING" || line == "PONG",
                "unexpected line from the server: {line:?}; {:?}",
                metrics.snapshot()
            );
            let _ = buf.split_to(end + 2);
            continue;
        }
        let len: usize = line
            .rsplit(' ')
            .next()
            .and_then(|l| l.parse().ok())
            .expect("MSG length");
        if buf.len() < end + 2 + len + 2 {
            return None;
        }
        let _ = buf.split_to(end + 2);
        let payload = buf.split_to(len).freeze();
        let _ = buf.split_to(2);
        return Some(payload);
    }
}

async fn native_fan_in(storing: bool) {
    let server = start(config(storing)).await;
    let subscriber = slow_native_subscriber(
        server.native_addr,
        std::sync::Arc::clone(&server.metrics),
        storing,
    )
    .await;
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let client = async_nats::connect(server.native_url())
            .await
            .expect("connect");
        publishers.push(tokio::spawn(async move {
            for n in 0..PER_PUBLISHER {
                client
                    .publish(format!("fan.p{p}.s{}", n % 100), payload(p, n))
                    .await
                    .expect("publish");
            }
            client.flush().await.expect("flush");
        }));
    }
    let what = if storing { "storing on" } else { "storing off" };
    assert_all_delivered(&server, publishers, subscriber, what).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_native_publishers_wait_for_a_slow_subscriber_and_lose_nothing_storing_off() {
    native_fan_in(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_native_publishers_wait_for_a_slow_subscriber_and_lose_nothing_storing_on() {
    native_fan_in(true).await;
}

// ---------------------------------------------------------------------------------
// MQTT

mod mqtt {
    use super::*;
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

    fn options(addr: SocketAddr, id: &str) -> MqttOptions {
        let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        options.set_keep_alive(Duration::from_secs(60));
        options
    }

    /// Waits for the CONNACK, then hands the event loop back.
    async fn connected(eventloop: &mut rumqttc::EventLoop) {
        loop {
            let event = tokio::time::timeout(WAIT, eventloop.poll())
                .await
                .expect("CONNACK in time")
                .expect("connect");
            if matches!(event, Event::Incoming(Packet::ConnAck(_))) {
                return;
            }
        }
    }

    async fn fan_in(storing: bool, qos: QoS) {
        let what = format!("storing {}, {qos:?}", if storing { "on" } else { "off" });
        let server = start(config(storing)).await;
        let addr = mqtt_addr(&server);

        let (subscriber, mut sub_loop) = AsyncClient::new(options(addr, "slow-sub"), 64);
        connected(&mut sub_loop).await;
        subscriber.subscribe("fan/#", qos).await.expect("subscribe");
        loop {
            let event = tokio::time::timeout(WAIT, sub_loop.poll())
                .await
                .expect("SUBACK in time")
                .expect("subscribed");
            if matches!(event, Event::Incoming(Packet::SubAck(_))) {
                break;
            }
        }
        // rumqttc reads the socket only when polled (and acks QoS 1 deliveries as
        // it does).
        let metrics = std::sync::Arc::clone(&server.metrics);
        let reader = tokio::spawn(async move {
            first_stall(&metrics, storing).await;
            let mut tally = Tally::new();
            while tally.total() < PUBLISHERS * PER_PUBLISHER {
                let event = tokio::time::timeout(DELIVERED_WITHIN, sub_loop.poll())
                    .await
                    .expect("the messages keep coming");
                match event {
                    Ok(Event::Incoming(Packet::Publish(publish))) => tally.take(&publish.payload),
                    Ok(_) => {}
                    Err(error) => panic!(
                        "cut off after {} messages: {error}; {:?}",
                        tally.total(),
                        metrics.snapshot()
                    ),
                }
            }
            drop(subscriber);
            tally
        });

        let mut publishers = Vec::new();
        for p in 0..PUBLISHERS {
            let (client, mut eventloop) = AsyncClient::new(options(addr, &format!("pub-{p}")), 256);
            connected(&mut eventloop).await;
            publishers.push(tokio::spawn(async move {
                let sending = tokio::spawn(async move {
                    for n in 0..PER_PUBLISHER {
                        client
                            .publish(format!("fan/p{p}/s{}", n % 100), qos, false, payload(p, n))
                            .await
                            .expect("publish");
                    }
                    client
                });
                // Drive the connection until every publish went out (and, at QoS 1,
                // was acked).
                let mut acked = 0;
                let mut sent = 0;
                while acked < PER_PUBLISHER {
                    match eventloop.poll().await.expect("publisher connection") {
                        Event::Outgoing(rumqttc::Outgoing::Publish(_)) => {
                            sent += 1;
                            if qos == QoS::AtMostOnce {
                                acked = sent;
                            }
                        }
                        Event::Incoming(Packet::PubAck(_)) => acked += 1,
                        _ => {}
                    }
                }
                let client = sending.await.expect("sending task");
                client.disconnect().await.expect("disconnect");
                // The DISCONNECT goes out, after every PUBLISH before it.
                while eventloop.poll().await.is_ok() {}
            }));
        }
        assert_all_delivered(&server, publishers, reader, &what).await;
        server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_mqtt_publishers_wait_for_a_slow_subscriber_at_qos_0_storing_off() {
        fan_in(false, QoS::AtMostOnce).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_mqtt_publishers_wait_for_a_slow_subscriber_at_qos_0_storing_on() {
        fan_in(true, QoS::AtMostOnce).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_mqtt_publishers_wait_for_a_slow_subscriber_at_qos_1_storing_off() {
        fan_in(false, QoS::AtLeastOnce).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_mqtt_publishers_wait_for_a_slow_subscriber_at_qos_1_storing_on() {
        fan_in(true, QoS::AtLeastOnce).await;
    }
}

// ---------------------------------------------------------------------------------
// /ws

mod ws {
    use super::*;
    use base64::Engine;
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    /// Publisher `p`'s message `n` as a `/ws` `pub`, on the native test's subjects.
    /// As `data_b64`: inline `data` must be JSON, and a JSON string would reach the
    /// native subscriber with its quotes, which the tally cannot read.
    fn pub_request(p: usize, n: usize) -> Message {
        let data = base64::engine::general_purpose::STANDARD.encode(payload(p, n));
        Message::text(format!(
            r#"{{"op":"pub","subject":"fan.p{p}.s{}","data_b64":"{data}"}}"#,
            n % 100
        ))
    }

    /// Sends publisher `p`'s messages as fast as the socket takes them, and returns
    /// once every one was answered `ok`: taken, not merely written.
    async fn publish_all(http: SocketAddr, p: usize) {
        let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{http}/ws"))
            .await
            .expect("open /ws");
        let (mut sink, mut answers) = socket.split();
        // The answers are read meanwhile: the server writes them between reads, and
        // a publisher that left them unread would block those writes and be closed
        // at the write deadline, not held back by the subscriber.
        let answered = tokio::spawn(async move {
            let mut oks = 0;
            while oks < PER_PUBLISHER {
                let message = answers
                    .next()
                    .await
                    .unwrap_or_else(|| panic!("publisher {p}: /ws closed after {oks} answers"))
                    .expect("answer");
                let Message::Text(text) = message else {
                    continue;
                };
                let answer: serde_json::Value =
                    serde_json::from_str(text.as_str()).expect("JSON answer");
                assert_eq!(answer["op"], "ok", "publisher {p}: {answer}");
                oks += 1;
            }
            answers
        });
        for n in 0..PER_PUBLISHER {
            sink.feed(pub_request(p, n)).await.expect("publish");
        }
        sink.flush().await.expect("flush");
        let answers = answered.await.expect("answers task");
        let mut socket = sink.reunite(answers).expect("one socket");
        socket.close(None).await.expect("close");
    }

    async fn fan_in(storing: bool) {
        let server = start(config(storing)).await;
        let http = server.http_addr.expect("http on");
        let subscriber = slow_native_subscriber(
            server.native_addr,
            std::sync::Arc::clone(&server.metrics),
            storing,
        )
        .await;
        let publishers = (0..PUBLISHERS)
            .map(|p| tokio::spawn(publish_all(http, p)))
            .collect();
        let what = if storing { "storing on" } else { "storing off" };
        assert_all_delivered(&server, publishers, subscriber, what).await;
        server.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_ws_publishers_wait_for_a_slow_subscriber_and_lose_nothing_storing_off() {
        fan_in(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_ws_publishers_wait_for_a_slow_subscriber_and_lose_nothing_storing_on() {
        fan_in(true).await;
    }
}
