//! A cluster node's server side: joining (its mesh, its listener for the other nodes,
//! its record), and the shards it owns, each its own store under the store's place, opened
//! when the node wins the shard and closed when it hands it over or loses it.
//!
//! Must never: keep serving a shard after [`ShardHost::close`], or open one twice.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ServerError;
use crate::broker::Broker;
use crate::broker::durable::StoreRouter;
use crate::broker::mesh::Mesh;
use crate::cluster::{Closing, ShardHost};
use crate::config::ClusterConfig;
use crate::server::relays::RelayHost;
use crate::store::{Store, StoreSettings};

/// Opens and closes the node's shard stores; the mesh keeps the open ones, where
/// routing looks them up.
pub struct ShardStores {
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    /// The settings every shard's store is opened with, but for its place.
    settings: StoreSettings,
    /// `authz.bootstrap_admin_password`: the default tenant's owner makes the admin.
    bootstrap_admin: Option<String>,
    /// The MQTT clients this node serves for the tenants of its shards.
    relays: Arc<RelayHost>,
    /// The `[[tables]]` (each written by the owner of its tenant's shard), and the
    /// store's settings that place them.
    tables: Tables,
    /// The table writers running for each open shard, stopped before it closes.
    writers: parking_lot::Mutex<HashMap<u32, (CancellationToken, TaskTracker)>>,
}

/// The `[[tables]]` a cluster writes, and the store settings that place them (in
/// the bucket, under the store's prefix, where every node finds them).
#[derive(Clone, Default)]
pub struct Tables {
    pub tables: Vec<crate::config::TableConfig>,
    pub store: crate::config::StoreConfig,
}

impl ShardStores {
    pub fn new(
        broker: Arc<Broker>,
        mesh: Arc<Mesh>,
        settings: StoreSettings,
        bootstrap_admin: Option<String>,
        relays: Arc<RelayHost>,
        tables: Tables,
    ) -> Self {
        Self {
            broker,
            mesh,
            settings,
            bootstrap_admin,
            relays,
            tables,
            writers: parking_lot::Mutex::default(),
        }
    }

    /// Starts the writers of the tables whose tenants live in `shard`.
    fn start_writers(&self, shard: u32, store: &Arc<Store>) {
        let mine: Vec<_> = self
            .tables
            .tables
            .iter()
            .filter(|table| self.mesh.shard_of(&table.tenant) == shard)
            .cloned()
            .collect();
        if mine.is_empty() {
            return;
        }
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let broker = &self.broker;
        crate::tables::writer::start(
            Arc::clone(store),
            &|name| super::table_parts(broker, name),
            &mine,
            &self.tables.store,
            &tracker,
            stop.clone(),
        );
        tracker.close();
        self.writers.lock().insert(shard, (stop, tracker));
    }

    /// Stops the table writers of `shard`, waiting up to `wait` for their last
    /// commits: the next owner goes on from whatever was committed.
    async fn stop_writers(&self, shard: u32, wait: std::time::Duration) {
        let Some((stop, tracker)) = self.writers.lock().remove(&shard) else {
            return;
        };
        stop.cancel();
        if tokio::time::timeout(wait, tracker.wait()).await.is_err() {
            tracing::warn!(
                shard,
                "a table writer did not stop in time; its next owner goes on from its last commit"
            );
        }
    }
}

#[async_trait::async_trait]
impl ShardHost for ShardStores {
    async fn open(&self, shard: u32, claim: i64) -> Result<(), String> {
        // The ownership task opens and closes shards one at a time.
        if self.mesh.is_open(shard) {
            return Ok(());
        }
        let mut settings = self.settings.clone();
        settings.url = settings
            .url
            .shard(shard)
            .ok_or_else(|| "a store in memory cannot be shared by nodes".to_owned())?;
        settings.clock = self.broker.clock().clone();
        // Opening bumps the database's writer epoch: a stalled previous owner that
        // wakes now is fenced at its next write.
        let store = Store::open(settings, Arc::new(StoreRouter::new(&self.broker)))
            .await
            .map_err(|e| e.to_string())?;
        let store = Arc::new(store);
        self.mesh.open_shard(shard, Arc::clone(&store), claim);
        if let Some(password) = self.bootstrap_admin.clone()
            && self.mesh.shard_of(crate::tenancy::DEFAULT_TENANT) == shard
            && let Err(error) = super::bootstrap_admin(&store, password).await
        {
            tracing::warn!(%error, "could not make the bootstrap admin");
        }
        self.broker.open_shard_tenants(&store, shard).await;
        self.start_writers(shard, &store);
        self.broker.release_parked(shard);
        Ok(())
    }

    fn offsets(&self) -> std::collections::BTreeMap<u32, u64> {
        self.mesh.shard_offsets()
    }

    /// The default tenant's shard: it holds the records every node's first
    /// clients need (the bootstrap admin among them).
    fn first(&self) -> Option<u32> {
        Some(self.mesh.shard_of(crate::tenancy::DEFAULT_TENANT))
    }

    async fn close(&self, shard: u32, how: Closing) {
        // Publishes for its tenants go to the next owner from now on.
        let Some(store) = self.mesh.close_shard(shard) else {
            return;
        };
        let wait = match how {
            Closing::Handover => std::time::Duration::from_secs(5),
            Closing::Lost => std::time::Duration::from_secs(1),
        };
        self.stop_writers(shard, wait).await;
        self.broker
            .release_shard_tenants(shard, how == Closing::Handover)
            .await;
        // Its MQTT clients save their sessions and connect again, to be served by
        // the next owner.
        let mesh = &self.mesh;
        self.relays
            .move_away(|tenant| mesh.shard_of(tenant) == shard, wait)
            .await;
        match (how, store.close().await) {
            (_, Ok(())) => {}
            (Closing::Handover, Err(error)) => {
                tracing::error!(shard, %error, "the shard's store did not close cleanly")
            }
            // A lost shard's store may well be fenced already: nothing it still
            // held was acknowledged.
            (Closing::Lost, Err(error)) => {
                tracing::warn!(shard, %error, "closed a lost shard's store")
            }
        }
    }
}

