//! JetStream push consumers without acks: the ordered consumers NATS KV's watch,
//! keys and history, an object's chunks and `js.subscribe(ordered_consumer)` read
//! through. Such a consumer is a task that follows the tenant's log over its
//! filters and routes each message to its deliver subject, shown under its own
//! subject with a `$JS.ACK.` reply that numbers it (consumer sequence, stream
//! sequence, how many are still to come), as nats-server does. An ordered *pull*
//! consumer (no deliver subject) is the same task delivering to the pulls it is sent
//! instead ([`pulled`]).
//!
//! It delivers in two parts: first the *plan*, the messages that were stored when it
//! was made and its deliver policy picks (every one, the last of each subject, from a
//! sequence or a time), in offset order, each telling how many of the plan follow it
//! (the clients end a watch's "initial values" on the one that says 0); then every
//! message stored after them, live. Its tap is registered before the plan's end is
//! read, so nothing falls between the two.
//!
//! While nobody listens on its deliver subject it delivers nothing (a push consumer
//! is bound only while its inbox is subscribed), and after `inactive_threshold` of
//! that it ends and is forgotten: the clients never delete these consumers. While
//! idle it sends `100 Idle Heartbeat` with the last sequences, which the clients'
//! ordered consumers check for gaps. A deliver subject whose subscriber reads slowly
//! holds it back as a fast publisher is held back ([`super::outbox`]).
//!
//! Must never: deliver a message a restart would not find (its follower is durable),
//! hold more than [`MAX_PLANNED`] planned messages (a larger plan from a point of the
//! log is read by the follower as it goes; more newest-of-a-subject is refused), keep
//! more than [`KEEP_BYTES`] of them in memory (the rest are read again when their
//! turn comes), let its tenant's plans together pass [`TENANT_PLANNED`] entries and
//! [`TENANT_KEEP_BYTES`] kept, outlive its tenant, or outlive its maker's hold on
//! the inbox it delivers to when that (not a publish right) let it deliver there.

mod plan;
mod pulled;
mod pump;
mod task;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use canopy_subjects::Pattern;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{Broker, Tenant};
use crate::follow::{Follower, Target};
use crate::store::{ReplayFrom, Store, StoreError};

pub use plan::{KEEP_BYTES, MAX_PLANNED, TENANT_KEEP_BYTES, TENANT_PLANNED};
pub use pulled::{MAX_WAITING, OrderedPull, PullRefused};
pub use pump::start_pump;

/// Most push consumers one tenant runs at once.
pub const MAX_PER_TENANT: usize = 10_000;
/// Bytes of stored messages a consumer's follower queues while it delivers.
const QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// Where a push consumer starts (its `deliver_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushStart {
    /// Every stored message its filters match.
    All,
    /// Only what is stored after it was made.
    New,
    /// The last stored message its filters match.
    Last,
    /// The last stored message of each subject its filters match.
    LastPerSubject,
    /// From a stream sequence (a tenant offset) on.
    Offset(u64),
    /// From the first message stored at or after a time (ms) on.
    Time(u64),
}

/// What a push consumer is.
#[derive(Debug, Clone)]
pub struct PushSpec {
    /// The stream it was made on, as its acks and infos name it.
    pub stream: Arc<str>,
    pub name: Arc<str>,
    /// Its filters, as given (none overlaps another).
    pub filters: Vec<String>,
    /// Where it delivers; none for an ordered *pull* consumer, which delivers to the
    /// pulls it is sent (`CONSUMER.MSG.NEXT`).
    pub deliver_subject: Option<String>,
    pub start: PushStart,
    /// Deliver each message's headers with `Nats-Msg-Size`, without its payload.
    pub headers_only: bool,
    /// Send `100 Idle Heartbeat` after this long without a delivery.
    pub heartbeat: Option<Duration>,
    /// End after this long with nobody listening on the deliver subject.
    pub inactive: Duration,
    /// Its config as its info echoes it.
    pub config: serde_json::Value,
    pub created_ms: u64,
    /// The connection whose inbox the deliver subject is, when that (not a publish
    /// right) let it deliver there: it ends once that connection no longer holds it.
    pub inbox_of: Option<u64>,
}

impl PushSpec {
    fn patterns(&self) -> Result<Vec<Pattern>, PushError> {
        self.filters
            .iter()
            .map(|filter| {
                Pattern::parse_native(filter)
                    .map_err(|e| PushError::Filter(format!("filter {filter:?}: {e}")))
            })
            .collect()
    }
}

