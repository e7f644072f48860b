//! The coordination alone, nodes in this process: which node owns which shard, told
//! through real etcd leases and watches. The nodes' hosts only record what they were
//! asked to open and close; the processes test has them open real shard stores.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use canopy::cluster::{Closing, Cluster, ClusterError, Etcd, NodeRecord, ShardHost, View};
use canopy::config::ClusterConfig;
use parking_lot::Mutex;

use super::{etcd_endpoint, fresh_cluster_name};
use crate::common::eventually;

/// The shards a node was told to serve, and everything it was told, in order.
#[derive(Default)]
struct Recorder {
    serving: Mutex<BTreeSet<u32>>,
    log: Mutex<Vec<(u32, &'static str)>>,
}

#[async_trait::async_trait]
impl ShardHost for Recorder {
    async fn open(&self, shard: u32, _claim: i64) -> Result<(), String> {
        assert!(
            self.serving.lock().insert(shard),
            "shard {shard} opened twice"
        );
        self.log.lock().push((shard, "open"));
        Ok(())
    }

    async fn close(&self, shard: u32, how: Closing) {
        assert!(
            self.serving.lock().remove(&shard),
            "shard {shard} closed unopened"
        );
        let what = match how {
            Closing::Handover => "handover",
            Closing::Lost => "lost",
        };
        self.log.lock().push((shard, what));
    }
}

fn config(name: &str, node: &str, shards: u32) -> ClusterConfig {
    ClusterConfig {
        etcd: vec![etcd_endpoint()],
        name: name.to_owned(),
        node_id: node.to_owned(),
        shards,
        lease_secs: 2,
        ..ClusterConfig::default()
    }
}

fn record(node: &str) -> NodeRecord {
    NodeRecord {
        id: node.to_owned(),
        link: String::new(),
        native: "127.0.0.1:4222".into(),
        mqtt: None,
        http: None,
        joined_ms: 0,
    }
}

async fn join(name: &str, node: &str, shards: u32) -> (Cluster, Arc<Recorder>) {
    let host = Arc::new(Recorder::default());
    let cluster = Cluster::join(&config(name, node, shards), record(node), host.clone())
        .await
        .expect("joins");
    (cluster, host)
}

/// Waits until every shard is served by exactly one of `hosts`, each serving
/// `shares[i]`, and `view` agrees.
async fn settled(what: &str, hosts: &[&Arc<Recorder>], shares: &[usize], shards: u32) {
    eventually(what, Duration::from_secs(15), || async {
        let serving: Vec<BTreeSet<u32>> = hosts.iter().map(|h| h.serving.lock().clone()).collect();
        let counts: Vec<usize> = serving.iter().map(BTreeSet::len).collect();
        let union: BTreeSet<u32> = serving.iter().flatten().copied().collect();
        let total: usize = counts.iter().sum();
        (counts == shares && union.len() == shards as usize && total == shards as usize)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn three_nodes_split_the_shards_fairly_and_one_leaving_hands_its_shards_over() {
    let name = fresh_cluster_name();
    let (a, host_a) = join(&name, "a", 16).await;
    settled("a alone holds every shard", &[&host_a], &[16], 16).await;
    let (b, host_b) = join(&name, "b", 16).await;
    let (c, host_c) = join(&name, "c", 16).await;
    settled(
        "16 shards over three nodes: 6, 5 and 5",
        &[&host_a, &host_b, &host_c],
        &[6, 5, 5],
        16,
    )
    .await;
    // A moves only what it must: what it gave up it handed over, never lost.
    assert!(
        host_a.log.lock().iter().all(|(_, what)| *what != "lost"),
        "{:?}",
        host_a.log.lock()
    );

    let view: View = c.view().borrow().clone();
    assert_eq!(view.nodes.len(), 3);
    assert_eq!(view.owners.len(), 16);

    a.leave().await;
    assert!(host_a.serving.lock().is_empty(), "a left holding shards");
    assert_eq!(
        host_a
            .log
            .lock()
            .iter()
            .filter(|(_, w)| *w == "handover")
            .count(),
        16,
        "a hands over everything it held: {:?}",
        host_a.log.lock()
    );
    settled("b and c take a's shards", &[&host_b, &host_c], &[8, 8], 16).await;
    b.leave().await;
    c.leave().await;
}

#[tokio::test]
async fn a_node_whose_lease_is_gone_drops_its_shards_and_joins_again() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("canopy=debug")
        .with_test_writer()
        .try_init();
    let name = fresh_cluster_name();
    let (a, host_a) = join(&name, "a", 4).await;
    let (b, host_b) = join(&name, "b", 4).await;
    settled(
        "two nodes, two shards each",
        &[&host_a, &host_b],
        &[2, 2],
        4,
    )
    .await;

    // What etcd does when a lease expires unrenewed (a stalled or cut-off node): the
    // lease goes, and the node's record and claims with it.
    let etcd = Etcd::new(&[etcd_endpoint()], Duration::from_secs(2)).expect("client");
    let a_lease = a
        .view()
        .borrow()
        .owners
        .values()
        .find(|o| o.node == "a")
        .expect("a owns")
        .lease;
    etcd.revoke(a_lease).await.expect("revoked");

    eventually(
        "a learns it lost its shards",
        Duration::from_secs(10),
        || async {
            (host_a
                .log
                .lock()
                .iter()
                .filter(|(_, w)| *w == "lost")
                .count()
                == 2)
                .then_some(())
        },
    )
    .await;
    // b may take all four meanwhile, and a, back with a new lease, gets its share again.
    settled("a back with its share", &[&host_a, &host_b], &[2, 2], 4).await;
    a.leave().await;
    b.leave().await;
}

#[tokio::test]
async fn a_node_configured_with_another_shard_count_is_refused() {
    let name = fresh_cluster_name();
    let (a, _) = join(&name, "a", 8).await;
    let refused = Cluster::join(
        &config(&name, "b", 16),
        record("b"),
        Arc::new(Recorder::default()),
    )
    .await
    .err()
    .expect("refused");
    assert!(
        matches!(
            refused,
            ClusterError::ShardCount {
                recorded: 8,
                configured: 16,
                ..
            }
        ),
        "{refused}"
    );
    a.leave().await;
}
