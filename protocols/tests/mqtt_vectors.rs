//! Hand-written MQTT byte vectors, built from the 3.1, 3.1.1 and 5.0 specifications: what
//! each must decode to, that the encoder writes the same bytes back, and the error (reason
//! code and level) for each way a packet can be wrong. The `decodes_*` / `refuses_*` tests
//! named after rumqttc's gaps show this codec does what rumqttc's does not.
//!
//! Must never: derive an expected value from the codec under test (every vector is spelled
//! out in bytes).

use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::{
    Ack, Auth, ByteStr, ConnAck, Connect, DecodeError, Decoder, Disconnect, EncodeError, Level,
    Packet, Properties, Publish, QoS, SubAck, Subscribe, SubscribeFilter, UnsubAck, Will, encode,
    encode_publish, encoded_len, reason,
};

const MAX: usize = 1 << 20;

/// Decodes exactly one packet from `bytes`, which must be consumed whole.
fn decode_one(decoder: &mut Decoder, bytes: &[u8]) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let packet = decoder
        .decode(&mut buf)?
        .unwrap_or_else(|| panic!("{bytes:02x?} is not a complete packet"));
    assert!(buf.is_empty(), "{} bytes left after {packet:?}", buf.len());
    Ok(packet)
}

fn at(level: Level, bytes: &[u8]) -> Result<Packet, DecodeError> {
    decode_one(&mut Decoder::with_level(level, MAX), bytes)
}

fn server(bytes: &[u8]) -> Result<Packet, DecodeError> {
    decode_one(&mut Decoder::new(MAX), bytes)
}

fn encoded(packet: &Packet, level: Level) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(packet, level, &mut out).expect("encodes");
    assert_eq!(out.len(), encoded_len(packet, level));
    out.to_vec()
}

/// Decodes `bytes` at `level`, checks the packet, and that encoding it gives `bytes` back.
fn vector(level: Level, bytes: &[u8], expected: Packet) {
    let got = if matches!(expected, Packet::Connect(_)) {
        server(bytes)
    } else {
        at(level, bytes)
    };
    assert_eq!(got.as_ref(), Ok(&expected));
    assert_eq!(encoded(&expected, level), bytes, "{expected:?}");
}

fn err(result: Result<Packet, DecodeError>) -> DecodeError {
    match result {
        Ok(p) => panic!("decoded {p:?}"),
        Err(e) => e,
    }
}

fn assert_error(result: Result<Packet, DecodeError>, code: u8, words: &str) -> DecodeError {
    let e = err(result);
    assert_eq!(e.code, code, "{e:?}");
    assert!(
        e.message.contains(words),
        "message {:?} should say {words:?}",
        e.message
    );
    e
}

fn props() -> Properties {
    Properties::default()
}

// ---------------------------------------------------------------------------------------
// The gaps of rumqttc

#[test]
fn decodes_bare_v5_disconnect() {
    vector(
        Level::V5,
        b"\xe0\x00",
        Packet::Disconnect(Disconnect::default()),
    );
    vector(
        Level::V5,
        b"\xe0\x01\x04",
        Packet::Disconnect(Disconnect {
            reason: reason::DISCONNECT_WITH_WILL,
            properties: props(),
        }),
    );
    vector(
        Level::V5,
        b"\xe0\x07\x8b\x05\x11\x00\x00\x00\x3c",
        Packet::Disconnect(Disconnect {
            reason: reason::SERVER_SHUTTING_DOWN,
            properties: Properties {
                session_expiry_interval: Some(60),
                ..props()
            },
        }),
    );
    vector(
        Level::V311,
        b"\xe0\x00",
        Packet::Disconnect(Disconnect::default()),
    );
    assert_error(
        at(Level::V311, b"\xe0\x01\x00"),
        0x81,
        "follow its last field",
    );
}

