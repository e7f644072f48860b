//! MQTT 5 properties (section 2.2.2): which packet may carry which, how each is read and
//! written, and the value rules the specification makes protocol errors.
//!
//! Owns: the property table (identifier, name, field of [`Properties`], value kind,
//! carriers), from which reading, sizing, checking and writing every property follow;
//! duplicate detection; and the property length that prefixes every property block.
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

/// Declares the property table of MQTT 5.0 section 2.2.2.2, one row per property in
/// identifier order (which is also the order the encoder writes them in):
/// `(identifier, name, field, kind, [carriers])`, where `field` is the property's field of
/// [`Properties`], `kind` how its value is read and written (a [`Kind`]), and `name` what
/// errors call it. Generates [`TABLE`] and the functions that visit every field by its
/// kind: `read_value`, `each_set`, `check_lens`, `sum_len` and `write_each`.
macro_rules! property_table {
    ($(
        ($id:literal, $name:literal, $field:ident, $kind:ty, [$($carrier:ident),+ $(,)?])
    ),+ $(,)?) => {
        const TABLE: &[Spec] = &[
            $( Spec { id: $id, name: $name, carriers: carriers(&[$($carrier),+]) } ),+
        ];

        /// Reads the value of the property `spec` into its field of `p`.
        fn read_value<'a>(
            spec: &Spec,
            input: &'a [u8],
            frame: &Bytes,
            carrier: Carrier,
            p: &mut Properties,
        ) -> Result<&'a [u8], nom::Err<Fault>> {
            match spec.id {
                $( $id => <$kind>::read(input, frame, spec, carrier, &mut p.$field), )+
                // `spec` is a row of the table: every identifier is handled above.
                id => Err(not_an_identifier(id)),
            }
        }

        /// Calls `f` with the identifier of every property set in `p` (once per identifier).
        fn each_set(
            p: &Properties,
            mut f: impl FnMut(u8) -> Result<(), EncodeError>,
        ) -> Result<(), EncodeError> {
            $( if <$kind>::is_set(&p.$field) { f($id)?; } )+
            Ok(())
        }

        /// Refuses strings and binary data too long for their two-byte length.
        fn check_lens(p: &Properties, packet: &'static str) -> Result<(), EncodeError> {
            $( <$kind>::check_len(&p.$field, packet, $name)?; )+
            Ok(())
        }

        /// Bytes of every property set in `p`.
        fn sum_len(p: &Properties) -> usize {
            0 $( + <$kind>::len(&p.$field) )+
        }

        /// Writes every property set in `p`, in identifier order.
        fn write_each(p: &Properties, out: &mut BytesMut) {
            $( <$kind>::write(&p.$field, $id, out); )+
        }
    };
}

property_table! {
    (0x01, "payload format indicator", payload_format_indicator, Flag, [Publish, Will]),
    (0x02, "message expiry interval", message_expiry_interval, Int<u32>, [Publish, Will]),
    (0x03, "content type", content_type, Utf8, [Publish, Will]),
    (0x08, "response topic", response_topic, Utf8, [Publish, Will]),
    (0x09, "correlation data", correlation_data, Binary, [Publish, Will]),
    (0x0B, "subscription identifier", subscription_identifiers, SubscriptionIds,
        [Publish, Subscribe]),
    (0x11, "session expiry interval", session_expiry_interval, Int<u32>,
        [Connect, ConnAck, Disconnect]),
    (0x12, "assigned client identifier", assigned_client_identifier, Utf8, [ConnAck]),
    (0x13, "server keep alive", server_keep_alive, Int<u16>, [ConnAck]),
    (0x15, "authentication method", authentication_method, Utf8, [Connect, ConnAck, Auth]),
    (0x16, "authentication data", authentication_data, Binary, [Connect, ConnAck, Auth]),
    (0x17, "request problem information", request_problem_information, Flag, [Connect]),
    (0x18, "will delay interval", will_delay_interval, Int<u32>, [Will]),
    (0x19, "request response information", request_response_information, Flag, [Connect]),
    (0x1A, "response information", response_information, Utf8, [ConnAck]),
    (0x1C, "server reference", server_reference, Utf8, [ConnAck, Disconnect]),
    (0x1F, "reason string", reason_string, Utf8,
        [ConnAck, Ack, SubAck, UnsubAck, Disconnect, Auth]),
    (0x21, "receive maximum", receive_maximum, Positive<u16>, [Connect, ConnAck]),
    (0x22, "topic alias maximum", topic_alias_maximum, Int<u16>, [Connect, ConnAck]),
    (0x23, "topic alias", topic_alias, Positive<u16>, [Publish]),
    (0x24, "maximum QoS", maximum_qos, Flag, [ConnAck]),
    (0x25, "retain available", retain_available, Flag, [ConnAck]),
    (0x26, "user property", user_properties, UserProperties,
        [Connect, ConnAck, Publish, Will, Ack, Subscribe, SubAck, Unsubscribe, UnsubAck,
         Disconnect, Auth]),
    (0x27, "maximum packet size", maximum_packet_size, Positive<u32>, [Connect, ConnAck]),
    (0x28, "wildcard subscription available", wildcard_subscription_available, Flag,
        [ConnAck]),
    (0x29, "subscription identifier available", subscription_identifiers_available, Flag,
        [ConnAck]),
    (0x2A, "shared subscription available", shared_subscription_available, Flag, [ConnAck]),
}

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
// Value kinds

