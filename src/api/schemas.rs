//! `$CANOPY.schema.*` (and `/api/schemas` on the HTTP port): bind JSON Schemas to
//! patterns of the caller's tenant, read them, list them, see their history and the
//! messages they refused, and delete them.
//!
//! A call is authorised as a publish to its own `$CANOPY.schema.<op>` subject, and
//! then for what it touches: a put or delete needs the rights to publish and to
//! subscribe to the whole pattern (a binding decides what its subjects' publishers
//! may send and where refused messages go), a custom dead-letter prefix the right to
//! publish under it, and reads show only the bindings and refused messages of
//! subjects the caller may subscribe to (the AsyncAPI document too). Guests never
//! change bindings. Changes are serialised per tenant, written to the store first and
//! made current in the registry after, so a publish never meets a binding a restart
//! would not find. A put's CPU-bound work (reading earlier versions, compiling, the
//! compatibility check) runs on a blocking thread, a few server-wide at once. This
//! module must never check a payload itself (that is the client core's, at publish
//! time), nor compile or compare schemas on a runtime worker.

use std::sync::Arc;

use canopy_subjects::{Pattern, validate_native_subject};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, ApiCall, ApiError, PREFIX, authorize, check_dead_letter, may_bind, parse};
use crate::broker::Broker;
use crate::schemas::patterns::MAX_TENANT_REGEX_BYTES;
use crate::schemas::registry::RecentError;
use crate::schemas::{
    Binding, DEFAULT_DEAD_LETTER, MAX_BINDINGS, MAX_SCHEMA_BYTES, MAX_TENANT_SCHEMA_BYTES,
    MAX_VERSIONS, Mode, OnInvalid, StoredVersion, compat,
};
use crate::store::{SchemaRecord, Store};
use crate::tenancy::{Action, Principal};

/// A new version of a binding.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Put {
    pub pattern: String,
    pub schema: Value,
    /// By default the binding's current mode (backward for a new binding).
    pub mode: Option<String>,
    /// By default the binding's current choice (reject for a new binding).
    pub on_invalid: Option<OnInvalid>,
    /// The dead-letter prefix, by default the binding's current (`$DLQ.schema`).
    pub dead_letter: Option<String>,
}

/// Which binding, or which version of it: by pattern, or the one a subject falls under.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Which {
    pub pattern: Option<String>,
    pub subject: Option<String>,
    pub version: Option<u64>,
}

/// Whose recent errors: every subject, a pattern's or one subject's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorsOf {
    pub pattern: Option<String>,
    pub subject: Option<String>,
}

pub(super) async fn dispatch(
    broker: &Arc<Broker>,
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
    let body = call.body_or_empty();
    let principal = &call.principal;
    let value = match call.operation.as_str() {
        "schema.put" => put(broker, store, principal, tenant, parse(&call.body)?).await?,
        "schema.get" => get(broker, store, principal, tenant, parse(body)?).await?,
        "schema.list" => list(broker, principal, tenant),
        "schema.history" => {
            let which: Which = parse(&call.body)?;
            let pattern = which
                .pattern
                .ok_or_else(|| ApiError::new(400, "history needs a `pattern`"))?;
            history(broker, store, principal, tenant, &pattern).await?
        }
        "schema.delete" => {
            let which: Which = parse(&call.body)?;
            let pattern = which
                .pattern
                .ok_or_else(|| ApiError::new(400, "delete needs a `pattern`"))?;
            delete(broker, store, principal, tenant, &pattern).await?
        }
        "schema.errors" => errors(broker, principal, tenant, parse(body)?)?,
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use schema.put, schema.get, schema.list, \
                     schema.history, schema.delete or schema.errors"
                ),
            ));
        }
    };
    answer.json(&value);
    Ok(())
}

/// Whose document: the caller's tenant, or (for the default tenant's users, who
/// administer tenants) another.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncApiOf {
    pub tenant: Option<String>,
}

