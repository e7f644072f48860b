//! Envelope encryption at rest: the data keys a tenant's patterns are sealed with,
//! sealing a message before the store writes it and opening it when the store reads
//! it back.
//!
//! A tenant may ask for the subjects of a pattern to be kept encrypted. The pattern
//! then has a *data key* (AES-256-GCM, 32 random bytes) which is stored only wrapped
//! by a *key-encryption key* that a [`KeyProvider`] holds (a local key file or an
//! environment variable now, a KMS later): the store never holds a data key in clear,
//! and rotating the key-encryption key re-wraps data keys without touching messages.
//! A sealed message is, in place of its header block and payload:
//!
//! ```text
//!  key_id:u32be nonce:12 AES-256-GCM(header_len:u32be headers payload) tag:16
//! ```
//!
//! with the tenant, subject and version as associated data, so a sealed value moved
//! to another subject or version, or another tenant's key, does not open. Deleting
//! every data key of a pattern makes its messages unreadable for good
//! (crypto-shredding): they read back as [`Opened::Unreadable`].
//!
//! Must never: write a data key anywhere unwrapped, seal two messages with one
//! (key, nonce), or give back a plaintext whose tag did not check.

mod data_key;
pub mod provider;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::RwLock;

pub use data_key::{DataKey, StoredDataKey, new_data_key, unwrap_data_key};
pub use provider::{KeyProvider, LocalKeys, Wrapped};

/// Bytes a sealed value adds to its header block and payload.
pub const OVERHEAD: usize = 4 + NONCE + 4 + TAG;
const NONCE: usize = 12;
const TAG: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("no key provider is configured (store.keys = \"file:PATH\" or \"env:NAME\")")]
    NoProvider,
    #[error("key-encryption key `{0}` is not in the key provider")]
    UnknownKek(String),
    #[error("the key provider's keys are not understood: {0}")]
    BadKeys(String),
    #[error(
        "a data key does not unwrap with key-encryption key `{0}` (a wrong key, or the record was changed)"
    )]
    Unwrap(String),
    #[error("the cipher failed: {0}")]
    Cipher(String),
}

/// A stored value read back under sealing.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// The header block and payload as published.
    Plain { headers: Bytes, payload: Bytes },
    /// Sealed with data key `key_id`, which this tenant no longer has (shredded), or
    /// the value does not open with it.
    Unreadable { key_id: u32 },
}

/// The associated data of a sealed message: the tenant, the subject and the version
/// it was stored at.
pub fn message_context(tenant: &str, subject: &str, version: u64) -> Vec<u8> {
    let mut aad = Vec::with_capacity(tenant.len() + subject.len() + 10);
    aad.extend_from_slice(tenant.as_bytes());
    aad.push(0);
    aad.extend_from_slice(subject.as_bytes());
    aad.push(0);
    aad.extend_from_slice(&version.to_be_bytes());
    aad
}

/// The data key id a sealed value names, if it is long enough to be one.
pub fn key_id_of(sealed: &[u8]) -> Option<u32> {
    let id: [u8; 4] = sealed.get(..4)?.try_into().ok()?;
    (sealed.len() >= OVERHEAD).then_some(u32::from_be_bytes(id))
}

/// One tenant's data keys: the ones new messages are sealed with, per pattern (most
/// specific first), and every one it still has by id, for reading.
#[derive(Debug, Default)]
pub struct TenantKeys {
    sealing: Vec<(Vec<String>, Arc<DataKey>)>,
    by_id: HashMap<u32, Arc<DataKey>>,
}

impl TenantKeys {
    /// The keys of `keys` (data keys unwrapped): each pattern seals with its newest
    /// key that is not retired.
    pub fn new(keys: impl IntoIterator<Item = Arc<DataKey>>) -> TenantKeys {
        let mut by_id = HashMap::new();
        let mut newest: HashMap<String, Arc<DataKey>> = HashMap::new();
        for key in keys {
            if key.sealing {
                let slot = newest
                    .entry(key.pattern.clone())
                    .or_insert_with(|| Arc::clone(&key));
                if key.created_ms > slot.created_ms {
                    *slot = Arc::clone(&key);
                }
            }
            by_id.insert(key.id, key);
        }
        let mut sealing: Vec<(Vec<String>, Arc<DataKey>)> = newest
            .into_values()
            .map(|key| (key.pattern.split('.').map(str::to_owned).collect(), key))
            .collect();
        sealing.sort_by(|a, b| {
            specificity(&b.0)
                .cmp(&specificity(&a.0))
                .then(a.1.pattern.cmp(&b.1.pattern))
        });
        TenantKeys { sealing, by_id }
    }

