//! The MQTT decoder: one packet at a time from the front of a byte stream, in either
//! direction, for the level a connection speaks.
//!
//! Owns: the fixed header (type, reserved flags, remaining length), the packet size limit
//! (checked as soon as the fixed header is complete, before the body is buffered), the
//! bodies of every control packet of levels 3, 4 and 5, and learning the level from CONNECT.
//!
//! Must never: consume bytes when it returns `Ok(None)`, copy payloads or topic names (they
//! are slices of the received frame), give different results for the same bytes split
//! differently, read a body before all of it is buffered, or panic on any input.

use bytes::{Bytes, BytesMut};
use nom::Parser;
use nom::error::context;
use nom::number::complete::{be_u8, be_u16};

use super::error::{DecodeError, Fault};
use super::packet::{
    Ack, Auth, ByteStr, ConnAck, Connect, Disconnect, Level, Packet, Properties, Publish, QoS,
    SubAck, Subscribe, SubscribeFilter, UnsubAck, Unsubscribe, Will, reason,
};
use super::properties::{Carrier, properties};
use super::wire::{HeaderLength, PResult, binary, binary_in, header_length, string};

pub(crate) const CONNECT: u8 = 1;
pub(crate) const CONNACK: u8 = 2;
pub(crate) const PUBLISH: u8 = 3;
pub(crate) const PUBACK: u8 = 4;
pub(crate) const PUBREC: u8 = 5;
pub(crate) const PUBREL: u8 = 6;
pub(crate) const PUBCOMP: u8 = 7;
pub(crate) const SUBSCRIBE: u8 = 8;
pub(crate) const SUBACK: u8 = 9;
pub(crate) const UNSUBSCRIBE: u8 = 10;
pub(crate) const UNSUBACK: u8 = 11;
pub(crate) const PINGREQ: u8 = 12;
pub(crate) const PINGRESP: u8 = 13;
pub(crate) const DISCONNECT: u8 = 14;
pub(crate) const AUTH: u8 = 15;

/// The specification's name of a packet type (`"reserved"` for 0).
fn type_name(kind: u8) -> &'static str {
    match kind {
        CONNECT => "CONNECT",
        CONNACK => "CONNACK",
        PUBLISH => "PUBLISH",
        PUBACK => "PUBACK",
        PUBREC => "PUBREC",
        PUBREL => "PUBREL",
        PUBCOMP => "PUBCOMP",
        SUBSCRIBE => "SUBSCRIBE",
        SUBACK => "SUBACK",
        UNSUBSCRIBE => "UNSUBSCRIBE",
        UNSUBACK => "UNSUBACK",
        PINGREQ => "PINGREQ",
        PINGRESP => "PINGRESP",
        DISCONNECT => "DISCONNECT",
        AUTH => "AUTH",
        _ => "reserved",
    }
}

/// Decodes MQTT packets from a byte stream. A server makes one with [`Decoder::new`] per
/// connection (the level is learnt from the CONNECT, which must come first); a client makes
/// one with [`Decoder::with_level`].
///
/// A CONNECT is only accepted while the level is unknown: a second CONNECT is a protocol
/// error [MQTT-3.1.0-2], and a client never receives one.
#[derive(Debug, Clone)]
pub struct Decoder {
    level: Option<Level>,
    max_packet_size: usize,
}

impl Decoder {
    /// A server-side decoder: the first packet must be a CONNECT, which sets the level.
    /// `max_packet_size` bounds a whole packet, fixed header included.
    pub fn new(max_packet_size: usize) -> Decoder {
        Decoder {
            level: None,
            max_packet_size,
        }
    }

    /// A decoder for a connection whose level is known (a client's, after its CONNECT).
    pub fn with_level(level: Level, max_packet_size: usize) -> Decoder {
        Decoder {
            level: Some(level),
            max_packet_size,
        }
    }

    pub fn level(&self) -> Option<Level> {
        self.level
    }

    pub fn set_level(&mut self, level: Level) {
        self.level = Some(level);
    }

    pub fn set_max_packet_size(&mut self, max_packet_size: usize) {
        self.max_packet_size = max_packet_size;
    }

    pub fn max_packet_size(&self) -> usize {
        self.max_packet_size
    }