/// Why a push consumer was not made.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{0}")]
    Filter(String),
    #[error("the tenant runs {MAX_PER_TENANT} push consumers, the most it may")]
    TooMany,
    #[error("a consumer named {0} is running")]
    Exists(String),
    #[error(
        "more subjects match the consumer's filters than it may list the newest message of \
         (at most {MAX_PLANNED}, and its tenant's consumers {TENANT_PLANNED} together): \
         narrow its filters, or read from a sequence or a time"
    )]
    PlanTooLarge,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a running push consumer has done, as its info reports it.
#[derive(Debug, Default)]
pub struct PushState {
    /// The last consumer sequence delivered.
    pub consumer_seq: AtomicU64,
    /// The stream sequence (offset) of the last message delivered.
    pub stream_seq: AtomicU64,
    /// Messages known to be still to deliver.
    pub pending: AtomicU64,
    /// Someone listens on the deliver subject.
    pub bound: AtomicBool,
    /// Pulls waiting (a pull consumer).
    pub waiting: AtomicU64,
}

/// A running push consumer.
#[derive(Debug)]
pub struct PushHandle {
    pub spec: PushSpec,
    pub state: Arc<PushState>,
    stop: CancellationToken,
    /// Where its pulls go (a pull consumer).
    pulls: Option<pulled::PullSender>,
}

impl PushHandle {
    /// Whether it is pulled (`CONSUMER.MSG.NEXT`) rather than pushed.
    pub fn is_pulled(&self) -> bool {
        self.pulls.is_some()
    }

    /// Hands a pull to the consumer's task, which answers it on its reply subject.
    pub fn pull(&self, pull: OrderedPull) -> Result<(), PullRefused> {
        match &self.pulls {
            Some(sender) => pulled::offer(sender, pull),
            None => Err(PullRefused::Gone),
        }
    }
}

/// A tenant's running push consumers, by name: ordered ones, and the pumps of those
/// with acks (which are groups).
#[derive(Debug, Default)]
pub struct TenantPushes {
    running: Mutex<HashMap<Arc<str>, Arc<PushHandle>>>,
    /// Each pump's token, with a number telling it from a later pump of that name.
    pumps: Mutex<HashMap<Arc<str>, (u64, CancellationToken)>>,
    next_pump: AtomicU64,
    /// What the running consumers' plans hold: entries and bytes kept whole.
    planned: AtomicUsize,
    planned_bytes: AtomicUsize,
}

