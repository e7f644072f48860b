//! Key-shared consumer groups: a named group over a subject pattern hands each
//! subject's messages to one member at a time, in version order, and keeps a cursor per
//! (group, subject) instead of a set of acked messages.
//!
//! This module holds what a group is ([`GroupSpec`], its checks) and the dispatcher
//! ([`dispatch::Dispatcher`]), which decides every delivery, ack and redelivery. Both
//! are pure: no I/O, no clock of their own (times come in as milliseconds), no tasks,
//! so every rule is tested here without a server. Must never: read or write the store,
//! or know about connections beyond a member's id.

pub mod dispatch;

use std::time::Duration;

use thiserror::Error;

/// Where a new group starts reading its subjects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Only messages stored after the group was created.
    New,
    /// Every message still stored.
    All,
    /// Messages stored at or after this time (milliseconds since the Unix epoch).
    Time(u64),
}

/// A group's definition, as `canopy group create` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    /// The subjects the group consumes, with NATS wildcards (`orders.>`).
    pub pattern: String,
    pub limits: Limits,
    pub start: StartAt,
    /// Where messages that ran out of deliveries go; `$DLQ.<group>.<subject>` when unset.
    pub dead_letter: Option<String>,
}

/// How a group delivers: ack deadline, redeliveries and how much may be outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a member has to ack (or send in-progress) before the message goes again.
    pub ack_wait: Duration,
    /// Deliveries of one message before it goes to the dead-letter subject (0: no limit).
    pub max_deliveries: u32,
    /// Messages of one subject outstanding at once; 1 keeps each subject in strict order.
    pub per_subject: u32,
    /// Messages outstanding at one member at once.
    pub per_member: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            max_deliveries: 5,
            per_subject: 1,
            per_member: 1_000,
        }
    }
}

/// Longest group name, in bytes.
pub const MAX_NAME: usize = 64;
/// Most messages outstanding per subject or per member a group may ask for.
pub const MAX_IN_FLIGHT: u32 = 100_000;

/// Why a group definition is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("a group name is 1 to {MAX_NAME} letters, digits, '-' or '_' (got {0:?})")]
    Name(String),
    #[error("the group's pattern is not a valid subject pattern: {0}")]
    Pattern(String),
    #[error("ack wait must be between 1 ms and 1 day")]
    AckWait,
    #[error("in flight per subject and per member must be between 1 and {MAX_IN_FLIGHT}")]
    InFlight,
}

impl GroupSpec {
    /// Checks a definition before it is stored; the pattern with the subjects crate's
    /// own parser, so a group matches exactly what a subscription with it would.
    pub fn check(&self) -> Result<(), SpecError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(SpecError::Name(self.name.clone()));
        }
        canopy_subjects::Pattern::parse_native(&self.pattern)
            .map_err(|e| SpecError::Pattern(e.to_string()))?;
        if self.limits.ack_wait < Duration::from_millis(1)
            || self.limits.ack_wait > Duration::from_secs(86_400)
        {
            return Err(SpecError::AckWait);
        }
        let in_range = |n: u32| (1..=MAX_IN_FLIGHT).contains(&n);
        if !in_range(self.limits.per_subject) || !in_range(self.limits.per_member) {
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
