//! MQTT 5 properties (section 2.2.2): which packet may carry which, how each is read and
//! written, and the value rules the specification makes protocol errors.
//!
//! Owns: the property table (identifier, name, carriers), duplicate detection, and the
//! property length that prefixes every property block.
//!
//! Must never: accept a property its packet type does not allow or a repeated one (except
//! user properties, and subscription identifiers in PUBLISH), or write one either.

use bytes::{BufMut, Bytes, BytesMut};
use nom::Parser;
use nom::error::context;
use nom::number::complete::{be_u16, be_u32};

use super::EncodeError;
use super::error::Fault;
use super::packet::Properties;
use super::wire::{
    MAX_VARINT, PResult, binary_in, byte, check_len, put_binary, put_varint, string, varint,
    varint_len,
};

/// What a property block belongs to: a packet type, or the will of a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carrier {
    Connect,
    ConnAck,
    Publish,
    Will,
    /// PUBACK, PUBREC, PUBREL and PUBCOMP share one set.
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

impl Carrier {
    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// One row of the property table of MQTT 5.0 section 2.2.2.2.
struct Spec {
    id: u8,
    name: &'static str,
    carriers: u16,
}

const fn carriers(list: &[Carrier]) -> u16 {
    let mut mask = 0;
    let mut rest = list;
    while let [first, tail @ ..] = rest {
        mask |= first.bit();
        rest = tail;
    }
    mask
}

use Carrier::{
    Ack, Auth, ConnAck, Connect, Disconnect, Publish, SubAck, Subscribe, UnsubAck, Unsubscribe,
    Will,
};

const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
const CONTENT_TYPE: u8 = 0x03;
const RESPONSE_TOPIC: u8 = 0x08;
const CORRELATION_DATA: u8 = 0x09;
const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
const SERVER_KEEP_ALIVE: u8 = 0x13;
const AUTHENTICATION_METHOD: u8 = 0x15;
const AUTHENTICATION_DATA: u8 = 0x16;
const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
const WILL_DELAY_INTERVAL: u8 = 0x18;
const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
const RESPONSE_INFORMATION: u8 = 0x1A;
const SERVER_REFERENCE: u8 = 0x1C;
const REASON_STRING: u8 = 0x1F;
const RECEIVE_MAXIMUM: u8 = 0x21;
const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
const TOPIC_ALIAS: u8 = 0x23;
const MAXIMUM_QOS: u8 = 0x24;
const RETAIN_AVAILABLE: u8 = 0x25;
const USER_PROPERTY: u8 = 0x26;
const MAXIMUM_PACKET_SIZE: u8 = 0x27;
const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

const fn spec(id: u8, name: &'static str, list: &[Carrier]) -> Spec {
    Spec {
        id,
        name,
        carriers: carriers(list),
    }
}

/// Identifier order, which is also the order the encoder writes them in.
const TABLE: &[Spec] = &[
    spec(
        PAYLOAD_FORMAT_INDICATOR,
        "payload format indicator",
        &[Publish, Will],
    ),
    spec(
        MESSAGE_EXPIRY_INTERVAL,
        "message expiry interval",
        &[Publish, Will],
    ),
    spec(CONTENT_TYPE, "content type", &[Publish, Will]),
    spec(RESPONSE_TOPIC, "response topic", &[Publish, Will]),
    spec(CORRELATION_DATA, "correlation data", &[Publish, Will]),
    spec(
        SUBSCRIPTION_IDENTIFIER,
        "subscription identifier",
        &[Publish, Subscribe],
    ),
    spec(
        SESSION_EXPIRY_INTERVAL,
        "session expiry interval",
        &[Connect, ConnAck, Disconnect],
    ),
    spec(
        ASSIGNED_CLIENT_IDENTIFIER,
        "assigned client identifier",
        &[ConnAck],
    ),
    spec(SERVER_KEEP_ALIVE, "server keep alive", &[ConnAck]),
    spec(
        AUTHENTICATION_METHOD,
        "authentication method",
        &[Connect, ConnAck, Auth],
    ),
    spec(
        AUTHENTICATION_DATA,
        "authentication data",
        &[Connect, ConnAck, Auth],
    ),
    spec(
        REQUEST_PROBLEM_INFORMATION,
        "request problem information",
        &[Connect],
    ),
    spec(WILL_DELAY_INTERVAL, "will delay interval", &[Will]),
    spec(
        REQUEST_RESPONSE_INFORMATION,
        "request response information",
        &[Connect],
    ),
    spec(RESPONSE_INFORMATION, "response information", &[ConnAck]),
    spec(SERVER_REFERENCE, "server reference", &[ConnAck, Disconnect]),
    spec(
        REASON_STRING,
        "reason string",
        &[ConnAck, Ack, SubAck, UnsubAck, Disconnect, Auth],
    ),
    spec(RECEIVE_MAXIMUM, "receive maximum", &[Connect, ConnAck]),
    spec(
        TOPIC_ALIAS_MAXIMUM,
        "topic alias maximum",
        &[Connect, ConnAck],
    ),
    spec(TOPIC_ALIAS, "topic alias", &[Publish]),
    spec(MAXIMUM_QOS, "maximum QoS", &[ConnAck]),
    spec(RETAIN_AVAILABLE, "retain available", &[ConnAck]),
    spec(
        USER_PROPERTY,
        "user property",
        &[
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
        ],
    ),
    spec(
        MAXIMUM_PACKET_SIZE,
        "maximum packet size",
        &[Connect, ConnAck],
    ),
    spec(
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        "wildcard subscription available",
        &[ConnAck],
    ),
    spec(
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        "subscription identifier available",
        &[ConnAck],
    ),
    spec(
        SHARED_SUBSCRIPTION_AVAILABLE,
        "shared subscription available",
        &[ConnAck],
    ),
];

fn lookup(id: u8) -> Option<&'static Spec> {
    TABLE.iter().find(|s| s.id == id)
}

