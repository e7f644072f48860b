//! `/api/plugins` and `/api/encryption`: the caller's tenant's plugins and data keys
//! over HTTP, the same operations and rights as `$CANOPY.plugin.<op>` and
//! `$CANOPY.encryption.<op>` on the native API.
//!
//! - `GET /api/plugins` lists the plugins, `GET /api/plugins/{pattern}` shows one;
//! - `PUT /api/plugins/{pattern}` binds the module in the body (binary WebAssembly or
//!   its text form), with `?hooks=publish,deliver&on_error=pass&deadline_ms=&memory_mib=`;
//! - `DELETE /api/plugins/{pattern}` unbinds it;
//! - `GET /api/encryption` lists the data keys, `PUT /api/encryption/{pattern}` seals
//!   the pattern (or rotates its key), `POST /api/encryption/{pattern}/stop` stops
//!   sealing, `DELETE /api/encryption/{pattern}` shreds its keys.
//!
//! Must never do the work itself: `api::plugins` and `api::encryption` do.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{ApiCall, encryption, plugins};
use crate::tenancy::Principal;

use super::HttpState;
use super::caller::Caller;
use super::tenant_api::api_answer;

/// Which API a call goes to.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Plugin,
    Encryption,
}

/// Runs `$CANOPY.<op>` for the caller as the native API would, and answers it.
async fn run(
    state: &HttpState,
    principal: Principal,
    kind: Kind,
    op: &str,
    body: Value,
) -> Response {
    let result = async {
        let operation = match kind {
            Kind::Plugin => format!("plugin.{op}"),
            Kind::Encryption => format!("encryption.{op}"),
        };
        crate::api::admit(&state.broker, &principal, &operation)?;
        let store = crate::api::store_for(&state.broker, &principal.tenant)?;
        let call = ApiCall {
            routes: state.broker.tenant_for(&principal),
            principal,
            limits: Arc::clone(&state.websocket.session_limits),
            origin: 0,
            operation,
            reply: None,
            body: Bytes::from(body.to_string()),
        };
        match kind {
            Kind::Plugin => plugins::answer_to(&state.broker, &store, &call).await,
            Kind::Encryption => encryption::answer_to(&state.broker, &store, &call).await,
        }
    };
    api_answer(result.await)
}

/// A list: `GET /api/plugins`, `GET /api/encryption`.
pub(super) async fn list(state: HttpState, principal: Principal, kind: Kind) -> Response {
    run(&state, principal, kind, "list", json!({})).await
}

/// An operation on one pattern named in the path.
pub(super) async fn on_pattern(
    state: HttpState,
    principal: Principal,
    pattern: String,
    (kind, op): (Kind, &str),
) -> Response {
    run(&state, principal, kind, op, json!({"pattern": pattern})).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PutQuery {
    /// Comma-separated: `publish`, `deliver`.
    hooks: Option<String>,
    on_error: Option<String>,
    deadline_ms: Option<u64>,
    memory_mib: Option<u32>,
}

pub(super) async fn put_plugin(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(pattern): Path<String>,
    Query(query): Query<PutQuery>,
    module: Bytes,
) -> Response {
    use base64::Engine as _;
    let mut body = json!({
        "pattern": pattern,
        "module": base64::engine::general_purpose::STANDARD.encode(&module),
    });
    if let Some(hooks) = query.hooks {
        body["hooks"] = json!(hooks.split(',').map(str::trim).collect::<Vec<_>>());
    }
    if let Some(on_error) = query.on_error {
        body["on_error"] = json!(on_error);
    }
    if let Some(ms) = query.deadline_ms {
        body["deadline_ms"] = json!(ms);
    }
    if let Some(mib) = query.memory_mib {
        body["memory_mib"] = json!(mib);
    }
    run(&state, principal, Kind::Plugin, "put", body).await
}