/// A node about to join its cluster: its mesh attached to the broker, its shards'
/// host ready and its listener for the other nodes bound.
pub(super) struct Joining {
    shards: Arc<ShardStores>,
    mesh: Arc<Mesh>,
    listener: TcpListener,
    relays: Arc<RelayHost>,
}

/// The addresses a node's clients reach it at.
pub(super) struct Addresses {
    pub native: SocketAddr,
    pub mqtt: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
}

impl Joining {
    pub(super) async fn prepare(
        cluster: &ClusterConfig,
        config: &crate::config::Config,
        broker: &Arc<Broker>,
        settings: StoreSettings,
    ) -> Result<Self, ServerError> {
        let tables = Tables {
            tables: config.tables.clone(),
            store: config.store.clone(),
        };
        tracing::warn!(
            "cluster mode is being built (issue 28): publishes, subscriptions, logins, \
             tenants, users, schemas, API calls, groups, MQTT sessions, /ws, the HTTP \
             admin API and tables work through every node"
        );
        let mesh = Arc::new(
            Mesh::new(&cluster.node_id, cluster.shards)
                .with_secret(cluster.secret.as_deref())
                // A takeover ends within a lease and the store's opening.
                .with_park_wait(std::time::Duration::from_secs(cluster.lease_secs + 5)),
        );
        if cluster.secret.is_none() {
            tracing::warn!(
                "cluster.secret is not set: this node trusts whoever reaches its cluster port \
                 (keep it on a private network)"
            );
        }
        mesh.attach_definitions(crate::cluster::Definitions::new(cluster)?);
        broker.attach_mesh(Arc::clone(&mesh));
        let listener =
            TcpListener::bind(cluster.listen)
                .await
                .map_err(|source| ServerError::Bind {
                    protocol: "cluster",
                    addr: cluster.listen,
                    source,
                })?;
        let relays = Arc::new(RelayHost::new(&cluster.name));
        Ok(Self {
            shards: Arc::new(ShardStores::new(
                Arc::clone(broker),
                Arc::clone(&mesh),
                settings,
                config.authz.bootstrap_admin_password.clone(),
                Arc::clone(&relays),
                tables,
            )),
            mesh,
            listener,
            relays,
        })
    }

    /// Where the MQTT clients other nodes relay here will be served.
    pub(super) fn relays(&self) -> Arc<RelayHost> {
        Arc::clone(&self.relays)
    }

    /// Joins: the node's record (its addresses as the others reach them) in etcd,
    /// its share of the shards claimed, its links to the other nodes started.
    pub(super) async fn join(
        self,
        cluster: &ClusterConfig,
        broker: &Arc<Broker>,
        addresses: Addresses,
        stop: CancellationToken,
    ) -> Result<crate::cluster::Cluster, ServerError> {
        let link = self
            .listener
            .local_addr()
            .map_err(|source| ServerError::Bind {
                protocol: "cluster",
                addr: cluster.listen,
                source,
            })?;
        let advertised = |addr: SocketAddr| match &cluster.advertise_host {
            Some(host) => format!("{host}:{}", addr.port()),
            None => addr.to_string(),
        };
        let node = crate::cluster::NodeRecord {
            id: cluster.node_id.clone(),
            link: advertised(link),
            native: advertised(addresses.native),
            mqtt: addresses.mqtt.map(advertised),
            http: addresses.http.map(advertised),
            joined_ms: crate::clock::system_ms(),
        };
        if let Some(definitions) = self.mesh.definitions() {
            let seen = crate::broker::definitions::SeenByBroker(Arc::clone(broker));
            definitions.watch(Arc::new(seen), stop.clone());
        }
        let admin_first = self.shards.bootstrap_admin.is_some();
        let joined = crate::cluster::Cluster::join(cluster, node, self.shards).await?;
        // Clients are let in once every shard has an owner, so the first of a new
        // cluster's nodes answers its first clients rather than telling them the
        // shards are moving. Its stores may still be opening: stored publishes wait
        // for them (`broker::parked`), and calls too. With a bootstrap admin, the
        // default tenant's shard (opened first) is waited for when this node opens
        // it, as it holds the admin every first login needs. Bounded: a cluster that
        // cannot settle is served as it is.
        let view = joined.view();
        let me = cluster.node_id.as_str();
        let default_shard = self.mesh.shard_of(crate::tenancy::DEFAULT_TENANT);
        let settled = async {
            loop {
                let ready = {
                    let now = view.borrow();
                    now.shards > 0
                        && now.owners.len() == now.shards as usize
                        && now.owners.get(&default_shard).is_some_and(|owner| {
                            owner.node != me || !admin_first || self.mesh.is_open(default_shard)
                        })
                };
                if ready {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        let bound = std::time::Duration::from_secs(cluster.lease_secs.saturating_mul(3));
        if tokio::time::timeout(bound, settled).await.is_err() {
            tracing::warn!("not every shard has an owner yet; serving clients anyway");
        }
        super::links::start(
            Arc::clone(broker),
            self.mesh,
            cluster.name.clone(),
            self.listener,
            joined.view(),
            self.relays,
            stop,
        );
        Ok(joined)
    }
}
