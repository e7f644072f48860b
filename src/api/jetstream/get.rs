//! `STREAM.MSG.GET` and `DIRECT.GET`: one stored message of a stream, the last of a
//! subject (`last_by_subj`, or the subject in a direct get's name; with wildcards, the
//! newest of the subjects it matches), the one at a
//! sequence (`seq`, the tenant's offset), or the first of a subject from a sequence
//! on (`seq` with `next_by_subj`). What KV clients read a key with.
//!
//! `MSG.GET` answers JSON (`message` with base64 `hdrs` and `data`, or 404/10037);
//! `DIRECT.GET` answers the message itself with `Nats-Stream`, `Nats-Subject`,
//! `Nats-Sequence` and `Nats-Time-Stamp` headers, or a `404 Message Not Found`
//! status, and only on streams that allow it (else nobody answers, as nats-server).
//! Reading needs the right to subscribe to the message's subject; a message the
//! caller may not read is not found, nor one older than the stream's `max_age` (a KV
//! bucket's TTL: retention removes it at its next pass). Must never return a message
//! outside the stream.

use base64::Engine;
use bytes::BytesMut;
use canopy_protocols::native::{HeaderMap, no_responders_block};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{JsError, Stream, time};
use crate::api::groups::may_read;
use crate::api::{Answer, ApiCall};
use crate::broker::Broker;
use crate::broker::groups::jetstream::status_block;
use crate::store::{ReplayFrom, Store, StoredMessage};

/// What a get asks for.
#[derive(Debug, Default, Deserialize)]
struct GetRequest {
    seq: Option<u64>,
    last_by_subj: Option<String>,
    next_by_subj: Option<String>,
}

fn parse(body: &[u8]) -> Result<GetRequest, JsError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(GetRequest::default());
    }
    serde_json::from_slice(body).map_err(|e| JsError::new(400, 10025, format!("invalid JSON: {e}")))
}

/// `STREAM.MSG.GET.<stream>`.
pub(super) async fn msg_get(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
) -> Result<Value, JsError> {
    let request = parse(&call.body)?;
    if request.seq.is_none() && request.last_by_subj.is_none() {
        return Err(JsError::bad_request("a get names a seq or a last_by_subj"));
    }
    let message = find(broker, store, call, stream, &request)
        .await?
        .ok_or_else(|| JsError::new(404, 10037, "no message found"))?;
    let base64 = base64::engine::general_purpose::STANDARD;
    let mut found = json!({
        "subject": message.subject,
        "seq": message.offset,
        "time": time::format(message.time_ms),
    });
    if !message.headers.is_empty() {
        found["hdrs"] = json!(base64.encode(&message.headers));
    }
    if !message.payload.is_empty() {
        found["data"] = json!(base64.encode(&message.payload));
    }
    Ok(json!({"type": "io.nats.jetstream.api.v1.stream_msg_get_response", "message": found}))
}

/// `DIRECT.GET.<stream>[.<subject>]`, answered with the message itself.
pub(super) async fn direct_get(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
    stream: &Stream,
    subject: Option<&str>,
) {
    let direct = match stream {
        Stream::Declared(declared) => declared.config["allow_direct"] == json!(true),
        Stream::Tenant(_) => false,
    };
    if !direct {
        // nats-server has nobody listening on a stream's direct subject without it.
        answer.status(no_responders_block());
        return;
    }
    let request = match (subject, parse(&call.body)) {
        (Some(subject), _) => GetRequest {
            last_by_subj: Some(subject.to_owned()),
            ..GetRequest::default()
        },
        (None, Ok(request))
            if request.seq.is_some_and(|seq| seq > 0) || request.last_by_subj.is_some() =>
        {
            request
        }
        (None, Ok(_)) => {
            answer.status(&status_block(408, "Empty Request", None));
            return;
        }
        (None, Err(error)) => {
            answer.status(&status_block(400, &error.description, None));
            return;
        }
    };
    match find(broker, store, call, stream, &request).await {
        Ok(Some(message)) => {
            let mut headers = HeaderMap::parse(&message.headers).unwrap_or_default();
            headers.insert("Nats-Stream", stream.name().to_owned());
            headers.insert("Nats-Subject", message.subject.clone());
            headers.insert("Nats-Sequence", message.offset.to_string());
            headers.insert("Nats-Time-Stamp", time::format(message.time_ms));
            let mut block = BytesMut::new();
            headers.encode(&mut block);
            answer.headed(&block, &message.payload);
        }
        Ok(None) => answer.status(&status_block(404, "Message Not Found", None)),
        Err(error) => answer.status(&status_block(error.code, &error.description, None)),
    }
}

