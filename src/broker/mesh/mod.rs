//! A cluster node's routing among the other nodes: where each tenant's messages are
//! stored (its shard's owner), the interest every other node's subscriptions make,
//! and the frames that carry messages, forwarded publishes and their acks between
//! nodes. The sockets are the server's ([`Links`]); this module only decides what to
//! send to whom.
//!
//! A message routed on this node is sent once to each other node whose interest
//! matches it; a message that came from another node is delivered here only, never
//! sent on, so no message crosses more than one link after its owner routed it. A
//! queue group whose members are spread over nodes gets the message once: here if a
//! member here matches, else on one node chosen among those with members.
//!
//! Must never: wait on a link (a full or broken link drops the frame and counts it),
//! or route a message that came over a link to another node.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use canopy_protocols::link::{self, Frame};
use canopy_subjects::Pattern;
use parking_lot::{Mutex, RwLock};

mod wire;

use wire::parse_remote_ack;
pub use wire::{
    append_from_wire, awaited_from_wire, expect_from_wire, expect_to_wire, outcome_from_wire,
    outcome_to_wire,
};

use super::{Message, Tenant};
use crate::store::{AckTo, AppendOutcome, AppendRequest, Store};

/// The server's side of the links: sockets, buffers, reconnects.
pub trait Links: Send + Sync + 'static {
    /// Queues `frame` for node `to`. False when the link is down or its buffer full:
    /// the frame is dropped.
    fn send(&self, to: &str, frame: Bytes) -> bool;
    /// Queues `frame` for every node linked now.
    fn broadcast(&self, frame: Bytes);
    /// Queues an answer for node `to` on its own link to this node (where what it
    /// answers came from), else on this node's link to it.
    fn reply(&self, to: &str, frame: Bytes) -> bool;
}

/// Where a tenant's messages are stored, as this node sees it now.
pub enum Home {
    /// This node owns the tenant's shard.
    Here(Arc<Store>),
    /// Another node does.
    Owner(Arc<str>),
    /// Nobody does this moment: the shard is moving.
    Moving,
}

/// A node's interest as a tenant's remote trie holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    pub node: Arc<str>,
    /// The pattern is one subject exactly: a subscription that answers requests.
    pub literal: bool,
}

/// One interest a node announced: its pattern (as [`interest_text`]) and queue group.
pub type Interest = (String, Option<Box<str>>);

/// What each other node said it is interested in, by tenant.
type InterestOf = HashMap<Arc<str>, HashSet<(Arc<str>, Interest)>>;

/// A publish to answer on this node with the outcome of its append, which another
/// node stored (or could not).
pub struct Answer {
    pub tenant: Arc<str>,
    pub ack: AckTo,
    pub outcome: AppendOutcome,
    /// What the groups a `Canopy-Await` named did, as the owner saw it.
    pub awaited: Option<crate::groups::awaiting::AwaitOutcome>,
}

/// A forwarded append waiting for its outcome.
struct Pending {
    tenant: Arc<str>,
    node: Arc<str>,
    ack: Option<AckTo>,
}

/// A barrier sent to an owner: the owner, and whom to tell when it passed.
type Barrier = (Arc<str>, tokio::sync::oneshot::Sender<()>);

/// This node's place among the others.
pub struct Mesh {
    me: Arc<str>,
    shards: u32,
    links: std::sync::OnceLock<Arc<dyn Links>>,
    /// Every live node's NATS address, for INFO's `connect_urls`.
    client_urls: tokio::sync::watch::Sender<Vec<String>>,
    /// Where each live node takes links (and relayed MQTT connections).
    link_addresses: RwLock<HashMap<Arc<str>, String>>,
    /// Each shard's owner as last seen.
    owners: RwLock<Vec<Option<Arc<str>>>>,
    /// The stores of the shards this node owns, with the etcd revision of each claim.
    stores: RwLock<BTreeMap<u32, (Arc<Store>, i64)>>,
    /// The cluster's name and this node's view of it, once joined.
    view: std::sync::OnceLock<(String, tokio::sync::watch::Receiver<crate::cluster::View>)>,
    /// Where the owner of a shard mirrors its tenants' definitions for every node.
    definitions: std::sync::OnceLock<crate::cluster::Definitions>,
    /// What this node's connections to others prove, and theirs to it.
    secret: crate::cluster::LinkSecret,
    /// Stored publishes waiting for their shard to have a home.
    parked: super::parked::Parked,
    /// What each other node said it is interested in: (tenant, pattern, queue).
    interest_of: Mutex<InterestOf>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Barriers sent to owners and not passed yet: the owner, and whom to tell.
    barriers: Mutex<HashMap<u64, Barrier>>,
    next_append: AtomicU64,
    /// Frames dropped because a link was down or full.
    pub dropped: AtomicU64,
    /// Messages sent to other nodes (one per interested node per message).
    pub messages_sent: AtomicU64,
    /// Publishes forwarded to their shard's owner.
    pub appends_forwarded: AtomicU64,
    /// API calls forwarded to their tenant's owner.
    pub calls_forwarded: AtomicU64,
}

