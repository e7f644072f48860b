//! Plugins as stored: one record per pattern a plugin is bound to (`'p' tenant 0
//! pattern`, the JSON the plugins layer gives, its module inside), under the tenant's
//! prefix, so deleting a tenant takes its plugins. This module stores what it is
//! given: what a record means is `crate::plugins`'.

use bytes::Bytes;
use slatedb::WriteBatch;

use super::{Store, StoreError, keys, put_durably, write_durably};

impl Store {
    /// Writes the plugin bound to `pattern`, durably (a new one, or its replacement).
    pub async fn put_plugin(
        &self,
        tenant: &str,
        pattern: &str,
        record: &[u8],
    ) -> Result<(), StoreError> {
        put_durably(self.db(), keys::plugin(tenant, pattern), record).await
    }

    /// Every plugin record of a tenant, in pattern order.
    pub async fn plugins(&self, tenant: &str) -> Result<Vec<Bytes>, StoreError> {
        self.values_of(keys::tenant_kind_range(keys::PLUGIN, tenant))
            .await
    }

    /// Deletes the plugin bound to `pattern`, durably.
    pub async fn delete_plugin(&self, tenant: &str, pattern: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.delete(keys::plugin(tenant, pattern));
        write_durably(self.db(), batch).await
    }
}
