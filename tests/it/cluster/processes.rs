//! Canopy nodes as processes (`canopy serve` with `[cluster]`) on one S3 bucket
//! (moto) and one etcd: each node opens the stores of the shards it owns; a node
//! killed loses its shards to the others once its lease expires, a node told to stop
//! hands them over first, and a node stalled past its lease drops them on waking.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

use super::{etcd_endpoint, fresh_cluster_name};
use crate::cli::{ServeProcess, run};
use crate::common::{eventually, metric_sample as sample, publish_acked, s3_env};

const SHARDS: u32 = 6;
const LEASE_SECS: u64 = 2;

fn node_env(cluster: &str, node: &str) -> Vec<(String, String)> {
    let mut env = s3_env(cluster);
    env.extend(
        [
            ("CANOPY_CLUSTER__ETCD", format!("[\"{}\"]", etcd_endpoint())),
            ("CANOPY_CLUSTER__NAME", cluster.to_owned()),
            ("CANOPY_CLUSTER__NODE_ID", node.to_owned()),
            ("CANOPY_CLUSTER__SHARDS", SHARDS.to_string()),
            ("CANOPY_CLUSTER__LEASE_SECS", LEASE_SECS.to_string()),
            ("CANOPY_CLUSTER__LISTEN", "127.0.0.1:0".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    );
    env
}

async fn start(cluster: &str, node: &str) -> ServeProcess {
    ServeProcess::start_with_env(&[], &node_env(cluster, node)).await
}

/// `canopy cluster status --json`.
pub async fn status(cluster: &str) -> Value {
    let out = run(&[
        "cluster",
        "status",
        "--json",
        "--etcd",
        &etcd_endpoint(),
        "--name",
        cluster,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON status")
}

/// Each live node's count of shards, by id, when every shard is owned.
fn shares(status: &Value) -> Option<Vec<(String, u64)>> {
    let owners = status["owners"].as_array()?;
    if owners.len() != SHARDS as usize || owners.iter().any(|o| o["owner"].is_null()) {
        return None;
    }
    Some(
        status["nodes"]
            .as_array()?
            .iter()
            .map(|n| {
                (
                    n["id"].as_str().unwrap_or_default().to_owned(),
                    n["shards"].as_u64().unwrap_or(0),
                )
            })
            .collect(),
    )
}

async fn settled(cluster: &str, expected: &[(&str, u64)]) -> Value {
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    eventually(
        &format!("shares {expected:?}"),
        Duration::from_secs(40),
        || async {
            let status = status(cluster).await;
            (shares(&status) == Some(expected.clone())).then_some(status)
        },
    )
    .await
}

pub fn signal(process: &ServeProcess, signal: &str) {
    let pid = process.child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

async fn log_of(mut process: ServeProcess) -> Vec<String> {
    signal(&process, "-TERM");
    tokio::time::timeout(Duration::from_secs(30), process.child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("exit status");
    process.log.await.expect("log")
}

#[tokio::test]
async fn three_nodes_share_the_shards_and_survivors_take_a_killed_nodes_shards() {
    let cluster = fresh_cluster_name();
    let a = start(&cluster, "a").await;
    let b = start(&cluster, "b").await;
    let mut c = start(&cluster, "c").await;
    let status = settled(&cluster, &[("a", 2), ("b", 2), ("c", 2)]).await;
    let natives: Vec<&str> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["native"].as_str().expect("native address"))
        .collect();
    assert!(
        natives.contains(&a.url.trim_start_matches("nats://")),
        "{natives:?}"
    );

    // NATS clients learn every node from INFO, to reconnect to another.
    let info = first_line(a.url.trim_start_matches("nats://")).await;
    let info: Value = serde_json::from_str(info.trim_start_matches("INFO ")).expect("INFO JSON");
    let mut urls: Vec<&str> = info["connect_urls"]
        .as_array()
        .expect("connect_urls")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    urls.sort_unstable();
    let mut expected: Vec<&str> = natives.clone();
    expected.sort_unstable();
    assert_eq!(urls, expected);

    let killed = Instant::now();
    c.child.start_kill().expect("kill -9");
    c.child.wait().await.expect("reaped");
    settled(&cluster, &[("a", 3), ("b", 3)]).await;
    eprintln!(
        "takeover after kill -9 (lease {LEASE_SECS}s): {:?}",
        killed.elapsed()
    );

    // A node told to stop hands its shards over before it exits.
    let b_log = log_of(b).await;
    assert_eq!(
        b_log
            .iter()
            .filter(|l| l.contains("handed the shard over"))
            .count(),
        3,
        "{b_log:#?}"
    );
    settled(&cluster, &[("a", SHARDS as u64)]).await;
    let a_log = log_of(a).await;
    assert!(
        !a_log
            .iter()
            .any(|l| l.contains("claim on the shard is gone")),
        "a lost a claim: {a_log:#?}"
    );
}

#[tokio::test]
async fn a_node_stalled_past_its_lease_drops_its_shards_on_waking_and_rejoins() {
    let cluster = fresh_cluster_name();
    let a = start(&cluster, "a").await;
    let b = start(&cluster, "b").await;
    settled(&cluster, &[("a", 3), ("b", 3)]).await;

    signal(&a, "-STOP");
    settled(&cluster, &[("b", SHARDS as u64)]).await;
    signal(&a, "-CONT");
    // Back with a new lease, a gets its share again, handed over by b.
    settled(&cluster, &[("a", 3), ("b", 3)]).await;

    let a_log = log_of(a).await;
    assert!(
        a_log.iter().any(|l| l.contains("lease expired")
            || l.contains("could not be renewed")
            || l.contains("claim on the shard is gone")),
        "a never noticed it lost its shards: {a_log:#?}"
    );
    let b_log = log_of(b).await;
    assert!(
        b_log
            .iter()
            .filter(|l| l.contains("handed the shard over"))
            .count()
            >= 3,
        "{b_log:#?}"
    );
}

/// Node `node`'s address for `what` (`mqtt`, `http`, `link`, `native`), from the
/// cluster's status.
pub fn node_address<'a>(status: &'a Value, node: &str, what: &str) -> &'a str {
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["id"] == node)
        .and_then(|n| n[what].as_str())
        .unwrap_or_else(|| panic!("node {node}'s {what} address in {status}"))
}

/// The nodes of a three-node cluster but `owner`.
pub fn others_than(owner: &str) -> Vec<&'static str> {
    ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != owner)
        .collect()
}

