//! `$JS.API.` and `$JS.ACK.`: the part of JetStream's API that the streams and pull
//! consumers of async-nats and nats.py use, over Canopy's key streams and consumer
//! groups, so NATS users keep the clients they have.
//!
//! A declared stream is a named set of subject filters (`streams.rs`); the tenant's own
//! stream, named after it, holds every subject no declared stream holds and cannot be
//! changed. A consumer is a consumer group of the same name (`consumers.rs` maps one onto the other); `CONSUMER.MSG.NEXT` is a pull the
//! group answers itself, JetStream's way; `$JS.ACK.` subjects come back to the group by
//! the consumer sequence they carry. Answers and errors are JetStream's JSON
//! (`{"error": {"code", "err_code", "description"}}`), never Canopy's, since these
//! clients parse them. Every call about a consumer needs the right to read its group
//! (a subscription to its filter), as `$CANOPY.group.*` does; lists and counts show
//! only the consumers the caller may read, a page at a time. This module must never
//! decide deliveries (the groups do) or accept a push consumer it cannot serve.

mod consumers;
mod get;
mod push;
mod streams;
pub(crate) mod time;

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Answer, ApiCall};
use crate::broker::Broker;
use crate::broker::groups::jetstream::parse_ack;
use crate::broker::groups::{Handed, JetStreamReply, ReplyKind};
use crate::store::Store;
use crate::tenancy::Action;

/// Subjects of JetStream API calls.
pub use crate::publish::JS_API_PREFIX as API_PREFIX;

/// A refused JetStream call, as nats-server words it: an HTTP-style code, the
/// JetStream error code clients match on, and a sentence.
#[derive(Debug)]
pub(crate) struct JsError {
    code: u16,
    err_code: u32,
    description: String,
}

impl JsError {
    pub(crate) fn new(code: u16, err_code: u32, description: impl Into<String>) -> Self {
        Self {
            code,
            err_code,
            description: description.into(),
        }
    }

    fn bad_request(description: impl Into<String>) -> Self {
        Self::new(400, 10003, description)
    }

    fn stream_not_found() -> Self {
        Self::new(404, 10059, "stream not found")
    }

    fn consumer_not_found() -> Self {
        Self::new(404, 10014, "consumer not found")
    }

    /// A consumer whose group the caller may not read.
    fn unreadable(name: &str) -> Self {
        Self::new(403, 10003, crate::api::groups::unreadable(name))
    }

    /// How a JetStream client is told its tenant runs too many API calls: a pull gets
    /// a status (a JSON body there would be taken for a message), any other call
    /// JetStream's error JSON.
    pub(crate) fn answer_busy(operation: &str, answer: &mut Answer, description: &str) {
        let verb = operation.strip_prefix(API_PREFIX).unwrap_or(operation);
        if verb.starts_with("CONSUMER.MSG.NEXT.") {
            let block =
                crate::broker::groups::jetstream::status_block(409, "Exceeded MaxWaiting", None);
            answer.status(&block);
        } else {
            // 10023: JetStream's "insufficient resources".
            answer.json(&Self::new(429, 10023, description).to_json());
        }
    }

    fn to_json(&self) -> Value {
        json!({"error": {"code": self.code, "err_code": self.err_code, "description": self.description}})
    }
}

impl From<crate::store::StoreError> for JsError {
    fn from(error: crate::store::StoreError) -> Self {
        JsError::new(503, 10077, format!("the store failed: {error}"))
    }
}

/// Hands a `$JS.ACK.` publish to its group; ignored when it names no delivery (as
/// nats-server ignores acks it does not know). One from a caller who may not read the
/// group is dropped, and answered 403 when it asked for a confirmation.
pub(super) fn ack(broker: &Arc<Broker>, call: &ApiCall) {
    let Some(target) = parse_ack(&call.operation) else {
        return;
    };
    if target.stream != &*call.routes.name
        && call.routes.streams.current().get(target.stream).is_none()
    {
        return;
    }
    let Some(kind) = ReplyKind::parse(&call.body) else {
        return;
    };
    let reply = JetStreamReply {
        consumer_seq: target.consumer_seq,
        kind,
        confirm: call.reply.clone().map(|to| (to, Arc::clone(&call.routes))),
    };
    let may = |pattern: &str| crate::api::groups::may_read(broker, &call.principal, pattern);
    let handed = broker
        .groups()
        .jetstream_reply(&call.routes, target.consumer, may, reply);
    if handed == Handed::Denied
        && let Some(to) = call.reply.clone()
    {
        Answer::new(Arc::clone(broker), Arc::clone(&call.routes), to)
            .error(403, &crate::api::groups::unreadable(target.consumer));
    }
}

