//! The links between the nodes of a cluster: this node dials every other node it
//! sees in the cluster's view and sends on that connection; it accepts the others'
//! connections and reads from them. Frames are the `link` protocol's.
//!
//! What goes out to a node waits in a bounded queue; when the queue is full or the
//! node unreachable, the frame is dropped and counted (a message not delivered, a
//! forwarded publish answered as not stored), so no node waits on another. A node
//! that links to this one first sends its whole interest, then every change.
//!
//! Must never: block routing on a socket, or apply a frame from a connection that did
//! not say it belongs to this cluster.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use canopy_protocols::link::{self, Frame};
use parking_lot::RwLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::broker::mesh::{self, Links, Mesh};
use crate::cluster::View;
use crate::server::relays::RelayHost;

/// Frames waiting for one node.
const QUEUE_FRAMES: usize = 65_536;
/// The largest frame a node accepts: a full message plus its names and headers.
const MAX_FRAME: usize = 64 << 20;

/// The sending side of every link.
pub struct LinkSet {
    senders: RwLock<HashMap<Arc<str>, mpsc::Sender<Bytes>>>,
    /// The way back on each node's own link to this one, for answers.
    returns: RwLock<HashMap<Arc<str>, mpsc::Sender<Bytes>>>,
}

impl Links for LinkSet {
    fn send(&self, to: &str, frame: Bytes) -> bool {
        // Either connection between two nodes carries any frame: this node's own
        // link first, the other's when this one is not up yet.
        let sender = self.senders.read().get(to).cloned();
        let sender = sender.or_else(|| self.returns.read().get(to).cloned());
        sender.is_some_and(|sender| sender.try_send(frame).is_ok())
    }

    fn reply(&self, to: &str, frame: Bytes) -> bool {
        let back = self.returns.read().get(to).cloned();
        let back = back.or_else(|| self.senders.read().get(to).cloned());
        back.is_some_and(|sender| sender.try_send(frame).is_ok())
    }

    fn broadcast(&self, frame: Bytes) {
        for sender in self.senders.read().values() {
            let _ = sender.try_send(frame.clone());
        }
    }
}

/// Starts the links: the listener for the other nodes, and a dialer that follows
/// the cluster's view.
pub fn start(
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    cluster: String,
    listener: TcpListener,
    view: watch::Receiver<View>,
    relays: Arc<RelayHost>,
    stop: CancellationToken,
) {
    let links = Arc::new(LinkSet {
        senders: RwLock::default(),
        returns: RwLock::default(),
    });
    mesh.attach_links(links.clone());
    mesh.attach_view(&cluster, view.clone());
    let incoming = Incoming {
        broker: Arc::clone(&broker),
        mesh: Arc::clone(&mesh),
        links: Arc::clone(&links),
        cluster: cluster.clone(),
        relays,
        stop: stop.clone(),
    };
    tokio::spawn(accept(Arc::new(incoming), listener));
    tokio::spawn(tend_parked(Arc::clone(&broker), stop.clone()));
    tokio::spawn(dial_all(broker, mesh, links, cluster, view, stop));
}

/// Answers publishes that waited too long for their shard, and releases any
/// whose shard found a home without a release starting.
async fn tend_parked(broker: Arc<Broker>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => broker.tend_parked(),
        }
    }
}

/// Keeps one outgoing link to every other live node, and the shards' owners known.
async fn dial_all(
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    links: Arc<LinkSet>,
    cluster: String,
    mut view: watch::Receiver<View>,
    stop: CancellationToken,
) {
    let mut dialers: HashMap<Arc<str>, (String, CancellationToken)> = HashMap::new();
    loop {
        let current = view.borrow_and_update().clone();
        let owners = (0..current.shards)
            .map(|shard| {
                current
                    .owners
                    .get(&shard)
                    .map(|o| Arc::from(o.node.as_str()))
            })
            .collect();
        broker.answer(mesh.set_owners(owners));
        for shard in 0..current.shards {
            broker.release_parked(shard);
        }
        mesh.set_client_urls(current.nodes.values().map(|n| n.native.clone()).collect());
        mesh.set_link_addresses(
            current
                .nodes
                .values()
                .map(|n| (Arc::from(n.id.as_str()), n.link.clone()))
                .collect(),
        );
        dialers.retain(|node, (address, token)| {
            let keep = current
                .nodes
                .get(&**node)
                .is_some_and(|record| record.link == *address);
            if !keep {
                token.cancel();
            }
            keep
        });
        for (id, record) in &current.nodes {
            if **id == **mesh.me() || record.link.is_empty() || dialers.contains_key(id.as_str()) {
                continue;
            }
            let node: Arc<str> = Arc::from(id.as_str());
            let token = stop.child_token();
            dialers.insert(Arc::clone(&node), (record.link.clone(), token.clone()));
            tokio::spawn(dial(
                Arc::clone(&broker),
                Arc::clone(&mesh),
                Arc::clone(&links),
                cluster.clone(),
                mesh.me().clone(),
                node,
                record.link.clone(),
                token,
            ));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = view.changed() => if changed.is_err() { return },
        }
    }
}