/// The message a get asks for, if the stream holds it and the caller may read it.
async fn find(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    request: &GetRequest,
) -> Result<Option<StoredMessage>, JsError> {
    let tenant = &*call.routes.name;
    let now = broker.clock().now_ms();
    let expired = |m: &StoredMessage| match stream {
        Stream::Declared(declared) => declared.expired(m.time_ms, now),
        Stream::Tenant(_) => false,
    };
    let found = match (&request.last_by_subj, &request.next_by_subj, request.seq) {
        (Some(subject), _, _) => {
            if !readable_in(broker, call, stream, subject) {
                return Ok(None);
            }
            match canopy_subjects::Pattern::parse_native(subject) {
                Ok(pattern) if !pattern.is_literal() => {
                    last_matching(store, tenant, &pattern).await?
                }
                _ => store.get(tenant, subject, None).await?,
            }
        }
        (None, Some(subject), Some(seq)) => {
            if !readable_in(broker, call, stream, subject) {
                return Ok(None);
            }
            // The first one at or after `seq` that has not outlived the stream's age,
            // within 64 versions (as many as a KV key keeps; expired ones come first).
            store
                .replay_subject(tenant, subject, ReplayFrom::Offset(seq), 64, usize::MAX)
                .await?
                .messages
                .into_iter()
                .find(|m| !expired(m))
        }
        (None, _, Some(seq)) => at_sequence(store, tenant, stream, seq).await?,
        _ => None,
    };
    Ok(found.filter(|m| readable_in(broker, call, stream, &m.subject) && !expired(m)))
}

/// The newest message of any subject `pattern` matches (a `last_by_subj` with
/// wildcards, as an object store's watch asks for its newest metadata): the subjects'
/// heads, a page at a time, the one with the highest offset kept.
async fn last_matching(
    store: &Store,
    tenant: &str,
    pattern: &canopy_subjects::Pattern,
) -> Result<Option<StoredMessage>, JsError> {
    const PAGE: usize = 1_000;
    // At most 100,000 subjects: a get is one request's work.
    const PAGES: usize = 100;
    let mut newest: Option<StoredMessage> = None;
    let mut each = |head: StoredMessage| {
        if newest.as_ref().is_none_or(|n| head.offset > n.offset) {
            newest = Some(head);
        }
        Ok::<(), JsError>(())
    };
    if store
        .each_head(tenant, pattern, (PAGE, PAGES), &mut each)
        .await?
    {
        return Ok(newest);
    }
    Err(JsError::bad_request(format!(
        "last_by_subj {pattern} matches more than {} subjects: name fewer",
        PAGE * PAGES
    )))
}

/// The message at tenant offset `seq`, when the stream holds its subject: the first
/// message at or after `seq` of any subject (one batch's read), kept only if it is
/// that one, so a sequence of another stream costs no walk through the log.
async fn at_sequence(
    store: &Store,
    tenant: &str,
    stream: &Stream,
    seq: u64,
) -> Result<Option<StoredMessage>, JsError> {
    let page = store
        .replay_matching(
            tenant,
            &|_: &str| true,
            ReplayFrom::Offset(seq),
            1,
            usize::MAX,
        )
        .await?;
    Ok(page
        .messages
        .into_iter()
        .find(|m| m.offset == seq && stream.holds(&m.subject)))
}

fn readable_in(broker: &Broker, call: &ApiCall, stream: &Stream, subject: &str) -> bool {
    stream.holds(subject)
        && may_read(broker, &call.principal, subject)
        && crate::api::plugins::unfiltered(&call.routes, subject).is_ok()
}
