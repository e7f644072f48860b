//! What an operator sees of a cluster: `canopy cluster status` (from etcd) with each
//! shard's durable offset, and any node's own view over NATS
//! (`$CANOPY.cluster.status`) and HTTP (`/api/cluster`, what the console shows).

use std::time::Duration;

use serde_json::Value;

use super::data::until_acked;
use super::processes::{Cluster3, node_address, others_than, owner_of_default};
use crate::common::{WAIT, eventually};

/// The default tenant's shard's offset in `status`, once its owner reported one.
fn default_offset(status: &Value) -> Option<u64> {
    let shards = status["owners"].as_array()?.len() as u32;
    let shard = canopy::cluster::share::shard_of("default", shards);
    status["owners"][shard as usize]["offset"].as_u64()
}

#[tokio::test]
async fn the_status_shows_each_shards_offset_and_every_node_shows_the_cluster() {
    let cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let owner = owner_of_default(&status);
    let other_id = others_than(&owner)[0];
    let other = cluster.node(other_id);
    let client = async_nats::connect(&other.url).await.expect("connect");
    until_acked(&client, "seen.1", "first").await;
    let before = eventually("the owner reports its shard's offset", WAIT, || async {
        default_offset(&cluster.status().await).filter(|o| *o > 0)
    })
    .await;
    for i in 0..3 {
        until_acked(&client, "seen.1", &format!("more{i}")).await;
    }
    eventually(
        "the reported offset follows the publishes",
        Duration::from_secs(20),
        || async { default_offset(&cluster.status().await).filter(|o| *o >= before + 3) },
    )
    .await;

    // A node's own view, over NATS: the same nodes and owners as etcd's.
    let answer = tokio::time::timeout(WAIT, client.request("$CANOPY.cluster.status", "".into()))
        .await
        .expect("answered in time")
        .expect("answered");
    let seen: Value = serde_json::from_slice(&answer.payload).expect("JSON");
    let ids = |status: &Value| -> Vec<String> {
        let mut ids: Vec<String> = status["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["id"].as_str().expect("id").to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&seen), ["a", "b", "c"], "{seen}");
    assert_eq!(owner_of_default(&seen), owner);
    assert!(default_offset(&seen).is_some(), "{seen}");

    // And over HTTP, as the console's overview asks.
    let (code, body) = crate::common::http_request(
        node_address(&status, other_id, "http")
            .parse()
            .expect("address"),
        "GET",
        "/api/cluster",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(ids(&seen), ["a", "b", "c"], "{seen}");
    assert_eq!(seen["shards"], status["shards"]);
}

#[tokio::test]
async fn the_console_of_any_node_shows_the_clusters_nodes() {
    use crate::browser::{Script, assert_png, chromium};
    assert!(chromium().exists(), "no Chromium at {:?}", chromium());
    let cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let http = node_address(&status, "b", "http");
    let mut script = Script::spawn("console_cluster_check.mjs", &[format!("http://{http}")]);
    assert_eq!(script.expect("nodes").await, "a,b,c");
    assert_eq!(
        script.expect("shards").await,
        status["shards"].to_string(),
        "every shard is held by one of the nodes shown"
    );
    let path = script.expect("screenshot console-cluster ").await;
    assert_png(std::path::Path::new(&path));
    script.finish("all checks passed").await;
}

/// The INFO lines a raw NATS connection to `address` (CONNECT with `protocol` 1, as
/// nats.go, nats.js and nats-py send) reads, as JSON, one at a time.
struct InfoReader {
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>>,
    _write: tokio::net::tcp::OwnedWriteHalf,
}

impl InfoReader {
    async fn connect(address: &str) -> InfoReader {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let (read, mut write) = stream.into_split();
        write
            .write_all(b"CONNECT {\"verbose\":false,\"protocol\":1,\"headers\":true}\r\nPING\r\n")
            .await
            .expect("CONNECT");
        let mut reader = InfoReader {
            lines: tokio::io::BufReader::new(read).lines(),
            _write: write,
        };
        let first = reader.next_info(WAIT).await.expect("the first INFO");
        assert_eq!(
            first["connect_urls"].as_array().map(Vec::len),
            Some(3),
            "{first}"
        );
        reader
    }

    /// The next INFO within `wait` (PINGs answered, other lines skipped).
    async fn next_info(&mut self, wait: Duration) -> Option<Value> {
        tokio::time::timeout(wait, async {
            while let Some(line) = self.lines.next_line().await.expect("read") {
                if let Some(json) = line.strip_prefix("INFO ") {
                    return Some(serde_json::from_str(json).expect("INFO JSON"));
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }
}

#[tokio::test]
async fn nats_clients_are_sent_a_new_info_when_a_node_goes() {
    let mut cluster = Cluster3::start().await;
    let status = cluster.status().await;
    let mut client = InfoReader::connect(node_address(&status, "a", "native")).await;
    let gone = node_address(&status, "c", "native").to_owned();
    cluster.kill("c").await;
    // Once c's lease is out, a tells its clients the nodes that are left.
    let info = client
        .next_info(Duration::from_secs(30))
        .await
        .expect("a new INFO after c went");
    let urls: Vec<&str> = info["connect_urls"]
        .as_array()
        .expect("connect_urls")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(urls.len(), 2, "{info}");
    assert!(
        !urls.contains(&gone.as_str()),
        "{urls:?} still names {gone}"
    );
}
