//! Who calls the HTTP port: the bearer token (a header, or a `bearer.<token>`
//! subprotocol for browsers' WebSockets) turned into the caller's principal, and the
//! login rules the console asks for first.
//!
//! Must never: answer before the failed-login delay on a refusal, or let a route that
//! wants a login through with none.

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::server::tls::Peer;
use crate::tenancy::Principal;

use super::HttpState;

/// Who is calling: anonymous unless logins are required; then the user of the bearer
/// token in `Authorization: Bearer …` or, for browsers' WebSockets, which cannot set
/// headers, in a `bearer.<token>` subprotocol. A refusal (401) comes after the failed
/// login delay.
pub(super) async fn caller(
    state: &HttpState,
    headers: &HeaderMap,
    client_id: &str,
    certified: Option<&str>,
) -> Result<Principal, Response> {
    if !state.require_login {
        return Ok(Principal::anonymous("http"));
    }
    let from_header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let from_protocol = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix("bearer."));
    let presented = crate::tenancy::login::Presented {
        token: from_header.or(from_protocol).map(str::to_owned),
        certified: certified.map(str::to_owned),
        client: client_id.to_owned(),
        ..Default::default()
    };
    let refused = || {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required\n",
        )
            .into_response()
    };
    let Some(users) = state.broker.users() else {
        return Err(refused());
    };
    let tenants = state.broker.tenant_records();
    match crate::tenancy::login::login(users, tenants, state.broker.metrics(), &presented).await {
        Ok(principal) => Ok(principal),
        Err(_) => {
            tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
            Err(refused())
        }
    }
}

/// Whether callers must log in: how the console knows to ask for a token before it
/// tries (a refused WebSocket cannot say why).
pub(super) async fn login_rules(State(state): State<HttpState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "required": state.require_login }).to_string(),
    )
        .into_response()
}

/// The caller of a request, logged in as [`caller`] says.
pub(super) struct Caller(pub(super) Principal);

impl axum::extract::FromRequestParts<HttpState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        // `?client_id=NAME` names a WebSocket client for `{client_id}` rules; without
        // it, such rules allow nothing (an empty name is never filled in).
        let client_id = parts
            .uri
            .query()
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("client_id="))
            .unwrap_or_default();
        let certified = parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .and_then(|info| info.0.certified.as_deref());
        caller(state, &parts.headers, client_id, certified)
            .await
            .map(Caller)
    }
}
