//! JetStream's stream calls (`STREAM.CREATE`, `UPDATE`, `INFO`, `NAMES`, `LIST`,
//! `DELETE`, `PURGE`) over declared streams: named views of a tenant's subjects
//! (`crate::streams`), stored as one definition each. The tenant's own stream (named
//! after it, holding every subject no declared stream holds) is listed beside them and
//! cannot be changed.
//!
//! Rights: declaring, changing, deleting or purging a stream needs the right to
//! publish to each of its filters (a purge's right: a stream's limits and its deletion
//! drop messages) and to read them; a stream is shown only to callers who may read
//! each of its filters. Must never store a stream whose filters overlap another's, or
//! change the tenant's own stream.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{JsError, authorize_reading, time};
use crate::api::ApiCall;
use crate::api::groups::may_read;
use crate::broker::Broker;
use crate::store::Store;
use crate::streams::{MAX_STREAMS, Stream, StreamRefusal, normalise};
use crate::tenancy::Action;

/// Streams one `STREAM.LIST` page holds, names one `STREAM.NAMES` page holds
/// (nats-server's pages).
const LIST_PAGE: usize = 256;
const NAMES_PAGE: usize = 1_024;
/// Pages of 1,000 subject markers a stream's info reads for its state at most (its
/// counts stop there).
const STATE_PAGES: usize = 100;

impl From<StreamRefusal> for JsError {
    fn from(refusal: StreamRefusal) -> Self {
        JsError::new(refusal.code, refusal.err_code, refusal.description)
    }
}

/// `STREAM.CREATE` and `STREAM.UPDATE`: the same config again is a success (creates
/// are idempotent); another config under an existing name is refused on create.
pub(super) async fn create(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    name: &str,
    updating: bool,
) -> Result<Value, JsError> {
    let tenant = &call.routes;
    if broker.mesh().is_some() {
        return Err(JsError::new(
            500,
            10052,
            "streams are not shared across a cluster's nodes yet: declare streams on a \
             single-node server",
        ));
    }
    if name == &*tenant.name {
        return Err(JsError::new(
            400,
            10052,
            format!(
                "stream {name} is the tenant's own, holding every subject no declared \
                 stream holds: it cannot be created or changed"
            ),
        ));
    }
    let body: Value = if call.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&call.body)
            .map_err(|e| JsError::new(400, 10025, format!("invalid JSON: {e}")))?
    };
    let config = normalise(name, &body)?;
    let subjects: Vec<String> = config["subjects"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    for subject in &subjects {
        authorize_changing(broker, call, subject)?;
    }
    let _changing = tenant.stream_changes.lock().await;
    let current = tenant.streams.current();
    let existing = current.get(name).cloned();
    let kind = if updating {
        "stream_update_response"
    } else {
        "stream_create_response"
    };
    if let Some(existing) = &existing {
        // A stream the caller may not read is not there for it; one it may read but
        // not change stays as it is.
        if !may_read_stream(broker, call, existing) {
            return Err(JsError::stream_not_found());
        }
        for subject in &existing.subjects {
            authorize_changing(broker, call, subject)?;
        }
    }
    match (&existing, updating) {
        (Some(existing), false) if existing.config != config => {
            return Err(JsError::new(
                400,
                10058,
                "stream name already in use with a different configuration",
            ));
        }
        (Some(existing), _) if existing.config == config => {
            let mut info = info_of(broker, store, call, existing, kind).await?;
            if !updating {
                info["did_create"] = json!(true);
            }
            return Ok(info);
        }
        (None, true) => return Err(JsError::stream_not_found()),
        _ => {}
    }
    if existing.is_none() && current.list().len() >= MAX_STREAMS {
        return Err(JsError::new(
            400,
            10027,
            format!("maximum number of streams reached ({MAX_STREAMS})"),
        ));
    }
    if let Some(other) = current.overlapping(name, &subjects) {
        return Err(JsError::new(
            400,
            10065,
            format!("subjects overlap with an existing stream ({})", other.name),
        ));
    }
    let created_ms = existing
        .as_ref()
        .map_or_else(|| broker.clock().now_ms(), |s| s.created_ms);
    let stream = Arc::new(Stream::new(config, created_ms)?);
    let record =
        serde_json::to_vec(&stream.stored()).map_err(|e| JsError::bad_request(e.to_string()))?;
    store.put_stream(&tenant.name, name, &record).await?;
    tenant.streams.set(current.with(Arc::clone(&stream)));
    let mut info = info_of(broker, store, call, &stream, kind).await?;
    if !updating {
        info["did_create"] = json!(true);
    }
    Ok(info)
}

