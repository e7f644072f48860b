//! MQTT and native clients on the same subjects and key streams: rumqttc (v4 and v5)
//! on one side, async-nats on the other, a real server in between.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use rumqttc::v5::mqttbytes::QoS as QoS5;
use rumqttc::v5::mqttbytes::v5::{Packet as Packet5, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient as Client5, Event as Event5, EventLoop as EventLoop5};

use crate::common::{
    file_config, header, header_of, replay_subject, start, start_default, test_config,
};

const WAIT: Duration = Duration::from_secs(10);

fn v5_options(id: &str, server: &canopy::server::RunningServer) -> rumqttc::v5::MqttOptions {
    let addr = server.mqtt_addr.expect("mqtt listener on");
    let mut options = rumqttc::v5::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(30));
    options
}

/// Polls the event loop until `want` picks an event out, within [`WAIT`].
pub(crate) async fn next_v5<T>(
    events: &mut EventLoop5,
    mut want: impl FnMut(&Packet5) -> Option<T>,
) -> T {
    tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await {
                Ok(Event5::Incoming(packet)) => {
                    if let Some(found) = want(&packet) {
                        return found;
                    }
                }
                Ok(_) => {}
                Err(error) => panic!("mqtt v5 connection failed: {error}"),
            }
        }
    })
    .await
    .expect("the awaited mqtt packet arrives")
}

pub(crate) async fn connected_v5(
    id: &str,
    server: &canopy::server::RunningServer,
) -> (Client5, EventLoop5) {
    let (client, mut events) = Client5::new(v5_options(id, server), 64);
    next_v5(&mut events, |p| {
        matches!(p, Packet5::ConnAck(_)).then_some(())
    })
    .await;
    (client, events)
}

async fn subscribed_v5(client: &Client5, events: &mut EventLoop5, filter: &str) {
    client
        .subscribe(filter, QoS5::AtLeastOnce)
        .await
        .expect("subscribe queued");
    next_v5(events, |p| matches!(p, Packet5::SubAck(_)).then_some(())).await;
}

#[tokio::test]
async fn an_mqtt_request_is_answered_by_a_native_service_with_its_correlation_data() {
    let server = start_default().await;
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let mut requests = nats.subscribe("svc.echo").await.expect("sub");
    nats.flush().await.expect("flush");
    let responder = nats.clone();
    let service = tokio::spawn(async move {
        // A plain NATS service: it answers the reply subject and copies no header.
        let request = requests.next().await.expect("a request");
        let reply = request.reply.clone().expect("a reply subject");
        let mut answer = b"echo:".to_vec();
        answer.extend_from_slice(&request.payload);
        responder
            .publish(reply, answer.into())
            .await
            .expect("answer");
        responder.flush().await.expect("flush");
        request
    });

    let (client, mut events) = connected_v5("requester", &server).await;
    subscribed_v5(&client, &mut events, "replies/requester").await;
    let properties = PublishProperties {
        response_topic: Some("replies/requester".into()),
        correlation_data: Some(Bytes::from_static(b"req-17")),
        ..PublishProperties::default()
    };
    client
        .publish_with_properties("svc/echo", QoS5::AtLeastOnce, false, "ping", properties)
        .await
        .expect("request queued");
    let response = next_v5(&mut events, |p| match p {
        Packet5::Publish(publish) if &publish.topic[..] == b"replies/requester" => {
            Some(publish.clone())
        }
        _ => None,
    })
    .await;
    assert_eq!(&response.payload[..], b"echo:ping");
    let properties = response.properties.expect("v5 properties");
    assert_eq!(
        properties.correlation_data.as_deref(),
        Some(&b"req-17"[..]),
        "the correlation data comes back although the service did not copy it"
    );
    let request = service.await.expect("service ran");
    assert_eq!(&request.payload[..], b"ping");
    server.stop().await;
}