/// How a kind of property value is read, measured and written. `Slot` is the type of the
/// property's field in [`Properties`].
trait Kind {
    type Slot;
    /// Reads the value that follows the identifier into `slot`; returns the input after it.
    fn read<'a>(
        input: &'a [u8],
        frame: &Bytes,
        spec: &Spec,
        carrier: Carrier,
        slot: &mut Self::Slot,
    ) -> Result<&'a [u8], nom::Err<Fault>>;
    fn is_set(slot: &Self::Slot) -> bool;
    /// Bytes the property takes, identifiers included; 0 when it is not set.
    fn len(slot: &Self::Slot) -> usize;
    /// Writes the property (identifier, then value), nothing when it is not set.
    fn write(slot: &Self::Slot, id: u8, out: &mut BytesMut);
    /// Refuses a string or binary value too long for its two-byte length.
    fn check_len(
        _slot: &Self::Slot,
        _packet: &'static str,
        _name: &'static str,
    ) -> Result<(), EncodeError> {
        Ok(())
    }
}

/// A kind that a property may carry once: its field is an `Option`, and a second
/// occurrence is a protocol error.
trait Single {
    type Value: Wire;
    /// Reads the value, refusing one the specification rules out.
    fn value<'a>(input: &'a [u8], frame: &Bytes, spec: &Spec) -> PResult<'a, Self::Value>;
}

impl<S: Single> Kind for S {
    type Slot = Option<S::Value>;

    fn read<'a>(
        input: &'a [u8],
        frame: &Bytes,
        spec: &Spec,
        _carrier: Carrier,
        slot: &mut Option<S::Value>,
    ) -> Result<&'a [u8], nom::Err<Fault>> {
        let (rest, value) = S::value(input, frame, spec)?;
        // A filled slot means the property was repeated.
        if slot.is_some() {
            return Err(duplicate(spec));
        }
        *slot = Some(value);
        Ok(rest)
    }

    fn is_set(slot: &Option<S::Value>) -> bool {
        slot.is_some()
    }

    fn len(slot: &Option<S::Value>) -> usize {
        slot.as_ref().map_or(0, |v| 1 + v.size())
    }

    fn write(slot: &Option<S::Value>, id: u8, out: &mut BytesMut) {
        if let Some(v) = slot {
            out.put_u8(id);
            v.put(out);
        }
    }

    fn check_len(
        slot: &Option<S::Value>,
        packet: &'static str,
        name: &'static str,
    ) -> Result<(), EncodeError> {
        match slot.as_ref().and_then(Wire::prefixed_len) {
            Some(len) => check_len(packet, name, len),
            None => Ok(()),
        }
    }
}

/// How a single value is laid out after its identifier, by its type.
trait Wire {
    /// Bytes of the value.
    fn size(&self) -> usize;
    fn put(&self, out: &mut BytesMut);
    /// The length its two-byte length prefix must hold (strings and binary data).
    fn prefixed_len(&self) -> Option<usize> {
        None
    }
}

/// The fixed-size integers of property values: Byte, Two and Four Byte Integer.
trait Number: Wire + Copy + std::fmt::Display + PartialEq {
    const ZERO: Self;
    fn parse(input: &[u8]) -> PResult<'_, Self>;
}

