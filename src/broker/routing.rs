//! Routing a publish: one walk of the tenant's trie, one member of each queue group,
//! MQTT's merged delivery for overlapping subscriptions, and the encode into each
//! outbox.
//!
//! Must never: wait for a subscriber, a socket or the store (a full outbox makes its
//! owner a slow consumer and routing goes on), or wake a subscriber itself (the
//! caller's `Wakes` does, once per batch).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use canopy_protocols::native::{encode_hmsg, encode_msg};
use canopy_subjects::QueueGroup;

use super::{
    Broker, Message, Outbox, QueuePick, RouteScratch, Subscription, Tenant, Wakes, envelope,
};
use crate::plugins::{Delivered, Plugin, TenantPlugins};

/// The one form of a refused call's answer, the API's and a consumer group's alike: a
/// `Canopy-Status: <code>` header block and `{"error": {"code", "description"}}`.
pub fn refusal(code: u16, description: &str) -> (Vec<u8>, Vec<u8>) {
    let mut headers = canopy_protocols::native::HeaderMap::new();
    headers.insert("Canopy-Status", code.to_string());
    let mut block = bytes::BytesMut::new();
    headers.encode(&mut block);
    let body = serde_json::json!({"error": {"code": code, "description": description}});
    (block.to_vec(), body.to_string().into_bytes())
}

impl Broker {
    /// Answers `reply` with a [`refusal`], waking its subscriber at once.
    pub fn refuse(&self, routes: &Tenant, reply: &str, code: u16, description: &str) {
        let (block, body) = refusal(code, description);
        let message = Message {
            subject: reply,
            headers: Some(&block),
            payload: &body,
            ..Message::default()
        };
        let mut wakes = Wakes::default();
        self.route(
            routes,
            None,
            &message,
            &mut RouteScratch::default(),
            &mut wakes,
        );
        wakes.wake_all();
    }

