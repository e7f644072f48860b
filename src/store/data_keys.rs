//! A tenant's data keys as stored (`'e' tenant 0 id`, JSON, the key wrapped by a
//! key-encryption key) and as the store seals with them: loaded when the tenant
//! opens (re-wrapped by the provider's current key-encryption key when an older one
//! wrapped them), made when a pattern starts being sealed or its key is rotated,
//! deleted when a pattern is shredded. Changes are serialised per store, written
//! durably first and used after, so no message is sealed with a key a restart would
//! not have.
//!
//! Must never: store a data key unwrapped, or keep sealing with a key whose record
//! is deleted.

use std::sync::Arc;

use slatedb::WriteBatch;

use super::{Store, StoreError, keys, write_durably};
use crate::sealing::{
    DataKey, KeyProvider, SealError, StoredDataKey, TenantKeys, new_data_key, unwrap_data_key,
};

/// Most data keys a tenant keeps (rotations included).
pub const MAX_DATA_KEYS: usize = 1024;

impl From<SealError> for StoreError {
    fn from(error: SealError) -> StoreError {
        StoreError::Refused(error.to_string())
    }
}

impl Store {
    fn provider(&self) -> Result<&Arc<dyn KeyProvider>, StoreError> {
        self.key_provider
            .as_ref()
            .ok_or(SealError::NoProvider.into())
    }

    /// Whether a key provider is configured.
    pub fn seals(&self) -> bool {
        self.key_provider.is_some()
    }

    /// The tenant's data keys as they are stored, in id order.
    pub async fn stored_data_keys(&self, tenant: &str) -> Result<Vec<StoredDataKey>, StoreError> {
        let values = self
            .values_of(keys::tenant_kind_range(keys::DATA_KEY, tenant))
            .await?;
        values
            .iter()
            .map(|value| {
                serde_json::from_slice(value).map_err(|e| {
                    StoreError::Refused(format!("a stored data key is unreadable: {e}"))
                })
            })
            .collect()
    }

    /// The tenant's data keys in use, in id order.
    pub fn data_keys(&self, tenant: &str) -> Vec<Arc<DataKey>> {
        self.db
            .sealing()
            .keys_of(tenant)
            .map(|keys| keys.keys())
            .unwrap_or_default()
    }

    /// Loads the tenant's data keys for sealing and opening, re-wrapping by the
    /// current key-encryption key those an earlier one wrapped. A key that does not
    /// unwrap (its key-encryption key is no longer in the provider) fails the open:
    /// its messages would read as shredded, which must not happen by mistake.
    pub async fn open_data_keys(&self, tenant: &str) -> Result<usize, StoreError> {
        let stored = self.stored_data_keys(tenant).await?;
        if stored.is_empty() {
            self.db.sealing().set(tenant, None);
            return Ok(0);
        }
        let provider = self.provider()?;
        let mut loaded = Vec::with_capacity(stored.len());
        let mut rewrapped = WriteBatch::new();
        let mut any_rewrapped = false;
        for record in &stored {
            let (key, again) = unwrap_data_key(provider.as_ref(), tenant, record)
                .await
                .map_err(|e| {
                    StoreError::Refused(format!("tenant {tenant}'s data key {}: {e}", record.id))
                })?;
            if let Some(again) = again {
                rewrapped.put(keys::data_key(tenant, again.id), encode(&again)?);
                any_rewrapped = true;
            }
            loaded.push(Arc::new(key));
        }
        if any_rewrapped {
            write_durably(&self.db, rewrapped).await?;
            tracing::info!(
                tenant,
                kek = provider.current(),
                "data keys re-wrapped by the current key-encryption key"
            );
        }
        let count = loaded.len();
        self.db.sealing().set(tenant, Some(TenantKeys::new(loaded)));
        Ok(count)
    }

