//! The values the store writes, and reading them back without trusting them.
//!
//! ```text
//!  message record  offset:u64be time_ms:u64be flags:u8 header_len:u24be headers payload
//!  run             0xFF count:u32be { record_len:u32be message record }*   (format 2)
//!  retained        version:u64be message record
//!  batch entry     time_ms:u64be count:u32be { subject_len:u16be subject version:u64be bytes:u32be }*
//!  msg id entry    version:u64be offset:u64be time_ms:u64be subject
//!  subject marker  purged_version:u64be purged_offset:u64be   (0 0 unless purged)
//! ```
//!
//! Headers are the NATS header block exactly as published (`NATS/1.0\r\n...`), or
//! empty. Decoding returns `None` on anything malformed instead of panicking: the
//! store is not trusted to hold what we wrote.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Headers longer than this cannot be stored: the length shares its word with the
/// flags. Format 1 wrote the length as a u32 with the flags byte always 0, so its
/// records read the same.
pub const MAX_HEADERS: usize = (1 << 24) - 1;

/// A record flag the store owns: the header block and payload are one sealed value
/// (`store/sealed.rs`). Never set on a record a reader gets.
pub const SEALED: u8 = 0x80;
/// A record flag the store owns: the record was sealed with a data key that is gone,
/// and reads back with no payload (`store/sealed.rs`).
pub const UNREADABLE: u8 = 0x40;

/// One stored message as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: u64,
    pub time_ms: u64,
    /// What a front end recorded about the publish (MQTT: its QoS and retain flag),
    /// opaque to the store but for its own two top bits ([`SEALED`], [`UNREADABLE`]).
    pub flags: u8,
    /// The raw NATS header block; empty when the message had none.
    pub headers: Bytes,
    pub payload: Bytes,
}

const RECORD_FIXED: usize = 8 + 8 + 4;

pub fn encode_record(
    offset: u64,
    time_ms: u64,
    flags: u8,
    headers: &[u8],
    payload: &[u8],
) -> Bytes {
    let mut out = BytesMut::with_capacity(RECORD_FIXED + headers.len() + payload.len());
    put_record(&mut out, offset, time_ms, flags, headers, payload);
    out.freeze()
}

fn put_record(
    out: &mut BytesMut,
    offset: u64,
    time_ms: u64,
    flags: u8,
    headers: &[u8],
    payload: &[u8],
) {
    out.put_u64(offset);
    out.put_u64(time_ms);
    // Callers refuse longer header blocks; the cap keeps a bad caller from
    // corrupting the flags.
    let len = u32::try_from(headers.len().min(MAX_HEADERS)).unwrap_or(0);
    out.put_u32(u32::from(flags) << 24 | len);
    out.put_slice(headers.get(..MAX_HEADERS).unwrap_or(headers));
    out.put_slice(payload);
}

/// The first byte of a run: a value holding `count` consecutive versions of one
/// subject, keyed by the first. A single message is stored as a bare record, whose
/// first byte is the top byte of its offset and so 0 below 2^56 offsets: the two
/// never look alike, and every format 1 value reads as a run of one.
pub const RUN_MARK: u8 = 0xFF;
const RUN_HEADER: usize = 1 + 4;

/// One run's value, built record by record into one buffer.
#[derive(Debug)]
pub struct RunBuilder {
    out: BytesMut,
    count: u32,
}

impl RunBuilder {
    pub fn new(capacity: usize) -> Self {
        let mut out = BytesMut::with_capacity(RUN_HEADER + 4 + RECORD_FIXED + capacity);
        out.put_u8(RUN_MARK);
        out.put_u32(0);
        RunBuilder { out, count: 0 }
    }

