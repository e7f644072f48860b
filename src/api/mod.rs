//! The `$CANOPY.` request/reply API: get, replay, subjects and atomic append, for
//! every front end that can publish a request with a reply subject.
//!
//! A request is JSON; answers are ordinary messages on the reply subject, routed by
//! the broker like any other, so they obey the same bounded outboxes. Replay is
//! pulled a page at a time (at most [`MAX_PAGE`] messages and [`MAX_PAGE_BYTES`]
//! bytes), so a client's buffers never overflow. Every call is authorised like the
//! publish or subscribe it stands for, and answered only where the caller may publish
//! (checked by the client core before the call is made). This module must never hold
//! more than one page in memory per request, never send an answer larger than the
//! server's `max_payload`, and never block a connection task: each request runs in its
//! own task.
//!
//! Two bounds keep tenants apart. A tenant has at most its `max_api_calls` calls
//! running (parked follows included; past it, 429 to that tenant only). Server-wide, at
//! most [`MAX_WORKING`] calls work at once (reading the store, building an answer),
//! taken in arrival order; a call waiting for news gives its place back while it
//! waits. So a tenant that parks every call it may hold costs the others nothing, and
//! one that floods the server with work waits in line with them, never ahead.

mod cluster;
pub(crate) mod encryption;
pub(crate) mod groups;
pub(crate) mod history;
pub mod jetstream;
pub(crate) mod plugins;
mod read;
pub mod schemas;
mod snapshots;
pub mod tenants;
mod users;
mod write;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::HeaderMap;
use canopy_subjects::validate_native_subject;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::broker::mesh::Home;
use crate::broker::{Broker, Message, RouteScratch, Tenant, Wakes};
use crate::store::{Snapshot, Store, StoreError, StoredMessage};
use crate::tenancy::quota::ApiCallSlot;
use crate::tenancy::{Action, Principal};

use crate::publish::is_reserved;
use read::{get, replay, subjects};
use snapshots::{get_snapshot, put_snapshot};
use write::{append, purge};

/// Subjects under this prefix are API calls, never routed or stored.
pub use crate::publish::API_PREFIX as PREFIX;
/// Most messages one replay page returns.
pub const MAX_PAGE: usize = crate::store::PAGE_MESSAGES;
/// About the most payload bytes one replay page returns.
pub const MAX_PAGE_BYTES: usize = crate::store::PAGE_BYTES;
/// API calls working at once, server-wide; more wait their turn.
pub const MAX_WORKING: usize = 256;
/// The longest a follow request may wait for new messages.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

static WORKING: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(MAX_WORKING)));

/// A running call's places: its tenant's, for as long as it runs, and the server's
/// working place, except while it waits for news.
struct Work {
    _slot: ApiCallSlot,
    working: Option<OwnedSemaphorePermit>,
}

impl Work {
    async fn begin(slot: ApiCallSlot) -> Self {
        Self {
            _slot: slot,
            working: Arc::clone(&WORKING).acquire_owned().await.ok(),
        }
    }
}

/// One API call as a front end received it.
pub struct ApiCall {
    pub principal: Principal,
    pub routes: Arc<Tenant>,
    /// The calling connection's limits: what an append's messages are held to.
    pub limits: Arc<crate::publish::SessionLimits>,
    /// The calling connection (a JetStream pull's member).
    pub origin: u64,
    /// The operation: what follows `$CANOPY.`, or a JetStream call's whole subject
    /// (`$JS.API.…`, `$JS.ACK.…`).
    pub operation: String,
    pub reply: Option<String>,
    pub body: Bytes,
}

impl ApiCall {
    /// The call's body, or `{}` when it sent none (reads may send no body at all).
    pub(crate) fn body_or_empty(&self) -> &[u8] {
        if self.body.is_empty() {
            b"{}"
        } else {
            &self.body
        }
    }
}