#[test]
fn decodes_v5_auth() {
    vector(Level::V5, b"\xf0\x00", Packet::Auth(Auth::default()));
    vector(
        Level::V5,
        b"\xf0\x0e\x18\x0c\x15\x00\x04SCRM\x16\x00\x02xy",
        Packet::Auth(Auth {
            reason: 0x18,
            properties: Properties {
                authentication_method: Some("SCRM".into()),
                authentication_data: Some(Bytes::from_static(b"xy")),
                ..props()
            },
        }),
    );
    // Reason only, without a property length: read leniently as no properties.
    assert_eq!(
        at(Level::V5, b"\xf0\x01\x19"),
        Ok(Packet::Auth(Auth {
            reason: 0x19,
            properties: props()
        }))
    );
    // A property AUTH may not carry.
    assert_error(
        at(Level::V5, b"\xf0\x04\x18\x02\x01\x01"),
        0x82,
        "not allowed",
    );
    // AUTH does not exist in 3.x: type 15 is reserved there.
    for level in [Level::V31, Level::V311] {
        assert_error(at(level, b"\xf0\x00"), 0x81, "AUTH");
    }
    assert!(matches!(
        encode(
            &Packet::Auth(Auth::default()),
            Level::V311,
            &mut BytesMut::new()
        ),
        Err(EncodeError::NotInLevel { .. })
    ));
}

#[test]
fn decodes_mqtt_3_1_connect() {
    let bytes = b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x01a";
    let mut decoder = Decoder::new(MAX);
    let packet = decode_one(&mut decoder, bytes).unwrap();
    assert_eq!(decoder.level(), Some(Level::V31));
    let expected = Packet::Connect(Box::new(Connect {
        level: Level::V31,
        client_id: "a".into(),
        clean_start: true,
        keep_alive: 60,
        username: None,
        password: None,
        will: None,
        properties: props(),
    }));
    assert_eq!(packet, expected);
    assert_eq!(encoded(&expected, Level::V31), bytes);
    // MQTT 3.1 set DUP on resent SUBSCRIBE/UNSUBSCRIBE/PUBREL: accepted at 3.1 only.
    let dup_subscribe = b"\x8a\x06\x00\x01\x00\x01a\x00";
    assert!(matches!(
        decode_one(&mut decoder, dup_subscribe),
        Ok(Packet::Subscribe(_))
    ));
    assert_error(at(Level::V311, dup_subscribe), 0x81, "flags");
    // 3.1 CONNACK: the first byte is unused.
    assert_eq!(
        at(Level::V31, b"\x20\x02\x00\x05"),
        Ok(Packet::ConnAck(ConnAck {
            session_present: false,
            code: 5,
            properties: props()
        }))
    );
}

#[test]
fn refuses_reserved_flags() {
    let reserved: [(Level, &[u8]); 10] = [
        // SUBSCRIBE, UNSUBSCRIBE and PUBREL need exactly 0b0010.
        (Level::V311, b"\x80\x06\x00\x01\x00\x01a\x00"),
        (Level::V5, b"\x83\x07\x00\x01\x00\x00\x01a\x00"),
        (Level::V311, b"\xa0\x05\x00\x01\x00\x01a"),
        (Level::V311, b"\x60\x02\x00\x01"),
        (Level::V5, b"\x6a\x02\x00\x01"),
        // Every other type but PUBLISH needs 0.
        (Level::V311, b"\xc1\x00"),
        (Level::V5, b"\xd8\x00"),
        (Level::V311, b"\x42\x02\x00\x01"),
        (Level::V5, b"\xe4\x00"),
        (Level::V5, b"\xf1\x00"),
    ];
    for (level, bytes) in reserved {
        assert_error(at(level, bytes), 0x81, "flags");
    }
    let connect = b"\x11\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a";
    assert_error(server(connect), 0x81, "flags");
    // The reserved CONNECT flag (bit 0 of the connect flags byte).
    let e = assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01a"),
        0x81,
        "reserved connect flag",
    );
    assert_eq!(e.level, Some(Level::V311));
    // Reserved bits of a SUBSCRIBE's options: upper 6 in 3.x, upper 2 in v5.
    assert_error(
        at(Level::V311, b"\x82\x06\x00\x01\x00\x01a\x04"),
        0x81,
        "reserved bits",
    );
    assert_error(
        at(Level::V5, b"\x82\x07\x00\x01\x00\x00\x01a\x40"),
        0x81,
        "reserved bits",
    );
    assert_error(
        at(Level::V5, b"\x82\x07\x00\x01\x00\x00\x01a\x30"),
        0x81,
        "retain handling 3",
    );
    // Reserved CONNACK flags.
    assert_error(
        at(Level::V311, b"\x20\x02\x02\x00"),
        0x81,
        "acknowledge flags",
    );
    // Packet type 0.
    assert_error(at(Level::V5, b"\x00\x00"), 0x81, "type 0");
}

