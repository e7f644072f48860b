//! The MQTT control packets of protocol levels 3 (3.1, `MQIsdp`), 4 (3.1.1) and 5, as
//! values: what the decoder produces and the encoder consumes.
//!
//! One set of types serves every level: fields a level lacks (properties, reason codes
//! of v5) are left at their defaults and the encoder leaves them out for that level.
//! Payloads and topic names are `Bytes` slices of the frame they were read from.

use bytes::Bytes;

/// The protocol level a connection speaks, from its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// MQTT 3.1: protocol name `MQIsdp`, level 3.
    V31,
    /// MQTT 3.1.1: protocol name `MQTT`, level 4.
    V311,
    /// MQTT 5.0: protocol name `MQTT`, level 5.
    V5,
}

impl Level {
    pub fn is_v5(self) -> bool {
        self == Level::V5
    }
}

/// Quality of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    pub fn from_bits(bits: u8) -> Option<QoS> {
        match bits {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// A UTF-8 string that is a slice of a received frame (topic names), checked once.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct ByteStr(Bytes);

impl ByteStr {
    /// `None` unless `bytes` is UTF-8.
    pub fn from_utf8(bytes: Bytes) -> Option<ByteStr> {
        std::str::from_utf8(&bytes).ok()?;
        Some(ByteStr(bytes))
    }

    pub fn from_static(s: &'static str) -> ByteStr {
        ByteStr(Bytes::from_static(s.as_bytes()))
    }

    pub fn as_str(&self) -> &str {
        // Checked at construction; an empty fallback keeps this panic-free.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl From<String> for ByteStr {
    fn from(s: String) -> Self {
        ByteStr(Bytes::from(s))
    }
}

impl From<&str> for ByteStr {
    fn from(s: &str) -> Self {
        ByteStr(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl std::fmt::Debug for ByteStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for ByteStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// MQTT 5 properties. One struct for every packet type; the decoder refuses a property
/// the packet type does not allow (a protocol error), and a repeated one except user
/// properties (and subscription identifiers in PUBLISH). Level 3/4 packets have none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// 0x01, PUBLISH, will.
    pub payload_format_indicator: Option<u8>,
    /// 0x02, PUBLISH, will. Seconds.
    pub message_expiry_interval: Option<u32>,
    /// 0x03, PUBLISH, will.
    pub content_type: Option<String>,
    /// 0x08, PUBLISH, will.
    pub response_topic: Option<String>,
    /// 0x09, PUBLISH, will.
    pub correlation_data: Option<Bytes>,
    /// 0x0B, PUBLISH (repeatable, server to client), SUBSCRIBE (at most one).
    /// Values 1..=268,435,455.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11, CONNECT, CONNACK, DISCONNECT. Seconds.
    pub session_expiry_interval: Option<u32>,
    /// 0x12, CONNACK.
    pub assigned_client_identifier: Option<String>,
    /// 0x13, CONNACK. Seconds.
    pub server_keep_alive: Option<u16>,
    /// 0x15, CONNECT, CONNACK, AUTH.
    pub authentication_method: Option<String>,
    /// 0x16, CONNECT, CONNACK, AUTH.
    pub authentication_data: Option<Bytes>,
    /// 0x17, CONNECT.
    pub request_problem_information: Option<u8>,
    /// 0x18, will. Seconds.
    pub will_delay_interval: Option<u32>,
    /// 0x19, CONNECT.
    pub request_response_information: Option<u8>,
    /// 0x1A, CONNACK.
    pub response_information: Option<String>,
    /// 0x1C, CONNACK, DISCONNECT.
    pub server_reference: Option<String>,
    /// 0x1F, CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH.
    pub reason_string: Option<String>,
    /// 0x21, CONNECT, CONNACK. Never 0.
    pub receive_maximum: Option<u16>,
    /// 0x22, CONNECT, CONNACK.
    pub topic_alias_maximum: Option<u16>,
    /// 0x23, PUBLISH. Never 0.
    pub topic_alias: Option<u16>,
    /// 0x24, CONNACK. 0 or 1.
    pub maximum_qos: Option<u8>,
    /// 0x25, CONNACK. 0 or 1.
    pub retain_available: Option<u8>,
    /// 0x26, every packet with properties; repeatable, order kept.
    pub user_properties: Vec<(String, String)>,
    /// 0x27, CONNECT, CONNACK. Never 0.
    pub maximum_packet_size: Option<u32>,
    /// 0x28, CONNACK. 0 or 1.
    pub wildcard_subscription_available: Option<u8>,
    /// 0x29, CONNACK. 0 or 1.
    pub subscription_identifiers_available: Option<u8>,
    /// 0x2A, CONNACK. 0 or 1.
    pub shared_subscription_available: Option<u8>,
}

impl Properties {
    pub fn is_empty(&self) -> bool {
        *self == Properties::default()
    }
}

/// CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub level: Level,
    /// May be empty (the server assigns one when it allows that).
    pub client_id: String,
    /// "Clean session" in 3.x, "clean start" in 5.
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    pub will: Option<Will>,
    pub properties: Properties,
}

/// The last will carried in CONNECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Will properties (v5): will delay, expiry, content type, response topic, ...
    pub properties: Properties,
}

/// CONNACK. `code` is the 3.x return code (0-5) or the v5 reason code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    pub code: u8,
    pub properties: Properties,
}

/// PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// May be empty in v5 when a topic alias stands for it.
    pub topic: ByteStr,
    /// Present exactly when `qos` is not 0.
    pub packet_id: Option<u16>,
    pub payload: Bytes,
    pub properties: Properties,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP. `reason` is 0 (success) in 3.x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub packet_id: u16,
    pub reason: u8,
    pub properties: Properties,
}

