//! Who is asking, and whether they may: the one `authorize` every front end calls
//! for every operation.
//!
//! Today the answer is "yes" unless a static deny list from the configuration says
//! otherwise; tenants, users and ACLs will fill in the same function later, so no
//! front end may ever decide access on its own or skip this call.

pub mod acl;
pub mod credentials;
mod hash_memory;
pub mod login;
pub mod pattern_rates;
pub mod quota;
mod rate;
mod registry;
mod user_book;

use std::sync::Arc;

use canopy_subjects::{Pattern, PatternToken, SubjectError};

use crate::config::AuthzConfig;
pub use registry::Tenants;
pub use user_book::{UserBook, Users};

pub use crate::store::DEFAULT_TENANT;

/// Who performs an operation: one per connection, fixed at connect time.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: Arc<str>,
    /// The authenticated user; `None` is anonymous.
    pub user: Option<Arc<str>>,
    /// Client name or id as the client announced it, for logs and ACL substitution.
    pub client: Arc<str>,
    /// The logged-in user's rules; `None` for anonymous clients.
    pub acl: Option<Arc<acl::Acl>>,
}

impl Principal {
    /// A client let in without credentials under a tenant's anonymous rules (not
    /// the anonymous client of a server that requires no logins): never an
    /// administrator, whatever the rules allow.
    pub fn is_guest(&self) -> bool {
        self.user.is_none() && self.acl.is_some()
    }

    pub fn anonymous(client: impl Into<Arc<str>>) -> Self {
        Self {
            tenant: Arc::from(DEFAULT_TENANT),
            user: None,
            client: client.into(),
            acl: None,
        }
    }
}

/// Connecting is decided by the login (`tenancy::login`) and the tenant's
/// connection quota, not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Publish,
    /// Subscribing to a subject or pattern.
    Subscribe,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("Permissions Violation for Publish to \"{0}\"")]
    Publish(String),
    #[error("Permissions Violation for Subscription to \"{0}\"")]
    Subscribe(String),
}

/// Decides every operation. Cheap to share: it is immutable once built.
#[derive(Debug, Default)]
pub struct Authorizer {
    deny_publish: Vec<Pattern>,
    deny_subscribe: Vec<Pattern>,
}

impl Authorizer {
    pub fn from_config(config: &AuthzConfig) -> Result<Self, SubjectError> {
        let parse = |list: &[String]| -> Result<Vec<Pattern>, SubjectError> {
            list.iter().map(|p| Pattern::parse_native(p)).collect()
        };
        Ok(Self {
            deny_publish: parse(&config.deny_publish)?,
            deny_subscribe: parse(&config.deny_subscribe)?,
        })
    }

