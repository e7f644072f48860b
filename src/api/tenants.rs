//! `$CANOPY.tenant.*`: create, list, describe, update and delete tenants.
//!
//! Every change writes the store first and then the in-memory registry, so a change
//! that was answered survives a restart. Deleting hides the tenant at once (its record
//! is marked, the registry forgets it) and purges its data in a background task. The
//! calls are authorised as publishes to their own `$CANOPY.tenant.<op>` subject. This
//! module must never touch a tenant's data other than through the store's purge.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, ApiCall, ApiError, PREFIX, authorize_call, parse};
use crate::broker::Broker;
use crate::store::{Store, TenantLimits, TenantRecord, check_tenant_name, new_tenant};
use crate::tenancy::DEFAULT_TENANT;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

/// A tenant's name and limits: what create and update take.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WithLimits {
    pub name: String,
    #[serde(default)]
    pub limits: TenantLimits,
}

pub(super) async fn dispatch(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    authorize_call(broker, call)?;
    let body = match call.operation.as_str() {
        "tenant.create" => create(broker, store, parse(&call.body)?).await?,
        "tenant.list" => list(broker),
        "tenant.describe" => describe(broker, store, &parse::<Named>(&call.body)?.name).await?,
        "tenant.update" => update(broker, store, parse(&call.body)?).await?,
        "tenant.delete" => delete(broker, store, &parse::<Named>(&call.body)?.name).await?,
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use tenant.create, tenant.list, \
                     tenant.describe, tenant.update or tenant.delete"
                ),
            ));
        }
    };
    answer.json(&body);
    Ok(())
}

fn record_json(record: &TenantRecord) -> Value {
    json!({"name": record.name, "created_ms": record.created_ms, "limits": record.limits})
}

/// Every usable tenant.
pub fn list(broker: &Broker) -> Value {
    let tenants: Vec<Value> = broker
        .tenant_records()
        .list()
        .iter()
        .map(|r| record_json(r))
        .collect();
    json!({ "tenants": tenants })
}

/// Creates a tenant: one durable write.
pub async fn create(
    broker: &Broker,
    store: &Store,
    request: WithLimits,
) -> Result<Value, ApiError> {
    check_tenant_name(&request.name).map_err(|reason| ApiError::new(400, reason))?;
    // The store's record, not the registry: a tenant still being purged is there.
    if let Some(existing) = store.tenant(&request.name).await? {
        let why = if existing.deleting {
            "is being deleted; try again when its data is purged"
        } else {
            "exists already"
        };
        return Err(ApiError::new(409, format!("tenant {} {why}", request.name)));
    }
    save(broker, store, new_tenant(&request.name, request.limits)).await
}

/// Writes a record to the store, then the registry; answers with it.
async fn save(broker: &Broker, store: &Store, record: TenantRecord) -> Result<Value, ApiError> {
    store.put_tenant(&record).await?;
    let body = record_json(&record);
    broker.tenant_records().set(record);
    Ok(body)
}

/// A tenant's record and usage.
pub async fn describe(broker: &Broker, store: &Store, name: &str) -> Result<Value, ApiError> {
    let record = usable(broker, name)?;
    let subjects = store.subject_count(&record.name).await?;
    let mut body = record_json(&record);
    body["usage"] = json!({ "subjects": subjects });
    Ok(body)
}

/// Replaces a tenant's limits.
pub async fn update(
    broker: &Broker,
    store: &Store,
    request: WithLimits,
) -> Result<Value, ApiError> {
    let current = usable(broker, &request.name)?;
    let record = TenantRecord {
        limits: request.limits,
        ..(*current).clone()
    };
    save(broker, store, record).await
}

/// Deletes a tenant: hidden at once, its data purged in the background.
pub async fn delete(broker: &Broker, store: &Store, name: &str) -> Result<Value, ApiError> {
    if name == DEFAULT_TENANT {
        return Err(ApiError::new(
            400,
            "the default tenant cannot be deleted (purge its subjects instead)",
        ));
    }
    let current = usable(broker, name)?;
    let record = TenantRecord {
        deleting: true,
        ..(*current).clone()
    };
    store.put_tenant(&record).await?;
    broker.tenant_records().remove(&record.name);
    match broker.store() {
        Some(store) => spawn_purge(Arc::clone(store), record.name.clone()),
        None => tracing::warn!(tenant = record.name, "no store to purge from"),
    }
    Ok(json!({"name": record.name, "deleted": true}))
}

fn usable(broker: &Broker, name: &str) -> Result<Arc<TenantRecord>, ApiError> {
    broker
        .tenant_records()
        .get(name)
        .ok_or_else(|| ApiError::new(404, format!("no tenant {name}")))
}

/// Purges a deleted tenant's data in the background; a failure is logged and the
/// purge runs again at the next start (the record stays marked until it is done).
pub fn spawn_purge(store: Arc<Store>, tenant: String) {
    tokio::spawn(async move {
        let purged = async {
            store.forget_tenant(&tenant).await?;
            store.purge_tenant(&tenant).await
        }
        .await;
        match purged {
            Ok(keys) => tracing::info!(tenant, keys, "deleted tenant purged"),
            Err(error) => {
                tracing::warn!(tenant, %error, "purging a deleted tenant failed; it resumes at the next start")
            }
        }
    });
}
