//! async-nats, unmodified, against Canopy: everything of core NATS.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::common::{WAIT, start, start_default, test_config};

async fn next(sub: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("a message within the wait")
        .expect("subscription open")
}

/// Asserts nothing more arrives: a PING round trip on the publisher's connection
/// has gone through the server after the publishes.
async fn assert_quiet(sub: &mut async_nats::Subscriber) {
    let extra = tokio::time::timeout(Duration::from_millis(200), sub.next()).await;
    assert!(
        extra.is_err(),
        "unexpected message: {:?}",
        extra.ok().flatten()
    );
}

#[tokio::test]
async fn wildcards_follow_nats_rules() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut one = client.subscribe("devices.*.temp").await.expect("sub");
    let mut rest = client.subscribe("devices.>").await.expect("sub");
    client.flush().await.expect("flush");
    for subject in [
        "devices.42.temp",
        "devices.42.hum",
        "devices",
        "devices.1.temp.x",
    ] {
        client
            .publish(subject, Bytes::from(subject))
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    assert_eq!(next(&mut one).await.subject.as_str(), "devices.42.temp");
    let got: Vec<String> = [
        next(&mut rest).await,
        next(&mut rest).await,
        next(&mut rest).await,
    ]
    .iter()
    .map(|m| m.subject.to_string())
    .collect();
    assert_eq!(
        got,
        ["devices.42.temp", "devices.42.hum", "devices.1.temp.x"]
    );
    assert_quiet(&mut one).await;
    assert_quiet(&mut rest).await;
    server.stop().await;
}

#[tokio::test]
async fn headers_round_trip() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut sub = client.subscribe("h.>").await.expect("sub");
    client.flush().await.expect("flush");
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Canopy-Test", "one");
    headers.append("Multi", "a");
    headers.append("Multi", "b");
    client
        .publish_with_headers("h.1", headers, Bytes::from_static(b"payload"))
        .await
        .expect("publish");
    let msg = next(&mut sub).await;
    let got = msg.headers.expect("headers");
    assert_eq!(got.get("Canopy-Test").map(|v| v.as_str()), Some("one"));
    let multi: Vec<&str> = got.get_all("Multi").map(|v| v.as_str()).collect();
    assert_eq!(multi, ["a", "b"]);
    assert_eq!(&msg.payload[..], b"payload");
    server.stop().await;
}

#[tokio::test]
async fn queue_groups_deliver_each_message_to_one_member() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut a = client
        .queue_subscribe("work.*", "workers".into())
        .await
        .expect("sub");
    let mut b = client
        .queue_subscribe("work.>", "workers".into())
        .await
        .expect("sub");
    let mut watcher = client.subscribe("work.*").await.expect("sub");
    client.flush().await.expect("flush");
    let total = 200;
    for i in 0..total {
        client
            .publish(format!("work.{i}"), Bytes::new())
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    for _ in 0..total {
        next(&mut watcher).await;
    }
    let (mut got_a, mut got_b) = (0, 0);
    while got_a + got_b < total {
        tokio::select! {
            Some(_) = a.next() => got_a += 1,
            Some(_) = b.next() => got_b += 1,
            _ = tokio::time::sleep(WAIT) => panic!("only {} of {total} delivered", got_a + got_b),
        }
    }
    assert!(
        got_a > 0 && got_b > 0,
        "both members work: {got_a} / {got_b}"
    );
    assert_quiet(&mut a).await;
    assert_quiet(&mut b).await;
    server.stop().await;
}

#[tokio::test]
async fn unsubscribe_after_delivers_exactly_that_many() {
    let server = start_default().await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut sub = client.subscribe("count").await.expect("sub");
    sub.unsubscribe_after(3).await.expect("unsub");
    client.flush().await.expect("flush");
    for i in 0..10 {
        client
            .publish("count", Bytes::from(i.to_string()))
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    let mut got = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        got.push(String::from_utf8_lossy(&msg.payload).into_owned());
    }
    assert_eq!(got, ["0", "1", "2"]);
    server.stop().await;
}

