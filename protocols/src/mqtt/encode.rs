//! The MQTT encoder: packets to bytes for a given level, and the exact size that will take.
//!
//! Owns: the wire form of every control packet at levels 3, 4 and 5 (3.x forms leave out
//! properties and reason codes; v5 uses the short forms the specification allows), and a
//! PUBLISH fast path that writes a delivery without building a [`Publish`].
//!
//! Must never: write a packet our decoder would refuse for a structural reason (a missing or
//! zero packet identifier, a property the packet may not carry, a string longer than its
//! length prefix, a return code the level lacks, an empty filter list), or disagree with
//! [`encoded_len`] about the size it writes. The text of topics and filters is the caller's:
//! the server validated it on the way in, and deliveries should not scan it again.

use bytes::{BufMut, BytesMut};

use super::decode::{
    AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREC,
    PUBREL, SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE,
};
use super::error::EncodeError;
use super::packet::{
    Ack, Auth, ConnAck, Connect, Disconnect, Level, Packet, Properties, QoS, SubAck, Subscribe,
    UnsubAck, Unsubscribe,
};
use super::properties::{self, Carrier};
use super::wire::{MAX_VARINT, check_len, put_binary, put_varint, varint_len};

/// Writes `packet` as `level` speaks it to the end of `out`. Fields the level lacks (v5
/// properties and reason codes in 3.x) are left out. Nothing is written on error.
pub fn encode(packet: &Packet, level: Level, out: &mut BytesMut) -> Result<(), EncodeError> {
    if let Packet::Publish(p) = packet {
        return encode_publish(
            out,
            level,
            p.dup,
            p.qos,
            p.retain,
            p.topic.as_bytes(),
            p.packet_id,
            &p.properties,
            &p.payload,
        );
    }
    check(packet, level)?;
    let remaining = body_len(packet, level);
    if remaining > MAX_VARINT as usize {
        return Err(EncodeError::PacketTooLarge {
            packet: packet.name(),
            len: remaining,
        });
    }
    out.reserve(1 + varint_len(remaining) + remaining);
    out.put_u8(first_byte(packet));
    put_varint(out, remaining);
    write_body(packet, level, out);
    Ok(())
}

/// The number of bytes [`encode`] writes for `packet` at `level`: what to compare with a
/// peer's Maximum Packet Size. For a packet `encode` refuses, the size it would have had.
pub fn encoded_len(packet: &Packet, level: Level) -> usize {
    let remaining = body_len(packet, level);
    1 + varint_len(remaining) + remaining
}

/// Writes a PUBLISH from its parts, for deliveries that do not own a [`Publish`]. With no
/// properties (or at 3.x) this is the fixed header, the topic, the packet identifier and
/// the payload copy.
#[allow(clippy::too_many_arguments)]
pub fn encode_publish(
    out: &mut BytesMut,
    level: Level,
    dup: bool,
    qos: QoS,
    retain: bool,
    topic: &[u8],
    packet_id: Option<u16>,
    properties: &Properties,
    payload: &[u8],
) -> Result<(), EncodeError> {
    const NAME: &str = "PUBLISH";
    check_len(NAME, "topic name", topic.len())?;
    if qos == QoS::AtMostOnce {
        let no_id = packet_id.is_none();
        require(no_id, NAME, "a QoS 0 message has no packet identifier")?;
        require(!dup, NAME, "the DUP flag must be 0 for a QoS 0 message")?;
    } else {
        let has_id = packet_id.is_some();
        require(
            has_id,
            NAME,
            "a QoS 1 or 2 message needs a packet identifier",
        )?;
        require(packet_id != Some(0), NAME, ZERO_PACKET_ID)?;
    }
    let v5 = level.is_v5();
    require(
        !topic.is_empty() || (v5 && properties.topic_alias.is_some()),
        NAME,
        "the topic name is empty and no topic alias stands for it",
    )?;
    if v5 {
        properties::check(properties, Carrier::Publish, NAME)?;
    }
    let remaining = publish_body_len(level, qos, topic.len(), properties, payload.len());
    if remaining > MAX_VARINT as usize {
        return Err(EncodeError::PacketTooLarge {
            packet: NAME,
            len: remaining,
        });
    }
    out.reserve(1 + varint_len(remaining) + remaining);
    out.put_u8(PUBLISH << 4 | u8::from(dup) << 3 | (qos as u8) << 1 | u8::from(retain));
    put_varint(out, remaining);
    put_binary(out, topic);
    if let Some(id) = packet_id {
        out.put_u16(id);
    }
    if v5 {
        properties::write(properties, out);
    }
    out.put_slice(payload);
    Ok(())
}

