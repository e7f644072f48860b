//! The pulls an ordered *pull* consumer serves: nats.js's `consumers.get(stream)` and
//! async-nats's `OrderedConfig` make consumers without acks and no deliver subject,
//! then pull them with `CONSUMER.MSG.NEXT`. Such a consumer is the same task as an
//! ordered push one (its plan, then live), delivering to the reply subject of the
//! oldest pull that still has room instead of to a deliver subject, and ending each
//! pull as nats-server does: nothing when it is filled, `404 No Messages` for a
//! `no_wait` pull with nothing more, `408 Request Timeout` with what it still wanted
//! when its `expires` passes, `100 Idle Heartbeat` while it waits, and `409 Consumer
//! Deleted` when the consumer goes. Must never: keep more than [`MAX_WAITING`] pulls,
//! or deliver to a pull whose asker stopped listening.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::broker::groups::PullPlace;
use crate::broker::groups::jetstream::status_block;
use crate::broker::{Broker, Message, RouteScratch, Tenant, Wakes};

/// Pulls one consumer keeps waiting at most (nats-server's default `max_waiting`).
pub const MAX_WAITING: usize = 512;
/// How long a `no_wait` pull without `expires` waits for what is stored but not yet
/// in the consumer's hands (a page being read, a message passing its sync).
const NO_WAIT_GRACE: Duration = Duration::from_millis(50);

/// One `CONSUMER.MSG.NEXT` to an ordered pull consumer.
pub struct OrderedPull {
    /// Where its messages and statuses go.
    pub reply: String,
    /// Messages it takes at most (1 or more).
    pub batch: usize,
    /// Payload bytes it takes at most (0: no limit); it ends once a message reached it.
    pub max_bytes: usize,
    /// How long it waits (its `expires`); zero with `no_wait` alone.
    pub wait: Duration,
    /// End once what is there is sent.
    pub no_wait: bool,
    pub heartbeat: Option<Duration>,
    /// Its place among its connection's waiting pulls.
    pub place: Option<PullPlace>,
}

/// Why a pull was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum PullRefused {
    /// The consumer keeps [`MAX_WAITING`] pulls already.
    TooMany,
    /// The consumer has ended.
    Gone,
}

/// The sending half, kept by the consumer's handle.
pub(super) type PullSender = mpsc::Sender<OrderedPull>;

pub(super) fn channel() -> (PullSender, mpsc::Receiver<OrderedPull>) {
    mpsc::channel(MAX_WAITING)
}

/// Offers `pull` to a consumer's task.
pub(super) fn offer(sender: &PullSender, pull: OrderedPull) -> Result<(), PullRefused> {
    sender.try_send(pull).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => PullRefused::TooMany,
        mpsc::error::TrySendError::Closed(_) => PullRefused::Gone,
    })
}

struct Waiting {
    pull: OrderedPull,
    until: Instant,
    sent: usize,
    bytes: usize,
    next_heartbeat: Option<Instant>,
}

/// The pulls waiting on one consumer, oldest first.
pub(super) struct Pulls {
    rx: mpsc::Receiver<OrderedPull>,
    waiting: VecDeque<Waiting>,
}