/// The AsyncAPI 3.0 document of a tenant's bindings, with the operations the caller's
/// rules allow (every operation, for an administrator reading another tenant's).
/// A caller reading its own tenant's sees the bindings [`list`] shows it, no more:
/// a channel quotes its schema, regular expressions and dead-letter subject included.
pub fn asyncapi(
    broker: &Broker,
    principal: &crate::tenancy::Principal,
    of: AsyncApiOf,
) -> Result<Value, ApiError> {
    use crate::schemas::asyncapi::{Action as Operation, document};
    let own = &*principal.tenant;
    let tenant = of.tenant.as_deref().unwrap_or(own);
    if tenant != own {
        if own != crate::tenancy::DEFAULT_TENANT || principal.is_guest() {
            return Err(ApiError::new(
                403,
                "another tenant's document is for the default tenant's users",
            ));
        }
        if broker.tenant_records().get(tenant).is_none() {
            return Err(ApiError::new(404, format!("no tenant {tenant}")));
        }
    }
    let bindings = broker.tenant(tenant).schemas.current();
    let shown: Vec<Arc<Binding>> = bindings
        .all()
        .iter()
        .filter(|binding| tenant != own || may_read(broker, principal, binding))
        .cloned()
        .collect();
    let authz = broker.authorizer();
    Ok(document(
        tenant,
        &shown,
        broker.listeners(),
        |operation, pattern| {
            if tenant != own {
                return true;
            }
            let action = match operation {
                Operation::Send => Action::Publish,
                Operation::Receive => Action::Subscribe,
            };
            authz.authorize(principal, action, pattern).is_ok()
        },
    ))
}

fn parse_pattern(pattern: &str) -> Result<Pattern, ApiError> {
    Pattern::parse_native(pattern).map_err(|e| ApiError::new(400, format!("invalid pattern: {e}")))
}

fn stored_of(record: &SchemaRecord) -> Result<StoredVersion, ApiError> {
    serde_json::from_slice(&record.record).map_err(|e| {
        ApiError::new(
            500,
            format!(
                "version {} of {} cannot be read: {e}",
                record.version, record.pattern
            ),
        )
    })
}

/// A version as the API shows it.
fn version_json(pattern: &str, version: u64, stored: &StoredVersion) -> Value {
    let mut value = json!({
        "pattern": pattern,
        "version": version,
        "mode": stored.mode.as_str(),
        "on_invalid": stored.on_invalid.as_str(),
        "dead_letter": stored.dead_letter.as_deref().unwrap_or(DEFAULT_DEAD_LETTER),
        "time_ms": stored.time_ms,
    });
    match &stored.schema {
        Some(schema) => value["schema"] = schema.clone(),
        None => value["deleted"] = json!(true),
    }
    value
}

fn binding_json(binding: &Binding) -> Value {
    version_json(&binding.pattern, binding.version.into(), &binding.stored)
}

/// Puts a new version of a binding, held to its compatibility mode; an unchanged
/// schema with unchanged options answers the current version.
///
/// Reading the earlier versions, compiling the schema and the compatibility check
/// run on a blocking thread ([`off_the_runtime`]), within the bounds of
/// [`compat`]: past them the put is refused with 422, as too costly to check (409
/// stays for a version that breaks its mode).
pub async fn put(
    broker: &Broker,
    store: &Store,
    principal: &Principal,
    tenant: &str,
    request: Put,
) -> Result<Value, ApiError> {
    parse_pattern(&request.pattern)?;
    may_bind(broker, principal, "schema", &request.pattern)?;
    let size = serde_json::to_vec(&request.schema).map_or(0, |v| v.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::new(
            400,
            format!("the schema is {size} bytes of JSON; the limit is {MAX_SCHEMA_BYTES}"),
        ));
    }
    let mode = request
        .mode
        .as_deref()
        .map(|name| {
            Mode::named(name).ok_or_else(|| {
                ApiError::new(
                    400,
                    format!(
                        "no mode `{name}`: use none, backward, backward_transitive, forward, \
                         forward_transitive, full or full_transitive"
                    ),
                )
            })
        })
        .transpose()?;
    if let Some(prefix) = &request.dead_letter
        && prefix != DEFAULT_DEAD_LETTER
    {
        check_dead_letter(broker, principal, prefix)?;
    }
    let pattern = request.pattern.clone();
    // Held through the check, so a tenant has at most one put waiting for or holding
    // a checker: its puts queue behind each other, and another tenant's wait for
    // at most one of its checks.
    let owner = broker.tenant(tenant);
    // One tenant's changes never wait for another's store write.
    let _change = owner.schema_changes.lock().await;
    let versions = store.schema_versions(tenant, &pattern).await?;
    let now_ms = broker.clock().now_ms();
    let (binding, record) =
        match off_the_runtime(move || prepare(request, mode, size, versions, now_ms)).await? {
            Prepared::Unchanged(value) => return Ok(value),
            Prepared::New { binding, record } => (binding, record),
        };
    let schemas = &owner.schemas;
    let bindings = schemas.current();
    if bindings.get(&pattern).is_none() && bindings.len() >= MAX_BINDINGS {
        return Err(ApiError::new(
            429,
            format!("the tenant has {MAX_BINDINGS} schema bindings, the most it may have"),
        ));
    }
    let others = bindings.all().iter().filter(|b| b.pattern != pattern);
    let (bytes, regex) = others.fold((0, 0), |(bytes, regex), b| {
        (bytes + b.schema_bytes, regex + b.regex.bytes)
    });
    if bytes + binding.schema_bytes > MAX_TENANT_SCHEMA_BYTES {
        return Err(ApiError::new(
            429,
            format!(
                "the tenant's bound schemas would hold {} bytes of JSON; together they may \
                 hold {MAX_TENANT_SCHEMA_BYTES}",
                bytes + binding.schema_bytes
            ),
        ));
    }
    if regex + binding.regex.bytes > MAX_TENANT_REGEX_BYTES {
        return Err(ApiError::new(
            429,
            format!(
                "the regular expressions of the tenant's bound schemas would compile to {} \
                 bytes; together they may hold {MAX_TENANT_REGEX_BYTES}",
                regex + binding.regex.bytes
            ),
        ));
    }
    store
        .put_schema_version(tenant, &pattern, binding.version.into(), &record)
        .await?;
    let value = binding_json(&binding);
    schemas.set(bindings.with(Arc::from(binding)));
    broker.mirror_definitions(tenant).await;
    Ok(value)
}

