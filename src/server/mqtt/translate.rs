//! One message, two protocols: MQTT 5 publish properties ⇄ NATS header blocks, and
//! MQTT topics ⇄ native subjects.
//!
//! The mapping (also in the README): user properties are headers of the same name and
//! value, in order; Content Type is `Content-Type`; Correlation Data is
//! `Canopy-Correlation-Data` (base64, since headers are text); the payload format
//! indicator is `Canopy-Payload-Format: utf-8`; Message Expiry is
//! `Canopy-Message-Expiry` (seconds, counted down when a stored message is delivered
//! later); the Response Topic is the native reply subject. MQTT 3.x messages carry
//! none of these. This module must never route, store or touch a socket.

use base64::Engine;
use bytes::{Bytes, BytesMut};
use canopy_protocols::mqtt::Properties;
use canopy_protocols::native::HeaderMap;
use canopy_subjects::{Limits, Subject};

pub const CONTENT_TYPE: &str = "Content-Type";
pub const CORRELATION_DATA: &str = "Canopy-Correlation-Data";
pub const PAYLOAD_FORMAT: &str = "Canopy-Payload-Format";
pub const MESSAGE_EXPIRY: &str = "Canopy-Message-Expiry";
/// The response topic (as a native subject), kept with the message so that a stored
/// or retained request still says where to answer: a reply subject is not stored.
pub const RESPONSE_TOPIC: &str = "Canopy-Response-Topic";

/// Why a publish's properties cannot become a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmappable {
    /// The response topic is not a valid topic name.
    ResponseTopic(String),
    /// The payload claims UTF-8 and is not.
    PayloadNotUtf8,
}

/// The native parts of an MQTT publish: its header block (empty when it has none)
/// and its reply subject.
#[derive(Debug, Default)]
pub struct NativeParts {
    pub headers: Bytes,
    pub reply: Option<Bytes>,
}

/// Maps the properties of an inbound v5 publish.
pub fn inbound(
    properties: &Properties,
    payload: &[u8],
    limits: &Limits,
) -> Result<NativeParts, Unmappable> {
    let mut parts = NativeParts::default();
    if let Some(topic) = &properties.response_topic {
        let subject = Subject::parse_mqtt_with(topic, limits)
            .map_err(|e| Unmappable::ResponseTopic(e.to_string()))?;
        parts.reply = Some(Bytes::copy_from_slice(subject.as_str().as_bytes()));
    }
    if properties.payload_format_indicator == Some(1) && std::str::from_utf8(payload).is_err() {
        return Err(Unmappable::PayloadNotUtf8);
    }
    let wanted = parts.reply.is_some()
        || !properties.user_properties.is_empty()
        || properties.content_type.is_some()
        || properties.correlation_data.is_some()
        || properties.payload_format_indicator == Some(1)
        || properties.message_expiry_interval.is_some();
    if !wanted {
        return Ok(parts);
    }
    let mut map = HeaderMap::new();
    for (name, value) in &properties.user_properties {
        map.append(header_name(name), value.as_str());
    }
    if let Some(content_type) = &properties.content_type {
        map.append(CONTENT_TYPE, content_type.as_str());
    }
    if let Some(data) = &properties.correlation_data {
        map.append(
            CORRELATION_DATA,
            base64::engine::general_purpose::STANDARD.encode(data),
        );
    }
    if properties.payload_format_indicator == Some(1) {
        map.append(PAYLOAD_FORMAT, "utf-8");
    }
    if let Some(expiry) = properties.message_expiry_interval {
        map.append(MESSAGE_EXPIRY, expiry.to_string());
    }
    if let Some(reply) = parts
        .reply
        .as_deref()
        .and_then(|r| std::str::from_utf8(r).ok())
    {
        map.append(RESPONSE_TOPIC, reply);
    }
    let mut block = BytesMut::new();
    map.encode(&mut block);
    parts.headers = block.freeze();
    Ok(parts)
}

/// A NATS header name cannot hold `:` or whitespace; MQTT user property names can.
/// Those characters become `_` (the one lossy corner of the mapping, in the README).
fn header_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c == ':' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// What an outbound delivery's properties are, or `None` when the message expired.
/// `age_secs` is how long the message waited since it was published (0 when live).
pub fn outbound(
    headers: &[u8],
    reply: &[u8],
    subscription_id: u32,
    age_secs: u64,
    out: &mut Properties,
) -> Option<()> {
    *out = Properties::default();
    if subscription_id != 0 {
        out.subscription_identifiers.push(subscription_id);
    }
    if !reply.is_empty()
        && let Ok(reply) = std::str::from_utf8(reply)
        && let Ok(subject) = Subject::parse_native(reply)
    {
        out.response_topic = Some(subject.to_mqtt());
    }
    if headers.is_empty() {
        return Some(());
    }
    let Ok(map) = HeaderMap::parse(headers) else {
        return Some(());
    };
    for (name, value) in map.entries {
        match name.as_str() {
            CONTENT_TYPE if out.content_type.is_none() => out.content_type = Some(value),
            CORRELATION_DATA if out.correlation_data.is_none() => {
                match base64::engine::general_purpose::STANDARD.decode(value.trim()) {
                    Ok(data) => out.correlation_data = Some(Bytes::from(data)),
                    Err(_) => out.user_properties.push((name, value)),
                }
            }
            PAYLOAD_FORMAT if value.trim() == "utf-8" => out.payload_format_indicator = Some(1),
            // The requester's own response topic wins over the server inbox in the
            // reply subject: an MQTT receiver answers the requester directly, as
            // between two MQTT clients anywhere else; the inbox is for NATS
            // services, which answer replies rather than headers.
            RESPONSE_TOPIC => {
                if let Ok(subject) = Subject::parse_native(value.trim()) {
                    out.response_topic = Some(subject.to_mqtt());
                }
            }
            MESSAGE_EXPIRY => {
                if let Ok(secs) = value.trim().parse::<u64>() {
                    let left = secs.checked_sub(age_secs).filter(|left| *left > 0)?;
                    out.message_expiry_interval = Some(u32::try_from(left).unwrap_or(u32::MAX));
                }
            }
            _ => out.user_properties.push((name, value)),
        }
    }
    Some(())
}