#[test]
fn decodes_level_5_connect_as_v5() {
    // Flags 0xc2: user name, password, clean start. Properties: session expiry 120,
    // receive maximum 10.
    let bytes = b"\x10\x1e\x00\x04MQTT\x05\xc2\x00\x3c\x08\x11\x00\x00\x00\x78\x21\x00\x0a\
                  \x00\x03cid\x00\x01u\x00\x01p";
    let mut decoder = Decoder::new(MAX);
    let packet = decode_one(&mut decoder, bytes).unwrap();
    assert_eq!(decoder.level(), Some(Level::V5));
    let expected = Packet::Connect(Box::new(Connect {
        level: Level::V5,
        client_id: "cid".into(),
        clean_start: true,
        keep_alive: 60,
        username: Some("u".into()),
        password: Some(Bytes::from_static(b"p")),
        will: None,
        properties: Properties {
            session_expiry_interval: Some(120),
            receive_maximum: Some(10),
            ..props()
        },
    }));
    assert_eq!(packet, expected);
    assert_eq!(encoded(&expected, Level::V5), bytes);
    // What follows is read as v5: a bare DISCONNECT.
    assert_eq!(
        decode_one(&mut decoder, b"\xe0\x00"),
        Ok(Packet::Disconnect(Disconnect::default()))
    );
}

// ---------------------------------------------------------------------------------------
// CONNECT

#[test]
fn connect_3_1_1_with_will() {
    // Flags 0x2e: will retain, will QoS 1, will flag, clean session.
    let bytes = b"\x10\x17\x00\x04MQTT\x04\x2e\x00\x0a\x00\x00\x00\x03a/b\x00\x04gone";
    vector(
        Level::V311,
        bytes,
        Packet::Connect(Box::new(Connect {
            level: Level::V311,
            client_id: String::new(),
            clean_start: true,
            keep_alive: 10,
            username: None,
            password: None,
            will: Some(Will {
                topic: "a/b".into(),
                payload: Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: props(),
            }),
            properties: props(),
        })),
    );
}

#[test]
fn connect_5_with_will_properties() {
    // Will properties come before the will topic: will delay 5, content type "t".
    let bytes =
        b"\x10\x1e\x00\x04MQTT\x05\x04\x00\x00\x00\x00\x01c\x09\x03\x00\x01t\x18\x00\x00\x00\x05\
                  \x00\x01w\x00\x01x";
    vector(
        Level::V5,
        bytes,
        Packet::Connect(Box::new(Connect {
            level: Level::V5,
            client_id: "c".into(),
            clean_start: false,
            keep_alive: 0,
            username: None,
            password: None,
            will: Some(Will {
                topic: "w".into(),
                payload: Bytes::from_static(b"x"),
                qos: QoS::AtMostOnce,
                retain: false,
                properties: Properties {
                    will_delay_interval: Some(5),
                    content_type: Some("t".into()),
                    ..props()
                },
            }),
            properties: props(),
        })),
    );
}