/// Answers one `$JS.API.` call.
pub(super) async fn dispatch(broker: &Arc<Broker>, call: &ApiCall, answer: &mut Answer) {
    let result = match broker.store_of(&call.routes.name) {
        Some(store) => call_api(broker, &store, call, answer).await,
        None => Err(JsError::new(
            503,
            10039,
            "JetStream not enabled: no store is configured",
        )),
    };
    match result {
        Ok(Some(body)) => answer.json(&body),
        Ok(None) => {}
        Err(error) => answer.json(&error.to_json()),
    }
}

/// Runs a call; `None` when the answer is sent some other way (a pull's messages).
async fn call_api(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<Option<Value>, JsError> {
    let tenant = &*call.routes.name;
    let operation = call.operation.strip_prefix(API_PREFIX).unwrap_or_default();
    let (verb, rest) = split_verb(operation);
    let body = match verb {
        "INFO" => account_info(broker, store, call).await?,
        "STREAM.NAMES" | "STREAM.LIST" => {
            streams::list(broker, store, call, verb == "STREAM.LIST").await?
        }
        "STREAM.INFO" => {
            let name = rest.split('.').next().unwrap_or_default();
            if name == tenant {
                let mut info = stream_info(broker, store, call).await?;
                info["type"] = json!("io.nats.jetstream.api.v1.stream_info_response");
                info
            } else {
                streams::info(broker, store, call, name)
                    .await?
                    .ok_or_else(JsError::stream_not_found)?
            }
        }
        "STREAM.MSG.GET" => {
            let stream = stream_named(broker, call, rest)?;
            get::msg_get(broker, store, call, &stream).await?
        }
        "DIRECT.GET" => {
            let name = rest.split('.').next().unwrap_or_default();
            let subject = rest.get(name.len() + 1..).filter(|s| !s.is_empty());
            match stream_named(broker, call, name) {
                Ok(stream) => get::direct_get(broker, store, call, answer, &stream, subject).await,
                // Nobody listens on a missing stream's direct subject.
                Err(_) => answer.status(canopy_protocols::native::no_responders_block()),
            }
            return Ok(None);
        }
        "STREAM.CREATE" | "STREAM.UPDATE" => {
            streams::create(broker, store, call, rest, verb == "STREAM.UPDATE").await?
        }
        "STREAM.DELETE" | "STREAM.PURGE" => {
            if rest == tenant {
                return Err(JsError::new(
                    400,
                    10052,
                    format!(
                        "stream {tenant} is the tenant's own, holding every subject no \
                         declared stream holds: it cannot be deleted or purged through \
                         JetStream (`canopy purge` purges subjects)"
                    ),
                ));
            }
            if verb == "STREAM.DELETE" {
                streams::delete(broker, store, call, rest).await?
            } else {
                streams::purge(broker, store, call, rest).await?
            }
        }
        "CONSUMER.CREATE" | "CONSUMER.DURABLE.CREATE" => {
            let (stream, name) = consumer_target(broker, call, rest, verb == "CONSUMER.CREATE")?;
            consumers::create(broker, store, call, &stream, name).await?
        }
        "CONSUMER.INFO" => {
            let (stream, name) = consumer_target(broker, call, rest, false)?;
            if let Some(pushed) = push::readable(broker, call, &stream, name)? {
                push::info(broker, &pushed)
            } else {
                consumers::readable(broker, store, call, &stream, name).await?;
                consumers::info(broker, store, call, &stream, name).await?
            }
        }
        "CONSUMER.DELETE" => {
            let (stream, name) = consumer_target(broker, call, rest, false)?;
            if push::readable(broker, call, &stream, name)?.is_some() {
                call.routes.pushes.stop(name);
                json!({"type": "io.nats.jetstream.api.v1.consumer_delete_response", "success": true})
            } else {
                consumers::delete(broker, store, call, &stream, name).await?
            }
        }
        "CONSUMER.NAMES" | "CONSUMER.LIST" => {
            let stream = stream_named(broker, call, rest)?;
            consumers::list(broker, store, call, &stream, verb == "CONSUMER.LIST").await?
        }
        "CONSUMER.MSG.NEXT" => {
            let (stream, name) = consumer_target(broker, call, rest, false)?;
            consumers::next(broker, store, call, answer, &stream, name).await;
            return Ok(None);
        }
        _ => {
            return Err(JsError::bad_request(format!(
                "Canopy does not offer $JS.API.{operation}: it serves JetStream's account, \
                 stream and pull consumer calls"
            )));
        }
    };
    Ok(Some(body))
}

/// Splits `STREAM.INFO.default` into the call (`STREAM.INFO`) and its arguments.
fn split_verb(operation: &str) -> (&str, &str) {
    const VERBS: [&str; 15] = [
        "STREAM.MSG.GET",
        "DIRECT.GET",
        "CONSUMER.DURABLE.CREATE",
        "CONSUMER.MSG.NEXT",
        "CONSUMER.CREATE",
        "CONSUMER.INFO",
        "CONSUMER.DELETE",
        "CONSUMER.NAMES",
        "CONSUMER.LIST",
        "STREAM.NAMES",
        "STREAM.LIST",
        "STREAM.INFO",
        "STREAM.CREATE",
        "STREAM.UPDATE",
        "STREAM.DELETE",
    ];
    for verb in VERBS.iter().chain(["STREAM.PURGE", "INFO"].iter()) {
        if let Some(rest) = operation.strip_prefix(verb) {
            if rest.is_empty() {
                return (verb, "");
            }
            if let Some(rest) = rest.strip_prefix('.') {
                return (verb, rest);
            }
        }
    }
    (operation, "")
}

/// The stream a call names: the tenant's own, or one it declared that the caller may
/// read (one it may not is not there for it).
fn stream_named(broker: &Broker, call: &ApiCall, rest: &str) -> Result<Stream, JsError> {
    let name = rest.split('.').next().unwrap_or_default();
    if name == &*call.routes.name {
        return Ok(Stream::Tenant(Arc::clone(&call.routes.name)));
    }
    call.routes
        .streams
        .current()
        .get(name)
        .filter(|declared| streams::may_read_stream(broker, call, declared))
        .map(|declared| Stream::Declared(Arc::clone(declared)))
        .ok_or_else(JsError::stream_not_found)
}

/// A stream consumers are called on.
pub(super) enum Stream {
    /// The tenant's own: every consumer of the tenant is on it.
    Tenant(Arc<str>),
    /// A declared one: the consumers whose filter it holds.
    Declared(Arc<crate::streams::Stream>),
}

impl Stream {
    pub(super) fn name(&self) -> &str {
        match self {
            Stream::Tenant(name) => name,
            Stream::Declared(stream) => &stream.name,
        }
    }

    /// Whether a consumer reading `pattern` is on this stream.
    pub(super) fn holds(&self, pattern: &str) -> bool {
        match self {
            Stream::Tenant(_) => true,
            Stream::Declared(stream) => stream.holds_filter(pattern),
        }
    }
}

/// A consumer create, once it holds its tenant's `group_changes`: the stream it was
/// called on is still declared (a stream's deletion takes that lock before it goes,
/// so a consumer is never made on a stream being deleted).
fn still_there(routes: &crate::broker::Tenant, stream: &Stream) -> Result<(), JsError> {
    let Stream::Declared(declared) = stream else {
        return Ok(());
    };
    let current = routes.streams.current();
    match current.get(&declared.name) {
        Some(now) if now.created_ms == declared.created_ms => Ok(()),
        _ => Err(JsError::stream_not_found()),
    }
}

/// The stream and consumer a consumer call names (`<stream>.<name>[.<filter>]`).
fn consumer_target<'a>(
    broker: &Broker,
    call: &ApiCall,
    rest: &'a str,
    creating: bool,
) -> Result<(Stream, &'a str), JsError> {
    let (stream, name) = consumer_parts(rest, creating)?;
    Ok((stream_named(broker, call, stream)?, name))
}

