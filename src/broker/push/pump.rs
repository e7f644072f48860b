//! The pump of a push consumer with acks: a consumer group whose messages go to a
//! deliver subject as they come. The pump keeps one long JetStream pull of the group
//! waiting, to the deliver subject, while something listens there (the group's
//! dispatcher then does all the rest: acks, redelivery, `max_ack_pending`, dead
//! letters), sends idle heartbeats when asked, and deletes an ephemeral consumer after
//! its inactive threshold without a listener, or once its maker's connection lets go
//! of the inbox that let it deliver there. Must never: hold a message (the group
//! does), or outlive its group or its tenant.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::broker::groups::jetstream::JetStreamPull;
use crate::broker::groups::{Pull, PullStyle};
use crate::broker::{Broker, Message, RouteScratch, Tenant, Wakes};
use crate::groups::PushTerms;
use crate::store::Store;

/// How often the pump looks for a listener, and how long each of its pulls waits: a
/// new one is asked for as the last one ends, so at most this long passes with none.
const TICK: Duration = Duration::from_millis(250);
const PULL_WAIT: Duration = Duration::from_secs(1);
/// Most messages one of the pump's pulls takes (the group's `max_ack_pending` bounds
/// what is in flight).
const PULL_BATCH: usize = 100_000;

/// Starts the pump of the push consumer `name` (a running group) of `routes`; one
/// already running under that name is stopped first.
pub fn start_pump(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    routes: &Arc<Tenant>,
    name: &str,
    terms: PushTerms,
) {
    let stop = routes.deleted.child_token();
    let id = routes.pushes.next_pump.fetch_add(1, Ordering::Relaxed);
    if let Some((_, old)) = routes
        .pushes
        .pumps
        .lock()
        .insert(Arc::from(name), (id, stop.clone()))
    {
        old.cancel();
    }
    let pump = Pump {
        broker: Arc::clone(broker),
        store: Arc::clone(store),
        routes: Arc::clone(routes),
        stream: Arc::from(terms.stream.as_str()),
        name: Arc::from(name),
        terms,
        id,
    };
    tokio::spawn(pump.run(stop));
}

struct Pump {
    broker: Arc<Broker>,
    store: Arc<Store>,
    routes: Arc<Tenant>,
    stream: Arc<str>,
    name: Arc<str>,
    terms: PushTerms,
    /// Tells this pump from a later one of the same name.
    id: u64,
}

impl Pump {
    async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_listened = Instant::now();
        let mut pulled: Option<Instant> = None;
        let mut beat = Instant::now();
        let heartbeat = Duration::from_millis(self.terms.heartbeat_ms);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Some(conn) = self.terms.inbox_of
                && !self
                    .routes
                    .holds_inbox_of(&self.terms.deliver_subject, conn)
            {
                // Its maker's connection let go of the inbox: someone else may take it.
                let _ = self.forget(&stop, true).await;
                return;
            }
            let listening = self
                .broker
                .has_interest(&self.routes, &self.terms.deliver_subject);
            if !listening {
                pulled = None;
                if let Some(ms) = self.terms.inactive_ms
                    && last_listened.elapsed() >= Duration::from_millis(ms)
                {
                    if self.forget(&stop, false).await {
                        return;
                    }
                    // A listener came while it waited for the lock.
                    last_listened = Instant::now();
                }
                continue;
            }
            last_listened = Instant::now();
            if pulled.is_none_or(|at| at.elapsed() >= PULL_WAIT) {
                if !self.pull().await {
                    // The group is gone (deleted, or its tenant closed).
                    self.routes.pushes.forget_pump(&self.name, self.id);
                    return;
                }
                pulled = Some(Instant::now());
            }
            if !heartbeat.is_zero() && beat.elapsed() >= heartbeat {
                self.heartbeat();
                beat = Instant::now();
            }
        }
    }

    /// Asks the group for what it has, to the deliver subject; false when there is no
    /// such group.
    async fn pull(&self) -> bool {
        let pull = Pull {
            member: format!("push:{}", self.name),
            max: PULL_BATCH,
            wait: PULL_WAIT,
            reply: self.terms.deliver_subject.clone(),
            routes: Arc::clone(&self.routes),
            style: PullStyle::JetStream {
                stream: Arc::clone(&self.stream),
                terms: JetStreamPull {
                    push: true,
                    ..JetStreamPull::default()
                },
            },
            place: None,
        };
        self.broker
            .groups()
            .pull(&self.routes, &self.name, pull)
            .await
    }

    fn heartbeat(&self) {
        let message = Message {
            subject: &self.terms.deliver_subject,
            headers: Some(b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"),
            ..Message::default()
        };
        let mut wakes = Wakes::default();
        self.broker.route(
            &self.routes,
            None,
            &message,
            &mut RouteScratch::default(),
            &mut wakes,
        );
    }

    /// An ephemeral consumer nobody listened to for its threshold (or whose maker's
    /// inbox is gone, `now`): its group is stopped and deleted, as nats-server
    /// deletes it. Checked again under the lock that makes and deletes consumers: a
    /// pump stopped meanwhile (its group deleted, maybe made again) deletes nothing,
    /// and a listener that came meanwhile keeps it.
    /// False when it is kept after all (and the pump goes on).
    async fn forget(&self, stop: &CancellationToken, now: bool) -> bool {
        let _change = self.routes.group_changes.lock().await;
        if stop.is_cancelled() {
            return true;
        }
        if !now
            && self
                .broker
                .has_interest(&self.routes, &self.terms.deliver_subject)
        {
            return false;
        }
        self.broker.groups().stop(&self.routes, &self.name);
        if let Err(e) = self.store.delete_group(&self.routes.name, &self.name).await {
            tracing::warn!(consumer = %self.name, "an inactive push consumer was not deleted: {e}");
        }
        self.routes.pushes.forget_pump(&self.name, self.id);
        true
    }
}
