//! Requests from `/ws` clients: [`decode_client`] turns one text message into a typed
//! [`ClientOp`], and [`encode_client`] writes one (for clients, benchmarks and tests).
//!
//! Owns: which fields each op needs and their types, the rule that `null` is the same as an
//! absent field, inline `data` kept as the very bytes of the request, `data_b64` decoded, the
//! header block a publish will be stored with, and the size limits on the request and on the
//! message or snapshot it carries.
//!
//! Must never: judge subjects or patterns (the server parses them with its subject limits),
//! decide permissions, allocate more than a small multiple of the request's size, or panic on
//! any text.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::error::{WsDecodeError, WsErrorKind, quoted};
use super::json::{push_bool, push_key, push_str, push_u64};
use crate::native::HeaderMap;

/// What a connection accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsLimits {
    /// Bytes of one request text at most.
    pub max_text: usize,
    /// Bytes of a published message at most (its payload plus the header block it is stored
    /// with), and of a snapshot's payload: the server's `max_payload`, so that what a browser
    /// publishes can be delivered to native subscribers too.
    pub max_payload: usize,
}

/// Messages a `replay` or `subjects` page holds when the request does not say.
pub const DEFAULT_PAGE: usize = 100;
/// Messages a `replay` or `subjects` page holds at most.
pub const MAX_PAGE: usize = 1000;

/// A page size asked for, within 1..=[`MAX_PAGE`].
fn page_size(max: Option<u64>) -> usize {
    let max = max.unwrap_or(DEFAULT_PAGE as u64).clamp(1, MAX_PAGE as u64);
    usize::try_from(max).unwrap_or(MAX_PAGE)
}

/// Where stored history starts, as a client says it. When a request gives several,
/// `from_time_ms` wins over `from_offset`, which wins over `from_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// `from_offset`: a tenant offset (for a pattern's history).
    Offset(u64),
    /// `from_version`: a version (for one subject's history).
    Version(u64),
    /// `from_time_ms`: the first message stored at or after this time.
    TimeMs(u64),
}

/// A request's payload: `data` (inline JSON), `data_b64` (bytes), or neither.
#[derive(Debug, Clone)]
pub enum Data<'a> {
    /// Neither field (or `null`): an empty payload.
    None,
    /// `data`: the JSON text exactly as it appears in the request (never `null`, which is
    /// the same as no `data`).
    Json(&'a RawValue),
    /// `data_b64`, decoded.
    Bytes(Vec<u8>),
}

impl Data<'_> {
    /// The payload's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Data::None => &[],
            Data::Json(raw) => raw.get().as_bytes(),
            Data::Bytes(bytes) => bytes,
        }
    }

    /// Bytes of the payload.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// An empty payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the payload is inline JSON (stored as `Content-Type: application/json`).
    pub fn is_json(&self) -> bool {
        matches!(self, Data::Json(_))
    }

    /// The payload as `Bytes` (decoded base64 moves without a copy).
    pub fn into_bytes(self) -> Bytes {
        match self {
            Data::None => Bytes::new(),
            Data::Json(raw) => Bytes::copy_from_slice(raw.get().as_bytes()),
            Data::Bytes(bytes) => Bytes::from(bytes),
        }
    }
}

impl PartialEq for Data<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.is_json() == other.is_json()
            && matches!(self, Data::None) == matches!(other, Data::None)
            && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Data<'_> {}

/// `sub`: follow `pattern` (native or MQTT syntax: the server tells them apart), live, or
/// from stored history and then live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe<'a> {
    pub id: Option<Cow<'a, str>>,
    pub pattern: Cow<'a, str>,
    /// Stored history to send first.
    pub from: Option<Start>,
    /// `from_snapshot`: one subject's latest snapshot first, then the versions after it
    /// (from the beginning when there is no snapshot and no `from`).
    pub from_snapshot: bool,
}

/// `unsub`: end subscription `sid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe<'a> {
    pub id: Option<Cow<'a, str>>,
    pub sid: u32,
}

/// `pub`: publish to `subject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish<'a> {
    pub id: Option<Cow<'a, str>>,
    pub subject: Cow<'a, str>,
    pub data: Data<'a>,
    /// `headers`, in the request's order; a name given twice keeps its last value. Every
    /// name is one a NATS header block can carry.
    pub headers: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// `expect_version`: optimistic locking (stored subjects).
    pub expect_version: Option<u64>,
    /// `msg_id`: deduplication (stored subjects).
    pub msg_id: Option<Cow<'a, str>>,
    /// The header block the message is stored and routed with.
    block: Bytes,
}

