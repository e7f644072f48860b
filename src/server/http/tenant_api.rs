//! `/api/tenants`: the admin calls on tenants over HTTP, the same operations and
//! rights as `$CANOPY.tenant.<op>` on the native API.
//!
//! Must never: let a user of a tenant other than `default` administer tenants, or do
//! the work itself (the API's `tenants` module does).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ApiError, tenants};
use crate::tenancy::Principal;

use super::HttpState;
use super::caller::Caller;

/// An admin call's answer: JSON, or `{"error": {code, description}}` with its status.
pub(super) fn api_answer(result: Result<serde_json::Value, ApiError>) -> Response {
    let (status, body, owner) = match result {
        Ok(body) => (StatusCode::OK, body, None),
        Err(error) => (
            StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            serde_json::json!({"error": {"code": error.code, "description": error.description}}),
            error.owner,
        ),
    };
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    // Another node owns the tenant: `forward` sends the request there.
    if let Some(owner) = owner.and_then(|o| header::HeaderValue::from_str(&o).ok()) {
        response.headers_mut().insert(super::forward::OWNER, owner);
    }
    response
}

/// The store of `tenant` and the caller's right to `$CANOPY.tenant.<op>`, as on the
/// native API: the default tenant's users only.
pub(super) fn tenant_admin(
    state: &HttpState,
    principal: &Principal,
    op: &str,
    tenant: &str,
) -> Result<Arc<crate::store::Store>, ApiError> {
    crate::api::admit_admin(&state.broker, principal, &format!("tenant.{op}"))?;
    crate::api::store_for(&state.broker, tenant)
}

pub(super) fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError {
        code: 400,
        description: format!("the request is not the JSON expected: {e}"),
        owner: None,
    })
}

pub(super) async fn list_tenants(
    State(state): State<HttpState>,
    Caller(principal): Caller,
) -> Response {
    let admitted = crate::api::admit_admin(&state.broker, &principal, "tenant.list");
    api_answer(admitted.map(|()| tenants::list(&state.broker)))
}

pub(super) async fn create_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    body: Bytes,
) -> Response {
    let result = async {
        crate::api::admit_admin(&state.broker, &principal, "tenant.create")?;
        let request: tenants::WithLimits = json_body(&body)?;
        let store = tenant_admin(&state, &principal, "create", &request.name)?;
        tenants::create(&state.broker, &store, request).await
    };
    api_answer(result.await)
}

pub(super) async fn describe_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "describe", &name)?;
        tenants::describe(&state.broker, &store, &name).await
    };
    api_answer(result.await)
}

/// The body of a PUT: the tenant's new limits, and anonymous rules when they change
/// (the name is in the path).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewLimits {
    #[serde(default)]
    limits: crate::store::TenantLimits,
    #[serde(default)]
    anonymous: Option<tenants::Anonymous>,
}

pub(super) async fn update_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "update", &name)?;
        let NewLimits { limits, anonymous } = json_body(&body)?;
        let request = tenants::WithLimits {
            name,
            limits,
            anonymous,
        };
        tenants::update(&state.broker, &store, request).await
    };
    api_answer(result.await)
}

pub(super) async fn delete_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "delete", &name)?;
        tenants::delete(&state.broker, &store, &name).await
    };
    api_answer(result.await)
}
