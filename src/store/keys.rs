//! The key layout of the store: how tenants, subjects and versions become byte
//! strings whose order is the order reads need.
//!
//! ```text
//!  message   'm' tenant 0x00 subject 0x00 version:u64be     -> record (record.rs)
//!  subject   'h' tenant 0x00 subject 0x00                   -> subject marker (purged version, offset)
//!  batch     'g' tenant 0x00 first_offset:u64be             -> (subject, version) list of one group commit
//!  msg id    'd' tenant 0x00 msg_id                         -> (subject, version, offset, time)
//!  snapshot  's' tenant 0x00 subject 0x00 version:u64be     -> time, snapshot bytes
//!  offsets   'o' tenant 0x00                                -> next offset floor (set when retention deletes batch keys)
//!  retained  'r' tenant 0x00 subject 0x00                   -> version, record of the subject's retained message
//!  session   'q' tenant 0x00 client_id                      -> a front end's session state (opaque)
//!  subjects  'c' tenant 0x00                                -> how many subjects the tenant has (u64be)
//!  tenant    't' tenant 0x00                                -> the tenant's record (JSON, tenants.rs)
//!  user      'u' tenant 0x00 name                           -> a user's record (JSON, users.rs)
//!  group     'k' tenant 0x00 name                           -> a consumer group's definition (JSON, groups.rs)
//!  cursor    'z' tenant 0x00 group 0x00 subject 0x00        -> the group's cursor in the subject (u64be)
//!  schema    'y' tenant 0x00 pattern 0x00 version:u64be     -> one version of a schema binding (JSON, schemas.rs)
//!  stream    'j' tenant 0x00 name                           -> a JetStream stream's definition (JSON, streams.rs)
//!  plugin    'p' tenant 0x00 pattern                        -> a plugin bound to a pattern (JSON, plugins.rs)
//!  format    'x' "format"                                   -> format version
//! ```
//!
//! Tenant and subject end with 0x00, a byte no subject may hold, so the range of
//! `a.b` never holds `a.b.c`; integers are big-endian so byte order is numeric order.
//! This module only builds and splits keys; it must never touch the engine.

use bytes::{BufMut, Bytes, BytesMut};

pub const MESSAGE: u8 = b'm';
pub const SUBJECT: u8 = b'h';
pub const BATCH: u8 = b'g';
pub const SNAPSHOT: u8 = b's';
pub const OFFSET_FLOOR: u8 = b'o';
pub const MSG_ID: u8 = b'd';
pub const RETAINED: u8 = b'r';
pub const SESSION: u8 = b'q';
pub const USAGE: u8 = b'c';
pub const TENANT: u8 = b't';
pub const USER: u8 = b'u';
pub const GROUP: u8 = b'k';
pub const CURSOR: u8 = b'z';
pub const SCHEMA: u8 = b'y';
pub const STREAM: u8 = b'j';
pub const PLUGIN: u8 = b'p';
pub const DATA_KEY: u8 = b'e';
/// Every kind of key that belongs to one tenant's data (not its record).
pub const TENANT_KINDS: [u8; 16] = [
    DATA_KEY,
    PLUGIN,
    STREAM,
    SCHEMA,
    USER,
    GROUP,
    CURSOR,
    MESSAGE,
    SUBJECT,
    BATCH,
    SNAPSHOT,
    OFFSET_FLOOR,
    MSG_ID,
    RETAINED,
    SESSION,
    USAGE,
];
pub const FORMAT_KEY: &[u8] = b"xformat";

fn prefix(kind: u8, tenant: &str, extra: usize) -> BytesMut {
    let mut key = BytesMut::with_capacity(2 + tenant.len() + extra);
    key.put_u8(kind);
    key.put_slice(tenant.as_bytes());
    key.put_u8(0);
    key
}

