//! Reading stored history: `get` (one message of a subject), `replay` (a page of a
//! subject's or pattern's history, optionally following it) and `subjects`.
//!
//! Must never: hold more than one page in memory per request, or answer anything the
//! caller could not subscribe to.

use std::time::Duration;

use bytes::BytesMut;
use canopy_protocols::native::HeaderMap;
use canopy_subjects::Pattern;
use serde::Deserialize;
use serde_json::json;

use crate::store::ReplayFrom;

use super::history::{History, Of};

use super::{Answer, ApiCall, ApiError, MAX_PAGE, MAX_PAGE_BYTES, MAX_WAIT, check_subject, parse};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GetRequest {
    pub(super) subject: String,
    pub(super) version: Option<u64>,
}

pub(super) async fn get(
    history: &History<'_>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: GetRequest = parse(&call.body)?;
    check_subject(&request.subject)?;
    let message = history.get(&request.subject, request.version).await?;
    answer.message(&message);
    answer.wakes.wake_all();
    Ok(())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StartAt {
    Named(String),
    Version { version: u64 },
    Offset { offset: u64 },
    Time { time_ms: u64 },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    subject: Option<String>,
    pattern: Option<String>,
    from: Option<StartAt>,
    cursor: Option<u64>,
    max: Option<usize>,
    #[serde(default)]
    follow: bool,
    wait_ms: Option<u64>,
}

pub(super) async fn replay(
    history: &History<'_>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: ReplayRequest = parse(&call.body)?;
    let max = request.max.unwrap_or(100).clamp(1, MAX_PAGE);
    let mut from_snapshot = false;
    let mut from = match (&request.cursor, &request.from) {
        (Some(cursor), _) if request.subject.is_some() => ReplayFrom::Version(*cursor),
        (Some(cursor), _) => ReplayFrom::Offset(*cursor),
        (None, None) => ReplayFrom::Start,
        (None, Some(StartAt::Named(name))) if name == "start" => ReplayFrom::Start,
        (None, Some(StartAt::Named(name))) if name == "snapshot" && request.subject.is_some() => {
            from_snapshot = true;
            ReplayFrom::Start
        }
        (None, Some(StartAt::Named(name))) => {
            return Err(ApiError::new(
                400,
                format!(
                    "`from` must be \"start\", {{\"version\": N}}, {{\"offset\": N}} or {{\"time_ms\": T}}, not \"{name}\""
                ),
            ));
        }
        (None, Some(StartAt::Version { version })) => ReplayFrom::Version(*version),
        (None, Some(StartAt::Offset { offset })) => ReplayFrom::Offset(*offset),
        (None, Some(StartAt::Time { time_ms })) => ReplayFrom::Time(*time_ms),
    };
    let parsed;
    let of = match (&request.subject, &request.pattern) {
        (Some(subject), None) => {
            check_subject(subject)?;
            Of::Subject(subject)
        }
        (None, Some(text)) => {
            parsed = Pattern::parse_native(text)
                .map_err(|e| ApiError::new(400, format!("invalid pattern: {e}")))?;
            Of::Pattern(&parsed)
        }
        _ => {
            return Err(ApiError::new(
                400,
                "a replay names either `subject` or `pattern`",
            ));
        }
    };
    if from_snapshot && let Of::Subject(subject) = of {
        match history.snapshot(subject, None).await {
            Ok(snapshot) => {
                answer.snapshot(&snapshot);
                from = ReplayFrom::Version(snapshot.version + 1);
            }
            Err(ApiError { code: 404, .. }) => {}
            Err(error) => return Err(error),
        }
    }
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(5000)).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut follower = history.follower(of, from, max, MAX_PAGE_BYTES)?;
    let mut page = follower.next().await?;
    if request.follow && page.messages.is_empty() && page.caught_up {
        // Caught up and following: from now on the log's new messages come to the
        // follower as they are routed, and it reads the store only across a gap.
        let mut follower = follower.tapped(&call.routes.taps, MAX_PAGE_BYTES, true);
        let news = tokio::time::timeout_at(deadline, follower.next());
        if let Ok(news) = answer.park(news).await {
            page = news?;
        }
    }
    history.keep_deliverable(&mut page.messages);
    for message in &page.messages {
        answer.message(message);
    }
    let mut done = HeaderMap::new();
    done.insert("Canopy-Done", "true");
    done.insert("Canopy-Cursor", page.next.to_string());
    done.insert("Canopy-Caught-Up", page.caught_up.to_string());
    done.insert("Canopy-Count", page.messages.len().to_string());
    let mut block = BytesMut::new();
    done.encode(&mut block);
    answer.send(Some(&block), &[]);
    answer.wakes.wake_all();
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubjectsRequest {
    pattern: Option<String>,
    after: Option<String>,
    max: Option<usize>,
}

pub(super) async fn subjects(
    history: &History<'_>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: SubjectsRequest = if call.body.is_empty() {
        SubjectsRequest {
            pattern: None,
            after: None,
            max: None,
        }
    } else {
        parse(&call.body)?
    };
    let text = request.pattern.as_deref().unwrap_or(">");
    let pattern = Pattern::parse_native(text)
        .map_err(|e| ApiError::new(400, format!("invalid pattern: {e}")))?;
    let max = request.max.unwrap_or(100).clamp(1, MAX_PAGE);
    let page = history
        .subjects(&pattern, request.after.as_deref(), max)
        .await?;
    // A page ends early where its answer would pass max_payload; `next` then
    // continues after the last subject it holds.
    let budget = answer.budget();
    let mut used = 0;
    let mut next = page.next;
    let mut subjects = Vec::new();
    for (i, s) in page.subjects.iter().enumerate() {
        let item = json!({"subject": s.subject, "version": s.version, "offset": s.offset, "time_ms": s.time_ms});
        used += item.to_string().len() + 1;
        if used > budget && i > 0 {
            next = Some(page.subjects[i - 1].subject.clone());
            break;
        }
        subjects.push(item);
    }
    answer.json(&json!({"subjects": subjects, "next": next}));
    Ok(())
}