impl<'a> Publish<'a> {
    /// A publish, with the header block it will be stored with (the same as a decoded one's).
    pub fn new(
        id: Option<Cow<'a, str>>,
        subject: Cow<'a, str>,
        data: Data<'a>,
        headers: Vec<(Cow<'a, str>, Cow<'a, str>)>,
        expect_version: Option<u64>,
        msg_id: Option<Cow<'a, str>>,
    ) -> Self {
        let block = header_block(&headers, data.is_json(), expect_version, msg_id.as_deref());
        Publish {
            id,
            subject,
            data,
            headers,
            expect_version,
            msg_id,
            block,
        }
    }

    /// The NATS header block (empty when there are no headers) the message is stored and
    /// routed with: `headers`, then `Content-Type: application/json` for inline data when
    /// `headers` set no `Content-Type`, then `Canopy-Expected-Version` and `Canopy-Msg-Id`
    /// (replacing any of those names in `headers`).
    pub fn header_block(&self) -> &Bytes {
        &self.block
    }

    /// Bytes the message holds: payload and header block.
    pub fn size(&self) -> usize {
        self.data.len().saturating_add(self.block.len())
    }
}

/// `get`: the latest message of `subject`, or its `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Get<'a> {
    pub id: Option<Cow<'a, str>>,
    pub subject: Cow<'a, str>,
    pub version: Option<u64>,
}

/// Whose history a `replay` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target<'a> {
    /// One subject's versions.
    Subject(Cow<'a, str>),
    /// Every stored subject matching a pattern, in tenant offset order.
    Pattern(Cow<'a, str>),
}

/// `replay`: one page of stored history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay<'a> {
    pub id: Option<Cow<'a, str>>,
    pub target: Target<'a>,
    /// `None`: from the beginning.
    pub from: Option<Start>,
    /// `max` as asked; [`Replay::page_size`] applies the default and the bounds.
    pub max: Option<u64>,
}

impl Replay<'_> {
    /// Messages the page may hold: `max`, [`DEFAULT_PAGE`] by default, within
    /// 1..=[`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        page_size(self.max)
    }
}

/// `subjects`: one page of stored subjects matching `pattern`, after `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects<'a> {
    pub id: Option<Cow<'a, str>>,
    /// `>` when the request has none.
    pub pattern: Cow<'a, str>,
    pub after: Option<Cow<'a, str>>,
    pub max: Option<u64>,
}

impl Subjects<'_> {
    /// Subjects the page may hold: `max`, [`DEFAULT_PAGE`] by default, within
    /// 1..=[`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        page_size(self.max)
    }
}

/// `snapshot.get`: the latest snapshot of `subject`, or the latest at or below `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotGet<'a> {
    pub id: Option<Cow<'a, str>>,
    pub subject: Cow<'a, str>,
    pub version: Option<u64>,
}

/// `snapshot.put`: the client's snapshot of `subject` as of `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPut<'a> {
    pub id: Option<Cow<'a, str>>,
    pub subject: Cow<'a, str>,
    pub version: u64,
    pub data: Data<'a>,
}

/// `group.next`: up to `max` (1 by default) messages of consumer group `group`,
/// waiting up to `wait_ms` for a first one when none is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNext<'a> {
    pub id: Option<Cow<'a, str>>,
    pub group: Cow<'a, str>,
    pub max: Option<u64>,
    pub wait_ms: Option<u64>,
}

/// What a `group.ack` says of a delivery: `kind` `ack` (the default), `nack` (again,
/// at once or after `delay_ms`), `in_progress` (the ack wait starts again) or `term`
/// (give up on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    Ack,
    Nack,
    InProgress,
    Term,
}