fn allowed(spec: &Spec, carrier: Carrier) -> bool {
    spec.carriers & carrier.bit() != 0
}

fn name_of(id: u8) -> &'static str {
    lookup(id).map_or("unknown", |s| s.name)
}

// ---------------------------------------------------------------------------------------
// Reading

/// A property block: the property length, then properties filling exactly that many bytes.
pub(crate) fn properties<'a>(
    input: &'a [u8],
    frame: &Bytes,
    carrier: Carrier,
) -> PResult<'a, Properties> {
    let (rest, len) = context("property length", varint).parse_complete(input)?;
    // A length past what remains cannot be satisfied: refuse before looking further.
    let Some(block) = rest.get(..len as usize) else {
        return Err(nom::Err::Failure(Fault::malformed(format!(
            "the property length ({len}) runs past the end of the packet"
        ))));
    };
    let after = rest.get(len as usize..).unwrap_or_default();
    let mut props = Properties::default();
    let mut input = block;
    while !input.is_empty() {
        input = property(input, frame, carrier, &mut props)?;
    }
    Ok((after, props))
}

fn duplicate(id: u8) -> nom::Err<Fault> {
    nom::Err::Failure(Fault::protocol(format!(
        "the {} property (0x{id:02X}) appears more than once",
        name_of(id)
    )))
}

fn bad_value(id: u8, value: impl std::fmt::Display, rule: &str) -> nom::Err<Fault> {
    nom::Err::Failure(Fault::protocol(format!(
        "the {} property (0x{id:02X}) is {value}, {rule}",
        name_of(id)
    )))
}

/// Stores `value` in an empty slot; a filled slot means the property was repeated.
fn once<T>(slot: &mut Option<T>, id: u8, value: T) -> Result<(), nom::Err<Fault>> {
    if slot.is_some() {
        return Err(duplicate(id));
    }
    *slot = Some(value);
    Ok(())
}