    /// Seals new messages of `pattern` with a new data key; the pattern's key before
    /// (if any) goes on opening what it sealed. Returns the new key and the ids of
    /// those it took over from.
    pub async fn seal_pattern(
        &self,
        tenant: &str,
        pattern: &str,
    ) -> Result<(Arc<DataKey>, Vec<u32>), StoreError> {
        let provider = self.provider()?;
        let _change = self.key_changes.lock().await;
        let current = self.data_keys(tenant);
        if current.len() >= MAX_DATA_KEYS {
            return Err(StoreError::Refused(format!(
                "a tenant keeps at most {MAX_DATA_KEYS} data keys: shred some first"
            )));
        }
        let id = loop {
            let mut bytes = [0u8; 4];
            aws_lc_rs::rand::fill(&mut bytes)
                .map_err(|_| SealError::Cipher("no randomness".into()))?;
            let id = u32::from_be_bytes(bytes);
            if id != 0 && current.iter().all(|k| k.id != id) {
                break id;
            }
        };
        let (key, record) =
            new_data_key(provider.as_ref(), tenant, pattern, id, self.clock.now_ms()).await?;
        let mut batch = WriteBatch::new();
        batch.put(keys::data_key(tenant, id), encode(&record)?);
        let retired = self.retire(tenant, &current, pattern, &mut batch).await?;
        write_durably(&self.db, batch).await?;
        let key = Arc::new(key);
        let mut next: Vec<Arc<DataKey>> = current
            .into_iter()
            .map(|k| match retired.contains(&k.id) {
                true => Arc::new(k.with_sealing(false)),
                false => k,
            })
            .collect();
        next.push(Arc::clone(&key));
        self.db.sealing().set(tenant, Some(TenantKeys::new(next)));
        Ok((key, retired))
    }

    /// Stops sealing new messages of `pattern`; its keys go on opening what they
    /// sealed. Returns how many keys stopped.
    pub async fn stop_sealing(&self, tenant: &str, pattern: &str) -> Result<usize, StoreError> {
        let _change = self.key_changes.lock().await;
        let current = self.data_keys(tenant);
        let mut batch = WriteBatch::new();
        let retired = self.retire(tenant, &current, pattern, &mut batch).await?;
        if retired.is_empty() {
            return Ok(0);
        }
        write_durably(&self.db, batch).await?;
        let next = current.into_iter().map(|k| match retired.contains(&k.id) {
            true => Arc::new(k.with_sealing(false)),
            false => k,
        });
        self.db.sealing().set(tenant, Some(TenantKeys::new(next)));
        Ok(retired.len())
    }

    /// Deletes every data key of `pattern` (crypto-shredding): what they sealed is
    /// unreadable from now on, here and after a restart. Returns the ids deleted.
    pub async fn shred(&self, tenant: &str, pattern: &str) -> Result<Vec<u32>, StoreError> {
        let _change = self.key_changes.lock().await;
        let current = self.data_keys(tenant);
        let (gone, kept): (Vec<_>, Vec<_>) =
            current.into_iter().partition(|k| k.pattern == pattern);
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        // Used no more before the records go: a round sealing meanwhile would
        // otherwise write what nothing can open.
        self.db.sealing().set(tenant, Some(TenantKeys::new(kept)));
        let mut batch = WriteBatch::new();
        for key in &gone {
            batch.delete(keys::data_key(tenant, key.id));
        }
        write_durably(&self.db, batch).await?;
        Ok(gone.iter().map(|k| k.id).collect())
    }

    /// Marks the sealing keys of `pattern` retired in `batch`; returns their ids.
    async fn retire(
        &self,
        tenant: &str,
        current: &[Arc<DataKey>],
        pattern: &str,
        batch: &mut WriteBatch,
    ) -> Result<Vec<u32>, StoreError> {
        let sealing: Vec<u32> = current
            .iter()
            .filter(|k| k.sealing && k.pattern == pattern)
            .map(|k| k.id)
            .collect();
        if sealing.is_empty() {
            return Ok(sealing);
        }
        for mut record in self.stored_data_keys(tenant).await? {
            if sealing.contains(&record.id) {
                record.sealing = false;
                batch.put(keys::data_key(tenant, record.id), encode(&record)?);
            }
        }
        Ok(sealing)
    }
}

fn encode(record: &StoredDataKey) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record)
        .map_err(|e| StoreError::Refused(format!("a data key could not be written: {e}")))
}
