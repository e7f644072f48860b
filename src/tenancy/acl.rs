//! A user's allow and deny rules for publishing and subscribing, compiled at login with
//! `{user}` and `{client_id}` filled in, and checked by [`super::Authorizer`] for every
//! operation of every front end.
//!
//! A publish needs an allow rule covering its subject (none listed: everything is
//! allowed) and no deny rule covering it. A subscription needs an allow rule covering
//! its whole pattern, and must not overlap a deny rule at all: being stricter than
//! NATS here (which delivers the allowed part) means no per-message filtering is
//! needed. A value substituted into a rule that is not a plain subject token (a client
//! id with `.`, `*`, `>`, `/`, `+`, `#` or spaces) drops an allow rule and turns a
//! deny rule into "deny everything": never wider than written. This module must never
//! widen what a rule says.

use canopy_subjects::{Pattern, PatternToken};

use super::covers;
use crate::store::{Permissions, Rules};

/// One action's compiled rules.
#[derive(Debug, Default)]
struct Compiled {
    /// `None`: no allow rule was listed, so everything not denied is allowed.
    allow: Option<Vec<Pattern>>,
    deny: Vec<Pattern>,
    /// A deny rule could not be filled in safely: it denies everything.
    deny_all: bool,
}

/// A logged-in user's rules.
#[derive(Debug, Default)]
pub struct Acl {
    publish: Compiled,
    subscribe: Compiled,
}

/// `rule` with the placeholders filled in; `None` when a value is not a safe token.
fn fill(rule: &str, user: &str, client: &str) -> Option<Pattern> {
    let safe = |value: &str| {
        !value.is_empty()
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'@'))
    };
    let mut filled = rule.to_owned();
    if filled.contains("{user}") {
        if !safe(user) {
            return None;
        }
        filled = filled.replace("{user}", user);
    }
    if filled.contains("{client_id}") {
        if !safe(client) {
            return None;
        }
        filled = filled.replace("{client_id}", client);
    }
    Pattern::parse_native(&filled).ok()
}

fn compile(rules: &Rules, user: &str, client: &str) -> Compiled {
    let allow = (!rules.allow.is_empty()).then(|| {
        rules
            .allow
            .iter()
            .filter_map(|r| fill(r, user, client))
            .collect()
    });
    let filled: Vec<Option<Pattern>> = rules.deny.iter().map(|r| fill(r, user, client)).collect();
    Compiled {
        allow,
        deny_all: filled.iter().any(Option::is_none),
        deny: filled.into_iter().flatten().collect(),
    }
}

impl Acl {
    pub fn compile(permissions: &Permissions, user: &str, client: &str) -> Acl {
        Acl {
            publish: compile(&permissions.publish, user, client),
            subscribe: compile(&permissions.subscribe, user, client),
        }
    }

    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.allows(subject, covers)
    }

    pub fn may_subscribe(&self, pattern: &str) -> bool {
        self.subscribe.allows(pattern, overlaps)
    }

    /// A subscription under the connection's own inbox (`_INBOX.<owner>.…`, which
    /// only that connection can hold) needs no allow rule; only a deny rule naming
    /// `_INBOX` itself refuses it (wildcards never reach inboxes).
    pub fn may_subscribe_own_inbox(&self, pattern: &str) -> bool {
        !self.subscribe.deny_all
            && !self.subscribe.deny.iter().any(|d| {
                matches!(d.tokens().first(), Some(PatternToken::Literal(t)) if &**t == canopy_subjects::INBOX_TOKEN)
                    && overlaps(d, pattern)
            })
    }
}

impl Compiled {
    /// Allowed: covered by an allow rule (when any is listed) and not `denied` by a
    /// deny rule.
    fn allows(&self, what: &str, denied: fn(&Pattern, &str) -> bool) -> bool {
        !self.deny_all
            && !self.deny.iter().any(|d| denied(d, what))
            && self
                .allow
                .as_ref()
                .is_none_or(|allow| allow.iter().any(|a| covers(a, what)))
    }
}

/// Whether some subject may match both patterns (errs towards yes).
pub fn patterns_overlap(a: &Pattern, b: &Pattern) -> bool {
    overlaps(a, &b.to_string()) || overlaps(b, &a.to_string())
}