impl Mesh {
    pub fn new(me: &str, shards: u32) -> Self {
        Self {
            me: Arc::from(me),
            shards,
            links: std::sync::OnceLock::new(),
            client_urls: tokio::sync::watch::Sender::new(Vec::new()),
            link_addresses: RwLock::default(),
            owners: RwLock::new(vec![None; shards as usize]),
            stores: RwLock::default(),
            definitions: std::sync::OnceLock::new(),
            view: std::sync::OnceLock::new(),
            secret: crate::cluster::LinkSecret::new(None),
            parked: super::parked::Parked::new(std::time::Duration::from_secs(10)),
            interest_of: Mutex::default(),
            pending: Mutex::default(),
            barriers: Mutex::default(),
            next_append: AtomicU64::new(1),
            dropped: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            appends_forwarded: AtomicU64::new(0),
            calls_forwarded: AtomicU64::new(0),
        }
    }

    /// Attaches the links; later calls are ignored.
    pub fn attach_links(&self, links: Arc<dyn Links>) {
        let _ = self.links.set(links);
    }

    pub fn me(&self) -> &Arc<str> {
        &self.me
    }

    pub fn shard_of(&self, tenant: &str) -> u32 {
        crate::cluster::share::shard_of(tenant, self.shards)
    }

    /// Where `tenant`'s messages are stored now.
    pub fn home(&self, tenant: &str) -> Home {
        self.home_of_shard(self.shard_of(tenant))
    }

