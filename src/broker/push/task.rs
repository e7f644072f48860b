//! An ordered consumer's task: delivers its plan, then follows the log live, while its
//! deliver subject has a listener (or, pulled, while a pull waits: [`super::pulled`]);
//! sends idle heartbeats; ends after its inactive threshold without a listener (or a
//! pull), or once its maker's connection lets go of the inbox that let it deliver
//! there. Must never block routing: it waits only on its follower, its tick, its
//! pulls and the outboxes it fills.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::plan::Planned;
use super::pulled::{OrderedPull, Pulls};
use super::{PlanReservation, PushHandle};
use crate::broker::groups::delivery_headers;
use crate::broker::groups::jetstream::ack_subject;
use crate::broker::{Broker, Message, RouteScratch, Tenant, Wakes};
use crate::follow::{Follower, Page};
use crate::store::{Store, StoredMessage};

/// How often the task looks for a listener and for a heartbeat due.
const TICK: Duration = Duration::from_millis(250);
/// Planned messages taken (and read, when not kept) at a time.
const PLANNED_BATCH: usize = 256;

pub(super) struct Delivery {
    broker: Arc<Broker>,
    store: Arc<Store>,
    routes: Arc<Tenant>,
    handle: Arc<PushHandle>,
    plan: VecDeque<Planned>,
    /// The plan's share of its tenant's budget, given back as it is delivered.
    reserved: PlanReservation,
    /// The log's end when it was made, when its follower reads the history up to it
    /// (a plan too large to list): what is pending is then known by offsets.
    streamed_to: Option<u64>,
    follower: Follower,
    /// Taken from the plan or the follower and not delivered yet, each with how many
    /// messages are known to follow it.
    held: VecDeque<(StoredMessage, u64)>,
    /// The last planned message found, held back until a later one is found (or the
    /// plan ends, when it says 0 pending).
    last_planned: Option<(StoredMessage, u64)>,
    /// It may deliver: its deliver subject has a listener, or a pull waits.
    bound: bool,
    /// The pulls it serves, when it is pulled.
    pulls: Option<Pulls>,
    last_listened: Instant,
    last_sent: Instant,
    scratch: RouteScratch,
}

impl Delivery {
    pub(super) fn new(
        broker: Arc<Broker>,
        store: Arc<Store>,
        routes: Arc<Tenant>,
        handle: Arc<PushHandle>,
        (plan, reserved, streamed_to): (VecDeque<Planned>, PlanReservation, Option<u64>),
        follower: Follower,
        pulls: Option<Pulls>,
    ) -> Self {
        let now = Instant::now();
        Self {
            broker,
            store,
            routes,
            handle,
            plan,
            reserved,
            streamed_to,
            follower,
            held: VecDeque::new(),
            last_planned: None,
            bound: false,
            pulls,
            last_listened: now,
            last_sent: now,
            scratch: RouteScratch::default(),
        }
    }

