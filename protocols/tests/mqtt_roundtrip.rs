//! Property tests of the MQTT codec: every valid packet of every level, encoded then decoded,
//! comes back equal; `encoded_len` is exactly what `encode` writes; and a stream of packets
//! decodes the same whole and split at arbitrary points.
//!
//! The strategies write down, independently of the codec, which property each packet type
//! may carry and which values are valid, so a wrong table in the codec fails here.
//!
//! Must never: generate a packet the specification makes invalid (that is the vectors' and
//! the corpus' job).

mod common;

use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::{
    Ack, Auth, ByteStr, ConnAck, Connect, Decoder, Disconnect, Level, Packet, Properties, Publish,
    QoS, SubAck, Subscribe, SubscribeFilter, UnsubAck, Unsubscribe, Will, encode, encode_publish,
    encoded_len,
};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

const MAX: usize = 1 << 20;

/// Where a property block sits, for [`restrict`]. The codec has the same list (crate-private);
/// this one is written down again on purpose, with [`restrict`], so the test states MQTT 5.0
/// table 2.2.2.2 independently of the codec's property table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    Connect,
    ConnAck,
    Publish,
    Will,
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![Just(Level::V31), Just(Level::V311), Just(Level::V5)]
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

/// Any MQTT UTF-8 string: no U+0000, wildcards and multi-byte characters included.
fn text() -> impl Strategy<Value = String> {
    "[\u{1}-\u{7f}\u{a0}-\u{3000}\u{10000}-\u{10010}]{0,12}"
}

/// A topic name: no wildcards, at least one character.
fn topic() -> impl Strategy<Value = String> {
    "[\u{1}-\"$-*,-\u{7f}\u{a0}-\u{3000}\u{1f600}]{1,12}"
}

fn data() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn packet_id() -> impl Strategy<Value = u16> {
    1..=u16::MAX
}

fn some<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
    option::weighted(0.3, s)
}

fn flag() -> impl Strategy<Value = Option<u8>> {
    some(0..=1u8)
}

/// Any combination of valid property values, before [`restrict`] keeps what a carrier allows.
fn any_properties() -> BoxedStrategy<Properties> {
    let publish = (
        flag(),
        some(any::<u32>()),
        some(text()),
        some(text()),
        some(data()),
        vec(1..=268_435_455u32, 0..3),
        some(1..=u16::MAX),
    );
    let connect = (
        some(any::<u32>()),
        some(text()),
        some(data()),
        flag(),
        flag(),
        some(1..=u16::MAX),
        some(any::<u16>()),
        some(1..=u32::MAX),
        some(any::<u32>()),
    );
    let connack = (
        some(text()),
        some(any::<u16>()),
        some(text()),
        some(text()),
        flag(),
        flag(),
        flag(),
        flag(),
        flag(),
    );
    let common = (some(text()), vec((text(), text()), 0..3));
    (publish, connect, connack, common)
        .prop_map(
            |(
                (payload_format, expiry, content_type, response_topic, correlation, sub_ids, alias),
                (
                    session_expiry,
                    auth_method,
                    auth_data,
                    problem,
                    response,
                    receive_max,
                    alias_max,
                    max_packet,
                    will_delay,
                ),
                (
                    assigned,
                    server_keep_alive,
                    response_info,
                    server_reference,
                    max_qos,
                    retain,
                    wildcard,
                    sub_ids_available,
                    shared,
                ),
                (reason_string, user),
            )| Properties {
                payload_format_indicator: payload_format,
                message_expiry_interval: expiry,
                content_type,
                response_topic,
                correlation_data: correlation,
                subscription_identifiers: sub_ids,
                session_expiry_interval: session_expiry,
                assigned_client_identifier: assigned,
                server_keep_alive,
                authentication_method: auth_method,
                authentication_data: auth_data,
                request_problem_information: problem,
                will_delay_interval: will_delay,
                request_response_information: response,
                response_information: response_info,
                server_reference,
                reason_string,
                receive_maximum: receive_max,
                topic_alias_maximum: alias_max,
                topic_alias: alias,
                maximum_qos: max_qos,
                retain_available: retain,
                user_properties: user,
                maximum_packet_size: max_packet,
                wildcard_subscription_available: wildcard,
                subscription_identifiers_available: sub_ids_available,
                shared_subscription_available: shared,
            },
        )
        .boxed()
}