impl AckKind {
    /// The `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            AckKind::Ack => "ack",
            AckKind::Nack => "nack",
            AckKind::InProgress => "in_progress",
            AckKind::Term => "term",
        }
    }

    fn named(name: &str) -> Option<AckKind> {
        [
            AckKind::Ack,
            AckKind::Nack,
            AckKind::InProgress,
            AckKind::Term,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

/// `group.ack`: answers the delivery whose `ack` token a `group.msg` carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAck<'a> {
    pub id: Option<Cow<'a, str>>,
    pub ack: Cow<'a, str>,
    pub kind: AckKind,
    /// For a `nack`: how long until the message goes again.
    pub delay_ms: Option<u64>,
}

/// One request, its fields checked. Fields that other ops use are accepted and ignored;
/// fields no op has are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOp<'a> {
    Subscribe(Subscribe<'a>),
    Unsubscribe(Unsubscribe<'a>),
    Publish(Publish<'a>),
    Get(Get<'a>),
    Replay(Replay<'a>),
    Subjects(Subjects<'a>),
    SnapshotGet(SnapshotGet<'a>),
    SnapshotPut(SnapshotPut<'a>),
    GroupNext(GroupNext<'a>),
    GroupAck(GroupAck<'a>),
}

impl ClientOp<'_> {
    /// The request's `id`, which its answer carries.
    pub fn id(&self) -> Option<&str> {
        match self {
            ClientOp::Subscribe(op) => op.id.as_deref(),
            ClientOp::Unsubscribe(op) => op.id.as_deref(),
            ClientOp::Publish(op) => op.id.as_deref(),
            ClientOp::Get(op) => op.id.as_deref(),
            ClientOp::Replay(op) => op.id.as_deref(),
            ClientOp::Subjects(op) => op.id.as_deref(),
            ClientOp::SnapshotGet(op) => op.id.as_deref(),
            ClientOp::SnapshotPut(op) => op.id.as_deref(),
            ClientOp::GroupNext(op) => op.id.as_deref(),
            ClientOp::GroupAck(op) => op.id.as_deref(),
        }
    }

    /// The `op` string.
    pub fn name(&self) -> &'static str {
        match self {
            ClientOp::Subscribe(_) => "sub",
            ClientOp::Unsubscribe(_) => "unsub",
            ClientOp::Publish(_) => "pub",
            ClientOp::Get(_) => "get",
            ClientOp::Replay(_) => "replay",
            ClientOp::Subjects(_) => "subjects",
            ClientOp::SnapshotGet(_) => "snapshot.get",
            ClientOp::SnapshotPut(_) => "snapshot.put",
            ClientOp::GroupNext(_) => "group.next",
            ClientOp::GroupAck(_) => "group.ack",
        }
    }
}

/// Every op, as the unknown-op message lists them.
pub const OPS: &[&str] = &[
    "sub",
    "unsub",
    "pub",
    "get",
    "replay",
    "subjects",
    "snapshot.get",
    "snapshot.put",
    "group.next",
    "group.ack",
];

/// The fields of a request, as named in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Op,
    Id,
    Pattern,
    Sid,
    Subject,
    Data,
    DataB64,
    Headers,
    ExpectVersion,
    MsgId,
    Version,
    FromOffset,
    FromVersion,
    FromTimeMs,
    Max,
    After,
    FromSnapshot,
    Group,
    WaitMs,
    Ack,
    Kind,
    DelayMs,
}

const FIELDS: &[(&str, Field)] = &[
    ("op", Field::Op),
    ("id", Field::Id),
    ("pattern", Field::Pattern),
    ("sid", Field::Sid),
    ("subject", Field::Subject),
    ("data", Field::Data),
    ("data_b64", Field::DataB64),
    ("headers", Field::Headers),
    ("expect_version", Field::ExpectVersion),
    ("msg_id", Field::MsgId),
    ("version", Field::Version),
    ("from_offset", Field::FromOffset),
    ("from_version", Field::FromVersion),
    ("from_time_ms", Field::FromTimeMs),
    ("max", Field::Max),
    ("after", Field::After),
    ("from_snapshot", Field::FromSnapshot),
    ("group", Field::Group),
    ("wait_ms", Field::WaitMs),
    ("ack", Field::Ack),
    ("kind", Field::Kind),
    ("delay_ms", Field::DelayMs),
];

impl Field {
    fn named(name: &str) -> Option<Field> {
        FIELDS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    fn name(self) -> &'static str {
        FIELDS
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// What the field must be, completing "`field` must be …".
    fn expected(self) -> &'static str {
        match self {
            Field::Op
            | Field::Id
            | Field::Pattern
            | Field::Subject
            | Field::DataB64
            | Field::MsgId
            | Field::After
            | Field::Group
            | Field::Ack => "a string",
            Field::Kind => "\"ack\", \"nack\", \"in_progress\" or \"term\"",
            Field::Sid => "a subscription id (an integer from 0 to 4294967295)",
            Field::Data => "JSON",
            Field::Headers => "an object whose values are strings",
            Field::ExpectVersion
            | Field::Version
            | Field::FromOffset
            | Field::FromVersion
            | Field::FromTimeMs
            | Field::Max
            | Field::WaitMs
            | Field::DelayMs => "an integer from 0 to 18446744073709551615",
            Field::FromSnapshot => "true or false",
        }
    }
}

/// The fields as read; which ones the op needs is checked after (the op may come last).
#[derive(Default)]
struct Fields<'a> {
    op: Option<Cow<'a, str>>,
    id: Option<Cow<'a, str>>,
    pattern: Option<Cow<'a, str>>,
    sid: Option<u32>,
    subject: Option<Cow<'a, str>>,
    data: Option<&'a RawValue>,
    data_b64: Option<Cow<'a, str>>,
    headers: Option<Vec<(Cow<'a, str>, Cow<'a, str>)>>,
    expect_version: Option<u64>,
    msg_id: Option<Cow<'a, str>>,
    version: Option<u64>,
    from_offset: Option<u64>,
    from_version: Option<u64>,
    from_time_ms: Option<u64>,
    max: Option<u64>,
    after: Option<Cow<'a, str>>,
    from_snapshot: Option<bool>,
    group: Option<Cow<'a, str>>,
    wait_ms: Option<u64>,
    ack: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    delay_ms: Option<u64>,
}

impl Fields<'_> {
    fn start(&self) -> Option<Start> {
        self.from_time_ms
            .map(Start::TimeMs)
            .or(self.from_offset.map(Start::Offset))
            .or(self.from_version.map(Start::Version))
    }
}

/// What the reading of a request found out beyond serde_json's error: the field being read,
/// a failure of our own, the id.
#[derive(Default)]
struct Trace {
    reading: Option<Field>,
    failure: Option<(WsErrorKind, String)>,
    id: Option<String>,
}

impl Trace {
    fn fail<E: de::Error>(&mut self, kind: WsErrorKind, message: String) -> E {
        let error = E::custom(&message);
        self.failure = Some((kind, message));
        error
    }
}

/// A JSON string, borrowed from the request when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

/// `headers` (or `null`), refused once the names and values alone exceed `max` bytes.
struct HeadersSeed<'t> {
    max: usize,
    trace: &'t mut Trace,
}

type HeaderList<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

impl<'de> DeserializeSeed<'de> for HeadersSeed<'_> {
    type Value = Option<HeaderList<'de>>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for HeadersSeed<'_> {
    type Value = Option<HeaderList<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut headers = Vec::new();
        // What the entries add to a header block: `Name: value\r\n` each.
        let mut size = 0usize;
        while let Some((Text(name), Text(value))) = map.next_entry::<Text<'de>, Text<'de>>()? {
            size = size.saturating_add(name.len() + value.len() + 4);
            if size > self.max {
                let kind = WsErrorKind::PayloadTooLarge {
                    size,
                    max: self.max,
                };
                let message = format!(
                    "the headers alone are more than the {} bytes a message may hold",
                    self.max
                );
                return Err(self.trace.fail(kind, message));
            }
            headers.push((name, value));
        }
        Ok(Some(headers))
    }
}

/// Reads a request object into [`Fields`].
struct RequestSeed<'t> {
    max_payload: usize,
    trace: &'t mut Trace,
}

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = Fields<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Fields<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = Fields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
        let mut fields = Fields::default();
        if let Err(error) = read_fields(&mut fields, &mut map, self.max_payload, self.trace) {
            // Read so far: the answer to the error can still reach the request.
            self.trace.id = fields.id.map(Cow::into_owned);
            return Err(error);
        }
        Ok(fields)
    }
}