#[test]
fn connect_errors() {
    // Unknown protocol names and levels: 0x84 with no level.
    for bytes in [
        &b"\x10\x0d\x00\x04MQTX\x04\x02\x00\x3c\x00\x01a"[..],
        b"\x10\x0d\x00\x04MQTT\x03\x02\x00\x3c\x00\x01a",
        b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01a",
        b"\x10\x0f\x00\x06MQIsdp\x04\x02\x00\x3c\x00\x01a",
    ] {
        let e = assert_error(server(bytes), 0x84, "protocol name");
        assert_eq!(e.level, None);
    }
    // Password without user name: malformed in 3.1.1, allowed in v5.
    let e = assert_error(
        server(b"\x10\x10\x00\x04MQTT\x04\x42\x00\x3c\x00\x01a\x00\x01p"),
        0x81,
        "password",
    );
    assert_eq!(e.level, Some(Level::V311));
    assert!(server(b"\x10\x11\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x01a\x00\x01p").is_ok());
    // Will QoS 3; will QoS or retain without the will flag.
    assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x1e\x00\x3c\x00\x01a"),
        0x81,
        "will QoS is 3",
    );
    assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x0a\x00\x3c\x00\x01a"),
        0x81,
        "without the will flag",
    );
    assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x22\x00\x3c\x00\x01a"),
        0x81,
        "without the will flag",
    );
    // Will topic with a wildcard.
    assert_error(
        server(b"\x10\x12\x00\x04MQTT\x04\x06\x00\x3c\x00\x01a\x00\x01#\x00\x00"),
        0x90,
        "will topic",
    );
    // The client id runs past the end; bytes after the last field.
    let e = assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x05a"),
        0x81,
        "client identifier",
    );
    assert_eq!(e.level, Some(Level::V311));
    assert_error(
        server(b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x01ab"),
        0x81,
        "follow",
    );
    // A property CONNECT may not carry (topic alias), and a repeated one.
    let e = assert_error(
        server(b"\x10\x10\x00\x04MQTT\x05\x02\x00\x3c\x03\x23\x00\x01\x00\x00"),
        0x82,
        "topic alias",
    );
    assert_eq!(e.level, Some(Level::V5));
    assert_error(
        server(b"\x10\x13\x00\x04MQTT\x05\x02\x00\x3c\x06\x21\x00\x01\x21\x00\x01\x00\x00"),
        0x82,
        "more than once",
    );
    // Any packet before CONNECT, and a second CONNECT.
    let e = assert_error(server(b"\xc0\x00"), 0x82, "CONNECT");
    assert_eq!(e.level, None);
    let mut decoder = Decoder::new(MAX);
    let connect = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a";
    decode_one(&mut decoder, connect).unwrap();
    assert_error(decode_one(&mut decoder, connect), 0x82, "already sent");
    // A padded remaining length is fine in 3.1.1 and malformed in v5.
    assert!(server(b"\x10\x8d\x00\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a").is_ok());
    let e = assert_error(
        server(b"\x10\x8e\x00\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01a"),
        0x81,
        "fewest bytes",
    );
    assert_eq!(e.level, Some(Level::V5));
    // Invalid UTF-8 and U+0000 in the client id.
    assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01\xff"),
        0x81,
        "UTF-8",
    );
    assert_error(
        server(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01\x00"),
        0x81,
        "U+0000",
    );
}

// ---------------------------------------------------------------------------------------
// PUBLISH

#[test]
fn publish_vectors() {
    vector(
        Level::V311,
        b"\x30\x07\x00\x03a/bhi",
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: ByteStr::from_static("a/b"),
            packet_id: None,
            payload: Bytes::from_static(b"hi"),
            properties: props(),
        }),
    );
    vector(
        Level::V311,
        b"\x3d\x07\x00\x03a/b\x12\x34",
        Packet::Publish(Publish {
            dup: true,
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: ByteStr::from_static("a/b"),
            packet_id: Some(0x1234),
            payload: Bytes::new(),
            properties: props(),
        }),
    );
    // v5, QoS 1, payload format indicator 1 and topic alias 5.
    vector(
        Level::V5,
        b"\x32\x0f\x00\x03a/b\x00\x0a\x05\x01\x01\x23\x00\x05hi",
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: ByteStr::from_static("a/b"),
            packet_id: Some(10),
            payload: Bytes::from_static(b"hi"),
            properties: Properties {
                payload_format_indicator: Some(1),
                topic_alias: Some(5),
                ..props()
            },
        }),
    );
    // v5: an empty topic with a topic alias stands for the aliased topic.
    vector(
        Level::V5,
        b"\x30\x07\x00\x00\x03\x23\x00\x01x",
        Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: ByteStr::default(),
            packet_id: None,
            payload: Bytes::from_static(b"x"),
            properties: Properties {
                topic_alias: Some(1),
                ..props()
            },
        }),
    );
    // Subscription identifiers repeat in PUBLISH, in order; user properties too.
    let p = at(
        Level::V5,
        b"\x30\x16\x00\x01t\x12\x0b\x01\x0b\x81\x01\x26\x00\x01k\x00\x01v\x26\x00\x01k\x00\x00",
    )
    .unwrap();
    let Packet::Publish(p) = p else { panic!() };
    assert_eq!(p.properties.subscription_identifiers, vec![1, 129]);
    assert_eq!(
        p.properties.user_properties,
        vec![("k".into(), "v".into()), ("k".into(), String::new())]
    );
}