/// `STREAM.INFO` of a declared stream; `None` when no declared stream has the name.
pub(super) async fn info(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    name: &str,
) -> Result<Option<Value>, JsError> {
    let Some(stream) = call.routes.streams.current().get(name).cloned() else {
        return Ok(None);
    };
    if !may_read_stream(broker, call, &stream) {
        return Err(JsError::stream_not_found());
    }
    Ok(Some(
        info_of(broker, store, call, &stream, "stream_info_response").await?,
    ))
}

/// The declared streams the caller may read, in name order.
pub(super) fn readable(broker: &Broker, call: &ApiCall) -> Vec<Arc<Stream>> {
    call.routes
        .streams
        .current()
        .list()
        .iter()
        .filter(|s| may_read_stream(broker, call, s))
        .cloned()
        .collect()
}

/// `STREAM.NAMES` (with `subject`: the streams that hold it) and `STREAM.LIST`, a page
/// from the request's `offset`, the tenant's own stream among them, in name order.
pub(super) async fn list(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    whole: bool,
) -> Result<Value, JsError> {
    let request: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
    let offset = request
        .get("offset")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    let subject = request
        .get("subject")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && *s != ">");
    let declared = readable(broker, call);
    let holds = |subjects: &[String]| {
        subject.is_none_or(|wanted| {
            subjects
                .iter()
                .any(|s| crate::streams::filters::overlap(wanted, s))
        })
    };
    // The tenant's own stream holds what no declared stream does.
    let own = subject.is_none_or(|wanted| {
        declared.iter().all(|s| {
            !s.subjects
                .iter()
                .any(|f| crate::streams::filters::within(wanted, f))
        })
    });
    let mut names: Vec<Option<&Arc<Stream>>> = declared
        .iter()
        .filter(|s| holds(&s.subjects))
        .map(Some)
        .collect();
    if own {
        names.push(None);
    }
    // In name order, as nats-server lists them.
    names.sort_by(|a, b| {
        let name = |s: &Option<&Arc<Stream>>| {
            s.map_or_else(|| call.routes.name.to_string(), |s| s.name.to_string())
        };
        name(a).cmp(&name(b))
    });
    let total = names.len();
    let page = if whole { LIST_PAGE } else { NAMES_PAGE };
    let shown = names.into_iter().skip(offset).take(page);
    if !whole {
        let streams: Vec<&str> = shown
            .map(|s| s.map_or(&*call.routes.name, |s| &*s.name))
            .collect();
        // nats-server answers an empty page with null, not [].
        let streams = if streams.is_empty() {
            Value::Null
        } else {
            json!(streams)
        };
        return Ok(json!({
            "type": "io.nats.jetstream.api.v1.stream_names_response",
            "total": total, "offset": offset, "limit": page, "streams": streams,
        }));
    }
    let mut streams = Vec::new();
    for stream in shown {
        streams.push(match stream {
            None => super::stream_info(broker, store, call).await?,
            Some(stream) => info_of(broker, store, call, stream, "stream_info_response").await?,
        });
    }
    Ok(json!({
        "type": "io.nats.jetstream.api.v1.stream_list_response",
        "total": total, "offset": offset, "limit": page, "streams": streams,
    }))
}

/// `STREAM.DELETE`: the stream's definition, then, as in NATS, its messages.
pub(super) async fn delete(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    name: &str,
) -> Result<Value, JsError> {
    let tenant = &call.routes;
    let _changing = tenant.stream_changes.lock().await;
    let current = tenant.streams.current();
    let stream = current
        .get(name)
        .filter(|stream| may_read_stream(broker, call, stream))
        .cloned()
        .ok_or_else(JsError::stream_not_found)?;
    for subject in &stream.subjects {
        authorize_changing(broker, call, subject)?;
    }
    // As in NATS, what the stream acked before it went goes with it: its messages are
    // purged while it still holds its subjects, and only then do they fall back to the
    // tenant's own stream (whose acks must hold).
    purge_subjects(store, &tenant.name, &stream.subjects).await?;
    // No consumer may be made on it from here until it is gone.
    let _consumers = tenant.group_changes.lock().await;
    super::consumers::delete_within(broker, store, call, &stream).await?;
    store.delete_stream(&tenant.name, name).await?;
    tenant.streams.set(tenant.streams.current().without(name));
    Ok(json!({"type": "io.nats.jetstream.api.v1.stream_delete_response", "success": true}))
}

