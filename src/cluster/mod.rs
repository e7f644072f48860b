//! Several nodes on one object store: who is alive, and which node owns which shard.
//!
//! etcd holds the membership and the ownership, nothing else of the data: each node
//! keeps one lease alive, its record (`/<cluster>/nodes/<id>`) and its shards' owner
//! keys (`/<cluster>/owners/<shard>`) live and die with it, and every node watches
//! both to keep a [`View`] of the cluster. A shard is claimed with a create-if-absent
//! transaction, so two nodes never both believe they won it; what a node does with a
//! shard it won (open its store, route its tenants) is its [`ShardHost`]'s business.
//! A node whose lease is lost (expired while it was stalled or cut off) drops its
//! shards at once; the store's writer fencing, not this module, is what makes sure a
//! stalled owner that wakes after its shards moved writes nothing.
//!
//! Must never: decide anything from the wall clock of another machine, or keep a
//! shard whose owner key is not this node's own creation.

mod definitions;
pub mod etcd;
mod lease;
mod ownership;
mod secret;
pub mod share;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ClusterConfig;
pub use definitions::{DefKey, Definition, DefinitionChange, Definitions, DefinitionsHost};
pub use etcd::{Etcd, EtcdError};
pub use secret::{LinkSecret, Unproven};

/// What joining or reading a cluster can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(
        "cluster {cluster} was made with {recorded} shards; this node is configured with \
         {configured} (cluster.shards must match)"
    )]
    ShardCount {
        cluster: String,
        recorded: u32,
        configured: u32,
    },
    #[error("etcd holds something unreadable at {key}: {reason}")]
    Corrupt { key: String, reason: String },
}

/// How the nodes reach this one, as its record in etcd says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: String,
    /// `host:port` the other nodes link to.
    #[serde(default)]
    pub link: String,
    /// `host:port` of the NATS-compatible listener.
    pub native: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// When the node joined (its own clock, for people reading the status).
    pub joined_ms: u64,
}

/// An owner key's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OwnerRecord {
    node: String,
    since_ms: u64,
}

/// Who owns a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub node: String,
    /// When the owner claimed it (the owner's clock).
    pub since_ms: u64,
    /// The revision of the claim: a later claim of the same shard has a higher one.
    pub claim: i64,
    /// The lease the claim dies with.
    pub lease: i64,
}

/// The cluster as this node last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The etcd revision the view reflects.
    pub revision: i64,
    pub shards: u32,
    /// Live nodes by id.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Owned shards; a shard missing here is free.
    pub owners: BTreeMap<u32, Owner>,
    /// The durable offset of each shard, as its owner last reported it, by node.
    pub offsets: BTreeMap<String, BTreeMap<u32, u64>>,
}

impl View {
    /// The shards no node owns.
    pub fn free(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.shards).filter(|shard| !self.owners.contains_key(shard))
    }

    /// How many shards `node` owns.
    pub fn held_by(&self, node: &str) -> u32 {
        self.owners.values().filter(|o| o.node == node).count() as u32
    }
}

