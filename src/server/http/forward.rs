//! Admin calls over HTTP (`/api/…`) that reach a node not owning their tenant's
//! shard: sent on, once, to the owner's HTTP listener, whose answer is given back
//! as it came. The handlers decide: one that needs a store this node does not hold
//! answers 503 naming the owner (`Canopy-Owner`) before doing anything, and this
//! layer turns that answer into the owner's. The owner logs the caller in again
//! from the same credentials (every node sees the same users).
//!
//! Must never: forward a request that came forwarded (two nodes whose views
//! disagree for a moment would pass it back and forth), or forward when the first
//! answer was anything but that 503.

use std::sync::LazyLock;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::HttpState;

/// The header of a 503 that names the tenant's owner.
pub(super) const OWNER: HeaderName = HeaderName::from_static("canopy-owner");
/// Marks a request one node sent on to another.
const FORWARDED_BY: HeaderName = HeaderName::from_static("canopy-forwarded-by");
/// The largest admin request body taken (schemas are the largest).
const MAX_BODY: usize = 4 << 20;

static CLIENT: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default()
});

pub(super) async fn to_owner(
    State(state): State<HttpState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(mesh) = state.broker.mesh() else {
        return next.run(request).await;
    };
    if request.headers().contains_key(&FORWARDED_BY) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an admin request's body may be {MAX_BODY} bytes at most\n"),
        )
            .into_response();
    };
    let (method, uri, headers) = (
        parts.method.clone(),
        parts.uri.clone(),
        parts.headers.clone(),
    );
    let response = next
        .run(Request::from_parts(parts, Body::from(body.clone())))
        .await;
    if response.status() != StatusCode::SERVICE_UNAVAILABLE {
        return response;
    }
    let Some(owner) = response
        .headers()
        .get(&OWNER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return response;
    };
    let address = mesh
        .view()
        .and_then(|(_, view)| view.borrow().nodes.get(&owner)?.http.clone());
    let Some(address) = address else {
        return response;
    };
    let me = mesh.me().to_string();
    match send(&address, state.tls, &me, method, &uri, &headers, body).await {
        Ok(answer) => answer,
        Err(error) => {
            tracing::debug!(%owner, %error, "could not send an admin request on to its owner");
            response
        }
    }
}

/// Sends the request to the owner at `address` and takes its answer.
async fn send(
    address: &str,
    tls: bool,
    me: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, reqwest::Error> {
    let scheme = if tls { "https" } else { "http" };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = CLIENT
        .request(method, format!("{scheme}://{address}{path}"))
        .body(body);
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE] {
        if let Some(value) = headers.get(&name) {
            request = request.header(name, value);
        }
    }
    if let Ok(me) = HeaderValue::from_str(me) {
        request = request.header(FORWARDED_BY, me);
    }
    let answer = request.send().await?;
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = answer.bytes().await?;
    let mut response = (status, bytes).into_response();
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    Ok(response)
}
