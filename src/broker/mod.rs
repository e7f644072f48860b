//! Routing: the one place where a publish becomes deliveries.
//!
//! Each tenant has its own subscription trie. A publish walks the trie once, encodes
//! the message into the outbox of every matching subscription (one member of each
//! queue group), and leaves the wake-ups to the caller's [`Wakes`] so a subscriber is
//! woken once per inbound batch. Routing never waits for a subscriber, a socket or the
//! store; a full outbox makes its owner a slow consumer and routing goes on.
//!
//! Lock order: a trie write may never be attempted while the same thread is inside a
//! trie match (the left-right trie would wait for itself), so subscriptions that reach
//! their UNSUB maximum during a match are removed after it.

pub mod definitions;
pub mod durable;
pub mod envelope;
pub mod groups;
mod inbox_claims;
pub mod mesh;
pub mod outbox;
mod parked;
pub mod push;

mod routing;
mod subscription;
mod tenant;

pub use tenant::Tenant;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

pub use crate::metrics::{Metrics, MetricsSnapshot};
pub use inbox_claims::{InboxClaims, inbox_owner};
pub use outbox::{Outbox, Refused, Wakes};
pub use routing::refusal;
pub use subscription::Subscription;

use crate::store::Store;
use crate::tenancy::Authorizer;
use durable::Policies;

/// [`AckTo::flags`](crate::store::AckTo) bit: answer in JetStream's error vocabulary.
pub const ACK_JETSTREAM: u32 = 1;
/// [`AckTo::flags`](crate::store::AckTo) bit: the ack goes to an MQTT connection's
/// inbox, the address being [`envelope::ack_address`].
pub const ACK_MQTT: u32 = 2;
/// [`AckTo::flags`](crate::store::AckTo) bit: the ack of an append another node
/// forwarded; its address names that node and its handle, and the outcome goes back
/// over the link.
pub const ACK_REMOTE: u32 = 4;
/// [`AckTo::flags`](crate::store::AckTo) bit: the publish rolls its subject up
/// (`Nats-Rollup: sub`): once stored, the versions before it are purged, and only
/// then is it acknowledged.
pub const ACK_ROLLUP: u32 = 8;

/// A message as routing sees it: borrowed from the publisher's frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Message<'a> {
    /// The subject routed on: subscriptions matching it receive the message.
    pub subject: &'a str,
    /// The subject receivers see, when it is not the one routed on: a JetStream pull's
    /// messages are routed to its reply inbox and show their own subjects.
    pub shown_as: Option<&'a str>,
    /// The stored subject a delivery carries when receivers see neither it nor
    /// `shown_as` (a Canopy group pull's messages go out under the pull's inbox):
    /// the tenant's deliver plugins of that subject still see it.
    pub source: Option<&'a str>,
    pub reply: Option<&'a [u8]>,
    /// The raw NATS header block, when the message has one.
    pub headers: Option<&'a [u8]>,
    pub payload: &'a [u8],
    /// The publishing connection (0: the server), for MQTT's no-local.
    pub origin: u64,
    /// [`envelope`] flags: the publish's MQTT QoS and RETAIN.
    pub flags: u8,
    /// Version and tenant offset of a stored message (0 when not stored).
    pub version: u64,
    pub offset: u64,
    /// Set for a message another node routed: delivered here only, to what it says.
    pub from_link: Option<LinkDelivery<'a>>,
}

/// What a message that came over a link is delivered to on this node.
#[derive(Debug, Clone, Copy)]
pub struct LinkDelivery<'a> {
    /// Subscriptions outside queue groups.
    pub plain: bool,
    /// The queue groups this node was chosen for.
    pub queues: &'a [&'a str],
}

impl Message<'_> {
    /// The subject receivers are shown.
    #[inline]
    pub fn shown_subject(&self) -> &str {
        self.shown_as.unwrap_or(self.subject)
    }

    /// The subject deliver plugins see: the stored subject the message carries.
    #[inline]
    pub fn plugged_subject(&self) -> &str {
        self.source.unwrap_or(self.shown_subject())
    }
}

/// Reusable per-connection scratch space, so routing allocates nothing per message.
#[derive(Default)]
pub struct RouteScratch {
    queue_picks: Vec<QueuePick>,
    spent: Vec<Arc<Subscription>>,
    /// Overlapping MQTT subscriptions that matched, delivered merged after the walk.
    merged: Vec<Arc<Subscription>>,
}

struct QueuePick {
    seen: u64,
    chosen: Arc<Subscription>,
}