/// Where a cluster's keys live in etcd.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Self {
        Self {
            root: format!("/{cluster}/"),
        }
    }

    /// Everything of the cluster: what a node watches.
    pub fn root(&self) -> &str {
        &self.root
    }

    fn shard_count(&self) -> String {
        format!("{}shards", self.root)
    }

    fn node(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.root)
    }

    fn owner(&self, shard: u32) -> String {
        format!("{}owners/{shard:04}", self.root)
    }

    /// Whether a change of `key` changes membership or ownership.
    fn is_decisive(&self, key: &str) -> bool {
        key.strip_prefix(&self.root).is_some_and(|rest| {
            rest.starts_with("nodes/") || rest.starts_with("owners/") || rest == "shards"
        })
    }

    fn offsets(&self, id: &str) -> String {
        format!("{}offsets/{id}", self.root)
    }

    /// Applies one key's value to `view`; false when the key is none of the cluster's.
    fn apply_put(&self, view: &mut View, kv: &etcd::KeyValue) -> Result<bool, ClusterError> {
        let corrupt = |reason: String| ClusterError::Corrupt {
            key: kv.key.clone(),
            reason,
        };
        let Some(rest) = kv.key.strip_prefix(&self.root) else {
            return Ok(false);
        };
        if let Some(id) = rest.strip_prefix("nodes/") {
            let record: NodeRecord =
                serde_json::from_slice(&kv.value).map_err(|e| corrupt(e.to_string()))?;
            view.nodes.insert(id.to_owned(), record);
        } else if let Some(shard) = rest.strip_prefix("owners/") {
            let shard: u32 = shard.parse().map_err(|_| corrupt("not a shard".into()))?;
            let record: OwnerRecord =
                serde_json::from_slice(&kv.value).map_err(|e| corrupt(e.to_string()))?;
            // A watch from an older listing replays claims a node may already have
            // seen superseded (its own newer claim, made meanwhile): keep the newer.
            if view
                .owners
                .get(&shard)
                .is_some_and(|o| o.claim > kv.create_revision)
            {
                return Ok(true);
            }
            view.owners.insert(
                shard,
                Owner {
                    node: record.node,
                    since_ms: record.since_ms,
                    claim: kv.create_revision,
                    lease: kv.lease,
                },
            );
        } else if let Some(id) = rest.strip_prefix("offsets/") {
            let offsets: BTreeMap<u32, u64> =
                serde_json::from_slice(&kv.value).map_err(|e| corrupt(e.to_string()))?;
            view.offsets.insert(id.to_owned(), offsets);
        } else if rest == "shards" {
            let text = std::str::from_utf8(&kv.value).unwrap_or_default();
            view.shards = text.parse().map_err(|_| corrupt(format!("{text:?}")))?;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// Applies a deletion seen at `revision` to `view`.
    fn apply_delete(&self, view: &mut View, key: &str, revision: i64) {
        let Some(rest) = key.strip_prefix(&self.root) else {
            return;
        };
        if let Some(id) = rest.strip_prefix("nodes/") {
            view.nodes.remove(id);
        } else if let Some(id) = rest.strip_prefix("offsets/") {
            view.offsets.remove(id);
        } else if let Some(Ok(shard)) = rest.strip_prefix("owners/").map(str::parse::<u32>) {
            // A late deletion of an older claim must not undo a newer one.
            if view.owners.get(&shard).is_some_and(|o| o.claim < revision) {
                view.owners.remove(&shard);
            }
        }
    }

    /// The view a listing of the cluster's keys gives.
    fn view_of(&self, kvs: &[etcd::KeyValue]) -> Result<View, ClusterError> {
        let mut view = View::default();
        for kv in kvs {
            self.apply_put(&mut view, kv)?;
        }
        Ok(view)
    }
}

/// How a shard is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Handed over: everything acknowledged is flushed before the claim is given back.
    Handover,
    /// The lease is gone, maybe the shard with it: stop at once; the store's fencing
    /// refuses whatever this node still tries to write.
    Lost,
}

/// What a node does with the shards it wins.
#[async_trait::async_trait]
pub trait ShardHost: Send + Sync + 'static {
    /// Opens `shard`, claimed at etcd revision `claim` (what writes made as its
    /// owner are guarded by); from its return on, this node serves it. An error
    /// gives the claim back.
    async fn open(&self, shard: u32, claim: i64) -> Result<(), String>;
    /// Closes `shard`: this node no longer serves it.
    async fn close(&self, shard: u32, how: Closing);
    /// The durable offset of each shard this node serves, for the status.
    fn offsets(&self) -> BTreeMap<u32, u64> {
        BTreeMap::new()
    }
    /// A shard to open before the others when this node wins several at once.
    fn first(&self) -> Option<u32> {
        None
    }
}