    /// Decodes one packet from the front of `buf` and advances `buf` past it. `Ok(None)`
    /// means more bytes are needed, and `buf` is untouched. After an error the connection
    /// must be closed: what is left in `buf` is unspecified.
    ///
    /// Checks run in stream order (first byte, remaining length, size limit, body), so the
    /// outcome never depends on how the stream was split into reads.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, DecodeError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        let kind = first >> 4;
        let flags = first & 0x0f;
        self.check_first_byte(kind, flags)?;
        let name = type_name(kind);
        let (remaining, len_bytes, minimal) = match header_length(buf.get(1..).unwrap_or_default())
        {
            HeaderLength::Incomplete => return Ok(None),
            HeaderLength::TooLong => {
                return Err(self.error(
                    reason::MALFORMED_PACKET,
                    format!(
                        "{name} packet is malformed: its remaining length is longer than 4 bytes"
                    ),
                ));
            }
            HeaderLength::Complete {
                value,
                len,
                minimal,
            } => (value, len, minimal),
        };
        if !minimal && self.level == Some(Level::V5) {
            return Err(self.error(reason::MALFORMED_PACKET, padded_length(name)));
        }
        let total = 1 + len_bytes + remaining;
        if total > self.max_packet_size {
            return Err(self.error(
                reason::PACKET_TOO_LARGE,
                format!(
                    "{name} packet of {total} bytes exceeds the maximum packet size of {} bytes",
                    self.max_packet_size
                ),
            ));
        }
        if buf.len() < total {
            return Ok(None);
        }
        let frame = buf.split_to(total).freeze();
        let body = frame.get(1 + len_bytes..).unwrap_or_default();
        let packet = match self.level {
            None => {
                let connect = connect(body, &frame, minimal)
                    .map_err(|(fault, level)| fault.into_error(name, level))?;
                self.level = Some(connect.level);
                Packet::Connect(Box::new(connect))
            }
            Some(level) => packet(kind, flags, level, body, &frame)
                .map_err(|fault| fault.into_error(name, Some(level)))?,
        };
        Ok(Some(packet))
    }

    fn error(&self, code: u8, message: String) -> DecodeError {
        DecodeError::new(code, message, self.level)
    }

    /// The rules the first byte alone decides: a known type that may come now, with the
    /// flags its type requires [MQTT-2.1.3-1, -2.2.2-1].
    fn check_first_byte(&self, kind: u8, flags: u8) -> Result<(), DecodeError> {
        let name = type_name(kind);
        match (kind, self.level) {
            (0, _) => {
                return Err(self.error(
                    reason::MALFORMED_PACKET,
                    "packet type 0 is malformed: the type is reserved".into(),
                ));
            }
            (CONNECT, None) => {}
            (_, None) => {
                return Err(self.error(
                    reason::PROTOCOL_ERROR,
                    format!("{name} packet breaks the protocol: the first packet must be CONNECT"),
                ));
            }
            (CONNECT, Some(_)) => {
                return Err(self.error(
                    reason::PROTOCOL_ERROR,
                    "CONNECT packet breaks the protocol: this connection already sent one".into(),
                ));
            }
            (AUTH, Some(level)) if !level.is_v5() => {
                return Err(self.error(
                    reason::MALFORMED_PACKET,
                    "AUTH packet is malformed: packet type 15 is reserved before MQTT 5".into(),
                ));
            }
            _ => {}
        }
        let ok = match kind {
            PUBLISH => {
                let qos = (flags >> 1) & 0b11;
                if qos == 3 {
                    return Err(self.error(
                        reason::MALFORMED_PACKET,
                        "PUBLISH packet is malformed: QoS 3 does not exist".into(),
                    ));
                }
                if qos == 0 && flags & 0b1000 != 0 {
                    return Err(self.error(
                        reason::MALFORMED_PACKET,
                        "PUBLISH packet is malformed: the DUP flag is set on a QoS 0 message"
                            .into(),
                    ));
                }
                true
            }
            // MQTT 3.1 set DUP on a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE; later levels
            // fix the flags at 0b0010.
            PUBREL | SUBSCRIBE | UNSUBSCRIBE => {
                flags == 0b0010 || (self.level == Some(Level::V31) && flags == 0b1010)
            }
            _ => flags == 0,
        };
        if ok {
            Ok(())
        } else {
            Err(self.error(
                reason::MALFORMED_PACKET,
                format!(
                    "{name} packet is malformed: the fixed header flags 0x{flags:X} are reserved"
                ),
            ))
        }
    }
}

