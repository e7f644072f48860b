//! Changing stored history: `append` (atomic, with expectations) and `purge`.
//!
//! Must never: write to the store except through its append queue and purge, or let a
//! caller change what it could not publish to.

use std::sync::Arc;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use canopy_protocols::native::HeaderMap;
use canopy_subjects::Pattern;
use serde::Deserialize;
use serde_json::json;

use crate::broker::Broker;
use crate::publish::{AppendRefusal, Publisher, Refusal};
use crate::store::{AckTo, AppendRequest, Expectation, NewMessage, RouteTag, Store};
use crate::tenancy::Action;

use super::{Answer, ApiCall, ApiError, authorize, check_subject, parse};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendMessage {
    data: Option<String>,
    data_base64: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendBody {
    subject: String,
    expect_version: Option<u64>,
    msg_id: Option<String>,
    messages: Vec<AppendMessage>,
}

pub(super) async fn append(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
) -> Result<(), ApiError> {
    let request: AppendBody = parse(&call.body)?;
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in request.messages {
        let payload = payload_of(message.data, message.data_base64)?;
        let headers = if message.headers.is_empty() {
            Bytes::new()
        } else {
            let mut map = HeaderMap::new();
            for (name, value) in message.headers {
                map.append(name, value);
            }
            let mut block = BytesMut::new();
            map.encode(&mut block);
            block.freeze()
        };
        messages.push(NewMessage {
            headers,
            payload,
            flags: 0,
        });
    }
    // The same stages as any publish, each message through its own, the quota
    // charged once all of them passed.
    let publisher = Publisher::new(
        Arc::clone(broker),
        Arc::clone(&call.routes),
        call.principal.clone(),
        Arc::clone(&call.limits),
        call.origin,
    );
    let policy = publisher
        .decide_append(&request.subject, &mut messages)
        .map_err(append_error)?;
    let size: usize = messages
        .iter()
        .map(|m| m.headers.len() + m.payload.len())
        .sum();
    call.routes
        .quota
        .count_admitted(messages.len() as u64, size as u64);
    let reply = call.reply.clone().unwrap_or_default();
    store
        .append(AppendRequest {
            tenant: Arc::clone(&call.routes.name),
            subject: Arc::from(request.subject.as_str()),
            messages,
            expect: request.expect_version.map(Expectation::Version),
            msg_id: request.msg_id.map(Box::from),
            durability: policy.durability,
            ack: Some(AckTo {
                address: Bytes::from(reply),
                flags: 0,
                cargo: None,
            }),
            route: RouteTag::default(),
            compaction: policy.compaction(),
            max_versions: publisher.version_limit(policy, &request.subject),
            retain: false,
        })
        .await?;
    Ok(())
}

/// An append's refusal as the API words it.
fn append_error(refusal: AppendRefusal) -> ApiError {
    let code = match &refusal {
        AppendRefusal::NotStored(_) | AppendRefusal::Empty => 400,
        AppendRefusal::Refused(refused)
        | AppendRefusal::Message {
            refusal: refused, ..
        } => match refused {
            Refusal::Reserved(_) | Refusal::Denied(_) => 403,
            Refusal::TooLarge { .. } | Refusal::TooLargeForStream(_) => 413,
            Refusal::OverQuota(_) => 429,
            Refusal::InvalidSubject(_)
            | Refusal::BadHeader(_)
            | Refusal::WrongStream(_)
            | Refusal::Invalid(_)
            | Refusal::Plugin(_) => 400,
        },
    };
    ApiError::new(code, refusal.to_string())
}

/// A payload given as `data` (text) or `data_base64`.
pub(super) fn payload_of(
    data: Option<String>,
    data_base64: Option<String>,
) -> Result<Bytes, ApiError> {
    match (data, data_base64) {
        (Some(text), None) => Ok(Bytes::from(text)),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Bytes::from)
            .map_err(|e| ApiError::new(400, format!("data_base64 is not base64: {e}"))),
        (None, None) => Ok(Bytes::new()),
        (Some(_), Some(_)) => Err(ApiError::new(400, "give `data` or `data_base64`, not both")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeRequest {
    subject: Option<String>,
    pattern: Option<String>,
}

pub(super) async fn purge(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: PurgeRequest = parse(&call.body)?;
    let purged = match (&request.subject, &request.pattern) {
        (Some(subject), None) => {
            check_subject(subject)?;
            authorize(broker, &call.principal, Action::Publish, subject)?;
            store.purge_subject(tenant, subject).await?
        }
        (None, Some(text)) => {
            let pattern = Pattern::parse_native(text)
                .map_err(|e| ApiError::new(400, format!("invalid pattern: {e}")))?;
            authorize(broker, &call.principal, Action::Publish, text)?;
            store.purge_pattern(tenant, &pattern).await?
        }
        _ => {
            return Err(ApiError::new(
                400,
                "a purge names either `subject` or `pattern`",
            ));
        }
    };
    answer.json(&json!({"subjects": purged.subjects, "messages": purged.messages}));
    Ok(())
}