/// One outgoing link, dialled again after every failure until `stop`.
#[allow(clippy::too_many_arguments)]
async fn dial(
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    links: Arc<LinkSet>,
    cluster: String,
    me: Arc<str>,
    node: Arc<str>,
    address: String,
    stop: CancellationToken,
) {
    loop {
        let session = async {
            let stream = TcpStream::connect(&address).await?;
            stream.set_nodelay(true)?;
            let (reading, mut stream) = stream.into_split();
            // Answers to what this node sends (acks) come back on the same link.
            let mut answers = AbortOnDrop(tokio::spawn(read_link(
                Arc::clone(&broker),
                Arc::clone(&mesh),
                Arc::clone(&links),
                cluster.clone(),
                Reading {
                    half: reading,
                    buffer: Vec::with_capacity(64 << 10),
                },
                Ok(Arc::clone(&node)),
                stop.clone(),
            )));
            let (sender, mut queue) = mpsc::channel::<Bytes>(QUEUE_FRAMES);
            links
                .senders
                .write()
                .insert(Arc::clone(&node), sender.clone());
            let mut hello = Vec::new();
            link::encode(
                &Frame::Hello {
                    version: link::VERSION,
                    cluster: &cluster,
                    node: &me,
                    proof: mesh.secret().prove_hello(&cluster, &me),
                },
                &mut hello,
            );
            // The whole interest after the hello; changes queue behind it.
            for (tenant, pattern, queue) in broker.interest_snapshot() {
                link::encode(
                    &Frame::Interest {
                        add: true,
                        tenant: &tenant,
                        pattern: &pattern,
                        queue: queue.as_deref(),
                    },
                    &mut hello,
                );
            }
            stream.write_all(&hello).await?;
            tracing::info!(node = %node, %address, "linked to node");
            let mut batch = Vec::with_capacity(256);
            let mut out = Vec::with_capacity(64 << 10);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return Ok::<(), std::io::Error>(()),
                    // The other node closed the link (it died, or is leaving): known
                    // at once, not at the next write after what the socket swallows.
                    _ = &mut answers.0 => {
                        return Err(std::io::Error::other("the other node closed the link"));
                    }
                    n = queue.recv_many(&mut batch, 256) => {
                        if n == 0 {
                            return Ok(());
                        }
                        out.clear();
                        for frame in batch.drain(..) {
                            out.extend_from_slice(&frame);
                        }
                        stream.write_all(&out).await?;
                    }
                }
            }
        }
        .await;
        links.senders.write().remove(&node);
        // What was sent on the link and not answered will not be now.
        broker.answer(mesh.fail_pending(&node));
        if let Err(error) = session {
            tracing::debug!(node = %node, %address, %error, "link to node failed; dialling again");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// What a connection another node opened is served with.
struct Incoming {
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    links: Arc<LinkSet>,
    cluster: String,
    relays: Arc<RelayHost>,
    stop: CancellationToken,
}

async fn accept(incoming: Arc<Incoming>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = incoming.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(take_incoming(Arc::clone(&incoming), stream, peer));
    }
}