impl Pulls {
    pub(super) fn new(rx: mpsc::Receiver<OrderedPull>) -> Self {
        Self {
            rx,
            waiting: VecDeque::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The next pull offered (waits for one).
    pub(super) async fn offered(&mut self) -> Option<OrderedPull> {
        self.rx.recv().await
    }

    /// Starts waiting on `pull`.
    pub(super) fn add(&mut self, pull: OrderedPull) {
        let now = Instant::now();
        let wait = match (pull.no_wait, pull.wait.is_zero()) {
            (true, true) => NO_WAIT_GRACE,
            _ => pull.wait,
        };
        self.waiting.push_back(Waiting {
            next_heartbeat: pull.heartbeat.map(|every| now + every),
            until: now + wait,
            pull,
            sent: 0,
            bytes: 0,
        });
    }

    /// When the earliest waiting pull next needs a look (its end or a heartbeat).
    pub(super) fn due(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .map(|w| w.next_heartbeat.map_or(w.until, |beat| beat.min(w.until)))
            .min()
    }

    /// The reply subject of the oldest pull, which the next message goes to.
    pub(super) fn front(&self) -> Option<&str> {
        self.waiting.front().map(|w| w.pull.reply.as_str())
    }

    /// The oldest pull's asker stopped listening: it is dropped without a word.
    pub(super) fn drop_front(&mut self) {
        self.waiting.pop_front();
    }

    /// A message of `bytes` went to the oldest pull; it is done once filled.
    pub(super) fn sent(&mut self, bytes: usize) {
        let Some(front) = self.waiting.front_mut() else {
            return;
        };
        front.sent += 1;
        front.bytes += bytes;
        front.next_heartbeat = front.pull.heartbeat.map(|every| Instant::now() + every);
        let max_bytes = front.pull.max_bytes;
        if front.sent >= front.pull.batch || (max_bytes > 0 && front.bytes >= max_bytes) {
            self.waiting.pop_front();
        }
    }

    /// Ends what is due: with `idle` (nothing is held to deliver), `no_wait` pulls that
    /// got something; pulls whose wait is over; and sends heartbeats due.
    pub(super) fn end_due(&mut self, broker: &Broker, routes: &Tenant, idle: bool) {
        let now = Instant::now();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        while let Some(mut waiting) = self.waiting.pop_front() {
            let pull = &waiting.pull;
            if pull.no_wait && (waiting.until <= now || (idle && waiting.sent > 0)) {
                // nats-server's `no_wait` without `expires` ends on 404 when nothing
                // more is there; with `expires`, one still empty at its end is a 408.
                if pull.wait.is_zero() || waiting.sent > 0 {
                    send_status(broker, routes, &pull.reply, 404, "No Messages", None);
                } else {
                    let unfilled = (pull.batch, pull.max_bytes);
                    send_status(
                        broker,
                        routes,
                        &pull.reply,
                        408,
                        "Request Timeout",
                        Some(unfilled),
                    );
                }
                continue;
            }
            if waiting.until <= now {
                let unfilled = (
                    pull.batch.saturating_sub(waiting.sent),
                    pull.max_bytes.saturating_sub(waiting.bytes),
                );
                let reply = &pull.reply;
                send_status(
                    broker,
                    routes,
                    reply,
                    408,
                    "Request Timeout",
                    Some(unfilled),
                );
                continue;
            }
            if let Some(beat) = waiting.next_heartbeat
                && beat <= now
            {
                send_status(broker, routes, &pull.reply, 100, "Idle Heartbeat", None);
                waiting.next_heartbeat = pull.heartbeat.map(|every| now + every);
            }
            still.push_back(waiting);
        }
        self.waiting = still;
    }

    /// Ends every waiting pull with `409 Consumer Deleted` (the consumer ended).
    pub(super) fn end_all(&mut self, broker: &Broker, routes: &Tenant) {
        self.rx.close();
        let offered = std::iter::from_fn(|| self.rx.try_recv().ok());
        let waiting: Vec<OrderedPull> = self.waiting.drain(..).map(|w| w.pull).collect();
        for pull in waiting.into_iter().chain(offered.collect::<Vec<_>>()) {
            send_status(broker, routes, &pull.reply, 409, "Consumer Deleted", None);
        }
    }
}

fn send_status(
    broker: &Broker,
    routes: &Tenant,
    reply: &str,
    code: u16,
    description: &str,
    unfilled: Option<(usize, usize)>,
) {
    let block = status_block(code, description, unfilled);
    let message = Message {
        subject: reply,
        headers: Some(&block),
        ..Message::default()
    };
    let mut scratch = RouteScratch::default();
    let mut wakes = Wakes::default();
    broker.route(routes, None, &message, &mut scratch, &mut wakes);
}
