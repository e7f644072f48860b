//! A tenant's routes: created on first use, made current from the tenant's record
//! (registry, live quotas, the store's limits), and evicted when the tenant is deleted.
//!
//! Must never: route a message, or keep a deleted tenant's routes reachable.

use std::sync::Arc;

use canopy_subjects::SharedTrie;

use super::{Broker, TenantRoutes};

pub(super) fn stored_limits(limits: &crate::store::TenantLimits) -> crate::store::StoredLimits {
    crate::store::StoredLimits {
        max_subjects: limits.max_subjects,
        max_bytes: limits.max_stored_bytes,
        max_age_ms: limits.max_age_secs.map(|s| s.saturating_mul(1000)),
    }
}

impl Broker {
    /// The routes of `tenant`, created on first use. Connections look this up once
    /// and keep it.
    pub fn tenant(&self, tenant: &str) -> Arc<TenantRoutes> {
        if let Some(routes) = self.tenants.read().get(tenant) {
            return Arc::clone(routes);
        }
        let record = self.tenant_records.get(tenant);
        let mut tenants = self.tenants.write();
        let routes = tenants.entry(Arc::from(tenant)).or_insert_with(|| {
            Arc::new(TenantRoutes {
                name: Arc::from(tenant),
                trie: SharedTrie::new(),
                quota: Arc::new(crate::tenancy::quota::Quota::new(
                    tenant,
                    record.as_deref().map(|r| &r.limits),
                    self.tenant_defaults,
                )),
                deleted: tokio_util::sync::CancellationToken::new(),
                inboxes: super::InboxClaims::default(),
                schemas: self.schemas.tenant(tenant),
                taps: Arc::default(),
            })
        });
        Arc::clone(routes)
    }

    /// Makes a tenant's record current: the registry, the live quotas of its
    /// connections, and the store's limits.
    pub async fn set_tenant(
        &self,
        record: crate::store::TenantRecord,
    ) -> Result<(), crate::store::StoreError> {
        if let Some(store) = self.store() {
            store
                .set_limits(&record.name, stored_limits(&record.limits))
                .await?;
        }
        if let Some(routes) = self.tenants.read().get(record.name.as_str()) {
            routes.quota.set_limits(&record.limits);
        }
        self.tenant_records.set(record);
        Ok(())
    }

    /// A deleted tenant's connections close, and a tenant made again under its name
    /// starts with routes and quotas of its own.
    pub fn evict_tenant(&self, name: &str) {
        if let Some(routes) = self.tenants.write().remove(name) {
            routes.deleted.cancel();
        }
        // Its groups stop too: their cursors go with the tenant's data; so do its
        // schemas.
        self.groups().stop_tenant(name);
        self.schemas.evict(name);
    }

    /// Tells the store every tenant's stored limits (at start, after loading).
    pub async fn apply_stored_limits(&self) -> Result<(), crate::store::StoreError> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        for record in self.tenant_records.list() {
            let limits = stored_limits(&record.limits);
            if limits != crate::store::StoredLimits::default() {
                store.set_limits(&record.name, limits).await?;
            }
        }
        Ok(())
    }
}