/// The first frame of a connection another node opened says what it is: a link
/// (`Hello`), or an MQTT client relayed here (`Relay`).
async fn take_incoming(incoming: Arc<Incoming>, mut stream: TcpStream, peer: SocketAddr) {
    let mut buffer: Vec<u8> = Vec::with_capacity(64 << 10);
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match link::decode(&buffer, MAX_FRAME) {
                Ok(Some((Frame::Relay(_), _))) => return Some(true),
                Ok(Some(_)) => return Some(false),
                Ok(None) => {}
                Err(_) => return None,
            }
            match stream.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await;
    match first {
        Ok(Some(true)) => {
            if let Ok(Some((Frame::Relay(relay), used))) = link::decode(&buffer, MAX_FRAME) {
                if let Err(unproven) = incoming.mesh.secret().check_relay(&relay) {
                    tracing::warn!(%peer, %unproven, "refused a relayed client");
                    return;
                }
                let leftover = buffer.get(used..).unwrap_or_default().to_vec();
                incoming.relays.accept(stream, leftover, &relay, peer);
            }
        }
        Ok(Some(false)) => {
            let (reading, writing) = stream.into_split();
            let (sender, queue) = mpsc::channel::<Bytes>(QUEUE_FRAMES);
            tokio::spawn(write_back(writing, queue, peer));
            read_incoming(&incoming, reading, buffer, sender).await;
        }
        Ok(None) | Err(_) => {
            tracing::debug!(%peer, "a connection to the cluster port said nothing usable")
        }
    }
}

/// Reads a link another node dialled (`buffer` holding its first bytes), answering
/// on its way back; when it ends, forgets what that node said it was interested in.
async fn read_incoming(
    incoming: &Incoming,
    reading: OwnedReadHalf,
    buffer: Vec<u8>,
    back: mpsc::Sender<Bytes>,
) {
    let Incoming {
        broker,
        mesh,
        links,
        ..
    } = incoming;
    let from = read_link(
        Arc::clone(broker),
        Arc::clone(mesh),
        Arc::clone(links),
        incoming.cluster.clone(),
        Reading {
            half: reading,
            buffer,
        },
        Err(back.clone()),
        incoming.stop.clone(),
    )
    .await;
    if let Some(node) = from {
        let mut returns = links.returns.write();
        if returns.get(&node).is_some_and(|s| s.same_channel(&back)) {
            returns.remove(&node);
        }
        drop(returns);
        mesh.forget_node(&node, |name| broker.tenant(name));
    }
}

/// Writes the answers of one incoming link.
async fn write_back(
    mut writing: OwnedWriteHalf,
    mut queue: mpsc::Receiver<Bytes>,
    peer: SocketAddr,
) {
    let mut batch = Vec::with_capacity(256);
    let mut out = Vec::with_capacity(16 << 10);
    while queue.recv_many(&mut batch, 256).await > 0 {
        out.clear();
        for frame in batch.drain(..) {
            out.extend_from_slice(&frame);
        }
        if let Err(error) = writing.write_all(&out).await {
            tracing::debug!(%peer, %error, "answering on a link failed");
            return;
        }
    }
}

/// The read half of a link, and what was read of it already.
struct Reading {
    half: OwnedReadHalf,
    buffer: Vec<u8>,
}