#[test]
fn publish_payload_is_a_slice_of_the_frame() {
    let mut buf = BytesMut::from(&b"\x30\x07\x00\x03a/bhi\xc0\x00"[..]);
    let frame_start = buf.as_ptr() as usize;
    let Some(Packet::Publish(p)) = Decoder::with_level(Level::V311, MAX)
        .decode(&mut buf)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(p.payload.as_ptr() as usize, frame_start + 7);
    assert_eq!(p.topic.as_bytes().as_ptr() as usize, frame_start + 4);
    assert_eq!(&buf[..], b"\xc0\x00");
}

#[test]
fn publish_errors() {
    assert_error(
        at(Level::V311, b"\x36\x07\x00\x03a/b\x00\x01"),
        0x81,
        "QoS 3",
    );
    assert_error(at(Level::V5, b"\x38\x06\x00\x03a/b\x00"), 0x81, "DUP");
    for topic in [&b"a/+"[..], b"a/#", b"+", b"#/x"] {
        let len = topic.len() as u8;
        let mut bytes = vec![0x30, 2 + len, 0, len];
        bytes.extend_from_slice(topic);
        assert_error(at(Level::V311, &bytes), 0x90, "wildcard");
    }
    assert_error(at(Level::V311, b"\x30\x05\x00\x03a\x00b"), 0x81, "U+0000");
    assert_error(at(Level::V311, b"\x30\x05\x00\x03a\xc0b"), 0x81, "UTF-8");
    assert_error(at(Level::V311, b"\x30\x02\x00\x00"), 0x82, "empty");
    assert_error(at(Level::V5, b"\x30\x03\x00\x00\x00"), 0x82, "topic alias");
    assert_error(
        at(Level::V311, b"\x32\x07\x00\x03a/b\x00\x00"),
        0x81,
        "identifier 0",
    );
    assert_error(
        at(Level::V311, b"\x32\x06\x00\x03a/b\x00"),
        0x81,
        "packet identifier",
    );
    // Duplicate topic alias, topic alias 0, a property PUBLISH may not carry.
    assert_error(
        at(Level::V5, b"\x30\x0a\x00\x01t\x06\x23\x00\x01\x23\x00\x02"),
        0x82,
        "more than once",
    );
    assert_error(
        at(Level::V5, b"\x30\x07\x00\x01t\x03\x23\x00\x00"),
        0x82,
        "topic alias",
    );
    assert_error(
        at(Level::V5, b"\x30\x09\x00\x01t\x05\x11\x00\x00\x00\x01"),
        0x82,
        "session expiry interval",
    );
    // An unknown property identifier; a property length past the end.
    assert_error(at(Level::V5, b"\x30\x05\x00\x01t\x01\x7f"), 0x81, "0x7F");
    assert_error(
        at(Level::V5, b"\x30\x05\x00\x01t\x05\x01"),
        0x81,
        "property length",
    );
    // A padded property length.
    assert_error(
        at(Level::V5, b"\x30\x05\x00\x01t\x80\x00"),
        0x81,
        "fewest bytes",
    );
}

// ---------------------------------------------------------------------------------------
// Acknowledgements, subscriptions, the rest

#[test]
fn ack_short_forms() {
    for level in [Level::V31, Level::V311, Level::V5] {
        vector(level, b"\x40\x02\x00\x01", Packet::PubAck(Ack::new(1)));
        vector(level, b"\x50\x02\xff\xff", Packet::PubRec(Ack::new(0xffff)));
        vector(level, b"\x62\x02\x00\x07", Packet::PubRel(Ack::new(7)));
        vector(level, b"\x70\x02\x01\x00", Packet::PubComp(Ack::new(256)));
    }
    let no_subscribers = Ack {
        packet_id: 1,
        reason: reason::NO_MATCHING_SUBSCRIBERS,
        properties: props(),
    };
    vector(
        Level::V5,
        b"\x40\x03\x00\x01\x10",
        Packet::PubAck(no_subscribers.clone()),
    );
    // Reason and an empty property block: same packet, longer form.
    assert_eq!(
        at(Level::V5, b"\x40\x04\x00\x01\x10\x00"),
        Ok(Packet::PubAck(no_subscribers))
    );
    vector(
        Level::V5,
        b"\x50\x08\x00\x01\x80\x04\x1f\x00\x01r",
        Packet::PubRec(Ack {
            packet_id: 1,
            reason: 0x80,
            properties: Properties {
                reason_string: Some("r".into()),
                ..props()
            },
        }),
    );
    assert_error(at(Level::V5, b"\x40\x02\x00\x00"), 0x81, "identifier 0");
    assert_error(at(Level::V311, b"\x40\x03\x00\x01\x00"), 0x81, "follow");
    assert_error(at(Level::V5, b"\x40\x01\x00"), 0x81, "packet identifier");
    assert_error(
        at(Level::V5, b"\x40\x07\x00\x01\x00\x03\x23\x00\x01"),
        0x82,
        "not allowed",
    );
}