/// The MQTT address of node `node`, from the cluster's status.
pub fn mqtt_address(status: &Value, node: &str) -> (String, u16) {
    let address = node_address(status, node, "mqtt");
    let (host, port) = address.rsplit_once(':').expect("host:port");
    (host.to_owned(), port.parse().expect("port"))
}

#[tokio::test]
async fn a_wildcard_subscriber_on_one_node_gets_what_publishers_on_the_others_send() {
    let cluster = fresh_cluster_name();
    let a = start(&cluster, "a").await;
    let b = start(&cluster, "b").await;
    let c = start(&cluster, "c").await;
    let status = settled(&cluster, &[("a", 2), ("b", 2), ("c", 2)]).await;

    let watcher = async_nats::connect(&a.url).await.expect("connect to a");
    let mut orders = watcher.subscribe("orders.>").await.expect("subscribe");
    watcher.flush().await.expect("flush");
    let on_b = async_nats::connect(&b.url).await.expect("connect to b");
    // a's interest reaches b over their link in the background: probe until it has.
    let probing = Instant::now();
    loop {
        on_b.publish("orders.probe", "probe".into())
            .await
            .expect("publish");
        if tokio::time::timeout(Duration::from_millis(200), orders.next())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            probing.elapsed() < Duration::from_secs(10),
            "a's interest never reached b"
        );
    }
    while tokio::time::timeout(Duration::from_millis(300), orders.next())
        .await
        .is_ok()
    {}

    // Stored, acknowledged publishes through b (which may or may not own the
    // default tenant's shard) and QoS 1 MQTT publishes through c.
    let (host, port) = mqtt_address(&status, "c");
    let mut options = rumqttc::MqttOptions::new("device-on-c", host, port);
    options.set_keep_alive(Duration::from_secs(30));
    let (device, mut events) = rumqttc::AsyncClient::new(options, 64);
    let acked = tokio::spawn(async move {
        let mut acks = 0;
        while acks < 20 {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => acks += 1,
                Ok(_) => {}
                Err(e) => panic!("MQTT connection to c failed: {e}"),
            }
        }
    });
    for i in 0..20 {
        device
            .publish(
                format!("orders/mqtt/{}", i % 2),
                rumqttc::QoS::AtLeastOnce,
                false,
                format!("c{i}"),
            )
            .await
            .expect("queued");
    }
    for i in 0..30 {
        publish_acked(&on_b, &format!("orders.native.{}", i % 3), format!("b{i}")).await;
    }
    tokio::time::timeout(Duration::from_secs(20), acked)
        .await
        .expect("c acks every MQTT publish")
        .expect("acks");

    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut total = 0;
    while total < 50 {
        let message = tokio::time::timeout(Duration::from_secs(10), orders.next())
            .await
            .unwrap_or_else(|_| panic!("only {total} of 50 reached a: {seen:?}"))
            .expect("subscription open");
        total += 1;
        seen.entry(message.subject.to_string())
            .or_default()
            .push(String::from_utf8_lossy(&message.payload).into_owned());
    }
    // Once each, in each subject's order.
    for (subject, payloads) in &seen {
        let mine: Vec<u32> = payloads
            .iter()
            .map(|p| p[1..].parse().expect("n"))
            .collect();
        let mut sorted = mine.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(mine, sorted, "{subject}: out of order or repeated");
    }
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), orders.next())
            .await
            .is_err(),
        "a message came twice"
    );

    // Each node's /metrics shows its part: at most one of b and c owns the default
    // tenant, so the other forwarded its 20 or 30 publishes.
    let mut forwarded = 0.0;
    for id in ["a", "b", "c"] {
        let page = metrics_of(&status, id).await;
        assert_eq!(sample(&page, "canopy_cluster_nodes"), Some(3.0), "{page}");
        assert_eq!(
            sample(&page, "canopy_cluster_shards_owned"),
            Some(2.0),
            "{page}"
        );
        forwarded += sample(&page, "canopy_cluster_appends_forwarded_total").unwrap_or(0.0);
    }
    assert!(forwarded >= 20.0, "{forwarded} publishes forwarded");
    drop((a, b, c));
}