/// `kind tenant 0 subject 0`: the start of one subject's versioned keys.
fn versioned_prefix(kind: u8, tenant: &str, subject: &str) -> BytesMut {
    let mut key = prefix(kind, tenant, subject.len() + 9);
    key.put_slice(subject.as_bytes());
    key.put_u8(0);
    key
}

fn versioned(kind: u8, tenant: &str, subject: &str, version: u64) -> Bytes {
    let mut key = versioned_prefix(kind, tenant, subject);
    key.put_u64(version);
    key.freeze()
}

/// The keys of one subject of `kind` from version `from` (inclusive) on.
fn versioned_range(kind: u8, tenant: &str, subject: &str, from: u64) -> std::ops::Range<Bytes> {
    let start = versioned(kind, tenant, subject, from);
    let mut end = versioned_prefix(kind, tenant, subject);
    // Past every version: the 0x00 terminator becomes 0x01.
    let last = end.len() - 1;
    end[last] = 1;
    start..end.freeze()
}

pub fn message(tenant: &str, subject: &str, version: u64) -> Bytes {
    versioned(MESSAGE, tenant, subject, version)
}

/// The key range of one subject's messages from `from` (inclusive) on.
pub fn message_range(tenant: &str, subject: &str, from: u64) -> std::ops::Range<Bytes> {
    versioned_range(MESSAGE, tenant, subject, from)
}

pub fn snapshot(tenant: &str, subject: &str, version: u64) -> Bytes {
    versioned(SNAPSHOT, tenant, subject, version)
}

/// The snapshots of one subject at versions up to `to` (inclusive).
pub fn snapshots_up_to(tenant: &str, subject: &str, to: u64) -> std::ops::Range<Bytes> {
    snapshot(tenant, subject, 0)..snapshot(tenant, subject, to.saturating_add(1))
}

/// The subject and version of a message key of `tenant`.
pub fn message_parts<'k>(tenant: &str, key: &'k [u8]) -> Option<(&'k str, u64)> {
    let rest = key.get(2 + tenant.len()..key.len().checked_sub(9)?)?;
    let version = message_version(key)?;
    (key.get(key.len() - 9) == Some(&0)).then_some(())?;
    Some((std::str::from_utf8(rest).ok()?, version))
}