#[test]
fn subscribe_vectors() {
    vector(
        Level::V311,
        b"\x82\x08\x00\x01\x00\x03a/b\x01",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: "a/b".into(),
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: 0,
            }],
            properties: props(),
        }),
    );
    // Options 0x2d: QoS 1, no local, retain as published, retain handling 2; subscription
    // identifier 7.
    vector(
        Level::V5,
        b"\x82\x0b\x00\x01\x02\x0b\x07\x00\x03a/#\x2d",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: "a/#".into(),
                qos: QoS::AtLeastOnce,
                no_local: true,
                retain_as_published: true,
                retain_handling: 2,
            }],
            properties: Properties {
                subscription_identifiers: vec![7],
                ..props()
            },
        }),
    );
    // Wildcard placement is the server's business: "a/#/b" decodes.
    assert!(at(Level::V311, b"\x82\x0a\x00\x01\x00\x05a/#/b\x00").is_ok());
    assert_error(
        at(Level::V311, b"\x82\x02\x00\x01"),
        0x82,
        "no topic filter",
    );
    assert_error(
        at(Level::V5, b"\x82\x03\x00\x01\x00"),
        0x82,
        "no topic filter",
    );
    assert_error(
        at(Level::V311, b"\x82\x06\x00\x01\x00\x01a\x03"),
        0x81,
        "QoS 3",
    );
    assert_error(
        at(Level::V311, b"\x82\x05\x00\x01\x00\x01a"),
        0x81,
        "subscription options",
    );
    assert_error(
        at(Level::V311, b"\x82\x06\x00\x00\x00\x01a\x00"),
        0x81,
        "identifier 0",
    );
    // Two subscription identifiers, or identifier 0.
    assert_error(
        at(
            Level::V5,
            b"\x82\x0b\x00\x01\x04\x0b\x01\x0b\x02\x00\x01a\x00",
        ),
        0x82,
        "more than once",
    );
    assert_error(
        at(Level::V5, b"\x82\x09\x00\x01\x02\x0b\x00\x00\x01a\x00"),
        0x82,
        "1 to",
    );
    // UNSUBSCRIBE needs a filter too.
    assert_error(
        at(Level::V311, b"\xa2\x02\x00\x01"),
        0x82,
        "no topic filter",
    );
    assert!(matches!(
        at(Level::V5, b"\xa2\x06\x00\x01\x00\x00\x01a"),
        Ok(Packet::Unsubscribe(_))
    ));
}

#[test]
fn suback_and_unsuback_vectors() {
    vector(
        Level::V311,
        b"\x90\x04\x00\x0a\x01\x80",
        Packet::SubAck(SubAck {
            packet_id: 10,
            codes: vec![1, 0x80],
            properties: props(),
        }),
    );
    vector(
        Level::V5,
        b"\x90\x05\x00\x0a\x00\x02\x9e",
        Packet::SubAck(SubAck {
            packet_id: 10,
            codes: vec![2, 0x9e],
            properties: props(),
        }),
    );
    assert_error(at(Level::V311, b"\x90\x03\x00\x0a\x9e"), 0x81, "0x9E");
    assert_error(at(Level::V311, b"\x90\x02\x00\x0a"), 0x82, "no return code");
    vector(
        Level::V311,
        b"\xb0\x02\x00\x05",
        Packet::UnsubAck(UnsubAck {
            packet_id: 5,
            codes: vec![],
            properties: props(),
        }),
    );
    vector(
        Level::V5,
        b"\xb0\x05\x00\x05\x00\x00\x11",
        Packet::UnsubAck(UnsubAck {
            packet_id: 5,
            codes: vec![0, 0x11],
            properties: props(),
        }),
    );
    assert_error(
        at(Level::V5, b"\xb0\x03\x00\x05\x00"),
        0x82,
        "no reason code",
    );
    assert_error(at(Level::V311, b"\xb0\x03\x00\x05\x00"), 0x81, "follow");
}