/// Runs `call` in its own task. Without a reply subject there is nobody to answer,
/// so the call is dropped.
pub fn spawn(broker: Arc<Broker>, call: ApiCall) {
    if call.operation == "cluster.status" {
        cluster::status(&broker, &call);
        return;
    }
    if let Some(mesh) = broker.mesh() {
        match mesh.home(&home_of(&call)) {
            Home::Here(_) => {}
            Home::Owner(owner) if forward(mesh, &call, &owner) => return,
            Home::Owner(_) | Home::Moving => {
                tokio::spawn(wait_for_home(broker, call));
                return;
            }
        }
    }
    if call.operation.starts_with("group.ack.") {
        groups::reply(&broker, &call);
        return;
    }
    if call
        .operation
        .starts_with(crate::broker::groups::jetstream::JS_ACK_PREFIX)
    {
        jetstream::ack(&broker, &call);
        return;
    }
    let Some(reply) = call.reply.clone() else {
        return;
    };
    let mut answer = Answer::new(Arc::clone(&broker), Arc::clone(&call.routes), reply);
    let slot = match call.routes.quota.api_call() {
        Ok(slot) => slot,
        Err(exceeded) if call.operation.starts_with(jetstream::API_PREFIX) => {
            jetstream::JsError::answer_busy(&call.operation, &mut answer, &exceeded.to_string());
            return;
        }
        Err(exceeded) => {
            answer.error(429, &exceeded.to_string());
            return;
        }
    };
    if call.operation.starts_with(jetstream::API_PREFIX) {
        tokio::spawn(async move {
            answer.work = Some(Work::begin(slot).await);
            jetstream::dispatch(&broker, &call, &mut answer).await;
        });
        return;
    }
    tokio::spawn(async move {
        answer.work = Some(Work::begin(slot).await);
        let result = match broker.store_of(&home_of(&call)) {
            Some(store) => dispatch(&broker, &store, &call, &mut answer).await,
            None => Err(ApiError::new(503, "no store is configured")),
        };
        if let Err(error) = result {
            answer.error(error.code, &error.description);
        }
    });
}

/// The tenant whose store a call works on: the one a tenant or user call names
/// (the default tenant's administrators manage the others), else the caller's.
/// In a cluster, the call runs on that tenant's shard's owner.
pub fn home_of(call: &ApiCall) -> std::borrow::Cow<'_, str> {
    home_tenant(&call.routes.name, &call.operation, &call.body)
}

/// [`home_of`] from a call's parts, as another node sent them.
pub fn home_tenant<'a>(caller: &'a str, operation: &str, body: &[u8]) -> std::borrow::Cow<'a, str> {
    #[derive(serde::Deserialize)]
    struct Names {
        name: Option<String>,
        tenant: Option<String>,
    }
    let named = |names: Names| {
        if operation.starts_with("tenant.") && operation != "tenant.list" {
            names.name
        } else if operation.starts_with("user.") {
            names.tenant
        } else {
            None
        }
    };
    if !operation.starts_with("tenant.") && !operation.starts_with("user.") {
        return std::borrow::Cow::Borrowed(caller);
    }
    match serde_json::from_slice::<Names>(body).ok().and_then(named) {
        Some(tenant) if crate::store::check_tenant_name(&tenant).is_ok() => {
            std::borrow::Cow::Owned(tenant)
        }
        _ => std::borrow::Cow::Borrowed(caller),
    }
}

/// The store a request by another door than a native publish (HTTP) works on for
/// `tenant`: the one store, or in a cluster its shard's when this node owns it. Such
/// a request is not forwarded (its answer has no reply subject to come back by).
pub fn store_for(broker: &Broker, tenant: &str) -> Result<Arc<Store>, ApiError> {
    if let Some(store) = broker.store_of(tenant) {
        return Ok(store);
    }
    let (description, owner) = match broker.mesh().map(|mesh| mesh.home(tenant)) {
        None => ("the store is not open".to_owned(), None),
        Some(Home::Owner(node)) => (
            format!(
                "this node does not own tenant {tenant}'s shard, and node {node}, which \
                 does, could not be reached over HTTP; try again"
            ),
            Some(node),
        ),
        Some(_) => (
            format!("tenant {tenant}'s shard is moving to another node; try again"),
            None,
        ),
    };
    Err(ApiError {
        owner,
        ..ApiError::new(503, description)
    })
}

/// Runs a call whose home tenant's shard has no home this moment (a takeover, or
/// this node still opening it), or whose owner cannot be reached (it may have died,
/// its lease not run out yet), once it has one: as long as a publish would wait
/// (`broker::parked`), rather than refusing it at once.
async fn wait_for_home(broker: Arc<Broker>, call: ApiCall) {
    let Some(wait) = broker.mesh().map(|mesh| mesh.parked().wait()) else {
        return;
    };
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Some(mesh) = broker.mesh() else {
            return;
        };
        match mesh.home(&home_of(&call)) {
            Home::Here(_) => {
                spawn(broker, call);
                return;
            }
            Home::Owner(owner) if forward(mesh, &call, &owner) => return,
            Home::Owner(_) | Home::Moving => {}
        }
    }
    if let Some(reply) = &call.reply {
        broker.refuse(
            &call.routes,
            reply,
            503,
            "the tenant's shard found no owner in time (it is moving to another node); try \
             again",
        );
    }
}

