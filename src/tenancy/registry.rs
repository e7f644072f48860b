//! The tenants clients can use: every record in the store, held in memory so a
//! connection finds its tenant without a read. Loaded at start (creating `default`
//! when the store has no record of it) and changed only by the admin API, which writes
//! the store first. A tenant being deleted is not listed here.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::DEFAULT_TENANT;
use crate::store::{Store, StoreError, TenantLimits, TenantRecord, new_tenant};

#[derive(Debug, Default)]
pub struct Tenants {
    records: RwLock<HashMap<Arc<str>, Arc<TenantRecord>>>,
}

impl Tenants {
    /// Reads every record, writing `default` when the store has none; returns the
    /// tenants whose deletion had not finished, for their purge to go on.
    pub async fn load(&self, store: &Store) -> Result<Vec<String>, StoreError> {
        let mut deleting = Vec::new();
        for record in store.tenants().await? {
            if record.deleting {
                deleting.push(record.name.clone());
            } else {
                self.set(record);
            }
        }
        if self.get(DEFAULT_TENANT).is_none() {
            let record = new_tenant(
                DEFAULT_TENANT,
                TenantLimits::default(),
                store.clock().now_ms(),
            );
            store.put_tenant(&record).await?;
            self.set(record);
        }
        Ok(deleting)
    }

    /// A usable tenant.
    pub fn get(&self, name: &str) -> Option<Arc<TenantRecord>> {
        self.records.read().get(name).cloned()
    }

    /// Every usable tenant, in name order.
    pub fn list(&self) -> Vec<Arc<TenantRecord>> {
        let mut all: Vec<_> = self.records.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub fn set(&self, record: TenantRecord) {
        self.records
            .write()
            .insert(Arc::from(record.name.as_str()), Arc::new(record));
    }

    pub fn remove(&self, name: &str) {
        self.records.write().remove(name);
    }
}