/// The stream and consumer names a consumer call's subject holds.
fn consumer_parts(rest: &str, creating: bool) -> Result<(&str, &str), JsError> {
    let stream = rest.split('.').next().unwrap_or_default();
    let name = rest
        .get(stream.len()..)
        .and_then(|r| r.strip_prefix('.'))
        .map(|r| r.split('.').next().unwrap_or_default())
        .unwrap_or_default();
    // A create without a name makes an ephemeral consumer (or takes the config's).
    if name.is_empty() && !creating {
        return Err(JsError::consumer_not_found());
    }
    Ok((stream, name))
}

async fn account_info(broker: &Broker, store: &Store, call: &ApiCall) -> Result<Value, JsError> {
    let tenant = &*call.routes.name;
    let usage = store.usage(tenant).await?;
    let consumers = consumers::readable_all(broker, store, call).await?.len();
    Ok(json!({
        "type": "io.nats.jetstream.api.v1.account_info_response",
        "memory": 0,
        "storage": usage.bytes,
        // async-nats needs them to read the answer (`create_key_value` asks first).
        "reserved_memory": 0,
        "reserved_storage": 0,
        "streams": 1 + streams::readable(broker, call).len(),
        "consumers": consumers,
        "limits": {
            "max_memory": -1, "max_storage": -1,
            "max_streams": 1 + crate::streams::MAX_STREAMS,
            "max_consumers": call.routes.quota.max_groups(),
            "max_ack_pending": -1, "memory_max_stream_bytes": -1,
            "storage_max_stream_bytes": -1, "max_bytes_required": false,
        },
        "api": {"total": 0, "errors": 0},
    }))
}

