//! The client core: what every connection has, whatever protocol it speaks.
//!
//! A front end (`server/native/`, `server/mqtt/`, `server/websocket/`) decodes
//! its frames and calls a [`Session`]: `publish`, `subscribe`, `unsubscribe`,
//! `end_batch`, `close`. The session owns the connection's principal and tenant,
//! its routes, outbox, publishes waiting for the sequencer, quota slot and the
//! pause a rate quota imposes, and decides every publish in one place
//! ([`Publisher::decide`]): the subject, the reserved namespaces, the user's rules,
//! the size limit, the quotas and the store policy. Messages published on a
//! client's behalf after the fact (an MQTT will, an answer forwarded to an MQTT 5
//! response topic) go through the same decision with the same principal.
//!
//! Refusals are typed ([`Refusal`]); each front end renders them in its own
//! protocol. This module must never touch a socket or know a wire format.

mod inbox;
mod plugged;
mod publish;

use std::sync::Arc;

use bytes::Bytes;
use canopy_subjects::Pattern;

use crate::broker::envelope::MqttOptions;
use crate::broker::{Broker, Outbox, RouteScratch, Subscription, Tenant, Wakes};
use crate::store::AppendRequest;
use crate::tenancy::quota::{ConnectionSlot, Exceeded};
use crate::tenancy::{Action, Denied, Principal};

pub use crate::publish::{
    Admission, AskAck, Decision, Publish, Published, Publisher, Refusal, Refused, SessionLimits,
};

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeRefusal {
    #[error("{0}")]
    Denied(Denied),
    /// Another connection holds the inbox the pattern is under.
    #[error("Permissions Violation for Subscription to \"{0}\"")]
    InboxTaken(String),
    #[error("{0}")]
    OverQuota(Exceeded),
    #[error("maximum subscriptions exceeded: a connection may hold {0}")]
    TooMany(usize),
}

/// Why a connection could not have an inbox of its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxRefusal {
    #[error("{0}")]
    Refused(#[from] SubscribeRefusal),
    #[error("no inbox could be made: {0}")]
    NotMade(String),
}

/// One connection's share of the server.
pub struct Session {
    /// Shared: it is cloned for wills, each publish holds it while the session
    /// carries the publish out, and an idle connection's task stays small.
    pub publisher: Arc<Publisher>,
    pub outbox: Arc<Outbox>,
    pub scratch: RouteScratch,
    pub wakes: Wakes,
    /// Publishes to stored subjects from this inbound batch, for the sequencer.
    pub appends: Vec<AppendRequest>,
    /// Publishes (messages, bytes) admitted this batch, counted once per batch.
    admitted: (u64, u64),
    /// Deliveries (messages, bytes) this batch made, counted once per batch.
    delivered: (u64, u64),
    /// Over its tenant's publish rate: the front end reads nothing until then.
    pub paused_until: Option<tokio::time::Instant>,
    /// Subscribers' outboxes this connection fed while they were falling behind:
    /// the front end reads nothing until they drain or `stall_until` passes.
    pressing: Vec<Arc<Outbox>>,
    stall_until: Option<tokio::time::Instant>,
    slot: Option<ConnectionSlot>,
    /// Subscriptions held, for the per-connection cap.
    subscriptions: usize,
    /// Inbox owner tokens this connection holds, with how many subscriptions each.
    inboxes: inbox::Held,
}

impl Session {
    pub fn new(
        broker: Arc<Broker>,
        routes: Arc<Tenant>,
        principal: Principal,
        outbox: Arc<Outbox>,
        limits: Arc<SessionLimits>,
    ) -> Self {
        outbox.set_reader(principal.user.clone().unwrap_or_else(|| Arc::from("")));
        let mut publisher = Publisher::new(broker, routes, principal, limits, outbox.conn_id);
        publisher.feedback = Some(crate::store::AckCargo::new(Arc::clone(&outbox)));
        Self {
            publisher: Arc::new(publisher),
            outbox,
            scratch: RouteScratch::default(),
            wakes: Wakes::default(),
            appends: Vec::new(),
            admitted: (0, 0),
            delivered: (0, 0),
            paused_until: None,
            pressing: Vec::new(),
            stall_until: None,
            slot: None,
            subscriptions: 0,
            inboxes: inbox::Held::default(),
        }
    }