/// Schema checks running at once, server-wide: half the cores (one to four), so
/// the runtime's own threads always have cores left for the traffic.
static CHECKERS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Arc::new(tokio::sync::Semaphore::new((cores / 2).clamp(1, 4)))
    });

/// Runs `work` (CPU-bound: parsing, compiling, comparing schemas) on a blocking
/// thread once one of the [`CHECKERS`] is free (waiting in turn, as the semaphore
/// is fair), so a runtime worker never does it. The permit goes with the work, so
/// a caller that gives up does not free a checker still busy.
pub(super) async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let permit = Arc::clone(&CHECKERS)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::new(503, "the schema checkers are closed"))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| ApiError::new(500, format!("the schema check failed: {e}")))?
}

/// What a put comes to once checked.
enum Prepared {
    /// The current version already is this one: answered as it is.
    Unchanged(Value),
    /// A new version, compiled (boxed: a validator is large), and its store record.
    New {
        binding: Box<Binding>,
        record: Vec<u8>,
    },
}

/// The CPU-bound part of a put (a blocking thread's): reads the stored `versions`
/// (oldest first) as far back as the mode compares, compiles the new schema and
/// checks it against them, within the bounds of [`compat`].
fn prepare(
    request: Put,
    mode: Option<Mode>,
    size: usize,
    versions: Vec<SchemaRecord>,
    now_ms: u64,
) -> Result<Prepared, ApiError> {
    let mut budget = compat::Budget::standard();
    let mut older = versions.iter().rev();
    let current = match older.next() {
        Some(record) => Some((record, stored_of(record)?)).filter(|(_, s)| s.schema.is_some()),
        None => None,
    };
    let new = StoredVersion {
        schema: Some(request.schema),
        mode: mode
            .or(current.as_ref().map(|(_, c)| c.mode))
            .unwrap_or_default(),
        on_invalid: request
            .on_invalid
            .or(current.as_ref().map(|(_, c)| c.on_invalid))
            .unwrap_or_default(),
        dead_letter: request
            .dead_letter
            .or_else(|| current.as_ref().and_then(|(_, c)| c.dead_letter.clone()))
            .filter(|prefix| prefix != DEFAULT_DEAD_LETTER),
        time_ms: now_ms,
    };
    if let Some((record, current)) = &current
        && current.schema == new.schema
        && current.mode == new.mode
        && current.on_invalid == new.on_invalid
        && current.dead_letter == new.dead_letter
    {
        let mut value = version_json(&request.pattern, record.version, current);
        value["unchanged"] = json!(true);
        return Ok(Prepared::Unchanged(value));
    }
    let version = versions.last().map_or(1, |r| r.version + 1);
    let Some(version) = u32::try_from(version).ok().filter(|v| *v <= MAX_VERSIONS) else {
        return Err(ApiError::new(
            409,
            format!(
                "{} has had {MAX_VERSIONS} versions (deletions count), the most one pattern may \
                 have, since a version number is never given twice",
                request.pattern
            ),
        ));
    };
    // Compiled first, so a schema that is not one is refused as such, not as a break.
    let binding = Binding::new(&request.pattern, version, new.clone())
        .map_err(|e| ApiError::new(400, e.to_string()))?;
    let too_costly = |why: String| {
        ApiError::new(
            422,
            format!(
                "version {version} of {} was not checked against its earlier versions under \
                 its {} compatibility: {why}. Use a mode that compares fewer versions (one \
                 that is not transitive), or delete the binding and bind it again to start \
                 a new lineage",
                request.pattern,
                new.mode.as_str()
            ),
        )
    };
    let earlier = earlier_versions(current, older, new.mode, size, &mut budget, &too_costly)?;
    let earlier: Vec<(u64, &Value)> = earlier.iter().map(|(n, s)| (*n, s)).collect();
    if let Some(schema) = &new.schema {
        compat::check_numbered(new.mode, &earlier, version.into(), schema, &mut budget).map_err(
            |error| match error {
                compat::CompatError::Breaks(breakage) => ApiError::new(
                    409,
                    format!(
                        "version {version} of {} breaks its {} compatibility: {breakage}",
                        request.pattern,
                        new.mode.as_str()
                    ),
                ),
                compat::CompatError::OverBudget(over) => too_costly(over.to_string()),
            },
        )?;
    }
    let record =
        serde_json::to_vec(&new).map_err(|e| ApiError::new(500, format!("schema record: {e}")))?;
    Ok(Prepared::New {
        binding: Box::new(binding),
        record,
    })
}