pub struct Broker {
    tenants: RwLock<HashMap<Arc<str>, Arc<Tenant>>>,
    metrics: Arc<Metrics>,
    authz: Arc<Authorizer>,
    next_id: AtomicU64,
    policies: Policies,
    /// Set once at start, after the store opened (the store calls back into the
    /// broker, so the broker exists first).
    store: OnceLock<Arc<Store>>,
    /// Where store acks for MQTT connections go.
    mqtt_acks: envelope::AckInboxes,
    /// The tenants' records.
    tenant_records: crate::tenancy::Tenants,
    /// The clock messages are aged by (the store's too).
    clock: crate::clock::Clock,
    /// The running consumer groups.
    groups: groups::Groups,
    /// The listeners clients reach, as documents describing the server name them.
    listeners: OnceLock<Vec<crate::schemas::asyncapi::Listener>>,
    /// A tenant's limits where its record names none.
    tenant_defaults: crate::tenancy::quota::TenantDefaults,
    /// The largest answer the server sends (`native.max_payload`).
    max_answer: usize,
    /// The other nodes, when this one is in a cluster.
    mesh: OnceLock<Arc<mesh::Mesh>>,
    /// In a cluster: the definitions this node has seen in etcd.
    seen: definitions::Seen,
}

impl Broker {
    pub fn new(authz: Arc<Authorizer>, metrics: Arc<Metrics>, policies: Policies) -> Self {
        Self {
            tenants: RwLock::new(HashMap::new()),
            metrics,
            authz,
            next_id: AtomicU64::new(1),
            policies,
            store: OnceLock::new(),
            mqtt_acks: envelope::AckInboxes::default(),
            tenant_records: crate::tenancy::Tenants::default(),
            clock: crate::clock::Clock::default(),
            groups: groups::Groups::default(),
            listeners: OnceLock::new(),
            tenant_defaults: crate::tenancy::quota::TenantDefaults::default(),
            max_answer: crate::config::NativeConfig::default().max_payload,
            mesh: OnceLock::new(),
            seen: definitions::Seen::default(),
        }
    }

    /// Makes this node one of a cluster's; later calls are ignored. Connection ids
    /// start at a random place, so that an id (a message's origin, for no-echo) means
    /// the same connection on every node.
    pub fn attach_mesh(&self, mesh: Arc<mesh::Mesh>) {
        if self.mesh.set(mesh).is_ok() {
            self.next_id
                .store(fastrand::u64(1 << 40..1 << 62), Ordering::Relaxed);
        }
    }

    /// The other nodes, when this one is in a cluster.
    pub fn mesh(&self) -> Option<&Arc<mesh::Mesh>> {
        self.mesh.get()
    }

    /// Sets the largest answer the server sends (`native.max_payload`).
    pub fn with_max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// The largest answer the server sends: what clients were told they may get.
    pub fn max_answer(&self) -> usize {
        self.max_answer
    }

    /// Sets the limits a tenant has where its record names none (`[limits]`).
    pub fn with_tenant_defaults(mut self, defaults: crate::tenancy::quota::TenantDefaults) -> Self {
        self.tenant_defaults = defaults;
        self
    }

    /// Records the listeners' addresses, once they are bound; later calls are ignored.
    pub fn advertise(&self, listeners: Vec<crate::schemas::asyncapi::Listener>) {
        let _ = self.listeners.set(listeners);
    }

    /// The listeners clients reach.
    pub fn listeners(&self) -> &[crate::schemas::asyncapi::Listener] {
        self.listeners.get().map_or(&[], Vec::as_slice)
    }

    /// The running consumer groups.
    pub fn groups(&self) -> &groups::Groups {
        &self.groups
    }

    /// The tenants' records (who exists, with which limits).
    pub fn tenant_records(&self) -> &crate::tenancy::Tenants {
        &self.tenant_records
    }