/// Sends a call whose home tenant's shard another node owns to that node, which
/// answers it (the caller's rights are made again there from the user or the
/// tenant's anonymous rules every node sees). False when the link to `owner` is
/// down.
fn forward(mesh: &crate::broker::mesh::Mesh, call: &ApiCall, owner: &Arc<str>) -> bool {
    let limits = &call.limits;
    mesh.forward_call(
        owner,
        canopy_protocols::link::Call {
            tenant: &call.routes.name,
            user: call.principal.user.as_deref(),
            guest: call.principal.is_guest(),
            client: &call.principal.client,
            origin: call.origin,
            operation: &call.operation,
            reply: call.reply.as_deref(),
            body: &call.body,
            limits: [
                limits.subjects.max_len as u64,
                limits.subjects.max_tokens as u64,
                limits.max_payload as u64,
                limits.max_subscriptions as u64,
            ],
        },
    )
}

/// The header block of a 413 answer.
const STATUS_413: &[u8] = b"NATS/1.0\r\nCanopy-Status: 413\r\n\r\n";

/// A refused call: an HTTP-style status and a sentence.
#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub description: String,
    /// The node that owns the call's tenant's shard, when this one does not (a 503
    /// that HTTP sends on to it).
    pub owner: Option<Arc<str>>,
}

impl ApiError {
    fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
            owner: None,
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
pub(crate) struct Answer {
    broker: Arc<Broker>,
    routes: Arc<Tenant>,
    reply: String,
    scratch: RouteScratch,
    wakes: Wakes,
    /// The call's places, when it runs as an API call.
    work: Option<Work>,
}

impl Answer {
    pub(crate) fn new(broker: Arc<Broker>, routes: Arc<Tenant>, reply: String) -> Self {
        Self {
            broker,
            routes,
            reply,
            scratch: RouteScratch::default(),
            wakes: Wakes::default(),
            work: None,
        }
    }

