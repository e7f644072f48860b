//! JetStream streams on Canopy (issue 30): a stream is a name for a set of subject
//! filters inside a tenant, a view over subjects that are already each their own
//! durable key stream. Declaring one copies nothing; it names which subjects a PubAck
//! reports under it, which a `Nats-Expected-Stream` publish must fall in, which a
//! consumer bound to it may read, and the limits (versions per subject) its subjects
//! are stored with. Subjects no declared stream holds stay in the tenant's own stream,
//! named after the tenant, as before.
//!
//! This module holds what a stream is: its config as JetStream clients send it,
//! checked and normalised ([`config`]), the set of a tenant's streams with the lookup
//! the publish path makes ([`Streams`]), and how filters relate ([`filters`]). It
//! must never touch the store or the network (the API does), and never accept a
//! setting it cannot honour: such a config is refused, saying which setting.

pub mod config;
pub mod filters;

use std::sync::Arc;

use canopy_subjects::{Pattern, Trie};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use config::{StreamRefusal, normalise};

/// Streams one tenant may declare.
pub const MAX_STREAMS: usize = 1_000;

/// One declared stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub name: Arc<str>,
    /// Its subject filters, native syntax.
    pub subjects: Vec<String>,
    /// Versions kept per subject (0: all), from `max_msgs_per_subject`.
    pub max_versions: u64,
    /// Whether a publish may roll its subject up (`allow_rollup_hdrs`).
    pub allow_rollup: bool,
    /// Milliseconds a message of the stream is kept (`max_age`; 0: no limit).
    pub max_age_ms: u64,
    /// Bytes of headers and payload one of its messages may have (`max_msg_size`, a
    /// KV bucket's `max_value_size`; 0: only the server's `max_payload`).
    pub max_msg_size: u64,
    /// When it was declared (the server's clock).
    pub created_ms: u64,
    /// The normalised config, as its info reports it.
    pub config: Value,
}

/// A stream as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredStream {
    pub config: Value,
    pub created_ms: u64,
}

impl Stream {
    /// A stream from a normalised config (see [`normalise`]).
    pub fn new(config: Value, created_ms: u64) -> Result<Stream, StreamRefusal> {
        let name = config
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| StreamRefusal::invalid("stream name is required"))?;
        let subjects = config::strings_of(&config, "subjects");
        let max_versions = config
            .get("max_msgs_per_subject")
            .and_then(Value::as_i64)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        let allow_rollup = config.get("allow_rollup_hdrs").and_then(Value::as_bool) == Some(true);
        let max_age_ms = config
            .get("max_age")
            .and_then(Value::as_u64)
            .map_or(0, |ns| ns.div_ceil(1_000_000));
        let max_msg_size = config
            .get("max_msg_size")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Ok(Stream {
            name: Arc::from(name),
            subjects,
            max_versions,
            allow_rollup,
            max_age_ms,
            max_msg_size,
            created_ms,
            config,
        })
    }

    /// The stream as stored.
    pub fn stored(&self) -> StoredStream {
        StoredStream {
            config: self.config.clone(),
            created_ms: self.created_ms,
        }
    }

    /// Whether a message of `size` bytes (headers and payload) is too large for it.
    pub fn too_large(&self, size: usize) -> bool {
        self.max_msg_size > 0 && size as u64 > self.max_msg_size
    }

    /// Whether a message stored at `time_ms` has outlived the stream's `max_age` at
    /// `now_ms` (retention removes it at its next pass; reads pass over it before).
    pub fn expired(&self, time_ms: u64, now_ms: u64) -> bool {
        self.max_age_ms > 0 && time_ms.saturating_add(self.max_age_ms) < now_ms
    }

    /// Whether `filter` reads only inside this stream.
    pub fn holds_filter(&self, filter: &str) -> bool {
        self.subjects.iter().any(|s| filters::within(filter, s))
    }
}

/// A tenant's declared streams, with a trie from their filters for the publish path.
#[derive(Default)]
pub struct Streams {
    list: Vec<Arc<Stream>>,
    trie: Trie<usize>,
}

impl Streams {
    pub fn new(list: Vec<Arc<Stream>>) -> Streams {
        let mut trie = Trie::new();
        for (i, stream) in list.iter().enumerate() {
            for subject in &stream.subjects {
                if let Ok(pattern) = Pattern::parse_native(subject) {
                    trie.insert(&pattern, None, i);
                }
            }
        }
        Streams { list, trie }
    }