impl TenantPushes {
    /// What a new plan may still take of the tenant's budget.
    fn plans_left(&self) -> plan::PlanCost {
        plan::PlanCost {
            entries: plan::TENANT_PLANNED.saturating_sub(self.planned.load(Ordering::Relaxed)),
            kept_bytes: plan::TENANT_KEEP_BYTES
                .saturating_sub(self.planned_bytes.load(Ordering::Relaxed)),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<PushHandle>> {
        self.running.lock().get(name).cloned()
    }

    /// Every running push consumer, in name order.
    pub fn list(&self) -> Vec<Arc<PushHandle>> {
        let mut all: Vec<_> = self.running.lock().values().cloned().collect();
        all.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        all
    }

    /// Stops and forgets `name` (an ordered consumer, or a pump); false when neither
    /// is running.
    pub fn stop(&self, name: &str) -> bool {
        let pump = self.pumps.lock().remove(name);
        let pumped = pump.inspect(|(_, token)| token.cancel()).is_some();
        let stopped = self.running.lock().remove(name);
        stopped.inspect(|handle| handle.stop.cancel()).is_some() || pumped
    }

    /// Stops every push consumer (the tenant is closing).
    pub fn stop_all(&self) {
        for (_, handle) in self.running.lock().drain() {
            handle.stop.cancel();
        }
        for (_, (_, pump)) in self.pumps.lock().drain() {
            pump.cancel();
        }
    }

    /// Forgets pump number `id` of `name`, if it is still the one under that name.
    fn forget_pump(&self, name: &str, id: u64) {
        let mut pumps = self.pumps.lock();
        if pumps.get(name).is_some_and(|(current, _)| *current == id) {
            pumps.remove(name);
        }
    }

    /// Forgets `handle` if it is still the one under its name (it ended itself).
    fn forget(&self, handle: &Arc<PushHandle>) {
        let mut running = self.running.lock();
        if running
            .get(&handle.spec.name)
            .is_some_and(|current| Arc::ptr_eq(current, handle))
        {
            running.remove(&handle.spec.name);
        }
    }
}

/// A plan's share of its tenant's budget, given back as the plan is delivered, and
/// the rest when dropped (its consumer's task ended, or it never started).
struct PlanReservation {
    routes: Arc<Tenant>,
    cost: plan::PlanCost,
}

impl PlanReservation {
    fn take(routes: &Arc<Tenant>, cost: plan::PlanCost) -> Self {
        routes
            .pushes
            .planned
            .fetch_add(cost.entries, Ordering::Relaxed);
        routes
            .pushes
            .planned_bytes
            .fetch_add(cost.kept_bytes, Ordering::Relaxed);
        Self {
            routes: Arc::clone(routes),
            cost,
        }
    }
}

impl PlanReservation {
    /// Gives back what one planned entry took (it is being delivered).
    fn release(&mut self, kept_bytes: usize) {
        let entries = self.cost.entries.min(1);
        let bytes = self.cost.kept_bytes.min(kept_bytes);
        self.cost.entries -= entries;
        self.cost.kept_bytes -= bytes;
        let pushes = &self.routes.pushes;
        pushes.planned.fetch_sub(entries, Ordering::Relaxed);
        pushes.planned_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Drop for PlanReservation {
    fn drop(&mut self) {
        let pushes = &self.routes.pushes;
        pushes
            .planned
            .fetch_sub(self.cost.entries, Ordering::Relaxed);
        pushes
            .planned_bytes
            .fetch_sub(self.cost.kept_bytes, Ordering::Relaxed);
    }
}

/// Makes and starts a push consumer on `routes`: registers its tap, plans what it
/// delivers first, and spawns its task. The handle's state already counts the plan
/// as pending, so an info taken at once tells the client how many messages the
/// initial part holds.
pub async fn start(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    routes: &Arc<Tenant>,
    spec: PushSpec,
) -> Result<Arc<PushHandle>, PushError> {
    {
        let running = routes.pushes.running.lock();
        if running.contains_key(&spec.name) {
            return Err(PushError::Exists(spec.name.to_string()));
        }
        if running.len() >= MAX_PER_TENANT {
            return Err(PushError::TooMany);
        }
    }
    let patterns = spec.patterns()?;
    let target = match patterns.as_slice() {
        [one] => Target::Pattern(one.clone()),
        _ => Target::Patterns(patterns.clone()),
    };
    let tenant = Arc::clone(&routes.name);
    // The tap first: whatever is routed from now on is queued for the live part.
    let follower = Follower::new(
        Arc::clone(store),
        Arc::clone(&tenant),
        target,
        ReplayFrom::Start,
    )
    .tapped(&routes.taps, QUEUE_BYTES, true);
    // Everything before `end` is durable once the barrier passes, so the plan's reads
    // see it all; what comes at or after `end` is the follower's.
    let end = store.next_offset(&tenant).await?;
    store.durable_barrier().await?;
    let left = routes.pushes.plans_left();
    let (plan, cost, live_from, streamed_to) =
        match plan::plan(store, &tenant, &spec, &patterns, end, left).await? {
            // A start past `end` holds for the live part too.
            plan::Plan::Listed(plan, cost) => {
                let live_from = match spec.start {
                    PushStart::Offset(offset) => end.max(offset),
                    _ => end,
                };
                (plan, cost, ReplayFrom::Offset(live_from), None)
            }
            plan::Plan::Streamed(from) => {
                (VecDeque::new(), plan::PlanCost::default(), from, Some(end))
            }
        };
    // Held until the task ends (a failure below gives it back at once).
    let reserved = PlanReservation::take(routes, cost);
    let state = Arc::new(PushState::default());
    let pending = match (streamed_to, live_from) {
        // Known only by offsets until read: at most this many.
        (Some(end), ReplayFrom::Offset(from)) => end.saturating_sub(from),
        (Some(end), _) => end.saturating_sub(1),
        (None, _) => plan.len() as u64,
    };
    state.pending.store(pending, Ordering::Relaxed);
    let stop = routes.deleted.child_token();
    let (pulls, pulls_rx) = match spec.deliver_subject {
        Some(_) => (None, None),
        None => {
            let (sender, rx) = pulled::channel();
            (Some(sender), Some(pulled::Pulls::new(rx)))
        }
    };
    let handle = Arc::new(PushHandle {
        spec,
        state: Arc::clone(&state),
        stop: stop.clone(),
        pulls,
    });
    {
        let mut running = routes.pushes.running.lock();
        if running.contains_key(&handle.spec.name) {
            return Err(PushError::Exists(handle.spec.name.to_string()));
        }
        if running.len() >= MAX_PER_TENANT {
            return Err(PushError::TooMany);
        }
        running.insert(Arc::clone(&handle.spec.name), Arc::clone(&handle));
    }
    let task = task::Delivery::new(
        Arc::clone(broker),
        Arc::clone(store),
        Arc::clone(routes),
        Arc::clone(&handle),
        (plan, reserved, streamed_to),
        follower.starting_at(live_from),
        pulls_rx,
    );
    tokio::spawn(task.run(stop));
    Ok(handle)
}
