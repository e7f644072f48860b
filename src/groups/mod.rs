//! Key-shared consumer groups: a named group over a subject pattern hands each
//! subject's messages to one member at a time, in version order, and keeps a cursor per
//! (group, subject) instead of a set of acked messages.
//!
//! This module holds what a group is ([`GroupSpec`], its checks) and the dispatcher
//! ([`dispatch::Dispatcher`]), which decides every delivery, ack and redelivery. Both
//! are pure: no I/O, no clock of their own (times come in as milliseconds), no tasks,
//! so every rule is tested here without a server. Must never: read or write the store,
//! or know about connections beyond a member's id.

pub mod awaiting;
pub mod dispatch;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where a new group starts reading its subjects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartAt {
    /// Only messages stored after the group was created.
    #[default]
    New,
    /// Every message still stored.
    All,
    /// Messages stored at or after this time (milliseconds since the Unix epoch).
    Time(u64),
}

/// A group's definition: what `canopy group create` sends and what is stored, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    pub name: String,
    /// The subjects the group consumes, with NATS wildcards (`orders.>`).
    pub pattern: String,
    /// How long a member has to ack (or send in-progress) before the message goes again.
    #[serde(default = "default_ack_wait_ms")]
    pub ack_wait_ms: u64,
    /// Deliveries of one message before it goes to the dead-letter subject (0: no limit).
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u32,
    /// Messages of one subject outstanding at once; 1 keeps each subject in strict order.
    #[serde(default = "default_per_subject")]
    pub per_subject: u32,
    /// Messages outstanding at one member at once.
    #[serde(default = "default_per_member")]
    pub per_member: u32,
    #[serde(default)]
    pub start: StartAt,
    /// Where messages that ran out of deliveries go, the subject appended;
    /// `$DLQ.<group>` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
}

/// Whether `name` may name a group or a consumer: 1 to [`MAX_NAME`] ASCII letters,
/// digits, `-` and `_` (it becomes a token of ack subjects).
pub fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks a member's name as a pull gives it (or as it is made from the pull's reply
/// inbox): 1 to [`MAX_MEMBER`] bytes without control characters.
pub fn check_member(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_MEMBER || name.chars().any(char::is_control) {
        return Err(format!(
            "a member name is 1 to {MAX_MEMBER} bytes without control characters (got {} \
             bytes); a pull without one is named by its reply inbox",
            name.len()
        ));
    }
    Ok(())
}

/// A definition as stored: the spec and when it was made (where `start: new` begins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGroup {
    pub spec: GroupSpec,
    pub created_ms: u64,
    /// Set for a JetStream push consumer: its messages go to a deliver subject as they
    /// come instead of waiting for pulls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushTerms>,
}

/// How a group that is a JetStream push consumer delivers (`deliver_subject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushTerms {
    /// The stream the consumer was made on, as its acks name it.
    pub stream: String,
    pub deliver_subject: String,
    /// Send `100 Idle Heartbeat` this often (0: never).
    #[serde(default)]
    pub heartbeat_ms: u64,
    /// Delete the group after this long with nobody listening on the deliver subject
    /// (an ephemeral consumer's `inactive_threshold`); `None` keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_ms: Option<u64>,
    /// The connection whose inbox the deliver subject is, when that (not a publish
    /// right) let the consumer deliver there: it is deleted once the connection no
    /// longer holds the inbox (only ephemeral consumers are made so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_of: Option<u64>,
    /// The queue group its subscribers share the deliveries in (`deliver_group`): as
    /// for any queue subscription, one of them gets each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_group: Option<String>,
}

fn default_ack_wait_ms() -> u64 {
    Limits::default().ack_wait_ms
}
fn default_max_deliveries() -> u32 {
    Limits::default().max_deliveries
}
fn default_per_subject() -> u32 {
    Limits::default().per_subject
}
fn default_per_member() -> u32 {
    Limits::default().per_member
}