/// This node's membership of a cluster: its lease kept alive, its shards claimed and
/// handed over, and its view of the others.
pub struct Cluster {
    view: watch::Receiver<View>,
    /// Stops the ownership task, which hands the shards over.
    stop: CancellationToken,
    /// Ends the lease, once the shards are handed over.
    end_lease: CancellationToken,
    lease: tokio::task::JoinHandle<()>,
    ownership: tokio::task::JoinHandle<()>,
}

impl Cluster {
    /// Joins the cluster `config` names as `node` (its record's addresses filled in),
    /// with `host` opening and closing the shards this node comes to own. Returns once
    /// the node's record is in etcd; shards are claimed in the background.
    pub async fn join(
        config: &ClusterConfig,
        node: NodeRecord,
        host: Arc<dyn ShardHost>,
    ) -> Result<Self, ClusterError> {
        let etcd = Etcd::new(&config.etcd, request_timeout(config.lease_secs))?;
        let keys = Keys::new(&config.name);
        agree_on_shard_count(&etcd, &keys, &config.name, config.shards).await?;
        let stop = CancellationToken::new();
        let end_lease = CancellationToken::new();
        let (lease_tx, lease_rx) = watch::channel(lease::Lease::NONE);
        let lease = lease::LeaseKeeper {
            etcd: etcd.clone(),
            key: keys.node(&node.id),
            record: serde_json::to_vec(&node).unwrap_or_default(),
            ttl: Duration::from_secs(config.lease_secs),
            current: lease_tx,
            stop: end_lease.clone(),
        };
        let mut first = lease_rx.clone();
        let lease = tokio::spawn(lease.run());
        // Wait for the first lease and record, or for the keeper to give up.
        while !first.borrow_and_update().is_live() {
            if first.changed().await.is_err() {
                break;
            }
        }
        let (view_tx, view) = watch::channel(View::default());
        let view_tx = Arc::new(view_tx);
        tokio::spawn(report_offsets(
            etcd.clone(),
            keys.offsets(&node.id),
            Arc::clone(&host),
            lease_rx.clone(),
            end_lease.clone(),
        ));
        let ownership = ownership::Ownership {
            etcd: etcd.clone(),
            keys: keys.clone(),
            me: node.id.clone(),
            shards: config.shards,
            free_grace: Duration::from_secs(config.lease_secs),
            host,
            lease: lease_rx,
            view: view_tx,
            held: BTreeMap::new(),
            free_since: BTreeMap::new(),
            stop: stop.clone(),
        };
        let ownership = tokio::spawn(ownership.run());
        tracing::info!(node = %node.id, cluster = %config.name, shards = config.shards, "joined the cluster");
        Ok(Self {
            view,
            stop,
            end_lease,
            lease,
            ownership,
        })
    }

    /// The cluster as this node sees it, updated on every change.
    pub fn view(&self) -> watch::Receiver<View> {
        self.view.clone()
    }

    /// Leaves: hands every shard over (flushed, then its claim given back), then
    /// ends the lease, which takes the node's record with it.
    pub async fn leave(self) {
        self.stop.cancel();
        let _ = self.ownership.await;
        self.end_lease.cancel();
        let _ = self.lease.await;
        tracing::info!("left the cluster");
    }
}

/// How often a node reports its shards' offsets, when they moved.
const OFFSETS_EVERY: Duration = Duration::from_secs(2);

/// Keeps this node's report of its shards' durable offsets in etcd, under its
/// lease (so it goes with the node), for `canopy cluster status` and the console.
/// Written only when an offset moved or the lease changed.
async fn report_offsets(
    etcd: Etcd,
    key: String,
    host: Arc<dyn ShardHost>,
    lease: watch::Receiver<lease::Lease>,
    stop: CancellationToken,
) {
    let mut written: Option<(i64, BTreeMap<u32, u64>)> = None;
    let mut tick = tokio::time::interval(OFFSETS_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = *lease.borrow();
        if !now.is_live() {
            continue;
        }
        let offsets = host.offsets();
        if written
            .as_ref()
            .is_some_and(|(id, last)| *id == now.id && *last == offsets)
        {
            continue;
        }
        let value = serde_json::to_vec(&offsets).unwrap_or_default();
        match etcd.put(&key, &value, now.id).await {
            Ok(()) => written = Some((now.id, offsets)),
            Err(error) => tracing::debug!(%error, "could not report the shards' offsets"),
        }
    }
}

