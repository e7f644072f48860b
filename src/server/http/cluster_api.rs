//! `GET /api/cluster`: the cluster as this node sees it (nodes, shards, owners and
//! offsets), what the console's overview shows; `$CANOPY.cluster.status` answers
//! the same over NATS.
//!
//! Must never: show the layout to anyone `/metrics` would not show everything to.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::HttpState;
use super::caller::Caller;
use super::metrics::MetricsScope;

pub(super) async fn cluster_status(
    State(state): State<HttpState>,
    Caller(principal): Caller,
) -> Response {
    if !matches!(
        MetricsScope::of(&state, &principal),
        Some(MetricsScope::Everything)
    ) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "the cluster is shown to the default tenant's users\n",
        )
            .into_response();
    }
    let Some((name, view)) = state.broker.mesh().and_then(|mesh| mesh.view()) else {
        return (
            StatusCode::NOT_FOUND,
            "this server runs alone: it is no cluster's node\n",
        )
            .into_response();
    };
    let status = crate::cluster::Status::of(
        name,
        &view.borrow(),
        &BTreeMap::new(),
        crate::clock::system_ms(),
    );
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&status).unwrap_or_default(),
    )
        .into_response()
}