    pub fn id(&self) -> u64 {
        self.outbox.conn_id
    }

    /// Makes the connection's per-client pattern buckets those of `client`, a stable
    /// identity (an MQTT client id) its later connections share: reconnecting does
    /// not start them full. Without one, a connection's buckets are its own.
    pub fn share_client_rates(&mut self, client: &str) {
        let rates = self.publisher.routes.quota.client_rates_of(client);
        std::sync::Arc::make_mut(&mut self.publisher).client_rates = rates;
    }

    pub fn routes(&self) -> &Arc<Tenant> {
        &self.publisher.routes
    }

    pub fn principal(&self) -> &Principal {
        &self.publisher.principal
    }

    /// Puts the connection in its logged-in principal's tenant (before anything
    /// else happened on it).
    pub fn log_in(&mut self, principal: Principal) {
        let routes = self.publisher.broker.tenant_for(&principal);
        let reader = principal.user.clone().unwrap_or_else(|| Arc::from(""));
        self.outbox.set_reader(reader);
        let publisher = Arc::make_mut(&mut self.publisher);
        publisher.routes = routes;
        publisher.principal = principal;
    }

    /// Names the client (NATS CONNECT's `name`), for logs and `{client_id}` rules.
    pub fn set_client_name(&mut self, name: &str) {
        Arc::make_mut(&mut self.publisher).principal.client = Arc::from(name);
    }

    /// Takes the connection's place in its tenant's connection quota.
    pub fn take_slot(&mut self) -> Result<(), Exceeded> {
        let slot = self.publisher.routes.quota.connect()?;
        self.slot = Some(slot);
        Ok(())
    }

    /// Adopts a slot taken before the session existed (MQTT takes it after a
    /// takeover).
    pub fn hold_slot(&mut self, slot: ConnectionSlot) {
        self.slot = Some(slot);
    }

    /// Decides a publish and carries it out: routed now, queued for the sequencer
    /// (sent by [`Session::send_appends`]), or an API call.
    #[inline]
    pub fn publish(&mut self, publish: Publish<'_>) -> Result<Published, Refused> {
        self.publish_then(publish, |_| {})
    }

    /// [`Session::publish`], calling `taken` with the outbox once the publish is
    /// taken and before it is carried out: NATS's `+OK` goes out before the
    /// publish's deliveries, also those to the publisher's own subscriptions.
    #[inline]
    pub fn publish_then(
        &mut self,
        publish: Publish<'_>,
        taken: impl FnOnce(&Outbox),
    ) -> Result<Published, Refused> {
        match self.publisher.run_plugins(&publish) {
            Ok(None) => {}
            Ok(Some(outcome)) => return self.publish_plugged(publish, outcome, taken),
            Err(refusal) => return Err(self.refused(&publish, refusal)),
        }
        // Held apart, so the decision may borrow it while the session carries it out.
        let publisher = Arc::clone(&self.publisher);
        let decision = match publisher.decide(&publish) {
            Ok(decision) => decision,
            Err(refusal) => return Err(self.refused(&publish, refusal)),
        };
        taken(&self.outbox);
        Ok(self.carry_out_with(&publisher, decision, publish))
    }

    /// A refusal with the answer its publisher gets, pausing the connection for a
    /// rate quota.
    fn refused(&mut self, publish: &Publish<'_>, refusal: Refusal) -> Refused {
        if let Some(wait) = refusal.wait() {
            pause(&mut self.paused_until, wait);
        }
        let answer = self.publisher.error_answer(publish, &refusal);
        Refused { refusal, answer }
    }

    /// Carries out a publish `publisher` (this session's) decided, counting what it
    /// admitted and delivered.
    fn carry_out_with(
        &mut self,
        publisher: &Publisher,
        decision: crate::publish::Decision<'_>,
        publish: Publish<'_>,
    ) -> Published {
        let size = publish.size() as u64;
        if let Some(wait) = decision.throttled {
            pause(&mut self.paused_until, wait);
        }
        if decision.charged {
            self.admitted.0 += 1;
            self.admitted.1 += size;
        }
        let published = publisher.carry_out(
            decision,
            publish,
            Some(&self.outbox),
            &mut self.scratch,
            &mut self.wakes,
            &mut self.appends,
        );
        if let Published::Routed { delivered } = published {
            self.delivered.0 += delivered as u64;
            self.delivered.1 += delivered as u64 * size;
        }
        published
    }

