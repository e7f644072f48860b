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

pub mod durable;
pub mod envelope;
pub mod metrics;
pub mod outbox;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use canopy_protocols::native::{encode_hmsg, encode_msg};
use canopy_subjects::{Pattern, QueueGroup, SharedTrie};
use parking_lot::RwLock;

pub use metrics::{Metrics, MetricsSnapshot};
pub use outbox::{Outbox, Refused, Wakes};

use crate::store::Store;
use crate::tenancy::Authorizer;
use durable::Policies;

/// One subscription of one connection.
pub struct Subscription {
    id: u64,
    pub outbox: Arc<Outbox>,
    /// The client's subscription id, echoed in every MSG.
    pub sid: Bytes,
    /// Set for an MQTT subscription: deliveries are envelopes, not MSG frames.
    pub mqtt: Option<envelope::MqttOptions>,
    pub pattern: Pattern,
    pub queue: Option<Arc<str>>,
    /// Another MQTT subscription of the same connection may match the same subjects:
    /// routing then merges their deliveries into one (MQTT's one copy per message).
    pub overlapping: std::sync::atomic::AtomicBool,
    /// Deliveries after which the subscription ends (UNSUB with a maximum); 0 = none.
    max_msgs: AtomicU64,
    delivered: AtomicU64,
}

impl PartialEq for Subscription {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("conn", &self.outbox.conn_id)
            .field("pattern", &self.pattern.to_string())
            .finish()
    }
}

impl Subscription {
    /// Ends the subscription after `max` deliveries in total, counting those before
    /// this call (NATS's auto-unsubscribe). Returns true when it has already had that
    /// many, so the caller removes it now.
    pub fn limit(&self, max: u64) -> bool {
        self.max_msgs.store(max, Ordering::Release);
        max > 0 && self.delivered.load(Ordering::Acquire) >= max
    }

    /// Whether the subscription has had all the deliveries it asked for.
    pub fn is_spent(&self) -> bool {
        let max = self.max_msgs.load(Ordering::Acquire);
        max > 0 && self.delivered.load(Ordering::Acquire) >= max
    }

    /// Could a delivery land now? Used to pick a queue group member that can take it.
    fn can_take(&self) -> bool {
        self.outbox.is_open() && !self.is_spent()
    }

    /// Counts one delivery; `None` means the subscription is spent and must not
    /// deliver, `Some(true)` means this was its last delivery.
    fn admit(&self) -> Option<bool> {
        let n = self.delivered.fetch_add(1, Ordering::AcqRel) + 1;
        let max = self.max_msgs.load(Ordering::Acquire);
        if max == 0 {
            Some(false)
        } else if n > max {
            None
        } else {
            Some(n == max)
        }
    }
}

/// A message as routing sees it: borrowed from the publisher's frame.
#[derive(Debug, Clone, Copy, Default)]
pub struct Message<'a> {
    pub subject: &'a str,
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

fn stored_limits(limits: &crate::store::TenantLimits) -> crate::store::StoredLimits {
    crate::store::StoredLimits {
        max_subjects: limits.max_subjects,
        max_bytes: limits.max_stored_bytes,
        max_age_ms: limits.max_age_secs.map(|s| s.saturating_mul(1000)),
    }
}

/// The routes of one tenant.
pub struct TenantRoutes {
    pub name: Arc<str>,
    trie: SharedTrie<Arc<Subscription>>,
    /// The tenant's live quotas, shared by its connections.
    pub quota: Arc<crate::tenancy::quota::Quota>,
    /// Cancelled when the tenant is deleted: its connections close.
    pub deleted: tokio_util::sync::CancellationToken,
    /// Which connection holds each reply inbox.
    pub inboxes: crate::session::InboxClaims,
}

impl TenantRoutes {
    pub fn subscription_count(&self) -> usize {
        self.trie.len()
    }
}

