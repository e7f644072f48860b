//! What the server sends `/ws` clients: [`ServerFrame`] and its encoders, appending JSON
//! text to a caller's `String`.
//!
//! Owns: the exact text of every answer and delivery (key order, which keys are left out and
//! which are `null`), byte for byte what the server wrote before this codec existed, so the
//! browser client and the console need no change; and the rule that decides how a payload is
//! shown: inline `data` when the headers say JSON (or, for a snapshot, when it is marked
//! JSON) and the bytes parse, kept as the very same bytes; `data_b64` otherwise.
//!
//! A delivery is [`MSG_HEAD`], the subscription id, and a tail that is the same for every
//! subscriber of the message ([`encode_msg_tail`]), so a server can render the tail once for
//! all of them.
//!
//! Must never: parse or re-serialize inline JSON (that would change its bytes), or panic.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::value::RawValue;

use super::error::ErrorCode;
use super::json::{push_bool, push_key, push_str, push_u64};
use crate::native::HeaderMap;

/// How every delivery's text starts; the subscription id follows, then the shared tail.
pub const MSG_HEAD: &str = r#"{"op":"msg","sid":"#;

/// A message as a subscriber receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub subject: &'a str,
    /// Present when the subject is stored.
    pub version: Option<u64>,
    pub offset: Option<u64>,
    /// Present when the publisher asked for an answer.
    pub reply: Option<&'a str>,
    /// The message's NATS header block (may be empty).
    pub headers: &'a [u8],
    pub payload: &'a [u8],
}

/// A stored message, in a `get` answer or a `replay` page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredMessage<'a> {
    pub subject: &'a str,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
    /// The message's NATS header block (may be empty).
    pub headers: &'a [u8],
    pub payload: &'a [u8],
}

/// A snapshot: the answer to `snapshot.get`, or first on a subscription from a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotBody<'a> {
    pub subject: &'a str,
    pub version: u64,
    pub time_ms: u64,
    /// Stored as JSON: shown inline when the bytes parse.
    pub json: bool,
    pub payload: &'a [u8],
}

/// A stored subject's head, in a `subjects` page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubjectHead<'a> {
    pub subject: &'a str,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
}

/// A consumer group's delivery to a `group.next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupDelivery<'a> {
    pub group: &'a str,
    /// 1 for the first delivery of this version, more for redeliveries.
    pub attempt: u32,
    /// The token a `group.ack` names the delivery by.
    pub ack: &'a str,
    /// The message, with its own headers.
    pub message: StoredMessage<'a>,
}

/// Everything the server sends. `id` is the request's, when it had one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerFrame<'a> {
    /// `{"code":…,"id":…,"message":…,"op":"error"}`.
    Error {
        id: Option<&'a str>,
        code: ErrorCode,
        message: &'a str,
    },
    /// A stale `expect_version`: an error naming the subject's current version.
    Conflict {
        id: Option<&'a str>,
        subject: &'a str,
        current_version: u64,
    },
    /// `{"id":…,"op":"ok"}`: `unsub` done.
    Ok { id: Option<&'a str> },
    /// `sub` done: the subscription id and the pattern in native syntax.
    Subscribed {
        id: Option<&'a str>,
        sid: u32,
        pattern: &'a str,
    },
    /// A publish to a subject that is not stored, routed.
    Published { id: Option<&'a str> },
    /// A publish the store holds (`duplicate`: a repeated msg id, stored before).
    Stored {
        id: Option<&'a str>,
        subject: &'a str,
        version: u64,
        offset: u64,
        duplicate: bool,
    },
    /// A delivery to subscription `sid`.
    Msg { sid: u32, delivery: Delivery<'a> },
    /// The answer to `get`.
    Message {
        id: Option<&'a str>,
        message: StoredMessage<'a>,
    },
    /// The answer to `replay`: ask again from `next` unless `caught_up`.
    Page {
        id: Option<&'a str>,
        messages: &'a [StoredMessage<'a>],
        next: u64,
        caught_up: bool,
    },
    /// The answer to `subjects`: ask again after `next` when there is one.
    Subjects {
        id: Option<&'a str>,
        subjects: &'a [SubjectHead<'a>],
        next: Option<&'a str>,
    },
    /// The answer to `snapshot.get`.
    Snapshot {
        id: Option<&'a str>,
        snapshot: SnapshotBody<'a>,
    },
    /// A subscription's snapshot, before the versions after it.
    SnapshotFirst {
        sid: u32,
        snapshot: SnapshotBody<'a>,
    },
    /// `snapshot.put` done.
    SnapshotStored {
        id: Option<&'a str>,
        subject: &'a str,
        version: u64,
    },
}