/// The version at the end of a message key of a known subject.
pub fn message_version(key: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

pub fn subject_marker(tenant: &str, subject: &str) -> Bytes {
    let mut key = prefix(SUBJECT, tenant, subject.len() + 1);
    key.put_slice(subject.as_bytes());
    key.put_u8(0);
    key.freeze()
}

/// The range of subject markers of `tenant` whose subject starts with `start`
/// (a literal prefix of a pattern; empty for all), from `after` (exclusive) on.
pub fn subject_marker_range(
    tenant: &str,
    literal_prefix: &str,
    after: Option<&str>,
) -> std::ops::Range<Bytes> {
    subject_keyed_range(SUBJECT, tenant, literal_prefix, after)
}

/// The key of a subject's retained message.
pub fn retained(tenant: &str, subject: &str) -> Bytes {
    let mut key = prefix(RETAINED, tenant, subject.len() + 1);
    key.put_slice(subject.as_bytes());
    key.put_u8(0);
    key.freeze()
}

/// The key of a tenant's record.
pub fn tenant(name: &str) -> Bytes {
    prefix(TENANT, name, 0).freeze()
}

/// The key of a user of a tenant.
pub fn user(tenant: &str, name: &str) -> Bytes {
    let mut key = prefix(USER, tenant, name.len());
    key.put_slice(name.as_bytes());
    key.freeze()
}

/// The key of a consumer group's definition.
pub fn group(tenant: &str, name: &str) -> Bytes {
    let mut key = prefix(GROUP, tenant, name.len());
    key.put_slice(name.as_bytes());
    key.freeze()
}

/// `'j' tenant 0 name`: a stream's definition.
pub fn stream(tenant: &str, name: &str) -> Bytes {
    let mut key = prefix(STREAM, tenant, name.len());
    key.put_slice(name.as_bytes());
    key.freeze()
}

/// `'p' tenant 0 pattern`: the plugin bound to a pattern.
/// `'e' tenant 0 id`: one of the tenant's data keys (`store/data_keys.rs`).
pub fn data_key(tenant: &str, id: u32) -> Bytes {
    let mut key = prefix(DATA_KEY, tenant, 4);
    key.put_u32(id);
    key.freeze()
}

pub fn plugin(tenant: &str, pattern: &str) -> Bytes {
    let mut key = prefix(PLUGIN, tenant, pattern.len());
    key.put_slice(pattern.as_bytes());
    key.freeze()
}

/// `'z' tenant 0 group 0`: the start of a group's cursors.
fn cursor_prefix(tenant: &str, group: &str, extra: usize) -> BytesMut {
    let mut key = prefix(CURSOR, tenant, group.len() + 1 + extra);
    key.put_slice(group.as_bytes());
    key.put_u8(0);
    key
}

/// The key of a group's cursor in one subject.
pub fn cursor(tenant: &str, group: &str, subject: &str) -> Bytes {
    let mut key = cursor_prefix(tenant, group, subject.len() + 1);
    key.put_slice(subject.as_bytes());
    key.put_u8(0);
    key.freeze()
}

/// Every cursor of one group.
pub fn cursor_range(tenant: &str, group: &str) -> std::ops::Range<Bytes> {
    let start = cursor_prefix(tenant, group, 0);
    let mut end = start.clone();
    let last = end.len() - 1;
    end[last] = 1;
    start.freeze()..end.freeze()
}

/// The subject of a cursor key.
pub fn cursor_subject<'k>(key: &'k [u8], tenant: &str, group: &str) -> Option<&'k str> {
    let start = 2 + tenant.len() + group.len() + 1;
    let rest = key.get(start..key.len().checked_sub(1)?)?;
    std::str::from_utf8(rest).ok()
}

/// One version of a schema binding.
pub fn schema(tenant: &str, pattern: &str, version: u64) -> Bytes {
    versioned(SCHEMA, tenant, pattern, version)
}

/// Every version of one schema binding.
pub fn schema_range(tenant: &str, pattern: &str) -> std::ops::Range<Bytes> {
    versioned_range(SCHEMA, tenant, pattern, 0)
}

/// The pattern and version of a schema key of `tenant`.
pub fn schema_parts<'k>(key: &'k [u8], tenant: &str) -> Option<(&'k str, u64)> {
    let rest = key
        .strip_prefix(&[SCHEMA])?
        .strip_prefix(tenant.as_bytes())?
        .strip_prefix(&[0])?;
    let split = rest.len().checked_sub(9)?;
    let (pattern, tail) = rest.split_at(split);
    let version = tail.strip_prefix(&[0])?;
    let pattern = std::str::from_utf8(pattern).ok()?;
    let version = u64::from_be_bytes(version.try_into().ok()?);
    Some((pattern, version))
}

/// Every tenant record.
pub fn tenant_range() -> std::ops::Range<Bytes> {
    Bytes::from_static(&[TENANT])..Bytes::from_static(&[TENANT + 1])
}

/// Every key of one kind belonging to `tenant`.
pub fn tenant_kind_range(kind: u8, tenant: &str) -> std::ops::Range<Bytes> {
    let start = prefix(kind, tenant, 0);
    let mut end = start.clone();
    // Past `kind tenant 0x00 ...`: the terminator becomes 0x01.
    let last = end.len() - 1;
    end[last] = 1;
    start.freeze()..end.freeze()
}

/// The key of a tenant's usage (subjects, stored bytes), the sequencer's, written
/// with the rounds that change it.
pub fn tenant_usage(tenant: &str) -> Bytes {
    prefix(USAGE, tenant, 0).freeze()
}

