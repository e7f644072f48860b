//! Envelopes: routed messages queued for a front end that encodes them itself.
//!
//! A native subscriber's outbox holds finished `MSG` frames. An MQTT connection cannot
//! take finished frames: packet identifiers, the in-flight window, topic aliases and
//! the client's maximum packet size are decided by its own task when it writes. So
//! routing writes an envelope instead (one copy of the payload, as for `MSG`), and the
//! connection reads envelopes back out of the bytes its outbox hands it.
//!
//! Also here: the per-message flags a publish carries into routing and the store
//! (MQTT QoS and RETAIN), and the inbox through which the store's acks reach an MQTT
//! connection. This module must never know about sockets or the MQTT codec.
//!
//! ```text
//! envelope  len:u32be qos:u8 retain:u8 sub_id:u32be version:u64be offset:u64be
//!           subject_len:u16be subject reply_len:u16be reply headers_len:u32be headers payload
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};

use super::{Message, Outbox};
use crate::store::AppendOutcome;

/// [`Message::flags`] bits 0-1: 0 for a publish without a QoS (native), else the MQTT
/// QoS plus one. Kept with stored messages, so offline delivery knows it too.
pub const FLAG_QOS_MASK: u8 = 0b011;
/// [`Message::flags`] bit 2: the publish had MQTT's RETAIN flag.
pub const FLAG_RETAIN: u8 = 0b100;

/// The flags of an MQTT publish.
pub fn mqtt_flags(qos: u8, retain: bool) -> u8 {
    (qos.min(2) + 1) | if retain { FLAG_RETAIN } else { 0 }
}

/// The highest QoS a message may be delivered at: its publisher's MQTT QoS, or 2 for
/// a native publish (it has no QoS; the subscription's own decides).
pub fn qos_cap(flags: u8) -> u8 {
    match flags & FLAG_QOS_MASK {
        0 => 2,
        n => n - 1,
    }
}

/// How an MQTT subscription wants its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MqttOptions {
    /// The granted QoS.
    pub qos: u8,
    /// Never deliver this connection's own publishes.
    pub no_local: bool,
    /// Keep the publisher's RETAIN flag on live deliveries.
    pub retain_as_published: bool,
    /// The subscription identifier (0: none).
    pub subscription_id: u32,
}

const FIXED: usize = 4 + 1 + 1 + 4 + 2 + 8 + 8 + 2 + 2 + 4;

/// Appends the envelope of `msg` for a subscription with `options`.
pub fn encode(out: &mut BytesMut, msg: &Message<'_>, options: &MqttOptions) {
    encode_merged(out, msg, options, &[]);
}

/// Appends one envelope of `msg` for several subscriptions of one connection, merged
/// into `options`, carrying every subscription identifier in `ids` (the first one
/// stands in `subscription_id` when `ids` is empty).
pub fn encode_merged(out: &mut BytesMut, msg: &Message<'_>, options: &MqttOptions, ids: &[u32]) {
    let retain = options.retain_as_published && msg.flags & FLAG_RETAIN != 0;
    let (first, extra) = match ids.split_first() {
        Some((first, extra)) => (*first, extra),
        None => (options.subscription_id, &[][..]),
    };
    encode_parts(
        out,
        &EnvelopeParts {
            qos: options.qos.min(qos_cap(msg.flags)),
            retain,
            subscription_id: first,
            extra_ids: extra,
            version: msg.version,
            offset: msg.offset,
            subject: msg.shown_subject().as_bytes(),
            reply: msg.reply.unwrap_or_default(),
            headers: msg.headers.unwrap_or_default(),
            payload: msg.payload,
        },
    );
}

/// The fields of an envelope, borrowed.
#[derive(Debug, Clone, Copy)]
struct EnvelopeParts<'a> {
    pub qos: u8,
    pub retain: bool,
    pub subscription_id: u32,
    /// More subscription identifiers of a merged delivery (at most `u16::MAX`).
    pub extra_ids: &'a [u32],
    pub version: u64,
    pub offset: u64,
    pub subject: &'a [u8],
    pub reply: &'a [u8],
    pub headers: &'a [u8],
    pub payload: &'a [u8],
}