    /// Waits for `news` without holding a server-wide working place, and takes one
    /// again (in line behind whoever came meanwhile) before going on.
    pub(crate) async fn park<F: Future>(&mut self, news: F) -> F::Output {
        let Some(work) = &mut self.work else {
            return news.await;
        };
        work.working = None;
        let out = news.await;
        work.working = Arc::clone(&WORKING).acquire_owned().await.ok();
        out
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

    /// The API's own answer, never larger than `max_payload`: lists page to fit
    /// ([`Answer::budget`]), and one that still would not is refused with 413
    /// rather than sent, since clients were told no message is larger. (Stored
    /// messages relayed by get and replay fitted when published; their few
    /// `Canopy-*` headers may take them past it, as JetStream's own headers do.)
    pub(crate) fn json(&mut self, value: &serde_json::Value) {
        let body = value.to_string();
        let limit = self.broker.max_answer();
        if body.len() > limit {
            tracing::warn!(size = body.len(), limit, reply = %self.reply, "an API answer was larger than max_payload");
            let refusal = json!({"error": {"code": 413, "description": format!(
                "the answer would be {} bytes, more than max_payload ({limit}): ask for \
                 a smaller page",
                body.len()
            )}});
            self.send(Some(STATUS_413), refusal.to_string().as_bytes());
        } else {
            self.send(None, body.as_bytes());
        }
        self.wakes.wake_all();
    }

    /// The bytes a list's items may take in one JSON answer: `max_payload` less room
    /// for the answer's other fields.
    pub(crate) fn budget(&self) -> usize {
        self.broker.max_answer().saturating_sub(1024)
    }

    pub(crate) fn error(&mut self, code: u16, description: &str) {
        let (block, body) = crate::broker::refusal(code, description);
        self.send(Some(&block), &body);
        self.wakes.wake_all();
    }

    /// A message of the call's own making: its header block and payload (a JetStream
    /// direct get's answer).
    pub(crate) fn headed(&mut self, block: &[u8], payload: &[u8]) {
        self.send(Some(block), payload);
        self.wakes.wake_all();
    }

    /// A status message (a header block without a payload), as JetStream frames pulls.
    pub(crate) fn status(&mut self, block: &[u8]) {
        self.send(Some(block), b"");
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
    store: &Arc<Store>,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    let tenant = &*call.routes.name;
    match call.operation.as_str() {
        "get" => get(&history_of(broker, store, call), call, answer).await,
        "replay" => replay(&history_of(broker, store, call), call, answer).await,
        "subjects" => subjects(&history_of(broker, store, call), call, answer).await,
        "append" => append(broker, store, call).await,
        "snapshot.put" => put_snapshot(&history_of(broker, store, call), call, answer).await,
        "snapshot.get" => get_snapshot(&history_of(broker, store, call), call, answer).await,
        "purge" => purge(broker, store, tenant, call, answer).await,
        op if op.starts_with("tenant.") => tenants::dispatch(broker, store, call, answer).await,
        op if op.starts_with("user.") => users::dispatch(broker, store, call, answer).await,
        op if op.starts_with("group.") => groups::dispatch(broker, store, call, answer).await,
        op if op.starts_with("schema.") => schemas::dispatch(broker, store, call, answer).await,
        op if op.starts_with("plugin.") => plugins::dispatch(broker, store, call, answer).await,
        op if op.starts_with("encryption.") => {
            encryption::dispatch(broker, store, call, answer).await
        }
        "asyncapi" => {
            authorize(broker, &call.principal, Action::Publish, "$CANOPY.asyncapi")?;
            let body = call.body_or_empty();
            answer.json(&schemas::asyncapi(broker, &call.principal, parse(body)?)?);
            Ok(())
        }
        other => Err(ApiError::new(
            404,
            format!(
                "no API `{PREFIX}{other}`: use get, replay, subjects, append, snapshot.put, \
                 snapshot.get, purge, tenant.*, user.*, group.*, schema.*, plugin.*, encryption.*, cluster.status or \
                 asyncapi"
            ),
        )),
    }
}

/// The caller's tenant's stored history, as the caller may read it.
fn history_of<'a>(
    broker: &'a Broker,
    store: &'a Arc<Store>,
    call: &'a ApiCall,
) -> history::History<'a> {
    history::History {
        broker,
        store,
        principal: &call.principal,
        tenant: &call.routes.name,
    }
}

/// Whether `principal` may bind or unbind a `kind` (a schema, a plugin) on
/// `pattern`: a guest never; anyone else with the rights to publish and subscribe
/// to all of it (what is bound decides what its subjects' publishers may send).
fn may_bind(
    broker: &Broker,
    principal: &crate::tenancy::Principal,
    kind: &str,
    pattern: &str,
) -> Result<(), ApiError> {
    if principal.is_guest() {
        return Err(ApiError::new(
            403,
            format!(
                "Permissions Violation for a {kind} of \"{pattern}\": guests cannot bind {kind}s"
            ),
        ));
    }
    authorize(broker, principal, Action::Publish, pattern)?;
    authorize(broker, principal, Action::Subscribe, pattern)
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

/// The rule of the admin calls (`tenant.*`, `user.*`), the same on every door: only
/// the default tenant's users (the operator's) may manage tenants and users, until ACLs
/// can grant it. The caller's right to `$CANOPY.<op>` itself is checked where the call
/// comes in: by the publish decision for a native call, by [`admit_admin`] for HTTP.
pub fn admin_only(principal: &Principal, operation: &str) -> Result<(), ApiError> {
    if &*principal.tenant != crate::tenancy::DEFAULT_TENANT || principal.is_guest() {
        return Err(ApiError::new(
            403,
            format!(
                "Permissions Violation for Publish to \"{PREFIX}{operation}\": tenants and \
                 users are managed from the default tenant"
            ),
        ));
    }
    Ok(())
}

/// A call that comes in by another door than a native publish (HTTP): the caller's
/// right to `$CANOPY.<op>`, as the publish decision checks it for a native call.
pub fn admit(broker: &Broker, principal: &Principal, operation: &str) -> Result<(), ApiError> {
    authorize(
        broker,
        principal,
        Action::Publish,
        &format!("{PREFIX}{operation}"),
    )
}

/// An admin call that comes in by another door than a native publish (HTTP): the
/// admin rule, then [`admit`].
pub fn admit_admin(
    broker: &Broker,
    principal: &Principal,
    operation: &str,
) -> Result<(), ApiError> {
    admin_only(principal, operation)?;
    admit(broker, principal, operation)
}

/// Longest custom dead-letter prefix, in bytes and tokens: half the default subject
/// limits, so a prefixed subject still fits (one that does not is refused, not kept).
const DEAD_LETTER_MAX_LEN: usize = 512;
const DEAD_LETTER_MAX_TOKENS: usize = 16;

/// A custom dead-letter prefix: a plain subject in none of the server's namespaces or
/// reply inboxes, under which the caller may publish.
pub(super) fn check_dead_letter(
    broker: &Broker,
    principal: &Principal,
    prefix: &str,
) -> Result<(), ApiError> {
    let limits = canopy_subjects::Limits {
        max_len: DEAD_LETTER_MAX_LEN,
        max_tokens: DEAD_LETTER_MAX_TOKENS,
    };
    validate_native_subject(prefix, &limits)
        .map_err(|e| ApiError::new(400, format!("invalid dead-letter prefix: {e}")))?;
    let first = prefix.split('.').next().unwrap_or(prefix);
    if is_reserved(prefix) || first == "_INBOX" {
        return Err(ApiError::new(
            400,
            format!(
                "invalid dead-letter prefix {prefix}: {first} is the server's (leave the \
                 prefix out for the default)"
            ),
        ));
    }
    authorize(broker, principal, Action::Publish, &format!("{prefix}.>"))
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