/// A byte property that only takes 0 or 1.
fn flag(input: &[u8], id: u8) -> PResult<'_, u8> {
    let (rest, value) = context("property value", byte).parse_complete(input)?;
    if value > 1 {
        return Err(bad_value(id, value, "but it must be 0 or 1"));
    }
    Ok((rest, value))
}

fn u16_value(input: &[u8]) -> PResult<'_, u16> {
    context("property value", be_u16).parse_complete(input)
}

fn u32_value(input: &[u8]) -> PResult<'_, u32> {
    context("property value", be_u32).parse_complete(input)
}

/// Reads one property into `props`; returns the input after it.
fn property<'a>(
    input: &'a [u8],
    frame: &Bytes,
    carrier: Carrier,
    props: &mut Properties,
) -> Result<&'a [u8], nom::Err<Fault>> {
    let (input, id) = context("property identifier", byte).parse_complete(input)?;
    let Some(spec) = lookup(id) else {
        return Err(nom::Err::Failure(Fault::malformed(format!(
            "0x{id:02X} is not a property identifier"
        ))));
    };
    if !allowed(spec, carrier) {
        return Err(nom::Err::Failure(Fault::protocol(format!(
            "the {} property (0x{id:02X}) is not allowed here",
            spec.name
        ))));
    }
    let p = props;
    let rest = match id {
        PAYLOAD_FORMAT_INDICATOR => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.payload_format_indicator, id, v)?;
            rest
        }
        MESSAGE_EXPIRY_INTERVAL => {
            let (rest, v) = u32_value(input)?;
            once(&mut p.message_expiry_interval, id, v)?;
            rest
        }
        CONTENT_TYPE => {
            let (rest, v) = string("content type")(input)?;
            once(&mut p.content_type, id, v)?;
            rest
        }
        RESPONSE_TOPIC => {
            let (rest, v) = string("response topic")(input)?;
            once(&mut p.response_topic, id, v)?;
            rest
        }
        CORRELATION_DATA => {
            let (rest, v) =
                context("correlation data", |i| binary_in(frame, i)).parse_complete(input)?;
            once(&mut p.correlation_data, id, v)?;
            rest
        }
        SUBSCRIPTION_IDENTIFIER => {
            let (rest, v) = context("subscription identifier", varint).parse_complete(input)?;
            if v == 0 {
                return Err(bad_value(id, v, "but it must be 1 to 268,435,455"));
            }
            if carrier == Subscribe && !p.subscription_identifiers.is_empty() {
                return Err(duplicate(id));
            }
            p.subscription_identifiers.push(v);
            rest
        }
        SESSION_EXPIRY_INTERVAL => {
            let (rest, v) = u32_value(input)?;
            once(&mut p.session_expiry_interval, id, v)?;
            rest
        }
        ASSIGNED_CLIENT_IDENTIFIER => {
            let (rest, v) = string("assigned client identifier")(input)?;
            once(&mut p.assigned_client_identifier, id, v)?;
            rest
        }
        SERVER_KEEP_ALIVE => {
            let (rest, v) = u16_value(input)?;
            once(&mut p.server_keep_alive, id, v)?;
            rest
        }
        AUTHENTICATION_METHOD => {
            let (rest, v) = string("authentication method")(input)?;
            once(&mut p.authentication_method, id, v)?;
            rest
        }
        AUTHENTICATION_DATA => {
            let (rest, v) =
                context("authentication data", |i| binary_in(frame, i)).parse_complete(input)?;
            once(&mut p.authentication_data, id, v)?;
            rest
        }
        REQUEST_PROBLEM_INFORMATION => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.request_problem_information, id, v)?;
            rest
        }
        WILL_DELAY_INTERVAL => {
            let (rest, v) = u32_value(input)?;
            once(&mut p.will_delay_interval, id, v)?;
            rest
        }
        REQUEST_RESPONSE_INFORMATION => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.request_response_information, id, v)?;
            rest
        }
        RESPONSE_INFORMATION => {
            let (rest, v) = string("response information")(input)?;
            once(&mut p.response_information, id, v)?;
            rest
        }
        SERVER_REFERENCE => {
            let (rest, v) = string("server reference")(input)?;
            once(&mut p.server_reference, id, v)?;
            rest
        }
        REASON_STRING => {
            let (rest, v) = string("reason string")(input)?;
            once(&mut p.reason_string, id, v)?;
            rest
        }
        RECEIVE_MAXIMUM => {
            let (rest, v) = u16_value(input)?;
            if v == 0 {
                return Err(bad_value(id, v, "but it must be at least 1"));
            }
            once(&mut p.receive_maximum, id, v)?;
            rest
        }
        TOPIC_ALIAS_MAXIMUM => {
            let (rest, v) = u16_value(input)?;
            once(&mut p.topic_alias_maximum, id, v)?;
            rest
        }
        TOPIC_ALIAS => {
            let (rest, v) = u16_value(input)?;
            if v == 0 {
                return Err(bad_value(id, v, "but it must be at least 1"));
            }
            once(&mut p.topic_alias, id, v)?;
            rest
        }
        MAXIMUM_QOS => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.maximum_qos, id, v)?;
            rest
        }
        RETAIN_AVAILABLE => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.retain_available, id, v)?;
            rest
        }
        USER_PROPERTY => {
            let (rest, key) = string("user property name")(input)?;
            let (rest, value) = string("user property value")(rest)?;
            p.user_properties.push((key, value));
            rest
        }
        MAXIMUM_PACKET_SIZE => {
            let (rest, v) = u32_value(input)?;
            if v == 0 {
                return Err(bad_value(id, v, "but it must be at least 1"));
            }
            once(&mut p.maximum_packet_size, id, v)?;
            rest
        }
        WILDCARD_SUBSCRIPTION_AVAILABLE => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.wildcard_subscription_available, id, v)?;
            rest
        }
        SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.subscription_identifiers_available, id, v)?;
            rest
        }
        SHARED_SUBSCRIPTION_AVAILABLE => {
            let (rest, v) = flag(input, id)?;
            once(&mut p.shared_subscription_available, id, v)?;
            rest
        }
        // Every identifier of the table is handled above.
        _ => {
            return Err(nom::Err::Failure(Fault::malformed(format!(
                "0x{id:02X} is not a property identifier"
            ))));
        }
    };
    Ok(rest)
}