fn encode_parts(out: &mut BytesMut, parts: &EnvelopeParts<'_>) {
    let subject = parts
        .subject
        .get(..usize::from(u16::MAX))
        .unwrap_or(parts.subject);
    let reply = parts
        .reply
        .get(..usize::from(u16::MAX))
        .unwrap_or(parts.reply);
    let extra = parts
        .extra_ids
        .get(..usize::from(u16::MAX))
        .unwrap_or(parts.extra_ids);
    let len = FIXED - 4
        + 4 * extra.len()
        + subject.len()
        + reply.len()
        + parts.headers.len()
        + parts.payload.len();
    out.reserve(len + 4);
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    out.put_u8(parts.qos);
    out.put_u8(u8::from(parts.retain));
    out.put_u32(parts.subscription_id);
    out.put_u16(u16::try_from(extra.len()).unwrap_or(u16::MAX));
    for id in extra {
        out.put_u32(*id);
    }
    out.put_u64(parts.version);
    out.put_u64(parts.offset);
    out.put_u16(u16::try_from(subject.len()).unwrap_or(u16::MAX));
    out.put_slice(subject);
    out.put_u16(u16::try_from(reply.len()).unwrap_or(u16::MAX));
    out.put_slice(reply);
    out.put_u32(u32::try_from(parts.headers.len()).unwrap_or(u32::MAX));
    out.put_slice(parts.headers);
    out.put_slice(parts.payload);
}

/// One envelope read back, its parts sliced from the taken buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub qos: u8,
    pub retain: bool,
    pub subscription_id: u32,
    /// More subscription identifiers, for a delivery merged from overlapping
    /// subscriptions of one MQTT connection.
    pub extra_ids: Vec<u32>,
    pub version: u64,
    /// The tenant offset of a stored message; 0 when it was not stored.
    pub offset: u64,
    pub subject: Bytes,
    pub reply: Bytes,
    pub headers: Bytes,
    pub payload: Bytes,
}

/// Reads the next envelope off the front of `buf`; `None` when none is left (or the
/// bytes are not envelopes, which only a bug could cause: they are dropped).
pub fn decode(buf: &mut Bytes) -> Option<Envelope> {
    if buf.len() < 4 {
        buf.clear();
        return None;
    }
    let len = usize::try_from(buf.get_u32()).ok()?;
    if len > buf.len() || len < FIXED - 4 {
        buf.clear();
        return None;
    }
    let mut body = buf.split_to(len);
    let qos = body.get_u8();
    let retain = body.get_u8() != 0;
    let subscription_id = body.get_u32();
    let extra = usize::from(body.get_u16());
    if body.len() < 4 * extra + 8 + 8 + 2 + 2 + 4 {
        buf.clear();
        return None;
    }
    let extra_ids = (0..extra).map(|_| body.get_u32()).collect();
    let version = body.get_u64();
    let offset = body.get_u64();
    let subject = take_sized(&mut body, 2)?;
    let reply = take_sized(&mut body, 2)?;
    let headers = take_sized(&mut body, 4)?;
    Some(Envelope {
        qos,
        retain,
        subscription_id,
        extra_ids,
        version,
        offset,
        subject,
        reply,
        headers,
        payload: body,
    })
}

fn take_sized(body: &mut Bytes, width: usize) -> Option<Bytes> {
    if body.len() < width {
        return None;
    }
    let n = if width == 2 {
        usize::from(body.get_u16())
    } else {
        usize::try_from(body.get_u32()).ok()?
    };
    (n <= body.len()).then(|| body.split_to(n))
}