pub struct Broker {
    tenants: RwLock<HashMap<Arc<str>, Arc<TenantRoutes>>>,
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
        }
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

    /// The policy under which `subject` is stored, when it is and a store is open.
    pub fn store_policy(&self, subject: &str) -> Option<&crate::config::StorePolicy> {
        self.store.get()?;
        self.policies.for_subject(subject)
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

    /// Live subscriptions of every tenant.
    pub fn subscription_count(&self) -> usize {
        self.tenants
            .read()
            .values()
            .map(|t| t.subscription_count())
            .sum()
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

    /// The routes of `tenant`, created on first use. Connections look this up once
    /// and keep it.
    pub fn tenant(&self, tenant: &str) -> Arc<TenantRoutes> {
        if let Some(routes) = self.tenants.read().get(tenant) {
            return Arc::clone(routes);
        }
        let record = self.tenant_records.get(tenant);
        let mut tenants = self.tenants.write();
        let routes = tenants.entry(Arc::from(tenant)).or_insert_with(|| {
            Arc::new(TenantRoutes {
                name: Arc::from(tenant),
                trie: SharedTrie::new(),
                quota: Arc::new(crate::tenancy::quota::Quota::new(
                    tenant,
                    record.as_deref().map(|r| &r.limits),
                )),
                deleted: tokio_util::sync::CancellationToken::new(),
                inboxes: crate::session::InboxClaims::default(),
            })
        });
        Arc::clone(routes)
    }

    /// Makes a tenant's record current: the registry, the live quotas of its
    /// connections, and the store's limits.
    pub async fn set_tenant(
        &self,
        record: crate::store::TenantRecord,
    ) -> Result<(), crate::store::StoreError> {
        if let Some(store) = self.store() {
            store
                .set_limits(&record.name, stored_limits(&record.limits))
                .await?;
        }
        if let Some(routes) = self.tenants.read().get(record.name.as_str()) {
            routes.quota.set_limits(&record.limits);
        }
        self.tenant_records.set(record);
        Ok(())
    }

    /// A deleted tenant's connections close, and a tenant made again under its name
    /// starts with routes and quotas of its own.
    pub fn evict_tenant(&self, name: &str) {
        if let Some(routes) = self.tenants.write().remove(name) {
            routes.deleted.cancel();
        }
    }

    /// Tells the store every tenant's stored limits (at start, after loading).
    pub async fn apply_stored_limits(&self) -> Result<(), crate::store::StoreError> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        for record in self.tenant_records.list() {
            let limits = stored_limits(&record.limits);
            if limits != crate::store::StoredLimits::default() {
                store.set_limits(&record.name, limits).await?;
            }
        }
        Ok(())
    }

    pub fn subscribe(
        &self,
        routes: &TenantRoutes,
        outbox: &Arc<Outbox>,
        sid: Bytes,
        pattern: Pattern,
        queue: Option<&str>,
    ) -> Arc<Subscription> {
        self.subscribe_as(routes, outbox, sid, pattern, queue, None)
    }

    /// [`Broker::subscribe`] for any front end: `mqtt` makes deliveries envelopes.
    pub fn subscribe_as(
        &self,
        routes: &TenantRoutes,
        outbox: &Arc<Outbox>,
        sid: Bytes,
        pattern: Pattern,
        queue: Option<&str>,
        mqtt: Option<envelope::MqttOptions>,
    ) -> Arc<Subscription> {
        let sub = Arc::new(Subscription {
            id: self.next_id(),
            outbox: Arc::clone(outbox),
            sid,
            mqtt,
            pattern,
            queue: queue.map(Arc::from),
            overlapping: std::sync::atomic::AtomicBool::new(false),
            max_msgs: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        });
        routes
            .trie
            .insert(&sub.pattern, sub.queue.as_deref(), Arc::clone(&sub));
        sub
    }

    /// Removes a subscription; false when it was already gone.
    pub fn unsubscribe(&self, routes: &TenantRoutes, sub: &Arc<Subscription>) -> bool {
        routes.trie.remove(&sub.pattern, sub.queue.as_deref(), sub)
    }

    /// Removes many subscriptions (a closing connection's) in one trie write.
    pub fn unsubscribe_all(&self, routes: &TenantRoutes, subs: &[Arc<Subscription>]) {
        if subs.is_empty() {
            return;
        }
        let items: Vec<_> = subs
            .iter()
            .map(|s| {
                (
                    s.pattern.clone(),
                    s.queue.as_deref().map(Box::from),
                    Arc::clone(s),
                )
            })
            .collect();
        routes.trie.remove_many(&items);
    }

    /// Delivers `msg` to every matching subscription of the tenant and returns how
    /// many received it. `from` is the publisher's outbox (for `echo: false`).
    pub fn publish(
        &self,
        routes: &TenantRoutes,
        from: &Outbox,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> usize {
        let skip_conn = (!from.echo()).then_some(from.conn_id);
        self.route(routes, skip_conn, msg, scratch, wakes)
    }

    /// Delivers `msg` to every matching subscription except those of connection
    /// `skip_conn`, and returns how many received it.
    pub fn route(
        &self,
        routes: &TenantRoutes,
        skip_conn: Option<u64>,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> usize {
        if self.authz.filters_delivery() && !self.authz.may_deliver(msg.subject) {
            return 0;
        }
        let mut delivered = 0usize;
        let RouteScratch {
            queue_picks,
            spent,
            merged,
        } = scratch;
        queue_picks.clear();
        routes
            .trie
            .for_each_match(msg.subject, &mut |plain, groups| {
                for sub in plain {
                    if Some(sub.outbox.conn_id) == skip_conn {
                        continue;
                    }
                    if sub.overlapping.load(Ordering::Relaxed) {
                        merged.push(Arc::clone(sub));
                    } else if deliver(sub, msg, spent, wakes) {
                        delivered += 1;
                    }
                }
                for group in groups {
                    pick_member(queue_picks, group, skip_conn);
                }
            });
        for pick in queue_picks.drain(..) {
            if deliver(&pick.chosen, msg, spent, wakes) {
                delivered += 1;
            }
        }
        if !merged.is_empty() {
            delivered += deliver_merged(merged, msg, wakes);
        }
        self.remove_spent(routes, spent);
        delivered
    }

    /// Delivers `msg` to one subscription of connection `conn` that matches: how a
    /// server-generated status (no responders) reaches a requester.
    pub fn deliver_to_conn(
        &self,
        routes: &TenantRoutes,
        conn: u64,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> bool {
        let mut delivered = false;
        let spent = &mut scratch.spent;
        routes
            .trie
            .for_each_match(msg.subject, &mut |plain, groups| {
                let members = groups.iter().flat_map(|g| g.members.iter());
                for sub in plain.iter().chain(members) {
                    if !delivered && sub.outbox.conn_id == conn {
                        delivered = deliver(sub, msg, spent, wakes);
                    }
                }
            });
        self.remove_spent(routes, spent);
        delivered
    }

    fn remove_spent(&self, routes: &TenantRoutes, spent: &mut Vec<Arc<Subscription>>) {
        for sub in spent.drain(..) {
            self.unsubscribe(routes, &sub);
        }
    }
}

/// Delivers one envelope per connection for overlapping MQTT subscriptions that
/// matched: the highest QoS any grants (capped by the publish's), every subscription
/// identifier, RETAIN kept if any keeps it. Returns how many connections got it.
fn deliver_merged(
    merged: &mut Vec<Arc<Subscription>>,
    msg: &Message<'_>,
    wakes: &mut Wakes,
) -> usize {
    merged.sort_by_key(|sub| sub.outbox.conn_id);
    let mut delivered = 0;
    let mut ids = Vec::new();
    for group in merged.chunk_by(|a, b| a.outbox.conn_id == b.outbox.conn_id) {
        let mut options: Option<envelope::MqttOptions> = None;
        ids.clear();
        for sub in group {
            let Some(mine) = &sub.mqtt else { continue };
            if mine.no_local && msg.origin == sub.outbox.conn_id {
                continue;
            }
            if mine.subscription_id != 0 && !ids.contains(&mine.subscription_id) {
                ids.push(mine.subscription_id);
            }
            let merged = options.get_or_insert(*mine);
            merged.qos = merged.qos.max(mine.qos);
            merged.retain_as_published |= mine.retain_as_published;
        }
        let (Some(options), Some(first)) = (options, group.first()) else {
            continue;
        };
        let queued = first
            .outbox
            .push(|out| envelope::encode_merged(out, msg, &options, &ids));
        if queued.is_ok() {
            wakes.add(&first.outbox);
            delivered += 1;
        }
    }
    merged.clear();
    delivered
}

/// Chooses one member of a queue group uniformly across every matching node, by
/// reservoir sampling, so a group spread over several patterns is still one group.
fn pick_member(
    picks: &mut Vec<QueuePick>,
    group: &QueueGroup<Arc<Subscription>>,
    skip_conn: Option<u64>,
) {
    let candidates = group
        .members
        .iter()
        .filter(|s| Some(s.outbox.conn_id) != skip_conn && s.can_take());
    let pick = picks.iter_mut().find(|p| {
        p.chosen
            .queue
            .as_deref()
            .is_some_and(|name| name == &*group.name)
    });
    match pick {
        Some(pick) => {
            for member in candidates {
                pick.seen += 1;
                if fastrand::u64(..pick.seen) == 0 {
                    pick.chosen = Arc::clone(member);
                }
            }
        }
        None => {
            let eligible = candidates.clone().count();
            if let Some(chosen) = candidates.clone().nth(fastrand::usize(..eligible.max(1))) {
                picks.push(QueuePick {
                    seen: eligible as u64,
                    chosen: Arc::clone(chosen),
                });
            }
        }
    }
}

/// Queues `msg` for `sub`; true when it was queued.
fn deliver(
    sub: &Arc<Subscription>,
    msg: &Message<'_>,
    spent: &mut Vec<Arc<Subscription>>,
    wakes: &mut Wakes,
) -> bool {
    if let Some(options) = &sub.mqtt {
        if options.no_local && msg.origin == sub.outbox.conn_id {
            return false;
        }
        return match sub.outbox.push(|out| envelope::encode(out, msg, options)) {
            Ok(()) => {
                wakes.add(&sub.outbox);
                true
            }
            Err(_) => false,
        };
    }
    match sub.admit() {
        None => return false,
        Some(true) => spent.push(Arc::clone(sub)),
        Some(false) => {}
    }
    let headers = msg.headers.filter(|_| sub.outbox.headers());
    let queued = sub.outbox.push(|out| match headers {
        Some(h) => encode_hmsg(
            out,
            msg.subject.as_bytes(),
            &sub.sid,
            msg.reply,
            h,
            msg.payload,
        ),
        None => encode_msg(
            out,
            msg.subject.as_bytes(),
            &sub.sid,
            msg.reply,
            msg.payload,
        ),
    });
    match queued {
        Ok(()) => {
            wakes.add(&sub.outbox);
            true
        }
        Err(_) => false,
    }
}
