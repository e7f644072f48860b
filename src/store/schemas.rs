//! Schema bindings as stored: one key per version of a binding (`'y' tenant 0 pattern
//! 0 version`, the JSON the schemas layer gives), under the tenant's prefix, so
//! deleting a tenant takes its schemas. This module stores what it is given: what a
//! version means is `crate::schemas`'.

use bytes::Bytes;

use super::{Store, StoreError, keys, put_durably};

/// One stored version of a binding.
#[derive(Debug, Clone)]
pub struct SchemaRecord {
    pub pattern: String,
    pub version: u64,
    pub record: Bytes,
}

impl Store {
    /// Writes one version of a binding, durably.
    pub async fn put_schema_version(
        &self,
        tenant: &str,
        pattern: &str,
        version: u64,
        record: &[u8],
    ) -> Result<(), StoreError> {
        put_durably(self.db(), keys::schema(tenant, pattern, version), record).await
    }

    /// One version of a binding, if it was stored.
    pub async fn schema_version(
        &self,
        tenant: &str,
        pattern: &str,
        version: u64,
    ) -> Result<Option<SchemaRecord>, StoreError> {
        let found = self
            .db()
            .get(keys::schema(tenant, pattern, version))
            .await?;
        Ok(found.map(|record| SchemaRecord {
            pattern: pattern.to_owned(),
            version,
            record,
        }))
    }

    /// Every version of one binding, oldest first.
    pub async fn schema_versions(
        &self,
        tenant: &str,
        pattern: &str,
    ) -> Result<Vec<SchemaRecord>, StoreError> {
        self.scan_schemas(tenant, keys::schema_range(tenant, pattern))
            .await
    }

    /// The newest version of every binding of a tenant (deletions included), by
    /// pattern: what a start needs, in memory one record per pattern however long
    /// the histories are.
    pub async fn newest_schemas(&self, tenant: &str) -> Result<Vec<SchemaRecord>, StoreError> {
        let range = keys::tenant_kind_range(keys::SCHEMA, tenant);
        let mut found = self.db().scan(range).await?;
        let mut newest: Vec<SchemaRecord> = Vec::new();
        while let Some(kv) = found.next().await? {
            let Some((pattern, version)) = keys::schema_parts(&kv.key, tenant) else {
                continue;
            };
            let record = SchemaRecord {
                pattern: pattern.to_owned(),
                version,
                record: kv.value,
            };
            match newest.last_mut() {
                Some(last) if last.pattern == record.pattern => *last = record,
                _ => newest.push(record),
            }
        }
        Ok(newest)
    }

    async fn scan_schemas(
        &self,
        tenant: &str,
        range: std::ops::Range<Bytes>,
    ) -> Result<Vec<SchemaRecord>, StoreError> {
        let mut found = self.db().scan(range).await?;
        let mut all = Vec::new();
        while let Some(kv) = found.next().await? {
            if let Some((pattern, version)) = keys::schema_parts(&kv.key, tenant) {
                all.push(SchemaRecord {
                    pattern: pattern.to_owned(),
                    version,
                    record: kv.value,
                });
            }
        }
        Ok(all)
    }
}
