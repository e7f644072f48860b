//! `/api/schemas`: the caller's tenant's schema bindings over HTTP, the same
//! operations and rights as `$CANOPY.schema.<op>` on the native API.
//!
//! - `GET /api/schemas` lists them (`?subject=`: only the one that subject falls under,
//!   with its schema);
//! - `GET /api/schemas/{pattern}` shows one (`?version=N` an older version);
//! - `PUT /api/schemas/{pattern}` puts a new version: the body is the schema itself,
//!   or `{"schema": …, "mode": …, "on_invalid": …, "dead_letter": …}`; the options
//!   may also be query parameters;
//! - `GET /api/schemas/{pattern}/history`, `DELETE /api/schemas/{pattern}`;
//! - `GET /api/schema-errors` (`?subject=` or `?pattern=`): the messages refused lately;
//! - `GET /api/asyncapi` (`?tenant=`): the tenant's AsyncAPI 3.0 document.
//!
//! Must never do the work itself: `api::schemas` does.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;

use crate::api::ApiError;
use crate::api::schemas::{self, AsyncApiOf, ErrorsOf, Put, Which};
use crate::schemas::OnInvalid;
use crate::store::Store;
use crate::tenancy::Principal;

use super::HttpState;
use super::caller::Caller;
use super::tenant_api::{api_answer, json_body};

/// The store and the caller's right to `$CANOPY.schema.<op>`.
fn allowed(state: &HttpState, principal: &Principal, op: &str) -> Result<Arc<Store>, ApiError> {
    crate::api::admit(&state.broker, principal, &format!("schema.{op}"))?;
    crate::api::store_for(&state.broker, &principal.tenant)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    subject: Option<String>,
}

pub(super) async fn list_schemas(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Query(query): Query<ListQuery>,
) -> Response {
    let result = async {
        let tenant = &*principal.tenant;
        match query.subject {
            None => {
                allowed(&state, &principal, "list")?;
                Ok(schemas::list(&state.broker, &principal, tenant))
            }
            // The list of the one binding that covers the subject, empty when none
            // does: no binding is an answer, not a missing resource.
            Some(subject) => {
                let store = allowed(&state, &principal, "get")?;
                let which = Which {
                    subject: Some(subject),
                    ..Which::default()
                };
                match schemas::get(&state.broker, &store, &principal, tenant, which).await {
                    Ok(binding) => Ok(serde_json::json!({ "schemas": [binding] })),
                    Err(ApiError { code: 404, .. }) => Ok(serde_json::json!({ "schemas": [] })),
                    Err(error) => Err(error),
                }
            }
        }
    };
    api_answer(result.await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct VersionQuery {
    version: Option<u64>,
}

pub(super) async fn get_schema(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(pattern): Path<String>,
    Query(query): Query<VersionQuery>,
) -> Response {
    let result = async {
        let store = allowed(&state, &principal, "get")?;
        let which = Which {
            pattern: Some(pattern),
            subject: None,
            version: query.version,
        };
        schemas::get(&state.broker, &store, &principal, &principal.tenant, which).await
    };
    api_answer(result.await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PutQuery {
    mode: Option<String>,
    on_invalid: Option<OnInvalid>,
    dead_letter: Option<String>,
}

/// A PUT's body: the options beside the schema, or the schema alone.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped {
    schema: serde_json::Value,
    mode: Option<String>,
    on_invalid: Option<OnInvalid>,
    dead_letter: Option<String>,
}

pub(super) async fn put_schema(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(pattern): Path<String>,
    Query(query): Query<PutQuery>,
    body: Bytes,
) -> Response {
    let result = async {
        let store = allowed(&state, &principal, "put")?;
        let value: serde_json::Value = json_body(&body)?;
        let wrapped = if value.get("schema").is_some() {
            json_body::<Wrapped>(&body)?
        } else {
            Wrapped {
                schema: value,
                mode: None,
                on_invalid: None,
                dead_letter: None,
            }
        };
        let put = Put {
            pattern,
            schema: wrapped.schema,
            mode: wrapped.mode.or(query.mode),
            on_invalid: wrapped.on_invalid.or(query.on_invalid),
            dead_letter: wrapped.dead_letter.or(query.dead_letter),
        };
        schemas::put(&state.broker, &store, &principal, &principal.tenant, put).await
    };
    api_answer(result.await)
}

pub(super) async fn schema_history(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(pattern): Path<String>,
) -> Response {
    let result = async {
        let store = allowed(&state, &principal, "history")?;
        schemas::history(
            &state.broker,
            &store,
            &principal,
            &principal.tenant,
            &pattern,
        )
        .await
    };
    api_answer(result.await)
}

pub(super) async fn delete_schema(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(pattern): Path<String>,
) -> Response {
    let result = async {
        let store = allowed(&state, &principal, "delete")?;
        schemas::delete(
            &state.broker,
            &store,
            &principal,
            &principal.tenant,
            &pattern,
        )
        .await
    };
    api_answer(result.await)
}

pub(super) async fn schema_errors(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Query(of): Query<ErrorsOf>,
) -> Response {
    let result = (|| {
        allowed(&state, &principal, "errors")?;
        schemas::errors(&state.broker, &principal, &principal.tenant, of)
    })();
    api_answer(result)
}

pub(super) async fn asyncapi_document(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Query(of): Query<AsyncApiOf>,
) -> Response {
    let result = crate::api::admit(&state.broker, &principal, "asyncapi")
        .and_then(|()| schemas::asyncapi(&state.broker, &principal, of));
    api_answer(result)
}
