//! Definitions every node sees: a tenant, user or schema binding made through one
//! node is what every node logs in, authorises and checks by, within a moment, and
//! a caller's rights travel with a call forwarded to the tenant's owner.

use std::time::Duration;

use serde_json::{Value, json};

use super::processes::{Cluster3, owner_of};
use crate::common::{api, eventually, header, publish_acked, replay_texts, store_request};

const ADMIN_PASSWORD: &str = "admin-secret-1";

async fn login(url: &str, user: &str, password: &str) -> Option<async_nats::Client> {
    async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .max_reconnects(Some(0))
        .connect(url)
        .await
        .ok()
}

/// Logs in, trying again until the definitions reached that node.
async fn login_eventually(url: &str, user: &str, password: &str) -> async_nats::Client {
    eventually(
        &format!("{user} logs in at {url}"),
        Duration::from_secs(10),
        || async { login(url, user, password).await },
    )
    .await
}

/// An API call, tried again while it is answered 503 (its shard moving or being
/// opened: what a client is told to retry).
async fn call(client: &async_nats::Client, op: &str, body: Value) -> (u16, Value) {
    eventually(
        &format!("{op} answered"),
        Duration::from_secs(10),
        || async {
            let (code, answer) = api(client, op, body.clone()).await;
            (code != 503).then_some((code, answer))
        },
    )
    .await
}

async fn with_logins() -> Cluster3 {
    Cluster3::start_with(&[
        ("CANOPY_AUTHZ__REQUIRE_LOGIN", "true"),
        ("CANOPY_AUTHZ__BOOTSTRAP_ADMIN_PASSWORD", ADMIN_PASSWORD),
    ])
    .await
}

fn urls(cluster: &Cluster3) -> Vec<String> {
    ["a", "b", "c"]
        .iter()
        .map(|id| cluster.node(id).url.clone())
        .collect()
}

