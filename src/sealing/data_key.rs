//! A data key: made at random, stored only wrapped, used in memory to seal and open
//! a pattern's messages.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use bytes::{Buf, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use super::provider::{KeyProvider, Wrapped};
use super::{NONCE, OVERHEAD, Opened, SealError, TAG, plaintext};

const KEY_BYTES: usize = 32;

/// A data key as the store keeps it: wrapped by a key-encryption key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoredDataKey {
    pub id: u32,
    pub pattern: String,
    pub created_ms: u64,
    /// False once a newer key took over the pattern or sealing stopped: the key
    /// only opens what it sealed.
    pub sealing: bool,
    pub wrapped: Wrapped,
}

/// A data key unwrapped, ready to seal and open.
pub struct DataKey {
    pub id: u32,
    pub pattern: String,
    pub created_ms: u64,
    pub sealing: bool,
    /// The key-encryption key it is stored wrapped by.
    pub kek: String,
    key: std::sync::Arc<LessSafeKey>,
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataKey")
            .field("id", &self.id)
            .field("pattern", &self.pattern)
            .field("sealing", &self.sealing)
            .field("kek", &self.kek)
            .finish_non_exhaustive()
    }
}

/// What a wrapped data key is bound to: its tenant and id, so a stored record copied
/// to another tenant or id does not unwrap.
fn wrap_context(tenant: &str, id: u32) -> Vec<u8> {
    let mut context = b"canopy data key\0".to_vec();
    context.extend_from_slice(tenant.as_bytes());
    context.push(0);
    context.extend_from_slice(&id.to_be_bytes());
    context
}

fn cipher(bytes: &[u8]) -> Result<LessSafeKey, SealError> {
    UnboundKey::new(&AES_256_GCM, bytes)
        .map(LessSafeKey::new)
        .map_err(|_| SealError::Cipher("a data key is not 32 bytes".into()))
}

/// A new data key for `pattern` of `tenant`, and its record wrapped by the provider's
/// current key-encryption key.
pub async fn new_data_key(
    provider: &dyn KeyProvider,
    tenant: &str,
    pattern: &str,
    id: u32,
    created_ms: u64,
) -> Result<(DataKey, StoredDataKey), SealError> {
    let mut bytes = [0u8; KEY_BYTES];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| SealError::Cipher("no randomness".into()))?;
    let wrapped = provider.wrap(&bytes, &wrap_context(tenant, id)).await;
    let key = cipher(&bytes);
    bytes.fill(0);
    let (wrapped, key) = (wrapped?, key?);
    let stored = StoredDataKey {
        id,
        pattern: pattern.to_owned(),
        created_ms,
        sealing: true,
        wrapped,
    };
    Ok((DataKey::from_stored(&stored, key), stored))
}

/// The data key a stored record holds, unwrapped; and, when it was wrapped by a
/// key-encryption key other than the provider's current one, its record wrapped
/// again by the current one (key rotation), for the caller to store.
pub async fn unwrap_data_key(
    provider: &dyn KeyProvider,
    tenant: &str,
    stored: &StoredDataKey,
) -> Result<(DataKey, Option<StoredDataKey>), SealError> {
    let context = wrap_context(tenant, stored.id);
    let mut bytes = provider.unwrap(&stored.wrapped, &context).await?;
    let rewrapped = if stored.wrapped.kek == provider.current() {
        None
    } else {
        match provider.wrap(&bytes, &context).await {
            Ok(wrapped) => Some(StoredDataKey {
                wrapped,
                ..stored.clone()
            }),
            Err(error) => {
                bytes.fill(0);
                return Err(error);
            }
        }
    };
    let key = cipher(&bytes);
    bytes.fill(0);
    let stored = rewrapped.as_ref().unwrap_or(stored);
    Ok((DataKey::from_stored(stored, key?), rewrapped))
}

impl DataKey {
    fn from_stored(stored: &StoredDataKey, key: LessSafeKey) -> DataKey {
        DataKey {
            id: stored.id,
            pattern: stored.pattern.clone(),
            created_ms: stored.created_ms,
            sealing: stored.sealing,
            kek: stored.wrapped.kek.clone(),
            key: std::sync::Arc::new(key),
        }
    }

    /// The same key, no longer sealing new messages (or sealing again).
    pub fn with_sealing(&self, sealing: bool) -> DataKey {
        DataKey {
            id: self.id,
            pattern: self.pattern.clone(),
            created_ms: self.created_ms,
            sealing,
            kek: self.kek.clone(),
            key: std::sync::Arc::clone(&self.key),
        }
    }

    /// The header block and payload sealed under `context` (see the module's format).
    /// Each value has a nonce of its own, 96 random bits from the thread's CSPRNG
    /// (rand's ChaCha12, seeded and reseeded from the OS): a data key should seal at
    /// most 2^32 values (rotate it before), beyond which two nonces may meet.
    pub fn seal(&self, context: &[u8], headers: &[u8], payload: &[u8]) -> Result<Bytes, SealError> {
        use rand::RngCore as _;
        let mut nonce = [0u8; NONCE];
        rand::rng().fill_bytes(&mut nonce);
        let mut out = BytesMut::with_capacity(OVERHEAD + headers.len() + payload.len());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&nonce);
        plaintext(headers, payload, &mut out);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context),
                &mut out[4 + NONCE..],
            )
            .map_err(|_| SealError::Cipher("sealing failed".into()))?;
        out.extend_from_slice(tag.as_ref());
        Ok(out.freeze())
    }

    /// What a value this key sealed under `context` holds.
    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Opened {
        let unreadable = Opened::Unreadable { key_id: self.id };
        let (Some(nonce), Some(body)) = (sealed.get(4..4 + NONCE), sealed.get(4 + NONCE..)) else {
            return unreadable;
        };
        let Ok(nonce) = Nonce::try_assume_unique_for_key(nonce) else {
            return unreadable;
        };
        if body.len() < 4 + TAG {
            return unreadable;
        }
        let mut body = BytesMut::from(body);
        let Ok(plain) = self.key.open_in_place(nonce, Aad::from(context), &mut body) else {
            return unreadable;
        };
        let plain_len = plain.len();
        body.truncate(plain_len);
        let header_len = usize::try_from(body.get_u32()).unwrap_or(usize::MAX);
        if header_len > body.len() {
            return unreadable;
        }
        let mut body = body.freeze();
        let headers = body.split_to(header_len);
        Opened::Plain {
            headers,
            payload: body,
        }
    }
}