    /// Counts what this inbound batch admitted and delivered, and wakes every
    /// subscriber it touched, once.
    pub fn end_batch(&mut self) {
        let (admitted, admitted_bytes) = std::mem::take(&mut self.admitted);
        if admitted > 0 {
            self.publisher
                .routes
                .quota
                .count_admitted(admitted, admitted_bytes);
        }
        let (delivered, delivered_bytes) = std::mem::take(&mut self.delivered);
        if delivered > 0 {
            self.publisher
                .broker
                .metrics()
                .count_out(delivered, delivered_bytes);
        }
        self.wakes.wake_all();
    }

    /// Whether the front end should read nothing more for now: subscribers this
    /// connection fed (live, or by stored messages the sequencer routed since) are
    /// falling behind. The stall lasts until they drain below half their limit or
    /// stop reading ([`Session::relieved`]), at most `broker::outbox::STALL_MAX`,
    /// after which one more batch is read. Never for the connection's own outbox,
    /// which its own task drains.
    pub fn stalled(&mut self) -> bool {
        self.wakes.take_pressing(&mut self.pressing);
        self.outbox.take_fed_pressing(&mut self.pressing);
        if self.pressing.is_empty() && self.stall_until.is_none() {
            return false;
        }
        let own = &self.outbox;
        self.pressing
            .retain(|o| !Arc::ptr_eq(o, own) && o.holds_back());
        let now = tokio::time::Instant::now();
        match self.stall_until {
            Some(until) if until <= now => {
                self.pressing.clear();
                self.stall_until = None;
                false
            }
            _ if self.pressing.is_empty() => {
                self.stall_until = None;
                false
            }
            Some(_) => true,
            None => {
                self.stall_until = Some(now + crate::broker::outbox::STALL_MAX);
                self.publisher.broker.metrics().count_stall();
                true
            }
        }
    }

    /// Whether a stall [`Session::stalled`] began is still on.
    pub fn is_stalled(&self) -> bool {
        self.stall_until.is_some()
    }

    /// Resolves when the stall [`Session::stalled`] began may end: every outbox it
    /// waits for drained or stopped reading, or `STALL_MAX` passed. Cancel-safe.
    pub async fn relieved(&self) {
        let Some(until) = self.stall_until else {
            return;
        };
        let drained = async {
            for outbox in &self.pressing {
                outbox.drained().await;
            }
        };
        let _ = tokio::time::timeout_at(until, drained).await;
    }

    /// Sends the publishes this batch made to stored subjects, and runs their round
    /// here when none is under way; waits while the sequencer's queue is full, which
    /// holds this publisher back and no one else.
    /// False when the store is closing (what was not taken was never acked).
    pub async fn send_appends(&mut self) -> bool {
        let mut appends = std::mem::take(&mut self.appends);
        let taken = self
            .publisher
            .broker
            .append_all(appends.drain(..))
            .await
            .is_ok();
        // Keeps the allocation for the next batch.
        self.appends = appends;
        taken
    }

    /// Checks a subscription (the user's rules, inbox ownership, the connection's
    /// and tenant's caps) before a front end adds it with [`Session::subscribe`];
    /// `native` is the pattern in native syntax (MQTT's `a/#` as `a.#`), `replacing`
    /// when it replaces one the connection holds. An inbox it is under is claimed
    /// for this connection when it passes.
    pub fn admit_subscription(
        &mut self,
        native: &str,
        pattern: &Pattern,
        replacing: bool,
    ) -> Result<(), SubscribeRefusal> {
        let owner = inbox::pattern_owner(pattern);
        let authz = self.publisher.broker.authorizer();
        let checked = match &owner {
            Some(_) => authz.authorize_own_inbox(self.principal(), native),
            None => authz.authorize(self.principal(), Action::Subscribe, native),
        };
        checked.map_err(SubscribeRefusal::Denied)?;
        if !replacing {
            let max = self.publisher.limits.max_subscriptions;
            if max > 0 && self.subscriptions >= max {
                return Err(SubscribeRefusal::TooMany(max));
            }
            self.publisher
                .routes
                .quota
                .admit_subscription(self.publisher.routes.subscription_count())
                .map_err(SubscribeRefusal::OverQuota)?;
        }
        if let Some(token) = owner {
            let id = self.id();
            if !self.inboxes.add(&token) {
                if !self.publisher.routes.inboxes.try_claim(&token, id) {
                    return Err(SubscribeRefusal::InboxTaken(native.to_owned()));
                }
                self.inboxes.hold(Arc::from(token));
            }
        }
        Ok(())
    }

