//! The cluster's shared secret: what a node proves it knows in the first frame of
//! every connection it opens to another node (`Hello` for a link, `Relay` for a
//! client it relays), since those frames say who is calling and whose client is
//! relayed. The proof is an HMAC-SHA256, under the secret, of the frame's fields,
//! the time it was made and a random nonce; the receiver takes it within a minute of
//! its own clock and only once (a recorded frame cannot be replayed). Links are not
//! encrypted: keep them on a private network, or tunnel them.
//!
//! Must never: log the secret, or accept a frame whose proof fails when a secret is
//! set.

use std::collections::HashMap;

use canopy_protocols::link::{self, Proof};
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

/// How far a proof's time may be from the receiver's clock.
const WINDOW_MS: u64 = 60_000;
/// Nonces remembered at most (a minute of new connections at any sane rate).
const MAX_NONCES: usize = 100_000;

/// Why a first frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    #[error("it does not prove the cluster's secret")]
    Mac,
    #[error("its proof is more than a minute from this node's clock")]
    Stale,
    #[error("its proof was used before")]
    Replayed,
    #[error("too many connections proved within a minute")]
    Busy,
}

/// The cluster's secret, or none (nothing is proved or checked: every connection
/// is trusted).
pub struct LinkSecret {
    key: Option<Vec<u8>>,
    seen: Mutex<HashMap<[u8; 16], u64>>,
}

impl LinkSecret {
    pub fn new(secret: Option<&str>) -> Self {
        Self {
            key: secret.map(|s| s.as_bytes().to_vec()),
            seen: Mutex::default(),
        }
    }

    pub fn is_set(&self) -> bool {
        self.key.is_some()
    }

    fn mac(key: &[u8], fields: &[&str], time_ms: u64, nonce: &[u8; 16]) -> [u8; 32] {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return [0; 32];
        };
        for field in fields {
            // Length-prefixed, so no two lists of fields read alike.
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field.as_bytes());
        }
        mac.update(&time_ms.to_be_bytes());
        mac.update(nonce);
        mac.finalize().into_bytes().into()
    }

    /// The proof for a first frame made of `fields`, at `now_ms`.
    pub fn prove(&self, fields: &[&str], now_ms: u64) -> Proof {
        let Some(key) = &self.key else {
            return Proof::default();
        };
        let mut nonce = [0; 16];
        nonce.fill_with(|| fastrand::u8(..));
        Proof {
            time_ms: now_ms,
            nonce,
            mac: Self::mac(key, fields, now_ms, &nonce),
        }
    }

    /// Checks a first frame's proof at `now_ms`, once.
    pub fn check(&self, fields: &[&str], proof: &Proof, now_ms: u64) -> Result<(), Unproven> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let expected = Self::mac(key, fields, proof.time_ms, &proof.nonce);
        // Compared whole, in constant time.
        let differs = expected
            .iter()
            .zip(proof.mac.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs != 0 {
            return Err(Unproven::Mac);
        }
        if proof.time_ms.abs_diff(now_ms) > WINDOW_MS {
            return Err(Unproven::Stale);
        }
        let mut seen = self.seen.lock();
        seen.retain(|_, at| at.abs_diff(now_ms) <= WINDOW_MS);
        if seen.contains_key(&proof.nonce) {
            return Err(Unproven::Replayed);
        }
        if seen.len() >= MAX_NONCES {
            return Err(Unproven::Busy);
        }
        seen.insert(proof.nonce, proof.time_ms);
        Ok(())
    }
}

/// The fields a `Hello` proves.
fn hello_fields<'a>(cluster: &'a str, node: &'a str) -> [&'a str; 3] {
    ["hello", cluster, node]
}

impl LinkSecret {
    /// The proof of this node's `Hello` to another.
    pub fn prove_hello(&self, cluster: &str, node: &str) -> Proof {
        self.prove(&hello_fields(cluster, node), crate::clock::system_ms())
    }

    pub fn check_hello(&self, cluster: &str, node: &str, proof: &Proof) -> Result<(), Unproven> {
        self.check(
            &hello_fields(cluster, node),
            proof,
            crate::clock::system_ms(),
        )
    }

    /// Sets the proof of a `Relay` this node sends.
    pub fn prove_relay(&self, relay: &mut link::Relay<'_>) {
        let (kind, guest) = (relay.kind.to_string(), relay.guest.to_string());
        let fields = relay_fields(relay, &kind, &guest);
        relay.proof = self.prove(&fields, crate::clock::system_ms());
    }

    pub fn check_relay(&self, relay: &link::Relay<'_>) -> Result<(), Unproven> {
        let (kind, guest) = (relay.kind.to_string(), relay.guest.to_string());
        let fields = relay_fields(relay, &kind, &guest);
        self.check(&fields, &relay.proof, crate::clock::system_ms())
    }
}

/// The fields a `Relay` proves: every one but the proof.
fn relay_fields<'a>(relay: &link::Relay<'a>, kind: &'a str, guest: &'a str) -> [&'a str; 8] {
    [
        "relay",
        kind,
        relay.cluster,
        relay.tenant,
        relay.user.unwrap_or("\u{0}none"),
        guest,
        relay.client,
        relay.peer,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_000_000_000;

    #[test]
    fn a_proof_holds_once_for_its_fields_under_its_secret_within_a_minute() {
        let ours = LinkSecret::new(Some("a long shared secret"));
        let proof = ours.prove(&["hello", "prod", "a"], NOW);
        assert_eq!(
            ours.check(&["hello", "prod", "a"], &proof, NOW + 1_000),
            Ok(())
        );
        assert_eq!(
            ours.check(&["hello", "prod", "a"], &proof, NOW + 2_000),
            Err(Unproven::Replayed)
        );
        let fresh = ours.prove(&["hello", "prod", "a"], NOW);
        assert_eq!(
            ours.check(&["hello", "prod", "b"], &fresh, NOW),
            Err(Unproven::Mac),
            "another node's name"
        );
        assert_eq!(
            ours.check(&["hello", "pro", "da"], &fresh, NOW),
            Err(Unproven::Mac),
            "fields that read alike"
        );
        assert_eq!(
            ours.check(&["hello", "prod", "a"], &fresh, NOW + 61_000),
            Err(Unproven::Stale)
        );
        let theirs = LinkSecret::new(Some("another secret"));
        let forged = theirs.prove(&["hello", "prod", "a"], NOW);
        assert_eq!(
            ours.check(&["hello", "prod", "a"], &forged, NOW),
            Err(Unproven::Mac)
        );
        assert_eq!(
            ours.check(&["hello", "prod", "a"], &Proof::default(), NOW),
            Err(Unproven::Mac),
            "a node without a secret"
        );
        let mut relay = link::Relay {
            kind: link::RELAY_MQTT,
            cluster: "prod",
            tenant: "acme",
            user: Some("ana"),
            guest: false,
            client: "meter-7",
            peer: "10.0.0.9:1",
            proof: Proof::default(),
        };
        ours.prove_relay(&mut relay);
        let mut other_user = relay.clone();
        other_user.user = Some("admin");
        assert_eq!(
            ours.check_relay(&other_user),
            Err(Unproven::Mac),
            "another user"
        );
        assert_eq!(ours.check_relay(&relay), Ok(()));
        let open = LinkSecret::new(None);
        assert_eq!(open.check(&["anything"], &Proof::default(), NOW), Ok(()));
        assert_eq!(open.prove(&["anything"], NOW), Proof::default());
    }
}