    /// May `principal` do `action` on `subject` (a literal subject for a publish, a
    /// pattern for a subscribe)? `subject` must already be validated.
    pub fn authorize(
        &self,
        principal: &Principal,
        action: Action,
        subject: &str,
    ) -> Result<(), Denied> {
        let acl = principal.acl.as_deref();
        match action {
            Action::Publish => {
                if self.deny_publish.iter().any(|d| covers(d, subject))
                    || acl.is_some_and(|acl| !acl.may_publish(subject))
                {
                    Err(Denied::Publish(subject.to_owned()))
                } else {
                    Ok(())
                }
            }
            Action::Subscribe => {
                // Each native pattern the subscription stands for must pass.
                let (first, second) = native_forms(subject);
                let denied = |form: &str| {
                    self.deny_subscribe.iter().any(|d| covers(d, form))
                        || acl.is_some_and(|acl| !acl.may_subscribe(form))
                };
                if denied(&first) || second.as_deref().is_some_and(denied) {
                    Err(Denied::Subscribe(subject.to_owned()))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// May `principal` subscribe to `pattern` under an inbox its connection holds?
    /// No allow rule is needed: the inbox is the connection's own.
    pub fn authorize_own_inbox(&self, principal: &Principal, pattern: &str) -> Result<(), Denied> {
        if self.deny_subscribe.iter().any(|d| covers(d, pattern))
            || principal
                .acl
                .as_deref()
                .is_some_and(|acl| !acl.may_subscribe_own_inbox(pattern))
        {
            Err(Denied::Subscribe(pattern.to_owned()))
        } else {
            Ok(())
        }
    }

    /// Whether a message on `subject` may be delivered to subscribers at all: a
    /// wildcard subscription that was allowed must still not see denied subjects.
    pub fn may_deliver(&self, subject: &str) -> bool {
        self.deny_subscribe.is_empty() || !self.deny_subscribe.iter().any(|d| covers(d, subject))
    }

    pub fn filters_delivery(&self) -> bool {
        !self.deny_subscribe.is_empty()
    }
}

/// The native patterns a subscription's text stands for. An MQTT filter ending in
/// `#` (rendered as a `#` token) matches its parent too: `a.#` is `a` and `a.>`, and
/// a lone `#` is `>`. A native subscription with a literal `#` token is checked the
/// same way, which only ever asks more of it.
fn native_forms(pattern: &str) -> (std::borrow::Cow<'_, str>, Option<String>) {
    if pattern == "#" {
        return (std::borrow::Cow::Borrowed(">"), None);
    }
    match pattern.strip_suffix(".#") {
        Some(parent) => (
            std::borrow::Cow::Borrowed(parent),
            Some(format!("{parent}.>")),
        ),
        None => (std::borrow::Cow::Borrowed(pattern), None),
    }
}

/// Whether every subject that `subject` (literal or pattern, native syntax) can stand
/// for lies inside `deny`. Wildcard tokens of `subject` are compared as tokens: `*`
/// is covered by a `*` or `>` of `deny`, `>` only by a `>`.
fn covers(deny: &Pattern, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for d in deny.tokens() {
        match d {
            PatternToken::OneOrMore => return tokens.next().is_some(),
            PatternToken::ZeroOrMore => return true,
            PatternToken::One => match tokens.next() {
                Some(">") | None => return false,
                Some(_) => {}
            },
            PatternToken::Literal(lit) => match tokens.next() {
                Some(t) if t == &**lit => {}
                _ => return false,
            },
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorizer(deny_pub: &[&str], deny_sub: &[&str]) -> Authorizer {
        Authorizer::from_config(&AuthzConfig {
            deny_publish: deny_pub.iter().map(|s| s.to_string()).collect(),
            deny_subscribe: deny_sub.iter().map(|s| s.to_string()).collect(),
            require_login: false,
            bootstrap_admin_password: None,
        })
        .expect("valid patterns")
    }

    #[test]
    fn deny_lists_refuse_what_they_cover_and_nothing_else() {
        let a = authorizer(&["secret.>", "admin"], &["secret.>", "x.*.y"]);
        let p = Principal::anonymous("t");
        assert!(a.authorize(&p, Action::Publish, "secret.a").is_err());
        assert!(a.authorize(&p, Action::Publish, "secret").is_ok());
        assert!(a.authorize(&p, Action::Publish, "admin").is_err());
        assert!(a.authorize(&p, Action::Publish, "admin.x").is_ok());
        assert!(a.authorize(&p, Action::Subscribe, "secret.*").is_err());
        assert!(a.authorize(&p, Action::Subscribe, "secret.>").is_err());
        assert!(a.authorize(&p, Action::Subscribe, "x.*.y").is_err());
        assert!(a.authorize(&p, Action::Subscribe, "x.>").is_ok());
        assert!(a.authorize(&p, Action::Subscribe, ">").is_ok());
        assert!(!a.may_deliver("secret.plans"));
        assert!(a.may_deliver("public.plans"));
        assert_eq!(
            a.authorize(&p, Action::Subscribe, "x.a.y")
                .expect_err("denied")
                .to_string(),
            "Permissions Violation for Subscription to \"x.a.y\""
        );
    }

    #[test]
    fn a_hash_filter_is_judged_as_its_parent_and_everything_below() {
        let a = authorizer(&[], &["secret.>"]);
        let p = Principal::anonymous("t");
        assert!(a.authorize(&p, Action::Subscribe, "secret.#").is_err());
        assert!(a.authorize(&p, Action::Subscribe, "public.#").is_ok());
        let mut user = Principal::anonymous("t");
        user.acl = Some(Arc::new(acl::Acl::compile(
            &crate::store::Permissions {
                subscribe: crate::store::Rules {
                    allow: vec!["devices.{user}.>".into()],
                    deny: vec!["devices.{user}.secret".into()],
                },
                ..Default::default()
            },
            "dev",
            "c",
        )));
        // `devices.dev.#` matches `devices.dev`, which the allow rule does not cover.
        assert!(
            a.authorize(&user, Action::Subscribe, "devices.dev.#")
                .is_err()
        );
        assert!(
            a.authorize(&user, Action::Subscribe, "devices.dev.a.#")
                .is_ok()
        );
        // `devices.dev.#` reaches the denied `devices.dev.secret`; a lone `#` is `>`.
        assert!(
            a.authorize(&user, Action::Subscribe, "devices.dev.secret.#")
                .is_err()
        );
        assert!(a.authorize(&user, Action::Subscribe, "#").is_err());
    }

    #[test]
    fn no_deny_list_allows_everything() {
        let a = Authorizer::default();
        let p = Principal::anonymous("t");
        assert!(a.authorize(&p, Action::Publish, "a.b").is_ok());
        assert!(a.authorize(&p, Action::Subscribe, ">").is_ok());
        assert!(a.may_deliver("anything"));
    }
}