fn read_fields<'de, A: MapAccess<'de>>(
    fields: &mut Fields<'de>,
    map: &mut A,
    max_payload: usize,
    trace: &mut Trace,
) -> Result<(), A::Error> {
    let mut seen = 0u32;
    while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
        let Some(field) = Field::named(&key) else {
            let message = format!("not a request: no op has a field `{}`", quoted(&key));
            return Err(trace.fail(WsErrorKind::UnknownField, message));
        };
        if seen & field.bit() != 0 {
            let kind = WsErrorKind::DuplicateField {
                field: field.name(),
            };
            let message = format!("not a request: `{}` is given twice", field.name());
            return Err(trace.fail(kind, message));
        }
        seen |= field.bit();
        trace.reading = Some(field);
        let text = |map: &mut A| {
            map.next_value::<Option<Text<'de>>>()
                .map(|t| t.map(|Text(t)| t))
        };
        match field {
            Field::Op => fields.op = text(map)?,
            Field::Id => fields.id = text(map)?,
            Field::Pattern => fields.pattern = text(map)?,
            Field::Subject => fields.subject = text(map)?,
            Field::DataB64 => fields.data_b64 = text(map)?,
            Field::MsgId => fields.msg_id = text(map)?,
            Field::After => fields.after = text(map)?,
            Field::Sid => fields.sid = map.next_value()?,
            Field::Data => fields.data = map.next_value::<Option<&'de RawValue>>()?,
            Field::Headers => {
                fields.headers = map.next_value_seed(HeadersSeed {
                    max: max_payload,
                    trace: &mut *trace,
                })?;
            }
            Field::ExpectVersion => fields.expect_version = map.next_value()?,
            Field::Version => fields.version = map.next_value()?,
            Field::FromOffset => fields.from_offset = map.next_value()?,
            Field::FromVersion => fields.from_version = map.next_value()?,
            Field::FromTimeMs => fields.from_time_ms = map.next_value()?,
            Field::Max => fields.max = map.next_value()?,
            Field::FromSnapshot => fields.from_snapshot = map.next_value()?,
            Field::Group => fields.group = text(map)?,
            Field::Ack => fields.ack = text(map)?,
            Field::Kind => fields.kind = text(map)?,
            Field::WaitMs => fields.wait_ms = map.next_value()?,
            Field::DelayMs => fields.delay_ms = map.next_value()?,
        }
        trace.reading = None;
    }
    Ok(())
}