    /// Delivers `msg` to every matching subscription of the tenant and returns how
    /// many received it. `from` is the publisher's outbox (for `echo: false`).
    pub fn publish(
        &self,
        routes: &Tenant,
        from: &Outbox,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> usize {
        let skip_conn = (!from.echo()).then_some(from.conn_id);
        self.route(routes, skip_conn, msg, scratch, wakes)
    }

    /// Delivers a message another node routed to this node's subscribers, as it says.
    pub fn route_from_link(&self, msg: &canopy_protocols::link::Msg<'_>) {
        let tenant = self.tenant(msg.tenant);
        let message = Message {
            subject: msg.subject,
            shown_as: msg.shown_as,
            // Plugins are not run across nodes (a cluster refuses them).
            source: None,
            reply: msg.reply,
            headers: msg.headers,
            payload: msg.payload,
            origin: msg.origin,
            flags: msg.flags,
            version: msg.version,
            offset: msg.offset,
            from_link: Some(super::LinkDelivery {
                plain: msg.plain,
                queues: &msg.queues,
            }),
        };
        let mut wakes = Wakes::default();
        let skip = msg.no_echo.then_some(msg.origin);
        let delivered = self.route(
            &tenant,
            skip,
            &message,
            &mut RouteScratch::default(),
            &mut wakes,
        );
        if delivered > 0 {
            self.metrics().count_out(
                delivered as u64,
                (delivered * (msg.payload.len() + msg.headers.map_or(0, <[u8]>::len))) as u64,
            );
        }
        wakes.wake_all();
    }

    /// Delivers `msg` to every matching subscription except those of connection
    /// `skip_conn`, and returns how many received it.
    #[inline]
    pub fn route(
        &self,
        routes: &Tenant,
        skip_conn: Option<u64>,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> usize {
        self.route_counted(routes, skip_conn, msg, scratch, wakes).0
    }

    /// [`Broker::route`], also saying how many readers the tenant's deliver plugins
    /// withheld the message from (a consumer skips a message so withheld rather than
    /// wait for a listener).
    pub fn route_counted(
        &self,
        routes: &Tenant,
        skip_conn: Option<u64>,
        msg: &Message<'_>,
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> (usize, usize) {
        if self.authz.filters_delivery() && !self.authz.may_deliver(msg.subject) {
            return (0, 0);
        }
        let mut delivered = 0usize;
        let mut withheld = 0usize;
        let withheld = &mut withheld;
        // What readers see goes through the tenant's deliver plugins of that subject.
        let chain = routes.plugins.deliver_chain(msg.plugged_subject());
        let chain = Chain {
            plugins: &chain,
            started: (!chain.is_empty()).then(std::time::Instant::now),
        };
        let RouteScratch {
            queue_picks,
            spent,
            merged,
        } = scratch;
        queue_picks.clear();
        let (plain_here, queues_here) = match msg.from_link {
            None => (true, None),
            Some(link) => (link.plain, Some(link.queues)),
        };
        routes
            .trie
            .for_each_match(msg.subject, &mut |plain, groups| {
                for sub in plain {
                    if !plain_here || Some(sub.outbox.conn_id) == skip_conn {
                        continue;
                    }
                    if sub.overlapping.load(Ordering::Relaxed) {
                        merged.push(Arc::clone(sub));
                    } else if deliver_through(chain, sub, msg, (spent, withheld), wakes) {
                        delivered += 1;
                    }
                }
                for group in groups {
                    if queues_here.is_none_or(|names| names.contains(&&*group.name)) {
                        pick_member(queue_picks, group, skip_conn);
                    }
                }
            });
        if msg.from_link.is_none()
            && let Some(mesh) = self.mesh()
        {
            let served: Vec<&str> = queue_picks
                .iter()
                .filter_map(|p| p.chosen.queue.as_deref())
                .collect();
            delivered += mesh.forward(routes, msg, &served, skip_conn);
        }
        for pick in queue_picks.drain(..) {
            if deliver_through(chain, &pick.chosen, msg, (spent, withheld), wakes) {
                delivered += 1;
            }
        }
        if !merged.is_empty() {
            delivered += deliver_merged(merged, msg, (chain, withheld), wakes);
        }
        self.remove_spent(routes, spent);
        (delivered, *withheld)
    }

    /// Tells connection `conn` that its request to `reply` reached no subscriber
    /// (NATS's no-responders status, a 503 header block on the reply subject), on
    /// one of its own subscriptions that matches the reply: the same for a publish
    /// routed now and one the sequencer routes.
    pub fn tell_no_responders(
        &self,
        routes: &Tenant,
        conn: u64,
        reply: &[u8],
        scratch: &mut RouteScratch,
        wakes: &mut Wakes,
    ) -> bool {
        let Ok(reply) = std::str::from_utf8(reply) else {
            return false;
        };
        let status = Message {
            subject: reply,
            reply: None,
            headers: Some(canopy_protocols::native::no_responders_block()),
            payload: &[],
            ..Message::default()
        };
        let mut delivered = false;
        let spent = &mut scratch.spent;
        routes
            .trie
            .for_each_match(status.subject, &mut |plain, groups| {
                let members = groups.iter().flat_map(|g| g.members.iter());
                for sub in plain.iter().chain(members) {
                    if !delivered && sub.outbox.conn_id == conn {
                        delivered = deliver(sub, &status, spent, wakes);
                    }
                }
            });
        self.remove_spent(routes, spent);
        delivered
    }

    /// Whether any subscription matches `subject` (a JetStream pull's inbox: a pull
    /// whose client stopped listening is dropped, not sent messages nobody reads).
    pub fn has_interest(&self, routes: &Tenant, subject: &str) -> bool {
        let mut found = false;
        routes.trie.for_each_match(subject, &mut |plain, groups| {
            found = found || !plain.is_empty() || groups.iter().any(|g| !g.members.is_empty());
        });
        found
            || self
                .mesh()
                .is_some_and(|mesh| mesh.has_interest(routes, subject))
    }

    /// Whether a subscription that answers requests on `subject` matches it: a member
    /// of a queue group, or a subscription to exactly this subject (NATS services
    /// subscribe one or the other). A wildcard subscription outside any queue group
    /// watches subjects; it does not answer them. `skip_conn` is a publisher that
    /// does not see its own messages.
    pub fn has_responder(&self, routes: &Tenant, subject: &str, skip_conn: Option<u64>) -> bool {
        let mut found = false;
        let other = |sub: &Arc<Subscription>| Some(sub.outbox.conn_id) != skip_conn;
        routes.trie.for_each_match(subject, &mut |plain, groups| {
            found = found
                || groups.iter().any(|g| g.members.iter().any(other))
                || plain
                    .iter()
                    .any(|sub| sub.pattern.is_literal() && other(sub));
        });
        found
            || self
                .mesh()
                .is_some_and(|mesh| mesh.has_responder(routes, subject))
    }
}

/// Delivers one envelope per connection for overlapping MQTT subscriptions that
/// matched: the highest QoS any grants (capped by the publish's), every subscription
/// identifier, RETAIN kept if any keeps it. Returns how many connections got it.
pub(super) fn deliver_merged(
    merged: &mut Vec<Arc<Subscription>>,
    msg: &Message<'_>,
    (chain, withheld): (Chain<'_>, &mut usize),
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
        let replaced;
        let msg = match seen_by(chain, &first.outbox, msg) {
            Delivered::Unchanged => *msg,
            Delivered::Withheld => {
                *withheld += 1;
                continue;
            }
            Delivered::Replaced { headers, payload } => {
                replaced = (headers, payload);
                replaced_message(msg, &replaced)
            }
        };
        let queued = first
            .outbox
            .push(|out| envelope::encode_merged(out, &msg, &options, &ids));
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
pub(super) fn pick_member(
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

/// The deliver plugins of a routed message's subject, and when they started on it.
#[derive(Clone, Copy)]
pub(super) struct Chain<'a> {
    plugins: &'a [Arc<Plugin>],
    started: Option<std::time::Instant>,
}

/// What `chain` (the deliver plugins of the message's subject) makes of `msg` for
/// the reader of `outbox`; past the route's budget, without running them.
fn seen_by(chain: Chain<'_>, outbox: &Outbox, msg: &Message<'_>) -> Delivered {
    if chain.plugins.is_empty() {
        return Delivered::Unchanged;
    }
    let over = chain
        .started
        .is_some_and(|started| started.elapsed() > crate::plugins::ROUTE_BUDGET);
    let input = (msg.headers.unwrap_or_default(), msg.payload);
    let reader = outbox.reader();
    TenantPlugins::on_deliver(chain.plugins, msg.plugged_subject(), input, (&reader, over))
}

/// `msg` with the headers and payload a deliver plugin gave.
fn replaced_message<'a>(msg: &Message<'a>, (headers, payload): &'a (Bytes, Bytes)) -> Message<'a> {
    Message {
        headers: (!headers.is_empty()).then_some(&headers[..]),
        payload,
        ..*msg
    }
}

/// [`deliver`], through the deliver plugins of the message's subject.
fn deliver_through(
    chain: Chain<'_>,
    sub: &Arc<Subscription>,
    msg: &Message<'_>,
    (spent, withheld): (&mut Vec<Arc<Subscription>>, &mut usize),
    wakes: &mut Wakes,
) -> bool {
    match seen_by(chain, &sub.outbox, msg) {
        Delivered::Unchanged => deliver(sub, msg, spent, wakes),
        Delivered::Withheld => {
            *withheld += 1;
            false
        }
        Delivered::Replaced { headers, payload } => {
            let replaced = (headers, payload);
            deliver(sub, &replaced_message(msg, &replaced), spent, wakes)
        }
    }
}

/// Queues `msg` for `sub`; true when it was queued.
pub(super) fn deliver(
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
            msg.shown_subject().as_bytes(),
            &sub.sid,
            msg.reply,
            h,
            msg.payload,
        ),
        None => encode_msg(
            out,
            msg.shown_subject().as_bytes(),
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
