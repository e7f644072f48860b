//! What a publish that waits for groups asks (`Canopy-Await: billing,search` and
//! `Canopy-Await-Timeout`), and what its ack reports: the groups that passed its
//! version, and the ones that did not, with why.
//!
//! Pure: parsing, who waits, and the answer's shape only. Must never: wait, know how
//! groups run, or tell a caller anything of a group it may not read.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::MAX_NAME;
use crate::tenancy::{Action, Authorizer, Principal};

/// How long a publish waits for its groups when its headers do not say.
pub const DEFAULT_AWAIT: Duration = Duration::from_secs(5);
/// The longest wait a publish may ask for.
pub const MAX_AWAIT: Duration = Duration::from_secs(60);
/// Groups one publish may wait for.
pub const MAX_AWAIT_GROUPS: usize = 16;

/// The groups a stored publish waits for before it is acknowledged, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Await {
    pub groups: Vec<Box<str>>,
    pub timeout: Duration,
    /// Who waits. A group it may not read is answered as one that does not exist;
    /// without a caller every group is.
    pub caller: Option<Caller>,
}

/// Who waits for groups: the groups it may read, and the allowance its waits count
/// against (its user's, or its connection's when it has no user).
#[derive(Clone)]
pub struct Caller {
    principal: Principal,
    authorizer: Arc<Authorizer>,
    origin: u64,
}

/// Whose allowance a wait counts against: the tenant, and the user, or the
/// connection of a caller without one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallerKey {
    tenant: Arc<str>,
    user: Option<Arc<str>>,
    connection: u64,
}

impl Caller {
    /// `principal`, on the connection `origin`, decided by `authorizer`.
    pub fn new(principal: Principal, authorizer: Arc<Authorizer>, origin: u64) -> Self {
        Self {
            principal,
            authorizer,
            origin,
        }
    }

    /// Whether the caller may read a group over `pattern`: subscribe to it, the right
    /// pulling from it needs.
    pub fn may_read(&self, pattern: &str) -> bool {
        self.authorizer
            .authorize(&self.principal, Action::Subscribe, pattern)
            .is_ok()
    }

    /// Who waits.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    pub fn key(&self) -> CallerKey {
        let user = self.principal.user.clone();
        CallerKey {
            tenant: Arc::clone(&self.principal.tenant),
            connection: if user.is_some() { 0 } else { self.origin },
            user,
        }
    }
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Caller {}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Caller").field(&self.key()).finish()
    }
}

impl Await {
    /// Reads `Canopy-Await` (group names, comma-separated) and `Canopy-Await-Timeout`
    /// (milliseconds, or a number with `ms` or `s`), refusing what cannot be meant.
    pub fn parse(groups: &str, timeout: Option<&str>) -> Result<Await, String> {
        let mut names: Vec<Box<str>> = Vec::new();
        for name in groups.split(',').map(str::trim) {
            let ok = !name.is_empty()
                && name.len() <= MAX_NAME
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(format!(
                    "Canopy-Await names groups separated by commas; `{name}` is not a group name"
                ));
            }
            if !names.iter().any(|n| **n == *name) {
                names.push(name.into());
            }
        }
        if names.len() > MAX_AWAIT_GROUPS {
            return Err(format!(
                "Canopy-Await names at most {MAX_AWAIT_GROUPS} groups, got {}",
                names.len()
            ));
        }
        let timeout = match timeout {
            None => DEFAULT_AWAIT,
            Some(text) => parse_timeout(text)?,
        };
        Ok(Await {
            groups: names,
            timeout,
            caller: None,
        })
    }

    /// Says who waits: what the client core knows once it has read the headers.
    pub fn waited_by(awaiting: &mut Arc<Await>, caller: Caller) {
        Arc::make_mut(awaiting).caller = Some(caller);
    }
}

/// `250`, `250ms` or `2s`: at least a millisecond, at most [`MAX_AWAIT`].
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1_000)
    } else {
        (text, 1)
    };
    let millis = number
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&ms| ms >= 1)
        .ok_or_else(|| {
            format!("Canopy-Await-Timeout must be milliseconds (`250`, `250ms`) or seconds (`2s`), got `{text}`")
        })?;
    let timeout = Duration::from_millis(millis);
    if timeout > MAX_AWAIT {
        return Err(format!(
            "Canopy-Await-Timeout is at most {}s",
            MAX_AWAIT.as_secs()
        ));
    }
    Ok(timeout)
}

