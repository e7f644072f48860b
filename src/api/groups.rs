//! `$CANOPY.group.*`: create, list, show and delete the caller's tenant's consumer
//! groups, pull from them, ack their deliveries and wait for them.
//!
//! A call is authorised as a publish to its own `$CANOPY.group.<op>` subject. Every
//! call about a group also needs the right to read it, a subscription to its pattern,
//! since the group reads every subject it matches: creating it, pulling, acking,
//! showing, deleting and waiting; a list shows only the groups the caller may read,
//! and a wait answers for any other as for a group that does not exist. Creates and
//! deletes are serialised per tenant, so two creates of one name cannot both succeed
//! and a tenant's count of groups holds. This module must never decide deliveries:
//! that is `crate::groups`'.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, ApiCall, ApiError, PREFIX, authorize, parse};
use crate::broker::groups::{ACK_PREFIX, Handed, Pull, PullStyle, Reply, ReplyKind};
use crate::broker::{Broker, Tenant};
use crate::groups::awaiting::{Await, Caller, DEFAULT_AWAIT, MAX_AWAIT, Missed};
use crate::groups::{GroupSpec, StoredGroup as Stored, check_member};
use crate::store::Store;
use crate::tenancy::{Action, Principal};

/// The tenant's limit on groups when `routes`' tenant keeps as many as it may (read
/// under its `Tenant::group_changes` lock, so two creates cannot both take the last place).
pub(crate) async fn groups_full(
    store: &Store,
    routes: &Tenant,
) -> Result<Option<u64>, crate::store::StoreError> {
    let limit = routes.quota.max_groups();
    let kept = store.groups(&routes.name).await?.len();
    Ok((u64::try_from(kept).unwrap_or(u64::MAX) >= limit).then_some(limit))
}

/// Whether `principal` may read a group over `pattern`: subscribe to it.
pub(crate) fn may_read(broker: &Broker, principal: &Principal, pattern: &str) -> bool {
    broker
        .authorizer()
        .authorize(principal, Action::Subscribe, pattern)
        .is_ok()
}

/// The refusal of a call about a group the caller may not read. It names the group,
/// not its pattern, which is part of what the caller may not read.
pub(crate) fn unreadable(name: &str) -> String {
    format!(
        "Permissions Violation for Subscription to group {name}: it reads subjects you may \
         not subscribe to"
    )
}

/// Most groups one `group.list` answer holds (and JetStream's `CONSUMER.LIST`, as
/// nats-server pages it); fewer when they would not fit the largest answer.
pub const LIST_PAGE: usize = 256;
/// Bytes kept free in an answer for what surrounds a page's entries.
const PAGE_ENVELOPE: usize = 512;

/// The entries of a page from `offset`: at most `limit`, and no more than fit an
/// answer of `max_answer` bytes (at least one, so a client paging by what it got
/// always moves on).
pub(crate) fn page(
    entries: impl Iterator<Item = Value>,
    offset: usize,
    limit: usize,
    max_answer: usize,
) -> Vec<Value> {
    let budget = max_answer.saturating_sub(PAGE_ENVELOPE);
    let mut used = 0;
    let mut page = Vec::new();
    for entry in entries.skip(offset).take(limit) {
        // Serialised once more when answered; the length is the cost of a bound.
        let size = entry.to_string().len() + 1;
        if !page.is_empty() && used + size > budget {
            break;
        }
        used += size;
        page.push(entry);
    }
    page
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ListRequest {
    /// Where the page starts, in the list of groups the caller may read.
    #[serde(default)]
    offset: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupRef {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Next {
    group: String,
    /// Messages at most in this answer.
    #[serde(default = "one")]
    max: usize,
    /// How long to wait for a first message when none is ready.
    #[serde(default)]
    wait_ms: u64,
    /// Who is consuming; by default the caller's reply inbox prefix.
    member: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wait {
    group: String,
    subject: String,
    version: u64,
    /// How long to wait (the default and the cap are a publish's `Canopy-Await`'s).
    timeout_ms: Option<u64>,
}

fn one() -> usize {
    1
}

/// Most messages one `group.next` answer carries.
pub const MAX_NEXT: usize = 1_000;

pub(super) async fn dispatch(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    // The caller's right to `$CANOPY.<op>` was checked by the publish decision, the
    // one door every call comes in by; what each operation reads is checked below.
    let body = match call.operation.as_str() {
        "group.create" => create(broker, store, call).await?,
        "group.list" => list(broker, store, call).await?,
        "group.info" => info(broker, store, call, answer).await?,
        "group.delete" => delete(broker, store, call).await?,
        // These two are answered later: by the group, or when the wait ends.
        "group.next" => return next(broker, store, call).await,
        "group.wait" => return wait(broker, call),
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use group.create, group.list, group.info, \
                     group.delete, group.next or group.wait"
                ),
            ));
        }
    };
    answer.json(&body);
    Ok(())
}

