//! `$CANOPY.plugin.*`: bind WebAssembly plugins to patterns of the caller's tenant,
//! read them, list them and delete them (`canopy plugin …` sends these).
//!
//! A call is authorised as a publish to its own `$CANOPY.plugin.<op>` subject (by
//! the publish decision), and then for what it touches: a put or delete needs the rights to publish and to
//! subscribe to the whole pattern (a plugin decides what its subjects' publishers
//! send), reads show only the plugins of patterns the caller may subscribe to.
//! Guests never change plugins. A module is compiled (and instantiated once) on a
//! blocking thread before anything is stored, so one that cannot run is refused with
//! why; changes are serialised per tenant, written to the store first and made
//! current after, so a publish never meets a plugin a restart would not load. Must
//! never compile a module on a runtime worker.

use std::sync::Arc;

use canopy_subjects::Pattern;
use serde::Deserialize;
use serde_json::{Value, json};

use super::schemas::off_the_runtime;
use super::{Answer, ApiCall, ApiError, PREFIX, authorize, may_bind, parse};
use crate::broker::Broker;
use crate::plugins::{
    DEFAULT_DEADLINE_MS, DEFAULT_MEMORY_MIB, Hook, MAX_DEADLINE_MS, MAX_MEMORY_MIB,
    MAX_MODULE_BYTES, MAX_PLUGINS, OnError, Plugin, PluginSpec, StoredPlugin, TENANT_MEMORY_MIB,
};
use crate::store::Store;
use crate::tenancy::Action;

/// A plugin put.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Put {
    pattern: String,
    /// The module (binary WebAssembly, or its text form), base64.
    module: String,
    /// By default every hook the module exports.
    hooks: Option<Vec<Hook>>,
    #[serde(default)]
    on_error: OnError,
    deadline_ms: Option<u64>,
    memory_mib: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Which {
    pattern: Option<String>,
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

/// What `call` answers, for any door (the native API, HTTP). The caller's right to
/// `$CANOPY.<op>` was checked at the door; what each operation touches is checked
/// below.
pub(crate) async fn answer_to(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
) -> Result<Value, ApiError> {
    let body = call.body_or_empty();
    let value = match call.operation.as_str() {
        "plugin.put" => put(broker, store, call, parse(&call.body)?).await?,
        "plugin.get" => get(broker, call, parse(body)?)?,
        "plugin.list" => list(broker, call),
        "plugin.delete" => delete(broker, store, call, parse(body)?).await?,
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use plugin.put, plugin.get, plugin.list or \
                     plugin.delete"
                ),
            ));
        }
    };
    Ok(value)
}

/// Refuses a read of stored history under `pattern` where a deliver plugin of the
/// tenant could filter or change what readers see (the read would go around it):
/// such subjects are read through a subscription or a consumer, which it sees.
pub(crate) fn unfiltered(routes: &crate::broker::Tenant, pattern: &str) -> Result<(), ApiError> {
    let current = routes.plugins.current();
    let covering = current.all().iter().find(|p| {
        p.serves(Hook::Deliver) && crate::streams::filters::overlap(&p.spec.pattern, pattern)
    });
    match covering {
        None => Ok(()),
        Some(plugin) => Err(ApiError::new(
            409,
            format!(
                "a deliver plugin on {} filters what readers of {pattern} see: read it through \
                 a subscription or a consumer",
                plugin.spec.pattern
            ),
        )),
    }
}

/// The spec a put asks for, within the bounds.
fn spec_of(put: &Put) -> Result<PluginSpec, ApiError> {
    let deadline_ms = put.deadline_ms.unwrap_or(DEFAULT_DEADLINE_MS);
    if deadline_ms == 0 || deadline_ms > MAX_DEADLINE_MS {
        return Err(ApiError::new(
            400,
            format!("deadline_ms is 1 to {MAX_DEADLINE_MS}"),
        ));
    }
    let memory_mib = put.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB);
    if memory_mib == 0 || memory_mib > MAX_MEMORY_MIB {
        return Err(ApiError::new(
            400,
            format!("memory_mib is 1 to {MAX_MEMORY_MIB}"),
        ));
    }
    let hooks = put.hooks.clone().unwrap_or_default();
    Ok(PluginSpec {
        pattern: put.pattern.clone(),
        hooks,
        on_error: put.on_error,
        deadline_ms,
        memory_mib,
    })
}

