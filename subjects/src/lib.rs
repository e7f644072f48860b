//! Subjects, patterns in the NATS and MQTT syntaxes, and the subscription trie.
//!
//! Owns everything about naming messages: the one reversible mapping between the native
//! (`a.b.c`) and MQTT (`a/b/c`) renderings ([`Subject`], [`Pattern`]), the limits a subject
//! must respect, and routing a subject to its subscribers ([`Trie`], [`SharedTrie`]).
//! Must never do I/O, depend on an async runtime, or panic on any input.

mod error;
mod escape;
mod pattern;
mod shared;
mod subject;
mod trie;

pub use error::SubjectError;
pub use pattern::{Pattern, PatternToken};
pub use shared::SharedTrie;
pub use subject::{Limits, MQTT_MAX_LEN, Subject, validate_native_subject};
pub use trie::{QueueGroup, Trie};

/// The first token of a reply inbox subject.
pub const INBOX_TOKEN: &str = "_INBOX";

/// For an inbox subject (`_INBOX` or `_INBOX.…`), what follows `_INBOX.` (`None`
/// when nothing does); `None` for every other subject.
pub fn inbox_rest(subject: &str) -> Option<Option<&str>> {
    let rest = subject.strip_prefix(INBOX_TOKEN)?;
    if rest.is_empty() {
        return Some(None);
    }
    rest.strip_prefix('.').map(Some)
}
