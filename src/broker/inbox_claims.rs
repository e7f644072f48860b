//! Which connection holds each reply-inbox owner token of one tenant.
//!
//! The first live connection to subscribe under `_INBOX.<owner>.…` claims `<owner>`
//! in its tenant (the session decides when, `session/inbox.rs`); while it holds it, no
//! other connection may subscribe under that token, and answers go there only for it.
//! The claims live with the tenant's routes; this module never routes or decides.

use std::collections::HashMap;
use std::sync::Arc;

use canopy_subjects::INBOX_TOKEN;
use parking_lot::Mutex;

/// The owner token of an inbox subject `_INBOX.<owner>.…`.
pub fn inbox_owner(subject: &str) -> Option<&str> {
    let mut tokens = subject.split('.');
    (tokens.next() == Some(INBOX_TOKEN))
        .then(|| tokens.next())
        .flatten()
        .filter(|owner| !owner.is_empty())
}

/// Which connection holds each owner token of one tenant.
#[derive(Debug, Default)]
pub struct InboxClaims {
    owners: Mutex<HashMap<Arc<str>, u64>>,
}

impl InboxClaims {
    /// Claims `token` for `conn`; false when another connection holds it.
    pub fn try_claim(&self, token: &str, conn: u64) -> bool {
        let mut owners = self.owners.lock();
        match owners.get(token) {
            Some(&owner) => owner == conn,
            None => {
                owners.insert(Arc::from(token), conn);
                true
            }
        }
    }

    /// Whether `conn` holds `token` now.
    pub fn holds(&self, token: &str, conn: u64) -> bool {
        self.owners.lock().get(token) == Some(&conn)
    }

    /// Gives `token` back, if `conn` holds it.
    pub fn release(&self, token: &str, conn: u64) {
        let mut owners = self.owners.lock();
        if owners.get(token) == Some(&conn) {
            owners.remove(token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_token_has_one_holder_at_a_time() {
        let claims = InboxClaims::default();
        assert!(claims.try_claim("abc", 1));
        assert!(claims.try_claim("abc", 1));
        assert!(!claims.try_claim("abc", 2));
        claims.release("abc", 2);
        assert!(!claims.try_claim("abc", 2));
        claims.release("abc", 1);
        assert!(claims.try_claim("abc", 2));
        assert!(!claims.try_claim("abc", 1), "one holder at a time");
    }
}