/// Whether some subject matches both `rule` and `pattern` (native syntax).
fn overlaps(rule: &Pattern, pattern: &str) -> bool {
    let mut tokens = pattern.split('.');
    for r in rule.tokens() {
        match r {
            PatternToken::OneOrMore => return tokens.next().is_some(),
            PatternToken::ZeroOrMore => return true,
            PatternToken::One | PatternToken::Literal(_) => {}
        }
        let Some(token) = tokens.next() else {
            return false;
        };
        if token == ">" || token == "#" {
            // One or more (or, MQTT's `#`, zero or more) tokens: this one and
            // whatever the rule still needs.
            return true;
        }
        if let PatternToken::Literal(literal) = r
            && token != "*"
            && token != &**literal
        {
            return false;
        }
    }
    // MQTT's `#` also matches the parent itself.
    matches!(tokens.next(), None | Some("#"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(publish: (&[&str], &[&str]), subscribe: (&[&str], &[&str])) -> Acl {
        let rules = |(allow, deny): (&[&str], &[&str])| Rules {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        };
        let permissions = Permissions {
            publish: rules(publish),
            subscribe: rules(subscribe),
        };
        Acl::compile(&permissions, "dev1", "sensor-9")
    }

    #[test]
    fn publishing_follows_allow_deny_and_substitution() {
        let acl = acl(
            (&["devices.{user}.>"], &["devices.{user}.secret"]),
            (&[], &[]),
        );
        assert!(acl.may_publish("devices.dev1.temp"));
        assert!(!acl.may_publish("devices.dev2.temp"), "another user's");
        assert!(!acl.may_publish("devices.dev1.secret"), "denied");
        assert!(!acl.may_publish("devices.dev1"), "> needs a token");
        let open = Acl::default();
        assert!(open.may_publish("anything.at.all"));
    }

    #[test]
    fn subscriptions_need_a_covering_allow_and_no_overlapping_deny() {
        let acl = acl(
            (&[], &[]),
            (&["devices.>", "cmd.{client_id}"], &["devices.*.secret"]),
        );
        assert!(acl.may_subscribe("devices.dev1.temp"));
        assert!(acl.may_subscribe("devices.*.temp"));
        assert!(!acl.may_subscribe("devices.>"), "overlaps the deny rule");
        assert!(
            !acl.may_subscribe("devices.dev1.*"),
            "overlaps the deny rule"
        );
        assert!(!acl.may_subscribe("devices.dev1.secret"));
        assert!(acl.may_subscribe("cmd.sensor-9"));
        assert!(!acl.may_subscribe("cmd.*"), "wider than the allow rule");
        assert!(!acl.may_subscribe(">"));
    }

    #[test]
    fn unsafe_substitutions_never_widen_a_rule() {
        let permissions = Permissions {
            publish: Rules {
                allow: vec!["cmd.{client_id}".into()],
                deny: vec![],
            },
            subscribe: Rules {
                allow: vec![],
                deny: vec!["private.{client_id}".into()],
            },
        };
        // A client id that would be a wildcard: the allow rule is dropped, the deny
        // rule denies everything.
        let acl = Acl::compile(&permissions, "u", "a.>");
        assert!(!acl.may_publish("cmd.a.b"));
        assert!(!acl.may_subscribe("anything"));
    }

    #[test]
    fn overlapping_mqtt_filters_are_found() {
        let m = |s: &str| Pattern::parse_mqtt(s).expect("filter");
        assert!(patterns_overlap(&m("t/a"), &m("t/a/#")));
        assert!(patterns_overlap(&m("t/+"), &m("t/a")));
        assert!(patterns_overlap(&m("#"), &m("x/y")));
        assert!(!patterns_overlap(&m("t/a"), &m("t/b")));
        assert!(!patterns_overlap(&m("t/a/+"), &m("t/a")));
    }

    #[test]
    fn overlap_is_symmetric_in_meaning() {
        let rule = |p: &str| Pattern::parse_native(p).expect("pattern");
        assert!(overlaps(&rule("a.b"), "a.>"));
        assert!(overlaps(&rule("a.b.c"), "a.>"));
        assert!(!overlaps(&rule("a"), "a.>"));
        assert!(!overlaps(&rule("a.>"), "a"));
        assert!(overlaps(&rule("a.*"), "a.b"));
        assert!(!overlaps(&rule("a.c"), "a.b"));
        assert!(overlaps(&rule("a.c"), "a.*"));
    }
}