#[tokio::test]
async fn user_properties_and_headers_cross_both_ways() {
    let server = start_default().await;
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let mut native_sub = nats.subscribe("cross.*.in").await.expect("sub");
    nats.flush().await.expect("flush");
    let (client, mut events) = connected_v5("props", &server).await;
    subscribed_v5(&client, &mut events, "cross/+/out").await;

    let properties = PublishProperties {
        user_properties: vec![
            ("site".into(), "north".into()),
            ("site".into(), "south".into()),
        ],
        content_type: Some("application/json".into()),
        ..PublishProperties::default()
    };
    client
        .publish_with_properties(
            "cross/1/in",
            QoS5::AtLeastOnce,
            false,
            "{\"t\":1}",
            properties,
        )
        .await
        .expect("publish queued");
    // The event loop sends it; the PUBACK says it was stored and routed.
    next_v5(&mut events, |p| {
        matches!(p, Packet5::PubAck(_)).then_some(())
    })
    .await;
    let received = tokio::time::timeout(WAIT, native_sub.next())
        .await
        .expect("in time")
        .expect("a message");
    assert_eq!(received.subject.as_str(), "cross.1.in");
    assert_eq!(&received.payload[..], b"{\"t\":1}");
    let headers = received.headers.as_ref().expect("headers");
    let sites: Vec<&str> = headers.get_all("site").map(|v| v.as_str()).collect();
    assert_eq!(
        sites,
        ["north", "south"],
        "repeated user properties keep their order"
    );
    assert_eq!(
        header_of(&received, "Content-Type"),
        Some("application/json")
    );

    let mut headers = header("Unit", "C");
    headers.insert("Canopy-Payload-Format", "utf-8");
    nats.publish_with_headers("cross.2.out", headers, "21.5".into())
        .await
        .expect("native publish");
    nats.flush().await.expect("flush");
    let publish = next_v5(&mut events, |p| match p {
        Packet5::Publish(publish) => Some(publish.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&publish.topic[..], b"cross/2/out");
    assert_eq!(&publish.payload[..], b"21.5");
    let properties = publish.properties.expect("properties");
    assert_eq!(
        properties.user_properties,
        vec![("Unit".to_owned(), "C".to_owned())]
    );
    assert_eq!(properties.payload_format_indicator, Some(1));
    server.stop().await;
}

#[tokio::test]
async fn a_stale_expected_version_is_refused_on_the_puback() {
    let server = start_default().await;
    let (client, mut events) = connected_v5("locker", &server).await;
    let expect = |version: &str| PublishProperties {
        user_properties: vec![("Canopy-Expected-Version".into(), version.into())],
        ..PublishProperties::default()
    };
    client
        .publish_with_properties("locks/door", QoS5::AtLeastOnce, false, "open", expect("0"))
        .await
        .expect("queued");
    let first = next_v5(&mut events, |p| match p {
        Packet5::PubAck(ack) => Some(ack.clone()),
        _ => None,
    })
    .await;
    assert_eq!(first.reason, PubAckReason::Success);
    client
        .publish_with_properties(
            "locks/door",
            QoS5::AtLeastOnce,
            false,
            "closed",
            expect("0"),
        )
        .await
        .expect("queued");
    let second = next_v5(&mut events, |p| match p {
        Packet5::PubAck(ack) => Some(ack.clone()),
        _ => None,
    })
    .await;
    assert_eq!(second.reason, PubAckReason::ImplementationSpecificError);
    let properties = second.properties.expect("a reason string");
    let why = properties.reason_string.expect("reason string");
    assert!(why.contains("is at version 1"), "{why}");
    assert!(
        properties
            .user_properties
            .contains(&("Canopy-Current-Version".to_owned(), "1".to_owned())),
        "{:?}",
        properties.user_properties
    );

    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let history = replay_subject(&nats, "locks.door").await;
    let payloads: Vec<String> = history.iter().map(|m| m.text()).collect();
    assert_eq!(payloads, ["open"], "the refused publish was not stored");
    server.stop().await;
}

#[tokio::test]
async fn retained_messages_live_in_the_stream_and_a_wildcard_finds_only_its_own() {
    let server = start_default().await;
    let (client, mut events) = connected_v5("retainer", &server).await;
    for (topic, payload) in [("ret/a/1", "a1"), ("ret/a/2", "a2"), ("ret/b/1", "b1")] {
        client
            .publish(topic, QoS5::AtLeastOnce, true, payload)
            .await
            .expect("queued");
        next_v5(&mut events, |p| {
            matches!(p, Packet5::PubAck(_)).then_some(())
        })
        .await;
    }
    // A later publish without RETAIN does not replace the retained one.
    client
        .publish("ret/a/1", QoS5::AtLeastOnce, false, "a1-live")
        .await
        .expect("queued");
    next_v5(&mut events, |p| {
        matches!(p, Packet5::PubAck(_)).then_some(())
    })
    .await;

    let (late, mut late_events) = connected_v5("late", &server).await;
    late.subscribe("ret/a/+", QoS5::AtLeastOnce)
        .await
        .expect("subscribe");
    let mut got = Vec::new();
    while got.len() < 2 {
        let publish = next_v5(&mut late_events, |p| match p {
            Packet5::Publish(publish) => Some(publish.clone()),
            _ => None,
        })
        .await;
        assert!(publish.retain, "retained messages carry RETAIN");
        got.push((
            String::from_utf8_lossy(&publish.topic).into_owned(),
            String::from_utf8_lossy(&publish.payload).into_owned(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("ret/a/1".to_owned(), "a1".to_owned()),
            ("ret/a/2".to_owned(), "a2".to_owned())
        ]
    );
    // Both publishes to ret/a/1 are in its stream, versions 1 and 2.
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let history = replay_subject(&nats, "ret.a.1").await;
    let payloads: Vec<String> = history.iter().map(|m| m.text()).collect();
    assert_eq!(payloads, ["a1", "a1-live"]);
    server.stop().await;
}

#[tokio::test]
async fn a_persistent_session_gets_what_was_published_while_the_server_restarted() {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(file_config(folder.path())).await;
    let addr = server.mqtt_addr.expect("mqtt");
    let mut options =
        rumqttc::MqttOptions::new("durable-device", addr.ip().to_string(), addr.port());
    options.set_clean_session(false);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = rumqttc::AsyncClient::new(options, 64);
    next_v4(&mut events, |p| {
        matches!(p, rumqttc::Packet::ConnAck(_)).then_some(())
    })
    .await;
    client
        .subscribe("plant/+/alarm", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    next_v4(&mut events, |p| {
        matches!(p, rumqttc::Packet::SubAck(_)).then_some(())
    })
    .await;
    client.disconnect().await.expect("disconnect queued");
    let _ = tokio::time::timeout(WAIT, async { while events.poll().await.is_ok() {} }).await;
    server.stop().await;

    // While the device is away the server restarts, and a service raises alarms.
    let server = start(file_config(folder.path())).await;
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for i in 1..=3 {
        crate::common::publish_acked(&nats, &format!("plant.{i}.alarm"), format!("alarm {i}"))
            .await;
    }
    let addr = server.mqtt_addr.expect("mqtt");
    let mut options =
        rumqttc::MqttOptions::new("durable-device", addr.ip().to_string(), addr.port());
    options.set_clean_session(false);
    options.set_keep_alive(Duration::from_secs(30));
    let (_client, mut events) = rumqttc::AsyncClient::new(options, 64);
    let present = next_v4(&mut events, |p| match p {
        rumqttc::Packet::ConnAck(ack) => Some(ack.session_present),
        _ => None,
    })
    .await;
    assert!(present, "the session survived the restart");
    let mut got = Vec::new();
    while got.len() < 3 {
        let publish = next_v4(&mut events, |p| match p {
            rumqttc::Packet::Publish(publish) => Some(publish.clone()),
            _ => None,
        })
        .await;
        got.push(String::from_utf8_lossy(&publish.payload).into_owned());
    }
    assert_eq!(
        got,
        ["alarm 1", "alarm 2", "alarm 3"],
        "in order, once each"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_mqtt_publish_is_a_versioned_message_of_the_native_stream() {
    let server = start(test_config()).await;
    let addr = server.mqtt_addr.expect("mqtt");
    let options = rumqttc::MqttOptions::new("v4-device", addr.ip().to_string(), addr.port());
    let (client, mut events) = rumqttc::AsyncClient::new(options, 64);
    next_v4(&mut events, |p| {
        matches!(p, rumqttc::Packet::ConnAck(_)).then_some(())
    })
    .await;
    for reading in ["20.5", "21.0"] {
        client
            .publish("devices/9/temp", rumqttc::QoS::AtLeastOnce, false, reading)
            .await
            .expect("queued");
        next_v4(&mut events, |p| {
            matches!(p, rumqttc::Packet::PubAck(_)).then_some(())
        })
        .await;
    }
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    let history = replay_subject(&nats, "devices.9.temp").await;
    let versions: Vec<(u64, String)> = history.iter().map(|m| (m.version, m.text())).collect();
    assert_eq!(versions, [(1, "20.5".to_owned()), (2, "21.0".to_owned())]);
    server.stop().await;
}

async fn next_v4<T>(
    events: &mut rumqttc::EventLoop,
    mut want: impl FnMut(&rumqttc::Packet) -> Option<T>,
) -> T {
    tokio::time::timeout(WAIT, async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(packet)) => {
                    if let Some(found) = want(&packet) {
                        return found;
                    }
                }
                Ok(_) => {}
                Err(error) => panic!("mqtt v4 connection failed: {error}"),
            }
        }
    })
    .await
    .expect("the awaited mqtt packet arrives")
}

/// A raw MQTT 5 connection, for what no client library will send.
async fn raw_v5(
    server: &canopy::server::RunningServer,
    max_packet: Option<u32>,
) -> tokio::net::TcpStream {
    let properties = canopy_protocols::mqtt::Properties {
        maximum_packet_size: max_packet,
        ..canopy_protocols::mqtt::Properties::default()
    };
    raw_v5_with(server, properties).await
}

async fn raw_v5_with(
    server: &canopy::server::RunningServer,
    properties: canopy_protocols::mqtt::Properties,
) -> tokio::net::TcpStream {
    use canopy_protocols::mqtt::{Connect, Level, Packet, encode};
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(server.mqtt_addr.expect("mqtt"))
        .await
        .expect("connect");
    let connect = Connect {
        level: Level::V5,
        client_id: format!("raw-{}", fastrand::u32(..)),
        clean_start: true,
        keep_alive: 30,
        username: None,
        password: None,
        will: None,
        properties,
    };
    let mut out = bytes::BytesMut::new();
    encode(&Packet::Connect(Box::new(connect)), Level::V5, &mut out).expect("encode");
    stream.write_all(&out).await.expect("send CONNECT");
    let connack = read_packet(&mut stream).await.expect("CONNACK");
    assert!(
        matches!(connack, Packet::ConnAck(ref ack) if ack.code == 0),
        "{connack:?}"
    );
    stream
}

/// The next packet from the server, or `None` once it closed the connection.
async fn read_packet(stream: &mut tokio::net::TcpStream) -> Option<canopy_protocols::mqtt::Packet> {
    use canopy_protocols::mqtt::{Decoder, Level};
    use tokio::io::AsyncReadExt;
    let mut decoder = Decoder::with_level(Level::V5, 1 << 20);
    let mut buf = bytes::BytesMut::new();
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(packet) = decoder
                .decode(&mut buf)
                .expect("the server sends valid packets")
            {
                return Some(packet);
            }
            let mut chunk = [0u8; 1];
            // One byte at a time: nothing after this packet is taken from the socket.
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => buf.extend_from_slice(&chunk),
            }
        }
    })
    .await
    .expect("the server answers in time")
}