/// The key of a front end's session state.
pub fn session(tenant: &str, client_id: &str) -> Bytes {
    let mut key = prefix(SESSION, tenant, client_id.len());
    key.put_slice(client_id.as_bytes());
    key.freeze()
}

fn subject_keyed_range(
    kind: u8,
    tenant: &str,
    literal_prefix: &str,
    after: Option<&str>,
) -> std::ops::Range<Bytes> {
    let base = prefix(kind, tenant, literal_prefix.len() + 1);
    let start = match after {
        Some(after) => {
            let mut key = base.clone();
            key.put_slice(after.as_bytes());
            // Just past `after 0x00`.
            key.put_u8(1);
            key.freeze()
        }
        None => {
            let mut key = base.clone();
            key.put_slice(literal_prefix.as_bytes());
            key.freeze()
        }
    };
    let mut end = base;
    end.put_slice(literal_prefix.as_bytes());
    end.put_u8(0xFF);
    start..end.freeze()
}

/// The subject of a subject-marker key of `tenant`.
pub fn marker_subject<'k>(tenant: &str, key: &'k [u8]) -> Option<&'k str> {
    let rest = key.get(2 + tenant.len()..)?;
    let subject = rest.strip_suffix(&[0])?;
    std::str::from_utf8(subject).ok()
}

pub fn batch(tenant: &str, first_offset: u64) -> Bytes {
    let mut key = prefix(BATCH, tenant, 8);
    key.put_u64(first_offset);
    key.freeze()
}

/// Every batch key of `tenant` from `first_offset` on.
pub fn batch_range(tenant: &str, first_offset: u64) -> std::ops::Range<Bytes> {
    let end = {
        let mut key = prefix(BATCH, tenant, 0);
        let last = key.len() - 1;
        key[last] = 1;
        key.freeze()
    };
    batch(tenant, first_offset)..end
}

pub fn batch_offset(key: &[u8]) -> Option<u64> {
    message_version(key)
}

/// The lowest next offset of a tenant, kept once the batch keys that proved it are gone.
pub fn offset_floor(tenant: &str) -> Bytes {
    prefix(OFFSET_FLOOR, tenant, 0).freeze()
}

pub fn msg_id(tenant: &str, id: &str) -> Bytes {
    let mut key = prefix(MSG_ID, tenant, id.len());
    key.put_slice(id.as_bytes());
    key.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subjects_range_holds_its_versions_and_nothing_else() {
        let range = message_range("t", "a.b", 1);
        let inside = [message("t", "a.b", 1), message("t", "a.b", u64::MAX)];
        let outside = [
            message("t", "a.b.c", 1),
            message("t", "a.bb", 1),
            message("t", "a", 1),
            message("u", "a.b", 1),
            message("t", "a.b", 0),
        ];
        for key in inside {
            assert!(range.contains(&key), "{key:?}");
        }
        for key in outside {
            assert!(!range.contains(&key), "{key:?}");
        }
    }

    #[test]
    fn versions_sort_numerically() {
        assert!(message("t", "s", 255) < message("t", "s", 256));
        assert_eq!(message_version(&message("t", "s", 77)), Some(77));
    }

    #[test]
    fn marker_ranges_follow_literal_prefixes() {
        let range = subject_marker_range("t", "a.", None);
        assert!(range.contains(&subject_marker("t", "a.b")));
        assert!(!range.contains(&subject_marker("t", "b.a")));
        assert!(!range.contains(&subject_marker("t", "a")));
        let after = subject_marker_range("t", "", Some("a.b"));
        assert!(!after.contains(&subject_marker("t", "a.b")));
        assert!(after.contains(&subject_marker("t", "a.b.c")));
        assert!(after.contains(&subject_marker("t", "a.c")));
        assert_eq!(
            marker_subject("t", &subject_marker("t", "x.y")),
            Some("x.y")
        );
    }
}
