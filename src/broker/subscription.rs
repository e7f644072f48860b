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
        self.interest_changed(routes, &sub, true);
        sub
    }

    /// Tells the other nodes of a cluster when this node's interest in a pattern
    /// begins or ends; nothing outside a cluster.
    fn interest_changed(&self, routes: &Tenant, sub: &Subscription, add: bool) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let key = (
            super::mesh::interest_text(&sub.pattern),
            sub.queue.as_deref().map(Box::from),
        );
        let announce = {
            let mut interest = routes.interest.lock();
            if add {
                let count = interest.entry(key.clone()).or_insert(0);
                *count += 1;
                *count == 1
            } else {
                match interest.get_mut(&key) {
                    Some(count) if *count > 1 => {
                        *count -= 1;
                        false
                    }
                    Some(_) => {
                        interest.remove(&key);
                        true
                    }
                    None => false,
                }
            }
        };
        if announce {
            mesh.announce(&routes.name, &key.0, key.1.as_deref(), add);
        }
    }

    /// This node's interest in every tenant, for a node that just linked to it.
    pub fn interest_snapshot(&self) -> Vec<(Arc<str>, String, Option<Box<str>>)> {
        let mut all = Vec::new();
        for tenant in self.tenants() {
            for (pattern, queue) in tenant.interest.lock().keys() {
                all.push((Arc::clone(&tenant.name), pattern.clone(), queue.clone()));
            }
        }
        all
    }

    /// Removes a subscription; false when it was already gone.
    pub fn unsubscribe(&self, routes: &Tenant, sub: &Arc<Subscription>) -> bool {
        let removed = routes.trie.remove(&sub.pattern, sub.queue.as_deref(), sub);
        if removed {
            self.interest_changed(routes, sub, false);
        }
        removed
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
        if self.mesh().is_some() {
            for sub in subs {
                self.interest_changed(routes, sub, false);
            }
        }
    }

    pub(super) fn remove_spent(&self, routes: &Tenant, spent: &mut Vec<Arc<Subscription>>) {
        for sub in spent.drain(..) {
            self.unsubscribe(routes, &sub);
        }
    }
}