#[tokio::test]
async fn bad_packets_close_only_their_connection_with_the_reason() {
    use canopy_protocols::mqtt::{Packet, reason};
    use tokio::io::AsyncWriteExt;
    let mut config = test_config();
    config.mqtt.max_packet_size = 1024;
    let server = start(config).await;
    let (bystander, mut bystander_events) = connected_v5("bystander", &server).await;
    subscribed_v5(&bystander, &mut bystander_events, "still/here").await;

    // PUBLISH with QoS 3: malformed.
    let mut malformed = raw_v5(&server, None).await;
    malformed
        .write_all(&[0x36, 0x05, 0x00, 0x01, b'a', 0x00, 0x01])
        .await
        .expect("send");
    match read_packet(&mut malformed).await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, reason::MALFORMED_PACKET),
        other => panic!("expected DISCONNECT 0x81, got {other:?}"),
    }
    assert!(
        read_packet(&mut malformed).await.is_none(),
        "then the connection closes"
    );

    // A packet larger than the server's maximum: refused from its fixed header.
    let mut large = raw_v5(&server, None).await;
    large
        .write_all(&[0x30, 0xD0, 0x0F])
        .await
        .expect("send the header of a 2,000-byte PUBLISH");
    large.write_all(&[0u8; 600]).await.expect("send part of it");
    match read_packet(&mut large).await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, reason::PACKET_TOO_LARGE),
        other => panic!("expected DISCONNECT 0x95, got {other:?}"),
    }

    // A second CONNECT: a protocol error.
    let mut twice = raw_v5(&server, None).await;
    twice
        .write_all(&[
            0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x1E, 0x00, 0x00,
            0x00,
        ])
        .await
        .expect("send");
    match read_packet(&mut twice).await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, reason::PROTOCOL_ERROR),
        other => panic!("expected DISCONNECT 0x82, got {other:?}"),
    }

    // Everyone else goes on.
    bystander
        .publish("still/here", QoS5::AtLeastOnce, false, "yes")
        .await
        .expect("queued");
    let publish = next_v5(&mut bystander_events, |p| match p {
        Packet5::Publish(publish) => Some(publish.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&publish.payload[..], b"yes");
    server.stop().await;
}

#[tokio::test]
async fn a_delivery_larger_than_the_clients_maximum_is_not_sent() {
    use canopy_protocols::mqtt::Packet;
    let server = start_default().await;
    let mut small = raw_v5(&server, Some(64)).await;
    raw_subscribe(&mut small, "sizes/#").await;
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    nats.publish("sizes.big", vec![b'x'; 200].into())
        .await
        .expect("publish");
    nats.publish("sizes.small", "ok".into())
        .await
        .expect("publish");
    nats.flush().await.expect("flush");
    match read_packet(&mut small).await {
        Some(Packet::Publish(publish)) => {
            assert_eq!(
                publish.topic.as_str(),
                "sizes/small",
                "the 200-byte one was dropped"
            );
        }
        other => panic!("expected the small PUBLISH, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn an_offline_backlog_beyond_its_bound_keeps_the_newest() {
    let mut config = test_config();
    config.mqtt.backlog_max_messages = 3;
    let server = start(config).await;
    let mut options = v5_options("away", &server);
    options.set_clean_start(false);
    options.set_session_expiry_interval(Some(600));
    let (client, mut events) = Client5::new(options.clone(), 64);
    next_v5(&mut events, |p| {
        matches!(p, Packet5::ConnAck(_)).then_some(())
    })
    .await;
    subscribed_v5(&client, &mut events, "feed/#").await;
    client.disconnect().await.expect("disconnect queued");
    let _ = tokio::time::timeout(WAIT, async { while events.poll().await.is_ok() {} }).await;

    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for i in 1..=5 {
        crate::common::publish_acked(&nats, "feed.x", format!("m{i}")).await;
    }
    let (_client, mut events) = Client5::new(options, 64);
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    while let Ok(Ok(event)) = tokio::time::timeout_at(deadline, events.poll()).await {
        if let Event5::Incoming(Packet5::Publish(publish)) = event {
            got.push(String::from_utf8_lossy(&publish.payload).into_owned());
        }
    }
    assert_eq!(got, ["m3", "m4", "m5"], "the oldest two are skipped");
    server.stop().await;
}

#[tokio::test]
async fn an_expired_retained_message_is_not_delivered() {
    let server = start_default().await;
    let (client, mut events) = connected_v5("expiring", &server).await;
    let short = PublishProperties {
        message_expiry_interval: Some(1),
        ..PublishProperties::default()
    };
    client
        .publish_with_properties("exp/short", QoS5::AtLeastOnce, true, "gone soon", short)
        .await
        .expect("queued");
    next_v5(&mut events, |p| {
        matches!(p, Packet5::PubAck(_)).then_some(())
    })
    .await;
    client
        .publish("exp/long", QoS5::AtLeastOnce, true, "stays")
        .await
        .expect("queued");
    next_v5(&mut events, |p| {
        matches!(p, Packet5::PubAck(_)).then_some(())
    })
    .await;
    // The message's one-second expiry passes on the server's clock, not ours.
    server.clock.advance(Duration::from_millis(2100));
    let (late, mut late_events) = connected_v5("expiring-late", &server).await;
    late.subscribe("exp/#", QoS5::AtLeastOnce)
        .await
        .expect("subscribe");
    let publish = next_v5(&mut late_events, |p| match p {
        Packet5::Publish(publish) => Some(publish.clone()),
        _ => None,
    })
    .await;
    assert_eq!(
        &publish.topic[..],
        b"exp/long",
        "the expired one is skipped"
    );
    let more = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            if let Ok(Event5::Incoming(Packet5::Publish(p))) = late_events.poll().await {
                return p;
            }
        }
    })
    .await;
    assert!(more.is_err(), "nothing else arrives: {more:?}");
    server.stop().await;
}