/// Appends `frame`'s text.
pub fn encode_server(out: &mut String, frame: &ServerFrame<'_>) {
    match *frame {
        ServerFrame::Error { id, code, message } => encode_error(out, id, code, message),
        ServerFrame::Conflict {
            id,
            subject,
            current_version,
        } => encode_conflict(out, id, subject, current_version),
        ServerFrame::Ok { id } => encode_ok(out, id),
        ServerFrame::Subscribed { id, sid, pattern } => encode_subscribed(out, id, sid, pattern),
        ServerFrame::Published { id } => encode_published(out, id),
        ServerFrame::Stored {
            id,
            subject,
            version,
            offset,
            duplicate,
        } => encode_stored(out, id, subject, version, offset, duplicate),
        ServerFrame::Msg { sid, delivery } => encode_msg(out, sid, &delivery),
        ServerFrame::Message { id, message } => encode_message(out, id, &message),
        ServerFrame::Page {
            id,
            messages,
            next,
            caught_up,
        } => encode_page(out, id, messages, next, caught_up),
        ServerFrame::Subjects { id, subjects, next } => encode_subjects(out, id, subjects, next),
        ServerFrame::Snapshot { id, snapshot } => encode_snapshot(out, id, &snapshot),
        ServerFrame::SnapshotFirst { sid, snapshot } => encode_snapshot_first(out, sid, &snapshot),
        ServerFrame::SnapshotStored {
            id,
            subject,
            version,
        } => encode_snapshot_stored(out, id, subject, version),
    }
}

/// `"id":"…",` for the frames whose keys are in alphabetical order, where `id` comes before
/// `op`.
fn push_id_before(out: &mut String, id: Option<&str>) {
    if let Some(id) = id {
        out.push_str("\"id\":");
        push_str(out, id);
        out.push(',');
    }
}

/// `,"id":"…"` after `op`.
fn push_id_after(out: &mut String, id: Option<&str>) {
    if let Some(id) = id {
        push_key(out, "id");
        push_str(out, id);
    }
}

/// `"id":"…"` or `"id":null`, first in the object.
fn push_id_or_null(out: &mut String, id: Option<&str>) {
    out.push_str("{\"id\":");
    match id {
        Some(id) => push_str(out, id),
        None => out.push_str("null"),
    }
}

/// `{"code":…,"id":…,"message":…,"op":"error"}` (no `id` without one).
pub fn encode_error(out: &mut String, id: Option<&str>, code: ErrorCode, message: &str) {
    out.push_str("{\"code\":");
    push_str(out, code.as_str());
    push_id_after(out, id);
    push_key(out, "message");
    push_str(out, message);
    out.push_str(",\"op\":\"error\"}");
}

/// A `conflict` error saying `subject is at version N`, with `current_version` and
/// `subject` as fields too.
pub fn encode_conflict(out: &mut String, id: Option<&str>, subject: &str, current_version: u64) {
    out.push_str("{\"code\":\"conflict\",\"current_version\":");
    push_u64(out, current_version);
    push_id_after(out, id);
    // The message is `{subject} is at version {n}`; escaping the parts one after the other
    // writes what escaping the whole would.
    push_key(out, "message");
    push_str(out, subject);
    out.pop();
    out.push_str(" is at version ");
    push_u64(out, current_version);
    out.push_str("\",\"op\":\"error\",\"subject\":");
    push_str(out, subject);
    out.push('}');
}

/// `{"id":…,"op":"ok"}`.
pub fn encode_ok(out: &mut String, id: Option<&str>) {
    out.push('{');
    push_id_before(out, id);
    out.push_str("\"op\":\"ok\"}");
}

/// `{"id":…,"op":"ok","pattern":…,"sid":N}`.
pub fn encode_subscribed(out: &mut String, id: Option<&str>, sid: u32, pattern: &str) {
    out.push('{');
    push_id_before(out, id);
    out.push_str("\"op\":\"ok\",\"pattern\":");
    push_str(out, pattern);
    push_key(out, "sid");
    push_u64(out, u64::from(sid));
    out.push('}');
}

/// `{"id":…,"op":"ok","stored":false}`.
pub fn encode_published(out: &mut String, id: Option<&str>) {
    out.push('{');
    push_id_before(out, id);
    out.push_str("\"op\":\"ok\",\"stored\":false}");
}

