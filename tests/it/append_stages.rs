//! `$CANOPY.append` goes through the same publish stages as a publish: the server's
//! namespaces, the rights, the validators, the stored-bytes limit and the rate quota,
//! each message through its own stages and the quota charged only once all of them
//! passed, so a refused append spends nothing. (Its size stage cannot be reached on
//! the native protocol: the call's own body is held to `max_payload` first.)

use serde_json::{Value, json};

use crate::common::{api, publish_acked, start, test_config};
use crate::quotas::limit_default;

async fn append(client: &async_nats::Client, subject: &str, data: &[String]) -> (u16, Value) {
    let messages: Vec<_> = data.iter().map(|d| json!({ "data": d })).collect();
    api(
        client,
        "append",
        json!({"subject": subject, "messages": messages}),
    )
    .await
}

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn an_append_is_held_to_the_namespaces() {
    let server = start(test_config()).await;
    let client = async_nats::connect(server.native_url()).await.unwrap();

    let (status, answer) = append(&client, "$SYS.orders", &texts(&["x"])).await;
    assert_eq!(status, 403, "{answer}");
    let text = answer["error"]["description"].as_str().unwrap_or_default();
    assert!(text.contains("reserved"), "{answer}");

    let (status, answer) = append(&client, "$JS.API.STREAM.INFO.x", &texts(&["x"])).await;
    assert_eq!(status, 403, "{answer}");
    server.stop().await;
}

#[tokio::test]
async fn a_refused_append_spends_no_token_and_the_stored_bytes_limit_holds() {
    let server = start(test_config()).await;
    let client = async_nats::connect(server.native_url()).await.unwrap();
    crate::schemas::bind(&client, "orders.a", json!({"type": "integer"})).await;

    limit_default(&client, json!({"max_publish_msgs_per_sec": 3})).await;
    // Two good messages, then one its schema refuses: refused whole, and no token
    // spent, so three messages fit right after (before, the first two were charged).
    let (status, answer) = append(&client, "orders.a", &texts(&["1", "2", "\"x\""])).await;
    assert_eq!(status, 400, "{answer}");
    let text = answer["error"]["description"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("message 2 does not match") && text.contains("nothing was appended"),
        "{answer}"
    );
    let (status, answer) = append(&client, "orders.a", &texts(&["1", "2", "3"])).await;
    assert_eq!(status, 200, "{answer}");
    // The rate is spent now: the next append is refused as over the quota.
    let (status, answer) = append(&client, "orders.a", &texts(&["4", "5", "6"])).await;
    assert_eq!(status, 429, "{answer}");

    // Filled to the byte by one acked publish (its bytes are its Canopy-Ack header
    // block and its payload): then an append is refused.
    let (status, described) = api(&client, "tenant.describe", json!({"name": "default"})).await;
    assert_eq!(status, 200, "{described}");
    let used = described["usage"]["stored_bytes"]
        .as_u64()
        .expect("stored bytes");
    let block = "NATS/1.0\r\nCanopy-Ack: durable\r\n\r\n".len() as u64;
    limit_default(&client, json!({"max_stored_bytes": used + block + 100})).await;
    publish_acked(&client, "orders.b", vec![b'a'; 100]).await;
    let (status, answer) = append(&client, "orders.b", &texts(&["more"])).await;
    assert_eq!(status, 429, "{answer}");
    let text = answer["error"]["description"].as_str().unwrap_or_default();
    assert!(text.contains("stored bytes"), "{answer}");
    server.stop().await;
}
