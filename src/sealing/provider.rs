//! Key-encryption keys: where they live is a [`KeyProvider`]'s business. The one
//! built in, [`LocalKeys`], reads them from a file or an environment variable; a KMS
//! implements the same two calls (wrap, unwrap) against its API.
//!
//! The text form, one key a line (or `,`-separated in a variable), `#` comments:
//!
//! ```text
//! k2026a:<64 hex digits>
//! k2026b:<64 hex digits>
//! ```
//!
//! The last key is the *current* one: new data keys are wrapped by it, and data keys
//! wrapped by an earlier one are re-wrapped by it when their tenant opens. Rotating is
//! adding a key at the end, restarting, and later removing the old one.
//!
//! Must never: log or show a key's bytes.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use super::{NONCE, SealError};

/// A data key wrapped by the key-encryption key `kek`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Wrapped {
    pub kek: String,
    /// base64 of what the provider made of the data key.
    pub bytes: String,
}

/// Holds key-encryption keys and wraps and unwraps data keys with them.
#[async_trait]
pub trait KeyProvider: Send + Sync + std::fmt::Debug {
    /// The id of the key new wraps use.
    fn current(&self) -> &str;
    /// `key` wrapped by the current key, bound to `context`.
    async fn wrap(&self, key: &[u8], context: &[u8]) -> Result<Wrapped, SealError>;
    /// The key `wrapped` holds, if it unwraps under `context`.
    async fn unwrap(&self, wrapped: &Wrapped, context: &[u8]) -> Result<Vec<u8>, SealError>;
}

/// Key-encryption keys held in this process, read from a file or a variable.
pub struct LocalKeys {
    keys: HashMap<String, LessSafeKey>,
    current: String,
}

impl std::fmt::Debug for LocalKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("LocalKeys")
            .field("ids", &ids)
            .field("current", &self.current)
            .finish()
    }
}

impl LocalKeys {
    /// Where `spec` says: `file:PATH` or `env:NAME`.
    pub fn load(spec: &str) -> Result<LocalKeys, SealError> {
        let text = if let Some(path) = spec.strip_prefix("file:") {
            std::fs::read_to_string(path)
                .map_err(|e| SealError::BadKeys(format!("cannot read {path}: {e}")))?
        } else if let Some(name) = spec.strip_prefix("env:") {
            std::env::var(name)
                .map_err(|_| SealError::BadKeys(format!("the variable {name} is not set")))?
        } else {
            return Err(SealError::BadKeys(format!(
                "`{spec}`: say file:PATH or env:NAME"
            )));
        };
        LocalKeys::parse(&text)
    }

    /// The keys of the text form (the module's).
    pub fn parse(text: &str) -> Result<LocalKeys, SealError> {
        let mut keys = HashMap::new();
        let mut current = None;
        for entry in text.split(['\n', ',']) {
            let entry = entry.split('#').next().unwrap_or_default().trim();
            if entry.is_empty() {
                continue;
            }
            let Some((id, hex)) = entry.split_once(':') else {
                return Err(SealError::BadKeys("an entry is not ID:HEX".into()));
            };
            let id = id.trim();
            if id.is_empty()
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(SealError::BadKeys(format!(
                    "key id `{id}`: letters, digits, - and _ only"
                )));
            }
            let bytes = decode_hex(hex.trim()).ok_or_else(|| {
                SealError::BadKeys(format!("key `{id}` is not 64 hex digits (32 bytes)"))
            })?;
            let key = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| SealError::BadKeys(format!("key `{id}` is not 32 bytes")))?;
            if keys.insert(id.to_owned(), LessSafeKey::new(key)).is_some() {
                return Err(SealError::BadKeys(format!("key `{id}` is there twice")));
            }
            current = Some(id.to_owned());
        }
        let current = current.ok_or_else(|| SealError::BadKeys("no key in it".into()))?;
        Ok(LocalKeys { keys, current })
    }
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[async_trait]
impl KeyProvider for LocalKeys {
    fn current(&self) -> &str {
        &self.current
    }

    async fn wrap(&self, key: &[u8], context: &[u8]) -> Result<Wrapped, SealError> {
        let kek = self
            .keys
            .get(&self.current)
            .ok_or_else(|| SealError::UnknownKek(self.current.clone()))?;
        let mut nonce = [0u8; NONCE];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| SealError::Cipher("no randomness".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(key);
        let tag = kek
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context),
                &mut out[NONCE..],
            )
            .map_err(|_| SealError::Cipher("wrapping failed".into()))?;
        out.extend_from_slice(tag.as_ref());
        let wrapped = Wrapped {
            kek: self.current.clone(),
            bytes: base64_of(&out),
        };
        out.fill(0);
        Ok(wrapped)
    }

    async fn unwrap(&self, wrapped: &Wrapped, context: &[u8]) -> Result<Vec<u8>, SealError> {
        use base64::Engine as _;
        let kek = self
            .keys
            .get(&wrapped.kek)
            .ok_or_else(|| SealError::UnknownKek(wrapped.kek.clone()))?;
        let unwrap_error = || SealError::Unwrap(wrapped.kek.clone());
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&wrapped.bytes)
            .map_err(|_| unwrap_error())?;
        if bytes.len() < NONCE {
            return Err(unwrap_error());
        }
        let mut body = bytes.split_off(NONCE);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| unwrap_error())?;
        let len = kek
            .open_in_place(nonce, Aad::from(context), &mut body)
            .map_err(|_| unwrap_error())?
            .len();
        body.truncate(len);
        Ok(body)
    }
}
