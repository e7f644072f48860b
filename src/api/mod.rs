//! The `$CANOPY.` request/reply API: get, replay, subjects and atomic append, for
//! every front end that can publish a request with a reply subject.
//!
//! A request is JSON; answers are ordinary messages on the reply subject, routed by
//! the broker like any other, so they obey the same bounded outboxes. Replay is
//! pulled a page at a time (at most [`MAX_PAGE`] messages and [`MAX_PAGE_BYTES`]
//! bytes), so a client's buffers never overflow. Every call is authorised like the
//! publish or subscribe it stands for. This module must never hold more than one
//! page in memory per request, and never block a connection task: each request runs
//! in its own task, and at most [`MAX_CONCURRENT`] run at once.

pub mod tenants;
mod users;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use canopy_protocols::native::HeaderMap;
use canopy_subjects::{Pattern, validate_native_subject};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::broker::{Broker, Message, RouteScratch, TenantRoutes, Wakes};
use crate::store::{
    AckTo, AppendRequest, Expectation, NewMessage, ReplayFrom, RouteTag, Snapshot, Store,
    StoreError, StoredMessage,
};
use crate::tenancy::{Action, Principal};

/// Subjects under this prefix are API calls, never routed or stored.
pub const PREFIX: &str = "$CANOPY.";
/// Most messages one replay page returns.
pub const MAX_PAGE: usize = crate::session::PAGE_MESSAGES;
/// About the most payload bytes one replay page returns.
pub const MAX_PAGE_BYTES: usize = crate::session::PAGE_BYTES;
/// API requests running at once; more are answered 503.
pub const MAX_CONCURRENT: usize = 256;
/// The longest a follow request may wait for new messages.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

static RUNNING: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(MAX_CONCURRENT)));

/// One API call as a front end received it.
pub struct ApiCall {
    pub principal: Principal,
    pub routes: Arc<TenantRoutes>,
    /// The operation: what follows `$CANOPY.`.
    pub operation: String,
    pub reply: Option<String>,
    pub body: Bytes,
}

/// Runs `call` in its own task. Without a reply subject there is nobody to answer,
/// so the call is dropped.
pub fn spawn(broker: Arc<Broker>, call: ApiCall) {
    let Some(reply) = call.reply.clone() else {
        return;
    };
    let mut answer = Answer::new(Arc::clone(&broker), Arc::clone(&call.routes), reply);
    let Ok(permit) = Arc::clone(&RUNNING).try_acquire_owned() else {
        answer.error(503, "the server is busy with other API requests; retry");
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let result = match broker.store() {
            Some(store) => dispatch(&broker, store, &call, &mut answer).await,
            None => Err(ApiError::new(503, "no store is configured")),
        };
        if let Err(error) = result {
            answer.error(error.code, &error.description);
        }
    });
}

/// A refused call: an HTTP-style status and a sentence.
#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub description: String,
}

impl ApiError {
    fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Refused(reason) => ApiError::new(400, reason),
            other => ApiError::new(503, format!("the store failed: {other}")),
        }
    }
}

/// Sends messages to the caller's reply subject.
struct Answer {
    broker: Arc<Broker>,
    routes: Arc<TenantRoutes>,
    reply: String,
    scratch: RouteScratch,
    wakes: Wakes,
}

impl Answer {
    fn new(broker: Arc<Broker>, routes: Arc<TenantRoutes>, reply: String) -> Self {
        Self {
            broker,
            routes,
            reply,
            scratch: RouteScratch::default(),
            wakes: Wakes::default(),
        }
    }

    fn send(&mut self, headers: Option<&[u8]>, payload: &[u8]) {
        let message = Message {
            subject: &self.reply,
            reply: None,
            headers,
            payload,
            ..Message::default()
        };
        self.broker.route(
            &self.routes,
            None,
            &message,
            &mut self.scratch,
            &mut self.wakes,
        );
    }

    fn json(&mut self, value: &serde_json::Value) {
        self.send(None, value.to_string().as_bytes());
        self.wakes.wake_all();
    }

    fn error(&mut self, code: u16, description: &str) {
        let mut headers = HeaderMap::new();
        headers.insert("Canopy-Status", code.to_string());
        let mut block = BytesMut::new();
        headers.encode(&mut block);
        let body = json!({"error": {"code": code, "description": description}});
        self.send(Some(&block), body.to_string().as_bytes());
        self.wakes.wake_all();
    }