/// The error for what serde_json refused, with what the trace knows.
fn refused(error: &serde_json::Error, trace: &mut Trace) -> WsDecodeError {
    if let Some((kind, message)) = trace.failure.take() {
        return WsDecodeError::new(kind, message);
    }
    match (error.classify(), trace.reading) {
        (serde_json::error::Category::Data, Some(field)) => WsDecodeError::new(
            WsErrorKind::WrongType {
                field: field.name(),
            },
            format!(
                "not a request: `{}` must be {}",
                field.name(),
                field.expected()
            ),
        ),
        (serde_json::error::Category::Data, None) => WsDecodeError::new(
            WsErrorKind::NotAnObject,
            "not a request: a request is a JSON object with an `op`",
        ),
        _ => WsDecodeError::new(WsErrorKind::NotJson, format!("not a request: {error}")),
    }
}

/// The `id` of a request that failed before its id was read: a second pass that reads only
/// `id` (the text must still be JSON).
fn id_only(text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: Option<String>,
    }
    serde_json::from_str::<IdOnly>(text).ok()?.id
}

/// Reads the request object and checks that nothing follows it.
fn read<'a>(
    text: &'a str,
    limits: &WsLimits,
    trace: &mut Trace,
) -> Result<Fields<'a>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let fields = RequestSeed {
        max_payload: limits.max_payload,
        trace: &mut *trace,
    }
    .deserialize(&mut de)?;
    if let Err(error) = de.end() {
        trace.id = fields.id.map(Cow::into_owned);
        return Err(error);
    }
    Ok(fields)
}

/// Decodes one request text.
///
/// A text over `limits.max_text` is refused unread. Otherwise the error carries the request's
/// `id` when the text has one, so the server can answer that request.
pub fn decode_client<'a>(text: &'a str, limits: &WsLimits) -> Result<ClientOp<'a>, WsDecodeError> {
    if text.len() > limits.max_text {
        return Err(WsDecodeError::new(
            WsErrorKind::TooLarge {
                size: text.len(),
                max: limits.max_text,
            },
            format!("a request may hold at most {} bytes", limits.max_text),
        ));
    }
    let mut trace = Trace::default();
    let mut fields = match read(text, limits, &mut trace) {
        Ok(fields) => fields,
        Err(error) => {
            let mut refusal = refused(&error, &mut trace);
            refusal.id = trace.id.take().or_else(|| id_only(text));
            return Err(refusal);
        }
    };
    op_of(&mut fields, limits).map_err(|mut refusal| {
        refusal.id = fields.id.take().map(Cow::into_owned);
        refusal
    })
}