/// Keeps the properties MQTT 5.0 table 2.2.2.2 allows `carrier`; none before v5.
fn restrict(mut p: Properties, carrier: Carrier, level: Level) -> Properties {
    use Carrier::*;
    if level != Level::V5 {
        return Properties::default();
    }
    if !matches!(carrier, Publish | Will) {
        p.payload_format_indicator = None;
        p.message_expiry_interval = None;
        p.content_type = None;
        p.response_topic = None;
        p.correlation_data = None;
    }
    if !matches!(carrier, Publish | Subscribe) {
        p.subscription_identifiers.clear();
    }
    if carrier == Subscribe {
        p.subscription_identifiers.truncate(1);
    }
    if !matches!(carrier, Connect | ConnAck | Disconnect) {
        p.session_expiry_interval = None;
    }
    if !matches!(carrier, ConnAck) {
        p.assigned_client_identifier = None;
        p.server_keep_alive = None;
        p.response_information = None;
        p.maximum_qos = None;
        p.retain_available = None;
        p.wildcard_subscription_available = None;
        p.subscription_identifiers_available = None;
        p.shared_subscription_available = None;
    }
    if !matches!(carrier, Connect | ConnAck | Auth) {
        p.authentication_method = None;
        p.authentication_data = None;
    }
    if !matches!(carrier, Connect) {
        p.request_problem_information = None;
        p.request_response_information = None;
    }
    if !matches!(carrier, Will) {
        p.will_delay_interval = None;
    }
    if !matches!(carrier, ConnAck | Disconnect) {
        p.server_reference = None;
    }
    if !matches!(
        carrier,
        ConnAck | Ack | SubAck | UnsubAck | Disconnect | Auth
    ) {
        p.reason_string = None;
    }
    if !matches!(carrier, Connect | ConnAck) {
        p.receive_maximum = None;
        p.topic_alias_maximum = None;
        p.maximum_packet_size = None;
    }
    if !matches!(carrier, Publish) {
        p.topic_alias = None;
    }
    p
}

fn props(carrier: Carrier, level: Level) -> BoxedStrategy<Properties> {
    if level == Level::V5 {
        any_properties()
            .prop_map(move |p| restrict(p, carrier, level))
            .boxed()
    } else {
        Just(Properties::default()).boxed()
    }
}

/// A v5 reason code (any byte), or 0 before v5.
fn reason_code(level: Level) -> BoxedStrategy<u8> {
    if level == Level::V5 {
        prop_oneof![Just(0u8), any::<u8>()].boxed()
    } else {
        Just(0u8).boxed()
    }
}

fn will(level: Level) -> BoxedStrategy<Will> {
    (
        topic(),
        data(),
        qos(),
        any::<bool>(),
        props(Carrier::Will, level),
    )
        .prop_map(|(topic, payload, qos, retain, properties)| Will {
            topic,
            payload,
            qos,
            retain,
            properties,
        })
        .boxed()
}

fn connect(level: Level) -> BoxedStrategy<Packet> {
    (
        text(),
        any::<bool>(),
        any::<u16>(),
        some(text()),
        some(data()),
        some(will(level)),
        props(Carrier::Connect, level),
    )
        .prop_map(
            move |(client_id, clean_start, keep_alive, username, password, will, properties)| {
                // Before v5 a password needs a user name.
                let password = if level == Level::V5 || username.is_some() {
                    password
                } else {
                    None
                };
                Packet::Connect(Box::new(Connect {
                    level,
                    client_id,
                    clean_start,
                    keep_alive,
                    username,
                    password,
                    will,
                    properties,
                }))
            },
        )
        .boxed()
}

fn publish(level: Level) -> BoxedStrategy<Publish> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic(),
        any::<bool>(),
        packet_id(),
        data(),
        props(Carrier::Publish, level),
    )
        .prop_map(
            |(qos, dup, retain, topic, empty_topic, id, payload, properties)| {
                let qos0 = qos == QoS::AtMostOnce;
                // v5: an empty topic when a topic alias stands for it.
                let topic = if empty_topic && properties.topic_alias.is_some() {
                    ByteStr::default()
                } else {
                    ByteStr::from(topic)
                };
                Publish {
                    dup: dup && !qos0,
                    qos,
                    retain,
                    topic,
                    packet_id: (!qos0).then_some(id),
                    payload,
                    properties,
                }
            },
        )
        .boxed()
}

fn ack(level: Level) -> impl Strategy<Value = Ack> {
    (packet_id(), reason_code(level), props(Carrier::Ack, level)).prop_map(
        |(packet_id, reason, properties)| Ack {
            packet_id,
            reason,
            properties,
        },
    )
}

