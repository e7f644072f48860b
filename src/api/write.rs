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
use crate::store::{AckTo, AppendRequest, Expectation, NewMessage, RouteTag, Store};
use crate::tenancy::Action;

use super::{Answer, ApiCall, ApiError, authorize, check_subject, parse, subject_request};

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

pub(super) async fn append(broker: &Broker, store: &Store, call: &ApiCall) -> Result<(), ApiError> {
    let request: AppendBody =
        subject_request(broker, call, Action::Publish, |r: &AppendBody| &r.subject)?;
    let Some(policy) = broker.store_policy(&request.subject) else {
        return Err(ApiError::new(
            400,
            format!("{} is not stored by any store policy", request.subject),
        ));
    };
    if request.messages.is_empty() {
        return Err(ApiError::new(400, "an append needs at least one message"));
    }
    // An append is all or nothing, so a message its schema refuses fails the whole
    // append, whatever the binding does with a single invalid publish.
    let binding = call.routes.schemas.for_subject(&request.subject);
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, message) in request.messages.into_iter().enumerate() {
        let payload = payload_of(message.data, message.data_base64)?;
        let own: Vec<_> = message
            .headers
            .into_iter()
            .filter(|(name, _)| !name.eq_ignore_ascii_case(crate::schemas::SCHEMA_HEADER))
            .collect();
        let mut headers = if own.is_empty() {
            Bytes::new()
        } else {
            let mut map = HeaderMap::new();
            for (name, value) in own {
                map.append(name, value);
            }
            let mut block = BytesMut::new();
            map.encode(&mut block);
            block.freeze()
        };
        if let Some(binding) = &binding {
            if let Err(violation) = binding.check(&payload) {
                call.routes
                    .schemas
                    .record_error(crate::schemas::registry::RecentError {
                        subject: request.subject.clone(),
                        schema: binding.reference(),
                        violation: violation.clone(),
                        time_ms: broker.clock().now_ms(),
                        dead_lettered: false,
                    });
                return Err(ApiError::new(
                    400,
                    format!(
                        "message {i} does not match schema {} at {violation}; nothing was appended",
                        binding.reference()
                    ),
                ));
            }
            headers = binding.stamp(&headers);
        }
        let size = headers.len() + payload.len();
        call.routes
            .quota
            .admit_publish(size)
            .map_err(|exceeded| ApiError::new(429, format!("quota exceeded: {exceeded}")))?;
        call.routes.quota.count_admitted(1, size as u64);
        messages.push(NewMessage {
            headers,
            payload,
            flags: 0,
        });
    }
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
            max_versions: policy.max_versions,
            retain: false,
        })
        .await?;
    Ok(())
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