// ---------------------------------------------------------------------------------------
// Writing

/// Calls `f` with the identifier of every property set in `p` (once per identifier).
fn each_set(
    p: &Properties,
    mut f: impl FnMut(u8) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let set = [
        (
            PAYLOAD_FORMAT_INDICATOR,
            p.payload_format_indicator.is_some(),
        ),
        (MESSAGE_EXPIRY_INTERVAL, p.message_expiry_interval.is_some()),
        (CONTENT_TYPE, p.content_type.is_some()),
        (RESPONSE_TOPIC, p.response_topic.is_some()),
        (CORRELATION_DATA, p.correlation_data.is_some()),
        (
            SUBSCRIPTION_IDENTIFIER,
            !p.subscription_identifiers.is_empty(),
        ),
        (SESSION_EXPIRY_INTERVAL, p.session_expiry_interval.is_some()),
        (
            ASSIGNED_CLIENT_IDENTIFIER,
            p.assigned_client_identifier.is_some(),
        ),
        (SERVER_KEEP_ALIVE, p.server_keep_alive.is_some()),
        (AUTHENTICATION_METHOD, p.authentication_method.is_some()),
        (AUTHENTICATION_DATA, p.authentication_data.is_some()),
        (
            REQUEST_PROBLEM_INFORMATION,
            p.request_problem_information.is_some(),
        ),
        (WILL_DELAY_INTERVAL, p.will_delay_interval.is_some()),
        (
            REQUEST_RESPONSE_INFORMATION,
            p.request_response_information.is_some(),
        ),
        (RESPONSE_INFORMATION, p.response_information.is_some()),
        (SERVER_REFERENCE, p.server_reference.is_some()),
        (REASON_STRING, p.reason_string.is_some()),
        (RECEIVE_MAXIMUM, p.receive_maximum.is_some()),
        (TOPIC_ALIAS_MAXIMUM, p.topic_alias_maximum.is_some()),
        (TOPIC_ALIAS, p.topic_alias.is_some()),
        (MAXIMUM_QOS, p.maximum_qos.is_some()),
        (RETAIN_AVAILABLE, p.retain_available.is_some()),
        (USER_PROPERTY, !p.user_properties.is_empty()),
        (MAXIMUM_PACKET_SIZE, p.maximum_packet_size.is_some()),
        (
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            p.wildcard_subscription_available.is_some(),
        ),
        (
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            p.subscription_identifiers_available.is_some(),
        ),
        (
            SHARED_SUBSCRIPTION_AVAILABLE,
            p.shared_subscription_available.is_some(),
        ),
    ];
    for (id, present) in set {
        if present {
            f(id)?;
        }
    }
    Ok(())
}