macro_rules! number {
    ($t:ty, $parser:expr, $put:ident) => {
        impl Wire for $t {
            fn size(&self) -> usize {
                std::mem::size_of::<$t>()
            }
            fn put(&self, out: &mut BytesMut) {
                out.$put(*self);
            }
        }

        impl Number for $t {
            const ZERO: $t = 0;
            fn parse(input: &[u8]) -> PResult<'_, $t> {
                context("property value", $parser).parse_complete(input)
            }
        }
    };
}

number!(u8, byte, put_u8);
number!(u16, be_u16, put_u16);
number!(u32, be_u32, put_u32);

impl Wire for String {
    fn size(&self) -> usize {
        2 + self.len()
    }
    fn put(&self, out: &mut BytesMut) {
        put_binary(out, self.as_bytes());
    }
    fn prefixed_len(&self) -> Option<usize> {
        Some(self.len())
    }
}

impl Wire for Bytes {
    fn size(&self) -> usize {
        2 + self.len()
    }
    fn put(&self, out: &mut BytesMut) {
        put_binary(out, self);
    }
    fn prefixed_len(&self) -> Option<usize> {
        Some(self.len())
    }
}

/// Any value of the integer type.
struct Int<T>(std::marker::PhantomData<T>);

impl<T: Number> Single for Int<T> {
    type Value = T;
    fn value<'a>(input: &'a [u8], _frame: &Bytes, _spec: &Spec) -> PResult<'a, T> {
        T::parse(input)
    }
}

/// An integer that must not be 0.
struct Positive<T>(std::marker::PhantomData<T>);

impl<T: Number> Single for Positive<T> {
    type Value = T;
    fn value<'a>(input: &'a [u8], _frame: &Bytes, spec: &Spec) -> PResult<'a, T> {
        ruled(input, spec, |v| v != T::ZERO, "but it must be at least 1")
    }
}

/// A byte that only takes 0 or 1.
struct Flag;

impl Single for Flag {
    type Value = u8;
    fn value<'a>(input: &'a [u8], _frame: &Bytes, spec: &Spec) -> PResult<'a, u8> {
        ruled(input, spec, |v| v <= 1, "but it must be 0 or 1")
    }
}

/// An integer refused unless `ok`; `rule` ends the error's sentence.
fn ruled<'a, T: Number>(
    input: &'a [u8],
    spec: &Spec,
    ok: impl Fn(T) -> bool,
    rule: &str,
) -> PResult<'a, T> {
    let (rest, value) = T::parse(input)?;
    if !ok(value) {
        return Err(bad_value(spec, value, rule));
    }
    Ok((rest, value))
}

/// A UTF-8 encoded string, owned.
struct Utf8;

impl Single for Utf8 {
    type Value = String;
    fn value<'a>(input: &'a [u8], _frame: &Bytes, spec: &Spec) -> PResult<'a, String> {
        string(spec.name)(input)
    }
}

/// Binary data, as a slice of the frame it was read from.
struct Binary;

impl Single for Binary {
    type Value = Bytes;
    fn value<'a>(input: &'a [u8], frame: &Bytes, spec: &Spec) -> PResult<'a, Bytes> {
        context(spec.name, |i| binary_in(frame, i)).parse_complete(input)
    }
}

/// Subscription identifiers: variable byte integers of 1 to 268,435,455, repeatable in
/// PUBLISH and at most one in SUBSCRIBE.
struct SubscriptionIds;

impl Kind for SubscriptionIds {
    type Slot = Vec<u32>;

    fn read<'a>(
        input: &'a [u8],
        _frame: &Bytes,
        spec: &Spec,
        carrier: Carrier,
        slot: &mut Vec<u32>,
    ) -> Result<&'a [u8], nom::Err<Fault>> {
        let (rest, v) = context(spec.name, varint).parse_complete(input)?;
        if v == 0 {
            return Err(bad_value(spec, v, "but it must be 1 to 268,435,455"));
        }
        if carrier == Subscribe && !slot.is_empty() {
            return Err(duplicate(spec));
        }
        slot.push(v);
        Ok(rest)
    }

    fn is_set(slot: &Vec<u32>) -> bool {
        !slot.is_empty()
    }

    fn len(slot: &Vec<u32>) -> usize {
        slot.iter().map(|&id| 1 + varint_len(id as usize)).sum()
    }

    fn write(slot: &Vec<u32>, id: u8, out: &mut BytesMut) {
        for &value in slot {
            out.put_u8(id);
            put_varint(out, value as usize);
        }
    }
}