    /// Attaches the opened store; later calls are ignored.
    pub fn attach_store(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
    }

    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.get()
    }

    /// The store holding `tenant`'s data on this node: the one store, or in a
    /// cluster its shard's when this node owns it.
    pub fn store_of(&self, tenant: &str) -> Option<Arc<Store>> {
        match self.mesh.get() {
            Some(mesh) => match mesh.home(tenant) {
                mesh::Home::Here(store) => Some(store),
                _ => None,
            },
            None => self.store.get().cloned(),
        }
    }

    /// The policy under which `subject` is stored, when it is and a store is open.
    pub fn store_policy(&self, subject: &str) -> Option<&crate::config::StorePolicy> {
        if self.store.get().is_none() && self.mesh.get().is_none() {
            return None;
        }
        self.policies.for_subject(subject)
    }

    /// Whether any store policy's pattern matches `subject` (storing it or not).
    pub fn has_policy_for(&self, subject: &str) -> bool {
        self.policies.first_match(subject).is_some()
    }

    /// Whether publishes can be stored here at all: a store is open, or this node is
    /// one of a cluster's, whose shards' owners store them.
    pub fn stores_messages(&self) -> bool {
        self.store.get().is_some() || self.mesh.get().is_some()
    }

    /// Hands an append to the store of its tenant: this node's, or in a cluster its
    /// shard's owner's. `Err` when the store is closing (nothing was taken); a
    /// forwarded append that cannot reach its owner is answered as not stored.
    pub async fn append(&self, request: crate::store::AppendRequest) -> Result<(), ()> {
        if let Some(mesh) = self.mesh.get() {
            // Behind publishes waiting for the shard, never past them.
            if mesh.parked().holds(mesh.shard_of(&request.tenant)) {
                self.park(request);
            } else if let Err(request) = self.append_routed(mesh, request).await {
                self.park(*request);
            }
            return Ok(());
        }
        match self.store.get() {
            Some(store) => store.append(request).await.map_err(drop),
            None => Ok(()),
        }
    }

    /// [`Broker::append`] for several appends at once: on this node's store they are
    /// all queued before a round runs, so they share one. `Err` when the store is
    /// closing (what was not taken was never acked).
    pub async fn append_all(
        &self,
        requests: impl IntoIterator<Item = crate::store::AppendRequest>,
    ) -> Result<(), ()> {
        let store = match (self.mesh.get(), self.store.get()) {
            (None, Some(store)) => store,
            _ => {
                for request in requests {
                    self.append(request).await?;
                }
                return Ok(());
            }
        };
        let mut queued = Ok(());
        for request in requests {
            if store.queue_append(request).await.is_err() {
                queued = Err(());
                break;
            }
        }
        store.run_queued().await;
        queued
    }

    /// Waits until every stored publish handed to [`Broker::append`] for `tenant`
    /// before now has been stored and routed, wherever its store is: what a PING
    /// after publishes waits for. In a cluster it waits no longer than a publish
    /// may wait for its shard.
    pub async fn barrier(&self, tenant: &str) {
        let Some(mesh) = self.mesh.get() else {
            if let Some(store) = self.store.get() {
                let _ = store.barrier().await;
            }
            return;
        };
        let shard = mesh.shard_of(tenant);
        let deadline = tokio::time::Instant::now() + mesh.parked().wait();
        while mesh.parked().holds(shard) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        match mesh.home(tenant) {
            mesh::Home::Here(store) => {
                let _ = store.barrier().await;
            }
            mesh::Home::Owner(owner) => {
                if let Some(passed) = mesh.barrier(&owner, tenant) {
                    let _ = tokio::time::timeout_at(deadline, passed).await;
                }
            }
            mesh::Home::Moving => {}
        }
    }

    /// Hands an append to its shard's store here, or to its owner. Gives it back
    /// while the shard has neither, or its owner cannot be reached (it may have
    /// died, its lease not run out yet): it is to wait for them.
    async fn append_routed(
        &self,
        mesh: &mesh::Mesh,
        request: crate::store::AppendRequest,
    ) -> Result<(), Box<crate::store::AppendRequest>> {
        let request = match mesh.home(&request.tenant) {
            mesh::Home::Here(store) => match store.try_append(request).await {
                Ok(()) => return Ok(()),
                // The shard was handed over meanwhile: where it is now.
                Err(request) => *request,
            },
            _ => request,
        };
        match mesh.home(&request.tenant) {
            mesh::Home::Here(_) => {
                self.answer(mesh.refuse_append(
                    request,
                    "the tenant's shard is closing on this node; not stored, try again",
                ));
                Ok(())
            }
            mesh::Home::Owner(owner) => mesh.forward_append(&owner, request),
            mesh::Home::Moving => Err(Box::new(request)),
        }
    }

    pub fn mqtt_acks(&self) -> &envelope::AckInboxes {
        &self.mqtt_acks
    }

    pub fn clock(&self) -> &crate::clock::Clock {
        &self.clock
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn authorizer(&self) -> &Arc<Authorizer> {
        &self.authz
    }

    /// Every tenant that has had a connection: its name, live quota and subscriptions.
    pub fn live_tenants(&self) -> Vec<(Arc<str>, Arc<crate::tenancy::quota::Quota>, usize)> {
        let mut all: Vec<_> = self
            .tenants
            .read()
            .values()
            .map(|r| {
                (
                    Arc::clone(&r.name),
                    Arc::clone(&r.quota),
                    r.subscription_count(),
                )
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// A fresh id for a connection or subscription.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