    pub fn push(&mut self, offset: u64, time_ms: u64, flags: u8, headers: &[u8], payload: &[u8]) {
        let headers = headers.get(..MAX_HEADERS).unwrap_or(headers);
        let len = RECORD_FIXED + headers.len() + payload.len();
        self.out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        put_record(&mut self.out, offset, time_ms, flags, headers, payload);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of the value so far.
    pub fn bytes(&self) -> usize {
        self.out.len()
    }

    /// The value: a bare record for a run of one, else the run.
    pub fn finish(mut self) -> Bytes {
        if self.count == 1 {
            return self.out.freeze().slice(RUN_HEADER + 4..);
        }
        self.out[1..RUN_HEADER].copy_from_slice(&self.count.to_be_bytes());
        self.out.freeze()
    }
}

/// How many messages a stored value holds: a run's count, 1 for a bare record.
pub fn run_count(value: &[u8]) -> u32 {
    match value {
        [RUN_MARK, a, b, c, d, ..] => u32::from_be_bytes([*a, *b, *c, *d]),
        _ => 1,
    }
}

/// One run holding the messages of `parts` (runs or bare records of one subject,
/// each starting where the one before ends) in order: `count` is their total.
pub fn join_runs(parts: &[Bytes], count: u32) -> Bytes {
    let bytes: usize = parts.iter().map(|p| p.len() + 4).sum();
    let mut out = BytesMut::with_capacity(RUN_HEADER + bytes);
    out.put_u8(RUN_MARK);
    out.put_u32(count);
    for part in parts {
        if part.first() == Some(&RUN_MARK) {
            out.put_slice(part.get(RUN_HEADER..).unwrap_or_default());
        } else {
            out.put_u32(u32::try_from(part.len()).unwrap_or(u32::MAX));
            out.put_slice(part);
        }
    }
    out.freeze()
}

/// The records of one stored value, in version order: one for a bare record, the
/// run's for a run. `None` when it is malformed.
pub fn decode_run(mut value: Bytes) -> Option<Vec<Record>> {
    if value.first() != Some(&RUN_MARK) {
        return decode_record(value).map(|r| vec![r]);
    }
    if value.len() < RUN_HEADER {
        return None;
    }
    value.advance(1);
    let count = usize::try_from(value.get_u32()).ok()?;
    let mut records = Vec::with_capacity(count.min(value.len() / (4 + RECORD_FIXED)));
    for _ in 0..count {
        if value.len() < 4 {
            return None;
        }
        let len = usize::try_from(value.get_u32()).ok()?;
        if len > value.len() {
            return None;
        }
        records.push(decode_record(value.split_to(len))?);
    }
    value.is_empty().then_some(records)
}

/// A retained message: the subject's version it came from, then its record.
pub fn encode_retained(
    version: u64,
    offset: u64,
    time_ms: u64,
    flags: u8,
    headers: &[u8],
    payload: &[u8],
) -> Bytes {
    let mut out = BytesMut::with_capacity(8 + RECORD_FIXED + headers.len() + payload.len());
    out.put_u64(version);
    put_record(&mut out, offset, time_ms, flags, headers, payload);
    out.freeze()
}

pub fn decode_retained(mut value: Bytes) -> Option<(u64, Record)> {
    if value.len() < 8 {
        return None;
    }
    let version = value.get_u64();
    Some((version, decode_record(value)?))
}

/// Whether a record's headers say its payload is JSON.
pub fn says_json(headers: &[u8]) -> bool {
    !headers.is_empty()
        && canopy_protocols::native::HeaderMap::parse(headers).is_ok_and(|map| map.says_json())
}

pub fn decode_record(mut value: Bytes) -> Option<Record> {
    if value.len() < RECORD_FIXED {
        return None;
    }
    let offset = value.get_u64();
    let time_ms = value.get_u64();
    let word = value.get_u32();
    let flags = u8::try_from(word >> 24).unwrap_or(0);
    let header_len = usize::try_from(word & 0x00FF_FFFF).ok()?;
    if header_len > value.len() {
        return None;
    }
    let headers = value.split_to(header_len);
    Some(Record {
        offset,
        time_ms,
        flags,
        headers,
        payload: value,
    })
}

/// The (subject, version) pairs one group commit wrote, in offset order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchEntry {
    pub time_ms: u64,
    /// (subject, version, bytes of headers and payload), in offset order.
    pub messages: Vec<(String, u64, u32)>,
}

pub fn encode_batch<'a>(
    time_ms: u64,
    messages: impl ExactSizeIterator<Item = (&'a str, u64, u32)>,
) -> Bytes {
    let mut out = BytesMut::with_capacity(12 + messages.len() * 28);
    out.put_u64(time_ms);
    out.put_u32(u32::try_from(messages.len()).unwrap_or(u32::MAX));
    for (subject, version, bytes) in messages {
        out.put_u16(u16::try_from(subject.len()).unwrap_or(u16::MAX));
        out.put_slice(subject.as_bytes());
        out.put_u64(version);
        out.put_u32(bytes);
    }
    out.freeze()
}

pub fn decode_batch(mut value: Bytes) -> Option<BatchEntry> {
    if value.len() < 12 {
        return None;
    }
    let time_ms = value.get_u64();
    let count = usize::try_from(value.get_u32()).ok()?;
    let mut messages = Vec::with_capacity(count.min(value.len() / 14));
    for _ in 0..count {
        if value.len() < 2 {
            return None;
        }
        let len = usize::from(value.get_u16());
        if value.len() < len + 12 {
            return None;
        }
        let subject = std::str::from_utf8(&value.split_to(len)).ok()?.to_owned();
        let version = value.get_u64();
        messages.push((subject, version, value.get_u32()));
    }
    Some(BatchEntry { time_ms, messages })
}