#[test]
fn connack_and_ping_vectors() {
    vector(
        Level::V311,
        b"\x20\x02\x01\x00",
        Packet::ConnAck(ConnAck {
            session_present: true,
            code: 0,
            properties: props(),
        }),
    );
    vector(
        Level::V5,
        b"\x20\x07\x00\x00\x04\x24\x01\x25\x00",
        Packet::ConnAck(ConnAck {
            session_present: false,
            code: 0,
            properties: Properties {
                maximum_qos: Some(1),
                retain_available: Some(0),
                ..props()
            },
        }),
    );
    assert_error(at(Level::V311, b"\x20\x02\x00\x06"), 0x81, "return code 6");
    assert_error(
        at(Level::V5, b"\x20\x05\x00\x00\x02\x24\x02"),
        0x82,
        "0 or 1",
    );
    for level in [Level::V31, Level::V311, Level::V5] {
        vector(level, b"\xc0\x00", Packet::PingReq);
        vector(level, b"\xd0\x00", Packet::PingResp);
        assert_error(at(level, b"\xc0\x01\x00"), 0x81, "follow");
    }
}

// ---------------------------------------------------------------------------------------
// Framing

#[test]
fn too_large_is_refused_from_the_fixed_header() {
    // Remaining length 16,383 announced, only the fixed header present.
    let mut buf = BytesMut::from(&b"\x30\xff\x7f"[..]);
    let e = Decoder::with_level(Level::V5, 100)
        .decode(&mut buf)
        .unwrap_err();
    assert_eq!(e.code, reason::PACKET_TOO_LARGE);
    assert!(e.message.contains("16386"), "{}", e.message);
    // Exactly at the limit is fine: 2 + 98 = 100.
    let mut packet = vec![0x30, 98, 0, 1, b't'];
    packet.resize(100, b'x');
    let mut buf = BytesMut::from(&packet[..]);
    assert!(
        Decoder::with_level(Level::V311, 100)
            .decode(&mut buf)
            .unwrap()
            .is_some()
    );
    let mut buf = BytesMut::from(&packet[..]);
    let e = Decoder::with_level(Level::V311, 99)
        .decode(&mut buf)
        .unwrap_err();
    assert_eq!(e.code, reason::PACKET_TOO_LARGE);
    // A CONNECT is held to the limit too, before the level is known.
    let mut buf = BytesMut::from(&b"\x10\xff\xff\x7f"[..]);
    let e = Decoder::new(1024).decode(&mut buf).unwrap_err();
    assert_eq!((e.code, e.level), (reason::PACKET_TOO_LARGE, None));
}

#[test]
fn remaining_length_rules() {
    let mut decoder = Decoder::with_level(Level::V311, MAX);
    // Four continuation bytes: a fifth would be needed, which is malformed.
    let mut buf = BytesMut::from(&b"\x30\xff\xff\xff"[..]);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert_eq!(buf.len(), 4);
    buf.extend_from_slice(b"\xff");
    let e = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(e.code, 0x81);
    assert!(e.message.contains("longer than 4 bytes"), "{}", e.message);
    // Padded: fine before v5, malformed in v5.
    assert_eq!(at(Level::V311, b"\xc0\x80\x00"), Ok(Packet::PingReq));
    assert_error(at(Level::V5, b"\xc0\x80\x00"), 0x81, "fewest bytes");
    // Needs more: the buffer is untouched.
    let mut buf = BytesMut::from(&b"\x30\x05\x00\x03a"[..]);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert_eq!(&buf[..], b"\x30\x05\x00\x03a");
    assert_eq!(decoder.decode(&mut BytesMut::new()), Ok(None));
}

// ---------------------------------------------------------------------------------------
// Encoder

