//! `$CANOPY.group.*`: create, list, show and delete the caller's tenant's consumer
//! groups.
//!
//! A call is authorised as a publish to its own `$CANOPY.group.<op>` subject, and
//! creating a group also as a subscription to its pattern, since the group reads
//! every subject it matches. Changes are serialised so two creates of one name cannot
//! both succeed. This module must never decide deliveries: that is `crate::groups`'.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{Answer, ApiCall, ApiError, PREFIX, authorize, parse};
use crate::broker::Broker;
use crate::broker::groups::{ACK_PREFIX, Handed, Pull, PullStyle, Reply, ReplyKind};
use crate::groups::awaiting::{Await, DEFAULT_AWAIT, MAX_AWAIT, Missed};
use crate::groups::{GroupSpec, StoredGroup as Stored};
use crate::store::{Store, now_ms};
use crate::tenancy::Action;

/// Serialises creates and deletes of groups.
pub(crate) static CHANGES: Mutex<()> = Mutex::const_new(());

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
            if let Some(prefix) = &spec.dead_letter {
                super::check_dead_letter(broker, &call.principal, prefix)?;
            }
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
            let body = group_json(&stored);
            if let Some(store) = broker.store() {
                broker.groups().start(broker, store, tenant, stored);
            }
            body
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
            info["live"] = broker
                .groups()
                .info(tenant, &name, true)
                .await
                .unwrap_or(Value::Null);
            info
        }
        "group.delete" => {
            let GroupRef { name } = parse(&call.body)?;
            let _change = CHANGES.lock().await;
            found(store, tenant, &name).await?;
            broker.groups().stop(tenant, &name);
            store.delete_group(tenant, &name).await?;
            json!({"name": name, "deleted": true})
        }
        "group.next" => {
            let next: Next = parse(&call.body)?;
            if !(1..=MAX_NEXT).contains(&next.max) {
                return Err(ApiError::new(400, format!("max is 1 to {MAX_NEXT}")));
            }
            let stored = found(store, tenant, &next.group).await?;
            authorize(
                broker,
                &call.principal,
                Action::Subscribe,
                &stored.spec.pattern,
            )?;
            let reply = call.reply.clone().unwrap_or_default();
            // A client's inbox prefix (`_INBOX.<id>` of `_INBOX.<id>.<n>`) is one
            // member; a reply subject of two tokens is its own.
            let member = next.member.unwrap_or_else(|| match reply.rsplit_once('.') {
                Some((inbox, _)) if inbox.contains('.') => inbox.to_owned(),
                _ => reply.clone(),
            });
            let pull = Pull {
                member,
                max: next.max,
                wait: Duration::from_millis(next.wait_ms).min(super::MAX_WAIT),
                reply,
                routes: Arc::clone(&call.routes),
                style: PullStyle::Canopy,
            };
            if !broker.groups().pull(tenant, &next.group, pull).await {
                return Err(ApiError::new(
                    503,
                    format!("group {} is not running", next.group),
                ));
            }
            // The group answers on the reply subject itself.
            return Ok(());
        }
        "group.wait" => {
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
            };
            // Answered from the wait's end, so a long wait holds no API slot.
            let Some(reply) = call.reply.clone() else {
                return Ok(());
            };
            let mut later = Answer::new(Arc::clone(broker), Arc::clone(&call.routes), reply);
            broker.groups().await_passing(
                tenant,
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
            return Ok(());
        }
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

/// An ack, nack, in-progress or term published to a delivery's reply subject
/// (`$CANOPY.group.ack.<group>.<version>.<attempt>.<subject>`), handed to its group.
/// With a reply subject it is confirmed once the group has taken it, and refused
/// with a status when it is not a delivery's ack, or its group is not running.
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
    match broker.groups().reply(&call.routes.name, group, reply) {
        Handed::Queued => {}
        Handed::NotRunning => refuse(404, &format!("group {group} is not running")),
        Handed::Busy => refuse(503, &format!("group {group} is too far behind; ack again")),
    }
}
