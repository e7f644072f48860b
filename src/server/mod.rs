//! Listeners and the life of a server: bind every port first, then serve until the
//! shutdown token fires, then drain.
//!
//! `Server::bind` is where the secure-default rule lives: with no authentication
//! configured, a listener outside loopback needs `allow_anonymous`. Nothing here
//! parses protocol bytes or routes messages; connection tasks do the one and the
//! broker the other.

pub mod http;
mod links;
mod listener;
pub mod mqtt;
pub mod native;
mod relays;
mod rendered;
pub mod shards;
pub mod tls;
pub mod websocket;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::durable::{Policies, RetentionByPolicy, StoreRouter};
use crate::broker::{Broker, Metrics};
use crate::config::Config;
use crate::store::{Store, StoreSettings};
use crate::tenancy::Authorizer;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "refusing to listen on {addr} without authentication: anyone who can reach it could \
         read and write every subject. Listen on a loopback address (127.0.0.1), or pass \
         --allow-anonymous (server.allow_anonymous = true) to accept anonymous clients"
    )]
    AnonymousOutsideLoopback { addr: SocketAddr },
    #[error("cannot listen on {addr} for {protocol} clients: {source}")]
    Bind {
        protocol: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid pattern in the configuration")]
    Pattern(#[from] canopy_subjects::SubjectError),
    #[error("cannot open the store")]
    Store(#[from] crate::store::StoreError),
    #[error("store.keys: {0}")]
    Keys(crate::sealing::SealError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot join the cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
}

/// Creates the default tenant's `admin` user with `password` unless it exists.
async fn bootstrap_admin(store: &Store, password: String) -> Result<(), ServerError> {
    use crate::tenancy::DEFAULT_TENANT;
    if store.user(DEFAULT_TENANT, "admin").await?.is_some() {
        return Ok(());
    }
    let hash =
        tokio::task::spawn_blocking(move || crate::tenancy::credentials::hash_password(&password))
            .await
            .map_err(|e| crate::store::StoreError::Refused(format!("hashing stopped: {e}")))?
            .map_err(|e| crate::store::StoreError::Refused(e.to_string()))?;
    let admin = crate::store::UserRecord {
        name: "admin".into(),
        created_ms: store.clock().now_ms(),
        password: Some(hash),
        tokens: Vec::new(),
        permissions: crate::store::Permissions::default(),
    };
    store.put_user(DEFAULT_TENANT, &admin).await?;
    tracing::info!("created the default tenant's admin user from bootstrap_admin_password");
    Ok(())
}

fn store_settings(config: &Config) -> Result<StoreSettings, ServerError> {
    let store = &config.store;
    Ok(StoreSettings {
        url: store.url.parse()?,
        flush_interval: Duration::from_millis(store.flush_interval_ms.max(1)),
        dedupe_window: Duration::from_secs(store.dedupe_window_secs),
        local_gc: Duration::from_secs(store.local_gc_secs.max(1)),
        compress: store.compression == crate::config::Compression::Lz4,
        max_batch: store.max_batch,
        queue_depth: store.queue_depth,
        s3: store.s3.clone(),
        block_cache_bytes: store.block_cache_mb.saturating_mul(1 << 20),
        meta_cache_bytes: store.meta_cache_mb.saturating_mul(1 << 20),
        object_store: None,
        clock: crate::clock::Clock::default(),
        journal: store.journal,
        journal_bytes: store.journal_mb.max(1).saturating_mul(1 << 20),
        keys: match &store.keys {
            Some(spec) => Some(Arc::new(
                crate::sealing::LocalKeys::load(spec).map_err(ServerError::Keys)?,
            )),
            None => None,
        },
    })
}

/// Opens the one store of a server that is not in a cluster, with what it holds
/// loaded: retention started, tenants being deleted resumed, the bootstrap admin.
async fn open_single_store(
    config: &Config,
    broker: &Arc<Broker>,
    settings: StoreSettings,
) -> Result<(), ServerError> {
    let store = Store::open(settings, Arc::new(StoreRouter::new(broker))).await?;
    tracing::info!(store = %config.store.url, "store open");
    let store = Arc::new(store);
    let retention = RetentionByPolicy::new(
        Policies::new(&config.store.policies)?,
        config.store.retention.max_bytes_per_tenant,
    )
    .with_streams_of(broker);
    store.start_retention(
        Arc::new(retention),
        Duration::from_secs(config.store.retention.interval_secs.max(1)),
    );
    let deleting = broker.tenant_records().load(&store).await?;
    // The dummy password hash, computed before any login could wait for it.
    tokio::task::spawn_blocking(crate::tenancy::credentials::prepare);
    if let Some(password) = config.authz.bootstrap_admin_password.clone() {
        bootstrap_admin(&store, password).await?;
    }
    for tenant in deleting {
        Arc::clone(&store).purge_in_background(tenant);
    }
    broker.attach_store(store);
    Ok(())
}

/// Binds an optional listener, refusing a non-loopback address unless
/// `beyond_loopback` (authentication is on, or anonymous access was allowed).
async fn bind_optional(
    protocol: &'static str,
    addr: Option<SocketAddr>,
    beyond_loopback: bool,
) -> Result<Option<(TcpListener, SocketAddr)>, ServerError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    if !addr.ip().is_loopback() && !beyond_loopback {
        return Err(ServerError::AnonymousOutsideLoopback { addr });
    }
    let bind_error = |source| ServerError::Bind {
        protocol,
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok(Some((listener, local)))
}

/// A server whose ports are bound, ready to run.
pub struct Server {
    config: Arc<Config>,
    broker: Arc<Broker>,
    native: TcpListener,
    native_addr: SocketAddr,
    mqtt: Option<(TcpListener, SocketAddr)>,
    http: Option<(TcpListener, SocketAddr)>,
    tls: Option<tls::Tls>,
    /// This node's membership, when it is one of a cluster's.
    cluster: Option<crate::cluster::Cluster>,
    /// In a cluster: where MQTT clients other nodes relay here are served.
    relays: Option<Arc<relays::RelayHost>>,
    /// Ends the links to the other nodes.
    links_stop: CancellationToken,
}

impl Server {
    pub async fn bind(config: Config) -> Result<Server, ServerError> {
        Self::bind_on(config, None).await
    }

    /// [`Server::bind`] with the store on a given object store instead of the one
    /// `store.url` names: for tests and fault injection.
    pub async fn bind_on(
        config: Config,
        object_store: Option<Arc<dyn object_store::ObjectStore>>,
    ) -> Result<Server, ServerError> {
        let authz = Arc::new(Authorizer::from_config(&config.authz)?);
        let tls = tls::Tls::from_config(&config.tls)?;
        let addr = config.native.listen;
        let authentication_configured = config.authz.require_login;
        if !authentication_configured && !addr.ip().is_loopback() && !config.server.allow_anonymous
        {
            return Err(ServerError::AnonymousOutsideLoopback { addr });
        }
        let native = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind {
                protocol: "native",
                addr,
                source,
            })?;
        let native_addr = native.local_addr().map_err(|source| ServerError::Bind {
            protocol: "native",
            addr,
            source,
        })?;
        let beyond_loopback = authentication_configured || config.server.allow_anonymous;
        let mqtt = bind_optional("mqtt", config.mqtt.listen, beyond_loopback).await?;
        let http = bind_optional("http", config.http.listen, beyond_loopback).await?;
        if !authentication_configured {
            if native_addr.ip().is_loopback() {
                tracing::info!(
                    "no authentication configured: listening on loopback only, so only \
                     this machine can connect"
                );
            } else {
                tracing::warn!(
                    addr = %native_addr,
                    "no authentication configured and anonymous access allowed: anyone who \
                     can reach this address can read and write every subject"
                );
            }
        }
        let policies = Policies::new(&config.store.policies)?;
        let broker = Arc::new(
            Broker::new(authz, Arc::new(Metrics::default()), policies)
                .with_tenant_defaults((&config.limits).into())
                .with_max_answer(config.native.max_payload),
        );
        let mut settings = store_settings(&config)?;
        settings.object_store = object_store;
        settings.clock = broker.clock().clone();
        let shards = match &config.cluster {
            None => {
                open_single_store(&config, &broker, settings).await?;
                None
            }
            Some(cluster) => {
                Some(shards::Joining::prepare(cluster, &config, &broker, settings).await?)
            }
        };
        let tls_on = |listener: &str| config.tls.on(listener);
        let mut listeners = vec![crate::schemas::asyncapi::Listener {
            name: "nats",
            protocol: "nats",
            host: native_addr.to_string(),
            pathname: None,
        }];
        if let Some((_, addr)) = &mqtt {
            listeners.push(crate::schemas::asyncapi::Listener {
                name: "mqtt",
                protocol: if tls_on("mqtt") { "mqtts" } else { "mqtt" },
                host: addr.to_string(),
                pathname: None,
            });
        }
        if let Some((_, addr)) = &http {
            listeners.push(crate::schemas::asyncapi::Listener {
                name: "ws",
                protocol: if tls_on("http") { "wss" } else { "ws" },
                host: addr.to_string(),
                pathname: Some("/ws"),
            });
        }
        broker.advertise(listeners);
        broker.open_tenants().await?;
        let links_stop = CancellationToken::new();
        let relays = shards.as_ref().map(shards::Joining::relays);
        let cluster = match (&config.cluster, shards) {
            (Some(cluster), Some(joining)) => {
                let addresses = shards::Addresses {
                    native: native_addr,
                    mqtt: mqtt.as_ref().map(|(_, addr)| *addr),
                    http: http.as_ref().map(|(_, addr)| *addr),
                };
                Some(
                    joining
                        .join(cluster, &broker, addresses, links_stop.clone())
                        .await?,
                )
            }
            _ => None,
        };
        Ok(Server {
            cluster,
            relays,
            links_stop,
            config: Arc::new(config),
            broker,
            native,
            native_addr,
            mqtt,
            http,
            tls,
        })
    }

    pub fn native_addr(&self) -> SocketAddr {
        self.native_addr
    }

    /// The HTTP listener's address, when HTTP is on.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|(_, addr)| *addr)
    }

    /// The MQTT listener's address, when MQTT is on.
    pub fn mqtt_addr(&self) -> Option<SocketAddr> {
        self.mqtt.as_ref().map(|(_, addr)| *addr)
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(self.broker.metrics())
    }

    /// Serves until `shutdown` fires, then stops accepting, lets every connection
    /// flush what it was sent (up to the drain timeout) and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(protocol = "native", addr = %self.native_addr, "listening");
        let tracker = TaskTracker::new();
        let drain = Duration::from_secs(self.config.server.drain_timeout_secs);
        let context = Arc::new(native::NativeContext::new(
            Arc::clone(&self.config),
            Arc::clone(&self.broker),
            self.native_addr,
            self.tls.clone().filter(|_| self.config.tls.on("native")),
        ));
        let mqtt_context = self.mqtt.as_ref().map(|_| {
            Arc::new(mqtt::MqttContext::new(
                Arc::clone(&self.config),
                Arc::clone(&self.broker),
                self.tls.clone().filter(|_| self.config.tls.on("mqtt")),
            ))
        });
        if let (Some(relays), Some(context)) = (&self.relays, &mqtt_context) {
            relays.serve_mqtt(Arc::clone(context), tracker.clone(), shutdown.clone());
        }
        let http = self.http.map(|(listener, addr)| {
            tracing::info!(protocol = "http", %addr, "listening");
            let websocket = Arc::new(websocket::WsContext::new(
                &self.config,
                Arc::clone(&self.broker),
            ));
            if let Some(relays) = &self.relays {
                relays.serve_ws(Arc::clone(&websocket), tracker.clone(), shutdown.clone());
            }
            let state = http::HttpState {
                broker: Arc::clone(&self.broker),
                mqtt: mqtt_context.clone(),
                websocket,
                shutdown: shutdown.clone(),
                websockets: Arc::default(),
                max_websockets: self.config.http.max_websockets,
                require_login: self.config.authz.require_login,
                tls: self.config.tls.on("http") && self.tls.is_some(),
            };
            let tls = self
                .tls
                .as_ref()
                .filter(|_| self.config.tls.on("http"))
                .map(tls::Tls::for_http);
            tokio::spawn(http::serve(listener, state, tls))
        });
        let mqtt = self
            .mqtt
            .zip(mqtt_context)
            .map(|((listener, addr), context)| {
                tracing::info!(protocol = "mqtt", %addr, "listening");
                let tracker = tracker.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    mqtt::accept_loop(listener, context, &tracker, shutdown).await;
                })
            });
        if let Some(store) = self.broker.store() {
            let broker = &self.broker;
            crate::tables::writer::start(
                Arc::clone(store),
                &|name| table_parts(broker, name),
                &self.config.tables,
                &self.config.store,
                &tracker,
                shutdown.clone(),
            );
        }
        native::accept_loop(self.native, context, &tracker, shutdown.clone()).await;
        if let Some(accepting) = mqtt {
            let _ = accepting.await;
        }
        if let Some(serving) = http {
            let _ = serving.await;
        }
        tracker.close();
        if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
            tracing::warn!(
                open = tracker.len(),
                "drain timeout passed; closing the remaining connections"
            );
        }
        if let Some(cluster) = self.cluster {
            // Every shard handed over (its store flushed and closed) before the
            // node's lease ends; bounded, since handing over needs etcd and the
            // object store: past the bound the lease ends by itself and the other
            // nodes take the shards then.
            if tokio::time::timeout(drain, cluster.leave()).await.is_err() {
                tracing::warn!(
                    "handing the shards over did not finish within the drain timeout; \
                     the other nodes take them when this node's lease expires"
                );
            }
        }
        self.links_stop.cancel();
        if let Some(store) = self.broker.store()
            && let Err(error) = store.close().await
        {
            tracing::error!(%error, "the store did not close cleanly");
        }
        tracing::info!("server stopped");
    }

    /// Runs the server on the current runtime; for tests and embedding.
    pub fn spawn(self) -> RunningServer {
        let shutdown = CancellationToken::new();
        let native_addr = self.native_addr;
        let mqtt_addr = self.mqtt_addr();
        let http_addr = self.http_addr();
        let metrics = self.metrics();
        let clock = self.broker.clock().clone();
        let task = tokio::spawn(self.run(shutdown.clone()));
        RunningServer {
            native_addr,
            mqtt_addr,
            http_addr,
            metrics,
            clock,
            shutdown,
            task,
        }
    }
}

/// A server running in a task of the current runtime.
pub struct RunningServer {
    pub native_addr: SocketAddr,
    /// Set when the MQTT listener is on (it is by default).
    pub mqtt_addr: Option<SocketAddr>,
    /// Set when the HTTP listener is on (it is by default).
    pub http_addr: Option<SocketAddr>,
    pub metrics: Arc<Metrics>,
    /// The server's clock: tests advance it instead of sleeping for an expiry.
    pub clock: crate::clock::Clock,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningServer {
    /// Stops the server and waits until it has drained.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// The URL NATS clients connect to.
    pub fn native_url(&self) -> String {
        format!("nats://{}", self.native_addr)
    }
}

/// What a table's writer takes of its tenant: its schema bindings, taps and plugins.
pub(crate) fn table_parts(broker: &Broker, tenant: &str) -> crate::tables::writer::TenantParts {
    let tenant = broker.tenant(tenant);
    crate::tables::writer::TenantParts {
        schemas: Arc::clone(&tenant.schemas),
        taps: Arc::clone(&tenant.taps),
        plugins: Arc::clone(&tenant.plugins),
    }
}
