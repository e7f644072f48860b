//! `$CANOPY.group.*`: create, list, show and delete the caller's tenant's consumer
//! groups.
//!
//! A call is authorised as a publish to its own `$CANOPY.group.<op>` subject, and
//! creating a group also as a subscription to its pattern, since the group reads
//! every subject it matches. Changes are serialised so two creates of one name cannot
//! both succeed. This module must never decide deliveries: that is `crate::groups`'.

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{Answer, ApiCall, ApiError, PREFIX, authorize, parse};
use crate::broker::Broker;
use crate::groups::GroupSpec;
use crate::store::{Store, now_ms};
use crate::tenancy::Action;

/// Serialises creates and deletes of groups.
static CHANGES: Mutex<()> = Mutex::const_new(());

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupRef {
    name: String,
}

/// A definition as stored: the spec and when it was made.
#[derive(serde::Serialize, Deserialize)]
struct Stored {
    spec: GroupSpec,
    created_ms: u64,
}

pub(super) async fn dispatch(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    authorize(
        broker,
        &call.principal,
        Action::Publish,
        &format!("{PREFIX}{}", call.operation),
    )?;
    let tenant = &*call.routes.name;
    let body = match call.operation.as_str() {
        "group.create" => {
            let spec: GroupSpec = parse(&call.body)?;
            spec.check()
                .map_err(|e| ApiError::new(400, e.to_string()))?;
            authorize(broker, &call.principal, Action::Subscribe, &spec.pattern)?;
            let _change = CHANGES.lock().await;
            if store.group(tenant, &spec.name).await?.is_some() {
                return Err(ApiError::new(
                    409,
                    format!("a group {} exists already", spec.name),
                ));
            }
            let stored = Stored {
                spec,
                created_ms: now_ms(),
            };
            let record = serde_json::to_vec(&stored)
                .map_err(|e| ApiError::new(500, format!("group record: {e}")))?;
            store
                .create_group(tenant, &stored.spec.name, &record)
                .await?;
            group_json(&stored)
        }
        "group.list" => {
            let groups: Vec<Value> = store
                .groups(tenant)
                .await?
                .iter()
                .filter_map(|record| serde_json::from_slice::<Stored>(record).ok())
                .map(|stored| group_json(&stored))
                .collect();
            json!({ "groups": groups })
        }
        "group.info" => {
            let GroupRef { name } = parse(&call.body)?;
            let stored = found(store, tenant, &name).await?;
            let cursors = store.cursors(tenant, &name).await?;
            let mut info = group_json(&stored);
            info["subjects"] = json!(cursors.len());
            info
        }
        "group.delete" => {
            let GroupRef { name } = parse(&call.body)?;
            let _change = CHANGES.lock().await;
            found(store, tenant, &name).await?;
            store.delete_group(tenant, &name).await?;
            json!({"name": name, "deleted": true})
        }
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use group.create, group.list, group.info or \
                     group.delete"
                ),
            ));
        }
    };
    answer.json(&body);
    Ok(())
}

fn group_json(stored: &Stored) -> Value {
    let mut value = serde_json::to_value(&stored.spec).unwrap_or(Value::Null);
    value["created_ms"] = json!(stored.created_ms);
    value["dead_letter_subject"] = json!(stored.spec.dead_letter_subject("<subject>"));
    value
}

async fn found(store: &Store, tenant: &str, name: &str) -> Result<Stored, ApiError> {
    let record = store
        .group(tenant, name)
        .await?
        .ok_or_else(|| ApiError::new(404, format!("no group {name}")))?;
    serde_json::from_slice(&record)
        .map_err(|e| ApiError::new(500, format!("the stored group {name} is unreadable: {e}")))
}