/// A store outcome for an MQTT publish waiting for its PUBACK or PUBREC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreAck {
    pub packet_id: u16,
    pub outcome: AppendOutcome,
    /// What the groups a `Canopy-Await` publish waited for did.
    pub awaited: Option<crate::groups::awaiting::AwaitOutcome>,
}

/// Where the store's acks for one MQTT connection wait for its task.
pub struct AckInbox {
    acks: Mutex<Vec<StoreAck>>,
    outbox: Arc<Outbox>,
}

impl AckInbox {
    pub fn new(outbox: Arc<Outbox>) -> Self {
        Self {
            acks: Mutex::new(Vec::new()),
            outbox,
        }
    }

    pub fn push(&self, ack: StoreAck) {
        self.acks.lock().push(ack);
        self.outbox.wake();
    }

    /// Everything that arrived, in order.
    pub fn take(&self, into: &mut Vec<StoreAck>) {
        into.append(&mut self.acks.lock());
    }
}

/// The ack inboxes of live MQTT connections, by connection id.
#[derive(Default)]
pub struct AckInboxes {
    by_conn: RwLock<HashMap<u64, Arc<AckInbox>>>,
}

impl AckInboxes {
    pub fn register(&self, conn: u64, inbox: Arc<AckInbox>) {
        self.by_conn.write().insert(conn, inbox);
    }

    pub fn remove(&self, conn: u64) {
        self.by_conn.write().remove(&conn);
    }

    pub fn get(&self, conn: u64) -> Option<Arc<AckInbox>> {
        self.by_conn.read().get(&conn).cloned()
    }
}

/// The ack address of an MQTT publish: its connection and packet identifier.
pub fn ack_address(conn: u64, packet_id: u16) -> Bytes {
    let mut out = BytesMut::with_capacity(10);
    out.put_u64(conn);
    out.put_u16(packet_id);
    out.freeze()
}

pub fn parse_ack_address(mut address: &[u8]) -> Option<(u64, u16)> {
    if address.len() != 10 {
        return None;
    }
    Some((address.get_u64(), address.get_u16()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_read_back_what_was_written() {
        let mut out = BytesMut::new();
        let msg = Message {
            subject: "a.b",
            reply: Some(b"r.1"),
            headers: Some(b"NATS/1.0\r\nk: v\r\n\r\n"),
            payload: b"hello",
            flags: mqtt_flags(1, true),
            version: 3,
            offset: 9,
            ..Message::default()
        };
        let options = MqttOptions {
            qos: 2,
            retain_as_published: true,
            subscription_id: 7,
            ..MqttOptions::default()
        };
        encode(&mut out, &msg, &options);
        encode(
            &mut out,
            &Message {
                payload: b"",
                ..msg
            },
            &MqttOptions::default(),
        );
        let mut buf = out.freeze();
        let first = decode(&mut buf).expect("first");
        assert_eq!(first.qos, 1, "capped by the publish's QoS");
        assert!(first.retain);
        assert_eq!(first.subscription_id, 7);
        assert_eq!((first.version, first.offset), (3, 9));
        assert_eq!(&first.subject[..], b"a.b");
        assert_eq!(&first.reply[..], b"r.1");
        assert_eq!(&first.payload[..], b"hello");
        let second = decode(&mut buf).expect("second");
        assert_eq!(second.qos, 0);
        assert!(
            !second.retain,
            "RETAIN is dropped on live deliveries by default"
        );
        assert!(second.payload.is_empty());
        assert_eq!(decode(&mut buf), None);
    }

    #[test]
    fn native_publishes_take_the_subscriptions_qos() {
        assert_eq!(qos_cap(0), 2);
        assert_eq!(qos_cap(mqtt_flags(0, false)), 0);
        assert_eq!(qos_cap(mqtt_flags(2, true)), 2);
    }

    #[test]
    fn ack_addresses_round_trip() {
        assert_eq!(parse_ack_address(&ack_address(42, 7)), Some((42, 7)));
        assert_eq!(parse_ack_address(b"short"), None);
    }
}