    /// A snapshot, marked `Canopy-Snapshot: true`.
    fn snapshot(&mut self, snapshot: &Snapshot) {
        let mut headers = HeaderMap::new();
        headers.insert("Canopy-Subject", snapshot.subject.clone());
        headers.insert("Canopy-Version", snapshot.version.to_string());
        headers.insert("Canopy-Time", snapshot.time_ms.to_string());
        headers.insert("Canopy-Snapshot", "true");
        if snapshot.json {
            headers.insert("Content-Type", "application/json");
        }
        let mut block = BytesMut::new();
        headers.encode(&mut block);
        self.send(Some(&block), &snapshot.payload);
    }

    /// A stored message with its Canopy-* headers added to its own.
    fn message(&mut self, message: &StoredMessage) {
        let mut headers = HeaderMap::parse(&message.headers).unwrap_or_default();
        headers.insert("Canopy-Subject", message.subject.clone());
        headers.insert("Canopy-Version", message.version.to_string());
        headers.insert("Canopy-Offset", message.offset.to_string());
        headers.insert("Canopy-Time", message.time_ms.to_string());
        let mut block = BytesMut::new();
        headers.encode(&mut block);
        self.send(Some(&block), &message.payload);
    }
}

async fn dispatch(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let tenant = &*call.routes.name;
    match call.operation.as_str() {
        "get" => get(broker, store, tenant, call, answer).await,
        "replay" => replay(broker, store, tenant, call, answer).await,
        "subjects" => subjects(broker, store, tenant, call, answer).await,
        "append" => append(broker, store, call).await,
        "snapshot.put" => put_snapshot(broker, store, tenant, call, answer).await,
        "snapshot.get" => get_snapshot(broker, store, tenant, call, answer).await,
        "purge" => purge(broker, store, tenant, call, answer).await,
        op if op.starts_with("tenant.") => tenants::dispatch(broker, store, call, answer).await,
        op if op.starts_with("user.") => users::dispatch(broker, store, call, answer).await,
        other => Err(ApiError::new(
            404,
            format!(
                "no API `{PREFIX}{other}`: use get, replay, subjects, append, snapshot.put, \
                 snapshot.get, purge, tenant.* or user.*"
            ),
        )),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the request is not the JSON expected: {e}")))
}

fn check_subject(subject: &str) -> Result<(), ApiError> {
    let limits = canopy_subjects::Limits::default();
    validate_native_subject(subject, &limits)
        .map_err(|e| ApiError::new(400, format!("invalid subject: {e}")))
}

/// Authorises an admin call: only the default tenant's users (the operator's) may
/// manage tenants and users, until ACLs can grant it; then as a publish to its own
/// `$CANOPY.<op>` subject.
fn authorize_call(broker: &Broker, call: &ApiCall) -> Result<(), ApiError> {
    if &*call.principal.tenant != crate::tenancy::DEFAULT_TENANT || call.principal.is_guest() {
        return Err(ApiError::new(
            403,
            format!(
                "Permissions Violation for Publish to \"{PREFIX}{}\": tenants and users are \
                 managed from the default tenant",
                call.operation
            ),
        ));
    }
    authorize(
        broker,
        &call.principal,
        Action::Publish,
        &format!("{PREFIX}{}", call.operation),
    )
}

fn authorize(
    broker: &Broker,
    principal: &Principal,
    action: Action,
    subject: &str,
) -> Result<(), ApiError> {
    broker
        .authorizer()
        .authorize(principal, action, subject)
        .map_err(|denied| ApiError::new(403, denied.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GetRequest {
    subject: String,
    version: Option<u64>,
}

async fn get(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: GetRequest = parse(&call.body)?;
    check_subject(&request.subject)?;
    authorize(broker, &call.principal, Action::Subscribe, &request.subject)?;
    match store.get(tenant, &request.subject, request.version).await? {
        Some(message) => {
            answer.message(&message);
            answer.wakes.wake_all();
            Ok(())
        }
        None => Err(ApiError::new(
            404,
            match request.version {
                Some(v) => format!("{} has no version {v}", request.subject),
                None => format!("{} has no messages", request.subject),
            },
        )),
    }
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

async fn replay(
    broker: &Broker,
    store: &Store,
    tenant: &str,
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
    let target = match (&request.subject, &request.pattern) {
        (Some(subject), None) => {
            check_subject(subject)?;
            authorize(broker, &call.principal, Action::Subscribe, subject)?;
            Target::Subject(subject)
        }
        (None, Some(pattern)) => {
            let parsed = Pattern::parse_native(pattern)
                .map_err(|e| ApiError::new(400, format!("invalid pattern: {e}")))?;
            authorize(broker, &call.principal, Action::Subscribe, pattern)?;
            Target::Pattern(parsed)
        }
        _ => {
            return Err(ApiError::new(
                400,
                "a replay names either `subject` or `pattern`",
            ));
        }
    };
    if from_snapshot
        && let Target::Subject(subject) = &target
        && let Some(snapshot) = store.snapshot(tenant, subject, None).await?
    {
        answer.snapshot(&snapshot);
        from = ReplayFrom::Version(snapshot.version + 1);
    }
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(5000)).min(MAX_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut durable = store.durable_watch();
    let mut page = loop {
        durable.borrow_and_update();
        let page = match &target {
            Target::Subject(subject) => {
                store
                    .replay_subject(tenant, subject, from, max, MAX_PAGE_BYTES)
                    .await?
            }
            Target::Pattern(pattern) => {
                store
                    .replay_pattern(tenant, pattern, from, max, MAX_PAGE_BYTES)
                    .await?
            }
        };
        if !page.messages.is_empty() || !request.follow {
            break page;
        }
        // Caught up and following: wait for the next durable write, then look again.
        match tokio::time::timeout_at(deadline, durable.changed()).await {
            Ok(Ok(())) => continue,
            _ => break page,
        }
    };
    // A broad pattern was allowed; the deny list's subjects still never show.
    let authz = broker.authorizer();
    if authz.filters_delivery() {
        page.messages.retain(|m| authz.may_deliver(&m.subject));
    }
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

enum Target<'a> {
    Subject(&'a str),
    Pattern(Pattern),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubjectsRequest {
    pattern: Option<String>,
    after: Option<String>,
    max: Option<usize>,
}

async fn subjects(
    broker: &Broker,
    store: &Store,
    tenant: &str,
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
    authorize(broker, &call.principal, Action::Subscribe, text)?;
    let max = request.max.unwrap_or(100).clamp(1, MAX_PAGE);
    let page = store
        .subjects(tenant, &pattern, request.after.as_deref(), max)
        .await?;
    let authz = broker.authorizer();
    let subjects: Vec<_> = page
        .subjects
        .iter()
        .filter(|s| authz.may_deliver(&s.subject))
        .map(|s| json!({"subject": s.subject, "version": s.version, "offset": s.offset, "time_ms": s.time_ms}))
        .collect();
    answer.json(&json!({"subjects": subjects, "next": page.next}));
    Ok(())
}

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

async fn append(broker: &Broker, store: &Store, call: &ApiCall) -> Result<(), ApiError> {
    let request: AppendBody = parse(&call.body)?;
    check_subject(&request.subject)?;
    authorize(broker, &call.principal, Action::Publish, &request.subject)?;
    let Some(policy) = broker.store_policy(&request.subject) else {
        return Err(ApiError::new(
            400,
            format!("{} is not stored by any store policy", request.subject),
        ));
    };
    if request.messages.is_empty() {
        return Err(ApiError::new(400, "an append needs at least one message"));
    }
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
fn payload_of(data: Option<String>, data_base64: Option<String>) -> Result<Bytes, ApiError> {
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
struct PutSnapshot {
    subject: String,
    version: u64,
    data: Option<String>,
    data_base64: Option<String>,
    /// `application/json` marks the snapshot as JSON for readers that show it.
    content_type: Option<String>,
}

async fn put_snapshot(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: PutSnapshot = parse(&call.body)?;
    check_subject(&request.subject)?;
    authorize(broker, &call.principal, Action::Publish, &request.subject)?;
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

async fn get_snapshot(
    broker: &Broker,
    store: &Store,
    tenant: &str,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let request: GetRequest = parse(&call.body)?;
    check_subject(&request.subject)?;
    authorize(broker, &call.principal, Action::Subscribe, &request.subject)?;
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeRequest {
    subject: Option<String>,
    pattern: Option<String>,
}

async fn purge(
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