/// `{"duplicate":true,"id":…,"offset":O,"op":"ok","stored":true,"subject":…,"version":V}`
/// (no `duplicate` unless it is one).
pub fn encode_stored(
    out: &mut String,
    id: Option<&str>,
    subject: &str,
    version: u64,
    offset: u64,
    duplicate: bool,
) {
    out.push('{');
    if duplicate {
        out.push_str("\"duplicate\":true,");
    }
    push_id_before(out, id);
    out.push_str("\"offset\":");
    push_u64(out, offset);
    out.push_str(",\"op\":\"ok\",\"stored\":true,\"subject\":");
    push_str(out, subject);
    push_key(out, "version");
    push_u64(out, version);
    out.push('}');
}

/// A delivery: [`MSG_HEAD`], `sid`, then [`encode_msg_tail`].
pub fn encode_msg(out: &mut String, sid: u32, delivery: &Delivery<'_>) {
    out.push_str(MSG_HEAD);
    push_u64(out, u64::from(sid));
    encode_msg_tail(out, delivery);
}

/// A delivery from a tail rendered before (by [`encode_msg_tail`]).
pub fn encode_msg_with_tail(out: &mut String, sid: u32, tail: &str) {
    out.reserve(MSG_HEAD.len() + 10 + tail.len());
    out.push_str(MSG_HEAD);
    push_u64(out, u64::from(sid));
    out.push_str(tail);
}

/// What follows the subscription id in a delivery, the same for every subscriber:
/// `,"subject":…,"version":V,"offset":O,"reply":…,"headers":{…},"data":…}` (version and
/// offset when stored, reply when there is one, headers when the message has any).
pub fn encode_msg_tail(out: &mut String, delivery: &Delivery<'_>) {
    push_key(out, "subject");
    push_str(out, delivery.subject);
    if let Some(version) = delivery.version {
        push_key(out, "version");
        push_u64(out, version);
    }
    if let Some(offset) = delivery.offset {
        push_key(out, "offset");
        push_u64(out, offset);
    }
    if let Some(reply) = delivery.reply {
        push_key(out, "reply");
        push_str(out, reply);
    }
    push_message_body(out, delivery.headers, delivery.payload);
    out.push('}');
}

/// `{"op":"group.msg","id":…,"group":…,"attempt":A,"ack":…,"subject":…,"version":V,
/// "offset":O,"time_ms":T,"headers":{…},"data":…}`: one message for the `group.next`
/// request `id` (headers when the message has any).
pub fn encode_group_msg(out: &mut String, id: Option<&str>, delivery: &GroupDelivery<'_>) {
    out.push_str("{\"op\":\"group.msg\"");
    push_id_after(out, id);
    push_key(out, "group");
    push_str(out, delivery.group);
    push_key(out, "attempt");
    push_u64(out, u64::from(delivery.attempt));
    push_key(out, "ack");
    push_str(out, delivery.ack);
    out.push(',');
    push_stored(out, &delivery.message);
    out.push('}');
}

/// `{"count":N,"group":…,"id":…,"op":"ok"}`: a `group.next` answered, after its
/// `count` messages.
pub fn encode_group_done(out: &mut String, id: Option<&str>, group: &str, count: u64) {
    out.push_str("{\"count\":");
    push_u64(out, count);
    push_key(out, "group");
    push_str(out, group);
    push_id_after(out, id);
    out.push_str(",\"op\":\"ok\"}");
}

/// `"subject":…,"version":V,"offset":O,"time_ms":T` and the body, without braces.
fn push_stored(out: &mut String, message: &StoredMessage<'_>) {
    out.push_str("\"subject\":");
    push_str(out, message.subject);
    push_key(out, "version");
    push_u64(out, message.version);
    push_key(out, "offset");
    push_u64(out, message.offset);
    push_key(out, "time_ms");
    push_u64(out, message.time_ms);
    push_message_body(out, message.headers, message.payload);
}

/// `{"op":"ok","id":…,"subject":…,"version":V,"offset":O,"time_ms":T,…}`: a `get` answer.
pub fn encode_message(out: &mut String, id: Option<&str>, message: &StoredMessage<'_>) {
    out.push_str("{\"op\":\"ok\"");
    push_id_after(out, id);
    out.push(',');
    push_stored(out, message);
    out.push('}');
}