/// Refuses properties `carrier` may not carry, strings too long for their length prefix and
/// subscription identifiers out of range, so that what is written is what a peer accepts.
pub(crate) fn check(
    p: &Properties,
    carrier: Carrier,
    packet: &'static str,
) -> Result<(), EncodeError> {
    if p.is_empty() {
        return Ok(());
    }
    each_set(p, |id| match lookup(id) {
        Some(spec) if allowed(spec, carrier) => Ok(()),
        _ => Err(EncodeError::PropertyNotAllowed {
            packet,
            property: name_of(id),
        }),
    })?;
    let strings = [
        ("content type", p.content_type.as_ref().map(String::len)),
        ("response topic", p.response_topic.as_ref().map(String::len)),
        (
            "correlation data",
            p.correlation_data.as_ref().map(Bytes::len),
        ),
        (
            "assigned client identifier",
            p.assigned_client_identifier.as_ref().map(String::len),
        ),
        (
            "authentication method",
            p.authentication_method.as_ref().map(String::len),
        ),
        (
            "authentication data",
            p.authentication_data.as_ref().map(Bytes::len),
        ),
        (
            "response information",
            p.response_information.as_ref().map(String::len),
        ),
        (
            "server reference",
            p.server_reference.as_ref().map(String::len),
        ),
        ("reason string", p.reason_string.as_ref().map(String::len)),
    ];
    for (field, len) in strings {
        check_len(packet, field, len.unwrap_or(0))?;
    }
    for (key, value) in &p.user_properties {
        check_len(packet, "user property name", key.len())?;
        check_len(packet, "user property value", value.len())?;
    }
    if p.subscription_identifiers
        .iter()
        .any(|&id| id == 0 || id > MAX_VARINT)
    {
        return Err(EncodeError::Invalid {
            packet,
            problem: "a subscription identifier must be 1 to 268,435,455",
        });
    }
    if carrier == Subscribe && p.subscription_identifiers.len() > 1 {
        return Err(EncodeError::Invalid {
            packet,
            problem: "a SUBSCRIBE carries at most one subscription identifier",
        });
    }
    Ok(())
}

/// Bytes of the properties themselves, without the property length in front.
pub(crate) fn content_len(p: &Properties) -> usize {
    if p.is_empty() {
        return 0;
    }
    let string = |s: &Option<String>| s.as_ref().map_or(0, |s| 3 + s.len());
    let binary = |b: &Option<Bytes>| b.as_ref().map_or(0, |b| 3 + b.len());
    let byte = |v: &Option<u8>| v.map_or(0, |_| 2);
    let two = |v: &Option<u16>| v.map_or(0, |_| 3);
    let four = |v: &Option<u32>| v.map_or(0, |_| 5);
    byte(&p.payload_format_indicator)
        + four(&p.message_expiry_interval)
        + string(&p.content_type)
        + string(&p.response_topic)
        + binary(&p.correlation_data)
        + p.subscription_identifiers
            .iter()
            .map(|&id| 1 + varint_len(id as usize))
            .sum::<usize>()
        + four(&p.session_expiry_interval)
        + string(&p.assigned_client_identifier)
        + two(&p.server_keep_alive)
        + string(&p.authentication_method)
        + binary(&p.authentication_data)
        + byte(&p.request_problem_information)
        + four(&p.will_delay_interval)
        + byte(&p.request_response_information)
        + string(&p.response_information)
        + string(&p.server_reference)
        + string(&p.reason_string)
        + two(&p.receive_maximum)
        + two(&p.topic_alias_maximum)
        + two(&p.topic_alias)
        + byte(&p.maximum_qos)
        + byte(&p.retain_available)
        + p.user_properties
            .iter()
            .map(|(k, v)| 5 + k.len() + v.len())
            .sum::<usize>()
        + four(&p.maximum_packet_size)
        + byte(&p.wildcard_subscription_available)
        + byte(&p.subscription_identifiers_available)
        + byte(&p.shared_subscription_available)
}