/// Where a message stored under a msg id went, for answering its duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgIdEntry {
    pub subject: String,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
}

pub fn encode_msg_id(entry: &MsgIdEntry) -> Bytes {
    let mut out = BytesMut::with_capacity(24 + entry.subject.len());
    out.put_u64(entry.version);
    out.put_u64(entry.offset);
    out.put_u64(entry.time_ms);
    out.put_slice(entry.subject.as_bytes());
    out.freeze()
}

pub fn decode_msg_id(mut value: Bytes) -> Option<MsgIdEntry> {
    if value.len() < 24 {
        return None;
    }
    let version = value.get_u64();
    let offset = value.get_u64();
    let time_ms = value.get_u64();
    let subject = std::str::from_utf8(&value).ok()?.to_owned();
    Some(MsgIdEntry {
        subject,
        version,
        offset,
        time_ms,
    })
}

/// A subject marker: the version and offset a purge removed up to, so versions are
/// never given again after the history is gone.
pub fn encode_marker(purged_version: u64, purged_offset: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(16);
    out.put_u64(purged_version);
    out.put_u64(purged_offset);
    out.freeze()
}

pub fn decode_marker(mut value: Bytes) -> Option<(u64, u64)> {
    if value.len() < 16 {
        return None;
    }
    Some((value.get_u64(), value.get_u64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let value = encode_record(7, 1234, 0, b"NATS/1.0\r\nA: b\r\n\r\n", b"payload");
        let record = decode_record(value.clone()).expect("decodes");
        assert_eq!(record.offset, 7);
        assert_eq!(record.time_ms, 1234);
        assert_eq!(&record.headers[..], b"NATS/1.0\r\nA: b\r\n\r\n");
        assert_eq!(&record.payload[..], b"payload");
        for cut in 0..RECORD_FIXED {
            assert_eq!(decode_record(value.slice(..cut)), None);
        }
        let mut lying = BytesMut::from(&value[..]);
        lying[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_record(lying.freeze()), None);
    }

    #[test]
    fn runs_round_trip_and_a_run_of_one_is_a_bare_record() {
        let mut one = RunBuilder::new(16);
        one.push(7, 1234, 2, b"", b"only");
        assert_eq!(one.finish(), encode_record(7, 1234, 2, b"", b"only"));
        assert_eq!(
            decode_run(encode_record(7, 1234, 2, b"", b"only")).map(|r| r.len()),
            Some(1)
        );

        let mut run = RunBuilder::new(64);
        run.push(10, 5, 0, b"NATS/1.0\r\nA: b\r\n\r\n", b"first");
        run.push(12, 5, 1, b"", b"");
        run.push(13, 6, 0, b"", b"third");
        assert_eq!(run.count(), 3);
        let value = run.finish();
        assert_eq!(value[0], RUN_MARK);
        let records = decode_run(value.clone()).expect("decodes");
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, [10, 12, 13]);
        assert_eq!(&records[0].headers[..], b"NATS/1.0\r\nA: b\r\n\r\n");
        assert_eq!(&records[0].payload[..], b"first");
        assert_eq!((records[1].flags, records[1].payload.len()), (1, 0));
        assert_eq!(&records[2].payload[..], b"third");
        // Cut anywhere, or with a count that lies, it is refused rather than misread.
        for cut in 1..value.len() {
            assert_eq!(decode_run(value.slice(..cut)), None, "cut at {cut}");
        }
        let mut lying = BytesMut::from(&value[..]);
        lying[1..5].copy_from_slice(&2u32.to_be_bytes());
        assert_eq!(decode_run(lying.freeze()), None);
    }

    #[test]
    fn batches_and_msg_ids_round_trip() {
        let list = [("a.b", 1u64, 10u32), ("c", 9, 0)];
        let value = encode_batch(55, list.iter().copied());
        let entry = decode_batch(value.clone()).expect("decodes");
        assert_eq!(entry.time_ms, 55);
        assert_eq!(
            entry.messages,
            vec![("a.b".into(), 1, 10), ("c".into(), 9, 0)]
        );
        assert_eq!(decode_batch(value.slice(..value.len() - 1)), None);

        let id = MsgIdEntry {
            subject: "x.y".into(),
            version: 3,
            offset: 99,
            time_ms: 5,
        };
        assert_eq!(decode_msg_id(encode_msg_id(&id)), Some(id));
    }
}
