//! Tenant records: one key per tenant (`'t' name`) holding its settings as JSON.
//!
//! Creating a tenant is that one durable write, whatever the number of tenants: its
//! data needs no setup, since every other key kind already starts with the tenant's
//! name. Deleting one is two steps: the record is marked deleting (the tenant is gone
//! for clients at once), then [`Store::purge_tenant`] deletes every key of the
//! tenant's ranges in chunks and finally the record. This module must never read or
//! write another tenant's keys.

use serde::{Deserialize, Serialize};
use slatedb::WriteBatch;

use super::{Store, StoreError, keys, put_durably, write_durably};

/// The tenant of a connection whose login names none, and of a server without tenants.
pub const DEFAULT_TENANT: &str = "default";

/// What a tenant may use; `None` is no limit of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_subscriptions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_publish_msgs_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_publish_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stored_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_subjects: Option<u64>,
    /// The tenant's own retention: messages older than this are removed, whatever
    /// their subject's policy keeps (the shorter of the two wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_secs: Option<u64>,
    /// API calls (`$CANOPY.…`, `$JS.API.…`) of the tenant running at once, parked
    /// follows included; past it a call is answered 429. Unset: the server's
    /// `[limits] tenant_api_calls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_api_calls: Option<u64>,
    /// Consumer groups (JetStream consumers included) the tenant may keep. Unset: the
    /// server's `[limits] tenant_groups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_groups: Option<u64>,
    /// Publish rates on the subjects of patterns, beside the tenant's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pattern_rates: Vec<PatternRate>,
}

/// A publish rate on the subjects of one pattern: messages and bytes per second,
/// shared by all of the tenant's publishers, or each client's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternRate {
    pub pattern: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msgs_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
    /// Each client (a connection, and the will it leaves) has its own bucket.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_client: bool,
}

/// A tenant as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    pub created_ms: u64,
    #[serde(default)]
    pub limits: TenantLimits,
    /// What clients that present no credentials may do in this tenant, when logins
    /// are required; `None`: they are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous: Option<super::Permissions>,
    /// Deleted for clients; its data is being purged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// Keys deleted per engine write while purging a tenant.
const PURGE_CHUNK: usize = 1000;

impl Store {
    /// Writes a tenant's record, durably: creating a tenant is this one write.
    pub async fn put_tenant(&self, record: &TenantRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(record)
            .map_err(|e| StoreError::Refused(format!("tenant record: {e}")))?;
        put_durably(self.db(), keys::tenant(&record.name), value).await
    }

    /// One tenant's record, deleting or not.
    pub async fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError> {
        Ok(self
            .db()
            .get(keys::tenant(name))
            .await?
            .and_then(|value| serde_json::from_slice(&value).ok()))
    }

    /// Every tenant record, in name order.
    pub async fn tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        let mut records = self.db().scan(keys::tenant_range()).await?;
        let mut all = Vec::new();
        while let Some(kv) = records.next().await? {
            match serde_json::from_slice(&kv.value) {
                Ok(record) => all.push(record),
                Err(error) => tracing::warn!(%error, "an unreadable tenant record is skipped"),
            }
        }
        Ok(all)
    }

    /// Purges a deleted tenant's data in the background; a failure is logged and the
    /// purge runs again at the next opening (the record stays marked until it is done).
    pub fn purge_in_background(self: std::sync::Arc<Self>, tenant: String) {
        tokio::spawn(async move {
            let purged = async {
                self.forget_tenant(&tenant).await?;
                self.purge_tenant(&tenant).await
            }
            .await;
            match purged {
                Ok(keys) => tracing::info!(tenant, keys, "deleted tenant purged"),
                Err(error) => {
                    tracing::warn!(tenant, %error, "purging a deleted tenant failed; it resumes at the next opening")
                }
            }
        });
    }

    /// Deletes every key of `tenant` (messages, markers, batches, msg ids, snapshots,
    /// retained messages, sessions, counters), then its record. Returns the keys
    /// deleted. Safe to run again after a crash half way.
    pub async fn purge_tenant(&self, tenant: &str) -> Result<u64, StoreError> {
        let mut deleted = 0;
        // Its data keys go with it: a tenant made again under the name seals nothing.
        self.db().sealing().set(tenant, None);
        // Deleted from the engine, so first written there.
        self.db().flush_unflushed().await?;
        for kind in keys::TENANT_KINDS {
            let range = keys::tenant_kind_range(kind, tenant);
            let mut found = self
                .db()
                .scan_flushed(range, &self.db().durable_scan())
                .await?;
            let mut batch = WriteBatch::new();
            let mut pending = 0;
            while let Some(kv) = found.next().await? {
                batch.delete(&kv.key);
                pending += 1;
                if pending == PURGE_CHUNK {
                    write_durably(self.db(), std::mem::take(&mut batch)).await?;
                    deleted += pending as u64;
                    pending = 0;
                }
            }
            if pending > 0 {
                write_durably(self.db(), batch).await?;
                deleted += pending as u64;
            }
        }
        let mut batch = WriteBatch::new();
        batch.delete(keys::tenant(tenant));
        write_durably(self.db(), batch).await?;
        Ok(deleted)
    }
}

/// A tenant name: 1 to 64 of `a-z`, `0-9`, `-` and `_`, starting with a letter or digit.
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a tenant name: use 1 to 64 of a-z, 0-9, '-' and '_', starting \
             with a letter or digit"
        ))
    }
}

/// The record of a new tenant, created at `now_ms` (by the server's clock).
pub fn new_tenant(name: &str, limits: TenantLimits, now_ms: u64) -> TenantRecord {
    TenantRecord {
        name: name.to_owned(),
        created_ms: now_ms,
        limits,
        anonymous: None,
        deleting: false,
    }
}