    /// Subscribes the connection to an inbox of its own, `_INBOX.<tag><random>.*`,
    /// for the answers to requests the front end makes for its client (MQTT 5
    /// response topics, `/ws` group calls); returns its prefix (`_INBOX.<…>.`, a
    /// request number goes after it) and the subscription. The owner token is
    /// random, since the first subscriber claims an inbox: a predictable one could
    /// be taken first.
    pub fn subscribe_private_inbox(
        &mut self,
        tag: &str,
        sid: Bytes,
        options: MqttOptions,
    ) -> Result<(String, Arc<Subscription>), InboxRefusal> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token)
            .map_err(|e| InboxRefusal::NotMade(format!("no random owner token: {e}")))?;
        let mut prefix = format!("{}.{tag}", canopy_subjects::INBOX_TOKEN);
        for byte in token {
            prefix.push_str(&format!("{byte:02x}"));
        }
        prefix.push('.');
        let text = format!("{prefix}*");
        let pattern = Pattern::parse_native(&text)
            .map_err(|e| InboxRefusal::NotMade(format!("{text}: {e}")))?;
        self.admit_subscription(&text, &pattern, false)?;
        let sub = self.subscribe(sid, pattern, None, Some(options));
        Ok((prefix, sub))
    }

    /// Adds a subscription that [`Session::admit_subscription`] allowed.
    pub fn subscribe(
        &mut self,
        sid: Bytes,
        pattern: Pattern,
        queue: Option<&str>,
        mqtt: Option<MqttOptions>,
    ) -> Arc<Subscription> {
        self.subscriptions += 1;
        let Publisher { broker, routes, .. } = &*self.publisher;
        broker.subscribe_as(routes, &self.outbox, sid, pattern, queue, mqtt)
    }

    /// Removes a subscription; false when it was already gone (spent).
    pub fn unsubscribe(&mut self, sub: &Arc<Subscription>) -> bool {
        self.forget(sub);
        let Publisher { broker, routes, .. } = &*self.publisher;
        broker.unsubscribe(routes, sub)
    }

    /// Records that a subscription ended by itself (an UNSUB maximum reached during
    /// routing), so the connection's counts stay true.
    pub fn forget(&mut self, sub: &Subscription) {
        self.subscriptions = self.subscriptions.saturating_sub(1);
        if let Some(token) = inbox::pattern_owner(&sub.pattern) {
            self.release_inbox(&token);
        }
    }

    fn release_inbox(&mut self, token: &str) {
        if let Some(token) = self.inboxes.remove(token) {
            self.publisher.routes.inboxes.release(&token, self.id());
        }
    }

    /// Gives back every inbox the connection holds.
    fn release_inboxes(&mut self) {
        for token in self.inboxes.take() {
            self.publisher
                .routes
                .inboxes
                .release(&token, self.outbox.conn_id);
        }
    }

    /// Removes every subscription the connection holds and gives back its inboxes
    /// (its slot goes with the session).
    pub fn close(&mut self, subs: &[Arc<Subscription>]) {
        let Publisher { broker, routes, .. } = &*self.publisher;
        broker.unsubscribe_all(routes, subs);
        self.release_inboxes();
        self.subscriptions = 0;
    }
}

/// Holds the reader back until `wait` has passed (the later of two pauses).
fn pause(paused_until: &mut Option<tokio::time::Instant>, wait: std::time::Duration) {
    let until = tokio::time::Instant::now() + wait;
    *paused_until = Some(paused_until.map_or(until, |u| u.max(until)));
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release_inboxes();
    }
}