/// Peer-supplied text quoted in an error message, cut to a few dozen characters: the message
/// goes back to the peer as a reason string and should stay short.
fn quoted(text: &str) -> String {
    const SHOWN: usize = 48;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}...", text.get(..cut).unwrap_or_default()),
        None => format!("{text:?}"),
    }
}

fn padded_length(name: &str) -> String {
    format!("{name} packet is malformed: its remaining length is not encoded in the fewest bytes")
}

fn fail<T>(fault: Fault) -> Result<T, nom::Err<Fault>> {
    Err(nom::Err::Failure(fault))
}

/// Unwraps a nom result over a whole body: bytes left after the last field are malformed.
fn finish<O>(result: PResult<'_, O>) -> Result<O, Fault> {
    match result {
        Ok(([], out)) => Ok(out),
        Ok((rest, _)) => Err(Fault::malformed(format!(
            "{} bytes follow its last field",
            rest.len()
        ))),
        Err(e) => Err(fault_of(e)),
    }
}

fn fault_of(e: nom::Err<Fault>) -> Fault {
    match e {
        nom::Err::Error(fault) | nom::Err::Failure(fault) => fault,
        // Complete parsers never ask for more; the whole body is here.
        nom::Err::Incomplete(_) => Fault::malformed("it ends before its fields are complete"),
    }
}

/// A body of any packet but CONNECT, for a known level.
fn packet(kind: u8, flags: u8, level: Level, body: &[u8], frame: &Bytes) -> Result<Packet, Fault> {
    let v5 = level.is_v5();
    Ok(match kind {
        CONNACK => Packet::ConnAck(finish(connack(body, frame, level))?),
        PUBLISH => Packet::Publish(finish(publish(body, frame, flags, v5))?),
        PUBACK => Packet::PubAck(finish(ack(body, frame, v5))?),
        PUBREC => Packet::PubRec(finish(ack(body, frame, v5))?),
        PUBREL => Packet::PubRel(finish(ack(body, frame, v5))?),
        PUBCOMP => Packet::PubComp(finish(ack(body, frame, v5))?),
        SUBSCRIBE => Packet::Subscribe(finish(subscribe(body, frame, v5))?),
        SUBACK => Packet::SubAck(finish(suback(body, frame, v5))?),
        UNSUBSCRIBE => Packet::Unsubscribe(finish(unsubscribe(body, frame, v5))?),
        UNSUBACK => Packet::UnsubAck(finish(unsuback(body, frame, v5))?),
        PINGREQ => {
            finish(empty(body))?;
            Packet::PingReq
        }
        PINGRESP => {
            finish(empty(body))?;
            Packet::PingResp
        }
        DISCONNECT => Packet::Disconnect(finish(disconnect(body, frame, v5))?),
        AUTH => Packet::Auth(finish(auth(body, frame))?),
        // The first byte was checked: CONNECT and type 0 never get here.
        _ => return Err(Fault::protocol("it is not expected here")),
    })
}

/// A property block in v5; before v5 packets have none.
fn v5_properties<'a>(
    input: &'a [u8],
    frame: &Bytes,
    v5: bool,
    carrier: Carrier,
) -> PResult<'a, Properties> {
    if v5 {
        properties(input, frame, carrier)
    } else {
        Ok((input, Properties::default()))
    }
}

fn empty(input: &[u8]) -> PResult<'_, ()> {
    Ok((input, ()))
}

/// A packet identifier, which is never 0 [MQTT-2.2.1-3].
fn packet_id(input: &[u8]) -> PResult<'_, u16> {
    let (rest, id) = context("packet identifier", be_u16).parse_complete(input)?;
    if id == 0 {
        return fail(Fault::malformed("packet identifier 0 is not allowed"));
    }
    Ok((rest, id))
}

