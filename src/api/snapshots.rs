//! `snapshot.put` and `snapshot.get`: a subject's state as of a version.
//!
//! Must never: store a snapshot the caller could not publish, or show one it could not
//! subscribe to.

use serde::Deserialize;
use serde_json::json;

use crate::broker::Broker;
use crate::store::Store;
use crate::tenancy::Action;

use super::read::GetRequest;
use super::write::payload_of;
use super::{Answer, ApiCall, ApiError, subject_request};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutSnapshot {
    subject: String,
    version: u64,
    data: Option<String>,
    data_base64: Option<String>,
    /// `application/json` marks the snapshot as JSON for readers that show it.
    content_type: Option<String>,
}

pub(super) async fn put_snapshot(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: PutSnapshot =
        subject_request(broker, call, Action::Publish, |r: &PutSnapshot| &r.subject)?;
    let payload = payload_of(request.data, request.data_base64)?;
    store
        .put_snapshot(
            tenant,
            &request.subject,
            request.version,
            &payload,
            request
                .content_type
                .is_some_and(|t| t.trim().starts_with("application/json")),
        )
        .await?;
    answer.json(&json!({"subject": request.subject, "version": request.version}));
    Ok(())
}

pub(super) async fn get_snapshot(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: GetRequest =
        subject_request(broker, call, Action::Subscribe, |r: &GetRequest| &r.subject)?;
    match store
        .snapshot(tenant, &request.subject, request.version)
        .await?
    {
        Some(snapshot) => {
            answer.snapshot(&snapshot);
            answer.wakes.wake_all();
            Ok(())
        }
        None => Err(ApiError::new(
            404,
            format!("{} has no snapshot", request.subject),
        )),
    }
}
