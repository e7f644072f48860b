//! Consumer groups as stored: a definition per group (`'k' tenant 0 name`, the JSON
//! the groups layer gives) and a cursor per (group, subject) (`'z' tenant 0 group 0
//! subject 0`, the last version the group is done with). Both live under the tenant's
//! prefix, so deleting a tenant takes its groups. This module stores what it is given:
//! what a definition means is `crate::groups`'.

use bytes::Bytes;
use slatedb::WriteBatch;

use super::{Store, StoreError, keys, put_durably, write_durably};

impl Store {
    /// Writes a new group's definition, durably, after removing any cursors left by
    /// an earlier group of the same name whose deletion a crash cut short.
    pub async fn create_group(
        &self,
        tenant: &str,
        name: &str,
        record: &[u8],
    ) -> Result<(), StoreError> {
        self.delete_range(keys::cursor_range(tenant, name)).await?;
        put_durably(self.db(), keys::group(tenant, name), record).await
    }

    /// One group's definition.
    pub async fn group(&self, tenant: &str, name: &str) -> Result<Option<Bytes>, StoreError> {
        Ok(self.db().get(keys::group(tenant, name)).await?)
    }

    /// Every group definition of a tenant, in name order.
    pub async fn groups(&self, tenant: &str) -> Result<Vec<Bytes>, StoreError> {
        self.values_of(keys::tenant_kind_range(keys::GROUP, tenant))
            .await
    }

    /// The values of every key in `range`, in key order.
    pub(super) async fn values_of(
        &self,
        range: std::ops::Range<Bytes>,
    ) -> Result<Vec<Bytes>, StoreError> {
        let mut records = self.db().scan(range).await?;
        let mut all = Vec::new();
        while let Some(kv) = records.next().await? {
            all.push(kv.value);
        }
        Ok(all)
    }

    /// Deletes a group's definition, then its cursors (a crash in between leaves
    /// cursors that [`Store::create_group`] clears before the name is used again).
    pub async fn delete_group(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.delete(keys::group(tenant, name));
        write_durably(self.db(), batch).await?;
        self.delete_range(keys::cursor_range(tenant, name)).await
    }

    /// Writes cursors of one group in one durable batch.
    pub async fn put_cursors(
        &self,
        tenant: &str,
        group: &str,
        cursors: &[(std::sync::Arc<str>, u64)],
    ) -> Result<(), StoreError> {
        if cursors.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::new();
        for (subject, acked) in cursors {
            batch.put(keys::cursor(tenant, group, subject), acked.to_be_bytes());
        }
        write_durably(self.db(), batch).await
    }

    /// Every cursor of one group, in subject order.
    pub async fn cursors(
        &self,
        tenant: &str,
        group: &str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut found = self.db().scan(keys::cursor_range(tenant, group)).await?;
        let mut all = Vec::new();
        while let Some(kv) = found.next().await? {
            let (Some(subject), Ok(acked)) = (
                keys::cursor_subject(&kv.key, tenant, group),
                <[u8; 8]>::try_from(&kv.value[..]),
            ) else {
                continue;
            };
            all.push((subject.to_owned(), u64::from_be_bytes(acked)));
        }
        Ok(all)
    }
}