    /// The stream holding `subject`, if one does (filters never overlap, so at most
    /// one matches).
    pub fn for_subject(&self, subject: &str) -> Option<&Arc<Stream>> {
        let mut found = usize::MAX;
        self.trie.for_each_match(subject, &mut |plain, _| {
            for &i in plain {
                found = found.min(i);
            }
        });
        self.list.get(found)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Stream>> {
        self.list.iter().find(|s| &*s.name == name)
    }

    /// In name order.
    pub fn list(&self) -> &[Arc<Stream>] {
        &self.list
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first stream other than `name` one of `subjects` overlaps.
    pub fn overlapping(&self, name: &str, subjects: &[String]) -> Option<&Arc<Stream>> {
        self.list.iter().find(|other| {
            &*other.name != name
                && other
                    .subjects
                    .iter()
                    .any(|theirs| subjects.iter().any(|ours| filters::overlap(ours, theirs)))
        })
    }

    /// These streams with `stream` added, or put in place of the one of its name.
    pub fn with(&self, stream: Arc<Stream>) -> Streams {
        let mut list: Vec<Arc<Stream>> = self
            .list
            .iter()
            .filter(|s| s.name != stream.name)
            .cloned()
            .collect();
        list.push(stream);
        list.sort_by(|a, b| a.name.cmp(&b.name));
        Streams::new(list)
    }

    /// These streams without the one called `name`.
    pub fn without(&self, name: &str) -> Streams {
        Streams::new(
            self.list
                .iter()
                .filter(|s| &*s.name != name)
                .cloned()
                .collect(),
        )
    }
}

/// The stricter of two version limits, 0 meaning none: a stream's
/// `max_msgs_per_subject` never raises a store policy's.
pub fn stricter(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, limit) | (limit, 0) => limit,
        (a, b) => a.min(b),
    }
}

/// A tenant's streams from their stored records; one that cannot be read is left out
/// and told to `unreadable`.
pub fn load(records: &[bytes::Bytes], mut unreadable: impl FnMut(String)) -> Streams {
    let mut list = Vec::new();
    for record in records {
        let stream = serde_json::from_slice::<StoredStream>(record)
            .map_err(|e| e.to_string())
            .and_then(|stored| {
                Stream::new(stored.config, stored.created_ms).map_err(|e| e.description)
            });
        match stream {
            Ok(stream) => list.push(Arc::new(stream)),
            Err(error) => unreadable(error),
        }
    }
    list.sort_by(|a, b| a.name.cmp(&b.name));
    Streams::new(list)
}

/// A tenant's streams as the publish path reads them: swapped whole on a change.
#[derive(Default)]
pub struct TenantStreams {
    current: RwLock<Arc<Streams>>,
}

impl TenantStreams {
    pub fn current(&self) -> Arc<Streams> {
        Arc::clone(&self.current.read())
    }

    pub fn set(&self, streams: Streams) {
        *self.current.write() = Arc::new(streams);
    }

    /// The stream holding `subject`, if the tenant declared one that does.
    pub fn for_subject(&self, subject: &str) -> Option<Arc<Stream>> {
        let current = self.current.read();
        if current.is_empty() {
            return None;
        }
        current.for_subject(subject).cloned()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stream(name: &str, subjects: &[&str]) -> Arc<Stream> {
        let config =
            normalise(name, &json!({"name": name, "subjects": subjects})).expect("a valid config");
        Arc::new(Stream::new(config, 0).expect("a stream"))
    }

    #[test]
    fn a_streams_version_limit_never_raises_a_policys() {
        assert_eq!(stricter(0, 5), 5);
        assert_eq!(stricter(3, 0), 3);
        assert_eq!(stricter(3, 5), 3);
        assert_eq!(stricter(0, 0), 0);
    }

    #[test]
    fn a_subject_belongs_to_the_stream_whose_filters_hold_it() {
        let streams = Streams::default()
            .with(stream("ORDERS", &["orders.>"]))
            .with(stream("KV_cfg", &["$KV.cfg.>"]));
        assert_eq!(
            streams.for_subject("orders.eu.1").map(|s| &*s.name),
            Some("ORDERS")
        );
        assert_eq!(
            streams.for_subject("$KV.cfg.a").map(|s| &*s.name),
            Some("KV_cfg")
        );
        assert!(streams.for_subject("billing.x").is_none());
        assert_eq!(
            streams
                .overlapping("OTHER", &["orders.eu.*".to_owned()])
                .map(|s| &*s.name),
            Some("ORDERS")
        );
        assert!(
            streams
                .overlapping("ORDERS", &["orders.*".to_owned()])
                .is_none(),
            "a stream does not overlap itself"
        );
        let fewer = streams.without("ORDERS");
        assert!(fewer.for_subject("orders.eu.1").is_none());
        assert_eq!(fewer.list().len(), 1);
    }
}