fn filter(level: Level) -> impl Strategy<Value = SubscribeFilter> {
    (text(), qos(), any::<bool>(), any::<bool>(), 0..=2u8).prop_map(
        move |(filter, qos, no_local, retain_as_published, retain_handling)| {
            let v5 = level == Level::V5;
            SubscribeFilter {
                filter,
                qos,
                no_local: no_local && v5,
                retain_as_published: retain_as_published && v5,
                retain_handling: if v5 { retain_handling } else { 0 },
            }
        },
    )
}

fn suback_codes(level: Level) -> BoxedStrategy<Vec<u8>> {
    if level == Level::V5 {
        vec(any::<u8>(), 1..5).boxed()
    } else {
        vec(prop::sample::select(vec![0u8, 1, 2, 0x80]), 1..5).boxed()
    }
}

/// Any packet but CONNECT, valid at `level`.
fn packet(level: Level) -> BoxedStrategy<Packet> {
    let v5 = level == Level::V5;
    let connack = (
        any::<bool>(),
        0..=5u8,
        reason_code(level),
        props(Carrier::ConnAck, level),
    )
        .prop_map(move |(session_present, code3, code5, properties)| {
            Packet::ConnAck(ConnAck {
                // MQTT 3.1 has no session present flag.
                session_present: session_present && level != Level::V31,
                code: if v5 { code5 } else { code3 },
                properties,
            })
        });
    let subscribe = (
        packet_id(),
        vec(filter(level), 1..4),
        props(Carrier::Subscribe, level),
    )
        .prop_map(|(packet_id, filters, properties)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                filters,
                properties,
            })
        });
    let suback = (
        packet_id(),
        suback_codes(level),
        props(Carrier::SubAck, level),
    )
        .prop_map(|(packet_id, codes, properties)| {
            Packet::SubAck(SubAck {
                packet_id,
                codes,
                properties,
            })
        });
    let unsubscribe = (
        packet_id(),
        vec(text(), 1..4),
        props(Carrier::Unsubscribe, level),
    )
        .prop_map(|(packet_id, filters, properties)| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                filters,
                properties,
            })
        });
    let unsuback = (
        packet_id(),
        vec(any::<u8>(), 1..4),
        props(Carrier::UnsubAck, level),
    )
        .prop_map(move |(packet_id, codes, properties)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                codes: if v5 { codes } else { Vec::new() },
                properties,
            })
        });
    let disconnect = (reason_code(level), props(Carrier::Disconnect, level))
        .prop_map(|(reason, properties)| Packet::Disconnect(Disconnect { reason, properties }));
    let common = prop_oneof![
        connack,
        publish(level).prop_map(Packet::Publish),
        ack(level).prop_map(Packet::PubAck),
        ack(level).prop_map(Packet::PubRec),
        ack(level).prop_map(Packet::PubRel),
        ack(level).prop_map(Packet::PubComp),
        subscribe,
        suback,
        unsubscribe,
        unsuback,
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect,
    ];
    if v5 {
        let auth = (reason_code(level), props(Carrier::Auth, level))
            .prop_map(|(reason, properties)| Packet::Auth(Auth { reason, properties }));
        prop_oneof![12 => common, 1 => auth].boxed()
    } else {
        common.boxed()
    }
}

/// Encodes `packet`, checking the size `encoded_len` announced.
fn encoded(packet: &Packet, level: Level) -> BytesMut {
    let mut out = BytesMut::new();
    encode(packet, level, &mut out).unwrap_or_else(|e| panic!("{e}: {packet:?}"));
    assert_eq!(out.len(), encoded_len(packet, level), "{packet:?}");
    out
}

/// `p` as 3.1.1 carries it: no properties, reason codes or v5 subscription options.
fn without_v5_fields(p: Packet) -> Packet {
    let none = Properties::default;
    let ack = |a: Ack| Ack::new(a.packet_id);
    match p {
        Packet::Connect(mut c) => {
            c.properties = none();
            if let Some(w) = &mut c.will {
                w.properties = none();
            }
            Packet::Connect(c)
        }
        Packet::ConnAck(c) => Packet::ConnAck(ConnAck {
            properties: none(),
            ..c
        }),
        Packet::Publish(p) => Packet::Publish(Publish {
            properties: none(),
            ..p
        }),
        Packet::PubAck(a) => Packet::PubAck(ack(a)),
        Packet::PubRec(a) => Packet::PubRec(ack(a)),
        Packet::PubRel(a) => Packet::PubRel(ack(a)),
        Packet::PubComp(a) => Packet::PubComp(ack(a)),
        Packet::Subscribe(s) => Packet::Subscribe(Subscribe {
            packet_id: s.packet_id,
            filters: s
                .filters
                .into_iter()
                .map(|f| SubscribeFilter {
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: 0,
                    ..f
                })
                .collect(),
            properties: none(),
        }),
        Packet::SubAck(s) => Packet::SubAck(SubAck {
            properties: none(),
            ..s
        }),
        Packet::Unsubscribe(u) => Packet::Unsubscribe(Unsubscribe {
            properties: none(),
            ..u
        }),
        Packet::UnsubAck(u) => Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            codes: Vec::new(),
            properties: none(),
        }),
        Packet::Disconnect(_) => Packet::Disconnect(Disconnect::default()),
        other => other,
    }
}