/// `{"op":"ok","id":…,"messages":[…],"next":N,"caught_up":B}`: a `replay` page.
pub fn encode_page(
    out: &mut String,
    id: Option<&str>,
    messages: &[StoredMessage<'_>],
    next: u64,
    caught_up: bool,
) {
    out.push_str("{\"op\":\"ok\"");
    push_id_after(out, id);
    out.push_str(",\"messages\":[");
    for (i, message) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        push_stored(out, message);
        out.push('}');
    }
    out.push_str("],\"next\":");
    push_u64(out, next);
    push_key(out, "caught_up");
    push_bool(out, caught_up);
    out.push('}');
}

/// `{"id":…,"next":…,"op":"ok","subjects":[{"offset":O,"subject":…,"time_ms":T,"version":V}]}`:
/// a `subjects` page. `id` and `next` are `null` when absent.
pub fn encode_subjects(
    out: &mut String,
    id: Option<&str>,
    subjects: &[SubjectHead<'_>],
    next: Option<&str>,
) {
    push_id_or_null(out, id);
    push_key(out, "next");
    match next {
        Some(next) => push_str(out, next),
        None => out.push_str("null"),
    }
    out.push_str(",\"op\":\"ok\",\"subjects\":[");
    for (i, head) in subjects.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"offset\":");
        push_u64(out, head.offset);
        push_key(out, "subject");
        push_str(out, head.subject);
        push_key(out, "time_ms");
        push_u64(out, head.time_ms);
        push_key(out, "version");
        push_u64(out, head.version);
        out.push('}');
    }
    out.push_str("]}");
}

fn push_snapshot(out: &mut String, snapshot: &SnapshotBody<'_>) {
    push_key(out, "subject");
    push_str(out, snapshot.subject);
    push_key(out, "version");
    push_u64(out, snapshot.version);
    push_key(out, "time_ms");
    push_u64(out, snapshot.time_ms);
    push_payload(out, snapshot.json, snapshot.payload);
    out.push('}');
}

/// `{"op":"ok","id":…,"subject":…,"version":V,"time_ms":T,…}`: a `snapshot.get` answer.
pub fn encode_snapshot(out: &mut String, id: Option<&str>, snapshot: &SnapshotBody<'_>) {
    out.push_str("{\"op\":\"ok\"");
    push_id_after(out, id);
    push_snapshot(out, snapshot);
}

/// `{"op":"snapshot","sid":N,"subject":…,"version":V,"time_ms":T,…}`: first on a
/// subscription from a snapshot.
pub fn encode_snapshot_first(out: &mut String, sid: u32, snapshot: &SnapshotBody<'_>) {
    out.push_str("{\"op\":\"snapshot\",\"sid\":");
    push_u64(out, u64::from(sid));
    push_snapshot(out, snapshot);
}

/// `{"id":…,"op":"ok","subject":…,"version":V}` (`"id":null` without one): `snapshot.put`
/// done.
pub fn encode_snapshot_stored(out: &mut String, id: Option<&str>, subject: &str, version: u64) {
    push_id_or_null(out, id);
    out.push_str(",\"op\":\"ok\",\"subject\":");
    push_str(out, subject);
    push_key(out, "version");
    push_u64(out, version);
    out.push('}');
}

/// A message's `,"headers":{…}` (when its header block parses) and payload. Repeated header
/// names become arrays; names are in sorted order.
fn push_message_body(out: &mut String, headers: &[u8], payload: &[u8]) {
    let mut json = false;
    if !headers.is_empty()
        && let Ok(map) = HeaderMap::parse(headers)
    {
        json = map.says_json();
        push_headers(out, &map);
    }
    push_payload(out, json, payload);
}

fn push_headers(out: &mut String, map: &HeaderMap) {
    let mut names: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, value) in &map.entries {
        names.entry(name.as_str()).or_default().push(value.as_str());
    }
    push_key(out, "headers");
    out.push('{');
    for (i, (name, values)) in names.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, name);
        out.push(':');
        match values.as_slice() {
            [one] => push_str(out, one),
            many => {
                out.push('[');
                for (j, value) in many.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    push_str(out, value);
                }
                out.push(']');
            }
        }
    }
    out.push('}');
}

/// `,"data":…` when `json` and the bytes are JSON (without the whitespace around the
/// value), `,"data_b64":"…"` otherwise.
fn push_payload(out: &mut String, json: bool, payload: &[u8]) {
    if json
        && let Ok(text) = std::str::from_utf8(payload)
        && let Ok(raw) = serde_json::from_str::<&RawValue>(text)
    {
        push_key(out, "data");
        out.push_str(raw.get());
        return;
    }
    push_key(out, "data_b64");
    out.push('"');
    STANDARD.encode_string(payload, out);
    out.push('"');
}
