//! `$CANOPY.cluster.status`: the cluster as the node asked sees it (its nodes and
//! their addresses, each shard's owner and durable offset), for the console and for
//! scripts that speak NATS rather than etcd. `canopy cluster status` reads the same
//! from etcd, with the nodes' lease times.
//!
//! Must never: answer a caller outside the default tenant (the house's layout is
//! the operator's), or be forwarded (every node's view is the cluster's).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Answer, ApiCall, ApiError};
use crate::broker::Broker;

pub(super) fn status(broker: &Arc<Broker>, call: &ApiCall) {
    let Some(reply) = call.reply.clone() else {
        return;
    };
    let mut answer = Answer::new(Arc::clone(broker), Arc::clone(&call.routes), reply);
    match answered(broker, call) {
        Ok(status) => answer.json(&status),
        Err(error) => answer.error(error.code, &error.description),
    }
}

fn answered(broker: &Broker, call: &ApiCall) -> Result<serde_json::Value, ApiError> {
    if &*call.principal.tenant != crate::tenancy::DEFAULT_TENANT {
        return Err(ApiError::new(
            403,
            "Permissions Violation for Publish to \"$CANOPY.cluster.status\": the cluster is \
             shown to the default tenant only",
        ));
    }
    let Some((name, view)) = broker.mesh().and_then(|mesh| mesh.view()) else {
        return Err(ApiError::new(
            404,
            "this server runs alone: it is no cluster's node (see `[cluster]` in the README)",
        ));
    };
    let status = crate::cluster::Status::of(
        name,
        &view.borrow(),
        &BTreeMap::new(),
        crate::clock::system_ms(),
    );
    serde_json::to_value(status).map_err(|e| ApiError::new(500, e.to_string()))
}