/// `group.create`: a new group, stored, then started.
async fn create(broker: &Arc<Broker>, store: &Store, call: &ApiCall) -> Result<Value, ApiError> {
    let tenant = &*call.routes.name;
    let spec: GroupSpec = parse(&call.body)?;
    spec.check()
        .map_err(|e| ApiError::new(400, e.to_string()))?;
    authorize(broker, &call.principal, Action::Subscribe, &spec.pattern)?;
    if let Some(prefix) = &spec.dead_letter {
        super::check_dead_letter(broker, &call.principal, prefix)?;
    }
    let _change = call.routes.group_changes.lock().await;
    // A JetStream ordered consumer's name is taken too: one consumer per name.
    if store.group(tenant, &spec.name).await?.is_some()
        || call.routes.pushes.get(&spec.name).is_some()
    {
        return Err(ApiError::new(
            409,
            format!("a group {} exists already", spec.name),
        ));
    }
    if let Some(limit) = groups_full(store, &call.routes).await? {
        return Err(ApiError::new(
            429,
            format!(
                "tenant {tenant} keeps at most {limit} groups (JetStream consumers \
                     included): delete one first"
            ),
        ));
    }
    let stored = Stored {
        spec,
        created_ms: broker.clock().now_ms(),
        push: None,
    };
    let record = serde_json::to_vec(&stored)
        .map_err(|e| ApiError::new(500, format!("group record: {e}")))?;
    store
        .create_group(tenant, &stored.spec.name, &record)
        .await?;
    let body = group_json(&stored);
    if let Some(store) = broker.store_of(&call.routes.name) {
        broker.groups().start(broker, &store, &call.routes, stored);
    }
    Ok(body)
}

/// `group.list`: a page of the groups the caller may read.
async fn list(broker: &Arc<Broker>, store: &Store, call: &ApiCall) -> Result<Value, ApiError> {
    let tenant = &*call.routes.name;
    let request: ListRequest = if call.body.iter().all(u8::is_ascii_whitespace) {
        ListRequest::default()
    } else {
        parse(&call.body)?
    };
    let readable: Vec<Stored> = store
        .groups(tenant)
        .await?
        .iter()
        .filter_map(|record| serde_json::from_slice::<Stored>(record).ok())
        .filter(|stored| may_read(broker, &call.principal, &stored.spec.pattern))
        .collect();
    let groups = page(
        readable.iter().map(group_json),
        request.offset,
        LIST_PAGE,
        broker.max_answer(),
    );
    Ok(json!({
        "groups": groups, "total": readable.len(), "offset": request.offset,
        "limit": LIST_PAGE,
    }))
}