/// Reads frames from one link until it ends; returns the node it was from. `side`
/// is the node this one dialled, or for an incoming link (which says who it is in
/// its hello) the way back to it, for answers.
async fn read_link(
    broker: Arc<Broker>,
    mesh: Arc<Mesh>,
    links: Arc<LinkSet>,
    cluster: String,
    reading: Reading,
    side: Result<Arc<str>, mpsc::Sender<Bytes>>,
    stop: CancellationToken,
) -> Option<Arc<str>> {
    let Reading {
        half: mut reading,
        mut buffer,
    } = reading;
    let peer = reading.peer_addr().ok();
    let dialled = side.is_ok();
    let (mut from, back) = match side {
        Ok(node) => (Some(node), None),
        Err(back) => (None, Some(back)),
    };
    let ended = loop {
        let mut used = 0;
        let mut refused = false;
        loop {
            match link::decode(&buffer[used..], MAX_FRAME) {
                Ok(Some((frame, n))) => {
                    used += n;
                    let was_known = from.is_some();
                    if let Err(reason) = apply(&broker, &mesh, &cluster, &mut from, frame).await {
                        tracing::warn!(?peer, %reason, "refused a link");
                        refused = true;
                        break;
                    }
                    if !was_known && let (Some(node), Some(back)) = (&from, &back) {
                        links.returns.write().insert(Arc::clone(node), back.clone());
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(?peer, %error, "a node sent a bad frame; dropping its link");
                    refused = true;
                    break;
                }
            }
        }
        if refused {
            break "refused";
        }
        buffer.drain(..used);
        if buffer.capacity() - buffer.len() < 16 << 10 {
            buffer.reserve(64 << 10);
        }
        let read = tokio::select! {
            () = stop.cancelled() => break "stopping",
            read = reading.read_buf(&mut buffer) => read,
        };
        match read {
            Ok(0) => break "closed",
            Ok(_) => {}
            Err(_) => break "read failed",
        }
    };
    if let Some(node) = &from
        && !dialled
    {
        tracing::info!(node = %node, reason = ended, "link from node ended");
    }
    from
}

/// Applies one frame from node `from` (set by its hello). `Err` ends the link.
async fn apply(
    broker: &Arc<Broker>,
    mesh: &Mesh,
    cluster: &str,
    from: &mut Option<Arc<str>>,
    frame: Frame<'_>,
) -> Result<(), String> {
    let node = match (&*from, &frame) {
        (
            None,
            Frame::Hello {
                cluster: theirs,
                node,
                proof,
                ..
            },
        ) => {
            if *theirs != cluster {
                return Err(format!("node {node} is of cluster {theirs}"));
            }
            if let Err(unproven) = mesh.secret().check_hello(theirs, node, proof) {
                return Err(format!("the hello of node {node}: {unproven}"));
            }
            *from = Some(Arc::from(*node));
            return Ok(());
        }
        (None, _) => return Err("a link must start with a hello".into()),
        (Some(node), _) => Arc::clone(node),
    };
    match frame {
        Frame::Hello { .. } => {}
        Frame::Interest {
            add,
            tenant,
            pattern,
            queue,
        } => {
            mesh.note_interest(&broker.tenant(tenant), &node, pattern, queue, add);
        }
        Frame::Msg(msg) => broker.route_from_link(&msg),
        Frame::Append(append) => store_forwarded(broker, mesh, &node, append).await,
        Frame::Ack {
            id,
            outcome,
            awaited,
        } => {
            let awaited = awaited.as_ref().map(mesh::awaited_from_wire);
            broker.answer(mesh.acked(id, mesh::outcome_from_wire(&outcome), awaited));
        }
        Frame::Call(call) => run_forwarded_call(broker, call),
        Frame::Barrier { id, tenant } => {
            // After the appends this link carried before it, which are in the
            // store's queue already (each was awaited into it).
            let store = broker.store_of(tenant);
            let broker = Arc::clone(broker);
            tokio::spawn(async move {
                if let Some(store) = store {
                    let _ = store.barrier().await;
                }
                if let Some(mesh) = broker.mesh() {
                    mesh.send_passed(&node, id);
                }
            });
        }
        Frame::Passed { id } => mesh.passed(id),
        Frame::Relay(_) => return Err("a relayed client's frame on a link".into()),
    }
    Ok(())
}

/// Why a forwarded append breaks the schema bound to its subject, if it does.
fn schema_refusal(broker: &Broker, append: &link::Append<'_>) -> Option<String> {
    let binding = broker
        .tenant(append.tenant)
        .schemas
        .for_subject(append.subject)?;
    append.messages.iter().find_map(|message| {
        // MQTT clears a retained message with an empty retained publish.
        if append.retain && message.payload.is_empty() {
            return None;
        }
        let violation = binding.check(message.payload).err()?;
        Some(format!(
            "the message does not match schema {} at {violation}; not stored",
            binding.reference()
        ))
    })
}

/// Runs an API call another node took from its client, as that client's: its
/// answer goes to the reply subject, which routing carries back to that node.
fn run_forwarded_call(broker: &Arc<Broker>, call: link::Call<'_>) {
    // Never sent on again: two nodes whose views disagree for a moment would
    // otherwise pass it back and forth.
    let refuse = |code, reason: &str| {
        if let Some(reply) = call.reply {
            broker.refuse(&broker.tenant(call.tenant), reply, code, reason);
        }
    };
    let home = crate::api::home_tenant(call.tenant, call.operation, call.body).into_owned();
    let opening = broker.mesh().is_some_and(|mesh| mesh.opening(&home));
    if broker.store_of(&home).is_none() && !opening {
        refuse(503, MOVED);
        return;
    }
    let Ok(principal) = crate::tenancy::login::of_forwarded(
        broker.user_book(),
        broker.tenant_records(),
        call.tenant,
        call.user,
        call.guest,
        call.client,
    ) else {
        refuse(
            503,
            "the caller's user or tenant is not known on the tenant's owner yet; try again",
        );
        return;
    };
    let [max_len, max_tokens, max_payload, max_subscriptions] = call
        .limits
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let forwarded = crate::api::ApiCall {
        principal,
        routes: broker.tenant(call.tenant),
        limits: Arc::new(crate::publish::SessionLimits {
            subjects: canopy_subjects::Limits {
                max_len,
                max_tokens,
            },
            max_payload,
            max_subscriptions,
        }),
        origin: call.origin,
        operation: call.operation.to_owned(),
        reply: call.reply.map(str::to_owned),
        body: Bytes::copy_from_slice(call.body),
    };
    if !opening {
        crate::api::spawn(Arc::clone(broker), forwarded);
        return;
    }
    // Claimed here and being opened (a node just started or took the shard over):
    // the call waits for it a little rather than being refused.
    let broker = Arc::clone(broker);
    tokio::spawn(async move {
        for _ in 0..100 {
            if broker.store_of(&home).is_some() {
                crate::api::spawn(broker, forwarded);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(reply) = &forwarded.reply {
            broker.refuse(&forwarded.routes, reply, 503, MOVED);
        }
    });
}

const MOVED: &str =
    "the tenant's shard moved to another node while the call was on its way; try again";

/// Stores an append another node forwarded here, its ack going back to that node.
async fn store_forwarded(broker: &Broker, mesh: &Mesh, from: &Arc<str>, append: link::Append<'_>) {
    let mut request = mesh::append_from_wire(from, &append);
    if let (Some(awaits), Some(ack)) = (&append.awaits, request.ack.as_mut()) {
        ack.cargo = forwarded_await(broker, append.tenant, append.origin, awaits)
            .map(crate::store::AckCargo::new);
    }
    // The entry node does not see the tenant's schema bindings yet (they live on
    // the owner): nothing that breaks them is stored through it.
    if let Some(refused) = schema_refusal(broker, &append) {
        broker
            .tenant(append.tenant)
            .schemas
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        broker.answer(mesh.refuse_append(request, &refused));
        return;
    }
    let request = match mesh.home(append.tenant) {
        mesh::Home::Here(store) => match store.try_append(request).await {
            Ok(()) => return,
            Err(request) => *request,
        },
        _ => request,
    };
    // Claimed here and being opened: it waits for the store, as this node's own
    // publishes do.
    if mesh.opening(append.tenant) {
        broker.park(request);
        return;
    }
    // The shard moved on (or is closing here): the entry node answers its
    // publisher as not stored, and the publisher tries again.
    broker.answer(mesh.refuse_append(
        request,
        "the tenant's shard moved to another node while the publish was on its way; not \
         stored, try again",
    ));
}

/// The `Canopy-Await` of an append another node forwarded: the owner waits for the
/// groups (they run here), for a waiter whose rights are made again here from its
/// user or its tenant's anonymous rules, as a forwarded call's are. A waiter that
/// cannot be made again reads no group.
fn forwarded_await(
    broker: &Broker,
    tenant: &str,
    origin: u64,
    awaits: &link::AwaitGroups<'_>,
) -> Option<Arc<crate::groups::awaiting::Await>> {
    use crate::groups::awaiting::{Await, Caller};
    let timeout = format!("{}ms", awaits.timeout_ms.max(1));
    let mut awaiting = Await::parse(awaits.groups, Some(&timeout)).ok()?;
    let principal = crate::tenancy::login::of_forwarded(
        broker.user_book(),
        broker.tenant_records(),
        tenant,
        awaits.user,
        awaits.guest,
        awaits.client,
    );
    awaiting.caller = principal
        .ok()
        .map(|principal| Caller::new(principal, Arc::clone(broker.authorizer()), origin));
    Some(Arc::new(awaiting))
}

/// Aborts a task when dropped: a link's reader ends with its writer.
struct AbortOnDrop(tokio::task::JoinHandle<Option<Arc<str>>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
