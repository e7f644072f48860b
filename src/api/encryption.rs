//! `$CANOPY.encryption.*`: keep the subjects of a pattern of the caller's tenant
//! encrypted at rest (envelope encryption, `crate::sealing`), rotate a pattern's data
//! key, stop sealing, shred, and list the data keys (`canopy encryption …` sends
//! these).
//!
//! A call is authorised as a publish to its own `$CANOPY.encryption.<op>` subject (by
//! the publish decision), and then like a schema or plugin binding: changing a
//! pattern's keys needs the rights to publish and to subscribe to the whole pattern;
//! a listing shows only the keys of patterns the caller may subscribe to. Guests
//! never change keys. Must never: show a data key's bytes, wrapped or not.

use std::sync::Arc;

use canopy_subjects::Pattern;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, ApiCall, ApiError, PREFIX, may_bind, parse};
use crate::broker::Broker;
use crate::sealing::DataKey;
use crate::store::Store;
use crate::tenancy::Action;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Which {
    pattern: String,
}

pub(super) async fn dispatch(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    answer.json(&answer_to(broker, store, call).await?);
    Ok(())
}

/// What `call` answers, for any door (the native API, HTTP).
pub(crate) async fn answer_to(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
) -> Result<Value, ApiError> {
    let value = match call.operation.as_str() {
        "encryption.seal" => seal(broker, store, call, parse(&call.body)?).await?,
        "encryption.stop" => stop(broker, store, call, parse(&call.body)?).await?,
        "encryption.shred" => shred(broker, store, call, parse(&call.body)?).await?,
        "encryption.list" => list(broker, store, call),
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use encryption.seal, encryption.stop, \
                     encryption.shred or encryption.list"
                ),
            ));
        }
    };
    Ok(value)
}

fn key_json(key: &DataKey) -> Value {
    json!({
        "id": key.id,
        "pattern": key.pattern,
        "sealing": key.sealing,
        "created_ms": key.created_ms,
        "kek": key.kek,
    })
}

/// The pattern a change names, checked, once the caller may change its keys.
fn pattern_of(broker: &Broker, call: &ApiCall, which: &Which) -> Result<(), ApiError> {
    if broker.mesh().is_some() {
        return Err(ApiError::new(
            501,
            "encryption at rest is not offered across a cluster's nodes yet",
        ));
    }
    let pattern = Pattern::parse_native(&which.pattern)
        .map_err(|e| ApiError::new(400, format!("pattern {:?}: {e}", which.pattern)))?;
    if pattern.to_string().starts_with('$') {
        return Err(ApiError::new(
            400,
            format!(
                "{}: the server's own subjects are not sealed",
                which.pattern
            ),
        ));
    }
    may_bind(broker, &call.principal, "data key", &which.pattern)
}

async fn seal(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    which: Which,
) -> Result<Value, ApiError> {
    pattern_of(broker, call, &which)?;
    if !store.seals() {
        return Err(ApiError::new(
            503,
            "this server has no key-encryption keys: its operator sets store.keys \
             (file:PATH or env:NAME)",
        ));
    }
    let (key, rotated) = store
        .seal_pattern(&call.routes.name, &which.pattern)
        .await?;
    Ok(json!({
        "pattern": which.pattern,
        "key": key_json(&key),
        "rotated": rotated,
    }))
}

async fn stop(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    which: Which,
) -> Result<Value, ApiError> {
    pattern_of(broker, call, &which)?;
    let stopped = store
        .stop_sealing(&call.routes.name, &which.pattern)
        .await?;
    if stopped == 0 {
        return Err(ApiError::new(
            404,
            format!("{} is not sealed", which.pattern),
        ));
    }
    Ok(json!({ "pattern": which.pattern, "stopped": stopped }))
}

async fn shred(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    which: Which,
) -> Result<Value, ApiError> {
    pattern_of(broker, call, &which)?;
    let shredded = store.shred(&call.routes.name, &which.pattern).await?;
    if shredded.is_empty() {
        return Err(ApiError::new(
            404,
            format!("{} has no data keys", which.pattern),
        ));
    }
    Ok(json!({
        "pattern": which.pattern,
        "shredded": shredded,
        "unreadable": "every message and snapshot these keys sealed now reads as unreadable \
                       (no payload, a Canopy-Unreadable header), here and after a restart",
    }))
}

fn list(broker: &Arc<Broker>, store: &Store, call: &ApiCall) -> Value {
    let keys: Vec<Value> = store
        .data_keys(&call.routes.name)
        .iter()
        .filter(|k| {
            broker
                .authorizer()
                .authorize(&call.principal, Action::Subscribe, &k.pattern)
                .is_ok()
        })
        .map(|k| key_json(k))
        .collect();
    json!({ "keys": keys })
}