#[tokio::test]
async fn request_reply_and_no_responders() {
    let server = start_default().await;
    let service = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut requests = service.subscribe("svc.echo").await.expect("sub");
    service.flush().await.expect("flush");
    let responder = tokio::spawn(async move {
        while let Some(req) = requests.next().await {
            if let Some(reply) = req.reply {
                let mut answer = b"echo: ".to_vec();
                answer.extend_from_slice(&req.payload);
                service
                    .publish(reply, Bytes::from(answer))
                    .await
                    .expect("reply");
            }
        }
    });
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    for i in 0..20 {
        let answer = client
            .request("svc.echo", Bytes::from(format!("{i}")))
            .await
            .expect("answered");
        assert_eq!(answer.payload, Bytes::from(format!("echo: {i}")));
    }
    // A request nobody receives gets NATS's no-responders status (on a stored subject
    // too, unless a declared stream holds it: `jetstream_publish.rs`).
    let error = client
        .request("_INBOX.nobody.home", Bytes::new())
        .await
        .expect_err("nobody answers");
    assert_eq!(
        error.kind(),
        async_nats::client::RequestErrorKind::NoResponders,
        "{error}"
    );
    responder.abort();
    server.stop().await;
}

#[tokio::test]
async fn no_echo_hides_a_clients_own_messages_from_itself() {
    let server = start_default().await;
    let quiet = async_nats::ConnectOptions::new()
        .no_echo()
        .connect(server.native_url())
        .await
        .expect("connect");
    let other = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut own = quiet.subscribe("echo.test").await.expect("sub");
    let mut theirs = other.subscribe("echo.test").await.expect("sub");
    quiet.flush().await.expect("flush");
    other.flush().await.expect("flush");
    quiet
        .publish("echo.test", Bytes::from_static(b"mine"))
        .await
        .expect("publish");
    quiet.flush().await.expect("flush");
    assert_eq!(&next(&mut theirs).await.payload[..], b"mine");
    other
        .publish("echo.test", Bytes::from_static(b"yours"))
        .await
        .expect("publish");
    assert_eq!(&next(&mut own).await.payload[..], b"yours");
    assert_quiet(&mut own).await;
    server.stop().await;
}

#[tokio::test]
async fn max_payload_is_announced_and_enforced_by_the_client() {
    let mut config = test_config();
    config.native.max_payload = 1000;
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    assert_eq!(client.server_info().max_payload, 1000);
    let error = client
        .publish("big", Bytes::from(vec![0u8; 1001]))
        .await
        .expect_err("too big");
    assert_eq!(
        error.kind(),
        async_nats::client::PublishErrorKind::MaxPayloadExceeded
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_cut_off_and_holds_its_publisher_back_briefly() {
    let mut config = test_config();
    config.native.max_payload = 16 * 1024;
    config.native.max_pending_bytes = 8 * 1024 * 1024;
    let server = start(config).await;

    // A subscriber that never reads its socket.
    // A small receive buffer, so the kernel cannot absorb the flood for it.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let mut stuck = socket.connect(server.native_addr).await.expect("connect");
    stuck
        .write_all(b"CONNECT {}\r\nSUB flood 1\r\nPING\r\n")
        .await
        .expect("write");
    let fast = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let mut fast_sub = fast.subscribe("flood").await.expect("sub");
    fast.flush().await.expect("flush");

    let publisher = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let total = 2500; // 25 MB: far past the socket buffers and the 8 MiB outbox.
    let payload = Bytes::from(vec![b'x'; 10 * 1024]);
    let receiver = tokio::spawn(async move {
        for _ in 0..total {
            next(&mut fast_sub).await;
        }
    });
    for _ in 0..total {
        publisher
            .publish("flood", payload.clone())
            .await
            .expect("publish");
    }
    tokio::time::timeout(WAIT, publisher.flush())
        .await
        .expect("the publisher is held back only while the stuck subscriber's outbox fills")
        .expect("flush");
    let received = tokio::time::timeout(WAIT, receiver).await;
    assert!(
        matches!(received, Ok(Ok(()))),
        "the fast subscriber got everything; counters: {:?}",
        server.metrics.snapshot()
    );

    // The stuck subscriber is already counted; once it reads, it gets what was
    // written before, then the error, then the end of the stream.
    assert_eq!(server.metrics.snapshot().slow_consumers, 1);
    // Its publisher waited for it first (flow control), only until its socket was
    // seen taking nothing (`STALL_IDLE`).
    assert!(server.metrics.snapshot().stalls > 0);
    let mut seen = Vec::new();
    tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_to_end(&mut stuck, &mut seen),
    )
    .await
    .expect("closed by the server")
    .ok();
    let tail = String::from_utf8_lossy(&seen[seen.len().saturating_sub(64)..]).into_owned();
    assert!(tail.ends_with("-ERR 'Slow Consumer'\r\n"), "tail: {tail:?}");
    assert_eq!(server.metrics.snapshot().slow_consumers, 1);
    server.stop().await;
}