/// User properties: name and value string pairs, repeatable, in order.
struct UserProperties;

impl Kind for UserProperties {
    type Slot = Vec<(String, String)>;

    fn read<'a>(
        input: &'a [u8],
        _frame: &Bytes,
        _spec: &Spec,
        _carrier: Carrier,
        slot: &mut Vec<(String, String)>,
    ) -> Result<&'a [u8], nom::Err<Fault>> {
        let (rest, key) = string("user property name")(input)?;
        let (rest, value) = string("user property value")(rest)?;
        slot.push((key, value));
        Ok(rest)
    }

    fn is_set(slot: &Vec<(String, String)>) -> bool {
        !slot.is_empty()
    }

    fn len(slot: &Vec<(String, String)>) -> usize {
        slot.iter().map(|(k, v)| 5 + k.len() + v.len()).sum()
    }

    fn write(slot: &Vec<(String, String)>, id: u8, out: &mut BytesMut) {
        for (key, value) in slot {
            out.put_u8(id);
            put_binary(out, key.as_bytes());
            put_binary(out, value.as_bytes());
        }
    }

    fn check_len(
        slot: &Vec<(String, String)>,
        packet: &'static str,
        _name: &'static str,
    ) -> Result<(), EncodeError> {
        for (key, value) in slot {
            check_len(packet, "user property name", key.len())?;
            check_len(packet, "user property value", value.len())?;
        }
        Ok(())
    }
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

fn not_an_identifier(id: u8) -> nom::Err<Fault> {
    nom::Err::Failure(Fault::malformed(format!(
        "0x{id:02X} is not a property identifier"
    )))
}

fn duplicate(spec: &Spec) -> nom::Err<Fault> {
    nom::Err::Failure(Fault::protocol(format!(
        "the {} property (0x{:02X}) appears more than once",
        spec.name, spec.id
    )))
}

fn bad_value(spec: &Spec, value: impl std::fmt::Display, rule: &str) -> nom::Err<Fault> {
    nom::Err::Failure(Fault::protocol(format!(
        "the {} property (0x{:02X}) is {value}, {rule}",
        spec.name, spec.id
    )))
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
        return Err(not_an_identifier(id));
    };
    if !allowed(spec, carrier) {
        return Err(nom::Err::Failure(Fault::protocol(format!(
            "the {} property (0x{id:02X}) is not allowed here",
            spec.name
        ))));
    }
    read_value(spec, input, frame, carrier, props)
}

// ---------------------------------------------------------------------------------------
// Writing

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
    check_lens(p, packet)?;
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
    sum_len(p)
}

/// Bytes of a property block: the property length and the properties.
pub(crate) fn block_len(p: &Properties) -> usize {
    let len = content_len(p);
    varint_len(len) + len
}

/// Writes a property block (property length, then the properties in identifier order).
/// `p` must have passed [`check`].
pub(crate) fn write(p: &Properties, out: &mut BytesMut) {
    let len = content_len(p);
    put_varint(out, len);
    if len == 0 {
        return;
    }
    write_each(p, out);
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
        let ids = read(b"\x04\x0b\x01\x0b\x02", Carrier::Publish).unwrap();
        assert_eq!(ids.subscription_identifiers, vec![1, 2]);
        let refused: [(&'static [u8], Carrier, u8); 8] = [
            // Misplaced (topic alias in CONNECT), two subscription identifiers in SUBSCRIBE.
            (b"\x03\x23\x00\x01", Carrier::Connect, 0x82),
            (b"\x04\x0b\x01\x0b\x02", Carrier::Subscribe, 0x82),
            // Values out of range: subscription identifier 0, a flag of 2, receive maximum 0.
            (b"\x02\x0b\x00", Carrier::Publish, 0x82),
            (b"\x02\x01\x02", Carrier::Publish, 0x82),
            (b"\x03\x21\x00\x00", Carrier::Connect, 0x82),
            // An unknown identifier, a length past the end, a value past the block.
            (b"\x02\x7f\x00", Carrier::Connect, 0x81),
            (b"\x05\x21\x00", Carrier::Connect, 0x81),
            (b"\x02\x21\x00\x05", Carrier::Connect, 0x81),
        ];
        for (block, carrier, code) in refused {
            let fault = read(block, carrier).unwrap_err();
            assert_eq!(fault.code, code, "{block:02x?}: {}", fault.problem);
        }
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