fn publish_body_len(
    level: Level,
    qos: QoS,
    topic: usize,
    props: &Properties,
    payload: usize,
) -> usize {
    let id = if qos == QoS::AtMostOnce { 0 } else { 2 };
    2 + topic + id + props_len(level, props) + payload
}

const ZERO_PACKET_ID: &str = "packet identifier 0 is not allowed";

/// Refuses the packet as [`EncodeError::Invalid`] with `problem` unless `ok`.
fn require(ok: bool, packet: &'static str, problem: &'static str) -> Result<(), EncodeError> {
    if ok {
        Ok(())
    } else {
        Err(EncodeError::Invalid { packet, problem })
    }
}

/// A property block's size at `level`: nothing before v5.
fn props_len(level: Level, props: &Properties) -> usize {
    if level.is_v5() {
        properties::block_len(props)
    } else {
        0
    }
}

fn write_props(level: Level, props: &Properties, out: &mut BytesMut) {
    if level.is_v5() {
        properties::write(props, out);
    }
}

fn check_props(
    level: Level,
    props: &Properties,
    carrier: Carrier,
    packet: &'static str,
) -> Result<(), EncodeError> {
    if level.is_v5() {
        properties::check(props, carrier, packet)
    } else {
        Ok(())
    }
}

fn check_id(packet: &'static str, id: u16) -> Result<(), EncodeError> {
    require(id != 0, packet, ZERO_PACKET_ID)
}

/// Everything the encoder refuses, checked before a byte is written.
fn check(packet: &Packet, level: Level) -> Result<(), EncodeError> {
    let name = packet.name();
    match packet {
        Packet::Connect(c) => check_connect(c, level),
        Packet::ConnAck(c) => {
            let code_ok = level.is_v5() || c.code <= 5;
            require(code_ok, name, "a 3.x CONNACK return code is 0 to 5")?;
            check_props(level, &c.properties, Carrier::ConnAck, name)
        }
        // Handled by `encode_publish`.
        Packet::Publish(_) => Ok(()),
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            check_id(name, a.packet_id)?;
            check_props(level, &a.properties, Carrier::Ack, name)
        }
        Packet::Subscribe(s) => {
            check_id(name, s.packet_id)?;
            check_props(level, &s.properties, Carrier::Subscribe, name)?;
            let has_filter = !s.filters.is_empty();
            require(
                has_filter,
                name,
                "a SUBSCRIBE needs at least one topic filter",
            )?;
            for f in &s.filters {
                check_len(name, "topic filter", f.filter.len())?;
                let handling_ok = !level.is_v5() || f.retain_handling <= 2;
                require(handling_ok, name, "retain handling must be 0, 1 or 2")?;
            }
            Ok(())
        }
        Packet::SubAck(s) => {
            check_id(name, s.packet_id)?;
            check_props(level, &s.properties, Carrier::SubAck, name)?;
            let has_code = !s.codes.is_empty();
            require(has_code, name, "a SUBACK needs at least one return code")?;
            let codes_ok = level.is_v5() || s.codes.iter().all(|c| matches!(c, 0 | 1 | 2 | 0x80));
            require(
                codes_ok,
                name,
                "a 3.x SUBACK return code is 0, 1, 2 or 0x80",
            )
        }
        Packet::Unsubscribe(u) => {
            check_id(name, u.packet_id)?;
            check_props(level, &u.properties, Carrier::Unsubscribe, name)?;
            let has_filter = !u.filters.is_empty();
            require(
                has_filter,
                name,
                "an UNSUBSCRIBE needs at least one topic filter",
            )?;
            for f in &u.filters {
                check_len(name, "topic filter", f.len())?;
            }
            Ok(())
        }
        Packet::UnsubAck(u) => {
            check_id(name, u.packet_id)?;
            check_props(level, &u.properties, Carrier::UnsubAck, name)?;
            let has_code = !level.is_v5() || !u.codes.is_empty();
            require(
                has_code,
                name,
                "a v5 UNSUBACK needs at least one reason code",
            )
        }
        Packet::PingReq | Packet::PingResp => Ok(()),
        Packet::Disconnect(d) => check_props(level, &d.properties, Carrier::Disconnect, name),
        Packet::Auth(a) => {
            if !level.is_v5() {
                return Err(EncodeError::NotInLevel {
                    packet: name,
                    level,
                });
            }
            check_props(level, &a.properties, Carrier::Auth, name)
        }
    }
}