/// `group.info`: a group's definition, its subjects and its live counts.
async fn info(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<Value, ApiError> {
    let tenant = &*call.routes.name;
    let GroupRef { name } = parse(&call.body)?;
    let stored = readable(broker, store, call, &name).await?;
    let cursors = store.cursors(tenant, &name).await?;
    let mut info = group_json(&stored);
    info["subjects"] = json!(cursors.len());
    // The group's task answers between its own work: no working place is
    // held meanwhile.
    info["live"] = answer
        .park(broker.groups().info(&call.routes, &name, true))
        .await
        .unwrap_or(Value::Null);
    Ok(info)
}

/// `group.delete`: the group stopped, then deleted with its cursors.
async fn delete(broker: &Arc<Broker>, store: &Store, call: &ApiCall) -> Result<Value, ApiError> {
    let tenant = &*call.routes.name;
    let GroupRef { name } = parse(&call.body)?;
    let _change = call.routes.group_changes.lock().await;
    readable(broker, store, call, &name).await?;
    broker.groups().stop(&call.routes, &name);
    // A JetStream push consumer's pump goes with its group.
    call.routes.pushes.stop(&name);
    store.delete_group(tenant, &name).await?;
    Ok(json!({"name": name, "deleted": true}))
}

/// `group.next`: a pull, handed to the group, which answers it.
async fn next(broker: &Arc<Broker>, store: &Store, call: &ApiCall) -> Result<(), ApiError> {
    let next: Next = parse(&call.body)?;
    if !(1..=MAX_NEXT).contains(&next.max) {
        return Err(ApiError::new(400, format!("max is 1 to {MAX_NEXT}")));
    }
    readable(broker, store, call, &next.group).await?;
    let reply = call.reply.clone().unwrap_or_default();
    // A client's inbox prefix (`_INBOX.<id>` of `_INBOX.<id>.<n>`) is one
    // member; a reply subject of two tokens is its own.
    let member = next.member.unwrap_or_else(|| match reply.rsplit_once('.') {
        Some((inbox, _)) if inbox.contains('.') => inbox.to_owned(),
        _ => reply.clone(),
    });
    check_member(&member).map_err(|why| ApiError::new(400, why))?;
    let wait = Duration::from_millis(next.wait_ms).min(super::MAX_WAIT);
    // A pull that may wait holds a place among its connection's.
    let place = if wait.is_zero() {
        None
    } else {
        Some(broker.groups().pull_place(call.origin).ok_or_else(|| {
            ApiError::new(
                429,
                format!(
                    "this connection has {} pulls waiting already; wait for their \
                         answers, or pull without waiting",
                    crate::broker::groups::CONNECTION_PULLS
                ),
            )
        })?)
    };
    let pull = Pull {
        member,
        max: next.max,
        wait,
        reply,
        routes: Arc::clone(&call.routes),
        style: PullStyle::Canopy,
        place,
    };
    if !broker.groups().pull(&call.routes, &next.group, pull).await {
        return Err(ApiError::new(
            503,
            format!("group {} is not running", next.group),
        ));
    }
    // The group answers on the reply subject itself.
    Ok(())
}

/// `group.wait`: answered once the group passes a version, or the wait ends.
fn wait(broker: &Arc<Broker>, call: &ApiCall) -> Result<(), ApiError> {
    let wait: Wait = parse(&call.body)?;
    canopy_subjects::validate_native_subject(&wait.subject, &Default::default())
        .map_err(|e| ApiError::new(400, format!("invalid subject: {e}")))?;
    authorize(broker, &call.principal, Action::Subscribe, &wait.subject)?;
    let timeout = match wait.timeout_ms {
        None => DEFAULT_AWAIT,
        Some(0) => return Err(ApiError::new(400, "timeout_ms is at least 1")),
        Some(ms) => Duration::from_millis(ms).min(MAX_AWAIT),
    };
    let awaiting = Await {
        groups: vec![wait.group.as_str().into()],
        timeout,
        // A group the caller may not read is answered as one that does not
        // exist.
        caller: Some(Caller::new(
            call.principal.clone(),
            Arc::clone(broker.authorizer()),
            call.origin,
        )),
    };
    // Answered from the wait's end, so a long wait holds no API slot.
    let Some(reply) = call.reply.clone() else {
        return Ok(());
    };
    let mut later = Answer::new(Arc::clone(broker), Arc::clone(&call.routes), reply);
    broker.groups().await_passing(
        &call.routes,
        Arc::from(wait.subject.as_str()),
        wait.version,
        &awaiting,
        move |outcome| match outcome.pending.first() {
            None => later.json(&json!({
                "group": wait.group, "subject": wait.subject,
                "version": wait.version, "passed": true,
            })),
            Some((_, why)) => {
                let code = match why {
                    Missed::TimedOut => 408,
                    Missed::NoSuchGroup => 404,
                    Missed::TooManyWaiting => 429,
                    _ => 409,
                };
                let description = format!(
                    "group {} has not passed version {} of {}: {}",
                    wait.group,
                    wait.version,
                    wait.subject,
                    why.as_str()
                );
                later.error(code, &description);
            }
        },
    );
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

/// The group `name`, when the caller may read it (403 otherwise).
async fn readable(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    name: &str,
) -> Result<Stored, ApiError> {
    let stored = found(store, &call.routes.name, name).await?;
    if !may_read(broker, &call.principal, &stored.spec.pattern) {
        return Err(ApiError::new(403, unreadable(name)));
    }
    Ok(stored)
}

/// An ack, nack, in-progress or term published to a delivery's reply subject
/// (`$CANOPY.group.ack.<group>.<version>.<attempt>.<subject>`), handed to its group.
/// With a reply subject it is confirmed once the group has taken it, and refused
/// with a status when it is not a delivery's ack, its group is not running, or the
/// caller may not read the group (without one, a refused ack is dropped). The right
/// is checked against the running group, so an ack costs no store read.
pub(super) fn reply(broker: &Arc<Broker>, call: &ApiCall) {
    // Told only to a member that asked for a confirmation: a plain ack has no answer.
    let refuse = |code: u16, description: &str| {
        if let Some(to) = call.reply.clone() {
            Answer::new(Arc::clone(broker), Arc::clone(&call.routes), to).error(code, description);
        }
    };
    let Some(rest) = ACK_PREFIX
        .strip_prefix(PREFIX)
        .and_then(|op| call.operation.strip_prefix(op))
    else {
        return;
    };
    let mut tokens = rest.splitn(4, '.');
    let (Some(group), Some(version), Some(attempt), Some(subject)) =
        (tokens.next(), tokens.next(), tokens.next(), tokens.next())
    else {
        refuse(400, "not a delivery's ack subject");
        return;
    };
    let (Ok(version), Ok(attempt)) = (version.parse(), attempt.parse()) else {
        refuse(400, "not a delivery's ack subject");
        return;
    };
    let Some(kind) = ReplyKind::parse(&call.body) else {
        refuse(
            400,
            "an ack says +ACK (or nothing), -NAK, -NAK {\"delay\":<ns>}, +WPI or +TERM",
        );
        return;
    };
    let reply = Reply {
        subject: Arc::from(subject),
        version,
        attempt,
        kind,
        confirm: call.reply.clone().map(|to| (to, Arc::clone(&call.routes))),
    };
    let may = |pattern: &str| may_read(broker, &call.principal, pattern);
    match broker.groups().reply(&call.routes, group, may, reply) {
        Handed::Queued => {}
        Handed::NotRunning => refuse(404, &format!("group {group} is not running")),
        Handed::Busy => refuse(503, &format!("group {group} is too far behind; ack again")),
        Handed::Denied => refuse(403, &unreadable(group)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_stops_at_its_limit_or_its_bytes_and_always_moves_on() {
        let entries = || (0..10).map(|n| json!({"name": format!("g{n}")}));
        let names = |page: Vec<Value>| -> Vec<String> {
            page.iter()
                .map(|v| v["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        };
        assert_eq!(names(page(entries(), 8, 5, 1 << 20)), ["g8", "g9"]);
        assert_eq!(page(entries(), 0, 4, 1 << 20).len(), 4);
        // Each entry is 15 bytes as JSON; 40 bytes past the envelope hold two.
        assert_eq!(page(entries(), 0, 10, PAGE_ENVELOPE + 40).len(), 2);
        assert_eq!(page(entries(), 3, 10, 0).len(), 1, "one, however small");
    }
}