/// Node `node`'s `/metrics` page.
async fn metrics_of(status: &Value, node: &str) -> String {
    let address = node_address(status, node, "http");
    let (code, page) = crate::common::http_request(
        address.parse().expect("address"),
        "GET",
        "/metrics",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 200, "{page}");
    page
}

/// Three nodes, a, b and c, of a fresh cluster, settled with two shards each. Each
/// node's NATS listener keeps its port across restarts, so clients reconnect to it.
pub struct Cluster3 {
    pub name: String,
    nodes: Vec<(String, String, ServeProcess)>,
    /// Settings every node gets beside the cluster's.
    extra: Vec<(String, String)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Cluster3 {
    pub async fn start() -> Cluster3 {
        Self::start_with(&[]).await
    }

    /// Three nodes with `extra` settings (environment variables) each.
    pub async fn start_with(extra: &[(&str, &str)]) -> Cluster3 {
        let name = fresh_cluster_name();
        let extra: Vec<(String, String)> = extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut nodes = Vec::new();
        for id in ["a", "b", "c"] {
            let listen = format!("127.0.0.1:{}", free_port());
            let mut env = node_env(&name, id);
            env.extend(extra.iter().cloned());
            let node = ServeProcess::start_on(&listen, &[], &env).await;
            nodes.push((id.to_owned(), listen, node));
        }
        settled(&name, &[("a", 2), ("b", 2), ("c", 2)]).await;
        Cluster3 { name, nodes, extra }
    }

    /// Stops node `id` with SIGTERM (it hands its shards over) and starts it again
    /// on the same port; returns the stopped process's log.
    pub async fn restart(&mut self, id: &str) -> Vec<String> {
        let at = self
            .nodes
            .iter()
            .position(|(n, _, _)| n == id)
            .expect("a node of the cluster");
        let (id, listen, old) = self.nodes.remove(at);
        // The old process frees the port before the new one binds it.
        let log = log_of(old).await;
        let mut env = node_env(&self.name, &id);
        env.extend(self.extra.iter().cloned());
        let new = ServeProcess::start_on(&listen, &[], &env).await;
        self.nodes.insert(at, (id, listen, new));
        log
    }

    pub async fn status(&self) -> Value {
        status(&self.name).await
    }

    /// Waits until the three nodes hold two shards each again.
    pub async fn settled(&self) -> Value {
        settled(&self.name, &[("a", 2), ("b", 2), ("c", 2)]).await
    }

    pub fn node(&self, id: &str) -> &ServeProcess {
        &self
            .nodes
            .iter()
            .find(|(n, _, _)| n == id)
            .expect("a node of the cluster")
            .2
    }

    /// Kills node `id` with SIGKILL and waits until it is gone.
    pub async fn kill(&mut self, id: &str) {
        let (_, _, node) = self
            .nodes
            .iter_mut()
            .find(|(n, _, _)| n == id)
            .expect("a node of the cluster");
        node.child.start_kill().expect("kill -9");
        node.child.wait().await.expect("reaped");
        self.nodes.retain(|(n, _, _)| n != id);
    }

    /// A node other than `id`.
    pub fn not(&self, id: &str) -> &ServeProcess {
        &self
            .nodes
            .iter()
            .find(|(n, _, _)| n != id)
            .expect("another node")
            .2
    }
}

/// The node owning the default tenant's shard, as `status` says.
pub fn owner_of_default(status: &Value) -> String {
    owner_of(status, "default")
}

/// The node owning `tenant`'s shard, as `status` says.
pub fn owner_of(status: &Value, tenant: &str) -> String {
    let shard = canopy::cluster::share::shard_of(tenant, SHARDS);
    status["owners"][shard as usize]["owner"]
        .as_str()
        .expect("the default tenant's shard has an owner")
        .to_owned()
}

/// The first line a server sends on a new connection (its INFO).
async fn first_line(address: &str) -> String {
    use tokio::io::AsyncBufReadExt;
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let mut line = String::new();
    tokio::io::BufReader::new(stream)
        .read_line(&mut line)
        .await
        .expect("INFO");
    line
}