#[test]
fn encoder_drops_what_3x_lacks_and_refuses_what_is_wrong() {
    let ack = Packet::PubAck(Ack {
        packet_id: 3,
        reason: 0x10,
        properties: Properties {
            reason_string: Some("why".into()),
            ..props()
        },
    });
    assert_eq!(encoded(&ack, Level::V311), b"\x40\x02\x00\x03");
    assert_eq!(
        encoded(&ack, Level::V5),
        b"\x40\x0a\x00\x03\x10\x06\x1f\x00\x03why"
    );
    let disconnect = Packet::Disconnect(Disconnect {
        reason: 0x8b,
        properties: props(),
    });
    assert_eq!(encoded(&disconnect, Level::V311), b"\xe0\x00");
    assert_eq!(encoded(&disconnect, Level::V5), b"\xe0\x01\x8b");
    let mut out = BytesMut::new();
    let not_allowed = Packet::PubAck(Ack {
        packet_id: 1,
        reason: 0,
        properties: Properties {
            topic_alias: Some(1),
            ..props()
        },
    });
    assert!(matches!(
        encode(&not_allowed, Level::V5, &mut out),
        Err(EncodeError::PropertyNotAllowed { .. })
    ));
    assert!(matches!(
        encode(&Packet::PubAck(Ack::new(0)), Level::V5, &mut out),
        Err(EncodeError::Invalid { .. })
    ));
    let long = "x".repeat(65_536);
    assert!(matches!(
        encode_publish(
            &mut out,
            Level::V311,
            false,
            QoS::AtMostOnce,
            false,
            long.as_bytes(),
            None,
            &props(),
            b""
        ),
        Err(EncodeError::TooLong { len: 65_536, .. })
    ));
    assert!(matches!(
        encode_publish(
            &mut out,
            Level::V311,
            false,
            QoS::AtLeastOnce,
            false,
            b"t",
            None,
            &props(),
            b""
        ),
        Err(EncodeError::Invalid { .. })
    ));
    assert!(out.is_empty(), "nothing written on error");
    // The fast path: no properties at 3.1.1.
    encode_publish(
        &mut out,
        Level::V311,
        false,
        QoS::AtLeastOnce,
        true,
        b"a/b",
        Some(9),
        &props(),
        b"hi",
    )
    .unwrap();
    assert_eq!(&out[..], b"\x33\x09\x00\x03a/b\x00\x09hi");
    // v5 with no properties writes a zero property length.
    out.clear();
    encode_publish(
        &mut out,
        Level::V5,
        false,
        QoS::AtMostOnce,
        false,
        b"a/b",
        None,
        &props(),
        b"hi",
    )
    .unwrap();
    assert_eq!(&out[..], b"\x30\x08\x00\x03a/b\x00hi");
}

#[test]
fn errors_read_as_sentences() {
    let e = err(at(Level::V5, b"\x30\x05\x00\x03a/+"));
    assert_eq!(e.to_string(), e.message);
    assert_eq!(
        e.message,
        "PUBLISH packet has an invalid topic name: the topic name contains the wildcard '+', \
         which only topic filters may use"
    );
    let e = err(at(Level::V311, b"\x82\x02\x00\x01"));
    assert_eq!(
        e.message,
        "SUBSCRIBE packet breaks the protocol: it has no topic filter"
    );
    let e = err(server(b"\x10\x0d\x00\x04MQTX\x04\x02\x00\x3c\x00\x01a"));
    assert_eq!(
        e.message,
        "CONNECT packet asks for a protocol version not supported: protocol name \"MQTX\" \
         with level 4 is not MQTT 3.1, 3.1.1 or 5"
    );
    // Peer text is cut short in messages.
    let mut long = vec![0x82, 0x00, 0x00, 0x01, 0x00, 100];
    long.extend(std::iter::repeat_n(b'f', 100));
    long.push(0x03);
    long[1] = (long.len() - 2) as u8;
    let e = err(at(Level::V311, &long));
    assert!(e.message.len() < 120, "{}", e.message);
    assert!(e.message.contains("\"ffff"), "{}", e.message);
    let e = err(at(Level::V5, b"\x32\x03\x00\x03a"));
    assert_eq!(
        e.message,
        "PUBLISH packet is malformed: it ends inside the topic name"
    );
}