/// The tenant as a stream. Canopy keeps no count of a tenant's messages, so
/// `messages` and `last_seq` are the offsets handed out (purged and expired messages
/// included).
async fn stream_info(broker: &Broker, store: &Store, call: &ApiCall) -> Result<Value, JsError> {
    let tenant = &*call.routes.name;
    let usage = store.usage(tenant).await?;
    let last_seq = store.next_offset(tenant).await?.saturating_sub(1);
    let consumers = consumers::readable_all(broker, store, call).await?.len();
    let created = time::format(0);
    let now = time::format(broker.clock().now_ms());
    Ok(json!({
        "config": {
            "name": tenant,
            "subjects": [">"],
            "retention": "limits",
            "max_consumers": call.routes.quota.max_groups(),
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msgs_per_subject": -1,
            "max_msg_size": -1,
            "discard": "old",
            "storage": "file",
            "num_replicas": 1,
            "duplicate_window": 120_000_000_000u64,
            "sealed": false,
            "deny_delete": true,
            "deny_purge": true,
            "allow_rollup_hdrs": false,
            "allow_direct": false,
            "mirror_direct": false,
        },
        "created": created,
        "state": {
            "messages": last_seq,
            "bytes": usage.bytes,
            "first_seq": u64::from(last_seq > 0),
            "first_ts": created,
            "last_seq": last_seq,
            "last_ts": now,
            "num_subjects": usage.subjects,
            "consumer_count": consumers,
        },
        "ts": now,
    }))
}

/// A consumer config's description and metadata within nats-server's bounds (any
/// kind of consumer: what is echoed in its info is bounded).
fn check_sizes(config: &Value) -> Result<(), JsError> {
    use consumers::{MAX_DESCRIPTION, MAX_METADATA};
    if config
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .len()
        > MAX_DESCRIPTION
    {
        return Err(JsError::new(
            400,
            10107,
            format!("consumer description is too long, maximum allowed is {MAX_DESCRIPTION}"),
        ));
    }
    let metadata_bytes: usize = config
        .get("metadata")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum()
        })
        .unwrap_or(0);
    if metadata_bytes > MAX_METADATA {
        return Err(JsError::new(
            400,
            10135,
            format!("consumer metadata exceeds maximum size of {MAX_METADATA} bytes"),
        ));
    }
    Ok(())
}

/// Authorises a consumer call that reads `pattern` as a subscription to it.
fn authorize_reading(broker: &Broker, call: &ApiCall, pattern: &str) -> Result<(), JsError> {
    broker
        .authorizer()
        .authorize(&call.principal, Action::Subscribe, pattern)
        .map_err(|denied| JsError::new(403, 10003, denied.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_split_into_verb_and_arguments() {
        assert_eq!(split_verb("INFO"), ("INFO", ""));
        assert_eq!(
            split_verb("STREAM.INFO.default"),
            ("STREAM.INFO", "default")
        );
        assert_eq!(
            split_verb("CONSUMER.CREATE.default.billing.orders.>"),
            ("CONSUMER.CREATE", "default.billing.orders.>")
        );
        assert_eq!(
            split_verb("CONSUMER.DURABLE.CREATE.default.billing"),
            ("CONSUMER.DURABLE.CREATE", "default.billing")
        );
        assert_eq!(
            split_verb("CONSUMER.MSG.NEXT.default.billing"),
            ("CONSUMER.MSG.NEXT", "default.billing")
        );
        assert_eq!(split_verb("INFOX"), ("INFOX", ""));
    }

    #[test]
    fn consumer_calls_name_a_stream_and_a_consumer() {
        assert_eq!(
            consumer_parts("default.billing.orders.>", true).ok(),
            Some(("default", "billing"))
        );
        assert_eq!(
            consumer_parts("ORDERS.billing", false).ok(),
            Some(("ORDERS", "billing"))
        );
        assert_eq!(consumer_parts("default", true).ok(), Some(("default", "")));
        let missing = consumer_parts("default", false).unwrap_err();
        assert_eq!(missing.err_code, 10014);
    }
}
