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

use super::{Answer, ApiCall, ApiError, PREFIX, parse};
use crate::broker::Broker;
use crate::store::{Permissions, Store, TenantLimits, TenantRecord, check_tenant_name, new_tenant};
use crate::tenancy::DEFAULT_TENANT;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

/// A tenant's name and settings: what create and update take. Update replaces the
/// limits, and the anonymous rules when given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WithLimits {
    pub name: String,
    #[serde(default)]
    pub limits: TenantLimits,
    #[serde(default)]
    pub anonymous: Option<Anonymous>,
}

/// Anonymous access to a tenant: rules to allow it under, or `false` to end it.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Anonymous {
    Rules(Permissions),
    Off(bool),
}

impl Anonymous {
    fn rules(self) -> Result<Option<Permissions>, ApiError> {
        match self {
            Anonymous::Rules(rules) => Ok(Some(rules)),
            Anonymous::Off(false) => Ok(None),
            Anonymous::Off(true) => Err(ApiError::new(
                400,
                "anonymous takes rules ({\"publish\": {...}, \"subscribe\": {...}}) or false",
            )),
        }
    }
}

pub(super) async fn dispatch(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    // The caller's right to the call was checked by the publish decision.
    super::admin_only(&call.principal, &call.operation)?;
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
    let mut body =
        json!({"name": record.name, "created_ms": record.created_ms, "limits": record.limits});
    if let Some(rules) = &record.anonymous {
        body["anonymous"] = json!(rules);
    }
    body
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
    let mut record = new_tenant(&request.name, request.limits, broker.clock().now_ms());
    if let Some(anonymous) = request.anonymous {
        record.anonymous = anonymous.rules()?;
    }
    save(broker, store, record).await
}

/// A rate of 0 would admit nothing yet look like a limit; no limit is no field.
fn check_limits(limits: &TenantLimits) -> Result<(), ApiError> {
    for (name, value) in [
        ("max_publish_msgs_per_sec", limits.max_publish_msgs_per_sec),
        (
            "max_publish_bytes_per_sec",
            limits.max_publish_bytes_per_sec,
        ),
        ("max_age_secs", limits.max_age_secs),
        ("max_api_calls", limits.max_api_calls),
    ] {
        if value == Some(0) {
            return Err(ApiError::new(
                400,
                format!("{name} must be at least 1 (leave it out for no limit)"),
            ));
        }
    }
    check_pattern_rates(&limits.pattern_rates)
}

/// Each pattern rate names a pattern and at least one rate of 1 or more; at most
/// [`MAX_PATTERN_RATES`] of them.
fn check_pattern_rates(rates: &[crate::store::PatternRate]) -> Result<(), ApiError> {
    use crate::tenancy::pattern_rates::MAX_PATTERN_RATES;
    if rates.len() > MAX_PATTERN_RATES {
        return Err(ApiError::new(
            400,
            format!("a tenant has at most {MAX_PATTERN_RATES} pattern_rates"),
        ));
    }
    for rate in rates {
        canopy_subjects::Pattern::parse_native(&rate.pattern)
            .map_err(|e| ApiError::new(400, format!("pattern_rates: {:?}: {e}", rate.pattern)))?;
        let given = [rate.msgs_per_sec, rate.bytes_per_sec];
        if given.contains(&Some(0)) || given.iter().all(Option::is_none) {
            return Err(ApiError::new(
                400,
                format!(
                    "pattern_rates: {} needs msgs_per_sec or bytes_per_sec of 1 or more",
                    rate.pattern
                ),
            ));
        }
    }
    Ok(())
}

/// Writes a record to the store, then the registry; answers with it.
async fn save(broker: &Broker, store: &Store, record: TenantRecord) -> Result<Value, ApiError> {
    check_limits(&record.limits)?;
    store.put_tenant(&record).await?;
    let body = record_json(&record);
    let name = record.name.clone();
    broker.set_tenant(record).await?;
    broker.mirror_definitions(&name).await;
    Ok(body)
}

/// A tenant's record and usage.
pub async fn describe(broker: &Broker, store: &Store, name: &str) -> Result<Value, ApiError> {
    let record = usable(broker, name)?;
    let stored = store.usage(&record.name).await?;
    let routes = broker.tenant(&record.name);
    let live = routes.quota.usage();
    let mut body = record_json(&record);
    body["usage"] = json!({
        "connections": live.connections,
        "subscriptions": routes.subscription_count(),
        "subjects": stored.subjects,
        "stored_bytes": stored.bytes,
        "msgs_per_sec": (live.msgs_per_sec * 10.0).round() / 10.0,
        "bytes_per_sec": live.bytes_per_sec.round(),
        "published_msgs": live.published_msgs,
        "published_bytes": live.published_bytes,
        "refused_by_quota": live.refused,
        "throttled_by_quota": live.throttled,
    });
    Ok(body)
}

/// Replaces a tenant's limits.
pub async fn update(
    broker: &Broker,
    store: &Store,
    request: WithLimits,
) -> Result<Value, ApiError> {
    let current = usable(broker, &request.name)?;
    let anonymous = match request.anonymous {
        Some(change) => change.rules()?,
        None => current.anonymous.clone(),
    };
    let record = TenantRecord {
        limits: request.limits,
        anonymous,
        ..(*current).clone()
    };
    save(broker, store, record).await
}

/// Deletes a tenant: hidden at once, its data purged in the background.
pub async fn delete(broker: &Broker, store: &Arc<Store>, name: &str) -> Result<Value, ApiError> {
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
    // Its clients go before its data: nothing they send can outlive the purge.
    broker.close_tenant(&record.name);
    Arc::clone(store).purge_in_background(record.name.clone());
    broker.mirror_definitions(&record.name).await;
    Ok(json!({"name": record.name, "deleted": true}))
}

fn usable(broker: &Broker, name: &str) -> Result<Arc<TenantRecord>, ApiError> {
    broker
        .tenant_records()
        .get(name)
        .ok_or_else(|| ApiError::new(404, format!("no tenant {name}")))
}