async fn put(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    put: Put,
) -> Result<Value, ApiError> {
    if broker.mesh().is_some() {
        return Err(ApiError::new(
            501,
            "plugins are not run across a cluster's nodes yet",
        ));
    }
    Pattern::parse_native(&put.pattern)
        .map_err(|e| ApiError::new(400, format!("pattern {:?}: {e}", put.pattern)))?;
    may_bind(broker, &call.principal, "plugin", &put.pattern)?;
    let module = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(put.module.trim())
            .map_err(|e| ApiError::new(400, format!("module is not base64: {e}")))?
    };
    if module.len() > MAX_MODULE_BYTES {
        return Err(ApiError::new(
            413,
            format!("a module is at most {MAX_MODULE_BYTES} bytes"),
        ));
    }
    let spec = spec_of(&put)?;
    let routes = &call.routes;
    let _change = routes.plugin_changes.lock().await;
    let current = routes.plugins.current();
    let previous = current.get(&spec.pattern);
    if previous.is_none() && current.len() >= MAX_PLUGINS {
        return Err(ApiError::new(
            429,
            format!("a tenant has at most {MAX_PLUGINS} plugins"),
        ));
    }
    let others: u64 = current
        .all()
        .iter()
        .filter(|p| p.spec.pattern != spec.pattern)
        .map(|p| p.memory_budget_mib())
        .sum();
    let mine = u64::from(spec.memory_mib) * crate::plugins::runtime::MAX_INSTANCES as u64;
    if others + mine > TENANT_MEMORY_MIB {
        return Err(ApiError::new(
            429,
            format!(
                "a tenant's plugins may have {TENANT_MEMORY_MIB} MiB together ({} instances \
                 each at its memory_mib): {others} MiB are taken, this one needs {mine}",
                crate::plugins::runtime::MAX_INSTANCES
            ),
        ));
    }
    let stored = StoredPlugin {
        spec,
        module: put.module.trim().to_owned(),
        version: previous.map_or(1, |p| p.version + 1),
        time_ms: broker.clock().now_ms(),
        sha256: crate::plugins::sha256_of(&module),
    };
    let max_message = broker.max_answer();
    let compiling = stored.clone();
    let plugin = off_the_runtime(move || {
        Plugin::new(&compiling, &module, max_message)
            .map_err(|fault| ApiError::new(400, format!("the plugin cannot run: {fault}")))
    })
    .await?;
    let record = serde_json::to_vec(&stored)
        .map_err(|e| ApiError::new(500, format!("the plugin could not be written: {e}")))?;
    store
        .put_plugin(&routes.name, &stored.spec.pattern, &record)
        .await?;
    let plugin = Arc::new(plugin);
    let value = info(&plugin);
    routes.plugins.set(current.with(plugin));
    Ok(value)
}

fn get(broker: &Broker, call: &ApiCall, which: Which) -> Result<Value, ApiError> {
    let pattern = which
        .pattern
        .ok_or_else(|| ApiError::new(400, "get needs a `pattern`"))?;
    authorize(broker, &call.principal, Action::Subscribe, &pattern)?;
    let current = call.routes.plugins.current();
    let plugin = current
        .get(&pattern)
        .ok_or_else(|| ApiError::new(404, format!("no plugin is bound to {pattern}")))?;
    Ok(info(plugin))
}

fn list(broker: &Broker, call: &ApiCall) -> Value {
    let current = call.routes.plugins.current();
    let plugins: Vec<Value> = current
        .all()
        .iter()
        .filter(|p| {
            broker
                .authorizer()
                .authorize(&call.principal, Action::Subscribe, &p.spec.pattern)
                .is_ok()
        })
        .map(|p| info(p))
        .collect();
    json!({ "plugins": plugins })
}

async fn delete(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    which: Which,
) -> Result<Value, ApiError> {
    let pattern = which
        .pattern
        .ok_or_else(|| ApiError::new(400, "delete needs a `pattern`"))?;
    may_bind(broker, &call.principal, "plugin", &pattern)?;
    let routes = &call.routes;
    let _change = routes.plugin_changes.lock().await;
    let current = routes.plugins.current();
    if current.get(&pattern).is_none() {
        return Err(ApiError::new(
            404,
            format!("no plugin is bound to {pattern}"),
        ));
    }
    store.delete_plugin(&routes.name, &pattern).await?;
    routes.plugins.set(current.without(&pattern));
    Ok(json!({ "pattern": pattern, "deleted": true }))
}

/// A plugin as the API shows it: its spec, its module's digest, how it fared.
fn info(plugin: &Plugin) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let mut value = json!({
        "pattern": plugin.spec.pattern,
        "hooks": plugin.spec.hooks,
        "on_error": plugin.spec.on_error,
        "deadline_ms": plugin.spec.deadline_ms,
        "memory_mib": plugin.spec.memory_mib,
        "version": plugin.version,
        "time_ms": plugin.time_ms,
        "sha256": plugin.sha256,
        "calls": plugin.calls.load(Relaxed),
        "faults": plugin.faults.load(Relaxed),
        "disabled": plugin.is_disabled(),
    });
    if let Some(fault) = plugin.last_fault() {
        value["last_fault"] = json!(fault);
    }
    value
}