/// `STREAM.PURGE` of a declared stream: every message of its subjects, or of those a
/// `filter` in the request holds. Keeping some (`keep`, `seq`) is refused.
pub(super) async fn purge(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    name: &str,
) -> Result<Value, JsError> {
    let stream = call
        .routes
        .streams
        .current()
        .get(name)
        .filter(|stream| may_read_stream(broker, call, stream))
        .cloned()
        .ok_or_else(JsError::stream_not_found)?;
    let request: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
    if request.get("keep").and_then(Value::as_u64).unwrap_or(0) > 0
        || request.get("seq").and_then(Value::as_u64).unwrap_or(0) > 0
    {
        return Err(JsError::bad_request(
            "a purge that keeps messages (keep, seq) is not offered: purge a filter, or set \
             max_msgs_per_subject",
        ));
    }
    let subjects = match request.get("filter").and_then(Value::as_str) {
        Some(filter) if !filter.is_empty() => {
            if !stream.holds_filter(filter) {
                return Err(JsError::bad_request(format!(
                    "filter {filter} is not within stream {name}'s subjects"
                )));
            }
            vec![filter.to_owned()]
        }
        _ => stream.subjects.clone(),
    };
    for subject in &subjects {
        authorize_changing(broker, call, subject)?;
    }
    if stream.config["deny_purge"] == json!(true) {
        return Err(JsError::new(400, 10083, "stream does not allow purges"));
    }
    let purged = purge_subjects(store, &call.routes.name, &subjects).await?;
    Ok(json!({
        "type": "io.nats.jetstream.api.v1.stream_purge_response",
        "success": true, "purged": purged,
    }))
}

async fn purge_subjects(store: &Store, tenant: &str, subjects: &[String]) -> Result<u64, JsError> {
    let mut purged = 0;
    for subject in subjects {
        let pattern = canopy_subjects::Pattern::parse_native(subject)
            .map_err(|e| JsError::bad_request(e.to_string()))?;
        purged += store.purge_pattern(tenant, &pattern).await?.messages;
    }
    Ok(purged)
}

/// A declared stream's info. Its state is read from its subjects' heads: `messages`
/// counts the versions given (purged ones included, as the tenant's stream counts
/// offsets), `last_seq` is the newest offset among them.
async fn info_of(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    kind: &str,
) -> Result<Value, JsError> {
    let (mut messages, mut last_seq, mut last_ms, mut subjects) = (0u64, 0u64, 0u64, 0usize);
    // Pages read, whatever they held (purged subjects keep markers but no head).
    let mut pages = 0;
    for filter in &stream.subjects {
        let Ok(pattern) = canopy_subjects::Pattern::parse_native(filter) else {
            continue;
        };
        let mut after: Option<String> = None;
        while pages < STATE_PAGES {
            pages += 1;
            let page = store
                .subjects(&call.routes.name, &pattern, after.as_deref(), 1_000)
                .await?;
            for head in &page.subjects {
                messages += head.version;
                last_seq = last_seq.max(head.offset);
                last_ms = last_ms.max(head.time_ms);
            }
            subjects += page.subjects.len();
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    let consumers = super::consumers::readable_all(broker, store, call)
        .await?
        .iter()
        .filter(|group| stream.holds_filter(&group.spec.pattern))
        .count();
    let now = time::format(broker.clock().now_ms());
    Ok(json!({
        "type": format!("io.nats.jetstream.api.v1.{kind}"),
        "config": stream.config,
        "created": time::format(stream.created_ms),
        "state": {
            "messages": messages,
            "bytes": 0,
            "first_seq": u64::from(messages > 0),
            "first_ts": time::format(0),
            "last_seq": last_seq,
            "last_ts": time::format(last_ms),
            "num_subjects": subjects,
            "consumer_count": consumers,
        },
        "ts": now,
    }))
}

pub(super) fn may_read_stream(broker: &Broker, call: &ApiCall, stream: &Stream) -> bool {
    stream
        .subjects
        .iter()
        .all(|s| may_read(broker, &call.principal, s))
}

/// Changing what a stream holds or keeps needs a purge's right (publishing) on each
/// of its filters, and reading them.
fn authorize_changing(broker: &Broker, call: &ApiCall, subject: &str) -> Result<(), JsError> {
    authorize_reading(broker, call, subject)?;
    broker
        .authorizer()
        .authorize(&call.principal, Action::Publish, subject)
        .map_err(|denied| JsError::new(403, 10003, denied.to_string()))?;
    Ok(())
}