#[tokio::test]
async fn tenants_and_users_made_through_one_node_log_in_and_work_on_every_node() {
    let cluster = with_logins().await;
    let status = cluster.status().await;
    let acme_owner = owner_of(&status, "acme");
    let urls = urls(&cluster);
    // The admin, made by the default tenant's owner, logs in anywhere.
    let mut admins = Vec::new();
    for url in &urls {
        admins.push(login_eventually(url, "admin", ADMIN_PASSWORD).await);
    }
    // Made through a node that does not own acme's shard: the calls go to its owner.
    let maker = ["a", "b", "c"]
        .iter()
        .position(|id| *id != acme_owner)
        .expect("another node");
    let (code, made) = call(&admins[maker], "tenant.create", json!({"name": "acme"})).await;
    assert_eq!(code, 200, "{made}");
    let (code, made) = call(
        &admins[maker],
        "user.create",
        json!({"tenant": "acme", "name": "ana", "password": "ana-secret-1",
               "permissions": {"publish": {"allow": ["orders.>", "$CANOPY.get", "$CANOPY.replay"]},
                               "subscribe": {"allow": ["orders.>"]}}}),
    )
    .await;
    assert_eq!(code, 200, "{made}");
    // Every node lists it.
    for admin in &admins {
        let listed = eventually("acme listed", Duration::from_secs(10), || async {
            let (_, list) = api(admin, "tenant.list", json!({})).await;
            list.to_string().contains("\"acme\"").then_some(list)
        })
        .await;
        assert!(listed["tenants"].is_array(), "{listed}");
    }
    let mut anas = Vec::new();
    for url in &urls {
        anas.push(login_eventually(url, "ana@acme", "ana-secret-1").await);
    }
    // A subscriber on one node gets what a publisher on another sends, in acme.
    // Its interest reaches the other nodes in the background (as NATS routes'
    // does): stored publishes go on until one is delivered.
    let mut orders = anas[2].subscribe("orders.>").await.expect("subscribe");
    anas[2].flush().await.expect("flush");
    let mut delivered = None;
    for _ in 0..40 {
        let ack = store_request(&anas[0], "orders.1", header("Canopy-Ack", "durable"), "one").await;
        if ack.get("version").is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let next = futures::StreamExt::next(&mut orders);
        if let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), next).await {
            delivered = Some(message);
            break;
        }
    }
    let got = delivered.expect("a publish through a reached the subscriber on c");
    assert_eq!(&got.payload[..], b"one");
    // ana's rights travel with her calls to acme's owner: a read she may do works
    // through every node, one she may not is refused there.
    for ana in &anas {
        let texts = replay_texts(ana, "orders.1").await;
        assert!(
            !texts.is_empty() && texts.iter().all(|t| t == "one"),
            "{texts:?}"
        );
        let (code, refused) = call(ana, "get", json!({"subject": "secret.1"})).await;
        assert_eq!(code, 403, "{refused}");
    }
    // A token issued through one node logs in at another.
    let token = crate::common::issue_token(&admins[maker], "acme", "ana").await;
    let other = (maker + 1) % 3;
    let by_token = eventually("a token login", Duration::from_secs(10), || async {
        async_nats::ConnectOptions::with_token(token.clone())
            .max_reconnects(Some(0))
            .connect(&urls[other])
            .await
            .ok()
    })
    .await;
    let ack = publish_acked(&by_token, "orders.2", "two").await;
    assert_eq!(ack["version"], 1, "{ack}");
    // Deleting the tenant through one node ends its logins on every node.
    let (code, gone) = call(&admins[other], "tenant.delete", json!({"name": "acme"})).await;
    assert_eq!(code, 200, "{gone}");
    for url in &urls {
        eventually(
            "ana refused after the delete",
            Duration::from_secs(10),
            || async {
                login(url, "ana@acme", "ana-secret-1")
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }
    // Those logged in before are closed on every node (a reconnect racing the
    // deletion included).
    for (at, ana) in anas.iter().enumerate() {
        eventually(
            &format!("ana's connection {at} closed"),
            Duration::from_secs(10),
            || async {
                (ana.connection_state() != async_nats::connection::State::Connected).then_some(())
            },
        )
        .await;
    }
}

#[tokio::test]
async fn a_binding_made_on_the_owner_checks_stamps_and_dead_letters_on_every_node() {
    let cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let owner = owner_of(&status, "default");
    let via_owner = async_nats::connect(&cluster.node(&owner).url)
        .await
        .expect("owner");
    let via_other = async_nats::connect(&cluster.not(&owner).url)
        .await
        .expect("other");
    let schema = json!({
        "type": "object",
        "properties": {"kwh": {"type": "number"}},
        "required": ["kwh"]
    });
    let (code, bound) = call(
        &via_owner,
        "schema.put",
        json!({"pattern": "meters.*", "schema": schema, "on_invalid": "dead_letter"}),
    )
    .await;
    assert_eq!(code, 200, "{bound}");
    // The other node sees the binding: it lists it, and an invalid publish through
    // it becomes a dead letter, acked as its subject would have been.
    // Until the binding reaches it, the owner refuses what the other node lets
    // through (nothing invalid is stored either way).
    let ack = eventually("the binding seen", Duration::from_secs(10), || async {
        let ack = store_request(
            &via_other,
            "meters.1",
            header("Canopy-Ack", "durable"),
            r#"{"kwh": "lots"}"#,
        )
        .await;
        ack.get("error").is_none().then_some(ack)
    })
    .await;
    assert_eq!(ack["stream"], "default", "a dead letter is acked: {ack}");
    let valid = publish_acked(&via_other, "meters.1", r#"{"kwh": 2}"#).await;
    assert_eq!(
        valid["version"], 1,
        "only the valid message is on the subject: {valid}"
    );
    let dead: Vec<Value> = crate::common::replay_subject(&via_owner, "$DLQ.schema.meters.1")
        .await
        .iter()
        .map(|m| Value::String(m.text()))
        .collect();
    assert_eq!(dead, [json!(r#"{"kwh": "lots"}"#)]);
    // Stamped with the binding's version by the node it came through.
    let stored = crate::common::replay_subject(&via_owner, "meters.1").await;
    let stamp = stored[0]
        .headers
        .as_ref()
        .and_then(|h| h.get("Canopy-Schema"))
        .map(|v| v.as_str().to_owned());
    assert_eq!(
        stamp.as_deref(),
        Some("meters.*@1"),
        "{:?}",
        stored[0].headers
    );
}

/// An HTTP request to node `id`'s HTTP listener, tried again while it is answered
/// 503 (a shard moving): its status and JSON body.
async fn http(
    status: &Value,
    id: &str,
    method: &str,
    path: &str,
    auth: &str,
    body: &str,
) -> (u16, Value) {
    let address = super::processes::node_address(status, id, "http")
        .parse()
        .expect("address");
    eventually(
        &format!("{method} {path} on {id}"),
        Duration::from_secs(10),
        || async {
            let (code, text) = crate::common::http_request(
                address,
                method,
                path,
                &[("Authorization", auth)],
                body,
            )
            .await;
            let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (code != 503).then_some((code, json))
        },
    )
    .await
}

#[tokio::test]
async fn the_http_admin_api_works_through_nodes_that_do_not_own_the_tenant() {
    let cluster = with_logins().await;
    let status = cluster.status().await;
    let admin = login_eventually(&cluster.node("a").url, "admin", ADMIN_PASSWORD).await;
    let (code, issued) = call(
        &admin,
        "user.token.create",
        json!({"tenant": "default", "name": "admin"}),
    )
    .await;
    assert_eq!(code, 200, "{issued}");
    let auth = format!("Bearer {}", issued["token"].as_str().expect("token"));

    // A tenant whose shard b does not own, made through b's HTTP.
    let name = (0..)
        .map(|i| format!("web{i}"))
        .find(|n| owner_of(&status, n) != "b")
        .expect("a name");
    let body = json!({"name": name}).to_string();
    let (code, made) = http(&status, "b", "POST", "/api/tenants", &auth, &body).await;
    assert_eq!(code, 200, "{made}");
    for id in ["a", "b", "c"] {
        let path = format!("/api/tenants/{name}");
        let (code, described) = http(&status, id, "GET", &path, &auth, "").await;
        assert_eq!(
            (code, &described["name"]),
            (200, &json!(name)),
            "on {id}: {described}"
        );
    }

    // A schema of the default tenant, put through a node that does not own it and
    // read through another.
    let owner = owner_of(&status, "default");
    let others = super::processes::others_than(&owner);
    let schema = json!({"type": "object", "required": ["kwh"]}).to_string();
    let (code, put) = http(
        &status,
        others[0],
        "PUT",
        "/api/schemas/meters.*",
        &auth,
        &schema,
    )
    .await;
    assert_eq!(code, 200, "{put}");
    let (code, got) = http(
        &status,
        others[1],
        "GET",
        "/api/schemas/meters.*",
        &auth,
        "",
    )
    .await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["version"], 1, "{got}");
    // A request that is wrong is answered by the owner as it would be on one node.
    let (code, refused) = http(
        &status,
        others[0],
        "PUT",
        "/api/schemas/meters.*",
        &auth,
        "{",
    )
    .await;
    assert_eq!(code, 400, "{refused}");
}