/// Protocol name and level to [`Level`]; anything else is a version we do not speak.
fn protocol(name: &[u8], number: u8) -> Option<Level> {
    match (name, number) {
        (b"MQIsdp", 3) => Some(Level::V31),
        (b"MQTT", 4) => Some(Level::V311),
        (b"MQTT", 5) => Some(Level::V5),
        _ => None,
    }
}

/// A CONNECT body. The error carries the level once the protocol name and level are read,
/// so the server can answer in the format the client speaks.
fn connect(body: &[u8], frame: &Bytes, minimal: bool) -> Result<Connect, (Fault, Option<Level>)> {
    let mut header = (
        context("protocol name", binary),
        context("protocol level", be_u8),
    );
    let (input, (name, number)) = header
        .parse_complete(body)
        .map_err(|e| (fault_of(e), None))?;
    let Some(level) = protocol(name, number) else {
        let shown = quoted(&String::from_utf8_lossy(name));
        return Err((
            Fault::with_code(
                reason::UNSUPPORTED_PROTOCOL_VERSION,
                format!("protocol name {shown} with level {number} is not MQTT 3.1, 3.1.1 or 5"),
            ),
            None,
        ));
    };
    if !minimal && level.is_v5() {
        return Err((
            Fault::malformed("its remaining length is not encoded in the fewest bytes"),
            Some(level),
        ));
    }
    finish(connect_rest(input, frame, level)).map_err(|fault| (fault, Some(level)))
}

/// CONNECT after the protocol level: flags, keep alive, properties and payload.
fn connect_rest<'a>(input: &'a [u8], frame: &Bytes, level: Level) -> PResult<'a, Connect> {
    let v5 = level.is_v5();
    let (input, flags) = context("connect flags", be_u8).parse_complete(input)?;
    if flags & 0x01 != 0 {
        return fail(Fault::malformed("the reserved connect flag (bit 0) is set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0b11;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if will_qos == 3 {
        return fail(Fault::malformed("the will QoS is 3"));
    }
    if !will_flag && (will_qos != 0 || will_retain) {
        return fail(Fault::malformed(
            "will QoS or will retain is set without the will flag",
        ));
    }
    if password_flag && !username_flag && !v5 {
        return fail(Fault::malformed(
            "the password flag is set without the user name flag",
        ));
    }
    let (input, keep_alive) = context("keep alive", be_u16).parse_complete(input)?;
    let (input, props) = v5_properties(input, frame, v5, Carrier::Connect)?;
    let (mut input, client_id) = string("client identifier")(input)?;
    let mut will = None;
    if will_flag {
        let (rest, will_props) = v5_properties(input, frame, v5, Carrier::Will)?;
        let (rest, topic) = string("will topic")(rest)?;
        if topic.is_empty() || topic.contains(['+', '#']) {
            return fail(Fault::with_code(
                reason::TOPIC_NAME_INVALID,
                format!(
                    "the will topic {} is empty or contains a wildcard ('+' or '#')",
                    quoted(&topic)
                ),
            ));
        }
        let (rest, payload) =
            context("will payload", |i| binary_in(frame, i)).parse_complete(rest)?;
        input = rest;
        will = Some(Will {
            topic,
            payload,
            qos: QoS::from_bits(will_qos).unwrap_or_default(),
            retain: will_retain,
            properties: will_props,
        });
    }
    let mut username = None;
    if username_flag {
        let (rest, name) = string("user name")(input)?;
        input = rest;
        username = Some(name);
    }
    let mut password = None;
    if password_flag {
        let (rest, secret) = context("password", |i| binary_in(frame, i)).parse_complete(input)?;
        input = rest;
        password = Some(secret);
    }
    Ok((
        input,
        Connect {
            level,
            client_id,
            clean_start,
            keep_alive,
            username,
            password,
            will,
            properties: props,
        },
    ))
}

fn connack<'a>(input: &'a [u8], frame: &Bytes, level: Level) -> PResult<'a, ConnAck> {
    let (input, flags) = context("acknowledge flags", be_u8).parse_complete(input)?;
    let (input, code) = context("reason code", be_u8).parse_complete(input)?;
    // MQTT 3.1 has no session present flag: its byte is unused.
    let session_present = match level {
        Level::V31 => false,
        Level::V311 | Level::V5 => {
            if flags & 0xfe != 0 {
                return fail(Fault::malformed(
                    "reserved acknowledge flags (bits 7-1) are set",
                ));
            }
            flags & 0x01 != 0
        }
    };
    if !level.is_v5() && code > 5 {
        return fail(Fault::malformed(format!("return code {code} is reserved")));
    }
    let (input, props) = v5_properties(input, frame, level.is_v5(), Carrier::ConnAck)?;
    Ok((
        input,
        ConnAck {
            session_present,
            code,
            properties: props,
        },
    ))
}

