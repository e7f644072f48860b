//! Passwords and bearer tokens.
//!
//! Passwords are stored as argon2id PHC strings (the crate's defaults: 19 MiB, two
//! passes, a random salt). A login for a user that does not exist is checked against a
//! fixed dummy hash, so it costs the same one hash computation as a known user's and
//! a caller cannot tell the two apart by time; [`hash_count`] counts computations so
//! tests can prove it without timing. Tokens are `cnp.<tenant>.<user>.<id>.<secret>`:
//! the names say whose record to read, the id which token it is (for revoking), and
//! only a SHA-256 of the 24-byte random secret is stored, compared in constant time.
//! Hashing is CPU work: callers run it on a blocking thread. This module must never
//! log or keep a password or a token's secret.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Password hash computations (hashing or verifying) since start.
static HASHES: AtomicU64 = AtomicU64::new(0);

/// What a login for an unknown user is checked against.
static DUMMY: LazyLock<Option<String>> = LazyLock::new(|| {
    Argon2::default()
        .hash_password(b"canopy: a user that does not exist")
        .ok()
        .map(|hash| hash.to_string())
});

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("the password could not be hashed: {0}")]
    Hash(String),
    #[error("no random bytes from the operating system: {0}")]
    Random(String),
}

/// Password hash computations since start.
pub fn hash_count() -> u64 {
    HASHES.load(Ordering::Relaxed)
}

/// Computes the dummy hash now, so no login pays for it.
pub fn prepare() {
    LazyLock::force(&DUMMY);
}

/// An argon2id PHC string of `password`.
pub fn hash_password(password: &str) -> Result<String, CredentialError> {
    HASHES.fetch_add(1, Ordering::Relaxed);
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|hash| hash.to_string())
        .map_err(|e| CredentialError::Hash(e.to_string()))
}

/// Whether `password` matches `stored` (`None`: the user does not exist, or has no
/// password). Costs one hash computation either way.
pub fn verify_password(stored: Option<&str>, password: &str) -> bool {
    HASHES.fetch_add(1, Ordering::Relaxed);
    let phc = stored.or(DUMMY.as_deref());
    let matches = phc
        .and_then(|phc| PasswordHash::new(phc).ok())
        .is_some_and(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        });
    matches && stored.is_some()
}

/// A token as issued: shown once; only `id` and `hash` are kept.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub id: String,
    pub token: String,
    pub hash: String,
}

fn random<const N: usize>() -> Result<[u8; N], CredentialError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| CredentialError::Random(e.to_string()))?;
    Ok(bytes)
}

fn secret_hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token for `user` of `tenant`.
pub fn issue_token(tenant: &str, user: &str) -> Result<IssuedToken, CredentialError> {
    let id: String = random::<8>()?.iter().map(|b| format!("{b:02x}")).collect();
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<24>()?);
    Ok(IssuedToken {
        token: format!("cnp.{tenant}.{user}.{id}.{secret}"),
        hash: secret_hash(&secret),
        id,
    })
}

/// The parts of a token: tenant, user, token id, secret.
pub struct TokenParts<'a> {
    pub tenant: &'a str,
    pub user: &'a str,
    pub id: &'a str,
    pub secret: &'a str,
}

/// Splits a token; `None` when it is not one of ours.
pub fn parse_token(token: &str) -> Option<TokenParts<'_>> {
    let mut parts = token.strip_prefix("cnp.")?.split('.');
    let parsed = TokenParts {
        tenant: parts.next()?,
        user: parts.next()?,
        id: parts.next()?,
        secret: parts.next()?,
    };
    parts.next().is_none().then_some(parsed)
}

/// Whether `secret` is the one whose hash is `stored`, in constant time.
pub fn token_matches(stored: &str, secret: &str) -> bool {
    secret_hash(secret)
        .as_bytes()
        .ct_eq(stored.as_bytes())
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_and_an_unknown_user_costs_one_hash_too() {
        prepare();
        let stored = hash_password("correct horse").expect("hashes");
        assert!(stored.starts_with("$argon2id$"), "{stored}");
        let before = hash_count();
        assert!(verify_password(Some(&stored), "correct horse"));
        assert!(!verify_password(Some(&stored), "wrong"));
        // No user: refused, after the same single computation.
        assert!(!verify_password(None, "correct horse"));
        assert_eq!(hash_count() - before, 3);
    }

    #[test]
    fn tokens_round_trip_and_only_their_secret_matches() {
        let issued = issue_token("acme", "dev-1").expect("issued");
        let parts = parse_token(&issued.token).expect("ours");
        assert_eq!(
            (parts.tenant, parts.user, parts.id),
            ("acme", "dev-1", issued.id.as_str())
        );
        assert!(token_matches(&issued.hash, parts.secret));
        assert!(!token_matches(&issued.hash, "not the secret"));
        assert!(parse_token("Bearer xyz").is_none());
        assert!(parse_token("cnp.a.b.c.d.e").is_none());
        assert_ne!(
            issue_token("acme", "dev-1").expect("issued").token,
            issued.token
        );
    }
}
