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