fn publish<'a>(input: &'a [u8], frame: &Bytes, flags: u8, v5: bool) -> PResult<'a, Publish> {
    let qos = QoS::from_bits((flags >> 1) & 0b11).unwrap_or_default();
    let (input, topic) = context("topic name", binary).parse_complete(input)?;
    // One pass for the bytes the rules forbid, then UTF-8 validation by `ByteStr`.
    if let Some(&bad) = topic.iter().find(|&&b| matches!(b, 0 | b'+' | b'#')) {
        return fail(if bad == 0 {
            Fault::malformed("the topic name contains the null character U+0000")
        } else {
            Fault::with_code(
                reason::TOPIC_NAME_INVALID,
                format!(
                    "the topic name contains the wildcard '{}', which only topic filters may use",
                    char::from(bad)
                ),
            )
        });
    }
    let Some(topic) = ByteStr::from_utf8(frame.slice_ref(topic)) else {
        return fail(Fault::malformed("the topic name is not valid UTF-8"));
    };
    let (input, packet_id) = if qos == QoS::AtMostOnce {
        (input, None)
    } else {
        let (rest, id) = packet_id(input)?;
        (rest, Some(id))
    };
    let (input, props) = v5_properties(input, frame, v5, Carrier::Publish)?;
    if topic.is_empty() && props.topic_alias.is_none() {
        return fail(Fault::protocol(if v5 {
            "the topic name is empty and no topic alias stands for it"
        } else {
            "the topic name is empty"
        }));
    }
    let payload = frame.slice_ref(input);
    Ok((
        &[],
        Publish {
            dup: flags & 0b1000 != 0,
            qos,
            retain: flags & 0b0001 != 0,
            topic,
            packet_id,
            payload,
            properties: props,
        },
    ))
}

/// PUBACK, PUBREC, PUBREL, PUBCOMP. In v5 the reason code and properties may be left out
/// from the end (remaining length 2: success; 3: no properties).
fn ack<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, Ack> {
    let (input, packet_id) = packet_id(input)?;
    let mut ack = Ack::new(packet_id);
    if !v5 || input.is_empty() {
        return Ok((input, ack));
    }
    let (input, code) = context("reason code", be_u8).parse_complete(input)?;
    ack.reason = code;
    if input.is_empty() {
        return Ok((input, ack));
    }
    let (input, props) = properties(input, frame, Carrier::Ack)?;
    ack.properties = props;
    Ok((input, ack))
}

fn subscribe<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, Subscribe> {
    let (input, packet_id) = packet_id(input)?;
    let (mut input, props) = v5_properties(input, frame, v5, Carrier::Subscribe)?;
    let mut filters = Vec::new();
    while !input.is_empty() {
        let (rest, filter) = string("topic filter")(input)?;
        let (rest, options) = context("subscription options", be_u8).parse_complete(rest)?;
        input = rest;
        filters.push(subscription_options(filter, options, v5)?);
    }
    if filters.is_empty() {
        return fail(Fault::protocol("it has no topic filter"));
    }
    Ok((
        input,
        Subscribe {
            packet_id,
            filters,
            properties: props,
        },
    ))
}