fn check_connect(c: &Connect, level: Level) -> Result<(), EncodeError> {
    const NAME: &str = "CONNECT";
    require(
        c.level == level,
        NAME,
        "its level differs from the level asked to encode it at",
    )?;
    check_props(level, &c.properties, Carrier::Connect, NAME)?;
    check_len(NAME, "client identifier", c.client_id.len())?;
    if let Some(will) = &c.will {
        check_props(level, &will.properties, Carrier::Will, NAME)?;
        check_len(NAME, "will topic", will.topic.len())?;
        check_len(NAME, "will payload", will.payload.len())?;
    }
    if let Some(name) = &c.username {
        check_len(NAME, "user name", name.len())?;
    }
    if let Some(password) = &c.password {
        check_len(NAME, "password", password.len())?;
        let named = c.username.is_some() || level.is_v5();
        require(named, NAME, "before MQTT 5 a password needs a user name")?;
    }
    Ok(())
}

/// The first byte of the fixed header (type and flags) of any packet but PUBLISH.
fn first_byte(packet: &Packet) -> u8 {
    match packet {
        Packet::Connect(_) => CONNECT << 4,
        Packet::ConnAck(_) => CONNACK << 4,
        Packet::Publish(p) => {
            PUBLISH << 4 | u8::from(p.dup) << 3 | (p.qos as u8) << 1 | u8::from(p.retain)
        }
        Packet::PubAck(_) => PUBACK << 4,
        Packet::PubRec(_) => PUBREC << 4,
        Packet::PubRel(_) => PUBREL << 4 | 0b0010,
        Packet::PubComp(_) => PUBCOMP << 4,
        Packet::Subscribe(_) => SUBSCRIBE << 4 | 0b0010,
        Packet::SubAck(_) => SUBACK << 4,
        Packet::Unsubscribe(_) => UNSUBSCRIBE << 4 | 0b0010,
        Packet::UnsubAck(_) => UNSUBACK << 4,
        Packet::PingReq => PINGREQ << 4,
        Packet::PingResp => PINGRESP << 4,
        Packet::Disconnect(_) => DISCONNECT << 4,
        Packet::Auth(_) => AUTH << 4,
    }
}

/// The protocol name and level byte a CONNECT announces.
fn protocol(level: Level) -> (&'static [u8], u8) {
    match level {
        Level::V31 => (b"MQIsdp", 3),
        Level::V311 => (b"MQTT", 4),
        Level::V5 => (b"MQTT", 5),
    }
}

/// The remaining length.
fn body_len(packet: &Packet, level: Level) -> usize {
    let v5 = level.is_v5();
    match packet {
        Packet::Connect(c) => connect_len(c, level),
        Packet::ConnAck(c) => 2 + props_len(level, &c.properties),
        Packet::Publish(p) => {
            publish_body_len(level, p.qos, p.topic.len(), &p.properties, p.payload.len())
        }
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            ack_len(a, v5)
        }
        Packet::Subscribe(s) => {
            2 + props_len(level, &s.properties)
                + s.filters.iter().map(|f| 3 + f.filter.len()).sum::<usize>()
        }
        Packet::SubAck(s) => 2 + props_len(level, &s.properties) + s.codes.len(),
        Packet::Unsubscribe(u) => {
            2 + props_len(level, &u.properties)
                + u.filters.iter().map(|f| 2 + f.len()).sum::<usize>()
        }
        Packet::UnsubAck(u) => {
            if v5 {
                2 + props_len(level, &u.properties) + u.codes.len()
            } else {
                2
            }
        }
        Packet::PingReq | Packet::PingResp => 0,
        Packet::Disconnect(d) => {
            if !v5 || (d.reason == 0 && d.properties.is_empty()) {
                0
            } else if d.properties.is_empty() {
                1
            } else {
                1 + properties::block_len(&d.properties)
            }
        }
        Packet::Auth(a) => auth_len(a),
    }
}

fn connect_len(c: &Connect, level: Level) -> usize {
    let (name, _) = protocol(level);
    // Protocol name, level, flags, keep alive.
    let mut len = 2 + name.len() + 1 + 1 + 2;
    len += props_len(level, &c.properties);
    len += 2 + c.client_id.len();
    if let Some(will) = &c.will {
        len += props_len(level, &will.properties) + 2 + will.topic.len() + 2 + will.payload.len();
    }
    if let Some(name) = &c.username {
        len += 2 + name.len();
    }
    if let Some(password) = &c.password {
        len += 2 + password.len();
    }
    len
}