/// Why a group had not passed an awaited version when the publish was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    TimedOut,
    /// Nobody consumes the group, so waiting would last until someone does.
    NoMembers,
    NoSuchGroup,
    /// The group's pattern does not take the publish's subject.
    NotMatching,
    /// The caller, or its tenant, has as many publishes waiting as it may.
    TooManyWaiting,
    /// The group was deleted or replaced while the publish waited.
    Stopped,
}

impl Missed {
    /// Every reason, in the order of their numbers on a link between nodes.
    pub const ALL: [Missed; 6] = [
        Missed::TimedOut,
        Missed::NoMembers,
        Missed::NoSuchGroup,
        Missed::NotMatching,
        Missed::TooManyWaiting,
        Missed::Stopped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Missed::TimedOut => "timed out",
            Missed::NoMembers => "the group has no live members",
            Missed::NoSuchGroup => "no such group",
            Missed::NotMatching => "the group's pattern does not match the subject",
            Missed::TooManyWaiting => {
                "too many waits for groups: the caller's or the tenant's places are taken"
            }
            Missed::Stopped => "the group stopped",
        }
    }
}

/// What a publish's ack says of the groups it waited for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwaitOutcome {
    /// Groups that had acked (or ended) the version, in the order the header named them.
    pub passed: Vec<Box<str>>,
    /// Groups that had not, with why.
    pub pending: Vec<(Box<str>, Missed)>,
}

impl AwaitOutcome {
    /// Every group named passed.
    pub fn complete(&self) -> bool {
        self.pending.is_empty()
    }

    /// `{"passed": [...], "pending": [{"group": .., "reason": ..}]}`, as the ack's `await`.
    pub fn to_json(&self) -> serde_json::Value {
        let pending: Vec<_> = self
            .pending
            .iter()
            .map(|(group, why)| json!({"group": &**group, "reason": why.as_str()}))
            .collect();
        let passed: Vec<&str> = self.passed.iter().map(|g| &**g).collect();
        json!({"passed": passed, "pending": pending})
    }

    /// The pending groups as `name (reason)`, comma-separated: what a protocol without
    /// JSON acks (MQTT) carries in a property.
    pub fn pending_text(&self) -> String {
        self.pending
            .iter()
            .map(|(group, why)| format!("{group} ({})", why.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_timeouts_are_read_and_bad_ones_refused() {
        let parsed = Await::parse(" billing, search ,billing", Some("2s")).unwrap();
        assert_eq!(parsed.groups, vec!["billing".into(), "search".into()]);
        assert_eq!(parsed.timeout, Duration::from_secs(2));
        assert_eq!(
            Await::parse("a", Some("250ms")).unwrap().timeout,
            Duration::from_millis(250)
        );
        assert_eq!(
            Await::parse("a", Some("40")).unwrap().timeout,
            Duration::from_millis(40)
        );
        assert_eq!(Await::parse("a", None).unwrap().timeout, DEFAULT_AWAIT);
        for (groups, timeout) in [
            ("", None),
            ("a,,b", None),
            ("orders.>", None),
            ("a", Some("0")),
            ("a", Some("soon")),
            ("a", Some("61s")),
            ("a", Some("-5")),
        ] {
            assert!(
                Await::parse(groups, timeout).is_err(),
                "{groups:?} {timeout:?}"
            );
        }
        let many = (0..=MAX_AWAIT_GROUPS)
            .map(|i| format!("g{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(Await::parse(&many, None).is_err());
    }

    #[test]
    fn an_outcome_names_each_pending_group_with_why() {
        let outcome = AwaitOutcome {
            passed: vec!["billing".into()],
            pending: vec![("search".into(), Missed::TimedOut)],
        };
        assert!(!outcome.complete());
        assert_eq!(
            outcome.to_json(),
            json!({"passed": ["billing"], "pending": [{"group": "search", "reason": "timed out"}]})
        );
        assert_eq!(outcome.pending_text(), "search (timed out)");
    }
}
