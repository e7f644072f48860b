//! `/ws` clients of a cluster: served by the owner of their tenant's shard, relayed
//! there by whichever node they reach, so reads (get, replay) answer through every
//! node, and live messages still reach them from any node.

use std::time::Duration;

use serde_json::{Value, json};

use super::data::until_acked;
use super::processes::{Cluster3, node_address, others_than, owner_of_default};
use crate::frontends::{Ws, WsEvent};

/// The HTTP address of node `node`, from the cluster's status.
fn http_address(status: &Value, node: &str) -> std::net::SocketAddr {
    node_address(status, node, "http")
        .parse()
        .expect("host:port")
}

/// A message's payload as text (`/ws` sends a payload that is not JSON in base64).
fn text_of(message: &Value) -> String {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(message["data_b64"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("data_b64 is not base64 ({e}): {message}"));
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn answer(ws: &mut Ws, request: Value) -> Value {
    match ws.call(request.clone()).await {
        Some(WsEvent::Text(answer)) => answer,
        other => panic!("{request}: {other:?}"),
    }
}

#[tokio::test]
async fn a_ws_client_of_a_node_that_does_not_own_its_tenant_reads_and_gets_live_messages() {
    let cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let owner = owner_of_default(&status);
    let others = others_than(&owner);
    let service = async_nats::connect(&cluster.node(others[1]).url)
        .await
        .expect("service");
    until_acked(&service, "orders.1", "first").await;
    until_acked(&service, "orders.1", "second").await;

    let mut ws = Ws::open(http_address(&status, others[0]), None)
        .await
        .expect("/ws opens on a node that does not own the tenant");
    let got = answer(&mut ws, json!({"op": "get", "subject": "orders.1"})).await;
    assert_eq!(
        (text_of(&got), &got["version"]),
        ("second".to_owned(), &json!(2)),
        "{got}"
    );
    let first = answer(
        &mut ws,
        json!({"op": "get", "subject": "orders.1", "version": 1}),
    )
    .await;
    assert_eq!(text_of(&first), "first", "{first}");

    // Live messages from a publisher on another node reach it too.
    let subscribed = answer(&mut ws, json!({"op": "sub", "pattern": "alerts.>"})).await;
    assert_eq!(subscribed["op"], "ok", "{subscribed}");
    // Its interest reaches the publisher's node in the background: publish until
    // a message arrives.
    let mut message = None;
    for _ in 0..30 {
        service
            .publish("alerts.1", "fire".into())
            .await
            .expect("publish");
        let next = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
        match next {
            Ok(Some(WsEvent::Text(value))) if value["op"] == "msg" => {
                message = Some(value);
                break;
            }
            Ok(Some(WsEvent::Text(_))) | Err(_) => {}
            Ok(other) => panic!("the relayed socket ended: {other:?}"),
        }
    }
    let message = message.expect("a live message through the relay");
    assert_eq!(
        (&message["subject"], text_of(&message)),
        (&json!("alerts.1"), "fire".to_owned()),
        "{message}"
    );
}
