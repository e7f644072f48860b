//! Subscriptions: what one is (its outbox, pattern, queue group, UNSUB maximum) and
//! how they enter and leave a tenant's trie.
//!
//! Must never: change the trie while the same thread is inside a trie match (spent
//! subscriptions are removed after the match), or deliver anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use canopy_subjects::Pattern;

use super::{Broker, Outbox, Tenant, envelope};

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
    pub(super) fn can_take(&self) -> bool {
        self.outbox.is_open() && !self.is_spent()
    }

    /// Counts one delivery; `None` means the subscription is spent and must not
    /// deliver, `Some(true)` means this was its last delivery.
    pub(super) fn admit(&self) -> Option<bool> {
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

impl Broker {
    pub fn subscribe(
        &self,
        routes: &Tenant,
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
        routes: &Tenant,
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
    pub fn unsubscribe(&self, routes: &Tenant, sub: &Arc<Subscription>) -> bool {
        routes.trie.remove(&sub.pattern, sub.queue.as_deref(), sub)
    }

    /// Removes many subscriptions (a closing connection's) in one trie write.
    pub fn unsubscribe_all(&self, routes: &Tenant, subs: &[Arc<Subscription>]) {
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

    pub(super) fn remove_spent(&self, routes: &Tenant, spent: &mut Vec<Arc<Subscription>>) {
        for sub in spent.drain(..) {
            self.unsubscribe(routes, &sub);
        }
    }
}
