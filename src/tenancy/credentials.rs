//! Passwords and bearer tokens.
//!
//! Passwords are stored as argon2id PHC strings (the crate's defaults: 19 MiB, two
//! passes, a random salt). Every computation runs in memory of its own
//! ([`HashMemory`]), given back to the system when it ends, so checks leave
//! nothing behind with the allocator however many fail. A login for a user that does not exist is checked against a
//! fixed dummy hash, so it costs the same one hash computation as a known user's and
//! a caller cannot tell the two apart by time; [`hash_count`] counts computations so
//! tests can prove it without timing. Tokens are `cnp.<tenant>.<user>.<id>.<secret>`:
//! the names say whose record to read, the id which token it is (for revoking), and
//! only a SHA-256 of the 24-byte random secret is stored, compared in constant time.
//! Hashing is CPU work: callers run it on a blocking thread. This module must never
//! log or keep a password or a token's secret.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use argon2::password_hash::phc::{Output, ParamsString, PasswordHash, Salt};
use argon2::{Algorithm, Argon2, Params, Version};
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::hash_memory::HashMemory;

/// Password hash computations (hashing or verifying) since start.
static HASHES: AtomicU64 = AtomicU64::new(0);

/// What a login for an unknown user is checked against.
static DUMMY: LazyLock<Option<String>> =
    LazyLock::new(|| hash_with_own_memory(b"canopy: a user that does not exist").ok());

/// The most memory a stored hash may ask for a check. Ours ask 19 MiB; a record
/// asking for more than this was not written by this server.
const MAX_HASH_BLOCKS: usize = 256 * 1024;

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
    hash_with_own_memory(password.as_bytes())
}

/// What `Argon2::default().hash_password` gives (argon2id, v19, default parameters,
/// a 16-byte random salt, a 32-byte output), computed in [`HashMemory`] so the
/// 19 MiB go back to the system afterwards instead of staying with the allocator.
fn hash_with_own_memory(password: &[u8]) -> Result<String, CredentialError> {
    let hash_error = |e: &dyn std::fmt::Display| CredentialError::Hash(e.to_string());
    let params = Params::default();
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
    let salt = random::<{ argon2::RECOMMENDED_SALT_LEN }>()?;
    let mut output = [0u8; Params::DEFAULT_OUTPUT_LEN];
    let memory = HashMemory::new(params.block_count()).map_err(|e| hash_error(&e))?;
    argon2
        .hash_password_into_with_memory(password, &salt, &mut output, memory)
        .map_err(|e| hash_error(&e))?;
    let hash = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params).map_err(|e| hash_error(&e))?,
        salt: Some(Salt::new(&salt).map_err(|e| hash_error(&e))?),
        hash: Some(Output::new(&output).map_err(|e| hash_error(&e))?),
    };
    Ok(hash.to_string())
}

/// Whether `password` matches `stored` (`None`: the user does not exist, or has no
/// password). Costs one hash computation either way.
pub fn verify_password(stored: Option<&str>, password: &str) -> bool {
    HASHES.fetch_add(1, Ordering::Relaxed);
    let phc = stored.or(DUMMY.as_deref());
    let matches = phc.is_some_and(|phc| matches_phc(phc, password.as_bytes()));
    matches && stored.is_some()
}

/// What `Argon2::verify_password` does (the PHC string's algorithm, version,
/// parameters and salt; the outputs compared in constant time), in [`HashMemory`].
fn matches_phc(phc: &str, password: &[u8]) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
        return false;
    };
    let Ok(algorithm) = Algorithm::try_from(hash.algorithm.as_str()) else {
        return false;
    };
    let version = match hash.version.map(Version::try_from).transpose() {
        Ok(version) => version.unwrap_or_default(),
        Err(_) => return false,
    };
    let Ok(params) = Params::try_from(&hash) else {
        return false;
    };
    if params.block_count() > MAX_HASH_BLOCKS {
        return false;
    }
    let Ok(memory) = HashMemory::new(params.block_count()) else {
        return false;
    };
    let mut computed = [0u8; Output::MAX_LENGTH];
    let Some(computed) = computed.get_mut(..expected.len()) else {
        return false;
    };
    Argon2::new(algorithm, version, params)
        .hash_password_into_with_memory(password, salt, computed, memory)
        .is_ok()
        && bool::from(computed.ct_eq(expected.as_bytes()))
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

    // These call the uncounted functions: the test above counts computations, and
    // tests run at once.
    #[test]
    fn hashes_are_the_argon2_crates_both_ways() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let ours = hash_with_own_memory(b"correct horse").expect("hashes");
        let parsed = PasswordHash::new(&ours).expect("a PHC string");
        assert!(
            Argon2::default()
                .verify_password(b"correct horse", &parsed)
                .is_ok()
        );
        assert!(
            Argon2::default()
                .verify_password(b"wrong", &parsed)
                .is_err()
        );
        let theirs = Argon2::default()
            .hash_password(b"battery staple")
            .expect("hashes")
            .to_string();
        assert_eq!(
            ours.split('$').nth(3),
            theirs.split('$').nth(3),
            "same m, t, p"
        );
        assert!(matches_phc(&theirs, b"battery staple"));
        assert!(!matches_phc(&theirs, b"battery stapl"));
    }

    #[test]
    fn hashes_that_are_not_ours_never_match() {
        let ours = hash_with_own_memory(b"pw").expect("hashes");
        assert!(matches_phc(&ours, b"pw"));
        let greedy = ours.replace("m=19456", "m=4194304");
        let no_hash = ours.rsplit_once('$').expect("parts").0.to_owned();
        let argon2i = ours.replace("$argon2id$", "$argon2i$");
        for stored in [greedy.as_str(), &no_hash, &argon2i, "", "$argon2id$", "pw"] {
            assert!(!matches_phc(stored, b"pw"), "{stored}");
        }
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