/// `headers` with `Canopy-Correlation-Data` set to `correlation` (replacing any).
pub fn with_correlation(headers: &[u8], correlation: &[u8]) -> Bytes {
    let mut map = if headers.is_empty() {
        HeaderMap::new()
    } else {
        HeaderMap::parse(headers).unwrap_or_default()
    };
    map.insert(
        CORRELATION_DATA,
        base64::engine::general_purpose::STANDARD.encode(correlation),
    );
    let mut block = BytesMut::new();
    map.encode(&mut block);
    block.freeze()
}

/// Writes the MQTT rendering of native subject `native` into `out`; false when it is
/// not a valid subject. Subjects without escapes or MQTT's special characters (nearly
/// all of them) take a fast path that only swaps separators.
pub fn mqtt_topic(native: &str, out: &mut String) -> bool {
    out.clear();
    if !native
        .bytes()
        .any(|b| matches!(b, b'%' | b'/' | b'+' | b'#') || b <= b' ' || b == 0x7f)
        && !native.is_empty()
        && !native
            .split('.')
            .any(|t| t.is_empty() || t == "*" || t == ">")
    {
        out.extend(native.chars().map(|c| if c == '.' { '/' } else { c }));
        return true;
    }
    match Subject::parse_native(native) {
        Ok(subject) => {
            out.push_str(&subject.to_mqtt());
            true
        }
        Err(_) => false,
    }
}

/// Whether a message with these headers, published `age_secs` ago, has expired.
pub fn expired(headers: &[u8], age_secs: u64) -> bool {
    if headers.is_empty() || age_secs == 0 {
        return false;
    }
    let Ok(map) = HeaderMap::parse(headers) else {
        return false;
    };
    map.get(MESSAGE_EXPIRY)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|secs| secs <= age_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_survive_the_round_trip_through_headers() {
        let properties = Properties {
            user_properties: vec![
                ("site".into(), "north".into()),
                ("site".into(), "south".into()),
                ("Canopy-Expected-Version".into(), "3".into()),
            ],
            content_type: Some("application/json".into()),
            correlation_data: Some(Bytes::from_static(&[0, 1, 255])),
            response_topic: Some("replies/dev 1".into()),
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(60),
            ..Properties::default()
        };
        let parts = inbound(&properties, b"{}", &Limits::default()).expect("maps");
        let map = HeaderMap::parse(&parts.headers).expect("a header block");
        assert_eq!(map.get("Canopy-Expected-Version"), Some("3"));
        assert_eq!(parts.reply.as_deref(), Some(&b"replies.dev%201"[..]));
        assert_eq!(map.get(RESPONSE_TOPIC), Some("replies.dev%201"));
        let mut back = Properties::default();
        outbound(&parts.headers, b"replies.dev%201", 9, 10, &mut back).expect("not expired");
        assert_eq!(back.user_properties, properties.user_properties);
        assert_eq!(back.content_type, properties.content_type);
        assert_eq!(back.correlation_data, properties.correlation_data);
        assert_eq!(back.response_topic, properties.response_topic);
        assert_eq!(back.payload_format_indicator, Some(1));
        assert_eq!(back.message_expiry_interval, Some(50), "counted down");
        assert_eq!(back.subscription_identifiers, vec![9]);
        // A stored message has no reply subject; the header still says where to answer.
        outbound(&parts.headers, b"", 0, 0, &mut back).expect("not expired");
        assert_eq!(back.response_topic, properties.response_topic);
        assert!(outbound(&parts.headers, b"", 0, 60, &mut back).is_none());
        assert!(expired(&parts.headers, 61));
        assert!(!expired(&parts.headers, 59));
    }

    #[test]
    fn refusals_are_reported() {
        let utf8 = Properties {
            payload_format_indicator: Some(1),
            ..Properties::default()
        };
        assert_eq!(
            inbound(&utf8, &[0xff], &Limits::default()).err(),
            Some(Unmappable::PayloadNotUtf8)
        );
        let bad_reply = Properties {
            response_topic: Some("a/+/b".into()),
            ..Properties::default()
        };
        assert!(matches!(
            inbound(&bad_reply, b"", &Limits::default()),
            Err(Unmappable::ResponseTopic(_))
        ));
    }

    #[test]
    fn the_fast_topic_path_agrees_with_the_mapping() {
        let mut out = String::new();
        for native in [
            "a.b.c",
            "devices.42.temp",
            "a%2Eb.c",
            "%.x",
            "a/b.c+d",
            "$SYS.x",
            "x y",
        ] {
            let expected = Subject::parse_native(native).map(|s| s.to_mqtt());
            assert_eq!(mqtt_topic(native, &mut out), expected.is_ok(), "{native}");
            if let Ok(expected) = expected {
                assert_eq!(out, expected, "{native}");
            }
        }
    }

    #[test]
    fn header_names_lose_only_what_nats_cannot_carry() {
        assert_eq!(header_name("a b:c"), "a_b_c");
        assert_eq!(header_name("ünïcode"), "ünïcode");
    }
}