    pub(super) async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.look_for_listener();
        while !stop.is_cancelled() {
            if self.bound && self.held.is_empty() {
                if !self.plan.is_empty() {
                    if let Err(e) = self.take_planned().await {
                        tracing::warn!(consumer = %self.handle.spec.name, "push consumer stopped: {e}");
                        break;
                    }
                    continue;
                }
                self.end_due_pulls(true);
                let due = self.pull_due();
                tokio::select! {
                    biased;
                    () = stop.cancelled() => break,
                    page = self.follower.next() => match page {
                        Ok(page) => self.take_page(page),
                        Err(e) => {
                            tracing::warn!(consumer = %self.handle.spec.name, "push consumer stopped: {e}");
                            break;
                        }
                    },
                    pull = offered(&mut self.pulls) => self.take_pull(pull),
                    () = tokio::time::sleep_until(due) => {}
                    _ = tick.tick() => if !self.on_tick() { break },
                }
                continue;
            }
            if self.bound {
                self.deliver(&stop).await;
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                pull = offered(&mut self.pulls) => self.take_pull(pull),
                _ = tick.tick() => if !self.on_tick() { break },
            }
        }
        if let Some(pulls) = self.pulls.as_mut() {
            pulls.end_all(&self.broker, &self.routes);
        }
        self.routes.pushes.forget(&self.handle);
    }

    /// A pull came (or, `None`, the consumer's handle is gone).
    fn take_pull(&mut self, pull: Option<OrderedPull>) {
        let Some(pulls) = self.pulls.as_mut() else {
            return;
        };
        if let Some(pull) = pull {
            pulls.add(pull);
        }
        self.look_for_listener();
    }

    /// Ends the pulls that are due; `idle`: nothing is held to deliver.
    fn end_due_pulls(&mut self, idle: bool) {
        if let Some(pulls) = self.pulls.as_mut() {
            pulls.end_due(&self.broker, &self.routes, idle);
            let waiting = pulls.len() as u64;
            self.handle.state.waiting.store(waiting, Ordering::Relaxed);
            if pulls.is_empty() {
                self.bound = false;
            }
        }
    }

    /// When a waiting pull next needs a look (far off when none does).
    fn pull_due(&self) -> tokio::time::Instant {
        self.pulls
            .as_ref()
            .and_then(Pulls::due)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600))
    }

    /// Whether the deliver subject has a listener (or a pull waits) now.
    fn look_for_listener(&mut self) {
        self.bound = match (&self.pulls, &self.handle.spec.deliver_subject) {
            (Some(pulls), _) => !pulls.is_empty(),
            (None, Some(subject)) => self.broker.has_interest(&self.routes, subject),
            (None, None) => false,
        };
        if self.bound {
            self.last_listened = Instant::now();
        }
        self.handle.state.bound.store(self.bound, Ordering::Relaxed);
    }

    /// Looks for a listener and sends a heartbeat when one is due; false when the
    /// consumer has had no listener for its inactive threshold and ends.
    fn on_tick(&mut self) -> bool {
        if !self.inbox_held() {
            // Its maker's connection let go of the inbox: someone else may take it.
            return false;
        }
        self.end_due_pulls(self.held.is_empty() && self.plan.is_empty());
        self.look_for_listener();
        let spec = &self.handle.spec;
        if !self.bound {
            return self.last_listened.elapsed() < spec.inactive;
        }
        let idle = self.held.is_empty() && self.plan.is_empty();
        if let Some(every) = spec.heartbeat
            && self.pulls.is_none()
            && idle
            && self.last_sent.elapsed() >= every
        {
            self.heartbeat();
        }
        true
    }

    /// False once the connection whose inbox let the consumer deliver there (if that
    /// is what did) no longer holds it.
    fn inbox_held(&self) -> bool {
        let spec = &self.handle.spec;
        match (spec.inbox_of, &spec.deliver_subject) {
            (Some(conn), Some(subject)) => self.routes.holds_inbox_of(subject, conn),
            _ => true,
        }
    }

    /// `100 Idle Heartbeat` with the last consumer and stream sequences delivered,
    /// which an ordered consumer compares with what it received.
    fn heartbeat(&mut self) {
        let Some(deliver_subject) = &self.handle.spec.deliver_subject else {
            return;
        };
        let state = &self.handle.state;
        let block = format!(
            "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {}\r\nNats-Last-Stream: {}\r\n\r\n",
            state.consumer_seq.load(Ordering::Relaxed),
            state.stream_seq.load(Ordering::Relaxed),
        );
        let message = Message {
            subject: deliver_subject,
            headers: Some(block.as_bytes()),
            ..Message::default()
        };
        let mut wakes = Wakes::default();
        self.broker
            .route(&self.routes, None, &message, &mut self.scratch, &mut wakes);
        self.last_sent = Instant::now();
    }

    /// The next planned messages, read from the store where they were not kept (one
    /// purged since is passed over).
    async fn take_planned(&mut self) -> Result<(), crate::store::StoreError> {
        for _ in 0..PLANNED_BATCH {
            let Some(planned) = self.plan.pop_front() else {
                break;
            };
            let kept = match &planned {
                Planned::Kept(m) => m.payload.len() + m.headers.len() + m.subject.len(),
                Planned::At { .. } => 0,
            };
            self.reserved.release(kept);
            let message = match planned {
                Planned::Kept(message) => Some(message),
                Planned::At {
                    subject, version, ..
                } => {
                    self.store
                        .get(&self.routes.name, &subject, Some(version))
                        .await?
                }
            };
            if let Some(message) = message {
                let pending = self.plan.len() as u64;
                if let Some(before) = self.last_planned.replace((message, pending)) {
                    self.held.push_back(before);
                }
            }
        }
        // The last planned message found says 0 even when the ones after it were
        // purged since (the clients end their initial values on it): each found one
        // waits until a later one is found, or the plan ends.
        if self.plan.is_empty()
            && let Some((message, _)) = self.last_planned.take()
        {
            self.held.push_back((message, 0));
        }
        self.count_pending();
        Ok(())
    }

    /// A page the follower gave: each message followed by the rest of the page, and,
    /// while it reads a streamed plan's history, by what is left of that (by offsets:
    /// at most that many; the last page of history says 0 at its end).
    fn take_page(&mut self, page: Page) {
        let mut left = page.messages.len() as u64;
        let beyond = self.history_left(page.next, page.caught_up);
        for message in page.messages {
            left -= 1;
            self.held.push_back((message, left + beyond));
        }
        self.count_pending();
    }

    /// What a streamed plan still has to read from `next` on (0 once caught up).
    fn history_left(&self, next: u64, caught_up: bool) -> u64 {
        match self.streamed_to {
            Some(end) if !caught_up => end.saturating_sub(next),
            _ => 0,
        }
    }

    fn count_pending(&self) {
        let waiting = usize::from(self.last_planned.is_some());
        let unread = self.history_left(self.follower.position(), self.follower.is_live());
        let pending = (self.plan.len() + self.held.len() + waiting) as u64 + unread;
        self.handle.state.pending.store(pending, Ordering::Relaxed);
    }

    /// Delivers what is held until it is all out, nobody listens, or an outbox it
    /// fills presses; then waits for the pressing outboxes to drain.
    async fn deliver(&mut self, stop: &CancellationToken) {
        if !self.inbox_held() {
            // Not one more delivery: the next tick ends the consumer.
            self.bound = false;
            return;
        }
        let handle = Arc::clone(&self.handle);
        let (spec, state) = (&handle.spec, &handle.state);
        let mut wakes = Wakes::default();
        while let Some((message, pending)) = self.held.front() {
            let to = match (&self.pulls, &spec.deliver_subject) {
                (Some(pulls), _) => pulls.front(),
                (None, subject) => subject.as_deref(),
            };
            let Some(to) = to else {
                self.bound = false;
                break;
            };
            let consumer_seq = state.consumer_seq.load(Ordering::Relaxed) + 1;
            let ack = ack_subject(
                &spec.stream,
                &spec.name,
                1,
                message.offset,
                consumer_seq,
                message.time_ms,
                *pending,
            );
            let only_headers;
            let (headers, payload) = if spec.headers_only {
                let size = message.payload.len().to_string();
                only_headers = delivery_headers(&message.headers, &[("Nats-Msg-Size", size)]);
                (Some(&only_headers[..]), &[][..])
            } else {
                let headers = (!message.headers.is_empty()).then_some(&message.headers[..]);
                (headers, &message.payload[..])
            };
            let size = headers.map_or(0, <[u8]>::len) + payload.len();
            let routed = Message {
                subject: to,
                shown_as: Some(&message.subject),
                reply: Some(ack.as_bytes()),
                headers,
                payload,
                ..Message::default()
            };
            let (reached, withheld) = self.broker.route_counted(
                &self.routes,
                None,
                &routed,
                &mut self.scratch,
                &mut wakes,
            );
            if reached == 0 && withheld > 0 {
                // A deliver plugin withholds it from this reader: skipped, with no
                // consumer sequence spent (the clients check those run without gaps).
                self.held.pop_front();
                continue;
            }
            if reached == 0 {
                if let Some(pulls) = self.pulls.as_mut() {
                    // That pull's asker stopped listening: the next pull gets it.
                    pulls.drop_front();
                    continue;
                }
                // Nobody listens any more: kept for when someone does.
                self.bound = false;
                state.bound.store(false, Ordering::Relaxed);
                break;
            }
            state.consumer_seq.store(consumer_seq, Ordering::Relaxed);
            state.stream_seq.store(message.offset, Ordering::Relaxed);
            self.held.pop_front();
            if let Some(pulls) = self.pulls.as_mut() {
                pulls.sent(size);
            }
            if wakes.fed_pressing() {
                break;
            }
        }
        self.end_due_pulls(self.held.is_empty() && self.plan.is_empty());
        self.last_sent = Instant::now();
        self.count_pending();
        let mut pressing = Vec::new();
        wakes.take_pressing(&mut pressing);
        wakes.wake_all();
        for outbox in pressing {
            tokio::select! {
                () = stop.cancelled() => return,
                () = outbox.drained() => {}
            }
        }
    }
}

/// The next pull offered to a pulled consumer; never, for a pushed one.
async fn offered(pulls: &mut Option<Pulls>) -> Option<OrderedPull> {
    match pulls {
        Some(pulls) => pulls.offered().await,
        None => std::future::pending().await,
    }
}
