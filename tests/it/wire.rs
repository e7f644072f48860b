//! Raw protocol bytes against a real listener: the exact texts NATS clients depend on.

use crate::common::{Raw, start, start_default, test_config};

#[tokio::test]
async fn info_announces_what_clients_need() {
    let server = start_default().await;
    let stream = tokio::net::TcpStream::connect(server.native_addr)
        .await
        .expect("connect");
    let mut reader = tokio::io::BufReader::new(stream);
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line)
        .await
        .expect("read");
    let json = line.strip_prefix("INFO ").expect("INFO first").trim_end();
    let info: serde_json::Value = serde_json::from_str(json).expect("INFO is JSON");
    assert_eq!(info["max_payload"], 1024 * 1024);
    assert_eq!(info["headers"], true);
    assert_eq!(info["proto"], 1);
    assert!(
        info["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("2."))
    );
    assert!(info["server_id"].as_str().is_some_and(|v| !v.is_empty()));
    assert!(info["client_id"].as_u64().is_some());
    server.stop().await;
}

#[tokio::test]
async fn verbose_clients_get_ok_after_each_operation() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {\"verbose\":true}\r\n").await;
    assert_eq!(raw.line().await, "+OK");
    raw.send("sub foo.* 7\r\n").await;
    assert_eq!(raw.line().await, "+OK");
    raw.send("PUB foo.bar reply.to 5\r\nhello\r\n").await;
    // As nats-server does: the +OK, then the delivery to our own subscription.
    assert_eq!(raw.line().await, "+OK");
    assert_eq!(raw.line().await, "MSG foo.bar 7 reply.to 5");
    assert_eq!(raw.line().await, "hello");
    raw.send("UNSUB 7\r\n").await;
    assert_eq!(raw.line().await, "+OK");
    // The same on a subject that is not stored (routed at once, not by the
    // sequencer): inboxes are left out of the default store policies.
    raw.send("SUB _INBOX.me.* 8\r\n").await;
    assert_eq!(raw.line().await, "+OK");
    raw.send("PUB _INBOX.me.x 2\r\nhi\r\n").await;
    assert_eq!(raw.line().await, "+OK");
    assert_eq!(raw.line().await, "MSG _INBOX.me.x 8 2");
    assert_eq!(raw.line().await, "hi");
    server.stop().await;
}

#[tokio::test]
async fn headers_are_delivered_byte_exact_as_hmsg() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {\"headers\":true}\r\nSUB h.> 1\r\n")
        .await;
    let headers = "NATS/1.0\r\nA: 1\r\nA: 2\r\nb-key: x y\r\n\r\n";
    let payload = "body";
    raw.send(&format!(
        "HPUB h.x {} {}\r\n{headers}{payload}\r\n",
        headers.len(),
        headers.len() + payload.len()
    ))
    .await;
    assert_eq!(
        raw.line().await,
        format!(
            "HMSG h.x 1 {} {}",
            headers.len(),
            headers.len() + payload.len()
        )
    );
    let body = raw.bytes(headers.len() + payload.len() + 2).await;
    assert_eq!(body, format!("{headers}{payload}\r\n").into_bytes());
    server.stop().await;
}

#[tokio::test]
async fn clients_without_headers_get_plain_msg() {
    let server = start_default().await;
    let mut sub = Raw::connect(server.native_addr).await;
    sub.send("CONNECT {}\r\nSUB h.x 1\r\n").await;
    sub.ping_pong().await;
    let mut publisher = Raw::connect(server.native_addr).await;
    publisher
        .send("CONNECT {\"headers\":true}\r\nHPUB h.x 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")
        .await;
    assert_eq!(sub.line().await, "MSG h.x 1 2");
    assert_eq!(sub.line().await, "hi");
    server.stop().await;
}

#[tokio::test]
async fn invalid_subjects_are_refused_and_the_connection_stays_open() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\n").await;
    raw.send("SUB a..b 1\r\n").await;
    assert_eq!(raw.line().await, "-ERR 'Invalid Subject'");
    raw.send("SUB a.>.b 2\r\n").await;
    assert_eq!(raw.line().await, "-ERR 'Invalid Subject'");
    raw.send("PUB a.* 1\r\nx\r\n").await;
    assert_eq!(raw.line().await, "-ERR 'Invalid Publish Subject'");
    raw.send("PUB .a 1\r\nx\r\n").await;
    assert_eq!(raw.line().await, "-ERR 'Invalid Publish Subject'");
    raw.ping_pong().await;
    server.stop().await;
}

#[tokio::test]
async fn protocol_violations_get_the_nats_error_and_close() {
    let server = start_default().await;
    let cases = [
        ("FOO bar\r\n", "-ERR 'Unknown Protocol Operation'"),
        ("PUB a 2000000\r\n", "-ERR 'Maximum Payload Violation'"),
        ("PUB a 3\r\nabcdef\r\n", "-ERR 'Parser Error'"),
    ];
    for (input, expected) in cases {
        let mut raw = Raw::connect(server.native_addr).await;
        raw.send("CONNECT {}\r\n").await;
        raw.send(input).await;
        assert_eq!(raw.line().await, expected, "input {input:?}");
        raw.expect_eof().await;
    }
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send(&format!("SUB {} 1\r\n", "a".repeat(5000))).await;
    assert_eq!(raw.line().await, "-ERR 'Maximum Control Line Exceeded'");
    raw.expect_eof().await;
    server.stop().await;
}

