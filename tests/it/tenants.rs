//! Tenants through the `$CANOPY.tenant.*` API and the CLI: create, list, describe,
//! update and delete; a creation is one store write however many tenants exist.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::memory::InMemory;
use serde_json::{Value, json};

use canopy::store::observed::ObservedStore;

use crate::common::{api, start, test_config};

async fn call(client: &async_nats::Client, op: &str, body: Value) -> (u16, Value) {
    api(client, &format!("tenant.{op}"), body).await
}

async fn user_call(client: &async_nats::Client, op: &str, body: Value) -> (u16, Value) {
    api(client, &format!("user.{op}"), body).await
}

fn names(list: &Value) -> Vec<&str> {
    list["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect()
}

#[tokio::test]
async fn tenants_are_created_listed_described_updated_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config();
    config.store.url = format!("file://{}", dir.path().display());
    let server = start(config.clone()).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");

    let (status, list) = call(&client, "list", json!({})).await;
    assert_eq!((status, names(&list)), (200, vec!["default"]));

    let (status, created) = call(
        &client,
        "create",
        json!({"name": "acme", "limits": {"max_connections": 10}}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["limits"]["max_connections"], 10);
    let (status, again) = call(&client, "create", json!({"name": "acme"})).await;
    assert_eq!(status, 409, "{again}");
    for bad in ["", "Acme", "a.b", "-x", &"x".repeat(65)] {
        let (status, refused) = call(&client, "create", json!({"name": bad})).await;
        assert_eq!(status, 400, "{bad:?}: {refused}");
    }
    let (status, refused) = call(
        &client,
        "create",
        json!({"name": "x", "limits": {"max_bananas": 1}}),
    )
    .await;
    assert_eq!(status, 400, "unknown limits are refused: {refused}");

    let (status, described) = call(&client, "describe", json!({"name": "acme"})).await;
    assert_eq!(status, 200, "{described}");
    assert_eq!(described["usage"]["subjects"], 0);
    let (status, updated) = call(
        &client,
        "update",
        json!({"name": "acme", "limits": {"max_subjects": 5}}),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["limits"], json!({"max_subjects": 5}));
    let (_, created) = call(&client, "create", json!({"name": "beta"})).await;
    assert_eq!(created["name"], "beta");

    let (status, refused) = call(&client, "delete", json!({"name": "default"})).await;
    assert_eq!(status, 400, "{refused}");
    let (status, deleted) = call(&client, "delete", json!({"name": "beta"})).await;
    assert_eq!(
        (status, &deleted["deleted"]),
        (200, &json!(true)),
        "{deleted}"
    );
    // Gone at once.
    let (status, _) = call(&client, "describe", json!({"name": "beta"})).await;
    assert_eq!(status, 404);
    let (_, list) = call(&client, "list", json!({})).await;
    assert_eq!(names(&list), ["acme", "default"]);
    // Purged in the background: then the name is free again.
    let mut recreated = 0;
    for _ in 0..200 {
        let (status, _) = call(&client, "create", json!({"name": "beta"})).await;
        recreated = status;
        if status == 200 {
            break;
        }
        assert_eq!(status, 409, "only 'being deleted' may delay it");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(recreated, 200, "the purge finished");

    // Records survive a restart, limits included.
    server.stop().await;
    let server = start(config).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    let (_, list) = call(&client, "list", json!({})).await;
    assert_eq!(names(&list), ["acme", "beta", "default"]);
    assert_eq!(list["tenants"][0]["limits"], json!({"max_subjects": 5}));
    server.stop().await;
}

#[tokio::test]
async fn creating_a_tenant_is_one_store_write_however_many_exist() {
    let observed = Arc::new(ObservedStore::new(Arc::new(InMemory::new())));
    let counters = Arc::clone(&observed.counters);
    let mut config = test_config();
    config.store.url = "memory://".into();
    let server = canopy::server::Server::bind_on(config, Some(observed))
        .await
        .expect("binds")
        .spawn();
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    // Object-store writes of one creation: each answer comes after its write is durable.
    let writes_of = |name: String| {
        let client = client.clone();
        let counters = Arc::clone(&counters);
        async move {
            let before = counters.puts.load(Ordering::SeqCst);
            let (status, body) = call(&client, "create", json!({ "name": name })).await;
            assert_eq!(status, 200, "{body}");
            counters.puts.load(Ordering::SeqCst) - before
        }
    };
    let first = writes_of("t-first".into()).await;
    for i in 0..300 {
        writes_of(format!("t{i}")).await;
    }
    let last = writes_of("t-last".into()).await;
    assert_eq!(
        first, last,
        "a creation costs the same with 1 or 301 tenants"
    );
    assert_eq!(first, 1, "one durable write: the tenant's record");
    let (_, list) = call(&client, "list", json!({})).await;
    assert_eq!(names(&list).len(), 303);
    server.stop().await;
}

#[tokio::test]
async fn users_and_tokens_are_managed_per_tenant_and_go_with_it() {
    let server = start(test_config()).await;
    let client = async_nats::connect(server.native_url())
        .await
        .expect("connect");
    call(&client, "create", json!({"name": "acme"})).await;
    let (status, created) = user_call(
        &client,
        "create",
        json!({"tenant": "acme", "name": "dev-1", "password": "s3cret",
               "permissions": {"publish": {"allow": ["devices.{user}.>"]}}}),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["password"], true);
    assert_eq!(
        created["permissions"]["publish"]["allow"],
        json!(["devices.{user}.>"])
    );
    let (status, _) = user_call(
        &client,
        "create",
        json!({"tenant": "acme", "name": "dev-1"}),
    )
    .await;
    assert_eq!(status, 409);
    let (status, _) = user_call(&client, "create", json!({"tenant": "nope", "name": "x"})).await;
    assert_eq!(status, 404);
    let (status, _) = user_call(&client, "create", json!({"tenant": "acme", "name": "a.b"})).await;
    assert_eq!(status, 400);
    // The same name in another tenant is another user.
    let (status, _) = user_call(
        &client,
        "create",
        json!({"tenant": "default", "name": "dev-1"}),
    )
    .await;
    assert_eq!(status, 200);

    let (status, issued) = user_call(
        &client,
        "token.create",
        json!({"tenant": "acme", "name": "dev-1"}),
    )
    .await;
    assert_eq!(status, 200, "{issued}");
    let token = issued["token"].as_str().expect("a token");
    let id = issued["id"].as_str().expect("an id");
    assert!(token.starts_with("cnp.acme.dev-1."), "{token}");
    let (_, listed) = user_call(&client, "list", json!({"tenant": "acme"})).await;
    assert_eq!(listed["users"][0]["tokens"], json!([id]));
    assert!(
        !listed.to_string().contains(token),
        "the token is shown once"
    );
    let (status, _) = user_call(
        &client,
        "token.revoke",
        json!({"tenant": "acme", "name": "dev-1", "id": id}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = user_call(
        &client,
        "token.revoke",
        json!({"tenant": "acme", "name": "dev-1", "id": id}),
    )
    .await;
    assert_eq!(status, 404);

    // Users go with their tenant.
    call(&client, "delete", json!({"name": "acme"})).await;
    for _ in 0..200 {
        if call(&client, "create", json!({"name": "acme"})).await.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, listed) = user_call(&client, "list", json!({"tenant": "acme"})).await;
    assert_eq!(listed["users"], json!([]));
    let (_, listed) = user_call(&client, "list", json!({"tenant": "default"})).await;
    assert_eq!(listed["users"][0]["name"], "dev-1");
    let (status, _) = user_call(
        &client,
        "delete",
        json!({"tenant": "default", "name": "dev-1"}),
    )
    .await;
    assert_eq!(status, 200);
    server.stop().await;
}