/// How a group delivers: what the dispatcher needs of its definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub ack_wait_ms: u64,
    pub max_deliveries: u32,
    pub per_subject: u32,
    pub per_member: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ack_wait_ms: 30_000,
            max_deliveries: 5,
            per_subject: 1,
            per_member: 1_000,
        }
    }
}

/// Longest group name, in bytes.
pub const MAX_NAME: usize = 64;
/// Longest member name, in bytes. A group keeps each member's name while it is a
/// member (at most 10,000 of them), so this bounds what members cost a group.
pub const MAX_MEMBER: usize = 256;
/// The shortest ack wait: below it a message that is not acked goes again many times
/// a second, each time a store read and a delivery, for as long as a pull waits.
pub const MIN_ACK_WAIT_MS: u64 = 100;
/// Most messages outstanding per subject or per member a group may ask for.
pub const MAX_IN_FLIGHT: u32 = 100_000;
/// The longest ack wait: a day.
pub const MAX_ACK_WAIT_MS: u64 = 86_400_000;

/// Why a group definition is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error(
        "a group name is 1 to {MAX_NAME} letters, digits, '-' or '_', and not `schema` (got {0:?})"
    )]
    Name(String),
    #[error("the group's pattern is not a valid subject pattern: {0}")]
    Pattern(String),
    #[error("the dead-letter prefix is not a valid subject: {0}")]
    DeadLetter(String),
    #[error("ack_wait_ms must be between {MIN_ACK_WAIT_MS} and {MAX_ACK_WAIT_MS} (a day)")]
    AckWait,
    #[error("per_subject and per_member must be between 1 and {MAX_IN_FLIGHT}")]
    InFlight,
}

impl GroupSpec {
    /// A definition with the default limits, starting at new messages.
    pub fn new(name: impl Into<String>, pattern: impl Into<String>) -> Self {
        let limits = Limits::default();
        Self {
            name: name.into(),
            pattern: pattern.into(),
            ack_wait_ms: limits.ack_wait_ms,
            max_deliveries: limits.max_deliveries,
            per_subject: limits.per_subject,
            per_member: limits.per_member,
            start: StartAt::New,
            dead_letter: None,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            ack_wait_ms: self.ack_wait_ms,
            max_deliveries: self.max_deliveries,
            per_subject: self.per_subject,
            per_member: self.per_member,
        }
    }

    /// Checks a definition before it is stored; the pattern with the subjects crate's
    /// own parser, so a group matches exactly what a subscription with it would.
    pub fn check(&self) -> Result<(), SpecError> {
        // `$DLQ.schema.…` holds schemas' dead letters.
        if !name_ok(&self.name) || self.name == "schema" {
            return Err(SpecError::Name(self.name.clone()));
        }
        canopy_subjects::Pattern::parse_native(&self.pattern)
            .map_err(|e| SpecError::Pattern(e.to_string()))?;
        if let Some(prefix) = &self.dead_letter {
            canopy_subjects::validate_native_subject(prefix, &canopy_subjects::Limits::default())
                .map_err(|e| SpecError::DeadLetter(e.to_string()))?;
        }
        if !(MIN_ACK_WAIT_MS..=MAX_ACK_WAIT_MS).contains(&self.ack_wait_ms) {
            return Err(SpecError::AckWait);
        }
        let in_range = |n: u32| (1..=MAX_IN_FLIGHT).contains(&n);
        if !in_range(self.per_subject) || !in_range(self.per_member) {
            return Err(SpecError::InFlight);
        }
        Ok(())
    }

    /// The subject a message that ran out of deliveries is published to.
    pub fn dead_letter_subject(&self, subject: &str) -> String {
        match &self.dead_letter {
            Some(prefix) => format!("{prefix}.{subject}"),
            None => format!("$DLQ.{}.{subject}", self.name),
        }
    }
}

#[cfg(test)]
mod tests;
