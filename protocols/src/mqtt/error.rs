//! The errors of the MQTT codec: what can be wrong with received bytes ([`DecodeError`]) and
//! what cannot be written ([`EncodeError`]).
//!
//! Owns: the v5 reason code each decoding failure maps to, and sentences that name the packet
//! and the problem (shown to operators and sent to v5 peers as a reason string).
//!
//! Must never: represent "need more bytes" (that is `Ok(None)`), or carry I/O errors.

use std::borrow::Cow;

use nom::error::{ContextError, ErrorKind, ParseError};

use super::packet::{Level, reason};

/// Received bytes break the MQTT specification. Every one is fatal for the connection: a
/// server answers a CONNECT with a CONNACK carrying `code` (mapped to a 3.x return code
/// where the level is 3.x), or any later packet with a v5 DISCONNECT carrying `code` and
/// `message` as its reason string, then closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    /// The v5 reason code that fits: [`reason::MALFORMED_PACKET`],
    /// [`reason::PROTOCOL_ERROR`], [`reason::UNSUPPORTED_PROTOCOL_VERSION`],
    /// [`reason::PACKET_TOO_LARGE`] or [`reason::TOPIC_NAME_INVALID`].
    pub code: u8,
    /// One sentence naming the packet and what is wrong with it.
    pub message: String,
    /// The protocol level known when the error happened: the decoder's level, or for a bad
    /// CONNECT the level it announced (`None` when the name or level is not one we speak),
    /// so the answer can use the format the peer understands.
    pub level: Option<Level>,
}

impl DecodeError {
    pub(crate) fn new(code: u8, message: impl Into<String>, level: Option<Level>) -> Self {
        DecodeError {
            code,
            message: message.into(),
            level,
        }
    }

    /// True for [`reason::MALFORMED_PACKET`].
    pub fn is_malformed(&self) -> bool {
        self.code == reason::MALFORMED_PACKET
    }
}

/// A packet that cannot be written as asked. The encoder refuses rather than write bytes a
/// conforming peer (and our own decoder) would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// An MQTT string or binary field carries a 16-bit length.
    #[error(
        "{packet}: the {field} is {len} bytes long; MQTT strings and binary data hold at most 65,535 bytes"
    )]
    TooLong {
        packet: &'static str,
        field: &'static str,
        len: usize,
    },
    /// The remaining length is a variable byte integer of at most four bytes.
    #[error(
        "{packet}: the packet would have a remaining length of {len} bytes; MQTT allows at most 268,435,455"
    )]
    PacketTooLarge { packet: &'static str, len: usize },
    /// A v5 property set on a packet type that may not carry it.
    #[error("{packet}: the {property} property is not allowed in this packet type")]
    PropertyNotAllowed {
        packet: &'static str,
        property: &'static str,
    },
    /// A packet type the level does not have (AUTH before v5).
    #[error("{packet} does not exist in MQTT {level:?}")]
    NotInLevel { packet: &'static str, level: Level },
    /// The fields contradict the specification (a QoS 1 PUBLISH without a packet id, a
    /// SUBSCRIBE without filters, ...).
    #[error("{packet}: {problem}")]
    Invalid {
        packet: &'static str,
        problem: &'static str,
    },
}

/// The nom error of body parsing: a reason code and what is wrong, without the packet name
/// (the decoder adds it). nom's own errors only ever mean "the packet ends early", since a
/// body is parsed only once all of it is buffered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub code: u8,
    pub problem: Cow<'static, str>,
    /// The body ended early (a nom error rather than a rule we check).
    truncated: bool,
    /// For a body that ended early, the innermost field being read (nom's `context`).
    field: Option<&'static str>,
}

impl Fault {
    pub fn malformed(problem: impl Into<Cow<'static, str>>) -> Self {
        Fault {
            code: reason::MALFORMED_PACKET,
            problem: problem.into(),
            truncated: false,
            field: None,
        }
    }

    pub fn protocol(problem: impl Into<Cow<'static, str>>) -> Self {
        Fault {
            code: reason::PROTOCOL_ERROR,
            problem: problem.into(),
            truncated: false,
            field: None,
        }
    }

    pub fn with_code(code: u8, problem: impl Into<Cow<'static, str>>) -> Self {
        Fault {
            code,
            problem: problem.into(),
            truncated: false,
            field: None,
        }
    }

    /// The sentence the operator sees: the packet, a verdict from the code, the problem.
    pub fn into_error(self, packet: &str, level: Option<Level>) -> DecodeError {
        let message = match (self.truncated, self.field) {
            (true, Some(field)) => {
                format!("{packet} packet is malformed: it ends inside the {field}")
            }
            _ => format!("{packet} packet {}: {}", verdict(self.code), self.problem),
        };
        DecodeError::new(self.code, message, level)
    }
}

/// What a reason code says about a packet, to open the sentence with.
fn verdict(code: u8) -> &'static str {
    match code {
        reason::MALFORMED_PACKET => "is malformed",
        reason::PROTOCOL_ERROR => "breaks the protocol",
        reason::UNSUPPORTED_PROTOCOL_VERSION => "asks for a protocol version not supported",
        reason::TOPIC_NAME_INVALID => "has an invalid topic name",
        _ => "is refused",
    }
}

impl<I> ParseError<I> for Fault {
    fn from_error_kind(_input: I, _kind: ErrorKind) -> Self {
        Fault {
            code: reason::MALFORMED_PACKET,
            problem: Cow::Borrowed("it ends before its fields are complete"),
            truncated: true,
            field: None,
        }
    }

    fn append(_input: I, _kind: ErrorKind, other: Self) -> Self {
        other
    }
}

impl<I> ContextError<I> for Fault {
    /// Keeps the innermost field: "ends inside the topic name" says more than "ends inside
    /// the PUBLISH variable header".
    fn add_context(_input: I, ctx: &'static str, mut other: Self) -> Self {
        if other.truncated && other.field.is_none() {
            other.field = Some(ctx);
        }
        other
    }
}
