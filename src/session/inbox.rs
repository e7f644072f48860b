//! Reply inboxes belong to the connection that asked.
//!
//! A subject `_INBOX.<owner>.…` is an inbox; its second token is the owner token.
//! The trie never matches an inbox through a wildcard standing for `_INBOX` or the
//! owner token (`canopy_subjects::Trie`), so `>` or `_INBOX.>` see no replies; and
//! the first live connection to subscribe under an owner token claims it in its
//! tenant, so no other connection can subscribe under it literally either until the
//! owner lets go. Owner tokens are random (NATS clients use a NUID), so knowing one
//! takes seeing a request, and then the claim still stands in the way.
//! This module is a connection's side of the claims (the tenant's side is
//! `broker::InboxClaims`, kept with its routes); it must never route.

use std::sync::Arc;

use canopy_subjects::{INBOX_TOKEN, Pattern, PatternToken};

/// The owner token a pattern subscribes under, when it names one literally.
pub(super) fn pattern_owner(pattern: &Pattern) -> Option<String> {
    match pattern.tokens() {
        [
            PatternToken::Literal(first),
            PatternToken::Literal(owner),
            ..,
        ] if &**first == INBOX_TOKEN => Some(owner.to_string()),
        _ => None,
    }
}

/// The owner tokens one connection holds, with how many of its subscriptions are
/// under each. Nothing is allocated until the first one: most connections hold none.
#[derive(Debug, Default)]
// One pointer instead of a `Vec`'s three words in every connection's task.
#[allow(clippy::box_collection)]
pub(super) struct Held(Option<Box<Vec<HeldToken>>>);

/// An owner token and how many subscriptions are under it.
type HeldToken = (Arc<str>, usize);

impl Held {
    /// Counts one more subscription under `token`; false when it is not held.
    pub(super) fn add(&mut self, token: &str) -> bool {
        let found = self
            .0
            .as_mut()
            .and_then(|held| held.iter_mut().find(|(t, _)| &**t == token));
        match found {
            Some((_, count)) => {
                *count += 1;
                true
            }
            None => false,
        }
    }

    /// Holds a newly claimed token, with its first subscription.
    pub(super) fn hold(&mut self, token: Arc<str>) {
        self.0.get_or_insert_with(Box::default).push((token, 1));
    }

    /// Counts one subscription less under `token`; the token when none is left, to
    /// give back.
    pub(super) fn remove(&mut self, token: &str) -> Option<Arc<str>> {
        let held = self.0.as_mut()?;
        let at = held.iter().position(|(t, _)| &**t == token)?;
        held[at].1 -= 1;
        (held[at].1 == 0).then(|| held.swap_remove(at).0)
    }

    /// Every token held, to give back; holds none after.
    pub(super) fn take(&mut self) -> impl Iterator<Item = Arc<str>> {
        self.0
            .take()
            .into_iter()
            .flat_map(|held| held.into_iter().map(|(token, _)| token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_patterns() {
        let owner = |s: &str| pattern_owner(&Pattern::parse_native(s).expect("pattern"));
        assert_eq!(owner("_INBOX.abc.*").as_deref(), Some("abc"));
        assert_eq!(owner("_INBOX.abc").as_deref(), Some("abc"));
        assert_eq!(owner("_INBOX.*.x"), None);
        assert_eq!(owner("_INBOX.>"), None);
        assert_eq!(owner(">"), None);
    }
}