#[tokio::test]
async fn the_server_gives_topic_aliases_up_to_the_clients_maximum() {
    use canopy_protocols::mqtt::{Packet, Properties};
    let server = start_default().await;
    let mut client = raw_v5_with(
        &server,
        Properties {
            topic_alias_maximum: Some(2),
            ..Properties::default()
        },
    )
    .await;
    raw_subscribe(&mut client, "al/#").await;
    let nats = async_nats::connect(server.native_url())
        .await
        .expect("nats");
    for subject in ["al.a", "al.a", "al.b", "al.c", "al.c"] {
        nats.publish(subject, subject.into())
            .await
            .expect("publish");
    }
    nats.flush().await.expect("flush");
    let mut seen = Vec::new();
    for _ in 0..5 {
        match read_packet(&mut client).await {
            Some(Packet::Publish(p)) => seen.push((
                p.topic.as_str().to_owned(),
                p.properties.topic_alias,
                String::from_utf8_lossy(&p.payload).into_owned(),
            )),
            other => panic!("expected a PUBLISH, got {other:?}"),
        }
    }
    let alias = |t: &str, a: Option<u16>, p: &str| (t.to_owned(), a, p.to_owned());
    assert_eq!(
        seen,
        [
            alias("al/a", Some(1), "al.a"),
            alias("", Some(1), "al.a"),
            alias("al/b", Some(2), "al.b"),
            alias("al/c", None, "al.c"),
            alias("al/c", None, "al.c"),
        ],
        "aliases up to the client's maximum of 2, then full topics"
    );
    server.stop().await;
}

/// Subscribes a raw MQTT 5 connection to `filter` at QoS 0 and waits for its SUBACK.
async fn raw_subscribe(stream: &mut tokio::net::TcpStream, filter: &str) {
    use canopy_protocols::mqtt::{
        Level, Packet, Properties, QoS, Subscribe, SubscribeFilter, encode,
    };
    use tokio::io::AsyncWriteExt;
    let subscribe = Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            qos: QoS::AtMostOnce,
            no_local: false,
            retain_as_published: false,
            retain_handling: 0,
        }],
        properties: Properties::default(),
    };
    let mut out = bytes::BytesMut::new();
    encode(&Packet::Subscribe(subscribe), Level::V5, &mut out).expect("encode");
    stream.write_all(&out).await.expect("send");
    assert!(matches!(read_packet(stream).await, Some(Packet::SubAck(_))));
}
