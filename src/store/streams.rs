//! JetStream streams as stored: one definition per stream (`'j' tenant 0 name`, the
//! JSON the streams layer gives), under the tenant's prefix, so deleting a tenant
//! takes its streams. A stream is a named view over the tenant's subjects: its
//! messages are the subjects' own, never copied here. This module stores what it is
//! given: what a definition means is `crate::streams`'.

use bytes::Bytes;
use slatedb::WriteBatch;

use super::{Store, StoreError, keys, put_durably, write_durably};

impl Store {
    /// Writes a stream's definition, durably (a new stream, or a change of one).
    pub async fn put_stream(
        &self,
        tenant: &str,
        name: &str,
        record: &[u8],
    ) -> Result<(), StoreError> {
        put_durably(self.db(), keys::stream(tenant, name), record).await
    }

    /// Every stream definition of a tenant, in name order.
    pub async fn streams(&self, tenant: &str) -> Result<Vec<Bytes>, StoreError> {
        self.values_of(keys::tenant_kind_range(keys::STREAM, tenant))
            .await
    }

    /// Deletes a stream's definition, durably (its subjects' messages are purged
    /// by the caller, as any purge is).
    pub async fn delete_stream(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.delete(keys::stream(tenant, name));
        write_durably(self.db(), batch).await
    }
}