#[tokio::test]
async fn denied_subscriptions_and_publishes_keep_the_connection() {
    let mut config = test_config();
    config.authz.deny_subscribe = vec!["secret.>".into()];
    config.authz.deny_publish = vec!["audit.>".into()];
    let server = start(config).await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\nSUB secret.plans 1\r\n").await;
    assert_eq!(
        raw.line().await,
        "-ERR 'Permissions Violation for Subscription to \"secret.plans\"'"
    );
    raw.send("PUB audit.log 1\r\nx\r\n").await;
    assert_eq!(
        raw.line().await,
        "-ERR 'Permissions Violation for Publish to \"audit.log\"'"
    );
    // A broad wildcard is allowed, but never sees the denied subjects.
    raw.send("SUB > 2\r\nPUB secret.plans 1\r\nx\r\nPUB open.plans 1\r\ny\r\n")
        .await;
    assert_eq!(raw.line().await, "MSG open.plans 2 1");
    assert_eq!(raw.line().await, "y");
    raw.ping_pong().await;
    server.stop().await;
}

#[tokio::test]
async fn unsub_with_a_maximum_stops_after_that_many() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\nSUB m 9\r\nUNSUB 9 2\r\n").await;
    for i in 0..4 {
        raw.send(&format!("PUB m 1\r\n{i}\r\n")).await;
    }
    raw.ping_pong_after_msgs(&["MSG m 9 1", "0", "MSG m 9 1", "1"])
        .await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_stops_answering_pings_is_dropped() {
    let mut config = test_config();
    config.native.ping_interval_secs = 1;
    config.native.max_pings_outstanding = 2;
    let server = start(config).await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\n").await;
    assert_eq!(raw.line().await, "PING");
    assert_eq!(raw.line().await, "PING");
    assert_eq!(raw.line().await, "-ERR 'Stale Connection'");
    raw.expect_eof().await;
    assert_eq!(server.metrics.snapshot().stale_connections, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_answers_pings_stays() {
    let mut config = test_config();
    config.native.ping_interval_secs = 1;
    let server = start(config).await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\n").await;
    for _ in 0..3 {
        assert_eq!(raw.line().await, "PING");
        raw.send("PONG\r\n").await;
    }
    raw.ping_pong().await;
    server.stop().await;
}

#[tokio::test]
async fn without_authentication_only_loopback_is_allowed() {
    let mut config = test_config();
    config.native.listen = "0.0.0.0:0".parse().expect("addr");
    let error = canopy::server::Server::bind(config.clone())
        .await
        .err()
        .expect("refused");
    assert!(error.to_string().contains("--allow-anonymous"), "{error}");
    config.server.allow_anonymous = true;
    let server = canopy::server::Server::bind(config)
        .await
        .expect("allowed")
        .spawn();
    server.stop().await;
}

#[tokio::test]
async fn connections_past_the_limit_are_refused() {
    let mut config = test_config();
    config.native.max_connections = 1;
    let server = start(config).await;
    let mut first = Raw::connect(server.native_addr).await;
    first.ping_pong().await;
    let mut second = Raw::connect(server.native_addr).await;
    assert_eq!(second.line().await, "-ERR 'maximum connections exceeded'");
    second.expect_eof().await;
    first.ping_pong().await;
    server.stop().await;
}

#[tokio::test]
async fn unsub_max_counts_messages_already_delivered() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\nSUB m 1\r\n").await;
    raw.send("PUB m 1\r\na\r\nPUB m 1\r\nb\r\nPUB m 1\r\nc\r\n")
        .await;
    raw.send("UNSUB 1 2\r\nPUB m 1\r\nd\r\n").await;
    raw.ping_pong_after_msgs(&["MSG m 1 1", "a", "MSG m 1 1", "b", "MSG m 1 1", "c"])
        .await;
    server.stop().await;
}

#[tokio::test]
async fn a_sid_can_be_reused_after_its_auto_unsubscribe() {
    let mut config = test_config();
    config.native.max_subscriptions = 2;
    let server = start(config).await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {}\r\n").await;
    // Old-style requests: each a subscription that ends after one message.
    for i in 0..5 {
        raw.send(&format!(
            "SUB inbox.{i} 1\r\nUNSUB 1 1\r\nPUB inbox.{i} 1\r\n{i}\r\n"
        ))
        .await;
        raw.ping_pong_after_msgs(&[&format!("MSG inbox.{i} 1 1"), &i.to_string()])
            .await;
    }
    server.stop().await;
}

#[tokio::test]
async fn no_responders_without_headers_is_refused() {
    let server = start_default().await;
    let mut raw = Raw::connect(server.native_addr).await;
    raw.send("CONNECT {\"no_responders\":true}\r\n").await;
    assert_eq!(
        raw.line().await,
        "-ERR 'no responders requires headers support'"
    );
    raw.expect_eof().await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_publishing_to_itself_faster_than_it_reads_is_not_deadlocked() {
    let server = start_default().await;
    let mut raw = Raw::connect_small_buffer(server.native_addr).await;
    raw.send("CONNECT {}\r\nSUB self 1\r\n").await;
    // 48 MB sent without reading a byte: more than the socket buffers of both
    // directions hold, so the server must keep reading while its writes are blocked.
    let payload = "x".repeat(16 * 1024);
    let frame = format!("PUB self {}\r\n{payload}\r\n", payload.len());
    let batch = frame.repeat(64);
    let count = 3072;
    let writer = async {
        for _ in 0..count / 64 {
            raw.send(&batch).await;
        }
    };
    tokio::time::timeout(crate::common::WAIT, writer)
        .await
        .expect("the server keeps reading");
    for _ in 0..count {
        assert_eq!(raw.line().await, format!("MSG self 1 {}", payload.len()));
        assert_eq!(raw.bytes(payload.len() + 2).await.len(), payload.len() + 2);
    }
    raw.ping_pong().await;
    assert_eq!(server.metrics.snapshot().slow_consumers, 0);
    server.stop().await;
}