fn missing(op: &str, field: &'static str) -> WsDecodeError {
    WsDecodeError::new(
        WsErrorKind::MissingField { field },
        format!("{op} needs `{field}`"),
    )
}

fn need<T>(value: Option<T>, op: &str, field: &'static str) -> Result<T, WsDecodeError> {
    value.ok_or_else(|| missing(op, field))
}

/// The typed op of `fields`; takes `id` only when it succeeds, so a refusal can carry it.
fn op_of<'a>(f: &mut Fields<'a>, limits: &WsLimits) -> Result<ClientOp<'a>, WsDecodeError> {
    let Some(op) = f.op.take() else {
        return Err(missing("a request", "op"));
    };
    Ok(match op.as_ref() {
        "sub" => {
            let pattern = need(f.pattern.take(), "sub", "pattern")?;
            ClientOp::Subscribe(Subscribe {
                from: f.start(),
                from_snapshot: f.from_snapshot.unwrap_or(false),
                pattern,
                id: f.id.take(),
            })
        }
        "unsub" => {
            let sid = need(f.sid, "unsub", "sid")?;
            ClientOp::Unsubscribe(Unsubscribe {
                sid,
                id: f.id.take(),
            })
        }
        "pub" => {
            let subject = need(f.subject.take(), "pub", "subject")?;
            let data = data_of(f.data.take(), f.data_b64.take())?;
            let headers = checked_headers(f.headers.take().unwrap_or_default())?;
            let publish = Publish::new(
                None,
                subject,
                data,
                headers,
                f.expect_version,
                f.msg_id.take(),
            );
            let size = publish.size();
            if size > limits.max_payload {
                return Err(WsDecodeError::new(
                    WsErrorKind::PayloadTooLarge {
                        size,
                        max: limits.max_payload,
                    },
                    format!(
                        "the message is {size} bytes with its headers; a message may hold at \
                         most {}",
                        limits.max_payload
                    ),
                ));
            }
            ClientOp::Publish(Publish {
                id: f.id.take(),
                ..publish
            })
        }
        "get" => ClientOp::Get(Get {
            subject: need(f.subject.take(), "get", "subject")?,
            version: f.version,
            id: f.id.take(),
        }),
        "replay" => {
            let target = match (f.subject.take(), f.pattern.take()) {
                (Some(subject), None) => Target::Subject(subject),
                (None, Some(pattern)) => Target::Pattern(pattern),
                (None, None) => {
                    return Err(WsDecodeError::new(
                        WsErrorKind::MissingOneOf {
                            fields: ["subject", "pattern"],
                        },
                        "replay needs `subject` or `pattern`",
                    ));
                }
                (Some(_), Some(_)) => {
                    return Err(WsDecodeError::new(
                        WsErrorKind::Exclusive {
                            fields: ["subject", "pattern"],
                        },
                        "replay reads a `subject` or a `pattern`, not both",
                    ));
                }
            };
            ClientOp::Replay(Replay {
                target,
                from: f.start(),
                max: f.max,
                id: f.id.take(),
            })
        }
        "subjects" => ClientOp::Subjects(Subjects {
            pattern: f.pattern.take().unwrap_or(Cow::Borrowed(">")),
            after: f.after.take(),
            max: f.max,
            id: f.id.take(),
        }),
        "snapshot.get" => ClientOp::SnapshotGet(SnapshotGet {
            subject: need(f.subject.take(), "snapshot.get", "subject")?,
            version: f.version,
            id: f.id.take(),
        }),
        "snapshot.put" => {
            let subject = need(f.subject.take(), "snapshot.put", "subject")?;
            let version = need(f.version, "snapshot.put", "version")?;
            let data = data_of(f.data.take(), f.data_b64.take())?;
            if data.len() > limits.max_payload {
                return Err(WsDecodeError::new(
                    WsErrorKind::PayloadTooLarge {
                        size: data.len(),
                        max: limits.max_payload,
                    },
                    format!(
                        "the snapshot is {} bytes; a snapshot may hold at most {}",
                        data.len(),
                        limits.max_payload
                    ),
                ));
            }
            ClientOp::SnapshotPut(SnapshotPut {
                subject,
                version,
                data,
                id: f.id.take(),
            })
        }
        "group.next" => ClientOp::GroupNext(GroupNext {
            group: need(f.group.take(), "group.next", "group")?,
            max: f.max,
            wait_ms: f.wait_ms,
            id: f.id.take(),
        }),
        "group.ack" => {
            let ack = need(f.ack.take(), "group.ack", "ack")?;
            let kind = match f.kind.take() {
                None => AckKind::Ack,
                Some(name) => AckKind::named(&name).ok_or_else(|| {
                    WsDecodeError::new(
                        WsErrorKind::WrongType { field: "kind" },
                        format!(
                            "`kind` must be {}, not \"{}\"",
                            Field::Kind.expected(),
                            quoted(&name)
                        ),
                    )
                })?,
            };
            ClientOp::GroupAck(GroupAck {
                ack,
                kind,
                delay_ms: f.delay_ms,
                id: f.id.take(),
            })
        }
        other => {
            return Err(WsDecodeError::new(
                WsErrorKind::UnknownOp,
                format!(
                    "unknown op `{}`: use sub, unsub, pub, get, replay, subjects, \
                     snapshot.get, snapshot.put, group.next or group.ack",
                    quoted(other)
                ),
            ));
        }
    })
}