impl Ack {
    pub fn new(packet_id: u16) -> Ack {
        Ack {
            packet_id,
            reason: 0,
            properties: Properties::default(),
        }
    }
}

/// One topic filter of a SUBSCRIBE with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: String,
    /// The maximum QoS asked for.
    pub qos: QoS,
    /// v5 options; false/0 in 3.x.
    pub no_local: bool,
    pub retain_as_published: bool,
    /// 0: send retained on subscribe, 1: only if the subscription is new, 2: never.
    pub retain_handling: u8,
}

/// SUBSCRIBE: at least one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    pub filters: Vec<SubscribeFilter>,
    pub properties: Properties,
}

/// SUBACK: one return/reason code per filter (granted QoS 0-2, or >= 0x80 a failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    pub codes: Vec<u8>,
    pub properties: Properties,
}

/// UNSUBSCRIBE: at least one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub filters: Vec<String>,
    pub properties: Properties,
}

/// UNSUBACK: v5 carries one reason code per filter; 3.x carries none (empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    pub codes: Vec<u8>,
    pub properties: Properties,
}

/// DISCONNECT. 3.x has no body: reason 0, no properties. A v5 DISCONNECT with a
/// remaining length of 0 means reason 0 (normal) and no properties.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Disconnect {
    pub reason: u8,
    pub properties: Properties,
}

/// AUTH (v5 only). A remaining length of 0 means reason 0 (success).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    pub reason: u8,
    pub properties: Properties,
}

/// Any control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    Auth(Auth),
}

impl Packet {
    /// The packet type's name as the specification spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}

/// MQTT 5 reason codes the server uses (also the values of 3.x SUBACK failure 0x80).
pub mod reason {
    pub const SUCCESS: u8 = 0x00;
    pub const GRANTED_QOS_1: u8 = 0x01;
    pub const GRANTED_QOS_2: u8 = 0x02;
    pub const DISCONNECT_WITH_WILL: u8 = 0x04;
    pub const NO_MATCHING_SUBSCRIBERS: u8 = 0x10;
    pub const NO_SUBSCRIPTION_EXISTED: u8 = 0x11;
    pub const UNSPECIFIED_ERROR: u8 = 0x80;
    pub const MALFORMED_PACKET: u8 = 0x81;
    pub const PROTOCOL_ERROR: u8 = 0x82;
    pub const IMPLEMENTATION_SPECIFIC_ERROR: u8 = 0x83;
    pub const UNSUPPORTED_PROTOCOL_VERSION: u8 = 0x84;
    pub const CLIENT_IDENTIFIER_NOT_VALID: u8 = 0x85;
    pub const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
    pub const NOT_AUTHORIZED: u8 = 0x87;
    pub const SERVER_UNAVAILABLE: u8 = 0x88;
    pub const SERVER_BUSY: u8 = 0x89;
    pub const SERVER_SHUTTING_DOWN: u8 = 0x8B;
    pub const BAD_AUTHENTICATION_METHOD: u8 = 0x8C;
    pub const KEEP_ALIVE_TIMEOUT: u8 = 0x8D;
    pub const SESSION_TAKEN_OVER: u8 = 0x8E;
    pub const TOPIC_FILTER_INVALID: u8 = 0x8F;
    pub const TOPIC_NAME_INVALID: u8 = 0x90;
    pub const PACKET_IDENTIFIER_IN_USE: u8 = 0x91;
    pub const PACKET_IDENTIFIER_NOT_FOUND: u8 = 0x92;
    pub const RECEIVE_MAXIMUM_EXCEEDED: u8 = 0x93;
    pub const TOPIC_ALIAS_INVALID: u8 = 0x94;
    pub const PACKET_TOO_LARGE: u8 = 0x95;
    pub const MESSAGE_RATE_TOO_HIGH: u8 = 0x96;
    pub const QUOTA_EXCEEDED: u8 = 0x97;
    pub const ADMINISTRATIVE_ACTION: u8 = 0x98;
    pub const PAYLOAD_FORMAT_INVALID: u8 = 0x99;
    pub const RETAIN_NOT_SUPPORTED: u8 = 0x9A;
    pub const QOS_NOT_SUPPORTED: u8 = 0x9B;
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0x9E;
    pub const CONNECTION_RATE_EXCEEDED: u8 = 0x9F;
    pub const MAXIMUM_CONNECT_TIME: u8 = 0xA0;
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: u8 = 0xA1;
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: u8 = 0xA2;

    /// 3.x CONNACK return codes.
    pub const V3_UNACCEPTABLE_PROTOCOL_VERSION: u8 = 0x01;
    pub const V3_IDENTIFIER_REJECTED: u8 = 0x02;
    pub const V3_SERVER_UNAVAILABLE: u8 = 0x03;
    pub const V3_BAD_USER_NAME_OR_PASSWORD: u8 = 0x04;
    pub const V3_NOT_AUTHORIZED: u8 = 0x05;
}