/// v5 leaves out a success reason code and empty properties from the end.
fn ack_len(a: &Ack, v5: bool) -> usize {
    if !v5 || (a.reason == 0 && a.properties.is_empty()) {
        2
    } else if a.properties.is_empty() {
        3
    } else {
        3 + properties::block_len(&a.properties)
    }
}

/// Only the success without properties has the short form: the specification does not
/// give AUTH the "reason code only" form of DISCONNECT.
fn auth_len(a: &Auth) -> usize {
    if a.reason == 0 && a.properties.is_empty() {
        0
    } else {
        1 + properties::block_len(&a.properties)
    }
}

fn write_body(packet: &Packet, level: Level, out: &mut BytesMut) {
    let v5 = level.is_v5();
    match packet {
        Packet::Connect(c) => write_connect(c, level, out),
        Packet::ConnAck(c) => write_connack(c, level, out),
        // Written by `encode_publish`.
        Packet::Publish(_) => {}
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            out.put_u16(a.packet_id);
            let len = ack_len(a, v5);
            if len > 2 {
                out.put_u8(a.reason);
            }
            if len > 3 {
                properties::write(&a.properties, out);
            }
        }
        Packet::Subscribe(s) => write_subscribe(s, level, out),
        Packet::SubAck(s) => write_suback(s, level, out),
        Packet::Unsubscribe(u) => write_unsubscribe(u, level, out),
        Packet::UnsubAck(u) => write_unsuback(u, level, out),
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(d) => write_disconnect(d, v5, out),
        Packet::Auth(a) => {
            if auth_len(a) > 0 {
                out.put_u8(a.reason);
                properties::write(&a.properties, out);
            }
        }
    }
}

fn write_connect(c: &Connect, level: Level, out: &mut BytesMut) {
    let (name, number) = protocol(level);
    put_binary(out, name);
    out.put_u8(number);
    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(will) = &c.will {
        flags |= 0x04 | (will.qos as u8) << 3;
        if will.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    out.put_u8(flags);
    out.put_u16(c.keep_alive);
    write_props(level, &c.properties, out);
    put_binary(out, c.client_id.as_bytes());
    if let Some(will) = &c.will {
        write_props(level, &will.properties, out);
        put_binary(out, will.topic.as_bytes());
        put_binary(out, &will.payload);
    }
    if let Some(name) = &c.username {
        put_binary(out, name.as_bytes());
    }
    if let Some(password) = &c.password {
        put_binary(out, password);
    }
}

fn write_connack(c: &ConnAck, level: Level, out: &mut BytesMut) {
    // MQTT 3.1 has no session present flag.
    let session_present = c.session_present && level != Level::V31;
    out.put_u8(u8::from(session_present));
    out.put_u8(c.code);
    write_props(level, &c.properties, out);
}

fn write_subscribe(s: &Subscribe, level: Level, out: &mut BytesMut) {
    out.put_u16(s.packet_id);
    write_props(level, &s.properties, out);
    for f in &s.filters {
        put_binary(out, f.filter.as_bytes());
        let mut options = f.qos as u8;
        if level.is_v5() {
            options |= u8::from(f.no_local) << 2
                | u8::from(f.retain_as_published) << 3
                | (f.retain_handling & 0b11) << 4;
        }
        out.put_u8(options);
    }
}

fn write_suback(s: &SubAck, level: Level, out: &mut BytesMut) {
    out.put_u16(s.packet_id);
    write_props(level, &s.properties, out);
    out.put_slice(&s.codes);
}

fn write_unsubscribe(u: &Unsubscribe, level: Level, out: &mut BytesMut) {
    out.put_u16(u.packet_id);
    write_props(level, &u.properties, out);
    for f in &u.filters {
        put_binary(out, f.as_bytes());
    }
}

fn write_unsuback(u: &UnsubAck, level: Level, out: &mut BytesMut) {
    out.put_u16(u.packet_id);
    if level.is_v5() {
        properties::write(&u.properties, out);
        out.put_slice(&u.codes);
    }
}

fn write_disconnect(d: &Disconnect, v5: bool, out: &mut BytesMut) {
    if !v5 || (d.reason == 0 && d.properties.is_empty()) {
        return;
    }
    out.put_u8(d.reason);
    if !d.properties.is_empty() {
        properties::write(&d.properties, out);
    }
}