    /// Where `tenant`'s messages are stored, waiting while its shard has no home
    /// (a takeover, or this node still opening it) as long as a publish would.
    pub async fn settled_home(&self, tenant: &str) -> Home {
        let deadline = tokio::time::Instant::now() + self.parked.wait();
        loop {
            let home = self.home(tenant);
            if !matches!(home, Home::Moving) || tokio::time::Instant::now() >= deadline {
                return home;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Whether `shard` has a home now: open here, or owned by another node.
    pub fn has_home(&self, shard: u32) -> bool {
        !matches!(self.home_of_shard(shard), Home::Moving)
    }

    /// Where the messages of `shard`'s tenants are stored now.
    pub fn home_of_shard(&self, shard: u32) -> Home {
        if let Some((store, _)) = self.stores.read().get(&shard) {
            return Home::Here(Arc::clone(store));
        }
        match self.owners.read().get(shard as usize).cloned().flatten() {
            Some(owner) if owner != self.me => Home::Owner(owner),
            _ => Home::Moving,
        }
    }

    /// Whether `tenant`'s shard is this node's and still being opened.
    pub fn opening(&self, tenant: &str) -> bool {
        let shard = self.shard_of(tenant);
        !self.stores.read().contains_key(&shard)
            && self
                .owners
                .read()
                .get(shard as usize)
                .is_some_and(|owner| owner.as_deref() == Some(&*self.me))
    }

    /// How many shards this node owns now, of how many.
    pub fn shards_here(&self) -> (usize, u32) {
        (self.stores.read().len(), self.shards)
    }

    /// Every live node's NATS address.
    pub fn client_urls(&self) -> Vec<String> {
        self.client_urls.borrow().clone()
    }

    /// Every live node's NATS address, watched: NATS connections send a new INFO
    /// when it changes, so clients learn of nodes that came or went.
    pub fn watch_client_urls(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.client_urls.subscribe()
    }

    /// Records every live node's NATS address, as the cluster's view says.
    pub fn set_client_urls(&self, mut urls: Vec<String>) {
        urls.sort_unstable();
        self.client_urls.send_if_modified(|now| {
            let changed = *now != urls;
            if changed {
                *now = urls;
            }
            changed
        });
    }

    /// Records where every live node takes links, as the cluster's view says.
    pub fn set_link_addresses(&self, addresses: HashMap<Arc<str>, String>) {
        *self.link_addresses.write() = addresses;
    }

    /// Where `node` takes links, if it is alive.
    pub fn link_address(&self, node: &str) -> Option<String> {
        self.link_addresses.read().get(node).cloned()
    }

    /// Records the owners of every shard, as the cluster's view says. Appends
    /// forwarded to a shard's previous owner and not answered yet never will be
    /// (it died or stalled): their answers, to give now.
    pub fn set_owners(&self, owners: Vec<Option<Arc<str>>>) -> Vec<Answer> {
        let moved: Vec<(u32, Arc<str>)> = {
            let mut current = self.owners.write();
            let moved = current
                .iter()
                .zip(&owners)
                .enumerate()
                .filter_map(|(shard, (before, now))| match (before, now) {
                    (Some(before), now) if now.as_ref() != Some(before) => {
                        Some((shard as u32, Arc::clone(before)))
                    }
                    _ => None,
                })
                .collect();
            *current = owners;
            moved
        };
        if moved.is_empty() {
            return Vec::new();
        }
        for (_, node) in &moved {
            self.drop_barriers(node);
        }
        self.take_pending(|p| {
            moved
                .iter()
                .any(|(shard, node)| *p.node == **node && self.shard_of(&p.tenant) == *shard)
        })
    }

    /// Takes the pending appends `lost` picks out, answered as of unknown outcome.
    fn take_pending(&self, lost: impl Fn(&Pending) -> bool) -> Vec<Answer> {
        let taken: Vec<Pending> = self
            .pending
            .lock()
            .extract_if(|_, p| lost(p))
            .map(|(_, p)| p)
            .collect();
        taken
            .into_iter()
            .filter_map(|p| {
                let outcome = unavailable(&p.node);
                answer(p, outcome)
            })
            .collect()
    }

    /// A shard's store, open on this node from now on.
    pub fn open_shard(&self, shard: u32, store: Arc<Store>, claim: i64) {
        self.stores.write().insert(shard, (store, claim));
    }

    /// Takes a shard's store away from this node.
    pub fn close_shard(&self, shard: u32) -> Option<Arc<Store>> {
        self.stores.write().remove(&shard).map(|(store, _)| store)
    }

    /// The store and claim of a shard this node has open.
    pub fn open_store(&self, shard: u32) -> Option<(Arc<Store>, i64)> {
        self.stores.read().get(&shard).cloned()
    }

    /// Sets the cluster's shared secret (`cluster.secret`).
    pub fn with_secret(mut self, secret: Option<&str>) -> Self {
        self.secret = crate::cluster::LinkSecret::new(secret);
        self
    }

    pub fn secret(&self) -> &crate::cluster::LinkSecret {
        &self.secret
    }

    /// Lets stored publishes wait up to `wait` for a shard without a home.
    pub fn with_park_wait(mut self, wait: std::time::Duration) -> Self {
        self.parked = super::parked::Parked::new(wait);
        self
    }

    pub fn parked(&self) -> &super::parked::Parked {
        &self.parked
    }

    /// Attaches the cluster's name and this node's view of it; later calls are
    /// ignored.
    pub fn attach_view(
        &self,
        name: &str,
        view: tokio::sync::watch::Receiver<crate::cluster::View>,
    ) {
        let _ = self.view.set((name.to_owned(), view));
    }

    /// The cluster's name and this node's view of it, once joined.
    pub fn view(&self) -> Option<(&str, &tokio::sync::watch::Receiver<crate::cluster::View>)> {
        self.view.get().map(|(name, view)| (name.as_str(), view))
    }

    /// Attaches the cluster's definitions; later calls are ignored.
    pub fn attach_definitions(&self, definitions: crate::cluster::Definitions) {
        let _ = self.definitions.set(definitions);
    }

    pub fn definitions(&self) -> Option<&crate::cluster::Definitions> {
        self.definitions.get()
    }

    /// The highest durable offset of each shard this node has open.
    pub fn shard_offsets(&self) -> BTreeMap<u32, u64> {
        self.stores
            .read()
            .iter()
            .map(|(&shard, (store, _))| (shard, *store.durable_watch().borrow()))
            .collect()
    }

    /// Whether this node has the shard's store open.
    pub fn is_open(&self, shard: u32) -> bool {
        self.stores.read().contains_key(&shard)
    }

    fn send(&self, to: &str, frame: Bytes) -> bool {
        let sent = self.links.get().is_some_and(|links| links.send(to, frame));
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Tells every node that this one's interest in `pattern` (`queue`) for `tenant`
    /// began or ended.
    pub fn announce(&self, tenant: &str, pattern: &str, queue: Option<&str>, add: bool) {
        let Some(links) = self.links.get() else {
            return;
        };
        let mut frame = Vec::new();
        link::encode(
            &Frame::Interest {
                add,
                tenant,
                pattern,
                queue,
            },
            &mut frame,
        );
        links.broadcast(Bytes::from(frame));
    }

    /// Records node `from`'s interest in `tenant`'s remote trie.
    pub fn note_interest(
        &self,
        tenant: &Tenant,
        from: &Arc<str>,
        pattern: &str,
        queue: Option<&str>,
        add: bool,
    ) {
        let Some(parsed) = parse_interest(pattern) else {
            tracing::warn!(node = %from, pattern, "ignored interest in a pattern that does not parse");
            return;
        };
        let key = (
            Arc::clone(&tenant.name),
            (pattern.to_owned(), queue.map(Box::from)),
        );
        let mut all = self.interest_of.lock();
        let of_node = all.entry(Arc::clone(from)).or_default();
        let value = RemoteNode {
            node: Arc::clone(from),
            literal: parsed.is_literal(),
        };
        if add {
            if of_node.insert(key) {
                tenant.remote.insert(&parsed, queue, value);
            }
        } else if of_node.remove(&key) {
            tenant.remote.remove(&parsed, queue, &value);
        }
    }

    /// Forgets everything node `node` was interested in (its link went down; it
    /// sends all of it again when the link is back). `tenant` finds a tenant by name.
    pub fn forget_node(&self, node: &str, tenant: impl Fn(&str) -> Arc<Tenant>) {
        let Some(interest) = self.interest_of.lock().remove(node) else {
            return;
        };
        let node: Arc<str> = Arc::from(node);
        for (name, (pattern, queue)) in interest {
            if let Some(parsed) = parse_interest(&pattern) {
                let value = RemoteNode {
                    node: Arc::clone(&node),
                    literal: parsed.is_literal(),
                };
                tenant(&name)
                    .remote
                    .remove(&parsed, queue.as_deref(), &value);
            }
        }
    }

    /// Whether any subscription on another node matches `subject`.
    pub fn has_interest(&self, tenant: &Tenant, subject: &str) -> bool {
        let mut found = false;
        tenant.remote.for_each_match(subject, &mut |plain, groups| {
            found = found || !plain.is_empty() || groups.iter().any(|g| !g.members.is_empty());
        });
        found
    }

    /// Whether a subscription on another node answers requests on `subject` (a
    /// queue group member, or a subscription to exactly it), as
    /// `Broker::has_responder` asks of this node's own.
    pub fn has_responder(&self, tenant: &Tenant, subject: &str) -> bool {
        let mut found = false;
        tenant.remote.for_each_match(subject, &mut |plain, groups| {
            found = found
                || groups.iter().any(|g| !g.members.is_empty())
                || plain.iter().any(|remote| remote.literal);
        });
        found
    }

    /// Sends `msg`, routed here, to every other node with matching interest; the
    /// queue groups `served_here` got it here already. Returns how many nodes it
    /// went to.
    pub fn forward(
        &self,
        tenant: &Tenant,
        msg: &Message<'_>,
        served_here: &[&str],
        skip_conn: Option<u64>,
    ) -> usize {
        // The nodes with plain interest, and for each queue group one node.
        let mut plain: Vec<Arc<str>> = Vec::new();
        let mut names: Vec<Box<str>> = Vec::new();
        tenant
            .remote
            .for_each_match(msg.subject, &mut |nodes, groups| {
                for remote in nodes {
                    if !plain.contains(&remote.node) {
                        plain.push(Arc::clone(&remote.node));
                    }
                }
                for group in groups {
                    if served_here.contains(&&*group.name) || group.members.is_empty() {
                        continue;
                    }
                    if !names.contains(&group.name) {
                        names.push(group.name.clone());
                    }
                }
            });
        if plain.is_empty() && names.is_empty() {
            return 0;
        }
        // One node per queue group, picked at random among its members' nodes.
        let mut chosen: Vec<(Box<str>, Arc<str>)> = Vec::new();
        for name in names {
            let mut seen = 0u64;
            let mut pick: Option<Arc<str>> = None;
            tenant.remote.for_each_match(msg.subject, &mut |_, groups| {
                for group in groups.iter().filter(|g| g.name == name) {
                    for remote in &group.members {
                        seen += 1;
                        if fastrand::u64(..seen) == 0 {
                            pick = Some(Arc::clone(&remote.node));
                        }
                    }
                }
            });
            if let Some(node) = pick {
                chosen.push((name, node));
            }
        }
        let mut targets: Vec<Arc<str>> = plain.clone();
        for (_, node) in &chosen {
            if !targets.contains(node) {
                targets.push(Arc::clone(node));
            }
        }
        // Nodes whose frames say the same (almost always all of them: plain
        // interest, no queue group) share one encoding.
        let mut encoded: Vec<((bool, Vec<&str>), Bytes)> = Vec::new();
        for node in &targets {
            let queues: Vec<&str> = chosen
                .iter()
                .filter(|(_, n)| n == node)
                .map(|(name, _)| &**name)
                .collect();
            let key = (plain.contains(node), queues);
            let frame = match encoded.iter().find(|(k, _)| *k == key) {
                Some((_, frame)) => frame.clone(),
                None => {
                    let mut frame = Vec::with_capacity(64 + msg.payload.len());
                    link::encode(
                        &Frame::Msg(link::Msg {
                            tenant: &tenant.name,
                            subject: msg.subject,
                            shown_as: msg.shown_as,
                            reply: msg.reply,
                            headers: msg.headers,
                            payload: msg.payload,
                            origin: msg.origin,
                            no_echo: skip_conn.is_some_and(|conn| conn == msg.origin),
                            flags: msg.flags,
                            version: msg.version,
                            offset: msg.offset,
                            plain: key.0,
                            queues: key.1.clone(),
                        }),
                        &mut frame,
                    );
                    let frame = Bytes::from(frame);
                    encoded.push((key, frame.clone()));
                    frame
                }
            };
            self.send(node, frame);
        }
        self.messages_sent
            .fetch_add(targets.len() as u64, Ordering::Relaxed);
        targets.len()
    }

    /// Sends an API call to `owner`, which answers it on its reply subject (routed
    /// back here by this node's interest in it). False when the link is down.
    pub fn forward_call(&self, owner: &str, call: link::Call<'_>) -> bool {
        let mut frame = Vec::with_capacity(128 + call.body.len());
        link::encode(&Frame::Call(call), &mut frame);
        self.calls_forwarded.fetch_add(1, Ordering::Relaxed);
        self.send(owner, Bytes::from(frame))
    }

    /// Sends an append to `owner`, to be stored there; its ack comes back as an
    /// `Ack` frame. Gives it back when the link to `owner` is down.
    pub fn forward_append(
        &self,
        owner: &Arc<str>,
        mut request: AppendRequest,
    ) -> Result<(), Box<AppendRequest>> {
        let id = self.next_append.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::with_capacity(128);
        wire::encode_append(id, &request, &mut frame);
        // Waiting before the frame leaves, since its ack may come back at once. An
        // append nobody waits for gets no ack, so it waits for nothing.
        let acked = request.ack.is_some();
        if acked {
            self.pending.lock().insert(
                id,
                Pending {
                    tenant: Arc::clone(&request.tenant),
                    node: Arc::clone(owner),
                    ack: request.ack.take(),
                },
            );
        }
        if self.send(owner, Bytes::from(frame)) {
            self.appends_forwarded.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if acked && let Some(pending) = self.pending.lock().remove(&id) {
            request.ack = pending.ack;
        }
        Err(Box::new(request))
    }

    /// The answer to an append that cannot be stored now: not stored.
    pub fn refuse_append(&self, request: AppendRequest, reason: &str) -> Option<Answer> {
        Some(Answer {
            tenant: request.tenant,
            ack: request.ack?,
            outcome: AppendOutcome::Failed {
                reason: reason.to_owned(),
            },
            awaited: None,
        })
    }

    /// The outcome of append `id` came back from its owner: the answer to give.
    pub fn acked(
        &self,
        id: u64,
        outcome: AppendOutcome,
        awaited: Option<crate::groups::awaiting::AwaitOutcome>,
    ) -> Option<Answer> {
        let pending = self.pending.lock().remove(&id)?;
        let mut answer = answer(pending, outcome)?;
        answer.awaited = awaited;
        Some(answer)
    }

    /// Sends the outcome of a forwarded append back to the node it came from.
    pub fn send_ack(
        &self,
        ack: &AckTo,
        outcome: &AppendOutcome,
        awaited: Option<&crate::groups::awaiting::AwaitOutcome>,
    ) {
        let Some((node, id)) = parse_remote_ack(&ack.address) else {
            return;
        };
        let mut frame = Vec::with_capacity(64);
        link::encode(
            &Frame::Ack {
                id,
                outcome: outcome_to_wire(outcome),
                awaited: awaited.map(wire::awaited_to_wire),
            },
            &mut frame,
        );
        let sent = self
            .links
            .get()
            .is_some_and(|links| links.reply(node, Bytes::from(frame)));
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The answers, not stored, to every append forwarded to `node` and not answered
    /// yet: the link it went on broke.
    pub fn fail_pending(&self, node: &str) -> Vec<Answer> {
        self.drop_barriers(node);
        self.take_pending(|p| *p.node == *node)
    }

    /// Asks `owner` to tell when every append sent to it for `tenant` so far has
    /// been stored and routed; the receiver ends (passed, or given up on when the
    /// link breaks or the shard moves). None when the link is down.
    pub fn barrier(
        &self,
        owner: &Arc<str>,
        tenant: &str,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let id = self.next_append.fetch_add(1, Ordering::Relaxed);
        let (passed, waiting) = tokio::sync::oneshot::channel();
        self.barriers.lock().insert(id, (Arc::clone(owner), passed));
        let mut frame = Vec::with_capacity(32);
        link::encode(&Frame::Barrier { id, tenant }, &mut frame);
        if self.send(owner, Bytes::from(frame)) {
            return Some(waiting);
        }
        self.barriers.lock().remove(&id);
        None
    }

    /// Barrier `id` passed on its owner.
    pub fn passed(&self, id: u64) {
        if let Some((_, passed)) = self.barriers.lock().remove(&id) {
            let _ = passed.send(());
        }
    }

    /// Tells node `to` that its barrier `id` passed here: on the link that carries
    /// this node's messages to it, so the messages routed before the barrier reach
    /// it first.
    pub fn send_passed(&self, to: &str, id: u64) {
        let mut frame = Vec::with_capacity(16);
        link::encode(&Frame::Passed { id }, &mut frame);
        self.send(to, Bytes::from(frame));
    }

    /// Gives up on the barriers sent to `node`: their waiters go on.
    fn drop_barriers(&self, node: &str) {
        self.barriers
            .lock()
            .retain(|_, (owner, _)| **owner != *node);
    }
}

fn answer(pending: Pending, outcome: AppendOutcome) -> Option<Answer> {
    Some(Answer {
        tenant: pending.tenant,
        ack: pending.ack?,
        outcome,
        awaited: None,
    })
}

/// The answer to an append whose owner went away before answering: it may have
/// stored it, or not; a retry with the same msg id is stored once either way.
fn unavailable(node: &str) -> AppendOutcome {
    AppendOutcome::Failed {
        reason: format!(
            "the tenant's shard owner (node {node}) was lost before it answered; the publish \
             may or may not be stored: retry with a msg id to store it once"
        ),
    }
}

/// Interest travels as `n:` and a native pattern, or `m:` and an MQTT filter (whose
/// `#` also matches its parent, which no native pattern says).
pub fn interest_text(pattern: &Pattern) -> String {
    match pattern.to_native() {
        Some(native) => format!("n:{native}"),
        None => format!("m:{}", pattern.to_mqtt()),
    }
}

fn parse_interest(text: &str) -> Option<Pattern> {
    if let Some(native) = text.strip_prefix("n:") {
        Pattern::parse_native(native).ok()
    } else {
        Pattern::parse_mqtt(text.strip_prefix("m:")?).ok()
    }
}