/// A level and, for it, a CONNECT then any packets.
fn session() -> impl Strategy<Value = (Level, Packet, Vec<Packet>)> {
    level().prop_flat_map(|level| (Just(level), connect(level), vec(packet(level), 0..8)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_packet_round_trips(
        (level, p) in level().prop_flat_map(|l| (Just(l), packet(l)))
    ) {
        let bytes = encoded(&p, level);
        let mut buf = bytes.clone();
        let got = Decoder::with_level(level, MAX).decode(&mut buf);
        prop_assert_eq!(got, Ok(Some(p)));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn connect_round_trips_and_sets_the_level(
        (level, p) in level().prop_flat_map(|l| (Just(l), connect(l)))
    ) {
        let mut buf = encoded(&p, level);
        let mut decoder = Decoder::new(MAX);
        prop_assert_eq!(decoder.decode(&mut buf), Ok(Some(p)));
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decoder.level(), Some(level));
    }

    /// `encode` writes a PUBLISH through `encode_publish` today; this keeps the two equal
    /// should that change. Taking `p` apart field by field stops compiling when `Publish`
    /// gains a field, which the fast path must then take as well.
    #[test]
    fn encode_publish_matches_encode(
        (level, p) in level().prop_flat_map(|l| (Just(l), publish(l)))
    ) {
        let Publish { dup, qos, retain, topic, packet_id, payload, properties } = &p;
        let mut fast = BytesMut::new();
        let (topic, id) = (topic.as_bytes(), *packet_id);
        encode_publish(&mut fast, level, *dup, *qos, *retain, topic, id, properties, payload)
            .unwrap();
        let packet = Packet::Publish(p);
        prop_assert_eq!(&fast[..], &encoded(&packet, level)[..]);
    }

    #[test]
    fn streams_decode_the_same_however_split(
        (level, connect, packets) in session(),
        cuts in vec(1..40usize, 0..64),
    ) {
        let mut stream = encoded(&connect, level);
        for p in &packets {
            stream.extend_from_slice(&encoded(p, level));
        }
        let mut expected = vec![connect];
        expected.extend(packets);
        let decoder = Decoder::new(MAX);
        let whole = common::stream::whole(&decoder, &stream);
        prop_assert_eq!(&whole.error, &None);
        prop_assert_eq!(whole.left, 0);
        prop_assert_eq!(&whole.frames, &expected);
        let split = common::stream::run(&decoder, &stream, &mut cuts.into_iter());
        prop_assert_eq!(split, whole);
    }

    #[test]
    fn encoding_for_3x_leaves_v5_fields_out(p in packet(Level::V5)) {
        // A v5 packet written at 3.1.1 reads back as the same packet without properties
        // and reason codes, wherever 3.1.1 has the packet at all.
        let mut out = BytesMut::new();
        let result = encode(&p, Level::V311, &mut out);
        // AUTH does not exist in 3.1.1, an empty topic needs its alias, which 3.1.1 does
        // not have, and 3.1.1 has fewer SUBACK and CONNACK codes: the encoder refuses those.
        let unwritable = match &p {
            Packet::Auth(_) => true,
            Packet::Publish(p) => p.topic.is_empty(),
            Packet::SubAck(s) => s.codes.iter().any(|c| !matches!(c, 0 | 1 | 2 | 0x80)),
            Packet::ConnAck(c) => c.code > 5,
            _ => false,
        };
        if unwritable {
            prop_assert!(result.is_err());
            return Ok(());
        }
        result.unwrap();
        prop_assert_eq!(out.len(), encoded_len(&p, Level::V311));
        let got = Decoder::with_level(Level::V311, MAX).decode(&mut out);
        prop_assert_eq!(got, Ok(Some(without_v5_fields(p))));
        prop_assert!(out.is_empty());
    }
}