fn data_of<'a>(
    data: Option<&'a RawValue>,
    data_b64: Option<Cow<'a, str>>,
) -> Result<Data<'a>, WsDecodeError> {
    match (data, data_b64) {
        (Some(raw), None) => Ok(Data::Json(raw)),
        (None, Some(text)) => STANDARD.decode(text.trim()).map(Data::Bytes).map_err(|e| {
            WsDecodeError::new(
                WsErrorKind::BadBase64,
                format!("data_b64 is not base64: {e}"),
            )
        }),
        (None, None) => Ok(Data::None),
        (Some(_), Some(_)) => Err(WsDecodeError::new(
            WsErrorKind::Exclusive {
                fields: ["data", "data_b64"],
            },
            "give data or data_b64, not both",
        )),
    }
}

/// Whether a NATS header block can carry `name` (what `HeaderMap::parse` reads back).
fn header_name_ok(name: &str) -> bool {
    !name.is_empty() && !name.bytes().any(|b| b <= b' ' || b == 0x7f || b == b':')
}

/// Checks the names and keeps the last value of a name given twice.
fn checked_headers(headers: HeaderList<'_>) -> Result<HeaderList<'_>, WsDecodeError> {
    if let Some((name, _)) = headers.iter().find(|(name, _)| !header_name_ok(name)) {
        return Err(WsDecodeError::new(
            WsErrorKind::BadHeaderName,
            format!(
                "{:?} cannot be a header name: use printable characters other than `:`, and no \
                 spaces",
                quoted(name)
            ),
        ));
    }
    let repeated = if headers.len() <= 8 {
        headers
            .iter()
            .enumerate()
            .any(|(i, (name, _))| headers.iter().take(i).any(|(other, _)| other == name))
    } else {
        let mut names = HashSet::with_capacity(headers.len());
        !headers.iter().all(|(name, _)| names.insert(name.as_ref()))
    };
    if !repeated {
        return Ok(headers);
    }
    // A JSON object read into a map keeps the last value of a repeated key.
    let mut later = HashSet::with_capacity(headers.len());
    let mut keep: Vec<bool> = headers
        .iter()
        .rev()
        .map(|(name, _)| later.insert(name.as_ref()))
        .collect();
    keep.reverse();
    Ok(headers
        .into_iter()
        .zip(keep)
        .filter_map(|(entry, keep)| keep.then_some(entry))
        .collect())
}

/// The block the server stores a publish with (see [`Publish::header_block`]).
fn header_block(
    headers: &[(Cow<'_, str>, Cow<'_, str>)],
    json: bool,
    expect_version: Option<u64>,
    msg_id: Option<&str>,
) -> Bytes {
    if headers.is_empty() && !json && expect_version.is_none() && msg_id.is_none() {
        return Bytes::new();
    }
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(name.as_ref(), value.as_ref());
    }
    if json && map.get("Content-Type").is_none() {
        map.append("Content-Type", "application/json");
    }
    if let Some(version) = expect_version {
        map.insert("Canopy-Expected-Version", version.to_string());
    }
    if let Some(msg_id) = msg_id {
        map.insert("Canopy-Msg-Id", msg_id);
    }
    let mut block = BytesMut::new();
    map.encode(&mut block);
    block.freeze()
}