/// A bound on one call to etcd: well inside a lease, so a renewal that hangs is
/// given up on while the lease still stands.
fn request_timeout(lease_secs: u64) -> Duration {
    Duration::from_millis((lease_secs * 1000 / 3).clamp(500, 5000))
}

/// Records the shard count when the cluster is new; refuses a node that disagrees.
async fn agree_on_shard_count(
    etcd: &Etcd,
    keys: &Keys,
    cluster: &str,
    configured: u32,
) -> Result<(), ClusterError> {
    let key = keys.shard_count();
    match etcd
        .create(&key, configured.to_string().as_bytes(), 0)
        .await?
    {
        etcd::Created::Yes { .. } => Ok(()),
        etcd::Created::Taken(existing) => {
            let recorded = existing
                .as_ref()
                .and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse::<u32>().ok())
                .ok_or_else(|| ClusterError::Corrupt {
                    key: key.clone(),
                    reason: "not a shard count".into(),
                })?;
            if recorded == configured {
                Ok(())
            } else {
                Err(ClusterError::ShardCount {
                    cluster: cluster.to_owned(),
                    recorded,
                    configured,
                })
            }
        }
    }
}

/// One shard's line in a status.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    pub shard: u32,
    pub owner: Option<String>,
    /// Milliseconds since the owner claimed it (by the owner's clock).
    pub owned_for_ms: Option<u64>,
    /// The highest offset durable in the shard's store, as its owner last
    /// reported it (every few seconds while it moves).
    pub offset: Option<u64>,
}

/// One node's line in a status.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    #[serde(flatten)]
    pub record: NodeRecord,
    pub shards: u32,
    /// Seconds the node's lease has left before it expires unrenewed.
    pub lease_left_secs: Option<i64>,
}

/// The cluster as etcd holds it now.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub cluster: String,
    pub shards: u32,
    pub nodes: Vec<NodeStatus>,
    pub owners: Vec<ShardStatus>,
}

/// Reads the status of cluster `name` from etcd, without joining it.
pub async fn status(etcd: &Etcd, name: &str, now_ms: u64) -> Result<Status, ClusterError> {
    let keys = Keys::new(name);
    let (kvs, _) = etcd.list(keys.root()).await?;
    let view = keys.view_of(&kvs)?;
    let mut leases = BTreeMap::new();
    for kv in kvs.iter().filter(|kv| kv.lease != 0) {
        if let Some(rest) = kv.key.strip_prefix(keys.root())
            && let Some(id) = rest.strip_prefix("nodes/")
        {
            leases.insert(id.to_owned(), etcd.time_to_live(kv.lease).await?);
        }
    }
    Ok(Status::of(name, &view, &leases, now_ms))
}

impl Status {
    /// The status `view` shows, with the nodes' leases' seconds left where known.
    pub fn of(
        name: &str,
        view: &View,
        leases: &BTreeMap<String, Option<i64>>,
        now_ms: u64,
    ) -> Status {
        let nodes = view
            .nodes
            .values()
            .map(|record| NodeStatus {
                shards: view.held_by(&record.id),
                lease_left_secs: leases.get(&record.id).copied().flatten(),
                record: record.clone(),
            })
            .collect();
        let owners = (0..view.shards)
            .map(|shard| {
                let owner = view.owners.get(&shard);
                ShardStatus {
                    shard,
                    owner: owner.map(|o| o.node.clone()),
                    owned_for_ms: owner.map(|o| now_ms.saturating_sub(o.since_ms)),
                    offset: owner.and_then(|o| view.offsets.get(&o.node)?.get(&shard).copied()),
                }
            })
            .collect();
        Status {
            cluster: name.to_owned(),
            shards: view.shards,
            nodes,
            owners,
        }
    }
}
