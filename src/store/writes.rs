//! A round's engine writes (puts, expiring puts, deletes) in a form both the engine
//! and the journal take: turned into one engine write batch without copying, and
//! encoded into a journal record that replays to the same batch.
//!
//! Record body: one entry after another, each `[kind u8][key len u32][key]`, then for
//! a put `[value len u32][value]`, and for an expiring put also `[ttl ms u64]`,
//! little-endian.
//!
//! Must never: decode a body it cannot account for byte by byte (a short or unknown
//! entry is an error, not a partial batch).

use bytes::{Buf, BufMut, Bytes};
use slatedb::WriteBatch;
use slatedb::config::{PutOptions, Ttl};

const PUT: u8 = 1;
const PUT_EXPIRING: u8 = 2;
const DELETE: u8 = 3;

/// A journal record body that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("a journal record's writes do not decode at byte {at}")]
pub struct BadWrites {
    at: usize,
}

/// One write of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put {
        key: Bytes,
        value: Bytes,
    },
    /// A subject's messages as a run (`store/runs.rs`) that a later round's run of
    /// the same subject may extend before the engine holds it. The journal records it
    /// as a plain put.
    Run {
        key: Bytes,
        value: Bytes,
    },
    PutExpiring {
        key: Bytes,
        value: Bytes,
        ttl_ms: u64,
    },
    Delete {
        key: Bytes,
    },
}

/// The writes of one round, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writes {
    writes: Vec<Write>,
    /// Bytes of keys and values, for sizing the journal record.
    bytes: usize,
}

impl Writes {
    pub fn put(&mut self, key: Bytes, value: Bytes) {
        self.bytes += key.len() + value.len();
        self.writes.push(Write::Put { key, value });
    }

    /// A subject's run of messages, keyed by its first version.
    pub fn put_run(&mut self, key: Bytes, value: Bytes) {
        self.bytes += key.len() + value.len();
        self.writes.push(Write::Run { key, value });
    }

    /// A put the engine forgets `ttl_ms` after it is written.
    pub fn put_expiring(&mut self, key: Bytes, value: Bytes, ttl_ms: u64) {
        self.bytes += key.len() + value.len();
        self.writes.push(Write::PutExpiring { key, value, ttl_ms });
    }

    pub fn delete(&mut self, key: Bytes) {
        self.bytes += key.len();
        self.writes.push(Write::Delete { key });
    }

    /// The engine batch, sharing the keys' and values' bytes.
    pub fn into_batch(self) -> WriteBatch {
        let mut batch = WriteBatch::new();
        for write in self.writes {
            match write {
                Write::Put { key, value } | Write::Run { key, value } => {
                    batch.put_bytes(key, value)
                }
                Write::PutExpiring { key, value, ttl_ms } => batch.put_bytes_with_options(
                    key,
                    value,
                    &PutOptions {
                        ttl: Ttl::ExpireAfterMillis(ttl_ms),
                    },
                ),
                Write::Delete { key } => batch.delete(key),
            }
        }
        batch
    }

    /// The writes in the order they were made.
    pub fn as_slice(&self) -> &[Write] {
        &self.writes
    }

    /// The writes in the order they were made, taken.
    pub fn into_writes(self) -> std::vec::IntoIter<Write> {
        self.writes.into_iter()
    }

    /// Appends the journal record body of these writes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.bytes + self.writes.len() * 17);
        for write in &self.writes {
            let (kind, key) = match write {
                Write::Put { key, .. } | Write::Run { key, .. } => (PUT, key),
                Write::PutExpiring { key, .. } => (PUT_EXPIRING, key),
                Write::Delete { key } => (DELETE, key),
            };
            out.put_u8(kind);
            put_slice(out, key);
            match write {
                Write::Put { value, .. } | Write::Run { value, .. } => put_slice(out, value),
                Write::PutExpiring { value, ttl_ms, .. } => {
                    put_slice(out, value);
                    out.put_u64_le(*ttl_ms);
                }
                Write::Delete { .. } => {}
            }
        }
    }

    /// The writes a journal record body holds.
    pub fn decode(body: Bytes) -> Result<Writes, BadWrites> {
        let total = body.len();
        let mut rest = body;
        let mut writes = Writes::default();
        while rest.has_remaining() {
            let at = total - rest.len();
            let bad = BadWrites { at };
            let kind = rest.get_u8();
            let key = take_slice(&mut rest).ok_or(bad)?;
            match kind {
                PUT => {
                    let value = take_slice(&mut rest).ok_or(BadWrites { at })?;
                    writes.put(key, value);
                }
                PUT_EXPIRING => {
                    let value = take_slice(&mut rest).ok_or(BadWrites { at })?;
                    if rest.remaining() < 8 {
                        return Err(BadWrites { at });
                    }
                    let ttl_ms = rest.get_u64_le();
                    writes.put_expiring(key, value, ttl_ms);
                }
                DELETE => writes.delete(key),
                _ => return Err(BadWrites { at }),
            }
        }
        Ok(writes)
    }
}

fn put_slice(out: &mut Vec<u8>, bytes: &[u8]) {
    // A key or value is far below 4 GiB: the engine and the front ends bound them.
    out.put_u32_le(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
    out.put_slice(bytes);
}

fn take_slice(rest: &mut Bytes) -> Option<Bytes> {
    if rest.remaining() < 4 {
        return None;
    }
    let len = rest.get_u32_le() as usize;
    (rest.remaining() >= len).then(|| rest.split_to(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_come_back_from_their_record_as_they_were_made() {
        let mut writes = Writes::default();
        writes.put(Bytes::from_static(b"m\0a"), Bytes::from_static(b"value"));
        writes.put_expiring(Bytes::from_static(b"d\0id"), Bytes::new(), 120_000);
        writes.delete(Bytes::from_static(b"m\0old"));
        let mut body = Vec::new();
        writes.encode(&mut body);
        let decoded = Writes::decode(Bytes::from(body)).expect("decodes");
        assert_eq!(decoded, writes);
    }

    #[test]
    fn a_short_or_unknown_record_is_an_error_not_a_partial_batch() {
        let mut writes = Writes::default();
        writes.put(Bytes::from_static(b"key"), Bytes::from_static(b"value"));
        let mut body = Vec::new();
        writes.encode(&mut body);
        for cut in 1..body.len() {
            let short = Bytes::copy_from_slice(&body[..cut]);
            assert!(Writes::decode(short).is_err(), "cut at {cut}");
        }
        assert!(Writes::decode(Bytes::from_static(&[9, 0, 0, 0, 0])).is_err());
        assert_eq!(
            Writes::decode(Bytes::new()).expect("empty"),
            Writes::default()
        );
    }
}