/// The earlier versions a new version in `mode` is compared with, oldest first: the
/// current one, and for a transitive mode each before it back to the last deletion,
/// each read only while what is compared stays within the bound. `older` goes back
/// from the version before the current one.
fn earlier_versions<'a>(
    current: Option<(&SchemaRecord, StoredVersion)>,
    older: impl Iterator<Item = &'a SchemaRecord>,
    mode: Mode,
    size: usize,
    budget: &mut compat::Budget,
    too_costly: &dyn Fn(String) -> ApiError,
) -> Result<Vec<(u64, Value)>, ApiError> {
    let directions = mode.directions();
    let mut earlier: Vec<(u64, Value)> = Vec::new();
    let mut compared = 0;
    if let Some((record, current)) = current
        && directions > 0
    {
        compared += (record.record.len() + size) * directions;
        earlier.extend(current.schema.map(|schema| (record.version, schema)));
        if mode.transitive() {
            for record in older {
                budget
                    .check_time()
                    .map_err(|over| too_costly(over.to_string()))?;
                let Some(schema) = stored_of(record)?.schema else {
                    break;
                };
                compared += (record.record.len() + size) * directions;
                if compared > compat::MAX_COMPARED_BYTES {
                    return Err(too_costly(format!(
                        "comparing it with the versions back to {} would compare more than \
                         {} bytes of schemas, the most one put may",
                        record.version,
                        compat::MAX_COMPARED_BYTES
                    )));
                }
                earlier.push((record.version, schema));
            }
        }
    }
    earlier.reverse();
    Ok(earlier)
}

/// One binding's current version (by pattern or by a subject it covers), or a given
/// version of it.
pub async fn get(
    broker: &Broker,
    store: &Store,
    principal: &Principal,
    tenant: &str,
    which: Which,
) -> Result<Value, ApiError> {
    let bindings = broker.tenant(tenant).schemas.current();
    let pattern = match (&which.pattern, &which.subject) {
        (Some(pattern), None) => {
            authorize(broker, principal, Action::Subscribe, pattern)?;
            pattern.clone()
        }
        (None, Some(subject)) => {
            validate_native_subject(subject, &Default::default())
                .map_err(|e| ApiError::new(400, format!("invalid subject: {e}")))?;
            authorize(broker, principal, Action::Subscribe, subject)?;
            match bindings.for_subject(subject) {
                Some(binding) if which.version.is_none() => return Ok(binding_json(binding)),
                Some(binding) => binding.pattern.clone(),
                None => {
                    return Err(ApiError::new(
                        404,
                        format!("no schema is bound to a pattern matching {subject}"),
                    ));
                }
            }
        }
        _ => return Err(ApiError::new(400, "name a `pattern` or a `subject`")),
    };
    match which.version {
        None => bindings
            .get(&pattern)
            .map(|binding| binding_json(binding))
            .ok_or_else(|| ApiError::new(404, format!("no schema is bound to {pattern}"))),
        Some(version) => {
            let record = store
                .schema_version(tenant, &pattern, version)
                .await?
                .ok_or_else(|| ApiError::new(404, format!("{pattern} has no version {version}")))?;
            Ok(version_json(&pattern, version, &stored_of(&record)?))
        }
    }
}