    /// The key a new message on `subject` is sealed with: the most specific pattern's.
    pub fn sealing_key(&self, subject: &str) -> Option<&Arc<DataKey>> {
        self.sealing
            .iter()
            .find(|(tokens, _)| matches(tokens, subject))
            .map(|(_, key)| key)
    }

    /// The newest key that seals: for what belongs to no one subject (a saved
    /// session's in-flight messages).
    pub fn newest_sealing_key(&self) -> Option<&Arc<DataKey>> {
        self.sealing
            .iter()
            .map(|(_, key)| key)
            .max_by_key(|key| key.created_ms)
    }

    pub fn key(&self, id: u32) -> Option<&Arc<DataKey>> {
        self.by_id.get(&id)
    }

    /// Every key, in id order.
    pub fn keys(&self) -> Vec<Arc<DataKey>> {
        let mut all: Vec<_> = self.by_id.values().cloned().collect();
        all.sort_by_key(|k| k.id);
        all
    }

    /// Whether some pattern's new messages are sealed.
    pub fn seals_any(&self) -> bool {
        !self.sealing.is_empty()
    }

    /// Opens a sealed value of `subject` at `version`.
    pub fn open(&self, tenant: &str, subject: &str, version: u64, sealed: &[u8]) -> Opened {
        self.open_with(&message_context(tenant, subject, version), sealed)
    }

    /// Opens a value sealed under `context`, with the key it names.
    pub fn open_with(&self, context: &[u8], sealed: &[u8]) -> Opened {
        let Some(key_id) = key_id_of(sealed) else {
            return Opened::Unreadable { key_id: 0 };
        };
        match self.key(key_id) {
            Some(key) => key.open(context, sealed),
            None => Opened::Unreadable { key_id },
        }
    }
}

/// Patterns with more tokens are more specific; among those, fewer wildcards.
fn specificity(tokens: &[String]) -> (usize, usize) {
    let wild = tokens.iter().filter(|t| *t == "*" || *t == ">").count();
    (tokens.len(), tokens.len() - wild)
}

/// Whether the native pattern `tokens` matches `subject`.
fn matches(tokens: &[String], subject: &str) -> bool {
    let mut parts = subject.split('.');
    for token in tokens {
        if token == ">" {
            return parts.next().is_some();
        }
        match parts.next() {
            Some(part) if token == "*" || token == part => {}
            _ => return false,
        }
    }
    parts.next().is_none()
}

/// The data keys of every tenant that has any, shared by the store's writer (which
/// seals) and readers (which open). Asking costs one atomic load while no tenant has
/// keys.
#[derive(Debug, Default)]
pub struct Sealing {
    tenants: RwLock<HashMap<Arc<str>, Arc<TenantKeys>>>,
    len: AtomicUsize,
}

impl Sealing {
    pub fn keys_of(&self, tenant: &str) -> Option<Arc<TenantKeys>> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.tenants.read().get(tenant).cloned()
    }

    /// Makes `keys` the tenant's (none: it has no data keys).
    pub fn set(&self, tenant: &str, keys: Option<TenantKeys>) {
        let mut tenants = self.tenants.write();
        match keys {
            Some(keys) if !keys.by_id.is_empty() => {
                tenants.insert(Arc::from(tenant), Arc::new(keys));
            }
            _ => {
                tenants.remove(tenant);
            }
        }
        self.len.store(tenants.len(), Ordering::Release);
    }
}

/// The plaintext a sealed value holds: the header block's length, the block, the
/// payload.
fn plaintext(headers: &[u8], payload: &[u8], out: &mut BytesMut) {
    out.put_u32(u32::try_from(headers.len()).unwrap_or(u32::MAX));
    out.put_slice(headers);
    out.put_slice(payload);
}

#[cfg(test)]
mod tests;
