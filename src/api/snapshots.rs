//! `snapshot.put` and `snapshot.get`: a subject's state as of a version.
//!
//! Must never: store a snapshot the caller could not publish, or show one it could not
//! subscribe to.

use serde::Deserialize;
use serde_json::json;

use super::history::History;
use super::read::GetRequest;
use super::write::payload_of;
use super::{Answer, ApiCall, ApiError, check_subject, parse};

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
    history: &History<'_>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: PutSnapshot = parse(&call.body)?;
    check_subject(&request.subject)?;
    let payload = payload_of(request.data, request.data_base64)?;
    let json = request
        .content_type
        .is_some_and(|t| t.trim().starts_with("application/json"));
    history
        .put_snapshot(&request.subject, request.version, &payload, json)
        .await?;
    answer.json(&json!({"subject": request.subject, "version": request.version}));
    Ok(())
}

pub(super) async fn get_snapshot(
    history: &History<'_>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: GetRequest = parse(&call.body)?;
    check_subject(&request.subject)?;
    let snapshot = history.snapshot(&request.subject, request.version).await?;
    answer.snapshot(&snapshot);
    answer.wakes.wake_all();
    Ok(())
}