/// The tenant's bindings in force, without their schemas.
pub fn list(broker: &Broker, principal: &Principal, tenant: &str) -> Value {
    let bindings = broker.tenant(tenant).schemas.current();
    let all: Vec<Value> = bindings
        .all()
        .iter()
        .filter(|binding| may_read(broker, principal, binding))
        .map(|binding| {
            let mut value = binding_json(binding);
            if let Some(fields) = value.as_object_mut() {
                fields.remove("schema");
            }
            value
        })
        .collect();
    json!({ "schemas": all })
}

/// Whether `principal` may see `binding` in a list or a document: with the right to
/// subscribe to its whole pattern. [`list`] and [`asyncapi`] both ask this.
fn may_read(broker: &Broker, principal: &Principal, binding: &Binding) -> bool {
    authorize(broker, principal, Action::Subscribe, &binding.pattern).is_ok()
}

/// Every version of a binding, deletions included, oldest first.
pub async fn history(
    broker: &Broker,
    store: &Store,
    principal: &Principal,
    tenant: &str,
    pattern: &str,
) -> Result<Value, ApiError> {
    parse_pattern(pattern)?;
    authorize(broker, principal, Action::Subscribe, pattern)?;
    let versions = store.schema_versions(tenant, pattern).await?;
    if versions.is_empty() {
        return Err(ApiError::new(
            404,
            format!("no schema was ever bound to {pattern}"),
        ));
    }
    let all = versions
        .iter()
        .map(|record| Ok(version_json(pattern, record.version, &stored_of(record)?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(json!({"pattern": pattern, "versions": all}))
}

/// Unbinds a pattern: a version without a schema ends its lineage (numbers go on, so
/// a version named in a stored message is never given again).
pub async fn delete(
    broker: &Broker,
    store: &Store,
    principal: &Principal,
    tenant: &str,
    pattern: &str,
) -> Result<Value, ApiError> {
    parse_pattern(pattern)?;
    may_bind(broker, principal, "schema", pattern)?;
    let owner = broker.tenant(tenant);
    let _change = owner.schema_changes.lock().await;
    let schemas = &owner.schemas;
    let bindings = schemas.current();
    let Some(current) = bindings.get(pattern) else {
        return Err(ApiError::new(
            404,
            format!("no schema is bound to {pattern}"),
        ));
    };
    let versions = store.schema_versions(tenant, pattern).await?;
    let version = versions
        .last()
        .map_or(u64::from(current.version), |r| r.version)
        + 1;
    let gone = StoredVersion {
        schema: None,
        time_ms: broker.clock().now_ms(),
        ..current.stored.clone()
    };
    let record =
        serde_json::to_vec(&gone).map_err(|e| ApiError::new(500, format!("schema record: {e}")))?;
    store
        .put_schema_version(tenant, pattern, version, &record)
        .await?;
    schemas.set(bindings.without(pattern));
    broker.mirror_definitions(tenant).await;
    Ok(json!({"pattern": pattern, "deleted": true, "version": version}))
}

/// The messages schemas refused lately (the newest [`RECENT_ERRORS`] of the tenant),
/// with counts since the start.
///
/// [`RECENT_ERRORS`]: crate::schemas::registry::RECENT_ERRORS
pub fn errors(
    broker: &Broker,
    principal: &Principal,
    tenant: &str,
    of: ErrorsOf,
) -> Result<Value, ApiError> {
    let pattern = of.pattern.as_deref().map(parse_pattern).transpose()?;
    let schemas = Arc::clone(&broker.tenant(tenant).schemas);
    // An error quotes the refused payload: only for those who may read the subject.
    let kept = schemas.recent_errors(|subject| {
        authorize(broker, principal, Action::Subscribe, subject).is_ok()
            && of.subject.as_deref().is_none_or(|s| s == subject)
            && pattern.as_ref().is_none_or(|p| {
                canopy_subjects::Subject::parse_native(subject)
                    .is_ok_and(|subject| p.matches(&subject))
            })
    });
    let errors: Vec<Value> = kept.iter().map(error_json).collect();
    Ok(json!({
        "errors": errors,
        "refused": schemas.refused.load(std::sync::atomic::Ordering::Relaxed),
        "dead_lettered": schemas.dead_lettered.load(std::sync::atomic::Ordering::Relaxed),
    }))
}

fn error_json(error: &RecentError) -> Value {
    json!({
        "subject": error.subject,
        "schema": error.schema,
        "path": error.violation.path,
        "message": error.violation.message,
        "time_ms": error.time_ms,
        "dead_lettered": error.dead_lettered,
    })
}