/// The options byte of a SUBSCRIBE filter: the QoS in 3.x (upper 6 bits reserved), and in
/// v5 no local, retain as published and retain handling (bits 6-7 reserved).
fn subscription_options(
    filter: String,
    options: u8,
    v5: bool,
) -> Result<SubscribeFilter, nom::Err<Fault>> {
    let reserved = if v5 { 0xc0 } else { 0xfc };
    if options & reserved != 0 {
        return fail(Fault::malformed(format!(
            "reserved bits are set in the options 0x{options:02X} of filter {}",
            quoted(&filter)
        )));
    }
    let Some(qos) = QoS::from_bits(options & 0b11) else {
        return fail(Fault::malformed(format!(
            "filter {} asks for QoS 3",
            quoted(&filter)
        )));
    };
    let retain_handling = (options >> 4) & 0b11;
    if retain_handling == 3 {
        return fail(Fault::malformed(format!(
            "filter {} asks for retain handling 3",
            quoted(&filter)
        )));
    }
    Ok(SubscribeFilter {
        filter,
        qos,
        no_local: options & 0x04 != 0,
        retain_as_published: options & 0x08 != 0,
        retain_handling,
    })
}

fn suback<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, SubAck> {
    let (input, packet_id) = packet_id(input)?;
    let (input, props) = v5_properties(input, frame, v5, Carrier::SubAck)?;
    if input.is_empty() {
        return fail(Fault::protocol("it has no return code"));
    }
    if !v5 && let Some(code) = input.iter().find(|c| !matches!(c, 0 | 1 | 2 | 0x80)) {
        return fail(Fault::malformed(format!(
            "return code 0x{code:02X} is reserved"
        )));
    }
    Ok((
        &[],
        SubAck {
            packet_id,
            codes: input.to_vec(),
            properties: props,
        },
    ))
}

fn unsubscribe<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, Unsubscribe> {
    let (input, packet_id) = packet_id(input)?;
    let (mut input, props) = v5_properties(input, frame, v5, Carrier::Unsubscribe)?;
    let mut filters = Vec::new();
    while !input.is_empty() {
        let (rest, filter) = string("topic filter")(input)?;
        input = rest;
        filters.push(filter);
    }
    if filters.is_empty() {
        return fail(Fault::protocol("it has no topic filter"));
    }
    Ok((
        input,
        Unsubscribe {
            packet_id,
            filters,
            properties: props,
        },
    ))
}

/// UNSUBACK: only a packet identifier in 3.x; properties and one reason code per filter
/// in v5.
fn unsuback<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, UnsubAck> {
    let (input, packet_id) = packet_id(input)?;
    if !v5 {
        return Ok((
            input,
            UnsubAck {
                packet_id,
                codes: Vec::new(),
                properties: Properties::default(),
            },
        ));
    }
    let (input, props) = properties(input, frame, Carrier::UnsubAck)?;
    if input.is_empty() {
        return fail(Fault::protocol("it has no reason code"));
    }
    Ok((
        &[],
        UnsubAck {
            packet_id,
            codes: input.to_vec(),
            properties: props,
        },
    ))
}

/// DISCONNECT: empty in 3.x. In v5 the reason code and properties may be left out from the
/// end (remaining length 0: normal disconnection; 1: no properties).
fn disconnect<'a>(input: &'a [u8], frame: &Bytes, v5: bool) -> PResult<'a, Disconnect> {
    let (input, reason, props) = reason_and_properties(input, frame, v5, Carrier::Disconnect)?;
    Ok((
        input,
        Disconnect {
            reason,
            properties: props,
        },
    ))
}

/// AUTH (v5 only): remaining length 0 means success without properties.
fn auth<'a>(input: &'a [u8], frame: &Bytes) -> PResult<'a, Auth> {
    let (input, reason, props) = reason_and_properties(input, frame, true, Carrier::Auth)?;
    Ok((
        input,
        Auth {
            reason,
            properties: props,
        },
    ))
}

/// An optional reason code followed by optional properties (DISCONNECT, AUTH).
fn reason_and_properties<'a>(
    input: &'a [u8],
    frame: &Bytes,
    v5: bool,
    carrier: Carrier,
) -> Result<(&'a [u8], u8, Properties), nom::Err<Fault>> {
    if !v5 || input.is_empty() {
        return Ok((input, 0, Properties::default()));
    }
    let (input, code) = context("reason code", be_u8).parse_complete(input)?;
    if input.is_empty() {
        return Ok((input, code, Properties::default()));
    }
    let (input, props) = properties(input, frame, carrier)?;
    Ok((input, code, props))
}