fn push_text_field(out: &mut String, key: &str, value: Option<&str>) {
    if let Some(value) = value {
        push_key(out, key);
        push_str(out, value);
    }
}

fn push_number_field(out: &mut String, key: &str, value: Option<u64>) {
    if let Some(value) = value {
        push_key(out, key);
        push_u64(out, value);
    }
}

fn push_start(out: &mut String, from: Option<Start>) {
    match from {
        Some(Start::Offset(n)) => push_number_field(out, "from_offset", Some(n)),
        Some(Start::Version(n)) => push_number_field(out, "from_version", Some(n)),
        Some(Start::TimeMs(n)) => push_number_field(out, "from_time_ms", Some(n)),
        None => {}
    }
}

fn push_data(out: &mut String, data: &Data<'_>) {
    match data {
        Data::None => {}
        Data::Json(raw) => {
            push_key(out, "data");
            out.push_str(raw.get());
        }
        Data::Bytes(bytes) => {
            push_key(out, "data_b64");
            out.push('"');
            STANDARD.encode_string(bytes, out);
            out.push('"');
        }
    }
}

/// Appends `op` as one request text, which [`decode_client`] reads back as `op`.
pub fn encode_client(out: &mut String, op: &ClientOp<'_>) {
    out.push_str("{\"op\":");
    push_str(out, op.name());
    push_text_field(out, "id", op.id());
    match op {
        ClientOp::Subscribe(op) => {
            push_text_field(out, "pattern", Some(&op.pattern));
            push_start(out, op.from);
            if op.from_snapshot {
                push_key(out, "from_snapshot");
                push_bool(out, true);
            }
        }
        ClientOp::Unsubscribe(op) => push_number_field(out, "sid", Some(u64::from(op.sid))),
        ClientOp::Publish(op) => {
            push_text_field(out, "subject", Some(&op.subject));
            push_data(out, &op.data);
            if !op.headers.is_empty() {
                push_key(out, "headers");
                let mut first = true;
                for (name, value) in &op.headers {
                    out.push(if first { '{' } else { ',' });
                    first = false;
                    push_str(out, name);
                    out.push(':');
                    push_str(out, value);
                }
                out.push('}');
            }
            push_number_field(out, "expect_version", op.expect_version);
            push_text_field(out, "msg_id", op.msg_id.as_deref());
        }
        ClientOp::Get(op) => {
            push_text_field(out, "subject", Some(&op.subject));
            push_number_field(out, "version", op.version);
        }
        ClientOp::Replay(op) => {
            match &op.target {
                Target::Subject(subject) => push_text_field(out, "subject", Some(subject)),
                Target::Pattern(pattern) => push_text_field(out, "pattern", Some(pattern)),
            }
            push_start(out, op.from);
            push_number_field(out, "max", op.max);
        }
        ClientOp::Subjects(op) => {
            push_text_field(out, "pattern", Some(&op.pattern));
            push_text_field(out, "after", op.after.as_deref());
            push_number_field(out, "max", op.max);
        }
        ClientOp::SnapshotGet(op) => {
            push_text_field(out, "subject", Some(&op.subject));
            push_number_field(out, "version", op.version);
        }
        ClientOp::SnapshotPut(op) => {
            push_text_field(out, "subject", Some(&op.subject));
            push_number_field(out, "version", Some(op.version));
            push_data(out, &op.data);
        }
        ClientOp::GroupNext(op) => {
            push_text_field(out, "group", Some(&op.group));
            push_number_field(out, "max", op.max);
            push_number_field(out, "wait_ms", op.wait_ms);
        }
        ClientOp::GroupAck(op) => {
            push_text_field(out, "ack", Some(&op.ack));
            push_text_field(out, "kind", Some(op.kind.as_str()));
            push_number_field(out, "delay_ms", op.delay_ms);
        }
    }
    out.push('}');
}