/// Bytes of a property block: the property length and the properties.
pub(crate) fn block_len(p: &Properties) -> usize {
    let len = content_len(p);
    varint_len(len) + len
}

fn text(s: &Option<String>) -> Option<&[u8]> {
    s.as_deref().map(str::as_bytes)
}

/// Writes a property block (property length, then the properties in identifier order).
/// `p` must have passed [`check`].
pub(crate) fn write(p: &Properties, out: &mut BytesMut) {
    let len = content_len(p);
    put_varint(out, len);
    if len == 0 {
        return;
    }
    let byte = |out: &mut BytesMut, id: u8, v: Option<u8>| {
        if let Some(v) = v {
            out.put_u8(id);
            out.put_u8(v);
        }
    };
    let two = |out: &mut BytesMut, id: u8, v: Option<u16>| {
        if let Some(v) = v {
            out.put_u8(id);
            out.put_u16(v);
        }
    };
    let four = |out: &mut BytesMut, id: u8, v: Option<u32>| {
        if let Some(v) = v {
            out.put_u8(id);
            out.put_u32(v);
        }
    };
    let data = |out: &mut BytesMut, id: u8, v: Option<&[u8]>| {
        if let Some(v) = v {
            out.put_u8(id);
            put_binary(out, v);
        }
    };
    byte(out, PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator);
    four(out, MESSAGE_EXPIRY_INTERVAL, p.message_expiry_interval);
    data(out, CONTENT_TYPE, text(&p.content_type));
    data(out, RESPONSE_TOPIC, text(&p.response_topic));
    data(out, CORRELATION_DATA, p.correlation_data.as_deref());
    for &id in &p.subscription_identifiers {
        out.put_u8(SUBSCRIPTION_IDENTIFIER);
        put_varint(out, id as usize);
    }
    four(out, SESSION_EXPIRY_INTERVAL, p.session_expiry_interval);
    data(
        out,
        ASSIGNED_CLIENT_IDENTIFIER,
        text(&p.assigned_client_identifier),
    );
    two(out, SERVER_KEEP_ALIVE, p.server_keep_alive);
    data(out, AUTHENTICATION_METHOD, text(&p.authentication_method));
    data(out, AUTHENTICATION_DATA, p.authentication_data.as_deref());
    byte(
        out,
        REQUEST_PROBLEM_INFORMATION,
        p.request_problem_information,
    );
    four(out, WILL_DELAY_INTERVAL, p.will_delay_interval);
    byte(
        out,
        REQUEST_RESPONSE_INFORMATION,
        p.request_response_information,
    );
    data(out, RESPONSE_INFORMATION, text(&p.response_information));
    data(out, SERVER_REFERENCE, text(&p.server_reference));
    data(out, REASON_STRING, text(&p.reason_string));
    two(out, RECEIVE_MAXIMUM, p.receive_maximum);
    two(out, TOPIC_ALIAS_MAXIMUM, p.topic_alias_maximum);
    two(out, TOPIC_ALIAS, p.topic_alias);
    byte(out, MAXIMUM_QOS, p.maximum_qos);
    byte(out, RETAIN_AVAILABLE, p.retain_available);
    for (key, value) in &p.user_properties {
        out.put_u8(USER_PROPERTY);
        put_binary(out, key.as_bytes());
        put_binary(out, value.as_bytes());
    }
    four(out, MAXIMUM_PACKET_SIZE, p.maximum_packet_size);
    byte(
        out,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        p.wildcard_subscription_available,
    );
    byte(
        out,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        p.subscription_identifiers_available,
    );
    byte(
        out,
        SHARED_SUBSCRIPTION_AVAILABLE,
        p.shared_subscription_available,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &'static [u8], carrier: Carrier) -> Result<Properties, Fault> {
        let frame = Bytes::from_static(bytes);
        match properties(&frame, &frame, carrier) {
            Ok(([], p)) => Ok(p),
            Ok(_) => panic!("left bytes"),
            Err(nom::Err::Error(f) | nom::Err::Failure(f)) => Err(f),
            Err(nom::Err::Incomplete(_)) => panic!("incomplete"),
        }
    }

    #[test]
    fn table_is_in_identifier_order_without_duplicates() {
        assert!(TABLE.windows(2).all(|w| w[0].id < w[1].id));
        assert_eq!(TABLE.len(), 27);
    }

    #[test]
    fn reads_and_writes_every_property() {
        let p = Properties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(7),
            content_type: Some("text/plain".into()),
            response_topic: Some("r".into()),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            subscription_identifiers: vec![1, 300, MAX_VARINT],
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
            topic_alias: Some(9),
            ..Properties::default()
        };
        check(&p, Carrier::Publish, "PUBLISH").unwrap();
        let mut out = BytesMut::new();
        write(&p, &mut out);
        assert_eq!(out.len(), block_len(&p));
        let frame = out.freeze();
        let (rest, back) = properties(&frame, &frame, Carrier::Publish).unwrap();
        assert!(rest.is_empty());
        assert_eq!(back, p);
    }

    #[test]
    fn refuses_duplicates_and_misplaced_properties() {
        let dup = read(b"\x06\x23\x00\x01\x23\x00\x02", Carrier::Publish).unwrap_err();
        assert_eq!(dup.code, 0x82);
        assert!(dup.problem.contains("topic alias"), "{}", dup.problem);
        let misplaced = read(b"\x03\x23\x00\x01", Carrier::Connect).unwrap_err();
        assert_eq!(misplaced.code, 0x82);
        let two_ids = read(b"\x04\x0b\x01\x0b\x02", Carrier::Subscribe).unwrap_err();
        assert_eq!(two_ids.code, 0x82);
        let ids = read(b"\x04\x0b\x01\x0b\x02", Carrier::Publish).unwrap();
        assert_eq!(ids.subscription_identifiers, vec![1, 2]);
        assert_eq!(
            read(b"\x02\x0b\x00", Carrier::Publish).unwrap_err().code,
            0x82
        );
        assert_eq!(
            read(b"\x02\x01\x02", Carrier::Publish).unwrap_err().code,
            0x82
        );
        assert_eq!(
            read(b"\x03\x21\x00\x00", Carrier::Connect)
                .unwrap_err()
                .code,
            0x82
        );
        assert_eq!(
            read(b"\x02\x7f\x00", Carrier::Connect).unwrap_err().code,
            0x81
        );
        // Length past the end, value past the block.
        assert_eq!(
            read(b"\x05\x21\x00", Carrier::Connect).unwrap_err().code,
            0x81
        );
        assert_eq!(
            read(b"\x02\x21\x00\x05", Carrier::Connect)
                .unwrap_err()
                .code,
            0x81
        );
    }

    #[test]
    fn check_refuses_what_the_carrier_may_not_hold() {
        let p = Properties {
            topic_alias: Some(1),
            ..Properties::default()
        };
        assert!(matches!(
            check(&p, Carrier::Connect, "CONNECT"),
            Err(EncodeError::PropertyNotAllowed { .. })
        ));
    }
}
